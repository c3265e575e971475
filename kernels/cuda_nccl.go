//go:build cuda

package kernels

// The CUDA backend's NCCL: *CUDA implements transport.NCCLLib (package transport asserts it; this
// package cannot import parallel) through kernels/cuda's NCCL, libnccl.so.2 opened at the first
// call. Each communicator runs on a stream of its own: NCCLGroupStart(comm) orders it after the
// kernels queued so far on the compute stream, NCCLJoin(comm) orders the kernels queued
// afterwards after it, neither blocking the host. Buffers are the backend's (Alloc, Slice),
// float32.

import (
	"errors"
	"fmt"

	"distflash/kernels/cuda"
)

// ncclDevice is a GPU that has NCCL: *cuda.Device (the host tests' fake device has not).
type ncclDevice interface {
	NCCL() (*cuda.NCCL, error)
}

// nccl returns the device's NCCL side.
func (c *CUDA) nccl() (*cuda.NCCL, error) {
	d, ok := c.dev.(ncclDevice)
	if !ok {
		return nil, errors.New("kernels: cuda: this device has no NCCL")
	}
	n, err := d.NCCL()
	if err != nil {
		return nil, fmt.Errorf("kernels: cuda: %w", err)
	}
	return n, nil
}

// ncclView returns the device view of a buffer of this backend.
func ncclView(what string, b Buf) (cuda.View, error) {
	d, ok := b.(cudaBuf)
	if !ok {
		return cuda.View{}, fmt.Errorf("kernels: cuda: %s: %T is not a CUDA buffer", what, b)
	}
	return cuda.View{Mem: d.mem, Off: d.off, Len: d.n}, nil
}

// ncclCall runs one NCCL operation on the device's NCCL side, prefixing its error with what.
func (c *CUDA) ncclCall(what string, op func(n *cuda.NCCL) error) error {
	n, err := c.nccl()
	if err != nil {
		return err
	}
	if err := op(n); err != nil {
		return fmt.Errorf("kernels: cuda: %s: %w", what, err)
	}
	return nil
}

// NCCLVersion is ncclGetVersion (transport.NCCLLib): major·10000 + minor·100 + patch.
func (c *CUDA) NCCLVersion() (int, error) {
	v, err := cuda.NCCLVersion()
	if err != nil {
		return 0, fmt.Errorf("kernels: cuda: %w", err)
	}
	return v, nil
}

// NCCLUniqueID is ncclGetUniqueId (transport.NCCLLib).
func (c *CUDA) NCCLUniqueID() ([128]byte, error) {
	var id [128]byte
	err := c.ncclCall("nccl unique id", func(n *cuda.NCCL) (err error) {
		id, err = n.UniqueID()
		return err
	})
	return id, err
}

// NCCLInit is ncclCommInitRank on this backend's device: this rank's communicator of nranks
// ranks, with a stream of its own (transport.NCCLLib).
func (c *CUDA) NCCLInit(nranks int, id [128]byte, rank int) (uintptr, error) {
	var comm uintptr
	err := c.ncclCall(fmt.Sprintf("nccl communicator of rank %d of %d", rank, nranks), func(n *cuda.NCCL) (err error) {
		comm, err = n.Init(nranks, id, rank)
		return err
	})
	return comm, err
}

// NCCLSplit is ncclCommSplit(comm, color, key, &new, NULL): the new communicator has a stream
// of its own (transport.NCCLLib). It fails with an NCCL older than 2.18.
func (c *CUDA) NCCLSplit(comm uintptr, color, key int) (uintptr, error) {
	var sub uintptr
	err := c.ncclCall(fmt.Sprintf("nccl split (color %d, key %d)", color, key), func(n *cuda.NCCL) (err error) {
		sub, err = n.Split(comm, color, key)
		return err
	})
	return sub, err
}

// NCCLGroupStart makes comm's stream wait for the kernels queued so far, then opens an NCCL
// group for comm's operations (transport.NCCLLib). The group's operations and NCCLGroupEnd must
// come from the same goroutine (NCCL's group is per thread: the goroutine stays on its thread
// until then).
func (c *CUDA) NCCLGroupStart(comm uintptr) error {
	return c.ncclCall("nccl group start", func(n *cuda.NCCL) error { return n.GroupStart(comm) })
}

// NCCLGroupEnd is ncclGroupEnd of the group NCCLGroupStart(comm) opened (transport.NCCLLib): its
// operations start.
func (c *CUDA) NCCLGroupEnd(comm uintptr) error {
	return c.ncclCall("nccl group end", func(n *cuda.NCCL) error { return n.GroupEnd() })
}

