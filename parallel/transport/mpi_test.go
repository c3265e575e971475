//go:build mpi

package transport_test

// The MPI tests run in two roles. Started by go test, TestMPI re-executes this test binary
// under mpirun on 1 to 4 ranks; started by mpirun (transport.MPIEnv says so), TestMain initialises MPI
// and TestMPIRanks runs every check on every rank, each rank comparing what MPI gave it with
// the expected values and with the in-process world running the same calls.

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// mpiTest is this process's MPI state when mpirun started it.
var mpiTest struct {
	comm  transport.Comm // nil when not started by an MPI launcher
	bench bool           // a benchmark run: rank 0 runs the benchmarks, the other ranks serve them
}

func TestMain(m *testing.M) {
	flag.Parse()
	l, err := transport.MPIEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if l == nil {
		os.Exit(m.Run())
	}
	c, err := transport.InitMPI()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	mpiTest.comm = c
	mpiTest.bench = flag.Lookup("test.bench").Value.String() != ""
	if mpiTest.bench && c.Rank() != 0 {
		mpiBenchServe(c)
		if err := transport.FinalizeMPI(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if mpiTest.bench {
		mpiBenchQuit(c)
	}
	if err := transport.FinalizeMPI(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestMPI runs TestMPIRanks under mpirun on P = 1, 2, 3 and 4 ranks, with MPI's ordinary
// sends and with synchronous ones (MPIOptions.SyncSend: no send completes before its receive
// is posted, which finds code that only works with eager sends), and on 3 ranks with
// MPI_THREAD_SERIALIZED (the lock and polled waits a library without MPI_THREAD_MULTIPLE
// gets). Every rank must pass.
func TestMPI(t *testing.T) {
	if mpiTest.comm != nil {
		t.Skip("this is a rank: TestMPIRanks does the work")
	}
	for _, tc := range []struct {
		P      int
		thread string
		sync   bool
	}{{1, "multiple", false}, {2, "multiple", true}, {3, "multiple", false}, {4, "multiple", false}, {4, "multiple", true}, {3, "serialized", true}} {
		t.Run(fmt.Sprintf("P%d/%s/syncsend=%v", tc.P, tc.thread, tc.sync), func(t *testing.T) {
			env := []string{
				"DISTFLASH_MPI_TIMEOUT=60s", // a rank that disagrees with the others ends the run
				"DISTFLASH_MPI_THREAD=" + tc.thread,
				fmt.Sprintf("DISTFLASH_MPI_SYNC_SEND=%v", tc.sync),
				"DISTFLASH_MPI_TEST_DIR=" + t.TempDir(),
			}
			transporttest.MPIRanksPass(t, tc.P, env, "TestMPIRanks")
		})
	}
}

// TestMPIRanks is one rank's share of TestMPI; it runs only under mpirun. Every subtest is
// run by every rank in the same order, as the calls are collective.
func TestMPIRanks(t *testing.T) {
	c := mpiTest.comm
	if c == nil {
		t.Skip("runs as the ranks of TestMPI, under mpirun")
	}
	if mpiTest.bench {
		t.Skip("a benchmark run: the other ranks serve the benchmarks")
	}
	if c.Rank() == 0 {
		t.Logf("%s", transport.MPIInfo())
	}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, c transport.Comm)
	}{
		{"PointToPoint", mpiTestPointToPoint},
		{"IrecvMatchesInPostOrder", mpiTestPostOrder},
		{"Collectives", mpiTestCollectives},
		{"SameAsInProcess", mpiTestSameAsInProcess},
		{"Barrier", mpiTestBarrier},
		{"Split", mpiTestSplit},
		{"Concurrent", mpiTestConcurrent},
		{"InPlaceUnderGC", mpiTestInPlaceUnderGC},
		{"Errors", mpiTestErrors},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, c)
			c.Barrier() // the next check starts together, whatever this one did
		})
	}
}

