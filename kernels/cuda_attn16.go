//go:build cuda

package kernels

// One rank's whole attention in 16 bits on the GPU (Backend.AttnForwardHalf and
// AttnBackwardHalf): q, k, v, o, dO and the gradients packed in sh.Operands, the statistics
// float32. The products run at sh.Operands whatever the backend's MatMul precision.
//
// cuDNN takes every block it can (cuda_cudnn_route.go; not device.attention = own, cuDNN
// loaded, a graph with a plan) and reads and writes the caller's buffers directly
// (cudnnForwardHalf, cudnnBackwardHalf in cuda_cudnn.go). Launched per call on a plain causal
// block:
//
//	forward:  the cuDNN execution alone (the float32 path: AttnInit's 3 memsets, 3 toHalf,
//	          cuDNN, fold, AttnFinish and the model's pack of o: 3 memsets, 6 launches)
//	backward: the cuDNN execution alone, and before cuDNN 9.6 the clearing of its dQ
//	          accumulator in the workspace (the float32 path: the model's zeroing of dq, dk, dv,
//	          prep, toHalf of q, k, v, O and dO, 3 memsets of the 16-bit gradients, cuDNN,
//	          add_half3: 6 memsets, 7 launches)
//
// A ragged (packed documents) forward takes the float32 state's path with cuDNN (AttnInit,
// cuDNN, fold, finish, pack): cuDNN's statistics are in padded rows there. Every other block
// cuDNN does not take runs the own kernels, in the state the Backend's float32 methods keep, in
// scratch of the backend's: forward AttnInit, the attention kernel, AttnFinish, PackHalf into o;
// backward AttnBackwardPrep (D of the 16-bit O and dO), zeroed float32 gradients, the two
// backward kernels, PackHalf into dq, dk, dv. Everything is queued on the stream: no call waits
// for the device.

import "distflash/kernels/cuda"

// attn16Scratch is the float32 state and gradients of the 16-bit attention's own path, grown on
// demand and reused (the work is ordered on the stream). CUDA.a16mu holds them for a call,
// which makes Backend calls that take CUDA.mu for their own scratch.
type attn16Scratch struct {
	bufs [4]*cuda.Mem
}

// scratch16 returns scratch slot i as a float32 buffer of n elements (c.a16mu held).
func (c *CUDA) scratch16(i, n int) Buf {
	c.grow(&c.a16.bufs[i], 4*n)
	return cudaBuf{mem: c.a16.bufs[i], n: n}
}

// sized is a buffer of a call, the name its length check gives it, and its length.
type sized struct {
	what string
	b    Buf
	n    int
}

// checkSized panics for a buffer whose length is not its call's.
func checkSized(bufs ...sized) {
	for _, x := range bufs {
		dptr(x.what, x.b, x.n)
	}
}

// AttnForwardHalf implements Backend.
func (c *CUDA) AttnForwardHalf(ob, lseb, qb, kb, vb Buf, sh AttnShape) {
	mustHalf("attention", sh.Operands)
	prec := cudaPrec(sh.Operands)
	p := c.attnPlan(sh, prec)
	H, hd := sh.Heads, sh.HeadDim
	ol := sh.OperandLen
	checkSized(sized{"attn o (packed)", ob, ol(sh.NQ * H * hd)}, sized{"attn lse", lseb, H * sh.NQ},
		sized{"attn q (packed)", qb, ol(sh.NQ * H * hd)}, sized{"attn k (packed)", kb, ol(sh.NK * sh.KVHeads * hd)},
		sized{"attn v (packed)", vb, ol(sh.NK * sh.KVHeads * hd)})
	pairs := visiblePairs(sh, attnT64, p.fwdBK)
	if pairs == 0 || sh.NQ == 0 {
		c.attnForwardHalfOwn(ob, lseb, qb, kb, vb, sh, prec, false)
		return
	}
	blk, spec, plan, ok := c.cudnnRoute(sh, false, prec)
	switch {
	case !ok: // counted as the own path's
		c.attnForwardHalfOwn(ob, lseb, qb, kb, vb, sh, prec, false)
	case blk.ragged:
		c.attnForwardHalfOwn(ob, lseb, qb, kb, vb, sh, prec, true)
	default:
		if !c.cudnnForwardHalf(ob, lseb, qb, kb, vb, sh, blk, spec, plan) {
			c.attnForwardHalfOwn(ob, lseb, qb, kb, vb, sh, prec, false)
			return
		}
		c.counters.AttnBlocks.Add(1)
		c.counters.AttnFwdFLOPs.Add(4 * pairs * int64(hd*H))
	}
}

