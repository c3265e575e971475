#!/usr/bin/env bash
# Builds the CUDA backend's device code from kernels/cuda/*.cu into kernels/cuda/image/, which
# package kernels/cuda embeds into `go build -tags cuda` binaries (kernels/cuda/image.go), and the
# table of what ptxas says of every kernel. Per source NAME.cu:
#   image/NAME.ptx          PTX for compute_80 (the driver JIT-compiles it for any GPU of compute
#                           capability 8.0 or later: A100, Ada, H100/H200 and later generations)
#   image/NAME.sm_80.cubin  machine code for sm_80 (runs on 8.x GPUs)
#   image/NAME.sm_90a.cubin machine code for sm_90a (exactly compute capability 9.0: H100/H200;
#                           the architecture-specific target that wgmma, TMA and setmaxnreg need)
# and image/PTXAS.md: registers, spills, stack and shared memory per kernel and target.
# Only the sources live in kernels/cuda/; every generated file is in image/. Adding a module is
# adding its NAME.cu (this script finds every *.cu) and its kernels in kernels/cuda.go's
# ptxKernels.
# One PTX, not one per target: the sources have no __CUDA_ARCH__ branch, so compute_90 PTX was
# compute_80's with another .target line and, where a bf16 value is widened, cvt.f32.bf16 for
# mov.b32 {0, h}; ptxas turns both into sm_90 code of the same instruction count (the attn_mma
# kernels byte for byte). A kernel that needs Hopper's instructions belongs in the sm_90a cubin.
# Everything is committed, so building the Go side needs only a C compiler; run this after
# editing a .cu file.
#   scripts/build_cuda.sh            rebuild in place
#   scripts/build_cuda.sh --check    rebuild into a temporary directory and fail if anything
#                                    committed differs (not rebuilt after a .cu edit, or built by
#                                    another nvcc than the one below)
#   scripts/build_cuda.sh --fetch …  first install the toolkit below with pip (once, into
#                                    $CUDA_WHEEL_DIR, default ~/.cache/distflash/cuda-13.0),
#                                    and use its nvcc
#
# The toolkit is CUDA 13.0 (nvcc 13.0.88) from NVIDIA's wheels on PyPI, about 250 MB installed:
#   pip install --target DIR nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
#       nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85        (then NVCC=DIR/nvidia/cu13/bin/nvcc)
# CUDA 13.0 writes PTX ISA 9.0, the newest a driver of the CUDA 13.0 generation (580) accepts;
# the GPU machines run driver 580. The committed artifacts are nvcc 13.0.88's: --check compares
# bytes, so it needs that nvcc. NVCC=/path/to/nvcc overrides the search ($NVCC, nvcc on PATH,
# $CUDA_WHEEL_DIR/nvidia/cu13/bin/nvcc).
#
# No fast-math: the elementwise kernels rely on IEEE division, square root, and exp/log in double
# to agree with the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${CUDA_WHEEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/distflash/cuda-13.0}
want=13.0.88
check=0
for arg in "$@"; do
	case "$arg" in
	--check) check=1 ;;
	--fetch)
		NVCC=${NVCC:-$wheels/nvidia/cu13/bin/nvcc}
		if [[ ! -x "$wheels/nvidia/cu13/bin/nvcc" ]]; then
			python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --target "$wheels" \
				nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
				nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
		fi
		;;
	*)
		echo "usage: $0 [--fetch] [--check]" >&2
		exit 2
		;;
	esac
done
NVCC=${NVCC:-}
if [[ -z "$NVCC" ]]; then
	if command -v nvcc >/dev/null; then
		NVCC=$(command -v nvcc)
	elif [[ -x "$wheels/nvidia/cu13/bin/nvcc" ]]; then
		NVCC="$wheels/nvidia/cu13/bin/nvcc"
	else
		echo "build_cuda: no nvcc (\$NVCC, PATH, $wheels): run $0 --fetch, or see the script's header" >&2
		exit 2
	fi
