package transport

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
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

	copies atomic.Int64 // copies of non-empty messages (one per message, two for a detached send)
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
					if f, ok := p.(*Failure); ok {
						errs[r] = fmt.Errorf("rank %d: %w", r, f)
					} else if p == errAborted {
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
		b = &mailbox{slots: map[int]*slot{}, copies: &g.world.copies}
		g.boxes[k] = b
	}
	return b
}

// mailbox holds the messages from one rank to another under one tag. Receives are matched to
// messages in the order they were posted (MPI's rule), not the order they are waited on: the
// k-th send and the k-th posted receive meet in slot k.
//
// Each message is copied once, from the sender's buffer straight into the receiver's, by
// whichever side comes second: a send that finds its receive posted copies at once; a
// receive posted after its send copies from the sender's buffer when it is posted (the
// sender must leave the buffer alone until its request's Wait returns, as Comm says). Only a
// send whose Wait comes before the receive is posted copies the message aside (so that Wait
// returns at once, as an eager send does) and the receive then copies it again.
type mailbox struct {
	mu      sync.Mutex
	slots   map[int]*slot // slots with only one side so far
	arrived int           // sends so far
	tickets int           // receives posted so far
	copies  *atomic.Int64 // the world's copy count
}

// slot is one message's meeting point. Fields are guarded by the mailbox's mu; done is
// closed when the data is in the receiver's buffer (or the lengths did not match).
type slot struct {
	src     []float32 // the sender's buffer (or its private copy, once detached)
	dst     []float32 // the receiver's buffer
	sent    bool      // the send has arrived
	posted  bool      // the receive is posted
	copying bool      // the copy is in progress, outside the lock
	bad     int       // length of a send that did not fit the receive, else -1
	at      time.Time // the simulated arrival (zero without a simulated link)
	done    chan struct{}
}

// slot returns slot k, making it if needed; b.mu must be held.
func (b *mailbox) slot(k int) *slot {
	sl := b.slots[k]
	if sl == nil {
		sl = &slot{bad: -1, done: make(chan struct{})}
		b.slots[k] = sl
	}
	return sl
}

// match copies the message of sl into the receive; b.mu is held on entry and on return (the
// copy runs without it) and sl is complete afterwards.
func (b *mailbox) match(k int, sl *slot) {
	delete(b.slots, k)
	if len(sl.src) != len(sl.dst) {
		sl.bad = len(sl.src)
		close(sl.done)
		return
	}
	sl.copying = true
	b.mu.Unlock()
	if copy(sl.dst, sl.src) > 0 {
		b.copies.Add(1)
	}
	b.mu.Lock()
	sl.copying = false
	sl.src = nil
	close(sl.done)
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

// sendRequest is a send whose receive was not posted yet when it was made.
type sendRequest struct {
	b    *mailbox
	sl   *slot
	once sync.Once
}

// Wait returns when the sender may reuse its buffer: at once if the receiver copied it, after
// the copy if it is copying, else after copying the message aside.
func (r *sendRequest) Wait() {
	r.once.Do(func() {
		b, sl := r.b, r.sl
		b.mu.Lock()
		switch {
		case sl.copying:
			b.mu.Unlock()
			<-sl.done
			return
		case sl.posted: // matched and copied
		default:
			if len(sl.src) > 0 {
				sl.src = append([]float32(nil), sl.src...)
				b.copies.Add(1)
			}
		}
		b.mu.Unlock()
	})
}

type recvRequest struct {
	once sync.Once
	fn   func()
}

func (r *recvRequest) Wait() { r.once.Do(r.fn) }

// send starts sending buf: the returned request's Wait must come before buf changes.
func (c *inprocComm) send(buf []float32, dst, tag int, site string) Request {
	if dst < 0 || dst >= c.Size() {
		panic(fmt.Sprintf("parallel: send to rank %d of %d", dst, c.Size()))
	}
	c.ctr.add(site, int64(4*len(buf)))
	var at time.Time
	if w := c.g.world; w.linkBytesPerSec > 0 {
		at = time.Now().Add(w.linkLatency + time.Duration(float64(4*len(buf))/w.linkBytesPerSec*float64(time.Second)))
	}
	b := c.g.box(c.rank, dst, tag)
	b.mu.Lock()
	k := b.arrived
	b.arrived++
	sl := b.slot(k)
	sl.src, sl.sent, sl.at = buf, true, at
	if sl.posted {
		b.match(k, sl)
		b.mu.Unlock()
		return doneRequest{}
	}
	b.mu.Unlock()
	return &sendRequest{b: b, sl: sl}
}

// post posts a receive into buf from src and returns the function that waits for it.
func (c *inprocComm) post(buf []float32, src, tag int) func() {
	b := c.g.box(src, c.rank, tag)
	b.mu.Lock()
	k := b.tickets
	b.tickets++
	sl := b.slot(k)
	sl.dst, sl.posted = buf, true
	if sl.sent {
		b.match(k, sl)
	}
	b.mu.Unlock()
	abort := c.g.world.abort
	return func() {
		select {
		case <-sl.done:
		case <-abort:
			panic(errAborted)
		}
		if sl.bad >= 0 {
			fail("parallel: rank %d expected %d values from rank %d (tag %d), got %d", c.rank, len(buf), src, tag, sl.bad)
		}
		if d := time.Until(sl.at); d > 0 {
			time.Sleep(d) // still on the simulated wire
		}
	}
}

// recv receives into buf from src (blocking).
func (c *inprocComm) recv(buf []float32, src, tag int) { c.post(buf, src, tag)() }

// waitAll waits for requests.
func waitAll(reqs []Request) {
	for _, r := range reqs {
		r.Wait()
	}
}

// Isend implements Comm.
func (c *inprocComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
	return c.send(host(buf), dst, tag, site)
}

// Irecv implements Comm.
func (c *inprocComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
	return &recvRequest{fn: c.post(host(buf), src, tag)} // matched in post order
}

// AllGather implements Comm.
func (c *inprocComm) AllGather(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	n := len(s)
	if len(d) != P*n {
		panic(fmt.Sprintf("parallel: all-gather of %d into %d on %d ranks", n, len(d), P))
	}
	var sends []Request
	for r := 0; r < P; r++ {
		if r != c.rank {
			sends = append(sends, c.send(s, r, collTag, site))
		}
	}
	copy(d[c.rank*n:], s)
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(d[r*n:(r+1)*n], r, collTag)
		}
	}
	waitAll(sends)
}

