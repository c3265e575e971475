//go:build mpi

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryCommandOverMPI: eval, its loss by position, passkey and generate of one checkpoint
// on 4 MPI processes (4 sequence-parallel ranks under ring; 2 replicas × 2 under zigzag with
// FSDP; ring with device.kind = cpu-device, every exchange staged) give one rank's results,
// through the binary under mpirun.
func TestEveryCommandOverMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run installs it): %v", err)
	}
	model := trainedTiny(t)
	one := runCommands(t, model, nil)
	launch := []string{mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4"}
	for _, w := range [][]string{commandWorlds[1], commandWorlds[7], commandWorlds[8]} {
		t.Run(strings.Join(w, ","), func(t *testing.T) {
			compareCommands(t, runCommands(t, model, launch, w...), one)
		})
	}
}

// TestExportOverMPI: export under mpirun writes one whole Hugging Face directory (rank 0's),
// the same as one process's, and the job ends well; a command that launches no world (plan
// here) says its refusal once, rank 0's.
func TestExportOverMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH: %v", err)
	}
	model := trainedTiny(t)
	dir := t.TempDir()
	one, many := filepath.Join(dir, "one"), filepath.Join(dir, "many")
	succeed(t, "export", "--model", model, "--out", one)
	cmd := command()
	cmd.Path, cmd.Args = mpirun, []string{mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", bin, "export", "--model", model, "--out", many}
	if _, stderr, err := runCmd(t, cmd); err != nil {
		t.Fatalf("export under mpirun -np 2: %v\n%s", err, tailOf(stderr, 20))
	}
	cmd = command()
	cmd.Path, cmd.Args = mpirun, []string{mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", bin, "plan", "--cluster", "bogus"}
	if _, stderr, err := runCmd(t, cmd); err == nil || strings.Count(stderr, `--cluster "bogus"`) != 1 {
		t.Errorf("plan --cluster bogus under mpirun -np 2: %v, the refusal %d times:\n%s", err, strings.Count(stderr, `--cluster "bogus"`), stderr)
	}
	for _, f := range []string{"config.json", "model.safetensors"} {
		a, errA := os.ReadFile(filepath.Join(one, f))
		b, errB := os.ReadFile(filepath.Join(many, f))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: one process and mpirun -np 2 differ (%v, %v)", f, errA, errB)
		}
	}
}

// TestEveryRankRefusalOnceOverMPI: a refusal that every rank of a launched eval or generate
// makes alike (a --seq-len, a passkey length or a generation beyond the model's longest
// sequence) is said once, rank 0's, with no "rank 1:" copy, and ends the job.
func TestEveryRankRefusalOnceOverMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH: %v", err)
	}
	model := trainedTiny(t)
	launch := []string{mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", bin}
	world := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"eval --seq-len beyond the model", []string{"eval", "--model", model, "--seq-len", "100000"}, "exceeds the model's longest sequence"},
		{"generate past the model", []string{"generate", "--model", model, "--prompt", "func main() {", "--max-new-tokens", "100000"}, "exceed the model's longest sequence"},
		{"passkey past the model", []string{"eval", "--task", "passkey", "--model", model, "--lengths", "64K"}, "65536"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := command()
			cmd.Path, cmd.Args = mpirun, append(append(launch, c.args...), world...)
			_, stderr, err := runCmd(t, cmd)
			if err == nil || strings.Count(stderr, c.want) != 1 || strings.Contains(stderr, "rank 1:") {
				t.Errorf("%v; %d times %q, want once and no \"rank 1:\" line:\n%s", err, strings.Count(stderr, c.want), c.want, stderr)
			}
		})
	}
}
