package parallel

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"distflash/kernels"
)

// World is the in-process world: Size ranks, one goroutine each, exchanging copies of their
// CPU buffers through mailboxes. It is what the tests and laptop runs use.
type World struct {
	size    int
	ctrs    []*counter
	comms   []Comm
	root    *group
	mu      sync.Mutex
	groups  map[string]*group
	abort   chan struct{}
	abortMu sync.Once

	linkBytesPerSec float64       // simulated link bandwidth; 0 = messages arrive at once
	linkLatency     time.Duration // simulated per-message latency
}

// SimulateLink makes every message arrive latency + bytes/bytesPerSec after it is sent, as
// over a network link, instead of at once. Only the receiver waits (sends stay eager), so a
// schedule that posts its next transfer before computing hides that time and one that
// transfers, then computes, does not: BenchmarkOverlap measures exactly this.
func (w *World) SimulateLink(bytesPerSec float64, latency time.Duration) {
	w.linkBytesPerSec, w.linkLatency = bytesPerSec, latency
}

// errAborted unwinds the ranks that wait on a message after another rank failed.
var errAborted = errors.New("parallel: another rank failed")

// NewWorld returns an in-process world of size ranks.
func NewWorld(size int) *World {
	if size < 1 {
		panic(fmt.Sprintf("parallel: world of %d ranks", size))
	}
	w := &World{size: size, groups: map[string]*group{}, abort: make(chan struct{})}
	for i := 0; i < size; i++ {
		w.ctrs = append(w.ctrs, &counter{})
	}
	ranks := make([]int, size)
	for i := range ranks {
		ranks[i] = i
	}
	w.root = w.newGroup("world", ranks)
	for r := 0; r < size; r++ {
		w.comms = append(w.comms, &inprocComm{g: w.root, rank: r, ctr: w.ctrs[r]})
	}
	return w
}

// Size is the number of ranks.
func (w *World) Size() int { return w.size }

// Comm returns rank's communicator over the whole world (the same one on every call, so the
// groups it splits off are named alike on every rank).
func (w *World) Comm(rank int) Comm { return w.comms[rank] }

// Traffic returns the bytes rank has sent, by call site, over all its groups.
func (w *World) Traffic(rank int) Traffic { return w.ctrs[rank].snapshot() }

// ResetTraffic clears every rank's byte counts.
func (w *World) ResetTraffic() {
	for _, c := range w.ctrs {
		c.reset()
	}
}

// Run calls fn on every rank in its own goroutine and waits for all; it may be called again
// for the next piece of work. The first error or panic aborts the ranks still waiting for
// messages (for good: the world is unusable afterwards) and is returned, naming the rank.
func (w *World) Run(fn func(c Comm) error) error {
	errs := make([]error, w.size)
	var wg sync.WaitGroup
	for r := 0; r < w.size; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					if p == errAborted {
						errs[r] = errAborted
					} else {
						errs[r] = fmt.Errorf("rank %d panicked: %v\n%s", r, p, debug.Stack())
					}
					w.abortMu.Do(func() { close(w.abort) })
				}
			}()
			if err := fn(w.Comm(r)); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				w.abortMu.Do(func() { close(w.abort) })
			}
		}(r)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && err != errAborted {
			return err
		}
	}
	return nil
}

// group is a set of world ranks with its own mailboxes.
type group struct {
	world *World
	id    string
	ranks []int // world rank of each member
	mu    sync.Mutex
	boxes map[[3]int]*mailbox // (src, dst, tag) → messages in order
}

func (w *World) newGroup(id string, ranks []int) *group {
	return &group{world: w, id: id, ranks: ranks, boxes: map[[3]int]*mailbox{}}
}

func (g *group) box(src, dst, tag int) *mailbox {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := [3]int{src, dst, tag}
	b := g.boxes[k]
	if b == nil {
		b = &mailbox{ready: make(chan struct{}, 1)}
		g.boxes[k] = b
	}
	return b
}

// mailbox holds the messages from one rank to another under one tag. Receives are matched to
// messages in the order they were posted (MPI's rule), not the order they are waited on: a
// receive takes a ticket when posted and gets the ticket-th message.
type mailbox struct {
	mu      sync.Mutex
	msgs    map[int]message // arrival number → message not yet taken
	arrived int
	tickets int
	ready   chan struct{}
}

