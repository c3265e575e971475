package data

import (
	"bytes"
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
	tests := []struct {
		name    string
		wantErr []string // substrings of the error; nil = success
	}{
		{"byte", nil},
		{"", nil},
		{"bpe", []string{`"bpe"`, `"byte"`}},
		{"Byte", []string{`"Byte"`, `"byte"`}},
		{"sentencepiece", []string{`"sentencepiece"`, `"byte"`, "later version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := NewTokenizer(tt.name)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if tok.Name() != "byte" || tok.VocabSize() != 256 {
					t.Errorf("got %s with vocab %d, want byte with 256", tok.Name(), tok.VocabSize())
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
