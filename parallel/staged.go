package parallel

import "distflash/kernels"

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
// before Wait; a receive lands in the device buffer when Wait returns.
func Staged(c Comm, s Stager) Comm { return &stagedComm{inner: c, st: s} }

type stagedComm struct {
	inner Comm
	st    Stager
}

// down returns b as host memory: b itself when it is host memory, else a downloaded copy
// (or, with load false, an uninitialised host buffer of its length for c to fill).
func (c *stagedComm) down(b kernels.Buf, load bool) kernels.Buf {
	if kernels.IsHost(b) {
		return b
	}
	h := make([]float32, b.Len())
	if load {
		c.st.Download(h, b)
	}
	return kernels.HostBuf(h)
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
	return Staged(c.inner.Split(color, key, site), c.st)
}

// Isend implements Comm.
func (c *stagedComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	return c.inner.Isend(c.down(buf, true), dst, tag, site)
}

// Irecv implements Comm.
func (c *stagedComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	h := c.down(buf, false)
	req := c.inner.Irecv(h, src, tag, site)
	if kernels.IsHost(buf) {
		return req
	}
	return &stagedRecv{req: req, up: func() { c.up(buf, h) }}
}

// stagedRecv uploads a received host copy into the device buffer once the receive is done.
type stagedRecv struct {
	req  Request
	up   func()
	done bool
}

func (r *stagedRecv) Wait() {
	r.req.Wait()
	if !r.done {
		r.done = true
		r.up()
	}
}

// AllGather implements Comm.
func (c *stagedComm) AllGather(dst, src kernels.Buf, site string) {
	h := c.down(dst, false)
	c.inner.AllGather(h, c.down(src, true), site)
	c.up(dst, h)
}

// ReduceScatter implements Comm.
func (c *stagedComm) ReduceScatter(dst, src kernels.Buf, site string) {
	h := c.down(dst, false)
	c.inner.ReduceScatter(h, c.down(src, true), site)
	c.up(dst, h)
}

// AllReduce implements Comm.
func (c *stagedComm) AllReduce(buf kernels.Buf, site string) {
	h := c.down(buf, true)
	c.inner.AllReduce(h, site)
	c.up(buf, h)
}

// AllToAll implements Comm.
func (c *stagedComm) AllToAll(dst, src kernels.Buf, site string) {
	h := c.down(dst, false)
	c.inner.AllToAll(h, c.down(src, true), site)
	c.up(dst, h)
}
