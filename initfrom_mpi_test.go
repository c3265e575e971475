//go:build mpi

package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestMPIInitFrom: `mpirun -np 4 distflash train --init-from HF-DIR` (one rank per process,
// each loading the source) trains exactly as the in-process world of 4 does from the same
// source, with and without FSDP.
func TestMPIInitFrom(t *testing.T) {
	for _, fsdp := range []string{"false", "true"} {
		t.Run("fsdp="+fsdp, func(t *testing.T) {
			inproc, mpi := t.TempDir(), t.TempDir()
			set := []string{"--init-from", "weights/testdata/hf/llama-sharded", "--set", "parallelism.fsdp=" + fsdp,
				"--set", "data.seq_len=128"}
			out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc))
			if err != nil {
				t.Fatalf("in-process: %v\n%s", err, out)
			}
			if !strings.Contains(out, "init: weights from weights/testdata/hf/llama-sharded (hf") {
				t.Errorf("no init line:\n%s", out)
			}
			out, _, err = mpirunTrain(t, 4, nil, append(set, "--set", "run.output_dir="+mpi)...)
			if err != nil {
				t.Fatalf("mpirun: %v\n%s", err, out)
			}
			if n := strings.Count(out, "init: weights from"); n != 1 {
				t.Errorf("%d processes reported the init, want rank 0 only:\n%s", n, out)
			}
			a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(mpi, "tiny-sp4"))
			if len(a) != 6 || fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("losses in-process %v\nover MPI %v", a, b)
			}
		})
	}
}
