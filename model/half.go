package model

import (
	"fmt"

	"distflash/kernels"
)

// The 16-bit step (Model.Precision BF16 or FP16): the block forward and backward written out
// again for 16-bit operands, on the Backend's 16-bit methods (kernels.Backend's MatMulHalf …
// CrossEntropyHalf; "packed" below is PackHalf's layout, two 16-bit values a buffer element,
// which on a GPU is a plain bf16 or fp16 array).
//
// What is 16-bit and what is not:
//   - Every GEMM reads 16-bit A and B: the weights' 16-bit copy as the store lends it
//     (HalfStore: no widening) and 16-bit activations; it accumulates in float32 and writes
//     either a packed C (rounded once) or a float32 C.
//   - Every activation between kernels is packed: both norms' outputs, q, k, v after RoPE,
//     the attention output, gate‖up and the SwiGLU activation, and every gradient temporary
//     (dnorm, dattn, dq, dk, dv, dqkv, dgate‖dup, dact, and a 16-bit copy of the residual
//     gradient, which the next GEMMs read).
//   - Float32: the residual stream and the residual gradient, the log-sum-exp and the norms'
//     1/rms, the logits (the loss's softmax needs them), the per-token losses and the weight
//     gradients (GEMMs with a float32 C).
//
// The residual stream stays float32 because sums accumulate in it: inside a block the
// attention's and the MLP's outputs are added into it by their projections' GEMMs (beta 1 on
// the float32 stream, no separate add), and backward the residual gradient collects 2L
// contributions the same way (each norm backward adds into it). Rounding each sum to 16 bits
// would lose every contribution below 2⁻⁹ of the running value (bf16), and those are most of
// them in a deep model. The stream is rounded once per block, at the block boundary: each
// block's input is a 16-bit value, the one its checkpoint keeps (X). That is what makes the
// recomputation of the policies layer and attn_output bit-identical to the forward: it starts
// from the kept X, which is exactly the forward's input, not a rounding of it. The gradients
// are then the same under every policy, MLP tiling and loss chunking (the weight-gradient
// sums over tiles and chunks aside), as the float32 path's are; keeping X in float32 instead
// would double the kept memory of layer and attn_output. The cost: one Round pass over the
// stream a block (8 bytes a value), and L−1 roundings of the stream, half as many as a 16-bit
// stream has and each after the block's two sums were added in float32; on the training
// tests it is within the noise (TestMixedPrecisionTrains, bf16: +0.011 nats from float32 with
// it, +0.022 without). The first block's input, the
// embedding's rows of the 16-bit table, is 16-bit already; the last block's output, the final
// norm's input, is never recomputed and stays float32.
//
// The forward of a block (n tokens; D the width, Q = heads·hd, KV = kvheads·hd, F the FFN
// width; r the float32 stream, holding the block input rounded to 16 bits):
//
//	n1  = RMSNormHalf(r)                          keep: X = r packed (exact)
//	qkv = n1·[Wq|Wk|Wv]ᵀ                          one GEMM, N = Q+2·KV, packed
//	q, k, v = RoPEQKV(qkv)                        per sequence (its positions)
//	o, lse = attention(q, k, v)                   packed o, float32 lse
//	r  += o·Woᵀ                                   r = h (GEMM beta 1, float32 C)
//	n2  = RMSNormHalf(r)                          keep: H = h packed (its backward's x)
//	gu  = n2·[Wgate|Wup]ᵀ                         one GEMM, N = 2F, packed, a tile of rows at a time
//	act = SwiGLUHalf(gu)
//	r  += act·Wdownᵀ                              r = the block's output (beta 1)
//	r   = Round(r)                                the next block's input
//
// and its backward (dx the float32 residual gradient, dx16 its packed copy from the last norm
// backward; weight gradients float32, beta 1, or 0 for a FreshGrads step's first one):
//
//	dact = dx16·Wdown;  dgu = SwiGLUBackwardHalf(dact, gu) (writing act where not kept)
//	dWdown += dx16ᵀ·act;  dn2 = dgu·[Wgate|Wup];  d[Wgate|Wup] += dguᵀ·n2   (per MLP tile)
//	dx += RMSNormBackwardHalf(dn2, H) → dx16
//	dattn = dx16·Wo;  dWo += dx16ᵀ·o
//	dq, dk, dv = attention backward;  dqkv = RoPEQKVBackward(dq, dk, dv)
//	dn1 = dqkv·[Wq|Wk|Wv];  d[Wq|Wk|Wv] += dqkvᵀ·n1
//	dx += RMSNormBackwardHalf(dn1, X) → dx16
//
// The head, a loss chunk at a time: logits (float32) = normF16·Headᵀ; CrossEntropyHalf writes
// dlogits packed into their own buffer; dnormF16 = dlogits16·Head; dHead += dlogits16ᵀ·normF16.
//
// The buffers of the 16-bit step (ensureHalf; n = B·T tokens, P packed at 2 bytes a value, F
// float32 at 4; what ActivationBytes counts):
//
//	kept per block, none:        X, N1, Q, K, V, O, H, N2 [n·(4D+2Q+2KV)] P; Rstd1, Rstd2 [2n] F;
//	                             Lse [n·heads] F; untiled MLP: GU [n·2F], Act [n·F] P
//	kept per block, layer:       X [n·D] P
//	kept per block, attn_output: X, O [n·(D+Q)] P; Lse [n·heads] F
//	recompute scratch (layer, attn_output): N1, Q, K, V, H, N2 [n·(3D+Q+2KV)] P; Rstd1, Rstd2
//	                             [2n] F; layer also O [n·Q] P, Lse [n·heads] F; untiled MLP: GU,
//	                             Act [n·3F] P
//	always: the stream r [n·D] F; qkv [n·(Q+2KV)] P; the final norm's input and output [2n·D]
//	        P and its Rstd [n] F; logits [c·V] F and dlogits [c·V] P (c the loss chunk); losses
//	        [n] F; backward: dx [n·D] F; dx16, dnorm [2n·D] P; dattn, dq [2n·Q] P; dk, dv
//	        [2n·KV] P; dqkv [n·(Q+2KV)] P; dgu, dact [t·3F] P (t the MLP tile, or n)
//	tiled MLP: gu, act [t·3F] P
//	an Attention that is not a HalfAttention (the sequence-parallel schedules): its float32
//	        operands per sequence: q, o, do, dq [4T·Q] F; k, v, dk, dv [4T·KV] F
//
// Not counted: the float32 k and v a KVHook is handed (the decoder's prefill), and the 16-bit
// copy of the weights a model without a store packs its Params into (halfWeights), both
// allocated on first use.
//
// The 16-bit step needs D, Q, KV and F even, so that every row of a packed buffer, every tile
// and chunk, every sequence's slice and every tensor of the packed weights starts on a buffer
// element. A resolved Config has D, Q and KV even always (each a head count times the head
// dimension, which RoPE needs even), so only an odd FFN width (no config in configs/ or the
// tests has one but TestHalfStepOddWidths') sends a model back to the float32 path, which then
// keeps its activations in Precision as ActPrecision does (halfStep).

