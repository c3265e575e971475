#!/usr/bin/env bash
# Checks kernels/cuda/nccl_abi.h, the declarations the CUDA backend binds NCCL with instead of
# NCCL's header, against a release's nccl.h: every constant's value, every type's size and
# alignment, every entry point's exported symbol and C signature.
#   NCCL_INCLUDE=DIR scripts/check_nccl_abi.sh    (DIR holds nccl.h, e.g. the include directory of
#                                                 the nvidia-nccl-cu12 wheel: .../nvidia/nccl/include)
#   NCCL_SRC=GIT_DIR [NCCL_TAG=v2.23.4-1] scripts/check_nccl_abi.sh
#                                                 (a clone of github.com/NVIDIA/nccl: nccl.h is made
#                                                 from the tag's src/nccl.h.in as NCCL's makefile does)
# nccl.h includes <cuda_runtime.h> and <cuda_fp16.h>: CUDA_INCLUDE=DIR if they are not on the
# compiler's default path (Debian's nvidia-cuda-dev puts them in /usr/include). Needs gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -n "${NCCL_INCLUDE:-}" ]]; then
	ncclinc=$NCCL_INCLUDE
	[[ -f "$ncclinc/nccl.h" ]] || { echo "check_nccl_abi: no nccl.h in NCCL_INCLUDE=$ncclinc" >&2; exit 2; }
	from="$ncclinc/nccl.h"
elif [[ -n "${NCCL_SRC:-}" ]]; then
	tag=${NCCL_TAG:-v2.23.4-1}
	ncclinc=$tmp/include
	mkdir -p "$ncclinc"
	git -C "$NCCL_SRC" show "$tag:makefiles/version.mk" >"$tmp/version.mk"
	field() { awk -v k="$1" '$1 == k && $2 == ":=" { print $3 }' "$tmp/version.mk"; }
	major=$(field NCCL_MAJOR) minor=$(field NCCL_MINOR) patch=$(field NCCL_PATCH) suffix=$(field NCCL_SUFFIX)
	[[ -n "$major" && -n "$minor" && -n "$patch" ]] || { echo "check_nccl_abi: no version in $tag:makefiles/version.mk" >&2; exit 2; }
	# src/Makefile: NCCL_VERSION(X,Y,Z) ((X) * 10000 + (Y) * 100 + (Z))
	version=$(printf "%d%02d%02d" "$major" "$minor" "$patch")
	git -C "$NCCL_SRC" show "$tag:src/nccl.h.in" |
		sed -e "s/\${nccl:Major}/$major/g" \
			-e "s/\${nccl:Minor}/$minor/g" \
			-e "s/\${nccl:Patch}/$patch/g" \
			-e "s/\${nccl:Suffix}/$suffix/g" \
			-e "s/\${nccl:Version}/$version/g" >"$ncclinc/nccl.h"
	from="nccl.h of $tag (made from $NCCL_SRC)"
else
	echo "usage: NCCL_INCLUDE=DIR $0, or NCCL_SRC=GIT_DIR [NCCL_TAG=TAG] $0 (see the script's header)" >&2
	exit 2
fi
define() { awk -v k="$1" '$1 == "#define" && $2 == k { print $3 }' "$ncclinc/nccl.h"; }
release="$(define NCCL_MAJOR).$(define NCCL_MINOR).$(define NCCL_PATCH)"
code=$(define NCCL_VERSION_CODE)
[[ "$code" =~ ^[0-9]+$ ]] || { echo "check_nccl_abi: no NCCL_VERSION_CODE in $from" >&2; exit 2; }
flags=(-std=c11 -Wall -Werror -Ikernels/cuda)
note=""
if ((code < 21800)); then # ncclCommSplit (DF_NCCL_OPTIONAL_FUNCS) came with 2.18
	flags+=(-DNO_OPTIONAL)
	note=" (ncclCommSplit, which came with 2.18, left out)"
fi
inc=(-I"$ncclinc")
[[ -n "${CUDA_INCLUDE:-}" ]] && inc+=(-I"$CUDA_INCLUDE")
gcc "${flags[@]}" -DOURS -o "$tmp/ours" scripts/check_nccl_abi.c
gcc "${flags[@]}" "${inc[@]}" -o "$tmp/theirs" scripts/check_nccl_abi.c
gcc "${flags[@]}" -DSIGNATURES "${inc[@]}" -fsyntax-only scripts/check_nccl_abi.c
"$tmp/ours" >"$tmp/ours.txt"
"$tmp/theirs" >"$tmp/theirs.txt"
if ! diff -u "$tmp/theirs.txt" "$tmp/ours.txt"; then
	echo "kernels/cuda/nccl_abi.h differs from $from (- theirs, + ours)" >&2
	exit 1
fi
echo "kernels/cuda/nccl_abi.h agrees with NCCL $release's nccl.h: $(grep -c . "$tmp/ours.txt") constants, sizes and symbols; every signature compiles$note"
