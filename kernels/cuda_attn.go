//go:build cuda

package kernels

// The attention primitive on the GPU (kernels/cuda/attn_mma.cu and attn_f32.cu). The host
// plans each call (planAttn), uploads the positions and the causal tile bounds (with a
// document mask also the queries' document starts and their tile bounds) in one copy,
// converts the operands to 16 bits for the tensor-core path, and launches: one kernel for the
// block forward, two for the block backward (dQ by query blocks; dK, dV by key blocks, on tensor
// cores split further when the key blocks alone do not fill the GPU, planDKDV, and then a third
// kernel adds the split's partials).
//
// Counters: the forward counts 4·hd FLOPs per (query, key) pair of the tiles its kernel
// computes (64×64 tiles on tensor cores, 64×32 on CUDA cores; tiles that the causal or the
// document mask hides are skipped and not counted), the backward 10·hd per pair of its dQ
// kernel's 64×32 tiles. The
// two-kernel backward recomputes S and dP in both kernels, so it executes 14·hd per pair; the
// counters keep the algorithm's 10·hd so that they compare with the CPU's and the papers'.

import (
	"fmt"
	"runtime"
)

// negInfBits is the float32 bit pattern of −Inf.
const negInfBits = 0xff800000

// AttnInit implements Backend.
func (c *CUDA) AttnInit(s AttnState) {
	c.Zero(s.O)
	c.Zero(s.L)
	m := dbuf(s.M)
	c.memset32(m.ptr(), negInfBits, m.n)
	runtime.KeepAlive(m)
}

// toHalf converts b into the 16-bit scratch slot i and returns its address (c.mu held).
func (c *CUDA) toHalf(i int, b Buf, fp16 bool) devPtr {
	d := dbuf(b)
	p := c.grow(&c.halves[i], 2*d.n)
	c.launch("df_to_half", ewGrid(d.n), 1, ewThreads, 0, p, d, int64(d.n), boolInt(fp16))
	return p
}

// operand returns the 16-bit address of one of a call's operands (c.mu held): a float32
// buffer converted into slot i (toHalf); a packed one (AttnShape.Operands) as it is, or copied
// into slot i when it does not start on a 16-byte boundary (the kernels' vector loads and
// cuDNN's tensors need it). A packed operand of the other 16-bit format than the backend
// computes in is a caller's bug.
func (c *CUDA) operand(i int, b Buf, sh AttnShape, fp16 bool) devPtr {
	if sh.Operands == FP32 {
		return c.toHalf(i, b, fp16)
	}
	if (sh.Operands == FP16) != fp16 {
		want := BF16
		if fp16 {
			want = FP16
		}
		panic(fmt.Sprintf("kernels: cuda attention operands packed in %v, the backend computes in %v", sh.Operands, want))
	}
	d := dbuf(b)
	if p := d.ptr(); p%16 == 0 {
		return p
	}
	p := c.grow(&c.halves[i], 4*d.n)
	must(c.dev.DtoD(p, d.ptr(), 4*d.n))
	return p
}

// attnPlan checks an attention call's shape and buffer lengths (as the CPU backend does) and
// returns the plan of its kernels at operand precision prec.
func (c *CUDA) attnPlan(sh AttnShape, prec cudaPrec) attnPlan {
	if err := sh.Validate(); err != nil {
		panic(err)
	}
	p := planAttn(sh.HeadDim, prec)
	if need := max(p.smemFwd, p.smemDQ, p.smemDKDV); need > c.info.smemOptin {
		panic(fmt.Sprintf("kernels: cuda attention with head_dim %d needs %d bytes of shared memory per block, device %s allows %d",
			sh.HeadDim, need, c.Device(), c.info.smemOptin))
	}
	return p
}

// AttnForward implements Backend.
func (c *CUDA) AttnForward(st AttnState, qb, kb, vb Buf, sh AttnShape) {
	c.attnForward(st, qb, kb, vb, sh, c.precision(), true)
}