// attnForwardHalfOwn is AttnForwardHalf through the float32 state: AttnInit, the block (on
// cuDNN with its fold when viaCUDNN, else the own kernel), AttnFinish, then o packed.
func (c *CUDA) attnForwardHalfOwn(ob, lseb, qb, kb, vb Buf, sh AttnShape, prec cudaPrec, viaCUDNN bool) {
	c.a16mu.Lock()
	defer c.a16mu.Unlock()
	H, hd := sh.Heads, sh.HeadDim
	st := AttnState{O: c.scratch16(0, sh.NQ*H*hd), M: c.scratch16(1, H*sh.NQ), L: c.scratch16(2, H*sh.NQ)}
	c.AttnInit(st)
	c.attnForward(st, qb, kb, vb, sh, prec, viaCUDNN)
	c.AttnFinish(st.O, lseb, st, sh.NQ, H, hd)
	c.pack16(ob, st.O, prec == precFP16)
}

// AttnBackwardHalf implements Backend.
func (c *CUDA) AttnBackwardHalf(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb Buf, sh AttnShape) {
	mustHalf("attention", sh.Operands)
	prec := cudaPrec(sh.Operands)
	c.attnPlan(sh, prec)
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	nq, nk := sh.OperandLen(sh.NQ*H*hd), sh.OperandLen(sh.NK*KVH*hd)
	checkSized(sized{"attn bwd dq (packed)", dqb, nq}, sized{"attn bwd dk (packed)", dkb, nk}, sized{"attn bwd dv (packed)", dvb, nk},
		sized{"attn bwd q (packed)", qb, nq}, sized{"attn bwd k (packed)", kb, nk}, sized{"attn bwd v (packed)", vb, nk},
		sized{"attn bwd o (packed)", ob, nq}, sized{"attn bwd do (packed)", dob, nq}, sized{"attn bwd lse", lseb, H * sh.NQ})
	pairs := visiblePairs(sh, attnT64, attnT32)
	if pairs == 0 || sh.NQ == 0 {
		for _, g := range []Buf{dqb, dkb, dvb} { // no key seen: every gradient 0
			c.Zero(g)
		}
		return
	}
	blk, spec, plan, ok := c.cudnnRoute(sh, true, prec)
	if !ok || !c.cudnnBackwardHalf(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, sh, blk, spec, plan) {
		c.attnBackwardHalfOwn(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, sh, prec)
		return
	}
	c.counters.AttnBackwards.Add(1)
	c.counters.AttnBwdFLOPs.Add(10 * pairs * int64(hd*H))
}

// attnBackwardHalfOwn is AttnBackwardHalf on the own kernels: D from the 16-bit O and dO,
// float32 gradients zeroed, the backward kernels, the gradients packed.
func (c *CUDA) attnBackwardHalfOwn(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb Buf, sh AttnShape, prec cudaPrec) {
	c.a16mu.Lock()
	defer c.a16mu.Unlock()
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	d := c.scratch16(0, H*sh.NQ)
	gq, gk, gv := c.scratch16(1, sh.NQ*H*hd), c.scratch16(2, sh.NK*KVH*hd), c.scratch16(3, sh.NK*KVH*hd)
	c.AttnBackwardPrep(d, ob, dob, sh.NQ, H, hd, sh.Operands)
	for _, g := range []Buf{gq, gk, gv} {
		c.Zero(g)
	}
	c.attnBackward(gq, gk, gv, qb, kb, vb, ob, dob, lseb, d, sh, prec, false)
	fp16 := prec == precFP16
	c.pack16(dqb, gq, fp16)
	c.pack16(dkb, gk, fp16)
	c.pack16(dvb, gv, fp16)
}
