package data

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hfVariant rewrites llama.tokenizer.json as hf_variant in scripts/tokenizer_vectors.py
// does and returns the path of the result; "" gives the committed file.
func hfVariant(t testing.TB, variant string) string {
	t.Helper()
	base := filepath.Join("testdata", "tok", "llama.tokenizer.json")
	if variant == "" {
		return base
	}
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if variant != "unk" && variant != "unk-nofuse" {
		f["normalizer"] = nil
	}
	switch variant {
	case "unk", "unk-nofuse":
		model := f["model"].(map[string]any)
		model["byte_fallback"] = false
		model["fuse_unk"] = variant == "unk"
	case "metaspace":
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false}
		model := f["model"].(map[string]any)
		merges := model["merges"].([]any)
		for i, m := range merges {
			merges[i] = strings.Split(m.(string), " ")
		}
	case "split":
		meta := map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true}
		f["pre_tokenizer"] = meta
		f["decoder"] = meta
	default:
		t.Fatalf("unknown variant %q", variant)
	}
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHFTokenizerVectors compares Encode and Decode with Hugging Face's tokenizers library
// (Rust, through its npm binding) on the tokenizer.json converted from llama.model as
// transformers' LlamaConverter does, and on rewrites of it (Metaspace pre-tokenizer with
// array merges; splitting Metaspace with its decoder; no byte fallback, with and without
// fusing unknown tokens).
func TestHFTokenizerVectors(t *testing.T) {
	for _, variant := range []string{"", "metaspace", "split", "unk", "unk-nofuse"} {
		name := "llama.hf.json"
		if variant != "" {
			name = "llama.hf-" + variant + ".json"
		}
		t.Run(name, func(t *testing.T) {
			tok, err := LoadHFTokenizer(hfVariant(t, variant))
			if err != nil {
				t.Fatal(err)
			}
			v := readVectors(t, name)
			for _, c := range v.Cases {
				got := tok.Encode([]byte(c.Text))
				if !slices.Equal(got, c.IDs) {
					t.Errorf("Encode(%q)\n got %v\n     %q\nwant %v\n     %q", c.Text, got, pieces(tok, got), c.IDs, c.Pieces)
				}
				if d := tok.Decode(c.IDs); string(d) != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
			}
			for _, c := range v.Decode {
				if d := tok.Decode(c.IDs); string(d) != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
			}
		})
	}
}

// TestHFMatchesSentencePiece checks the converted tokenizer.json against the model it was
// converted from: the same ids on every sentence except the one that spells out "<s>",
// "</s>" and "<unk>", which tokenizers takes as the special tokens and sentencepiece as
// text.
func TestHFMatchesSentencePiece(t *testing.T) {
	hf, err := LoadHFTokenizer(hfVariant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	sp := loadSPM(t, "llama.model")
	if hf.VocabSize() != sp.VocabSize() {
		t.Errorf("VocabSize %d, sentencepiece %d", hf.VocabSize(), sp.VocabSize())
	}
	hb, he := hf.Specials()
	sb, se := sp.Specials()
	if hb != sb || he != se || hb != 1 || he != 2 {
		t.Errorf("Specials %d, %d; sentencepiece %d, %d; want 1, 2", hb, he, sb, se)
	}
	differ := 0
	for _, c := range readVectors(t, "llama.json").Cases {
		got := hf.Encode([]byte(c.Text))
		if !slices.Equal(got, c.IDs) {
			differ++
			if !strings.Contains(c.Text, "<s>") {
				t.Errorf("Encode(%q) = %v, sentencepiece %v", c.Text, got, c.IDs)
			}
		}
	}
	if differ != 1 {
		t.Errorf("%d sentences differ from sentencepiece, want 1 (the one with \"<s>\" in it)", differ)
	}
}

// TestHFTokenizerConfig checks that tokenizer_config.json beside tokenizer.json names BOS
// and EOS (string, object and null forms) and that a bad one is an error naming it.
func TestHFTokenizerConfig(t *testing.T) {
	src, err := os.ReadFile(hfVariant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		config   string
		bos, eos int32
		wantErr  []string
	}{
		{"", 1, 2, nil},
		{`{"bos_token": "</s>", "eos_token": {"__type": "AddedToken", "content": "<unk>"}}`, 2, 0, nil},
		{`{"bos_token": null, "eos_token": "<0x0A>"}`, -1, 13, nil},
		{`{"bos_token": "<bos>"}`, 0, 0, []string{"tokenizer_config.json", "bos_token", `"<bos>"`}},
		{`{"eos_token": 7}`, 0, 0, []string{"tokenizer_config.json", "eos_token = 7"}},
		{`{"eos_token": `, 0, 0, []string{"tokenizer_config.json", "unexpected end"}},
	}
	for _, tt := range tests {
		t.Run(tt.config, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "tokenizer.json")
			if err := os.WriteFile(path, src, 0o644); err != nil {
				t.Fatal(err)
			}
			if tt.config != "" {
				if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tt.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tok, err := LoadHFTokenizer(path)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatal("no error")
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %s", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.eos == 13 && tok.Piece(13) != "<0x0A>" {
				t.Fatalf("test assumes id 13 is <0x0A>, it is %q", tok.Piece(13))
			}
			if bos, eos := tok.Specials(); bos != tt.bos || eos != tt.eos {
				t.Errorf("Specials = %d, %d, want %d, %d", bos, eos, tt.bos, tt.eos)
			}
		})
	}
}

