package model

import (
	"fmt"

	"distflash/kernels"
)

// CastStore is the ParamStore of a model that keeps all its fp32 master parameters and
// gradients but computes with a bf16 or fp16 copy of the weights: one buffer holding the
// whole layout as 16-bit values (two per element of a kernels.Buf, kernels.Backend.PackHalf),
// value i being parameter i. The 16-bit step (Model.Precision) reads a unit's part of it as
// it is (HalfParams); the float32 path widens a unit at a time into a scratch buffer (Params).
// Refresh re-makes the copy after the master weights change, unless the optimizer writes it
// itself (Packed).
type CastStore struct {
	be      kernels.Backend
	prec    kernels.Precision
	units   []Unit
	master  kernels.Buf // fp32 parameters, whole layout
	grads   kernels.Buf // fp32 gradients, whole layout
	packed  kernels.Buf // the 16-bit copy, whole layout
	scratch kernels.Buf // one unit, widened
	// Ops, when set, is the per-op profile Refresh's casts are recorded in.
	Ops *kernels.OpProfile
}

// NewCastStore returns a store for the fp32 master params and grads (both the whole layout)
// that computes in prec (kernels.BF16 or kernels.FP16). Every unit of the layout must start on
// an even parameter, so that its 16-bit values start on a packed element: a resolved Config
// gives that (its width is heads × an even head dimension, so every tensor of the embedding
// and the head, and every block, holds an even number of values); it panics otherwise.
func NewCastStore(be kernels.Backend, layout Layout, params, grads kernels.Buf, prec kernels.Precision) *CastStore {
	s := &CastStore{be: be, prec: prec, units: layout.Units(), master: params, grads: grads}
	most := 0
	for i, u := range s.units {
		if u.Off%2 != 0 {
			panic(fmt.Sprintf("model: unit %d starts at the odd parameter %d: not on a packed 16-bit element", i, u.Off))
		}
		most = max(most, u.N)
	}
	s.packed = be.Alloc((layout.Size + 1) / 2)
	s.scratch = be.Alloc(most)
	s.Refresh()
	return s
}

// Refresh rounds the master parameters into the 16-bit compute copy: one pass.
func (s *CastStore) Refresh() {
	s.Ops.Begin(kernels.OpCast, kernels.PhaseStep)
	s.be.PackHalf(s.packed, s.master, s.prec)
	s.Ops.End(kernels.HalfCost(s.master.Len()))
}

// Packed returns the 16-bit copy of the whole layout (parameter i is its value i, packed in
// Precision): what an optimizer that writes the copy as it updates the master weights
// (kernels.Backend.AdamWSegmentsHalf) writes into, in place of Refresh.
func (s *CastStore) Packed() kernels.Buf { return s.packed }

// Precision is the 16-bit precision of the copy.
func (s *CastStore) Precision() kernels.Precision { return s.prec }

// Params widens unit u's 16-bit copy into the scratch buffer.
func (s *CastStore) Params(u int) kernels.Buf {
	buf := s.be.Slice(s.scratch, 0, s.units[u].N)
	s.be.UnpackHalf(buf, s.half(u), s.prec)
	return buf
}

// HalfParams implements HalfStore: unit u's part of the 16-bit copy itself, nothing widened.
func (s *CastStore) HalfParams(u int, p kernels.Precision) kernels.Buf {
	if p != s.prec {
		return nil
	}
	return s.half(u)
}

// half is unit u's part of the 16-bit copy.
func (s *CastStore) half(u int) kernels.Buf {
	unit := s.units[u]
	return s.be.Slice(s.packed, unit.Off/2, (unit.N+1)/2)
}

// Release does nothing: the scratch is reused by the next Params.
func (s *CastStore) Release(int) {}

// Grad returns unit u's part of the fp32 gradient buffer.
func (s *CastStore) Grad(u int) kernels.Buf { return s.be.Slice(s.grads, s.units[u].Off, s.units[u].N) }

// FreshGrad implements FreshGradStore: the gradient accumulates in place, so the model's
// overwriting the unit's part of it is all a fresh gradient takes.
func (s *CastStore) FreshGrad(u int) kernels.Buf { return s.Grad(u) }

// GradDone does nothing: gradients accumulate in place.
func (s *CastStore) GradDone(int) {}

// Bytes is the memory of the 16-bit copy and the scratch.
func (s *CastStore) Bytes() int64 { return 4 * int64(s.packed.Len()+s.scratch.Len()) }
