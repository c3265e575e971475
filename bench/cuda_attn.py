#!/usr/bin/env python3
"""Causal attention on one GPU: PyTorch's scaled_dot_product_attention (flash backend, bf16)
beside distflash's tensor-core kernel (kernels/cuda/attn_mma.cu), in one run, same shapes.

    python3 bench/cuda_attn.py [--seqs 4096,8192,16384,32768,65536] [--heads 16]
                               [--benchtime 2s] [--skip-torch] [--skip-go]

Shapes: batch 1, 16 heads of dimension 128 (MHA), causal, bf16 operands. TFLOP/s counts the
useful work, 4·n(n+1)/2·hd·heads for the forward and 2.5× that for the backward, for both
sides (the convention of the FlashAttention papers). The PyTorch backward time is the time of
forward+backward minus the forward. distflash's side is
`go test -tags cuda -run '^$' -bench BenchmarkCUDAAttn ./kernels` (see
kernels/cuda_bench_test.go: the forward includes the fp32→bf16 conversion of q, k, v, because
distflash's buffers are fp32 at the Backend interface, and the backward is its deterministic
two-kernel version). Prints a table and one JSON line per sequence length.

Needs a CUDA GPU, Go with the CUDA toolkit for the Go side (scripts/build_cuda.sh documents
it), and PyTorch with CUDA for the reference.
"""

import argparse
import json
import os
import re
import subprocess
import sys

HEAD_DIM = 128


def useful_flops(n, heads, hd=HEAD_DIM):
    """Forward FLOPs of causal attention: QKᵀ and PV over the n(n+1)/2 visible pairs."""
    return 4.0 * n * (n + 1) / 2 * hd * heads


def torch_side(seqs, heads, reps):
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash():
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # older torch

        def flash():
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)

    def timed(fn):
        fn()  # warm-up
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    out = {}
    dev = torch.device("cuda")
    for n in seqs:
        g = torch.Generator(device=dev).manual_seed(n)
        q, k, v = (torch.randn(1, heads, n, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        do = torch.randn(1, heads, n, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
        with flash():
            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(do)

            t_f = timed(fwd)
            t_fb = timed(fwd_bwd)
        fl = useful_flops(n, heads)
        out[n] = {"fwd_s": t_f, "bwd_s": t_fb - t_f, "fwd_tflops": fl / t_f / 1e12,
                  "bwd_tflops": 2.5 * fl / (t_fb - t_f) / 1e12}
        del q, k, v, do
        torch.cuda.empty_cache()
    out["device"] = torch.cuda.get_device_name(0)
    out["torch"] = torch.__version__
    return out


def go_side(seqs, benchtime):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, DISTFLASH_BENCH_SEQS=",".join(str(n) for n in seqs))
    cmd = ["go", "test", "-tags", "cuda", "-run", "^$", "-bench", "BenchmarkCUDAAttn", "-benchtime", benchtime,
           "./kernels"]
    print("$", " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    sys.stderr.write(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"go test failed with status {res.returncode}")
    out = {}
    pat = re.compile(r"^BenchmarkCUDAAttn/(fwd|bwd)/n(\d+)\S*\s+\d+\s+([\d.]+) ns/op\s+([\d.]+) TFLOP/s")
    for line in res.stdout.splitlines():
        m = pat.match(line)
        if m:
            kind, n, ns, tf = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
            out.setdefault(n, {})[kind + "_s"] = ns / 1e9
            out[n][kind + "_tflops"] = tf
    missing = [n for n in seqs if n not in out]
    if missing:
        raise RuntimeError(f"no benchmark result for sequence lengths {missing}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="4096,8192,16384,32768,65536")
    ap.add_argument("--heads", type=int, default=16, help="must stay 16: the Go benchmark's head count")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions on the PyTorch side")
    ap.add_argument("--benchtime", default="2s", help="go test -benchtime")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-go", action="store_true")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    if a.heads != 16:
        sys.exit("--heads: the Go benchmark (kernels/cuda_bench_test.go) uses 16 heads")
    pt = {} if a.skip_torch else torch_side(seqs, a.heads, a.reps)
    go = {} if a.skip_go else go_side(seqs, a.benchtime)
    if pt:
        print(f"PyTorch {pt['torch']} on {pt['device']}")
    print(f"causal attention, batch 1, {a.heads} heads × {HEAD_DIM}, bf16; TFLOP/s of useful work")
    print(f"{'seq':>7} {'torch fwd':>10} {'ours fwd':>9} {'ratio':>6} {'torch bwd':>10} {'ours bwd':>9} {'ratio':>6}")
    for n in seqs:
        p, g = pt.get(n, {}), go.get(n, {})

        def cell(d, key):
            return f"{d[key]:.1f}" if key in d else "-"

        def ratio(key):
            return f"{g[key] / p[key]:.2f}" if key in g and key in p else "-"

        print(f"{n:>7} {cell(p, 'fwd_tflops'):>10} {cell(g, 'fwd_tflops'):>9} {ratio('fwd_tflops'):>6} "
              f"{cell(p, 'bwd_tflops'):>10} {cell(g, 'bwd_tflops'):>9} {ratio('bwd_tflops'):>6}")
    for n in seqs:
        print(json.dumps({"seq": n, "heads": a.heads, "head_dim": HEAD_DIM, "torch": pt.get(n), "distflash": go.get(n)}))


if __name__ == "__main__":
    main()
