//go:build !mpi

package e2e

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestRankRefusalNeverLost (a binary without MPI, which can be started as rank 1 of 2 without a
// launcher; an MPI binary would wait in MPI_Init): a rank other than 0 leaves the saying of its error to rank 0, which
// ends the job; should rank 0 not end it (rank 0 of this job is not running), the rank says it
// itself after the grace period, naming its rank, so the refusal is never lost. Here the rank's
// error is that this binary, started as rank 1 of 2, has no MPI (what it would refuse next, the
// flag, it never reaches).
func TestRankRefusalNeverLost(t *testing.T) {
	cmd := command("eval", "--task", "bogus", "--model", t.TempDir())
	cmd.Env = append(os.Environ(), "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2")
	start := time.Now()
	_, stderr, err := runCmd(t, cmd)
	took := time.Since(start)
	if err == nil || !strings.Contains(stderr, "distflash: rank 1: parallel: this process was started by Open MPI's mpirun as rank 1 of 2") ||
		!strings.Contains(stderr, "built without MPI") || strings.Count(stderr, "distflash:") != 1 {
		t.Errorf("rank 1 of 2 alone, in a binary without MPI: %v, want that said once, with the rank:\n%s", err, stderr)
	}
	if took < 4*time.Second {
		t.Errorf("rank 1 said it after %v, without leaving rank 0 the time to say it first", took)
	}
}
