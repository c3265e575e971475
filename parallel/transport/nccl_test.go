package transport_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// TestNCCLBootstrap checks the order of the bootstrap calls: only rank 0 makes the unique id,
// every rank initialises with the same id, the world's size and its own rank; a split is
// ncclCommSplit with the rank's colour and key from NCCL 2.18 on, and before it one unique id
// per group from the group's first rank (by key), carried by the bootstrap communicator's split.
func TestNCCLBootstrap(t *testing.T) {
	const P = 4
	for _, v := range transporttest.NCCLVersions {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			colour := func(r int) int { return r % 2 } // even and odd ranks
			key := func(r int) int { return P - r }    // reversed: the highest rank first
			libs, err := transporttest.NCCLWorld(P, v, func(c transport.Comm) error {
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
				log := lib.Calls()
				want := []string{"GetVersion"}
				if r == 0 {
					want = append(want, "GetUniqueId")
				}
				want = append(want, fmt.Sprintf("CommInitRank %d", P))
				for i, w := range want {
					if i >= len(log) || !strings.HasPrefix(log[i], w) {
						t.Fatalf("rank %d: call %d is %q, want %q…\n%s", r, i, at(log, i), w, transporttest.Joined(log))
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
				if v >= transport.NCCLSplitVersion {
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

// TestNCCLGroupCalls checks how transport.Comm calls become NCCL calls: posted sends and receives wait
// for transport.Start (or a Wait) and go out as one group in the order posted; a Wait joins the streams
// once; each collective is a group of its own followed by a join; an all-to-all is one group
// of a send and a receive per rank.
func TestNCCLGroupCalls(t *testing.T) {
	const P, n = 2, 3
	libs := transporttest.NCCLLibs(P, transporttest.NCCLVersions[0])
	err := transporttest.RunNCCL(libs, func(c transport.Comm) error {
		r := c.Rank()
		be := kernels.NewCPU()
		a, b, k, v := be.Alloc(n), be.Alloc(n), be.Alloc(n), be.Alloc(n)
		mark := func() { libs[r].Record("--") }
		mark()
		reqs := []transport.Request{c.Irecv(a, 1-r, 1, "kv"), c.Irecv(b, 1-r, 2, "kv"), c.Isend(k, 1-r, 1, "kv"), c.Isend(v, 1-r, 2, "kv")}
		mark() // nothing issued yet
		transport.Start(c)
		mark()
		for _, q := range reqs {
			q.Wait() // one join for all
		}
		mark()
		rq := c.Irecv(a, 1-r, 3, "x")
		c.Isend(k, 1-r, 3, "x").Wait() // a Wait without transport.Start issues what is queued
		rq.Wait()                      // joined already
		mark()
		c.AllReduce(a, "ar")
		mark()
		c.AllToAll(be.Alloc(P*n), be.Alloc(P*n), "a2a")
		mark()
		transport.Start(c) // nothing queued: no group
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
		log := lib.Calls()
		i := 0
		for i < len(log) && log[i] != "--" {
			i++
		}
		j := i
		for j < len(log) && !strings.HasPrefix(log[j], "Sync") {
			j++
		}
		w := strings.NewReplacer("{me}", fmt.Sprint(r), "{peer}", fmt.Sprint(1-r)).Replace(want)
		if got := transporttest.Joined(log[i:j]); got != w {
			t.Errorf("rank %d's calls:\n%s\nwant:\n%s", r, got, w)
		}
	}
}

// TestNCCLMatchesHost runs every transport.Comm call on 1–4 ranks over NCCL (the fake, which sums in rank
// order) and on the in-process world: the same bits arrive and the same bytes are counted per
// call site (the NCCL world's bootstrap adds its unique ids under nccl.id).
func TestNCCLMatchesHost(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4} {
		for _, v := range transporttest.NCCLVersions {
			t.Run(fmt.Sprintf("P%d/%d", P, v), func(t *testing.T) {
				outs, traffic := make([][][]float32, 2), make([][]transport.Traffic, 2)
				for i, run := range []func(func(transport.Comm) error) error{transport.NewWorld(P).Run, transporttest.NCCLRun(P, v)} {
					outs[i], traffic[i] = make([][]float32, P), make([]transport.Traffic, P)
					err := run(func(c transport.Comm) error {
						out := transporttest.Exercise(c, kernels.HostBuf, kernels.Host)
						c.Barrier()
						tr := c.Traffic()
						delete(tr, transport.NCCLIDSite)
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
	err := transport.NewWorld(3).Run(func(boot transport.Comm) error {
		lib := transporttest.NewFakeNet().Lib(boot.Rank(), transporttest.NCCLVersions[0])
		var l transport.NCCLLib = lib
		if boot.Rank() == 0 {
			l = noIDLib{lib}
		}
		_, err := transport.NewNCCL(boot, l, transport.NCCLOptions{})
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
		if len(lib.Calls()) != 1 { // GetVersion only
			return fmt.Errorf("rank %d called %v", boot.Rank(), lib.Calls())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = transporttest.NCCLWorld(2, transporttest.NCCLVersions[0], func(c transport.Comm) error {
		c.Split(-1, 0, "split")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "split color -1") {
		t.Fatalf("a negative split colour: %v", err)
	}
}

// noIDLib is a library whose ncclGetUniqueId fails.
type noIDLib struct{ *transporttest.FakeNCCL }

func (noIDLib) NCCLUniqueID() ([128]byte, error) { return [128]byte{}, fmt.Errorf("no network") }

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
			net := transporttest.NewFakeNet()
			reports := make(chan string, 2)
			hung := make(chan struct{})
			start := time.Now()
			err := transport.NewWorld(2).Run(func(boot transport.Comm) error {
				lib := net.Lib(boot.Rank(), transporttest.NCCLVersions[0])
				opt := transport.NCCLOptions{Timeout: 100 * time.Millisecond, Every: 5 * time.Millisecond, OnHang: func(r string) {
					reports <- r
					close(hung)
				}}
				c, err := transport.NewNCCL(boot, lib, opt)
				if err != nil {
					return err
				}
				if boot.Rank() == 1 {
					<-hung // never posts the receive
					return closeComm(c)
				}
				if tc.async != nil {
					lib.SetAsyncError(tc.async)
					<-hung
					if err := closeComm(c); err == nil || !strings.Contains(err.Error(), "the watchdog aborted") {
						return fmt.Errorf("Close after the watchdog: %v", err)
					}
					return nil
				}
				c.Isend(kernels.NewCPU().Alloc(3), 1, 0, "lost").Wait() // its join waits until the abort
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

// closeComm closes an NCCL communicator.
func closeComm(c transport.Comm) error { return c.(interface{ Close() error }).Close() }
