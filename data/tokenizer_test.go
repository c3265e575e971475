package data

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestByteTokenizerRoundTrip(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []struct {
		name string
		text []byte
	}{
		{"empty", nil},
		{"ascii", []byte("package main\n\nfunc main() {}\n")},
		{"utf-8", []byte("héllo, 世界 — ∑ 🚀")},
		{"invalid utf-8", []byte{0xff, 0xfe, 0x80, 'a', 0xc3}},
		{"nul and controls", []byte{0, 1, '\t', '\r', '\n', 0x7f}},
		{"all bytes", all},
	}
	tok := ByteTokenizer{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := tok.Encode(tt.text)
			if len(ids) != len(tt.text) {
				t.Fatalf("Encode gave %d ids for %d bytes", len(ids), len(tt.text))
			}
			for i, id := range ids {
				if id != int32(tt.text[i]) {
					t.Fatalf("id %d = %d, want byte value %d", i, id, tt.text[i])
				}
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("id %d = %d outside the vocabulary [0, %d)", i, id, tok.VocabSize())
				}
			}
			if got := tok.Decode(ids); !bytes.Equal(got, tt.text) {
				t.Errorf("Decode(Encode(%q)) = %q", tt.text, got)
			}
			if got := tok.AppendEncode([]int32{-7}, tt.text); len(got) != len(ids)+1 || got[0] != -7 {
				t.Errorf("AppendEncode lost the prefix or the tokens: %v", got)
			}
		})
	}
}

func TestByteTokenizerDecodeOutOfRange(t *testing.T) {
	got := ByteTokenizer{}.Decode([]int32{'a', 256, -1, 'b'})
	if want := "a\uFFFD\uFFFDb"; string(got) != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
}

func TestNewTokenizer(t *testing.T) {
	tokDir, err := filepath.Abs(filepath.Join("testdata", "tok"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DISTFLASH_TOK_DIR", tokDir)
	hfDir := t.TempDir() // a model directory as Hugging Face lays it out: both files
	spDir := t.TempDir() // only tokenizer.model
	for _, c := range []struct{ src, dir, dst string }{
		{"llama.tokenizer.json", hfDir, "tokenizer.json"},
		{"llama.model", hfDir, "tokenizer.model"},
		{"llama.model", spDir, "tokenizer.model"},
	} {
		b, err := os.ReadFile(filepath.Join(tokDir, c.src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.dir, c.dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	empty := t.TempDir()
	junk := filepath.Join(empty, "junk.model")
	if err := os.WriteFile(junk, []byte{0x0a, 0x7f, 1}, 0o644); err != nil {
		t.Fatal(err)
	}
	tiktoken := filepath.Join(t.TempDir(), "tokenizer.model")
	if err := os.WriteFile(tiktoken, []byte("IQ== 0\nIg== 1\nIw== 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badJSON := filepath.Join(empty, "bad.json")
	if err := os.WriteFile(badJSON, []byte(`  {"model": {"type": "WordPiece"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		wantType  string // "byte", "spm", "hf"
		wantVocab int
		wantErr   []string // substrings of the error; nil = success
	}{
		{"byte", "byte", 256, nil},
		{"", "byte", 256, nil},
		{filepath.Join(tokDir, "llama.model"), "spm", 1000, nil},
		{"$DISTFLASH_TOK_DIR/opts.model", "spm", 400, nil},
		{filepath.Join(tokDir, "llama.tokenizer.json"), "hf", 1000, nil},
		{hfDir, "hf", 1000, nil},
		{spDir, "spm", 1000, nil},
		{"bpe", "", 0, []string{`"bpe"`, `"byte"`, "tokenizer.model", "tokenizer.json"}},
		{"Byte", "", 0, []string{`"Byte"`, `"byte"`}},
		{"$DISTFLASH_NO_SUCH_VAR/tokenizer.model", "", 0, []string{"DISTFLASH_NO_SUCH_VAR", "not set"}},
		{empty, "", 0, []string{empty, "neither tokenizer.json nor tokenizer.model"}},
		{junk, "", 0, []string{"sentencepiece model " + junk, "protobuf"}},
		{badJSON, "", 0, []string{badJSON, `model.type "WordPiece"`, "only BPE"}},
		{tiktoken, "", 0, []string{tiktoken, "tiktoken", "tokenizer.json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := NewTokenizer(tt.name)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				var typ string
				switch tok.(type) {
				case ByteTokenizer:
					typ = "byte"
				case *SentencePiece:
					typ = "spm"
				case *HFTokenizer:
					typ = "hf"
				}
				if typ != tt.wantType || tok.VocabSize() != tt.wantVocab {
					t.Errorf("got %T with vocab %d, want %s with %d", tok, tok.VocabSize(), tt.wantType, tt.wantVocab)
				}
				if want := cmp.Or(tt.name, "byte"); tok.Name() != want {
					t.Errorf("Name = %q, want %q", tok.Name(), want)
				}
				_, special := tok.(SpecialTokens)
				if special != (typ != "byte") {
					t.Errorf("%T implements SpecialTokens: %v", tok, special)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, got %v", tok)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
}
