// Package model is the LLaMA family of distflash: parameters in one flat buffer, and each
// transformer block's forward and backward written out by hand, as in the C trainers of GPT-2,
// with no autograd tape. What a block saves for its backward is one visible struct, LayerActs,
// so where activations are checkpointed is a policy (Checkpoint), not a rewrite.
//
// The block (Touvron et al., LLaMA; Hugging Face LlamaDecoderLayer):
//
//	h   = x + Wo · attn(rope(Wq·n1), rope(Wk·n1), Wv·n1),   n1 = rmsnorm(x) ∘ w1
//	out = h + Wdown · (silu(Wgate·n2) ∘ (Wup·n2)),           n2 = rmsnorm(h) ∘ w2
//
// followed, after the last block, by a final RMSNorm and the untied output head.
package model

import (
	"fmt"

	"distflash/kernels"
)

// Checkpoint is the activation checkpointing policy (papers/distflashattn.txt §3.3).
type Checkpoint int

const (
	// CheckpointNone keeps every activation of every block: most memory, no recomputation.
	CheckpointNone Checkpoint = iota
	// CheckpointLayer keeps only each block's input (the HuggingFace / Megatron default);
	// backward re-runs the whole block forward, attention included: 2L attention forwards a step.
	CheckpointLayer
	// CheckpointAttnOutput keeps each block's input and its attention output and log-sum-exp
	// (the rematerialization-aware placement of DistFlashAttn §3.3, Fig. 3): backward recomputes
	// the cheap projections, norms and MLP but never the attention forward: L attention forwards.
	CheckpointAttnOutput
)

var checkpointNames = []string{"none", "layer", "attn_output"}

// String returns the config name of the policy.
func (c Checkpoint) String() string { return checkpointNames[c] }

// ParseCheckpoint reads checkpoint.activation.
func ParseCheckpoint(s string) (Checkpoint, error) {
	for i, n := range checkpointNames {
		if s == n {
			return Checkpoint(i), nil
		}
	}
	return 0, fmt.Errorf("checkpoint.activation = %q: want one of none, layer, attn_output", s)
}

// LayerActs is everything one block's backward reads, for the n tokens of a micro-batch.
// Under CheckpointNone each block keeps a full LayerActs; under the other policies a block
// keeps only the fields its policy names and the rest is recomputed into shared scratch.
type LayerActs struct {
	X       kernels.Buf // [n, dim] block input — kept by every policy
	Norm1   kernels.Buf // [n, dim] rmsnorm(x) ∘ w1
	Rstd1   kernels.Buf // [n] 1/rms of x
	Q       kernels.Buf // [n, heads·hd] queries after RoPE
	K       kernels.Buf // [n, kvheads·hd] keys after RoPE
	V       kernels.Buf // [n, kvheads·hd]
	AttnOut kernels.Buf // [n, heads·hd] normalised attention output — kept by attn_output
	Lse     kernels.Buf // [batch, heads, T] log-sum-exp of each query's scores — kept by attn_output
	H       kernels.Buf // [n, dim] x + Wo·attn
	Norm2   kernels.Buf // [n, dim] rmsnorm(h) ∘ w2
	Rstd2   kernels.Buf // [n]
	Gate    kernels.Buf // [n, ffn] Wgate·n2
	Up      kernels.Buf // [n, ffn] Wup·n2
	Act     kernels.Buf // [n, ffn] silu(gate) ∘ up
}

// Stats are the model's own counts.
type Stats struct {
	AttnForwards int64 // attention forwards (one per block per forward or recompute pass)
	Steps        int64 // ForwardBackward calls
}

