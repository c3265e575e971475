//go:build cuda

package kernels

// Placeholders of the 16-bit step on the CUDA backend while it is built: each panics. The
// engineers implementing them delete theirs from this file; it is removed when empty.

// EmbeddingHalf implements Backend.
func (c *CUDA) EmbeddingHalf(out, table Buf, ids []int32, dim int, p Precision) {
	panic("kernels: cuda: EmbeddingHalf not built yet")
}

// RMSNormHalf implements Backend.
func (c *CUDA) RMSNormHalf(out, keep, rstd, x, w Buf, rows, dim int, eps float32, p Precision) {
	panic("kernels: cuda: RMSNormHalf not built yet")
}

// RMSNormBackwardHalf implements Backend.
func (c *CUDA) RMSNormBackwardHalf(dx, dxHalf, dw, dout, x, w, rstd Buf, rows, dim int, dwBeta float32, p Precision) {
	panic("kernels: cuda: RMSNormBackwardHalf not built yet")
}

// RoPEQKV implements Backend.
func (c *CUDA) RoPEQKV(q, k, v, qkv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	panic("kernels: cuda: RoPEQKV not built yet")
}

// RoPEQKVBackward implements Backend.
func (c *CUDA) RoPEQKVBackward(dqkv, dq, dk, dv Buf, pos []int32, heads, kvHeads, headDim int, t RoPETable, p Precision) {
	panic("kernels: cuda: RoPEQKVBackward not built yet")
}

// SwiGLUHalf implements Backend.
func (c *CUDA) SwiGLUHalf(act, gu Buf, rows, ffn int, p Precision) {
	panic("kernels: cuda: SwiGLUHalf not built yet")
}

// SwiGLUBackwardHalf implements Backend.
func (c *CUDA) SwiGLUBackwardHalf(dgu, act, dact, gu Buf, rows, ffn int, p Precision) {
	panic("kernels: cuda: SwiGLUBackwardHalf not built yet")
}

// CrossEntropyHalf implements Backend.
func (c *CUDA) CrossEntropyHalf(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32, p Precision) {
	panic("kernels: cuda: CrossEntropyHalf not built yet")
}

// GradStats implements Backend.
func (c *CUDA) GradStats(dst, g Buf) {
	panic("kernels: cuda: GradStats not built yet")
}

// AdamWSegmentsHalf implements Backend.
func (c *CUDA) AdamWSegmentsHalf(pb, gb, mb, vb, half Buf, segs []AdamWSegment, hp AdamWStep, prec Precision) {
	panic("kernels: cuda: AdamWSegmentsHalf not built yet")
}