// attnForward is AttnForward with the products' precision prec (the backend's, or the 16-bit
// operands' of AttnForwardHalf); viaCUDNN false runs the own kernels without asking cuDNN.
func (c *CUDA) attnForward(st AttnState, qb, kb, vb Buf, sh AttnShape, prec cudaPrec, viaCUDNN bool) {
	p := c.attnPlan(sh, prec)
	H, hd := sh.Heads, sh.HeadDim
	qs, ks := H*hd, sh.KVHeads*hd
	ol := sh.OperandLen
	q, k, v := dptr("attn q", qb, ol(sh.NQ*qs)), dptr("attn k", kb, ol(sh.NK*ks)), dptr("attn v", vb, ol(sh.NK*ks))
	o, m, l := dptr("attn o", st.O, sh.NQ*qs), dptr("attn m", st.M, H*sh.NQ), dptr("attn l", st.L, H*sh.NQ)
	pairs := visiblePairs(sh, attnT64, p.fwdBK)
	if pairs == 0 || sh.NQ == 0 {
		c.counters.AttnSkipped.Add(1)
		return
	}
	c.counters.AttnBlocks.Add(1)
	c.counters.AttnFwdFLOPs.Add(4 * pairs * int64(hd*H))
	if viaCUDNN && c.cudnnForward(st, qb, kb, vb, sh, prec) {
		return
	}
	if !p.mma && sh.Operands != FP32 { // the float32 kernel (a head dimension the 16-bit one has not): the values, widened
		qb, kb, vb = sh.widened(c, "attn q", qb, sh.NQ*qs), sh.widened(c, "attn k", kb, sh.NK*ks), sh.widened(c, "attn v", vb, sh.NK*ks)
		q, k, v = dbuf(qb), dbuf(kb), dbuf(vb)
		sh.Operands = FP32
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	ai := packAttnInts(sh)
	ip := c.uploadInts(ai.data)
	at, doc := attnArgs(ip, sh)
	causal := boolInt(sh.Causal)
	gx := ceilDiv(sh.NQ, attnT64)
	if !p.mma {
		c.launch("df_attn_fwd_f32", gx, H, p.threads, p.smemFwd, q, k, v, o, m, l,
			at(ai.qpos), at(ai.kpos), at(ai.q64max), at(ai.k32min), doc(ai.qstart), doc(ai.qs64min), doc(ai.k32max),
			int32(sh.NQ), int32(sh.NK), int32(H), int32(sh.KVHeads), int32(hd), sh.Scale, causal)
		return
	}
	hq, hk, hv := c.operand(0, qb, sh, p.halfIsFP16), c.operand(1, kb, sh, p.halfIsFP16), c.operand(2, vb, sh, p.halfIsFP16)
	c.launch("df_attn_fwd_"+p.suffix, gx, H, p.threads, p.smemFwd, hq, hk, hv, o, m, l,
		at(ai.qpos), at(ai.kpos), at(ai.q64min), at(ai.q64max), at(ai.k64min), at(ai.k64max),
		doc(ai.qstart), doc(ai.qs64min), doc(ai.qs64max),
		int32(sh.NQ), int32(sh.NK), int32(H), int32(sh.KVHeads), sh.Scale, causal)
}

// AttnMerge implements Backend.
func (c *CUDA) AttnMerge(dst, src AttnState, nq, heads, headDim int) {
	n := nq * heads * headDim
	o1, o2 := dptr("merge o", dst.O, n), dptr("merge o", src.O, n)
	m1, m2 := dptr("merge m", dst.M, heads*nq), dptr("merge m", src.M, heads*nq)
	l1, l2 := dptr("merge l", dst.L, heads*nq), dptr("merge l", src.L, heads*nq)
	c.launch("df_attn_merge", warpRowGrid(nq*heads), 1, ewThreads, 0, o1, m1, l1, o2, m2, l2,
		int32(nq), int32(heads), int32(headDim))
}

// AttnFinish implements Backend.
func (c *CUDA) AttnFinish(ob, lseb Buf, s AttnState, nq, heads, headDim int) {
	n := nq * heads * headDim
	o, so := dptr("finish o", ob, n), dptr("finish state o", s.O, n)
	lse, m, l := dptr("finish lse", lseb, heads*nq), dptr("finish m", s.M, heads*nq), dptr("finish l", s.L, heads*nq)
	c.launch("df_attn_finish", warpRowGrid(nq*heads), 1, ewThreads, 0, o, lse, so, m, l,
		int32(nq), int32(heads), int32(headDim))
}

// AttnBackwardPrep implements Backend.
func (c *CUDA) AttnBackwardPrep(db, ob, dob Buf, nq, heads, headDim int, p Precision) {
	n := nq * heads * headDim
	if p != FP32 {
		n16 := AttnShape{Operands: p}.OperandLen(n)
		d, o, do := dptr("prep D", db, heads*nq), dptr("prep o", ob, n16), dptr("prep do", dob, n16)
		c.launch("df_attn_prep16", warpRowGrid(nq*heads), 1, ewThreads, 0, d, o, do,
			int32(nq), int32(heads), int32(headDim), boolInt(p == FP16))
		return
	}
	d, o, do := dptr("prep D", db, heads*nq), dptr("prep o", ob, n), dptr("prep do", dob, n)
	c.launch("df_attn_prep", warpRowGrid(nq*heads), 1, ewThreads, 0, d, o, do,
		int32(nq), int32(heads), int32(headDim))
}

// AttnBackward implements Backend.
func (c *CUDA) AttnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db Buf, sh AttnShape) {
	c.attnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db, sh, c.precision(), true)
}

