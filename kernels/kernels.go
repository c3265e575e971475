// Package kernels holds the compute primitives of distflash behind one interface, Backend.
//
// The model, the optimizer and the distributed attention schedules call only Backend methods on
// Buf values, so a CUDA implementation (build tag cuda) can stand beside the pure-Go CPU one
// without any change above this package. Shapes are passed explicitly, as in the C trainers of
// GPT-2: every buffer is a flat row-major float32 array and each method documents its layout.
//
// Conventions:
//   - Activations are [tokens, width] row-major. Attention tensors are [tokens, heads, head_dim].
//   - Backward methods accumulate (+=) into their gradient outputs unless documented otherwise,
//     so a caller zeroes a gradient buffer once and lets several paths add into it.
//   - Reductions accumulate in float64 over a fixed partition of the rows, so results are
//     bit-reproducible run to run and independent of the number of threads.
//
// The attention primitive (DESIGN.md "one attention primitive"; papers/distflashattn.txt §3.1,
// papers/ring-attention-explained.txt) is a block forward that folds one block of keys/values
// into a running (o, m, l) with an online softmax, a merge of two partial results by their
// log-sum-exp, a finish that normalises, and a block backward that uses the saved log-sum-exp
// and D = rowsum(dO ∘ O). Masks come from global token positions (key j is visible to query i
// iff qPos[i] >= kPos[j], and with document masking also kPos[j] >= qStart[i], the start of
// the query's document), so contiguous, zig-zag, striped and cyclic layouts all use it.
package kernels

import "fmt"

// Buf is a contiguous array of float32 elements owned by a Backend (host memory for the CPU
// backend, device memory for an accelerator). Only the Backend that made a Buf may use it.
type Buf interface {
	// Len is the number of float32 elements.
	Len() int
}

// AttnShape describes one attention block call: nq queries against nk keys.
//
// Layouts: q, o, dq, do are [NQ, Heads, HeadDim]; k, v, dk, dv are [NK, KVHeads, HeadDim];
// m, l, lse and D are [Heads, NQ]. Query head h reads key/value head h / (Heads/KVHeads)
// (grouped-query attention; KVHeads = Heads is multi-head, KVHeads = 1 multi-query).
type AttnShape struct {
	NQ, NK  int
	Heads   int
	KVHeads int
	HeadDim int
	Causal  bool    // mask keys whose position is greater than the query's
	Scale   float32 // multiplies q·k; usually 1/sqrt(HeadDim)
	QPos    []int32 // global position of each query, len NQ (used when Causal)
	KPos    []int32 // global position of each key, len NK (used when Causal)
	// QStart, when not nil (with Causal), masks by document: the global position at which
	// each query's document starts, len NQ. Key j is then visible to query i iff
	// QStart[i] <= KPos[j] <= QPos[i]: a document is an interval of positions, so this is
	// "same document and causal", and keys need no document ids of their own.
	QStart []int32
	// Operands, when BF16 or FP16, says that the call's q, k and v (and a backward's o and do)
	// hold their values packed in that 16-bit format (PackHalf's layout: Len() is (n+1)/2 for n
	// values), as a 16-bit run's schedules keep and send them: converted once per layer, not
	// once per block, and half the bytes on the wire. The attention state, the statistics and
	// the gradients stay float32. FP32 (the zero value): every buffer is float32.
	Operands Precision
}

// OperandLen is the length of a buffer that holds n of a call's operand values: n, or (n+1)/2
// when they are packed in 16 bits (AttnShape.Operands).
func (s AttnShape) OperandLen(n int) int {
	if s.Operands == FP32 {
		return n
	}
	return (n + 1) / 2
}

// widened returns the n values of one of the call's operands, packed in s.Operands, in a
// float32 buffer of be's own: for the kernels that compute on float32 operands, on the values
// the packing rounded to. what names the operand in the panic of a wrong length.
func (s AttnShape) widened(be Backend, what string, b Buf, n int) Buf {
	if b.Len() != s.OperandLen(n) {
		panic(fmt.Sprintf("kernels: %s (packed) has %d elements, want %d", what, b.Len(), s.OperandLen(n)))
	}
	out := be.Alloc(n)
	be.UnpackHalf(out, b, s.Operands)
	return out
}

