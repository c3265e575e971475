//go:build amd64 && !noasm

package kernels

import "math"

// Vector kernels of exp_amd64.s; n is a multiple of the vector width (16 for AVX-512F,
// 8 for AVX2), and the sum returned is the lanes' partial sums added in a fixed order.

//go:noescape
func expShift512(dst, src *float32, n int, shift float32) float32

//go:noescape
func expShift256(dst, src *float32, n int, shift float32) float32

//go:noescape
func max256(src *float32, n int) float32

// expShift sets dst[j] = e^(src[j]−shift) (the algorithm of expf32) and returns Σ dst[j],
// summed in a fixed order.
func expShift(dst, src []float32, shift float32) float32 {
	switch {
	case gemmHasAVX512:
		return expShiftVec(expShift512, 16, dst, src, shift)
	case gemmHasAVX2:
		return expShiftVec(expShift256, 8, dst, src, shift)
	}
	return expShiftGo(dst, src, shift)
}

// expShiftVec runs kernel k over the full vectors of src and over the rest padded with -Inf
// (whose exponential, 0, adds nothing), so every element goes through the same kernel.
func expShiftVec(k func(dst, src *float32, n int, shift float32) float32, w int, dst, src []float32, shift float32) float32 {
	n := len(src)
	if n == 0 {
		return 0
	}
	dst = dst[:n]
	full := n &^ (w - 1)
	var s float32
	if full > 0 {
		s = k(&dst[0], &src[0], full, shift)
	}
	if full < n {
		var buf [16]float32
		ninf := float32(math.Inf(-1))
		for i := range buf[:w] {
			buf[i] = ninf
		}
		copy(buf[:], src[full:])
		s += k(&buf[0], &buf[0], w, shift)
		copy(dst[full:], buf[:n-full])
	}
	return s
}

// rowMax returns the largest element of src (-Inf when empty); NaNs are ignored.
func rowMax(src []float32) float32 {
	if !gemmHasAVX2 || len(src) < 16 {
		return maxGo(src)
	}
	full := len(src) &^ 15
	return max(max256(&src[0], full), maxGo(src[full:]))
}

// expImpls lists the exponential kernels this CPU can run (for tests).
func expImpls() []expImpl {
	l := []expImpl{{"go", expShiftGo}}
	if gemmHasAVX2 {
		l = append(l, expImpl{"avx2", func(d, s []float32, sh float32) float32 { return expShiftVec(expShift256, 8, d, s, sh) }})
	}
	if gemmHasAVX512 {
		l = append(l, expImpl{"avx512", func(d, s []float32, sh float32) float32 { return expShiftVec(expShift512, 16, d, s, sh) }})
	}
	return l
}

//go:noescape
func dsRow256(p, dp *float32, n int, d float32)

// dsRow sets dp[j] = p[j]·(dp[j] − d), the gradient of the scores in the attention backward.
func dsRow(p, dp []float32, d float32) {
	p = p[:len(dp)]
	full := len(dp) &^ 7
	if gemmHasAVX2 && full > 0 {
		dsRow256(&p[0], &dp[0], full, d)
		p, dp = p[full:], dp[full:]
	}
	dsRowGo(p, dp, d)
}
