//go:build mpi

package e2e

import (
	"os/exec"
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