// halfActs is what one block's backward reads in the 16-bit step (packed unless marked).
type halfActs struct {
	X     kernels.Buf // [n, D] the block input, kept by every policy
	N1    kernels.Buf // [n, D] rmsnorm(x) ∘ w1
	Rstd1 kernels.Buf // float32 [n]
	Q     kernels.Buf // [n, Q] after RoPE
	K     kernels.Buf // [n, KV] after RoPE
	V     kernels.Buf // [n, KV]
	O     kernels.Buf // [n, Q] the attention output, kept by attn_output
	Lse   kernels.Buf // float32 [B, heads, T], kept by attn_output
	H     kernels.Buf // [n, D] x + Wo·o, the FFN norm's input
	N2    kernels.Buf // [n, D] rmsnorm(h) ∘ w2
	Rstd2 kernels.Buf // float32 [n]
	GU    kernels.Buf // [n, 2F] rows gate | up (untiled MLP)
	Act   kernels.Buf // [n, F] silu(gate) ∘ up (untiled MLP)
}

// halfState holds the 16-bit step's buffers for the current batch shape (see above).
type halfState struct {
	acts      []halfActs // per block, the fields its policy keeps
	work      halfActs   // recompute scratch (layer, attn_output)
	view      halfActs   // work with one block's kept fields
	r         kernels.Buf
	qkv       kernels.Buf
	gu, act   kernels.Buf // tiled MLP: one tile's
	xOut      kernels.Buf // the last block's output, packed (the final norm backward's x)
	normF     kernels.Buf
	rstdF     kernels.Buf
	logit     kernels.Buf // float32
	dlogit    kernels.Buf
	dx        kernels.Buf // float32
	dx16, dn  kernels.Buf
	dattn, dq kernels.Buf
	dk, dv    kernels.Buf
	dqkv      kernels.Buf
	dgu, dact kernels.Buf
	// float32 operands of an Attention that takes no 16-bit ones, one sequence's
	aq, ak, av, ao, ado, adq, adk, adv kernels.Buf
	hookK, hookV                       kernels.Buf // float32 k, v for KVHook
	wpack                              kernels.Buf // a unit packed from a store's float32 weights
}

