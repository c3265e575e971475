package kernels

import (
	"fmt"
	"math"
	"unsafe"
)

// Mixed precision: rounding float32 values to bfloat16 and IEEE binary16, their 16-bit
// encodings, and the packed 16-bit buffers that carry compute copies of the weights.
//
// bfloat16 keeps float32's sign and 8-bit exponent and the top 7 bits of the mantissa, so
// rounding is integer arithmetic on the float32 bits. binary16 (fp16) has a 5-bit exponent
// (bias 15) and a 10-bit mantissa: normal values from 2^-14 to 65504, subnormals k·2^-24.
// Every rounding here is to nearest, ties to even, as PyTorch's x.to(torch.bfloat16) and
// x.to(torch.float16) are (kernels/testdata/half holds PyTorch's answers for the tests).

// Precision is a floating-point storage/compute format.
type Precision uint8

// The formats, with their configuration names "fp32", "bf16" and "fp16".
const (
	FP32 Precision = iota // IEEE binary32: what every Buf holds
	BF16                  // bfloat16: 8-bit exponent, 7-bit mantissa
	FP16                  // IEEE binary16: 5-bit exponent, 10-bit mantissa
)

var precisionNames = [...]string{FP32: "fp32", BF16: "bf16", FP16: "fp16"}

// ParsePrecision returns the precision named s ("fp32", "bf16" or "fp16").
func ParsePrecision(s string) (Precision, error) {
	for p, name := range precisionNames {
		if s == name {
			return Precision(p), nil
		}
	}
	return 0, fmt.Errorf("kernels: precision %q: want one of fp32, bf16, fp16", s)
}

// String returns the configuration name of p ("fp32", "bf16", "fp16").
func (p Precision) String() string {
	if int(p) < len(precisionNames) {
		return precisionNames[p]
	}
	return fmt.Sprintf("Precision(%d)", uint8(p))
}

// mustHalf panics unless p is one of the 16-bit formats.
func mustHalf(what string, p Precision) {
	if p != BF16 && p != FP16 {
		panic(fmt.Sprintf("kernels: %s needs bf16 or fp16, got %v", what, p))
	}
}

// RoundBF16 returns the bfloat16 value nearest to x (ties to even). Values beyond the largest
// bfloat16 (about 3.39e38) round to ±Inf like any other carry; ±Inf stay; a NaN stays a NaN,
// made quiet (its sign and top payload bits are kept).
func RoundBF16(x float32) float32 {
	return math.Float32frombits(roundBF16Bits(math.Float32bits(x)))
}

// roundBF16Bits rounds float32 bits u to the bits of the nearest bfloat16 (low half zero).
func roundBF16Bits(u uint32) uint32 {
	if u&0x7fffffff > 0x7f800000 { // NaN: set the quiet bit, which bfloat16 keeps
		return (u | 0x00400000) &^ 0xffff
	}
	// Adding 0x7fff rounds halves down and everything above up; the kept bit (u>>16)&1 turns
	// the exact halves of odd values up. A carry out of the mantissa increments the exponent,
	// which is the right answer (and Inf out of the largest finite value).
	return (u + 0x7fff + (u>>16)&1) &^ 0xffff
}

// BF16Bits returns the bfloat16 encoding of x rounded to nearest, ties to even.
func BF16Bits(x float32) uint16 { return uint16(roundBF16Bits(math.Float32bits(x)) >> 16) }

// BF16Value returns the float32 value of the bfloat16 encoding b (exact).
func BF16Value(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// fp16 limits as float32 bits.
const (
	fp16MinNormal = 0x38800000 // 2^-14
	fp16Overflow  = 0x477ff000 // 65520: the half-way point above 65504 and everything beyond rounds to Inf
)

// RoundFP16 returns the IEEE binary16 value nearest to x (ties to even): |x| ≥ 65520 gives ±Inf,
// values below 2^-14 round to the subnormal grid k·2^-24 (so |x| ≤ 2^-25 gives ±0), the sign of
// zero is kept, and a NaN stays a NaN, made quiet, with the payload bits binary16 can hold.
func RoundFP16(x float32) float32 {
	u := math.Float32bits(x)
	a := u & 0x7fffffff
	switch {
	case a-fp16MinNormal < fp16Overflow-fp16MinNormal: // normal result: drop 13 mantissa bits
		return math.Float32frombits((u + 0xfff + (u>>13)&1) &^ 0x1fff)
	case a < fp16MinNormal:
		// In [0.5, 1) float32 has the spacing 2^-24 of the fp16 subnormals, so adding 0.5
		// rounds |x| (< 2^-14) to that grid, to nearest even, and subtracting it is exact.
		// The conversions keep the compiler from fusing or reordering the two operations.
		r := float32(float32(math.Float32frombits(a)+0.5) - 0.5)
		return math.Float32frombits(math.Float32bits(r) | u&0x80000000)
	case a <= 0x7f800000: // at or beyond 65520, Inf included
		return math.Float32frombits(u&0x80000000 | 0x7f800000)
	}
	return math.Float32frombits((u | 0x00400000) &^ 0x1fff) // NaN
}

// FP16Bits returns the IEEE binary16 encoding of x rounded to nearest, ties to even.
func FP16Bits(x float32) uint16 {
	u := math.Float32bits(RoundFP16(x))
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a >= 0x7f800000: // Inf, NaN (RoundFP16 left only bits binary16 has)
		return sign | 0x7c00 | uint16(a>>13)&0x3ff
	case a >= fp16MinNormal: // rebias the exponent from 127 to 15
		return sign | uint16((a-0x38000000)>>13)
	}
	return sign | uint16(math.Float32frombits(a)*(1<<24)) // subnormal: k·2^-24, k exact
}

