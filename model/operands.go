package model

import (
	"fmt"

	"distflash/kernels"
)

// The attention operands of a 16-bit run. Every kernel of a bf16 or fp16 run reads q, k, v,
// O and dO in 16 bits (the CUDA backend's tensor-core kernels and cuDNN; the CPU backend rounds
// to the same values), so an Attention (LocalAttention, and the schedules of package parallel)
// converts them once per call, not once per block or ring step, keeps them packed
// (kernels.Backend.PackHalf: two values a float32 word) across its steps, sends them packed —
// half the bytes of k and v on the ring, of q and dO to a helper, of the Ulysses all-to-alls —
// and tells the kernels so (kernels.AttnShape.Operands). The attention state, the statistics
// (lse, D) and the gradients stay float32, on the wire too: the gradients that travel are sums
// (a ring's accumulator over the blocks it visited, a helper's block over its query tiles), and
// rounding them to 16 bits at every hop would add a rounding per step that one rank's attention
// does not have. In a float32 run nothing changes.

// Operands is an Attention's conversion of its operands: the format of this call (the
// backend's matmul precision: FP32, BF16 or FP16) and the buffers the packed copies live in.
// The zero value is ready; Begin sets the format at the start of each call.
type Operands struct {
	prec kernels.Precision
	bufs map[string]kernels.Buf
}

// Begin takes the format of this call from the backend.
func (o *Operands) Begin(be kernels.Backend) {
	o.prec = be.MatMulPrecision()
	if o.prec != kernels.BF16 && o.prec != kernels.FP16 {
		o.prec = kernels.FP32
	}
}

// Precision is this call's format: FP32, or the run's 16-bit format.
func (o *Operands) Precision() kernels.Precision { return o.prec }

// Len is the buffer length of v operand values: v, or (v+1)/2 packed.
func (o *Operands) Len(v int) int { return o.Shape(kernels.AttnShape{}).OperandLen(v) }

// Per is how many operand values a buffer element holds: 1, or 2 packed.
func (o *Operands) Per() int {
	if o.prec == kernels.FP32 {
		return 1
	}
	return 2
}

// Pack returns x (float32) in this call's format: x itself, or its values packed into the
// buffer kept under name.
func (o *Operands) Pack(be kernels.Backend, name string, x kernels.Buf) kernels.Buf {
	if o.prec == kernels.FP32 || x == nil {
		return x
	}
	b := o.buf(be, name, o.Len(x.Len()))
	be.PackHalf(b, x, o.prec)
	return b
}

// buf returns the buffer kept under name, of length n.
func (o *Operands) buf(be kernels.Backend, name string, n int) kernels.Buf {
	if o.bufs == nil {
		o.bufs = map[string]kernels.Buf{}
	}
	if b, ok := o.bufs[name]; ok && b.Len() == n {
		return b
	}
	b := be.Alloc(n)
	o.bufs[name] = b
	return b
}

// Rows is the view of rows [i·c, (i+1)·c) of w values each of an operand buffer.
func (o *Operands) Rows(be kernels.Backend, b kernels.Buf, i, c, w int) kernels.Buf {
	if (c*w)%o.Per() != 0 {
		panic(fmt.Sprintf("model: %d rows of %d packed 16-bit values do not end on a word", c, w))
	}
	return be.Slice(b, i*c*w/o.Per(), c*w/o.Per())
}

// Shape marks a block's shape with this call's operand format.
func (o *Operands) Shape(sh kernels.AttnShape) kernels.AttnShape {
	sh.Operands = o.prec
	return sh
}
