#!/usr/bin/env python3
"""The GPU check of distflash, run from a folder that `scripts/gpu_check.sh pack` made (binaries,
test binary, PyTorch scripts, token data), on a machine with an NVIDIA GPU, PyTorch and,
optionally, Nsight Compute, but no Go. scripts/gpu_check.sh is the entry point:

    python3 bench/gpu_check.py run --pack DIR --out OUT [--phase all|PHASE[,PHASE...]]
                                   [--budget SECONDS] [--steps REGEX] [--dry]
    python3 bench/gpu_check.py merge --dest DIR OUT1 OUT2 ...

Phases, in the order of their value (PHASES; --phase all runs them so): each has a budget that
fits one 10-minute command (BUDGET); with several and a --budget, each in turn gets the smaller
of its budget and what is left, so the most valuable run first and time a phase leaves unused
passes on. `run` prints the plan first: every step's limit, each phase's budget and the planned
total. Every step has its own time limit, a failing or timed-out step is recorded and the next
one runs, and OUT gets the results even when steps fail. --steps runs only the steps whose name
the expression finds, for a rerun after a fix; merge then lets a later report's run of a step
replace an earlier one, which the report lists as superseded. On the H200 the correctness,
attention and model phases of the time took 7 minutes together (bench/results/h200-2026-11-26).

  correctness  the kernels test binary (every Backend method against the CPU backend, the
               training-step parity test, the host-side tests), then `train --config tiny.toml`
               for 50 steps four times: cpu/cuda × fp32/bf16. fp32: cuda's loss at every step
               within 1e-5 relative of cpu's. bf16: max_s |cuda_bf16 − cpu_fp32| / cpu_fp32 ≤
               2 × max_s |cpu_bf16 − cpu_fp32| / cpu_fp32 (cuda's bf16 curve stays in the band
               the CPU's bf16 run has around the fp32 curve; 2× for two independent roundings).
               Then the same config with data.document_mask = true (the Go files packed as
               documents, attention masked by document) for 20 steps, cpu and cuda in fp32:
               cuda's loss at every step within 1e-5 relative of cpu's. The test binary holds
               the kernel-level document-mask cases (TestCUDAAttnFP32/TensorCores *_docs_*).
               Then configs/llama-1b.toml's shape (head_dim 128, GQA 16/4, vocab 32000) cut to
               2 layers at seq 1024, 4 steps fp32 on cpu and cuda: within 1e-5 relative. Last,
               compute-sanitizer memcheck and racecheck over the kernels tests SANITIZER_RUNS
               names: no error, every test passing under the tool.
  gemm         issue 41's GEMM table: the review's 18 products of the 0.85B step at 8K, in
               distflash's modes (fp32-storage: today's cublasGemmEx on float32 A, B, C;
               bf16: 16-bit A, B and C; bf16-f32c: 16-bit A, B, float32 C) from the kernels
               test binary's BenchmarkCUDAGemmTable (-test.benchtime 20x, records written to
               DISTFLASH_GEMM_OUT), beside torch.matmul in bf16 (bench/torch_gemm.py): TFLOP/s
               per shape and mode, each of ours over torch's, and the FLOP-weighted rate of each
               mode, under "gemm" in summary.json. Right after correctness: half a minute that
               settles the largest row of the predicted 8K budget (docs/gpu.md), needing neither
               cuDNN nor the model. A dry run checks that the benchmark is in the binary and
               fails without a GPU, runs torch_gemm.py --dry and the join on made-up records; a
               side missing from the pack fails its step, naming it.
  model        the 0.85B LLaMA (configs/llama-1b.toml: dim 2048, 16 layers, 16 heads, 4 kv heads,
               ffn 5632, vocab 32000), bf16, at 8K, 64K and 128K tokens a step, device.attention
               cudnn, with the checkpoint policy auto where the binary accepts it (`plan` with
               checkpoint.activation = auto decides; else attn_output, and the report says
               which), plus at 8K checkpoint none with mlp_tile 0 and the own attention kernel;
               PyTorch (bench/torch_ops.py: torch_llama.py's step, attn_output through the flash
               ops, and none at 8K) at each length. Each run, ours and PyTorch's, is one process:
               warm-up steps, timed steps (the median gives tokens/s), and the per-op table of its
               profiled steps (ours: `train --profile`, ops.json; PyTorch's: torch.profiler in the
               same classes); at 64K and 128K ours times the profiled steps. Timing runs use a
               constant learning rate from the first step (TIMING_SETS), as PyTorch's. Peak GPU
               memory is the largest `nvidia-smi` memory.used while the run lasts, minus the value
               before it (the same measurement for both programs; PyTorch's allocator peak is
               reported beside it); `distflash plan` at each length beside ours. The report has
               MFU, the ratios to PyTorch (the goals under "goals" in summary.json), every per-op
               table beside PyTorch's of the same length and policy, and each table rolled up into
               the components of docs/gpu.md's predicted 8K budget beside the prediction
               ("budget_8k"). A run is ended once its last step and table are written (the final
               checkpoint of 10 GB is not needed). PyTorch out of memory is a result.
  curve        the 0.85B's bf16 curve beside PyTorch's at 8K (curve_1b below).
  (the rest below by subject; PHASES has the order)
  attention    bench/cuda_attn.py, in two steps (torch, then distflash): distflash's
               FlashAttention kernel (forward, forward+backward, causal, bf16, head_dim 64 and
               128, seq 4K/16K/64K) beside torch SDPA (flash and cuDNN backends) on the same
               shapes; then one `ncu` profile of the forward and the two backward kernels
               (head_dim 128, 16K).
  multigpu     several processes on the one GPU over MPI with device buffers (issue "many
               GPUs", part 3): Open MPI from the Debian packages the pack carries, unpacked into
               the work folder and run relocated (OPAL_PREFIX); then `mpirun -np 4` of the
               -tags 'cuda mpi' binary, device.kind = cuda, every schedule on 4
               sequence-parallel ranks, the ring × Ulysses hybrid and FSDP over the 4, 10 steps
               fp32, each rank's exchanges staged through host copies: the losses within 1e-5
               relative of one GPU rank's at every step. --dry runs the same with
               device.kind = cpu-device (the CPU posing as a device) against one CPU rank.
               Then NCCL (parallelism.backend = nccl): the pack's libnccl.so.2 (NCCL 2.30
               built for sm_90 by scripts/build_nccl.sh), else that of the nvidia-nccl wheel
               PyTorch brings; its version, scripts/check_nccl_abi.sh against its nccl.h; one
               NCCL rank against one GPU rank; and, where NCCL ≥ 2.30 allows several ranks on
               one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1), the 4-rank cases over NCCL against one
               rank (sums in NCCL's order: 1e-5 relative still). A dry run loads the library,
               reads its version and checks its header; the NCCL runs need a GPU.

  commands     every command where train runs (issue "one world", part 4): a tiny checkpoint
               trained on the CPU here, then `eval` (loss and --positions), `eval --task
               passkey` and greedy `generate` of it on CUDA in one process, on 4 MPI processes
               on the GPU (4 sequence-parallel ranks, ring; 2 replicas × 2 ranks, zigzag, FSDP)
               and over NCCL (one rank; 4 ranks on the GPU where NCCL ≥ 2.30 allows it), each
               against one CPU rank: the loss and every position bucket within 1e-5 relative
               (float32 per-token losses summed in float64 in sample order on every world; the
               kernels differ in rounding only), the passkey answers and the generated tokens
               equal (greedy: the largest logit, which rounding moves only where the top two
               are within 1e-5). --dry runs the same with device.kind = cpu-device.

  cudnn-first  cuDNN's fused attention the first time it meets a GPU (the cuDNN review's D0–D7,
               docs/gpu.md "cuDNN's fused attention"), at most 5 minutes: the cuDNN and NVRTC
               of the Python environment (D0: files, versions, whether NVRTC and its builtins
               load); the kernels test binary's TestCUDACUDNNFirst with CUDNN_LOGLEVEL_DBG=2
               (D0–D6: one block forward and backward against the own kernel, with the real O
               and with the synthetic O′, softmax_sum against D, the two forms' time, the
               deterministic and default workspace at 8K × 32 heads, the mask matrix, TFLOP/s of
               cuDNN and the own kernel at head_dim 64/128, 4K–16K, with the glue's share);
               PyTorch SDPA (cuDNN backend) on the same shapes; and D7, two steps of the tiny
               config at 2048 tokens over 2 ranks with ring and with distflash, bf16, cuDNN
               against the own kernel (losses within 2e-3 relative, gradient norms 5e-2: the
               kernels round P and dS to bf16 at different points), the plans the warm-up built
               and no block that cuDNN was meant to take on the own kernel. --dry runs
               TestCUDACUDNNFirst on the stub cuDNN and the recording fake device
               (DISTFLASH_CUDNN_FIRST=stub: the routing, plans and workspaces, no numbers), the
               SDPA script on the CPU, and D7 on CPU ranks.
  cudnn        cuDNN's fused attention behind the CUDA backend (issue "GPU attention at cuDNN's
               speed", part 2): the cuDNN the Python environment carries (the nvidia-cudnn wheel
               PyTorch brings), its version, scripts/check_cudnn_abi.sh against its headers;
               PyTorch SDPA's cuDNN graphs captured with CUDNN_LOGLEVEL_DBG=3 (the log kept for
               comparison with ours); the kernels test binary with DISTFLASH_ATTENTION=cudnn
               (every Backend method and TestCUDATrainStep, every block kind routed to cuDNN
               where it can: the paths each test took are in its log); tiny 50-step bf16 curves
               with device.attention = cudnn against the CPU's band; the attention benchmark's
               distflash side with cuDNN beside the own kernel's numbers of the attention phase;
               the 0.85B model at 8K with cuDNN. --dry checks only what needs no GPU (the ABI
               check against the headers of a wheel cached on this machine, when there is one).

MFU counts 6·N + 6·L·d·S FLOPs per token: N the parameters without the input embedding table
(the output head's matmul counts), L layers, d = heads × head_dim, S the sequence length; the
attention term is 12·L·d·S (QKᵀ and PV, forward and backward) halved for the causal mask.
Recomputation is not counted. Peak: 989e12 bf16 FLOP/s dense for H100 SXM and H200.

--dry runs what needs no GPU, on the CPU at small sizes, through the same code: the host-side
tests of the test binary, the CPU training curves (and checks that device.kind = cuda fails
with a clear error), the PyTorch scripts, plan, the parsers and the report writer.

OUT receives report.md, report.json and logs.tar.gz (every step's output), plus ncu_attn.ncu-rep
and ncu_attn.txt from the attention phase: few files, since a device command returns at most 8.
"""

import argparse
import glob
import json
import lzma
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time

# The phases in order of value (issue 39, "the device run"): what a device session of 15 minutes
# runs first. correctness first (the PTX nvcc 13 rebuilt and the kernels' parity: if they fail, no
# figure after them counts); gemm right after it (issue 41's GEMM table: half a minute that
# settles the largest row of the predicted step budget, docs/gpu.md "The 8K step's budget",
# with no dependence on cuDNN or the model); then cuDNN's first run, the commands on every
# world, the 0.85B model and its per-op tables, the curve beside PyTorch's; last the phases
# that earlier ones superseded or that need the most time (multigpu, attention, cudnn).
PHASES = ["correctness", "gemm", "cudnn-first", "commands", "model", "curve", "multigpu", "attention", "cudnn"]
# The most each phase may use, in seconds, each inside one 10-minute command. A run of several
# phases gives each, in order, the smaller of its budget and what --budget has left (the most
# valuable phase first; time a phase leaves unused passes on); a step gets the smaller of its
# own limit and what its phase has left. `run` prints the plan before it starts.
BUDGET = {"correctness": 360, "gemm": 120, "cudnn-first": 300, "commands": 240, "model": 420, "curve": 300,
          "multigpu": 480, "attention": 420, "cudnn": 420}
