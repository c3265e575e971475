//go:build mpi

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"distflash/ckpt"
)

// The tests of this file build distflash against MPICH, beside the Open MPI binary of the
// other MPI tests, the way docs/cluster.md tells a cluster user with MPICH (or Cray MPICH,
// Intel MPI, MVAPICH) to: CC=mpicc.mpich go build -tags 'mpi mpicc' (MPICH's compiler wrapper
// gives the flags), and run it under MPICH's mpiexec (Hydra, mpiexec.mpich on Debian): it says
// which MPI it was built with, trains as the in-process world does, bit for bit, ends in
// bounded time saying so when a rank is killed, and says a config every rank refuses once.
// Without MPICH (Debian: apt-get install mpich libmpich-dev) they skip, except under CI (CI
// set), which installs it: there they fail.

// mpichBin is the MPICH build of the binary, made once per test binary by mpichBinary.
var mpichBin struct {
	once    sync.Once
	path    string // the binary
	mpiexec string // MPICH's launcher
	err     error  // MPICH is here but the build failed
	missing string // what is not installed
}

// mpichBinary builds the binary against MPICH (CC=mpicc.mpich, -tags mpi,mpicc) next to the
// Open MPI one, once, and returns it and MPICH's mpiexec.
func mpichBinary(t *testing.T) (path, mpiexec string) {
	t.Helper()
	b := &mpichBin
	b.once.Do(func() {
		cc, err := exec.LookPath("mpicc.mpich")
		if err == nil {
			b.mpiexec, err = exec.LookPath("mpiexec.mpich")
		}
		if err != nil {
			b.missing = err.Error()
			return
		}
		b.path = filepath.Join(filepath.Dir(bin), "distflash-mpich")
		cmd := exec.Command("go", "build", "-tags", "mpi,mpicc", "-o", b.path, ".")
		cmd.Env = append(os.Environ(), "CC="+cc)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("CC=%s go build -tags mpi,mpicc: %v\n%s", cc, err, out)
		}
	})
	if b.missing != "" {
		msg := "MPICH is not installed (" + b.missing + "; Debian: apt-get install mpich libmpich-dev, which .ci/run does)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path, b.mpiexec
}

// mpichTrain runs `mpiexec.mpich distflash train` of the MPICH build with the tiny-sp4 config's
// world and args (trainArgs), rank i with the environment variables envs[i] (an MPMD section
// for each run of ranks alike, as mpirunRanks makes for Open MPI), and returns the output of
// all ranks, the error and the run time. Hydra passes this process's environment on to every
// rank, and needs no options as root or for more ranks than cores.
func mpichTrain(t *testing.T, envs [][]string, args ...string) (string, time.Duration, error) {
	t.Helper()
	return mpichTrainWithin(t, 3*time.Minute, envs, args...)
}

// mpichTrainWithin is mpichTrain that stops the job (SIGKILL) after limit.
func mpichTrainWithin(t *testing.T, limit time.Duration, envs [][]string, args ...string) (string, time.Duration, error) {
	t.Helper()
	bin, mpiexec := mpichBinary(t)
	var argv []string
	for i, j := 0, 0; i < len(envs); i = j {
		for j = i + 1; j < len(envs) && slices.Equal(envs[j], envs[i]); j++ {
		}
		if i > 0 {
			argv = append(argv, ":")
		}
		argv = append(argv, "-n", fmt.Sprint(j-i))
		for _, kv := range envs[i] {
			k, v, _ := strings.Cut(kv, "=")
			argv = append(argv, "-env", k, v)
		}
		argv = append(append(argv, bin), trainArgs(args)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpiexec, argv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	return out.String(), time.Since(start), err
}

// running lists the processes that run the program at path.
func running(path string) []string {
	var pids []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err == nil && exe == path {
			pids = append(pids, d.Name())
		}
	}
	return pids
}

// TestMPIVersionNamesTheMPI: `distflash version` of an MPI build names the MPI whose mpi.h it
// was compiled against and the library it loads: Open MPI for the binary of the other MPI
// tests (pkg-config's mpi, Open MPI on Debian), MPICH for the one built with MPICH's wrapper.
func TestMPIVersionNamesTheMPI(t *testing.T) {
	out := mustSucceed(t, "version")
	if !strings.Contains(out, "tags mpi") || !strings.Contains(out, "MPI built against Open MPI ") || !strings.Contains(out, "library Open MPI v") {
		t.Errorf("version of the Open MPI build: %q", out)
	}
	mpich, _ := mpichBinary(t)
	b, err := exec.Command(mpich, "version").CombinedOutput()
	if s := string(b); err != nil || !strings.Contains(s, "tags mpi,mpicc") || !strings.Contains(s, "MPI built against MPICH ") || !strings.Contains(s, "library MPICH ") {
		t.Errorf("version of the MPICH build: %v, %q", err, s)
	}
}

// TestMPICHTrainsLikeInProcess: `mpiexec.mpich -n 4 distflash train --config configs/tiny-sp4.toml`
// of the MPICH build gives the losses and checkpointed weights of world_size = 4 in one
// process, bit for bit, as Open MPI's mpirun does (TestMPITrainsLikeInProcess): each process
// knows its rank from Hydra's PMI_RANK and PMI_SIZE, rank 0 alone reports.
func TestMPICHTrainsLikeInProcess(t *testing.T) {
	mpichBinary(t)
	inproc, mpi := t.TempDir(), t.TempDir()
	if out, err := runBinArgs(t, trainArgs([]string{"--set", "run.output_dir=" + inproc})); err != nil {
		t.Fatalf("in-process: %v\n%s", err, out)
	}
	out, took, err := mpichTrain(t, make([][]string, 4), "--set", "run.output_dir="+mpi)
	if err != nil {
		t.Fatalf("mpiexec.mpich: %v\n%s", err, out)
	}
	if !strings.Contains(out, "mpi: 4 processes; MPICH ") || strings.Count(out, "trained 6 steps") != 1 {
		t.Errorf("want rank 0 alone to report the MPICH world of 4 processes and the summary:\n%s", out)
	}
	t.Logf("mpiexec.mpich -n 4: %v", took)
	a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(mpi, "tiny-sp4"))
	if len(a) != 6 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("losses in-process %v\nover MPICH %v", a, b)
	}
	if err := sameState(stateOf(t, filepath.Join(inproc, "tiny-sp4", "step-000006")),
		stateOf(t, filepath.Join(mpi, "tiny-sp4", "step-000006"))); err != nil {
		t.Errorf("step 6 in-process vs MPICH: %v", err)
	}
}

