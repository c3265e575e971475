package transport_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// commSizes are the world sizes the communicator tests run on: one rank, even and odd.
var commSizes = []int{1, 2, 3, 5}

// commRunWorld runs fn on every rank of a fresh world of P ranks and fails the test on an error
// or when the ranks do not finish within 20 s (a hang).
func commRunWorld(t *testing.T, P int, fn func(c transport.Comm, be kernels.Backend) error) *transport.World {
	t.Helper()
	w := transport.NewWorld(P)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(func(c transport.Comm) error { return fn(c, kernels.NewCPU()) }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("world of %d ranks did not finish: %v", P, ctx.Err())
	}
	return w
}

// commBuf returns a buffer of be holding x.
func commBuf(be kernels.Backend, x []float32) kernels.Buf {
	b := be.Alloc(len(x))
	be.Upload(b, x)
	return b
}

// commEqualBits reports the first index where got and want differ bit for bit, or −1.
func commEqualBits(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// commAllReduceBytes is what rank r of P sends in an all-reduce of n values: a reduce-scatter
// over the chunks [q·n/P, (q+1)·n/P) then an all-gather, so it sends every chunk but its own
// once and its own chunk n_r to the P−1 others: (n − n_r + (P−1)·n_r)·4 bytes. Summed over
// the ranks that is 2·(P−1)·n·4, the bandwidth-optimal volume.
func commAllReduceBytes(n, P, r int) int64 {
	nr := (r+1)*n/P - r*n/P
	return int64((n - nr + (P-1)*nr) * 4)
}

// TestCommPointToPoint: every rank sends to the next rank of the ring several messages under
// several tags, all in flight at once; the receiver posts its receives tag by tag in another
// order than they were sent and must get each tag's messages in the order they were sent.
// A send buffer changed after Isend's Wait does not change what arrives, and the bytes are
// counted under the call site: messages·len·4.
func TestCommPointToPoint(t *testing.T) {
	const (
		perTag = 3
		length = 5
	)
	tags := []int{0, 1, 7}
	val := func(src, tag, seq, i int) float32 { return float32(1000*src + 100*tag + 10*seq + i) }
	for _, P := range commSizes {
		t.Run(fmt.Sprintf("P%d", P), func(t *testing.T) {
			commRunWorld(t, P, func(c transport.Comm, be kernels.Backend) error {
				r := c.Rank()
				next, prev := (r+1)%P, (r+P-1)%P
				buf := be.Alloc(length)
				for seq := 0; seq < perTag; seq++ { // interleaved: tag 0, 1, 7, 0, 1, 7, …
					for _, tag := range tags {
						x := make([]float32, length)
						for i := range x {
							x[i] = val(r, tag, seq, i)
						}
						be.Upload(buf, x)
						c.Isend(buf, next, tag, "p2p").Wait()
						be.Zero(buf) // the message was copied: reusing buf changes nothing
					}
				}
				type posted struct {
					tag, seq int
					buf      kernels.Buf
					req      transport.Request
				}
				var all []posted
				for i := len(tags) - 1; i >= 0; i-- { // tags in reverse order, each tag's in order
					for seq := 0; seq < perTag; seq++ {
						b := be.Alloc(length)
						all = append(all, posted{tags[i], seq, b, c.Irecv(b, prev, tags[i], "p2p")})
					}
				}
				for _, p := range all {
					p.req.Wait()
					got := kernels.Host(p.buf)
					for i := range got {
						if want := val(prev, p.tag, p.seq, i); got[i] != want {
							return fmt.Errorf("tag %d message %d value %d: got %v, want %v", p.tag, p.seq, i, got[i], want)
						}
					}
				}
				return transporttest.CheckTraffic(c.Traffic(), transport.Traffic{"p2p": int64(perTag * len(tags) * length * 4)})
			})
		})
	}
}

// TestCommIrecvMatchesInPostOrder: two receives posted for the same source and tag match the
// messages in the order they were posted, whatever the order they are waited for (MPI's
// non-overtaking rule, which a schedule that prefetches several blocks relies on).
func TestCommIrecvMatchesInPostOrder(t *testing.T) {
	commRunWorld(t, 2, func(c transport.Comm, be kernels.Backend) error {
		if c.Rank() == 0 {
			for i := 1; i <= 2; i++ {
				c.Isend(commBuf(be, []float32{float32(i)}), 1, 0, "p2p").Wait()
			}
			return nil
		}
		first, second := be.Alloc(1), be.Alloc(1)
		r1 := c.Irecv(first, 0, 0, "p2p")
		r2 := c.Irecv(second, 0, 0, "p2p")
		r2.Wait()
		r1.Wait()
		if a, b := kernels.Host(first)[0], kernels.Host(second)[0]; a != 1 || b != 2 {
			return fmt.Errorf("first-posted receive got message %v, second-posted got %v; want 1, 2", a, b)
		}
		return nil
	})
}

// TestCommCollectives checks every collective's result and its bytes on P ranks. Sums are
// compared bit for bit with a float32 sum in rank order, over values whose sum depends on the
// order (1e8 + 1 − 1e8), so a reduction in any other order would show.
func TestCommCollectives(t *testing.T) {
	cases := []struct {
		name string
		fn   func(c transport.Comm, be kernels.Backend) error
	}{
		{"AllGather", func(c transport.Comm, be kernels.Backend) error {
			const n = 4
			P, r := c.Size(), c.Rank()
			dst := be.Alloc(P * n)
			c.AllGather(dst, commBuf(be, mixedVec(r, 0, n)), "ag")
			var want []float32
			for q := 0; q < P; q++ {
				want = append(want, mixedVec(q, 0, n)...)
			}
			if i := commEqualBits(kernels.Host(dst), want); i >= 0 {
				return fmt.Errorf("element %d: got %v, want %v", i, kernels.Host(dst), want)
			}
			// every rank sends its src to every other rank: (P−1)·len(src)·4 bytes
			return transporttest.CheckTraffic(c.Traffic(), transport.Traffic{"ag": int64((P - 1) * n * 4)})
		}},
		{"ReduceScatter", func(c transport.Comm, be kernels.Backend) error {
			const n = 3
			P, r := c.Size(), c.Rank()
			dst := be.Alloc(n)
			c.ReduceScatter(dst, commBuf(be, mixedVec(r, 0, P*n)), "rs")
			want := make([]float32, n)
			for i := range want {
				want[i] = rankOrderSum(P, r*n+i)
			}
			if i := commEqualBits(kernels.Host(dst), want); i >= 0 {
				return fmt.Errorf("element %d: got %v, want the rank-order sum %v", i, kernels.Host(dst), want)
			}
			// every rank sends every other rank its chunk: (P−1)·len(dst)·4 bytes
			return transporttest.CheckTraffic(c.Traffic(), transport.Traffic{"rs": int64((P - 1) * n * 4)})
		}},
		{"AllReduce", func(c transport.Comm, be kernels.Backend) error {
			P, r := c.Size(), c.Rank()
			want := transport.Traffic{}
			for _, n := range []int{7, 3, 1, 11} { // 7 and 11 divisible by none of 2, 3, 5; 3, 1 < P
				site := fmt.Sprintf("ar%d", n)
				b := commBuf(be, mixedVec(r, 0, n))
				c.AllReduce(b, site)
				w := make([]float32, n)
				for i := range w {
					w[i] = rankOrderSum(P, i)
				}
				if i := commEqualBits(kernels.Host(b), w); i >= 0 {
					return fmt.Errorf("length %d element %d: got %v, want the rank-order sum %v", n, i, kernels.Host(b), w)
				}
				if P > 1 {
					want[site] = commAllReduceBytes(n, P, r)
				}
			}
			return transporttest.CheckTraffic(c.Traffic(), want)
		}},
		{"AllToAll", func(c transport.Comm, be kernels.Backend) error {
			const n = 2
			P, r := c.Size(), c.Rank()
			src := make([]float32, P*n)
			for j := 0; j < P; j++ { // chunk j is for rank j
				for i := 0; i < n; i++ {
					src[j*n+i] = float32(100*r + 10*j + i)
				}
			}
			dst := be.Alloc(P * n)
			c.AllToAll(dst, commBuf(be, src), "a2a")
			for j := 0; j < P; j++ { // chunk j came from rank j: its chunk r
				for i := 0; i < n; i++ {
					if got, want := kernels.Host(dst)[j*n+i], float32(100*j+10*r+i); got != want {
						return fmt.Errorf("chunk %d element %d: got %v, want %v", j, i, got, want)
					}
				}
			}
			// every chunk but its own leaves: (P−1)·chunk·4 bytes
			return transporttest.CheckTraffic(c.Traffic(), transport.Traffic{"a2a": int64((P - 1) * n * 4)})
		}},
	}
	for _, tc := range cases {
		for _, P := range commSizes {
			t.Run(fmt.Sprintf("%s/P%d", tc.name, P), func(t *testing.T) {
				commRunWorld(t, P, tc.fn)
			})
		}
	}
}

// TestCommBarrier: no rank leaves the barrier before every rank has reached it (the last
// rank arrives late), several times in a row; a barrier moves no data.
func TestCommBarrier(t *testing.T) {
	for _, P := range commSizes {
		t.Run(fmt.Sprintf("P%d", P), func(t *testing.T) {
			var arrived atomic.Int64
			commRunWorld(t, P, func(c transport.Comm, be kernels.Backend) error {
				for round := 1; round <= 3; round++ {
					if c.Rank() == P-1 {
						time.Sleep(5 * time.Millisecond)
					}
					arrived.Add(1)
					c.Barrier()
					if got := arrived.Load(); got < int64(round*P) {
						return fmt.Errorf("round %d: left the barrier when %d of %d arrivals had happened", round, got, round*P)
					}
					c.Barrier() // nobody starts the next round before all have checked
				}
				if b := c.Traffic().Total(); b != 0 {
					return fmt.Errorf("barrier sent %d bytes", b)
				}
				return nil
			})
		})
	}
}

// TestCommSplit cuts 6 ranks into the rows and the columns of a 2×3 grid (rank = 3·row + col)
// and runs collectives inside the sub-groups; a key reorders the ranks of a group.
func TestCommSplit(t *testing.T) {
	const rows, cols = 2, 3
	cases := []struct {
		name        string
		color, key  func(row, col int) int
		size        int
		rank        func(row, col int) int
		memberWorld func(row, col, i int) int // world rank of sub-group rank i
	}{
		{"rows", func(row, col int) int { return row }, func(row, col int) int { return col }, cols,
			func(row, col int) int { return col }, func(row, col, i int) int { return row*cols + i }},
		{"cols", func(row, col int) int { return col }, func(row, col int) int { return row }, rows,
			func(row, col int) int { return row }, func(row, col, i int) int { return i*cols + col }},
		{"rows-reversed", func(row, col int) int { return row }, func(row, col int) int { return -col }, cols,
			func(row, col int) int { return cols - 1 - col }, func(row, col, i int) int { return row*cols + cols - 1 - i }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			commRunWorld(t, rows*cols, func(c transport.Comm, be kernels.Backend) error {
				row, col := c.Rank()/cols, c.Rank()%cols
				g := c.Split(tc.color(row, col), tc.key(row, col), "split")
				if g.Size() != tc.size || g.Rank() != tc.rank(row, col) {
					return fmt.Errorf("(%d,%d): sub-group rank %d of %d, want %d of %d", row, col, g.Rank(), g.Size(), tc.rank(row, col), tc.size)
				}
				// AllGather of the world ranks lists the members in sub-group order.
				all := be.Alloc(g.Size())
				g.AllGather(all, commBuf(be, []float32{float32(c.Rank())}), "sub.ag")
				for i, w := range kernels.Host(all) {
					if want := tc.memberWorld(row, col, i); int(w) != want {
						return fmt.Errorf("(%d,%d): member %d is world rank %v, want %d", row, col, i, w, want)
					}
				}
				// AllReduce stays inside the group.
				s := commBuf(be, []float32{float32(c.Rank())})
				g.AllReduce(s, "sub.ar")
				want := 0
				for i := 0; i < g.Size(); i++ {
					want += tc.memberWorld(row, col, i)
				}
				if got := kernels.Host(s)[0]; got != float32(want) {
					return fmt.Errorf("(%d,%d): all-reduce in the group gave %v, want %d", row, col, got, want)
				}
				// Split all-gathers (color, key) over the parent: (P−1)·2·4 bytes; then the
				// group's all-gather and all-reduce of 1 value each.
				P, G := c.Size(), g.Size()
				ar := int64(0)
				if G > 1 {
					ar = commAllReduceBytes(1, G, g.Rank())
				}
				return transporttest.CheckTraffic(c.Traffic(), transport.Traffic{"split": int64((P - 1) * 2 * 4), "sub.ag": int64((G - 1) * 4), "sub.ar": ar})
			})
		})
	}
	// Rows then columns from the same world: both groupings coexist, and a collective in one
	// does not see messages of the other.
	t.Run("rows-and-cols", func(t *testing.T) {
		commRunWorld(t, rows*cols, func(c transport.Comm, be kernels.Backend) error {
			row, col := c.Rank()/cols, c.Rank()%cols
			rg := c.Split(row, col, "split")
			cg := c.Split(col, row, "split")
			a, b := commBuf(be, []float32{1}), commBuf(be, []float32{10})
			cg.AllReduce(b, "col")
			rg.AllReduce(a, "row")
			if ga, gb := kernels.Host(a)[0], kernels.Host(b)[0]; ga != cols || gb != 10*rows {
				return fmt.Errorf("(%d,%d): row sum %v (want %d), column sum %v (want %d)", row, col, ga, cols, gb, 10*rows)
			}
			return nil
		})
	})
}