CURVE_STEPS = 50
DOC_STEPS = 20
FP32_TOL = 1e-5
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Runner:
    """Runs steps with time limits inside a budget and records them."""

    def __init__(self, pack, out, budget, dry, only=None):
        self.pack, self.out, self.dry = os.path.abspath(pack), os.path.abspath(out), dry
        self.work = os.path.join(self.out, "work")
        self.logs = os.path.join(self.work, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.deadline = time.monotonic() + budget
        self.end = self.deadline  # the whole run's deadline; deadline is the current phase's
        self.steps = []
        self.only = only  # a regular expression: run only the steps whose name it finds
        self.planning = None  # a list while plan() collects the steps instead of running them
        self.env = dict(os.environ)
        self.meta = {"started": now(), "dry_run": dry, "pack": self.read_manifest()}

    def read_manifest(self):
        try:
            with open(os.path.join(self.pack, "MANIFEST.json")) as f:
                return json.load(f)
        except OSError as e:
            return {"error": str(e)}

    def bin(self, name):
        return os.path.join(self.pack, "bin", name)

    def left(self):
        return self.deadline - time.monotonic()

    def start_phase(self, phases, i):
        """Sets the deadline of phases[i]: its BUDGET, or what the run has left if that is less."""
        self.deadline = min(time.monotonic() + BUDGET[phases[i]], self.end)

    def plan(self, phases, fns):
        """The steps each phase would run, their limits and expected seconds, without running them
        (each phase function called with step() recording only): [(phase, [(step, limit,
        expected or None), ...]), ...]."""
        self.planning, out = [], []
        try:
            for p in phases:
                self.planning.clear()
                fns[p](self)
                out.append((p, list(self.planning)))
        finally:
            self.planning = None
        return out

    def step(self, phase, name, fn, timeout, expect=None):
        """Runs fn(timeout) -> dict (its result) and records it; fn raises Fail or Timeout.
        expect is the seconds the step should take on the GPU (for the plan), where known."""
        if getattr(self, "planning", None) is not None:
            self.planning.append((name, timeout, expect))
            return {"phase": phase, "name": name, "status": "planned"}
        rec = {"phase": phase, "name": name, "status": "pass", "started": now()}
        if self.only and not re.search(self.only, name):
            rec.update(status="skipped", note=f"not selected by --steps {self.only}")
            self.steps.append(rec)
            return rec
        limit = min(timeout, self.left() - 5)
        if limit < min(30, timeout):
            rec.update(status="skipped", note=f"budget: {self.left():.0f} s left, step needs up to {timeout} s")
            self.steps.append(rec)
            print(f"[{phase}] {name}: skipped (budget)", flush=True)
            return rec
        t0 = time.monotonic()
        print(f"[{phase}] {name} (limit {limit:.0f} s) ...", flush=True)
        try:
            rec["result"] = fn(limit) or {}
        except Timeout as e:
            rec.update(status="timeout", note=str(e))
        except Skip as e:
            rec.update(status="skipped", note=str(e))
        except Fail as e:
            rec.update(status="fail", note=str(e))
        except Exception as e:  # a bug in this script or unexpected output: record, go on
            rec.update(status="fail", note=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.monotonic() - t0, 2)
        if "result" in rec and isinstance(rec["result"], dict) and rec["result"].get("failed"):
            rec["status"] = "fail"
            rec.setdefault("note", rec["result"]["failed"])
        if "result" in rec and isinstance(rec["result"], dict) and rec["result"].get("note") and "note" not in rec:
            rec["note"] = rec["result"]["note"]
        self.steps.append(rec)
        print(f"[{phase}] {name}: {rec['status']} in {rec['seconds']} s {rec.get('note', '')}", flush=True)
        return rec

    def sh(self, name, cmd, timeout, cwd=None, env=None, ok_codes=(0,), done=None):
        """Runs cmd, its output to logs/name.log; returns (exit code, output). done, if given, is
        asked twice a second while cmd runs: once it returns true, cmd and its children are ended
        (SIGKILL) and the call returns as if cmd had exited with 0 (a training run whose last
        needed step is written, spared its final checkpoint)."""
        log = os.path.join(self.logs, name + ".log")
        e = dict(self.env, **(env or {}))
        ended = False
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:  # a session of its own, so that a timeout ends its children too (GPU work)
                p = subprocess.Popen(cmd, cwd=cwd, env=e, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as err:
                raise Fail(f"cannot run {cmd[0]}: {err}")
            end = time.monotonic() + timeout
            while True:
                try:
                    p.wait(timeout=max(0.0, min(0.5, end - time.monotonic())) if done else max(0.0, end - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    if done is not None and done():
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                        ended = True
                        break
                    if time.monotonic() >= end:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                        raise Timeout(f"{os.path.basename(cmd[0])} ran past {timeout:.0f} s (log: logs/{name}.log)")
            if ended:
                f.write("\n(gpu_check: ended here, its last needed step written)\n")
        with open(log, errors="replace") as f:
            text = f.read()
        if ended:
            return 0, text
        if p.returncode not in ok_codes:
            raise Fail(f"exit status {p.returncode}: {tail(text, 600)}")
        return p.returncode, text


class Fail(Exception):
    pass


class Timeout(Exception):
    pass


class Skip(Exception):
    pass


def tail(text, n):
    t = text.strip()
    return t if len(t) <= n else "…" + t[-n:]


# ---------------------------------------------------------------------------------------------
# Environment


def find_cublas():
    """The newest libcublas.so.N this machine has (path), or None."""
    pats = ["/usr/local/cuda*/lib64/libcublas.so.*", "/usr/local/cuda*/targets/*/lib/libcublas.so.*",
            "/usr/lib/x86_64-linux-gnu/libcublas.so.*", "/opt/*/.venv/lib/python3*/site-packages/nvidia/**/libcublas.so.*",
            "/usr/local/lib/python3*/dist-packages/nvidia/**/libcublas.so.*"]
    try:
        import site
        for d in site.getsitepackages():
            pats.append(os.path.join(d, "nvidia", "**", "libcublas.so.*"))
    except (ImportError, AttributeError):
        pass
    found = set()
    for p in pats:
        found.update(glob.glob(p, recursive=True))
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        found.update(re.findall(r"=> (\S*libcublas\.so\.\d+)\s*$", out, re.M))
    except OSError:
        pass

    def major(p):
        m = re.search(r"libcublas\.so\.(\d+)$", p)
        return int(m.group(1)) if m else -1

    found = [p for p in found if major(p) >= 11]
    return max(found, key=lambda p: (major(p), p)) if found else None


def find_libcuda():
    """libcuda.so.1 where the loader would not find it by name (None: leave it to the loader)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        if "libcuda.so.1 " in out:
            return None
    except OSError:
        pass
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.exists(os.path.join(d, "libcuda.so.1")):
            return None
    for p in ["/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib/libcuda.so.1",
              "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"]:
        if os.path.exists(p):
            return p
    return None


def setup_env(r):
    """LD_LIBRARY_PATH and DISTFLASH_CUBLAS for cuBLAS; GPU, driver, torch and ncu facts."""
    info = {}
    # The driver compiles the embedded PTX at each process's first module load; its cache
    # (default 256 MiB or 1 GiB by driver) keeps the result for the next process.
    r.env.setdefault("CUDA_CACHE_MAXSIZE", str(4 << 30))
    blas = os.environ.get("DISTFLASH_CUBLAS") or find_cublas()
    if blas:
        r.env["DISTFLASH_CUBLAS"] = blas
        r.env["LD_LIBRARY_PATH"] = os.path.dirname(blas) + ":" + r.env.get("LD_LIBRARY_PATH", "")
    info["cublas"] = blas
    cu = os.environ.get("DISTFLASH_LIBCUDA") or find_libcuda()
    if cu:
        r.env["DISTFLASH_LIBCUDA"] = cu
    info["libcuda"] = cu
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        info["gpu"] = q.stdout.split(",")[0].strip() if q.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"], info["gpu"] = f"unavailable: {e}", None
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    info["ncu"] = find_ncu()
    info["compute_sanitizer"] = find_tool("compute-sanitizer")
    info["python"] = sys.version.split()[0]
    return info


def find_ncu():
    return find_tool("ncu")


def find_tool(name):
    """An NVIDIA tool on PATH, else in the usual install folders (newest), else None."""
    p = shutil.which(name)
    if p:
        return p
    c = sorted(glob.glob(f"/opt/nvidia/nsight-compute/*/{name}") + glob.glob(f"/usr/local/cuda*/bin/{name}") +
               glob.glob(f"/usr/local/cuda*/compute-sanitizer/{name}") +
               glob.glob(f"/opt/*/.venv/lib/python3*/site-packages/nvidia/**/bin/{name}", recursive=True))
    return c[-1] if c else None


def peak_flops(gpu):
    if not gpu:
        return None
    for k in ["H100 PCIe", "H100", "H200", "A100"]:
        if k in gpu:
            return PEAK_FLOPS[k]
    return None


class MemSampler:
    """Largest nvidia-smi memory.used (MiB) of GPU 0 while it runs, minus the value at start."""

    def __init__(self):
        self.base = self.read()
        self.peak, self.stop = self.base, threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)

    @staticmethod
    def read():
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                               capture_output=True, text=True, timeout=10)
            return float(q.stdout.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def loop(self):
        while not self.stop.wait(0.25):
            v = self.read()
            if v is not None and (self.peak is None or v > self.peak):
                self.peak = v

    def __enter__(self):
        if self.base is not None:
            self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        if self.t.is_alive():
            self.t.join()

    def result(self):
        if self.base is None or self.peak is None:
            return None
        return (self.peak - self.base) * 2**20


# ---------------------------------------------------------------------------------------------
# Phase correctness


TEST_LINE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)")


def parse_tests(text):
    res = {"PASS": [], "FAIL": [], "SKIP": []}
    for line in text.splitlines():
        m = TEST_LINE.match(line)
        if m:
            res[m.group(1)].append(m.group(2))
    return res


def kernels_tests(r, limit):
    run = "TestCUDAHost" if r.dry else "CUDA"
    nccl = packed_nccl(r)  # TestCUDAHostNCCLLibrary loads it
    code, text = r.sh("kernels_test", [r.bin("kernels.test"), "-test.v", "-test.run", run,
                                        "-test.timeout", f"{int(limit) - 10}s"],
                      limit, cwd=os.path.join(r.pack, "kernels"), ok_codes=(0, 1),
                      env={"DISTFLASH_LIBNCCL": nccl} if os.path.exists(nccl) else None)
    t = parse_tests(text)
    cuda = [n for n in t["PASS"] + t["FAIL"] if n.startswith("TestCUDA")]
    res = {"passed": len(t["PASS"]), "failed_tests": t["FAIL"], "skipped_tests": t["SKIP"], "cuda_tests": len(cuda),
           "exit": code}
    if code != 0 or t["FAIL"]:
        res["failed"] = f"{len(t['FAIL'])} test(s) failed: {', '.join(t['FAIL'][:12])}" if t["FAIL"] else \
            f"exit status {code}: {tail(text, 400)}"
    elif not t["PASS"]:
        res["failed"] = "no test ran"
    return res


def train_curve(r, name, device, prec, limit, steps=CURVE_STEPS, config="tiny.toml", extra=(), env=None, done=None):
    runs = os.path.join(r.work, "runs")
    cmd = [r.bin("distflash"), "train", "--config", os.path.join(r.pack, "configs", config),
           "--set", f"data.train={os.path.join(r.pack, 'data', 'go.tokens')}", "--set", "data.format=tokens",
           "--set", f"training.steps={steps}", "--set", f"device.kind={device}",
           "--set", f"training.mixed_precision={prec}", "--set", f"run.output_dir={runs}", "--set", f"run.name={name}",
           "--set", "run.log_interval=1", "--progress=false", *extra]
    r.sh(name, cmd, limit, cwd=r.work, env=env, done=done)
    return read_metrics(os.path.join(runs, name, "metrics.jsonl"))


def read_metrics(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [row for row in rows if "loss" in row and "step" in row]


def curves_step(r, limit):
    """The four 50-step runs and their comparison."""
    deadline = time.monotonic() + limit
    runs = [(dev, prec) for dev in ["cpu", "cuda"] for prec in ["fp32", "bf16"]]
    # Each run's share of the time left; a dry run's cuda runs only start and fail.
    weight = [0.2 if r.dry and dev == "cuda" else 1 for dev, _ in runs]
    out, errs = {}, []
    for i, (dev, prec) in enumerate(runs):
        name = f"tiny-{dev}-{prec}"
        per = max(20, (deadline - time.monotonic()) * weight[i] / sum(weight[i:]))
        if r.dry and dev == "cuda":
            out[name] = expect_no_gpu(r, name, prec)
            continue
        try:
            out[name] = [m["loss"] for m in train_curve(r, name, dev, prec, per)]
        except (Fail, Timeout) as e:
            errs.append(f"{name}: {e}")
    res = {"curves": out}
    if r.dry:
        if "tiny-cpu-fp32" in out and "tiny-cpu-bf16" in out:
            res["comparator_check"] = check_comparator(out)
        if errs:
            res["failed"] = "; ".join(errs)
        return res
    res.update(compare_curves(out))
    if errs:
        res["failed"] = "; ".join(errs) + ("; " + res["failed"] if res.get("failed") else "")
    return res


def compare_curves(c):
    """The fp32 and bf16 criteria of the module doc, from loss lists."""
    res, bad = {}, []

    def rel(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and b else None

    need = ["tiny-cpu-fp32", "tiny-cuda-fp32", "tiny-cpu-bf16", "tiny-cuda-bf16"]
    have = {k: c.get(k) for k in need}
    for k, v in have.items():
        if not v or len(v) != CURVE_STEPS:
            bad.append(f"{k}: {len(v) if v else 0} of {CURVE_STEPS} steps")
    if have["tiny-cpu-fp32"] and have["tiny-cuda-fp32"]:
        res["fp32_max_rel"] = rel(have["tiny-cuda-fp32"], have["tiny-cpu-fp32"])
        res["fp32_ok"] = res["fp32_max_rel"] <= FP32_TOL
        if not res["fp32_ok"]:
            bad.append(f"fp32: cuda vs cpu loss differs by {res['fp32_max_rel']:.3g} relative (> {FP32_TOL})")
    if all(have[k] for k in ["tiny-cpu-fp32", "tiny-cpu-bf16", "tiny-cuda-bf16"]):
        band = rel(have["tiny-cpu-bf16"], have["tiny-cpu-fp32"])
        dev = rel(have["tiny-cuda-bf16"], have["tiny-cpu-fp32"])
        res.update(bf16_cpu_band=band, bf16_cuda_vs_fp32=dev, bf16_cuda_vs_cpu_bf16=rel(have["tiny-cuda-bf16"], have["tiny-cpu-bf16"]))
        res["bf16_ok"] = dev <= 2 * band
        if not res["bf16_ok"]:
            bad.append(f"bf16: cuda deviates {dev:.3g} from the fp32 curve, over 2 × the CPU bf16 band {band:.3g}")
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def docmask_step(r, limit):
    """The tiny config with data.document_mask on cpu and cuda in fp32, DOC_STEPS steps: cuda's
    loss within FP32_TOL relative of cpu's at every step. A dry run trains the cpu side only."""
    deadline = time.monotonic() + limit
    extra = ("--set", "data.document_mask=true")
    out = {}
    for dev in ["cpu"] if r.dry else ["cpu", "cuda"]:
        per = max(20, (deadline - time.monotonic()) / (2 if dev == "cpu" and not r.dry else 1))
        name = f"tiny-docmask-{dev}-fp32"
        out[name] = [m["loss"] for m in train_curve(r, name, dev, "fp32", per, steps=DOC_STEPS, extra=extra)]
    res = {"curves": out}
    bad = [f"{k}: {len(v)} of {DOC_STEPS} steps" for k, v in out.items() if len(v) != DOC_STEPS]
    if not r.dry and not bad:
        a, b = out["tiny-docmask-cuda-fp32"], out["tiny-docmask-cpu-fp32"]
        res["fp32_max_rel"] = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        res["fp32_ok"] = res["fp32_max_rel"] <= FP32_TOL
        if not res["fp32_ok"]:
            bad.append(f"document mask fp32: cuda vs cpu loss differs by {res['fp32_max_rel']:.3g} relative (> {FP32_TOL})")
    if bad:
        res["failed"] = "; ".join(bad)
    return res


SHAPE_STEPS = 4
SHAPE_SETS = ("model.n_layers=2", "data.seq_len=1024")


def shape_parity_step(r, limit):
    """configs/llama-1b.toml's shape (dim 2048, head_dim 128, GQA 16/4, ffn 5632, vocab 32000)
    cut to 2 layers at seq 1024, SHAPE_STEPS steps in fp32 on cpu and cuda: cuda's loss within
    FP32_TOL relative of cpu's at every step (the tiny config has head_dim 32 and vocab 256).
    A dry run trains the cpu side only, at the dry model size."""
    deadline = time.monotonic() + limit
    extra = [x for kv in SHAPE_SETS for x in ("--set", kv)]
    if r.dry:
        extra = [x for kv in model_sets(LLAMA_DRY) for x in ("--set", kv)] + ["--set", "data.seq_len=128"]
    out = {}
    for dev in ["cpu"] if r.dry else ["cpu", "cuda"]:
        per = max(20, (deadline - time.monotonic()) * (0.7 if dev == "cpu" and not r.dry else 1))
        name = f"llama1b-shape-{dev}-fp32"
        out[name] = [m["loss"] for m in train_curve(r, name, dev, "fp32", per, steps=SHAPE_STEPS,
                                                    config="llama-1b.toml", extra=extra)]
    res = {"curves": out}
    bad = [f"{k}: {len(v)} of {SHAPE_STEPS} steps" for k, v in out.items() if len(v) != SHAPE_STEPS]
    if not r.dry and not bad:
        a, b = out["llama1b-shape-cuda-fp32"], out["llama1b-shape-cpu-fp32"]
        res["fp32_max_rel"] = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        if res["fp32_max_rel"] > FP32_TOL:
            bad.append(f"llama-1b shape fp32: cuda vs cpu loss differs by {res['fp32_max_rel']:.3g} relative (> {FP32_TOL})")
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def check_comparator(c):
    """Dry run: compare_curves passes the CPU curves against themselves and fails a curve
    shifted by 1e-4 (fp32) or by 3 × the bf16 band."""
    f32, b16 = c["tiny-cpu-fp32"], c["tiny-cpu-bf16"]
    same = compare_curves({"tiny-cpu-fp32": f32, "tiny-cuda-fp32": f32, "tiny-cpu-bf16": b16, "tiny-cuda-bf16": b16})
    if same.get("failed"):
        raise Fail(f"comparator rejects identical curves: {same['failed']}")
    band = max(abs(x - y) / y for x, y in zip(b16, f32))
    off = compare_curves({"tiny-cpu-fp32": f32, "tiny-cuda-fp32": [x * (1 + 1e-4) for x in f32], "tiny-cpu-bf16": b16,
                          "tiny-cuda-bf16": [x * (1 + 3 * band) for x in f32]})
    if off.get("fp32_ok") is not False or off.get("bf16_ok") is not False:
        raise Fail(f"comparator accepts shifted curves: {off}")
    return "ok"


def expect_no_gpu(r, name, prec):
    """Dry run: device.kind = cuda must fail at once with a clear error, before any step."""
    try:
        train_curve(r, name, "cuda", prec, 60, steps=2)
    except Fail as e:
        msg = str(e)
        if "cuda" in msg and ("libcuda" in msg or "driver" in msg or "device" in msg):
            return {"clear_error": tail(msg, 300)}
        raise Fail(f"device.kind = cuda without a GPU failed, but not clearly: {msg}")
    raise Fail("device.kind = cuda trained without a GPU")


SANITIZER_RUNS = {
    # memcheck: every device test but the training step (slow under the tool; it calls the
    # same kernels); racecheck: the kernels that share memory between threads, the
    # FlashAttention kernels at bf16 only (racecheck is slow: the fp32 tiles and the fp16
    # twins of the same code take minutes more). Each entry is one -test.run pattern, run as a
    # process of its own (go test splits a pattern at '/' only outside parentheses, so one
    # pattern cannot pick subtests of one test and whole other tests).
    "memcheck": ["TestCUDA(Buffers|Reductions|MatMul|Embedding|RMSNorm|RoPE|SwiGLU|CrossEntropy|AdamW|HalfCasts|Attn)"],
    "racecheck": ["TestCUDA(Reductions|RMSNorm|CrossEntropy)", "TestCUDAAttnTensorCores/^bf16"],
}
# The tool's last line: "ERROR SUMMARY: N errors" (memcheck) or "RACECHECK SUMMARY: N hazards
# displayed (E errors, W warnings)".
SANITIZER_SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error)")


def sanitizer_step(r, tool, limit):
    """compute-sanitizer --tool TOOL over the kernels tests SANITIZER_RUNS names: no error reported."""
    cs = r.meta["env"].get("compute_sanitizer")
    if r.dry or not cs:
        raise Skip("dry run" if r.dry else "compute-sanitizer not found")
    extra = ["--racecheck-report", "all"] if tool == "racecheck" else ["--leak-check", "no"]
    deadline = time.monotonic() + limit
    res = {"errors": 0, "tests_passed": 0, "tests_failed": [], "runs": []}
    bad = []
    runs = SANITIZER_RUNS[tool]
    for i, pattern in enumerate(runs):
        per = (deadline - time.monotonic()) / (len(runs) - i)
        code, text = r.sh(f"sanitizer_{tool}_{i}", [cs, "--tool", tool, "--error-exitcode", "86", "--print-limit", "20",
                                                    *extra, r.bin("kernels.test"), "-test.v", "-test.run", pattern,
                                                    "-test.timeout", f"{max(10, int(per) - 5)}s"],
                          per, cwd=os.path.join(r.pack, "kernels"), ok_codes=(0, 1, 2, 86))
        m = SANITIZER_SUMMARY.search(text)
        errors = int(m.group(1) or m.group(2)) if m else None
        t = parse_tests(text)
        res["runs"].append({"pattern": pattern, "errors": errors, "tests_passed": len(t["PASS"]), "exit": code})
        res["tests_passed"] += len(t["PASS"])
        res["tests_failed"] += t["FAIL"]
        if errors is None:
            bad.append(f"{pattern}: no summary from the tool (exit {code}): {tail(text, 300)}")
            continue
        res["errors"] += errors
        if code == 86 or errors > 0:
            bad.append(f"{pattern}: {errors} error(s): " + tail("\n".join(
                l for l in text.splitlines() if l.startswith("=========")), 500))
        elif code != 0 or t["FAIL"] or not t["PASS"]:
            bad.append(f"{pattern}: the tests under the tool: exit {code}, failed {t['FAIL']}, {len(t['PASS'])} passed: "
                       f"{tail(text, 300)}")
    if bad:
        res["failed"] = f"{tool}: " + "; ".join(bad)
    return res


# ---------------------------------------------------------------------------------------------
# Phase attention


def attention_step(r, limit, side):
    """One side of bench/cuda_attn.py (torch SDPA or distflash), each in its own bounded step so
    that a slow or failing side leaves the other's numbers."""
    jpath = os.path.join(r.work, f"attn_{side}.jsonl")
    cmd = [sys.executable, os.path.join(r.pack, "bench", "cuda_attn.py"), "--json", jpath,
           "--skip-go" if side == "torch" else "--skip-torch"]
    if r.dry and side == "distflash":
        # No GPU: the benchmark must start from the test binary and fail, saying so.
        cmd += ["--go-bin", r.bin("kernels.test"), "--seqs", "4096", "--head-dims", "128", "--benchtime", "1x"]
        code, text = r.sh("attention_distflash", cmd, limit, ok_codes=(0, 1))
        if code == 0 or "need a GPU" not in text:
            raise Fail(f"the distflash benchmark without a GPU: exit {code}, no clear error: {tail(text, 300)}")
        return {"clear_error": re.findall(r"need a GPU: .*", text)[0][:300]}
    if r.dry:
        cmd += ["--device", "cpu", "--fill", "256", "--seqs", "128,256", "--head-dims", "64,128", "--reps", "2"]
    else:
        cmd += ["--go-bin", r.bin("kernels.test"), "--seqs", "4096,16384,65536", "--head-dims", "64,128",
                "--benchtime", "3x", "--reps", "10"]
    _, text = r.sh(f"attention_{side}", cmd, limit, env={"PYTHONUNBUFFERED": "1"})
    with open(jpath) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    res = {"shapes": recs}
    if r.dry and side == "torch":
        res["parse_go_check"] = check_parse_go(r)
    return res


def merge_attention(steps):
    """The per-shape records of the torch and distflash attention steps, joined."""
    out = {}
    for name, key in (("attention: torch SDPA", "torch"), ("attention: distflash kernel", "distflash")):
        for s in (steps.get(name) or {}).get("shapes", []):
            d = out.setdefault((s["seq"], s["head_dim"]), {k: s[k] for k in ("seq", "head_dim", "heads", "batch")})
            d[key] = s.get(key)
            if key == "torch":
                d["torch_version"], d["device"] = s.get("torch_version"), s.get("device")
    return [out[k] for k in sorted(out, key=lambda k: (k[1], k[0]))]


def check_parse_go(r):
    """Dry run: the Go benchmark line format (as `go test -bench` prints it) parses."""
    sys.path.insert(0, os.path.join(r.pack, "bench"))
    import cuda_attn
    lines = "\n".join(
        f"BenchmarkCUDAAttn/{k}/hd{hd}/n{n}/h{cuda_attn.MODEL_WIDTH // hd * max(1, 16384 // n)}-16 \t       5\t  {ns}"
        f" ns/op\t       {tf} TFLOP/s"
        for hd in (64, 128) for n in (4096, 16384) for k, ns, tf in (("fwd", 1000000, 123.5), ("bwd", 2500000, 123.5)))
    got = cuda_attn.parse_go(lines, [4096, 16384], [64, 128])
    d = got[(16384, 128)]
    if d["heads_x_batch"] != 16 or d["fwd_tflops"] != 123.5 or abs(d["fwd_bwd_tflops"] - 123.5) > 1e-9:
        raise Fail(f"parse_go misread the benchmark lines: {d}")
    return "ok"


def ncu_step(r, limit):
    ncu = r.meta["env"].get("ncu")
    if r.dry or not ncu:
        raise Skip("dry run" if r.dry else "ncu not found (PATH, /opt/nvidia/nsight-compute, /usr/local/cuda/bin)")
    rep = os.path.join(r.out, "ncu_attn")
    env = {"DISTFLASH_BENCH_SEQS": "16384", "DISTFLASH_BENCH_HEADDIMS": "128"}
    r.sh("ncu", [ncu, "--target-processes", "all", "--clock-control", "none", "--set", "full",
                 "--kernel-name", "regex:df_attn_(fwd|bwd_dq|bwd_dkdv)_bf16_hd128", "--launch-count", "3",
                 "--export", rep, "--force-overwrite", r.bin("kernels.test"), "-test.run", "^$",
                 "-test.bench", "BenchmarkCUDAAttn/bwd/", "-test.benchtime", "1x"],
         limit * 0.8, cwd=os.path.join(r.pack, "kernels"), env=env)
    _, text = r.sh("ncu_details", [ncu, "--import", rep + ".ncu-rep", "--page", "details"], max(20, limit * 0.15))
    with open(os.path.join(r.out, "ncu_attn.txt"), "w") as f:
        f.write(text)
    return {"kernels": ncu_summary(text)}


NCU_KEYS = ["Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Achieved Occupancy",
            "Theoretical Occupancy", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Executed Ipc Active",
            "Issue Slots Busy", "No Eligible"]


def ncu_summary(text):
    """Key metrics per profiled kernel from `ncu --page details`."""
    out, cur = [], None
    for line in text.splitlines():
        m = re.match(r"^\s{0,4}(df_attn_\w+)", line)
        if m:
            cur = {"kernel": m.group(1)}
            out.append(cur)
            continue
        if cur is None:
            continue
        for k in NCU_KEYS:
            m = re.match(r"^\s*" + re.escape(k) + r"\s+(\S+)\s+([\d.,]+)\s*$", line)
            if m and k not in cur:
                cur[k] = f"{m.group(2)} {m.group(1)}"
    return out


# ---------------------------------------------------------------------------------------------
# Phase model


def model_shape(cfg):
    """Parameters of a llama config (dict of [model]) and N for MFU."""
    d, L, H, KV = cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]
    hd = cfg.get("head_dim") or d // H
    ffn, V = cfg["ffn_dim"], cfg["vocab_size"]
    block = d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * ffn + 2 * d
    total = L * block + d + 2 * V * d
    return {"params": total, "n_mfu": total - V * d, "layers": L, "attn_dim": H * hd, "dim": d}


LLAMA_1B = {"dim": 2048, "n_layers": 16, "n_heads": 16, "n_kv_heads": 4, "head_dim": 128, "ffn_dim": 5632, "vocab_size": 32000}
LLAMA_DRY = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "ffn_dim": 352, "vocab_size": 512}


def flops_per_token(shape, seq):
    return 6 * shape["n_mfu"] + 6 * shape["layers"] * shape["attn_dim"] * seq


def model_sets(cfg):
    return [f"model.{k}={v}" for k, v in cfg.items()]


# The model phase's lengths (8K, 64K, 128K tokens a step: one sequence) and the dry run's
# stand-ins at the dry model's size on the CPU.
MODEL_SEQS = (8192, 65536, 131072)
MODEL_DRY_SEQS = (256, 512, 1024)
# distflash's timing runs by length: (steps, timed steps FIRST..LAST, profiled steps FIRST..LAST).
# At 8K the profile (a pair of CUDA events around each of ~1,700 ops, one wait at the end of a
# step) runs after the timed steps; at 64K and 128K it costs well under 1% of a step of seconds,
# so the timed steps are the profiled ones, after one warm-up step.
MODEL_STEPS = ((7, (3, 5), (6, 7)), (3, (2, 3), (2, 3)), (2, (2, 2), (2, 2)))
# PyTorch's (bench/torch_ops.py) by length: warm-up steps, timed steps, profiled steps.
TORCH_STEPS = ((2, 3, 2), (1, 2, 1), (1, 1, 1))
# The timing runs' settings: a constant learning rate from the first step, the config's 3e-4,
# as bench/torch_llama.py and torch_ops.py train (torch.optim.AdamW at lr 3e-4, no schedule). The
# review's §7.9: the H100 and H200 runs' 6 steps compressed the config's warm-up to 2 steps and
# their losses rose to 13–17 while PyTorch's fell; with today's 200-step warm-up the 6 steps
# would train at lr/200 to 6·lr/200, PyTorch's at lr. Neither compares. The final checkpoint is
# not needed (the run is ended once its last step is written: Runner.sh's done); level 1 keeps
# it short where it is written anyway.
TIMING_SETS = ("training.lr_schedule=constant", "training.warmup_steps=0", "checkpoint.compression_level=1",
               "run.tensorboard=false")
# The variants of distflash's run: device.attention and settings after the common ones. The
# checkpoint policy is the phase's (ckpt_policy: auto where the binary accepts it).
MODEL_VARIANTS = {
    "cudnn": {"attention": "cudnn", "sets": ()},
    # review §5 and §6 change 2: nothing recomputed, the MLP untiled (a tile makes `none`
    # recompute gate and up anyway)
    "cudnn-none": {"attention": "cudnn", "sets": ("checkpoint.activation=none", "training.mlp_tile=0")},
    "own": {"attention": "own", "sets": ()},
}


def plan_cmd(r, seq, ckpt):
    cluster = "1x1xH200-141GB" if "H200" in (r.meta["env"].get("gpu") or "") else "1x1xH100-80GB"
    cmd = [r.bin("distflash"), "plan", "--config", os.path.join(r.pack, "configs", "llama-1b.toml"),
           "--cluster", cluster, "--format", "json", "--set", f"data.seq_len={seq}",
           "--set", f"model.max_seq_len={max(seq, 8192)}", "--set", f"checkpoint.activation={ckpt}"]
    if r.dry:
        for s in model_sets(LLAMA_DRY):
            cmd += ["--set", s]
    return cluster, cmd


def plan_step(r, seq, limit):
    """`distflash plan` at seq with the phase's checkpoint policy: its step time and memory."""
    ckpt = ckpt_policy(r, limit / 2)
    cluster, cmd = plan_cmd(r, seq, ckpt)
    _, text = r.sh(f"plan_{seq}", cmd, limit / 2)
    p = json.loads(text[text.index("{"):])["plans"][0]
    return {"cluster": cluster, "seq": seq, "checkpoint": ckpt, "checkpoint_choice": r.ckpt_note,
            "step_s": p["time"]["step_s"], "memory": p["memory"], "peak_bytes": p["memory"]["peak"]}


def ckpt_policy(r, limit=30):
    """The checkpoint policy the model phase asks for: "auto" where this binary accepts it
    (issue 41's default, `plan`'s estimate deciding), else "attn_output", decided once by
    `distflash plan` at the first length with checkpoint.activation = auto; r.ckpt_note says which
    and why."""
    if getattr(r, "ckpt", None):
        return r.ckpt
    seq = (MODEL_DRY_SEQS if r.dry else MODEL_SEQS)[0]
    _, cmd = plan_cmd(r, seq, "auto")
    try:
        r.sh("plan_checkpoint_auto", cmd, limit)
        r.ckpt, r.ckpt_note = "auto", "checkpoint.activation = auto: this binary accepts it"
    except Fail as e:
        if "checkpoint.activation" not in str(e):
            raise
        why = re.search(r"checkpoint\.activation = [^\n]*", str(e))  # the config's error, not the command line
        r.ckpt = "attn_output"
        r.ckpt_note = ("checkpoint.activation = auto refused by this binary (" + (why.group(0)[:200] if why else tail(str(e), 200)) +
                       "): attn_output, the config's policy before auto")
    print(f"[model] {r.ckpt_note}", flush=True)
    return r.ckpt


def checkpoint_lines(text):
    """The lines of a train log that say which activation checkpoint policy the run took."""
    return [line.strip()[:300] for line in text.splitlines()[:80] if "checkpoint" in line and "activation" in line]


def resolved_checkpoint(asked, lines):
    """The policy a run used: asked, or for "auto" the policy its log names after the word auto
    (None when the log does not say)."""
    if asked != "auto":
        return asked
    for line in lines:
        m = re.search(r"auto\b\W+(?:[\w.]+\W+){0,4}?(none|layer|attn_output)\b", line)
        if m:
            return m.group(1)
    return None


def metrics_reached(path, step):
    """Whether metrics.jsonl at path has the line of step (its loss written)."""
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    if m.get("step", 0) >= step and "loss" in m:
                        return True
    except (OSError, ValueError):
        pass
    return False


def distflash_run(r, i, variant, limit):
    """One timing run of the 0.85B (configs/llama-1b.toml, bf16) at the i-th length: MODEL_STEPS
    steps at a constant learning rate, the per-op profile over its profiled steps (ops.json),
    peak GPU memory by nvidia-smi. Ended once its last step and ops.json are written."""
    seq = (MODEL_DRY_SEQS if r.dry else MODEL_SEQS)[i]
    steps, timed, prof = MODEL_STEPS[i]
    v = MODEL_VARIANTS[variant]
    ckpt = ckpt_policy(r)
    name = f"llama1b-{seq}-{variant}"
    runs, profdir = os.path.join(r.work, "runs"), os.path.join(r.work, f"ops_{seq}_{variant}")
    sets = [f"data.seq_len={seq}", f"model.max_seq_len={max(seq, 8192)}", *TIMING_SETS, f"checkpoint.activation={ckpt}", *v["sets"]]
    # cudnn and own choose among a GPU's paths: a CPU run (the dry run) refuses them
    sets += model_sets(LLAMA_DRY) if r.dry else [f"device.attention={v['attention']}"]
    extra = [x for s in sets for x in ("--set", s)] + ["--profile", profdir, "--profile-steps", f"{prof[0]}..{prof[1]}"]
    mpath = os.path.join(runs, name, "metrics.jsonl")
    done = lambda: os.path.exists(os.path.join(profdir, "ops.txt")) and metrics_reached(mpath, steps)  # noqa: E731
    with MemSampler() as ms:
        rows = train_curve(r, name, "cpu" if r.dry else "cuda", "bf16", limit, steps=steps, config="llama-1b.toml",
                           extra=extra, done=done)
    for d in glob.glob(os.path.join(runs, name, "step-*")):  # 10 GB a checkpoint: the disk is 64 GB
        shutil.rmtree(d, ignore_errors=True)
    with open(os.path.join(r.logs, name + ".log"), errors="replace") as f:
        text = f.read()
    lines = checkpoint_lines(text)
    res = {"impl": "distflash", "variant": variant, "attention": v["attention"], "seq": seq, "steps": len(rows),
           "timed_steps": list(timed), "profiled_steps": list(prof), "checkpoint_asked": ckpt,
           "checkpoint": "none" if "checkpoint.activation=none" in v["sets"] else resolved_checkpoint(ckpt, lines),
           "checkpoint_lines": lines, "attention_path": re.findall(r"^attention \(.*", text, re.M)[-1:],
           "losses": [m["loss"] for m in rows], "lrs": [m.get("lr") for m in rows], "peak_gpu_bytes": ms.result(),
           "host_accounting": (rows[-1].get("memory") or [{}])[0] if rows else {}}
    tps = [m["tokens_per_s"] for m in rows if timed[0] <= m["step"] <= timed[1]]
    if len(tps) < timed[1] - timed[0] + 1:
        raise Fail(f"{len(rows)} of {steps} steps written: no timed steps {timed[0]}..{timed[1]}")
    res.update(tokens_per_s=statistics.median(tps), step_s=seq / statistics.median(tps), step_s_all=[seq / t for t in tps])
    bad = [m["step"] for m in rows if not math.isfinite(m["loss"])]
    if bad:
        res["failed"] = f"loss not finite at step(s) {bad}"
    try:
        with open(os.path.join(profdir, "ops.json")) as f:
            res["table"] = json.load(f)
        shutil.copy(os.path.join(profdir, "ops.txt"), os.path.join(r.logs, f"ops_{name}.txt"))
    except OSError as e:
        res["failed"] = (res.get("failed", "") + f"; no per-op table: {e}").lstrip("; ")
    return res


TORCH_TIMING = ("tokens_per_s", "step_s", "step_s_all", "losses", "peak_allocated_bytes", "peak_reserved_bytes",
                "ckpt_mode", "flash_ops", "fallback_reason", "oom", "error")


def torch_run(r, i, ckpt, limit):
    """bench/torch_ops.py at the i-th length with PyTorch's checkpointing ckpt (attn_output: the
    same policy through the flash-attention ops; none): timed steps (tokens/s, allocator peak),
    then the per-op table of its profiled steps. PyTorch out of memory is a result, not a failure."""
    seq = (MODEL_DRY_SEQS if r.dry else MODEL_SEQS)[i]
    warm, timed, prof = TORCH_STEPS[i]
    cfg = LLAMA_DRY if r.dry else LLAMA_1B
    jpath = os.path.join(r.work, f"torch_{seq}_{ckpt}.json")
    cmd = [sys.executable, os.path.join(r.pack, "bench", "torch_ops.py"), "--seq", str(seq), "--json", jpath,
           "--dim", str(cfg["dim"]), "--layers", str(cfg["n_layers"]), "--heads", str(cfg["n_heads"]),
           "--kv-heads", str(cfg["n_kv_heads"]), "--ffn", str(cfg["ffn_dim"]), "--vocab", str(cfg["vocab_size"]),
           "--warmup", str(warm), "--timed", str(timed), "--steps", str(prof), "--ckpt", ckpt,
           "--device", "cpu" if r.dry else "cuda"]
    with MemSampler() as ms:
        r.sh(f"torch_{seq}_{ckpt}", cmd, limit, env={"PYTHONUNBUFFERED": "1"})
    with open(jpath) as f:
        rec = json.load(f)
    res = {"impl": "torch", "variant": ckpt, "attention": "flash (aten)" if ckpt == "attn_output" else "sdpa", "seq": seq,
           "checkpoint": rec.get("ckpt_mode", ckpt), "peak_gpu_bytes": ms.result()}
    res.update({k: rec[k] for k in TORCH_TIMING if k in rec})
    if rec.get("oom"):
        res["note"] = f"PyTorch ran out of memory at {seq} tokens ({ckpt}): {tail(rec.get('error', ''), 200)}"
    else:
        res["table"] = {k: v for k, v in rec.items() if k not in TORCH_TIMING}
    return res


def torch_check(r, limit):
    cmd = [sys.executable, os.path.join(r.pack, "bench", "torch_llama.py"), "--check",
           "--device", "cpu" if r.dry else "cuda"]
    _, text = r.sh("torch_check", cmd, limit)
    return json.loads(text.strip().splitlines()[-1])


MODEL_SUMMARY = "summary (MFU, PyTorch, planner, activation bytes)"
# The order of a length's runs in the report, and the run each PyTorch run is set beside.
RUN_ORDER = [("distflash", "cudnn"), ("distflash", "cudnn-none"), ("distflash", "own"), ("torch", "attn_output"), ("torch", "none")]
TORCH_PEER = {"cudnn": "attn_output", "cudnn-none": "none", "own": "attn_output"}


def model_summary(r, res):
    """MFU, the ratios to PyTorch, the planner's agreement and activation bytes from the model
    phase's runs (res: "distflash_SEQ_VARIANT", "torch_SEQ_CKPT", "plan_SEQ" → results)."""
    cfg = LLAMA_DRY if r.dry else LLAMA_1B
    shape = model_shape(cfg)
    peak = peak_flops(r.meta["env"].get("gpu"))
    seqs = MODEL_DRY_SEQS if r.dry else MODEL_SEQS
    rows, goals, notes = [], {}, []
    for seq in seqs:
        row = {"seq": seq, "flops_per_token": flops_per_token(shape, seq), "runs": []}
        torch_best = max((d.get("tokens_per_s") or 0 for k, d in res.items() if k.startswith(f"torch_{seq}_") and d), default=0)
        for impl, variant in RUN_ORDER:
            d = res.get(f"{impl}_{seq}_{variant}")
            if not d:
                continue
            e = {k: d.get(k) for k in ("impl", "variant", "attention", "checkpoint", "tokens_per_s", "step_s", "peak_gpu_bytes",
                                       "peak_allocated_bytes", "oom")}
            e["losses"] = [d["losses"][0], d["losses"][-1]] if d.get("losses") else None
            if peak and d.get("tokens_per_s"):
                e["mfu"] = d["tokens_per_s"] * row["flops_per_token"] / peak
            if impl == "distflash" and d.get("tokens_per_s"):
                t = res.get(f"torch_{seq}_{TORCH_PEER[variant]}") or {}
                if t.get("tokens_per_s"):
                    e["vs_torch"] = d["tokens_per_s"] / t["tokens_per_s"]
                    if t.get("peak_gpu_bytes") and d.get("peak_gpu_bytes"):
                        e["peak_vs_torch"] = d["peak_gpu_bytes"] / t["peak_gpu_bytes"]
                if torch_best:
                    e["vs_torch_best"] = d["tokens_per_s"] / torch_best
            row["runs"].append(e)
        p = res.get(f"plan_{seq}")
        main = res.get(f"distflash_{seq}_cudnn") or {}
        if p:
            row["plan"] = {"step_s": p["step_s"], "peak_bytes": p["peak_bytes"], "checkpoint": p.get("checkpoint")}
            if main.get("step_s"):
                row["plan"]["step_ratio"] = p["step_s"] / main["step_s"]
            if main.get("peak_gpu_bytes"):
                row["plan"]["memory_ratio"] = p["peak_bytes"] / main["peak_gpu_bytes"]
        for e in row["runs"]:  # the timing runs' losses at one constant lr: ours should fall where PyTorch's falls
            t = next((x for x in row["runs"] if x["impl"] == "torch" and x["variant"] == TORCH_PEER.get(e["variant"])), None)
            if e["impl"] == "distflash" and e.get("losses") and t and t.get("losses") and e["losses"][1] > e["losses"][0] \
                    and t["losses"][1] < t["losses"][0]:
                notes.append(f"{seq} {e['variant']}: our loss rose {e['losses'][0]:.3f} → {e['losses'][1]:.3f} at the constant "
                             f"lr where PyTorch's fell {t['losses'][0]:.3f} → {t['losses'][1]:.3f} (different data and init: "
                             "see the curve phase for the comparison on the same ones)")
        ours = [e for e in row["runs"] if e["impl"] == "distflash" and e.get("tokens_per_s") and e["attention"] != "own"]
        if ours:
            m = next((e for e in ours if e["variant"] == "cudnn"), ours[0])
            best = max(ours, key=lambda e: e["tokens_per_s"])
            goals[str(seq)] = {"run": m["variant"], "checkpoint": m.get("checkpoint"), "mfu": m.get("mfu"),
                               "vs_torch": m.get("vs_torch"), "peak_vs_torch": m.get("peak_vs_torch"),
                               "best_run": best["variant"], "best_mfu": best.get("mfu"), "best_vs_torch_best": best.get("vs_torch_best")}
        rows.append(row)
    out = {"shape": shape, "peak_flops": peak, "rows": rows, "goals": goals, "checkpoint_choice": getattr(r, "ckpt_note", None),
           "loss_notes": notes,
           "mfu_formula": "tokens/s × (6·N + 6·L·d·S) / peak; N = params − vocab·dim (no input embedding), d = heads·head_dim, causal"}
    # Activation bytes per token per layer: the slope of the measured peak between the first two
    # lengths, less the planner's per-token terms that are not saved activations (logits,
    # backward scratch, attention working set), divided by the layers; only between two runs
    # of one policy.
    s0, s1 = seqs[0], seqs[1]
    d0, d1 = res.get(f"distflash_{s0}_cudnn"), res.get(f"distflash_{s1}_cudnn")
    p0, p1 = res.get(f"plan_{s0}"), res.get(f"plan_{s1}")
    act = {"bf16_anchor_bytes": 2 * 2 * cfg["dim"],
           "anchor_note": "X and the attention output kept in bf16: 2·2·dim bytes per token per layer "
                          "(16 KiB for LLaMA-7B's dim 4096, 8 KiB at dim 2048)"}
    if d0 and d1:
        if not d0.get("checkpoint") or d0.get("checkpoint") != d1.get("checkpoint"):
            act["note"] = f"not compared: the runs' policies {d0.get('checkpoint')} and {d1.get('checkpoint')} differ or are not named"
        else:
            a0, a1 = (d0.get("host_accounting") or {}).get("activations"), (d1.get("host_accounting") or {}).get("activations")
            if a0 and a1:
                act["accounted_bytes_per_token_layer"] = (a1 - a0) / (s1 - s0) / cfg["n_layers"]
            if d0.get("peak_gpu_bytes") and d1.get("peak_gpu_bytes") and p0 and p1:
                slope = (d1["peak_gpu_bytes"] - d0["peak_gpu_bytes"]) / (s1 - s0)
                other = sum((p1["memory"][k] - p0["memory"][k]) for k in ("logits", "backward_scratch", "attn_work")) / (s1 - s0)
                act.update(measured_peak_slope_bytes_per_token=slope, planner_non_activation_bytes_per_token=other,
                           measured_bytes_per_token_layer=(slope - other) / cfg["n_layers"])
            if p0 and p1:
                act["planner_bytes_per_token_layer"] = (p1["memory"]["activations"] - p0["memory"]["activations"]) / (s1 - s0) / cfg["n_layers"]
    out["activations"] = act
    return out


# ---------------------------------------------------------------------------------------------
# Phases


def phase_correctness(r):
    # expected: the H200 run's times (bench/results/h200-2026-11-26), rounded up
    r.step("correctness", "kernels test binary", lambda t: kernels_tests(r, t), 150, 15)
    r.step("correctness", "tiny 50-step curves cpu/cuda × fp32/bf16", lambda t: curves_step(r, t), 150, 12)
    r.step("correctness", "tiny 20-step document-mask curves cpu/cuda fp32", lambda t: docmask_step(r, t), 60, 4)
    r.step("correctness", "llama-1b shape (2 layers, seq 1024) cpu vs cuda fp32", lambda t: shape_parity_step(r, t), 120, 23)
    for tool, e in (("memcheck", 37), ("racecheck", 81)):
        r.step("correctness", f"compute-sanitizer {tool}", lambda t, tool=tool: sanitizer_step(r, tool, t), 100, e)


def phase_attention(r):
    r.step("attention", "attention: torch SDPA", lambda t: attention_step(r, t, "torch"), 90)
    r.step("attention", "attention: distflash kernel", lambda t: attention_step(r, t, "distflash"), 150)
    r.step("attention", "ncu profile (hd128, 16K)", lambda t: ncu_step(r, t), 90)


# Each step of the model phase: (key in the results, step name, function of (r, limit), limit in
# seconds, expected seconds on an H200), in the order of value: the 8K pair and the 64K pair (the
# goals), the 8K run without recomputation (the prediction's last column), 128K (where PyTorch may
# run out), PyTorch without recomputation at 8K (the fair peer of ours), the own kernel at 8K (the
# fallback), PyTorch at 128K, the reference's self-check. Expected: about 12 s to start distflash
# (0.85B parameters initialised in Go and uploaded, cuDNN's plans warmed; the final checkpoint,
# 18 s on the H200, is spared), 12 s to start PyTorch, and the steps of docs/gpu.md's prediction
# (0.11–0.13 s at 8K, 2.5 s at 64K, 8.5 s at 128K; PyTorch 0.22 s, about 4 s and 12 s). A limit
# leaves room for a slower step or a slower start.
def model_steps(r):
    seqs = MODEL_DRY_SEQS if r.dry else MODEL_SEQS
    ours = lambda i, v: lambda r_, t: distflash_run(r_, i, v, t)  # noqa: E731
    theirs = lambda i, c: lambda r_, t: torch_run(r_, i, c, t)  # noqa: E731
    S = seqs
    return [
        *((f"plan_{s}", f"plan seq {s}", lambda r_, t, s=s: plan_step(r_, s, t), 20, 1) for s in S),
        (f"distflash_{S[0]}_cudnn", f"distflash 1B seq {S[0]} cudnn", ours(0, "cudnn"), 60, 15),
        (f"torch_{S[0]}_attn_output", f"torch 1B seq {S[0]} attn_output", theirs(0, "attn_output"), 45, 18),
        (f"distflash_{S[1]}_cudnn", f"distflash 1B seq {S[1]} cudnn", ours(1, "cudnn"), 70, 20),
        (f"torch_{S[1]}_attn_output", f"torch 1B seq {S[1]} attn_output", theirs(1, "attn_output"), 50, 30),
        (f"distflash_{S[0]}_cudnn-none", f"distflash 1B seq {S[0]} cudnn, checkpoint none, mlp_tile 0", ours(0, "cudnn-none"), 50, 15),
        (f"distflash_{S[2]}_cudnn", f"distflash 1B seq {S[2]} cudnn", ours(2, "cudnn"), 80, 30),
        (f"torch_{S[0]}_none", f"torch 1B seq {S[0]} none", theirs(0, "none"), 35, 17),
        (f"distflash_{S[0]}_own", f"distflash 1B seq {S[0]} own attention", ours(0, "own"), 50, 17),
        (f"torch_{S[2]}_attn_output", f"torch 1B seq {S[2]} attn_output", theirs(2, "attn_output"), 75, 50),
        ("torch_check", "torch checkpointing self-check", lambda r_, t: torch_check(r_, t), 20, 9),
    ]


def phase_model(r):
    res = {}
    for key, name, fn, lim, exp in model_steps(r):
        rec = r.step("model", name, lambda t, f=fn: f(r, t), lim, exp)
        res[key] = rec.get("result")
    r.step("model", MODEL_SUMMARY, lambda t: model_summary(r, res), 10, 0)
    r.step("model", "per-op tables side by side", lambda t: ops_tables(r, res), 10, 0)


# ---------------------------------------------------------------------------------------------
# The GEMM table (issue 41, "Ready for the GPU"): the review's 18 shapes of the 0.85B step at 8K,
# distflash's products in today's fp32-storage mode and the 16-bit step's (bf16 operands, C in
# bf16 or in fp32 with beta 1: kernels' BenchmarkCUDAGemmTable, DISTFLASH_GEMM_OUT) beside
# torch.matmul in bf16 (bench/torch_gemm.py). Both write a JSON array of {role, m, n, k, transA,
# transB, mode, ms, tflops}; "gemm" in summary.json is the table joined by shape.

GEMM_KEYS = ("role", "m", "n", "k", "transA", "transB", "mode", "ms", "tflops")
GEMM_GO_MODES = ("fp32-storage", "bf16", "bf16-f32c")
GEMM_TORCH_MODES = ("torch-bf16",)
GEMM_BENCH = "BenchmarkCUDAGemmTable"
# A record's TFLOP/s must agree with its own ms and shape (2·m·n·k FLOPs) to 10%: the table's
# ratios use TFLOP/s, and a writer that reports the best time beside the mean, or counts FLOPs
# otherwise, would make them wrong without this.
GEMM_SELF_TOL = 0.10


def read_gemm(path, modes, side, untimed=False):
    """The records of one side of the GEMM table, checked: every key, positive times, TFLOP/s
    agreeing with ms, every mode of modes present. untimed (bench/torch_gemm.py --dry, which
    runs each shape small on the CPU): ms and tflops are null, the shapes positive."""
    try:
        with open(path) as f:
            recs = json.load(f)
    except (OSError, ValueError) as e:
        raise Fail(f"{side}: no GEMM records in {os.path.basename(path)}: {e}")
    if not isinstance(recs, list) or not recs:
        raise Fail(f"{side}: {os.path.basename(path)} is not a non-empty JSON array of records")
    for i, x in enumerate(recs):
        miss = [k for k in GEMM_KEYS if k not in x]
        if miss:
            raise Fail(f"{side}: record {i} lacks {', '.join(miss)}: {x}")
        if untimed:
            if x["ms"] is not None or x["tflops"] is not None or not (x["m"] > 0 and x["n"] > 0 and x["k"] > 0):
                raise Fail(f"{side}: untimed record {i} has ms {x['ms']}, tflops {x['tflops']}, shape {x['m']}×{x['n']}×{x['k']}: "
                           "want null times and a positive shape")
            continue
        if not (x["ms"] is not None and x["tflops"] is not None and x["ms"] > 0 and x["tflops"] > 0):
            raise Fail(f"{side}: record {i} has ms {x['ms']}, tflops {x['tflops']}: want both positive")
        want = 2 * x["m"] * x["n"] * x["k"] / (x["ms"] * 1e-3) / 1e12
        if abs(x["tflops"] - want) > GEMM_SELF_TOL * want:
            raise Fail(f"{side}: record {i} ({x['role']} {x['mode']}): {x['tflops']:.4g} TFLOP/s but 2·m·n·k/ms gives {want:.4g}")
    lack = [m for m in modes if m not in {x["mode"] for x in recs}]
    if lack:
        raise Fail(f"{side}: no record of mode {', '.join(lack)} (want {', '.join(modes)})")
    return recs


def gemm_go(r, limit):
    """BenchmarkCUDAGemmTable of the kernels test binary, its records through DISTFLASH_GEMM_OUT.
    A dry run checks that the benchmark is in the binary and fails without a GPU, saying so."""
    cwd = os.path.join(r.pack, "kernels")
    _, listing = r.sh("gemm_go_list", [r.bin("kernels.test"), "-test.list", f"^{GEMM_BENCH}$"], min(30, limit), cwd=cwd)
    if GEMM_BENCH not in listing.split():
        raise Fail(f"the kernels test binary has no {GEMM_BENCH}: the GEMM table's Go side (issue 41: the 18 shapes in "
                   "fp32-storage, bf16 and bf16-f32c, written to DISTFLASH_GEMM_OUT) is not in this tree; merge it and pack again")
    out = os.path.join(r.work, "gemm_go.json")
    cmd = [r.bin("kernels.test"), "-test.run", "^$", "-test.bench", GEMM_BENCH, "-test.benchtime", "20x"]
    code, text = r.sh("gemm_go", cmd, limit, cwd=cwd, env={"DISTFLASH_GEMM_OUT": out}, ok_codes=(0, 1) if r.dry else (0,))
    if r.dry:
        if code == 0 or "GPU" not in text or os.path.exists(out):
            raise Fail(f"{GEMM_BENCH} without a GPU: exit {code}, {'a' if os.path.exists(out) else 'no'} "
                       f"{os.path.basename(out)}, no clear error: {tail(text, 300)}")
        return {"clear_error": next((line.strip() for line in text.splitlines() if "GPU" in line), "")[:300]}
    return {"records": read_gemm(out, GEMM_GO_MODES, GEMM_BENCH)}


def gemm_torch(r, limit):
    """bench/torch_gemm.py: torch.matmul in bf16 on the same shapes (--dry: its dry run)."""
    script = os.path.join(r.pack, "bench", "torch_gemm.py")
    if not os.path.exists(script):
        raise Fail("bench/torch_gemm.py is not in the pack: the GEMM table's PyTorch side (issue 41: torch.matmul in bf16 on "
                   "the 18 shapes, mode torch-bf16) is not in this tree; merge it and pack again")
    out = os.path.join(r.work, "gemm_torch.json")
    r.sh("gemm_torch", [sys.executable, script, "--out", out] + (["--dry"] if r.dry else []), limit, env={"PYTHONUNBUFFERED": "1"})
    return {"records": read_gemm(out, GEMM_TORCH_MODES, "bench/torch_gemm.py", untimed=r.dry)}


def gemm_join(go, torch_recs):
    """The table by shape (role, m, n, k, transA, transB): each mode's TFLOP/s and ms, each of
    ours over torch-bf16, bf16 over fp32-storage; and per mode the FLOP-weighted rate over the
    shapes every mode has (the time of one product of each shape: Σ FLOPs / Σ time)."""
    rows, order = {}, []
    for x in list(go) + list(torch_recs):
        key = tuple(x[k] for k in GEMM_KEYS[:6])
        if key not in rows:
            rows[key] = {**{k: x[k] for k in GEMM_KEYS[:6]}, "tflops": {}, "ms": {}}
            order.append(key)
        rows[key]["tflops"][x["mode"]] = x["tflops"]
        rows[key]["ms"][x["mode"]] = x["ms"]
    seen = {x["mode"] for x in list(go) + list(torch_recs)}
    modes = [m for m in GEMM_GO_MODES + GEMM_TORCH_MODES if m in seen] + sorted(seen - set(GEMM_GO_MODES + GEMM_TORCH_MODES))
    out = []
    for key in order:
        row = rows[key]
        t = row["tflops"]
        ref = t.get("torch-bf16")
        row["vs_torch"] = {m: t[m] / ref for m in GEMM_GO_MODES if m in t and ref}
        if "bf16" in t and "fp32-storage" in t:
            row["bf16_over_fp32_storage"] = t["bf16"] / t["fp32-storage"]
        out.append(row)
    full = [row for row in out if all(m in row["tflops"] for m in modes)]
    weighted = {}
    if full:
        flops = sum(2 * row["m"] * row["n"] * row["k"] for row in full)
        for m in modes:
            weighted[m] = flops / sum(2 * row["m"] * row["n"] * row["k"] / row["tflops"][m] for row in full)
    return {"modes": modes, "rows": out, "flop_weighted_tflops": weighted, "shapes_in_every_mode": len(full),
            "shapes": len(out), "unmatched": [f"{row['role']} {row['m']}×{row['n']}×{row['k']}" for row in out if row not in full]}


def gemm_join_check(torch_recs):
    """Dry run: gemm_join and its Markdown on Go records made from torch's (or two made-up
    shapes) at known fractions of torch's rate: every ratio and the weighted rates must come back."""
    # the torch side's shapes (a dry run's records are untimed: each gets 0.1 ms), else two made up
    base = [dict(x, ms=0.1, tflops=2 * x["m"] * x["n"] * x["k"] / 0.1e-3 / 1e12) for x in torch_recs if x["mode"] == "torch-bf16"] or [
        {"role": "q fwd", "m": 8192, "n": 2048, "k": 2048, "transA": False, "transB": True, "mode": "torch-bf16", "ms": 0.106,
         "tflops": 2 * 8192 * 2048 * 2048 / 0.106e-3 / 1e12},
        {"role": "kv dX", "m": 8192, "n": 2048, "k": 512, "transA": False, "transB": False, "mode": "torch-bf16", "ms": 0.05,
         "tflops": 2 * 8192 * 2048 * 512 / 0.05e-3 / 1e12}]
    frac = {"fp32-storage": 0.5, "bf16": 1.0, "bf16-f32c": 0.8}
    go = [dict(x, mode=m, tflops=x["tflops"] * f, ms=x["ms"] / f) for x in base for m, f in frac.items()]
    j = gemm_join(go, base)
    if len(j["rows"]) != len({tuple(x[k] for k in GEMM_KEYS[:6]) for x in base}) or j["unmatched"]:
        raise Fail(f"gemm_join: {len(j['rows'])} rows, unmatched {j['unmatched']}, from {len(base)} shapes")
    for row in j["rows"]:
        for m, f in frac.items():
            if abs(row["vs_torch"][m] - f) > 1e-9:
                raise Fail(f"gemm_join: {row['role']} {m} over torch {row['vs_torch'][m]}, want {f}")
    w = j["flop_weighted_tflops"]
    for m, f in frac.items():
        if abs(w[m] / w["torch-bf16"] - f) > 1e-9:
            raise Fail(f"gemm_join: weighted {m} {w[m]} over torch {w['torch-bf16']}, want {f}")
    if not any("| bf16/torch" in line or "bf16/torch" in line for line in gemm_markdown(j)):
        raise Fail("gemm_markdown: no ratio column")
    return "ok"


def gemm_table(r, steps):
    """The two sides joined (summary.json's "gemm"); a dry run checks the join on made-up records."""
    go = (steps.get("go") or {}).get("records") or []
    th = (steps.get("torch") or {}).get("records") or []
    res = {}
    if r.dry:  # the torch side's records are untimed and the Go side made none: check the join only
        res["join_check"] = gemm_join_check(th)
        return res
    if not go and not th:
        raise Skip("neither side of the GEMM table was made (their steps say why)")
    res["gemm"] = gemm_join(go, th)
    if not go or not th:
        res["note"] = "one side only: " + ("no distflash records" if not go else "no torch records")
    return res


def phase_gemm(r):
    got = {}
    # expected: a process start and cuBLAS's load (a few s), 18 shapes × the modes × 21 products of
    # at most 2 ms, and the uploads of their operands
    rec = r.step("gemm", f"GEMM table: distflash ({GEMM_BENCH})", lambda t: gemm_go(r, t), 60, 15)
    got["go"] = rec.get("result")
    rec = r.step("gemm", "GEMM table: torch.matmul (bench/torch_gemm.py)", lambda t: gemm_torch(r, t), 45, 15)
    got["torch"] = rec.get("result")
    r.step("gemm", "GEMM table joined", lambda t: gemm_table(r, got), 10, 0)


def tflag(x):
    return x if isinstance(x, str) else ("T" if x else "N")


def gemm_markdown(g):
    modes = g.get("modes") or []
    ours = [m for m in GEMM_GO_MODES if m in modes]
    L = ["", "## GEMM table (TFLOP/s; distflash's modes over torch.matmul bf16)", "",
         "| role | M×N×K | op | " + " | ".join(modes) + " | " + " | ".join(f"{m}/torch" for m in ours) + " | bf16/fp32-storage |",
         "| --- | --- | --- |" + " ---: |" * (len(modes) + len(ours) + 1)]
    for row in g.get("rows", []):
        t, v = row["tflops"], row.get("vs_torch", {})
        L.append(f"| {str(row['role']).replace('|', chr(92) + '|')} | {row['m']}×{row['n']}×{row['k']} | {tflag(row['transA'])}{tflag(row['transB'])} | " +
                 " | ".join(fmt(t.get(m), ".1f") for m in modes) + " | " + " | ".join(fmt(v.get(m), ".2f") for m in ours) +
                 f" | {fmt(row.get('bf16_over_fp32_storage'), '.2f')} |")
    w = g.get("flop_weighted_tflops") or {}
    if w:
        L += ["", f"FLOP-weighted over the {g.get('shapes_in_every_mode')} shapes every mode has: " +
              ", ".join(f"{m} {w[m]:.1f}" for m in modes if m in w) + " TFLOP/s."]
    if g.get("unmatched"):
        L += ["", "Shapes not in every mode: " + ", ".join(g["unmatched"]) + "."]
    return L


# ---------------------------------------------------------------------------------------------
# The per-op tables (issue 36, part 1): ours from `train --profile` (ops.json: CUDA events per op
# class, floors at the ceilings it measures), PyTorch's from torch.profiler (bench/torch_ops.py),
# for every run of the model phase, each beside PyTorch's run of the same length and policy; all
# under "ops" in summary.json, with each table rolled up into the components of docs/gpu.md's
# predicted budget ("budget").

# The components of docs/gpu.md's "The 8K step's budget" and the op classes (ops.json's, and
# torch_ops.py's, which adds gemm.other and other) each takes, by phase where it matters: the
# optimizer phase is the step phase's optimizer, casts (the 16-bit copy's refresh), zeroing and
# collectives; what no bracket covers (today the gradient norm, the finiteness check and the
# stats download) is in gaps.
BUDGET_ROWS = [
    ("attention kernels and glue", lambda op, ph: op == "attention"),
    ("GEMMs", lambda op, ph: op.startswith("gemm.")),
    ("elementwise and casts", lambda op, ph: op in ("rmsnorm", "add+rmsnorm", "rope", "swiglu", "residual", "embedding", "cast",
                                                      "zero", "other") and ph != "step"),
    ("loss", lambda op, ph: op == "loss"),
    ("optimizer phase", lambda op, ph: ph == "step" and op in ("optimizer", "cast", "zero", "comm", "other")),
    ("host gaps and syncs (and what no bracket covers)", lambda op, ph: op == "gaps"),
]
# docs/gpu.md's prediction ("The 8K step's budget") for the 0.85B at 8K on one H200 after issue 41,
# ms a step, with attn_output and with checkpoint none (mlp_tile 0): the report sets each
# measured row beside it. The gradient-norm pass (GradStats, 0.9 ms) is bracketed by no op, so
# the prediction counts it where the rollup finds it: in gaps.
PREDICTED_8K = {"attention kernels and glue": (30.2, 30.2), "GEMMs": (73.0, 59.5), "elementwise and casts": (9.0, 7.1),
                "loss": (0.4, 0.4), "optimizer phase": (6.7, 6.7), "host gaps and syncs (and what no bracket covers)": (2.4, 2.4)}


def budget_rollup(table):
    """ms a step of each BUDGET_ROWS component in an ops table (ours or torch_ops.py's)."""
    out = {name: 0.0 for name, _ in BUDGET_ROWS}
    for x in (table or {}).get("ops", []):
        for name, f in BUDGET_ROWS:
            if f(x["op"], x["phase"]):
                out[name] += 1e3 * x.get("seconds", 0)
                break
    out["step"] = 1e3 * (table or {}).get("step_seconds", 0)
    return out


def ops_side_by_side(ours, theirs):
    """Rows of both tables by (op, phase): each side's ms a step, ours over PyTorch's, and our
    floor (the op's bytes and FLOPs at the ceilings our run measured) with each side's ratio to it."""
    a = {(x["op"], x["phase"]): x for x in (ours or {}).get("ops", [])}
    b = {(x["op"], x["phase"]): x for x in (theirs or {}).get("ops", [])}
    rows = []
    for k in list(a) + [k for k in b if k not in a]:
        x, y = a.get(k, {}), b.get(k, {})
        row = {"op": k[0], "phase": k[1], "ours_ms": 1e3 * x.get("seconds", 0), "torch_ms": 1e3 * y.get("seconds", 0),
               "ours_calls": x.get("calls", 0), "torch_calls": y.get("calls", 0)}
        if row["ours_ms"] > 0 and row["torch_ms"] > 0:
            row["ours_over_torch"] = row["ours_ms"] / row["torch_ms"]
        if x.get("floor_seconds"):
            row["floor_ms"] = 1e3 * x["floor_seconds"]
            row["ours_ratio"], row["torch_ratio"] = row["ours_ms"] / row["floor_ms"], row["torch_ms"] / row["floor_ms"]
        rows.append(row)
    return rows


def ops_tables(r, res):
    """Every run's table beside PyTorch's of the same length and policy, rolled up into the
    budget's components, under "ops" (summary.json takes it); at the first length the rollups
    beside docs/gpu.md's prediction ("budget_8k")."""
    seqs = MODEL_DRY_SEQS if r.dry else MODEL_SEQS
    out, cols = [], {}
    for seq in seqs:
        for variant in MODEL_VARIANTS:
            d = res.get(f"distflash_{seq}_{variant}") or {}
            t = res.get(f"torch_{seq}_{TORCH_PEER[variant]}") or {}
            ours, theirs = d.get("table"), t.get("table")
            if not ours:
                continue
            out.append({"seq": seq, "variant": variant, "checkpoint": d.get("checkpoint"), "torch_variant": TORCH_PEER[variant],
                        "distflash": ours, "torch": theirs, "side_by_side": ops_side_by_side(ours, theirs),
                        "budget": {"distflash": budget_rollup(ours), "torch": budget_rollup(theirs) if theirs else None}})
            if seq == seqs[0]:
                cols[f"distflash {variant} (checkpoint {d.get('checkpoint') or d.get('checkpoint_asked')})"] = budget_rollup(ours)
        for ckpt in ("attn_output", "none"):
            t = res.get(f"torch_{seq}_{ckpt}") or {}
            if seq == seqs[0] and t.get("table"):
                cols[f"PyTorch {ckpt}"] = budget_rollup(t["table"])
    if not out:
        raise Skip("no per-op table was made")
    pred = None if r.dry else {k: {"attn_output": a, "none": n} for k, (a, n) in PREDICTED_8K.items()}  # for the 0.85B at 8K only
    return {"ops": out, "budget_8k": {"seq": seqs[0], "predicted": pred, "measured": cols}}


def ops_markdown(o):
    """One run's side-by-side table for report.md."""
    ours, theirs = o.get("distflash") or {}, o.get("torch") or {}

    def num(v, spec=".3f"):
        return format(v, spec) if v else "-"
    c = ours.get("ceilings") or {}
    L = ["", f"## Per-op tables, seq {o.get('seq')}, distflash {o.get('variant')} (checkpoint {o.get('checkpoint')}) beside PyTorch "
         f"{o.get('torch_variant')} (ms a step; floor: our bytes and FLOPs at our measured ceilings)", "",
         f"distflash {num(1e3 * ours.get('step_seconds', 0), '.1f')} ms a step on the device's clock, "
         f"{num(1e3 * ours.get('gap_seconds', 0), '.1f')} ms of it outside every op; ceilings ({c.get('source')}): "
         f"{num((c.get('bytes_per_s') or 0) / 1e9, '.0f')} GB/s, {num((c.get('gemm_flops_per_s') or 0) / 1e12, '.1f')} TFLOP/s GEMM. "
         f"PyTorch {num(1e3 * theirs.get('step_seconds', 0), '.1f')} ms a step with the profiler on, kernels "
         f"{num(1e3 * (theirs.get('step_seconds', 0) - theirs.get('gap_seconds', 0)), '.1f')} ms.", "",
         "| op | phase | ours calls | ours ms | PyTorch calls | PyTorch ms | ours/PyTorch | floor ms | ours ×floor | PyTorch ×floor |",
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x in o.get("side_by_side", []):
        L.append(f"| {x['op']} | {x['phase']} | {num(x['ours_calls'], '.0f')} | {num(x['ours_ms'])} | {num(x['torch_calls'], '.0f')} | "
                 f"{num(x['torch_ms'])} | {num(x.get('ours_over_torch'), '.2f')} | {num(x.get('floor_ms'))} | "
                 f"{num(x.get('ours_ratio'), '.2f')} | {num(x.get('torch_ratio'), '.2f')} |")
    return L


def budget_markdown(b):
    """The 8K budget: docs/gpu.md's prediction beside each run's rollup."""
    cols = list((b.get("measured") or {}).keys())
    L = ["", f"## The {b.get('seq')}-token step's budget: predicted (docs/gpu.md, H200) beside measured (ms a step)", "",
         "| component | predicted attn_output | predicted none | " + " | ".join(cols) + " |",
         "| --- | ---: | ---: |" + " ---: |" * len(cols)]
    for name, _ in BUDGET_ROWS + [("step", None)]:
        p = (b.get("predicted") or {}).get(name) or {}
        if name == "step":
            p = {k: sum(v[k] for v in (b.get("predicted") or {}).values()) for k in ("attn_output", "none")} if b.get("predicted") else {}
        L.append(f"| {name} | {fmt(p.get('attn_output'), '.1f')} | {fmt(p.get('none'), '.1f')} | " +
                 " | ".join(fmt(b["measured"][c].get(name), ".1f") for c in cols) + " |")
    return L


# ---------------------------------------------------------------------------------------------
# The 0.85B model's curve beside PyTorch's (issue 35)

CURVE_1B_STEPS = 30
# The largest relative gap allowed between the two bf16 curves. bf16 trains within 0.01 nats of
# fp32 over a run (docs/training.md#mixed-precision), and a bf16 curve's single steps have been
# measured up to 0.019 nats from fp32's (TestHalfActivationsTrain, 50 steps); two bf16 programs
# that each stay that close to the fp32 curve differ by at most 0.04 nats, which at the losses of
# these 30 steps (above 4 nats for the byte tokens of the Go tree) is 1%. On the CPU at the tiny
# shape the two differ by 7e-4 relative (e2e's TestTrainsLikePyTorch).
CURVE_1B_TOL = 0.01


def curve_1b(r, limit):
    """distflash and PyTorch (bench/torch_train.py) train configs/llama-1b.toml's 0.85B model in
    bf16 at 8K tokens a step for CURVE_1B_STEPS steps, from distflash's step-0 weights on the same
    sequences (DISTFLASH_TRACE), with the same schedule (warmup 10 to lr 3e-4: the curve moves),
    clipping and AdamW. Both curves are drawn in curve_1b.png; "curve" in summary.json has the
    steps, the largest relative gap and the tolerance."""
    seq = 256 if r.dry else 8192
    trace = os.path.join(r.work, "trace_1b")
    extra = ["--set", f"data.seq_len={seq}", "--set", "training.warmup_steps=10", "--set", "run.tensorboard=false"]
    if r.dry:
        extra += [x for s in model_sets(LLAMA_DRY) for x in ("--set", s)]
    start = time.time()
    rows = train_curve(r, "llama1b-curve", "cpu" if r.dry else "cuda", "bf16", limit * 0.45, steps=CURVE_1B_STEPS,
                       config="llama-1b.toml", extra=extra, env={"DISTFLASH_TRACE": trace})
    ours = {m["step"]: m["loss"] for m in rows}
    jpath = os.path.join(r.work, "torch_curve_1b.json")
    cmd = [sys.executable, os.path.join(r.pack, "bench", "torch_train.py"), "--trace", trace, "--json", jpath,
           "--device", "cpu" if r.dry else "cuda"]
    r.sh("torch_curve_1b", cmd, max(limit - (time.time() - start), 1), env={"PYTHONUNBUFFERED": "1"})
    with open(jpath) as f:
        theirs = json.load(f)
    steps = [s for s in theirs["steps"] if s in ours]
    gaps = [abs(l - ours[s]) / abs(ours[s]) for s, l in zip(theirs["steps"], theirs["loss"]) if s in ours]
    if len(steps) < CURVE_1B_STEPS:
        raise Fail(f"{len(steps)} steps in both curves, want {CURVE_1B_STEPS}")
    curve = {"steps": len(steps), "max_rel": max(gaps), "tolerance": CURVE_1B_TOL, "seq": seq,
             "distflash": [ours[s] for s in steps], "pytorch": theirs["loss"][:len(steps)], "torch": theirs.get("torch")}
    curve["png"] = plot_curves(os.path.join(r.out, "curve_1b.png"), steps, curve, seq)
    if not curve["max_rel"] <= CURVE_1B_TOL:
        raise Fail(f"the curves differ by up to {curve['max_rel']:.3g} relative, over {CURVE_1B_TOL}: {curve}")
    return {"curve": curve}


def plot_curves(path, steps, curve, seq):
    """Both losses against the step in one PNG (matplotlib, which the GPU machine has with
    PyTorch); None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(steps, curve["distflash"], "o-", ms=3, label="distflash")
    ax.plot(steps, curve["pytorch"], "x--", ms=4, label="PyTorch (bench/torch_train.py)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"0.85B LLaMA, bf16, {seq} tokens a step: largest gap {curve['max_rel']:.2e} relative")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return os.path.basename(path)


def phase_curve(r):
    rec = r.step("curve", "0.85B curve: distflash vs PyTorch", lambda t: curve_1b(r, t), 280)
    c = (rec.get("result") or {}).get("curve")
    if c:  # the report's table says it
        rec["note"] = (f"{c['steps']} steps of {c['seq']} tokens, bf16: largest relative gap {c['max_rel']:.3g} "
                       f"(tolerance {c['tolerance']}); {c['png'] or 'no PNG (matplotlib missing)'}")


# ---------------------------------------------------------------------------------------------
# Report


def fmt(x, spec=".3g"):
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def gib(b):
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def render(rep):
    m = rep["meta"]
    env = m.get("env", {})
    pk = m.get("pack", {})
    L = [f"# distflash GPU check{' (dry run, no GPU)' if m.get('dry_run') else ''}", "",
         f"- date: {m.get('started')} – {m.get('finished')}; phases: {', '.join(m.get('phases', []))}",
         f"- GPU: {env.get('nvidia_smi')}", f"- PyTorch {env.get('torch')} (CUDA {env.get('torch_cuda')}); "
         f"cuBLAS {env.get('cublas')}; ncu {env.get('ncu')}",
         f"- pack: commit {pk.get('commit')}{' (dirty)' if pk.get('dirty') else ''}, {pk.get('go')}, "
         f"{pk.get('nvcc')}, packed {pk.get('date')}", "", "## Steps", "",
         "| phase | step | status | seconds | note |", "| --- | --- | --- | --- | --- |"]
    for s in rep["steps"]:
        note = (s.get("note") or "").replace("|", "\\|").replace("\n", " ")
        L.append(f"| {s['phase']} | {s['name']} | {s['status']} | {fmt(s.get('seconds'))} | {tail(note, 300)} |")
    sup = m.get("superseded") or []
    if sup:
        L += ["", "Earlier runs of steps that a later run replaced (after a fix):", "",
              "| phase | step | status | started | note |", "| --- | --- | --- | --- | --- |"]
        for s in sup:
            note = (s.get("note") or "").replace("|", "\\|").replace("\n", " ")
            L.append(f"| {s['phase']} | {s['name']} | {s['status']} | {s.get('started')} | {tail(note, 200)} |")
    by = {s["name"]: s.get("result") or {} for s in rep["steps"]}
    kt = by.get("kernels test binary")
    if kt:
        L += ["", "## Correctness", "", f"kernels test binary: {kt.get('passed')} passed "
              f"({kt.get('cuda_tests')} of them TestCUDA*), failed: {', '.join(kt.get('failed_tests') or []) or 'none'}"]
    cv = by.get("tiny 50-step curves cpu/cuda × fp32/bf16")
    if cv and cv.get("curves"):
        c = cv["curves"]
        L += ["", f"tiny.toml, {CURVE_STEPS} steps: fp32 max relative loss difference cuda vs cpu "
              f"{fmt(cv.get('fp32_max_rel'))} (limit {FP32_TOL}); bf16: cpu band {fmt(cv.get('bf16_cpu_band'))}, "
              f"cuda vs fp32 {fmt(cv.get('bf16_cuda_vs_fp32'))} (limit 2 × band), cuda vs cpu bf16 "
              f"{fmt(cv.get('bf16_cuda_vs_cpu_bf16'))}", "",
              "| step | " + " | ".join(c) + " |", "| --- |" + " --- |" * len(c)]
        lists = {k: v for k, v in c.items() if isinstance(v, list)}
        n = max((len(v) for v in lists.values()), default=0)
        for i in list(range(0, n, 10)) + ([n - 1] if n and (n - 1) % 10 else []):
            L.append(f"| {i + 1} | " + " | ".join(fmt(v[i], ".6f") if isinstance(v, list) and i < len(v) else
                                                  ("(error)" if not isinstance(v, list) else "-") for v in c.values()) + " |")
        for k, v in c.items():
            if isinstance(v, dict):
                L.append(f"\n{k}: {v}")
    dm = by.get("tiny 20-step document-mask curves cpu/cuda fp32")
    if dm and dm.get("curves"):
        L += ["", f"tiny.toml with data.document_mask, {DOC_STEPS} steps: fp32 max relative loss difference cuda vs "
              f"cpu {fmt(dm.get('fp32_max_rel'))} (limit {FP32_TOL}); final losses " +
              ", ".join(f"{k} {fmt(v[-1], '.6f')}" for k, v in dm["curves"].items() if v)]
    sp = by.get("llama-1b shape (2 layers, seq 1024) cpu vs cuda fp32")
    if sp and sp.get("curves"):
        L += ["", f"llama-1b shape ({', '.join(SHAPE_SETS)}), {SHAPE_STEPS} steps fp32: max relative loss difference "
              f"cuda vs cpu {fmt(sp.get('fp32_max_rel'))} (limit {FP32_TOL}); losses " +
              "; ".join(f"{k} " + ", ".join(fmt(x, '.6f') for x in v) for k, v in sp["curves"].items() if v)]
    for tool in ("memcheck", "racecheck"):
        sz = by.get(f"compute-sanitizer {tool}")
        if sz:
            L += ["", f"compute-sanitizer {tool} ({' and '.join(SANITIZER_RUNS[tool])}): {sz.get('errors')} error(s), "
                  f"{sz.get('tests_passed')} test(s) passed, failed: {', '.join(sz.get('tests_failed') or []) or 'none'}"]
    shapes = merge_attention(by)
    if shapes:
        L += ["", "## Attention (causal, bf16; TFLOP/s of useful work; torch = faster of SDPA flash / cuDNN)", "",
              "| head_dim | seq | batch×heads | torch fwd | ours fwd | ratio | torch fwd+bwd | ours fwd+bwd | ratio |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in shapes:
            t = (s.get("torch") or {}).get("best", {})
            g = s.get("distflash") or {}

            def ratio(k):
                return f"{g[k] / t[k]:.2f}" if g.get(k) and t.get(k) else "-"
            L.append(f"| {s['head_dim']} | {s['seq']} | {s['batch']}×{s['heads']} | {fmt(t.get('fwd_tflops'), '.1f')} | "
                     f"{fmt(g.get('fwd_tflops'), '.1f')} | {ratio('fwd_tflops')} | {fmt(t.get('fwd_bwd_tflops'), '.1f')} | "
                     f"{fmt(g.get('fwd_bwd_tflops'), '.1f')} | {ratio('fwd_bwd_tflops')} |")
    nc = by.get("ncu profile (hd128, 16K)")
    if nc and nc.get("kernels"):
        L += ["", "## ncu (head_dim 128, seq 16K, 16 heads)", ""]
        for k in nc["kernels"]:
            L.append(f"- {k['kernel']}: " + "; ".join(f"{a} {k[a]}" for a in NCU_KEYS if a in k))
    for res in by.values():
        if isinstance(res.get("gemm"), dict):
            L += gemm_markdown(res["gemm"])
    ms = by.get(MODEL_SUMMARY)
    if ms and ms.get("rows"):
        L += ["", f"## Model ({fmt(ms['shape']['params'] / 1e9, '.3f')}B params; MFU = {ms['mfu_formula']}; "
              f"peak {fmt(ms.get('peak_flops'))} FLOP/s)", "",
              f"Checkpoint policy asked: {ms.get('checkpoint_choice')}. Learning rate constant from the first step, as PyTorch's. "
              "×PyTorch: tokens/s over PyTorch's with the same policy (attn_output, or none beside none); ×best: over "
              "PyTorch's faster run at that length.", "",
              "| seq | impl | attention | checkpoint | tokens/s | step s | MFU | ×PyTorch | ×best | peak GPU mem (nvidia-smi) | "
              "torch allocator peak | mem/PyTorch | loss first → last | plan step s | plan peak | plan/measured step | plan/measured mem |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
        for row in ms["rows"]:
            p = row.get("plan", {})
            for d in row.get("runs", []):
                mfu = f"{d['mfu'] * 100:.1f}%" if d.get("mfu") else "-"
                main = d["impl"] == "distflash" and d["variant"] == "cudnn"
                planc = [fmt(p.get("step_s")), gib(p.get("peak_bytes")), fmt(p.get("step_ratio"), ".2f"),
                         fmt(p.get("memory_ratio"), ".2f")] if main else ["", "", "", ""]
                loss = f"{d['losses'][0]:.3f} → {d['losses'][1]:.3f}" if d.get("losses") else ("out of memory" if d.get("oom") else "-")
                L.append(f"| {row['seq']} | {d['impl']} {d['variant']} | {d.get('attention')} | {d.get('checkpoint') or '-'} | "
                         f"{fmt(d.get('tokens_per_s'), '.0f')} | {fmt(d.get('step_s'))} | {mfu} | {fmt(d.get('vs_torch'), '.2f')} | "
                         f"{fmt(d.get('vs_torch_best'), '.2f')} | {gib(d.get('peak_gpu_bytes'))} | {gib(d.get('peak_allocated_bytes'))} | "
                         f"{fmt(d.get('peak_vs_torch'), '.2f')} | {loss} | " + " | ".join(planc) + " |")
        for n in ms.get("loss_notes") or []:
            L += ["", f"Note: {n}."]
        a = ms.get("activations", {})
        L += ["", "Activation bytes per token per layer: measured (peak slope less the planner's logits/scratch terms) "
              f"{fmt(a.get('measured_bytes_per_token_layer'), '.0f')}; distflash's own accounting "
              f"{fmt(a.get('accounted_bytes_per_token_layer'), '.0f')}; planner {fmt(a.get('planner_bytes_per_token_layer'), '.0f')}; "
              f"bf16 anchor {a.get('bf16_anchor_bytes')} ({a.get('anchor_note')}){'; ' + a['note'] if a.get('note') else ''}."]
    for res in by.values():
        if isinstance(res.get("budget_8k"), dict):
            L += budget_markdown(res["budget_8k"])
        if isinstance(res.get("ops"), list):
            for o in res["ops"]:
                L += ops_markdown(o)
    L.append("")
    return "\n".join(L)


def summary(rep):
    """The figures tools read, from a report's steps (summary.json): the GPU, attention
    forward+backward TFLOP/s of ours (own kernel, cuDNN) beside SDPA's per shape, the 0.85B
    model's runs (tokens/s, MFU, peak memory, their ratios to PyTorch's) and the goals' figures
    (model_summary), and whatever a step put under "curve", "ops", "gemm" or "budget_8k"."""
    steps = {s["name"]: s.get("result") or {} for s in rep["steps"]}
    def fb(rec, key):
        d = rec.get(key)
        if isinstance(d, dict):
            return (d.get("best") or d).get("fwd_bwd_tflops")
        return None
    attn = {}
    for name, key, field in (("attention: torch SDPA", "torch", "sdpa_fwd_bwd"), ("attention: distflash kernel", "distflash", "ours_fwd_bwd"),
                             ("attention: distflash with cuDNN", "distflash", "ours_cudnn_fwd_bwd")):
        for sh in steps.get(name, {}).get("shapes", []):
            row = attn.setdefault((sh.get("head_dim"), sh.get("seq")), {"head_dim": sh.get("head_dim"), "seq": sh.get("seq")})
            row[field] = fb(sh, key)
    model, goals = [], None
    ms = steps.get(MODEL_SUMMARY, {})
    for row in ms.get("rows", []):
        for d in row.get("runs", []):
            model.append({"seq": row["seq"], **{k: d.get(k) for k in ("impl", "variant", "attention", "checkpoint", "tokens_per_s", "mfu",
                                                                       "vs_torch", "vs_torch_best", "peak_vs_torch", "oom")},
                          "peak_gib": (d.get("peak_gpu_bytes") or 0) / 2**30 or None})
    if ms.get("goals"):
        goals = ms["goals"]
    c = steps.get("distflash 1B seq 8192 with cuDNN")
    if c:
        model.append({"seq": c.get("seq"), "impl": "distflash", "variant": "phase cudnn", "attention": "cudnn",
                      "tokens_per_s": c.get("tokens_per_s"), "peak_gib": (c.get("peak_gpu_bytes") or 0) / 2**30 or None})
    out = {"gpu": rep["meta"].get("env", {}).get("gpu"), "attention": [attn[k] for k in sorted(attn, key=lambda k: (k[0] or 0, k[1] or 0))],
           "model": model}
    if goals:
        out["goals"] = goals
    for res in steps.values():
        for key in ("curve", "ops", "gemm", "budget_8k"):
            if isinstance(res, dict) and key in res:
                out[key] = res[key]
    recs = {s["name"]: s for s in rep["steps"]}
    cmds = {}
    for name in (STEP_CMD_WORLDS, STEP_CMD_NCCL):
        if name in recs:
            rec = recs[name]
            cmds.update({tag: v for tag, v in (rec.get("result") or {}).items() if isinstance(v, dict)})
            cmds.setdefault("steps", {})[name] = step_status(rec)
    if cmds:
        out["commands"] = cmds
    nccl = nccl_summary(recs)
    if nccl:
        out["nccl"] = nccl
    return out


def step_status(rec):
    """A step's status and note, as summary.json lists them."""
    return {"status": rec["status"], **({"note": rec["note"]} if rec.get("note") else {})}


def nccl_summary(recs):
    """summary.json's nccl: the library the NCCL cases ran on (version, pack or wheel, its build,
    the ABI check), the ranks that ran (1, 4), each training case's largest relative loss
    difference from one rank, and the steps' statuses."""
    found = next((recs[n] for n in (STEP_NCCL_FIND, STEP_NCCL_FIND_CMD) if n in recs), None)
    if found is None:
        return None
    lib = found.get("result") or {}
    out = {k: lib[k] for k in ("version", "from", "lib", "abi") if k in lib}
    if isinstance(lib.get("build"), dict):
        out["build"] = {k: lib["build"].get(k) for k in ("tag", "commit", "arch", "only_funcs", "bytes")}
    if "wheel" in lib:
        out["wheel_version"] = lib["wheel"].get("version")
    ranks, train = set(), {}
    steps = {n: step_status(recs[n]) for n in (STEP_NCCL_FIND, STEP_NCCL_FIND_CMD, STEP_NCCL_TRAIN, STEP_CMD_NCCL) if n in recs}
    for case, v in ((recs.get(STEP_NCCL_TRAIN) or {}).get("result") or {}).items():
        if isinstance(v, dict) and "max_rel" in v:
            train[case] = v["max_rel"]
            ranks.add(1 if case == "one_rank" else 4)
    for tag, v in ((recs.get(STEP_CMD_NCCL) or {}).get("result") or {}).items():
        if isinstance(v, dict):
            ranks.add(1 if tag == "nccl-1" else 4)
    out.update(ranks_run=sorted(ranks), train_max_rel=train, steps=steps)
    return out


def write_report(r, phases):
    r.meta["finished"] = now()
    r.meta["phases"] = phases
    rep = {"meta": r.meta, "steps": r.steps}
    with open(os.path.join(r.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(r.out, "summary.json"), "w") as f:
        json.dump(summary(rep), f, indent=1)
    with open(os.path.join(r.out, "report.md"), "w") as f:
        f.write(render(rep))
    with tarfile.open(os.path.join(r.out, "logs.tar.gz"), "w:gz") as t:
        t.add(r.logs, arcname="logs")
        for p in glob.glob(os.path.join(r.work, "runs", "*", "metrics.jsonl")):
            t.add(p, arcname=os.path.relpath(p, r.work))
    shutil.rmtree(r.work, ignore_errors=True)
    return rep


# ---------------------------------------------------------------------------------------------
# Several GPU processes over MPI

MPI_STEPS = 10
MPI_CASES = [("distflash", ()), ("ring", ()), ("zigzag", ()), ("burst", ()), ("ulysses", ()), ("attn2d", ()),
             ("ring-ulysses2", ("--set", "parallelism.attention=ring", "--set", "parallelism.ulysses_degree=2")),
             ("fsdp", ("--set", "parallelism.attention=distflash", "--set", "parallelism.fsdp=true"))]


# The steps summary() reads the commands and NCCL results of.
STEP_NCCL_FIND = "NCCL library, version, ABI against its header"
STEP_NCCL_FIND_CMD = STEP_NCCL_FIND + " (commands)"  # the commands phase's, where it runs first
STEP_NCCL_TRAIN = "NCCL: one rank; 4 ranks on one GPU (NCCL >= 2.30) vs 1 rank"
STEP_CMD_WORLDS = "eval, positions, passkey, generate: 1 GPU rank, 4 MPI ranks on the GPU vs 1 CPU rank"
STEP_CMD_NCCL = "the same over NCCL: 1 rank; 4 ranks on one GPU (NCCL >= 2.30)"


def unpack_mpi(r, limit):
    """Unpacks the pack's Open MPI .debs into work/ompi and sets r.mpi_env to run it from there,
    and r.mpi_bin to the MPI build of distflash (bin/distflash-mpi, unpacked from its .xz)."""
    if not os.path.exists(r.bin("distflash-mpi")):
        raise Fail("the pack has no bin/distflash-mpi(.xz): make it with scripts/gpu_check.sh pack")
    r.mpi_bin = r.bin("distflash-mpi")
    debs = sorted(glob.glob(os.path.join(r.pack, "ompi", "*.deb")))
    if not debs:
        raise Fail("the pack has no ompi/*.deb: scripts/gpu_check.sh pack downloads them with apt-get (Debian)")
    root = os.path.join(r.work, "ompi")
    os.makedirs(root, exist_ok=True)
    for d in debs:
        if shutil.which("dpkg-deb"):
            r.sh("ompi-unpack-" + os.path.basename(d), ["dpkg-deb", "-x", d, root], 60)
        else:  # ar + tar, where there is no dpkg
            tmp = os.path.join(r.work, "deb")
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            r.sh("ompi-ar-" + os.path.basename(d), ["ar", "x", d], 60, cwd=tmp)
            data = glob.glob(os.path.join(tmp, "data.tar.*"))[0]
            r.sh("ompi-tar-" + os.path.basename(d), ["tar", "-xf", data, "-C", root], 60)
    usr = os.path.join(root, "usr")
    lib = os.path.join(usr, "lib", "x86_64-linux-gnu")
    r.mpi_env = {"OPAL_PREFIX": usr, "PMIX_INSTALL_PREFIX": usr,
                 "PATH": os.path.join(usr, "bin") + ":" + r.env.get("PATH", ""),
                 "LD_LIBRARY_PATH": lib + ":" + os.path.join(lib, "openmpi", "lib") + ":" + r.env.get("LD_LIBRARY_PATH", ""),
                 "OMPI_MCA_plm_rsh_agent": "false"}
    _, out = r.sh("ompi-version", [os.path.join(usr, "bin", "mpirun.openmpi"), "--version"], 30, env=r.mpi_env)
    return {"debs": len(debs), "version": out.strip().splitlines()[-1] if out.strip() else ""}


def mpi_train(r, name, np, device, extra, limit, env=None):
    runs = os.path.join(r.work, "runs")
    cmd = [r.mpi_bin, "train", "--config", os.path.join(r.pack, "configs", "tiny.toml"),
           "--set", f"data.train={os.path.join(r.pack, 'data', 'go.tokens')}", "--set", "data.format=tokens",
           "--set", f"training.steps={MPI_STEPS}", "--set", f"device.kind={device}",
           "--set", f"parallelism.world_size={np}", "--set", f"parallelism.sequence_parallel_degree={np}",
           "--set", f"run.output_dir={runs}", "--set", f"run.name={name}", "--progress=false", *extra]
    if np > 1:
        usr = r.mpi_env["OPAL_PREFIX"]
        cmd = [os.path.join(usr, "bin", "mpirun.openmpi"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(np), *cmd]
    r.sh(name, cmd, limit, cwd=r.work, env={**r.mpi_env, **(env or {})})  # the MPI build needs libmpi even on one rank
    return [m["loss"] for m in read_metrics(os.path.join(runs, name, "metrics.jsonl"))]


def mpi_schedules(r, limit):
    """4 MPI processes on the GPU (cpu-device in a dry run), every case, against 1 rank."""
    if not getattr(r, "mpi_env", None):
        raise Skip("Open MPI was not unpacked")
    device = "cpu-device" if r.dry else "cuda"
    deadline = time.monotonic() + limit
    one = mpi_train(r, f"mpi-1-{device}", 1, device, ("--set", "parallelism.attention=distflash"), deadline - time.monotonic())
    r.mpi_one = one
    res = {"one_rank": one}
    bad = mpi_cases(r, "mpi", device, (), None, deadline, res)
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def mpi_cases(r, prefix, device, extra, env, deadline, res):
    """Runs MPI_CASES on 4 ranks with extra settings, each against r.mpi_one, into res; returns
    what failed."""
    bad = []
    for i, (name, case) in enumerate(MPI_CASES):
        per = (deadline - time.monotonic()) / (len(MPI_CASES) - i)
        ex = case if case else ("--set", f"parallelism.attention={name}")
        try:
            got = mpi_train(r, f"{prefix}-4-{name}", 4, device, (*ex, *extra), per, env)
        except (Fail, Timeout) as e:
            bad.append(f"{name}: {e}")
            continue
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, r.mpi_one)) if len(got) == len(r.mpi_one) == MPI_STEPS else None
        res[name] = {"losses": got, "max_rel": worst}
        if worst is None or worst > FP32_TOL:
            bad.append(f"{name}: {len(got)} steps, max relative difference {worst} from one rank (> {FP32_TOL})")
    return bad


def packed_nccl(r):
    """The pack's NCCL library (scripts/build_nccl.sh's, which gpu_check.sh pack carries)."""
    return os.path.join(r.pack, "nccl", "libnccl.so.2")


def nccl_version(lib):
    """ncclGetVersion of the library file lib (loading it and asking needs no GPU)."""
    import ctypes
    v = ctypes.c_int()
    try:
        if ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(v)) != 0:
            raise Fail(f"{lib}: ncclGetVersion failed")
    except OSError as e:
        raise Fail(f"{lib} does not load: {e}")
    return v.value


