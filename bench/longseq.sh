#!/usr/bin/env bash
# Train-step tokens/s of a long-sequence model (dim 256, GQA 4/2 heads, one layer) at sequence
# 4K, 16K and 32K on 1 and 2 in-process ranks (BenchmarkLongSeqStep), each under the CPU
# profiler, with the share of the profile's samples spent in the attention kernels
# (kernels.(*CPU).Attn*: block forward, merge, finish, backward and the work they fan out).
#   bench/longseq.sh [count]      (default 1 timed step per configuration)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1}
out=$(mktemp -d)
go test -c -o "$out/distflash.test" .
for T in 4096 16384 32768; do
	for P in 1 2; do
		"$out/distflash.test" -test.run '^$' -test.bench "^BenchmarkLongSeqStep\$/^T$T\$/^P$P\$" \
			-test.benchtime "${n}x" -test.cpuprofile "$out/T$T-P$P.prof" | grep '^Benchmark' | tr '\n' ' '
		go tool pprof -top -focus 'kernels\.\(\*CPU\)\.Attn' "$out/distflash.test" "$out/T$T-P$P.prof" 2>/dev/null |
			awk '/^Showing nodes accounting for/ {gsub(",", "", $6); print "attention share " $6}'
	done
done
