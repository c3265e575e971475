#!/usr/bin/env python3
"""Writes the tokenizer test vectors in data/testdata/tok/.

Independent references, none of them part of distflash:

  * Debian's `sentencepiece` (spm_train) trains two small BPE models on a corpus this
    script makes (deterministic: a seeded generator, English, accented Latin, Greek,
    Cyrillic, CJK, digits, code; emoji and rarer symbols stay out of the vocabulary, so
    byte fallback and <unk> are exercised):
      llama.model  LLaMA's trainer settings: identity normalization, no removal of extra
                   whitespace, split digits, byte fallback, whitespace-only pieces.
      opts.model   sentencepiece's default whitespace handling (extra whitespace removed),
                   a normalization rule table (a small NFKC-like subset written here, so
                   that its precompiled charsmap stays small: full-width forms, ligatures,
                   a composition, deletions), no byte fallback, user-defined and control
                   symbols, non-default special ids.
  * Debian's `python3-sentencepiece` encodes and decodes the test sentences:
    <model>.json holds {"text", "ids", "pieces", "decoded"} for each.
  * llama.json is the Hugging Face tokenizer.json of llama.model, written here the way
    transformers' LlamaConverter writes one (vocab = pieces by id, merges = every split of
    a piece into two pieces, ordered by the merged piece's score). hf.json holds the ids
    and decoded text of the same sentences from Hugging Face's own `tokenizers` library
    (its Node.js binding, the npm package `tokenizers`, which runs the Rust code), with
    add_special_tokens=false and skip_special_tokens=true. The script installs that
    package into a temporary directory with npm when NODE_PATH does not already hold it.
    llama.hf-metaspace.json and llama.hf-split.json do the same for two rewrites of
    llama.tokenizer.json (see hf_variant) that exercise the Metaspace pre-tokenizer and
    decoder and the array form of merges.

Run from the repository root:

    apt-get install -y sentencepiece python3-sentencepiece nodejs npm
    /usr/bin/python3 scripts/tokenizer_vectors.py

CI needs none of this: the outputs are committed and the Go tests read only them.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import sentencepiece as spm

OUT = os.path.join("data", "testdata", "tok")

WORDS = """the of and to in is that for it as with was on be by at this from or an are
have not but had his they which one you were her all she there would their we him been
has when who will more no if out so said what up its about into than them can only other
new some could time these two may then do first any my now such like our over man me
even most made after also did many before must through back years where much your way
well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take
three tokenizer sentence piece model train token merge byte fallback vocabulary score
parallel attention sequence worker ring schedule gradient optimizer checkpoint""".split()

ACCENTED = """café naïve über résumé façade déjà vu Ångström crème brûlée piñata jalapeño
Zürich Köln São Paulo coöperate señor mañana élève garçon Straße Ærøskøbing smörgåsbord
Dvořák Łódź Kraków""".split()

GREEK_CYRILLIC = """λόγος αλφάβητο καλημέρα κόσμε Привет мир спасибо Москва язык
данные""".split()

CJK = ["日本語", "東京", "中文", "汉字", "你好", "世界", "分词器", "モデル", "トークン", "한국어", "안녕하세요"]

CODE = [
    "func main() { fmt.Println(\"hello\") }",
    "for i := 0; i < n; i++ { sum += x[i] }",
    "if err != nil { return fmt.Errorf(\"read %s: %w\", path, err) }",
    "def forward(self, x): return self.proj(x) * 0.5",
    "x = [1, 2, 3]; y = {\"a\": 1, \"b\": 2}",
]

# Characters kept out of the training text: they reach the tokenizers only through the
# test sentences, so they take byte fallback (llama) or <unk> (opts).
RARE = "🙂🚀🎉∑∫≈√★☃€£¥©®™"

SENTENCES = [
    "",
    " ",
    "  ",
    "\n",
    "hello",
    "Hello world",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "inner   spaces   here",
    "tab\tseparated\tvalues",
    "line one\nline two\n",
    "\n\nparagraph\n\n",
    "The quick brown fox jumps over the lazy dog.",
    "café naïve über résumé Ångström",
    "日本語のテキストと中文",
    "emoji 🙂 and rocket 🚀!",
    "∑ of √ values ≈ 3.14159 € £ ¥",
    "numbers 1234567890 and 2024-01-15",
    "func main() { fmt.Println(\"héllo, 世界\") }",
    "Привет мир, καλημέρα κόσμε",
    "<s> and </s> and <unk> are just text here",
    "[SEP] user defined [SEP][SEP] symbols <ctrl> stay",
    "the\u2581lower one eighth block \u2581 in the input",
    "full-width ＡＢＣ１２３ and ligature ﬁ and Ⅻ",
    "replacement char \ufffd in the text",
    "roman \u2160\u2161 and \u2160 \u2161 numerals",
    "composed e\u0301 and zero\u200bwidth and no-break\u00a0space and ideographic\u3000space",
    "control \u0001\u0002 chars and NUL \u0000 too",
    "tokenizertokenizertokenizertokenizer",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    " ".join(ACCENTED[:8]) + " " + "".join(CJK[:4]) + " " + RARE,
]


def make_corpus(path):
    """Writes a deterministic training text, one sentence per line."""
    rng = random.Random(20240615)
    lines = []
    for _ in range(6000):
        kind = rng.random()
        n = rng.randint(3, 16)
        if kind < 0.55:
            words = [rng.choice(WORDS) for _ in range(n)]
        elif kind < 0.7:
            words = [rng.choice(WORDS + ACCENTED) for _ in range(n)]
        elif kind < 0.78:
            words = [rng.choice(GREEK_CYRILLIC + WORDS) for _ in range(n)]
        elif kind < 0.86:
            words = ["".join(rng.choice(CJK) for _ in range(rng.randint(1, 4))) for _ in range(n)]
        elif kind < 0.93:
            words = [rng.choice(CODE)]
        else:
            words = [rng.choice(WORDS) for _ in range(n // 2)] + [str(rng.randint(0, 10**rng.randint(1, 8)))]
        line = " ".join(words)
        if rng.random() < 0.3:
            line = line[0].upper() + line[1:]
        if rng.random() < 0.5:
            line += rng.choice([".", "!", "?", ",", ";", ":"])
        if rng.random() < 0.05:
            line = "  " + line.replace(" ", "   ", 2)
        lines.append(line)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def train(corpus, prefix, args):
    # Relative paths in the working directory: the model records them in its trainer_spec,
    # so that the committed file does not change with the temporary directory's name.
    cwd = os.path.dirname(prefix)
    cmd = ["spm_train", "--input=" + os.path.basename(corpus), "--model_prefix=" + os.path.basename(prefix),
           "--model_type=bpe", "--num_threads=1", "--minloglevel=2"] + args
    subprocess.run(cmd, check=True, cwd=cwd)
    return prefix + ".model"


def spm_vectors(model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    cases = []
    for s in SENTENCES:
        ids = sp.encode(s)
        cases.append({"text": s, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids], "decoded": sp.decode(ids)})
    # Every id decoded alone, and invalid UTF-8 from byte pieces.
    return {
        "model": os.path.basename(model_path),
        "sentencepiece_version": spm.__version__,
        "vocab_size": sp.get_piece_size(),
        "bos": sp.bos_id(),
        "eos": sp.eos_id(),
        "unk": sp.unk_id(),
        "cases": cases,
        "decode": [{"ids": ids, "decoded": sp.decode(ids)} for ids in decode_cases(sp)],
    }


def decode_cases(sp):
    """Id sequences whose decoding is checked on its own: control and unknown ids, and
    byte pieces that do not form valid UTF-8."""
    specials = [i for i in (sp.bos_id(), sp.eos_id()) if i >= 0]
    out = [specials, [sp.unk_id()], specials[:1] + sp.encode("hello world") + specials[1:],
           [sp.unk_id()] * 2 + sp.encode(" x ") + [sp.unk_id()]]
    byte = lambda b: sp.piece_to_id("<0x%02X>" % b)
    if sp.id_to_piece(byte(0x41)) == "<0x41>":
        out.append([byte(0xE6), byte(0x97)])  # truncated 日
        out.append([byte(0xFF), byte(0x41)] + sp.encode(" ok"))
        out.append(sp.encode("hi") + [byte(0xF0), byte(0x9F), byte(0x99), byte(0x82)])
    return out


def hf_tokenizer_json(model_path):
    """The tokenizer.json transformers' LlamaConverter makes of a sentencepiece BPE model."""
    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = sp.get_piece_size()
    vocab_scores = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(n)]
    vocab_scores[:3] = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    vocab = {p: i for i, (p, _) in enumerate(vocab_scores)}
    merges = []
    for piece, score in vocab_scores:
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    special = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        ]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            # The "a b" string form LLaMA-2 and TinyLlama ship (newer tokenizers write
            # ["a", "b"] arrays; the Go test rewrites the file that way and expects the same).
            "merges": [m[0] + " " + m[1] for m in merges],
        },
    }


