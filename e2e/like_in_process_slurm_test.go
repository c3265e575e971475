//go:build mpi && slurm

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestSlurmTrainsLikeInProcess is the Slurm counterpart of like_in_process_mpi_test.go: ranks
// that srun (or mpirun in an allocation) starts train as in-process ranks do, bit for bit.

// TestSlurmTrainsLikeInProcess: `srun -n 4 --mpi=pmix distflash train` on one node (Open
// MPI's ranks wired up by Slurm's PMIx server, no mpirun) gives bit-identical losses and
// checkpointed weights to world_size = 4 in one process, with and without FSDP; and so does
// `srun -N 2 --ntasks-per-node=2 --mpi=pmix` on 2 Slurm nodes (network namespace hosts, one
// slurmd each), whose ranks' traffic crosses the hosts' links (the PMIx servers of the two
// nodes wire up the ranks of both), and, with FSDP, mpirun in an allocation of those 2 nodes.
func TestSlurmTrainsLikeInProcess(t *testing.T) {
	one, two := newSlurm(t, 0), newSlurm(t, 2)
	link := func() int64 { return (&netCluster{name: two.name}).linkBytes(t, 1) }
	for _, fsdp := range []string{"false", "true"} {
		t.Run("fsdp="+fsdp, func(t *testing.T) {
			set := []string{"--set", "parallelism.fsdp=" + fsdp, "--set", "checkpoint.interval=3"}
			inproc := t.TempDir()
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc)); err != nil {
				t.Fatalf("in-process: %v\n%s", err, out)
			}
			// same checks that the run in dir trained like the in-process one.
			same := func(what, launcher, dir, out string) {
				t.Helper()
				for _, s := range []string{"mpi: started by " + launcher + ";", "mpi: 4 processes"} {
					if !strings.Contains(out, s) {
						t.Errorf("%s: rank 0 did not say %q:\n%s", what, s, out)
					}
				}
				if strings.Contains(out, "without PMIx") {
					t.Errorf("%s: a rank warned of a launch without PMIx:\n%s", what, out)
				}
				if n := strings.Count(out, "trained 6 steps"); n != 1 {
					t.Errorf("%s: %d ranks printed the summary, want rank 0 only:\n%s", what, n, out)
				}
				a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(dir, "tiny-sp4"))
				if len(a) != 6 || fmt.Sprint(a) != fmt.Sprint(b) {
					t.Errorf("losses in-process %v\n%s %v", a, what, b)
				}
				step := func(dir string) string { return filepath.Join(dir, "tiny-sp4", "step-000006") }
				if err := sameState(stateOf(t, step(inproc)), stateOf(t, step(dir))); err != nil {
					t.Errorf("step 6 in-process vs %s: %v", what, err)
				}
			}
			dir := t.TempDir()
			out, took, err := one.srun(t, 4, "pmix", nil, append(set, "--set", "run.output_dir="+dir)...)
			if err != nil {
				t.Fatalf("srun: %v\n%s", err, out)
			}
			t.Logf("srun -n 4 --mpi=pmix on one node: %v", took)
			same("srun on one node", "srun", dir, out)

			// On 2 nodes: srun without FSDP; with FSDP mpirun in an allocation (salloc), which
			// takes the nodes and ranks from it and starts its daemons there through Slurm.
			dir = t.TempDir()
			before := link()
			what, launcher := "srun -N 2 --ntasks-per-node=2 --mpi=pmix", "srun"
			if fsdp == "true" {
				what, launcher = "salloc -N 2 --ntasks-per-node=2 mpirun", "Open MPI's mpirun"
				out, took, err = two.launch(t, []string{"salloc", "-N", "2", "--ntasks-per-node=2", "mpirun", "--allow-run-as-root", "--bind-to", "none"},
					append(set, "--set", "run.output_dir="+dir)...)
			} else {
				out, took, err = two.srunWith(t, []string{"-N", "2", "--ntasks-per-node=2", "--mpi=pmix"}, nil,
					append(set, "--set", "run.output_dir="+dir)...)
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", what, err, out)
			}
			// Ranks 2 and 3 run on host 1: what they exchange with ranks 0 and 1 crosses its
			// link. Ranks on one host would leave only Slurm's own traffic there, a few KB.
			crossed := link() - before
			if crossed < 1<<20 {
				t.Errorf("host 1's link carried %d bytes during the run; the ranks did not talk over it", crossed)
			}
			t.Logf("%s: %v; host 1's link carried %.1f MB", what, took, float64(crossed)/1e6)
			same(what, launcher, dir, out)
		})
	}
}