// mpiTestPointToPoint is TestCommPointToPoint over MPI: each rank sends its ring successor
// several messages under several tags, all in flight; the receives are posted tag by tag in
// another order than the sends and must get each tag's messages in send order; the bytes are
// counted under the call site.
func mpiTestPointToPoint(t *testing.T, c transport.Comm) {
	const perTag, length = 3, 5
	tags := []int{0, 1, 7}
	val := func(src, tag, seq, i int) float32 { return float32(1000*src + 100*tag + 10*seq + i) }
	be := kernels.NewCPU()
	before := c.Traffic()
	P, r := c.Size(), c.Rank()
	next, prev := (r+1)%P, (r+P-1)%P
	var sends []transport.Request
	for seq := 0; seq < perTag; seq++ { // interleaved: tag 0, 1, 7, 0, 1, 7, …
		for _, tag := range tags {
			x := make([]float32, length)
			for i := range x {
				x[i] = val(r, tag, seq, i)
			}
			sends = append(sends, c.Isend(commBuf(be, x), next, tag, "p2p"))
		}
	}
	type posted struct {
		tag, seq int
		buf      kernels.Buf
		req      transport.Request
	}
	var all []posted
	for i := len(tags) - 1; i >= 0; i-- {
		for seq := 0; seq < perTag; seq++ {
			b := be.Alloc(length)
			all = append(all, posted{tags[i], seq, b, c.Irecv(b, prev, tags[i], "p2p")})
		}
	}
	for _, p := range all {
		p.req.Wait()
		for i, got := range kernels.Host(p.buf) {
			if want := val(prev, p.tag, p.seq, i); got != want {
				t.Fatalf("tag %d message %d value %d: got %v, want %v", p.tag, p.seq, i, got, want)
			}
		}
	}
	for _, s := range sends {
		s.Wait()
	}
	if err := transporttest.SameTraffic(transporttest.TrafficSince(c, before), transport.Traffic{"p2p": perTag * int64(len(tags)) * length * 4}); err != nil {
		t.Error(err)
	}
}

// mpiTestInPlaceUnderGC runs the in-place collectives (AllGather of this rank's own block,
// AllReduce's all-gather phase) many times while the collector runs without pause and the
// calling goroutine's stack has grown and emptied, so that the collector shrinks it in the
// middle of the calls. MPI_IN_PLACE is (void *)1 in Open MPI: held in a Go pointer variable it
// made the runtime throw "invalid pointer found on stack" at such a shrink (seen in CI).
func mpiTestInPlaceUnderGC(t *testing.T, c transport.Comm) {
	be := kernels.NewCPU()
	P, r := c.Size(), c.Rank()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	const n = 3
	for it := range 300 {
		growStack(64)
		ip := commBuf(be, make([]float32, P*n))
		copy(kernels.Host(ip)[r*n:], mixedVec(r, it, n))
		c.AllGather(ip, be.Slice(ip, r*n, n), "ag.inplace")
		sum := commBuf(be, []float32{float32(r + it)})
		c.AllReduce(sum, "ar")
		for q := 0; q < P; q++ {
			if got, want := kernels.Host(ip)[q*n:(q+1)*n], mixedVec(q, it, n); commEqualBits(got, want) >= 0 {
				t.Fatalf("iteration %d: all-gather in place: rank %d's block %v, want %v", it, q, got, want)
			}
		}
		if got, want := kernels.Host(sum)[0], float32(P*(P-1)/2+P*it); got != want {
			t.Fatalf("iteration %d: all-reduce %v, want %v", it, got, want)
		}
	}
}

// growStack grows the calling goroutine's stack by about depth KiB and returns: the stack then
// stays large and mostly empty, which the collector shrinks.
func growStack(depth int) byte {
	var pad [1024]byte
	pad[depth%len(pad)] = byte(depth)
	if depth > 0 {
		pad[0] += growStack(depth - 1)
	}
	return pad[0]
}

