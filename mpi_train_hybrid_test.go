//go:build mpi

package main

import (
	"fmt"
	"path/filepath"
	"testing"
)

// TestMPIHybridTrainsLikeInProcess: `mpirun -np 4` with parallelism.ulysses_degree = 2 (the
// hybrid's group and ring made by MPI_Comm_split) gives bit-identical losses and weights to
// the same world in one process.
func TestMPIHybridTrainsLikeInProcess(t *testing.T) {
	inproc, mpi := t.TempDir(), t.TempDir()
	set := []string{"--set", "parallelism.ulysses_degree=2", "--set", "parallelism.attention=zigzag"}
	if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc)); err != nil {
		t.Fatalf("in-process: %v\n%s", err, out)
	}
	out, took, err := mpirunTrain(t, 4, nil, append(set, "--set", "run.output_dir="+mpi)...)
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
	t.Logf("mpirun -np 4, ulysses_degree 2: %v", took)
	a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(mpi, "tiny-sp4"))
	if len(a) != 6 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("losses in-process %v\nover MPI %v", a, b)
	}
	if err := sameState(stateOf(t, filepath.Join(inproc, "tiny-sp4", "step-000006")),
		stateOf(t, filepath.Join(mpi, "tiny-sp4", "step-000006"))); err != nil {
		t.Errorf("step 6 in-process vs MPI: %v", err)
	}
}
