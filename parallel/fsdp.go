package parallel

import (
	"fmt"
	"sync"

	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
	"distflash/parallel/transport"
)

// FSDP shards a model's parameters, gradients and optimizer state over the ranks of a group,
// ZeRO-3 style (papers/parallelism-overview.txt, "Fully Sharded Data Parallel"; used with
// DistFlashAttn over the same ranks, papers/distflashattn.txt §4.1). It is the model's
// ParamStore: each unit (model.Layout.Units: the embedding, each block, the final norm and
// head) is padded to a multiple of 2·P elements and rank r owns the r-th of its P equal
// chunks. Before a unit computes, its chunks are all-gathered into a full buffer, which is
// given back when the unit is done; after the unit's backward its full gradient is
// reduce-scattered, so each rank keeps the summed gradient of its own chunk only.
//
// Master and MasterGrads hold the rank's chunks of every unit one after the other (fp32 master
// weights and their gradients); an optimizer updates them directly. With a low-precision
// compute type the chunks are rounded to bf16 or fp16 and sent as 16-bit values, so a gather
// moves half the bytes, and the model computes with the rounded weights.
//
// A model computing in the same 16-bit precision (model.Model.Precision) takes the gathered
// 16-bit values as they arrived (HalfParams, model.HalfStore), without widening them; Params
// widens them for a float32 computation.
//
// With model.Model.FreshGrads the model takes a unit's gradient by FreshGrad, and GradDone
// then sets the rank's gradient chunk to the reduce-scattered gradient instead of adding it,
// so the caller need not zero the gradients (ZeroGrads) before the step's first micro-batch.
//
// Prefetch: while a unit computes, the next unit's all-gather already runs (on a separate
// communicator split off for the purpose, from a second goroutine), so its transfer hides
// behind compute. The store predicts the next unit from the order a model asks for them
// (forward 0…L+1, backward L+1…1), and never across the end of a backward, where the
// optimizer changes the weights; a wrong guess costs a wasted gather, never a wrong value.
type FSDP struct {
	comm   transport.Comm // gathers and reduce-scatters, in call order
	pcomm  transport.Comm // prefetch gathers, from the prefetch goroutine
	be     kernels.Backend
	prec   kernels.Precision
	units  []model.Unit
	chunk  []int // elements per rank of each unit (padded, even)
	offset []int // where each unit's chunk starts in Params and Grads

	// Master and MasterGrads are this rank's fp32 chunks of every unit.
	Master, MasterGrads kernels.Buf

	slots    [2]kernels.Buf // gathered units (the one computing and the one prefetched)
	slotUnit [2]int         // unit held by each slot, -1 for none
	inUse    [2]bool
	packSend [2]kernels.Buf // per slot: this rank's chunk as 16-bit values (low precision)
	packRecv [2]kernels.Buf // per slot: every rank's chunk as 16-bit values
	gradFull kernels.Buf    // one unit's full (padded) gradient
	gradPart kernels.Buf    // the reduce-scattered chunk of it
	fresh    []bool         // per unit: its gradient was taken by FreshGrad, not yet done

	prefetch *prefetch // the gather in flight, if any
	order    []int     // the unit sequence of one forward-backward
	cursor   int       // position in order of the last Params call

	mem  Memory
	live int // gathered slots in use or in flight now
}

// prefetch is an all-gather running on the prefetch goroutine.
type prefetch struct {
	unit, slot int
	done       sync.WaitGroup
	failed     any // what the gather panicked with (a failed collective), raised again by Params
}

// FSDPOptions configure a store.
type FSDPOptions struct {
	Precision kernels.Precision // compute type of the gathered weights (FP32, BF16, FP16)
	Prefetch  bool              // gather the next unit while the current one computes
}

// Memory is what a rank holds for the model, in bytes, as FSDP counts it.
type Memory struct {
	MasterParams  int64 // fp32 master chunks
	Grads         int64 // fp32 gradient chunks
	GatheredPeak  int64 // most bytes of gathered units held at once (in use or in flight)
	GradBuffers   int64 // the full-unit gradient and reduce-scatter buffers
	PackedBuffers int64 // 16-bit send/receive buffers (low precision only)
}

