//go:build !amd64 || noasm

package kernels

// expShift sets dst[j] = e^(src[j]−shift) (expf32) and returns Σ dst[j], summed in a fixed order.
func expShift(dst, src []float32, shift float32) float32 { return expShiftGo(dst, src, shift) }

// rowMax returns the largest element of src (-Inf when empty); NaNs are ignored.
func rowMax(src []float32) float32 { return maxGo(src) }

// expImpls lists the exponential kernels this build can run (for tests).
func expImpls() []expImpl { return []expImpl{{"go", expShiftGo}} }

// dsRow sets dp[j] = p[j]·(dp[j] − d), the gradient of the scores in the attention backward.
func dsRow(p, dp []float32, d float32) { dsRowGo(p, dp, d) }
