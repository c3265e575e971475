package model

import "distflash/kernels"

// CastStore is the ParamStore of a model that keeps all its fp32 master parameters and
// gradients but computes with a bf16 or fp16 copy of the weights, stored as 16-bit values
// (two per element of a kernels.Buf, kernels.Backend.PackHalf) and widened one unit at a time
// into a scratch buffer. Refresh re-makes the copy after the master weights change.
type CastStore struct {
	be      kernels.Backend
	prec    kernels.Precision
	units   []Unit
	master  kernels.Buf   // fp32 parameters, whole layout
	grads   kernels.Buf   // fp32 gradients, whole layout
	packed  []kernels.Buf // per unit: the 16-bit copy
	scratch kernels.Buf   // one unit, widened
	// Ops, when set, is the per-op profile Refresh's casts are recorded in.
	Ops *kernels.OpProfile
}

// NewCastStore returns a store for the fp32 master params and grads (both the whole layout)
// that computes in prec (kernels.BF16 or kernels.FP16).
func NewCastStore(be kernels.Backend, layout Layout, params, grads kernels.Buf, prec kernels.Precision) *CastStore {
	s := &CastStore{be: be, prec: prec, units: layout.Units(), master: params, grads: grads}
	most := 0
	for _, u := range s.units {
		s.packed = append(s.packed, be.Alloc((u.N+1)/2))
		most = max(most, u.N)
	}
	s.scratch = be.Alloc(most)
	s.Refresh()
	return s
}

// Refresh rounds the master parameters into the 16-bit compute copy.
func (s *CastStore) Refresh() {
	for i, u := range s.units {
		s.Ops.Begin(kernels.OpCast, kernels.PhaseStep)
		s.be.PackHalf(s.packed[i], s.be.Slice(s.master, u.Off, u.N), s.prec)
		s.Ops.End(kernels.HalfCost(u.N))
	}
}

// Params widens unit u's 16-bit copy into the scratch buffer.
func (s *CastStore) Params(u int) kernels.Buf {
	buf := s.be.Slice(s.scratch, 0, s.units[u].N)
	s.be.UnpackHalf(buf, s.packed[u], s.prec)
	return buf
}

// Release does nothing: the scratch is reused by the next Params.
func (s *CastStore) Release(int) {}

// Grad returns unit u's part of the fp32 gradient buffer.
func (s *CastStore) Grad(u int) kernels.Buf { return s.be.Slice(s.grads, s.units[u].Off, s.units[u].N) }

// GradDone does nothing: gradients accumulate in place.
func (s *CastStore) GradDone(int) {}

// Bytes is the memory of the 16-bit copy and the scratch.
func (s *CastStore) Bytes() int64 {
	var n int64
	for _, p := range s.packed {
		n += int64(p.Len()) * 4
	}
	return n + int64(s.scratch.Len())*4
}
