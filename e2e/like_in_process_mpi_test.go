//go:build mpi

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests of this file check that MPI processes train as the same world of in-process ranks
// does, bit for bit: mpirun on this machine (the world, the hybrid, --init-from, buffers that
// only staging reaches) and on 2 network-namespace hosts (as root). Run them with
// `go test -tags mpi ./e2e -run 'MPI|MultiNode'`.

// TestMPITrainsLikeInProcess: `mpirun -np 4 distflash train --config configs/tiny-sp4.toml`
// (one rank per process, the MPI communicator) gives bit-identical losses and checkpointed
// weights to world_size = 4 in one process, with and without FSDP; and a run saved by the
// MPI processes resumes in one process (and the other way round) exactly.
func TestMPITrainsLikeInProcess(t *testing.T) {
	for _, fsdp := range []string{"false", "true"} {
		t.Run("fsdp="+fsdp, func(t *testing.T) {
			inproc, mpi := t.TempDir(), t.TempDir()
			set := []string{"--set", "parallelism.fsdp=" + fsdp, "--set", "checkpoint.interval=3"}
			out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc))
			if err != nil {
				t.Fatalf("in-process: %v\n%s", err, out)
			}
			out, took, err := mpirunTrain(t, 4, nil, append(set, "--set", "run.output_dir="+mpi)...)
			if err != nil {
				t.Fatalf("mpirun: %v\n%s", err, out)
			}
			if !strings.Contains(out, "mpi: 4 processes") {
				t.Errorf("rank 0 did not report the MPI world:\n%s", out)
			}
			if n := strings.Count(out, "trained 6 steps"); n != 1 {
				t.Errorf("%d ranks printed the summary, want rank 0 only:\n%s", n, out)
			}
			t.Logf("mpirun -np 4: %v", took)
			a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(mpi, "tiny-sp4"))
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("losses in-process %v\nover MPI %v", a, b)
			}
			if err := sameState(stateOf(t, filepath.Join(inproc, "tiny-sp4", "step-000006")),
				stateOf(t, filepath.Join(mpi, "tiny-sp4", "step-000006"))); err != nil {
				t.Errorf("step 6 in-process vs MPI: %v", err)
			}
			// Resume across backends: MPI saved step 3; one process continues it (and the
			// other way round), ending where the straight runs did.
			cross := t.TempDir()
			if out, _, err := mpirunTrain(t, 4, nil, append(set, "--set", "run.output_dir="+cross, "--stop-after", "3")...); err != nil {
				t.Fatalf("mpirun to step 3: %v\n%s", err, out)
			}
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+cross, "--resume", "auto")); err != nil {
				t.Fatalf("in-process resume of the MPI checkpoint: %v\n%s", err, out)
			}
			if err := sameState(stateOf(t, filepath.Join(inproc, "tiny-sp4", "step-000006")),
				stateOf(t, filepath.Join(cross, "tiny-sp4", "step-000006"))); err != nil {
				t.Errorf("MPI to step 3, in-process to 6: %v", err)
			}
			back := t.TempDir()
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+back, "--stop-after", "3")); err != nil {
				t.Fatalf("in-process to step 3: %v\n%s", err, out)
			}
			if out, _, err := mpirunTrain(t, 4, nil, append(set, "--set", "run.output_dir="+back, "--resume", "auto")...); err != nil {
				t.Fatalf("MPI resume of the in-process checkpoint: %v\n%s", err, out)
			}
			if err := sameState(stateOf(t, filepath.Join(inproc, "tiny-sp4", "step-000006")),
				stateOf(t, filepath.Join(back, "tiny-sp4", "step-000006"))); err != nil {
				t.Errorf("in-process to step 3, MPI to 6: %v", err)
			}
		})
	}
}

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