// splitByteLevel is a pre_tokenizer as LLaMA-3 has it: Split by pattern, then ByteLevel.
func splitByteLevel(pattern, behavior string, invert bool) map[string]any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": behavior, "invert": invert},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
}

// TestLoadHFTokenizerErrors checks that unsupported or broken tokenizer.json files are
// refused with an error naming the file, the key and what is supported.
func TestLoadHFTokenizerErrors(t *testing.T) {
	src, err := os.ReadFile(hfVariant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	var base map[string]any
	if err := json.Unmarshal(src, &base); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		edit    func(f, model map[string]any)
		wantErr []string
	}{
		{"unigram", func(f, m map[string]any) { m["type"] = "Unigram" }, []string{`model.type "Unigram"`, "only BPE"}},
		{"no model", func(f, m map[string]any) { delete(f, "model") }, []string{"no model"}},
		{"whitespace", func(f, m map[string]any) { f["pre_tokenizer"] = map[string]any{"type": "Whitespace"} },
			[]string{"pre_tokenizer Whitespace", "Metaspace, ByteLevel"}},
		{"other regex", func(f, m map[string]any) { f["pre_tokenizer"] = splitByteLevel(`\w+|\s+`, "Isolated", false) },
			[]string{"pre_tokenizer.pretokenizers[0]", `regular expression "\\w+|\\s+" is not supported`, "LLaMA-3"}},
		{"split removed", func(f, m map[string]any) { f["pre_tokenizer"] = splitByteLevel(llama3Pattern, "Removed", false) },
			[]string{"pre_tokenizer.pretokenizers[0]", `behavior "Removed"`, "Isolated"}},
		{"split inverted", func(f, m map[string]any) { f["pre_tokenizer"] = splitByteLevel(gpt2Pattern, "Isolated", true) },
			[]string{"pre_tokenizer.pretokenizers[0]", "invert true"}},
		{"split regex after", func(f, m map[string]any) {
			p := splitByteLevel(llama3Pattern, "Isolated", false)
			p["pretokenizers"].([]any)[1].(map[string]any)["use_regex"] = true
			f["pre_tokenizer"] = p
		}, []string{"pre_tokenizer.pretokenizers[1]", "use_regex false"}},
		{"template without sequence", func(f, m map[string]any) {
			f["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{}}
		}, []string{"post_processor TemplateProcessing", "no Sequence"}},
		{"bert processing", func(f, m map[string]any) { f["post_processor"] = map[string]any{"type": "BertProcessing"} },
			[]string{"post_processor BertProcessing", "TemplateProcessing"}},
		{"nfkc", func(f, m map[string]any) { f["normalizer"] = map[string]any{"type": "NFKC"} },
			[]string{"normalizer NFKC", "Prepend, Replace"}},
		{"regex replace", func(f, m map[string]any) {
			f["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": "▁"}
		}, []string{"normalizer Replace", "regular expression"}},
		{"bpe decoder", func(f, m map[string]any) { f["decoder"] = map[string]any{"type": "BPEDecoder"} },
			[]string{"decoder BPEDecoder", "ByteFallback"}},
		{"dropout", func(f, m map[string]any) { m["dropout"] = 0.1 }, []string{"model.dropout = 0.1"}},
		{"merge not in vocab", func(f, m map[string]any) { m["merges"] = []any{"▁ zzz"} },
			[]string{"model.merges[0]", `"zzz"`, "not in model.vocab"}},
		{"merged not in vocab", func(f, m map[string]any) { m["merges"] = []any{"a a"} },
			[]string{"model.merges[0]", `"aa"`, "not in model.vocab"}},
		{"bad merge", func(f, m map[string]any) { m["merges"] = []any{"a b c"} }, []string{"model.merges[0]", `"a b c"`}},
		{"bad merge array", func(f, m map[string]any) { m["merges"] = []any{[]any{"a"}} }, []string{"model.merges[0]", `["a"]`}},
		{"unk", func(f, m map[string]any) { m["unk_token"] = "<oov>" }, []string{`model.unk_token "<oov>"`}},
		{"normalized added", func(f, m map[string]any) {
			f["added_tokens"] = []any{map[string]any{"id": 3, "content": "x", "normalized": true}}
		}, []string{`added token "x"`, "normalized"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f map[string]any
			json.Unmarshal(src, &f) // a fresh copy
			model, _ := f["model"].(map[string]any)
			tt.edit(f, model)
			b, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = LoadHFTokenizer(path)
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range append([]string{path}, tt.wantErr...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
	if _, err := LoadHFTokenizer(filepath.Join(t.TempDir(), "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: error %v does not name it", err)
	}
}
