package evaluate

import (
	"slices"
	"strings"
	"testing"

	"distflash/data"
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
