// Package transporttest holds what tests of communicators and of the code written against them
// share: a fake NCCL library with NCCL's rules (FakeNCCL, over a FakeNet), worlds of NCCL
// communicators on it (NCCLWorld), and a runner that starts a test binary under mpirun
// (MPIRunSelf). Only tests import it.
package transporttest

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"distflash/kernels"
	"distflash/parallel/transport"
)

// FakeNCCL is one rank's NCCL library in the tests: it records every call in order (log) and
// carries them out on the rank's CPU buffers with NCCL's rules, over a FakeNet its world
// shares. Point-to-point operations pair by order on each directed pair of a communicator
// (tags do not exist), a group's operations are posted at ncclGroupEnd and complete only when
// their partners are posted (sends rendezvous), and NCCLJoin/NCCLSync wait on the host for every
// operation issued on the communicator so far, as the compute stream waits for the
// communicator's stream; an operation not done within 2 s would deadlock under NCCL and
// panics saying so. Collectives
// complete when every rank of the communicator has issued theirs and sum in rank order, as the
// host communicators do, so results can be compared bit for bit.
type FakeNCCL struct {
	net     *FakeNet
	be      kernels.Backend
	version int
	rank    int // world rank, for messages

	mu    sync.Mutex
	log   []string
	comms []*fakeHandle         // handle h is comms[h-1]
	async atomic.Pointer[error] // the asynchronous error NCCLPoll reports, when set
}

// fakeHandle is one of a rank's communicators with its stream: the open group's operations,
// posted at GroupEnd, and the operations posted and not yet waited for.
type fakeHandle struct {
	s *fakeCommState

	mu      sync.Mutex // the watchdog polls beside the communicator's goroutine
	inGroup bool
	grouped []func() *fakeOp
	issued  []*fakeOp
	aborted bool
}

// FakeNet is the world of fake communicators: their members, posted point-to-point operations
// and collective rendezvous.
type FakeNet struct {
	mu    sync.Mutex
	byID  map[[128]byte]*fakeGroup
	sends map[fakeLink][]*fakeOp
	recvs map[fakeLink][]*fakeOp
	colls map[string]*fakeRendezvous
}

// fakeGroup is a communicator's group: its name and size.
type fakeGroup struct {
	name   string
	size   int
	seq    map[int]int // per rank, collectives issued
	splits int         // splits completed
}

// fakeCommState is one rank's communicator.
type fakeCommState struct {
	g    *fakeGroup
	rank int
}

// fakeLink is a direction of a communicator's pair.
type fakeLink struct {
	group    string
	src, dst int
}

// fakeOp is an issued operation; done is closed when it completed, err says how it failed.
type fakeOp struct {
	what  string
	done  chan struct{}
	err   error
	buf   kernels.Buf
	split *fakeCommState // a split's new communicator
}

// finish marks op done, once (an aborted operation may still be matched later); the net's lock
// is held.
func (op *fakeOp) finish() {
	select {
	case <-op.done:
	default:
		close(op.done)
	}
}

// fakeRendezvous collects one collective's calls.
type fakeRendezvous struct {
	kind  string
	calls map[int]fakeCollCall
	ops   []*fakeOp
}

type fakeCollCall struct {
	dst, src   kernels.Buf
	color, key int
	op         *fakeOp
}

// NewFakeNet returns an empty world of fake communicators.
func NewFakeNet() *FakeNet {
	return &FakeNet{byID: map[[128]byte]*fakeGroup{}, sends: map[fakeLink][]*fakeOp{}, recvs: map[fakeLink][]*fakeOp{}, colls: map[string]*fakeRendezvous{}}
}

// Lib returns world rank's library on a CPU backend.
func (n *FakeNet) Lib(rank, version int) *FakeNCCL {
	return &FakeNCCL{net: n, be: kernels.NewCPU(), version: version, rank: rank}
}

