#!/usr/bin/env python3
"""Hugging Face LLaMA directories written by transformers itself, with their RoPE, and the
losses transformers computes on them: weights/testdata/hfrope/.

    "$(scripts/install_torch.sh)" scripts/transformers_fixtures.py

The interpreter needs PyTorch (scripts/install_torch.sh makes it) and Go on PATH. Two pinned
transformers releases are installed beside that venv on first use (pip install --target,
${XDG_CACHE_HOME:-~/.cache}/distflash/transformers-VERSION) and each is run in its own process:

  - transformers 5 (TF5) writes config.json with "rope_parameters": {"rope_type", "rope_theta",
    scaling fields}; transformers 4 (TF4) wrote top-level "rope_theta" and "rope_scaling".
    TF5 reads both; TF4 reads only its own (it ignores rope_parameters, so reads theta 10000).
  - MODELS are tiny LlamaForCausalLM models (bfloat16, a few tens of KB each) made by
    LlamaConfig + LlamaForCausalLM + save_pretrained of the release named, every rope_type
    distflash implements, all with rope_theta 500000; their weights are drawn here with a
    fixed seed, q and k large enough that attention depends on position.
  - EXPORTS: `distflash train --init-from` one of them for two steps, then `distflash export
    --dtype bf16`, read back by both releases.
  - expected.json: for every directory the loss each release computes (float64 weights, eager
    attention) on the documents of weights/testdata/hf/docs, each as [BOS] + its UTF-8 bytes
    (no BOS for the exports, whose bos_token_id is null) cut to SEQ_LEN + 1 tokens, as `distflash eval --data 'weights/testdata/hf/docs/*.txt'
    --samples 5 --seq-len 128` scores them; and the losses with the RoPE settings dropped
    (theta 10000, no scaling) and with the scaling alone dropped, which must differ from the
    loss by far more than e2e's tolerance (1e-5 relative), or the test could not see a
    misread config.

Each document is scored by a freshly loaded model: transformers' dynamic RoPE keeps the
frequencies of the longest sequence it has seen (above max_position_embeddings) for later,
shorter ones, so scoring the documents one after another would depend on their order;
distflash scales each sequence by its own length.

e2e/transformers_test.go checks, without Python, that `distflash eval` of every directory gives
transformers' loss, and that `distflash export` still writes the exports' config.json.
"""

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "weights", "testdata", "hfrope")
DOCS = "weights/testdata/hf/docs/*.txt"
SEQ_LEN, SAMPLES = 128, 5
TF5, TF4 = "5.24.0", "4.57.6"

SHAPE = dict(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
             bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
THETA = 500000.0
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16.0}

# name, the transformers release that writes it, max_position_embeddings, the RoPE (without
# rope_theta). max_position_embeddings is 128 (the evaluated length) except for dynamic, where
# it is the pretrained length (32) that the documents (45 to 108 tokens) exceed.
MODELS = [
    ("default", TF5, 128, {"rope_type": "default"}),
    ("linear", TF5, 128, {"rope_type": "linear", "factor": 4.0}),
    ("dynamic", TF5, 32, {"rope_type": "dynamic", "factor": 4.0}),
    ("yarn", TF5, 128, YARN),
    ("llama3", TF5, 128, LLAMA3),
    ("v4-yarn", TF4, 128, YARN),
    ("v4-llama3", TF4, 128, LLAMA3),
]
# Exports: distflash's export of a model trained from each of these.
EXPORTS = ["dynamic", "yarn", "llama3"]


def site(version):
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "distflash", "transformers-" + version)