// TestMPIDeviceStaging: 4 MPI processes whose buffers are not host memory (device.kind =
// "cpu-device", so the MPI communicator only ever sees transport.Staged's host copies, as a
// GPU rank's buffers) train bit for bit as the host path, every schedule, the hybrid and FSDP,
// and every rank sends the same bytes at every call site (DISTFLASH_TRAFFIC).
func TestMPIDeviceStaging(t *testing.T) {
	for _, c := range stagingCases() {
		t.Run(fmt.Sprint(c[1:]), func(t *testing.T) {
			var dirs [2]string
			var traffic [2][]string
			for i, kind := range []string{"cpu", "cpu-device"} {
				dirs[i] = t.TempDir()
				t.Setenv("DISTFLASH_TRAFFIC", filepath.Join(dirs[i], "traffic"))
				args := []string{"--set", "run.output_dir=" + dirs[i], "--set", "training.steps=3", "--set", "device.kind=" + kind}
				for _, s := range c {
					args = append(args, "--set", s)
				}
				if out, _, err := mpirunTrain(t, 4, nil, args...); err != nil {
					t.Fatalf("%s: %v\n%s", kind, err, out)
				}
				for r := range 4 {
					b, err := os.ReadFile(filepath.Join(dirs[i], fmt.Sprintf("traffic.rank%d", r)))
					if err != nil {
						t.Fatal(err)
					}
					traffic[i] = append(traffic[i], string(b))
				}
			}
			a := readMetrics(t, filepath.Join(dirs[0], "tiny-sp4", "metrics.jsonl"))
			b := readMetrics(t, filepath.Join(dirs[1], "tiny-sp4", "metrics.jsonl"))
			if len(a) != 3 || len(b) != 3 {
				t.Fatalf("%d and %d metric lines, want 3", len(a), len(b))
			}
			for i := range a {
				if a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm || a[i].AttnBytes != b[i].AttnBytes {
					t.Errorf("step %d: host %v %v %d, staged %v %v %d", a[i].Step, a[i].Loss, a[i].GradNorm, a[i].AttnBytes, b[i].Loss, b[i].GradNorm, b[i].AttnBytes)
				}
			}
			for r := range 4 {
				if traffic[0][r] != traffic[1][r] {
					t.Errorf("rank %d's bytes per site: host %s, staged %s", r, traffic[0][r], traffic[1][r])
				}
			}
			if err := sameState(stateOf(t, filepath.Join(dirs[0], "tiny-sp4")), stateOf(t, filepath.Join(dirs[1], "tiny-sp4"))); err != nil {
				t.Errorf("the checkpoints differ: %v", err)
			}
		})
	}
}

// TestMultiNodeTrainsLikeInProcess: 2 hosts × 2 ranks train bit-identically to 4 in-process
// ranks, with and without FSDP, and the traffic between the hosts crosses their links; a
// checkpoint the cluster saved continues in one process, and one saved in one process
// continues on the cluster, both ending on the weights of the straight runs.
func TestMultiNodeTrainsLikeInProcess(t *testing.T) {
	c := newCluster(t, 2, "")
	for _, fsdp := range []string{"false", "true"} {
		t.Run("fsdp="+fsdp, func(t *testing.T) {
			inproc, multi := t.TempDir(), t.TempDir()
			// 4 steps, a checkpoint at 2 and 4 (CI time: each cluster run starts 4 processes).
			set := []string{"--set", "parallelism.fsdp=" + fsdp, "--set", "training.steps=4", "--set", "checkpoint.interval=2"}
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc)); err != nil {
				t.Fatalf("in-process: %v\n%s", err, out)
			}
			before := c.linkBytes(t, 1)
			out, err := c.train(t, append(set, "--set", "run.output_dir="+multi)...)
			if err != nil {
				t.Fatalf("mpirun on 2 hosts: %v\n%s", err, out)
			}
			if !strings.Contains(out, "mpi: 4 processes") {
				t.Errorf("rank 0 did not report the MPI world:\n%s", out)
			}
			// Ranks 2 and 3 are on host 1: every byte they exchange with ranks 0 and 1 crosses
			// host 1's link. A run that stayed on one host (shared memory) would leave only
			// mpirun's control traffic there, a few KB.
			crossed := c.linkBytes(t, 1) - before
			if crossed < 1<<20 {
				t.Errorf("host 1's link carried %d bytes during the run; the ranks did not talk over it", crossed)
			}
			t.Logf("host 1's link carried %.1f MB", float64(crossed)/1e6)
			a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(multi, "tiny-sp4"))
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("losses in-process %v\non 2 hosts %v", a, b)
			}
			step := func(dir, s string) string { return filepath.Join(dir, "tiny-sp4", "step-00000"+s) }
			if err := sameState(stateOf(t, step(inproc, "4")), stateOf(t, step(multi, "4"))); err != nil {
				t.Errorf("step 4 in-process vs 2 hosts: %v", err)
			}
			if fsdp == "true" {
				return // the resumes below do not depend on the sharding
			}
			// The cluster's step 2, continued in one process; the in-process step 2,
			// continued on the cluster.
			cross, back := t.TempDir(), t.TempDir()
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+cross, "--resume", step(multi, "2"))); err != nil {
				t.Fatalf("in-process resume of the cluster's step 2: %v\n%s", err, out)
			}
			if err := sameState(stateOf(t, step(inproc, "4")), stateOf(t, step(cross, "4"))); err != nil {
				t.Errorf("2 hosts to step 2, in-process to 4: %v", err)
			}
			if out, err := c.train(t, append(set, "--set", "run.output_dir="+back, "--resume", step(inproc, "2"))...); err != nil {
				t.Fatalf("cluster resume of the in-process step 2: %v\n%s", err, out)
			}
			if err := sameState(stateOf(t, step(inproc, "4")), stateOf(t, step(back, "4"))); err != nil {
				t.Errorf("in-process to step 2, 2 hosts to 4: %v", err)
			}
		})
	}
}
