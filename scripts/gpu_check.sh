#!/usr/bin/env bash
# The GPU check of distflash in one command per machine (docs/gpu.md: "CUDA backend", "GPU check").
#
#   scripts/gpu_check.sh pack DIR
#       On a machine with Go and a C compiler (no CUDA toolkit needed): builds
#       the -tags cuda distflash binary and the kernels test binary (stripped), and copies them
#       with the kernels' test vectors, the configs, 2 MiB of the Go source as byte-token shards
#       (the tiny config's training text) and the PyTorch scripts into DIR (about 30 MB).
#   scripts/gpu_check.sh run DIR OUT [--phase all|PHASE[,PHASE...]] [--budget SECONDS] [--steps REGEX]
#       On a machine with an NVIDIA GPU, python3 with PyTorch and optionally ncu; no Go needed.
#       Runs the phases (bench/gpu_check.py says what each checks and measures), in the order
#       given (all: by value, correctness gemm cudnn-first commands model curve multigpu
#       attention cudnn), each step with its own time limit, after printing the plan (every
#       step's limit, each phase's budget, the planned total), and writes OUT/report.md,
#       OUT/report.json, OUT/summary.json and OUT/logs.tar.gz (attention also
#       OUT/ncu_attn.ncu-rep and ncu_attn.txt). Exit status 1 when a step failed. Phase budgets:
#       correctness 6 min, gemm 2, cudnn-first 5, commands 4, model 7, curve 5, multigpu 8,
#       attention 7, cudnn 7 (BUDGET in bench/gpu_check.py); with --budget each phase in turn
#       gets the smaller of its budget and what is left.
#   scripts/gpu_check.sh merge DEST OUT1 OUT2 ...
#       Joins the reports of several runs (one per phase) into DEST/report.md and report.json.
#   scripts/gpu_check.sh dry-run OUT
#       Without a GPU: checks kernels/cuda/cuda_abi.h against the CUDA headers where they are
#       installed, packs into OUT/pack, then runs every phase with --dry (host-side tests,
#       CPU training, device.kind = cuda failing clearly, the PyTorch scripts on the CPU at
#       small sizes, plan, the report writer). Exit status 0 when everything passed.
set -euo pipefail

usage() {
	sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
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
	rm -rf "${dir:?}"/{bin,kernels,configs,data,bench,scripts,docs,ompi,MANIFEST.json}
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
		gzip -f -9 "$dir/bin/distflash-mpi" # 23 → 9 MB: the pack must stay under a device call's 64 MiB
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
	[[ -x "$dir/bin/distflash" && -x "$dir/bin/kernels.test" ]] || {
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