// Validate reports a shape that cannot be computed.
func (s AttnShape) Validate() error {
	switch {
	case s.NQ < 0 || s.NK < 0:
		return fmt.Errorf("kernels: attention with %d queries and %d keys", s.NQ, s.NK)
	case s.Heads <= 0 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0:
		return fmt.Errorf("kernels: attention heads %d / kv heads %d: heads must be a positive multiple of kv heads", s.Heads, s.KVHeads)
	case s.HeadDim <= 0:
		return fmt.Errorf("kernels: attention head_dim %d", s.HeadDim)
	case s.Causal && (len(s.QPos) != s.NQ || len(s.KPos) != s.NK):
		return fmt.Errorf("kernels: causal attention needs %d query and %d key positions, got %d and %d", s.NQ, s.NK, len(s.QPos), len(s.KPos))
	case s.QStart != nil && (!s.Causal || len(s.QStart) != s.NQ):
		return fmt.Errorf("kernels: document mask needs causal attention and %d query document starts, got causal=%v and %d", s.NQ, s.Causal, len(s.QStart))
	case s.Operands > FP16:
		return fmt.Errorf("kernels: attention operands in %v", s.Operands)
	}
	return nil
}

// AttnState is a partial attention result over some of the keys: O is the output so far,
// not yet divided by the softmax denominator ([NQ, Heads, HeadDim]); M is the running maximum
// of the scaled scores and L the running sum of exp(score - M) (both [Heads, NQ]).
// A fresh state has O = 0, M = -Inf, L = 0 (see Backend.AttnInit).
type AttnState struct {
	O, M, L Buf
}

// AdamWStep holds the hyper-parameters of one AdamW update (Loshchilov & Hutter, decoupled
// weight decay) at step Step (1-based, for bias correction).
type AdamWStep struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Step                               int64
	GradScale                          float32 // gradients are multiplied by this before use (clipping, loss scale)
}

// AdamWSegment is a run of the parameters of an AdamW update: the elements [Off, Off+N), with
// weight decay (Decay) or without (norm weights).
type AdamWSegment struct {
	Off, N int
	Decay  bool
}