// attnBackward is AttnBackward with the products' precision prec; viaCUDNN false runs the own
// kernels without asking cuDNN.
func (c *CUDA) attnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db Buf, sh AttnShape, prec cudaPrec, viaCUDNN bool) {
	p := c.attnPlan(sh, prec)
	H, hd := sh.Heads, sh.HeadDim
	qs, ks := H*hd, sh.KVHeads*hd
	ol := sh.OperandLen
	q, dq, do := dptr("attn bwd q", qb, ol(sh.NQ*qs)), dptr("attn bwd dq", dqb, sh.NQ*qs), dptr("attn bwd do", dob, ol(sh.NQ*qs))
	k, dk := dptr("attn bwd k", kb, ol(sh.NK*ks)), dptr("attn bwd dk", dkb, sh.NK*ks)
	v, dv := dptr("attn bwd v", vb, ol(sh.NK*ks)), dptr("attn bwd dv", dvb, sh.NK*ks)
	lse, d := dptr("attn bwd lse", lseb, H*sh.NQ), dptr("attn bwd D", db, H*sh.NQ)
	pairs := visiblePairs(sh, attnT64, attnT32)
	if pairs == 0 || sh.NQ == 0 {
		return
	}
	c.counters.AttnBackwards.Add(1)
	c.counters.AttnBwdFLOPs.Add(10 * pairs * int64(hd*H))
	if ob != nil {
		dptr("attn bwd o", ob, ol(sh.NQ*qs))
	}
	if viaCUDNN && c.cudnnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db, sh, prec) {
		return
	}
	if !p.mma && sh.Operands != FP32 {
		qb, kb, vb = sh.widened(c, "attn bwd q", qb, sh.NQ*qs), sh.widened(c, "attn bwd k", kb, sh.NK*ks), sh.widened(c, "attn bwd v", vb, sh.NK*ks)
		dob = sh.widened(c, "attn bwd do", dob, sh.NQ*qs)
		q, k, v, do = dbuf(qb), dbuf(kb), dbuf(vb), dbuf(dob)
		sh.Operands = FP32
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	ai := packAttnInts(sh)
	ip := c.uploadInts(ai.data)
	at, doc := attnArgs(ip, sh)
	causal := boolInt(sh.Causal)
	nq, nk, kvh := int32(sh.NQ), int32(sh.NK), int32(sh.KVHeads)
	if !p.mma {
		c.launch("df_attn_bwd_dq_f32", ceilDiv(sh.NQ, attnT64), H, p.threads, p.smemDQ,
			q, k, v, do, lse, d, dq, at(ai.qpos), at(ai.kpos), at(ai.q64max), at(ai.k32min),
			doc(ai.qstart), doc(ai.qs64min), doc(ai.k32max),
			nq, nk, int32(H), kvh, int32(hd), sh.Scale, causal)
		c.launch("df_attn_bwd_dkdv_f32", ceilDiv(sh.NK, attnT64), sh.KVHeads, p.threads, p.smemDKDV,
			q, k, v, do, lse, d, dk, dv, at(ai.qpos), at(ai.kpos), at(ai.q32max), at(ai.k64min),
			doc(ai.qstart), doc(ai.qs32min), doc(ai.k64max),
			nq, nk, int32(H), kvh, int32(hd), sh.Scale, causal)
		return
	}
	f16 := p.halfIsFP16
	hq, hk, hv, hdo := c.operand(0, qb, sh, f16), c.operand(1, kb, sh, f16), c.operand(2, vb, sh, f16), c.operand(3, dob, sh, f16)
	c.launch("df_attn_bwd_dq_"+p.suffix, ceilDiv(sh.NQ, attnT64), H, p.threads, p.smemDQ,
		hq, hk, hv, hdo, lse, d, dq, at(ai.qpos), at(ai.kpos), at(ai.q64min), at(ai.q64max), at(ai.k32min), at(ai.k32max),
		doc(ai.qstart), doc(ai.qs64min), doc(ai.qs64max),
		nq, nk, int32(H), kvh, sh.Scale, causal)
	g := planDKDV(sh.NQ, sh.NK, H, sh.KVHeads, hd, c.info.sms, c.info.smemOptin, c.dkdvSplit)
	var part devPtr
	if g.split > 1 {
		part = c.grow(&c.dkdvPart, 4*g.partFloats(sh.NK, sh.KVHeads, hd))
	}
	c.launch("df_attn_bwd_dkdv_"+p.suffix, g.blocks, 1, p.threads, p.smemDKDV,
		hq, hk, hv, hdo, lse, d, dk, dv, at(ai.qpos), at(ai.kpos), at(ai.q32min), at(ai.q32max), at(ai.k64min), at(ai.k64max),
		doc(ai.qstart), doc(ai.qs32min), doc(ai.qs32max),
		nq, nk, int32(H), kvh, sh.Scale, causal, part, int32(g.split))
	if g.split > 1 {
		n := sh.NK * sh.KVHeads * hd
		c.launch("df_attn_dkdv_reduce", ewGrid(n), 1, ewThreads, 0, dk, dv, part, int64(n), int32(g.split), sh.Scale)
	}
}

// attnArgs returns the functions that give the device address of a part of the uploaded
// attnInts at ip: at for the causal parts (null without a causal mask, whose kernels read no
// positions), doc for the document mask's (null without one: the kernels take a null qstart
// for no document mask).
func attnArgs(ip devPtr, sh AttnShape) (at, doc func(off int) devPtr) {
	part := func(on bool) func(int) devPtr {
		return func(off int) devPtr {
			if !on {
				return 0
			}
			return ip + devPtr(4*off)
		}
	}
	return part(sh.Causal), part(sh.Causal && sh.QStart != nil)
}

// attnFLOPs is 4·hd·H per causal-visible (query, key) pair of a whole causal attention of n
// tokens, the useful work a benchmark divides by: 4·n·(n+1)/2·hd·H (QKᵀ and PV), 2.5× that for
// the backward.
func attnFLOPs(n, heads, hd int, causal bool) float64 {
	pairs := float64(n) * float64(n)
	if causal {
		pairs = float64(n) * float64(n+1) / 2
	}
	return 4 * pairs * float64(hd*heads)
}
