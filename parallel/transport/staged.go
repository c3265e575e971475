package transport

import (
	"sync"

	"distflash/kernels"
)

// Stager copies between a backend's buffers and host memory: the Upload and Download of a
// kernels.Backend.
type Stager interface {
	Upload(dst kernels.Buf, src []float32)
	Download(dst []float32, src kernels.Buf)
}

// Staged returns a communicator that accepts the buffers of a backend whose memory is not host
// memory (the CUDA backend's) and moves them through c, whose calls read and write host memory
// (the in-process and MPI communicators): a source is downloaded into a host copy before c
// sends it, a destination is uploaded from the host copy c wrote. Host buffers pass through
// untouched, so the staged and the direct path move the same bytes and count the same
// traffic. A send's host copy is taken when the call is made, so the device buffer may change
// before Wait; a receive lands in the device buffer when Wait returns. The host copies come
// from a pool that the communicator and its Splits share: a copy is reused once its call is
// done (a send's or receive's at Wait), so a step allocates its staging memory once. With a
// Stager that allocates host memory itself (a GPU's page-locked memory: HostAllocator), the
// pool takes its buffers from it.
func Staged(c Comm, s Stager) Comm { return &stagedComm{inner: c, st: s, pool: &hostPool{st: s}} }

// HostAllocator is a Stager that provides the host memory copies go through (page-locked
// memory, which a GPU copies to and from at full speed and asynchronously).
type HostAllocator interface {
	AllocHost(n int) []float32
}

// hostPool keeps host buffers by length for reuse.
type hostPool struct {
	st     Stager
	mu     sync.Mutex
	free   map[int][][]float32
	allocs int // buffers made (tests: a pool that reuses makes a step's worth once)
}

// get returns a host buffer of n elements, reused when one is free.
func (p *hostPool) get(n int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[n]; len(l) > 0 {
		x := l[len(l)-1]
		p.free[n] = l[:len(l)-1]
		return x
	}
	p.allocs++
	if a, ok := p.st.(HostAllocator); ok {
		return a.AllocHost(n)
	}
	return make([]float32, n)
}

// put returns x to the pool.
func (p *hostPool) put(x []float32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == nil {
		p.free = map[int][][]float32{}
	}
	p.free[len(x)] = append(p.free[len(x)], x)
}

type stagedComm struct {
	inner Comm
	st    Stager
	pool  *hostPool
}

// down returns b as host memory: b itself when it is host memory, else a pooled host buffer
// holding b's values (with load false, zeros, for c to overwrite), and the function that
// returns that buffer to the pool.
func (c *stagedComm) down(b kernels.Buf, load bool) (kernels.Buf, func()) {
	if kernels.IsHost(b) {
		return b, func() {}
	}
	h := c.pool.get(b.Len())
	if load {
		c.st.Download(h, b)
	} else {
		clear(h)
	}
	return kernels.HostBuf(h), func() { c.pool.put(h) }
}

// up copies the host buffer h back into b when b is not host memory (h is then b's copy).
func (c *stagedComm) up(b, h kernels.Buf) {
	if !kernels.IsHost(b) {
		c.st.Upload(b, kernels.Host(h))
	}
}

func (c *stagedComm) Rank() int        { return c.inner.Rank() }
func (c *stagedComm) Size() int        { return c.inner.Size() }
func (c *stagedComm) Barrier()         { c.inner.Barrier() }
func (c *stagedComm) Traffic() Traffic { return c.inner.Traffic() }
func (c *stagedComm) Split(color, key int, site string) Comm {
	return &stagedComm{inner: c.inner.Split(color, key, site), st: c.st, pool: c.pool}
}

// Isend implements Comm.
func (c *stagedComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	h, release := c.down(buf, true)
	req := c.inner.Isend(h, dst, tag, site)
	if kernels.IsHost(buf) {
		return req
	}
	return &stagedReq{req: req, after: release}
}

// Irecv implements Comm.
func (c *stagedComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	h, release := c.down(buf, false)
	req := c.inner.Irecv(h, src, tag, site)
	if kernels.IsHost(buf) {
		return req
	}
	return &stagedReq{req: req, after: func() { c.up(buf, h); release() }}
}

// stagedReq finishes a staged call once it is done: a receive's upload into the device
// buffer, and the host copy's return to the pool.
type stagedReq struct {
	req   Request
	after func()
	done  bool
}

func (r *stagedReq) Wait() {
	r.req.Wait()
	if !r.done {
		r.done = true
		r.after()
	}
}

// through runs op, a collective from src into dst, on host copies of them: src's copied
// down, dst's copied back up after it.
func (c *stagedComm) through(dst, src kernels.Buf, op func(h, s kernels.Buf)) {
	h, rh := c.down(dst, false)
	s, rs := c.down(src, true)
	op(h, s)
	c.up(dst, h)
	rh()
	rs()
}

// AllGather implements Comm.
func (c *stagedComm) AllGather(dst, src kernels.Buf, site string) {
	c.through(dst, src, func(h, s kernels.Buf) { c.inner.AllGather(h, s, site) })
}

// ReduceScatter implements Comm.
func (c *stagedComm) ReduceScatter(dst, src kernels.Buf, site string) {
	c.through(dst, src, func(h, s kernels.Buf) { c.inner.ReduceScatter(h, s, site) })
}

// AllReduce implements Comm.
func (c *stagedComm) AllReduce(buf kernels.Buf, site string) {
	h, rh := c.down(buf, true)
	c.inner.AllReduce(h, site)
	c.up(buf, h)
	rh()
}

// AllToAll implements Comm.
func (c *stagedComm) AllToAll(dst, src kernels.Buf, site string) {
	c.through(dst, src, func(h, s kernels.Buf) { c.inner.AllToAll(h, s, site) })
}