// TestCommWorldRunFailure: when one rank returns an error or panics while the others wait for its
// messages (point-to-point or in a collective), Run returns, without hanging, an error that
// names the failing rank and carries its cause.
func TestCommWorldRunFailure(t *testing.T) {
	const bad = 2
	cases := []struct {
		name string
		fail func() error
		wait func(c transport.Comm, be kernels.Backend)
		want []string
	}{
		{"error/irecv", func() error { return errors.New("boom") },
			func(c transport.Comm, be kernels.Backend) { c.Irecv(be.Alloc(1), bad, 0, "p2p").Wait() },
			[]string{"rank 2", "boom"}},
		{"panic/irecv", func() error { panic("kaboom") },
			func(c transport.Comm, be kernels.Backend) { c.Irecv(be.Alloc(1), bad, 0, "p2p").Wait() },
			[]string{"rank 2", "panicked", "kaboom"}},
		{"error/allreduce", func() error { return errors.New("boom") },
			func(c transport.Comm, be kernels.Backend) { c.AllReduce(be.Alloc(7), "ar") },
			[]string{"rank 2", "boom"}},
		{"panic/barrier", func() error { panic("kaboom") },
			func(c transport.Comm, be kernels.Backend) { c.Barrier() },
			[]string{"rank 2", "panicked", "kaboom"}},
	}
	for _, tc := range cases {
		for _, P := range []int{3, 5} {
			t.Run(fmt.Sprintf("%s/P%d", tc.name, P), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				w := transport.NewWorld(P)
				done := make(chan error, 1)
				go func() {
					done <- w.Run(func(c transport.Comm) error {
						if c.Rank() == bad {
							time.Sleep(5 * time.Millisecond) // the others are waiting by now
							return tc.fail()
						}
						tc.wait(c, kernels.NewCPU())
						return nil
					})
				}()
				select {
				case err := <-done:
					if err == nil {
						t.Fatal("Run returned no error")
					}
					for _, s := range tc.want {
						if !strings.Contains(err.Error(), s) {
							t.Errorf("error %q does not contain %q", commFirstLine(err.Error()), s)
						}
					}
				case <-ctx.Done():
					t.Fatal("Run hung after rank 2 failed")
				}
			})
		}
	}
}

