#!/usr/bin/env bash
# Checks kernels/cuda/cudnn_abi.h, the declarations the CUDA backend binds cuDNN's backend (graph)
# API with instead of cuDNN's headers, against a release's headers: every constant's value, every
# type's size and alignment, every entry point's exported symbol and C signature.
#   CUDNN_INCLUDE=DIR scripts/check_cudnn_abi.sh   (DIR holds cudnn_graph.h, e.g. the include
#                                                  directory of a cuDNN install or of the
#                                                  nvidia-cudnn-cu13 wheel: .../nvidia/cudnn/include)
#   scripts/check_cudnn_abi.sh --wheel [PACKAGE==VERSION]
#                                                  fetches that wheel with pip (default
#                                                  nvidia-cudnn-cu13==9.28.1.4; the oldest cuDNN 9
#                                                  is nvidia-cudnn-cu12==9.0.0.312) into
#                                                  $CUDNN_WHEEL_CACHE (default
#                                                  ~/.cache/distflash/cudnn), keeps only its include
#                                                  directory, and checks against it
# cudnn_graph.h includes <cuda_runtime_api.h> and <library_types.h>: CUDA_INCLUDE=DIR names a
# CUDA toolkit's include directory; without it the script writes the few declarations cuDNN's
# header needs from them (cudaStream_t, cudaGraph_t, libraryPropertyType) into a temporary
# directory. Needs gcc (and pip with --wheel). The wheel is about 520 MB; only the headers
# (about 1 MB) are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ "${1:-}" == "--wheel" ]]; then
	spec=${2:-nvidia-cudnn-cu13==9.28.1.4}
	cache=${CUDNN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distflash/cudnn}
	dir="$cache/${spec//[^A-Za-z0-9.=_-]/_}"
	if [[ ! -f "$dir/include/cudnn_graph.h" ]]; then
		mkdir -p "$tmp/wheel"
		python3 -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: --dest "$tmp/wheel" "$spec"
		whl=$(ls "$tmp/wheel"/*.whl)
		python3 - "$whl" "$tmp/include" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if "/include/" in n and n.endswith(".h"):
            with open(os.path.join(out, os.path.basename(n)), "wb") as f:
                f.write(z.read(n))
PY
		rm -rf "$tmp/wheel"
		mkdir -p "$dir"
		rm -rf "$dir/include"
		mv "$tmp/include" "$dir/include"
	fi
	CUDNN_INCLUDE="$dir/include"
fi
if [[ -z "${CUDNN_INCLUDE:-}" ]]; then
	echo "usage: CUDNN_INCLUDE=DIR $0, or $0 --wheel [PACKAGE==VERSION] (see the script's header)" >&2
	exit 2
fi
[[ -f "$CUDNN_INCLUDE/cudnn_graph.h" ]] || { echo "check_cudnn_abi: no cudnn_graph.h in CUDNN_INCLUDE=$CUDNN_INCLUDE" >&2; exit 2; }
define() { awk -v k="$1" '$1 == "#define" && $2 == k { print $3 }' "$CUDNN_INCLUDE/cudnn_version.h"; }
release="$(define CUDNN_MAJOR).$(define CUDNN_MINOR).$(define CUDNN_PATCHLEVEL)"
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "check_cudnn_abi: no version in $CUDNN_INCLUDE/cudnn_version.h" >&2; exit 2; }
cudainc=${CUDA_INCLUDE:-}
if [[ -z "$cudainc" ]]; then
	cudainc="$tmp/cuda"
	mkdir -p "$cudainc"
	printf '%s\n' '// written by check_cudnn_abi.sh: what cudnn_graph.h needs of the CUDA runtime' \
		'typedef struct CUstream_st* cudaStream_t;' 'typedef struct CUgraph_st* cudaGraph_t;' >"$cudainc/cuda_runtime_api.h"
	printf '%s\n' '// written by check_cudnn_abi.sh' \
		'typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType;' \
		'typedef enum cudaDataType_t { CUDA_R_32F = 0 } cudaDataType;' >"$cudainc/library_types.h"
fi
# every constant cudnn_abi.h defines must be in DF_CUDNN_CONSTS, or it would never be compared
missing=$(awk '$1 == "#define" && $2 ~ /^CUDNN_/ { print $2 }' kernels/cuda/cudnn_abi.h | while read -r k; do
	grep -q "X($k)" kernels/cuda/cudnn_abi_funcs.h || echo "$k"
done)
if [[ -n "$missing" ]]; then
	echo "check_cudnn_abi: kernels/cuda/cudnn_abi.h defines constants DF_CUDNN_CONSTS does not list (never compared): $missing" >&2
	exit 1
fi
flags=(-std=c11 -Wall -Werror -Ikernels/cuda)
inc=(-I"$CUDNN_INCLUDE" -I"$cudainc")
gcc "${flags[@]}" -DOURS -o "$tmp/ours" scripts/check_cudnn_abi.c
gcc "${flags[@]}" "${inc[@]}" -o "$tmp/theirs" scripts/check_cudnn_abi.c
gcc "${flags[@]}" -DSIGNATURES "${inc[@]}" -fsyntax-only scripts/check_cudnn_abi.c
"$tmp/ours" >"$tmp/ours.txt"
"$tmp/theirs" >"$tmp/theirs.txt"
if ! diff -u "$tmp/theirs.txt" "$tmp/ours.txt"; then
	echo "kernels/cuda/cudnn_abi.h differs from cuDNN $release's headers in $CUDNN_INCLUDE (- theirs, + ours)" >&2
	exit 1
fi
echo "kernels/cuda/cudnn_abi.h agrees with cuDNN $release's cudnn_graph.h: $(grep -c . "$tmp/ours.txt") constants, sizes and symbols; every signature compiles"