// TestMPICHKilledRank kills rank 1 of 2 (SIGKILL, from inside) while it saves step 3: Hydra
// ends the job within a bounded time saying the rank was killed, no process of the job is
// left, and no checkpoint is taken for one (the save was not complete).
func TestMPICHKilledRank(t *testing.T) {
	bin, _ := mpichBinary(t)
	dir := t.TempDir()
	envs := [][]string{nil, {ckpt.KillAtEnv + "=shard written"}}
	out, took, err := mpichTrain(t, envs, "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "checkpoint.interval=3", "--set", "run.output_dir="+dir)
	if err == nil {
		t.Fatalf("mpiexec.mpich succeeded although rank 1 was killed:\n%s", out)
	}
	if took > 60*time.Second {
		t.Errorf("the job took %v to end after a rank died", took)
	}
	if !strings.Contains(out, "Killed (signal 9)") {
		t.Errorf("the output does not say a rank was killed:\n%s", out)
	}
	if p := running(bin); len(p) > 0 {
		t.Errorf("processes of the job still run after it ended: %v", p)
	}
	if path, skipped, err := ckpt.Resolve(filepath.Join(dir, "tiny-sp4"), "auto"); path != "" || len(skipped) > 0 || err != nil {
		t.Errorf("after the kill: checkpoint %q, %v (skipped %v); want none", path, err, skipped)
	}
	t.Logf("job ended %v after start (%v); mpiexec.mpich said:\n%s", took, err, lastLines(out, 4))
}

// TestMPICHRefusalOnce: a config that every rank refuses alike is said once, by rank 0, under
// MPICH's mpiexec too.
func TestMPICHRefusalOnce(t *testing.T) {
	out, _, err := mpichTrain(t, make([][]string, 2), "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "model.n_kv_heads=3", "--set", "run.output_dir="+t.TempDir())
	const want = "model.n_heads = 4 is not a multiple of model.n_kv_heads = 3"
	if err == nil || strings.Count(out, want) != 1 {
		t.Errorf("%v; %d times %q in:\n%s", err, strings.Count(out, want), want, out)
	}
}

// TestMPICHRankFailsBeforeInit: a rank that fails before MPI_Init (here rank 1 alone, on a bad
// DISTFLASH_MPI_TIMEOUT) ends the job at once, saying why once, where Hydra left the other
// rank waiting in MPI_Init for it for ever: Hydra ends a job when a process aborts, not when
// one exits with a failure, so the failing rank asks it to (PMI's abort).
func TestMPICHRankFailsBeforeInit(t *testing.T) {
	const limit = time.Minute
	out, took, err := mpichTrainWithin(t, limit, [][]string{nil, {"DISTFLASH_MPI_TIMEOUT=bogus"}},
		"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2", "--set", "run.output_dir="+t.TempDir())
	const want = `rank 1: parallel: environment variable DISTFLASH_MPI_TIMEOUT="bogus"`
	if err == nil || strings.Count(out, want) != 1 {
		t.Errorf("%v; %d times %q in:\n%s", err, strings.Count(out, want), want, out)
	}
	if took >= limit {
		t.Errorf("the job still ran %v after rank 1 failed before MPI_Init (stopped then):\n%s", took, out)
	}
	t.Logf("ended in %v", took)
}
