#!/bin/sh
# Regenerates testdata/export/: a tiny model trained by distflash, exported by
# `distflash export` (f32 in one file; bf16 in shards of at most 40KB with an index),
# and the losses scripts/reference.py computes from the exported files with its own
# safetensors reader and PyTorch LLaMA (float64), in testdata/export/*.reference.json.
# e2e/round_trip_test.go checks, without Python, that `distflash eval` of the committed
# directories gives those losses and that `distflash export` still writes them byte for byte.
#
#   sh scripts/export_fixture.sh        (needs Go and /usr/bin/python3 with torch)
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/distflash" .
"$tmp/distflash" train --config configs/tiny.toml --progress=false \
	--set run.name=fixture --set run.output_dir="$tmp/runs" \
	--set data.train=scripts/reference.py --set data.max_bytes=0 \
	--set model.dim=32 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2 \
	--set model.ffn_dim=64 --set model.norm_eps=1e-6 --set model.rope_theta=500000 \
	--set model.max_seq_len=256 --set data.seq_len=64 --set data.batch_size=4 \
	--set training.steps=40 --set training.warmup_steps=4 --set checkpoint.interval=40
rm -rf testdata/export
mkdir -p testdata/export
"$tmp/distflash" export --model "$tmp/runs/fixture" --out testdata/export/f32
"$tmp/distflash" export --model "$tmp/runs/fixture" --out testdata/export/bf16 --dtype bf16 --max-shard-size 40KB
for d in f32 bf16; do
	/usr/bin/python3 scripts/reference.py read-hf testdata/export/$d \
		--docs 'weights/testdata/hf/docs/*.txt' --seq-len 128 --samples 5 \
		--out testdata/export/$d.reference.json >/dev/null
	grep '"loss"' testdata/export/$d.reference.json
done
