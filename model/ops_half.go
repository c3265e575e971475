package model

import "distflash/kernels"

// The 16-bit step's backend calls with the per-op profile's brackets, as ops.go's for the
// float32 path. The fused projections are recorded under the op classes of their first part:
// q‖k‖v as gemm.q, gate‖up as gemm.gate (the classes name the float32 path's separate GEMMs).
// Their costs count the bytes as the 16-bit buffers hold them: 2 a packed value, 4 a float32.

// matHalf is MatMulHalf in the step's precision, recorded in the current phase: C =
// op(A)·op(B) + beta·C with A and B packed, C packed (cHalf) or float32.
func (m *Model) matHalf(role kernels.OpClass, c, a, b kernels.Buf, M, N, K int, transA, transB bool, beta float32, cHalf bool) {
	m.matHalfIn(m.phase, role, c, a, b, M, N, K, transA, transB, beta, cHalf)
}

// gradHalf is matHalf recorded in the backward: an input or weight gradient's GEMM (the
// head's run in the forward, a loss chunk at a time).
func (m *Model) gradHalf(role kernels.OpClass, c, a, b kernels.Buf, M, N, K int, transA, transB bool, beta float32, cHalf bool) {
	m.matHalfIn(kernels.PhaseBackward, role, c, a, b, M, N, K, transA, transB, beta, cHalf)
}

func (m *Model) matHalfIn(phase kernels.Phase, role kernels.OpClass, c, a, b kernels.Buf, M, N, K int, transA, transB bool, beta float32, cHalf bool) {
	m.Ops.Begin(role, phase)
	m.be.MatMulHalf(c, a, b, M, N, K, transA, transB, beta, m.Precision, cHalf)
	m.Ops.End(halfMatMulCost(M, N, K, beta, cHalf))
}

// normHalf is RMSNormHalf over rows rows of the model's width: out packed, keep (when not nil)
// the float32 input packed.
func (m *Model) normHalf(out, keep, rstd, x, w kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpRMSNorm, m.phase)
	m.be.RMSNormHalf(out, keep, rstd, x, w, rows, m.Cfg.Dim, float32(m.Cfg.NormEps), m.Precision)
	m.Ops.End(halfRMSNormCost(rows, m.Cfg.Dim, keep != nil))
}

// normBackwardHalf is RMSNormBackwardHalf over rows rows of the model's width.
func (m *Model) normBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd kernels.Buf, rows int, dwBeta float32) {
	m.Ops.Begin(kernels.OpRMSNorm, kernels.PhaseBackward)
	m.be.RMSNormBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd, rows, m.Cfg.Dim, dwBeta, m.Precision)
	m.Ops.End(halfRMSNormBackwardCost(rows, m.Cfg.Dim, dxHalf != nil))
}

// ropeQKV splits one sequence's fused projection into q, k (rotated) and v.
func (m *Model) ropeQKV(q, k, v, qkv kernels.Buf, pos []int32) {
	c := m.Cfg
	m.Ops.Begin(kernels.OpRoPE, m.phase)
	m.be.RoPEQKV(q, k, v, qkv, pos, c.NHeads, c.NKVHeads, c.HeadDim, m.rope, m.Precision)
	m.Ops.End(halfRoPEQKVCost(len(pos), c.QDim(), c.KVDim()))
}

// ropeQKVBackward sets one sequence's dqkv from dq, dk (turned back) and dv.
func (m *Model) ropeQKVBackward(dqkv, dq, dk, dv kernels.Buf, pos []int32) {
	c := m.Cfg
	m.Ops.Begin(kernels.OpRoPE, kernels.PhaseBackward)
	m.be.RoPEQKVBackward(dqkv, dq, dk, dv, pos, c.NHeads, c.NKVHeads, c.HeadDim, m.rope, m.Precision)
	m.Ops.End(halfRoPEQKVCost(len(pos), c.QDim(), c.KVDim()))
}

// swigluHalf sets act = silu(gate)∘up from gu's rows gate | up.
func (m *Model) swigluHalf(act, gu kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpSwiGLU, m.phase)
	m.be.SwiGLUHalf(act, gu, rows, m.Cfg.FFNDim, m.Precision)
	m.Ops.End(halfSwiGLUCost(rows * m.Cfg.FFNDim))
}

// swigluBackwardHalf sets dgu from dact, and act when not nil.
func (m *Model) swigluBackwardHalf(dgu, act, dact, gu kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpSwiGLU, kernels.PhaseBackward)
	m.be.SwiGLUBackwardHalf(dgu, act, dact, gu, rows, m.Cfg.FFNDim, m.Precision)
	m.Ops.End(halfSwiGLUBackwardCost(rows*m.Cfg.FFNDim, act != nil))
}

