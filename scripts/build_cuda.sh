#!/usr/bin/env bash
# Builds the PTX of the CUDA backend (kernels/cuda/*.cu → kernels/cuda/<name>_sm80.ptx and
# <name>_sm90.ptx), which package kernels/cuda embeds into `go build -tags cuda` binaries. The
# PTX is committed, so building the Go side needs no nvcc; run this after editing a .cu file.
#   scripts/build_cuda.sh           rebuild the PTX in place
#   scripts/build_cuda.sh --check   rebuild into a temporary directory and fail if the committed
#                                   PTX differs (it was not rebuilt after a .cu edit)
#
# Needs nvcc. On Debian 12: add "contrib non-free" to the Components of
# /etc/apt/sources.list.d/debian.sources, then `apt-get update && apt-get install -y
# nvidia-cuda-toolkit` (CUDA 11.8: the first release that knows sm_90). Override the compiler
# with NVCC=/path/to/nvcc.
#
# The driver JIT-compiles the PTX for the GPU at hand when the backend starts (and caches the
# result): compute_80 code for A100-class GPUs, compute_90 code for H100/H200. ptxas checks here
# that each PTX assembles for its GPU and prints every kernel's registers and spills. No
# fast-math: the elementwise kernels rely on IEEE division, square root, and exp/log in double
# to agree with the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/../kernels/cuda"
NVCC="${NVCC:-nvcc}"
out=.
if [[ "${1:-}" == "--check" ]]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
"$NVCC" --version | tail -n 2
for src in *.cu; do
	name="${src%.cu}"
	for arch in 80 90; do
		ptx="$out/${name}_sm${arch}.ptx"
		"$NVCC" -ptx -std=c++17 -O3 -arch="compute_${arch}" -o "$ptx" "$src"
		ptxas -arch="sm_${arch}" -v -o /dev/null "$ptx" 2>&1 |
			awk '/Compiling entry/ {gsub(/\x27/, "", $7); k = $7} /spill/ {s = $5 "+" $9} /Used/ {printf "  sm_%s %-32s %3d registers, spill stores+loads %s bytes\n", "'"$arch"'", k, $5, s}'
		if [[ "$out" != . ]] && ! cmp -s "$ptx" "${name}_sm${arch}.ptx"; then
			echo "kernels/cuda/${name}_sm${arch}.ptx is not what ${src} compiles to: run scripts/build_cuda.sh" >&2
			exit 1
		fi
	done
done
if [[ "$out" == . ]]; then
	ls -l ./*.ptx
else
	echo "committed PTX is up to date"
fi
