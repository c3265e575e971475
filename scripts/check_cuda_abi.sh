#!/usr/bin/env bash
# Checks kernels/cuda/cuda_abi.h, the declarations the CUDA backend is built with instead of the
# CUDA toolkit's headers, against cuda.h and cublas_v2.h: every constant's value, every type's
# size, every entry point's exported symbol (e.g. cuMemcpyHtoDAsync_v2) and C signature.
#   scripts/check_cuda_abi.sh        (needs gcc and the toolkit's headers, e.g. Debian's
#                                     nvidia-cuda-dev; CUDA_INCLUDE=DIR if not on the default path)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=()
[[ -n "${CUDA_INCLUDE:-}" ]] && inc=(-I"$CUDA_INCLUDE")
gcc -std=c11 -Wall -Werror -DOURS -Ikernels/cuda -o "$tmp/ours" scripts/check_cuda_abi.c
gcc -std=c11 -Wall -Werror "${inc[@]}" -Ikernels/cuda -o "$tmp/theirs" scripts/check_cuda_abi.c
gcc -std=c11 -Wall -Werror -DSIGNATURES "${inc[@]}" -Ikernels/cuda -fsyntax-only scripts/check_cuda_abi.c
"$tmp/ours" >"$tmp/ours.txt"
"$tmp/theirs" >"$tmp/theirs.txt"
if ! diff -u "$tmp/theirs.txt" "$tmp/ours.txt"; then
	echo "kernels/cuda/cuda_abi.h differs from the CUDA headers (- theirs, + ours)" >&2
	exit 1
fi
echo "kernels/cuda/cuda_abi.h agrees with the CUDA headers: $(grep -c . "$tmp/ours.txt") constants, sizes and symbols; every signature compiles"