// mpiTestPostOrder: two receives posted for the same source and tag match the messages in the
// order they were posted, whatever the order they are waited for.
func mpiTestPostOrder(t *testing.T, c transport.Comm) {
	if c.Size() < 2 || c.Rank() > 1 {
		return
	}
	be := kernels.NewCPU()
	if c.Rank() == 0 {
		for i := 1; i <= 2; i++ {
			c.Isend(commBuf(be, []float32{float32(i)}), 1, 0, "p2p").Wait()
		}
		return
	}
	first, second := be.Alloc(1), be.Alloc(1)
	r1 := c.Irecv(first, 0, 0, "p2p")
	r2 := c.Irecv(second, 0, 0, "p2p")
	r2.Wait()
	r1.Wait()
	if a, b := kernels.Host(first)[0], kernels.Host(second)[0]; a != 1 || b != 2 {
		t.Errorf("first-posted receive got message %v, second-posted got %v; want 1, 2", a, b)
	}
}

// mpiTestCollectives is TestCommCollectives over MPI: every collective's result, sums bit for
// bit equal to the float32 sum in rank order, and the bytes of each.
func mpiTestCollectives(t *testing.T, c transport.Comm) {
	be := kernels.NewCPU()
	P, r := c.Size(), c.Rank()
	check := func(what string, got, want []float32) {
		t.Helper()
		if i := commEqualBits(got, want); i >= 0 {
			t.Errorf("%s: element %d: got %v, want %v", what, i, got, want)
		}
	}
	before := c.Traffic()
	want := transport.Traffic{}

	const n = 4
	dst := be.Alloc(P * n)
	c.AllGather(dst, commBuf(be, mixedVec(r, 0, n)), "ag")
	var all []float32
	for q := 0; q < P; q++ {
		all = append(all, mixedVec(q, 0, n)...)
	}
	check("all-gather", kernels.Host(dst), all)
	want["ag"] = int64((P - 1) * n * 4)

	// In place: src is this rank's block of dst.
	ip := commBuf(be, make([]float32, P*n))
	copy(kernels.Host(ip)[r*n:], mixedVec(r, 0, n))
	c.AllGather(ip, be.Slice(ip, r*n, n), "ag.inplace")
	check("all-gather in place", kernels.Host(ip), all)
	want["ag.inplace"] = int64((P - 1) * n * 4)

	const m = 3
	rs := be.Alloc(m)
	c.ReduceScatter(rs, commBuf(be, mixedVec(r, 0, P*m)), "rs")
	w := make([]float32, m)
	for i := range w {
		w[i] = rankOrderSum(P, r*m+i)
	}
	check("reduce-scatter", kernels.Host(rs), w)
	want["rs"] = int64((P - 1) * m * 4)

	for _, n := range []int{7, 3, 1, 11, 50000} { // 7, 11 divisible by none of 2, 3, 4; 1, 3 < P
		site := fmt.Sprintf("ar%d", n)
		b := commBuf(be, mixedVec(r, 0, n))
		c.AllReduce(b, site)
		w := make([]float32, n)
		for i := range w {
			w[i] = rankOrderSum(P, i)
		}
		check("all-reduce "+site, kernels.Host(b), w)
		if P > 1 {
			want[site] = commAllReduceBytes(n, P, r)
		}
	}

	const k = 2
	src := make([]float32, P*k)
	for j := 0; j < P; j++ {
		for i := 0; i < k; i++ {
			src[j*k+i] = float32(100*r + 10*j + i)
		}
	}
	a2a := be.Alloc(P * k)
	c.AllToAll(a2a, commBuf(be, src), "a2a")
	for j := 0; j < P; j++ {
		for i := 0; i < k; i++ {
			if got, want := kernels.Host(a2a)[j*k+i], float32(100*j+10*r+i); got != want {
				t.Errorf("all-to-all chunk %d element %d: got %v, want %v", j, i, got, want)
			}
		}
	}
	want["a2a"] = int64((P - 1) * k * 4)
	if err := transporttest.SameTraffic(transporttest.TrafficSince(c, before), want); err != nil {
		t.Error(err)
	}
}