// halfBlock is one block's weights, packed (or their float32 gradients), as the 16-bit step
// uses them: Wq|Wk|Wv and Wgate|Wup, contiguous in the Layout, each one matrix.
type halfBlock struct {
	AttnNorm, Wqkv, Wo, FFNNorm, Wgu, Down kernels.Buf
}

// halfStep reports whether the model runs the 16-bit step: Precision BF16 or FP16 and every
// width even (see above).
func (m *Model) halfStep() bool {
	c := m.Cfg
	return isHalf(m.Precision) && c.Dim%2 == 0 && c.FFNDim%2 == 0 && c.QDim()%2 == 0 && c.KVDim()%2 == 0
}

// ensureHalf sizes the 16-bit step's buffers for m.batch sequences of m.seq tokens.
func (m *Model) ensureHalf() {
	c := m.Cfg
	n, L, D, Q, KV, F, H := m.batch*m.seq, c.NLayers, c.Dim, c.QDim(), c.KVDim(), c.FFNDim, c.NHeads
	T, QKV := m.seq, Q+2*c.KVDim()
	m.takeBytes = 0
	pk := func(values int) kernels.Buf { return m.take((values + 1) / 2) }
	m.tile = n
	if m.MLPTile > 0 && m.MLPTile < n {
		m.tile = m.MLPTile
	}
	m.chunk = n
	if m.LossChunk > 0 && m.LossChunk < n {
		m.chunk = m.LossChunk
	}
	tiled := m.tiled()
	// block activations: attention's and the MLP's as needed
	acts := func(x, attn bool) halfActs {
		a := halfActs{N1: pk(n * D), Rstd1: m.take(n), Q: pk(n * Q), K: pk(n * KV), V: pk(n * KV),
			H: pk(n * D), N2: pk(n * D), Rstd2: m.take(n)}
		if x {
			a.X = pk(n * D)
		}
		if attn {
			a.O, a.Lse = pk(n*Q), m.take(n*H)
		}
		if !tiled {
			a.GU, a.Act = pk(n*2*F), pk(n*F)
		}
		return a
	}
	hs := halfState{acts: make([]halfActs, L)}
	for l := range hs.acts {
		switch m.Policy {
		case CheckpointNone:
			hs.acts[l] = acts(true, true)
		case CheckpointLayer:
			hs.acts[l] = halfActs{X: pk(n * D)}
		case CheckpointAttnOutput:
			hs.acts[l] = halfActs{X: pk(n * D), O: pk(n * Q), Lse: m.take(n * H)}
		}
	}
	if m.Policy != CheckpointNone {
		hs.work = acts(false, m.Policy == CheckpointLayer)
	}
	rows := n
	if tiled {
		rows = m.tile
		hs.gu, hs.act = pk(rows*2*F), pk(rows*F)
	}
	hs.r, hs.qkv = m.take(n*D), pk(n*QKV)
	hs.xOut, hs.normF, hs.rstdF = pk(n*D), pk(n*D), m.take(n)
	hs.logit, hs.dlogit, m.loss = m.take(m.chunk*c.VocabSize), pk(m.chunk*c.VocabSize), m.take(n)
	hs.dx, hs.dx16, hs.dn = m.take(n*D), pk(n*D), pk(n*D)
	hs.dattn, hs.dq, hs.dk, hs.dv, hs.dqkv = pk(n*Q), pk(n*Q), pk(n*KV), pk(n*KV), pk(n*QKV)
	hs.dgu, hs.dact = pk(rows*2*F), pk(rows*F)
	if _, ok := m.Attn.(HalfAttention); !ok {
		hs.aq, hs.ao, hs.ado, hs.adq = m.take(T*Q), m.take(T*Q), m.take(T*Q), m.take(T*Q)
		hs.ak, hs.av, hs.adk, hs.adv = m.take(T*KV), m.take(T*KV), m.take(T*KV), m.take(T*KV)
	}
	hs.hookK, hs.hookV, hs.wpack = m.hs.hookK, m.hs.hookV, m.hs.wpack // not the batch's: kept
	m.hs = hs
	m.logit = hs.logit
	m.actBytes = m.takeBytes
}

// halfSeq returns sequence b's rows of a packed [B·T, width] buffer (width even).
func (m *Model) halfSeq(buf kernels.Buf, b, width int) kernels.Buf {
	return m.be.Slice(buf, b*m.seq*width/2, m.seq*width/2)
}

// halfRows returns rows [i0, i0+rows) of a packed [·, width] buffer (width even).
func (m *Model) halfRows(buf kernels.Buf, i0, rows, width int) kernels.Buf {
	return m.be.Slice(buf, i0*width/2, rows*width/2)
}

