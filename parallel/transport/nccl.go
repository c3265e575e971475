package transport

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"

	"distflash/kernels"
)

// NCCLLib is the NCCL library as one rank's GPU backend drives it: the CUDA backend of package
// kernels (build tag cuda) implements it with libnccl.so.2 opened at run time and its device
// buffers; the tests implement it with a recording fake. Handles are ncclComm_t values.
//
// Streams: each communicator has a stream of its own, apart from the compute stream the
// backend's kernels run on. NCCLGroupStart(comm) makes comm's stream wait for every kernel
// queued on the compute stream so far (an event), so the group's operations see the data those
// kernels wrote; NCCLJoin(comm) makes the kernels queued afterwards wait for every operation
// issued on comm so far (an event the other way). Neither blocks the host: the attention
// kernels of the next block run while a group's transfers do. Communicators used from two
// goroutines at once (FSDP's prefetch gathers beside the step's own collectives) therefore
// never queue behind each other in an order that could differ between ranks. NCCLSync blocks
// the host until comm's operations are done and reports NCCL's asynchronous error, if any.
type NCCLLib interface {
	// NCCLVersion is ncclGetVersion: major·10000 + minor·100 + patch from 2.9 on.
	NCCLVersion() (int, error)
	// NCCLUniqueID is ncclGetUniqueId: the 128 bytes a world's ranks initialise from.
	NCCLUniqueID() ([128]byte, error)
	// NCCLInit is ncclCommInitRank: this rank's communicator of nranks ranks, with its stream.
	NCCLInit(nranks int, id [128]byte, rank int) (uintptr, error)
	// NCCLSplit is ncclCommSplit (NCCL ≥ 2.18): ranks of comm with equal color form a new
	// communicator (with its stream), ordered by key then by rank in comm.
	NCCLSplit(comm uintptr, color, key int) (uintptr, error)
	// NCCLGroupStart is ncclGroupStart, after comm's stream's wait for the compute stream; the
	// group's operations are all comm's.
	NCCLGroupStart(comm uintptr) error
	// NCCLGroupEnd is ncclGroupEnd of the group NCCLGroupStart(comm) opened: its operations
	// start together.
	NCCLGroupEnd(comm uintptr) error
	// NCCLSend is ncclSend of buf's float32 values to peer.
	NCCLSend(comm uintptr, buf kernels.Buf, peer int) error
	// NCCLRecv is ncclRecv of buf's float32 values from peer.
	NCCLRecv(comm uintptr, buf kernels.Buf, peer int) error
	// NCCLAllReduce is ncclAllReduce (ncclSum, ncclFloat32) in place.
	NCCLAllReduce(comm uintptr, buf kernels.Buf) error
	// NCCLAllGather is ncclAllGather of src into dst.
	NCCLAllGather(comm uintptr, dst, src kernels.Buf) error
	// NCCLReduceScatter is ncclReduceScatter (ncclSum) of src into dst.
	NCCLReduceScatter(comm uintptr, dst, src kernels.Buf) error
	// NCCLJoin makes the compute stream's later work wait for every operation issued on comm
	// so far.
	NCCLJoin(comm uintptr) error
	// NCCLSync waits on the host for comm's operations and returns its asynchronous error.
	NCCLSync(comm uintptr) error
	// NCCLDestroy is ncclCommDestroy, and frees comm's stream.
	NCCLDestroy(comm uintptr) error
	// NCCLPoll reports, without waiting, whether comm's stream has operations not yet done, and
	// comm's asynchronous error (ncclCommGetAsyncError); the watchdog calls it from its own
	// goroutine, beside comm's other calls.
	NCCLPoll(comm uintptr) (busy bool, err error)
	// NCCLAbort is ncclCommAbort: it ends comm's operations still running (a hung or failed
	// communicator, before the job ends).
	NCCLAbort(comm uintptr) error
	// Slice is the backend's view [off, off+n) of b (kernels.Backend's Slice).
	Slice(b kernels.Buf, off, n int) kernels.Buf
}

// NCCLSplitVersion is the first NCCL with ncclCommSplit (2.18.1).
const NCCLSplitVersion = 21801

// NCCLIDSite is the call site under which the bootstrap communicator counts the unique ids it
// carries.
const NCCLIDSite = "nccl.id"