// Model is a LLaMA with its parameters and gradients on one backend.
type Model struct {
	Cfg    Config
	Policy Checkpoint
	Layout Layout
	Params Weights
	Grads  Weights
	Attn   Attention
	Stats  Stats
	// Store, when set, lends the parameters unit by unit (FSDP, low-precision compute copies);
	// Params and Grads are then empty and the gradients go where the store says.
	Store ParamStore
	// LossChunk is how many tokens the final norm's output goes through the output head and
	// the loss at a time (training.loss_chunk): the [tokens, vocab] logits exist one chunk at a
	// time, and in ForwardBackward each chunk's head backward runs at once (dlogits → the
	// final norm's output gradient, and the head's weight gradient added chunk by chunk, in
	// order). 0 or at least the tokens: all at once. Set it before the first Forward.
	LossChunk int
	// MLPTile is how many tokens the SwiGLU MLP (gate, up, activation, down) runs at a time
	// (training.mlp_tile): its [tokens, ffn] tensors then exist one tile at a time, in the
	// forward and in the backward, which recomputes each tile's gate, up and activation from
	// the saved FFN norm output (two more GEMMs per block where the policy kept them). 0 or at
	// least the tokens: all at once, the [tokens, ffn] tensors kept as the policy says. Set it
	// before the first Forward.
	MLPTile int
	// Precision is the step's compute precision (training.mixed_precision): FP32 (the zero
	// value) computes in float32 as ever; BF16 or FP16 runs the 16-bit step (half.go): the
	// GEMMs read 16-bit operands (the weights' 16-bit copy, which a HalfStore lends without
	// widening, and 16-bit activations), every activation between kernels is 16-bit but the
	// residual stream and its gradient, and attention reads and writes 16-bit q, k, v, o.
	// The 16-bit step needs even widths (a resolved Config's are, but for FFNDim): a model
	// with an odd FFNDim computes in float32 instead and keeps the activations its policy keeps
	// in Precision, as ActPrecision says. The backend's matmul precision should be Precision
	// too (world sets both): an Attention without 16-bit methods (the sequence-parallel
	// schedules) reads it, and the float32 GEMMs of a Decoder's steps. Set it before the first
	// Forward.
	Precision kernels.Precision
	// ActPrecision is the precision the activations a checkpoint policy keeps are stored in
	// on the float32 path (Precision FP32, or a 16-bit Precision with odd widths, where
	// Precision takes its place): under the policies layer and attn_output with BF16 or FP16,
	// each block's input and attention output are kept for the backward as 16-bit values (two
	// per element of a buffer, kernels.Backend.PackHalf; the log-sum-exp stays float32). The
	// forward computes in float32 as ever, so the loss does not change; the backward
	// recomputes from the 16-bit copies, so the gradients are those at the rounded
	// activations. FP32 (the zero value), or the policy none: float32. The 16-bit step
	// ignores it. Set it before the first Forward.
	ActPrecision kernels.Precision
	// FreshGrads, when set, makes the next ForwardBackward's gradient the only one in the
	// gradient buffers: the first contribution to each weight's gradient overwrites it (a GEMM
	// with beta 0 for the first tile or loss chunk, the norm weights' gradient set rather than
	// added; the embedding's gradient, a scatter-add, is zeroed by the model first), so the
	// caller skips ZeroGrads, a pass over every gradient. The model clears it when that
	// ForwardBackward returns (Forward leaves it). The gradients are bit for bit those of
	// ZeroGrads then ForwardBackward: a GEMM's sum r lands as r with beta 0 and as r + 0 = r
	// on zeros (its accumulator starts at +0, so r is never −0). With a Store the buffers are
	// the store's FreshGrad (see FreshGradStore), which the store must implement.
	FreshGrads bool
	// DeferLoss, when set, keeps the per-token losses on the device: Forward and
	// ForwardBackward return a loss sum of 0 (and the right count) without a download, which
	// would wait for the device in the middle of the step, and keep each call's losses in a
	// device buffer until TakeLoss brings every pending call's down at once.
	DeferLoss bool
	// KVHook, when set, is called in the forward with each layer's keys (after RoPE) and
	// values of the batch's tokens ([B·T, kvheads·hd], this rank's tokens in order), before
	// the attention: how a Decoder fills its cache in the prefill. The buffers are the
	// model's; copy what is needed.
	KVHook func(l int, k, v kernels.Buf)
	// RowHook, when set, is called in the forward with each chunk of logits (rows tokens
	// from token row0, [rows, vocab]) before the loss reads them (see LossChunk).
	RowHook func(row0 int, logits kernels.Buf, rows int)
	// Ops, when set, is the per-op profile the model's backend calls are recorded in (in its
	// profiled steps: kernels.OpProfile), each GEMM by its role and every op in the phase it
	// runs in (forward, the backward's recomputation, backward).
	Ops *kernels.OpProfile

	units    []Unit
	actBytes int64
	phase    kernels.Phase // of the ops being run, for Ops
	arena    []kernels.Buf // the buffers ensure sizes, in the order it takes them (take)
	taken    int           // how many of them ensure has taken for the current batch

	be    kernels.Backend
	batch int // sequences in the current micro-batch
	seq   int // tokens per sequence on this rank
	pos   []int32
	rpos  [][]int32         // RoPE positions per sequence (pos, or per document with ResetPositions)
	seqs  []Seq             // attention placement per sequence
	wseqs []Seq             // the same, masked by the sliding window (windowed layers; nil without one)
	rope  kernels.RoPETable // of the current forward (Config.RoPE)
	acts  []LayerActs       // per block, fields per policy
	work  LayerActs         // recompute scratch (policies layer and attn_output)
	view  LayerActs         // work with the kept fields of one block swapped in
	xOut  kernels.Buf       // [n, dim] last block's output
	normF kernels.Buf       // [n, dim] final norm output
	rstdF kernels.Buf       // [n]
	logit kernels.Buf       // [chunk, vocab] (see LossChunk); holds the last chunk's dlogits after backward
	loss  kernels.Buf       // [n] per-token loss
	chunk int               // tokens per loss chunk
	tile  int               // tokens per MLP tile; the batch's tokens when not tiled
	mlp   LayerActs         // the MLP's tile buffers (Gate, Up, Act: [tile, ffn]) when tiled
	xin   [2]kernels.Buf    // with 16-bit kept activations: the forward's block inputs, float32, in turn
	grad  gradScratch
	// headGrad is the output unit's gradient buffer, taken in the forward (whose loss chunks
	// add the head's weight gradient into it) and completed in the backward.
	headGrad []kernels.Buf

	half      bool        // the current batch runs the 16-bit step (halfStep)
	hs        halfState   // the 16-bit step's buffers (half.go)
	ownHalf   kernels.Buf // the 16-bit copy of Params, without a Store, for the 16-bit step
	takeBytes int64       // the bytes take handed out since ensure began sizing
	fresh     bool        // this ForwardBackward's FreshGrads
	ropeLen   int         // the sequence length rope was made for, when ropeSet
	ropeSet   bool        //
	lossBuf   kernels.Buf // this call's per-token losses: loss, or its slot of the deferred ones
	deferred  lossQueue   // the losses of the calls since the last TakeLoss (DeferLoss)
	hostLoss  []float32   // the last call's per-token losses (TokenLosses)
	lastHost  bool        // hostLoss holds the last call's losses (not still deferred)
}