def hf_variant(base, variant):
    """Rewrites tokenizer.json the way hfVariant in data/hftokenizer_test.go does (the
    variants are not committed, only their vectors):
      metaspace  the form transformers writes for LLaMA with legacy=False: no normalizer, a
                 Metaspace pre-tokenizer (prepend_scheme "first", no split); merges in the
                 ["a", "b"] array form.
      split      a Metaspace pre-tokenizer that splits words (prepend_scheme "always") and
                 a Metaspace decoder.
      unk        no byte fallback: unknown characters become <unk>, runs of them fused.
      unk-nofuse no byte fallback, no fusing: one <unk> per unknown character.
    """
    t = json.loads(json.dumps(base))
    if variant.startswith("unk"):
        t["model"]["byte_fallback"] = False
        t["model"]["fuse_unk"] = variant == "unk"
        return t
    t["normalizer"] = None
    if variant == "metaspace":
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        t["model"]["merges"] = [m.split(" ") for m in t["model"]["merges"]]
    elif variant == "split":
        meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
        t["pre_tokenizer"] = meta
        t["decoder"] = meta
    else:
        raise ValueError(variant)
    return t


HF_JS = r"""
const fs = require('fs');
const { Tokenizer } = require('tokenizers');
const [tokPath, sentPath, outPath] = process.argv.slice(1);
(async () => {
  const tok = Tokenizer.fromFile(tokPath);
  const { sentences, decodeIds } = JSON.parse(fs.readFileSync(sentPath, 'utf8'));
  const cases = [];
  for (const text of sentences) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    cases.push({ text, ids, pieces: enc.getTokens(), decoded: await tok.decode(ids, true) });
  }
  const decode = [];
  for (const ids of decodeIds) {
    decode.push({ ids, decoded: await tok.decode(ids, true), decoded_special: await tok.decode(ids, false) });
  }
  fs.writeFileSync(outPath, JSON.stringify({ library: 'tokenizers (npm, Rust)', version: require('tokenizers/package.json').version, cases, decode }, null, 1) + '\n');
})().catch((e) => { console.error(e); process.exit(1); });
"""