def find_nccl(r, limit):
    """The NCCL the NCCL cases run on: the pack's (nccl/libnccl.so.2, NCCL >= 2.30 built for sm_90
    by scripts/build_nccl.sh, which allows several ranks on one GPU), else the nvidia-nccl wheel's
    on this Python's path; its version by ncclGetVersion, and kernels/cuda/nccl_abi.h checked
    against its nccl.h. None of it needs a GPU, so a dry run does it too."""
    lib = inc = None
    res = {}
    for base in sys.path:
        d = os.path.join(base, "nvidia", "nccl")
        if os.path.exists(os.path.join(d, "lib", "libnccl.so.2")):
            lib, inc = os.path.join(d, "lib", "libnccl.so.2"), os.path.join(d, "include")
            res["wheel"] = {"lib": lib, "version": nccl_version(lib)}
            break
    packed = packed_nccl(r)
    if os.path.exists(packed):
        lib, inc = packed, os.path.join(r.pack, "nccl", "include")
        try:
            with open(os.path.join(r.pack, "nccl", "BUILD.json")) as f:
                res["build"] = json.load(f)
        except (OSError, ValueError) as e:
            res["build"] = f"no BUILD.json: {e}"
    if lib is None:
        raise Skip("no NCCL: the pack has no nccl/libnccl.so.2 (scripts/build_nccl.sh, then pack) and this "
                   "Python has no nvidia/nccl/lib/libnccl.so.2") if r.dry else \
            Fail("no NCCL: the pack has no nccl/libnccl.so.2 (scripts/build_nccl.sh, then pack) and this Python "
                 "has no nvidia/nccl/lib/libnccl.so.2 (pip install nvidia-nccl-cu12 or -cu13)")
    r.nccl = {"lib": lib, "version": nccl_version(lib), "from": "pack" if lib == packed else "wheel"}
    res.update(r.nccl)
    if os.path.exists(os.path.join(inc, "nccl.h")):
        env = {**r.env, "NCCL_INCLUDE": inc}
        # nccl.h includes cuda_runtime.h: $CUDA_INCLUDE (gpu_check.sh dry-run sets it to the
        # CUDA wheels' headers), else the machine's CUDA
        dirs = [r.env.get("CUDA_INCLUDE", ""), "/usr/local/cuda/include", "/usr/include"]
        found = [d for d in dirs if d and os.path.exists(os.path.join(d, "cuda_runtime.h"))]
        if found:
            env["CUDA_INCLUDE"] = found[0]
        elif r.dry:
            res["abi"] = "not checked: no cuda_runtime.h here, which nccl.h includes (set CUDA_INCLUDE)"
            return res
        _, out = r.sh("nccl-abi", ["bash", os.path.join(r.pack, "scripts", "check_nccl_abi.sh")], limit, env=env)
        res["abi"] = out.strip().splitlines()[-1] if out.strip() else ""
    else:
        res["abi"] = f"not checked: no {inc}/nccl.h"
    return res


