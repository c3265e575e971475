#!/usr/bin/env bash
# Per-step time of the tiny sequence-parallel config on 4 ranks: 4 MPI processes on this
# machine (mpirun -np 4) vs 4 in-process ranks (goroutines), same steps, same data, one run.
# Prints the mean step time of steps 6..N (the first ones warm up) and the ratio MPI / in-process.
# Needs Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev). Usage: bench/mpi_step.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -tags mpi -o "$out/distflash" .
args=(train --config configs/tiny-sp4.toml --progress=false --set training.steps="$steps"
      --set data.max_bytes=1048576 --set run.log_interval=0)
"$out/distflash" "${args[@]}" --set run.output_dir="$out/inproc" >/dev/null 2>&1
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 \
  "$out/distflash" "${args[@]}" --set run.output_dir="$out/mpi" >/dev/null 2>&1
python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
def step_time(kind):
    ms = [json.loads(l) for l in open(f"{out}/{kind}/tiny-sp4/metrics.jsonl")]
    a, b = ms[4], ms[-1]  # elapsed after step 5 and after the last step
    return (b["elapsed_s"] - a["elapsed_s"]) / (len(ms) - 5), ms[-1]["loss"]
ti, li = step_time("inproc")
tm, lm = step_time("mpi")
print(f"tiny-sp4, 4 ranks, steps 6..{steps}: in-process {ti*1e3:.1f} ms/step, MPI {tm*1e3:.1f} ms/step, "
      f"ratio MPI/in-process {tm/ti:.2f}; final loss {li:.6f} vs {lm:.6f}")
PY
