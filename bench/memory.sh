#!/usr/bin/env bash
# Memory of one training step, measured against plan: for each data.seq_len, one step of a
# model (default: a 125M-class LLaMA, dim 768, 12 layers, 12 heads, ffn 2048, vocab 32000) on
# the CPU, batch 1, attn_output checkpointing, fp32. For each length it prints the peak plan
# predicts (plan --format json), the total of the memory table train prints (what the model
# allocated: without the attention's working set and the collector's headroom, which plan
# counts), the process's peak resident set (/usr/bin/time -v) and their ratios, then the
# saved bytes per token per layer from the slope between the first and last lengths, measured
# (the memory table's activations) and planned, and plan's longest data.seq_len on this
# machine (the available memory train's check sees).
#
#   bench/memory.sh [-b BINARY] [-l "1024 2048 4096 8192"] [--set k=v ...]
#
# BINARY defaults to a fresh `go build` of this checkout; extra --set pairs change the model
# (e.g. --set model.vocab_size=128256), the policy or the chunk sizes (training.loss_chunk,
# training.mlp_tile: 0 = all tokens at once, as before they existed).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="" lengths="1024 2048 4096 8192"
sets=(--set model.dim=768 --set model.n_layers=12 --set model.n_heads=12 --set model.n_kv_heads=12
	--set model.ffn_dim=2048 --set model.vocab_size=32000 --set model.max_seq_len=8388608
	--set data.batch_size=1 --set checkpoint.activation=attn_output --set training.steps=1
	--set training.warmup_steps=0 --set data.max_bytes=4194304)
while [[ $# -gt 0 ]]; do
	case "$1" in
	-b) bin="$2"; shift 2 ;;
	-l) lengths="$2"; shift 2 ;;
	--set) sets+=(--set "$2"); shift 2 ;;
	*) sed -n '2,16p' "$0"; exit 2 ;;
	esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z "$bin" ]]; then
	bin="$work/distflash"
	go build -o "$bin" .
fi
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
echo "| seq_len | plan peak MiB | train's table MiB | peak RSS MiB | table / plan | RSS / plan | activations MiB (table) | activations + logits + scratch MiB (plan) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
first="" last=""
for T in $lengths; do
	plan=$("$bin" plan "${sets[@]}" --set data.seq_len="$T" --cluster 1x1xcpu --flops 1e11 --format json)
	read -r peak acts <<<"$(python3 -c 'import json,sys; m=json.load(sys.stdin)["plans"][0]["memory"]; print(m["peak"], m["activations"]+m["logits"]+m["backward_scratch"])' <<<"$plan")"
	out="$work/run-$T"
	/usr/bin/time -v "$bin" train "${sets[@]}" --set data.seq_len="$T" --set run.output_dir="$out" --progress=false \
		>"$work/stdout-$T" 2>"$work/stderr-$T" || { cat "$work/stderr-$T" >&2; exit 1; }
	rss=$(awk -F': ' '/Maximum resident set size/ { print $2 * 1024 }' "$work/stderr-$T")
	read -r total tacts <<<"$(awk '/memory per rank/ { getline; print $7 * 1048576, $6 * 1048576 }' "$work/stdout-$T")"
	printf "| %d | %s | %s | %s | %.2f | %.2f | %s | %s |\n" "$T" "$(mib "$peak")" "$(mib "$total")" "$(mib "$rss")" \
		"$(awk -v a="$total" -v b="$peak" 'BEGIN { print a / b }')" "$(awk -v a="$rss" -v b="$peak" 'BEGIN { print a / b }')" \
		"$(mib "$tacts")" "$(mib "$acts")"
	[[ -n "$first" ]] || first="$T $tacts $acts"
	last="$T $tacts $acts"
done
layers=$("$bin" plan "${sets[@]}" --cluster 1x1xcpu --flops 1e11 --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"].split(" layers")[0].split(", ")[-1])')
read -r t0 m0 p0 <<<"$first"
read -r t1 m1 p1 <<<"$last"
awk -v t0="$t0" -v t1="$t1" -v m0="$m0" -v m1="$m1" -v p0="$p0" -v p1="$p1" -v L="$layers" 'BEGIN {
	printf "\nbytes per token per layer (slope %d..%d, %d layers): measured %.0f, planned %.0f\n", t0, t1, L, (m1 - m0) / (t1 - t0) / L, (p1 - p0) / (t1 - t0) / L }'
"$bin" train "${sets[@]}" --set data.seq_len=4194304 --set run.output_dir="$work/none" --progress=false 2>&1 |
	grep -o 'this machine has [^)]*)\|The longest data.seq_len that fits is [0-9]*' || true
