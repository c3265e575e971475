//go:build mpi

package parallel

// The schedules over MPI. Started by go test, TestMPISchedules re-executes this test binary
// under mpirun on 1 to 4 ranks; started by mpirun (transport.MPIEnv says so), TestMain
// initialises MPI and TestMPISchedulesRanks runs every schedule on every rank, each rank
// comparing what MPI gave it with single-worker attention and with the in-process world.
// (The communicator's own MPI tests are package transport's.)

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"testing"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// mpiComm is this process's world when mpirun started it; nil otherwise.
var mpiComm transport.Comm

func TestMain(m *testing.M) {
	l, err := transport.MPIEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if l == nil {
		os.Exit(m.Run())
	}
	if mpiComm, err = transport.InitMPI(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	if err := transport.FinalizeMPI(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestMPISchedules runs TestMPISchedulesRanks under mpirun on P = 1 to 4 ranks, with MPI's
// ordinary sends and with synchronous ones (no send completes before its receive is posted,
// which finds a schedule that only works with eager sends). Every rank must pass.
func TestMPISchedules(t *testing.T) {
	if mpiComm != nil {
		t.Skip("this is a rank: TestMPISchedulesRanks does the work")
	}
	for _, tc := range []struct {
		P    int
		sync bool
	}{{1, false}, {2, true}, {3, false}, {4, false}, {4, true}} {
		t.Run(fmt.Sprintf("P%d/syncsend=%v", tc.P, tc.sync), func(t *testing.T) {
			env := []string{"DISTFLASH_MPI_TIMEOUT=60s", fmt.Sprintf("DISTFLASH_MPI_SYNC_SEND=%v", tc.sync)}
			transporttest.MPIRanksPass(t, tc.P, env, "TestMPISchedulesRanks")
		})
	}
}

// TestMPISchedulesRanks is one rank's share of TestMPISchedules; it runs only under mpirun.
func TestMPISchedulesRanks(t *testing.T) {
	if mpiComm == nil {
		t.Skip("runs as the ranks of TestMPISchedules, under mpirun")
	}
	mpiTestSchedules(t, mpiComm)
}

// mpiTestSchedules: every attention schedule on these P ranks over MPI gives the output, lse
// and dQ, dK, dV of single-worker attention (checkExact's tolerances), the same bits as on
// the in-process world, and the same bytes on every call site.
func mpiTestSchedules(t *testing.T, c transport.Comm) {
	heads := make([]string, 0, len(testHeads))
	for hn := range testHeads {
		heads = append(heads, hn)
	}
	sort.Strings(heads) // the same order on every rank
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) { mpiTestSchedule(t, c, name, heads, 1) })
	}
	// the hybrid (hybrid.go): Ulysses groups of U ranks, the schedule between them, on the
	// communicator splits of MPI
	for U := 2; U <= c.Size(); U++ {
		if c.Size()%U != 0 {
			continue
		}
		for _, name := range hybridOuter {
			t.Run(fmt.Sprintf("%s/U%d", name, U), func(t *testing.T) { mpiTestSchedule(t, c, name, heads, U) })
		}
	}
}

// mpiTestSchedule checks schedule name with parallelism.ulysses_degree = U.
func mpiTestSchedule(t *testing.T, c transport.Comm, name string, heads []string, U int) {
	P, r := c.Size(), c.Rank()
	const T = 48 // a multiple of 2P for P ≤ 4
	ran := 0
	{
		for _, hn := range heads {
			h := testHeads[hn]
			if err := CheckHybrid(name, h, P, U); err != nil {
				continue // refused on every rank alike; TestSchedulesExact and TestHybridExact check the refusal
			}
			for _, overlap := range []bool{false, true} {
				what := fmt.Sprintf("%s/P%d/U%d/%s/overlap=%v", name, P, U, hn, overlap)
				in := newInputs(T, h, uint64(P*100+h.N))
				be := kernels.NewCPU()
				before := c.Traffic()
				s, err := NewAttention(name, c, be, Options{Overlap: overlap, UlyssesDegree: U})
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				got := in.newRun(P)
				if err := in.runRank(s, c, be, &got); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				traffic := transporttest.TrafficSince(c, before)
				got = mpiGathered(c, be, got)

				want, err := in.runHybrid(name, P, U, Options{Overlap: overlap})
				if err != nil {
					t.Fatalf("%s in process: %v", what, err)
				}
				checkExact(t, got, in.reference())
				for _, x := range []struct {
					what string
					a, b []float32
				}{{"o", got.o, want.o}, {"lse", got.lse, want.lse}, {"dq", got.dq, want.dq}, {"dk", got.dk, want.dk}, {"dv", got.dv, want.dv}} {
					if !slices.Equal(x.a, x.b) {
						t.Errorf("%s: %s over MPI differs from the in-process world's", what, x.what)
					}
				}
				if err := transporttest.SameTraffic(traffic, want.traffic[r]); err != nil {
					t.Errorf("%s: %v", what, err)
				}
				ran++
			}
		}
	}
	t.Logf("%d runs on %d ranks", ran, P)
}

// mpiGathered sums every rank's partial outputs (each rank's positions, zeros elsewhere) so
// that every rank holds the whole sequence's.
func mpiGathered(c transport.Comm, be kernels.Backend, part scheduleRun) scheduleRun {
	sum := func(x []float32) []float32 {
		b := be.Alloc(len(x))
		be.Upload(b, x)
		c.AllReduce(b, "test.gather")
		return kernels.Host(b)
	}
	part.o, part.lse, part.dq, part.dk, part.dv = sum(part.o), sum(part.lse), sum(part.dq), sum(part.dk), sum(part.dv)
	return part
}