// NewNCCL returns the NCCL communicator of the world boot spans, the way llm.c and the NCCL
// documentation's MPI example bootstrap one: boot (the MPI world the ranks were launched in, or
// any host communicator) carries rank 0's ncclGetUniqueId to every rank, then each calls
// ncclCommInitRank with its rank in boot. Splits of the result split boot alongside, and make
// their NCCL communicators with ncclCommSplit (NCCL ≥ 2.18) or, on an older library, with a
// unique id of the new group's first rank carried by boot's split. Every rank must call it.
//
// The communicator's buffers are lib's device buffers. Isend and Irecv only queue an operation:
// Start issues everything queued as one NCCL group, as does the first Wait or collective after
// it, so a schedule posts a step's sends and receives, calls Start (see Start) and computes
// while they run. NCCL pairs a send with a receive by their order on the pair of ranks, not by
// tag, and a send completes only when its receive is posted: every schedule posts its messages
// so that it is exact under those rules (TestSchedulesUnderNCCL). Collectives sum in NCCL's order, not rank order,
// so results equal the host path's to rounding. The bytes counted per call site are those the
// host communicators count for the same calls.
//
// A watchdog (opt.Timeout, NCCLOptions) ends the job when a communicator stays hung. Close
// destroys the world's communicators, its splits' included, and stops the watchdog.
func NewNCCL(boot Comm, lib NCCLLib, opt NCCLOptions) (Comm, error) {
	v, err := lib.NCCLVersion()
	if err != nil {
		return nil, fmt.Errorf("parallel: nccl: %w", err)
	}
	h, err := ncclInit(boot, lib)
	if err != nil {
		return nil, err
	}
	c := &ncclComm{lib: lib, boot: boot, h: h, version: v, name: "the world", root: true,
		sh: &ncclShared{ctr: &counter{}, rank: boot.Rank(), opt: opt, stop: make(chan struct{})}}
	c.sh.add(c)
	if opt.Timeout > 0 {
		go c.sh.watch(lib)
	}
	return c, nil
}

