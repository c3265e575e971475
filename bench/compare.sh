#!/usr/bin/env bash
# Sets distflash's training step beside the same step in PyTorch on this machine, at the same
# thread count, in one run, and prints the ratio. Also the GEMM and attention kernels.
#   bench/compare.sh [threads]      (default 2; needs Debian's python3-torch for the reference)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
export GOMAXPROCS=$threads OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
out=$(mktemp -d)
go test ./train -run '^$' -bench 'TrainStep/none' -benchtime 20x | tee "$out/go.txt"
go_tps=$(awk '/BenchmarkTrainStep\/none/ {for (i=1;i<=NF;i++) if ($(i+1)=="tokens/s") print $i}' "$out/go.txt")
/usr/bin/python3 scripts/reference.py bench --threads "$threads" --steps 20 | tee "$out/torch.json"
pt_tps=$(/usr/bin/python3 -c "import json,sys; print(json.load(open('$out/torch.json'))['tokens_per_s'])")
/usr/bin/python3 - "$go_tps" "$pt_tps" "$threads" <<'PY'
import sys
g, p, t = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(f"tiny train step, {t} threads: distflash {g:.0f} tokens/s, PyTorch {p:.0f} tokens/s, ratio {g/p:.2f}")
PY
go test ./kernels -run '^$' -bench 'MatMul|Attn' -benchtime 1s