// message is a copy of a sent buffer and the time it may be received (its send time plus
// the simulated link's transfer time; zero without a simulated link).
type message struct {
	data []float32
	at   time.Time
}

func (b *mailbox) put(m message) {
	b.mu.Lock()
	if b.msgs == nil {
		b.msgs = map[int]message{}
	}
	b.msgs[b.arrived] = m
	b.arrived++
	b.mu.Unlock()
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// ticket reserves the next message for a receive being posted.
func (b *mailbox) ticket() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tickets++
	return b.tickets - 1
}

// take waits for message number t. Only the receiving rank's goroutine waits on a mailbox,
// one receive at a time, so the single wake-up token cannot be lost to another waiter.
func (b *mailbox) take(t int, abort <-chan struct{}) []float32 {
	for {
		b.mu.Lock()
		if m, ok := b.msgs[t]; ok {
			delete(b.msgs, t)
			b.mu.Unlock()
			if d := time.Until(m.at); d > 0 {
				time.Sleep(d) // still on the simulated wire
			}
			return m.data
		}
		b.mu.Unlock()
		select {
		case <-b.ready:
		case <-abort:
			panic(errAborted)
		}
	}
}

// inprocComm is one rank's handle on a group.
type inprocComm struct {
	g      *group
	rank   int
	ctr    *counter
	splits int // Split calls so far, to name the groups they make
}

// collTag is the tag of collective traffic; messages between a pair stay in order, and every
// rank calls collectives in the same order, so one tag serves them all.
const collTag = -1

func host(b kernels.Buf) []float32 { return kernels.Host(b) }

func (c *inprocComm) Rank() int { return c.rank }
func (c *inprocComm) Size() int { return len(c.g.ranks) }

// Traffic implements Comm.
func (c *inprocComm) Traffic() Traffic { return c.ctr.snapshot() }

type doneRequest struct{}

func (doneRequest) Wait() {}

type recvRequest struct {
	once sync.Once
	fn   func()
}

func (r *recvRequest) Wait() { r.once.Do(r.fn) }

// send copies buf now (eager), so the sender may reuse it at once.
func (c *inprocComm) send(buf []float32, dst, tag int, site string) {
	if dst < 0 || dst >= c.Size() {
		panic(fmt.Sprintf("parallel: send to rank %d of %d", dst, c.Size()))
	}
	m := make([]float32, len(buf))
	copy(m, buf)
	c.ctr.add(site, int64(4*len(buf)))
	msg := message{data: m}
	if w := c.g.world; w.linkBytesPerSec > 0 {
		msg.at = time.Now().Add(w.linkLatency + time.Duration(float64(4*len(buf))/w.linkBytesPerSec*float64(time.Second)))
	}
	c.g.box(c.rank, dst, tag).put(msg)
}

func (c *inprocComm) recv(buf []float32, src, tag int) {
	b := c.g.box(src, c.rank, tag)
	c.take(buf, b, b.ticket(), src, tag)
}

// take waits for message t of mailbox b and copies it into buf.
func (c *inprocComm) take(buf []float32, b *mailbox, t, src, tag int) {
	m := b.take(t, c.g.world.abort)
	if len(m) != len(buf) {
		panic(fmt.Sprintf("parallel: rank %d expected %d values from rank %d (tag %d), got %d", c.rank, len(buf), src, tag, len(m)))
	}
	copy(buf, m)
}

// Isend implements Comm.
func (c *inprocComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
	c.send(host(buf), dst, tag, site)
	return doneRequest{}
}

// Irecv implements Comm.
func (c *inprocComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
	h := host(buf)
	b := c.g.box(src, c.rank, tag)
	t := b.ticket() // matched in post order
	return &recvRequest{fn: func() { c.take(h, b, t, src, tag) }}
}

// AllGather implements Comm.
func (c *inprocComm) AllGather(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	n := len(s)
	if len(d) != P*n {
		panic(fmt.Sprintf("parallel: all-gather of %d into %d on %d ranks", n, len(d), P))
	}
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.send(s, r, collTag, site)
		}
	}
	copy(d[c.rank*n:], s)
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(d[r*n:(r+1)*n], r, collTag)
		}
	}
}