// gradScratch holds the backward's temporaries for one micro-batch.
type gradScratch struct {
	dx, dnorm, dh    kernels.Buf // [n, dim]
	dq, dattn        kernels.Buf // [n, heads·hd]
	dk, dv           kernels.Buf // [n, kvheads·hd]
	dgate, dup, dact kernels.Buf // [n, ffn]
}

// New returns a model with zero parameters and gradients on be (fill Params with Load or
// InitParams). cfg must be resolved (Config.Resolve).
func New(cfg Config, policy Checkpoint, be kernels.Backend) *Model {
	layout := NewLayout(cfg)
	m := NewWithStore(cfg, policy, be, nil)
	m.Params = NewWeights(be, layout, cfg.NLayers, be.Alloc(layout.Size))
	m.Grads = NewWeights(be, layout, cfg.NLayers, be.Alloc(layout.Size))
	return m
}

// NewWithStore returns a model that holds no parameters of its own: it computes with the
// units store lends it (see ParamStore). With a nil store the caller must set Params and
// Grads (New does).
func NewWithStore(cfg Config, policy Checkpoint, be kernels.Backend, store ParamStore) *Model {
	layout := NewLayout(cfg)
	return &Model{Cfg: cfg, Policy: policy, Layout: layout, be: be, Attn: NewLocalAttention(be),
		Store: store, units: layout.Units()}
}

// Backend returns the backend the model computes on.
func (m *Model) Backend() kernels.Backend { return m.be }

// LoadParams copies host values (in Layout order) into the parameters.
func (m *Model) LoadParams(host []float32) { m.be.Upload(m.Params.Flat, host) }

// ZeroGrads clears the gradient buffer (FreshGrads makes a step's first ForwardBackward do
// without it).
func (m *Model) ZeroGrads() { m.be.Zero(m.Grads.Flat) }

// Logits returns the logits of the last Forward's last loss chunk ([rows, vocab], see
// LossChunk); after the float32 path's ForwardBackward the buffer holds the gradient of the
// loss with respect to them instead (the 16-bit step writes that gradient into a 16-bit buffer
// of its own and leaves the logits).
func (m *Model) Logits() kernels.Buf { return m.logit }

// heads is the attention geometry of the model.
func (m *Model) heads() Heads {
	return Heads{N: m.Cfg.NHeads, KV: m.Cfg.NKVHeads, Dim: m.Cfg.HeadDim}
}

// full allocates a complete LayerActs for n tokens.
func (m *Model) full(n int) LayerActs {
	c := m.Cfg
	a := LayerActs{
		X: m.take(n * c.Dim), Norm1: m.take(n * c.Dim), Rstd1: m.take(n),
		Q: m.take(n * c.QDim()), K: m.take(n * c.KVDim()), V: m.take(n * c.KVDim()),
		AttnOut: m.take(n * c.QDim()), Lse: m.take(n * c.NHeads),
		H: m.take(n * c.Dim), Norm2: m.take(n * c.Dim), Rstd2: m.take(n),
	}
	if !m.tiled() { // tiled, the MLP's tensors live in m.mlp, one tile at a time
		a.Gate, a.Up, a.Act = m.take(n*c.FFNDim), m.take(n*c.FFNDim), m.take(n*c.FFNDim)
	}
	return a
}

// tiled reports whether the MLP runs in tiles (MLPTile below the batch's tokens).
func (m *Model) tiled() bool { return m.tile < m.batch*m.seq }

// halfActs reports whether the float32 path keeps its activations in 16 bits (keptPrecision
// under a recomputing policy).
func (m *Model) halfActs() bool {
	return m.keptPrecision() != kernels.FP32 && m.Policy != CheckpointNone
}

// keptPrecision is the precision the float32 path keeps its activations in: Precision where
// the 16-bit step cannot run it (odd widths), else ActPrecision.
func (m *Model) keptPrecision() kernels.Precision {
	if isHalf(m.Precision) {
		return m.Precision
	}
	return m.ActPrecision
}

// isHalf reports whether p is a 16-bit precision.
func isHalf(p kernels.Precision) bool { return p == kernels.BF16 || p == kernels.FP16 }