// mpiProgram is a mix of every transport.Comm call on random data of a few sizes (messages of 4 bytes
// to 400 KB, so both of MPI's eager and rendezvous protocols); it returns everything this
// rank received or computed, in order.
func mpiProgram(c transport.Comm, be kernels.Backend) []float32 {
	P, r := c.Size(), c.Rank()
	rng := rand.New(rand.NewPCG(uint64(r), 7))
	rnd := func(n int) kernels.Buf {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 1e3)
		}
		return commBuf(be, x)
	}
	var out []float32
	keep := func(b kernels.Buf) { out = append(out, kernels.Host(b)...) }
	next, prev := (r+1)%P, (r+P-1)%P
	for _, n := range []int{1, 1000, 100000} {
		a, b := be.Alloc(n), be.Alloc(n)
		ra, rb := c.Irecv(a, prev, 3, "prog.p2p"), c.Irecv(b, next, 4, "prog.p2p")
		sa, sb := c.Isend(rnd(n), next, 3, "prog.p2p"), c.Isend(rnd(n), prev, 4, "prog.p2p")
		rb.Wait()
		ra.Wait()
		sa.Wait()
		sb.Wait()
		keep(a)
		keep(b)
		ag := be.Alloc(P * n)
		c.AllGather(ag, rnd(n), "prog.ag")
		keep(ag)
		rs := be.Alloc(n)
		c.ReduceScatter(rs, rnd(P*n), "prog.rs")
		keep(rs)
		ar := rnd(n)
		c.AllReduce(ar, "prog.ar")
		keep(ar)
		a2a := be.Alloc(P * n)
		c.AllToAll(a2a, rnd(P*n), "prog.a2a")
		keep(a2a)
	}
	c.Barrier()
	row := c.Split(r%2, -r, "prog.split")
	x := rnd(999)
	row.AllReduce(x, "prog.row.ar")
	keep(x)
	out = append(out, float32(row.Rank()), float32(row.Size()))
	return out
}