def install(version):
    d = site(version)
    if os.path.exists(os.path.join(d, ".complete")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-cache-dir", "--target", d, "transformers==" + version], check=True)
    open(os.path.join(d, ".complete"), "w").close()
    return d


def under(version, *args):
    """Runs this script with args in a process that imports transformers `version`."""
    env = dict(os.environ, PYTHONPATH=install(version), TRANSFORMERS_VERBOSITY="error",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, check=True,
                         stdout=subprocess.PIPE, cwd=REPO).stdout
    return json.loads(out) if out.strip() else None


# --------------------------------------------------------------------------
# run under one transformers release

def check_release(version):
    import transformers
    assert transformers.__version__ == version, (transformers.__version__, version)


def init_weights(model, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            x = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                x = 1 + 0.1 * x
            elif "embed_tokens" not in name:
                x = x / math.sqrt(p.shape[1])
                if "q_proj" in name or "k_proj" in name:
                    x = 3 * x  # attention logits O(1): positions matter
            p.copy_(x)


def cmd_save(a):
    """Writes the MODELS of release a.version into a.out with save_pretrained."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    check_release(a.version)
    for seed, (name, version, max_pos, rope) in enumerate(MODELS):
        if version != a.version:
            continue
        if version.startswith("5."):
            cfg = LlamaConfig(**SHAPE, max_position_embeddings=max_pos, rope_parameters=dict(rope, rope_theta=THETA))
        else:
            scaling = None if rope["rope_type"] == "default" else dict(rope)
            cfg = LlamaConfig(**SHAPE, max_position_embeddings=max_pos, rope_theta=THETA, rope_scaling=scaling)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        init_weights(model, 1000 + seed)
        model.to(torch.bfloat16).save_pretrained(os.path.join(a.out, name))


def docs():
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, DOCS)))[:SAMPLES]:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def loss_of(d, edit=None):
    """transformers' loss of directory d on the documents (see the module's doc); edit, if
    given, changes the config first."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, LlamaForCausalLM
    torch.set_num_threads(1)
    sums, counts = [], []
    for doc in docs():
        cfg = AutoConfig.from_pretrained(d)
        if edit:
            edit(cfg)
        model = LlamaForCausalLM.from_pretrained(d, config=cfg, attn_implementation="eager").double().eval()
        bos = [] if cfg.bos_token_id is None else [cfg.bos_token_id]  # distflash's exports: none
        ids = (bos + list(doc))[:SEQ_LEN + 1]
        if len(ids) < 2:
            continue  # nothing to predict
        inp = torch.tensor([ids[:-1]], dtype=torch.int64)
        tgt = torch.tensor(ids[1:], dtype=torch.int64)
        with torch.no_grad():
            logits = model(input_ids=inp).logits[0]
        sums.append(float(F.cross_entropy(logits, tgt, reduction="sum")))
        counts.append(len(ids) - 1)
    return {"loss": sum(sums) / sum(counts), "tokens": sum(counts), "samples": len(sums),
            "sample_loss_sums": sums, "sample_tokens": counts}


def cmd_loss(a):
    """Prints {dir: loss_of(dir)} as JSON; with --perturb also the losses with the RoPE
    settings dropped (TF5 only)."""
    import transformers
    check_release(a.version)
    out = {}
    for d in a.dirs:
        r = loss_of(d)
        if a.perturb:
            cfg = transformers.AutoConfig.from_pretrained(d)
            theta = cfg.rope_parameters["rope_theta"]

            def drop_all(c):
                c.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}

            def drop_scaling(c):
                c.rope_parameters = {"rope_type": "default", "rope_theta": theta}

            r["loss_theta_10000_no_scaling"] = loss_of(d, drop_all)["loss"]
            if cfg.rope_parameters["rope_type"] != "default":
                r["loss_no_scaling"] = loss_of(d, drop_scaling)["loss"]
        out[os.path.relpath(d, OUT)] = r
    json.dump(out, sys.stdout)


# --------------------------------------------------------------------------
# the whole job, in the torch venv without transformers

