//go:build mpi

package transport_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// mpiFailBound is how long a job may take to end after one of its ranks failed.
const mpiFailBound = 30 * time.Second

// TestMPIFailure: when one rank of a running job fails, the job ends, with a non-zero status
// and a message that names the rank, within mpiFailBound, while the other rank waits in a
// collective for it. A rank killed (SIGKILL) or exiting on a panic is mpirun's to notice,
// with the watchdog off; a rank that stops (sleeps) is the watchdog's: the waiting rank
// aborts the job after DISTFLASH_MPI_TIMEOUT.
func TestMPIFailure(t *testing.T) {
	if mpiTest.comm != nil {
		t.Skip("this is a rank: TestMPIFailingRank does the work")
	}
	// The exit status is the failed rank's (128 + SIGKILL, Go's 2 for a panic) or the
	// watchdog's MPI_Abort code, 124. (Open MPI's own "MPI_ABORT was invoked" notice is not
	// checked: it is sometimes lost when the aborting rank dies at once.) MPICH's mpiexec
	// exits with the signal's number for a killed rank, and says nothing of a panicking one
	// beyond its output.
	kill := struct {
		status int
		want   []string
	}{137, []string{"rank 1", "signal 9"}}
	panicSays := []string{"rank 1 fails on purpose", "non-zero status"}
	if strings.HasPrefix(transport.MPIBuiltWith(), "MPICH") {
		kill.status, kill.want = 9, []string{"Killed (signal 9)"}
		panicSays = panicSays[:1]
	}
	for _, tc := range []struct {
		mode    string
		timeout string
		status  int
		want    []string
	}{
		{"kill", "0", kill.status, kill.want},
		{"panic", "0", 2, panicSays},
		{"hang", "2s", 124, []string{"MPI rank 0", "waited 2s for the all-reduce (reduce-scatter phase) of 1000 values", `site "loop"`, "aborting the job"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			env := []string{"DISTFLASH_MPI_FAIL=" + tc.mode, "DISTFLASH_MPI_TIMEOUT=" + tc.timeout}
			out, took, err := transporttest.MPIRunSelf(t, 2, 2*mpiFailBound, env, "-test.run=^TestMPIFailingRank$")
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.status {
				t.Fatalf("the MPI launcher ended with %v after rank 1 failed (%s), want exit status %d; output:\n%s", err, tc.mode, tc.status, out)
			}
			for _, s := range tc.want {
				if !strings.Contains(out, s) {
					t.Errorf("output does not say %q; output:\n%s", s, out)
				}
			}
			// The time from the failure (rank 1 says when) to the end of the job.
			m := regexp.MustCompile(`rank 1 fails on purpose at (\d+)`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("rank 1 did not say when it failed; output:\n%s", out)
			}
			at, _ := strconv.ParseInt(m[1], 10, 64)
			ended := time.Since(time.Unix(0, at)) // mpirunSelf has returned: the job has ended
			if ended > mpiFailBound {
				t.Errorf("the job ended %v after rank 1 failed, want < %v", ended, mpiFailBound)
			}
			t.Logf("%s: the launcher exited (%v) %v after rank 1 failed (%v in all)", tc.mode, err, ended.Round(time.Millisecond), took.Round(time.Millisecond))
		})
	}
}

// TestMPIFailingRank is a rank of TestMPIFailure: both ranks all-reduce in a loop, and after a
// few rounds rank 1 fails as DISTFLASH_MPI_FAIL says (kill, panic or hang) while rank 0 goes
// on into the next all-reduce.
func TestMPIFailingRank(t *testing.T) {
	c := mpiTest.comm
	mode := os.Getenv("DISTFLASH_MPI_FAIL")
	if c == nil || mode == "" {
		t.Skip("runs as the ranks of TestMPIFailure, under mpirun")
	}
	be := kernels.NewCPU()
	b := be.Alloc(1000)
	for i := 0; i < 1000; i++ {
		if i == 5 && c.Rank() == 1 {
			fmt.Fprintf(os.Stderr, "rank 1 fails on purpose at %d (%s)\n", time.Now().UnixNano(), mode)
			switch mode {
			case "kill":
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			case "panic":
				panic("rank 1 fails on purpose")
			case "hang":
				time.Sleep(time.Hour)
			}
		}
		c.AllReduce(b, "loop")
	}
	t.Fatalf("rank %d finished the loop: rank 1 did not fail (DISTFLASH_MPI_FAIL=%q)", c.Rank(), mode)
}
