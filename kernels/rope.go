package kernels

import (
	"fmt"
	"math"
)

// RoPETable is a rotary position embedding as Backend.RoPE applies it: the pair (x_i,
// x_{i+headDim/2}) of every head turns by the angle pos·InvFreq[i], and the cosine and sine
// of that angle are multiplied by Scale. Hugging Face's RoPE variants (default, linear,
// dynamic NTK, YaRN, LLaMA 3) differ only in this table; package model builds it from the
// [model] config. Scale is YaRN's attention factor and 1 for the others.
type RoPETable struct {
	InvFreq []float64 // headDim/2 inverse frequencies, radians per position
	Scale   float64   // multiplies cos and sin
}

// DefaultRoPE is the rotary embedding of LLaMA with base theta: InvFreq[i] =
// theta^(−2i/headDim), Scale 1.
func DefaultRoPE(theta float64, headDim int) RoPETable {
	inv := make([]float64, headDim/2)
	for i := range inv {
		inv[i] = math.Pow(theta, -float64(2*i)/float64(headDim))
	}
	return RoPETable{InvFreq: inv, Scale: 1}
}

// check panics unless t fits heads of headDim features.
func (t RoPETable) check(headDim int) {
	if len(t.InvFreq) != headDim/2 {
		panic(fmt.Sprintf("kernels: rope table of %d frequencies for head_dim %d", len(t.InvFreq), headDim))
	}
}
