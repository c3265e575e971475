#!/usr/bin/env bash
# Sliding-window traffic and throughput on 4 in-process ranks, measured against plan: for each
# schedule (default ring, zigzag, distflash) and window (default none, 1K, 4K), a few training
# steps of configs/tiny-sp4.toml's model (dim 128, 4 layers, 4 heads / 2 kv) at data.seq_len
# T (default 16K), batch 1, fp32 on the CPU. It prints one row per run: the attention bytes
# the busiest rank sent per step (metrics attn_bytes, mean over the steps after the first)
# and plan's prediction of the same (plan --format json: comm.attention), their ratio, the
# traffic against the same schedule without a window, measured and planned, and tokens/s
# (median of the steps after the first) with its ratio to the unwindowed run.
#
#   bench/window.sh [-b BINARY] [-T 16384] [-w "0 1024 4096"] [-s "ring zigzag distflash"] [-n 3]
#
# BINARY defaults to a fresh `go build` of this checkout. A markdown table goes to stdout and
# the rows as JSON lines to $OUT (default: none) when set.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="" T=16384 windows="0 1024 4096" schedules="ring zigzag distflash" steps=3
while [[ $# -gt 0 ]]; do
	case "$1" in
	-b) bin="$2"; shift 2 ;;
	-T) T="$2"; shift 2 ;;
	-w) windows="$2"; shift 2 ;;
	-s) schedules="$2"; shift 2 ;;
	-n) steps="$2"; shift 2 ;;
	*) sed -n '2,14p' "$0"; exit 2 ;;
	esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z "$bin" ]]; then
	bin="$work/distflash"
	go build -o "$bin" .
fi
echo "| schedule | window | attn MB/step measured | planned | measured / planned | traffic vs no window: measured | planned | tokens/s | vs no window |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for s in $schedules; do
	base_meas="" base_plan="" base_tps=""
	for W in $windows; do
		sets=(--set data.seq_len="$T" --set model.max_seq_len="$T" --set data.batch_size=1 --set data.max_bytes=4194304
			--set training.steps="$steps" --set training.warmup_steps=0 --set checkpoint.interval=1000000
			--set parallelism.attention="$s" --set model.sliding_window="$W")
		planned=$("$bin" plan --config configs/tiny-sp4.toml "${sets[@]}" --cluster 1x4xcpu --flops 1e11 --format json |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["plans"][0]["comm"]["attention"])')
		out="$work/$s-$W"
		"$bin" train --config configs/tiny-sp4.toml "${sets[@]}" --set run.output_dir="$out" --progress=false \
			>"$work/stdout" 2>"$work/stderr" || { cat "$work/stderr" >&2; exit 1; }
		read -r meas tps <<<"$(python3 - "$out"/*/metrics.jsonl <<'EOF'
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[1]) if '"attn_bytes"' in l]
ms = ms[1:] or ms  # the first step warms the buffers
print(statistics.mean(m["attn_bytes"] for m in ms), statistics.median(m["tokens_per_s"] for m in ms))
EOF
)"
		if [[ -z "$base_meas" ]]; then base_meas=$meas base_plan=$planned base_tps=$tps; fi
		row=$(awk -v s="$s" -v W="$W" -v m="$meas" -v p="$planned" -v bm="$base_meas" -v bp="$base_plan" -v t="$tps" -v bt="$base_tps" 'BEGIN {
			printf "| %s | %s | %.2f | %.2f | %.4f | %.3f | %.3f | %.0f | %.2f |", s, (W == 0 ? "none" : W), m / 1e6, p / 1e6, m / p, m / bm, p / bp, t, t / bt }')
		echo "$row"
		if [[ -n "${OUT:-}" ]]; then
			printf '{"schedule":"%s","window":%s,"seq_len":%s,"attn_bytes":%s,"planned":%s,"tokens_per_s":%s}\n' "$s" "$W" "$T" "$meas" "$planned" "$tps" >>"$OUT"
		fi
	done
done
