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
// without changing any token's loss or gradient; BalanceDocuments picks an order that
// shortens the schedule's attention time for a layout.
//
// The work model. Every visible (query, key) pair is computed once, by the rank and at the
// step the schedule gives its (query block, key block) pair:
//
//   - ring (Alg. 1 of papers/distflashattn.txt) and zigzag: by the query's rank, at the step
//     the key's block arrives, (query rank − key rank) mod P, forward and backward alike;
//   - burst: forward like ring; backward by the key's rank, at the step the query block
//     arrives, (query rank − key rank) mod P (BurstAttention Alg. 2: K, V stay, Q travels,
//     here from rank r to r − 1, burst.go);
//   - distflash (Alg. 2): a pair of blocks at offset d = query rank − key rank is computed by
//     the query's rank at step d when d ≤ ⌊P/2⌋, and otherwise by the key's rank as the
//     helper at step P − d (dfPlan), forward and backward alike;
//   - attn2d: in one phase between its collectives, by the rank at the query's row and the
//     key's column (attn2d.go: row (q mod P) mod Pr, column (k mod P) / Pr);
//   - ulysses: in one phase, every rank all pairs for H/P of the heads: 1/P of the pairs,
//     rounded up.
//
// Step time. A schedule's ranks wait for each other between steps: ring and zigzag pass k, v
// on and wait for the next block, and their backward's dk, dv accumulators (Burst's dq ones)
// reach a rank only after its predecessor has added its part at the previous step;
// DistFlashAttn's owners wait for their helpers' partials, step by step (Alg. 2 lines 8–11,
// Fig. 2); attn2d and ulysses exchange before and after their one compute phase. So the
// attention time is modelled as the sum over steps of the busiest rank's work at that step,
// forward and backward steps separately (DocumentTime's span), as in DistFlashAttn's Fig. 1,
// and a schedule's idle fraction is 1 − (mean rank's work)/span. This is exact when every step
// is a barrier. The real exchanges are point to point, so a rank may start a step while a
// rank it does not depend on is still busy (the ring's forward, whose sends are eager here,
// can run ahead): the real time lies between the largest per-rank total (DocumentWork) and
// the span; the two coincide for causal attention without documents on ring and DistFlashAttn.

// balanceTries is the number of seeded shuffles BalanceDocuments tries beside the sorted
// orders.
const balanceTries = 64

// Weights of a visible pair in forward and backward, as the FLOPs counters weigh them
// (kernels.Counters: 4·hd forward, 10·hd backward per score).
const (
	fwdPairWeight = 4
	bwdPairWeight = 10
)

