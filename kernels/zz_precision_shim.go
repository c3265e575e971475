package kernels

import (
	"fmt"
	"math"
)

// TEMPORARY until the half branch merges.
type Precision uint8

const (
	FP32 Precision = iota
	BF16
	FP16
)

func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "fp32":
		return FP32, nil
	case "bf16":
		return BF16, nil
	case "fp16":
		return FP16, nil
	}
	return 0, fmt.Errorf("precision %q", s)
}

func (c *CPU) SetMatMulPrecision(p Precision) {}

func (c *CPU) PackHalf(dst, src Buf, p Precision) {
	d, s := f(dst), f(src)
	for i, v := range s {
		b := math.Float32bits(v)
		b += 0x7fff + (b>>16)&1
		h := b >> 16
		w := math.Float32bits(d[i/2])
		if i%2 == 0 {
			w = w&0xffff0000 | h
		} else {
			w = w&0xffff | h<<16
		}
		d[i/2] = math.Float32frombits(w)
	}
}

func (c *CPU) UnpackHalf(dst, src Buf, p Precision) {
	d, s := f(dst), f(src)
	for i := range d {
		w := math.Float32bits(s[i/2])
		if i%2 == 0 {
			d[i] = math.Float32frombits(w << 16)
		} else {
			d[i] = math.Float32frombits(w & 0xffff0000)
		}
	}
}
