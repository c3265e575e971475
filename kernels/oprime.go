package kernels

import "math"

// The synthetic output O′ of a cuDNN backward block whose real O is not on this rank (the cuDNN
// review's E1, docs/gpu.md "cuDNN's fused attention"). cuDNN's backward graph reads O only to
// compute softmax_sum = rowsum(dO ∘ O), in float32 from the 16-bit operands, which it then uses
// where FlashAttention uses D. The schedules that pass D instead of O (the helper blocks of
// DistFlashAttn and BurstAttention, a backward given D) hand cuDNN an O′ built so that
// rowsum(dO ∘ O′) is D to within the 16-bit unit, and the graph keeps one head dimension for
// Q, K, V and O, as PyTorch's and TransformerEngine's do.
//
// Per row, with x_c the 16-bit dO (rounded to nearest) and D the row's D:
//
//	α = D / Σ_c x_c²                     (float64)
//	O′_c = round16(α·x_c)                for every column but c*, the largest |x_c| (the lowest on ties)
//	O′_c* = round16((D − Σ_{c≠c*} x_c·O′_c) / x_c*)
//
// Every product x_c·O′_c has D's sign (no cancellation) and is exact in float32 (16 × 16 bits
// of significand), so rowsum(dO ∘ O′) = D·(1 + η) with |η| ≤ u·(w* + u), u the 16-bit unit
// (2^-8 for bf16, 2^-11 for fp16, plus 2^-24 for rounding through float32) and w* = x_c*²/Σx²:
// the last column absorbs the rounding of the others. To that cuDNN adds its float32 summation
// (≤ (hd−1)·2^-24 relative, the terms having one sign), and a 16-bit O′_c* in the subnormal range
// rounds to absolute, not relative, steps. By Cauchy–Schwarz |O′_c| ≲ |D|/‖dO‖ ≤ ‖O‖₂ (the
// last column up to a factor 1 + u·hd more): O′ stays within the real O's norm, so in fp16 it
// overflows only where ‖O‖₂ nears 65504. A zero row of dO (or D = 0) gives O′ = 0; a non-finite
// D is written into every column of O′, so a NaN still reaches the gradients.
//
// SyntheticO is the reference of the CUDA kernel df_cudnn_oprime (kernels/cuda/cudnn_aux.cu),
// which computes each row in one warp: lane l takes the columns l, l+32, …, in order, and the
// 32 lane sums are combined by the butterfly of __shfl_xor_sync (offsets 16, 8, 4, 2, 1). It is
// written the same way here, so that the two agree bit for bit.

// oprimeLanes is the warp width df_cudnn_oprime sums over.
const oprimeLanes = 32

// SyntheticO writes one row: dop = round16(do) and op = O′ for D = d, in the 16-bit encoding of
// p (BF16 or FP16). do, dop and op have the head dimension's length.
func SyntheticO(dop, op []uint16, do []float32, d float32, p Precision) {
	mustHalf("SyntheticO", p)
	to16, from16 := halfCodec(p)
	hd := len(do)
	x := make([]float64, hd)
	for c, v := range do {
		dop[c] = to16(v)
		x[c] = float64(from16(dop[c]))
	}
	if math.IsNaN(float64(d)) || math.IsInf(float64(d), 0) {
		for c := range op {
			op[c] = to16(d)
		}
		return
	}
	n2 := warpSum(hd, func(c int) float64 { return x[c] * x[c] })
	if d == 0 || n2 == 0 || math.IsInf(n2, 0) {
		clear(op)
		return
	}
	alpha := float64(d) / n2
	star := 0
	for c := 1; c < hd; c++ {
		if math.Abs(x[c]) > math.Abs(x[star]) {
			star = c
		}
	}
	for c := range op {
		if c != star {
			op[c] = to16(float32(alpha * x[c]))
		}
	}
	s := warpSum(hd, func(c int) float64 {
		if c == star {
			return 0
		}
		return x[c] * float64(from16(op[c]))
	})
	op[star] = to16(float32((float64(d) - s) / x[star]))
}

// warpSum is Σ_c f(c) over c < n as a warp sums it: each lane's columns in order, then the
// xor butterfly of the lane sums.
func warpSum(n int, f func(c int) float64) float64 {
	var lane [oprimeLanes]float64
	for l := range oprimeLanes {
		for c := l; c < n; c += oprimeLanes {
			lane[l] += f(c)
		}
	}
	for off := oprimeLanes / 2; off > 0; off /= 2 {
		var next [oprimeLanes]float64
		for l := range oprimeLanes {
			next[l] = lane[l] + lane[l^off]
		}
		lane = next
	}
	return lane[0]
}

// halfCodec returns the 16-bit encoder (round to nearest even) and decoder of p.
func halfCodec(p Precision) (func(float32) uint16, func(uint16) float32) {
	if p == FP16 {
		return FP16Bits, FP16Value
	}
	return BF16Bits, BF16Value
}