// ensure sizes the activation and scratch buffers for the batch: B sequences of T tokens at
// positions pos.
func (m *Model) ensure(bt Batch) {
	B, T, pos := bt.B, len(bt.Pos), bt.Pos
	m.pos = pos
	seqLen := bt.SeqLen
	if seqLen == 0 {
		for _, p := range pos {
			seqLen = max(seqLen, int(p)+1)
		}
	}
	if !m.ropeSet || m.ropeLen != seqLen { // the table depends on the length alone (Config.RoPE)
		m.rope, m.ropeLen, m.ropeSet = m.Cfg.RoPE(seqLen), seqLen, true
	}
	m.rpos, m.seqs = m.rpos[:0], m.seqs[:0]
	for b := 0; b < B; b++ {
		s, rp := Seq{Pos: pos}, pos
		if bt.Docs != nil {
			if len(bt.Docs) != B*seqLen {
				panic(fmt.Sprintf("model: %d document starts for %d sequences of %d tokens", len(bt.Docs), B, seqLen))
			}
			s.DocStart = bt.Docs[b*seqLen : (b+1)*seqLen]
			if bt.ResetPositions {
				rp = make([]int32, len(pos))
				for i, p := range pos {
					rp[i] = p - s.DocStart[p]
				}
			}
		}
		m.rpos, m.seqs = append(m.rpos, rp), append(m.seqs, s)
	}
	m.wseqs = m.wseqs[:0]
	if W := m.Cfg.SlidingWindow; W > 0 {
		for _, s := range m.seqs {
			s.Window = W
			m.wseqs = append(m.wseqs, s)
		}
	}
	if m.batch == B && m.seq == T {
		return
	}
	m.batch, m.seq = B, T
	m.taken = 0
	if cap(m.hostLoss) < B*T {
		m.hostLoss = make([]float32, B*T)
	}
	m.hostLoss = m.hostLoss[:B*T]
	m.half = m.halfStep()
	if m.half {
		m.ensureHalf()
		return
	}
	n, c := B*T, m.Cfg
	m.tile = n
	if m.MLPTile > 0 && m.MLPTile < n {
		m.tile = m.MLPTile
	}
	m.mlp = LayerActs{}
	ff := n * c.FFNDim // the MLP's [tokens, ffn] scratch of the backward: one tile when tiled
	if m.tiled() {
		ff = m.tile * c.FFNDim
		m.mlp = LayerActs{Gate: m.take(ff), Up: m.take(ff), Act: m.take(ff)}
	}
	m.acts = make([]LayerActs, c.NLayers)
	kept := func(elems int) kernels.Buf { // a kept activation: float32, or two 16-bit values an element
		if m.halfActs() {
			return m.take((elems + 1) / 2)
		}
		return m.take(elems)
	}
	m.xin = [2]kernels.Buf{}
	if m.halfActs() {
		m.xin = [2]kernels.Buf{m.take(n * c.Dim), m.take(n * c.Dim)}
	}
	for l := range m.acts {
		switch m.Policy {
		case CheckpointNone:
			m.acts[l] = m.full(n)
		case CheckpointLayer:
			m.acts[l] = LayerActs{X: kept(n * c.Dim)}
		case CheckpointAttnOutput:
			m.acts[l] = LayerActs{X: kept(n * c.Dim), AttnOut: kept(n * c.QDim()), Lse: m.take(n * c.NHeads)}
		}
	}
	if m.Policy != CheckpointNone {
		m.work = m.full(n)
	}
	m.xOut, m.normF, m.rstdF = m.take(n*c.Dim), m.take(n*c.Dim), m.take(n)
	m.chunk = n
	if m.LossChunk > 0 && m.LossChunk < n {
		m.chunk = m.LossChunk
	}
	m.logit, m.loss = m.take(m.chunk*c.VocabSize), m.take(n)
	m.grad = gradScratch{
		dx: m.take(n * c.Dim), dnorm: m.take(n * c.Dim), dh: m.take(n * c.Dim),
		dq: m.take(n * c.QDim()), dattn: m.take(n * c.QDim()),
		dk: m.take(n * c.KVDim()), dv: m.take(n * c.KVDim()),
		dgate: m.take(ff), dup: m.take(ff), dact: m.take(ff),
	}
	m.actBytes = 0
	for _, a := range m.acts {
		m.actBytes += a.bytes()
	}
	m.actBytes += m.work.bytes() + m.mlp.bytes()
	for _, b := range m.xin {
		if b != nil {
			m.actBytes += int64(b.Len()) * 4
		}
	}
	for _, b := range []kernels.Buf{m.xOut, m.normF, m.rstdF, m.logit, m.loss} {
		m.actBytes += int64(b.Len()) * 4
	}
	g := m.grad
	for _, b := range []kernels.Buf{g.dx, g.dnorm, g.dh, g.dq, g.dattn, g.dk, g.dv, g.dgate, g.dup, g.dact} {
		m.actBytes += int64(b.Len()) * 4
	}
}

// take returns a buffer of n values for the batch ensure is sizing: a view of the next of the
// buffers ensure has made, made anew only when the batch needs more than it holds. ensure asks
// for its buffers in the same order each time, so a batch no larger than an earlier one (an
// evaluation between training steps, samples of several lengths) allocates nothing, and the
// buffers stay as large as the largest batch. Their contents are not cleared: every buffer is
// written before it is read in a step, as they are reused from step to step anyway.
func (m *Model) take(n int) kernels.Buf {
	i := m.taken
	m.taken++
	if i == len(m.arena) {
		m.arena = append(m.arena, nil)
	}
	if m.arena[i] == nil || m.arena[i].Len() < n {
		m.arena[i] = m.be.Alloc(n)
	}
	m.takeBytes += 4 * int64(n)
	return m.be.Slice(m.arena[i], 0, n)
}

