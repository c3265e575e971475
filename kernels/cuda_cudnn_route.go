//go:build cuda

package kernels

// Which attention blocks cuDNN's fused attention can compute, and as what graph: plain Go over
// the block's positions (AttnShape), unit-tested without a GPU.
//
// A block's mask comes from global positions: key j is visible to query i iff KPos[j] ≤ QPos[i]
// (causal) and, with document starts, QStart[i] ≤ KPos[j] (documents and sliding windows both
// come as QStart). cuDNN masks by row and column index instead: a right bound (the causal
// diagonal, top-left aligned and possibly shifted, or bottom-right aligned), a left bound (a
// band: the sliding window), and per-segment sequence lengths with ragged offsets (packed
// documents). classifyCUDNN finds the cuDNN mask that hides exactly what the positions hide,
// or says why there is none:
//
//   - full: no causal mask, or every key visible to every query;
//   - causal: keys at consecutive positions k0, k0+1, …; query i sees keys [0, hi_i] with
//     hi_i = min(NK−1, i+δ) for one δ ≥ 0: top-left (δ = 0), bottom-right (δ = NK−NQ), or
//     top-left shifted by δ;
//   - band: the same with a window: query i sees [lo_i, hi_i], lo_i = max(0, hi_i−L+1)… exactly
//     max(0, i+δ−L+1);
//   - documents: the rows split into segments, each a contiguous run of queries seeing a
//     contiguous run of keys disjoint from the other segments' (a document, as far as the
//     block holds it), all segments full, or all bottom-right causal (a band with one window
//     L): one ragged batch per segment, rows no key is visible to in none.
//
// Anything else (keys out of order, a segment shape that mixes kinds, a band cuDNN's bounds
// cannot place) runs the own kernel.

import (
	"fmt"
	"math/bits"

	"distflash/kernels/cuda"
)

// cudnnBlock is a block as cuDNN computes it.
type cudnnBlock struct {
	kind   string // "full", "causal", "causal bottom-right", "causal shifted", "band", "documents", "documents causal", "documents band"
	mask   cuda.Mask
	ragged bool
	b      int64 // batches (segments, bucketed; 1 when not ragged)
	sq     int64 // query rows per batch (the bucketed maximum when ragged)
	skv    int64 // key rows per batch
	segs   []cudnnSeg
}

// cudnnSeg is one ragged segment: queries [q0, q0+nq) see keys [k0, k0+nk).
type cudnnSeg struct{ q0, nq, k0, nk int }

// classifyCUDNN returns the cuDNN form of block sh, or the reason it has none.
func classifyCUDNN(sh AttnShape) (cudnnBlock, string) {
	nq, nk := sh.NQ, sh.NK
	full := cudnnBlock{kind: "full", b: 1, sq: int64(nq), skv: int64(nk)}
	if !sh.Causal {
		return full, ""
	}
	minQ, maxK := sh.QPos[0], sh.KPos[0]
	for _, p := range sh.QPos {
		minQ = min(minQ, p)
	}
	for _, p := range sh.KPos {
		maxK = max(maxK, p)
	}
	if maxK <= minQ {
		minK := sh.KPos[0]
		for _, p := range sh.KPos {
			minK = min(minK, p)
		}
		hidden := false
		for _, s := range sh.QStart {
			hidden = hidden || s > minK
		}
		if !hidden {
			return full, ""
		}
	}
	k0 := sh.KPos[0]
	for j, p := range sh.KPos {
		if p != k0+int32(j) {
			return cudnnBlock{}, "keys at non-consecutive positions"
		}
	}
	// the visible keys of each query: [lo[i], hi[i]] (empty when lo > hi)
	lo, hi := make([]int, nq), make([]int, nq)
	empty := false
	for i := range nq {
		hi[i] = min(nk-1, int(sh.QPos[i]-k0))
		if sh.QStart != nil {
			lo[i] = max(0, int(sh.QStart[i]-k0))
		}
		empty = empty || lo[i] > hi[i]
	}
	if !empty {
		if b, ok := fitDiagonal(nq, nk, lo, hi); ok {
			return b, ""
		}
	}
	return fitSegments(nq, nk, lo, hi)
}

