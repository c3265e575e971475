//go:build cuda

package kernels

// SetCUDAPrecisionForTest sets the precision ("fp32", "bf16", "fp16") of a CUDA backend for the
// external tests of this package (cuda_step_test.go), until Backend has SetMatMulPrecision.
func SetCUDAPrecisionForTest(be Backend, p string) {
	for _, q := range []cudaPrec{precFP32, precBF16, precFP16} {
		if q.String() == p {
			be.(*CUDA).setPrecision(q)
			return
		}
	}
	panic("unknown precision " + p)
}