// NCCLSend queues ncclSend of buf's float32 values to rank peer of comm (transport.NCCLLib).
func (c *CUDA) NCCLSend(comm uintptr, buf Buf, peer int) error {
	v, err := ncclView("nccl send", buf)
	if err != nil {
		return err
	}
	return c.ncclCall(fmt.Sprintf("send of %d values to rank %d", v.Len, peer), func(n *cuda.NCCL) error {
		return n.Send(comm, v, peer)
	})
}

// NCCLRecv queues ncclRecv of buf's float32 values from rank peer of comm (transport.NCCLLib).
func (c *CUDA) NCCLRecv(comm uintptr, buf Buf, peer int) error {
	v, err := ncclView("nccl receive", buf)
	if err != nil {
		return err
	}
	return c.ncclCall(fmt.Sprintf("receive of %d values from rank %d", v.Len, peer), func(n *cuda.NCCL) error {
		return n.Recv(comm, v, peer)
	})
}

// NCCLAllReduce queues ncclAllReduce (ncclSum, ncclFloat32) of buf in place
// (transport.NCCLLib).
func (c *CUDA) NCCLAllReduce(comm uintptr, buf Buf) error {
	v, err := ncclView("nccl all-reduce", buf)
	if err != nil {
		return err
	}
	return c.ncclCall(fmt.Sprintf("all-reduce of %d values", v.Len), func(n *cuda.NCCL) error {
		return n.AllReduce(comm, v)
	})
}

// NCCLAllGather queues ncclAllGather of src into dst, ranks × src.Len() values
// (transport.NCCLLib).
func (c *CUDA) NCCLAllGather(comm uintptr, dst, src Buf) error {
	d, err := ncclView("nccl all-gather destination", dst)
	if err != nil {
		return err
	}
	s, err := ncclView("nccl all-gather source", src)
	if err != nil {
		return err
	}
	return c.ncclCall(fmt.Sprintf("all-gather of %d values into %d", s.Len, d.Len), func(n *cuda.NCCL) error {
		return n.AllGather(comm, d, s)
	})
}

// NCCLReduceScatter queues ncclReduceScatter (ncclSum, ncclFloat32) of src, ranks × dst.Len()
// values, into dst (transport.NCCLLib).
func (c *CUDA) NCCLReduceScatter(comm uintptr, dst, src Buf) error {
	d, err := ncclView("nccl reduce-scatter destination", dst)
	if err != nil {
		return err
	}
	s, err := ncclView("nccl reduce-scatter source", src)
	if err != nil {
		return err
	}
	return c.ncclCall(fmt.Sprintf("reduce-scatter of %d values into %d", s.Len, d.Len), func(n *cuda.NCCL) error {
		return n.ReduceScatter(comm, d, s)
	})
}

// NCCLJoin makes the kernels queued afterwards wait for every operation queued on comm so far,
// without blocking the host (transport.NCCLLib).
func (c *CUDA) NCCLJoin(comm uintptr) error {
	return c.ncclCall("nccl join", func(n *cuda.NCCL) error { return n.Join(comm) })
}

// NCCLSync waits on the host for comm's operations and returns its asynchronous error, if any
// (transport.NCCLLib).
func (c *CUDA) NCCLSync(comm uintptr) error {
	return c.ncclCall("nccl sync", func(n *cuda.NCCL) error { return n.Sync(comm) })
}

// NCCLDestroy is ncclCommDestroy, after comm's operations; it frees comm's stream
// (transport.NCCLLib).
func (c *CUDA) NCCLDestroy(comm uintptr) error {
	return c.ncclCall("nccl destroy", func(n *cuda.NCCL) error { return n.Destroy(comm) })
}

// NCCLPoll reports, without waiting, whether comm's stream has operations not yet done and
// comm's asynchronous error (transport.NCCLLib; safe beside comm's other calls).
func (c *CUDA) NCCLPoll(comm uintptr) (busy bool, err error) {
	err = c.ncclCall("nccl poll", func(n *cuda.NCCL) (err error) {
		busy, err = n.Poll(comm)
		return err
	})
	return busy, err
}

// NCCLAbort is ncclCommAbort (transport.NCCLLib): it ends comm's operations still running.
func (c *CUDA) NCCLAbort(comm uintptr) error {
	return c.ncclCall("nccl abort", func(n *cuda.NCCL) error { return n.Abort(comm) })
}
