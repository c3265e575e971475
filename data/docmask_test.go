package data

import (
	"slices"
	"strings"
	"testing"
)

// TestDocStarts: a document starts at each boundary token, and a window that opens inside a
// document continues it from position 0.
func TestDocStarts(t *testing.T) {
	for _, c := range []struct {
		seq, want []int32
	}{
		{[]int32{5, 6, 7}, []int32{0, 0, 0}},
		{[]int32{0, 6, 7}, []int32{0, 0, 0}},
		{[]int32{5, 0, 7, 8, 0}, []int32{0, 1, 1, 1, 4}},
		{[]int32{0, 0, 0}, []int32{0, 1, 2}},
	} {
		got := make([]int32, len(c.seq))
		DocStarts(got, c.seq, 0)
		if !slices.Equal(got, c.want) {
			t.Errorf("DocStarts(%v) = %v, want %v", c.seq, got, c.want)
		}
	}
}

// TestLoadTokensBoundary: with a boundary token the documents are joined by it alone, and a
// document that holds it is refused with its path.
func TestLoadTokensBoundary(t *testing.T) {
	dir := writeTree(t, map[string]string{"a.txt": "one\ntwo", "b.txt": "three"})
	b := int32(0)
	toks, err := LoadTokens(Source{Path: dir, Boundary: &b}, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(ByteTokenizer{}.Decode(toks)), "\x00"); n != 1 || len(toks) != len("one\ntwo")+len("three")+1 {
		t.Errorf("stream %q: want the two documents joined by one NUL", ByteTokenizer{}.Decode(toks))
	}
	// jsonl can carry a NUL inside its text through a \u0000 escape
	bad := writeTree(t, map[string]string{"x.jsonl": `{"text": "a\u0000b"}` + "\n"})
	_, err = LoadTokens(Source{Path: bad, Format: "jsonl", Boundary: &b}, ByteTokenizer{})
	if err == nil || !strings.Contains(err.Error(), "document boundary") || !strings.Contains(err.Error(), bad) {
		t.Errorf("document holding the boundary: err = %v", err)
	}
	_, err = LoadTokens(Source{Path: dir, Format: "tokens", Boundary: &b}, ByteTokenizer{})
	if err == nil || !strings.Contains(err.Error(), "document_mask") {
		t.Errorf("tokens with a boundary: err = %v", err)
	}
	if bt, err := DocumentBoundary(ByteTokenizer{}); err != nil || bt != 0 {
		t.Errorf("DocumentBoundary(byte) = %d, %v; want 0", bt, err)
	}
}

// TestLoaderDocumentsResume: a packing loader yields document starts that match its inputs,
// a document longer than a window runs on into the next window, and a loader restored from
// any state yields bit-identical batches (inputs, targets and document starts).
func TestLoaderDocumentsResume(t *testing.T) {
	// documents of lengths 3, 40 (longer than a window), 1, 7, ... each starting with 0
	var stream []int32
	for i, n := range []int{3, 40, 1, 7, 12, 2, 30, 5} {
		stream = append(stream, 0)
		for j := 0; j < n; j++ {
			stream = append(stream, int32(100+i))
		}
	}
	const T, B = 16, 2
	mk := func() *Loader {
		l := mustLoader(t, stream, T, B, 7)
		l.SetBoundary(0)
		return l
	}
	a := mk()
	var states []LoaderState
	var batches []Batch
	for range 12 {
		states = append(states, a.State())
		batches = append(batches, a.Next())
	}
	sawContinued := false
	for _, bt := range batches {
		for r := 0; r < B; r++ {
			in, ds := bt.Inputs[r*T:(r+1)*T], bt.DocStart[r*T:(r+1)*T]
			for i := range in {
				s := ds[i]
				if s > int32(i) || (in[s] != 0 && s != 0) || slices.Contains(in[s+1:i+1], 0) {
					t.Fatalf("row %v: DocStart %v is not the last boundary at or before each token", in, ds)
				}
				if s == 0 && in[0] != 0 && i == T-1 {
					sawContinued = true // the whole window continues one document
				}
			}
		}
	}
	if !sawContinued {
		t.Error("no window continued a document from the previous window")
	}
	for k, st := range states {
		b := mk()
		if err := b.Restore(st); err != nil {
			t.Fatal(err)
		}
		for _, want := range batches[k:] {
			got := b.Next()
			if !slices.Equal(got.Inputs, want.Inputs) || !slices.Equal(got.Targets, want.Targets) || !slices.Equal(got.DocStart, want.DocStart) {
				t.Fatalf("resumed at %+v: batch differs", st)
			}
		}
	}
	if mustLoader(t, stream, T, B, 7).Next().DocStart != nil {
		t.Error("a loader without a boundary sets DocStart")
	}
}
