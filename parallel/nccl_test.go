package parallel

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/model"
)

// ncclVersions are the library versions the tests run: one with ncclCommSplit (2.23.4) and one
// before it (2.17.1), whose splits make a communicator per group from its own unique id.
var ncclVersions = []int{22304, 21701}

// ncclWorld runs fn on P in-process ranks, each on an NCCL communicator over a fakeNCCL of
// the given version bootstrapped from the in-process world, and returns the libraries.
func ncclWorld(P, version int, fn func(c Comm) error) ([]*fakeNCCL, error) {
	net := newFakeNet()
	libs := make([]*fakeNCCL, P)
	for r := range libs {
		libs[r] = net.lib(r, version)
	}
	err := NewWorld(P).Run(func(boot Comm) error {
		// the watchdog polls every millisecond beside the operations (a minute: it never fires)
		c, err := NewNCCL(boot, libs[boot.Rank()], NCCLOptions{Timeout: time.Minute, Every: time.Millisecond})
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
		return c.(*ncclComm).Close()
	})
	return libs, err
}

// ncclRun adapts ncclWorld to the runners the schedule and FSDP tests take.
func ncclRun(P, version int) func(func(Comm) error) error {
	return func(fn func(Comm) error) error {
		_, err := ncclWorld(P, version, fn)
		return err
	}
}

