package kernels

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
)

// The CPU backend's 16-bit step (Backend's MatMulHalf … AdamWSegmentsHalf). Each method
// widens its packed inputs (exact), runs the float32 method on them and rounds its 16-bit
// outputs once: the rounding points of the GPU's kernels, so a bf16 or fp16 run on the CPU is
// the reference of the same run on a GPU. The widened copies and float32 results are a call's
// scratch, taken from the backend's free lists and given back when it returns: a step would
// otherwise allocate (and, under train's GOGC=10, collect) several times the model's
// activations, which made the CPU's bf16 step twice as slow. The lists keep, for the
// backend's life, the temporaries of the largest calls (per power-of-two size class, as many
// as one call holds at once), about what one call of the old path allocated afresh.

// halfPool is a CPU backend's free lists of scratch, by size class (a power of two).
type halfPool struct {
	mu   sync.Mutex
	free [64][]*[]float32
}

// scratch is the float32 temporaries of one call; free gives them back to the pool. Their
// contents are left from an earlier use: every caller writes a temporary whole before reading
// it, or clears it.
type scratch struct {
	pool *halfPool
	bufs []*[]float32
}

// scratch starts a call's temporaries.
func (c *CPU) scratch() scratch { return scratch{pool: &c.half} }

// get returns a temporary of n values.
func (s *scratch) get(n int) []float32 {
	class := bits.Len(uint(n))
	var b *[]float32
	p := s.pool
	p.mu.Lock()
	if l := len(p.free[class]); l > 0 {
		b = p.free[class][l-1]
		p.free[class] = p.free[class][:l-1]
	}
	p.mu.Unlock()
	if b == nil {
		x := make([]float32, 1<<class)
		b = &x
	}
	s.bufs = append(s.bufs, b)
	return (*b)[:n]
}

// free gives every temporary back.
func (s *scratch) free() {
	p := s.pool
	p.mu.Lock()
	for _, b := range s.bufs {
		class := bits.Len(uint(cap(*b))) - 1
		p.free[class] = append(p.free[class], b)
	}
	p.mu.Unlock()
	s.bufs = nil
}

// widen returns the n values of the buffer b, packed in p, in a temporary of s.
func (s *scratch) widen(what string, b Buf, n int, p Precision) []float32 {
	mustHalf(what, p)
	src := f(b)
	mustLen(what+" (packed)", src, (n+1)/2)
	out := s.get(n)
	chunks(len(src), 1<<13, func(lo, hi int) { unpackHalf(out[2*lo:min(2*hi, n)], src[lo:hi], p) })
	return out
}

// narrow stores the values x, rounded to p, packed into the buffer b.
func narrow(what string, b Buf, x []float32, p Precision) {
	d := f(b)
	mustLen(what+" (packed)", d, (len(x)+1)/2)
	chunks(len(d), 1<<13, func(lo, hi int) { packHalf(d[lo:hi], x[2*lo:min(2*hi, len(x))], p) })
}

// MatMulHalf implements Backend.
func (c *CPU) MatMulHalf(cb, ab, bb Buf, m, n, k int, transA, transB bool, beta float32, p Precision, cHalf bool) {
	s := c.scratch()
	defer s.free()
	A, B := s.widen("matmul A", ab, m*k, p), s.widen("matmul B", bb, k*n, p)
	if !cHalf {
		C := f(cb)
		mustLen("matmul C", C, m*n)
		c.matmul(C, A, B, m, n, k, transA, transB, beta)
		return
	}
	var C []float32
	if beta != 0 {
		C = s.widen("matmul C", cb, m*n, p)
	} else {
		mustLen("matmul C (packed)", f(cb), (m*n+1)/2)
		C = s.get(m * n) // beta 0: the product overwrites it, NaNs included
	}
	c.matmul(C, A, B, m, n, k, transA, transB, beta)
	narrow("matmul C", cb, C, p)
}

// matmul is MatMul on host slices with exact float32 operands.
func (c *CPU) matmul(C, A, B []float32, m, n, k int, transA, transB bool, beta float32) {
	c.counters.MatMulFLOPs.Add(int64(2 * m * n * k))
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		for i := range C {
			if beta == 0 {
				C[i] = 0
			} else {
				C[i] *= beta
			}
		}
		return
	}
	lda, ldb := leadingDims(m, n, k, transA, transB)
	sgemmPrec(FP32, transA, transB, m, n, k, 1, A, lda, B, ldb, beta, C, n)
}