// ncclInit makes the communicator of boot's ranks from a unique id boot's rank 0 makes. A
// failure to make the id is every rank's error, so no rank waits in ncclCommInitRank for a
// rank that has given up.
func ncclInit(boot Comm, lib NCCLLib) (uintptr, error) {
	// the id travels as 32 float32 bit patterns after a flag, through boot's AllGather (the
	// host communicators copy values bit for bit)
	const n = 1 + 128/4
	mine := make([]float32, n)
	var idErr error
	if boot.Rank() == 0 {
		id, err := lib.NCCLUniqueID()
		if err != nil {
			idErr = err
		} else {
			mine[0] = 1
			for i := 0; i < 32; i++ {
				mine[1+i] = math.Float32frombits(uint32(id[4*i]) | uint32(id[4*i+1])<<8 | uint32(id[4*i+2])<<16 | uint32(id[4*i+3])<<24)
			}
		}
	}
	all := make([]float32, n*boot.Size())
	boot.AllGather(kernels.HostBuf(all), kernels.HostBuf(mine), NCCLIDSite)
	if all[0] != 1 {
		if idErr != nil {
			return 0, fmt.Errorf("parallel: nccl: ncclGetUniqueId on rank 0: %w", idErr)
		}
		return 0, fmt.Errorf("parallel: nccl: rank 0 of the bootstrap group could not make the NCCL unique id (its error is in rank 0's log)")
	}
	var id [128]byte
	for i := 0; i < 32; i++ {
		b := math.Float32bits(all[1+i])
		id[4*i], id[4*i+1], id[4*i+2], id[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	h, err := lib.NCCLInit(boot.Size(), id, boot.Rank())
	if err != nil {
		return 0, fmt.Errorf("parallel: nccl: ncclCommInitRank (rank %d of %d): %w", boot.Rank(), boot.Size(), err)
	}
	return h, nil
}

// ncclComm is one rank's NCCL communicator.
type ncclComm struct {
	lib     NCCLLib
	boot    Comm // the host communicator of the same ranks
	h       uintptr
	version int
	name    string // for the watchdog's report: "the world", or the split's site and colour
	root    bool   // the world's communicator: its Close closes every split too
	sh      *ncclShared
	queued  []ncclOp // posted, not yet issued
	// issued counts the groups issued on h (the watchdog reads it); joined is the value of
	// issued at the last NCCLJoin, which tells a request whether the compute stream waits for
	// it already
	issued atomic.Int64
	joined int64
	last   atomic.Value // string: the last group issued, for the watchdog's report
}

// ncclOp is a queued send or receive.
type ncclOp struct {
	send bool
	buf  kernels.Buf
	peer int
	site string
	req  *ncclRequest
}

// ncclRequest is a queued or issued point-to-point operation.
type ncclRequest struct {
	c     *ncclComm
	group int64 // the issue count of its group, 0 while queued
}

// Wait issues the operation if it is still queued and makes the compute stream wait for it.
func (r *ncclRequest) Wait() {
	c := r.c
	if r.group == 0 {
		c.Start()
	}
	if c.joined < r.group {
		c.join()
	}
}

func (c *ncclComm) Rank() int { return c.boot.Rank() }
func (c *ncclComm) Size() int { return c.boot.Size() }

// must panics with a *Failure naming the failed call: a Comm method has no error result, and a
// failed NCCL call on a working communicator is a lost peer or ranks that disagree (Recover
// makes it the command's error; the launcher ends the job).
func (c *ncclComm) must(call string, err error) {
	if err != nil {
		fail("parallel: nccl: rank %d of %d: %s: %v", c.Rank(), c.Size(), call, err)
	}
}

func (c *ncclComm) checkPeer(what string, peer, tag int) {
	if peer < 0 || peer >= c.Size() {
		panic(fmt.Sprintf("parallel: nccl: %s rank %d of %d", what, peer, c.Size()))
	}
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
}

// Isend implements Comm: it queues the send until Start or a Wait.
func (c *ncclComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	c.checkPeer("send to", dst, tag)
	c.sh.ctr.add(site, int64(4*buf.Len()))
	r := &ncclRequest{c: c}
	c.queued = append(c.queued, ncclOp{send: true, buf: buf, peer: dst, site: site, req: r})
	return r
}

// Irecv implements Comm: it queues the receive until Start or a Wait.
func (c *ncclComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	c.checkPeer("receive from", src, tag)
	r := &ncclRequest{c: c}
	c.queued = append(c.queued, ncclOp{buf: buf, peer: src, site: site, req: r})
	return r
}

// Start issues the queued sends and receives as one NCCL group (ncclGroupStart, each ncclSend
// and ncclRecv in the order posted, ncclGroupEnd): they run on the communication stream
// while the host goes on queueing kernels. It does nothing when nothing is queued.
func (c *ncclComm) Start() {
	if len(c.queued) == 0 {
		return
	}
	c.last.Store(fmt.Sprintf("a group of %d sends and receives (%s)", len(c.queued), c.queued[len(c.queued)-1].site))
	g := c.group(func() {
		for _, op := range c.queued {
			if op.send {
				c.must("ncclSend", c.lib.NCCLSend(c.h, op.buf, op.peer))
			} else {
				c.must("ncclRecv", c.lib.NCCLRecv(c.h, op.buf, op.peer))
			}
		}
	})
	for _, op := range c.queued {
		op.req.group = g
	}
	c.queued = c.queued[:0]
}

// group issues ops between ncclGroupStart and ncclGroupEnd and returns the group's number.
// The goroutine stays on its OS thread meanwhile: NCCL keeps the open group per thread, and a
// goroutine's cgo calls may otherwise run on different threads.
func (c *ncclComm) group(ops func()) int64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.must("ncclGroupStart", c.lib.NCCLGroupStart(c.h))
	ops()
	c.must("ncclGroupEnd", c.lib.NCCLGroupEnd(c.h))
	return c.issued.Add(1)
}

// join makes the compute stream wait for everything issued on c.
func (c *ncclComm) join() {
	c.must("join", c.lib.NCCLJoin(c.h))
	c.joined = c.issued.Load()
}

// count adds a collective's bytes to site (none for a group of one, as on the host).
func (c *ncclComm) count(site string, bytes int) {
	if bytes > 0 {
		c.sh.ctr.add(site, int64(bytes))
	}
}

// collective issues what is queued, then op (what, at site) as a group of its own, and joins.
func (c *ncclComm) collective(what, site string, op func()) {
	c.Start()
	c.last.Store(fmt.Sprintf("%s (%s)", what, site))
	c.group(op)
	c.join()
}

// AllGather implements Comm (ncclAllGather).
func (c *ncclComm) AllGather(dst, src kernels.Buf, site string) {
	P, n := c.Size(), src.Len()
	if dst.Len() != P*n {
		panic(fmt.Sprintf("parallel: all-gather of %d into %d on %d ranks", n, dst.Len(), P))
	}
	c.count(site, 4*(P-1)*n)
	c.collective("ncclAllGather", site, func() { c.must("ncclAllGather", c.lib.NCCLAllGather(c.h, dst, src)) })
}

// ReduceScatter implements Comm (ncclReduceScatter).
func (c *ncclComm) ReduceScatter(dst, src kernels.Buf, site string) {
	P, n := c.Size(), dst.Len()
	if src.Len() != P*n {
		panic(fmt.Sprintf("parallel: reduce-scatter of %d into %d on %d ranks", src.Len(), n, P))
	}
	c.count(site, 4*(P-1)*n)
	c.collective("ncclReduceScatter", site, func() { c.must("ncclReduceScatter", c.lib.NCCLReduceScatter(c.h, dst, src)) })
}

// AllReduce implements Comm (ncclAllReduce). The bytes counted are the host communicators'
// reduce-scatter then all-gather over near-equal chunks.
func (c *ncclComm) AllReduce(buf kernels.Buf, site string) {
	P, n := c.Size(), buf.Len()
	if P == 1 {
		return
	}
	mine := (c.Rank()+1)*n/P - c.Rank()*n/P
	c.count(site, 4*(n-mine+(P-1)*mine))
	c.collective("ncclAllReduce", site, func() { c.must("ncclAllReduce", c.lib.NCCLAllReduce(c.h, buf)) })
}

// AllToAll implements Comm: NCCL has no all-to-all, so it is one group of a send and a receive
// per rank, this rank's own chunk included (NCCL copies a send to self).
func (c *ncclComm) AllToAll(dst, src kernels.Buf, site string) {
	P := c.Size()
	if src.Len() != dst.Len() || src.Len()%P != 0 {
		panic(fmt.Sprintf("parallel: all-to-all of %d into %d on %d ranks", src.Len(), dst.Len(), P))
	}
	n := src.Len() / P
	c.count(site, 4*(P-1)*n)
	c.collective("all-to-all", site, func() {
		for r := 0; r < P; r++ {
			c.must("ncclSend", c.lib.NCCLSend(c.h, c.lib.Slice(src, r*n, n), r))
			c.must("ncclRecv", c.lib.NCCLRecv(c.h, c.lib.Slice(dst, r*n, n), r))
		}
	})
}

// Barrier implements Comm: the host waits for this rank's NCCL operations, then for every rank
// on the bootstrap communicator.
func (c *ncclComm) Barrier() {
	c.Start()
	c.join()
	c.must("ncclCommGetAsyncError", c.lib.NCCLSync(c.h))
	c.boot.Barrier()
}

// Split implements Comm: boot splits alongside, and the new NCCL communicator comes from
// ncclCommSplit or, before NCCL 2.18, from the new group's own unique id.
func (c *ncclComm) Split(color, key int, site string) Comm {
	if color < 0 {
		panic(fmt.Sprintf("parallel: nccl: split color %d: colors are ≥ 0 (NCCL reserves negative ones)", color))
	}
	c.Start()
	sub := c.boot.Split(color, key, site)
	var h uintptr
	var err error
	if c.version >= NCCLSplitVersion {
		h, err = c.lib.NCCLSplit(c.h, color, key)
		if err != nil {
			err = fmt.Errorf("parallel: nccl: ncclCommSplit (color %d, key %d): %w", color, key, err)
		}
	} else {
		h, err = ncclInit(sub, c.lib)
	}
	c.must("split", err)
	s := &ncclComm{lib: c.lib, boot: sub, h: h, version: c.version, sh: c.sh, name: fmt.Sprintf("the split %s (colour %d) of %s", site, color, c.name)}
	c.sh.add(s)
	return s
}

// Traffic implements Comm: the bytes of the NCCL calls and of the bootstrap communicator's
// (splits and unique ids).
func (c *ncclComm) Traffic() Traffic {
	t := c.sh.ctr.snapshot()
	for k, v := range c.boot.Traffic() {
		t[k] += v
	}
	return t
}

// Close destroys the NCCL communicator (ncclCommDestroy) after its operations are done; the
// world's communicator closes every split made from it too, and stops the watchdog.
func (c *ncclComm) Close() error {
	if !c.root {
		c.sh.remove(c)
		return c.destroy()
	}
	c.sh.once.Do(func() { close(c.sh.stop) })
	if c.sh.aborted.Load() {
		return fmt.Errorf("parallel: nccl: rank %d: the watchdog aborted the communicators", c.sh.rank)
	}
	var first error
	for _, s := range c.sh.all() {
		c.sh.remove(s)
		if err := s.destroy(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// destroy issues what is queued, waits for it and destroys the communicator.
func (c *ncclComm) destroy() error {
	c.Start()
	if err := c.lib.NCCLSync(c.h); err != nil {
		return fmt.Errorf("parallel: nccl: %s: %w", c.name, err)
	}
	if err := c.lib.NCCLDestroy(c.h); err != nil {
		return fmt.Errorf("parallel: nccl: %s: ncclCommDestroy: %w", c.name, err)
	}
	return nil
}

// Queues reports whether c queues its operations until Start (NCCL's communicator).
func Queues(c Comm) bool {
	_, ok := c.(interface{ Start() })
	return ok
}

// Start issues the operations c has queued, on a communicator that queues them (NCCL's); on
// the others, whose operations start when posted, it does nothing. A schedule calls it after
// posting a step's sends and receives and before the compute they overlap.
func Start(c Comm) {
	if s, ok := c.(interface{ Start() }); ok {
		s.Start()
	}
}