// TestNCCLBootstrap checks the order of the bootstrap calls: only rank 0 makes the unique id,
// every rank initialises with the same id, the world's size and its own rank; a split is
// ncclCommSplit with the rank's colour and key from NCCL 2.18 on, and before it one unique id
// per group from the group's first rank (by key), carried by the bootstrap communicator's split.
func TestNCCLBootstrap(t *testing.T) {
	const P = 4
	for _, v := range ncclVersions {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			colour := func(r int) int { return r % 2 } // even and odd ranks
			key := func(r int) int { return P - r }    // reversed: the highest rank first
			libs, err := ncclWorld(P, v, func(c Comm) error {
				r := c.Rank()
				sub := c.Split(colour(r), key(r), "split")
				if want := P - 1 - r; sub.Rank() != want/2 {
					return fmt.Errorf("rank %d is rank %d of its group, want %d", r, sub.Rank(), want/2)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			id := func(call string) string { return strings.Fields(call)[1] }
			var worldID string
			for r, lib := range libs {
				log := lib.calls()
				want := []string{"GetVersion"}
				if r == 0 {
					want = append(want, "GetUniqueId")
				}
				want = append(want, fmt.Sprintf("CommInitRank %d", P))
				for i, w := range want {
					if i >= len(log) || !strings.HasPrefix(log[i], w) {
						t.Fatalf("rank %d: call %d is %q, want %q…\n%s", r, i, at(log, i), w, joined(log))
					}
				}
				if r == 0 {
					worldID = id(log[1])
				}
				init := strings.Fields(log[len(want)-1])
				if init[2] != worldID || init[3] != fmt.Sprint(r) {
					t.Fatalf("rank %d initialised with %q, want the id %s of rank 0 and rank %d", r, log[len(want)-1], worldID, r)
				}
				rest := log[len(want):]
				if v >= ncclSplitVersion {
					if w := fmt.Sprintf("CommSplit 1 %d %d", colour(r), key(r)); len(rest) == 0 || rest[0] != w {
						t.Fatalf("rank %d: after init %q, want %q", r, at(rest, 0), w)
					}
					continue
				}
				// before 2.18: the group's first rank by key (3 for the odd ranks, 2 for the
				// even) makes the group's id, every member initialises a group of 2
				first := r == 2 || r == 3
				i := 0
				if first {
					if !strings.HasPrefix(at(rest, 0), "GetUniqueId") {
						t.Fatalf("rank %d, first of its group: %q, want GetUniqueId", r, at(rest, 0))
					}
					i = 1
				}
				if f := strings.Fields(at(rest, i)); len(f) != 4 || f[0] != "CommInitRank" || f[1] != "2" || f[2] == worldID || f[3] != fmt.Sprint((P-1-r)/2) {
					t.Fatalf("rank %d: %q, want CommInitRank 2 with a new id and rank %d", r, at(rest, i), (P-1-r)/2)
				}
			}
		})
	}
}

func at(log []string, i int) string {
	if i < len(log) {
		return log[i]
	}
	return "(nothing)"
}

// TestNCCLGroupCalls checks how Comm calls become NCCL calls: posted sends and receives wait
// for Start (or a Wait) and go out as one group in the order posted; a Wait joins the streams
// once; each collective is a group of its own followed by a join; an all-to-all is one group
// of a send and a receive per rank.
func TestNCCLGroupCalls(t *testing.T) {
	const P, n = 2, 3
	libs, err := ncclWorld(P, ncclVersions[0], func(c Comm) error {
		r := c.Rank()
		be := kernels.NewCPU()
		a, b, k, v := be.Alloc(n), be.Alloc(n), be.Alloc(n), be.Alloc(n)
		mark := func() { c.(*ncclComm).lib.(*fakeNCCL).record("--") }
		mark()
		reqs := []Request{c.Irecv(a, 1-r, 1, "kv"), c.Irecv(b, 1-r, 2, "kv"), c.Isend(k, 1-r, 1, "kv"), c.Isend(v, 1-r, 2, "kv")}
		mark() // nothing issued yet
		Start(c)
		mark()
		for _, q := range reqs {
			q.Wait() // one join for all
		}
		mark()
		rq := c.Irecv(a, 1-r, 3, "x")
		c.Isend(k, 1-r, 3, "x").Wait() // a Wait without Start issues what is queued
		rq.Wait()                      // joined already
		mark()
		c.AllReduce(a, "ar")
		mark()
		c.AllToAll(be.Alloc(P*n), be.Alloc(P*n), "a2a")
		mark()
		Start(c) // nothing queued: no group
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `--
--
GroupStart
Recv 3 {me}←{peer}
Recv 3 {me}←{peer}
Send 3 {me}→{peer}
Send 3 {me}→{peer}
GroupEnd
--
Join
--
GroupStart
Recv 3 {me}←{peer}
Send 3 {me}→{peer}
GroupEnd
Join
--
GroupStart
AllReduce 3 3
GroupEnd
Join
--
GroupStart
Send 3 {me}→0
Recv 3 {me}←0
Send 3 {me}→1
Recv 3 {me}←1
GroupEnd
Join
--`
	for r, lib := range libs {
		log := lib.calls()
		i := 0
		for i < len(log) && log[i] != "--" {
			i++
		}
		j := i
		for j < len(log) && !strings.HasPrefix(log[j], "Sync") {
			j++
		}
		w := strings.NewReplacer("{me}", fmt.Sprint(r), "{peer}", fmt.Sprint(1-r)).Replace(want)
		if got := joined(log[i:j]); got != w {
			t.Errorf("rank %d's calls:\n%s\nwant:\n%s", r, got, w)
		}
	}
}

// TestNCCLMatchesHost runs every Comm call on 1–4 ranks over NCCL (the fake, which sums in rank
// order) and on the in-process world: the same bits arrive and the same bytes are counted per
// call site (the NCCL world's bootstrap adds its unique ids under nccl.id).
func TestNCCLMatchesHost(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4} {
		for _, v := range ncclVersions {
			t.Run(fmt.Sprintf("P%d/%d", P, v), func(t *testing.T) {
				outs, traffic := make([][][]float32, 2), make([][]Traffic, 2)
				for i, run := range []func(func(Comm) error) error{NewWorld(P).Run, ncclRun(P, v)} {
					outs[i], traffic[i] = make([][]float32, P), make([]Traffic, P)
					err := run(func(c Comm) error {
						out := exerciseComm(c, kernels.HostBuf, kernels.Host)
						c.Barrier()
						tr := c.Traffic()
						delete(tr, ncclIDSite)
						outs[i][c.Rank()], traffic[i][c.Rank()] = out, tr
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				for r := range P {
					for k := range outs[0][r] {
						if math.Float32bits(outs[0][r][k]) != math.Float32bits(outs[1][r][k]) {
							t.Fatalf("rank %d value %d: nccl %g, host %g", r, k, outs[1][r][k], outs[0][r][k])
						}
					}
					if traffic[0][r].String() != traffic[1][r].String() {
						t.Errorf("rank %d traffic: nccl %v, host %v", r, traffic[1][r], traffic[0][r])
					}
				}
			})
		}
	}
}

// TestNCCLFailures checks that a failed unique id is every rank's error (no rank waits in
// ncclCommInitRank) and that a split colour NCCL reserves is refused.
func TestNCCLFailures(t *testing.T) {
	err := NewWorld(3).Run(func(boot Comm) error {
		lib := newFakeNet().lib(boot.Rank(), ncclVersions[0])
		var l NCCLLib = lib
		if boot.Rank() == 0 {
			l = noIDLib{lib}
		}
		_, err := NewNCCL(boot, l, NCCLOptions{})
		if err == nil {
			return fmt.Errorf("rank %d: no error", boot.Rank())
		}
		want := "could not make the NCCL unique id"
		if boot.Rank() == 0 {
			want = "ncclGetUniqueId on rank 0: no network"
		}
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("rank %d: %v, want %q", boot.Rank(), err, want)
		}
		if len(lib.calls()) != 1 { // GetVersion only
			return fmt.Errorf("rank %d called %v", boot.Rank(), lib.calls())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ncclWorld(2, ncclVersions[0], func(c Comm) error {
		c.Split(-1, 0, "split")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "split color -1") {
		t.Fatalf("a negative split colour: %v", err)
	}
}

// noIDLib is a library whose ncclGetUniqueId fails.
type noIDLib struct{ *fakeNCCL }

func (noIDLib) NCCLUniqueID() ([128]byte, error) { return [128]byte{}, fmt.Errorf("no network") }

// TestFSDPUnderNCCL runs FSDP's forward-backward over NCCL: the gradient chunks and the loss
// equal the in-process world's bit for bit (the fake sums in rank order, as the host does).
func TestFSDPUnderNCCL(t *testing.T) {
	cfg := fsdpConfig()
	params := model.InitParams(cfg, model.NewLayout(cfg), 3)
	const T = 8
	for _, P := range []int{2, 3} {
		ids, targets := fsdpBatch(cfg, P, T)
		dscale := float32(1) / float32(P*T)
		for _, prefetch := range []bool{false, true} {
			hostG, hostL := runFSDP(t, NewWorld(P).Run, cfg, params, ids, targets, P, T, dscale, model.CheckpointLayer, prefetch)
			ncclG, ncclL := runFSDP(t, ncclRun(P, ncclVersions[0]), cfg, params, ids, targets, P, T, dscale, model.CheckpointLayer, prefetch)
			if hostL != ncclL {
				t.Errorf("P%d prefetch=%v: loss %v over NCCL, %v in process", P, prefetch, ncclL, hostL)
			}
			for r := range hostG {
				for i := range hostG[r] {
					if math.Float32bits(hostG[r][i]) != math.Float32bits(ncclG[r][i]) {
						t.Fatalf("P%d prefetch=%v rank %d gradient %d: %v over NCCL, %v in process", P, prefetch, r, i, ncclG[r][i], hostG[r][i])
					}
				}
			}
		}
	}
}

// TestSchedulesUnderNCCL runs every schedule (P = 2, 3, 4, 5, 8, with and without overlap,
// causal and with a window and documents) and the hybrids over the NCCL communicator on the
// fake NCCL, whose rules are NCCL's: each gives the single-worker result, with no send paired
// with the wrong receive and no deadlock.
func TestSchedulesUnderNCCL(t *testing.T) {
	type tc struct {
		name string
		P, U int
	}
	var cases []tc
	for _, name := range Names() {
		for _, P := range []int{2, 3, 4, 5, 8} {
			cases = append(cases, tc{name, P, 1})
		}
	}
	for _, name := range hybridOuter {
		cases = append(cases, tc{name, 4, 2})
	}
	h := testHeads["MHA"]
	for _, c := range cases {
		for _, overlap := range []bool{false, true} {
			for _, masked := range []bool{false, true} {
				key := fmt.Sprintf("%s/P%d/U%d/overlap=%v/window+docs=%v", c.name, c.P, c.U, overlap, masked)
				t.Run(key, func(t *testing.T) {
					if CheckHybrid(c.name, h, c.P, c.U) != nil {
						return // refused for these heads (TestSchedulesExact checks the refusal)
					}
					T := 24 * c.P
					in := newInputs(T, h, uint64(c.P*100+h.N))
					if masked { // a window of half a rank's tokens and short documents: fewer steps, skipped pairs
						in.docs, in.window = docTables(T, c.P, uint64(c.P))["short"], 13
					}
					out := in.newRun(c.P)
					err := ncclRun(c.P, ncclVersions[0])(func(cm Comm) error {
						be := kernels.NewCPU()
						s, err := NewAttention(c.name, cm, be, Options{Overlap: overlap, UlyssesDegree: c.U})
						if err != nil {
							return err
						}
						return in.runRank(s, cm, be, &out)
					})
					if err != nil {
						t.Fatalf("under NCCL's rules: %v", err)
					}
					checkExact(t, out, in.reference())
				})
			}
		}
	}
}

// TestNCCLWatchdog: a send whose receive never comes is reported after the timeout, naming the
// rank, the communicator, its last operation and the variable that sets the wait, and every
// communicator is aborted, so the waiting rank returns instead of hanging; an asynchronous error
// is reported at the next look.
func TestNCCLWatchdog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		async error
		want  []string
	}{
		{"hang", nil, []string{"NCCL on rank 0: the world has had operations pending for", "with nothing new issued",
			"its last operation: a group of 1 sends and receives (lost)", "DISTFLASH_NCCL_TIMEOUT sets the wait, 100ms now"}},
		{"async error", fmt.Errorf("remote process exited"), []string{"NCCL on rank 0: the world has failed: remote process exited",
			"its last operation: none issued"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := newFakeNet()
			reports := make(chan string, 2)
			hung := make(chan struct{})
			start := time.Now()
			err := NewWorld(2).Run(func(boot Comm) error {
				lib := net.lib(boot.Rank(), ncclVersions[0])
				opt := NCCLOptions{Timeout: 100 * time.Millisecond, Every: 5 * time.Millisecond, OnHang: func(r string) {
					reports <- r
					close(hung)
				}}
				c, err := NewNCCL(boot, lib, opt)
				if err != nil {
					return err
				}
				if boot.Rank() == 1 {
					<-hung // never posts the receive
					return c.(*ncclComm).Close()
				}
				if tc.async != nil {
					lib.async.Store(&tc.async)
					<-hung
					if err := c.(*ncclComm).Close(); err == nil || !strings.Contains(err.Error(), "the watchdog aborted") {
						return fmt.Errorf("Close after the watchdog: %v", err)
					}
					return nil
				}
				c.Isend(lib.be.Alloc(3), 1, 0, "lost").Wait() // its join waits until the abort
				return nil
			})
			if tc.async == nil && (err == nil || !strings.Contains(err.Error(), "aborted (ncclCommAbort)")) {
				t.Errorf("the hung rank: %v, want its wait ended by the abort", err)
			}
			if tc.async != nil && err != nil {
				t.Error(err)
			}
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("took %v: the fake's own 2 s deadlock limit, not the watchdog, ended it", d)
			}
			if len(reports) != 1 {
				t.Fatalf("%d reports, want 1", len(reports))
			}
			r := <-reports
			for _, w := range tc.want {
				if !strings.Contains(r, w) {
					t.Errorf("report %q lacks %q", r, w)
				}
			}
		})
	}
}

// TestNCCLOptionsFromEnv reads DISTFLASH_NCCL_TIMEOUT.
func TestNCCLOptionsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Duration
		wantErr string
	}{
		{"", DefaultNCCLTimeout, ""},
		{"90s", 90 * time.Second, ""},
		{"0", 0, ""},
		{"ten", 0, `DISTFLASH_NCCL_TIMEOUT="ten"`},
		{"-5s", 0, `DISTFLASH_NCCL_TIMEOUT="-5s"`},
	} {
		o, err := ncclOptionsFrom(func(k string) string {
			if k == "DISTFLASH_NCCL_TIMEOUT" {
				return tc.value
			}
			return ""
		})
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error naming %s", tc.value, err, tc.wantErr)
			}
		case err != nil || o.Timeout != tc.want:
			t.Errorf("%q: %v, %v; want %v", tc.value, o.Timeout, err, tc.want)
		}
	}
}