// EmbeddingHalf implements Backend.
func (c *CPU) EmbeddingHalf(out, table Buf, ids []int32, dim int, p Precision) {
	o := f(out)
	mustLen("embedding out", o, len(ids)*dim)
	mustHalf("embedding", p)
	t := f(table)
	vocab := 2 * len(t) / max(dim, 1)
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			panic(fmt.Sprintf("kernels: token id %d outside vocabulary of %d", id, vocab))
		}
	}
	if dim%2 != 0 {
		panic(fmt.Sprintf("kernels: a packed embedding table needs an even width, got %d", dim))
	}
	chunks(len(ids), 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := int(ids[i]) * dim / 2
			unpackHalf(o[i*dim:(i+1)*dim], t[row:row+dim/2], p)
		}
	})
}

// RMSNormHalf implements Backend.
func (c *CPU) RMSNormHalf(out, keep, rstd, x, w Buf, rows, dim int, eps float32, p Precision) {
	s := c.scratch()
	defer s.free()
	ws := s.widen("rmsnorm w", w, dim, p)
	o := s.get(rows * dim)
	c.RMSNorm(cpuBuf(o), rstd, x, cpuBuf(ws), rows, dim, eps)
	narrow("rmsnorm out", out, o, p)
	if keep != nil {
		narrow("rmsnorm keep", keep, f(x), p)
	}
}

// RMSNormBackwardHalf implements Backend.
func (c *CPU) RMSNormBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd Buf, rows, dim int, dwBeta float32, p Precision) {
	s := c.scratch()
	defer s.free()
	do, xs, ws := s.widen("rmsnorm dout", dout, rows*dim, p), s.widen("rmsnorm x", x, rows*dim, p), s.widen("rmsnorm w", w, dim, p)
	dws := f(dw)
	mustLen("rmsnorm dw", dws, dim)
	if dwBeta == 0 {
		clear(dws)
	} else if dwBeta != 1 {
		panic(fmt.Sprintf("kernels: rmsnorm backward dw beta %v: want 0 or 1", dwBeta))
	}
	c.RMSNormBackward(dx, dw, cpuBuf(do), cpuBuf(xs), cpuBuf(ws), rstd, rows, dim)
	if dxHalf != nil {
		narrow("rmsnorm dx", dxHalf, f(dx), p)
	}
}

// RoPEQKV implements Backend.
func (c *CPU) RoPEQKV(q, k, v, qkv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	s := c.scratch()
	defer s.free()
	n, Q, KV := len(pos), heads*headDim, kvHeads*headDim
	all := s.widen("rope qkv", qkv, n*(Q+2*KV), p)
	qs, ks, vs := s.get(n*Q), s.get(n*KV), s.get(n*KV)
	for i := range n {
		row := all[i*(Q+2*KV):]
		copy(qs[i*Q:(i+1)*Q], row[:Q])
		copy(ks[i*KV:(i+1)*KV], row[Q:Q+KV])
		copy(vs[i*KV:(i+1)*KV], row[Q+KV:Q+2*KV])
	}
	c.RoPE(cpuBuf(qs), pos, heads, headDim, t, false)
	c.RoPE(cpuBuf(ks), pos, kvHeads, headDim, t, false)
	narrow("rope q", q, qs, p)
	narrow("rope k", k, ks, p)
	narrow("rope v", v, vs, p)
}

// RoPEQKVBackward implements Backend.
func (c *CPU) RoPEQKVBackward(dqkv, dq, dk, dv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	s := c.scratch()
	defer s.free()
	n, Q, KV := len(pos), heads*headDim, kvHeads*headDim
	qs, ks, vs := s.widen("rope dq", dq, n*Q, p), s.widen("rope dk", dk, n*KV, p), s.widen("rope dv", dv, n*KV, p)
	c.RoPE(cpuBuf(qs), pos, heads, headDim, t, true)
	c.RoPE(cpuBuf(ks), pos, kvHeads, headDim, t, true)
	all := s.get(n * (Q + 2*KV))
	for i := range n {
		row := all[i*(Q+2*KV):]
		copy(row[:Q], qs[i*Q:(i+1)*Q])
		copy(row[Q:Q+KV], ks[i*KV:(i+1)*KV])
		copy(row[Q+KV:Q+2*KV], vs[i*KV:(i+1)*KV])
	}
	narrow("rope dqkv", dqkv, all, p)
}

// splitRows sets a and b ([rows, w] each) to the two column halves of x ([rows, 2·w]).
func splitRows(a, b, x []float32, rows, w int) {
	for i := range rows {
		copy(a[i*w:(i+1)*w], x[2*i*w:(2*i+1)*w])
		copy(b[i*w:(i+1)*w], x[(2*i+1)*w:(2*i+2)*w])
	}
}

// SwiGLUHalf implements Backend.
func (c *CPU) SwiGLUHalf(act, gu Buf, rows, ffn int, p Precision) {
	s := c.scratch()
	defer s.free()
	g, u, a := s.get(rows*ffn), s.get(rows*ffn), s.get(rows*ffn)
	splitRows(g, u, s.widen("swiglu gu", gu, rows*2*ffn, p), rows, ffn)
	c.SwiGLU(cpuBuf(a), cpuBuf(g), cpuBuf(u))
	narrow("swiglu act", act, a, p)
}

