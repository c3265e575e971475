#!/usr/bin/env bash
# Builds NCCL's library from its public source for one GPU architecture, for the GPU check's
# several ranks on one GPU (docs/gpu.md, "GPU check"). NCCL refuses two ranks on one GPU before
# 2.30, which added NCCL_MULTI_RANK_GPU_ENABLE; the GPU machines have 2.28 (PyTorch's wheel), and
# the 2.30 wheel (about 300 MB, every architecture) is far over what a device call carries.
# A build for sm_90 alone (H100, H200), and of only the device functions distflash calls, is a
# fraction of it; the pack carries it xz-compressed.
#
#   NCCL_SRC=GIT_DIR [NCCL_TAG=v2.30.7-1] [NCCL_ARCH=90] [NCCL_ONLY_FUNCS=...] scripts/build_nccl.sh [DEST]
#
# NCCL_SRC is a clone of github.com/NVIDIA/nccl (a bare one will do); the tag is checked out
# into a temporary directory. DEST defaults to ~/.cache/distflash/nccl-TAG-smARCH and receives
#   lib/libnccl.so.2     the library, stripped; it links CUDA's runtime statically, so it needs
#                        only the driver (libcuda.so.1) where it runs
#   include/nccl.h       its header (the GPU check runs scripts/check_nccl_abi.sh against it)
#   BUILD.json           tag, commit, architecture, the functions built, nvcc, size, build time
# NCCL_ONLY_FUNCS is NCCL's ONLY_FUNCS (src/device/generate.py): which device functions are
# compiled. The default is what kernels/cuda/nccl.go calls, every one in float32 and with ncclSum
# (ncclSend and ncclRecv, ncclAllReduce, ncclAllGather, ncclReduceScatter), every algorithm and
# protocol of each, and Broadcast: a 2.30.7 library of every function for sm_90 is 33 MB stripped
# and 30 MB in xz (cubins hardly compress), which with the tree and the rest of the pack is over a
# device call's 64 MiB. NCCL_ONLY_FUNCS= (empty) builds every function. A library of the default
# set runs any other reduction or type into a device function it does not have: only for
# distflash's own calls, never a general NCCL.
# A DEST that already holds a library is kept (NCCL_REBUILD=1 builds again); a build that fails
# leaves DEST as it was. The compiler is the CUDA 13.0 toolkit of scripts/build_cuda.sh --fetch
# ($CUDA_WHEEL_DIR, default ~/.cache/distflash/cuda-13.0; NVCC=/path/to/nvcc overrides), whose
# libcudart_static.a NCCL links; make and g++ besides. About 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/distflash
src=${NCCL_SRC:-}
tag=${NCCL_TAG:-v2.30.7-1}
arch=${NCCL_ARCH:-90}
only=${NCCL_ONLY_FUNCS-AllReduce Sum f32 * *|ReduceScatter Sum f32 * *|AllGather * *|Broadcast * *|SendRecv}
dest=${1:-$cache/nccl-$tag-sm$arch}
[[ -n "$src" ]] || {
	echo "build_nccl: NCCL_SRC must name a clone of github.com/NVIDIA/nccl (see the script's header)" >&2
	exit 2
}
git -C "$src" rev-parse --verify -q "$tag^{commit}" >/dev/null || {
	echo "build_nccl: $src has no tag $tag" >&2
	exit 2
}
if [[ -f "$dest/lib/libnccl.so.2" && -z "${NCCL_REBUILD:-}" ]]; then
	echo "build_nccl: $dest already holds a build ($(cat "$dest/BUILD.json" 2>/dev/null || echo 'no BUILD.json')); NCCL_REBUILD=1 builds again"
	exit 0
fi
nvcc=${NVCC:-${CUDA_WHEEL_DIR:-$cache/cuda-13.0}/nvidia/cu13/bin/nvcc}
[[ -x "$nvcc" ]] || {
	echo "build_nccl: no nvcc at $nvcc: scripts/build_cuda.sh --fetch --check installs CUDA 13.0's, or set NVCC" >&2
	exit 2
}
toolkit=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
lib=$toolkit/lib64
[[ -d "$lib" ]] || lib=$toolkit/lib # the wheels' layout
[[ -f "$lib/libcudart_static.a" ]] || {
	echo "build_nccl: no libcudart_static.a in $lib (NCCL links CUDA's runtime statically): install nvidia-cuda-runtime beside nvcc" >&2
	exit 2
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q --no-checkout "$src" "$tmp/nccl"
git -C "$tmp/nccl" -c advice.detachedHead=false checkout -q "$tag"
commit=$(git -C "$tmp/nccl" rev-parse HEAD)
# NCCL's makefiles want CUDA_HOME with bin/, include/ and lib64/
mkdir "$tmp/cuda"
ln -s "$toolkit/bin" "$tmp/cuda/bin"
ln -s "$toolkit/include" "$tmp/cuda/include"
ln -s "$lib" "$tmp/cuda/lib64"
start=$(date +%s)
echo "build_nccl: NCCL $tag ($commit) for sm_$arch, functions '${only:-all}', with $("$nvcc" --version | grep -o 'release [0-9.]*'), $(nproc) jobs"
if ! make -C "$tmp/nccl" -j"$(nproc)" src.build CUDA_HOME="$tmp/cuda" BUILDDIR="$tmp/build" ONLY_FUNCS="$only" \
	NVCC_GENCODE="-gencode=arch=compute_$arch,code=sm_$arch" >"$tmp/make.log" 2>&1; then
	tail -40 "$tmp/make.log" >&2
	echo "build_nccl: make failed (the last 40 lines above); $dest is unchanged" >&2
	exit 1
fi
seconds=$(($(date +%s) - start))
built=$(readlink -f "$tmp/build/lib/libnccl.so.2")
rm -rf "$dest.new"
mkdir -p "$dest.new/lib" "$dest.new/include"
cp "$built" "$dest.new/lib/libnccl.so.2"
strip --strip-unneeded "$dest.new/lib/libnccl.so.2"
cp "$tmp/build/include/nccl.h" "$dest.new/include/"
bytes=$(stat -c %s "$dest.new/lib/libnccl.so.2")
printf '{"tag": "%s", "commit": "%s", "arch": "sm_%s", "only_funcs": "%s", "nvcc": "%s", "bytes": %d, "build_seconds": %d, "jobs": %d, "date": "%s"}\n' \
	"$tag" "$commit" "$arch" "${only:-all}" "$("$nvcc" --version | grep -o 'V[0-9][0-9.]*')" "$bytes" "$seconds" "$(nproc)" \
	"$(date -u +%FT%TZ)" >"$dest.new/BUILD.json"
rm -rf "$dest.old"
[[ ! -e "$dest" ]] || mv "$dest" "$dest.old"
mv "$dest.new" "$dest"
rm -rf "$dest.old"
echo "build_nccl: $dest/lib/libnccl.so.2, $bytes bytes, built in $seconds s"