// roundStream rounds the float32 residual stream to the step's precision in place: the next
// block's input (see half.go).
func (m *Model) roundStream(r kernels.Buf) {
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.Round(r, m.Precision)
	m.Ops.End(kernels.OpCost{Bytes: 8 * int64(r.Len()), FLOPs: int64(r.Len())})
}

// The costs of the 16-bit methods (kernels' cost formulas with 2 bytes a packed value).

// halfMatMulCost is MatMulHalf's: A and B packed, C float32 or packed (read too when beta is
// not 0); 2mnk FLOPs.
func halfMatMulCost(m, n, k int, beta float32, cHalf bool) kernels.OpCost {
	mn := int64(m) * int64(n)
	cb := int64(4)
	if cHalf {
		cb = 2
	}
	c := 2*(int64(m)*int64(k)+int64(k)*int64(n)) + cb*mn
	if beta != 0 {
		c += cb * mn
	}
	return kernels.OpCost{Bytes: c, FLOPs: 2 * mn * int64(k)}
}

// halfRMSNormCost is RMSNormHalf's: x float32 in, out packed (and keep), w packed, rstd.
func halfRMSNormCost(rows, dim int, keep bool) kernels.OpCost {
	e := int64(rows) * int64(dim)
	b := 4*e + 2*e + 2*int64(dim) + 4*int64(rows)
	if keep {
		b += 2 * e
	}
	return kernels.OpCost{Bytes: b, FLOPs: 4 * e}
}

// halfRMSNormBackwardCost is RMSNormBackwardHalf's: dout and x packed in, dx float32
// accumulated (and its packed copy written), dw, w and rstd; 10 FLOPs an element.
func halfRMSNormBackwardCost(rows, dim int, dxHalf bool) kernels.OpCost {
	e := int64(rows) * int64(dim)
	b := 2*e + 2*e + 8*e + 8*int64(dim) + 2*int64(dim) + 4*int64(rows)
	if dxHalf {
		b += 2 * e
	}
	return kernels.OpCost{Bytes: b, FLOPs: 10 * e}
}

// halfRoPEQKVCost is RoPEQKV's (or its backward's) on tokens rows of q | k | v: every value
// read and written once, packed, and the positions; 3 FLOPs a turned value.
func halfRoPEQKVCost(tokens, q, kv int) kernels.OpCost {
	e := int64(tokens) * int64(q+2*kv)
	return kernels.OpCost{Bytes: 2*2*e + 4*int64(tokens), FLOPs: 3 * int64(tokens) * int64(q+kv)}
}

// halfSwiGLUCost is SwiGLUHalf's on n activations: gate and up in, act out, packed.
func halfSwiGLUCost(n int) kernels.OpCost {
	return kernels.OpCost{Bytes: 6 * int64(n), FLOPs: 5 * int64(n)}
}

// halfSwiGLUBackwardCost is SwiGLUBackwardHalf's: dact, gate and up in, dgate and dup (and
// act) out, packed.
func halfSwiGLUBackwardCost(n int, act bool) kernels.OpCost {
	if act {
		return kernels.OpCost{Bytes: 12 * int64(n), FLOPs: 12 * int64(n)}
	}
	return kernels.OpCost{Bytes: 10 * int64(n), FLOPs: 10 * int64(n)}
}

// halfEmbeddingCost is EmbeddingHalf's: packed rows of the table in, float32 rows out, the ids.
func halfEmbeddingCost(tokens, dim int) kernels.OpCost {
	e := int64(tokens) * int64(dim)
	return kernels.OpCost{Bytes: 2*e + 4*e + 4*int64(tokens)}
}

// halfCrossEntropyCost is CrossEntropyHalf's: CrossEntropy's with dlogits written packed.
func halfCrossEntropyCost(rows, vocab int) kernels.OpCost {
	c := kernels.CrossEntropyCost(rows, vocab, true)
	c.Bytes -= 2 * int64(rows) * int64(vocab)
	return c
}

// halfAttnCost is AttnCost with q, k, v, o (and do, dq, dk, dv) at 2 bytes: the FLOPs the
// backend counted, the bytes of the packed operands and the float32 statistics.
func halfAttnCost(s kernels.AttnShape, backward bool, flops int64) kernels.OpCost {
	q, kv, st := int64(s.NQ)*int64(s.Heads*s.HeadDim), int64(s.NK)*int64(s.KVHeads*s.HeadDim), int64(s.NQ)*int64(s.Heads)
	if backward { // q, k, v, o, do in; lse; dq, dk, dv out
		return kernels.OpCost{Bytes: 2*(3*q+2*kv) + 4*st + 2*(q+2*kv), FLOPs: flops}
	}
	return kernels.OpCost{Bytes: 2*(2*q+2*kv) + 4*st, FLOPs: flops}
}
