package model

import (
	"math"

	"distflash/kernels"
)

// Heads is the head geometry of one attention call.
type Heads struct {
	N, KV, Dim int // query heads, key/value heads, head dimension
}

// Seq places one rank's tokens of one sequence: their global positions, and the documents
// of the whole sequence when documents are packed and masked.
type Seq struct {
	Pos []int32 // global positions of this rank's tokens
	// DocStart, when not nil, masks attention by document: DocStart[p] is the global
	// position at which the document holding position p starts, for every position of the
	// whole sequence (so every rank can mask any block without exchanging document ids). A
	// key at kp is visible to a query at qp iff DocStart[qp] <= kp <= qp: documents are
	// intervals of positions, so that is "same document and causal".
	DocStart []int32
}

// WindowStarts is the Seq.DocStart table of a sequence of seqLen positions under a sliding
// window of W (W > 0): position p sees the keys from max(p − W + 1, its document's start) up to
// itself, doc being the document starts (nil: one document). A window is a document that
// starts W − 1 positions back, so every kernel and schedule that masks documents masks it.
func WindowStarts(seqLen, W int, doc []int32) []int32 {
	ws := make([]int32, seqLen)
	for p := range ws {
		ws[p] = int32(max(p-W+1, 0))
		if doc != nil {
			ws[p] = max(ws[p], doc[p])
		}
	}
	return ws
}

// Starts returns the document start of each position of pos, or nil when s has no
// documents: the QStart of an attention block with queries at pos.
func (s Seq) Starts(pos []int32) []int32 {
	if s.DocStart == nil {
		return nil
	}
	st := make([]int32, len(pos))
	for i, p := range pos {
		st[i] = s.DocStart[p]
	}
	return st
}

// Attention computes causal self-attention (masked by document when seq.DocStart is set) for the
// tokens one rank holds of one sequence.
// The local implementation sees the whole sequence; the sequence-parallel schedules of
// package parallel (DistFlashAttn, ring, zig-zag, Burst, Ulysses, Attention2D) implement the
// same two calls by exchanging blocks with the other ranks.
type Attention interface {
	// Forward writes the normalised output o ([n, heads, dim]) and its log-sum-exp lse
	// ([heads, n]) for the queries q against the keys and values of the whole sequence.
	// q, k, v are this rank's n tokens at global positions seq.Pos.
	Forward(o, lse, q, k, v kernels.Buf, seq Seq, h Heads)
	// Backward adds the gradients of this rank's q, k and v into dq, dk, dv (zeroed by the
	// caller), given the forward's o and lse and the output gradient do.
	Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq, h Heads)
}

// LocalAttention is single-worker causal attention: one block of the attention primitive
// over the whole sequence (internally tiled, so nothing N×N is materialised).
type LocalAttention struct {
	Backend kernels.Backend
	st      kernels.AttnState
	d       kernels.Buf
}

// NewLocalAttention returns single-worker attention on be.
func NewLocalAttention(be kernels.Backend) *LocalAttention { return &LocalAttention{Backend: be} }

func attnShape(n int, seq Seq, h Heads) kernels.AttnShape {
	return kernels.AttnShape{NQ: n, NK: n, Heads: h.N, KVHeads: h.KV, HeadDim: h.Dim, Causal: true,
		Scale: float32(1 / math.Sqrt(float64(h.Dim))), QPos: seq.Pos, KPos: seq.Pos, QStart: seq.Starts(seq.Pos)}
}

func (a *LocalAttention) scratch(n int, h Heads) {
	if a.st.O == nil || a.st.O.Len() != n*h.N*h.Dim || a.st.M.Len() != n*h.N {
		be := a.Backend
		a.st = kernels.AttnState{O: be.Alloc(n * h.N * h.Dim), M: be.Alloc(n * h.N), L: be.Alloc(n * h.N)}
		a.d = be.Alloc(n * h.N)
	}
}

// Forward implements Attention.
func (a *LocalAttention) Forward(o, lse, q, k, v kernels.Buf, seq Seq, h Heads) {
	n := len(seq.Pos)
	a.scratch(n, h)
	be := a.Backend
	be.AttnInit(a.st)
	be.AttnForward(a.st, q, k, v, attnShape(n, seq, h))
	be.AttnFinish(o, lse, a.st, n, h.N, h.Dim)
}

// Backward implements Attention.
func (a *LocalAttention) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq, h Heads) {
	n := len(seq.Pos)
	a.scratch(n, h)
	a.Backend.AttnBackwardPrep(a.d, o, do, n, h.N, h.Dim)
	a.Backend.AttnBackward(dq, dk, dv, q, k, v, do, lse, a.d, attnShape(n, seq, h))
}