def hf_vectors(tok_json, decode_ids, out, tmp):
    env = dict(os.environ)
    probe = subprocess.run(["node", "-e", "require('tokenizers')"], env=env, capture_output=True)
    if probe.returncode != 0:
        npm_dir = os.path.join(tmp, "npm")
        if not os.path.isdir(npm_dir):
            os.makedirs(npm_dir)
            subprocess.run(["npm", "install", "--silent", "--prefix", npm_dir, "tokenizers@0.23.2"], check=True)
        env["NODE_PATH"] = os.path.join(npm_dir, "node_modules")
    sent = os.path.join(tmp, "sentences.json")
    with open(sent, "w", encoding="utf-8") as f:
        json.dump({"sentences": SENTENCES, "decodeIds": decode_ids}, f)
    subprocess.run(["node", "-e", HF_JS, tok_json, sent, out], check=True, env=env)
    with open(out, encoding="utf-8") as f:
        write_json(out, json.load(f))


def write_rules(path):
    """Writes sentencepiece normalization rules: source code points, tab, target."""
    lines = ["%X\t%X" % (c, c - 0xFF01 + 0x21) for c in range(0xFF01, 0xFF5F)]  # full width
    lines += [
        "FB01\t66 69",  # ligature ﬁ -> fi
        "FB02\t66 6C",  # ligature ﬂ -> fl
        "216B\t58 49 49",  # Ⅻ -> XII
        "65 301\tE9",  # e + combining acute -> é (a two-code-point source)
        "A0\t20",  # no-break space -> space
        "3000\t20",  # ideographic space -> space
        "9\t20",  # tab -> space
        "200B\t",  # zero-width space -> nothing
        "2160\t49",  # Ⅰ -> I
        "2161\t49 49",  # Ⅱ -> II
        "2160 2161\t58",  # ⅠⅡ -> X: the longest rule wins
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_json(path, obj):
    """Writes obj as JSON with each element of a top-level list value on one line."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            items = ",\n  ".join(json.dumps(x, ensure_ascii=False) for x in v)
            parts.append(" %s: [\n  %s\n ]" % (json.dumps(k), items))
        else:
            parts.append(" %s: %s" % (json.dumps(k), json.dumps(v, ensure_ascii=False)))
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(parts) + "\n}\n")


def write_tokenizer_json(path, obj):
    """Writes a tokenizer.json the way tokenizers does (pretty, two-space indent)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        corpus = os.path.join(tmp, "corpus.txt")
        make_corpus(corpus)
        with open(corpus, "a", encoding="utf-8") as f:  # user-defined symbols in context
            f.write("a [SEP] b\n" * 20)
        llama = train(corpus, os.path.join(tmp, "llama"), [
            "--vocab_size=1000", "--character_coverage=0.9995", "--byte_fallback=true", "--split_digits=true",
            "--allow_whitespace_only_pieces=true", "--remove_extra_whitespaces=false",
            "--normalization_rule_name=identity", "--add_dummy_prefix=true",
        ])
        rules = os.path.join(tmp, "rules.tsv")
        write_rules(rules)
        opts = train(corpus, os.path.join(tmp, "opts"), [
            "--normalization_rule_tsv=" + os.path.basename(rules), "--vocab_size=400", "--character_coverage=0.995", "--user_defined_symbols=[SEP],☃",
            "--control_symbols=<ctrl>", "--bos_id=-1", "--eos_id=1", "--unk_id=2", "--pad_id=0",
        ])
        for model in (llama, opts):
            name = os.path.splitext(os.path.basename(model))[0]
            shutil.copy(model, os.path.join(OUT, name + ".model"))
            write_json(os.path.join(OUT, name + ".json"), spm_vectors(model))
        tok_json = os.path.join(OUT, "llama.tokenizer.json")
        base = hf_tokenizer_json(llama)
        write_tokenizer_json(tok_json, base)
        sp = spm.SentencePieceProcessor(model_file=llama)
        hf_vectors(tok_json, decode_cases(sp), os.path.join(OUT, "llama.hf.json"), tmp)
        for variant in ("metaspace", "split", "unk", "unk-nofuse"):
            path = os.path.join(tmp, variant + ".tokenizer.json")
            write_tokenizer_json(path, hf_variant(base, variant))
            hf_vectors(path, decode_cases(sp), os.path.join(OUT, "llama.hf-%s.json" % variant), tmp)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
