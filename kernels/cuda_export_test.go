//go:build cuda

package kernels

import "testing"

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

// NewTracingCUDAForTest returns a CUDA backend on the recording fake device (cuda_fake_test.go)
// for the external tests, and a function that returns the device's trace since its last call:
// one line per kernel launch ("launch NAME"), GEMM ("gemm A B C", the element types), copy to
// the host ("dtoh") and synchronisation ("sync"), in the order the backend asked for them. The
// fake computes nothing (a copy to the host reads zeros).
func NewTracingCUDAForTest(t *testing.T) (Backend, func() []string) {
	c, f := newFakeCUDA(t)
	f.trace = []string{}
	return c, func() []string {
		tr := f.trace
		f.trace = []string{}
		return tr
	}
}