// blockViews cuts unit u's buffer (a block's weights packed, per 2, or its float32
// gradient, per 1) into the tensors the 16-bit step uses.
func (m *Model) blockViews(u int, buf kernels.Buf, per int) halfBlock {
	unit := m.units[u]
	if want := (unit.N + per - 1) / per; buf.Len() != want {
		panic(fmt.Sprintf("model: unit %d buffer of %d elements, want %d", u, buf.Len(), want))
	}
	t := m.Layout.Tensors[unit.First : unit.First+unit.Count]
	view := func(first, last int) kernels.Buf {
		off, size := t[first].Off-unit.Off, t[last].Off+t[last].Size()-t[first].Off
		return m.be.Slice(buf, off/per, (size+per-1)/per)
	}
	return halfBlock{AttnNorm: view(0, 0), Wqkv: view(1, 3), Wo: view(4, 4), FFNNorm: view(5, 5), Wgu: view(6, 7), Down: view(8, 8)}
}

// headViews cuts the output unit's buffer (packed, per 2, or float32, per 1) into the final
// norm's weight and the head.
func (m *Model) headViews(buf kernels.Buf, per int) (norm, head kernels.Buf) {
	D := m.Cfg.Dim
	return m.be.Slice(buf, 0, D/per), m.be.Slice(buf, D/per, m.Cfg.VocabSize*D/per)
}

// lendHalf returns unit u's weights packed in Precision when they are to be had without
// packing: the store's HalfParams, or the model's own 16-bit copy without a store; nil
// otherwise (the store lends float32 only). A unit it returns is released with release.
func (m *Model) lendHalf(u int) kernels.Buf {
	unit := m.units[u]
	if m.Store == nil {
		return m.be.Slice(m.ownHalf, unit.Off/2, (unit.N+1)/2)
	}
	hs, ok := m.Store.(HalfStore)
	if !ok {
		return nil
	}
	if _, cast := m.Store.(*CastStore); cast { // a view of its copy: nothing to record
		return hs.HalfParams(u, m.Precision)
	}
	m.Ops.Begin(kernels.OpComm, m.phase)
	b := hs.HalfParams(u, m.Precision)
	cost := kernels.OpCost{}
	if b != nil {
		cost.Bytes = 2 * int64(unit.N) // what is gathered
	}
	m.Ops.End(cost)
	return b
}

// acquireHalf returns unit u's weights packed in Precision: lent as they are (lendHalf), or
// the store's float32 weights packed into a scratch, one pass.
func (m *Model) acquireHalf(u int) kernels.Buf {
	if b := m.lendHalf(u); b != nil {
		return b
	}
	buf := m.be.Slice(m.Store.Params(u), 0, m.units[u].N)
	if m.hs.wpack == nil {
		most := 0
		for _, un := range m.units {
			most = max(most, un.N)
		}
		m.hs.wpack = m.be.Alloc((most + 1) / 2)
	}
	dst := m.be.Slice(m.hs.wpack, 0, (buf.Len()+1)/2)
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.PackHalf(dst, buf, m.Precision)
	m.Ops.End(kernels.HalfCost(buf.Len()))
	return dst
}

// packOwn makes the 16-bit copy of Params a model without a store computes with: at the start
// of every call, since the caller may have changed Params since the last (an optimizer step).
// A caller that wants no such pass gives the model a CastStore (world does).
func (m *Model) packOwn() {
	if m.ownHalf == nil {
		m.ownHalf = m.be.Alloc((m.Layout.Size + 1) / 2)
	}
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.PackHalf(m.ownHalf, m.Params.Flat, m.Precision)
	m.Ops.End(kernels.HalfCost(m.Layout.Size))
}