// NewFSDP shards layout over comm. The prefetch communicator is split off comm here, so every
// rank of comm must call NewFSDP at the same point.
func NewFSDP(comm transport.Comm, be kernels.Backend, layout model.Layout, opt FSDPOptions) *FSDP {
	P := comm.Size()
	f := &FSDP{comm: comm, be: be, prec: opt.Precision, units: layout.Units(), slotUnit: [2]int{-1, -1}}
	f.fresh = make([]bool, len(f.units))
	if opt.Prefetch && P > 1 {
		f.pcomm = comm.Split(0, comm.Rank(), "fsdp.prefetch")
	}
	total, most := 0, 0
	for _, u := range f.units {
		c := (u.N + 2*P - 1) / (2 * P) * 2
		f.chunk = append(f.chunk, c)
		f.offset = append(f.offset, total)
		total += c
		most = max(most, c)
	}
	f.Master, f.MasterGrads = be.Alloc(total), be.Alloc(total)
	for i := range f.slots {
		f.slots[i] = be.Alloc(P * most)
	}
	f.gradFull, f.gradPart = be.Alloc(P*most), be.Alloc(most)
	f.mem = Memory{MasterParams: 4 * int64(total), Grads: 4 * int64(total), GradBuffers: 4 * int64(P*most+most)}
	if f.prec != kernels.FP32 {
		for i := range f.slots {
			f.packSend[i], f.packRecv[i] = be.Alloc(most/2), be.Alloc(P*most/2)
		}
		f.mem.PackedBuffers = 4 * int64(most+P*most)
	}
	L := len(f.units) - 2
	for u := 0; u <= L+1; u++ {
		f.order = append(f.order, u)
	}
	for u := L + 1; u >= 1; u-- {
		f.order = append(f.order, u)
	}
	f.cursor = len(f.order) - 1
	return f
}

// Range is one run of elements a rank owns: global elements [Off, Off+N) of the flat layout
// are elements [Local, Local+N) of the rank's Master (and MasterGrads).
type Range struct {
	Off, Local, N int
}

// Owned lists the real (not padding) elements this rank owns, in order.
func (f *FSDP) Owned() []Range {
	var out []Range
	r := f.comm.Rank()
	for i, u := range f.units {
		lo := r * f.chunk[i]
		n := min(f.chunk[i], u.N-lo)
		if n > 0 {
			out = append(out, Range{Off: u.Off + lo, Local: f.offset[i], N: n})
		}
	}
	return out
}

// Load sets this rank's chunks from the whole flat parameter vector.
func (f *FSDP) Load(full []float32) {
	host := make([]float32, f.Master.Len())
	for _, r := range f.Owned() {
		copy(host[r.Local:r.Local+r.N], full[r.Off:r.Off+r.N])
	}
	f.be.Upload(f.Master, host)
}

// LoadEach loads this rank's chunks from a generator of the full parameter vector in Layout
// order, which each calls with visit for every block (its offset and values, as
// model.InitParamsEach does), keeping only what this rank owns: the rank never holds the
// whole model.
func (f *FSDP) LoadEach(each func(visit func(off int, vals []float32))) {
	host, direct := []float32(nil), kernels.IsHost(f.Master)
	if direct { // the CPU backend: straight into the chunks, no second copy of them
		host = kernels.Host(f.Master)
	} else {
		host = make([]float32, f.Master.Len())
	}
	owned := f.Owned()
	each(func(off int, vals []float32) {
		end := off + len(vals)
		for _, r := range owned {
			lo, hi := max(off, r.Off), min(end, r.Off+r.N)
			if lo < hi {
				copy(host[r.Local+lo-r.Off:r.Local+hi-r.Off], vals[lo-off:hi-off])
			}
		}
	})
	if !direct {
		f.be.Upload(f.Master, host)
	}
}

// ZeroGrads clears the gradient chunks.
func (f *FSDP) ZeroGrads() { f.be.Zero(f.MasterGrads) }

// Memory reports the bytes this rank holds for the model.
func (f *FSDP) Memory() Memory { return f.mem }