// FP16Value returns the float32 value of the IEEE binary16 encoding b (exact).
func FP16Value(b uint16) float32 {
	sign := uint32(b&0x8000) << 16
	exp, mant := uint32(b>>10)&0x1f, uint32(b&0x3ff)
	switch exp {
	case 0: // zero or subnormal: mant·2^-24
		return math.Float32frombits(math.Float32bits(float32(mant)*(1.0/(1<<24))) | sign)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// words views a float32 slice as its bit patterns, so that packed 16-bit pairs (which may
// look like NaNs) are moved without any floating-point operation.
func words(s []float32) []uint32 {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&s[0])), len(s))
}

// roundSlice rounds every element of s to p in place (FP32: unchanged).
func roundSlice(s []float32, p Precision) {
	w := words(s)
	switch p {
	case FP32:
	case BF16:
		for i, u := range w {
			if u&0x7fffffff > 0x7f800000 {
				w[i] = roundBF16Bits(u)
				continue
			}
			w[i] = (u + 0x7fff + (u>>16)&1) &^ 0xffff
		}
	case FP16:
		for i, u := range w {
			if (u&0x7fffffff)-fp16MinNormal < fp16Overflow-fp16MinNormal {
				w[i] = (u + 0xfff + (u>>13)&1) &^ 0x1fff
				continue
			}
			s[i] = RoundFP16(s[i])
		}
	default:
		panic(fmt.Sprintf("kernels: round to unknown %v", p))
	}
}

// bf16Word returns the bfloat16 encoding of the float32 bits u (in the low 16 bits).
func bf16Word(u uint32) uint32 { return roundBF16Bits(u) >> 16 }

// fp16Word returns the binary16 encoding of the float32 bits u (in the low 16 bits), with
// the common case (a normal result) inline.
func fp16Word(u uint32) uint32 {
	a := u & 0x7fffffff
	if a-fp16MinNormal < fp16Overflow-fp16MinNormal {
		return u>>16&0x8000 | ((a+0xfff+(a>>13)&1)-0x38000000)>>13
	}
	return uint32(FP16Bits(math.Float32frombits(u)))
}

// fp16Float returns the float32 bits of the binary16 encoding b (low 16 bits), with the
// common case (a normal value) inline.
func fp16Float(b uint32) uint32 {
	if e := b & 0x7c00; e != 0 && e != 0x7c00 {
		return b&0x8000<<16 | (b&0x7fff)<<13 + 0x38000000
	}
	return math.Float32bits(FP16Value(uint16(b)))
}

// packHalf stores the p encodings of src two per word of dst (element 2i in the low half,
// 2i+1 in the high half; the high half of a last odd element is 0).
func packHalf(dst, src []float32, p Precision) {
	d, s := words(dst), words(src)
	n := len(s) / 2
	switch p {
	case BF16:
		for i := range d[:n] {
			d[i] = bf16Word(s[2*i]) | bf16Word(s[2*i+1])<<16
		}
		if len(s)%2 == 1 {
			d[n] = bf16Word(s[2*n])
		}
	case FP16:
		for i := range d[:n] {
			d[i] = fp16Word(s[2*i]) | fp16Word(s[2*i+1])<<16
		}
		if len(s)%2 == 1 {
			d[n] = fp16Word(s[2*n])
		}
	}
}

// unpackHalf is the inverse of packHalf: len(dst) values from the packed words of src.
func unpackHalf(dst, src []float32, p Precision) {
	d, s := words(dst), words(src)
	n := len(d) / 2
	switch p {
	case BF16:
		for i, w := range s[:n] {
			d[2*i], d[2*i+1] = w<<16, w&0xffff0000
		}
		if len(d)%2 == 1 {
			d[2*n] = s[n] << 16
		}
	case FP16:
		for i, w := range s[:n] {
			d[2*i], d[2*i+1] = fp16Float(w&0xffff), fp16Float(w>>16)
		}
		if len(d)%2 == 1 {
			d[2*n] = fp16Float(s[n] & 0xffff)
		}
	}
}
