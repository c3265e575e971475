#!/usr/bin/env bash
# CUDA backend benchmarks on one GPU: whole training steps (tokens/s), cuBLAS GEMMs through
# MatMul at fp32/bf16/fp16 (TFLOP/s), and the attention table against PyTorch's flash SDPA.
#   bench/cuda_step.sh            (needs a GPU, the CUDA toolkit libraries and, for the
#                                  attention comparison, PyTorch with CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
go test -tags cuda -run '^$' -bench 'BenchmarkCUDA(TrainStep|MatMul)' -benchtime 3s ./kernels
python3 bench/cuda_attn.py "$@"