// bytes is the memory of the buffers a holds.
func (a LayerActs) bytes() int64 {
	var n int64
	for _, b := range []kernels.Buf{a.X, a.Norm1, a.Rstd1, a.Q, a.K, a.V, a.AttnOut, a.Lse, a.H, a.Norm2, a.Rstd2, a.Gate, a.Up, a.Act} {
		if b != nil {
			n += int64(b.Len()) * 4
		}
	}
	return n
}

// ActivationBytes is the memory of the activation buffers of the current micro-batch shape:
// what each block saves under the checkpoint policy, the recompute scratch, the head's
// logits and the backward's temporaries. They live for the whole step, so this is the peak.
// (The attention schedules' own communication buffers are not counted.)
func (m *Model) ActivationBytes() int64 { return m.actBytes }

// seqSlice returns sequence b's rows of a [B·T, width] buffer.
func (m *Model) seqSlice(buf kernels.Buf, b, width int) kernels.Buf {
	return m.be.Slice(buf, b*m.seq*width, m.seq*width)
}

// blockForward runs block l on a.X. It fills every field of a; when attn is false it takes
// a.AttnOut and a.Lse as already computed (the attn_output checkpoint) and skips the
// attention. When out is not nil the block's output x + h-path is written there; when it is
// nil (the backward's recomputation) the MLP's activation is left to the backward, whose
// SwiGLU kernel writes it (SwiGLUBackwardAct), and a tiled MLP is left to it whole.
func (m *Model) blockForward(l int, w LayerWeights, a *LayerActs, out kernels.Buf, attn bool) {
	be, c := m.be, m.Cfg
	n, D, Q, KV, F := m.batch*m.seq, c.Dim, c.QDim(), c.KVDim(), c.FFNDim
	m.norm(a.Norm1, a.Rstd1, a.X, w.AttnNorm, n)
	m.linear(kernels.OpGemmQ, a.Q, a.Norm1, w.Wq, n, Q, D)
	m.linear(kernels.OpGemmK, a.K, a.Norm1, w.Wk, n, KV, D)
	m.linear(kernels.OpGemmV, a.V, a.Norm1, w.Wv, n, KV, D)
	for b := 0; b < m.batch; b++ {
		m.rotate(m.seqSlice(a.Q, b, Q), m.rpos[b], c.NHeads, false)
		m.rotate(m.seqSlice(a.K, b, KV), m.rpos[b], c.NKVHeads, false)
	}
	if m.KVHook != nil && attn {
		m.KVHook(l, a.K, a.V)
	}
	if attn {
		m.Stats.AttnForwards++
		for b := 0; b < m.batch; b++ {
			m.attnForward(m.seqSlice(a.AttnOut, b, Q), m.seqSlice(a.Lse, b, c.NHeads),
				m.seqSlice(a.Q, b, Q), m.seqSlice(a.K, b, KV), m.seqSlice(a.V, b, KV), m.seqOf(l, b))
		}
		if kept := m.acts[l].AttnOut; kept != nil && m.halfActs() { // kept for the backward in 16 bits
			m.pack(kept, a.AttnOut)
		}
	}
	m.linear(kernels.OpGemmO, a.H, a.AttnOut, w.Wo, n, D, Q)
	m.addNorm(a.H, a.Norm2, a.Rstd2, a.H, a.X, w.FFNNorm, n) // h = x + Wo·attn, n2 = rmsnorm(h)∘w2
	if m.tiled() {
		// the MLP a tile of tokens at a time; a recompute for the backward (out nil) leaves it
		// to blockBackward, which recomputes each tile where it needs it
		if out != nil {
			for i0 := 0; i0 < n; i0 += m.tile {
				rows := min(m.tile, n-i0)
				t := m.mlpTile(w, a.Norm2, i0, rows, true)
				o := be.Slice(out, i0*D, rows*D)
				m.linear(kernels.OpGemmDown, o, t.Act, w.Down, rows, D, F)
				m.residual(o, o, be.Slice(a.H, i0*D, rows*D))
			}
		}
		return
	}
	m.linear(kernels.OpGemmGate, a.Gate, a.Norm2, w.Gate, n, F, D)
	m.linear(kernels.OpGemmUp, a.Up, a.Norm2, w.Up, n, F, D)
	if out != nil {
		m.swiglu(a.Act, a.Gate, a.Up)
		m.linear(kernels.OpGemmDown, out, a.Act, w.Down, n, D, F)
		m.residual(out, out, a.H)
	}
}

