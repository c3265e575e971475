package parallel

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// Under a document mask the attention work of a token is the number of keys it sees, its
// offset in its document plus one, so the static layouts, balanced for one causal triangle,
// lose their balance: a rank whose tokens sit late in long documents does far more than one
// holding the starts of short ones. Documents attend only to themselves and RoPE scores
// depend only on distances, so the documents of a packed sequence may be put in any order
// without changing any token's loss or gradient; BalanceDocuments picks an order that evens
// out the ranks' visible work for a layout.

// balanceTries is the number of seeded shuffles BalanceDocuments tries beside the sorted
// orders.
const balanceTries = 64

// DocumentWork returns each rank's attention work, in visible score pairs weighted as the
// FLOPs counters weigh them (4 in forward, 10 in backward), when a sequence with document
// starts docStart is split over P ranks by schedule's layout: the forward's pairs are
// counted at the query's rank, the backward's at the query's rank too except for Burst,
// which computes dK, dV where the keys live (a key sees the later queries of its document).
func DocumentWork(docStart []int32, schedule string, P int) ([]int64, error) {
	l, err := LayoutOf(schedule)
	if err != nil {
		return nil, err
	}
	T := len(docStart)
	end := make([]int32, T) // one past the last position of each position's document
	for p := T - 1; p >= 0; p-- {
		if p == T-1 || docStart[p+1] != docStart[p] {
			end[p] = int32(p + 1)
		} else {
			end[p] = end[p+1]
		}
	}
	work := make([]int64, P)
	for r := 0; r < P; r++ {
		pos, err := l.Positions(T, P, r)
		if err != nil {
			return nil, err
		}
		for _, p := range pos {
			q, k := int64(p-docStart[p]+1), int64(end[p]-p)
			if schedule == "burst" {
				work[r] += 4*q + 10*k
			} else {
				work[r] += 14 * q
			}
		}
	}
	return work, nil
}

// BalanceDocuments reorders the documents of one packed sequence (docStart as in
// model.Seq.DocStart, one entry per token) so that the largest rank's work (DocumentWork)
// under schedule on P ranks is as small as it finds: it tries the given order, the documents
// longest first and shortest first, and balanceTries shuffles drawn from seed, and keeps the
// best (the first of equals, so a balanced sequence stays as it is). It returns perm, the old
// index of the token at each new index (apply it to inputs and targets alike), and the
// document starts of the new order.
func BalanceDocuments(docStart []int32, schedule string, P int, seed uint64) (perm, newStart []int32, err error) {
	T := len(docStart)
	type doc struct{ start, n int32 }
	var docs []doc
	for p := 0; p < T; p++ {
		if p == 0 || docStart[p] != docStart[p-1] {
			if docStart[p] != int32(p) {
				return nil, nil, fmt.Errorf("parallel: document start %d at position %d: documents must be intervals that start at their first token", docStart[p], p)
			}
			docs = append(docs, doc{start: int32(p)})
		}
		docs[len(docs)-1].n++
	}
	build := func(order []doc) (perm, start []int32) {
		perm, start = make([]int32, 0, T), make([]int32, 0, T)
		for _, d := range order {
			s := int32(len(perm))
			for i := int32(0); i < d.n; i++ {
				perm, start = append(perm, d.start+i), append(start, s)
			}
		}
		return perm, start
	}
	cands := [][]doc{docs}
	desc := slices.Clone(docs)
	slices.SortStableFunc(desc, func(a, b doc) int { return int(b.n - a.n) })
	asc := slices.Clone(desc)
	slices.Reverse(asc)
	cands = append(cands, desc, asc)
	r := rand.New(rand.NewPCG(seed, 0xd0c5))
	for range balanceTries {
		c := slices.Clone(docs)
		r.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		cands = append(cands, c)
	}
	best := int64(-1)
	for _, c := range cands {
		p, s := build(c)
		w, err := DocumentWork(s, schedule, P)
		if err != nil {
			return nil, nil, err
		}
		if m := slices.Max(w); best < 0 || m < best {
			best, perm, newStart = m, p, s
		}
	}
	return perm, newStart, nil
}