// mpiTestSameAsInProcess: the same calls on the same data give this rank the same values, bit
// for bit, and the same bytes per call site over MPI as on the in-process world.
func mpiTestSameAsInProcess(t *testing.T, c transport.Comm) {
	P, r := c.Size(), c.Rank()
	before := c.Traffic()
	got := mpiProgram(c, kernels.NewCPU())
	gotT := transporttest.TrafficSince(c, before)

	w := transport.NewWorld(P)
	var want []float32
	if err := w.Run(func(ic transport.Comm) error {
		o := mpiProgram(ic, kernels.NewCPU())
		if ic.Rank() == r {
			want = o
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if i := commEqualBits(got, want); i >= 0 {
		t.Errorf("%d values over MPI, %d in process; first difference at %d", len(got), len(want), i)
	}
	if err := transporttest.SameTraffic(gotT, w.Traffic(r)); err != nil {
		t.Error(err)
	}
}

// mpiTestBarrier: no rank leaves a barrier before the last rank, which arrives late, has
// reached it. The last rank leaves a file before it enters; every rank must see it after.
func mpiTestBarrier(t *testing.T, c transport.Comm) {
	dir := os.Getenv("DISTFLASH_MPI_TEST_DIR")
	if dir == "" {
		t.Fatal("DISTFLASH_MPI_TEST_DIR is not set (TestMPI sets it)")
	}
	P := c.Size()
	before := c.Traffic()
	for round := 0; round < 3; round++ {
		mark := filepath.Join(dir, fmt.Sprintf("barrier-%d", round))
		if c.Rank() == P-1 {
			time.Sleep(20 * time.Millisecond) // the others are waiting by now
			if err := os.WriteFile(mark, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		c.Barrier()
		if _, err := os.Stat(mark); err != nil {
			t.Errorf("round %d: left the barrier before the last rank reached it: %v", round, err)
		}
	}
	if b := transporttest.TrafficSince(c, before).Total(); b != 0 {
		t.Errorf("barrier sent %d bytes", b)
	}
}

// mpiTestSplit is TestCommSplit over MPI for every rows × cols grid of the ranks: rows,
// columns and reversed rows as sub-groups, each with the right ranks in the right order,
// collectives that stay inside the group, bytes as in process, and rows and columns
// coexisting.
func mpiTestSplit(t *testing.T, c transport.Comm) {
	be := kernels.NewCPU()
	P := c.Size()
	for rows := 1; rows <= P; rows++ {
		if P%rows != 0 {
			continue
		}
		cols := P / rows
		row, col := c.Rank()/cols, c.Rank()%cols
		for _, tc := range []struct {
			name        string
			color, key  int
			size, rank  int
			memberWorld func(i int) int
		}{
			{"rows", row, col, cols, col, func(i int) int { return row*cols + i }},
			{"cols", col, row, rows, row, func(i int) int { return i*cols + col }},
			{"rows-reversed", row, -col, cols, cols - 1 - col, func(i int) int { return row*cols + cols - 1 - i }},
		} {
			what := fmt.Sprintf("%dx%d %s", rows, cols, tc.name)
			before := c.Traffic()
			g := c.Split(tc.color, tc.key, "split")
			if g.Size() != tc.size || g.Rank() != tc.rank {
				t.Fatalf("%s: (%d,%d) is rank %d of %d, want %d of %d", what, row, col, g.Rank(), g.Size(), tc.rank, tc.size)
			}
			all := be.Alloc(g.Size())
			g.AllGather(all, commBuf(be, []float32{float32(c.Rank())}), "sub.ag")
			sum := 0
			for i, w := range kernels.Host(all) {
				if want := tc.memberWorld(i); int(w) != want {
					t.Errorf("%s: member %d is world rank %v, want %d", what, i, w, want)
				}
				sum += tc.memberWorld(i)
			}
			s := commBuf(be, []float32{float32(c.Rank())})
			g.AllReduce(s, "sub.ar")
			if got := kernels.Host(s)[0]; got != float32(sum) {
				t.Errorf("%s: all-reduce in the group gave %v, want %d", what, got, sum)
			}
			G := g.Size()
			ar := int64(0)
			if G > 1 {
				ar = commAllReduceBytes(1, G, g.Rank())
			}
			want := transport.Traffic{"sub.ag": int64((G - 1) * 4), "sub.ar": ar}
			if P > 1 {
				want["split"] = int64((P - 1) * 2 * 4)
			}
			if err := transporttest.SameTraffic(transporttest.TrafficSince(c, before), want); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		rg, cg := c.Split(row, col, "split"), c.Split(col, row, "split")
		a, b := commBuf(be, []float32{1}), commBuf(be, []float32{10})
		cg.AllReduce(b, "col")
		rg.AllReduce(a, "row")
		if ga, gb := kernels.Host(a)[0], kernels.Host(b)[0]; ga != float32(cols) || gb != float32(10*rows) {
			t.Errorf("%dx%d: row sum %v (want %d), column sum %v (want %d)", rows, cols, ga, cols, gb, 10*rows)
		}
	}
}

// mpiTestConcurrent: two goroutines of each rank exchange with the ring neighbours at once
// under different tags (MPI_THREAD_MULTIPLE, or the lock and polled waits of SERIALIZED).
func mpiTestConcurrent(t *testing.T, c transport.Comm) {
	P, r := c.Size(), c.Rank()
	next, prev := (r+1)%P, (r+P-1)%P
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			be := kernels.NewCPU()
			for it := 0; it < 200; it++ {
				n := 1 + (it*37)%3000
				in := be.Alloc(n)
				rq := c.Irecv(in, prev, 10+g, "conc")
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(r*1e6 + g*1e5 + it*10 + i%10)
				}
				sq := c.Isend(commBuf(be, x), next, 10+g, "conc")
				rq.Wait()
				sq.Wait()
				for i, v := range kernels.Host(in) {
					if want := float32(prev*1e6 + g*1e5 + it*10 + i%10); v != want {
						errs[g] = fmt.Errorf("goroutine %d iteration %d value %d: got %v, want %v", g, it, i, v, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// mpiPanic runs f and returns what it panicked with, as text ("" when it did not).
func mpiPanic(f func()) (msg string) {
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprint(p)
		}
	}()
	f()
	return ""
}

// mpiTestErrors: a message longer than the receive buffer (MPI_ERR_TRUNCATE, returned under
// MPI_ERRORS_RETURN) and one shorter than it both fail with a *transport.Failure naming the
// ranks, tag and site, which transport.Recover turns into an error, and the communicator goes on
// working; a bad peer panics before reaching MPI; a
// nil dereference after MPI_Init is still a Go panic (Open MPI's signal handlers stay off).
func mpiTestErrors(t *testing.T, c transport.Comm) {
	be := kernels.NewCPU()
	P, r := c.Size(), c.Rank()
	if msg := mpiPanic(func() { c.Isend(be.Alloc(1), P, 0, "bad") }); !strings.Contains(msg, fmt.Sprintf("send to rank %d of %d", P, P)) {
		t.Errorf("send to rank %d: panic %q", P, msg)
	}
	if msg := mpiPanic(func() { c.Irecv(be.Alloc(1), 0, -1, "bad") }); !strings.Contains(msg, "negative tags") {
		t.Errorf("negative tag: panic %q", msg)
	}
	if msg := mpiPanic(func() {
		var p *[4]float32
		p[1] = 1
	}); !strings.Contains(msg, "nil pointer") {
		t.Errorf("nil dereference after MPI_Init: recovered %q, want a nil pointer panic", msg)
	}
	if P < 2 || r > 1 {
		return
	}
	if r == 0 {
		for i := 0; i < 2; i++ {
			c.Isend(commBuf(be, []float32{1, 2, 3}), 1, 9, "len").Wait()
		}
		return
	}
	msg := mpiFailure(t, func() { c.Irecv(be.Alloc(2), 0, 9, "len").Wait() })
	for _, s := range []string{"MPI rank 1", "receive of 2 values from rank 0", "tag 9", `site "len"`} {
		if !strings.Contains(msg, s) {
			t.Errorf("receive of a longer message: error %q does not say %q", msg, s)
		}
	}
	// MPI's words for the error: Open MPI's MPI_Error_string names the class, MPICH's says it.
	if !strings.Contains(msg, "MPI_ERR_TRUNCATE") && !strings.Contains(msg, "Message truncated") {
		t.Errorf("receive of a longer message: error %q does not say MPI_ERR_TRUNCATE (Open MPI) or Message truncated (MPICH)", msg)
	}
	msg = mpiFailure(t, func() { c.Irecv(be.Alloc(4), 0, 9, "len").Wait() })
	if !strings.Contains(msg, "rank 1 expected 4 values from rank 0 (tag 9), got 3") || !strings.Contains(msg, `site "len"`) {
		t.Errorf("receive of a shorter message: error %q", msg)
	}
}

// mpiFailure runs f, a call that fails, and returns the error transport.Recover makes of its
// panic: a *transport.Failure, which a command returns as its error instead of crashing.
func mpiFailure(t *testing.T, f func()) string {
	t.Helper()
	var err error
	func() {
		defer transport.Recover(&err)
		f()
	}()
	var fail *transport.Failure
	if !errors.As(err, &fail) {
		t.Errorf("a failed call gave %v (%T), want a *transport.Failure", err, err)
		return ""
	}
	return err.Error()
}
