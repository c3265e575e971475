//go:build cuda

package kernels

// Placeholders of the 16-bit step on the CUDA backend while it is built: each panics. The
// engineers implementing them delete theirs from this file; it is removed when empty.

// MatMulHalf implements Backend.
func (c *CUDA) MatMulHalf(cb, ab, bb Buf, m, n, k int, transA, transB bool, beta float32, p Precision, cHalf bool) {
	panic("kernels: cuda: MatMulHalf not built yet")
}

// AttnForwardHalf implements Backend.
func (c *CUDA) AttnForwardHalf(o, lse, q, k, v Buf, sh AttnShape) {
	panic("kernels: cuda: AttnForwardHalf not built yet")
}

// AttnBackwardHalf implements Backend.
func (c *CUDA) AttnBackwardHalf(dq, dk, dv, q, k, v, o, do, lse Buf, sh AttnShape) {
	panic("kernels: cuda: AttnBackwardHalf not built yet")
}