// forwardHalf is forward in the 16-bit step: embedding, blocks, final norm, head and the
// per-token losses into lossBuf; with dscale the head's backward too, a loss chunk at a time.
func (m *Model) forwardHalf(bt Batch, dscale float32) {
	be, c, p, hs := m.be, m.Cfg, m.Precision, &m.hs
	n, L, D, V := m.batch*m.seq, c.NLayers, c.Dim, c.VocabSize
	if m.Store == nil {
		m.packOwn()
	}
	if table := m.lendHalf(0); table != nil {
		m.Ops.Begin(kernels.OpEmbedding, m.phase)
		be.EmbeddingHalf(hs.r, table, bt.IDs, D, p)
		m.Ops.End(halfEmbeddingCost(n, D))
	} else { // the float32 rows, rounded: the rows of the table rounded, without packing it
		table := m.acquire(0)[0]
		m.Ops.Begin(kernels.OpEmbedding, m.phase)
		be.Embedding(hs.r, table, bt.IDs, D)
		m.Ops.End(kernels.EmbeddingCost(n, D, false))
		m.roundStream(hs.r)
	}
	m.release(0)
	for l := 0; l < L; l++ {
		if l > 0 {
			m.roundStream(hs.r)
		}
		w := m.blockViews(1+l, m.acquireHalf(1+l), 2)
		m.blockForwardHalf(l, w, m.halfLayer(l), hs.acts[l].X, true)
		m.release(1 + l)
	}
	normW, head := m.headViews(m.acquireHalf(L+1), 2)
	m.normHalf(hs.normF, hs.xOut, hs.rstdF, hs.r, normW, n)
	if dscale != 0 {
		m.headGrad = m.gradOf(L + 1)
	}
	for i0 := 0; i0 < n; i0 += m.chunk {
		rows := min(m.chunk, n-i0)
		lg, nf := be.Slice(hs.logit, 0, rows*V), m.halfRows(hs.normF, i0, rows, D)
		m.matHalf(kernels.OpGemmHead, lg, nf, head, rows, V, D, false, true, 0, false)
		if m.RowHook != nil {
			m.RowHook(i0, lg, rows)
		}
		loss, tg := be.Slice(m.lossBuf, i0, rows), bt.Targets[i0:i0+rows]
		m.Ops.Begin(kernels.OpLoss, m.phase)
		if dscale == 0 {
			be.CrossEntropy(loss, nil, lg, tg, V, 0)
			m.Ops.End(kernels.CrossEntropyCost(rows, V, false))
			continue
		}
		dl := be.Slice(hs.dlogit, 0, (rows*V+1)/2)
		be.CrossEntropyHalf(loss, dl, lg, tg, V, dscale, p)
		m.Ops.End(halfCrossEntropyCost(rows, V))
		// logits = normF·Headᵀ: dnormF = dlogits·Head, dHead += dlogitsᵀ·normF
		m.gradHalf(kernels.OpGemmHead, m.halfRows(hs.dn, i0, rows, D), dl, head, rows, D, V, false, false, 0, true)
		m.gradHalf(kernels.OpGemmHead, m.headGrad[1], dl, nf, V, D, rows, true, false, m.gradBeta(i0 == 0), false)
	}
	m.release(L + 1)
}

// halfLayer returns block l's activations for its forward: its own under CheckpointNone,
// otherwise the shared scratch with the fields the policy keeps pointing at block l's.
func (m *Model) halfLayer(l int) *halfActs {
	hs := &m.hs
	if m.Policy == CheckpointNone {
		return &hs.acts[l]
	}
	kept := hs.acts[l]
	hs.view = hs.work
	hs.view.X = kept.X
	if kept.O != nil {
		hs.view.O, hs.view.Lse = kept.O, kept.Lse
	}
	return &hs.view
}

// blockForwardHalf runs block l on the stream r (the block's input, a 16-bit value), filling
// a. keepX, when not nil, receives the input packed (the forward; the recomputation starts
// from it). With attn false a.O and a.Lse are taken as computed (attn_output's recomputation).
// With full the block's output is left in r; without (the backward's recomputation) the block
// stops where the backward takes over: after gate‖up untiled (the SwiGLU backward writes the
// activation), after the FFN norm tiled (the backward recomputes each tile).
func (m *Model) blockForwardHalf(l int, w halfBlock, a *halfActs, keepX kernels.Buf, full bool) {
	be, c, hs := m.be, m.Cfg, &m.hs
	n, D, Q, KV, F := m.batch*m.seq, c.Dim, c.QDim(), c.KVDim(), c.FFNDim
	QKV := Q + 2*KV
	attn := keepX != nil || m.Policy == CheckpointLayer // the forward, or layer's recomputation
	m.normHalf(a.N1, keepX, a.Rstd1, hs.r, w.AttnNorm, n)
	m.matHalf(kernels.OpGemmQKV, hs.qkv, a.N1, w.Wqkv, n, QKV, D, false, true, 0, true)
	for b := 0; b < m.batch; b++ {
		m.ropeQKV(m.halfSeq(a.Q, b, Q), m.halfSeq(a.K, b, KV), m.halfSeq(a.V, b, KV), m.halfSeq(hs.qkv, b, QKV), m.rpos[b])
	}
	if attn {
		if m.KVHook != nil && keepX != nil {
			m.hookKV(l, a.K, a.V, n*KV)
		}
		m.Stats.AttnForwards++
		for b := 0; b < m.batch; b++ {
			m.attnForwardHalf(m.halfSeq(a.O, b, Q), m.seqSlice(a.Lse, b, c.NHeads),
				m.halfSeq(a.Q, b, Q), m.halfSeq(a.K, b, KV), m.halfSeq(a.V, b, KV), m.seqOf(l, b))
		}
	}
	m.matHalf(kernels.OpGemmO, hs.r, a.O, w.Wo, n, D, Q, false, true, 1, false) // r = h = x + o·Woᵀ
	keepH := a.H
	if full && m.Policy != CheckpointNone { // the backward recomputes it
		keepH = nil
	}
	m.normHalf(a.N2, keepH, a.Rstd2, hs.r, w.FFNNorm, n)
	if m.tiled() {
		if !full {
			return
		}
		for i0 := 0; i0 < n; i0 += m.tile {
			rows := min(m.tile, n-i0)
			gu, act := be.Slice(hs.gu, 0, rows*F), be.Slice(hs.act, 0, rows*F/2)
			m.matHalf(kernels.OpGemmGateUp, gu, m.halfRows(a.N2, i0, rows, D), w.Wgu, rows, 2*F, D, false, true, 0, true)
			m.swigluHalf(act, gu, rows)
			m.matHalf(kernels.OpGemmDown, be.Slice(hs.r, i0*D, rows*D), act, w.Down, rows, D, F, false, true, 1, false)
		}
		return
	}
	m.matHalf(kernels.OpGemmGateUp, a.GU, a.N2, w.Wgu, n, 2*F, D, false, true, 0, true)
	if full {
		m.swigluHalf(a.Act, a.GU, n)
		m.matHalf(kernels.OpGemmDown, hs.r, a.Act, w.Down, n, D, F, false, true, 1, false) // r = h + act·Wdownᵀ
	}
}

