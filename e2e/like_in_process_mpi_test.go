//go:build mpi

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"distflash/ckpt"
)

func init() { binTags = append(binTags, "mpi") }

// mpirunTrain runs `mpirun -np np distflash train` (the -tags mpi binary) with the tiny-sp4
// config's world and args, and returns the output of all ranks, the error and the run time.
// As root (CI) mpirun needs --allow-run-as-root; --oversubscribe lets 4 ranks share 2 cores,
// and --bind-to none lets each rank's Go runtime use both.
func mpirunTrain(t *testing.T, np int, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run installs it): %v", err)
	}
	bin := buildBinary(t)
	argv := []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}
	if len(env) > 0 { // MPMD: rank 0 runs with env, the others without
		argv = append(argv, "-np", "1", "env")
		argv = append(argv, env...)
		argv = append(argv, bin)
		argv = append(argv, trainArgs(args)...)
		argv = append(argv, ":", "-np", fmt.Sprint(np-1), bin)
	} else {
		argv = append(argv, "-np", fmt.Sprint(np), bin)
	}
	argv = append(argv, trainArgs(args)...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, argv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	return out.String(), time.Since(start), err
}

// trainArgs are the arguments of a short tiny-sp4 run.
func trainArgs(args []string) []string {
	return append([]string{"train", "--config", "configs/tiny-sp4.toml", "--progress=false",
		"--set", "data.max_bytes=1048576", "--set", "data.batch_size=2", "--set", "training.steps=6",
		"--set", "training.warmup_steps=2"}, args...)
}

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

// TestMPIKilledRank kills rank 0 (SIGKILL, from inside) while it saves step 4, after it wrote
// its shard: the job ends within a bounded time with a message that names the failure, and
// the checkpoint of step 2 stays `latest`, intact.
func TestMPIKilledRank(t *testing.T) {
	dir := t.TempDir()
	set := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "checkpoint.interval=2", "--set", "run.output_dir=" + dir}
	if out, _, err := mpirunTrain(t, 2, nil, append(set, "--stop-after", "2")...); err != nil {
		t.Fatalf("mpirun to step 2: %v\n%s", err, out)
	}
	out, took, err := mpirunTrain(t, 2, []string{ckpt.KillAtEnv + "=shard written"}, append(set, "--resume", "auto")...)
	if err == nil {
		t.Fatalf("mpirun succeeded although rank 0 was killed:\n%s", out)
	}
	if took > 60*time.Second {
		t.Errorf("the job took %v to end after a rank died", took)
	}
	if !strings.Contains(out, "signal 9") && !strings.Contains(out, "Killed") {
		t.Errorf("the output does not say a rank was killed:\n%s", out)
	}
	path, skipped, err := ckpt.Resolve(filepath.Join(dir, "tiny-sp4"), "auto")
	if err != nil || len(skipped) > 0 || filepath.Base(path) != "step-000002" {
		t.Errorf("latest after the kill: %s, %v (skipped %v); want step-000002", path, err, skipped)
	}
	t.Logf("job ended %v after start; mpirun said:\n%s", took, lastLines(out, 8))
}

// runBinArgs runs the binary with args in this process's environment.
func runBinArgs(t *testing.T, args []string) (string, error) {
	t.Helper()
	cmd := exec.Command(buildBinary(t), args...)
	cmd.Env = os.Environ()
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// TestMPIWorldMismatch: a config whose world_size is not the number of processes is refused
// by every rank, naming both numbers.
func TestMPIWorldMismatch(t *testing.T) {
	out, _, err := mpirunTrain(t, 2, nil, "--set", "run.output_dir="+t.TempDir())
	if err == nil || !strings.Contains(out, "parallelism.world_size = 4, but the launcher started 2 processes") {
		t.Errorf("mpirun -np 2 with world_size 4: %v\n%s", err, out)
	}
}

// TestMPIRefusalOnce: a config that every rank refuses alike is said once, by rank 0, not once
// per rank.
func TestMPIRefusalOnce(t *testing.T) {
	out, _, err := mpirunTrain(t, 2, nil, "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "model.n_kv_heads=3")
	const want = "model.n_heads = 4 is not a multiple of model.n_kv_heads = 3"
	if err == nil || strings.Count(out, want) != 1 {
		t.Errorf("%v; %d times %q in:\n%s", err, strings.Count(out, want), want, out)
	}
}

// TestMPITimeLimit: under mpirun, --time-limit stops every rank after the same step with a
// checkpoint, and mpirun's exit status is the ranks' 0 (a forwarded Ctrl-C makes Open MPI's
// mpirun exit 1 however the ranks end: docs/training.md#stopping).
func TestMPITimeLimit(t *testing.T) {
	dir := t.TempDir()
	out, _, err := mpirunTrain(t, 2, nil, "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "training.steps=100000", "--set", "run.output_dir="+dir, "--time-limit", "8s")
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`time limit 8s: stopping after step (\d+),`).FindStringSubmatch(out)
	if m == nil || strings.Count(out, "time limit 8s: stopping") != 1 {
		t.Fatalf("want one time-limit message, from rank 0:\n%s", out)
	}
	c, err := ckpt.Open(filepath.Join(dir, "tiny-sp4"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := fmt.Sprint(c.Manifest().Step); got != m[1] || c.Manifest().World.Size != 2 {
		t.Errorf("latest is step %s of %d ranks, the message said %s", got, c.Manifest().World.Size, m[1])
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