// ReduceScatter implements Comm.
func (c *inprocComm) ReduceScatter(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	n := len(d)
	if len(s) != P*n {
		panic(fmt.Sprintf("parallel: reduce-scatter of %d into %d on %d ranks", len(s), n, P))
	}
	var sends []Request
	for r := 0; r < P; r++ {
		if r != c.rank {
			sends = append(sends, c.send(s[r*n:(r+1)*n], r, collTag, site))
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
	waitAll(sends)
}

// AllReduce implements Comm: a reduce-scatter over near-equal chunks then an all-gather, the
// bandwidth-optimal pattern (2·(P−1)/P of the buffer sent per rank).
func (c *inprocComm) AllReduce(buf kernels.Buf, site string) {
	b, P := host(buf), c.Size()
	if P == 1 {
		return
	}
	lo := func(r int) int { return r * len(b) / P }
	var sends []Request
	for r := 0; r < P; r++ {
		if r != c.rank {
			sends = append(sends, c.send(b[lo(r):lo(r+1)], r, collTag, site))
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
	waitAll(sends) // the receives below overwrite what was sent
	copy(mine, sum)
	sends = sends[:0]
	for r := 0; r < P; r++ {
		if r != c.rank {
			sends = append(sends, c.send(mine, r, collTag, site))
		}
	}
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(b[lo(r):lo(r+1)], r, collTag)
		}
	}
	waitAll(sends)
}

// AllToAll implements Comm.
func (c *inprocComm) AllToAll(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.Size()
	if len(d) != len(s) || len(s)%P != 0 {
		panic(fmt.Sprintf("parallel: all-to-all of %d into %d on %d ranks", len(s), len(d), P))
	}
	n := len(s) / P
	var sends []Request
	for r := 0; r < P; r++ {
		if r != c.rank {
			sends = append(sends, c.send(s[r*n:(r+1)*n], r, collTag, site))
		}
	}
	copy(d[c.rank*n:(c.rank+1)*n], s[c.rank*n:(c.rank+1)*n])
	for r := 0; r < P; r++ {
		if r != c.rank {
			c.recv(d[r*n:(r+1)*n], r, collTag)
		}
	}
	waitAll(sends)
}

// Barrier implements Comm.
func (c *inprocComm) Barrier() {
	for r := 0; r < c.Size(); r++ {
		if r != c.rank {
			c.send(nil, r, collTag, "barrier").Wait()
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