// hookKV hands KVHook block l's keys and values widened to float32, as the float32 path does.
func (m *Model) hookKV(l int, k, v kernels.Buf, values int) {
	hs := &m.hs
	if hs.hookK == nil || hs.hookK.Len() < values {
		hs.hookK, hs.hookV = m.be.Alloc(values), m.be.Alloc(values)
	}
	hk, hv := m.be.Slice(hs.hookK, 0, values), m.be.Slice(hs.hookV, 0, values)
	m.be.UnpackHalf(hk, k, m.Precision)
	m.be.UnpackHalf(hv, v, m.Precision)
	m.KVHook(l, hk, hv)
}

// restoreHalf returns block l's activations for its backward, recomputing what the policy did
// not keep from the kept input X, which is exactly the forward's input: the recomputation is
// bit-identical to the forward.
func (m *Model) restoreHalf(l int, w halfBlock) *halfActs {
	if m.Policy == CheckpointNone {
		return &m.hs.acts[l]
	}
	defer m.setPhase(m.setPhase(kernels.PhaseRecompute))
	a := m.halfLayer(l)
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.UnpackHalf(m.hs.r, a.X, m.Precision)
	m.Ops.End(kernels.HalfCost(m.hs.r.Len()))
	m.blockForwardHalf(l, w, a, nil, false)
	return a
}

// backwardHalf is ForwardBackward's backward in the 16-bit step, after forwardHalf (whose
// loss chunks left dnormF in dn and took the head's gradient).
func (m *Model) backwardHalf(bt Batch) {
	c, hs := m.Cfg, &m.hs
	n, L, D := m.batch*m.seq, c.NLayers, c.Dim
	m.phase = kernels.PhaseBackward
	normW, _ := m.headViews(m.acquireHalf(L+1), 2)
	headGrad := m.headGrad
	m.headGrad = nil
	m.zero(hs.dx)
	m.normBackwardHalf(hs.dx, hs.dx16, headGrad[0], hs.dn, hs.xOut, normW, hs.rstdF, n, m.gradBeta(true))
	m.release(L + 1)
	m.gradDone(L + 1)
	for l := L - 1; l >= 0; l-- {
		w := m.blockViews(1+l, m.acquireHalf(1+l), 2)
		g := m.blockViews(1+l, m.gradUnit(1+l), 1)
		m.blockBackwardHalf(l, w, g, m.restoreHalf(l, w))
		m.release(1 + l)
		m.gradDone(1 + l)
	}
	m.embeddingBackward(hs.dx, bt.IDs, n, D)
}