def nccl_runs(r, limit):
    """One NCCL rank against one GPU rank; 4 NCCL ranks on the one GPU where NCCL allows it."""
    if r.dry:
        raise Skip("NCCL runs on a GPU only")
    if not getattr(r, "nccl", None) or not getattr(r, "mpi_one", None):
        raise Skip("no NCCL library, or no one-rank run to compare with")
    env = {"DISTFLASH_LIBNCCL": r.nccl["lib"]}
    deadline = time.monotonic() + limit
    nccl = ("--set", "parallelism.backend=nccl")
    one = mpi_train(r, "nccl-1", 1, "cuda", ("--set", "parallelism.attention=distflash", *nccl), limit / 3, env)
    worst = max(abs(a - b) / abs(b) for a, b in zip(one, r.mpi_one)) if len(one) == len(r.mpi_one) else None
    res, bad = {"one_rank": {"losses": one, "max_rel": worst}}, []
    if worst is None or worst > FP32_TOL:
        bad.append(f"one NCCL rank: max relative difference {worst} from one GPU rank")
    if r.nccl["version"] < 23000:
        res["several_ranks"] = f"skipped: NCCL {r.nccl['version']} refuses several ranks on one GPU (2.30 adds NCCL_MULTI_RANK_GPU_ENABLE)"
    else:
        env.update({"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"})
        bad += mpi_cases(r, "nccl", "cuda", nccl, env, deadline, res)
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def phase_multigpu(r):
    r.step("multigpu", "Open MPI unpacked and relocated", lambda t: unpack_mpi(r, t), 60)
    r.step("multigpu", "mpirun -np 4 on one device: every schedule, hybrid, FSDP vs 1 rank", lambda t: mpi_schedules(r, t), 200)
    r.step("multigpu", STEP_NCCL_FIND, lambda t: find_nccl(r, t), 30)
    r.step("multigpu", STEP_NCCL_TRAIN, lambda t: nccl_runs(r, t), 200)


