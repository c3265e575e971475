#!/usr/bin/env python3
"""The GEMM table's PyTorch column (issue 41): torch.matmul on bf16 tensors of the 18 shapes of
the 0.85B model's GEMMs at 8K tokens (notes/gpu-step-review.md §1), beside distflash's
BenchmarkCUDAGemmTable (kernels/cuda_bench_test.go), which writes the same JSON for its modes
fp32-storage, bf16 and bf16-f32c.

    python3 bench/torch_gemm.py --out FILE [--dry] [--warmup 5] [--iters 20]

The shapes are derived as the Go table's are: a projection y = x·Wᵀ of W [out, in] over T
tokens is the forward (M T, N out, K in, B transposed), the input gradient dX = dY·W (M T,
N in, K out) and the weight gradient dW = dYᵀ·X (M out, N in, K T, A transposed), for q, k/v,
o, gate/up, down and the head, at T 8192, D 2048, Q 2048, KV 512, F 5632, V 32000. A stored
[k, m] when transposed, B [n, k]: op(A) and op(B) are views (.t()), which torch hands cuBLAS as
transposition flags, the layout distflash's MatMul gives it. Each product is written into a
preallocated bf16 C (beta 0), timed by CUDA events over --iters products after --warmup ones.
Reductions of split-K partial products stay in float32
(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False), as distflash's
cuBLAS handle has them; --reduced-precision-reduction gives PyTorch's default instead.

The JSON is a list of {"role", "m", "n", "k", "transA", "transB", "mode": "torch-bf16", "ms",
"tflops"}, one per shape, ms the mean time of one product. --dry needs no GPU: it checks the
table (18 shapes, each product's FLOPs those of the review's table) and runs every shape's
matmul on the CPU at 1/64 of its size (the output's shape, and its values against float32), then
writes the rows with ms and tflops null.
"""

import argparse
import json
import sys

T, D, Q, KV, F, V = 8192, 2048, 2048, 512, 5632, 32000
# the projections by role: (out, in) of W
PROJECTIONS = [("q", Q, D), ("kv", KV, D), ("o", D, Q), ("gate_up", F, D), ("down", D, F), ("head", V, D)]
# the review's GFLOP per product, by role
REVIEW_GFLOP = {"q": 68.7, "kv": 17.2, "o": 68.7, "gate_up": 189, "down": 189, "head": 1074}
MODE = "torch-bf16"


def shapes():
    """The 18 rows: (role, m, n, k, transA, transB), in the Go table's order."""
    rows = []
    for role, out, inp in PROJECTIONS:
        rows.append((role + ".fwd", T, out, inp, False, True))
        rows.append((role + ".dX", T, inp, out, False, False))
        rows.append((role + ".dW", out, inp, T, True, False))
    return rows


def check_table(rows):
    if len(rows) != 18 or len({r[0] for r in rows}) != 18:
        sys.exit(f"torch_gemm: {len(rows)} shapes, want 18 distinct roles")
    for role, m, n, k, _, _ in rows:
        gflop, want = 2 * m * n * k / 1e9, REVIEW_GFLOP[role.split(".")[0]]
        if abs(gflop - want) > 0.005 * want:
            sys.exit(f"torch_gemm: {role} is {gflop:.1f} GFLOP, the review's table says {want}")


def operands(torch, m, n, k, ta, tb, device, dtype):
    """op(A) [m, k] and op(B) [k, n], A stored [k, m] when transposed, B [n, k]."""
    a = torch.randn((k, m) if ta else (m, k), device=device, dtype=dtype)
    b = torch.randn((n, k) if tb else (k, n), device=device, dtype=dtype)
    return (a.t() if ta else a), (b.t() if tb else b)


def row(role, m, n, k, ta, tb, ms):
    tflops = None if ms is None else 2 * m * n * k / (ms * 1e-3) / 1e12
    return {"role": role, "m": m, "n": n, "k": k, "transA": ta, "transB": tb, "mode": MODE, "ms": ms, "tflops": tflops}


def dry(torch, rows):
    """Every shape at 1/64 of its size on the CPU: the output's shape, and bf16 against float32."""
    out = []
    for role, m, n, k, ta, tb in rows:
        sm, sn, sk = max(1, m // 64), max(1, n // 64), max(1, k // 64)
        x, y = operands(torch, sm, sn, sk, ta, tb, "cpu", torch.float32)
        c = torch.matmul(x.bfloat16(), y.bfloat16())
        ref = torch.matmul(x.bfloat16().float(), y.bfloat16().float())
        if tuple(c.shape) != (sm, sn):
            sys.exit(f"torch_gemm --dry: {role}: output {tuple(c.shape)}, want {(sm, sn)}")
        # bf16 output: half a unit (2^-9) of each value, plus float32 sums in another order
        err = (c.float() - ref).abs().max().item()
        if err > 2 ** -8 * ref.abs().max().item() + 1e-3:
            sys.exit(f"torch_gemm --dry: {role}: bf16 product off float32 by {err}")
        out.append(row(role, m, n, k, ta, tb, None))
    return out


def measure(torch, rows, warmup, iters):
    out = []
    for role, m, n, k, ta, tb in rows:
        x, y = operands(torch, m, n, k, ta, tb, "cuda", torch.bfloat16)
        c = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        for _ in range(warmup):
            torch.matmul(x, y, out=c)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(x, y, out=c)
        end.record()
        torch.cuda.synchronize()
        r = row(role, m, n, k, ta, tb, start.elapsed_time(end) / iters)
        print(f"{MODE} {role:12s} {m:6d}×{n:6d}×{k:6d} tA={ta:d} tB={tb:d}  {r['ms']:8.3f} ms  {r['tflops']:7.1f} TFLOP/s", flush=True)
        out.append(r)
        del x, y, c
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--dry", action="store_true", help="no GPU: check the shapes on the CPU, write null timings")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reduced-precision-reduction", action="store_true",
                    help="PyTorch's default: split-K partial sums may be rounded to bf16")
    args = ap.parse_args()
    rows = shapes()
    check_table(rows)
    import torch

    torch.manual_seed(41)
    if args.dry:
        out = dry(torch, rows)
    else:
        if not torch.cuda.is_available():
            sys.exit("torch_gemm: no CUDA device (--dry runs without one)")
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = args.reduced_precision_reduction
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
        out = measure(torch, rows, args.warmup, args.iters)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"torch_gemm: wrote {len(out)} rows to {args.out}")


if __name__ == "__main__":
    main()