// blockBackwardHalf turns the residual gradient dx (float32, and its packed copy dx16: the
// gradient with respect to block l's output) into the gradient with respect to its input,
// setting or adding the weight gradients into g on the way.
func (m *Model) blockBackwardHalf(l int, w, g halfBlock, a *halfActs) {
	be, c, hs := m.be, m.Cfg, &m.hs
	n, D, Q, KV, F := m.batch*m.seq, c.Dim, c.QDim(), c.KVDim(), c.FFNDim
	QKV := Q + 2*KV
	// out = h + act·Wdownᵀ: dh = dout (dx holds it), dact = dout·Wdown, per MLP tile
	for i0 := 0; i0 < n; i0 += m.tile {
		rows := min(m.tile, n-i0)
		gu, act, actOut := a.GU, a.Act, a.Act // the activation, written by the SwiGLU backward
		switch {
		case m.tiled(): // the tile's gate‖up recomputed from the kept FFN norm output
			gu, act = be.Slice(hs.gu, 0, rows*F), be.Slice(hs.act, 0, rows*F/2)
			actOut = act
			old := m.setPhase(kernels.PhaseRecompute)
			m.matHalf(kernels.OpGemmGateUp, gu, m.halfRows(a.N2, i0, rows, D), w.Wgu, rows, 2*F, D, false, true, 0, true)
			m.setPhase(old)
		case m.Policy == CheckpointNone: // the forward's activation, kept
			actOut = nil
		}
		dout, n2 := m.halfRows(hs.dx16, i0, rows, D), m.halfRows(a.N2, i0, rows, D)
		dact, dgu := be.Slice(hs.dact, 0, rows*F/2), be.Slice(hs.dgu, 0, rows*F)
		first := m.gradBeta(i0 == 0)
		m.gradHalf(kernels.OpGemmDown, dact, dout, w.Down, rows, F, D, false, false, 0, true)
		m.swigluBackwardHalf(dgu, actOut, dact, gu, rows)
		m.gradHalf(kernels.OpGemmDown, g.Down, dout, act, D, F, rows, true, false, first, false)
		m.gradHalf(kernels.OpGemmGateUp, m.halfRows(hs.dn, i0, rows, D), dgu, w.Wgu, rows, D, 2*F, false, false, 0, true)
		m.gradHalf(kernels.OpGemmGateUp, g.Wgu, dgu, n2, 2*F, D, rows, true, false, first, false)
	}
	first := m.gradBeta(true)
	m.normBackwardHalf(hs.dx, hs.dx16, g.FFNNorm, hs.dn, a.H, w.FFNNorm, a.Rstd2, n, first) // dx = dh
	// h = x + o·Woᵀ: dx = dh, dattn = dh·Wo
	m.gradHalf(kernels.OpGemmO, hs.dattn, hs.dx16, w.Wo, n, Q, D, false, false, 0, true)
	m.gradHalf(kernels.OpGemmO, g.Wo, hs.dx16, a.O, D, Q, n, true, false, first, false)
	for b := 0; b < m.batch; b++ {
		dq, dk, dv := m.halfSeq(hs.dq, b, Q), m.halfSeq(hs.dk, b, KV), m.halfSeq(hs.dv, b, KV)
		m.attnBackwardHalf(dq, dk, dv, m.halfSeq(a.Q, b, Q), m.halfSeq(a.K, b, KV), m.halfSeq(a.V, b, KV),
			m.halfSeq(a.O, b, Q), m.seqSlice(a.Lse, b, c.NHeads), m.halfSeq(hs.dattn, b, Q), m.seqOf(l, b))
		m.ropeQKVBackward(m.halfSeq(hs.dqkv, b, QKV), dq, dk, dv, m.rpos[b])
	}
	m.gradHalf(kernels.OpGemmQKV, hs.dn, hs.dqkv, w.Wqkv, n, D, QKV, false, false, 0, true)
	m.gradHalf(kernels.OpGemmQKV, g.Wqkv, hs.dqkv, a.N1, QKV, D, n, true, false, first, false)
	dx16 := hs.dx16
	if l == 0 { // the embedding's backward reads the float32 gradient only
		dx16 = nil
	}
	m.normBackwardHalf(hs.dx, dx16, g.AttnNorm, hs.dn, a.X, w.AttnNorm, a.Rstd1, n, first)
}

// HalfAttention is an Attention that also takes 16-bit operands (the 16-bit step's): q, k, v
// and o packed in p, and in the backward do too, with dq, dk, dv set (not added to) packed in
// p; lse float32. LocalAttention implements it with the backend's one-call 16-bit attention.
// The model calls an Attention without it through Forward and Backward on float32 copies of
// the operands (attnForwardHalf).
type HalfAttention interface {
	Attention
	// ForwardHalf is Forward with q, k, v and o packed in p.
	ForwardHalf(o, lse, q, k, v kernels.Buf, seq Seq, h Heads, p kernels.Precision)
	// BackwardHalf is Backward with q, k, v, o and do packed in p, setting dq, dk, dv (packed
	// in p, their previous contents ignored).
	BackwardHalf(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq, h Heads, p kernels.Precision)
}

