package data

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
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