// Record adds a line to the log (a test marks a point between calls with it).
func (f *FakeNCCL) Record(format string, args ...any) {
	f.mu.Lock()
	f.log = append(f.log, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// Calls returns the log of the calls so far, one line each.
func (f *FakeNCCL) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// NCCLVersion records the call and returns the version the library was made with.
func (f *FakeNCCL) NCCLVersion() (int, error) { f.Record("GetVersion"); return f.version, nil }

// NCCLUniqueID records the call and returns a random id.
func (f *FakeNCCL) NCCLUniqueID() ([128]byte, error) {
	var id [128]byte
	for i := range id {
		id[i] = byte(rand.Uint32())
	}
	f.Record("GetUniqueId %x", id[:4])
	return id, nil
}

// handle returns communicator h; one goroutine at a time uses a communicator.
func (f *FakeNCCL) handle(h uintptr) *fakeHandle {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h == 0 || int(h) > len(f.comms) {
		panic(fmt.Sprintf("fake nccl: rank %d: no communicator %d", f.rank, h))
	}
	return f.comms[h-1]
}

func (f *FakeNCCL) comm(h uintptr) *fakeCommState { return f.handle(h).s }

// newHandle adds a communicator.
func (f *FakeNCCL) newHandle(s *fakeCommState) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.comms = append(f.comms, &fakeHandle{s: s})
	return uintptr(len(f.comms))
}

// NCCLInit joins the communicator of id as rank of nranks.
func (f *FakeNCCL) NCCLInit(nranks int, id [128]byte, rank int) (uintptr, error) {
	f.Record("CommInitRank %d %x %d", nranks, id[:4], rank)
	f.net.mu.Lock()
	g := f.net.byID[id]
	if g == nil {
		g = &fakeGroup{name: fmt.Sprintf("id%x", id[:4]), size: nranks, seq: map[int]int{}}
		f.net.byID[id] = g
	}
	f.net.mu.Unlock()
	if g.size != nranks || rank < 0 || rank >= nranks {
		return 0, fmt.Errorf("fake nccl: rank %d of %d on a communicator of %d", rank, nranks, g.size)
	}
	return f.newHandle(&fakeCommState{g: g, rank: rank}), nil
}

// rendezvous joins rank's call to the k-th collective of group g and returns it with the op
// that completes when every rank has joined.
func (f *FakeNCCL) rendezvous(s *fakeCommState, kind string, call fakeCollCall, complete func(rv *fakeRendezvous)) *fakeOp {
	n := f.net
	n.mu.Lock()
	defer n.mu.Unlock()
	k := s.g.seq[s.rank]
	s.g.seq[s.rank]++
	key := fmt.Sprintf("%s#%d", s.g.name, k)
	rv := n.colls[key]
	if rv == nil {
		rv = &fakeRendezvous{kind: kind, calls: map[int]fakeCollCall{}}
		n.colls[key] = rv
	}
	op := &fakeOp{what: fmt.Sprintf("%s %s", kind, key), done: make(chan struct{})}
	call.op = op
	rv.calls[s.rank] = call
	rv.ops = append(rv.ops, op)
	if rv.kind != kind {
		op.err = fmt.Errorf("rank %d called %s where another rank of %s called %s", s.rank, kind, s.g.name, rv.kind)
	}
	if len(rv.calls) == s.g.size {
		delete(n.colls, key)
		complete(rv)
		for _, o := range rv.ops {
			o.finish()
		}
	}
	return op
}

// NCCLSplit makes the communicator of the members of comm that give the same color, ranked by key.
func (f *FakeNCCL) NCCLSplit(comm uintptr, color, key int) (uintptr, error) {
	f.Record("CommSplit %d %d %d", comm, color, key)
	if f.version < transport.NCCLSplitVersion {
		return 0, fmt.Errorf("fake nccl: ncclCommSplit needs NCCL 2.18, this is %d", f.version)
	}
	s := f.comm(comm)
	op := f.rendezvous(s, "split", fakeCollCall{color: color, key: key}, func(rv *fakeRendezvous) {
		type member struct{ key, rank int }
		byColor := map[int][]member{}
		for r, c := range rv.calls {
			byColor[c.color] = append(byColor[c.color], member{c.key, r})
		}
		splitNo := s.g.splits
		s.g.splits++
		for color, ms := range byColor {
			sort.Slice(ms, func(i, j int) bool {
				if ms[i].key != ms[j].key {
					return ms[i].key < ms[j].key
				}
				return ms[i].rank < ms[j].rank
			})
			g := &fakeGroup{name: fmt.Sprintf("%s/%d:%d", s.g.name, splitNo, color), size: len(ms), seq: map[int]int{}}
			for i, m := range ms {
				rv.calls[m.rank].op.split = &fakeCommState{g: g, rank: i}
			}
		}
	})
	if err := f.wait(op); err != nil {
		return 0, err
	}
	return f.newHandle(op.split), nil
}

// NCCLGroupStart opens a group on comm.
func (f *FakeNCCL) NCCLGroupStart(comm uintptr) error {
	f.Record("GroupStart")
	h := f.handle(comm)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inGroup {
		return fmt.Errorf("fake nccl: nested group")
	}
	h.inGroup = true
	return nil
}

// NCCLGroupEnd posts the group's operations.
func (f *FakeNCCL) NCCLGroupEnd(comm uintptr) error {
	f.Record("GroupEnd")
	h := f.handle(comm)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.inGroup {
		return fmt.Errorf("fake nccl: ncclGroupEnd without ncclGroupStart")
	}
	h.inGroup = false
	for _, post := range h.grouped {
		h.issued = append(h.issued, post())
	}
	h.grouped = nil
	return nil
}

// enqueue adds an operation to comm's open group; the communicator calls none outside one.
func (f *FakeNCCL) enqueue(comm uintptr, post func() *fakeOp) {
	h := f.handle(comm)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.inGroup {
		panic("fake nccl: an operation outside a group")
	}
	h.grouped = append(h.grouped, post)
}

// p2p posts a send or receive and pairs the link's queues in order.
func (f *FakeNCCL) p2p(send bool, s *fakeCommState, buf kernels.Buf, peer int) *fakeOp {
	n := f.net
	n.mu.Lock()
	defer n.mu.Unlock()
	op := &fakeOp{buf: buf, done: make(chan struct{})}
	k := fakeLink{s.g.name, s.rank, peer}
	if send {
		op.what = fmt.Sprintf("send %d→%d of %s (%d values)", s.rank, peer, s.g.name, buf.Len())
		n.sends[k] = append(n.sends[k], op)
	} else {
		k = fakeLink{s.g.name, peer, s.rank}
		op.what = fmt.Sprintf("receive %d←%d of %s (%d values)", s.rank, peer, s.g.name, buf.Len())
		n.recvs[k] = append(n.recvs[k], op)
	}
	for len(n.sends[k]) > 0 && len(n.recvs[k]) > 0 {
		sd, rv := n.sends[k][0], n.recvs[k][0]
		n.sends[k], n.recvs[k] = n.sends[k][1:], n.recvs[k][1:]
		if sd.buf.Len() != rv.buf.Len() {
			sd.err = fmt.Errorf("%s meets a receive of %d values: NCCL would pair them", sd.what, rv.buf.Len())
			rv.err = sd.err
		} else {
			copy(kernels.Host(rv.buf), kernels.Host(sd.buf))
		}
		sd.finish()
		rv.finish()
	}
	return op
}

// NCCLSend queues a send of buf to peer in the open group.
func (f *FakeNCCL) NCCLSend(comm uintptr, buf kernels.Buf, peer int) error {
	s := f.comm(comm)
	f.Record("Send %d %d→%d", buf.Len(), s.rank, peer)
	f.enqueue(comm, func() *fakeOp { return f.p2p(true, s, buf, peer) })
	return nil
}

// NCCLRecv queues a receive into buf from peer in the open group.
func (f *FakeNCCL) NCCLRecv(comm uintptr, buf kernels.Buf, peer int) error {
	s := f.comm(comm)
	f.Record("Recv %d %d←%d", buf.Len(), s.rank, peer)
	f.enqueue(comm, func() *fakeOp { return f.p2p(false, s, buf, peer) })
	return nil
}

// collective enqueues a rendezvous whose completion runs fn over every rank's call in rank order.
func (f *FakeNCCL) collective(comm uintptr, kind string, dst, src kernels.Buf, fn func(calls []fakeCollCall)) {
	s := f.comm(comm)
	f.Record("%s %d %d", kind, dst.Len(), src.Len())
	f.enqueue(comm, func() *fakeOp {
		return f.rendezvous(s, kind, fakeCollCall{dst: dst, src: src}, func(rv *fakeRendezvous) {
			calls := make([]fakeCollCall, len(rv.calls))
			for r, c := range rv.calls {
				calls[r] = c
			}
			fn(calls)
		})
	})
}

// rankSum returns Σ_r part(r)[i] in rank order, from 0, as the host communicators sum.
func rankSum(P, n int, part func(r int) []float32) []float32 {
	sum := make([]float32, n)
	for i := range sum {
		var s float32
		for r := 0; r < P; r++ {
			s += part(r)[i]
		}
		sum[i] = s
	}
	return sum
}

// NCCLAllReduce sums buf over comm's ranks, in rank order.
func (f *FakeNCCL) NCCLAllReduce(comm uintptr, buf kernels.Buf) error {
	f.collective(comm, "AllReduce", buf, buf, func(calls []fakeCollCall) {
		P := len(calls)
		in := make([][]float32, P)
		for r, c := range calls {
			in[r] = append([]float32(nil), kernels.Host(c.src)...)
		}
		sum := rankSum(P, buf.Len(), func(r int) []float32 { return in[r] })
		for _, c := range calls {
			copy(kernels.Host(c.dst), sum)
		}
	})
	return nil
}

// NCCLAllGather gathers every rank's src into dst, in rank order.
func (f *FakeNCCL) NCCLAllGather(comm uintptr, dst, src kernels.Buf) error {
	f.collective(comm, "AllGather", dst, src, func(calls []fakeCollCall) {
		n := src.Len()
		for _, c := range calls {
			for r, o := range calls {
				copy(kernels.Host(c.dst)[r*n:(r+1)*n], kernels.Host(o.src))
			}
		}
	})
	return nil
}

// NCCLReduceScatter sums src over the ranks and leaves each rank its part in dst.
func (f *FakeNCCL) NCCLReduceScatter(comm uintptr, dst, src kernels.Buf) error {
	f.collective(comm, "ReduceScatter", dst, src, func(calls []fakeCollCall) {
		P, n := len(calls), dst.Len()
		in := make([][]float32, P)
		for r, c := range calls {
			in[r] = append([]float32(nil), kernels.Host(c.src)...)
		}
		for q, c := range calls {
			copy(kernels.Host(c.dst), rankSum(P, n, func(r int) []float32 { return in[r][q*n : (q+1)*n] }))
		}
	})
	return nil
}

// wait waits for op, failing after 2 s: under NCCL it would never complete.
func (f *FakeNCCL) wait(op *fakeOp) error {
	select {
	case <-op.done:
	case <-time.After(2 * time.Second):
		return fmt.Errorf("rank %d: %s did not complete in 2 s: it would deadlock under NCCL", f.rank, op.what)
	}
	return op.err
}

// NCCLJoin waits for every operation issued on comm (the compute stream waiting for comm's).
func (f *FakeNCCL) NCCLJoin(comm uintptr) error {
	f.Record("Join")
	return f.drain(comm)
}

// drain waits for every operation issued on comm.
func (f *FakeNCCL) drain(comm uintptr) error {
	h := f.handle(comm)
	h.mu.Lock()
	ops := append([]*fakeOp(nil), h.issued...)
	h.mu.Unlock()
	for _, op := range ops {
		if err := f.wait(op); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.issued = h.issued[len(ops):] // the ones waited for stay visible to NCCLPoll until done
	h.mu.Unlock()
	return nil
}

// NCCLPoll reports whether an operation issued on comm is not done, and the error the test
// set for this rank (async).
func (f *FakeNCCL) NCCLPoll(comm uintptr) (bool, error) {
	h := f.handle(comm)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := f.async.Load(); err != nil {
		return false, *err
	}
	for _, op := range h.issued {
		select {
		case <-op.done:
		default:
			return true, nil
		}
	}
	return false, nil
}

// NCCLAbort ends comm's pending operations with an error.
func (f *FakeNCCL) NCCLAbort(comm uintptr) error {
	f.Record("CommAbort %d", comm)
	h := f.handle(comm)
	h.mu.Lock()
	ops := h.issued
	h.aborted = true
	h.mu.Unlock()
	f.net.mu.Lock()
	defer f.net.mu.Unlock()
	for _, op := range ops {
		select {
		case <-op.done:
		default:
			op.err = fmt.Errorf("rank %d: %s: aborted (ncclCommAbort)", f.rank, op.what)
			op.finish()
		}
	}
	return nil
}

// NCCLSync waits for every operation issued on comm.
func (f *FakeNCCL) NCCLSync(comm uintptr) error {
	f.Record("Sync %d", comm)
	return f.drain(comm)
}

// NCCLDestroy records the call.
func (f *FakeNCCL) NCCLDestroy(comm uintptr) error {
	f.Record("CommDestroy %d", comm)
	return nil
}

// Slice is the rank backend's Slice.
func (f *FakeNCCL) Slice(b kernels.Buf, off, n int) kernels.Buf { return f.be.Slice(b, off, n) }

// Joined returns a log as one line per call, for messages.
func Joined(log []string) string { return strings.Join(log, "\n") }

// SetAsyncError makes NCCLPoll report err on every communicator of this rank, as NCCL's
// ncclCommGetAsyncError reports a failure seen by its proxy thread.
func (f *FakeNCCL) SetAsyncError(err error) { f.async.Store(&err) }
