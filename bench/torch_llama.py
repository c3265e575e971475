#!/usr/bin/env python3
"""A plain PyTorch training step of a LLaMA, the reference for distflash's single-GPU numbers
(scripts/gpu_check.sh, phase model).

    python3 bench/torch_llama.py --seq 8192 [--dim 2048 --layers 16 --heads 16 --kv-heads 4
                                 --ffn 5632 --vocab 32000] [--steps 6 --warmup 2]
                                 [--device cuda|cpu] [--precision bf16|fp32] [--json FILE]
    python3 bench/torch_llama.py --check [--device cpu]   # self-test of the checkpointing

The model is the one distflash trains (pre-norm RMSNorm blocks, RoPE, grouped-query causal
attention, SwiGLU, untied output head), with fp32 master weights, AdamW (fused on CUDA) and,
under bf16, torch.autocast(bfloat16): the same arithmetic as distflash's mixed precision.

Activation checkpointing is distflash's attn_output policy (DistFlashAttn §3.3): each block keeps
its input x, the attention output o and the attention's log-sum-exp; the backward pass recomputes
norm, q/k/v projections and RoPE (not the attention forward) and the o-projection + MLP half. On
CUDA the attention is FlashAttention-2 through aten::_scaled_dot_product_flash_attention and its
backward op (the kernels SDPA's flash backend runs); key/value heads are repeated to the query
heads for those ops. If the ops are missing or refuse the shapes, the step falls back to
torch.utils.checkpoint around the two halves with SDPA between them (which also keeps q, k, v),
and the JSON says so (ckpt_mode). --ckpt none keeps everything autograd saves.

Timing: --warmup steps, then --steps timed steps (device synchronised around each); the median
step time gives tokens/s. Peak memory is torch.cuda.max_memory_allocated / _reserved. The last
line printed is the JSON record (also written to --json).
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w.to(x.dtype)


def rope_tables(seq, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    """x: (B, H, S, hd); rotates the pairs (x[i], x[i + hd/2]) by position × inv_freq[i]:
    Hugging Face's rotate_half, distflash's RoPE (weights/hf.go), so that the same weights give
    the same model in both (bench/torch_train.py)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class Cfg:
    def __init__(self, a):
        self.dim, self.layers, self.heads, self.kv = a.dim, a.layers, a.heads, a.kv_heads
        self.hd = a.dim // a.heads
        self.ffn, self.vocab, self.eps, self.theta = a.ffn, a.vocab, 1e-5, 10000.0


def init_params(c, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def w(*shape):
        return torch.nn.Parameter((torch.randn(*shape, generator=g) * (1.0 / math.sqrt(shape[-1]))).to(device))

    blocks = []
    for _ in range(c.layers):
        blocks.append([
            torch.nn.Parameter(torch.ones(c.dim, device=device)),  # attn norm
            w(c.heads * c.hd, c.dim), w(c.kv * c.hd, c.dim), w(c.kv * c.hd, c.dim),  # wq wk wv
            w(c.dim, c.heads * c.hd),  # wo
            torch.nn.Parameter(torch.ones(c.dim, device=device)),  # mlp norm
            w(c.ffn, c.dim), w(c.ffn, c.dim), w(c.dim, c.ffn),  # w1 (gate) w3 (up) w2 (down)
        ])
    emb = w(c.vocab, c.dim)
    norm = torch.nn.Parameter(torch.ones(c.dim, device=device))
    head = w(c.vocab, c.dim)
    return emb, blocks, norm, head


def part_a(c, x, p, cos, sin):
    """Norm, q/k/v projections and RoPE: (B, H, S, hd) q and (B, KV, S, hd) k, v."""
    B, S, _ = x.shape
    h = rmsnorm(x, p[0], c.eps)
    q = F.linear(h, p[1]).view(B, S, c.heads, c.hd).transpose(1, 2)
    k = F.linear(h, p[2]).view(B, S, c.kv, c.hd).transpose(1, 2)
    v = F.linear(h, p[3]).view(B, S, c.kv, c.hd).transpose(1, 2)
    return rope(q, cos, sin), rope(k, cos, sin), v


def part_b(c, x, o, p):
    """o: (B, H, S, hd). Output projection, residual, norm, SwiGLU MLP, residual."""
    B, S, _ = x.shape
    y = x + F.linear(o.transpose(1, 2).reshape(B, S, c.heads * c.hd), p[4])
    h = rmsnorm(y, p[5], c.eps)
    return y + F.linear(F.silu(F.linear(h, p[6])) * F.linear(h, p[7]), p[8])


def expand_kv(t, rep):
    return t if rep == 1 else t.repeat_interleave(rep, dim=1)


def attn_math(q, k, v, scale):
    """Causal attention in fp32 with its log-sum-exp (small sizes and CPU only)."""
    S = q.shape[2]
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype), lse


