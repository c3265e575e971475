#!/usr/bin/env bash
# The GPU check of distflash in one command per machine (docs/gpu.md: "CUDA backend", "GPU check").
#
#   scripts/gpu_check.sh pack DIR
#       On a machine with Go, a C compiler and xz (no CUDA toolkit needed): builds the -tags
#       cuda distflash binary, its -tags 'cuda mpi' build and the kernels test binary
#       (stripped), and puts them with the kernels' test vectors, the configs, 2 MiB of the Go
#       source as byte-token shards (the tiny config's training text), the PyTorch scripts,
#       Debian's Open MPI packages and the NCCL that scripts/build_nccl.sh built
#       ($DISTFLASH_NCCL_DIR, default ~/.cache/distflash/nccl-v2.30.7-1-sm90) into DIR, the
#       binaries, the shards and NCCL in xz (about 28 MiB); then says what a device call
#       carries, the repository's tree and DIR, and fails when that is over the call's 64 MiB.
#   scripts/gpu_check.sh run DIR OUT [--phase all|PHASE[,PHASE...]] [--budget SECONDS] [--steps REGEX]
#       On a machine with an NVIDIA GPU, python3 with PyTorch and optionally ncu; no Go needed.
#       Unpacks DIR's .xz files in place, then runs the phases (bench/gpu_check.py says what
#       each checks and measures), in the order given (all: by value, correctness gemm
#       cudnn-first commands model curve multigpu attention cudnn), each step with its own
#       time limit, after printing the plan (every step's limit, each phase's budget, the
#       planned total), and writes OUT/report.md, OUT/report.json, OUT/summary.json and
#       OUT/logs.tar.gz (attention also OUT/ncu_attn.ncu-rep and ncu_attn.txt). Exit status 1
#       when a step failed. Phase budgets:
#       correctness 6 min, gemm 2, cudnn-first 5, commands 4, model 7, curve 5, multigpu 8,
#       attention 7, cudnn 7 (BUDGET in bench/gpu_check.py); with --budget each phase in turn
#       gets the smaller of its budget and what is left.
#   scripts/gpu_check.sh merge DEST OUT1 OUT2 ...
#       Joins the reports of several runs (one per phase) into DEST/report.md and report.json.
#   scripts/gpu_check.sh dry-run OUT
#       Without a GPU: checks kernels/cuda/cuda_abi.h against the CUDA headers where they are
#       installed, packs into OUT/pack, then runs every phase with --dry (host-side tests,
#       CPU training, device.kind = cuda failing clearly, the PyTorch scripts on the CPU at
#       small sizes, plan, the report writer, NCCL loaded and checked against its header).
#       Exit status 0 when everything passed.
set -euo pipefail

usage() {
	sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
}

here="$(cd "$(dirname "$0")" && pwd)"
# python3 with PyTorch: $PYTHON, else the first of python3 and /usr/bin/python3 that imports torch.
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
	py=python3
	for c in python3 /usr/bin/python3; do
		if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then
			py="$c"
			break
		fi
	done
fi

