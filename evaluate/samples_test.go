package evaluate

import (
	"slices"
	"strings"
	"testing"

	"distflash/config"
	"distflash/data"
	"distflash/weights"
)

// TestEvalSamples: BOS, truncation to seq_len, which bytes count, skipped short documents.
func TestEvalSamples(t *testing.T) {
	tok := data.ByteTokenizer{}
	ids := func(s string) []int32 { return tok.Encode([]byte(s)) }
	for _, tc := range []struct {
		doc     string
		bos     int32
		seqLen  int
		ok      bool
		in, tg  []int32
		nbytes  int
		comment string
	}{
		{"abc", 1, 10, true, append([]int32{1}, ids("ab")...), ids("abc"), 3, "BOS predicts every byte"},
		{"abc", -1, 10, true, ids("ab"), ids("bc"), 2, "without BOS the first byte is context only"},
		{"abcdef", 1, 3, true, append([]int32{1}, ids("ab")...), ids("abc"), 3, "cut to seq_len inputs and targets"},
		{"abcdef", -1, 3, true, ids("abc"), ids("bcd"), 3, "cut without BOS"},
		{"a", 1, 10, true, []int32{1}, ids("a"), 1, "one byte with BOS"},
		{"a", -1, 10, false, nil, nil, 0, "one byte without BOS predicts nothing"},
		{"é!", 1, 2, true, append([]int32{1}, ids("é")[:1]...), ids("é"), 2, "é is two bytes, both predicted"},
	} {
		s, ok, err := NewSample([]byte(tc.doc), tok, tc.bos, tc.seqLen, 256)
		if err != nil || ok != tc.ok || !slices.Equal(s.IDs, tc.in) || !slices.Equal(s.Targets, tc.tg) || s.Bytes != tc.nbytes {
			t.Errorf("%s: %q bos %d seq %d: got %v %v %d bytes ok %v err %v; want %v %v %d bytes ok %v",
				tc.comment, tc.doc, tc.bos, tc.seqLen, s.IDs, s.Targets, s.Bytes, ok, err, tc.in, tc.tg, tc.nbytes, tc.ok)
		}
	}
	if _, _, err := NewSample([]byte("é"), tok, 1, 10, 128); err == nil || !strings.Contains(err.Error(), "vocabulary of 128") {
		t.Errorf("byte 0xc3 with a vocabulary of 128: %v", err)
	}
	var docs [][]byte
	for _, d := range []string{"x", "hello", "y", "world", "again"} {
		docs = append(docs, []byte(d))
	}
	ss, err := CollectSamples(docs, tok, -1, 8, 256, 2)
	if err != nil || len(ss) != 2 || string(tok.Decode(ss[1].Targets)) != "orld" {
		t.Errorf("collectSamples skips one-byte documents and stops at n: %v, %v", ss, err)
	}
}

// TestConfigForRefusesModelKeys: --set model.* is refused for a checkpoint or a Hugging Face
// directory, which bring their own shape, and taken for a .safetensors file, whose shape the
// config gives.
func TestConfigForRefusesModelKeys(t *testing.T) {
	cfg := config.Default()
	if err := cfg.Model.Resolve(); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"checkpoint", "hf"} {
		em := weights.Model{Config: cfg.Model, Source: src, Path: "m"}
		if _, err := ConfigFor(cfg, em, "", []string{"model.sliding_window=8"}, "eval"); err == nil || !strings.Contains(err.Error(), "model.sliding_window=8") {
			t.Errorf("%s: --set model.sliding_window: %v", src, err)
		}
		if _, err := ConfigFor(cfg, em, "", []string{"eval.samples=3"}, "eval"); err != nil {
			t.Errorf("%s: --set eval.samples: %v", src, err)
		}
	}
	em := weights.Model{Config: cfg.Model, Source: "safetensors", Path: "m.safetensors"}
	if _, err := ConfigFor(cfg, em, "", []string{"model.sliding_window=8"}, "eval"); err != nil {
		t.Errorf("safetensors: --set model.sliding_window: %v", err)
	}
}