// mlpTile computes the MLP's gate and up (and, with act, its activation) for the rows tokens
// from row i0 of the FFN norm output norm2 into the tile buffers, and returns them (Gate, Up,
// Act of the tile).
func (m *Model) mlpTile(w LayerWeights, norm2 kernels.Buf, i0, rows int, act bool) LayerActs {
	be, D, F := m.be, m.Cfg.Dim, m.Cfg.FFNDim
	t := LayerActs{Gate: be.Slice(m.mlp.Gate, 0, rows*F), Up: be.Slice(m.mlp.Up, 0, rows*F), Act: be.Slice(m.mlp.Act, 0, rows*F)}
	x := be.Slice(norm2, i0*D, rows*D)
	m.linear(kernels.OpGemmGate, t.Gate, x, w.Gate, rows, F, D)
	m.linear(kernels.OpGemmUp, t.Up, x, w.Up, rows, F, D)
	if act {
		m.swiglu(t.Act, t.Gate, t.Up)
	}
	return t
}

// layerActs returns a complete LayerActs for block l: the block's own under CheckpointNone,
// otherwise the shared scratch with the fields the policy keeps pointing at block l's buffers.
func (m *Model) layerActs(l int) *LayerActs {
	if m.Policy == CheckpointNone {
		return &m.acts[l]
	}
	kept := &m.acts[l]
	m.view = m.work
	if m.halfActs() { // the forward's float32 input; the kept fields are packed
		m.view.X = m.xin[l%2]
		if kept.Lse != nil {
			m.view.Lse = kept.Lse
		}
		return &m.view
	}
	m.view.X = kept.X
	if kept.AttnOut != nil {
		m.view.AttnOut, m.view.Lse = kept.AttnOut, kept.Lse
	}
	return &m.view
}

// restore returns the complete activations of block l for its backward, recomputing what the
// policy did not keep: everything under CheckpointLayer (attention forward included), all but
// the attention under CheckpointAttnOutput. Recomputation runs the same kernels on the same
// inputs, so it is bit-identical to what the forward computed.
func (m *Model) restore(l int, w LayerWeights) *LayerActs {
	defer m.setPhase(m.setPhase(kernels.PhaseRecompute))
	if m.halfActs() { // widen what was kept into the scratch, then recompute the rest
		kept := &m.acts[l]
		m.view = m.work
		m.unpack(m.view.X, kept.X)
		if kept.AttnOut != nil {
			m.unpack(m.view.AttnOut, kept.AttnOut)
			m.view.Lse = kept.Lse
		}
		m.blockForward(l, w, &m.view, nil, m.Policy == CheckpointLayer)
		return &m.view
	}
	a := m.layerActs(l)
	if m.Policy != CheckpointNone {
		m.blockForward(l, w, a, nil, m.Policy == CheckpointLayer)
	}
	return a
}

// blockBackward turns dx, the gradient with respect to block l's output, into the gradient
// with respect to its input, adding the parameter gradients into g on the way.
func (m *Model) blockBackward(l int, w, g LayerWeights, a *LayerActs, dx kernels.Buf) {
	be, c, s := m.be, m.Cfg, &m.grad
	n, D, Q, KV, F := m.batch*m.seq, c.Dim, c.QDim(), c.KVDim(), c.FFNDim
	// out = h + Wdown·act: dh = dout (dx already holds it), dact = dout·Wdown. Where the
	// activation was not kept (recomputed, or tiled), the SwiGLU backward's kernel writes it
	// before the down projection's weight gradient reads it (SwiGLUBackwardAct).
	if m.tiled() { // a tile at a time, its gate and up recomputed
		for i0 := 0; i0 < n; i0 += m.tile {
			rows := min(m.tile, n-i0)
			old := m.setPhase(kernels.PhaseRecompute)
			t := m.mlpTile(w, a.Norm2, i0, rows, false)
			m.setPhase(old)
			dact, dgate, dup := be.Slice(s.dact, 0, rows*F), be.Slice(s.dgate, 0, rows*F), be.Slice(s.dup, 0, rows*F)
			dnorm, norm2, dout := be.Slice(s.dnorm, i0*D, rows*D), be.Slice(a.Norm2, i0*D, rows*D), be.Slice(dx, i0*D, rows*D)
			first := m.gradBeta(i0 == 0)
			m.gradX(kernels.OpGemmDown, dact, dout, w.Down, rows, D, F, 0)
			m.swigluBackwardAct(t.Act, dgate, dup, dact, t.Gate, t.Up)
			m.gradW(kernels.OpGemmDown, g.Down, dout, t.Act, rows, D, F, first)
			m.linearBackward(kernels.OpGemmGate, dnorm, g.Gate, dgate, norm2, w.Gate, rows, F, D, 0, first)
			m.linearBackward(kernels.OpGemmUp, dnorm, g.Up, dup, norm2, w.Up, rows, F, D, 1, first)
		}
	} else {
		first := m.gradBeta(true)
		if m.Policy == CheckpointNone { // the forward's activation, kept
			m.linearBackward(kernels.OpGemmDown, s.dact, g.Down, dx, a.Act, w.Down, n, D, F, 0, first)
			m.swigluBackward(s.dgate, s.dup, s.dact, a.Gate, a.Up)
		} else {
			m.gradX(kernels.OpGemmDown, s.dact, dx, w.Down, n, D, F, 0)
			m.swigluBackwardAct(a.Act, s.dgate, s.dup, s.dact, a.Gate, a.Up)
			m.gradW(kernels.OpGemmDown, g.Down, dx, a.Act, n, D, F, first)
		}
		m.linearBackward(kernels.OpGemmGate, s.dnorm, g.Gate, s.dgate, a.Norm2, w.Gate, n, F, D, 0, first)
		m.linearBackward(kernels.OpGemmUp, s.dnorm, g.Up, s.dup, a.Norm2, w.Up, n, F, D, 1, first)
	}
	first := m.gradBeta(true)
	m.freshNorm(g.FFNNorm)
	m.normBackward(dx, g.FFNNorm, s.dnorm, a.H, w.FFNNorm, a.Rstd2, n) // dx = dh
	// h = x + Wo·attn: dx = dh, dattn = dh·Wo
	m.linearBackward(kernels.OpGemmO, s.dattn, g.Wo, dx, a.AttnOut, w.Wo, n, D, Q, 0, first)
	m.zero(s.dq)
	m.zero(s.dk)
	m.zero(s.dv)
	for b := 0; b < m.batch; b++ {
		m.attnBackward(m.seqSlice(s.dq, b, Q), m.seqSlice(s.dk, b, KV), m.seqSlice(s.dv, b, KV),
			m.seqSlice(a.Q, b, Q), m.seqSlice(a.K, b, KV), m.seqSlice(a.V, b, KV),
			m.seqSlice(a.AttnOut, b, Q), m.seqSlice(a.Lse, b, c.NHeads), m.seqSlice(s.dattn, b, Q), m.seqOf(l, b))
		m.rotate(m.seqSlice(s.dq, b, Q), m.rpos[b], c.NHeads, true)
		m.rotate(m.seqSlice(s.dk, b, KV), m.rpos[b], c.NKVHeads, true)
	}
	m.linearBackward(kernels.OpGemmQ, s.dnorm, g.Wq, s.dq, a.Norm1, w.Wq, n, Q, D, 0, first)
	m.linearBackward(kernels.OpGemmK, s.dnorm, g.Wk, s.dk, a.Norm1, w.Wk, n, KV, D, 1, first)
	m.linearBackward(kernels.OpGemmV, s.dnorm, g.Wv, s.dv, a.Norm1, w.Wv, n, KV, D, 1, first)
	m.freshNorm(g.AttnNorm)
	m.normBackward(dx, g.AttnNorm, s.dnorm, a.X, w.AttnNorm, a.Rstd1, n)
}