// fitDiagonal fits one batch: hi[i] = min(nk−1, i+δ) and lo[i] = 0 or max(0, i+δ−L+1).
func fitDiagonal(nq, nk int, lo, hi []int) (cudnnBlock, bool) {
	b := cudnnBlock{b: 1, sq: int64(nq), skv: int64(nk)}
	d := hi[0]
	if d == nk-1 {
		for _, h := range hi {
			if h != nk-1 {
				return b, false
			}
		}
	}
	for i, h := range hi {
		if h != min(nk-1, i+d) {
			return b, false
		}
	}
	L := 0
	for i, l := range lo {
		if l > 0 {
			L = i + d + 1 - l
			break
		}
	}
	if L != 0 {
		if L < 1 {
			return b, false
		}
		for i, l := range lo {
			if l != max(0, i+d-L+1) {
				return b, false
			}
		}
	}
	if d >= nk-1 && L == 0 {
		b.kind = "full"
		return b, true
	}
	m := cuda.Mask{Causal: true}
	switch {
	case d == 0:
		b.kind = "causal"
	case nq <= nk && d == nk-nq:
		b.kind, m.BottomRight = "causal bottom-right", true
	default:
		b.kind, m.Shift = "causal shifted", int64(d)
	}
	if L != 0 {
		b.kind = "band"
		// cuDNN's left bound is in the diagonal's frame: top-left keeps column c of row i iff
		// c > i − left, i.e. lo = i − left + 1 = i + d − L + 1 only when left = L − d (the shift
		// is not applied to the left bound); bottom-right's frame already holds d = nk − nq.
		left := L
		if !m.BottomRight {
			left = L - d
		}
		if left < 1 {
			return b, false
		}
		m.Left = int64(left)
	}
	b.mask = m
	return b, true
}

// fitSegments splits the rows into ragged segments (documents) and fits one mask to all.
func fitSegments(nq, nk int, lo, hi []int) (cudnnBlock, string) {
	var segs []cudnnSeg
	for i := 0; i < nq; {
		if lo[i] > hi[i] {
			i++
			continue
		}
		j := i + 1
		for j < nq && lo[j] <= hi[j] && lo[j] <= hi[j-1] && lo[j] >= lo[j-1] && hi[j] >= hi[j-1] {
			j++
		}
		s := cudnnSeg{q0: i, nq: j - i, k0: lo[i], nk: hi[j-1] - lo[i] + 1}
		if n := len(segs); n > 0 && s.k0 <= segs[n-1].k0+segs[n-1].nk-1 {
			return cudnnBlock{}, "document segments whose keys overlap"
		}
		segs = append(segs, s)
		i = j
	}
	if len(segs) == 0 {
		return cudnnBlock{}, "no query sees a key"
	}
	if len(segs) > 1024 {
		return cudnnBlock{}, fmt.Sprintf("%d document segments (at most 1024)", len(segs))
	}
	// every segment full, or every segment bottom-right causal with one window
	allFull, allCausal, L := true, true, 0
	for _, s := range segs {
		last := s.k0 + s.nk - 1
		for r := range s.nq {
			i := s.q0 + r
			if hi[i] != last || lo[i] != s.k0 {
				allFull = false
			}
			if hi[i] != last-(s.nq-1-r) {
				allCausal = false
			}
			if lo[i] > s.k0 && L == 0 {
				L = hi[i] - lo[i] + 1
			}
		}
		if s.nq > s.nk {
			allCausal = false
		}
	}
	if !allFull && !allCausal {
		return cudnnBlock{}, "document segments of mixed masks"
	}
	b := cudnnBlock{ragged: true, segs: segs}
	if allFull && (L == 0 || !allCausal) {
		if L != 0 {
			return cudnnBlock{}, "document segments with a window and no diagonal"
		}
		b.kind = "documents"
	} else {
		b.kind, b.mask = "documents causal", cuda.Mask{Causal: true, BottomRight: true}
		if L != 0 {
			for _, s := range segs {
				for r := range s.nq {
					i := s.q0 + r
					if lo[i] != max(s.k0, hi[i]-L+1) {
						return cudnnBlock{}, "document segments with different windows"
					}
				}
			}
			b.kind, b.mask.Left = "documents band", int64(L)
		}
	}
	maxQ, maxK := 0, 0
	for _, s := range segs {
		maxQ, maxK = max(maxQ, s.nq), max(maxK, s.nk)
	}
	b.b, b.sq, b.skv = int64(pow2(len(segs), 1)), int64(pow2(maxQ, 64)), int64(pow2(maxK, 64))
	return b, ""
}

