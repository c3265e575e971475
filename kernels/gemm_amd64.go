//go:build amd64 && !noasm

package kernels

import "golang.org/x/sys/cpu"

// Assembly microkernels (gemm_amd64.s), gemmKernelFuncs:
// sgemmKernel6x16 uses AVX2+FMA (12 ymm accumulators), sgemmKernel6x32 AVX-512F
// (12 zmm accumulators). Both compute every element with the same operations in the same
// order (one FMA chain over k, then ·alpha, + beta·c), so they give identical results.

//go:noescape
func sgemmKernel6x16(kc int, a, b, c *float32, ldc int, alpha, beta float32)

//go:noescape
func sgemmKernel6x32(kc int, a, b, c *float32, ldc int, alpha, beta float32)

// Packing helpers (AVX).

//go:noescape
func gemmPackT8(dst, src *float32, ld, kc8, ds int)

//go:noescape
func gemmPackT6(dst, src *float32, ld, kc8 int)

//go:noescape
func gemmPackRows6(dst, src *float32, ld, kc int)

//go:noescape
func gemmPackRows16(dst, src *float32, ld, kc int)

//go:noescape
func gemmPackRows32(dst, src *float32, ld, kc int)

var (
	gemmHasAVX2   = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	gemmHasAVX512 = gemmHasAVX2 && cpu.X86.HasAVX512F

	gemmAVX2   = gemmImpl{name: "avx2", mr: 6, nr: 16, kernel: sgemmKernel6x16}
	gemmAVX512 = gemmImpl{name: "avx512", mr: 6, nr: 32, kernel: sgemmKernel6x32}
)

func init() {
	switch {
	case gemmHasAVX512:
		gemmKernel = gemmAVX512
	case gemmHasAVX2:
		gemmKernel = gemmAVX2
	}
}

// gemmAsmImpls lists the assembly microkernels this CPU can run (for tests).
func gemmAsmImpls() []gemmImpl {
	var l []gemmImpl
	if gemmHasAVX2 {
		l = append(l, gemmAVX2)
	}
	if gemmHasAVX512 {
		l = append(l, gemmAVX512)
	}
	return l
}

// gemmPackRowsAsm sets dst[p·w + j] = src[p·ld + j] for p < kc, j < w, reporting whether
// it could (w ∈ {6, 16, 32}).
func gemmPackRowsAsm(dst, src []float32, ld, kc, w int) bool {
	if !gemmHasAVX2 || kc <= 0 {
		return false
	}
	var f func(dst, src *float32, ld, kc int)
	switch w {
	case 6:
		f = gemmPackRows6
	case 16:
		f = gemmPackRows16
	case 32:
		f = gemmPackRows32
	default:
		return false
	}
	_ = dst[kc*w-1]
	_ = src[(kc-1)*ld+w-1]
	f(&dst[0], &src[0], ld, kc)
	return true
}

// gemmPackTAsm sets dst[p·ds + j] = src[j·ld + p] for j < rows and p below a multiple of 8
// up to kc, returning that multiple (0 when it cannot: rows must be 6 with ds = 6, or a
// multiple of 8).
func gemmPackTAsm(dst, src []float32, ld, kc, rows, ds int) int {
	kc8 := kc &^ 7
	if !gemmHasAVX2 || kc8 == 0 {
		return 0
	}
	if !(rows == 6 && ds == 6) && rows%8 != 0 {
		return 0
	}
	_ = dst[(kc8-1)*ds+rows-1]
	_ = src[(rows-1)*ld+kc8-1]
	if rows == 6 {
		gemmPackT6(&dst[0], &src[0], ld, kc8)
		return kc8
	}
	for j := 0; j < rows; j += 8 {
		gemmPackT8(&dst[j], &src[j*ld], ld, kc8, ds)
	}
	return kc8
}