// SwiGLUBackwardHalf implements Backend.
func (c *CPU) SwiGLUBackwardHalf(dgu, act, dact, gu Buf, rows, ffn int, p Precision) {
	s := c.scratch()
	defer s.free()
	g, u := s.get(rows*ffn), s.get(rows*ffn)
	splitRows(g, u, s.widen("swiglu gu", gu, rows*2*ffn, p), rows, ffn)
	do := s.widen("swiglu dact", dact, rows*ffn, p)
	a, dg, du := s.get(rows*ffn), s.get(rows*ffn), s.get(rows*ffn)
	c.SwiGLUBackwardAct(cpuBuf(a), cpuBuf(dg), cpuBuf(du), cpuBuf(do), cpuBuf(g), cpuBuf(u))
	all := s.get(rows * 2 * ffn)
	for i := range rows {
		copy(all[2*i*ffn:(2*i+1)*ffn], dg[i*ffn:(i+1)*ffn])
		copy(all[(2*i+1)*ffn:(2*i+2)*ffn], du[i*ffn:(i+1)*ffn])
	}
	narrow("swiglu dgu", dgu, all, p)
	if act != nil {
		narrow("swiglu act", act, a, p)
	}
}

// CrossEntropyHalf implements Backend.
func (c *CPU) CrossEntropyHalf(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32, p Precision) {
	mustHalf("cross-entropy", p)
	s := c.scratch()
	defer s.free()
	dl := s.get(len(targets) * vocab)
	c.CrossEntropy(losses, cpuBuf(dl), logits, targets, vocab, dscale)
	narrow("cross-entropy dlogits", dlogits, dl, p)
}

// AttnForwardHalf implements Backend.
func (c *CPU) AttnForwardHalf(o, lse, q, k, v Buf, sh AttnShape) {
	mustHalf("attention", sh.Operands)
	s := c.scratch()
	defer s.free()
	nq := sh.NQ * sh.Heads * sh.HeadDim
	st := AttnState{O: cpuBuf(s.get(nq)), M: cpuBuf(s.get(sh.NQ * sh.Heads)), L: cpuBuf(s.get(sh.NQ * sh.Heads))}
	c.AttnInit(st)
	c.AttnForward(st, q, k, v, sh)
	c.AttnFinish(st.O, lse, st, sh.NQ, sh.Heads, sh.HeadDim)
	narrow("attention o", o, f(st.O), sh.Operands)
}

// AttnBackwardHalf implements Backend.
func (c *CPU) AttnBackwardHalf(dq, dk, dv, q, k, v, o, do, lse Buf, sh AttnShape) {
	mustHalf("attention", sh.Operands)
	s := c.scratch()
	defer s.free()
	nq, nk := sh.NQ*sh.Heads*sh.HeadDim, sh.NK*sh.KVHeads*sh.HeadDim
	d := cpuBuf(s.get(sh.NQ * sh.Heads))
	c.AttnBackwardPrep(d, o, do, sh.NQ, sh.Heads, sh.HeadDim, sh.Operands)
	gq, gk, gv := s.get(nq), s.get(nk), s.get(nk)
	clear(gq) // AttnBackward adds into them
	clear(gk)
	clear(gv)
	c.AttnBackward(cpuBuf(gq), cpuBuf(gk), cpuBuf(gv), q, k, v, o, do, lse, d, sh)
	narrow("attention dq", dq, gq, sh.Operands)
	narrow("attention dk", dk, gk, sh.Operands)
	narrow("attention dv", dv, gv, sh.Operands)
}

// GradStats implements Backend. Σ g² of float32 values in float64 is finite exactly when
// every value is (the largest float32 squared is about 1e77, and no buffer holds 1e231 of
// them), so one pass answers both.
func (c *CPU) GradStats(dst, g Buf) {
	d := f(dst)
	mustLen("grad stats", d, 3)
	x := f(g)
	ss := sumChunks(len(x), func(lo, hi int) float64 {
		var s float64
		for _, v := range x[lo:hi] {
			s += float64(v) * float64(v)
		}
		return s
	})
	hi := float32(ss)
	d[0], d[1], d[2] = hi, float32(ss-float64(hi)), 0
	if math.IsInf(ss, 0) || math.IsNaN(ss) {
		d[1], d[2] = 0, 1
	}
}

// AdamWSegmentsHalf implements Backend.
func (c *CPU) AdamWSegmentsHalf(pb, gb, mb, vb, half Buf, segs []AdamWSegment, hp AdamWStep, prec Precision) {
	mustHalf("adamw copy", prec)
	c.AdamWSegments(pb, gb, mb, vb, segs, hp)
	c.PackHalf(half, pb, prec)
}
