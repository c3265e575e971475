package data

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tokVectors is a file written by scripts/tokenizer_vectors.py: sentences with the ids and
// decoded text the reference library gave, and id sequences with their decoded text.
type tokVectors struct {
	VocabSize int   `json:"vocab_size"`
	BOS       int32 `json:"bos"`
	EOS       int32 `json:"eos"`
	Unk       int32 `json:"unk"`
	Cases     []struct {
		Text    string   `json:"text"`
		IDs     []int32  `json:"ids"`
		Pieces  []string `json:"pieces"`
		Decoded string   `json:"decoded"`
	} `json:"cases"`
	Decode []struct {
		IDs     []int32 `json:"ids"`
		Decoded string  `json:"decoded"`
	} `json:"decode"`
}

func readVectors(t *testing.T, name string) tokVectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "tok", name))
	if err != nil {
		t.Fatal(err)
	}
	var v tokVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(v.Cases) < 20 {
		t.Fatalf("%s: only %d cases", name, len(v.Cases))
	}
	return v
}

func loadSPM(t testing.TB, name string) *SentencePiece {
	t.Helper()
	tok, err := LoadSentencePiece(filepath.Join("testdata", "tok", name))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestSentencePieceVectors compares Encode and Decode with Debian's python3-sentencepiece
// on models trained by spm_train: llama.model (LLaMA's settings: identity normalization,
// byte fallback, split digits) and opts.model (a character map, extra whitespace removed,
// no byte fallback, user-defined and control symbols, other special ids).
func TestSentencePieceVectors(t *testing.T) {
	for _, name := range []string{"llama", "opts"} {
		t.Run(name, func(t *testing.T) {
			tok := loadSPM(t, name+".model")
			v := readVectors(t, name+".json")
			if tok.VocabSize() != v.VocabSize {
				t.Errorf("VocabSize = %d, want %d", tok.VocabSize(), v.VocabSize)
			}
			if bos, eos := tok.Specials(); bos != v.BOS || eos != v.EOS {
				t.Errorf("Specials = %d, %d, want %d, %d", bos, eos, v.BOS, v.EOS)
			}
			for _, c := range v.Cases {
				got := tok.Encode([]byte(c.Text))
				if !slices.Equal(got, c.IDs) {
					t.Errorf("Encode(%q)\n got %v\n     %q\nwant %v\n     %q", c.Text, got, pieces(tok, got), c.IDs, c.Pieces)
				}
				if d := tok.Decode(c.IDs); string(d) != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
				if got := tok.AppendEncode([]int32{-5}, []byte(c.Text)); got[0] != -5 || !slices.Equal(got[1:], c.IDs) {
					t.Errorf("AppendEncode(%q) = %v, want -5 then %v", c.Text, got, c.IDs)
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

func pieces(tok interface{ Piece(int32) string }, ids []int32) []string {
	var p []string
	for _, id := range ids {
		p = append(p, tok.Piece(id))
	}
	return p
}

// TestLoadSentencePieceErrors checks that models the tokenizer cannot run exactly are
// refused with an error naming the file and the setting. The broken models are llama.model
// with bytes appended: a repeated message field merges into the first in protobuf, so an
// appended trainer_spec overrides single settings.
func TestLoadSentencePieceErrors(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "tok", "llama.model"))
	if err != nil {
		t.Fatal(err)
	}
	trainerSpec := func(field ...byte) []byte { return append([]byte{0x12, byte(len(field))}, field...) }
	tests := []struct {
		name    string
		data    []byte
		wantErr []string
	}{
		{"unigram", append(slices.Clip(good), trainerSpec(0x18, 1)...), []string{"model_type UNIGRAM", "only BPE"}},
		{"char", append(slices.Clip(good), trainerSpec(0x18, 4)...), []string{"model_type CHAR", "only BPE"}},
		{"suffix", append(slices.Clip(good), trainerSpec(0xC0, 0x01, 1)...), []string{"treat_whitespace_as_suffix"}},
		{"bytes without fallback", append(slices.Clip(good), trainerSpec(0x98, 0x02, 0)...), []string{`"<0x00>"`, "byte_fallback is false"}},
		{"denormalizer", append(slices.Clip(good), 0x2A, 4, 0x12, 2, 'x', 'y'), []string{"denormalizer"}},
		{"duplicate piece", append(slices.Clip(good), 0x0A, 7, 0x0A, 3, '<', 's', '>', 0x18, 3), []string{`"<s>"`, "already defined"}},
		{"truncated", good[:len(good)/2], []string{"protobuf", "runs past the end"}},
		{"group", []byte{0x0B}, []string{"protobuf", "wire type 3"}},
		{"empty", nil, []string{"no pieces"}},
		{"text", []byte("# a vocabulary file?\n"), []string{"protobuf"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokenizer.model")
			if err := os.WriteFile(path, tt.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadSentencePiece(path)
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
}

// roundTripText returns deterministic texts from a pool of ASCII, whitespace, control
// characters, accented Latin, Cyrillic, CJK and emoji: every kind of character the test
// models have as pieces, as byte fallback or not at all.
func roundTripText() []string {
	pool := []rune("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,;:!?-_()[]{}<>/\\\"'   \n\n\t\x00\x01\x7féèêëçñüßÅ∑√€日本語中文한국어🙂🚀🎉")
	r := newRNG(7, 0, 0)
	var out []string
	for n := range 300 {
		var b strings.Builder
		for range n%40 + 1 {
			b.WriteRune(pool[r.intn(len(pool))])
		}
		out = append(out, b.String())
	}
	return out
}

// TestEncodeDecodeRoundTrip checks Decode(Encode(text)) == text on random valid UTF-8
// text for the tokenizers whose normalization changes nothing (LLaMA's settings), and that
// every id is inside the vocabulary.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	hf, err := LoadHFTokenizer(hfVariant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []Tokenizer{loadSPM(t, "llama.model"), hf} {
		for _, text := range roundTripText() {
			ids := tok.Encode([]byte(text))
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("%T: Encode(%q) gave id %d outside [0, %d)", tok, text, id, tok.VocabSize())
				}
			}
			if got := tok.Decode(ids); string(got) != text {
				t.Errorf("%T: Decode(Encode(%q)) = %q", tok, text, got)
			}
		}
	}
}

// TestEncodeLinesIndependently checks that encoding line by line (what the tokenizers do
// when no piece holds a newline) gives the ids of encoding the whole text at once.
func TestEncodeLinesIndependently(t *testing.T) {
	text := []byte(strings.Join(roundTripText(), "\n"))
	if readme, err := os.ReadFile(filepath.Join("..", "README.md")); err == nil {
		text = append(text, readme...)
	}
	for _, name := range []string{"llama.model", "opts.model"} {
		tok := loadSPM(t, name)
		if !tok.splitLines {
			t.Fatalf("%s: no piece holds a newline, yet lines are not split", name)
		}
		whole := *tok
		whole.splitLines = false
		if a, b := tok.Encode(text), whole.Encode(text); !slices.Equal(a, b) {
			t.Errorf("%s: line by line %d ids, whole text %d ids, or they differ", name, len(a), len(b))
		}
	}
	for _, variant := range []string{"", "metaspace"} {
		hf, err := LoadHFTokenizer(hfVariant(t, variant))
		if err != nil {
			t.Fatal(err)
		}
		if !hf.splitLines {
			t.Fatalf("tokenizer.json %q: lines are not split", variant)
		}
		whole := *hf
		whole.splitLines = false
		if a, b := hf.Encode(text), whole.Encode(text); !slices.Equal(a, b) {
			t.Errorf("tokenizer.json %q: line by line %d ids, whole text %d ids, or they differ", variant, len(a), len(b))
		}
	}
}

// TestEncodeLongWord encodes a 256 KiB "word" (no space, no newline): BPE with a priority
// queue takes milliseconds, a quadratic merge loop would take minutes.
func TestEncodeLongWord(t *testing.T) {
	text := bytes.Repeat([]byte("tokenizer"), 256<<10/9)
	hf, err := LoadHFTokenizer(hfVariant(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []Tokenizer{loadSPM(t, "llama.model"), hf} {
		ids := tok.Encode(text)
		if len(ids) >= len(text)/2 {
			t.Errorf("%T: %d ids for %d bytes: hardly merged", tok, len(ids), len(text))
		}
		if got := tok.Decode(ids); !bytes.Equal(got, text) {
			t.Errorf("%T: Decode(Encode(long word)) differs", tok)
		}
	}
}

// TestSentencePieceConcurrent encodes from several goroutines at once (run with -race).
func TestSentencePieceConcurrent(t *testing.T) {
	tok := loadSPM(t, "llama.model")
	texts := roundTripText()
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode([]byte(s))
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

// benchText is a few MB of real text: Go sources from the toolchain (as the default
// training corpus), or the test sentences repeated when GOROOT cannot be read.
func benchText(b *testing.B) []byte {
	b.Helper()
	var text []byte
	if root, err := ExpandPath("$GOROOT/src/net/http"); err == nil {
		files, _ := filepath.Glob(filepath.Join(root, "*.go"))
		for _, f := range files {
			if c, err := os.ReadFile(f); err == nil {
				text = append(text, c...)
			}
			if len(text) > 4<<20 {
				break
			}
		}
	}
	for len(text) < 4<<20 {
		text = append(text, strings.Join(roundTripText(), "\n")...)
	}
	return text
}

// BenchmarkEncode measures Encode throughput (MB/s of input text) for each tokenizer: bytes,
// the LLaMA-2-style test models (SentencePiece llama.model and its tokenizer.json, 1000
// pieces) and LLaMA-3's real tokenizer.json (128256 tokens).
func BenchmarkEncode(b *testing.B) {
	text := benchText(b)
	hf, err := LoadHFTokenizer(hfVariant(b, ""))
	if err != nil {
		b.Fatal(err)
	}
	llama3, err := LoadHFTokenizer(llama3Variant(b, ""))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tok  Tokenizer
	}{
		{"byte", ByteTokenizer{}},
		{"llama2-spm", loadSPM(b, "llama.model")},
		{"llama2-hf", hf},
		{"llama3-hf", llama3},
	} {
		tok := tc.tok
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var n int
			for b.Loop() {
				n = len(tok.Encode(text))
			}
			b.ReportMetric(float64(len(text))/float64(n), "bytes/token")
		})
	}
}

// BenchmarkLoadLlama3 measures reading LLaMA-3's tokenizer.json (9 MB, 280147 merges).
func BenchmarkLoadLlama3(b *testing.B) {
	path := llama3Variant(b, "")
	for b.Loop() {
		if _, err := LoadHFTokenizer(path); err != nil {
			b.Fatal(err)
		}
	}
}