// Backend is the compute interface. A method panics on a programming error (mismatched
// lengths): those are bugs in the caller, not conditions a user can fix.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda").
	Name() string
	// Counters are the work counters of this backend.
	Counters() *Counters

	// Alloc returns a zeroed buffer of n elements.
	Alloc(n int) Buf
	// Slice returns the view [off, off+n) of b, sharing its memory.
	Slice(b Buf, off, n int) Buf
	// Upload copies host values into dst (len(src) == dst.Len()).
	Upload(dst Buf, src []float32)
	// Download copies src into host memory (len(dst) == src.Len()).
	Download(dst []float32, src Buf)
	// Zero sets every element of b to 0.
	Zero(b Buf)
	// Copy copies src into dst (equal lengths).
	Copy(dst, src Buf)
	// Add sets dst = a + b elementwise; dst may alias a or b.
	Add(dst, a, b Buf)
	// Scale multiplies every element of b by s.
	Scale(b Buf, s float32)
	// SumSquares returns Σ b², accumulated in float64.
	SumSquares(b Buf) float64
	// AllFinite reports whether no element of b is Inf or NaN.
	AllFinite(b Buf) bool

	// MatMul computes C = op(A)·op(B) + beta·C with C [m, n], op(A) [m, k], op(B) [k, n], all
	// row-major and densely packed; op transposes when transA / transB is set (A is then
	// stored [k, m], B [n, k]).
	MatMul(c, a, b Buf, m, n, k int, transA, transB bool, beta float32)
	// SetMatMulPrecision makes later MatMul calls round both operands to p (as tensor cores
	// read bf16 / fp16 inputs) and accumulate in float32; FP32 (the default) leaves them as
	// they are. C, beta·C and the attention methods stay float32.
	SetMatMulPrecision(p Precision)
	// MatMulPrecision returns the operand precision of MatMul.
	MatMulPrecision() Precision

	// Round sets each element of b to the nearest value of p (ties to even); FP32 leaves b.
	Round(b Buf, p Precision)
	// PackHalf stores the 16-bit p encodings (p is BF16 or FP16) of src two per element of
	// dst: element 2i in the low 16 bits of dst[i], element 2i+1 in the high 16 bits (0 past
	// an odd end); dst.Len() == (src.Len()+1)/2. The words of dst are bit patterns, not
	// numbers: move them only with bit-preserving copies (Copy, the communicator).
	PackHalf(dst, src Buf, p Precision)
	// UnpackHalf is the inverse of PackHalf: it sets the dst.Len() values of dst from the
	// packed src (src.Len() == (dst.Len()+1)/2).
	UnpackHalf(dst, src Buf, p Precision)

	// Embedding sets out[t] = table[ids[t]] (table [vocab, dim], out [len(ids), dim]).
	Embedding(out, table Buf, ids []int32, dim int)
	// EmbeddingBackward adds dout[t] into dtable[ids[t]].
	EmbeddingBackward(dtable, dout Buf, ids []int32, dim int)
	// RMSNorm sets out = x / sqrt(mean(x²) + eps) * w per row and stores the reciprocal
	// root-mean-square of each row in rstd ([rows]). x, out [rows, dim], w [dim].
	RMSNorm(out, rstd, x, w Buf, rows, dim int, eps float32)
	// RMSNormBackward adds the gradients with respect to x and w into dx and dw.
	RMSNormBackward(dx, dw, dout, x, w, rstd Buf, rows, dim int)
	// AddRMSNorm is Add then RMSNorm in one pass: sum = a + b (sum may alias a or b), then
	// out, rstd = RMSNorm(sum, w), every value as the two calls make it. The residual add
	// before a block's second norm.
	AddRMSNorm(sum, out, rstd, a, b, w Buf, rows, dim int, eps float32)
	// RoPE rotates x ([len(pos), heads, headDim]) in place by the rotary embedding t of each
	// token's position, in the rotate-half convention of Hugging Face LLaMA: for i < headDim/2,
	// (x_i, x_{i+headDim/2}) turns by the angle pos·t.InvFreq[i] (computed in float64) with its
	// cosine and sine multiplied by t.Scale. With inverse set it turns by the opposite angle,
	// with the same scale: the transpose of the forward map, which is its backward (and, when
	// t.Scale is 1, its inverse). len(t.InvFreq) must be headDim/2.
	RoPE(x Buf, pos []int32, heads, headDim int, t RoPETable, inverse bool)
	// SwiGLU sets out = silu(gate) * up elementwise.
	SwiGLU(out, gate, up Buf)
	// SwiGLUBackward sets (overwrites) dgate and dup from dout.
	SwiGLUBackward(dgate, dup, dout, gate, up Buf)
	// SwiGLUBackwardAct is SwiGLU(act, gate, up) and SwiGLUBackward(dgate, dup, dout, gate,
	// up) in one pass, every value as the two calls make it: the backward of an activation
	// that was not kept, which the down projection's weight gradient then reads.
	SwiGLUBackwardAct(act, dgate, dup, dout, gate, up Buf)
	// CrossEntropy computes, per row of logits ([rows, vocab]), the loss -log softmax(row)[t]
	// into losses ([rows]) for targets t = targets[row]; a negative target marks a row that is
	// ignored (loss 0, gradient 0). When dlogits is not nil it is set (overwritten) to
	// (softmax(row) - onehot(t)) * dscale; dlogits may be the same buffer as logits.
	CrossEntropy(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32)

	// AttnInit resets s to the empty partial result (O = 0, M = -Inf, L = 0).
	AttnInit(s AttnState)
	// AttnForward folds the keys/values k, v into the partial result s of queries q.
	AttnForward(s AttnState, q, k, v Buf, shape AttnShape)
	// AttnMerge folds the partial result src into dst (both over the same queries, disjoint keys).
	AttnMerge(dst, src AttnState, nq, heads, headDim int)
	// AttnFinish writes the normalised output o = s.O / s.L and lse = s.M + log(s.L); o may be
	// s.O. A query that saw no key gets o = 0 and lse = -Inf.
	AttnFinish(o, lse Buf, s AttnState, nq, heads, headDim int)
	// AttnBackwardPrep sets D = rowsum(dO ∘ O) per head and query ([heads, nq]). With p BF16
	// or FP16, o and do hold their values packed in that format (as AttnShape.Operands) and D
	// is the rowsum of those 16-bit values, as FlashAttention and cuDNN compute it: consistent
	// with the dP = dO·Vᵀ a backward forms from the same 16-bit dO (a D from the float32 values
	// biases dQ by their difference). FP32: float32 buffers.
	AttnBackwardPrep(d, o, do Buf, nq, heads, headDim int, p Precision)
	// AttnBackward adds the gradients of one block of keys into dq, dk, dv, given the queries'
	// final lse and D (FlashAttention-2 backward: P is recomputed, nothing N×N is stored). o,
	// when not nil, is the queries' final output O, from which D was computed: a backend whose
	// kernel takes O rather than D (cuDNN's fused attention computes D itself) uses it. It is
	// nil where the queries are another rank's and only D travelled with them; the result is
	// the same either way to within the 16-bit rounding of O.
	AttnBackward(dq, dk, dv, q, k, v, o, do, lse, d Buf, shape AttnShape)

	// AdamW updates parameters p in place from gradients g and moments m, v. When decay is
	// false the weight decay is not applied (norm weights).
	AdamW(p, g, m, v Buf, hp AdamWStep, decay bool)
	// AdamWSegments is AdamW on each segment of p, g, m and v (in increasing order, disjoint;
	// elements outside every segment are left), every value as AdamW on the segment's slices
	// makes it: one call, on a GPU one launch, for the many tensors of a model.
	AdamWSegments(p, g, m, v Buf, segs []AdamWSegment, hp AdamWStep)

	// The 16-bit step (half_step.go): the methods a bf16 or fp16 training step is made of.
	// "Packed in p" is PackHalf's layout (two 16-bit values of p a buffer element, Len()
	// (n+1)/2 for n values), which on a GPU is a plain array of bf16 or fp16 values. Each
	// method reads its 16-bit inputs exactly, computes in float32 (float64 where the float32
	// method does), and rounds to p once, at each 16-bit output.

	// MatMulHalf is MatMul with A and B packed in p: C = op(A)·op(B) + beta·C from the exact
	// 16-bit values, accumulated in float32. C is float32 (cHalf false: a weight gradient, or
	// the residual stream with beta 1) or packed in p (cHalf true: beta·C reads its 16-bit
	// values and the sum is rounded once).
	MatMulHalf(c, a, b Buf, m, n, k int, transA, transB bool, beta float32, p Precision, cHalf bool)
	// EmbeddingHalf is Embedding from a table packed in p into float32 out.
	EmbeddingHalf(out, table Buf, ids []int32, dim int, p Precision)
	// RMSNormHalf is RMSNorm of the float32 rows x with weights w packed in p, writing out
	// packed in p. keep, when not nil, receives x packed in p in the same pass (the copy of a
	// block's input that a checkpoint keeps).
	RMSNormHalf(out, keep, rstd, x, w Buf, rows, dim int, eps float32, p Precision)
	// RMSNormBackwardHalf is RMSNormBackward in one pass over the rows with dout, x and w
	// packed in p: it adds the input gradient into the float32 dx and, when dxHalf is not nil,
	// writes the sum packed in p into dxHalf (the operand of the next GEMMs); it sets
	// (dwBeta 0) or adds (dwBeta 1) the weight gradient into the float32 dw.
	RMSNormBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd Buf, rows, dim int, dwBeta float32, p Precision)
	// RoPEQKV splits the fused projection qkv ([n, Q+2·KV] rows q | k | v, Q = heads·headDim,
	// KV = kvHeads·headDim, n = len(pos), packed in p) into q [n, Q] and k [n, KV], each rotated
	// as RoPE does (forward), and v [n, KV] copied, all packed in p.
	RoPEQKV(q, k, v, qkv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision)
	// RoPEQKVBackward is RoPEQKV's backward: it sets dqkv ([n, Q+2·KV]) to the rows
	// RoPE⁻¹(dq) | RoPE⁻¹(dk) | dv, all packed in p.
	RoPEQKVBackward(dqkv, dq, dk, dv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision)
	// SwiGLUHalf sets act ([rows, ffn]) = silu(gate)∘up from the fused gu ([rows, 2·ffn], rows
	// gate | up), both packed in p.
	SwiGLUHalf(act, gu Buf, rows, ffn int, p Precision)
	// SwiGLUBackwardHalf sets dgu ([rows, 2·ffn], rows dgate | dup) from dact ([rows, ffn])
	// and gu, all packed in p; act, when not nil, receives silu(gate)∘up as SwiGLUHalf makes it
	// (the activation the down projection's weight gradient reads, not kept by the forward).
	SwiGLUBackwardHalf(dgu, act, dact, gu Buf, rows, ffn int, p Precision)
	// CrossEntropyHalf is CrossEntropy of float32 logits whose gradient dlogits (not nil, its
	// own buffer) is written packed in p.
	CrossEntropyHalf(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32, p Precision)
	// AttnForwardHalf is the attention of queries over every key they see, in one call: q, k
	// and v packed in sh.Operands (BF16 or FP16), the normalised output o written packed in
	// sh.Operands and lse in float32, every value as AttnInit, AttnForward, AttnFinish and
	// PackHalf make it. One rank's whole attention, with no state kept between calls.
	AttnForwardHalf(o, lse, q, k, v Buf, sh AttnShape)
	// AttnBackwardHalf is AttnForwardHalf's backward: from q, k, v, o and do packed in
	// sh.Operands and the forward's lse, it sets (overwrites) dq, dk and dv, packed in
	// sh.Operands, as AttnBackwardPrep, AttnBackward on zeroed float32 gradients and PackHalf
	// make them.
	AttnBackwardHalf(dq, dk, dv, q, k, v, o, do, lse Buf, sh AttnShape)
	// GradStats writes into dst (3 elements) Σ g² accumulated in float64 as two float32 (hi,
	// then lo = the rest) and 1 when some element of g is Inf or NaN (else 0): SumSquares and
	// AllFinite in one pass, on the device, for the step's statistics to travel without a
	// download of their own.
	GradStats(dst, g Buf)
	// AdamWSegmentsHalf is AdamWSegments that also writes every updated parameter of the
	// segments, rounded to prec, into half (packed in prec, laid out like p): the optimizer
	// and the refresh of the 16-bit compute copy in one pass.
	AdamWSegmentsHalf(p, g, m, v, half Buf, segs []AdamWSegment, hp AdamWStep, prec Precision)
}