// ReduceScatter implements Comm.
func (c *inprocComm) ReduceScatter(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	n := len(d)
	if len(s) != P*n {
		panic(fmt.Sprintf("parallel: reduce-scatter of %d into %d on %d ranks", len(s), n, P))
	}
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.send(s[r*n:(r+1)*n], r, collTag, site)
		}
	}
	parts := make([][]float32, P)
	for r := 0; r < P; r++ {
		if r == c.rank {
			parts[r] = s[r*n : (r+1)*n]
			continue
		}
		parts[r] = make([]float32, n)
		c.recv(parts[r], r, collTag)
	}
	for i := range d {
		var sum float32
		for r := 0; r < P; r++ {
			sum += parts[r][i]
		}
		d[i] = sum
	}
}

// AllReduce implements Comm: a reduce-scatter over near-equal chunks then an all-gather, the
// bandwidth-optimal pattern (2·(P−1)/P of the buffer sent per rank).
func (c *inprocComm) AllReduce(buf kernels.Buf, site string) {
	b, P := host(buf), c.Size()
	if P == 1 {
		return
	}
	lo := func(r int) int { return r * len(b) / P }
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.send(b[lo(r):lo(r+1)], r, collTag, site)
		}
	}
	mine := b[lo(c.rank):lo(c.rank+1)]
	parts := make([][]float32, P)
	for r := 0; r < P; r++ {
		if r != c.rank {
			parts[r] = make([]float32, len(mine))
			c.recv(parts[r], r, collTag)
		}
	}
	sum := make([]float32, len(mine))
	for i := range sum {
		var s float32
		for r := 0; r < P; r++ {
			if r == c.rank {
				s += mine[i]
			} else {
				s += parts[r][i]
			}
		}
		sum[i] = s
	}
	copy(mine, sum)
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.send(mine, r, collTag, site)
		}
	}
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(b[lo(r):lo(r+1)], r, collTag)
		}
	}
}

// AllToAll implements Comm.
func (c *inprocComm) AllToAll(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	if len(d) != len(s) || len(s)%P != 0 {
		panic(fmt.Sprintf("parallel: all-to-all of %d into %d on %d ranks", len(s), len(d), P))
	}
	n := len(s) / P
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.send(s[r*n:(r+1)*n], r, collTag, site)
		}
	}
	copy(d[c.rank*n:(c.rank+1)*n], s[c.rank*n:(c.rank+1)*n])
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(d[r*n:(r+1)*n], r, collTag)
		}
	}
}

// Barrier implements Comm.
func (c *inprocComm) Barrier() {
	for r := 0; r < c.Size(); r++ {
		if r != c.rank {
			c.send(nil, r, collTag, "barrier")
		}
	}
	for r := 0; r < c.Size(); r++ {
		if r != c.rank {
			c.recv(nil, r, collTag)
		}
	}
}

// Split implements Comm.
func (c *inprocComm) Split(color, key int, site string) Comm {
	P := c.Size()
	if abs(color) >= 1<<24 || abs(key) >= 1<<24 {
		panic(fmt.Sprintf("parallel: split color %d, key %d: must be below 2^24 in magnitude", color, key))
	}
	mine := kernels.NewCPU().Alloc(2)
	host(mine)[0], host(mine)[1] = float32(color), float32(key)
	all := kernels.NewCPU().Alloc(2 * P)
	c.AllGather(all, mine, site)
	a := host(all)
	type member struct{ key, rank int }
	var members []member
	for r := 0; r < P; r++ {
		if int(a[2*r]) == color {
			members = append(members, member{int(a[2*r+1]), r})
		}
	}
	sort.Slice(members, func(i, j int) bool {
		if members[i].key != members[j].key {
			return members[i].key < members[j].key
		}
		return members[i].rank < members[j].rank
	})
	ranks := make([]int, len(members))
	newRank := 0
	for i, m := range members {
		ranks[i] = c.g.ranks[m.rank]
		if m.rank == c.rank {
			newRank = i
		}
	}
	id := fmt.Sprintf("%s/%d:%d", c.g.id, c.splits, color)
	c.splits++
	w := c.g.world
	w.mu.Lock()
	g := w.groups[id]
	if g == nil {
		g = w.newGroup(id, ranks)
		w.groups[id] = g
	}
	w.mu.Unlock()
	return &inprocComm{g: g, rank: newRank, ctr: c.ctr}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
