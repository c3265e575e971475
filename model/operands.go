package parallel

import (
	"fmt"

	"distflash/kernels"
)

// The attention operands of a 16-bit run. Every kernel of a bf16 or fp16 run reads q, k, v,
// O and dO in 16 bits (the CUDA backend's tensor-core kernels and cuDNN; the CPU backend rounds
// to the same values), so a schedule converts them once per call, not once per block or ring
// step, keeps them packed (kernels.Backend.PackHalf: two values a float32 word) across its
// steps, sends them packed — half the bytes of k and v on the ring, of q and dO to a helper,
// of the Ulysses all-to-alls — and tells the kernels so (kernels.AttnShape.Operands). The
// attention state, the statistics (lse, D) and the gradients stay float32, on the wire too:
// the gradients that travel are sums (a ring's accumulator over the blocks it visited, a
// helper's block over its query tiles), and rounding them to 16 bits at every hop would add a
// rounding per step that one rank's attention does not have. In a float32 run nothing changes.

// operands is a schedule's conversion of its operands: the format of this call (the backend's
// matmul precision: FP32, BF16 or FP16) and the buffers the packed copies live in.
type operands struct {
	prec kernels.Precision
	bufs map[string]kernels.Buf
}

// begin takes the format of this call from the backend.
func (o *operands) begin(be kernels.Backend) {
	o.prec = be.MatMulPrecision()
	if o.prec != kernels.BF16 && o.prec != kernels.FP16 {
		o.prec = kernels.FP32
	}
}

// n is the buffer length of v operand values: v, or (v+1)/2 packed.
func (o *operands) n(v int) int {
	if o.prec == kernels.FP32 {
		return v
	}
	return (v + 1) / 2
}

// per is how many operand values a buffer element holds: 1, or 2 packed.
func (o *operands) per() int {
	if o.prec == kernels.FP32 {
		return 1
	}
	return 2
}

// pack returns x (float32) in this call's format: x itself, or its values packed into the
// buffer kept under name.
func (o *operands) pack(be kernels.Backend, name string, x kernels.Buf) kernels.Buf {
	if o.prec == kernels.FP32 || x == nil {
		return x
	}
	b := o.buf(be, name, o.n(x.Len()))
	be.PackHalf(b, x, o.prec)
	return b
}

// buf returns the buffer kept under name, of length n.
func (o *operands) buf(be kernels.Backend, name string, n int) kernels.Buf {
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

// rows is the view of rows [i·c, (i+1)·c) of w values each of an operand buffer.
func (o *operands) rows(be kernels.Backend, b kernels.Buf, i, c, w int) kernels.Buf {
	if (c*w)%o.per() != 0 {
		panic(fmt.Sprintf("parallel: %d rows of %d packed 16-bit values do not end on a word", c, w))
	}
	return be.Slice(b, i*c*w/o.per(), c*w/o.per())
}

// shape marks a block's shape with this call's operand format.
func (o *operands) shape(sh kernels.AttnShape) kernels.AttnShape {
	sh.Operands = o.prec
	return sh
}
