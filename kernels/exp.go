package kernels

import "math"

// Vectorised exponential of the attention softmax.
//
// expf32 is the algorithm every implementation follows (Cephes expf, range reduction as in
// Cody & Waite): clamp x to [-105, 89] (NaN passes through), n = round(x·log2 e),
// r = x − n·C1 − n·C2 with C1 + C2 = ln 2 (C1 exact in 9 bits, so n·C1 is exact), then
// e^r ≈ 1 + r + r²·P(r) with P of degree 5, and the result is e^r·2^n. 2^n is applied as
// 2^⌊n/2⌋·2^(n−⌊n/2⌋): the first product is exact and the second rounds once, so results in
// the subnormal range are correctly rounded from e^r·2^n, results below half the smallest
// subnormal are 0, -Inf gives 0, and x above ln(MaxFloat32) gives +Inf.
//
// The assembly versions (exp_amd64.s, AVX2 and AVX-512F) evaluate the same steps with fused
// multiply-adds and give identical results to each other; the portable Go version rounds
// each step separately. Error against math.Exp (TestExpAccuracy: every 199th float32 bit
// pattern in [-106, 90], the subnormal-result range [-104, -86] in steps of 1/4096, and the
// edges): 1.003 ulp for the assembly, 0.959 ulp for Go, on normal results (bound expMaxULP);
// subnormal results are within one subnormal step of e^x.
const expMaxULP = 1.01

const (
	expHi    = 89.0
	expLo    = -105.0
	expLog2e = 1.44269504088896341
	expC1    = 0.693359375
	expC2    = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

// expf32 is the portable exponential (see the package comment above).
func expf32(x float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, expLo), expHi)
	n := float32(math.RoundToEven(float64(float32(x * expLog2e))))
	r := float32(x - float32(n*expC1))
	r = float32(r - float32(n*expC2))
	z := float32(r * r)
	p := float32(float32(expP0*r) + expP1)
	p = float32(float32(p*r) + expP2)
	p = float32(float32(p*r) + expP3)
	p = float32(float32(p*r) + expP4)
	p = float32(float32(p*r) + expP5)
	y := float32(float32(float32(p*z)+r) + 1)
	ni := int32(n)
	n1 := ni >> 1
	n2 := ni - n1
	y = float32(y * math.Float32frombits(uint32(n1+127)<<23))
	return float32(y * math.Float32frombits(uint32(n2+127)<<23))
}

// expShiftGo is the portable expShift.
func expShiftGo(dst, src []float32, shift float32) float32 {
	dst = dst[:len(src)]
	var s float32
	for j, x := range src {
		e := expf32(x - shift)
		dst[j] = e
		s += e
	}
	return s
}

// maxGo is the portable rowMax.
func maxGo(src []float32) float32 {
	m := negInf
	for _, x := range src {
		if x > m {
			m = x
		}
	}
	return m
}

// expImpl is an implementation of expShift (for tests).
type expImpl struct {
	name string
	fn   func(dst, src []float32, shift float32) float32
}

// dsRowGo is the portable dsRow.
func dsRowGo(p, dp []float32, d float32) {
	p = p[:len(dp)]
	for j, x := range p {
		dp[j] = x * (dp[j] - d)
	}
}
