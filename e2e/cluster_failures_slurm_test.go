//go:build mpi && slurm

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"distflash/ckpt"
)

// The tests of this file check how a Slurm job step ends when a rank is killed, or when srun
// gives Open MPI no PMIx server: at once, saying why, the last checkpoint intact.

// TestSlurmKilledRank kills rank 0 (SIGKILL, from inside) while it saves step 4, after it
// wrote its shard: Slurm ends the whole step in bounded time and says a task was killed, and
// the checkpoint of step 2 stays `latest`.
func TestSlurmKilledRank(t *testing.T) {
	c := newSlurm(t, 0)
	dir := t.TempDir()
	set := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "checkpoint.interval=2", "--set", "run.output_dir=" + dir}
	if out, _, err := c.srun(t, 2, "pmix", nil, append(set, "--stop-after", "2")...); err != nil {
		t.Fatalf("srun to step 2: %v\n%s", err, out)
	}
	// Only task 0 gets the variable: srun passes one environment to every task.
	wrap := []string{"sh", "-c", `[ "$SLURM_PROCID" = 0 ] && export ` + ckpt.KillAtEnv + `="shard written"; exec "$@"`, "sh"}
	out, took, err := c.srun(t, 2, "pmix", wrap, append(set, "--resume", "auto")...)
	if err == nil {
		t.Fatalf("srun succeeded although rank 0 was killed:\n%s", out)
	}
	if took > 60*time.Second {
		t.Errorf("the step took %v to end after a rank died", took)
	}
	if !strings.Contains(out, "task 0: Killed") {
		t.Errorf("srun's output does not say task 0 was killed:\n%s", out)
	}
	path, skipped, err := ckpt.Resolve(filepath.Join(dir, "tiny-sp4"), "auto")
	if err != nil || len(skipped) > 0 || filepath.Base(path) != "step-000002" {
		t.Errorf("latest after the kill: %s, %v (skipped %v); want step-000002", path, err, skipped)
	}
	t.Logf("step ended %v after start; srun said:\n%s", took, lastLines(out, 6))
}

// TestSlurmWithoutPMIx: srun --mpi=pmi2 (and none) gives Open MPI no PMIx server, and
// Debian's Open MPI has no PMI-2 client: the step must fail at once, rank 0 saying to use
// --mpi=pmix, and no rank may train on its own.
func TestSlurmWithoutPMIx(t *testing.T) {
	c := newSlurm(t, 0)
	for _, mpi := range []string{"pmi2", "none"} {
		t.Run(mpi, func(t *testing.T) {
			dir := t.TempDir()
			out, took, err := c.srun(t, 4, mpi, nil, "--set", "run.output_dir="+dir)
			if err == nil {
				t.Fatalf("srun --mpi=%s succeeded:\n%s", mpi, out)
			}
			if want := "4 ranks with --mpi=" + mpi + ", without PMIx"; !strings.Contains(out, want) || !strings.Contains(out, "run srun --mpi=pmix") {
				t.Errorf("rank 0 did not say %q and how to fix it:\n%s", want, out)
			}
			if _, err := os.Stat(filepath.Join(dir, "tiny-sp4", "metrics.jsonl")); !os.IsNotExist(err) {
				t.Errorf("a rank trained although MPI did not start: %v", err)
			}
			t.Logf("srun --mpi=%s failed after %v:\n%s", mpi, took, lastLines(out, 4))
		})
	}
}
