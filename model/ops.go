package model

import "distflash/kernels"

// The model's backend calls with the per-op profile's brackets (kernels.OpProfile, Model.Ops):
// each opens an op of its class in the model's current phase, makes the call and closes the op
// with the call's cost. The model knows what the backend does not: which projection a GEMM is,
// and whether a forward computation is the forward or the backward's recomputation. Without a
// profile (Ops nil, or outside a profiled step) they are the calls alone.

// setPhase sets the phase the next ops are recorded in and returns the previous one.
func (m *Model) setPhase(p kernels.Phase) kernels.Phase {
	old := m.phase
	m.phase = p
	return old
}

// linear computes y = x·Wᵀ for x [n, in], W [out, in]: the projection role.
func (m *Model) linear(role kernels.OpClass, y, x, w kernels.Buf, n, out, in int) {
	m.Ops.Begin(role, m.phase)
	m.be.MatMul(y, x, w, n, out, in, false, true, 0)
	m.Ops.End(kernels.MatMulCost(n, out, in, 0))
}

// linearBackward sets (dwBeta 0) or adds (dwBeta 1) dW = dyᵀ·x and sets (beta 0) or adds
// (beta 1) dx = dy·W.
func (m *Model) linearBackward(role kernels.OpClass, dx, dw, dy, x, w kernels.Buf, n, out, in int, beta, dwBeta float32) {
	m.gradW(role, dw, dy, x, n, out, in, dwBeta)
	m.gradX(role, dx, dy, w, n, out, in, beta)
}

// gradW sets (beta 0: the first contribution of a FreshGrads step) or adds (beta 1) the
// weight gradient of the projection role y = x·Wᵀ: dW = dyᵀ·x.
func (m *Model) gradW(role kernels.OpClass, dw, dy, x kernels.Buf, n, out, in int, beta float32) {
	m.Ops.Begin(role, kernels.PhaseBackward)
	m.be.MatMul(dw, dy, x, out, in, n, true, false, beta)
	m.Ops.End(kernels.MatMulCost(out, in, n, beta))
}

// gradBeta is the beta of a contribution to a weight gradient: 0 for the first contribution
// (first) of a FreshGrads step, which overwrites what the buffer held, else 1.
func (m *Model) gradBeta(first bool) float32 {
	if m.fresh && first {
		return 0
	}
	return 1
}

// freshNorm clears a norm weight's gradient before the float32 path's RMSNormBackward adds
// into it, in a FreshGrads step (the 16-bit step's norm backward sets it instead).
func (m *Model) freshNorm(dw kernels.Buf) {
	if m.fresh {
		m.zero(dw)
	}
}

// gradX sets (beta 0) or adds (beta 1) the input gradient of the projection role: dx = dy·W.
func (m *Model) gradX(role kernels.OpClass, dx, dy, w kernels.Buf, n, out, in int, beta float32) {
	m.Ops.Begin(role, kernels.PhaseBackward)
	m.be.MatMul(dx, dy, w, n, in, out, false, false, beta)
	m.Ops.End(kernels.MatMulCost(n, in, out, beta))
}

// norm is RMSNorm over rows rows of the model's width.
func (m *Model) norm(out, rstd, x, w kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpRMSNorm, m.phase)
	m.be.RMSNorm(out, rstd, x, w, rows, m.Cfg.Dim, float32(m.Cfg.NormEps))
	m.Ops.End(kernels.RMSNormCost(rows, m.Cfg.Dim))
}

// addNorm sets sum = a + b (the residual add) and out = rmsnorm(sum)∘w in one call.
func (m *Model) addNorm(sum, out, rstd, a, b, w kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpAddRMSNorm, m.phase)
	m.be.AddRMSNorm(sum, out, rstd, a, b, w, rows, m.Cfg.Dim, float32(m.Cfg.NormEps))
	m.Ops.End(kernels.AddRMSNormCost(rows, m.Cfg.Dim))
}

// normBackward is RMSNormBackward over rows rows of the model's width.
func (m *Model) normBackward(dx, dw, dout, x, w, rstd kernels.Buf, rows int) {
	m.Ops.Begin(kernels.OpRMSNorm, kernels.PhaseBackward)
	m.be.RMSNormBackward(dx, dw, dout, x, w, rstd, rows, m.Cfg.Dim)
	m.Ops.End(kernels.RMSNormBackwardCost(rows, m.Cfg.Dim))
}

