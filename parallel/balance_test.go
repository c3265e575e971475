package parallel

import (
	"slices"
	"testing"

	"distflash/model"
)

// TestBalanceDocuments: the balanced order is a permutation that moves whole documents, no
// rank's visible work grows (and for zig-zag under web-like documents the largest falls),
// and attention over the reordered sequence gives every token the output and gradients it
// had in the original order.
func TestBalanceDocuments(t *testing.T) {
	const T, P = 512, 4
	docs := webDocs(T, 3)
	for _, l := range []string{"ring", "burst", "zigzag", "attn2d"} {
		perm, start, err := BalanceDocuments(docs, l, P, 1)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.Clone(perm)
		slices.Sort(sorted)
		for i, p := range sorted {
			if p != int32(i) {
				t.Fatalf("%s: not a permutation of the tokens", l)
			}
		}
		for i, p := range perm { // a token keeps its offset in its document
			if int32(i)-start[i] != p-docs[p] {
				t.Fatalf("%s: token %d has offset %d in its document, had %d", l, p, int32(i)-start[i], p-docs[p])
			}
		}
		before, _ := DocumentWork(docs, l, P)
		after, _ := DocumentWork(start, l, P)
		if slices.Max(after) > slices.Max(before) {
			t.Errorf("%s: largest rank work %d, was %d", l, slices.Max(after), slices.Max(before))
		}
		t.Logf("%s: rank work %v -> %v", l, before, after)
		if l == "zigzag" && slices.Max(after) >= slices.Max(before) {
			t.Errorf("zigzag: balancing did not lower the largest rank's work %d", slices.Max(before))
		}
	}
	// the reordered sequence computes the same thing per token
	h := model.Heads{N: 2, KV: 1, Dim: 8}
	in := newInputs(T, h, 2)
	in.docs = docs
	want := in.reference()
	perm, start, err := BalanceDocuments(docs, "zigzag", P, 1)
	if err != nil {
		t.Fatal(err)
	}
	re := attnInputs{T: T, h: h, docs: start}
	gather := func(x []float32, w int) []float32 {
		out := make([]float32, 0, len(x))
		for _, p := range perm {
			out = append(out, x[int(p)*w:int(p+1)*w]...)
		}
		return out
	}
	qw, kw := h.N*h.Dim, h.KV*h.Dim
	re.q, re.k, re.v, re.do = gather(in.q, qw), gather(in.k, kw), gather(in.v, kw), gather(in.do, qw)
	got, err := re.run("zigzag", P, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want []float32
	}{{"o", got.o, gather(want.o, qw)}, {"dq", got.dq, gather(want.dq, qw)}, {"dk", got.dk, gather(want.dk, kw)}, {"dv", got.dv, gather(want.dv, kw)}} {
		if e := relErr(c.got, c.want); e > 1e-5 {
			t.Errorf("reordered %s: rel err %.3g", c.what, e)
		}
	}
}
