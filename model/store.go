package model

import (
	"fmt"

	"distflash/kernels"
)

// Unit is one piece of the parameters that FSDP gathers and frees as a whole
// (papers/parallelism-overview.txt, ZeRO-3 / FSDP): unit 0 is the embedding, unit 1+l is block
// l, the last unit is the final norm and the output head. A unit is a contiguous range of the
// flat Layout and holds whole tensors, [First, First+Count) in Layout.Tensors.
type Unit struct {
	Off, N       int // elements [Off, Off+N) of the flat buffer
	First, Count int // tensors of the unit
}

// Units cuts the layout into FSDP units. The layout must be one made by NewLayout.
func (l Layout) Units() []Unit {
	nLayers := (len(l.Tensors) - 3) / 9
	units := []Unit{{First: 0, Count: 1}}
	for i := 0; i < nLayers; i++ {
		units = append(units, Unit{First: 1 + 9*i, Count: 9})
	}
	units = append(units, Unit{First: 1 + 9*nLayers, Count: 2})
	for i := range units {
		u := &units[i]
		first, last := l.Tensors[u.First], l.Tensors[u.First+u.Count-1]
		u.Off, u.N = first.Off, last.Off+last.Size()-first.Off
	}
	return units
}

// ParamStore lends a model its parameters one unit at a time, which is how a model runs
// when no rank holds all of them (FSDP) or when the computation reads a low-precision copy
// of fp32 master weights. The model calls, per unit and pass, Params … Release, and in the
// backward Grad … GradDone around the unit's gradient computation. Between Params(u) and
// Release(u) the buffer holds the unit's parameters in Layout order (elements Unit.Off … of
// the flat buffer, N of them); between Grad(u) and GradDone(u) the unit's gradient is added
// into the buffer Grad returns.
type ParamStore interface {
	// Params returns unit u's parameters, ready to compute with.
	Params(u int) kernels.Buf
	// Release ends the model's use of unit u's parameters until the next Params(u).
	Release(u int)
	// Grad returns the buffer unit u's gradient of this micro-batch is to be added into.
	Grad(u int) kernels.Buf
	// GradDone says unit u's gradient of this micro-batch is complete.
	GradDone(u int)
}

// HalfStore is a ParamStore that can lend a unit's weights as 16-bit values, which the 16-bit
// step (Model.Precision) computes with directly: no widening to float32 and no rounding again.
type HalfStore interface {
	ParamStore
	// HalfParams is Params with the weights packed in p (kernels.Backend.PackHalf's layout:
	// unit u's Unit.N values in Layout order, (N+1)/2 buffer elements), valid until
	// Release(u) as Params' buffer is; nil when the store does not hold them in p, and the
	// model then calls Params and packs the float32 weights itself.
	HalfParams(u int, p kernels.Precision) kernels.Buf
}

// FreshGradStore is a ParamStore that can take a micro-batch's gradient as the only one of
// a step (Model.FreshGrads): a model with FreshGrads set calls FreshGrad in place of Grad,
// for every unit.
type FreshGradStore interface {
	ParamStore
	// FreshGrad is Grad for a micro-batch whose gradient is to replace, not add to, what the
	// store holds: the model overwrites every element of the buffer it returns (its contents
	// do not matter), and after GradDone(u) the store's gradient of unit u is this
	// micro-batch's alone.
	FreshGrad(u int) kernels.Buf
}

// views cuts a unit's buffer into its tensors.
func (m *Model) views(u int, buf kernels.Buf) []kernels.Buf {
	unit := m.units[u]
	if buf.Len() != unit.N {
		panic(fmt.Sprintf("model: unit %d buffer of %d elements, want %d", u, buf.Len(), unit.N))
	}
	v := make([]kernels.Buf, unit.Count)
	for i := range v {
		t := m.Layout.Tensors[unit.First+i]
		v[i] = m.be.Slice(buf, t.Off-unit.Off, t.Size())
	}
	return v
}

// layerWeights names the nine tensors of a block.
func layerWeights(v []kernels.Buf) LayerWeights {
	return LayerWeights{AttnNorm: v[0], Wq: v[1], Wk: v[2], Wv: v[3], Wo: v[4],
		FFNNorm: v[5], Gate: v[6], Up: v[7], Down: v[8]}
}

// acquire returns the tensors of unit u's parameters.
func (m *Model) acquire(u int) []kernels.Buf {
	if m.Store == nil {
		return m.views(u, m.be.Slice(m.Params.Flat, m.units[u].Off, m.units[u].N))
	}
	class := m.storeClass()
	m.Ops.Begin(class, m.phase)
	buf := m.Store.Params(u)
	cost := kernels.OpCost{Bytes: 4 * int64(m.units[u].N)} // what is gathered
	if class == kernels.OpCast {
		cost = kernels.HalfCost(m.units[u].N)
	}
	m.Ops.End(cost)
	return m.views(u, buf)
}

// release ends the use of unit u's parameters.
func (m *Model) release(u int) {
	if m.Store != nil {
		m.Store.Release(u)
	}
}

// gradOf returns the tensors unit u's gradient is added into (in a FreshGrads step: written
// into, the first contribution overwriting).
func (m *Model) gradOf(u int) []kernels.Buf { return m.views(u, m.gradUnit(u)) }

// gradUnit returns the buffer unit u's gradient goes into: the unit's part of Grads, or the
// store's Grad, or in a FreshGrads step its FreshGrad.
func (m *Model) gradUnit(u int) kernels.Buf {
	switch {
	case m.Store == nil:
		return m.be.Slice(m.Grads.Flat, m.units[u].Off, m.units[u].N)
	case !m.fresh:
		return m.Store.Grad(u)
	}
	fs, ok := m.Store.(FreshGradStore)
	if !ok {
		panic(fmt.Sprintf("model: FreshGrads with a store (%T) that cannot take a fresh gradient", m.Store))
	}
	return fs.FreshGrad(u)
}

// gradDone says unit u's gradient is complete (FSDP reduce-scatters it; a CastStore has
// nothing to do).
func (m *Model) gradDone(u int) {
	if m.Store == nil {
		return
	}
	if m.storeClass() == kernels.OpCast {
		m.Store.GradDone(u)
		return
	}
	m.Ops.Begin(kernels.OpComm, m.phase)
	m.Store.GradDone(u)
	m.Ops.End(kernels.OpCost{Bytes: 4 * int64(m.units[u].N)})
}