CMD_CASES = [("mpi4-ring", 4, ("--set", "parallelism.world_size=4", "--set", "parallelism.sequence_parallel_degree=4",
                                "--set", "parallelism.attention=ring")),
             ("mpi4-dp2-zigzag-fsdp", 4, ("--set", "parallelism.world_size=4", "--set", "parallelism.sequence_parallel_degree=2",
                                          "--set", "parallelism.attention=zigzag", "--set", "parallelism.fsdp=true"))]


def cmd_source(r, limit):
    """Trains the checkpoint the commands run on: tiny, 100 steps on the CPU."""
    runs = os.path.join(r.work, "runs")
    r.sh("cmd-train", [r.bin("distflash"), "train", "--config", os.path.join(r.pack, "configs", "tiny.toml"),
                       "--set", f"data.train={os.path.join(r.pack, 'data', 'go.tokens')}", "--set", "data.format=tokens",
                       "--set", "training.steps=100", "--set", f"run.output_dir={runs}", "--set", "run.name=cmd-src",
                       "--progress=false"], limit, cwd=r.work)
    r.cmd_src = os.path.join(runs, "cmd-src")
    return {"model": r.cmd_src}


def cmd_all(r, tag, binary, device, np, extra, limit, env=None):
    """eval (with --positions), passkey and generate of r.cmd_src: their JSON results."""
    out = os.path.join(r.work, "cmd", tag)
    os.makedirs(out, exist_ok=True)
    evald = os.path.join(r.pack, "data", "eval")
    sets = ("--set", f"device.kind={device}", *extra)
    runs = [("eval", ["eval", "--model", r.cmd_src, "--data", evald, "--set", "data.format=text", "--samples", "8",
                      "--seq-len", "256", "--positions", "--out", os.path.join(out, "eval.json"), "--progress=false"]),
            ("passkey", ["eval", "--model", r.cmd_src, "--task", "passkey", "--lengths", "512", "--trials", "4",
                         "--out", os.path.join(out, "passkey.json"), "--progress=false"]),
            ("generate", ["generate", "--model", r.cmd_src, "--prompt", "func main() {", "--max-new-tokens", "32",
                          "--out", os.path.join(out, "generate.json"), "--stream=false"])]
    deadline = time.monotonic() + limit
    res = {}
    for i, (what, args) in enumerate(runs):
        cmd = [binary, *args, *sets]
        if np > 1:
            usr = r.mpi_env["OPAL_PREFIX"]
            cmd = [os.path.join(usr, "bin", "mpirun.openmpi"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "-np", str(np), *cmd]
        e = {**(r.mpi_env if binary == getattr(r, "mpi_bin", None) else {}), **(env or {})}
        r.sh(f"cmd-{tag}-{what}", cmd, (deadline - time.monotonic()) / (len(runs) - i), cwd=r.work, env=e)
        with open(os.path.join(out, what + ".json")) as f:
            res[what] = json.load(f)
    return res


def cmd_compare(got, want):
    """What differs between two cmd_all results beyond the tolerances (the phase's doc)."""
    bad = []
    def rel(a, b):
        return abs(a - b) / max(abs(b), 1e-30)
    g, w = got["eval"], want["eval"]
    if rel(g["loss"], w["loss"]) > FP32_TOL or g["tokens"] != w["tokens"]:
        bad.append(f"eval loss {g['loss']} over {g['tokens']} tokens, cpu {w['loss']} over {w['tokens']}")
    for i, (a, b) in enumerate(zip(g["positions"]["loss"], w["positions"]["loss"])):
        if a is not None and b is not None and rel(a, b) > FP32_TOL:
            bad.append(f"positions bucket {i}: {a} vs cpu {b}")
    gp, wp = got["passkey"]["passkey"], want["passkey"]["passkey"]
    answers = lambda p: [(t["generated"], t["forced_hit"]) for t in p["records"]]
    if answers(gp) != answers(wp):
        bad.append(f"passkey: generated {gp['generated']['accuracy']}, teacher-forced {gp['teacher_forced']['accuracy']}; "
                   f"cpu {wp['generated']['accuracy']}, {wp['teacher_forced']['accuracy']}")
    gt, wt = got["generate"]["samples"][0]["tokens"], want["generate"]["samples"][0]["tokens"]
    if gt != wt:
        bad.append(f"generate: tokens {gt} vs cpu {wt}")
    return bad


def cmd_row(got):
    """A world's figures of a cmd_all result, as the report and summary.json keep them."""
    return {"eval_loss": got["eval"]["loss"], "eval_tokens": got["eval"]["tokens"],
            "passkey": got["passkey"]["passkey"]["generated"]["accuracy"],
            "passkey_teacher_forced": got["passkey"]["passkey"]["teacher_forced"]["accuracy"],
            "tokens": got["generate"]["samples"][0]["tokens"][:8]}


def cmd_worlds(r, limit):
    """The commands on one CPU rank, one GPU rank and 4 MPI processes on the GPU."""
    if not getattr(r, "cmd_src", None):
        raise Skip("no checkpoint to run the commands on")
    device = "cpu-device" if r.dry else "cuda"
    deadline = time.monotonic() + limit
    r.cmd_cpu = cmd_all(r, "cpu-1", r.bin("distflash"), "cpu", 1, (), limit / 6)
    res, bad = {"cpu": cmd_row(r.cmd_cpu)}, []
    cases = [(f"{device}-1", r.bin("distflash"), 1, ())]
    if getattr(r, "mpi_env", None):
        cases += [(f"{device}-{name}", r.mpi_bin, np, extra) for name, np, extra in CMD_CASES]
    else:
        res["mpi"] = "skipped: Open MPI was not unpacked (the multigpu phase unpacks it)"
    for i, (tag, binary, np, extra) in enumerate(cases):
        try:
            got = cmd_all(r, tag, binary, device, np, extra, (deadline - time.monotonic()) / (len(cases) - i))
        except (Fail, Timeout) as e:
            bad.append(f"{tag}: {e}")
            continue
        res[tag] = cmd_row(got)
        bad += [f"{tag}: {b}" for b in cmd_compare(got, r.cmd_cpu)]
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def cmd_nccl(r, limit):
    """The commands over NCCL: one rank; 4 ranks on the GPU where NCCL >= 2.30 allows it."""
    if r.dry:
        raise Skip("NCCL runs on a GPU only")
    if not getattr(r, "nccl", None) or not getattr(r, "cmd_cpu", None) or not getattr(r, "mpi_env", None):
        raise Skip("no NCCL library (the multigpu phase finds it), or no CPU run to compare with")
    env = {"DISTFLASH_LIBNCCL": r.nccl["lib"]}
    nccl = ("--set", "parallelism.backend=nccl")
    cases = [("nccl-1", 1, nccl)]
    if r.nccl["version"] >= 23000:
        env.update({"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"})
        cases += [(f"nccl-{name}", np, (*extra, *nccl)) for name, np, extra in CMD_CASES]
    deadline = time.monotonic() + limit
    res, bad = {}, []
    for i, (tag, np, extra) in enumerate(cases):
        try:
            got = cmd_all(r, tag, r.mpi_bin, "cuda", np, extra, (deadline - time.monotonic()) / (len(cases) - i), env)
        except (Fail, Timeout) as e:
            bad.append(f"{tag}: {e}")
            continue
        res[tag] = cmd_row(got)
        bad += [f"{tag}: {b}" for b in cmd_compare(got, r.cmd_cpu)]
    if r.nccl["version"] < 23000:
        res["several_ranks"] = f"skipped: NCCL {r.nccl['version']} refuses several ranks on one GPU (2.30 adds NCCL_MULTI_RANK_GPU_ENABLE)"
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def phase_commands(r):
    # the multigpu phase does both too, after this one in value order: named apart, so that a merged
    # report keeps both
    if not getattr(r, "mpi_env", None):
        r.step("commands", "Open MPI unpacked and relocated (commands)", lambda t: unpack_mpi(r, t), 60)
    if not getattr(r, "nccl", None):
        r.step("commands", STEP_NCCL_FIND_CMD, lambda t: find_nccl(r, t), 30)
    r.step("commands", "a tiny checkpoint trained on the CPU", lambda t: cmd_source(r, t), 60)
    r.step("commands", STEP_CMD_WORLDS, lambda t: cmd_worlds(r, t), 150)
    r.step("commands", STEP_CMD_NCCL, lambda t: cmd_nccl(r, t), 90)


def cudnn_find(r, limit):
    """The cuDNN of this Python environment (the nvidia-cudnn wheel): its library, version and
    the ABI check of kernels/cuda/cudnn_abi.h against its headers."""
    lib = inc = None
    for base in sys.path:
        d = os.path.join(base, "nvidia", "cudnn")
        cands = sorted(glob.glob(os.path.join(d, "lib", "libcudnn.so.*")))
        if cands:
            lib, inc = os.path.join(d, "lib", "libcudnn.so.9"), os.path.join(d, "include")
            break
    if lib is None:
        if r.dry:
            raise Skip("no nvidia-cudnn wheel on this Python's path (a GPU machine's PyTorch brings one)")
        raise Fail("no nvidia/cudnn/lib/libcudnn.so.* on the Python path (pip install nvidia-cudnn-cu13)")
    res = {"lib": lib}
    if not r.dry:
        import ctypes
        res["version"] = ctypes.CDLL(lib).cudnnGetVersion()
        r.cudnn = res
    if os.path.exists(os.path.join(inc, "cudnn_graph.h")):
        env = {"CUDNN_INCLUDE": inc}
        for d in ("/usr/local/cuda/include",):
            if os.path.exists(os.path.join(d, "cuda_runtime_api.h")):
                env["CUDA_INCLUDE"] = d
        _, out = r.sh("cudnn-abi", ["bash", os.path.join(r.pack, "scripts", "check_cudnn_abi.sh")], limit, env=env)
        res["abi"] = out.strip().splitlines()[-1] if out.strip() else ""
    else:
        res["abi"] = f"not checked: no {inc}/cudnn_graph.h"
    return res


CUDNN_CAPTURE = r"""
import os, sys, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.manual_seed(0)
for hd in (64, 128):
    q, k, v = (torch.randn(1, 8, 2048, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.sum().backward()
torch.cuda.synchronize()
print("captured", flush=True)
"""


def cudnn_capture(r, limit):
    """PyTorch SDPA's cuDNN graphs, forward and backward, logged by cuDNN (CUDNN_LOGLEVEL_DBG=3)."""
    if r.dry:
        raise Skip("needs a GPU")
    log = os.path.join(r.logs, "cudnn_torch_sdpa.log")
    script = os.path.join(r.work, "cudnn_capture.py")
    with open(script, "w") as f:
        f.write(CUDNN_CAPTURE)
    r.sh("cudnn-capture", [sys.executable, script], limit, env={"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": log})
    with open(log, errors="replace") as f:
        text = f.read()
    ops = sorted(set(re.findall(r"CUDNN_BACKEND_OPERATION_[A-Z_]+", text)))
    return {"log": "logs/cudnn_torch_sdpa.log", "bytes": len(text), "operations": ops}


def cudnn_kernels(r, limit):
    """The kernels test binary's CUDA tests with every bf16/fp16 block that cuDNN can compute on
    cuDNN (DISTFLASH_ATTENTION=cudnn)."""
    if r.dry:
        raise Skip("needs a GPU (the host-side cuDNN tests run in CI: TestCUDAHostCUDNN*)")
    code, text = r.sh("kernels_test_cudnn", [r.bin("kernels.test"), "-test.v", "-test.run", "CUDA",
                                              "-test.timeout", f"{int(limit) - 10}s"],
                      limit, cwd=os.path.join(r.pack, "kernels"), ok_codes=(0, 1), env={"DISTFLASH_ATTENTION": "cudnn"})
    t = parse_tests(text)
    res = {"passed": len(t["PASS"]), "failed_tests": t["FAIL"], "paths": re.findall(r"attention \(cudnn.*", text)[:20]}
    if code != 0 or t["FAIL"]:
        res["failed"] = f"{len(t['FAIL'])} test(s) failed: {', '.join(t['FAIL'][:12])}" if t["FAIL"] else \
            f"exit status {code}: {tail(text, 400)}"
    return res


def cudnn_curves(r, limit):
    """Tiny 50-step bf16 curves with device.attention = cudnn against the CPU's bf16 band."""
    if r.dry:
        raise Skip("needs a GPU")
    deadline = time.monotonic() + limit
    out = {}
    for dev, prec, extra in (("cpu", "fp32", ()), ("cpu", "bf16", ()), ("cuda", "bf16", ("--set", "device.attention=cudnn"))):
        name = f"tiny-{dev}-{prec}" + ("-cudnn" if extra else "")
        out[name] = [m["loss"] for m in train_curve(r, name, dev, prec, (deadline - time.monotonic()) / 2, extra=extra)]
    c = {"tiny-cpu-fp32": out["tiny-cpu-fp32"], "tiny-cpu-bf16": out["tiny-cpu-bf16"], "tiny-cuda-bf16": out["tiny-cuda-bf16-cudnn"],
         "tiny-cuda-fp32": out["tiny-cpu-fp32"]}  # fp32 on cuDNN is the own kernel: the bf16 band is what is checked
    res = {"curves": out}
    res.update(compare_curves(c))
    return res


def cudnn_attention(r, limit):
    """The attention benchmark's distflash side with cuDNN (DISTFLASH_ATTENTION=cudnn)."""
    if r.dry:
        raise Skip("needs a GPU")
    jpath = os.path.join(r.work, "attn_distflash_cudnn.jsonl")
    cmd = [sys.executable, os.path.join(r.pack, "bench", "cuda_attn.py"), "--json", jpath, "--skip-torch",
           "--go-bin", r.bin("kernels.test"), "--seqs", "4096,16384,65536", "--head-dims", "64,128", "--benchtime", "3x"]
    r.sh("attention_distflash_cudnn", cmd, limit, env={"PYTHONUNBUFFERED": "1", "DISTFLASH_ATTENTION": "cudnn"})
    with open(jpath) as f:
        return {"shapes": [json.loads(line) for line in f if line.strip()]}


def cudnn_model(r, limit):
    """The 0.85B model at 8K with device.attention = cudnn."""
    if r.dry:
        raise Skip("needs a GPU")
    name = "llama1b-8192-cudnn"
    extra = ["--set", "data.seq_len=8192", "--set", "model.max_seq_len=8192", "--set", "device.attention=cudnn"] + \
        [x for s in TIMING_SETS for x in ("--set", s)]
    with MemSampler() as ms:
        rows = train_curve(r, name, "cuda", "bf16", limit, steps=6, config="llama-1b.toml", extra=extra)
    tps = statistics.median(m["tokens_per_s"] for m in rows[min(2, len(rows) - 1):])
    return {"seq": 8192, "tokens_per_s": tps, "losses": [m["loss"] for m in rows], "peak_gpu_bytes": ms.result()}


def first_nvrtc(r, limit):
    """D0: the cuDNN and NVRTC of this Python environment: the files, cuDNN's version and the
    CUDA it was built for, and whether libnvrtc and its builtins load (as distflash preloads
    them: RTLD_GLOBAL)."""
    res = cudnn_find(r, limit)
    majors = {}
    for base in sys.path:
        for d in ("cuda_nvrtc", "cu13", "cu12"):
            for f in sorted(glob.glob(os.path.join(base, "nvidia", d, "lib", "libnvrtc*.so*"))):
                majors.setdefault(os.path.basename(f), f)
    res["nvrtc_files"] = majors
    if r.dry:
        return res
    import ctypes
    lib = ctypes.CDLL(res["lib"])
    lib.cudnnGetCudartVersion.restype = ctypes.c_size_t
    major = lib.cudnnGetCudartVersion() // 1000
    res["cuda_major"] = major
    name = f"libnvrtc.so.{major}"
    path = majors.get(name, name)
    try:
        nv = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        maj, mnr = ctypes.c_int(), ctypes.c_int()
        nv.nvrtcVersion(ctypes.byref(maj), ctypes.byref(mnr))
        res["nvrtc"] = f"{maj.value}.{mnr.value} ({path})"
        b = f"libnvrtc-builtins.so.{maj.value}.{mnr.value}"
        ctypes.CDLL(os.path.join(os.path.dirname(path), b) if os.path.isabs(path) else b, mode=ctypes.RTLD_GLOBAL)
        res["nvrtc_builtins"] = b
    except OSError as e:
        res["failed"] = f"NVRTC for CUDA {major} does not load: {e}"
    return res


def first_kernels(r, limit):
    """D0–D6: the kernels test binary's TestCUDACUDNNFirst, cuDNN's debug log kept."""
    env = {"DISTFLASH_ATTENTION": "cudnn"}
    if r.dry:
        env["DISTFLASH_CUDNN_FIRST"] = "stub"
    else:
        env.update({"CUDNN_LOGLEVEL_DBG": "2", "CUDNN_LOGDEST_DBG": os.path.join(r.logs, "cudnn_first_dbg.log")})
    code, text = r.sh("cudnn_first", [r.bin("kernels.test"), "-test.v", "-test.run", "^TestCUDACUDNNFirst$",
                                      "-test.timeout", f"{int(limit) - 5}s"],
                      limit, cwd=os.path.join(r.pack, "kernels"), ok_codes=(0, 1), env=env)
    steps = [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith("CUDNNFIRST ")]
    t = parse_tests(text)
    res = {"steps": steps, "failed_tests": t["FAIL"]}
    if code != 0 or t["FAIL"]:
        errs = [line.strip() for line in text.splitlines() if "_test.go:" in line][:12]
        res["failed"] = f"{', '.join(t['FAIL'][:8]) or f'exit status {code}'}: {' | '.join(errs) or tail(text, 400)}"
    return res


def first_sdpa(r, limit):
    """D6's reference: PyTorch SDPA (its cuDNN and flash backends) on the same shapes."""
    jpath = os.path.join(r.work, "cudnn_first_sdpa.jsonl")
    cmd = [sys.executable, os.path.join(r.pack, "bench", "cuda_attn.py"), "--json", jpath, "--skip-go",
           "--seqs", "4096,8192,16384", "--head-dims", "64,128", "--reps", "5"]
    if r.dry:
        cmd = [sys.executable, os.path.join(r.pack, "bench", "cuda_attn.py"), "--json", jpath, "--skip-go", "--device", "cpu",
               "--seqs", "256", "--head-dims", "64", "--reps", "1"]
    r.sh("cudnn_first_sdpa", cmd, limit, env={"PYTHONUNBUFFERED": "1"})
    with open(jpath) as f:
        return {"shapes": [json.loads(line) for line in f if line.strip()]}


def first_schedules(r, limit):
    """D7: two steps of the tiny config at 2048 tokens over 2 ranks, ring and distflash, bf16,
    cuDNN against the own kernel: the losses, gradient norms, the warm-up's plans, the paths."""
    deadline = time.monotonic() + limit
    dev = "cpu" if r.dry else "cuda"
    res, bad = {}, []
    for attn in ("ring", "distflash"):
        rows = {}
        for mode in ("cudnn", "own"):
            name = f"d7-{attn}-{mode}"
            extra = ("--set", "data.seq_len=2048", "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
                     "--set", f"parallelism.attention={attn}") + (() if r.dry else ("--set", f"device.attention={mode}"))
            rows[mode] = train_curve(r, name, dev, "bf16", max(30, (deadline - time.monotonic()) / 2), steps=2, extra=extra)
            with open(os.path.join(r.logs, name + ".log"), errors="replace") as f:
                text = f.read()
            res[name] = {"losses": [m["loss"] for m in rows[mode]], "grad_norms": [m["grad_norm"] for m in rows[mode]],
                         "warmup": re.findall(r"attention warm-up before the first step.*", text)[:1],
                         "paths": re.findall(r"^attention \(.*", text, re.M)[-1:]}
            if mode == "cudnn" and not r.dry:
                if not res[name]["warmup"]:
                    bad.append(f"{attn}: no attention warm-up line")
                for p in res[name]["paths"]:
                    if "cuDNN has no plan" in p or "no cuDNN" in p:
                        bad.append(f"{attn}: a block without cuDNN: {p[:300]}")
        for a, b in zip(rows["cudnn"], rows["own"]):
            if abs(a["loss"] - b["loss"]) > 2e-3 * abs(b["loss"]) or abs(a["grad_norm"] - b["grad_norm"]) > 5e-2 * abs(b["grad_norm"]):
                bad.append(f"{attn} step {a['step']}: cuDNN loss {a['loss']:.6f}, grad norm {a['grad_norm']:.4g}; own {b['loss']:.6f}, {b['grad_norm']:.4g}")
    if bad:
        res["failed"] = "; ".join(bad)
    return res


def phase_cudnn_first(r):
    r.step("cudnn-first", "D0: cuDNN and NVRTC of the Python environment", lambda t: first_nvrtc(r, t), 30)
    r.step("cudnn-first", "D0-D6: TestCUDACUDNNFirst", lambda t: first_kernels(r, t), 150)
    r.step("cudnn-first", "D6: PyTorch SDPA on the same shapes", lambda t: first_sdpa(r, t), 60)
    r.step("cudnn-first", "D7: ring and distflash steps, cuDNN vs own", lambda t: first_schedules(r, t), 90)


def phase_cudnn(r):
    r.step("cudnn", "cuDNN library, version, ABI against its headers", lambda t: cudnn_find(r, t), 60)
    r.step("cudnn", "PyTorch SDPA's cuDNN graphs (CUDNN_LOGLEVEL_DBG=3)", lambda t: cudnn_capture(r, t), 60)
    r.step("cudnn", "kernels test binary with DISTFLASH_ATTENTION=cudnn", lambda t: cudnn_kernels(r, t), 150)
    r.step("cudnn", "tiny 50-step bf16 curves: cuda with cuDNN vs the cpu band", lambda t: cudnn_curves(r, t), 120)
    r.step("cudnn", "attention: distflash with cuDNN", lambda t: cudnn_attention(r, t), 120)
    r.step("cudnn", "distflash 1B seq 8192 with cuDNN", lambda t: cudnn_model(r, t), 100)


# phase name → its function
PHASE_FNS = {"correctness": phase_correctness, "gemm": phase_gemm, "cudnn-first": phase_cudnn_first,
             "commands": phase_commands, "model": phase_model, "curve": phase_curve, "multigpu": phase_multigpu,
             "attention": phase_attention, "cudnn": phase_cudnn}


def phase_list(arg):
    """The phases --phase names, in its order: "all", one phase, or several joined by commas
    (the most valuable first, for a device lent for less than all of them)."""
    if arg == "all":
        return list(PHASES)
    phases = arg.split(",")
    for p in phases:
        if p not in PHASES:
            raise argparse.ArgumentTypeError(f"--phase {arg}: unknown phase {p!r}: want all or some of {', '.join(PHASES)}, joined by commas")
    if len(set(phases)) != len(phases):
        raise argparse.ArgumentTypeError(f"--phase {arg}: a phase named twice")
    return phases


def print_plan(r, phases, budget):
    """The steps of the run with their limits (and the time each should take on an H200, where
    known), each phase's budget, and where --budget ends if every phase before used all of its
    budget: the planned total, printed before anything runs."""
    plan = r.plan(phases, PHASE_FNS)
    r.meta["plan"] = {"budget_s": budget, "phases": [{"phase": p, "budget_s": BUDGET[p], "steps": [
        {"step": n, "limit_s": t, "expected_s": e} for n, t, e in steps]} for p, steps in plan]}
    total = sum(BUDGET[p] for p in phases)
    print(f"plan: {len(phases)} phase(s), their budgets {total} s in all, --budget {budget:.0f} s", flush=True)
    used = expected = 0
    known_so_far = True
    for p, steps in plan:
        lim = sum(t for _, t, _ in steps)
        exp = sum(e or 0 for _, _, e in steps)
        known = all(e is not None for _, _, e in steps)
        flag = "" if used + BUDGET[p] <= budget else (
            "  (past --budget if the phases before use all of theirs)" if used < budget else "  (runs only if the phases before finish early)")
        print(f"  {p:<12} budget {BUDGET[p]:>4} s, from {used:>4} s (expected from {expected}{'' if known_so_far else '+'} s); "
              f"steps' limits {lim} s, expected {'' if known else 'at least '}{exp} s{flag}", flush=True)
        known_so_far = known_so_far and known
        for n, t, e in steps:
            print(f"      limit {t:>4} s, expected {'-' if e is None else e:>4} s  {n}", flush=True)
        used += BUDGET[p]
        expected += exp
    given = [e for _, steps in plan for _, _, e in steps]
    exp = ("no step gives an expected time" if all(e is None for e in given) else
           f"expected {expected} s" if all(e is not None for e in given) else f"expected {expected} s where the steps give one")
    print(f"planned total: {min(total, budget):.0f} s (phase budgets {total} s, --budget {budget:.0f} s); {exp}", flush=True)


def unpack(pack):
    """Decompresses every FILE.xz of the pack (the binaries, the token data, the NCCL library:
    scripts/gpu_check.sh pack compresses them so that the tree and the pack fit a device call's
    64 MiB) into FILE beside it, keeping its mode, unless FILE is already newer. Returns
    {FILE: bytes} of what it wrote."""
    done = {}
    for xz in sorted(glob.glob(os.path.join(pack, "**", "*.xz"), recursive=True)):
        dst = xz[:-3]
        if os.path.exists(dst) and os.path.getmtime(dst) >= os.path.getmtime(xz):
            continue
        with lzma.open(xz, "rb") as src, open(dst + ".tmp", "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.chmod(dst + ".tmp", os.stat(xz).st_mode & 0o777)
        os.replace(dst + ".tmp", dst)
        done[os.path.relpath(dst, pack)] = os.path.getsize(dst)
    if done:
        print(f"unpacked {len(done)} file(s) of the pack: "
              + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in done.items()), flush=True)
    return done


def cmd_run(a):
    phases = phase_list(a.phase)
    r = Runner(a.pack, a.out, a.budget, a.dry, a.steps)
    r.meta["unpacked"] = unpack(r.pack)
    r.meta["env"] = setup_env(r)
    print(json.dumps(r.meta["env"]), flush=True)
    print_plan(r, phases, a.budget)
    for i, p in enumerate(phases):
        r.start_phase(phases, i)
        PHASE_FNS[p](r)
    rep = write_report(r, phases)
    print(render(rep))
    bad = [s for s in rep["steps"] if s["status"] != "pass" and not (a.dry and s["status"] == "skipped")
           and not s.get("note", "").startswith("not selected")]
    return 1 if bad else 0


def cmd_merge(a):
    reps = []
    for d in a.outs:
        with open(os.path.join(d, "report.json")) as f:
            reps.append(json.load(f))
    meta = dict(reps[0]["meta"])
    meta["phases"] = list(dict.fromkeys(p for r in reps for p in r["meta"].get("phases", [])))
    meta["finished"] = reps[-1]["meta"].get("finished")
    # A step run again in a later report replaces the earlier run of it (a rerun after a fix),
    # which is kept under meta.superseded; steps a run did not select (--steps) are left out.
    steps, superseded = {}, []
    for i, r in enumerate(reps):
        for s in r["steps"]:
            if s.get("note", "").startswith("not selected"):
                continue
            if s["name"] in steps:
                old = steps[s["name"]]
                superseded.append({k: old.get(k) for k in ("phase", "name", "status", "started", "seconds", "note")})
            steps[s["name"]] = dict(s, report=a.outs[i])
    order = {}
    for r in reps:
        for s in r["steps"]:
            order.setdefault(s["name"], len(order))
    meta["superseded"] = superseded
    meta["packs"] = [r["meta"].get("pack") for r in reps]
    rep = {"meta": meta, "steps": sorted(steps.values(), key=lambda s: (PHASES.index(s["phase"]), order[s["name"]]))}
    os.makedirs(a.dest, exist_ok=True)
    with open(os.path.join(a.dest, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(a.dest, "report.md"), "w") as f:
        f.write(render(rep))
    with open(os.path.join(a.dest, "summary.json"), "w") as f:
        json.dump(summary(rep), f, indent=1)
    print(f"wrote {a.dest}/report.md, report.json and summary.json from {len(reps)} report(s)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--pack", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--phase", default="all",
                   help=f"all, or one or more of {','.join(PHASES)} joined by commas, run in that order")
    r.add_argument("--budget", type=float, default=None,
                   help=f"seconds for all steps (default {BUDGET}, summed for all)")
    r.add_argument("--dry", action="store_true")
    r.add_argument("--steps", default=None, help="a regular expression: run only the steps whose name it finds "
                   "(the others are recorded as skipped)")
    m = sub.add_parser("merge")
    m.add_argument("--dest", required=True)
    m.add_argument("outs", nargs="+")
    a = ap.parse_args()
    if a.cmd == "run":
        try:
            phases = phase_list(a.phase)
        except argparse.ArgumentTypeError as e:
            r.error(str(e))
        if a.budget is None:
            a.budget = sum(BUDGET[p] for p in phases)
        sys.exit(cmd_run(a))
    sys.exit(cmd_merge(a))


if __name__ == "__main__":
    main()
