//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"unsafe"

	"distflash/kernels/cuda"
)

// The CUDA side of the 16-bit step's elementwise methods (Backend's EmbeddingHalf …
// AdamWSegmentsHalf, the products and the attention aside): the kernels of
// kernels/cuda/half.cu, each computing every value as the CPU reference (cpu_half.go) does, in
// the float32 kernels' order of operations, and rounding its 16-bit outputs once. A packed
// buffer of n values (Len (n+1)/2) is a plain bf16 or fp16 array on the device; the pad half of
// an odd-length output is written 0, as PackHalf writes it.
//
// Bytes moved per element (the profiler's cost model; 16-bit values 2 bytes, float32 4):
//
//	EmbeddingHalf        reads 2 (table row), writes 4
//	RMSNormHalf          reads 4 (x) + 4 again (the second pass, mostly from cache), writes 2 (+2 keep)
//	RMSNormBackwardHalf  reads 2 (dout) + 2 (x) twice (dot, then dx: the second mostly from
//	                     cache) + 4 (dx), writes 4 (dx) (+2 dxHalf); then 8·dim per row
//	                     partition (normParts) written and read once for dw
//	RoPEQKV, backward    reads 2, writes 2 (every value of q|k|v)
//	SwiGLUHalf           reads 4 (gate, up), writes 2
//	SwiGLUBackwardHalf   reads 6 (gate, up, dact), writes 4 (dgate, dup) (+2 act)
//	CrossEntropyHalf     reads 4 three times (max, Σexp, the gradient), writes 2
//	GradStats            reads 4; writes 8 per 65536 elements (partials) and 12 bytes
//	AdamWSegmentsHalf    reads 16 (p, g, m, v), writes 14 (p, m, v, the 16-bit copy)

// halfState is what the 16-bit step keeps on the device between calls (guarded by CUDA.mu).
type halfState struct {
	// rope holds the RoPE tables uploaded so far, oldest first (ropeFreqs).
	rope []ropeEntry
}

// ropeEntry is one RoPE table's inverse frequencies on the device and the host copy they were
// uploaded from.
type ropeEntry struct {
	inv []float64
	mem *cuda.Mem
}

// ropeCacheTables is how many RoPE tables stay on the device: a model has one (or one per kind
// of layer), so the oldest is dropped only when a caller cycles through more.
const ropeCacheTables = 8

// ropeFreqs returns the device address of t's inverse frequencies (c.mu held). A table is
// identified by its values: InvFreq equal bit for bit to a table uploaded before is that table
// (Scale, a launch parameter, plays no part), so the frequencies travel to the device once per
// distinct table, and a caller that refills its InvFreq slice with other values gets them
// uploaded. An empty table has the null address.
func (c *CUDA) ropeFreqs(t RoPETable) devPtr {
	if len(t.InvFreq) == 0 {
		return 0
	}
	for _, e := range c.step16.rope {
		if sameFloat64Bits(e.inv, t.InvFreq) {
			return e.mem.Ptr
		}
	}
	e := ropeEntry{inv: append([]float64(nil), t.InvFreq...), mem: c.alloc(8 * len(t.InvFreq))}
	c.htod(e.mem.Ptr, unsafe.Pointer(&e.inv[0]), 8*len(e.inv))
	if len(c.step16.rope) == ropeCacheTables {
		// The dropped table's memory is freed by its cleanup, stream-ordered after the kernels
		// queued with it.
		c.step16.rope = append(c.step16.rope[:0], c.step16.rope[1:]...)
	}
	c.step16.rope = append(c.step16.rope, e)
	return e.mem.Ptr
}