// seqOf is sequence b's attention placement for layer l: masked by the sliding window when
// the layer has one (Config.Window).
func (m *Model) seqOf(l, b int) Seq {
	if m.Cfg.Window(l) > 0 {
		return m.wseqs[b]
	}
	return m.seqs[b]
}

// Positions returns 0..T-1, the positions of an unsharded sequence.
func Positions(T int) []int32 {
	p := make([]int32, T)
	for i := range p {
		p[i] = int32(i)
	}
	return p
}

// Batch is what one Forward or ForwardBackward reads besides the weights: B sequences, of which
// this rank holds the tokens at the global positions Pos of each (all of them on one rank:
// Positions(T)), and how the whole sequences are made. It is passed with every call; the model
// keeps none of it for the next.
type Batch struct {
	IDs     []int32 // [B·len(Pos)] the rank's tokens of each sequence, in Pos order
	Targets []int32 // [B·len(Pos)] their next tokens; negative: not scored
	B       int     // sequences
	Pos     []int32 // the global positions of the rank's tokens, the same in every sequence
	// SeqLen is the length of the whole sequences: with sequence parallelism each rank holds a
	// slice of the positions and the caller gives the global length here; a decoder gives the
	// prompt and the tokens to come. 0 means max(Pos)+1, right for an unsharded sequence. Only
	// model.rope_scaling.type dynamic depends on it (see Config.RoPE).
	SeqLen int
	// Docs, when not nil, packs documents (data.document_mask) into the sequences: Docs[b·S+p]
	// is the global position at which the document of position p of sequence b starts (S the
	// whole sequence's length, SeqLen or max(Pos)+1; data.Batch.DocStart), and attention sees
	// only keys of the query's own document. With ResetPositions (data.position_reset) RoPE
	// turns the token at p by its position in its document, p − Docs[b·S+p]; the mask still
	// uses the global order.
	Docs           []int32
	ResetPositions bool
}

