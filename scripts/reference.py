#!/usr/bin/env python3
"""Independent PyTorch reference for the distflash LLaMA trainer.

This file is the specification the Go implementation is checked against.  It is
written from the LLaMA paper / Hugging Face ``LlamaForCausalLM`` definition and
does not depend on (or look at) any Go code.  Every command needs PyTorch and
numpy, which a plain python3 lacks: Debian's ``python3-torch`` and
``python3-numpy`` (``apt-get install python3-torch python3-numpy``, then
``/usr/bin/python3``), or the virtual environment ``scripts/install_torch.sh``
makes (it prints its interpreter: ``"$(scripts/install_torch.sh)"
scripts/reference.py ...``).  No ``safetensors`` or ``transformers`` package is
used.

Usage
-----
    /usr/bin/python3 scripts/reference.py golden
        Regenerate model/testdata/golden/*.safetensors and
        kernels/testdata/attn/*.safetensors (paths relative to the repo root,
        i.e. this script's parent's parent).  Deterministic: two runs produce
        byte-identical files.

    /usr/bin/python3 scripts/reference.py half
        Regenerate kernels/testdata/half/*.safetensors: PyTorch's float32 ->
        bfloat16 / float16 conversions and products of bf16 / fp16-rounded
        operands (see "Mixed-precision files" below).  Deterministic.

    /usr/bin/python3 scripts/reference.py rope
        Regenerate model/testdata/rope/*.safetensors: the golden model files
        (same layout) of each RoPE scaling (see "RoPE scaling" below).
        Deterministic.

    /usr/bin/python3 scripts/reference.py docmask
        Regenerate model/testdata/docmask/*.safetensors: packed documents with
        an explicit block-diagonal causal mask (see "Document masking" below).
        Deterministic.

    /usr/bin/python3 scripts/reference.py window
        Regenerate model/testdata/window/*.safetensors: sliding-window attention with
        an explicit banded causal mask (key j visible to query i iff i - W < j <= i),
        on every layer or some, with and without documents.  Deterministic.

    /usr/bin/python3 scripts/reference.py hf
        Regenerate weights/testdata/hf/ (deterministic; see "Hugging Face
        fixtures" below).

    /usr/bin/python3 scripts/reference.py read-hf DIR --docs 'GLOB' --seq-len N \\
        --samples S [--out FILE]
        Loss of a Hugging Face LLaMA directory (what `distflash export` writes),
        read with this file's own safetensors reader, on byte-tokenized
        documents (see cmd_read_hf); prints JSON.  Needs PyTorch and numpy, as
        every command (see above).

    /usr/bin/python3 scripts/reference.py generate
        Regenerate weights/testdata/hf/generate.json: greedy decoding of the three
        Hugging Face fixtures, read back with this file's own reader, on fixed
        prompts (see "Greedy decoding" below).  Deterministic.

    /usr/bin/python3 scripts/reference.py bench --threads 2 --dim 128 \\
        --n-layers 4 --n-heads 4 --n-kv-heads 2 --ffn-dim 352 --vocab 256 \\
        --seq-len 128 --batch 8 --steps 10
        fp32 training-step throughput (forward, backward, AdamW step,
        zero_grad) of the same model; prints one JSON line.

    /usr/bin/python3 scripts/reference.py bench-attn --threads 2 \\
        --seq-len 1024 --n-heads 8 --head-dim 64
        fp32 causal attention forward+backward throughput; prints one JSON line.

safetensors format (as written here)
------------------------------------
8-byte little-endian u64 header length N, then N bytes of UTF-8 JSON header
padded with spaces to a multiple of 8, then the raw little-endian data section.
The header maps tensor name -> {"dtype": "F32"|"I32", "shape": [...],
"data_offsets": [begin, end]} (byte offsets relative to the start of the data
section; tensors are laid out contiguously, C order, in header order with no
gaps) plus "__metadata__": {string: string}.  Header keys are written in a
fixed order so output is byte-reproducible.

Model (all reference computation in float64)
--------------------------------------------
Sizes: D=dim, H=n_heads, K=n_kv_heads, hd=head_dim, F=ffn_dim, V=vocab_size,
L=n_layers, B=batch, T=seq_len.  Weights are generated in fp32 (so they are
exactly fp32-representable), cast to float64, and every forward/backward
computation is done in float64 with torch autograd.  Results are stored as F32
(rounded once from float64).

Parameters (Hugging Face names, shapes [out, in]; a linear computes x @ W.T):
    model.embed_tokens.weight                        [V, D]
    model.layers.{i}.input_layernorm.weight          [D]
    model.layers.{i}.self_attn.q_proj.weight         [H*hd, D]
    model.layers.{i}.self_attn.k_proj.weight         [K*hd, D]
    model.layers.{i}.self_attn.v_proj.weight         [K*hd, D]
    model.layers.{i}.self_attn.o_proj.weight         [D, H*hd]
    model.layers.{i}.post_attention_layernorm.weight [D]
    model.layers.{i}.mlp.gate_proj.weight            [F, D]
    model.layers.{i}.mlp.up_proj.weight              [F, D]
    model.layers.{i}.mlp.down_proj.weight            [D, F]
    model.norm.weight                                [D]
    lm_head.weight                                   [V, D]   (untied)
No biases anywhere.

RMSNorm(x, w) = x * rsqrt(mean(x^2, last dim) + eps) * w.

RoPE (Hugging Face rotate-half convention, NOT interleaved pairs):
    inv_freq[i] = 1 / theta^(2i/hd), i in [0, hd/2)      (computed in float64)
    angle[p, i] = p * inv_freq[i], positions p = 0..T-1 (per sequence)
    cos = cos(cat(angle, angle)), sin = sin(cat(angle, angle))   -> [T, hd]
    rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2])
    q' = q*cos + rotate_half(q)*sin,  k' = k*cos + rotate_half(k)*sin
Applied per head to q and k (not v), after the projections.  q_proj output is
viewed as [T, H, hd] (head-major: feature index = h*hd + d), k/v as [T, K, hd].

Attention: causal softmax(q k^T / sqrt(hd)) v.  GQA/MQA: query head h uses
kv head h // (H/K) (repeat_interleave of the kv heads).  Head outputs are
concatenated back to [T, H*hd] (feature index h*hd + d) and fed to o_proj.

Block:  h   = x + o_proj(attn(input_layernorm(x)))
        n   = post_attention_layernorm(h)
        out = h + down_proj(silu(gate_proj(n)) * up_proj(n))
        silu(z) = z * sigmoid(z)
Model:  x = embed_tokens[tokens]; L blocks; logits = lm_head(norm(x)).
Loss:   mean cross-entropy over all B*T positions, targets given (no ignore
        index, no shifting: logits[b, t] is scored against targets[b, t]).

Golden model files: model/testdata/golden/<variant>.safetensors
    every parameter under its HF name                F32, shape as above
    tokens                                           I32 [B, T]
    targets                                          I32 [B, T]
    logits                                           F32 [B, T, V]
    loss                                             F32 [1]
    grad.<hf name> (d loss / d weight)               F32, same shape as weight
    __metadata__: "config" = JSON string with keys dim, n_layers, n_heads,
        n_kv_heads, head_dim, ffn_dim, vocab_size, norm_eps, rope_theta,
        batch, seq_len; "generator" = "scripts/reference.py";
        "torch" = torch.__version__; "variant" = variant name.
Init (torch.Generator seeded per variant, all drawn in fp32):
    matrices ~ N(0, 1/fan_in) (fan_in = in features = shape[1]),
    embed_tokens ~ N(0, 1), norm weights = 1 + 0.1*N(0, 1),
    tokens, targets ~ uniform integers in [0, V) (independent).
Variants (L=2, V=61, B=2, T=12):
    mha: D=32,  H=4,  K=4,  hd=8,  F=64, eps=1e-5, theta=1e4
    gqa: D=48,  H=6,  K=2,  hd=8,  F=64, eps=1e-6, theta=5e5
    mqa: D=32,  H=4,  K=1,  hd=8,  F=64, eps=1e-5, theta=1e4
    h33: D=132, H=33, K=11, hd=4,  F=48, eps=1e-5, theta=1e4
    h1:  D=16,  H=1,  K=1,  hd=16, F=40, eps=1e-5, theta=1e4

RoPE scaling files: model/testdata/rope/<variant>.safetensors
Same layout as the golden model files, for the RoPE variants of Hugging Face
transformers' modeling_rope_utils (hf_rope_inv_freq: default, linear, dynamic,
yarn, llama3), written from their definitions.  The cos and sin tables are
cos/sin(cat(freqs, freqs)) * attention_factor (yarn's; 1 for the others), so q
and k are both scaled.  Model L=2, D=32, H=2, K=1, hd=16, F=32, V=61, B=1,
T=64; pretrained length 16, so 48 of the 64 positions lie beyond it.
    theta:      rope_theta 1e6, no rope_scaling (a base change)
    linear:     factor 4
    dynamic:    factor 4, HF max_position_embeddings 16 (the base grows at T=64)
    yarn:       factor 4, original_max_position_embeddings 16, defaults
    yarn_betas: factor 4, original 16, beta_fast 8, beta_slow 0.5,
                attention_factor 1.3, rope_theta 100 (a ramp over 3 dimensions)
    llama3:     factor 4, original 16, low_freq_factor 0.5, high_freq_factor 2
__metadata__ adds: "config" is distflash's [model] (max_seq_len, rope_scaling
under its HF key names with original_max_position_embeddings explicit),
"hf_config" the HF fields the table was computed from, "inv_freq" and
"attention_factor" the table itself (JSON).

Document masking: model/testdata/docmask/<variant>.safetensors
The golden model files' layout plus
    doc_id  I32 [B, T]   document of each token (non-decreasing along a sequence)
and "position_reset" (bool) in the config metadata.  Attention is the same
softmax with an explicit [B, T, T] boolean mask built from the ids:
    visible[b, i, j] = doc_id[b, i] == doc_id[b, j] and j <= i
RoPE angles use position t − (first t' with doc_id[b, t'] == doc_id[b, t]) when
position_reset, else t.  Documents (T=16, B=2): sequence 0 has random
boundaries (each position starts a document with probability 1/4), sequence 1
documents starting at 0, 8 and 15 (a one-token document at the end).
    mha_reset:   the mha shape, position_reset
    gqa:         the gqa shape, no position reset
    h33_reset:   the h33 shape, position_reset

Golden attention files: kernels/testdata/attn/<case>.safetensors
The bare attention primitive (no projections, no RoPE), float64 reference:
    q      F32 [Nq, H, hd]
    k      F32 [Nk, K, hd]
    v      F32 [Nk, K, hd]
    q_pos  I32 [Nq]          global token positions of the queries
    k_pos  I32 [Nk]          global token positions of the keys
    do     F32 [Nq, H, hd]   upstream gradient dL/do
    o      F32 [Nq, H, hd]   output
    lse    F32 [H, Nq]       natural-log logsumexp over keys of the scaled,
                             masked scores s[h,i,j] = scale * q[i,h].k[j,kv(h)]
    dq     F32 [Nq, H, hd]   gradients of L = sum(o * do)
    dk     F32 [Nk, K, hd]
    dv     F32 [Nk, K, hd]
    scale = 1/sqrt(hd); kv(h) = h // (H/K); causal mask: query i may attend
    key j iff q_pos[i] >= k_pos[j]; non-causal: every key visible.  Every
    query has at least one visible key in every case.
    __metadata__: "config" = JSON {"n_heads", "n_kv_heads", "head_dim",
        "causal"}; "generator"; "torch"; "case".
Cases (q,k,v,do ~ N(0,1), q additionally multiplied by 2):
    contig_mha:      Nq=Nk=16, H=K=2, hd=8, positions 0..15, causal
    zigzag_gqa:      Nq=Nk=16, H=4, K=2, hd=8, causal, q_pos = k_pos =
                     [0..3, 12..15, 4..7, 8..11]
    cyclic_h33:      H=33, K=3, hd=4, causal, Nq=8 with q_pos 8,10,...,22,
                     Nk=24 with k_pos a seeded shuffle of 0..23
    cross_noncausal: Nq=5, Nk=7, H=3, K=1, hd=6, non-causal,
                     q_pos 0..4, k_pos 0..6 (unused by the mask)

Mixed-precision files: kernels/testdata/half/
convert.safetensors
    x      F32 [N]   float32 inputs (bit patterns matter: NaNs, -0, subnormals)
    bf16   I32 [N]   x.to(torch.bfloat16).view(torch.int16) as unsigned 16-bit
    fp16   I32 [N]   x.to(torch.float16).view(torch.int16) as unsigned 16-bit
    Inputs: hand-picked edges (ties of both parities and their neighbours,
    max finite, overflow, fp16 subnormals and their boundaries, underflow,
    -0, +-Inf, NaNs, float32 subnormals), tie patterns at random exponents,
    random values near float32's largest and smallest (bf16 overflow and
    underflow), and 5000 random values (random bit patterns, and exponents
    around the fp16 range), every value also negated.
matmul_<case>.safetensors
    a      F32       op(A) stored [m, k], or [k, m] when trans_a
    b      F32       op(B) stored [k, n], or [n, k] when trans_b
    c0     F32 [m, n] C before the call
    c      F32 [m, n] round(op(A)) @ round(op(B)) + beta * c0 in float64, where
                     round is .to(bfloat16 / float16) (the precision); Inf
                     where an fp16 operand overflowed
    scale  F32 [m, n] |round(op(A))| @ |round(op(B))| + |beta * c0|, the
                     error scale of a float32-accumulated product
    __metadata__: "config" = JSON {"m", "n", "k", "trans_a", "trans_b",
        "beta", "precision"}; "generator"; "torch"; "case".

Hugging Face fixtures: weights/testdata/hf/
    llama-sharded/  config.json (LlamaConfig keys), model.safetensors.index.json,
                    model-00001-of-00002.safetensors (F32: embed_tokens, layer 0),
                    model-00002-of-00002.safetensors (BF16: layer 1, norm, lm_head)
                    D=32, L=2, H=4, K=2, hd=8, F=64, V=256, eps=1e-5, theta=1e4
    llama-tied/     config.json (tie_word_embeddings true, head_dim given),
                    model.safetensors (F16, no lm_head, plus a rotary_emb.inv_freq
                    buffer that loaders must skip)
                    D=48, L=2, H=6, K=2, hd=8, F=96, V=256, eps=1e-6, theta=5e5
    docs/doc<i>.txt five UTF-8 documents (44, 107, 78, 1, 45 bytes)
    expected.json   per model: the shape, per-tensor checksums of the stored
                    values (sum, sum of squares, first 3 values, in float64) and,
                    for (seq_len, samples) in (40, 4), (512, 5): loss, perplexity,
                    bits_per_byte, tokens, bytes and per-document loss sums.
    permute.safetensors  meta_q/meta_k (Meta's interleaved-RoPE row order) and
                    hf_q/hf_k (the permute of transformers'
                    convert_llama_weights_to_hf.py); the script asserts that both
                    give the same attention scores under their own RoPE.
Weights are drawn as for the golden files (init_params) and rounded to the
shard's dtype; the reference computes in float64 with exactly the stored values.
Evaluation: token ids are the UTF-8 bytes with bos_token_id = 1 prepended; each
document is cut to seq_len + 1 tokens and every token after the first is
predicted; loss = summed cross-entropy / predicted tokens, bits per byte =
summed cross-entropy / ln 2 / predicted bytes (one byte per token).

Greedy decoding: weights/testdata/hf/generate.json
For each fixture (llama-sharded, llama-tied, mistral-window) and each prompt of
GEN_PROMPTS (the last one 52 bytes, so mistral-window's 16-token window matters):
prompt_ids = [bos_token_id] + UTF-8 bytes (no BOS, recorded as bos -1, when the
config's bos_token_id is null or absent); then GEN_NEW_TOKENS (24) tokens, each the
argmax (ties: the lowest id) of the last position's logits of a full float64
forward over the whole sequence so far (no KV cache; positions 0..len-1; the
sliding window on every layer where config.json has one), with no stop at EOS.
Per case: prompt, bos, prompt_ids, tokens, margins (top-1 minus top-2 logit of
each step), min_margin and first_logits (all V float64 logits of the last prompt
position, i.e. of step 0).  Self-check: one forward over prompt_ids + tokens[:-1]
gives the same argmax at every generated position.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"reference.py needs PyTorch and numpy ({e}): apt-get install python3-torch python3-numpy "
             "and run /usr/bin/python3, or run the interpreter scripts/install_torch.sh prints")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(REPO_ROOT, "model", "testdata", "golden")
ATTN_DIR = os.path.join(REPO_ROOT, "kernels", "testdata", "attn")


# --------------------------------------------------------------------------
# safetensors writer

_DTYPES = {np.dtype("float32"): "F32", np.dtype("int32"): "I32"}
# Half-precision torch tensors are written as their raw 16-bit patterns (numpy has no bf16).
_HALF = {torch.bfloat16: "BF16", torch.float16: "F16"}


def save_safetensors(path, tensors, metadata):
    """tensors: list of (name, array) in the order they are laid out."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name, arr in tensors:
        if name in header:
            raise ValueError("duplicate tensor " + name)
        if isinstance(arr, torch.Tensor) and arr.dtype in _HALF:
            dtype = _HALF[arr.dtype]
            bits = arr.detach().cpu().contiguous().view(torch.int16).numpy()
            data = bits.astype("<i2", copy=False).tobytes()
            arr = bits
        else:
            if isinstance(arr, torch.Tensor):
                arr = arr.detach().cpu().numpy()
            arr = np.asarray(arr)
            if arr.dtype not in _DTYPES:
                raise ValueError("%s: unsupported dtype %s" % (name, arr.dtype))
            dtype = _DTYPES[arr.dtype]
            data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": [int(s) for s in arr.shape],
            "data_offsets": [off, off + len(data)],
        }
        blobs.append(data)
        off += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """Minimal reader used for self-checks: returns (dict name->ndarray, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":  # the top 16 bits of a float32
            bits = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(info["shape"])
            continue
        dt = {"F32": "<f4", "I32": "<i4", "F16": "<f2"}[info["dtype"]]
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(info["shape"])
    return out, meta


# --------------------------------------------------------------------------
# model (dtype-generic: float64 for golden, float32 for bench)

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, hd, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)            # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)       # [T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    # x: [B, nh, T, hd]; cos/sin: [T, hd]
    return x * cos + rotate_half(x) * sin


def causal_attention(q, k, v):
    """q: [B, H, T, hd], k/v: [B, K, T, hd]. Plain-op causal attention with GQA."""
    H, K = q.shape[1], k.shape[1]
    if K != H:
        k = k.repeat_interleave(H // K, dim=1)
        v = v.repeat_interleave(H // K, dim=1)
    T, hd = q.shape[2], q.shape[3]
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def masked_attention(q, k, v, visible):
    """causal_attention with an explicit mask: visible [B, T, T] says which keys (last axis)
    each query sees."""
    H, K = q.shape[1], k.shape[1]
    if K != H:
        k = k.repeat_interleave(H // K, dim=1)
        v = v.repeat_interleave(H // K, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[3])
    s = s.masked_fill(~visible[:, None], float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def param_shapes(c):
    D, H, K, hd, Fd, V = c["dim"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["ffn_dim"], c["vocab_size"]
    shapes = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["n_layers"]):
        p = "model.layers.%d." % i
        shapes += [
            (p + "input_layernorm.weight", (D,)),
            (p + "self_attn.q_proj.weight", (H * hd, D)),
            (p + "self_attn.k_proj.weight", (K * hd, D)),
            (p + "self_attn.v_proj.weight", (K * hd, D)),
            (p + "self_attn.o_proj.weight", (D, H * hd)),
            (p + "post_attention_layernorm.weight", (D,)),
            (p + "mlp.gate_proj.weight", (Fd, D)),
            (p + "mlp.up_proj.weight", (Fd, D)),
            (p + "mlp.down_proj.weight", (D, Fd)),
        ]
    shapes += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    return shapes


def init_params(c, gen):
    """fp32 parameters, drawn in param_shapes order from gen."""
    params = {}
    for name, shape in param_shapes(c):
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif name == "model.embed_tokens.weight":
            w = torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            w = torch.randn(shape, generator=gen, dtype=torch.float32) / math.sqrt(shape[1])
        params[name] = w.to(torch.float32).contiguous()
    return params


def forward(c, P, tokens, attn_fn=causal_attention, rope=None, layer_attn=None):
    """P: dict name -> tensor (any float dtype). tokens: int64 [B, T]. Returns logits [B, T, V].
    rope: (cos, sin) [T, hd] of a scaled RoPE (hf_rope_cos_sin), or [B, 1, T, hd] with
    positions of each sequence's own; None is plain RoPE with c["rope_theta"]. layer_attn, when
    given, returns layer i's attention function (else attn_fn on every layer)."""
    B, T = tokens.shape
    H, K, hd, eps = c["n_heads"], c["n_kv_heads"], c["head_dim"], c["norm_eps"]
    dtype = P["model.embed_tokens.weight"].dtype
    cos, sin = rope if rope is not None else rope_cos_sin(T, hd, c["rope_theta"], dtype)
    x = P["model.embed_tokens.weight"][tokens]                     # [B, T, D]
    for i in range(c["n_layers"]):
        p = "model.layers.%d." % i
        n = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = (n @ P[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (n @ P[p + "self_attn.k_proj.weight"].T).view(B, T, K, hd).transpose(1, 2)
        v = (n @ P[p + "self_attn.v_proj.weight"].T).view(B, T, K, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        a = (layer_attn(i) if layer_attn else attn_fn)(q, k, v)     # [B, H, T, hd]
        a = a.transpose(1, 2).reshape(B, T, H * hd)
        h = x + a @ P[p + "self_attn.o_proj.weight"].T
        n = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = n @ P[p + "mlp.gate_proj.weight"].T
        u = n @ P[p + "mlp.up_proj.weight"].T
        x = h + (F.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, P["model.norm.weight"], eps)
    return x @ P["lm_head.weight"].T


def loss_fn(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean")


# --------------------------------------------------------------------------
# golden model files

BASE = dict(n_layers=2, vocab_size=61, norm_eps=1e-5, rope_theta=10000.0, batch=2, seq_len=12)

VARIANTS = [
    ("mha", dict(dim=32, n_heads=4, n_kv_heads=4, head_dim=8, ffn_dim=64), 1001),
    ("gqa", dict(dim=48, n_heads=6, n_kv_heads=2, head_dim=8, ffn_dim=64,
                 rope_theta=500000.0, norm_eps=1e-6), 1002),
    ("mqa", dict(dim=32, n_heads=4, n_kv_heads=1, head_dim=8, ffn_dim=64), 1003),
    ("h33", dict(dim=132, n_heads=33, n_kv_heads=11, head_dim=4, ffn_dim=48), 1004),
    ("h1", dict(dim=16, n_heads=1, n_kv_heads=1, head_dim=16, ffn_dim=40), 1005),
]

CONFIG_KEYS = ["dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
               "vocab_size", "norm_eps", "rope_theta", "batch", "seq_len"]


def make_config(over):
    c = dict(BASE)
    c.update(over)
    return {k: c[k] for k in CONFIG_KEYS}


def gen_variant(name, over, seed):
    c = make_config(over)
    assert c["n_heads"] % c["n_kv_heads"] == 0
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    P64 = {k: v.to(torch.float64).requires_grad_(True) for k, v in P32.items()}
    logits = forward(c, P64, tokens)
    loss = loss_fn(logits, targets)
    loss.backward()

    tensors = [(k, P32[k].numpy()) for k, _ in param_shapes(c)]
    tensors.append(("tokens", tokens.to(torch.int32).numpy()))
    tensors.append(("targets", targets.to(torch.int32).numpy()))
    tensors.append(("logits", logits.detach().to(torch.float32).numpy()))
    tensors.append(("loss", loss.detach().to(torch.float32).reshape(1).numpy()))
    for k, _ in param_shapes(c):
        tensors.append(("grad." + k, P64[k].grad.to(torch.float32).numpy()))
    meta = {
        "config": json.dumps(c, separators=(",", ":")),
        "generator": "scripts/reference.py",
        "torch": torch.__version__,
        "variant": name,
    }
    path = os.path.join(GOLDEN_DIR, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path, c, float(loss), P64, tokens, targets


# --------------------------------------------------------------------------
# document masking

DOCMASK_DIR = os.path.join(REPO_ROOT, "model", "testdata", "docmask")

DOCMASK_VARIANTS = [
    ("mha_reset", dict(dim=32, n_heads=4, n_kv_heads=4, head_dim=8, ffn_dim=64, seq_len=16), True, 2001),
    ("gqa", dict(dim=48, n_heads=6, n_kv_heads=2, head_dim=8, ffn_dim=64, seq_len=16,
                 rope_theta=500000.0, norm_eps=1e-6), False, 2002),
    ("h33_reset", dict(dim=132, n_heads=33, n_kv_heads=11, head_dim=4, ffn_dim=48, seq_len=16), True, 2003),
]


def forward_docs(c, P, tokens, doc_id, reset):
    """forward() with an explicit block-diagonal causal mask from doc_id [B, T] and, when
    reset, RoPE positions counted from each document's first token."""
    B, T = tokens.shape
    hd = c["head_dim"]
    dtype = P["model.embed_tokens.weight"].dtype
    t = torch.arange(T)
    same = doc_id[:, :, None] == doc_id[:, None, :]                 # [B, T, T]
    visible = same & (t[None, None, :] <= t[None, :, None])      # key j <= query i
    if reset:
        first = torch.stack([torch.tensor([int((doc_id[b] == doc_id[b, i]).nonzero()[0]) for i in range(T)])
                             for b in range(B)])
        pos = (t[None, :] - first).to(torch.float64)                 # [B, T]
    else:
        pos = t[None, :].expand(B, T).to(torch.float64)
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos[:, :, None] * inv_freq[None, None, :]                  # [B, T, hd/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]                     # [B, 1, T, hd]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return forward(c, P, tokens, attn_fn=lambda q, k, v: masked_attention(q, k, v, visible), rope=(cos, sin))


def gen_docmask_variant(name, over, reset, seed):
    c = make_config(over)
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    starts = torch.rand((T,), generator=gen) < 0.25
    doc_id = torch.zeros((B, T), dtype=torch.int64)
    doc_id[0] = torch.cumsum(starts.to(torch.int64), 0) - int(starts[0])
    doc_id[1] = torch.tensor([0 if t < 8 else (1 if t < 15 else 2) for t in range(T)])

    P64 = {k: v.to(torch.float64).requires_grad_(True) for k, v in P32.items()}
    logits = forward_docs(c, P64, tokens, doc_id, reset)
    loss = loss_fn(logits, targets)
    loss.backward()
    # the mask matters: without it the loss differs
    with torch.no_grad():
        plain = float(loss_fn(forward(c, P64, tokens), targets))
        assert abs(plain - float(loss)) > 1e-4, (name, plain, float(loss))

    tensors = [(k, P32[k].numpy()) for k, _ in param_shapes(c)]
    tensors.append(("tokens", tokens.to(torch.int32).numpy()))
    tensors.append(("targets", targets.to(torch.int32).numpy()))
    tensors.append(("doc_id", doc_id.to(torch.int32).numpy()))
    tensors.append(("logits", logits.detach().to(torch.float32).numpy()))
    tensors.append(("loss", loss.detach().to(torch.float32).reshape(1).numpy()))
    for k, _ in param_shapes(c):
        tensors.append(("grad." + k, P64[k].grad.to(torch.float32).numpy()))
    cc = dict(c)
    cc["position_reset"] = reset
    meta = {
        "config": json.dumps(cc, separators=(",", ":")),
        "generator": "scripts/reference.py",
        "torch": torch.__version__,
        "variant": name,
    }
    path = os.path.join(DOCMASK_DIR, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path, float(loss), plain


WINDOW_DIR = os.path.join(REPO_ROOT, "model", "testdata", "window")

# name, config overrides, window W, windowed layers (None: all), documents, seed
WINDOW_VARIANTS = [
    ("mha_w3", dict(dim=32, n_heads=4, n_kv_heads=4, head_dim=8, ffn_dim=64, seq_len=16), 3, None, False, 3001),
    ("gqa_w5_docs", dict(dim=48, n_heads=6, n_kv_heads=2, head_dim=8, ffn_dim=64, seq_len=16,
                         rope_theta=500000.0, norm_eps=1e-6), 5, None, True, 3002),
    ("h33_w4_layer0", dict(dim=132, n_heads=33, n_kv_heads=11, head_dim=4, ffn_dim=48, seq_len=16), 4, [0], False, 3003),
]


def forward_window(c, P, tokens, window, layers, doc_id):
    """forward() with an explicit banded causal mask: a key at j is visible to the query at i
    iff i - window < j <= i (and, with doc_id [B, T], in the same document), on the layers
    listed (all when None); the other layers attend to the whole causal prefix."""
    B, T = tokens.shape
    t = torch.arange(T)
    causal = t[None, :] <= t[:, None]                                # [T(i), T(j)]: j <= i
    band = causal & (t[:, None] - t[None, :] < window)
    same = torch.ones((B, T, T), dtype=torch.bool) if doc_id is None else doc_id[:, :, None] == doc_id[:, None, :]
    masks = {True: band[None] & same, False: causal[None] & same}  # [B, T, T]

    def layer_attn(i):
        visible = masks[layers is None or i in layers]
        return lambda q, k, v: masked_attention(q, k, v, visible)

    return forward(c, P, tokens, layer_attn=layer_attn)


def gen_window_variant(name, over, window, layers, docs, seed):
    c = make_config(over)
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    doc_id = None
    if docs:
        starts = torch.rand((T,), generator=gen) < 0.2
        doc_id = torch.zeros((B, T), dtype=torch.int64)
        doc_id[0] = torch.cumsum(starts.to(torch.int64), 0) - int(starts[0])
        doc_id[1] = torch.tensor([0 if t < 9 else 1 for t in range(T)])

    P64 = {k: v.to(torch.float64).requires_grad_(True) for k, v in P32.items()}
    logits = forward_window(c, P64, tokens, window, layers, doc_id)
    loss = loss_fn(logits, targets)
    loss.backward()
    with torch.no_grad():  # the window matters: without it the loss differs
        plain = float(loss_fn(forward_window(c, P64, tokens, T + 1, layers, doc_id), targets))
        assert abs(plain - float(loss)) > 1e-4, (name, plain, float(loss))

    tensors = [(k, P32[k].numpy()) for k, _ in param_shapes(c)]
    tensors.append(("tokens", tokens.to(torch.int32).numpy()))
    tensors.append(("targets", targets.to(torch.int32).numpy()))
    if doc_id is not None:
        tensors.append(("doc_id", doc_id.to(torch.int32).numpy()))
    tensors.append(("logits", logits.detach().to(torch.float32).numpy()))
    tensors.append(("loss", loss.detach().to(torch.float32).reshape(1).numpy()))
    for k, _ in param_shapes(c):
        tensors.append(("grad." + k, P64[k].grad.to(torch.float32).numpy()))
    cc = dict(c)
    cc["sliding_window"] = window
    cc["sliding_window_layers"] = layers or []
    meta = {
        "config": json.dumps(cc, separators=(",", ":")),
        "generator": "scripts/reference.py",
        "torch": torch.__version__,
        "variant": name,
    }
    path = os.path.join(WINDOW_DIR, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path, float(loss), plain


def cmd_window(_args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(WINDOW_DIR, exist_ok=True)
    for name, over, window, layers, docs, seed in WINDOW_VARIANTS:
        path, loss, plain = gen_window_variant(name, over, window, layers, docs, seed)
        print("%-60s %8d bytes  loss=%.6f  (no window %.6f)" % (
            os.path.relpath(path, REPO_ROOT), os.path.getsize(path), loss, plain))


def cmd_docmask(_args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(DOCMASK_DIR, exist_ok=True)
    for name, over, reset, seed in DOCMASK_VARIANTS:
        path, loss, plain = gen_docmask_variant(name, over, reset, seed)
        print("%-60s %8d bytes  loss=%.6f  (unmasked %.6f)" % (
            os.path.relpath(path, REPO_ROOT), os.path.getsize(path), loss, plain))


# --------------------------------------------------------------------------
# golden attention files

def attention_ref(q, k, v, q_pos, k_pos, causal):
    """q: [Nq, H, hd], k/v: [Nk, K, hd] float64. Returns o [Nq,H,hd], lse [H,Nq]."""
    Nq, H, hd = q.shape
    K = k.shape[1]
    kk = k.repeat_interleave(H // K, dim=1)        # [Nk, H, hd]
    vv = v.repeat_interleave(H // K, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, kk) / math.sqrt(hd)   # [H, Nq, Nk]
    if causal:
        allowed = q_pos[:, None] >= k_pos[None, :]            # [Nq, Nk]
        assert bool(allowed.any(dim=1).all()), "a query has no visible key"
        s = s.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                           # [H, Nq]
    p = torch.exp(s - lse[..., None])
    o = torch.einsum("hij,jhd->ihd", p, vv)
    return o, lse


ATTN_CASES = [
    # name, Nq, Nk, H, K, hd, causal, seed
    ("contig_mha", 16, 16, 2, 2, 8, True, 2001),
    ("zigzag_gqa", 16, 16, 4, 2, 8, True, 2002),
    ("cyclic_h33", 8, 24, 33, 3, 4, True, 2003),
    ("cross_noncausal", 5, 7, 3, 1, 6, False, 2004),
]


def gen_attn_case(name, Nq, Nk, H, K, hd, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn(Nq, H, hd, generator=gen, dtype=torch.float32)
    k = torch.randn(Nk, K, hd, generator=gen, dtype=torch.float32)
    v = torch.randn(Nk, K, hd, generator=gen, dtype=torch.float32)
    do = torch.randn(Nq, H, hd, generator=gen, dtype=torch.float32)
    if name == "zigzag_gqa":
        pos = torch.cat([torch.arange(0, 4), torch.arange(12, 16), torch.arange(4, 8), torch.arange(8, 12)])
        q_pos, k_pos = pos.clone(), pos.clone()
    elif name == "cyclic_h33":
        q_pos = torch.arange(8, 24, 2)
        k_pos = torch.randperm(Nk, generator=gen)
    else:
        q_pos = torch.arange(Nq)
        k_pos = torch.arange(Nk)
    assert q_pos.numel() == Nq and k_pos.numel() == Nk

    q64, k64, v64 = (t.to(torch.float64).requires_grad_(True) for t in (q, k, v))
    o, lse = attention_ref(q64, k64, v64, q_pos, k_pos, causal)
    (o * do.to(torch.float64)).sum().backward()

    f32 = lambda t: t.detach().to(torch.float32).numpy()
    tensors = [
        ("q", q.numpy()), ("k", k.numpy()), ("v", v.numpy()),
        ("q_pos", q_pos.to(torch.int32).numpy()), ("k_pos", k_pos.to(torch.int32).numpy()),
        ("do", do.numpy()),
        ("o", f32(o)), ("lse", f32(lse)),
        ("dq", f32(q64.grad)), ("dk", f32(k64.grad)), ("dv", f32(v64.grad)),
    ]
    cfg = {"n_heads": H, "n_kv_heads": K, "head_dim": hd, "causal": causal}
    meta = {
        "config": json.dumps(cfg, separators=(",", ":")),
        "generator": "scripts/reference.py",
        "torch": torch.__version__,
        "case": name,
    }
    path = os.path.join(ATTN_DIR, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path


# --------------------------------------------------------------------------
# self-checks (run as part of `golden`)

def _check_model_variant(path, c, loss, P64, tokens, targets):
    t, meta = load_safetensors(path)
    assert json.loads(meta["config"]) == c
    # Gradient check of a few entries by central finite differences in fp64.
    eps = 1e-6
    with torch.no_grad():
        for name in ["model.norm.weight", "model.layers.0.self_attn.k_proj.weight",
                     "model.layers.1.input_layernorm.weight", "model.embed_tokens.weight"]:
            w = P64[name]
            flat = w.view(-1)
            g = t["grad." + name].reshape(-1)
            idx = int(tokens[0, 0]) * c["dim"] if name == "model.embed_tokens.weight" else 0
            for j in (idx, idx + 1):
                old = float(flat[j])
                flat[j] = old + eps
                lp = float(loss_fn(forward(c, P64, tokens), targets))
                flat[j] = old - eps
                lm = float(loss_fn(forward(c, P64, tokens), targets))
                flat[j] = old
                fd = (lp - lm) / (2 * eps)
                assert abs(fd - float(g[j])) <= 1e-5 * max(1.0, abs(fd)), (name, j, fd, float(g[j]))
    # Cross-check the GQA path against an explicit per-head loop.
    with torch.no_grad():
        def loop_attn(q, k, v):
            H, K, T, hd = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
            outs = []
            for h in range(H):
                kv = h // (H // K)
                s = q[:, h] @ k[:, kv].transpose(-1, -2) / math.sqrt(hd)
                s = s + torch.full((T, T), float("-inf"), dtype=q.dtype).triu(1)
                outs.append(torch.softmax(s, -1) @ v[:, kv])
            return torch.stack(outs, 1)
        l2 = forward(c, P64, tokens, attn_fn=loop_attn)
        assert torch.allclose(l2.float(), torch.from_numpy(t["logits"].copy()), atol=1e-5)
    assert abs(float(t["loss"][0]) - loss) < 1e-5


def cmd_golden(_args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    os.makedirs(ATTN_DIR, exist_ok=True)
    for name, over, seed in VARIANTS:
        path, c, loss, P64, tokens, targets = gen_variant(name, over, seed)
        _check_model_variant(path, c, loss, P64, tokens, targets)
        print("%-60s %8d bytes  loss=%.6f  (ln V = %.4f)" % (
            os.path.relpath(path, REPO_ROOT), os.path.getsize(path), loss, math.log(c["vocab_size"])))
    for case in ATTN_CASES:
        path = gen_attn_case(*case)
        print("%-60s %8d bytes" % (os.path.relpath(path, REPO_ROOT), os.path.getsize(path)))


# --------------------------------------------------------------------------
# RoPE scaling files

ROPE_DIR = os.path.join(REPO_ROOT, "model", "testdata", "rope")


def hf_rope_inv_freq(hf, seq_len):
    """(inv_freq [hd/2] float64, attention_factor) of RoPE as Hugging Face transformers'
    modeling_rope_utils defines each rope_type, for a LlamaConfig-like dict hf (rope_theta,
    head_dim, max_position_embeddings, rope_scaling) and a forward whose max(position_ids) + 1
    is seq_len. Computed in float64 (transformers uses float32)."""
    base, dim = hf["rope_theta"], hf["head_dim"]
    rs = hf.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    expo = torch.arange(0, dim, 2, dtype=torch.float64) / dim

    def plain(b):
        return 1.0 / (b ** expo)

    if kind == "default":
        return plain(base), 1.0
    factor = rs["factor"]
    if kind == "linear":
        # Position interpolation: positions / factor, i.e. every frequency / factor.
        return plain(base) / factor, 1.0
    if kind == "dynamic":
        # NTK-aware: the base grows with the sequence beyond max_position_embeddings (which
        # transformers reads as the pretrained length for this type).
        L0 = hf["max_position_embeddings"]
        L = max(seq_len, L0)
        return plain(base * ((factor * L / L0) - (factor - 1)) ** (dim / (dim - 2))), 1.0
    if kind == "yarn":
        L0 = rs.get("original_max_position_embeddings", hf["max_position_embeddings"])
        att = rs.get("attention_factor")
        if att is None:
            att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def turns_dim(turns):  # the dimension whose frequency turns `turns` times over L0
            return dim * math.log(L0 / (turns * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(turns_dim(beta_fast)), 0)
        hi = min(math.ceil(turns_dim(beta_slow)), dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        pos_freqs = base ** expo
        extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        keep = 1 - ramp  # share of the extrapolated (unchanged) frequency
        return interpolated * (1 - keep) + extrapolated * keep, att
    if kind == "llama3":
        inv = plain(base)
        L0 = rs["original_max_position_embeddings"]
        lo_f, hi_f = rs["low_freq_factor"], rs["high_freq_factor"]
        wave = 2 * math.pi / inv
        scaled = torch.where(wave > L0 / lo_f, inv / factor, inv)
        smooth = (L0 / wave - lo_f) / (hi_f - lo_f)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wave < L0 / hi_f) & ~(wave > L0 / lo_f)
        return torch.where(medium, smoothed, scaled), 1.0
    raise ValueError("unknown rope_type " + kind)


def hf_rope_cos_sin(hf, T, dtype):
    """cos, sin [T, hd] at positions 0..T-1: HF multiplies both by the attention factor."""
    inv, att = hf_rope_inv_freq(hf, T)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * att).to(dtype), (emb.sin() * att).to(dtype)


ROPE_BASE = dict(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=32,
                 vocab_size=61, norm_eps=1e-5, rope_theta=10000.0, batch=1, seq_len=64)

# (name, overrides of ROPE_BASE, HF rope_scaling, HF max_position_embeddings, seed). The
# pretrained length is 16 and the sequences 64 long, so 3/4 of the positions lie beyond it.
# max_position_embeddings is what a config.json must say for transformers to compute this
# table: the pretrained length for dynamic (which reads it as such), pretrained × factor for
# yarn (transformers 4.4x-4.5x take factor = max_position_embeddings /
# original_max_position_embeddings when the latter is set; later versions take factor).
ROPE_VARIANTS = [
    ("theta", dict(rope_theta=1e6), None, 64, 2001),
    ("linear", {}, {"rope_type": "linear", "factor": 4.0}, 64, 2002),
    ("dynamic", {}, {"rope_type": "dynamic", "factor": 4.0}, 16, 2003),
    ("yarn", {}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 64, 2004),
    ("yarn_betas", dict(rope_theta=100.0),
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
      "beta_fast": 8.0, "beta_slow": 0.5, "attention_factor": 1.3}, 64, 2005),
    ("llama3", {}, {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 16,
                    "low_freq_factor": 0.5, "high_freq_factor": 2.0}, 64, 2006),
]


def gen_rope_variant(name, over, rope_scaling, max_pos, seed):
    c = dict(ROPE_BASE)
    c.update(over)
    hf = {"rope_theta": c["rope_theta"], "head_dim": c["head_dim"], "max_position_embeddings": max_pos,
          "rope_scaling": rope_scaling}
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    P64 = {k: v.to(torch.float64).requires_grad_(True) for k, v in P32.items()}
    rope = hf_rope_cos_sin(hf, T, torch.float64)
    logits = forward(c, P64, tokens, rope=rope)
    loss = loss_fn(logits, targets)
    loss.backward()

    # distflash's [model] of the same model: max_seq_len is the sequence length, and
    # original_max_position_embeddings is explicit (16) for the types that read it.
    dc = dict(c)
    dc["max_seq_len"] = T
    if rope_scaling is not None:
        dc["rope_scaling"] = dict(rope_scaling)
        if rope_scaling["rope_type"] == "dynamic":
            dc["rope_scaling"]["original_max_position_embeddings"] = max_pos
    inv, att = hf_rope_inv_freq(hf, T)
    tensors = [(k, P32[k].numpy()) for k, _ in param_shapes(c)]
    tensors.append(("tokens", tokens.to(torch.int32).numpy()))
    tensors.append(("targets", targets.to(torch.int32).numpy()))
    tensors.append(("logits", logits.detach().to(torch.float32).numpy()))
    tensors.append(("loss", loss.detach().to(torch.float32).reshape(1).numpy()))
    for k, _ in param_shapes(c):
        tensors.append(("grad." + k, P64[k].grad.to(torch.float32).numpy()))
    meta = {
        "config": json.dumps(dc, separators=(",", ":"), sort_keys=True),
        "hf_config": json.dumps(hf, separators=(",", ":"), sort_keys=True),
        "inv_freq": json.dumps([float(x) for x in inv]),
        "attention_factor": repr(float(att)),
        "generator": "scripts/reference.py",
        "torch": torch.__version__,
        "variant": name,
    }
    os.makedirs(ROPE_DIR, exist_ok=True)
    path = os.path.join(ROPE_DIR, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path, c, hf, float(loss)


def _check_rope_definitions():
    """Properties of the definitions above that do not restate them."""
    hf = {"rope_theta": 10000.0, "head_dim": 16, "max_position_embeddings": 16, "rope_scaling": None}
    plain, _ = hf_rope_inv_freq(hf, 64)
    # linear is position interpolation: angle(p) = angle_plain(p / factor).
    lin, _ = hf_rope_inv_freq(dict(hf, rope_scaling={"rope_type": "linear", "factor": 4.0}), 64)
    p = torch.arange(64, dtype=torch.float64)
    assert torch.allclose(torch.outer(p, lin), torch.outer(p / 4, plain), rtol=1e-15, atol=0)
    # dynamic is plain RoPE up to the pretrained length, a larger base (lower frequencies) past it.
    dyn = dict(hf, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    assert torch.allclose(hf_rope_inv_freq(dyn, 16)[0], plain, rtol=1e-15, atol=0)
    longer = hf_rope_inv_freq(dyn, 64)[0]
    assert longer[0] == plain[0] and bool((longer[1:] < plain[1:]).all())
    # yarn's extremes: the fastest frequency kept, the slowest divided by factor; the default
    # attention factor 0.1 ln 4 + 1.
    y, att = hf_rope_inv_freq(dict(hf, rope_scaling={"rope_type": "yarn", "factor": 4.0}), 64)
    assert y[0] == plain[0] and abs(float(y[-1] / plain[-1]) - 0.25) < 1e-15
    assert abs(att - (0.1 * math.log(4) + 1)) < 1e-15
    # llama3: wavelengths below 16/2 kept, above 16/0.5 divided by 4, in between in (1/4, 1).
    l3, _ = hf_rope_inv_freq(dict(hf, rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                                    "original_max_position_embeddings": 16,
                                                    "low_freq_factor": 0.5, "high_freq_factor": 2.0}), 64)
    wave = 2 * math.pi / plain
    r = l3 / plain
    assert bool((r[wave < 8] == 1).all()) and bool((r[wave > 32] == 0.25).all())
    mid = (wave >= 8) & (wave <= 32)
    assert bool(mid.any()) and bool(((r[mid] > 0.25) & (r[mid] < 1)).all())


def cmd_rope(_args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    _check_rope_definitions()
    for v in ROPE_VARIANTS:
        path, c, hf, loss = gen_rope_variant(*v)
        inv, att = hf_rope_inv_freq(hf, c["seq_len"])
        print("%-45s %7d bytes  loss=%.6f  attention_factor=%.4f  inv_freq[-1]=%.4g" % (
            os.path.relpath(path, REPO_ROOT), os.path.getsize(path), loss, att, float(inv[-1])))


# --------------------------------------------------------------------------
# mixed-precision files

HALF_DIR = os.path.join(REPO_ROOT, "kernels", "testdata", "half")


def _f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _half_bits(x, dtype):
    return (x.to(dtype).view(torch.int16).to(torch.int32) & 0xFFFF).numpy()


def half_inputs():
    """float32 bit patterns for the conversion vector (see the module docstring)."""
    edges = [
        0x00000000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # bf16 ties 1+2^-8
        0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001, 0x3F802FFF, 0x3F803001,  # fp16 ties 1+2^-11
        0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F7E8000,              # bf16 max, overflow
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,              # 65504 .. 65536
        0x477FD000, 0x477FB000, 0x47C35000,                                      # ties below max, 1e5
        0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33C00000, 0x34200000,  # 2^-24, 2^-25, 1.5, 2.5 *2^-24
        0x387FC000, 0x387FE000, 0x387FDFFF, 0x387FE001, 0x38800000, 0x38801000,  # around 2^-14
        0x38000000, 0x35000000, 0x37800000, 0x387FFFFF, 0x34400000, 0x34A00000,  # subnormal grid
        0x2EDBE6FF, 0x0DA24260, 0x00000001, 0x00400000, 0x007FFFFF, 0x00008000,  # underflow, fp32 subnormals
        0x00018000, 0x00808000, 0x00818000,                                      # bf16 subnormal ties
        0x7F800000, 0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7FC00001,  # Inf, NaNs
        0x7F802000, 0x7FE01234,
        0x40490FDB, 0x3DCCCCCD, 0x42F6E979, 0x461C4000, 0x3EAAAAAB,              # pi, 0.1, 123.456, 1e4, 1/3
    ]
    rng = np.random.default_rng(3001)
    ties = []
    for _ in range(64):
        e = int(rng.integers(100, 151))
        hi = int(rng.integers(0, 1 << 6)) << 17
        for par in (0, 1):
            for low in (0x7FFF, 0x8000, 0x8001):
                ties.append((e << 23) | hi | (par << 16) | low)
        hi = int(rng.integers(0, 1 << 9)) << 14
        for par in (0, 1):
            for low in (0xFFF, 0x1000, 0x1001):
                ties.append((e << 23) | hi | (par << 13) | low)
    raw = rng.integers(0, 1 << 32, size=2000, dtype=np.uint64).astype(np.uint32)
    exps = rng.integers(127 - 28, 127 + 18, size=3000, dtype=np.uint64).astype(np.uint32)
    mant = rng.integers(0, 1 << 23, size=3000, dtype=np.uint64).astype(np.uint32)
    near = (exps << 23) | mant
    # bf16 keeps float32's exponent range: its overflow and underflow happen at the ends.
    top = (254 << 23) | rng.integers(0x7F0000, 0x800000, size=50, dtype=np.uint64).astype(np.uint32)
    tiny = rng.integers(1, 1 << 17, size=50, dtype=np.uint64).astype(np.uint32)
    pos = np.concatenate([np.array(edges + ties, dtype=np.uint32), top, tiny, raw & 0x7FFFFFFF, near])
    return np.concatenate([pos, pos | 0x80000000]).astype(np.uint32)


def gen_half_convert():
    bits = half_inputs()
    x = torch.from_numpy(_f32(bits).copy())
    b16, f16 = _half_bits(x, torch.bfloat16), _half_bits(x, torch.float16)
    # Self-check the hand-picked expectations that the Go tests also rely on.
    want = {0x3F808000: (0x3F80, None), 0x3F818000: (0x3F82, None), 0x7F7F8000: (0x7F80, 0x7C00),
            0x477FEFFF: (None, 0x7BFF), 0x477FF000: (None, 0x7C00), 0x33000000: (None, 0x0000),
            0x33000001: (None, 0x0001), 0x33C00000: (None, 0x0002), 0x34200000: (None, 0x0002),
            0x387FE000: (None, 0x0400), 0x3F801000: (None, 0x3C00), 0x3F803000: (None, 0x3C02)}
    index = {int(u): i for i, u in enumerate(bits)}
    for u, (wb, wf) in want.items():
        i = index[u]
        assert wb is None or b16[i] == wb, hex(u)
        assert wf is None or f16[i] == wf, hex(u)
    tensors = [("x", _f32(bits)), ("bf16", b16.astype(np.int32)), ("fp16", f16.astype(np.int32))]
    meta = {"generator": "scripts/reference.py", "torch": torch.__version__, "case": "convert"}
    path = os.path.join(HALF_DIR, "convert.safetensors")
    save_safetensors(path, tensors, meta)
    return path


HALF_MATMUL_CASES = [
    # name, precision, m, n, k, trans_a, trans_b, beta, seed
    ("bf16_nn", "bf16", 17, 21, 300, False, False, 0.0, 3101),
    ("bf16_tt_beta1", "bf16", 20, 70, 33, True, True, 1.0, 3102),
    ("fp16_nt_beta1", "fp16", 24, 20, 260, False, True, 1.0, 3103),
    ("fp16_tn", "fp16", 13, 7, 100, True, False, 0.0, 3104),
    ("fp16_overflow", "fp16", 6, 8, 20, False, False, 0.0, 3105),
]


def gen_half_matmul(name, prec, m, n, k, ta, tb, beta, seed):
    gen = torch.Generator().manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[prec]
    A = torch.randn(m, k, generator=gen, dtype=torch.float32)       # op(A)
    B = torch.randn(k, n, generator=gen, dtype=torch.float32)       # op(B)
    c0 = torch.randn(m, n, generator=gen, dtype=torch.float32)
    if name == "fp16_overflow":
        B = B.abs() + 0.25                      # positive, so an Inf in a row of A gives +Inf
        A[2, 5] = 70000.0                       # beyond 65520: Inf in fp16, row 2 of C is +Inf
        A[4, 3] = 65519.0                       # rounds to 65504: finite
        A[1, 0] = 1e-8                          # underflows to 0
    Ar = A.to(dt).to(torch.float64)
    Br = B.to(dt).to(torch.float64)
    c = Ar @ Br + beta * c0.to(torch.float64)
    scale = Ar.abs() @ Br.abs() + abs(beta) * c0.to(torch.float64).abs()
    if name == "fp16_overflow":
        assert bool(torch.isinf(c[2]).all()) and bool(torch.isfinite(c[4]).all())
    a_st = A.t().contiguous() if ta else A
    b_st = B.t().contiguous() if tb else B
    cfg = {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb, "beta": beta, "precision": prec}
    tensors = [("a", a_st.numpy()), ("b", b_st.numpy()), ("c0", c0.numpy()),
               ("c", c.to(torch.float32).numpy()), ("scale", scale.to(torch.float32).numpy())]
    meta = {"config": json.dumps(cfg, separators=(",", ":")), "generator": "scripts/reference.py",
            "torch": torch.__version__, "case": name}
    path = os.path.join(HALF_DIR, "matmul_" + name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path


def cmd_half(_args):
    torch.set_num_threads(1)
    os.makedirs(HALF_DIR, exist_ok=True)
    paths = [gen_half_convert()] + [gen_half_matmul(*c) for c in HALF_MATMUL_CASES]
    for path in paths:
        print("%-60s %8d bytes" % (os.path.relpath(path, REPO_ROOT), os.path.getsize(path)))

# Hugging Face LLaMA directories (weights/testdata/hf)

HF_DIR = os.path.join(REPO_ROOT, "weights", "testdata", "hf")

# Token ids are the UTF-8 bytes of the text (distflash's "byte" tokenizer, vocabulary 256), with
# bos_token_id = 1 (LLaMA's) prepended to every document.
HF_BOS = 1

# Evaluation text: one document per file, docs/doc<i>.txt, in this order (the order of their
# sorted paths). Lengths in bytes straddle the seq_len of the first evaluation below, so some
# documents are truncated and some are not; multi-byte UTF-8 is included on purpose.
HF_DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ring attention passes key and value blocks around the ranks; "
    "each rank folds them into its running softmax.",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve r\u00e9sum\u00e9 \u2014 "
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 and \u00fcber.",
    "a",
    "func main() {\n\tfmt.Println(\"hello, world\")\n}\n",
]

# (seq_len, samples): what `distflash eval --seq-len N --samples S` is checked against.
HF_EVALS = [(40, 4), (512, 5)]

# name, model shape, seed, tie_word_embeddings, shards: [(file, dtype, tensor-name predicate)]
# (one file and no index when there is one shard), extra HF config keys.
HF_MODELS = [
    ("llama-sharded",
     dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64, vocab_size=256,
          norm_eps=1e-5, rope_theta=10000.0),
     3001, False,
     [("model-00001-of-00002.safetensors", torch.float32,
       lambda n: n == "model.embed_tokens.weight" or n.startswith("model.layers.0.")),
      ("model-00002-of-00002.safetensors", torch.bfloat16, lambda n: True)],
     {"torch_dtype": "bfloat16"}),
    ("llama-tied",
     dict(dim=48, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=8, ffn_dim=96, vocab_size=256,
          norm_eps=1e-6, rope_theta=500000.0),
     3002, True,
     [("model.safetensors", torch.float16, lambda n: True)],
     {"torch_dtype": "float16", "head_dim": 8}),
    # Mistral: LLaMA with a sliding window on every layer (key j visible to query i iff
    # i - 16 < j <= i), which its evals apply with an explicit banded mask
    ("mistral-window",
     dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64, vocab_size=256,
          norm_eps=1e-5, rope_theta=10000.0),
     3003, False,
     [("model.safetensors", torch.float32, lambda n: True)],
     {"torch_dtype": "float32", "model_type": "mistral", "architectures": ["MistralForCausalLM"],
      "sliding_window": 16}),
]


def hf_config_json(c, tied, extra):
    """config.json of a LlamaForCausalLM with shape c (keys as transformers' LlamaConfig)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c["dim"],
        "intermediate_size": c["ffn_dim"],
        "num_hidden_layers": c["n_layers"],
        "num_attention_heads": c["n_heads"],
        "num_key_value_heads": c["n_kv_heads"],
        "rms_norm_eps": c["norm_eps"],
        "rope_theta": c["rope_theta"],
        "vocab_size": c["vocab_size"],
        "max_position_embeddings": 512,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": HF_BOS,
        "eos_token_id": 2,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    cfg.update(extra)
    return json.dumps(cfg, indent=2, sort_keys=True) + "\n"


def hf_eval(c, P64, seq_len, samples, window=None):
    """Mean next-token cross-entropy over the first `samples` documents, each tokenized as
    [BOS] + UTF-8 bytes and cut to seq_len + 1 tokens (seq_len inputs, seq_len targets),
    attending within a sliding window of `window` tokens on every layer when it is set."""
    V = c["vocab_size"]
    sums, counts = [], []
    for doc in HF_DOCS[:samples]:
        ids = ([HF_BOS] + list(doc.encode("utf-8")))[:seq_len + 1]
        inp = torch.tensor([ids[:-1]], dtype=torch.int64)
        tgt = torch.tensor([ids[1:]], dtype=torch.int64)
        with torch.no_grad():
            if window:
                logits = forward_window(c, P64, inp, window, None, None)
            else:
                logits = forward(c, P64, inp)
            s = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="sum")
        sums.append(float(s))
        counts.append(len(ids) - 1)
    total, n = sum(sums), sum(counts)
    loss = total / n
    return {
        "seq_len": seq_len, "samples": samples,
        "loss": loss, "perplexity": math.exp(loss),
        "tokens": n, "bytes": n,  # one byte per predicted token
        "bits_per_byte": total / math.log(2) / n,
        "sample_loss_sums": sums, "sample_tokens": counts,
    }


def gen_hf_model(name, over, seed, tied, shards, extra):
    c = dict(over)
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(c, gen)
    names = [n for n, _ in param_shapes(c)]
    if tied:
        # The embedding is also the output head: N(0, 0.1^2) keeps the logits O(1), as in
        # trained models, where N(0, 1) would make them O(sqrt(dim)).
        names.remove("lm_head.weight")
        P32["model.embed_tokens.weight"] = P32["model.embed_tokens.weight"] * 0.1
    # Each tensor is stored in its shard's dtype; the reference computes with exactly the
    # stored values (dequantized to float64), as distflash does after converting to float32.
    where, stored = {}, {}
    for n in names:
        for fname, dtype, pick in shards:
            if pick(n):
                where[n] = (fname, dtype)
                stored[n] = P32[n].to(dtype)
                break
    P64 = {n: stored[n].to(torch.float64) for n in names}
    if tied:
        P64["lm_head.weight"] = P64["model.embed_tokens.weight"]
    d = os.path.join(HF_DIR, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(hf_config_json(c, tied, extra))
    for fname, _, _ in shards:
        tensors = [(n, stored[n]) for n in names if where[n][0] == fname]
        if tied:  # older checkpoints carry RoPE's inverse frequencies; loaders ignore them
            hd = c["head_dim"]
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            tensors.append(("model.layers.0.self_attn.rotary_emb.inv_freq", inv))
        save_safetensors(os.path.join(d, fname), tensors, {"format": "pt"})
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(stored[n].numel() * stored[n].element_size() for n in names)},
            "weight_map": {n: where[n][0] for n in sorted(names)},
        }
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    # Self-check: the files read back (by this script's own reader) are the stored values.
    for fname, _, _ in shards:
        back, _ = load_safetensors(os.path.join(d, fname))
        for n, arr in back.items():
            if n in stored:
                assert np.array_equal(arr.astype(np.float32), stored[n].to(torch.float32).numpy()), n
    tensors = {}
    for n in names:
        w = P64[n]
        tensors[n] = {"shape": list(w.shape), "dtype": {torch.float32: "F32", torch.bfloat16: "BF16",
                                                          torch.float16: "F16"}[where[n][1]],
                      "sum": float(w.sum()), "sum_sq": float((w * w).sum()),
                      "head": [float(x) for x in w.reshape(-1)[:3]]}
    return {
        "config": dict(c, sliding_window=extra.get("sliding_window", 0)), "tie_word_embeddings": tied,
        "evals": [hf_eval(c, P64, L, S, extra.get("sliding_window")) for L, S in HF_EVALS],
        "tensors": tensors,
    }


def hf_permute(w, n_heads, dim1, dim2):
    """Meta (interleaved RoPE pairs) -> Hugging Face (rotate-half) row order of a q or k
    projection, as transformers' convert_llama_weights_to_hf.py writes it."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def meta_rope(x, theta):
    """Meta's LLaMA RoPE (llama/model.py apply_rotary_emb): consecutive pairs (x[2i], x[2i+1])
    as complex numbers times exp(i*p*theta^(-2i/hd)). x: [T, heads, hd] float64."""
    T, _, hd = x.shape
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    cis = torch.polar(torch.ones_like(ang), ang)                       # [T, hd/2]
    xc = torch.view_as_complex(x.reshape(T, x.shape[1], hd // 2, 2).contiguous())
    return torch.view_as_real(xc * cis[:, None, :]).reshape(T, x.shape[1], hd)


def gen_hf_permute():
    H, K, hd, D, T, theta = 4, 2, 6, 24, 5, 10000.0
    gen = torch.Generator().manual_seed(3003)
    meta_q = torch.randn(H * hd, D, generator=gen, dtype=torch.float32)
    meta_k = torch.randn(K * hd, D, generator=gen, dtype=torch.float32)
    hf_q = hf_permute(meta_q, H, H * hd, D)
    hf_k = hf_permute(meta_k, K, K * hd, D)
    # Self-check: Meta's interleaved RoPE on Meta's weights and HF's rotate-half RoPE on the
    # permuted weights give the same attention scores (the rows are a per-head permutation).
    x = torch.randn(T, D, generator=gen, dtype=torch.float64)
    cos, sin = rope_cos_sin(T, hd, theta, torch.float64)
    def scores(q, k):
        q, k = q.transpose(0, 1), k.repeat_interleave(H // K, dim=1).transpose(0, 1)
        return q @ k.transpose(-1, -2)
    qm = meta_rope((x @ meta_q.double().T).view(T, H, hd), theta)
    km = meta_rope((x @ meta_k.double().T).view(T, K, hd), theta)
    qh = apply_rope((x @ hf_q.double().T).view(T, H, hd).transpose(0, 1), cos, sin).transpose(0, 1)
    kh = apply_rope((x @ hf_k.double().T).view(T, K, hd).transpose(0, 1), cos, sin).transpose(0, 1)
    assert torch.allclose(scores(qm, km), scores(qh, kh), atol=1e-9)
    cfg = {"n_heads": H, "n_kv_heads": K, "head_dim": hd, "dim": D}
    path = os.path.join(HF_DIR, "permute.safetensors")
    save_safetensors(path, [("meta_q", meta_q), ("hf_q", hf_q.contiguous()),
                            ("meta_k", meta_k), ("hf_k", hf_k.contiguous())],
                     {"config": json.dumps(cfg, separators=(",", ":")), "generator": "scripts/reference.py"})
    return path


def cmd_hf(_args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(os.path.join(HF_DIR, "docs"), exist_ok=True)
    for f in os.listdir(os.path.join(HF_DIR, "docs")):
        os.remove(os.path.join(HF_DIR, "docs", f))
    for i, doc in enumerate(HF_DOCS):
        with open(os.path.join(HF_DIR, "docs", "doc%d.txt" % i), "wb") as f:
            f.write(doc.encode("utf-8"))
    expected = {
        "generator": "scripts/reference.py hf",
        "torch": torch.__version__,
        "bos_token_id": HF_BOS,
        "docs": "docs/*.txt",
        "models": {},
    }
    for name, over, seed, tied, shards, extra in HF_MODELS:
        expected["models"][name] = gen_hf_model(name, over, seed, tied, shards, extra)
        for e in expected["models"][name]["evals"]:
            print("%-16s seq_len %4d samples %d: loss %.6f over %d tokens" % (
                name, e["seq_len"], e["samples"], e["loss"], e["tokens"]))
    with open(os.path.join(HF_DIR, "expected.json"), "w") as f:
        f.write(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    gen_hf_permute()
    total = 0
    for root, _, files in os.walk(HF_DIR):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print("%s: %d bytes in all" % (os.path.relpath(HF_DIR, REPO_ROOT), total))


# --------------------------------------------------------------------------
# reading a Hugging Face LLaMA directory (what `distflash export` writes)

_ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
              "F64": (torch.float64, 8)}


def read_safetensors_torch(path):
    """Own safetensors reader (struct + json + torch.frombuffer; no safetensors package):
    returns ({name: float64 tensor}, metadata). Checks every tensor's extent against its
    shape and that the data section is covered without gaps or overlaps."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError("%s: header length %d exceeds the file" % (path, n))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = bytearray(raw[8 + n:])
    out, spans = {}, []
    for name, info in header.items():
        dtype, size = _ST_DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        count = math.prod(info["shape"])
        if e - b != count * size or e > len(data):
            raise ValueError("%s: tensor %s: offsets [%d, %d) do not hold %s %s" % (path, name, b, e, info["shape"], info["dtype"]))
        spans.append((b, e))
        t = torch.frombuffer(data, dtype=dtype, count=count, offset=b) if count else torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            raise ValueError("%s: data section has a gap or overlap at byte %d" % (path, pos))
        pos = e
    if pos != len(data):
        raise ValueError("%s: %d bytes of data after the last tensor" % (path, len(data) - pos))
    return out, meta


def read_hf_dir(d, model_types=("llama",), skip_inv_freq=False):
    """(config c as this file's model takes it, {name: float64 tensor}, HF config) of a
    LlamaForCausalLM directory: config.json plus model.safetensors or the shards that
    model.safetensors.index.json lists. model_types: the config model_type values taken
    (a caller that applies the sliding window may add "mistral"); skip_inv_freq: drop the
    rotary_emb.inv_freq buffers of older checkpoints instead of refusing them."""
    with open(os.path.join(d, "config.json")) as f:
        hc = json.load(f)
    if hc.get("model_type", "llama") not in model_types or hc.get("hidden_act", "silu") != "silu":
        raise ValueError("%s: not a LLaMA with SiLU" % d)
    for key in ("attention_bias", "mlp_bias"):
        if hc.get(key):
            raise ValueError("%s: %s is not supported here" % (d, key))
    H = hc["num_attention_heads"]
    c = dict(dim=hc["hidden_size"], n_layers=hc["num_hidden_layers"], n_heads=H,
             n_kv_heads=hc.get("num_key_value_heads") or H,
             head_dim=hc.get("head_dim") or hc["hidden_size"] // H,
             ffn_dim=hc["intermediate_size"], vocab_size=hc["vocab_size"],
             norm_eps=hc.get("rms_norm_eps", 1e-6), rope_theta=hc.get("rope_theta", 10000.0))
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    P = {}
    for fname in files:
        tensors, meta = read_safetensors_torch(os.path.join(d, fname))
        if meta.get("format") != "pt":
            raise ValueError("%s: __metadata__ format %r: transformers wants \"pt\"" % (fname, meta.get("format")))
        P.update(tensors)
    if skip_inv_freq:
        P = {n: t for n, t in P.items() if not n.endswith(".rotary_emb.inv_freq")}
    if hc.get("tie_word_embeddings", False):
        P.setdefault("lm_head.weight", P["model.embed_tokens.weight"])
    want = dict(param_shapes(c))
    extra = sorted(set(P) - set(want))
    if extra:
        raise ValueError("%s: tensors that are not parameters: %s" % (d, extra[:3]))
    for name, shape in want.items():
        if tuple(P[name].shape) != tuple(shape):
            raise ValueError("%s: %s has shape %s, want %s" % (d, name, tuple(P[name].shape), shape))
    return c, P, hc


def cmd_read_hf(a):
    """Loss of a Hugging Face LLaMA directory on documents, byte-tokenized (the byte tokenizer
    that distflash's own runs use: one token per UTF-8 byte), with the config's bos_token_id
    prepended when it is not null; each document cut to seq_len + 1 tokens; float64."""
    import glob
    torch.set_num_threads(1)
    c, P, hc = read_hf_dir(a.dir)
    bos = hc.get("bos_token_id")
    V = c["vocab_size"]
    sums, counts = [], []
    for path in sorted(glob.glob(a.docs)):
        if len(sums) == a.samples:
            break
        with open(path, "rb") as f:
            ids = list(f.read())
        if bos is not None:
            ids = [bos] + ids
        ids = ids[:a.seq_len + 1]
        if len(ids) < 2:
            continue
        inp = torch.tensor([ids[:-1]], dtype=torch.int64)
        tgt = torch.tensor([ids[1:]], dtype=torch.int64)
        rope = None
        if hc.get("rope_scaling"):  # as transformers computes it for this length (hf_rope_cos_sin)
            hf = dict(rope_theta=c["rope_theta"], head_dim=c["head_dim"],
                      max_position_embeddings=hc["max_position_embeddings"], rope_scaling=hc["rope_scaling"])
            rope = hf_rope_cos_sin(hf, inp.shape[1], torch.float64)
        with torch.no_grad():
            logits = forward(c, P, inp, rope=rope)
            s = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="sum")
        sums.append(float(s))
        counts.append(len(ids) - 1)
    total, n = sum(sums), sum(counts)
    res = {"dir": os.path.relpath(a.dir, REPO_ROOT) if a.dir.startswith(REPO_ROOT) else a.dir,
           "docs": a.docs, "seq_len": a.seq_len, "samples": len(sums),
           "loss": total / n, "tokens": n, "sample_loss_sums": sums, "sample_tokens": counts,
           "params": int(sum(P[name].numel() for name, _ in param_shapes(c))),
           "torch": torch.__version__, "generator": "scripts/reference.py read-hf"}
    print(json.dumps(res, indent=2, sort_keys=True))
    if a.out:
        with open(a.out, "w") as f:
            f.write(json.dumps(res, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------
# greedy decoding of the Hugging Face fixtures (weights/testdata/hf/generate.json)

GEN_MODELS = ["llama-sharded", "llama-tied", "mistral-window"]
GEN_PROMPTS = [
    "The quick brown fox",
    "func main() {\n\tfmt.Println(",
    "Once upon a time, in a land far",
    # 52 bytes: with BOS and the new tokens, well past mistral-window's 16-token window.
    "package main\n\nimport \"fmt\"\n\nfunc add(a, b int) int {",
]
GEN_NEW_TOKENS = 24
GEN_MIN_MARGIN = 1e-4  # below this a float32 forward could flip a near tie


def gen_logits(c, P, hc, ids):
    """float64 logits [T, V] of one full forward over the token list ids (positions 0..T-1):
    causal, within the config's sliding_window on every layer when it has one (Mistral;
    transformers' LLaMA ignores the key), plain RoPE with rope_theta."""
    if hc.get("rope_scaling"):
        raise ValueError("generate: rope_scaling is not supported (the fixtures have none)")
    window = hc.get("sliding_window") if hc.get("model_type") == "mistral" else None
    tokens = torch.tensor([ids], dtype=torch.int64)
    with torch.no_grad():
        if window:
            return forward_window(c, P, tokens, window, None, None)[0]
        return forward(c, P, tokens)[0]


def gen_argmax(logits):
    """(argmax with ties to the lowest id, top-1 minus top-2 value) of a 1-D tensor."""
    top = float(logits.max())
    best = int(torch.nonzero(logits == top)[0, 0])
    top2 = torch.topk(logits, 2).values
    return best, float(top2[0] - top2[1])


def greedy_decode(c, P, hc, prompt_ids, n):
    """(tokens, margins, first_logits) of n greedy steps, each a full forward over the
    sequence so far (no KV cache) and no stop at EOS."""
    ids = list(prompt_ids)
    tokens, margins, first = [], [], None
    for _ in range(n):
        last = gen_logits(c, P, hc, ids)[-1]
        if first is None:
            first = [float(x) for x in last]
        tok, margin = gen_argmax(last)
        tokens.append(tok)
        margins.append(margin)
        ids.append(tok)
    return tokens, margins, first


def check_greedy(c, P, hc, prompt_ids, tokens):
    """Self-check: one forward over prompt_ids + tokens[:-1] has the decoded token as the
    argmax at each generated position."""
    logits = gen_logits(c, P, hc, list(prompt_ids) + tokens[:-1])
    start = len(prompt_ids) - 1
    again = [gen_argmax(logits[start + i])[0] for i in range(len(tokens))]
    assert again == tokens, (again, tokens)


def gen_generate_case(name, c, P, hc, prompt):
    """One generate.json case: the prompt decoded greedily by the model read from name."""
    bos = hc.get("bos_token_id")
    bos = -1 if bos is None else int(bos)
    prompt_ids = ([bos] if bos >= 0 else []) + list(prompt.encode("utf-8"))
    tokens, margins, first = greedy_decode(c, P, hc, prompt_ids, GEN_NEW_TOKENS)
    check_greedy(c, P, hc, prompt_ids, tokens)
    assert len(first) == c["vocab_size"]
    return {"model": name, "prompt": prompt, "bos": bos, "prompt_ids": prompt_ids,
            "tokens": tokens, "margins": margins, "min_margin": min(margins),
            "first_logits": first}


def cmd_generate(_args):
    """Write weights/testdata/hf/generate.json and print one line per case."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cases, low = [], []
    for name in GEN_MODELS:
        c, P, hc = read_hf_dir(os.path.join(HF_DIR, name), model_types=("llama", "mistral"),
                             skip_inv_freq=True)
        for prompt in GEN_PROMPTS:
            case = gen_generate_case(name, c, P, hc, prompt)
            cases.append(case)
            text = bytes(t for t in case["tokens"] if t < 256).decode("utf-8", errors="replace")
            flag = "  LOW MARGIN (< %g)" % GEN_MIN_MARGIN if case["min_margin"] < GEN_MIN_MARGIN else ""
            if flag:
                low.append((name, prompt))
            print("%-15s prompt %2d bytes  min margin %.6g  -> %r%s" % (
                name, len(prompt.encode("utf-8")), case["min_margin"], text, flag))
    out = {
        "note": "Greedy decoding reference for the Hugging Face fixtures in this directory: each "
                "model read with scripts/reference.py's own safetensors reader (weights as stored, "
                "in float64), prompt_ids = [bos_token_id] + UTF-8 bytes (bos -1: none), then "
                "new_tokens argmax steps (ties: lowest id), each a full float64 forward over the "
                "whole sequence (no KV cache, causal, sliding window on every layer for "
                "mistral-window, plain RoPE), no stop at EOS. margins: top-1 minus top-2 logit per "
                "step; first_logits: the last prompt position's logits. Made by "
                "/usr/bin/python3 scripts/reference.py generate (torch %s)." % torch.__version__,
        "new_tokens": GEN_NEW_TOKENS,
        "cases": cases,
    }
    path = os.path.join(HF_DIR, "generate.json")
    with open(path, "w") as f:
        f.write(json.dumps(out, indent=1) + "\n")
    print("%s: %d bytes, %d cases" % (os.path.relpath(path, REPO_ROOT), os.path.getsize(path), len(cases)))
    if low:
        print("min margin below %g: %s" % (GEN_MIN_MARGIN, low))


# --------------------------------------------------------------------------
# benchmarks (fp32)

def _blas_info():
    """The BLAS library actually loaded: Debian's torch links libblas.so.3, which the
    alternatives system points at the reference BLAS or, when installed, OpenBLAS."""
    import re
    torch.ones(4, 4) @ torch.ones(4, 4)
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and ".so" in l})
        if libs:
            return ",".join(os.path.realpath(l) for l in libs)
    except OSError:
        pass
    m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


def cmd_bench(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = dict(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads,
             head_dim=a.head_dim or a.dim // a.n_heads, ffn_dim=a.ffn_dim, vocab_size=a.vocab,
             norm_eps=1e-5, rope_theta=10000.0, batch=a.batch, seq_len=a.seq_len)
    gen = torch.Generator().manual_seed(0)
    P = {k: v.requires_grad_(True) for k, v in init_params(c, gen).items()}
    opt = torch.optim.AdamW(list(P.values()), lr=1e-3, weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen)

    def step():
        loss = loss_fn(forward(c, P, tokens), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    step_s = dt / a.steps
    print(json.dumps({
        "tokens_per_s": round(a.batch * a.seq_len / step_s, 1),
        "step_ms": round(step_s * 1e3, 3),
        "threads": a.threads,
        "torch": torch.__version__,
        "attention": "plain ops (matmul + masked_fill(-inf) + softmax + matmul; "
                     "F.scaled_dot_product_attention not available in this torch)"
                     if not hasattr(F, "scaled_dot_product_attention") else "plain ops (matmul + masked_fill + softmax)",
        "dtype": "float32",
        "blas": _blas_info(),
        "params": sum(p.numel() for p in P.values()),
        "config": c,
        "steps": a.steps,
        "warmup": a.warmup,
    }))


def cmd_bench_attn(a):
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    N, H, hd = a.seq_len, a.n_heads, a.head_dim
    q = torch.randn(1, H, N, hd, generator=gen).requires_grad_(True)
    k = torch.randn(1, H, N, hd, generator=gen).requires_grad_(True)
    v = torch.randn(1, H, N, hd, generator=gen).requires_grad_(True)
    do = torch.randn(1, H, N, hd, generator=gen)

    def once():
        o = causal_attention(q, k, v)
        o.backward(do)
        q.grad = k.grad = v.grad = None

    for _ in range(a.warmup):
        once()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        once()
    dt = (time.perf_counter() - t0) / a.steps
    fwd_flops = 4.0 * N * N * H * hd / 2
    total = fwd_flops * 3.5
    print(json.dumps({
        "gflops": round(total / dt / 1e9, 3),
        "ms": round(dt * 1e3, 3),
        "seq_len": N, "n_heads": H, "head_dim": hd,
        "threads": a.threads,
        "torch": torch.__version__,
        "attention": "plain ops, causal, fp32, fwd+bwd",
        "flops_counted": "fwd 4*N*N*H*hd/2, bwd 2.5x fwd",
        "blas": _blas_info(),
    }))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("golden", help="regenerate golden safetensors files")
    sub.add_parser("half", help="regenerate the bf16 / fp16 test vectors")
    sub.add_parser("rope", help="regenerate the RoPE scaling vectors in model/testdata/rope")
    sub.add_parser("hf", help="regenerate the Hugging Face LLaMA fixtures in weights/testdata/hf")
    sub.add_parser("generate", help="regenerate weights/testdata/hf/generate.json (greedy decoding of the HF fixtures)")
    r = sub.add_parser("read-hf", help="loss of a Hugging Face LLaMA directory, read with this file's own safetensors reader (needs PyTorch and numpy)")
    r.add_argument("dir")
    r.add_argument("--docs", required=True, help="glob of text files, one document each, in sorted order")
    r.add_argument("--seq-len", type=int, required=True)
    r.add_argument("--samples", type=int, required=True)
    r.add_argument("--out", default="", help="also write the JSON result here")
    sub.add_parser("docmask", help="regenerate model/testdata/docmask (packed documents, block-diagonal causal mask)")
    sub.add_parser("window", help="regenerate model/testdata/window (sliding windows: an explicit banded causal mask)")
    b = sub.add_parser("bench", help="fp32 training-step throughput")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--dim", type=int, default=128)
    b.add_argument("--n-layers", type=int, default=4)
    b.add_argument("--n-heads", type=int, default=4)
    b.add_argument("--n-kv-heads", type=int, default=2)
    b.add_argument("--head-dim", type=int, default=0, help="default dim/n_heads")
    b.add_argument("--ffn-dim", type=int, default=352)
    b.add_argument("--vocab", type=int, default=256)
    b.add_argument("--seq-len", type=int, default=128)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    ba = sub.add_parser("bench-attn", help="fp32 causal attention fwd+bwd throughput")
    ba.add_argument("--threads", type=int, default=1)
    ba.add_argument("--seq-len", type=int, default=1024)
    ba.add_argument("--n-heads", type=int, default=8)
    ba.add_argument("--head-dim", type=int, default=64)
    ba.add_argument("--steps", type=int, default=5)
    ba.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args(argv)
    {"golden": cmd_golden, "docmask": cmd_docmask, "window": cmd_window, "half": cmd_half, "rope": cmd_rope, "hf": cmd_hf, "generate": cmd_generate, "bench": cmd_bench, "bench-attn": cmd_bench_attn,
     "read-hf": cmd_read_hf}[a.cmd](a)


if __name__ == "__main__":
    main()
