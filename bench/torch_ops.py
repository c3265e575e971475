#!/usr/bin/env python3
"""The per-op table of bench/torch_llama.py's training step, from torch.profiler, in the op classes
and phases of distflash's per-op profile (`train --profile DIR` writes DIR/ops.json;
kernels/opprofile.go), for the GPU check's model phase to set beside ours (issue 36, part 1).

    python3 bench/torch_ops.py --seq 8192 [--dim 2048 --layers 16 --heads 16 --kv-heads 4
                               --ffn 5632 --vocab 32000] [--warmup 2 --timed 0 --steps 2]
                               [--ckpt attn_output|none] [--device cuda|cpu] [--json FILE]

The step is torch_llama.py's (attn_output checkpointing through the flash-attention ops, or with
--ckpt none everything autograd keeps and SDPA; bf16 autocast, fused AdamW at a constant lr 3e-4,
clipping), run with its functions wrapped in torch.profiler ranges, so that every kernel can be
put in a class:

  - each F.linear by the role of its weight (the parameter's storage, which the recomputation's
    detached copies share): gemm.q, gemm.k, gemm.v, gemm.o, gemm.gate, gemm.up, gemm.down,
    gemm.head; rmsnorm, rope, the attention ops, F.silu (swiglu), F.embedding, F.cross_entropy
    (loss), and the optimizer's clipping and AdamW (phase step);
  - phase recompute inside the attn_output block's backward (its recomputation of the norm,
    projections, RoPE and MLP), bwd for the attention backward there;
  - a backward node (autograd::engine::evaluate_function: …) takes the class of the forward op
    it differentiates (the same sequence number and thread), phase bwd;
  - the rest by the aten op's name: casts (_to_copy, copy_), residual adds (add), the SwiGLU
    product (mul), zero fills; "other" for what matches nothing.

--timed N first times N steps without the profiler, as torch_llama.py times them (the device
synchronised around each; the median gives tokens/s; the allocator's peak over them): the GPU
check's model phase takes its PyTorch figures and table from one process. PyTorch running out
of device memory is a result: the JSON record says "oom": true with the error, exit status 0.

A kernel's device time goes to the innermost CPU op that launched it (self device time); a cast
inside a labelled range is a cast. Calls are kernel launches. Times are per step, the mean of the
profiled steps, which run with the profiler on (its overhead is in step_seconds, not in the ops).
With --device cpu (the dry run) self CPU time of the leaf ops stands in for device time. The last
line printed is the JSON table (also written to --json): keys as ops.json's (device, steps,
step_seconds, gap_seconds, ops: op, phase, calls, seconds) plus impl, torch, ckpt_mode, losses
and, with --timed, step_s, step_s_all, tokens_per_s and the allocator's peaks.
"""

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch_llama as tl  # noqa: E402

LABEL = "df::"
ROLES = ["norm1", "gemm.q", "gemm.k", "gemm.v", "gemm.o", "norm2", "gemm.gate", "gemm.up", "gemm.down"]
# aten op names (without "aten::") → class, for what no range names
BY_NAME = [(("_to_copy", "copy_", "to", "_copy_from", "_copy_from_and_resize"), "cast"),
           (("add", "add_"), "residual"), (("mul", "silu", "silu_backward"), "swiglu"),
           (("fill_", "zero_", "zeros", "zeros_like", "empty"), "zero"),
           (("mm", "addmm", "bmm", "matmul", "linear"), "gemm.other"),
           (("embedding", "embedding_dense_backward"), "embedding"),
           (("log_softmax", "_log_softmax", "nll_loss", "nll_loss_forward", "cross_entropy_loss",
             "_log_softmax_backward_data", "nll_loss_backward"), "loss")]
CASTS = {"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from"}


def by_name(name):
    n = name.split("::", 1)[-1]
    if "flash_attention" in n or "scaled_dot_product" in n:
        return "attention"
    if "adam" in n or n.startswith("_foreach"):
        return "optimizer"
    for names, cls in BY_NAME:
        if n in names:
            return cls
    return "other"


def label(name):
    return torch.profiler.record_function(LABEL + name)


def wrap(fn, name):
    def labelled(*a, **k):
        with label(name):
            return fn(*a, **k)
    return labelled


