#!/usr/bin/env python3
"""PyTorch repeats a distflash run step for step: the reference of distflash's training curve.

    DISTFLASH_TRACE=TRACE distflash train --config C [--set ...]       # writes TRACE/
    python3 bench/torch_train.py --trace TRACE [--against runs/NAME/metrics.jsonl]
                                 [--device cpu|cuda] [--precision fp32|bf16] [--json FILE]

distflash's trace (train/trace.go) holds the weights before the first step (init.safetensors,
Hugging Face names), the resolved config (config.json) and every step's sequences
(batches.jsonl: the token ids of each sequence, and the learning rate distflash used). This
script builds the same LLaMA in PyTorch (bench/torch_llama.py's model: pre-norm RMSNorm blocks,
rotate-half RoPE, grouped-query causal attention through SDPA, SwiGLU, untied head) from those
weights and trains it on those sequences, in that order, with the same recipe:

  - loss: the mean cross-entropy over every target token of the step (all micro-batches and
    replicas at once, which is what distflash's summed, rescaled gradients are);
  - learning rate: optim.Schedule (linear warmup from lr/warmup to lr, then cosine, linear or
    constant to min_lr), computed here and checked against the trace's, step by step;
  - clipping: torch.nn.utils.clip_grad_norm_ (max_norm / (norm + 1e-6) when the norm is over
    max_norm), as optim.ClipScale; the norm reported is the one before clipping;
  - AdamW: torch.optim.AdamW, betas, eps and weight decay from the config, bias correction,
    eps added to sqrt(v̂) (PyTorch's and kernels' AdamW alike), decoupled decay lr·wd·p on the
    matrices (embedding and head included) and none on the norm weights (model.NewLayout's
    Decay);
  - precision: fp32, or bf16 as torch.autocast(bfloat16) with fp32 master weights and
    optimizer state.

It prints one JSON line: the losses, gradient norms and learning rates; with --against, also
distflash's losses from that metrics.jsonl and the largest relative gap between the curves.
Not reproduced (refused): sliding windows, RoPE scaling, document masks, fp16, and a trace of a
resumed run (whose optimizer state is not in the trace).
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama  # noqa: E402  (the model: rmsnorm, rope, part_a, part_b, forward_loss)


def read_safetensors(path):
    """The F32 tensors of a safetensors file and its metadata (the format of
    weights/safetensors/write.go: u64 header length, JSON header, data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        if h["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {h['dtype']}, want F32")
        a, b = h["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(h["shape"])
    return out, meta


def lr_at(t, step):
    """optim.Schedule.At: the learning rate of update number step (0-based)."""
    lr, warm, steps = t["lr"], t["warmup_steps"], t["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    if t["lr_schedule"] == "constant":
        return lr
    span = steps - 1 - warm
    progress = min(1.0, (step - warm) / span) if span > 0 else 1.0
    if t["lr_schedule"] == "linear":
        return lr - (lr - t["min_lr"]) * progress
    return t["min_lr"] + (lr - t["min_lr"]) * 0.5 * (1 + math.cos(math.pi * progress))


def model_of(cfg):
    """torch_llama's Cfg of distflash's [model] section; refuses what the model here lacks."""
    m = cfg["model"]
    rs = m.get("rope_scaling") or {}
    if m.get("sliding_window") or rs.get("rope_type") not in (None, "", "none", "default"):
        raise SystemExit("model.sliding_window or model.rope_scaling is set: bench/torch_train.py does not reproduce them")
    if cfg["data"].get("document_mask") or cfg["data"].get("position_reset"):
        raise SystemExit("data.document_mask / position_reset: bench/torch_train.py does not reproduce them")
    a = argparse.Namespace(dim=m["dim"], layers=m["n_layers"], heads=m["n_heads"],
                           kv_heads=m["n_kv_heads"] or m["n_heads"], ffn=m["ffn_dim"], vocab=m["vocab_size"])
    c = torch_llama.Cfg(a)
    c.hd = m["head_dim"] or m["dim"] // m["n_heads"]
    c.eps, c.theta = m["norm_eps"], m["rope_theta"]
    return c


def load_params(c, tensors, device):
    """torch_llama's parameter structure (emb, blocks, norm, head) from the trace's weights."""
    def p(name):
        return torch.nn.Parameter(tensors[name].clone().to(device))

    blocks = []
    for i in range(c.layers):
        q = f"model.layers.{i}."
        blocks.append([p(q + "input_layernorm.weight"), p(q + "self_attn.q_proj.weight"),
                       p(q + "self_attn.k_proj.weight"), p(q + "self_attn.v_proj.weight"),
                       p(q + "self_attn.o_proj.weight"), p(q + "post_attention_layernorm.weight"),
                       p(q + "mlp.gate_proj.weight"), p(q + "mlp.up_proj.weight"), p(q + "mlp.down_proj.weight")])
    return p("model.embed_tokens.weight"), blocks, p("model.norm.weight"), p("lm_head.weight")


def read_losses(path):
    """step -> loss of a distflash metrics.jsonl (the last line of a step written twice)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                m = json.loads(line)
                out[m["step"]] = m["loss"]
    return out


def train(a):
    with open(os.path.join(a.trace, "config.json")) as f:
        cfg = json.load(f)
    tensors, meta = read_safetensors(os.path.join(a.trace, "init.safetensors"))
    if meta.get("step", "0") != "0":
        raise SystemExit(f"{a.trace}: the trace starts at step {meta['step']}: only a fresh run's trace can be repeated")
    t = cfg["training"]
    prec = a.precision or t["mixed_precision"]
    if prec not in ("fp32", "bf16"):
        raise SystemExit(f"precision {prec}: bench/torch_train.py repeats fp32 and bf16 runs")
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    c = model_of(cfg)
    params = load_params(c, tensors, device)
    del tensors
    emb, blocks, norm, head = params
    decay = [emb] + [w for b in blocks for i, w in enumerate(b) if i not in (0, 5)] + [head]
    no_decay = [b[0] for b in blocks] + [b[5] for b in blocks] + [norm]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"lr": t["lr"], "betas": (t["beta1"], t["beta2"]), "eps": t["eps"]}
    opt = None
    if device.type == "cuda":
        try:
            opt = torch.optim.AdamW(groups, fused=True, **kw)
        except (TypeError, RuntimeError):
            opt = None
    if opt is None:
        opt = torch.optim.AdamW(groups, foreach=False, **kw)
    plist = torch_llama.all_params(params)
    seq = cfg["data"]["seq_len"]
    tables = torch_llama.rope_tables(seq, c.hd, c.theta, device)
    ops = torch_llama.FlashOps(device)
    rec = {"impl": "pytorch", "torch": torch.__version__, "device": str(device), "precision": prec,
           "steps": [], "loss": [], "grad_norm": [], "lr": []}
    with open(os.path.join(a.trace, "batches.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            b = json.loads(line)
            if a.steps and b["step"] > a.steps:
                break
            lr = lr_at(t, b["step"] - 1)
            if abs(lr - b["lr"]) > 1e-12 * max(abs(lr), 1e-30):
                raise SystemExit(f"step {b['step']}: the schedule here gives lr {lr!r}, the trace {b['lr']!r}")
            for g in opt.param_groups:
                g["lr"] = lr
            ids = torch.tensor(b["inputs"], dtype=torch.long, device=device)
            tgt = torch.tensor(b["targets"], dtype=torch.long, device=device)
            opt.zero_grad(set_to_none=True)
            loss = torch_llama.forward_loss(c, params, ids, tgt, a.ckpt, ops, tables, prec == "bf16")
            loss.backward()
            if t["grad_clip"] > 0:
                gn = torch.nn.utils.clip_grad_norm_(plist, t["grad_clip"])
            else:
                gn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in plist]))
            opt.step()
            rec["steps"].append(b["step"])
            rec["loss"].append(loss.item())
            rec["grad_norm"].append(gn.item())
            rec["lr"].append(lr)
            print(f"step {b['step']}: loss {rec['loss'][-1]:.6f} grad_norm {rec['grad_norm'][-1]:.4f} lr {lr:.3e}", file=sys.stderr)
    if a.against:
        theirs = read_losses(a.against)
        gaps = [abs(l - theirs[s]) / abs(theirs[s]) for s, l in zip(rec["steps"], rec["loss"]) if s in theirs]
        rec["distflash_loss"] = [theirs.get(s) for s in rec["steps"]]
        rec["max_rel"] = max(gaps) if gaps else None
        rec["max_abs"] = max(abs(l - theirs[s]) for s, l in zip(rec["steps"], rec["loss"]) if s in theirs) if gaps else None
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, help="the directory DISTFLASH_TRACE named")
    ap.add_argument("--against", help="distflash's metrics.jsonl of the same run: report the largest relative gap")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], help="default: the config's training.mixed_precision")
    ap.add_argument("--ckpt", default="none", choices=["none", "attn_output", "sdpa_checkpoint"],
                    help="bench/torch_llama.py's activation checkpointing (none: plain autograd)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: every step of the trace)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    ap.add_argument("--json", help="also write the JSON record to this file")
    a = ap.parse_args()
    torch.manual_seed(0)
    rec = train(a)
    line = json.dumps(rec)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
