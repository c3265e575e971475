package model

import (
	"math"

	"distflash/kernels"
)

// Heads is the head geometry of one attention call.
type Heads struct {
	N, KV, Dim int // query heads, key/value heads, head dimension
}

// Seq places one rank's tokens of one sequence: their global positions, the documents of
// the whole sequence when documents are packed and masked, and the sliding window.
type Seq struct {
	Pos []int32 // global positions of this rank's tokens
	// DocStart, when not nil, masks attention by document: DocStart[p] is the global
	// position at which the document holding position p starts, for every position of the
	// whole sequence (so every rank can mask any block without exchanging document ids).
	// Positions past its end (an evaluator's padding) start at 0.
	DocStart []int32
	// Window, when positive, is the sliding window: a query at qp sees the keys from
	// qp − Window + 1 up to itself.
	Window int
}

// Masked reports whether s masks more than causally (documents or a window).
func (s Seq) Masked() bool { return s.DocStart != nil || s.Window > 0 }

// Start returns the first key position a query at qp sees: a key at kp is visible iff
// Start(qp) <= kp <= qp. Documents are intervals of positions and the window one more
// interval ending at qp, so that is "same document, within the window, and causal".
func (s Seq) Start(qp int32) int32 {
	var st int32
	if int(qp) < len(s.DocStart) {
		st = s.DocStart[qp]
	}
	if s.Window > 0 {
		st = max(st, qp-int32(s.Window)+1)
	}
	return st
}

// Starts returns Start of each position of pos, or nil when s masks only causally: the
// QStart of an attention block with queries at pos.
func (s Seq) Starts(pos []int32) []int32 {
	if !s.Masked() {
		return nil
	}
	st := make([]int32, len(pos))
	for i, p := range pos {
		st[i] = s.Start(p)
	}
	return st
}

// Attention computes causal self-attention (masked by document and window as seq says) for the
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
// over the whole sequence (internally tiled, so nothing N×N is materialised). In a bf16 or
// fp16 run (the backend's matmul precision) it hands the kernels q, k, v, O and dO packed in
// that format (kernels.AttnShape.Operands), as the sequence-parallel schedules do: the values
// every 16-bit kernel reads, converted once.
type LocalAttention struct {
	Backend kernels.Backend
	st      kernels.AttnState
	d       kernels.Buf
	ops     Operands // q, k, v, O, dO in the run's 16-bit format
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
	be, ops := a.Backend, &a.ops
	ops.Begin(be)
	be.AttnInit(a.st)
	be.AttnForward(a.st, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), ops.Shape(attnShape(n, seq, h)))
	be.AttnFinish(o, lse, a.st, n, h.N, h.Dim)
}

// Backward implements Attention.
func (a *LocalAttention) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq, h Heads) {
	n := len(seq.Pos)
	a.scratch(n, h)
	be, ops := a.Backend, &a.ops
	ops.Begin(be)
	o, do = ops.Pack(be, "o", o), ops.Pack(be, "do", do)
	be.AttnBackwardPrep(a.d, o, do, n, h.N, h.Dim, ops.Precision()) // D of the 16-bit O and dO the kernel reads
	be.AttnBackward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), o, do, lse, a.d, ops.Shape(attnShape(n, seq, h)))
}

// WarmAttention runs the attention of one sequence held at positions pos once, forward and
// backward, on zeros, for each mask the layers use (causal, and with the sliding window where
// a layer has one), through m.Attn: the schedule on several ranks, so it is collective. A
// backend that prepares something per block shape at its first use (cuDNN's execution plans,
// compiled then) prepares it here, before the first step, rather than inside a step while the
// other ranks wait for it. It counts nothing in the model's Stats and leaves the parameters and
// gradients as they are. Packed documents are not warmed: their blocks' shapes depend on the
// batch. In the 16-bit step an Attention that takes 16-bit operands (HalfAttention) is warmed
// through them, as the step calls it.
func (m *Model) WarmAttention(pos []int32) {
	be, h, n := m.be, m.heads(), len(pos)
	qn, kn := n*h.N*h.Dim, n*h.KV*h.Dim
	ha, half := m.Attn.(HalfAttention)
	half = half && m.halfStep()
	if half { // packed operands: half the elements
		qn, kn = (qn+1)/2, (kn+1)/2
	}
	q, o, do, dq := be.Alloc(qn), be.Alloc(qn), be.Alloc(qn), be.Alloc(qn)
	k, v, dk, dv := be.Alloc(kn), be.Alloc(kn), be.Alloc(kn), be.Alloc(kn)
	lse := be.Alloc(h.N * n)
	windows := map[int]bool{}
	for l := range m.Cfg.NLayers {
		windows[m.Cfg.Window(l)] = true
	}
	for _, w := range []int{0, m.Cfg.SlidingWindow} {
		if !windows[w] {
			continue
		}
		delete(windows, w)
		seq := Seq{Pos: pos, Window: w}
		if half {
			ha.ForwardHalf(o, lse, q, k, v, seq, h, m.Precision)
			ha.BackwardHalf(dq, dk, dv, q, k, v, o, lse, do, seq, h, m.Precision)
			continue
		}
		m.Attn.Forward(o, lse, q, k, v, seq, h)
		m.Attn.Backward(dq, dk, dv, q, k, v, o, lse, do, seq, h)
	}
}