// DocumentSteps returns the visible (query, key) pairs, per head, that each rank computes at
// each step of schedule's forward (fwd[step][rank]) and backward (bwd[step][rank]) on P
// ranks, for a sequence with document starts docStart (model.Seq.DocStart, one entry per
// token: the position where the token's document starts). The package comment above gives
// which rank computes a pair at which step: ring, zigzag and burst have P steps, distflash
// 1 + ⌊P/2⌋, attn2d and ulysses one.
func DocumentSteps(docStart []int32, schedule string, P int) (fwd, bwd [][]int64, err error) {
	l, err := LayoutOf(schedule)
	if err != nil {
		return nil, nil, err
	}
	T := len(docStart)
	if _, err := l.Positions(T, P, 0); err != nil {
		return nil, nil, err
	}
	for p, s := range docStart {
		if s < 0 || int(s) > p {
			return nil, nil, fmt.Errorf("parallel: document start %d at position %d: want a start in [0, %d]", s, p, p)
		}
	}
	steps := 1
	switch schedule {
	case "ring", "zigzag", "burst":
		steps = P
	case "distflash":
		steps = 1 + dfSteps(P)
	}
	grid := func() [][]int64 {
		g := make([][]int64, steps)
		for s := range g {
			g[s] = make([]int64, P)
		}
		return g
	}
	fwd, bwd = grid(), grid()
	switch schedule {
	case "ulysses":
		var v int64
		for p, s := range docStart {
			v += int64(p - int(s) + 1)
		}
		for r := 0; r < P; r++ {
			fwd[0][r], bwd[0][r] = (v+int64(P)-1)/int64(P), (v+int64(P)-1)/int64(P)
		}
		return fwd, bwd, nil
	case "attn2d":
		rows, cols := attn2dGrid(P)
		// below returns how many positions x < n have x mod P in [a, a+rows).
		below := func(n, a int) int64 {
			return int64(n/P*rows + min(max(n%P-a, 0), rows))
		}
		for q, s := range docStart {
			i := (q % P) % rows
			for j := 0; j < cols; j++ {
				if c := below(q+1, j*rows) - below(int(s), j*rows); c > 0 {
					fwd[0][i+j*rows] += c
					bwd[0][i+j*rows] += c
				}
			}
		}
		return fwd, bwd, nil
	}
	// Contiguous chunks of c positions: P of T/P (ring, burst, distflash) or 2P of T/(2P)
	// (zigzag, chunks r and 2P−1−r on rank r).
	c := T / P
	owner := func(ch int) int { return ch }
	if l == ZigZag {
		c = T / (2 * P)
		owner = func(ch int) int { return min(ch, 2*P-1-ch) }
	}
	for q, s := range docStart {
		qr := owner(q / c)
		for ch := int(s) / c; ch <= q/c; ch++ {
			n := int64(min(q, ch*c+c-1) - max(int(s), ch*c) + 1)
			kr := owner(ch)
			fs, fr := (qr-kr+P)%P, qr // ring, zigzag, burst forward
			bs, br := fs, fr
			switch schedule {
			case "burst":
				bs, br = (qr-kr+P)%P, kr
			case "distflash":
				if d := qr - kr; d > dfSteps(P) {
					fs, fr = P-d, kr
				}
				bs, br = fs, fr
			}
			fwd[fs][fr] += n
			bwd[bs][br] += n
		}
	}
	return fwd, bwd, nil
}

// DocumentWork returns each rank's total attention work under schedule on P ranks for a
// sequence with document starts docStart: its visible pairs per head (DocumentSteps), weighted
// as the FLOPs counters weigh them, 4 in forward and 10 in backward.
func DocumentWork(docStart []int32, schedule string, P int) ([]int64, error) {
	fwd, bwd, err := DocumentSteps(docStart, schedule, P)
	if err != nil {
		return nil, err
	}
	work := make([]int64, P)
	for s := range fwd {
		for r := range work {
			work[r] += fwdPairWeight*fwd[s][r] + bwdPairWeight*bwd[s][r]
		}
	}
	return work, nil
}

// DocumentTime returns the attention time of schedule on P ranks for a sequence with
// document starts docStart, in DocumentWork's units, when every step waits for its busiest
// rank (the package comment): span = Σ over forward and backward steps of the largest rank's
// work at that step. busy is the work of all ranks together, so the ranks are idle
// 1 − busy/(P·span) of the time.
func DocumentTime(docStart []int32, schedule string, P int) (span, busy int64, err error) {
	fwd, bwd, err := DocumentSteps(docStart, schedule, P)
	if err != nil {
		return 0, 0, err
	}
	for _, ph := range []struct {
		steps [][]int64
		w     int64
	}{{fwd, fwdPairWeight}, {bwd, bwdPairWeight}} {
		for _, st := range ph.steps {
			span += ph.w * slices.Max(st)
			for _, x := range st {
				busy += ph.w * x
			}
		}
	}
	return span, busy, nil
}

// BalanceDocuments reorders the documents of one packed sequence (docStart as in
// model.Seq.DocStart, one entry per token) so that schedule's attention time on P ranks
// (DocumentTime's span) is as short as it finds: it tries the given order, the documents
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
		m, _, err := DocumentTime(s, schedule, P)
		if err != nil {
			return nil, nil, err
		}
		if best < 0 || m < best {
			best, perm, newStart = m, p, s
		}
	}
	return perm, newStart, nil
}
