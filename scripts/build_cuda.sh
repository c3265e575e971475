#!/usr/bin/env bash
# Builds the PTX of the CUDA backend (kernels/cuda/*.cu → kernels/cuda/<name>_sm80.ptx and
# <name>_sm90.ptx), which kernels/cuda_embed.go embeds into `go build -tags cuda` binaries. The
# PTX is committed, so building the Go side needs no nvcc; run this after editing a .cu file.
#
# Needs nvcc. On Debian 12: add "contrib non-free" to the Components of
# /etc/apt/sources.list.d/debian.sources, then `apt-get update && apt-get install -y
# nvidia-cuda-toolkit` (CUDA 11.8: the first release that knows sm_90). Override the compiler
# with NVCC=/path/to/nvcc.
#
# The driver JIT-compiles the PTX for the GPU at hand (and caches it): compute_80 code for
# A100-class GPUs, compute_90 code for H100/H200. No fast-math: the elementwise kernels rely on
# IEEE division, square root and exp/log in double to agree with the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/../kernels/cuda"
NVCC="${NVCC:-nvcc}"
"$NVCC" --version | tail -n 2
for src in *.cu; do
	name="${src%.cu}"
	for arch in 80 90; do
		"$NVCC" -ptx -std=c++17 -O3 -arch="compute_${arch}" -o "${name}_sm${arch}.ptx" "$src"
		# Check that the PTX assembles for the real GPU of its generation, and show each
		# kernel's registers and spills (attention kernels must not spill).
		ptxas -arch="sm_${arch}" -v -o /dev/null "${name}_sm${arch}.ptx" 2>&1 |
			awk '/Compiling entry/ {gsub(/\x27/, "", $7); k = $7} /spill/ {s = $5 "+" $9} /Used/ {printf "  sm_%s %-32s %3d registers, spill stores+loads %s bytes\n", "'"$arch"'", k, $5, s}'
	done
done
ls -l ./*.ptx