// forward runs embedding, blocks, final norm, head and the per-token loss of the batch. When
// dscale is not zero the logits buffer is overwritten by dscale·dloss/dlogits.
func (m *Model) forward(bt Batch, dscale float32) (lossSum float64, count int) {
	ids, targets, B, T := bt.IDs, bt.Targets, bt.B, len(bt.Pos)
	if len(ids) != B*T || len(targets) != B*T {
		panic(fmt.Sprintf("model: %d ids and %d targets for %d×%d tokens", len(ids), len(targets), B, T))
	}
	m.ensure(bt)
	m.beginLoss(targets)
	m.phase = kernels.PhaseForward
	if m.half {
		m.forwardHalf(bt, dscale)
		return m.endLoss(targets)
	}
	be, c := m.be, m.Cfg
	n := B * T
	// each block's input, kept as the policy says: with 16-bit kept activations it is made in
	// a float32 buffer (xin), which the forward computes with, and packed into the kept one
	keep := func(l int, x kernels.Buf) {
		if m.halfActs() {
			m.pack(m.acts[l].X, x)
		}
	}
	input := func(l int) kernels.Buf {
		if m.halfActs() {
			return m.xin[l%2]
		}
		return m.acts[l].X
	}
	table := m.acquire(0)[0]
	m.Ops.Begin(kernels.OpEmbedding, m.phase)
	be.Embedding(input(0), table, ids, c.Dim)
	m.Ops.End(kernels.EmbeddingCost(n, c.Dim, false))
	m.release(0)
	keep(0, input(0))
	for l := 0; l < c.NLayers; l++ {
		out := m.xOut
		if l+1 < c.NLayers {
			out = input(l + 1)
		}
		m.blockForward(l, layerWeights(m.acquire(1+l)), m.layerActs(l), out, true)
		m.release(1 + l)
		if l+1 < c.NLayers {
			keep(l+1, out)
		}
	}
	// the final norm, then the head and the loss a chunk of tokens at a time (LossChunk),
	// with the head's backward for each chunk as soon as its dlogits exist
	L, D, V := c.NLayers, c.Dim, c.VocabSize
	head := m.acquire(L + 1)
	m.norm(m.normF, m.rstdF, m.xOut, head[0], n)
	if dscale != 0 {
		m.headGrad = m.gradOf(L + 1)
	}
	for i0 := 0; i0 < n; i0 += m.chunk {
		rows := min(m.chunk, n-i0)
		lg, nf := be.Slice(m.logit, 0, rows*V), be.Slice(m.normF, i0*D, rows*D)
		m.linear(kernels.OpGemmHead, lg, nf, head[1], rows, V, D)
		if m.RowHook != nil {
			m.RowHook(i0, lg, rows)
		}
		var dl kernels.Buf
		if dscale != 0 {
			dl = lg
		}
		m.Ops.Begin(kernels.OpLoss, m.phase)
		be.CrossEntropy(be.Slice(m.lossBuf, i0, rows), dl, lg, targets[i0:i0+rows], V, dscale)
		m.Ops.End(kernels.CrossEntropyCost(rows, V, dl != nil))
		if dscale != 0 { // logits = normF·Headᵀ: dnormF = dlogits·Head, dHead += dlogitsᵀ·normF
			m.linearBackward(kernels.OpGemmHead, be.Slice(m.grad.dnorm, i0*D, rows*D), m.headGrad[1], lg, nf, head[1], rows, V, D, 0, m.gradBeta(i0 == 0))
		}
	}
	m.release(L + 1)
	return m.endLoss(targets)
}

// Forward computes the logits of the batch (see Logits) and returns the summed loss over the
// targets that are not negative, and how many there are.
func (m *Model) Forward(b Batch) (lossSum float64, count int) {
	return m.forward(b, 0)
}

// ForwardBackward runs forward and backward for B sequences and adds dscale·∂(Σ loss)/∂θ into
// Grads. The caller picks dscale: 1/(tokens in the global batch) gives the mean loss's
// gradient however the batch is split over micro-batches and ranks.
func (m *Model) ForwardBackward(b Batch, dscale float32) (lossSum float64, count int) {
	if dscale == 0 {
		panic("model: ForwardBackward with dscale 0")
	}
	m.fresh = m.FreshGrads
	defer func() { m.fresh, m.FreshGrads = false, false }()
	lossSum, count = m.forward(b, dscale)
	if m.half {
		m.backwardHalf(b)
		m.Stats.Steps++
		return lossSum, count
	}
	ids := b.IDs
	c, s := m.Cfg, &m.grad
	n := b.B * len(b.Pos)
	// the head's backward ran in the forward, chunk by chunk; s.dnorm holds dnormF
	L := c.NLayers
	m.phase = kernels.PhaseBackward
	head, headGrad := m.acquire(L+1), m.headGrad
	m.headGrad = nil
	m.zero(s.dx)
	m.freshNorm(headGrad[0])
	m.normBackward(s.dx, headGrad[0], s.dnorm, m.xOut, head[0], m.rstdF, n)
	m.release(L + 1)
	m.gradDone(L + 1)
	for l := L - 1; l >= 0; l-- {
		w := layerWeights(m.acquire(1 + l))
		g := layerWeights(m.gradOf(1 + l))
		m.blockBackward(l, w, g, m.restore(l, w), s.dx)
		m.release(1 + l)
		m.gradDone(1 + l)
	}
	m.embeddingBackward(s.dx, ids, n, c.Dim)
	m.Stats.Steps++
	return lossSum, count
}

// embeddingBackward ends a backward pass: dx, the gradient at the embedding's output for the n
// tokens ids, scatter-added into the table's gradient (unit 0; zeroed first under FreshGrads,
// since the rows no token hit are not written), which is then done.
func (m *Model) embeddingBackward(dx kernels.Buf, ids []int32, n, dim int) {
	dtable := m.gradOf(0)[0]
	if m.fresh {
		m.zero(dtable)
	}
	m.Ops.Begin(kernels.OpEmbedding, m.phase)
	m.be.EmbeddingBackward(dtable, dx, ids, dim)
	m.Ops.End(kernels.EmbeddingCost(n, dim, true))
	m.gradDone(0)
}