def main_all():
    import torch
    tmp = tempfile.mkdtemp()
    try:
        binary = os.path.join(tmp, "distflash")
        subprocess.run(["go", "build", "-o", binary, "."], cwd=REPO, check=True)
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(os.path.join(OUT, "export"))
        for version in (TF5, TF4):
            under(version, "save", "--version", version, "--out", OUT)
        for name in EXPORTS:
            run = os.path.join(tmp, "runs")
            subprocess.run([binary, "train", "--config", "configs/tiny.toml", "--progress=false",
                            "--init-from", os.path.join(OUT, name),
                            "--set", "run.name=" + name, "--set", "run.output_dir=" + run,
                            "--set", "data.train=scripts/reference.py", "--set", "data.max_bytes=0",
                            "--set", "data.seq_len=64", "--set", "data.batch_size=2",
                            "--set", "training.steps=2", "--set", "training.warmup_steps=1",
                            "--set", "checkpoint.interval=2"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            subprocess.run([binary, "export", "--model", os.path.join(run, name), "--dtype", "bf16",
                            "--out", os.path.join(OUT, "export", name)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        models = [os.path.join(OUT, n) for n, _, _, _ in MODELS]
        exports = [os.path.join(OUT, "export", n) for n in EXPORTS]
        tf5 = under(TF5, "loss", "--version", TF5, "--perturb", *models)
        tf5x = under(TF5, "loss", "--version", TF5, *exports)
        tf4 = under(TF4, "loss", "--version", TF4, *[m for m, (_, v, _, _) in zip(models, MODELS) if v == TF4], *exports)
        expected = {
            "generator": "scripts/transformers_fixtures.py",
            "transformers": [TF5, TF4], "torch": torch.__version__,
            "docs": DOCS, "samples": SAMPLES, "seq_len": SEQ_LEN,
            "models": {}, "exports": {},
        }
        for name, version, _, _ in MODELS:
            r = tf5[name]
            with open(os.path.join(OUT, name, "config.json")) as f:
                form = "rope_parameters" if "rope_parameters" in json.load(f) else "rope_scaling"
            r.update(written_by="transformers " + version, form=form)
            if name in tf4:
                # TF4 reads its own form: the same model as TF5 reads, to float64 rounding.
                assert abs(tf4[name]["loss"] - r["loss"]) <= 1e-9 * r["loss"], (name, tf4[name], r)
                r["loss_transformers_4"] = tf4[name]["loss"]
            for k in ("loss_theta_10000_no_scaling", "loss_no_scaling"):
                if k in r:  # a misread RoPE moves the loss 50x e2e's tolerance or more
                    gap = abs(r[k] - r["loss"]) / r["loss"]
                    assert gap > 5e-4, (name, k, gap)  # 50x e2e's 1e-5
                    print("%-10s %s: loss %.6f, %s %.6f (rel %.1e)" % (name, form, r["loss"], k, r[k], gap))
            expected["models"][name] = r
        for name in EXPORTS:
            r, r4 = tf5x["export/" + name], tf4["export/" + name]
            assert abs(r4["loss"] - r["loss"]) <= 1e-9 * r["loss"], (name, r4, r)
            r["loss_transformers_4"] = r4["loss"]
            r["from"] = name
            expected["exports"][name] = r
            print("export/%-7s loss %.9f (transformers %s), %.9f (%s)" % (name, r["loss"], TF5, r4["loss"], TF4))
        with open(os.path.join(OUT, "expected.json"), "w") as f:
            f.write(json.dumps(expected, indent=2, sort_keys=True) + "\n")
        total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
        print("%s: %d bytes in all" % (os.path.relpath(OUT, REPO), total))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("save", help="(internal) write the MODELS of one release")
    s.add_argument("--version", required=True)
    s.add_argument("--out", required=True)
    lo = sub.add_parser("loss", help="(internal) transformers' loss of directories, as JSON")
    lo.add_argument("--version", required=True)
    lo.add_argument("--perturb", action="store_true")
    lo.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    if a.cmd == "save":
        cmd_save(a)
    elif a.cmd == "loss":
        cmd_loss(a)
    else:
        main_all()


if __name__ == "__main__":
    main()
