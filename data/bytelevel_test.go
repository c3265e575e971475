package data

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/data/datatest"
	"unicode/utf8"
)

// llama3Variant writes LLaMA-3's tokenizer.json (fetched by scripts/fetch_llama3_tokenizer.sh) into a
// temporary directory, rewritten as variant in scripts/tokenizer_vectors_llama3.py does
// ("" leaves it as shipped), and returns its path.
func llama3Variant(t testing.TB, variant string) string {
	t.Helper()
	src := datatest.Llama3TokenizerJSON(t, filepath.Join("testdata", "tok", "llama3.tokenizer.json.gz"))
	if variant != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(src, &m); err != nil {
			t.Fatal(err)
		}
		switch variant {
		case "template":
			m["post_processor"] = json.RawMessage(`{"type": "Sequence", "processors": [
				{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
				{"type": "TemplateProcessing",
				 "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
				 "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
				          {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
				 "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}}}]}`)
		case "gpt2", "gpt2-prefix":
			m["pre_tokenizer"] = json.RawMessage(`{"type": "ByteLevel", "add_prefix_space": ` +
				map[bool]string{true: "true", false: "false"}[variant == "gpt2-prefix"] + `, "trim_offsets": true, "use_regex": true}`)
		case "merges":
			model := bytes.Replace(m["model"], []byte(`"ignore_merges": true`), []byte(`"ignore_merges": false`), 1)
			if bytes.Equal(model, m["model"]) {
				t.Fatal("no ignore_merges in tokenizer.json")
			}
			m["model"] = model
		default:
			t.Fatalf("unknown variant %q", variant)
		}
		var err error
		if src, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// llama3Vectors is a file written by scripts/tokenizer_vectors_llama3.py.
type llama3Vectors struct {
	Version   string `json:"version"`
	VocabSize int    `json:"vocab_size"`
	Cases     []struct {
		Text           string   `json:"text"`
		IDs            []int32  `json:"ids"`
		IDsSpecial     []int32  `json:"ids_special"` // add_special_tokens=true, where it differs
		Pieces         []string `json:"pieces"`
		Words          []*int   `json:"words"` // the pre-token of each id
		Decoded        string   `json:"decoded"`
		DecodedSpecial *string  `json:"decoded_special"` // skip_special_tokens=false, where it differs
	} `json:"cases"`
	Decode []struct {
		IDs     []int32 `json:"ids"`
		Decoded string  `json:"decoded"`
	} `json:"decode"`
}

// TestLlama3Vectors compares Encode and Decode with Hugging Face's tokenizers library
// (Rust, through its npm binding) on LLaMA-3's tokenizer.json as shipped, and on rewrites
// of it: Meta's current post-processor (TemplateProcessing adding <|begin_of_text|>), GPT-2's
// pre-tokenizer with and without a prefix space, and BPE without ignore_merges. The
// sentences hold every script, emoji, digit runs, whitespace runs, contractions, code,
// special tokens, and 400 random strings over the characters the regular expressions tell
// apart.
func TestLlama3Vectors(t *testing.T) {
	for _, variant := range []string{"", "template", "gpt2", "gpt2-prefix", "merges"} {
		name := "llama3.hf.json"
		if variant != "" {
			name = "llama3.hf-" + variant + ".json"
		}
		t.Run(name, func(t *testing.T) {
			tok, err := LoadHFTokenizer(llama3Variant(t, variant))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join("testdata", "tok", name))
			if err != nil {
				t.Fatal(err)
			}
			var v llama3Vectors
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			if len(v.Cases) < 400 || len(v.Decode) < 5 {
				t.Fatalf("%s: %d cases, %d decode cases", name, len(v.Cases), len(v.Decode))
			}
			if tok.VocabSize() != v.VocabSize || tok.VocabSize() != 128256 {
				t.Errorf("VocabSize %d, tokenizers %d, want 128256", tok.VocabSize(), v.VocabSize)
			}
			if bos, eos := tok.Specials(); bos != 128000 || eos != 128001 {
				t.Errorf("Specials = %d, %d, want 128000, 128001", bos, eos)
			}
			mismatch, splits, ids := 0, 0, 0
			for _, c := range v.Cases {
				ids += len(c.IDs)
				got := tok.Encode([]byte(c.Text))
				if !slices.Equal(got, c.IDs) {
					if mismatch++; mismatch <= 10 {
						t.Errorf("Encode(%q)\n got %v\n     %q\nwant %v\n     %q", c.Text, got, pieces(tok, got), c.IDs, c.Pieces)
					}
				}
				// The pre-tokens: how many ids each gives, here and in tokenizers.
				var want []int
				for i, w := range c.Words {
					if i == 0 || w == nil || c.Words[i-1] == nil || *w != *c.Words[i-1] {
						want = append(want, 0)
					}
					want[len(want)-1]++
				}
				if got := preTokenSizes(tok, c.Text); !slices.Equal(got, want) {
					if splits++; splits <= 10 {
						t.Errorf("%q: pre-tokens give %v ids each, tokenizers %v", c.Text, got, want)
					}
				}
				if d := tok.Decode(c.IDs); string(d) != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
				// add_special_tokens=true adds BOS only where the file has TemplateProcessing.
				if variant == "template" {
					bos, _ := tok.Specials()
					if want := append([]int32{bos}, c.IDs...); !slices.Equal(c.IDsSpecial, want) {
						t.Errorf("%q: tokenizers with add_special_tokens gives %v, not BOS and the ids", c.Text, c.IDsSpecial)
					}
				} else if c.IDsSpecial != nil {
					t.Errorf("%q: tokenizers adds special tokens %v without a TemplateProcessing", c.Text, c.IDsSpecial)
				}
			}
			for _, c := range v.Decode {
				if d := tok.Decode(c.IDs); string(d) != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
			}
			t.Logf("%s: %d of %d sentences (%d ids) differ from tokenizers %s; %d split otherwise", name, mismatch, len(v.Cases), ids, v.Version, splits)
		})
	}
}