// rotate turns the heads of x (one sequence's tokens at positions pos) by the rotary embedding.
func (m *Model) rotate(x kernels.Buf, pos []int32, heads int, inverse bool) {
	m.Ops.Begin(kernels.OpRoPE, m.phase)
	m.be.RoPE(x, pos, heads, m.Cfg.HeadDim, m.rope, inverse)
	m.Ops.End(kernels.RoPECost(len(pos), heads, m.Cfg.HeadDim))
}

// swiglu sets act = silu(gate)∘up.
func (m *Model) swiglu(act, gate, up kernels.Buf) {
	m.Ops.Begin(kernels.OpSwiGLU, m.phase)
	m.be.SwiGLU(act, gate, up)
	m.Ops.End(kernels.SwiGLUCost(act.Len()))
}

// swigluBackward sets dgate and dup from dact.
func (m *Model) swigluBackward(dgate, dup, dact, gate, up kernels.Buf) {
	m.Ops.Begin(kernels.OpSwiGLU, kernels.PhaseBackward)
	m.be.SwiGLUBackward(dgate, dup, dact, gate, up)
	m.Ops.End(kernels.SwiGLUBackwardCost(dact.Len()))
}

// swigluBackwardAct sets dgate and dup from dact and act = silu(gate)∘up, which the backward
// then needs for the down projection's weight gradient: the recomputation's SwiGLU in the
// backward's kernel.
func (m *Model) swigluBackwardAct(act, dgate, dup, dact, gate, up kernels.Buf) {
	m.Ops.Begin(kernels.OpSwiGLU, kernels.PhaseBackward)
	m.be.SwiGLUBackwardAct(act, dgate, dup, dact, gate, up)
	m.Ops.End(kernels.SwiGLUBackwardActCost(dact.Len()))
}

// residual sets dst = a + b.
func (m *Model) residual(dst, a, b kernels.Buf) {
	m.Ops.Begin(kernels.OpResidual, m.phase)
	m.be.Add(dst, a, b)
	m.Ops.End(kernels.AddCost(dst.Len()))
}

// zero clears a gradient buffer.
func (m *Model) zero(b kernels.Buf) {
	m.Ops.Begin(kernels.OpZero, m.phase)
	m.be.Zero(b)
	m.Ops.End(kernels.ZeroCost(b.Len()))
}

// pack keeps x in 16 bits (keptPrecision) in dst; unpack widens it back.
func (m *Model) pack(dst, x kernels.Buf) {
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.PackHalf(dst, x, m.keptPrecision())
	m.Ops.End(kernels.HalfCost(x.Len()))
}

func (m *Model) unpack(dst, x kernels.Buf) {
	m.Ops.Begin(kernels.OpCast, m.phase)
	m.be.UnpackHalf(dst, x, m.keptPrecision())
	m.Ops.End(kernels.HalfCost(dst.Len()))
}

// attnForward is the attention of one sequence (the schedule's, on several ranks); its FLOPs
// are those the backend counts.
func (m *Model) attnForward(o, lse, q, k, v kernels.Buf, seq Seq) {
	if !m.Ops.Active() {
		m.Attn.Forward(o, lse, q, k, v, seq, m.heads())
		return
	}
	c := m.be.Counters()
	f0 := c.AttnFwdFLOPs.Load()
	m.Ops.Begin(kernels.OpAttention, m.phase)
	m.Attn.Forward(o, lse, q, k, v, seq, m.heads())
	m.Ops.End(kernels.AttnCost(attnShape(len(seq.Pos), seq, m.heads()), false, c.AttnFwdFLOPs.Load()-f0))
}

// attnBackward is the attention backward of one sequence.
func (m *Model) attnBackward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq Seq) {
	if !m.Ops.Active() {
		m.Attn.Backward(dq, dk, dv, q, k, v, o, lse, do, seq, m.heads())
		return
	}
	c := m.be.Counters()
	f0 := c.AttnBwdFLOPs.Load()
	m.Ops.Begin(kernels.OpAttention, kernels.PhaseBackward)
	m.Attn.Backward(dq, dk, dv, q, k, v, o, lse, do, seq, m.heads())
	m.Ops.End(kernels.AttnCost(attnShape(len(seq.Pos), seq, m.heads()), true, c.AttnBwdFLOPs.Load()-f0))
}

// storeClass is the class of what the parameter store does when it lends a unit: a widening of
// the 16-bit copy (CastStore), or gathering and scattering between ranks (FSDP).
func (m *Model) storeClass() kernels.OpClass {
	if _, ok := m.Store.(*CastStore); ok {
		return kernels.OpCast
	}
	return kernels.OpComm
}