// pow2 is the least power of two ≥ max(n, least): the ragged graphs' batch count and maximal
// lengths are bucketed so that blocks of similar documents share a plan.
func pow2(n, least int) int {
	n = max(n, least)
	return 1 << bits.Len(uint(n-1))
}

// raggedInts lays out what a ragged block's graph reads besides the operands: the sequence
// lengths of its batches, the ragged offsets (in elements) of Q/dQ, K/dK, V/dV and O/dO
// (rows of the given widths), batches past the segments empty; and the row map of its queries
// into cuDNN's padded statistics [B, heads, SQ] (−1 for a query in no segment). The offsets
// must fit int32. Every array starts on a 16-byte boundary (a multiple of 4 values from the
// start of the upload, itself an allocation's start): the tensors declare 16-byte alignment,
// and cuDNN may read the offsets vectorised.
type raggedInts struct {
	data                                        []int32
	seqQ, seqKV, offQ, offK, offV, offO, rowmap int
}

func packRagged(b cudnnBlock, nq, heads int, qw, kw, vw, ow int) (raggedInts, error) {
	var r raggedInts
	add := func(n int) int {
		off := (len(r.data) + 3) &^ 3
		r.data = append(r.data, make([]int32, off+n-len(r.data))...)
		return off
	}
	B := int(b.b)
	r.seqQ, r.seqKV = add(B), add(B)
	r.offQ, r.offK, r.offV, r.offO = add(B+1), add(B+1), add(B+1), add(B+1)
	r.rowmap = add(nq)
	for i := range nq {
		r.data[r.rowmap+i] = -1
	}
	lastQ, lastK := 0, 0
	for s := range B {
		q0, k0, sq, sk := lastQ, lastK, 0, 0
		if s < len(b.segs) {
			g := b.segs[s]
			q0, k0, sq, sk = g.q0, g.k0, g.nq, g.nk
			lastQ, lastK = q0+sq, k0+sk
			for j := range sq {
				r.data[r.rowmap+q0+j] = int32(s*heads*int(b.sq) + j)
			}
		}
		r.data[r.seqQ+s], r.data[r.seqKV+s] = int32(sq), int32(sk)
		for _, o := range []struct{ at, row, width int }{{r.offQ, q0, qw}, {r.offK, k0, kw}, {r.offV, k0, vw}, {r.offO, q0, ow}} {
			v := int64(o.row) * int64(o.width)
			if v > 1<<31-1 {
				return r, fmt.Errorf("a ragged offset of %d elements does not fit int32", v)
			}
			r.data[o.at+s] = int32(v)
		}
	}
	for _, o := range []struct{ at, row, width int }{{r.offQ, lastQ, qw}, {r.offK, lastK, kw}, {r.offV, lastK, vw}, {r.offO, lastQ, ow}} {
		v := int64(o.row) * int64(o.width)
		if v > 1<<31-1 {
			return r, fmt.Errorf("a ragged offset of %d elements does not fit int32", v)
		}
		r.data[o.at+B] = int32(v)
	}
	return r, nil
}
