// Package transport is how distflash's ranks talk: the communicator interface (Comm:
// point-to-point sends and receives, collectives, splits, bytes counted per rank and call
// site) and its implementations: the in-process world (one goroutine per rank, real copies
// between rank-private buffers), MPI (mpi.go, build tag mpi: processes on one or many
// machines, launched by mpirun or srun, with a watchdog), NCCL (nccl.go: GPU buffers moved by
// NCCL, bootstrapped over MPI, with its own watchdog), and staging (staged.go: device buffers
// carried by a host communicator through host copies). Package parallel's schedules and FSDP
// are written against Comm alone.
package transport

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"distflash/kernels"
)

// Request is an outstanding non-blocking send or receive.
type Request interface {
	// Wait blocks until the operation has completed: for a send, the buffer may be reused;
	// for a receive, the data is in the buffer.
	Wait()
}

// Comm is one rank's view of a group of ranks. Every method of a collective must be called by
// all ranks of the group in the same order. Buffers belong to the rank's own kernels.Backend
// (host memory for the in-process and MPI worlds; device memory for NCCL); nothing is shared
// between ranks except by the copies these calls make.
//
// Every call names its call site (site), under which the bytes this rank sends are counted.
type Comm interface {
	// Rank is this rank's index in the group, 0 ≤ Rank < Size.
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// Isend starts sending buf to rank dst with tag; buf must not change until Wait returns.
	Isend(buf kernels.Buf, dst, tag int, site string) Request
	// Irecv starts receiving into buf from rank src the message sent with tag.
	Irecv(buf kernels.Buf, src, tag int, site string) Request
	// AllGather concatenates every rank's src into dst in rank order (dst.Len() = Size·src.Len()).
	AllGather(dst, src kernels.Buf, site string)
	// ReduceScatter sums src over the ranks and leaves chunk Rank of the sum in dst
	// (src.Len() = Size·dst.Len()). The sum runs in rank order, so it is deterministic.
	ReduceScatter(dst, src kernels.Buf, site string)
	// AllReduce sums buf over the ranks, in rank order, into every rank's buf.
	AllReduce(buf kernels.Buf, site string)
	// AllToAll sends chunk j of src to rank j and receives rank j's chunk Rank into chunk j
	// of dst (src.Len() = dst.Len() = Size·chunk).
	AllToAll(dst, src kernels.Buf, site string)
	// Barrier returns when every rank has called it.
	Barrier()
	// Split partitions the group: ranks with the same color form a new group, ordered by key
	// then by rank (rows or columns of a 2-D grid).
	Split(color, key int, site string) Comm
	// Traffic returns the bytes this rank has sent, by call site.
	Traffic() Traffic
}

// Traffic is bytes sent by one rank, per call site.
type Traffic map[string]int64

// Since is what was sent since before, an earlier snapshot of the same counts: by call site,
// the sites that sent nothing since left out.
func (t Traffic) Since(before Traffic) Traffic {
	out := Traffic{}
	for k, v := range t {
		if v != before[k] {
			out[k] = v - before[k]
		}
	}
	return out
}

// Total is the sum over call sites.
func (t Traffic) Total() int64 {
	var s int64
	for _, v := range t {
		s += v
	}
	return s
}

// Sum is the bytes under the call sites whose name starts with prefix (all sites for "").
func (t Traffic) Sum(prefix string) int64 {
	var s int64
	for k, v := range t {
		if strings.HasPrefix(k, prefix) {
			s += v
		}
	}
	return s
}

// String lists the sites in order.
func (t Traffic) String() string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%s=%d ", k, t[k])
	}
	return s
}

// counter accumulates a rank's traffic; safe for concurrent use.
type counter struct {
	mu sync.Mutex
	t  Traffic
}

func (c *counter) add(site string, bytes int64) {
	c.mu.Lock()
	if c.t == nil {
		c.t = Traffic{}
	}
	c.t[site] += bytes
	c.mu.Unlock()
}

func (c *counter) snapshot() Traffic {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Traffic{}
	for k, v := range c.t {
		out[k] = v
	}
	return out
}

func (c *counter) reset() {
	c.mu.Lock()
	c.t = nil
	c.mu.Unlock()
}

// Failure is how a communicator reports a call that failed on a working group: MPI or NCCL
// returned an error (a truncated message, a lost peer), or a receive got another number of
// values than it asked for — what ranks that disagree on the shapes they exchange meet. The Comm
// methods have no error result, since nothing in a step can go on after one; they panic with a
// *Failure, and Recover, deferred where a command calls its ranks, turns it into the error it
// returns. Any other panic is a bug and stays one.
type Failure struct{ msg string }

// Error implements error.
func (f *Failure) Error() string { return f.msg }

// fail panics with a *Failure saying what format and args say.
func fail(format string, args ...any) {
	panic(&Failure{msg: fmt.Sprintf(format, args...)})
}

// Recover, deferred, turns a panic with a *Failure into *err (when *err is nil) and lets any
// other panic go on.
func Recover(err *error) {
	p := recover()
	if p == nil {
		return
	}
	f, ok := p.(*Failure)
	if !ok {
		panic(p)
	}
	if *err == nil {
		*err = f
	}
}
