//go:build mpi

package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestMPIRefusalOfOneRankEndsTheJob: a refusal that rank 0 alone makes (the run directory holds
// an earlier run: only rank 0 checks it) reaches the user in seconds, printed once, and ends
// the job, instead of the other ranks waiting in a collective for the watchdog
// (DISTFLASH_MPI_TIMEOUT, 60 s here) while rank 0 waits in MPI_Finalize.
func TestMPIRefusalOfOneRankEndsTheJob(t *testing.T) {
	t.Setenv("DISTFLASH_MPI_TIMEOUT", "60s")
	dir := t.TempDir()
	args := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "training.steps=1", "--set", "run.output_dir=" + dir}
	if out, _, err := mpirunTrain(t, 2, nil, args...); err != nil {
		t.Fatalf("the first run: %v\n%s", err, out)
	}
	out, took, err := mpirunTrain(t, 2, nil, args...)
	const want = "holds an earlier run"
	if err == nil || strings.Count(out, want) != 1 {
		t.Errorf("the second run into the same directory: %v; %d times %q in:\n%s", err, strings.Count(out, want), want, out)
	}
	if took > 20*time.Second {
		t.Errorf("the refusal took %v to end the job (the watchdog's 60 s?):\n%s", took, out)
	}
	t.Logf("refused and ended in %v", took)
}