def sdpa(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn_math(q, k, v, 1.0 / math.sqrt(q.shape[-1]))[0]


class FlashOps:
    """Attention forward returning (o, state) and backward from that state: the aten flash ops
    on CUDA, the math version (autograd through a recomputation) elsewhere."""

    def __init__(self, device):
        self.flash = device.type == "cuda" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention")

    def forward(self, q, k, v, scale):
        if self.flash:
            r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
            return r[0], r  # out, (out, lse, cum_q, cum_k, max_q, max_k, seed, offset, mask)
        o, lse = attn_math(q, k, v, scale)
        return o, (o, lse)

    def backward(self, do, q, k, v, st, scale):
        if self.flash:
            o, lse, cq, ck, mq, mk, seed, off = st[:8]
            return torch.ops.aten._scaled_dot_product_flash_attention_backward(
                do, q, k, v, o, lse, cq, ck, mq, mk, 0.0, True, seed, off, scale=scale)
        with torch.enable_grad():
            q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
            o, _ = attn_math(q2, k2, v2, scale)
            return torch.autograd.grad(o, (q2, k2, v2), do)


class AttnOutBlock(torch.autograd.Function):
    """One block under distflash's attn_output policy: saves x, o and the attention state; the
    backward recomputes part_a (for q, k, v) and part_b, never the attention forward."""

    @staticmethod
    def forward(ctx, x, c, ops, cos, sin, amp, *p):
        ctx.c, ctx.ops, ctx.amp, ctx.cos, ctx.sin = c, ops, amp, cos, sin
        rep = c.heads // c.kv
        scale = 1.0 / math.sqrt(c.hd)
        with torch.no_grad(), autocast(x.device, amp):
            q, k, v = part_a(c, x, p, cos, sin)
            o, st = ops.forward(q.contiguous(), expand_kv(k, rep).contiguous(), expand_kv(v, rep).contiguous(), scale)
            out = part_b(c, x, o, p)
        # o and the attention state (lse, and on CUDA the flash op's bookkeeping: sequence
        # offsets, lengths, RNG state) are intermediates, held on ctx until the backward.
        ctx.o, ctx.st = o, st
        ctx.save_for_backward(x, *p)
        return out

    @staticmethod
    def backward(ctx, gout):
        c, ops, amp = ctx.c, ctx.ops, ctx.amp
        x, *p = ctx.saved_tensors
        o, st = ctx.o, ctx.st
        rep = c.heads // c.kv
        scale = 1.0 / math.sqrt(c.hd)
        with torch.enable_grad(), autocast(x.device, amp):
            xb = x.detach().requires_grad_()
            ob = o.detach().requires_grad_()
            pb = [t.detach().requires_grad_() for t in p]
            out = part_b(c, xb, ob, pb)
            gb = torch.autograd.grad(out, [xb, ob] + pb[4:], gout)
            xa = x.detach().requires_grad_()
            pa = [t.detach().requires_grad_() for t in p[:4]]
            q, k, v = part_a(c, xa, pa, ctx.cos, ctx.sin)
            ke, ve = expand_kv(k, rep).contiguous(), expand_kv(v, rep).contiguous()
            dq, dk, dv = ops.backward(gb[1].to(o.dtype).contiguous(), q.contiguous(), ke, ve, st, scale)
            ctx.o = ctx.st = None
            B, H, S, hd = dk.shape
            dk = dk.view(B, c.kv, rep, S, hd).sum(2)
            dv = dv.view(B, c.kv, rep, S, hd).sum(2)
            ga = torch.autograd.grad((q, k, v), [xa] + pa, (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)))
        # ga: x, p[0..3] (norm, wq, wk, wv); gb: x, o, p[4..8] (wo, norm, w1, w3, w2).
        return (gb[0] + ga[0], None, None, None, None, None, *ga[1:], *gb[2:])