class LabelledF:
    """torch.nn.functional with linear labelled by the weight's role, and silu, embedding and
    cross_entropy by their class."""

    def __init__(self, F, roles):
        self._F, self._roles = F, roles
        self.silu = wrap(F.silu, "swiglu")
        self.embedding = wrap(F.embedding, "embedding")
        self.cross_entropy = wrap(F.cross_entropy, "loss")

    def __getattr__(self, k):
        return getattr(self._F, k)

    def linear(self, x, w, *a, **k):
        with label(self._roles.get(w.data_ptr(), "gemm.other")):
            return self._F.linear(x, w, *a, **k)


def instrument(params):
    """Wraps torch_llama's functions in ranges (once per process); roles maps each weight's
    storage to its class."""
    emb, blocks, norm, head = params
    roles = {head.data_ptr(): "gemm.head"}
    for b in blocks:
        for role, t in zip(ROLES, b):
            if role.startswith("gemm."):
                roles[t.data_ptr()] = role
    if not getattr(tl, "_df_instrumented", False):
        tl._df_instrumented = True
        tl.rmsnorm = wrap(tl.rmsnorm, "rmsnorm")
        tl.rope = wrap(tl.rope, "rope")
        tl.FlashOps.forward = wrap(tl.FlashOps.forward, "attention")
        tl.FlashOps.backward = wrap(tl.FlashOps.backward, "attention.bwd")
        tl.AttnOutBlock.backward = staticmethod(wrap(tl.AttnOutBlock.backward, "phase.recompute"))
        tl.F = LabelledF(tl.F, roles)
    else:
        tl.F._roles = roles


def self_time(ev, cuda):
    if cuda:
        return getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0) or 0
    return ev.self_cpu_time_total if not ev.cpu_children else 0


def classify(ev, fwd):
    """(class, phase) of the kernels ev launched."""
    cls, phase = None, "fwd"
    if ev.name in CASTS:
        cls = "cast"
    e = ev
    while e is not None:
        n = e.name
        if n.startswith("autograd::engine::evaluate_function"):
            if cls is not None:  # a labelled op of the recomputation inside the block's backward node
                return cls, "recompute" if phase == "recompute" else "bwd"
            src = fwd.get((e.fwd_thread, e.sequence_nr)) if e.sequence_nr is not None and e.sequence_nr >= 0 else None
            return src[0] if src else by_name(ev.name), "bwd"
        if n.startswith(LABEL):
            lab = n[len(LABEL):]
            if lab == "phase.recompute":
                phase = "recompute"
            elif lab == "attention.bwd":
                return "attention", "bwd"
            elif lab == "optimizer":
                return cls or "optimizer", "step"
            elif cls is None:
                cls = lab
        e = e.cpu_parent
    return cls or by_name(ev.name), phase


def forward_ops(events):
    """(thread, sequence number) → (class, phase) of the forward op that made each autograd node:
    of the ops recorded with that number (an op and the no-op conversions around it), the one
    whose name is the node's (MulBackward0 ← aten::mul, ToCopyBackward0 ← aten::_to_copy), else
    the last."""
    byseq, nodes = {}, {}
    for ev in events:
        if ev.sequence_nr is None or ev.sequence_nr < 0 or ev.name.startswith("autograd::"):
            continue
        if "Backward" in ev.name:
            nodes[(ev.fwd_thread, ev.sequence_nr)] = ev.name
        else:
            byseq.setdefault((ev.thread, ev.sequence_nr), []).append(ev)
    squash = lambda n: n.split("::")[-1].replace("_", "").lower()  # noqa: E731
    fwd = {}
    for k, evs in byseq.items():
        node = nodes.get(k, "")
        want = squash(node[:node.find("Backward")]) if "Backward" in node else None
        pick = next((e for e in evs if want and squash(e.name) == want), evs[-1])
        fwd[k] = classify(pick, {})
    return fwd


def table(events, cuda, steps):
    """The rows from the profiler's events (the steps' sum, divided by steps)."""
    fwd = forward_ops(events)
    rows = {}
    for ev in events:
        t = self_time(ev, cuda)
        if t <= 0:
            continue
        key = classify(ev, fwd)
        r = rows.setdefault(key, {"op": key[0], "phase": key[1], "calls": 0, "seconds": 0.0})
        r["calls"] += max(len(getattr(ev, "kernels", []) or []), 1) if cuda else 1
        r["seconds"] += t / 1e6
    order = ["gemm.q", "gemm.k", "gemm.v", "gemm.o", "gemm.gate", "gemm.up", "gemm.down", "gemm.head", "gemm.other",
             "attention", "rmsnorm", "rope", "swiglu", "residual", "loss", "embedding", "cast", "zero", "optimizer", "other"]
    phases = ["fwd", "recompute", "bwd", "step"]
    out = sorted(rows.values(), key=lambda r: (order.index(r["op"]) if r["op"] in order else len(order), phases.index(r["phase"])))
    for r in out:
        r["calls"] /= steps
        r["seconds"] /= steps
    return out