// Segments returns the runs of Master that share a weight-decay setting (padding is put in
// a run without decay), for an optimizer over the chunks.
func (f *FSDP) Segments(layout model.Layout) []optim.Segment {
	var segs []optim.Segment
	add := func(off, n int, decay bool) {
		if k := len(segs); k > 0 && segs[k-1].Decay == decay && segs[k-1].Off+segs[k-1].N == off {
			segs[k-1].N += n
			return
		}
		segs = append(segs, optim.Segment{Off: off, N: n, Decay: decay})
	}
	r := f.comm.Rank()
	for i, u := range f.units {
		lo, hi := u.Off+r*f.chunk[i], u.Off+(r+1)*f.chunk[i] // global, may pass the unit's end
		for _, t := range layout.Tensors[u.First : u.First+u.Count] {
			a, b := max(lo, t.Off), min(hi, t.Off+t.Size())
			if a < b {
				add(f.offset[i]+a-lo, b-a, t.Decay)
			}
		}
		if end := u.Off + u.N; hi > end {
			pad := hi - max(lo, end)
			add(f.offset[i]+f.chunk[i]-pad, pad, false)
		}
	}
	return segs
}

// gather all-gathers unit u into slot on comm c: the float32 chunks into the slot, or in
// low precision the 16-bit chunks into the slot's receive buffer (Params widens them).
func (f *FSDP) gather(c transport.Comm, u, slot int) {
	P, n := f.comm.Size(), f.chunk[u]
	mine := f.be.Slice(f.Master, f.offset[u], n)
	if f.prec == kernels.FP32 {
		c.AllGather(f.be.Slice(f.slots[slot], 0, P*n), mine, "fsdp.gather")
		return
	}
	// Each slot has its own 16-bit buffers: the prefetch goroutine gathers into the other slot.
	send := f.be.Slice(f.packSend[slot], 0, n/2)
	f.be.PackHalf(send, mine, f.prec)
	c.AllGather(f.be.Slice(f.packRecv[slot], 0, P*n/2), send, "fsdp.gather")
}

// Params implements model.ParamStore: it returns unit u gathered (in low precision, its
// 16-bit values widened), from the prefetch if that guessed right, and starts gathering the
// unit expected next.
func (f *FSDP) Params(u int) kernels.Buf {
	if f.comm.Size() == 1 && f.prec == kernels.FP32 {
		return f.be.Slice(f.Master, f.offset[u], f.units[u].N)
	}
	slot := f.acquire(u)
	if f.prec != kernels.FP32 {
		n := f.comm.Size() * f.chunk[u]
		f.be.UnpackHalf(f.be.Slice(f.slots[slot], 0, n), f.be.Slice(f.packRecv[slot], 0, n/2), f.prec)
	}
	return f.be.Slice(f.slots[slot], 0, f.units[u].N)
}

// HalfParams implements model.HalfStore: in low precision, unit u's gathered 16-bit values
// as they arrived (each rank's chunk is even, so the chunks' packed words line up into the
// unit's); nil when p is not the precision the store gathers in.
func (f *FSDP) HalfParams(u int, p kernels.Precision) kernels.Buf {
	if f.prec == kernels.FP32 || p != f.prec {
		return nil
	}
	slot := f.acquire(u)
	return f.be.Slice(f.packRecv[slot], 0, (f.units[u].N+1)/2)
}

// acquire returns the slot holding unit u gathered, from the prefetch if that guessed right,
// and starts gathering the unit expected next.
func (f *FSDP) acquire(u int) int {
	slot := -1
	if p := f.prefetch; p != nil {
		p.done.Wait()
		f.prefetch = nil
		if p.failed != nil {
			panic(p.failed) // on the rank's own goroutine, where transport.Recover can see it
		}
		if p.unit == u {
			slot = p.slot
		} else {
			f.slotUnit[p.slot] = -1
			f.setLive(-1)
		}
	}
	if slot < 0 {
		slot = f.freeSlot()
		f.setLive(1)
		f.gather(f.comm, u, slot)
		f.slotUnit[slot] = u
	}
	f.inUse[slot] = true
	f.advance(u)
	// No prefetch past the end of a backward: the optimizer changes the weights before the
	// next forward asks for them.
	if f.pcomm != nil && f.cursor+1 < len(f.order) {
		next := f.order[f.cursor+1]
		if next != u {
			ps := 1 - slot
			if !f.inUse[ps] {
				p := &prefetch{unit: next, slot: ps}
				f.slotUnit[ps] = next
				f.setLive(1)
				p.done.Add(1)
				f.prefetch = p
				go func() {
					defer p.done.Done()
					defer func() { p.failed = recover() }()
					f.gather(f.pcomm, next, ps)
				}()
			}
		}
	}
	return slot
}

