#!/usr/bin/env python3
"""Causal attention on one GPU: PyTorch's scaled_dot_product_attention (FlashAttention-2 and
cuDNN backends, bf16) beside distflash's tensor-core kernel (kernels/cuda/attn_mma.cu), in one run,
same shapes.

    python3 bench/cuda_attn.py [--seqs 4096,16384,65536] [--head-dims 64,128] [--benchtime 2s]
                               [--go-bin PATH/kernels.test] [--skip-torch] [--skip-go]
                               [--device cpu --fill 256] [--json FILE]

Shapes: causal MHA, bf16 operands, head dimension hd with 2048/hd heads (a 2048-wide model)
and a batch of max(1, 16384/n) sequences of n tokens, so every shape has at least 16K tokens
and fills the GPU (distflash folds the batch into its head axis: kernels/cuda_bench_test.go,
cudaBenchHeads). TFLOP/s counts the useful work, 4·n(n+1)/2·hd·heads·batch for the forward and
2.5× that for the backward, for both sides (the convention of the FlashAttention papers). The
PyTorch backward time is the time of forward+backward minus the forward. distflash's side is
`go test -tags cuda -run '^$' -bench BenchmarkCUDAAttn ./kernels`, or the same benchmark of a
test binary built by `go test -c -tags cuda ./kernels` (--go-bin; scripts/gpu_check.sh packs
one): its forward includes the fp32→bf16 conversion of q, k, v, because distflash's buffers are
fp32 at the Backend interface, and its backward is the deterministic two-kernel version.
Prints a table and one JSON line per shape (all of them to --json).

Needs a CUDA GPU, the Go side built with the CUDA toolkit, and PyTorch with CUDA. --device cpu
--skip-go --fill 256 runs the PyTorch side on the CPU at small sizes (a dry run of the script itself).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

MODEL_WIDTH = 2048  # heads × head_dim of every shape
FILL_TOKENS = 16384  # batch = max(1, FILL_TOKENS / n)


def shape(n, hd):
    """(batch, heads) of the shape with n tokens and head dimension hd."""
    return max(1, FILL_TOKENS // n), MODEL_WIDTH // hd


def useful_flops(n, hd):
    """Forward FLOPs of causal attention: QKᵀ and PV over the n(n+1)/2 visible pairs."""
    batch, heads = shape(n, hd)
    return 4.0 * n * (n + 1) / 2 * hd * heads * batch


def torch_side(seqs, hds, reps, device_name):
    import torch
    import torch.nn.functional as F

    dev = torch.device(device_name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    backends = {"default": None}
    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if dev.type == "cuda":
            backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    except ImportError:
        pass

    def attention(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # torch < 2.0 (CPU dry runs only): the same function, written out
        n = q.shape[-2]
        s = (q @ k.transpose(-1, -2)).float() / q.shape[-1] ** 0.5
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return (s.softmax(-1).to(v.dtype) @ v)

    def timed(fn):
        fn()  # warm-up
        if dev.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out = {}
    for hd in hds:
        for n in seqs:
            batch, heads = shape(n, hd)
            g = torch.Generator(device=dev).manual_seed(n * 1000 + hd)
            q, k, v = (torch.randn(batch, heads, n, hd, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
                       for _ in range(3))
            do = torch.randn(batch, heads, n, hd, device=dev, dtype=torch.bfloat16, generator=g)
            fl = useful_flops(n, hd)
            rec = {"batch": batch, "heads": heads}
            for name, be in backends.items():
                def fwd():
                    with torch.no_grad():
                        attention(q, k, v)

                def fwd_bwd():
                    o = attention(q, k, v)
                    o.backward(do)

                try:
                    if be is None:
                        t_f, t_fb = timed(fwd), timed(fwd_bwd)
                    else:
                        with sdpa_kernel(be):
                            t_f, t_fb = timed(fwd), timed(fwd_bwd)
                except RuntimeError as e:  # a backend that refuses the shape
                    rec[name] = {"error": str(e)[:300]}
                    continue
                rec[name] = {"fwd_s": t_f, "bwd_s": t_fb - t_f, "fwd_tflops": fl / t_f / 1e12,
                             "bwd_tflops": 2.5 * fl / (t_fb - t_f) / 1e12,
                             "fwd_bwd_tflops": 3.5 * fl / t_fb / 1e12}
            ok = [r for r in rec.values() if isinstance(r, dict) and "fwd_s" in r]
            if ok:  # the faster backend per column is the reference
                rec["best"] = {k: max(r[k] for r in ok) for k in ("fwd_tflops", "bwd_tflops", "fwd_bwd_tflops")}
            out[(n, hd)] = rec
            del q, k, v, do
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    out["device"] = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    out["torch"] = torch.__version__
    return out


def go_side(seqs, hds, benchtime, go_bin):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, DISTFLASH_BENCH_SEQS=",".join(str(n) for n in seqs),
               DISTFLASH_BENCH_HEADDIMS=",".join(str(h) for h in hds))
    if go_bin:
        cmd, cwd = [go_bin, "-test.run", "^$", "-test.bench", "BenchmarkCUDAAttn", "-test.benchtime", benchtime], None
    else:
        cmd = ["go", "test", "-tags", "cuda", "-run", "^$", "-bench", "BenchmarkCUDAAttn", "-benchtime", benchtime,
               "./kernels"]
        cwd = repo
    print("$", " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    sys.stderr.write(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed with status {res.returncode}")
    return parse_go(res.stdout, seqs, hds)


GO_LINE = re.compile(r"^BenchmarkCUDAAttn/(fwd|bwd)/hd(\d+)/n(\d+)/h(\d+)\S*\s+\d+\s+([\d.]+) ns/op\s+([\d.]+) TFLOP/s")


def parse_go(text, seqs, hds):
    """The benchmark lines of BenchmarkCUDAAttn, keyed by (n, hd)."""
    out = {}
    for line in text.splitlines():
        m = GO_LINE.match(line)
        if m:
            kind, hd, n, heads = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            ns, tf = float(m.group(5)), float(m.group(6))
            d = out.setdefault((n, hd), {"heads_x_batch": heads})
            d[kind + "_s"] = ns / 1e9
            d[kind + "_tflops"] = tf
    for d in out.values():
        if "fwd_s" in d and "bwd_s" in d:
            d["fwd_bwd_tflops"] = 3.5 * d["fwd_tflops"] * d["fwd_s"] / (d["fwd_s"] + d["bwd_s"])
    missing = [k for k in ((n, hd) for hd in hds for n in seqs) if k not in out]
    if missing:
        raise RuntimeError(f"no benchmark result for (seq, head_dim) {missing}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="4096,16384,65536")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions on the PyTorch side")
    ap.add_argument("--benchtime", default="2s", help="go test -benchtime (e.g. 2s or 10x)")
    ap.add_argument("--go-bin", help="a kernels test binary (go test -c -tags cuda ./kernels) instead of go test")
    ap.add_argument("--fill", type=int, default=16384,
                    help="tokens per shape, batch = max(1, fill/seq); change it only with --skip-go (the Go benchmark uses 16384)")
    ap.add_argument("--device", default="cuda", help="PyTorch's device (cpu: a dry run of this script, with --skip-go)")
    ap.add_argument("--json", help="write every shape's record to this file, one JSON line each")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-go", action="store_true")
    a = ap.parse_args()
    global FILL_TOKENS
    if a.fill != 16384 and not a.skip_go:
        sys.exit("--fill: the Go benchmark fills 16384 tokens per shape; use --fill only with --skip-go")
    FILL_TOKENS = a.fill
    seqs = [int(s) for s in a.seqs.split(",")]
    hds = [int(h) for h in a.head_dims.split(",")]
    pt = {} if a.skip_torch else torch_side(seqs, hds, a.reps, a.device)
    go = {} if a.skip_go else go_side(seqs, hds, a.benchtime, a.go_bin)
    if pt:
        print(f"PyTorch {pt['torch']} on {pt['device']}")
    print("causal attention, bf16, 2048/hd heads × max(1, 16K/seq) batch; TFLOP/s of useful work; "
          "torch = the faster of SDPA's flash and cuDNN backends")
    print(f"{'hd':>4} {'seq':>6} {'torch fwd':>10} {'ours fwd':>9} {'ratio':>6} {'torch f+b':>10} {'ours f+b':>9} {'ratio':>6}")
    recs = []
    for hd in hds:
        for n in seqs:
            p, g = pt.get((n, hd), {}), go.get((n, hd), {})
            best = p.get("best", {})

            def cell(d, key):
                return f"{d[key]:.1f}" if key in d else "-"

            def ratio(key):
                return f"{g[key] / best[key]:.2f}" if key in g and key in best else "-"

            print(f"{hd:>4} {n:>6} {cell(best, 'fwd_tflops'):>10} {cell(g, 'fwd_tflops'):>9} {ratio('fwd_tflops'):>6} "
                  f"{cell(best, 'fwd_bwd_tflops'):>10} {cell(g, 'fwd_bwd_tflops'):>9} {ratio('fwd_bwd_tflops'):>6}")
            batch, heads = shape(n, hd)
            recs.append({"seq": n, "head_dim": hd, "heads": heads, "batch": batch, "torch": p or None,
                         "distflash": g or None, "torch_version": pt.get("torch"), "device": pt.get("device")})
    for r in recs:
        print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