// commFirstLine is s up to its first newline (a panic's error carries the stack).
func commFirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestInprocCopiesOnce: the in-process world copies a message once, from the sender's buffer
// into the receiver's, whether the receive is posted before the send or after it (as long as
// it comes before the send's Wait), and the data is the sender's at the send even when the
// sender reuses its buffer right after Wait. A send waited on before its receive is posted
// is copied aside, a second copy.
func TestInprocCopiesOnce(t *testing.T) {
	w := transport.NewWorld(2)
	be := kernels.NewCPU()
	bufs := [2]kernels.Buf{commBuf(be, []float32{1, 2, 3}), commBuf(be, []float32{4, 5, 6})}
	got := [2]kernels.Buf{be.Alloc(3), be.Alloc(3)}
	check := func(step string, wantCopies int64) {
		t.Helper()
		for r, want := range [][]float32{{4, 5, 6}, {1, 2, 3}} {
			if i := commEqualBits(kernels.Host(got[r]), want); i >= 0 {
				t.Fatalf("%s: rank %d received %v, want %v", step, r, kernels.Host(got[r]), want)
			}
		}
		if n := transport.TakeCopies(w); n != wantCopies {
			t.Fatalf("%s: %d copies for 2 messages, want %d", step, n, wantCopies)
		}
		for r := range got {
			be.Zero(got[r])
		}
	}
	exchange := func(recvFirst, waitSendFirst bool) func(c transport.Comm) error {
		return func(c transport.Comm) error {
			r := c.Rank()
			var rq, sq transport.Request
			if recvFirst {
				rq = c.Irecv(got[r], 1-r, 3, "p2p")
				c.Barrier() // both receives are posted before either send
				sq = c.Isend(bufs[r], 1-r, 3, "p2p")
			} else {
				sq = c.Isend(bufs[r], 1-r, 3, "p2p")
				if waitSendFirst {
					sq.Wait()
					kernels.Host(bufs[r])[0] += 100 // reuse: the message was copied aside
				}
				c.Barrier() // both sends are made before either receive is posted
				rq = c.Irecv(got[r], 1-r, 3, "p2p")
			}
			rq.Wait()
			c.Barrier() // both receives are posted before either send is waited on
			sq.Wait()
			if waitSendFirst {
				kernels.Host(bufs[r])[0] -= 100
			}
			return nil
		}
	}
	if err := w.Run(exchange(true, false)); err != nil {
		t.Fatal(err)
	}
	check("receive posted first", 2)
	if err := w.Run(exchange(false, false)); err != nil {
		t.Fatal(err)
	}
	check("send first", 2)
	if err := w.Run(exchange(false, true)); err != nil {
		t.Fatal(err)
	}
	check("send waited on before the receive", 4)
}

// mixedX is rank r's element i: mixed magnitudes (1e8 + i, 1 + r/7, −1e8 − r), so a float32
// sum depends on its order and only the rank-order sum matches bit for bit.
func mixedX(r, i int) float32 {
	switch (r + i) % 3 {
	case 0:
		return 1e8 + float32(i)
	case 1:
		return 1 + float32(r)/7
	default:
		return -1e8 - float32(r)
	}
}

// mixedVec is rank r's elements off to off+n.
func mixedVec(r, off, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = mixedX(r, off+i)
	}
	return v
}

// rankOrderSum is the float32 sum of element i over ranks 0 to P−1, in rank order.
func rankOrderSum(P, i int) float32 {
	var s float32
	for r := 0; r < P; r++ {
		s += mixedX(r, i)
	}
	return s
}