// preTokenSizes is Encode of a byte-level tokenizer without normalizer, returning how many
// ids each pre-token (and each added token) gives.
func preTokenSizes(tok *HFTokenizer, text string) []int {
	var sizes []int
	var w bpeWork
	segment := func(s string) {
		if s == "" {
			return
		}
		if tok.prefixSpace && s[0] != ' ' {
			s = " " + s
		}
		b := []byte(s)
		word := func(i, j int) { sizes = append(sizes, len(tok.encodeBytes(nil, b[i:j], &w))) }
		switch tok.split {
		case splitLlama3:
			scanLlama3(b, word)
		case splitGPT2:
			scanGPT2(b, word)
		default:
			word(0, len(b))
		}
	}
	start := 0
	for i := 0; i < len(text); i++ {
		if a, ok := tok.matchAdded([]byte(text[i:])); ok {
			segment(text[start:i])
			sizes = append(sizes, 1)
			i += len(a.content) - 1
			start = i + 1
		}
	}
	segment(text[start:])
	return sizes
}

// TestLlama3RoundTrip checks Decode(Encode(text)) == text on random text (any valid UTF-8
// but LLaMA-3's special tokens round-trips through byte-level BPE), and that encoding is
// safe from several goroutines at once (run with -race).
func TestLlama3RoundTrip(t *testing.T) {
	tok, err := LoadHFTokenizer(llama3Variant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	// Long pre-tokens too: a 256 KiB word (BPE with a heap stays O(n log n)), a run of
	// digits, of punctuation, of spaces before a word.
	texts := append(roundTripText(), "<|begin_of_text|>", "\u0085\u2028\u3000 \t\r\n\v\f",
		strings.Repeat("tokenizer", 256<<10/9), strings.Repeat("9", 1000), strings.Repeat("!?", 5000),
		strings.Repeat(" ", 10000)+"x")
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode([]byte(s))
		if got := tok.Decode(want[i]); string(got) != s && s != "<|begin_of_text|>" {
			t.Errorf("Decode(Encode(%.40q)) = %.40q", s, got)
		}
		if len(s) > 1<<17 && len(want[i]) > len(s)/2 {
			t.Errorf("%d ids for %.20q, %d bytes: hardly merged", len(want[i]), s, len(s))
		}
	}
	done := make(chan bool)
	for g := range 4 {
		go func() {
			ok := true
			for i := g; i < len(texts); i += 4 {
				ok = ok && slices.Equal(tok.Encode([]byte(texts[i])), want[i])
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Error("concurrent Encode gave other ids")
		}
	}
}

// TestNewTokenizerLlama3 loads LLaMA-3's tokenizer through NewTokenizer from a model
// directory, with a tokenizer_config.json that names an instruct model's EOS, as train,
// eval and data tokenize do.
func TestNewTokenizerLlama3(t *testing.T) {
	path := llama3Variant(t, "")
	dir := filepath.Dir(path)
	cfg := `{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tokenizer_class": "PreTrainedTokenizerFast"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := NewTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 128256 {
		t.Errorf("VocabSize = %d, want 128256", tok.VocabSize())
	}
	if bos, eos := tok.(SpecialTokens).Specials(); bos != 128000 || eos != 128009 {
		t.Errorf("Specials = %d, %d, want 128000, 128009 (<|eot_id|>)", bos, eos)
	}
	text := "Hello world<|eot_id|>"
	if ids := tok.Encode([]byte(text)); !slices.Equal(ids, []int32{9906, 1917, 128009}) {
		t.Errorf("Encode(%q) = %v, want [9906 1917 128009]", text, ids)
	}
	// A shard stores ids above 65535 as uint32.
	shard := filepath.Join(t.TempDir(), "s.tok")
	w, err := CreateShard(shard, tok)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{0, 65535, 65536, 128000, 128255}
	if err := w.WriteDocument(ids, 10); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	h, got, err := ReadShard(shard)
	if err != nil {
		t.Fatal(err)
	}
	if h.TokenBytes != 4 || !slices.Equal(got, ids) {
		t.Errorf("shard: %d bytes per token, ids %v, want 4 and %v", h.TokenBytes, got, ids)
	}
}

// TestPreTokenizerScanners checks the hand-written matchers of LLaMA-3's and GPT-2's
// regular expressions on the cases that decide between alternatives: the lookahead of
// \s+(?!\S), \s*[\r\n]+ backing off to the last newline, digit groups, case-insensitive
// contractions (LLaMA-3 only) and a leading non-letter.
func TestPreTokenizerScanners(t *testing.T) {
	tests := []struct {
		text         string
		llama3, gpt2 []string
	}{
		{"   x", []string{"  ", " x"}, []string{"  ", " x"}},
		{"x   ", []string{"x", "   "}, []string{"x", "   "}},
		{"a \n\n  b", []string{"a", " \n\n", " ", " b"}, []string{"a", " \n\n ", " b"}},
		{"a\r\n \r\nb", []string{"a", "\r\n \r\n", "b"}, []string{"a", "\r\n \r", "\n", "b"}},
		{"1234567", []string{"123", "456", "7"}, []string{"1234567"}},
		{" 12", []string{" ", "12"}, []string{" 12"}},
		{"IT'S it's 'LL", []string{"IT", "'S", " it", "'s", " '", "LL"}, []string{"IT", "'", "S", " it", "'s", " '", "LL"}},
		{"it'ſ", []string{"it", "'ſ"}, []string{"it", "'", "ſ"}},
		{"(hello) x", []string{"(hello", ")", " x"}, []string{"(", "hello", ")", " x"}},
		{"\thi", []string{"\thi"}, []string{"\t", "hi"}},
		{"a!!\n\nb", []string{"a", "!!\n\n", "b"}, []string{"a", "!!", "\n", "\n", "b"}},
		{"x\u00a0y", []string{"x", "\u00a0y"}, []string{"x", "\u00a0", "y"}},
		{"日本語 テキスト", []string{"日本語", " テキスト"}, []string{"日本語", " テキスト"}},
		{"ä\u0301b", []string{"ä", "\u0301b"}, []string{"ä", "\u0301", "b"}},
	}
	scan := func(f func([]byte, func(int, int)), s string) []string {
		var out []string
		f([]byte(s), func(i, j int) { out = append(out, s[i:j]) })
		return out
	}
	for _, tt := range tests {
		if got := scan(scanLlama3, tt.text); !slices.Equal(got, tt.llama3) {
			t.Errorf("LLaMA-3 split of %q = %q, want %q", tt.text, got, tt.llama3)
		}
		if got := scan(scanGPT2, tt.text); !slices.Equal(got, tt.gpt2) {
			t.Errorf("GPT-2 split of %q = %q, want %q", tt.text, got, tt.gpt2)
		}
	}
}

// TestAppendLossyUTF8 checks the replacement of malformed UTF-8 against the examples of
// Unicode's "maximal subpart" practice, which Rust's from_utf8_lossy follows.
func TestAppendLossyUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ok", "ok"},
		{"\xe6\x97", "\uFFFD"},
		{"\xe6\x97a", "\uFFFDa"},
		{"\xff\xfe", "\uFFFD\uFFFD"},
		{"\xf0\x9f\x99", "\uFFFD"},
		{"\xf0\x9f\x99\x82", "🙂"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // a surrogate: ED takes only 80..9F
		{"\xe0\x80\xaf", "\uFFFD\uFFFD\uFFFD"}, // overlong: E0 takes only A0..BF
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"a\x80b", "a\uFFFDb"},
	}
	for _, tt := range tests {
		got := string(appendLossyUTF8(nil, []byte(tt.in)))
		if got != tt.want {
			t.Errorf("lossy(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("lossy(%q) is not valid UTF-8", tt.in)
		}
	}
}