// sameFloat64Bits reports whether a and b hold the same float64 bit patterns.
func sameFloat64Bits(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

// halfFlag is the kernels' format parameter for p (0 bfloat16, 1 binary16); it panics, with
// the CPU's message, unless p is a 16-bit format.
func halfFlag(what string, p Precision) int32 {
	mustHalf(what, p)
	return boolInt(p == FP16)
}

// hptr is dptr for a buffer packed in 16 bits holding n values ((n+1)/2 elements), with the
// CPU's message; a nil Buf gives the null pointer.
func hptr(what string, b Buf, n int) cudaBuf { return dptr(what+" (packed)", b, (n+1)/2) }

// normParts is the number of row partitions of RMSNormBackwardHalf: a block of the one-pass
// kernel each, every block taking 8 rows or more, at most 512 (enough blocks to fill a GPU at
// 8K rows while the dw partials, 8·dim bytes a partition, stay under a tenth of the pass's
// traffic). It depends on rows only, so dw is the same run to run.
func normParts(rows int) int { return min(max((rows+7)/8, 1), 512) }

// normAccShared reports whether the one-pass norm backward keeps a block's dw accumulators in
// shared memory (8·dim bytes, beside its 256 static bytes) on a device whose blocks may use
// optin bytes; wider rows accumulate in their global partial row instead.
func normAccShared(dim, optin int) bool { return 8*dim+256 <= optin }

// EmbeddingHalf implements Backend: df_embedding16, a block per token.
func (c *CUDA) EmbeddingHalf(out, table Buf, ids []int32, dim int, p Precision) {
	o := dptr("embedding out", out, len(ids)*dim)
	fp := halfFlag("embedding", p)
	t := dbuf(table)
	checkIDs(ids, 2*t.n/max(dim, 1))
	if dim%2 != 0 {
		panic(fmt.Sprintf("kernels: a packed embedding table needs an even width, got %d", dim))
	}
	if len(ids) == 0 || dim == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ip := c.uploadInts(ids)
	c.launch("df_embedding16", rowGrid(len(ids)), 1, ewThreads, 0, o, t, ip, int32(len(ids)), int32(dim), fp)
}

// RMSNormHalf implements Backend: df_rmsnorm16, a block per row, writing out (and keep) in 16
// bits in the pass that normalises.
func (c *CUDA) RMSNormHalf(out, keep, rstd, x, w Buf, rows, dim int, eps float32, p Precision) {
	fp := halfFlag("rmsnorm", p)
	wp := hptr("rmsnorm w", w, dim)
	xp, rp := dptr("rmsnorm x", x, rows*dim), dptr("rmsnorm rstd", rstd, rows)
	op, kp := hptr("rmsnorm out", out, rows*dim), hptr("rmsnorm keep", keep, rows*dim)
	if rows == 0 {
		return
	}
	c.launch("df_rmsnorm16", rowGrid(rows), 1, ewThreads, 0, op, kp, rp, xp, wp, int32(rows), int32(dim), eps, fp)
}

// RMSNormBackwardHalf implements Backend: df_rmsnorm16_bwd, one pass over the rows in
// normParts(rows) blocks that adds into dx, writes dxHalf and leaves each block's float64 dw
// partial sums, then df_rmsnorm16_dw, a block per 32 columns, which adds the partials over a
// fixed tree into dw (set for dwBeta 0, added to for 1).
func (c *CUDA) RMSNormBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd Buf, rows, dim int, dwBeta float32, p Precision) {
	fp := halfFlag("rmsnorm backward", p)
	dop, xp, wp := hptr("rmsnorm dout", dout, rows*dim), hptr("rmsnorm x", x, rows*dim), hptr("rmsnorm w", w, dim)
	dwp := dptr("rmsnorm dw", dw, dim)
	if dwBeta != 0 && dwBeta != 1 {
		panic(fmt.Sprintf("kernels: rmsnorm backward dw beta %v: want 0 or 1", dwBeta))
	}
	dxp, dxh := dptr("rmsnorm dx", dx, rows*dim), hptr("rmsnorm dx", dxHalf, rows*dim)
	rp := dptr("rmsnorm rstd", rstd, rows)
	if dim == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := 0
	var part devPtr
	if rows > 0 {
		parts = normParts(rows)
		part = c.grow(&c.f64s, 8*parts*dim)
		shared, smem := int32(0), 0
		if normAccShared(dim, c.info.smemOptin) {
			shared, smem = 1, 8*dim
		}
		c.launch("df_rmsnorm16_bwd", parts, 1, ewThreads, smem, dxp, dxh, part, dop, xp, wp, rp, int32(rows), int32(dim), shared, fp)
	}
	// With no rows, dw is only set (beta 0) or left plus 0 (beta 1), as on the CPU.
	c.launch("df_rmsnorm16_dw", ceilDiv(dim, warpThreads), 1, ewThreads, 0, dwp, part, int32(dim), int32(parts), dwBeta)
}

// RoPEQKV implements Backend: df_rope_qkv16, a block per token (see ropeFreqs for the cached
// table; the positions are uploaded per call).
func (c *CUDA) RoPEQKV(q, k, v, qkv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	c.ropeQKV(false, qkv, q, k, v, pos, heads, kvHeads, headDim, t, p)
}

// RoPEQKVBackward implements Backend: df_rope_qkv16 in the other direction.
func (c *CUDA) RoPEQKVBackward(dqkv, dq, dk, dv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	c.ropeQKV(true, dqkv, dq, dk, dv, pos, heads, kvHeads, headDim, t, p)
}