def run(a):
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    c = tl.Cfg(a)
    params = tl.init_params(c, device, 1)
    plist = tl.all_params(params)
    kw = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    try:
        opt = torch.optim.AdamW(plist, fused=True, **kw) if cuda else torch.optim.AdamW(plist, **kw)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(plist, **kw)
    g = torch.Generator(device="cpu").manual_seed(5)
    ids = torch.randint(0, 256, (1, a.seq + 1), generator=g).to(device)
    inp, tgt = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    tables = tl.rope_tables(a.seq, c.hd, c.theta, device)
    ops = tl.FlashOps(device)
    instrument(params)
    mode, err = a.ckpt, None

    def step():
        opt.zero_grad(set_to_none=True)
        loss = tl.forward_loss(c, params, inp, tgt, mode, ops, tables, a.precision == "bf16")
        loss.backward()
        with label("optimizer"):
            torch.nn.utils.clip_grad_norm_(plist, 1.0)
            opt.step()
        return loss

    losses = []
    if mode == "attn_output":  # as torch_llama.py: the flash ops missing or refusing the shapes
        try:
            losses.append(step().item())
        except (RuntimeError, TypeError) as e:
            if is_oom(e):
                raise
            err = f"{type(e).__name__}: {e}"[:400]
            print(f"attn_output with the flash ops failed ({err}); falling back to sdpa_checkpoint", file=sys.stderr)
            mode = "sdpa_checkpoint"
    for _ in range(a.warmup - len(losses)):
        losses.append(step().item())
    tl.sync(device)
    rec = {"impl": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "seq": a.seq, "ckpt_mode": mode, "flash_ops": ops.flash and mode == "attn_output", "fallback_reason": err}
    if a.timed:  # timed as torch_llama.py times: the device synchronised around each step
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(a.timed):
            t0 = time.perf_counter()
            losses.append(step().item())
            tl.sync(device)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        rec.update(step_s=med, step_s_all=times, tokens_per_s=a.seq / med)
        if cuda:
            rec.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved())
    rec["losses"] = losses
    if not a.steps:
        return rec
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            losses.append(step().item())
        tl.sync(device)
        wall = (time.perf_counter() - t0) / a.steps
    rows = table(prof.events(), cuda, a.steps)
    inside = sum(r["seconds"] for r in rows)
    rec.update({"steps": a.steps, "step_seconds": wall, "gap_seconds": max(wall - inside, 0.0),
                "ops": rows + [{"op": "gaps", "phase": "step", "calls": 0, "seconds": max(wall - inside, 0.0)}],
                "attribution": "torch.profiler self device time per CPU op, classes by range labels (bench/torch_ops.py)"})
    return rec


def is_oom(e):
    """Whether e is PyTorch running out of device memory."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tl.add_shape_args(ap)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=0, help="steps timed without the profiler, after the warm-up")
    ap.add_argument("--steps", type=int, default=2, help="steps profiled, after the timed ones (0: no table)")
    ap.add_argument("--ckpt", default="attn_output", choices=["attn_output", "none"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="also write the table to this file")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: PyTorch sees no CUDA device")
    if a.timed < 0 or a.steps < 0 or a.warmup < 0 or a.timed + a.steps == 0:
        sys.exit("--warmup, --timed and --steps: none negative, and some steps timed or profiled")
    try:
        rec = run(a)
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            raise
        rec = {"impl": "pytorch", "torch": torch.__version__, "seq": a.seq, "ckpt_mode": a.ckpt, "oom": True,
               "error": f"{type(e).__name__}: {e}"[:600]}
        if torch.cuda.is_available():
            rec["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        tl.emit(rec, a.json)
        return
    if not all(math.isfinite(r["seconds"]) for r in rec.get("ops", [])):
        sys.exit("a time that is not a number")
    tl.emit(rec, a.json)


if __name__ == "__main__":
    main()