// advance moves the cursor to u's next place in the expected order.
func (f *FSDP) advance(u int) {
	for i := 1; i <= len(f.order); i++ {
		c := (f.cursor + i) % len(f.order)
		if f.order[c] == u {
			f.cursor = c
			return
		}
	}
}

// freeSlot returns a slot not in use; a model holds at most one unit at a time.
func (f *FSDP) freeSlot() int {
	for i, busy := range f.inUse {
		if !busy {
			return i
		}
	}
	panic("parallel: FSDP: the model holds two units at once")
}

// setLive tracks how many gathered units are held, for the peak.
func (f *FSDP) setLive(d int) {
	f.live += d
	if b := int64(f.live) * 4 * int64(f.slots[0].Len()); b > f.mem.GatheredPeak {
		f.mem.GatheredPeak = b
	}
}

// Release implements model.ParamStore: unit u's gathered weights are given back.
func (f *FSDP) Release(u int) {
	if f.comm.Size() == 1 && f.prec == kernels.FP32 {
		return
	}
	for i := range f.slots {
		if f.inUse[i] && f.slotUnit[i] == u {
			f.inUse[i] = false
			f.slotUnit[i] = -1
			f.setLive(-1)
			return
		}
	}
	panic(fmt.Sprintf("parallel: FSDP: release of unit %d, which is not held", u))
}

// Grad implements model.ParamStore: a zeroed full-unit gradient buffer.
func (f *FSDP) Grad(u int) kernels.Buf {
	if f.comm.Size() == 1 {
		return f.be.Slice(f.MasterGrads, f.offset[u], f.units[u].N)
	}
	full := f.be.Slice(f.gradFull, 0, f.comm.Size()*f.chunk[u])
	f.be.Zero(full)
	return f.be.Slice(full, 0, f.units[u].N)
}

// FreshGrad implements model.FreshGradStore: on one rank the unit's gradient chunk itself,
// which the model overwrites; on several the full-unit buffer, its padding zeroed (the model
// writes the rest), whose reduce-scattered chunk GradDone then copies into this rank's
// gradient chunk rather than adding it.
func (f *FSDP) FreshGrad(u int) kernels.Buf {
	if f.comm.Size() == 1 {
		return f.be.Slice(f.MasterGrads, f.offset[u], f.units[u].N)
	}
	N, full := f.units[u].N, f.comm.Size()*f.chunk[u]
	if full > N {
		f.be.Zero(f.be.Slice(f.gradFull, N, full-N))
	}
	f.fresh[u] = true
	return f.be.Slice(f.gradFull, 0, N)
}

// GradDone implements model.ParamStore: the unit's gradient is reduce-scattered and added
// into this rank's gradient chunk (copied into it, after FreshGrad).
func (f *FSDP) GradDone(u int) {
	if f.comm.Size() == 1 {
		return
	}
	n := f.chunk[u]
	part := f.be.Slice(f.gradPart, 0, n)
	f.comm.ReduceScatter(part, f.be.Slice(f.gradFull, 0, f.comm.Size()*n), "fsdp.reduce_scatter")
	mine := f.be.Slice(f.MasterGrads, f.offset[u], n)
	if f.fresh[u] {
		f.fresh[u] = false
		f.be.Copy(mine, part)
		return
	}
	f.be.Add(mine, mine, part)
}

// FullParams returns the whole fp32 parameter vector in Layout order, from every rank's
// master chunks. It is collective: every rank of the group must call it.
func (f *FSDP) FullParams() []float32 {
	P, total := f.comm.Size(), f.Master.Len()
	all := f.be.Alloc(P * total)
	f.comm.AllGather(all, f.Master, "fsdp.full_params")
	host := make([]float32, P*total)
	f.be.Download(host, all)
	last := f.units[len(f.units)-1]
	out := make([]float32, last.Off+last.N)
	for i, u := range f.units {
		for r := 0; r < P; r++ {
			lo := r * f.chunk[i]
			if n := min(f.chunk[i], u.N-lo); n > 0 {
				copy(out[u.Off+lo:u.Off+lo+n], host[r*total+f.offset[i]:])
			}
		}
	}
	return out
}