// ropeQKV is RoPEQKV (bwd false: the fused rows read, q, k and v written) and its backward (bwd
// true: q, k and v read, the fused rows written).
func (c *CUDA) ropeQKV(bwd bool, qkv, q, k, v Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	fp := halfFlag("rope", p)
	n, Q, KV := len(pos), heads*headDim, kvHeads*headDim
	name := [2]string{"rope ", "rope d"}[boolInt(bwd)]
	fused := [2]string{"rope qkv", "rope dqkv"}[boolInt(bwd)]
	fp2 := hptr(fused, qkv, n*(Q+2*KV))
	qp, kp, vp := hptr(name+"q", q, n*Q), hptr(name+"k", k, n*KV), hptr(name+"v", v, n*KV)
	t.check(headDim)
	if n == 0 || headDim == 0 || heads+kvHeads == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	freqs := c.ropeFreqs(t)
	pp := c.uploadInts(pos)
	c.launch("df_rope_qkv16", rowGrid(n), 1, ewThreads, 2*(headDim/2)*4, fp2, qp, kp, vp, pp, freqs,
		int32(n), int32(heads), int32(kvHeads), int32(headDim), t.Scale, boolInt(bwd), fp)
}

// SwiGLUHalf implements Backend: df_swiglu16, a block per row.
func (c *CUDA) SwiGLUHalf(act, gu Buf, rows, ffn int, p Precision) {
	fp := halfFlag("swiglu", p)
	g, a := hptr("swiglu gu", gu, rows*2*ffn), hptr("swiglu act", act, rows*ffn)
	if rows == 0 || ffn == 0 {
		return
	}
	c.launch("df_swiglu16", rowGrid(rows), 1, ewThreads, 0, a, g, int32(rows), int32(ffn), fp)
}

// SwiGLUBackwardHalf implements Backend: df_swiglu16_bwd, a block per row.
func (c *CUDA) SwiGLUBackwardHalf(dgu, act, dact, gu Buf, rows, ffn int, p Precision) {
	fp := halfFlag("swiglu backward", p)
	g, do := hptr("swiglu gu", gu, rows*2*ffn), hptr("swiglu dact", dact, rows*ffn)
	dg, a := hptr("swiglu dgu", dgu, rows*2*ffn), hptr("swiglu act", act, rows*ffn)
	if rows == 0 || ffn == 0 {
		return
	}
	c.launch("df_swiglu16_bwd", rowGrid(rows), 1, ewThreads, 0, dg, a, do, g, int32(rows), int32(ffn), fp)
}

// CrossEntropyHalf implements Backend: df_xent16, a block per row.
func (c *CUDA) CrossEntropyHalf(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32, p Precision) {
	fp := halfFlag("cross-entropy", p)
	rows := len(targets)
	lg, ls := dptr("cross-entropy logits", logits, rows*vocab), dptr("cross-entropy losses", losses, rows)
	if dlogits == nil {
		panic("kernels: cross-entropy in 16 bits needs a dlogits buffer")
	}
	dl := hptr("cross-entropy dlogits", dlogits, rows*vocab)
	if dl.mem == lg.mem && dl.n > 0 && lg.n > 0 && dl.off < lg.off+lg.n && lg.off < dl.off+dl.n {
		panic("kernels: cross-entropy in 16 bits: dlogits overlaps logits (it needs its own buffer)")
	}
	checkTargets(targets, vocab)
	if rows == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := c.uploadInts(targets)
	c.launch("df_xent16", rowGrid(rows), 1, ewThreads, 0, ls, dl, lg, tp, int32(rows), int64(vocab), dscale, fp)
}

// GradStats implements Backend: df_sumsq_partial's float64 partial sums over the partition
// SumSquares uses (fixed by the length), then df_gradstats, one block adding them over a fixed
// tree and writing dst. Nothing waits for the device and nothing is downloaded.
func (c *CUDA) GradStats(dst, g Buf) {
	d := dptr("grad stats", dst, 3)
	x := dbuf(g)
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := 0
	var part devPtr
	if x.n > 0 {
		parts = sumsqParts(x.n)
		part = c.grow(&c.f64s, 8*parts)
		c.launch("df_sumsq_partial", parts, 1, ewThreads, 0, x, int64(x.n), part)
	}
	c.launch("df_gradstats", 1, 1, ewThreads, 0, d, part, int32(parts))
}

// AdamWSegmentsHalf implements Backend: df_adamw_multi16, AdamWSegments' one launch (the same
// segment table and grid) that also stores each updated parameter in 16 bits into half.
func (c *CUDA) AdamWSegmentsHalf(pb, gb, mb, vb, half Buf, segs []AdamWSegment, hp AdamWStep, prec Precision) {
	fp := halfFlag("adamw copy", prec)
	n := pb.Len()
	h := hptr("adamw copy", half, n)
	c.adamwSegments("df_adamw_multi16", pb, gb, mb, vb, segs, hp, []any{h}, []any{int64(n), fp})
}