def autocast(device, amp):
    if not amp:
        return NullCtx()
    if hasattr(torch, "autocast"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.cuda.amp.autocast(dtype=torch.bfloat16)


class NullCtx:
    """A context that does nothing (autocast off)."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def checkpoint_fn(fn, *args):
    import torch.utils.checkpoint as cp
    try:
        return cp.checkpoint(fn, *args, use_reentrant=False)
    except TypeError:  # torch < 1.11
        return cp.checkpoint(fn, *args)


def forward_loss(c, params, ids, tgt, mode, ops, tables, amp):
    emb, blocks, norm, head = params
    cos, sin = tables
    x = F.embedding(ids, emb)
    for p in blocks:
        if mode == "attn_output":
            x = AttnOutBlock.apply(x, c, ops, cos, sin, amp, *p)
            continue
        with autocast(x.device, amp):
            if mode == "sdpa_checkpoint":
                q, k, v = checkpoint_fn(lambda x_, *p_: part_a(c, x_, p_, cos, sin), x, *p[:4])
            else:
                q, k, v = part_a(c, x, p, cos, sin)
            rep = c.heads // c.kv
            o = sdpa(q, expand_kv(k, rep), expand_kv(v, rep))
            if mode == "sdpa_checkpoint":
                x = checkpoint_fn(lambda x_, o_, *p_: part_b(c, x_, o_, (None,) * 4 + p_), x, o, *p[4:])
            else:
                x = part_b(c, x, o, p)
    with autocast(x.device, amp):
        logits = F.linear(rmsnorm(x, norm, c.eps), head)
    return F.cross_entropy(logits.float().view(-1, c.vocab), tgt.view(-1))


def all_params(params):
    emb, blocks, norm, head = params
    return [emb] + [t for b in blocks for t in b] + [norm, head]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check(a, device):
    """The attn_output block's gradients equal plain autograd's (fp32, small model)."""
    small = argparse.Namespace(dim=64, layers=2, heads=4, kv_heads=2, ffn=96, vocab=64)
    c = Cfg(small)
    torch.manual_seed(0)
    ids = torch.randint(0, c.vocab, (2, 48), device=device)
    tgt = torch.randint(0, c.vocab, (2, 48), device=device)
    tables = rope_tables(48, c.hd, c.theta, device)
    results = {}
    amp = a.precision == "bf16" and device.type == "cuda"
    for mode in ("none", "attn_output", "sdpa_checkpoint"):
        params = init_params(c, device, 3)
        loss = forward_loss(c, params, ids, tgt, mode, FlashOps(device), tables, amp)
        grads = torch.autograd.grad(loss, all_params(params))
        results[mode] = (loss.item(), torch.cat([g.flatten().float() for g in grads]))
    ref = results["none"]
    tol = 2e-2 if amp else 1e-5
    out = {}
    for mode in ("attn_output", "sdpa_checkpoint"):
        l, g = results[mode]
        err = ((g - ref[1]).abs().max() / ref[1].abs().max()).item()
        out[mode] = {"loss_diff": abs(l - ref[0]), "grad_rel_err": err}
        if not (err <= tol and abs(l - ref[0]) <= tol * abs(ref[0])):
            raise SystemExit(f"check failed: {mode}: gradients differ from plain autograd by {err:.3g} (tolerance {tol})")
    return {"check": out, "tolerance": tol, "device": str(device), "flash_ops": FlashOps(device).flash}


def bench(a, device):
    c = Cfg(a)
    amp = a.precision == "bf16"
    params = init_params(c, device, 1)
    plist = all_params(params)
    n_params = sum(t.numel() for t in plist)
    opt_kw = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    if device.type == "cuda":
        try:
            opt = torch.optim.AdamW(plist, fused=True, **opt_kw)
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW(plist, **opt_kw)
    else:
        opt = torch.optim.AdamW(plist, **opt_kw)
    g = torch.Generator(device="cpu").manual_seed(5)
    ids = torch.randint(0, 256, (a.batch, a.seq + 1), generator=g).to(device)
    inp, tgt = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    tables = rope_tables(a.seq, c.hd, c.theta, device)
    ops = FlashOps(device)
    mode = a.ckpt
    times, losses, err = [], [], None

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(c, params, inp, tgt, mode, ops, tables, amp)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        return loss

    if mode == "attn_output":
        try:
            step()
        except (RuntimeError, TypeError) as e:  # the flash ops are missing or refuse the shapes
            err = f"{type(e).__name__}: {e}"[:400]
            print(f"attn_output with the flash ops failed ({err}); falling back to sdpa_checkpoint", file=sys.stderr)
            mode = "sdpa_checkpoint"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        sync(device)
        t0 = time.perf_counter()
        loss = step()
        sync(device)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt)
        print(f"step {i}: loss {losses[-1]:.4f} {dt * 1e3:.1f} ms", file=sys.stderr)
    med = statistics.median(times)
    rec = {
        "impl": "pytorch", "torch": torch.__version__, "device": str(device),
        "device_name": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "dim": c.dim, "layers": c.layers, "heads": c.heads, "kv_heads": c.kv, "head_dim": c.hd, "ffn": c.ffn,
        "vocab": c.vocab, "seq": a.seq, "batch": a.batch, "params": n_params, "precision": a.precision,
        "ckpt_mode": mode, "flash_ops": ops.flash and mode == "attn_output", "fallback_reason": err,
        "step_s": med, "step_s_all": times, "tokens_per_s": a.batch * a.seq / med, "losses": losses,
    }
    if device.type == "cuda":
        rec["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return rec


def add_shape_args(ap):
    """The model's shape and the sequence length as flags (defaults: configs/llama-1b.toml at 8K)."""
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=8192)


def emit(rec, path):
    """Prints the JSON record as the last line, and writes it to path too when one is given."""
    line = json.dumps(rec)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")
    print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(ap)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ckpt", default="attn_output", choices=["attn_output", "sdpa_checkpoint", "none"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check", action="store_true", help="compare the checkpointed gradients with plain autograd and exit")
    ap.add_argument("--json", help="also write the JSON record to this file")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: PyTorch sees no CUDA device")
    emit(check(a, device) if a.check else bench(a, device), a.json)


if __name__ == "__main__":
    main()