fi
PTXAS="$(dirname "$NVCC")/ptxas"
[[ -x "$PTXAS" ]] || PTXAS=ptxas
version=$("$NVCC" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')
echo "nvcc $version ($NVCC)"
if [[ "$version" != "$want" && $check == 1 ]]; then
	echo "build_cuda: the committed device code is nvcc $want's; $NVCC is $version (run $0 --fetch --check)" >&2
	exit 1
fi

src=kernels/cuda
img=$src/image
out=$img
tmps=()
trap 'rm -rf "${tmps[@]}"' EXIT
if ((check)); then
	out=$(mktemp -d)
	tmps+=("$out")
fi
log=$(mktemp)
tmps+=("$log")
flags=(-std=c++17 -O3)
mkdir -p "$out"
for cu in "$src"/*.cu; do
	name=$(basename "${cu%.cu}")
	"$NVCC" -ptx "${flags[@]}" -arch=compute_80 -o "$out/$name.ptx" "$cu"
	for arch in sm_80 sm_90a; do
		"$NVCC" -cubin "${flags[@]}" -arch="$arch" -Xptxas -v -o "$out/$name.$arch.cubin" "$cu" 2>>"$log"
	done
done

# PTXAS.md: one row per kernel, from ptxas -v of the cubins.
{
	echo "# ptxas -v of every kernel"
	echo
	echo "Written by scripts/build_cuda.sh from \`ptxas -v\` (nvcc $version, -O3) of the committed cubins: registers per"
	echo "thread, spill stores/loads and stack frame in bytes, static shared memory in bytes. The attention kernels'"
	echo "dynamic shared memory is set at launch (kernels/cuda_geom.go, planAttn) and is not in these figures."
	echo
	echo "| kernel | sm_80 registers | sm_80 spills (st/ld) | sm_80 stack | sm_80 smem | sm_90a registers | sm_90a spills (st/ld) | sm_90a stack | sm_90a smem |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
	awk '
		/Compiling entry function/ { k = $0; sub(/.*function \x27/, "", k); sub(/\x27.*/, "", k); a = $0; sub(/.*for \x27/, "", a); sub(/\x27.*/, "", a); key = k SUBSEP a; if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
		/bytes stack frame/ { stack[key] = $1; spill[key] = $5 "/" $9 }
		/Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "registers,") regs[key] = $i; if ($(i+1) == "bytes" && $(i+2) == "smem,") smem[key] = $i; if ($(i+1) == "bytes" && $(i+2) == "smem") smem[key] = $i } }
		END {
			for (i = 0; i < n; i++) {
				k = order[i]; line = "| " k
				split("sm_80 sm_90a", as, " ")
				for (j = 1; j <= 2; j++) { key = k SUBSEP as[j]; line = line " | " regs[key] " | " spill[key] " | " stack[key] " | " (key in smem ? smem[key] : 0) }
				print line " |"
			}
		}' "$log" | sort
} >"$out/PTXAS.md"

status=0
# Generated files beside the sources (the layout before image/, or a stray nvcc output) are
# stale: they are neither embedded nor checked.
for f in "$src"/*.ptx "$src"/*.cubin "$src"/*.fatbin "$src"/PTXAS.md; do
	[[ -e "$f" ]] || continue
	if ((check)); then
		echo "$f: generated files belong in $img/, not beside the sources: remove it" >&2
		status=1
	else
		rm -v "$f"
	fi
done
if ((check)); then
	for f in "$out"/*; do
		b=$(basename "$f")
		if ! cmp -s "$f" "$img/$b"; then
			echo "$img/$b is not what $src/*.cu compile to with nvcc $version: run scripts/build_cuda.sh" >&2
			status=1
		fi
	done
	for f in "$img"/*; do
		[[ -e "$out/$(basename "$f")" ]] || { echo "$f has no .cu source: remove it" >&2; status=1; }
	done
	((status)) || echo "committed $img is up to date ($(ls "$out"/*.ptx | wc -l) PTX, $(ls "$out"/*.cubin | wc -l) cubins, PTXAS.md)"
else
	for f in "$img"/*; do # a module whose source is gone
		b=$(basename "$f")
		[[ "$b" == PTXAS.md || -e "$src/${b%%.*}.cu" ]] || rm -v "$f"
	done
	grep -c '^| df_' "$out/PTXAS.md" | xargs echo "kernels in $img/PTXAS.md:"
	awk -F'|' '/^\| df_/ && ($4 !~ / 0\/0 / || $8 !~ / 0\/0 /) { print "spills:" $0 }' "$out/PTXAS.md"
	ls -l "$img"
fi
exit $status