// ForwardHalf implements HalfAttention: one call of the backend's AttnForwardHalf, which
// writes o packed and lse directly (no state to initialise, fold, finish or pack).
func (a *LocalAttention) ForwardHalf(o, lse, q, k, v kernels.Buf, seq Seq, h Heads, p kernels.Precision) {
	sh := attnShape(len(seq.Pos), seq, h)
	sh.Operands = p
	a.Backend.AttnForwardHalf(o, lse, q, k, v, sh)
}

// BackwardHalf implements HalfAttention: one call of the backend's AttnBackwardHalf, which
// reads the real o (no D-split) and overwrites dq, dk, dv (no zeroing, no add).
func (a *LocalAttention) BackwardHalf(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq, h Heads, p kernels.Precision) {
	sh := attnShape(len(seq.Pos), seq, h)
	sh.Operands = p
	a.Backend.AttnBackwardHalf(dq, dk, dv, q, k, v, o, do, lse, sh)
}

// halfOperands returns the float32 operand buffers of one sequence for an Attention that is
// not a HalfAttention (allocated here when m.Attn changed after the buffers were sized).
func (m *Model) halfOperands(T int) (q, k, v, o, do, dq, dk, dv kernels.Buf) {
	hs, c := &m.hs, m.Cfg
	Q, KV := T*c.QDim(), T*c.KVDim()
	if hs.aq == nil {
		hs.aq, hs.ao, hs.ado, hs.adq = m.be.Alloc(Q), m.be.Alloc(Q), m.be.Alloc(Q), m.be.Alloc(Q)
		hs.ak, hs.av, hs.adk, hs.adv = m.be.Alloc(KV), m.be.Alloc(KV), m.be.Alloc(KV), m.be.Alloc(KV)
	}
	return hs.aq, hs.ak, hs.av, hs.ao, hs.ado, hs.adq, hs.adk, hs.adv
}

// attnForwardHalf is the attention of one sequence on packed operands: the Attention's
// ForwardHalf, or (a sequence-parallel schedule, which takes float32 operands) Forward on
// them widened, its output packed. The widened values are the 16-bit ones, which a 16-bit
// run's schedule packs again exactly (Operands), so its numbers are those it has always had.
func (m *Model) attnForwardHalf(o, lse, q, k, v kernels.Buf, seq Seq) {
	m.profileAttn(seq, false, func() {
		h, p := m.heads(), m.Precision
		if ha, ok := m.Attn.(HalfAttention); ok {
			ha.ForwardHalf(o, lse, q, k, v, seq, h, p)
			return
		}
		be := m.be
		aq, ak, av, ao, _, _, _, _ := m.halfOperands(len(seq.Pos))
		be.UnpackHalf(aq, q, p)
		be.UnpackHalf(ak, k, p)
		be.UnpackHalf(av, v, p)
		m.Attn.Forward(ao, lse, aq, ak, av, seq, h)
		be.PackHalf(o, ao, p)
	})
}

// attnBackwardHalf is the attention backward of one sequence on packed operands, setting
// the packed dq, dk, dv: BackwardHalf, or Backward on widened operands and zeroed float32
// gradients, packed.
func (m *Model) attnBackwardHalf(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq) {
	m.profileAttn(seq, true, func() {
		h, p := m.heads(), m.Precision
		if ha, ok := m.Attn.(HalfAttention); ok {
			ha.BackwardHalf(dq, dk, dv, q, k, v, o, lse, do, seq, h, p)
			return
		}
		be := m.be
		aq, ak, av, ao, ado, adq, adk, adv := m.halfOperands(len(seq.Pos))
		for _, x := range [][2]kernels.Buf{{aq, q}, {ak, k}, {av, v}, {ao, o}, {ado, do}} {
			be.UnpackHalf(x[0], x[1], p)
		}
		be.Zero(adq)
		be.Zero(adk)
		be.Zero(adv)
		m.Attn.Backward(adq, adk, adv, aq, ak, av, ao, lse, ado, seq, h)
		be.PackHalf(dq, adq, p)
		be.PackHalf(dk, adk, p)
		be.PackHalf(dv, adv, p)
	})
}

// profileAttn runs an attention call inside the per-op profile's bracket, with the FLOPs the
// backend counted.
func (m *Model) profileAttn(seq Seq, backward bool, run func()) {
	if !m.Ops.Active() {
		run()
		return
	}
	c := m.be.Counters()
	flops := &c.AttnFwdFLOPs
	phase := m.phase
	if backward {
		flops, phase = &c.AttnBwdFLOPs, kernels.PhaseBackward
	}
	f0 := flops.Load()
	m.Ops.Begin(kernels.OpAttention, phase)
	run()
	sh := attnShape(len(seq.Pos), seq, m.heads())
	sh.Operands = m.Precision
	m.Ops.End(halfAttnCost(sh, backward, flops.Load()-f0))
}
