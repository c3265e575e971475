//go:build !amd64 || noasm

package kernels

// Without assembly (other architectures, or the noasm build tag) sgemm uses the portable
// microkernel sgemmKernelGo4x6 that gemm.go installs by default, and pure-Go packing.

// gemmAsmImpls lists the assembly microkernels this CPU can run (for tests): none.
func gemmAsmImpls() []gemmImpl { return nil }

func gemmPackRowsAsm(dst, src []float32, ld, kc, w int) bool { return false }

func gemmPackTAsm(dst, src []float32, ld, kc, rows, ds int) int { return 0 }