pack() {
	local dir="$1" repo
	repo="$(cd "$here/.." && pwd)"
	command -v go >/dev/null || { echo "pack: needs Go on PATH" >&2; exit 1; }
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd)"
	rm -rf "${dir:?}"/{bin,kernels,configs,data,bench,scripts,docs,ompi,nccl,MANIFEST.json}
	mkdir -p "$dir"/{bin,kernels,configs,data,bench,scripts,docs}
	(
		cd "$repo"
		export CGO_ENABLED=1
		go build -tags cuda -trimpath -ldflags='-s -w' -o "$dir/bin/distflash" .
		go test -c -tags cuda -trimpath -ldflags='-s -w' -o "$dir/bin/kernels.test" ./kernels
		# the multigpu phase: the MPI build and Debian's Open MPI, unpacked and relocated there
		go build -tags 'cuda mpi' -trimpath -ldflags='-s -w' -o "$dir/bin/distflash-mpi" .
		# -tags mpi takes the MPI pkg-config's mpi names (update-alternatives --config mpi): it must be the Open MPI packed below
		"$dir/bin/distflash-mpi" version | grep -q 'MPI built against Open MPI' ||
			{ echo "pack: the MPI build is not against Open MPI ($("$dir/bin/distflash-mpi" version)); the multigpu phase ships Debian's Open MPI: update-alternatives --set mpi /usr/bin/mpicc.openmpi, go clean -cache (the build cache does not see the change), and pack again" >&2; exit 1; }
		rm -rf "$dir/ompi"
		mkdir -p "$dir/ompi"
		if command -v apt-get >/dev/null; then
			(cd "$dir/ompi" && apt-get download -q openmpi-bin openmpi-common libopenmpi3 ibverbs-providers libatomic1 \
				libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libhwloc15 libibverbs1 libmunge2 libnl-3-200 \
				libnl-route-3-200 libnuma1 libpmix2 libpsm-infinipath1 libpsm2-2 librdmacm1 libucx0 2>&1 | grep -v '^W:' || true)
		else
			echo "pack: no apt-get: the multigpu phase will find no Open MPI" >&2
		fi
		cp -r kernels/testdata "$dir/kernels/"
		cp docs/gpu.md "$dir/docs/" # TestCUDAHostCUDNNCheck holds cuDNN's support table to its rows
		cp configs/tiny.toml configs/llama-1b.toml "$dir/configs/"
		# the commands phase's evaluation text: a few Go source files, one document each
		mkdir -p "$dir/data/eval"
		cp "$(go env GOROOT)"/src/fmt/{format,print,scan,errors}.go "$dir/data/eval/"
		cp bench/gpu_check.py bench/cuda_attn.py bench/torch_llama.py bench/torch_train.py bench/torch_ops.py "$dir/bench/"
		# the gemm phase's PyTorch side (issue 41's GEMM table); the phase fails naming it when it is missing
		if [[ -e bench/torch_gemm.py ]]; then
			cp bench/torch_gemm.py "$dir/bench/"
		else
			echo "pack: bench/torch_gemm.py is missing: the gemm phase's PyTorch side will fail, saying so" >&2
		fi
		cp scripts/gpu_check.sh scripts/check_nccl_abi.sh scripts/check_nccl_abi.c scripts/check_cudnn_abi.sh scripts/check_cudnn_abi.c "$dir/scripts/"
		mkdir -p "$dir/kernels/cuda" # the NCCL ABI check's declarations
		cp kernels/cuda/nccl_abi.h kernels/cuda/nccl_abi_funcs.h kernels/cuda/cuda_abi.h kernels/cuda/cuda_abi_funcs.h \
			kernels/cuda/cudnn_abi.h kernels/cuda/cudnn_abi_funcs.h "$dir/kernels/cuda/"
		"$dir/bin/distflash" data tokenize --config configs/tiny.toml --set data.max_bytes=2097152 \
			--out "$dir/data/go.tokens" --progress=false
		# NCCL >= 2.30 built for sm_90 (scripts/build_nccl.sh): several ranks on the one GPU
		local nccl="${DISTFLASH_NCCL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/distflash/nccl-v2.30.7-1-sm90}"
		mkdir -p "$dir/nccl"
		if [[ -f "$nccl/lib/libnccl.so.2" ]]; then
			mkdir -p "$dir/nccl/include"
			cp "$nccl/lib/libnccl.so.2" "$dir/nccl/"
			cp "$nccl/include/nccl.h" "$dir/nccl/include/"
			cp "$nccl/BUILD.json" "$dir/nccl/" 2>/dev/null || true
		else
			echo "pack: no NCCL build in $nccl (scripts/build_nccl.sh makes one; DISTFLASH_NCCL_DIR names another): the GPU check uses the machine's NCCL wheel, and its 4-rank NCCL cases run only where that is 2.30 or later" >&2
		fi
		# xz: the tree and the pack together must stay under a device call's 64 MiB; the run
		# unpacks every .xz in place (bench/gpu_check.py, unpack)
		command -v xz >/dev/null || { echo "pack: needs xz (apt-get install xz-utils)" >&2; exit 1; }
		find "$dir/bin" "$dir/data" "$dir/nccl" -type f \( -name distflash -o -name kernels.test -o -name distflash-mpi \
			-o -name go.tokens -o -name libnccl.so.2 \) -print0 | xargs -0 xz -f -9 -T0
		local nvcc="none"
		command -v nvcc >/dev/null && nvcc="$(nvcc --version | grep -o 'release [0-9.]*' || true)"
		local commit dirty=false
		commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
		[[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || dirty=true
		printf '{"commit": "%s", "dirty": %s, "go": "%s", "nvcc": "%s", "date": "%s", "host": "%s"}\n' \
			"$commit" "$dirty" "$(go env GOVERSION)" "nvcc $nvcc" "$(date -u +%FT%TZ)" "$(uname -srm)" \
			>"$dir/MANIFEST.json"
	)
	echo "packed $(du -sh "$dir" | cut -f1) into $dir:"
	(cd "$dir" && find . -type f -printf '  %p %s bytes\n' | grep -v '/testdata/' | sort)
	travel "$dir"
}

# travel DIR: what a device call carries, the repository's tree (tracked and untracked files
# that git does not ignore) and the pack DIR, against the call's 64 MiB; status 1 when over.
travel() {
	local repo tree pack limit=$((64 << 20))
	repo="$(cd "$here/.." && pwd)"
	tree=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
	pack=$(du -sb "$1" | cut -f1)
	if [[ "$1" == "$repo"/* ]] && ! (cd "$repo" && git check-ignore -q "$1"); then
		pack=0 # a pack inside the tree that git does not ignore is counted in the tree
	fi
	awk -v t="$tree" -v p="$pack" 'BEGIN { m = 1048576
		printf "a device call carries the tree (%.1f MiB) and the pack (%.1f MiB): %.1f of its 64 MiB\n", t / m, p / m, (t + p) / m }'
	((tree + pack <= limit)) || { echo "pack: over a device call's 64 MiB: compress more or pack less" >&2; return 1; }
}

cmd="${1:-}"
shift || true
case "$cmd" in
pack)
	[[ $# -eq 1 ]] || usage
	pack "$1"
	;;
run)
	[[ $# -ge 2 ]] || usage
	dir="$1" out="$2"
	shift 2
	[[ -e "$dir/bin/distflash.xz" || -x "$dir/bin/distflash" ]] && [[ -e "$dir/bin/kernels.test.xz" || -x "$dir/bin/kernels.test" ]] || {
		echo "run: $dir has no bin/distflash or bin/kernels.test: make it with scripts/gpu_check.sh pack $dir" >&2
		exit 1
	}
	mkdir -p "$out"
	exec "$py" "$dir/bench/gpu_check.py" run --pack "$dir" --out "$out" "$@"
	;;
merge)
	[[ $# -ge 2 ]] || usage
	dest="$1"
	shift
	exec "$py" "$here/../bench/gpu_check.py" merge --dest "$dest" "$@"
	;;
dry-run)
	[[ $# -eq 1 ]] || usage
	out="$1"
	mkdir -p "$out"
	status=0
	if echo '#include <cuda.h>' | gcc -E -x c - >/dev/null 2>&1; then
		"$here/check_cuda_abi.sh" || status=1
	else
		echo "dry-run: no cuda.h here: kernels/cuda/cuda_abi.h not compared with the CUDA headers"
	fi
	pack "$out/pack"
	# the NCCL ABI check's cuda_runtime.h, which nccl.h includes: scripts/build_cuda.sh's toolkit
	cu="${CUDA_WHEEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/distflash/cuda-13.0}/nvidia/cu13/include"
	[[ -n "${CUDA_INCLUDE:-}" || ! -f "$cu/cuda_runtime.h" ]] || export CUDA_INCLUDE="$cu"
	phases=(correctness gemm cudnn-first commands model curve multigpu attention cudnn) # bench/gpu_check.py's PHASES
	for phase in "${phases[@]}"; do
		"$py" "$out/pack/bench/gpu_check.py" run --pack "$out/pack" --out "$out/$phase" --phase "$phase" --dry || status=1
	done
	"$py" "$here/../bench/gpu_check.py" merge --dest "$out" "${phases[@]/#/$out/}"
	exit $status
	;;
*)
	usage
	;;
esac
