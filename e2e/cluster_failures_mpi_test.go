//go:build mpi

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"distflash/ckpt"
)

// The tests of this file check how a job of several MPI processes ends when something goes
// wrong or runs out: a killed rank, a cut link between hosts (the watchdog), a world of the
// wrong size, a config every rank refuses (said once), a time limit (every rank stops after
// the same step). It ends in bounded time, saying why, and leaves the last checkpoint intact.

// TestMPIKilledRank kills rank 0 (SIGKILL, from inside) while it saves step 4, after it wrote
// its shard: the job ends within a bounded time with a message that names the failure, and
// the checkpoint of step 2 stays `latest`, intact.
func TestMPIKilledRank(t *testing.T) {
	out, took := killDuringSave(t, 0)
	if took > 60*time.Second {
		t.Errorf("the job took %v to end after a rank died", took)
	}
	if !strings.Contains(out, "signal 9") && !strings.Contains(out, "Killed") {
		t.Errorf("the output does not say a rank was killed:\n%s", out)
	}
	t.Logf("job ended %v after start; mpirun said:\n%s", took, lastLines(out, 8))
}

// TestMPIRankLostDuringSave kills rank 1 while the ranks save step 4, after its shard is
// written: what rank 0 says of the save that mpirun's SIGTERM stopped it in is true: it stops
// when the save is complete, or, when it cannot be, the checkpoint of step 2 stays `latest`,
// as it does (issue 33, item 8).
func TestMPIRankLostDuringSave(t *testing.T) {
	out, _ := killDuringSave(t, 1)
	const said = "stopping when the checkpoint of step 4, now being saved, is complete (Ctrl-C again to stop now); until it is, or if it cannot be (stopped now, a rank lost), the checkpoint of step 2 stays `latest`"
	if !strings.Contains(out, said) || strings.Count(out, "now being saved") != 1 {
		t.Errorf("rank 0 did not say what becomes of the save (%q):\n%s", said, out)
	}
}

// killDuringSave trains 2 MPI ranks to a checkpoint of step 2, resumes them and kills rank
// killed (SIGKILL, from inside) while the ranks save step 4, after its shard is written: the
// job must fail, and the checkpoint of step 2 stay `latest`, intact. It returns what mpirun
// printed and how long the job took.
func killDuringSave(t *testing.T, killed int) (string, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	set := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "checkpoint.interval=2", "--set", "run.output_dir=" + dir}
	if out, _, err := mpirunTrain(t, 2, nil, append(set, "--stop-after", "2")...); err != nil {
		t.Fatalf("mpirun to step 2: %v\n%s", err, out)
	}
	envs := make([][]string, 2)
	envs[killed] = []string{ckpt.KillAtEnv + "=shard written"}
	out, took, err := mpirunRanks(t, envs, append(set, "--resume", "auto")...)
	if err == nil {
		t.Fatalf("mpirun succeeded although rank %d was killed:\n%s", killed, out)
	}
	path, skipped, err := ckpt.Resolve(filepath.Join(dir, "tiny-sp4"), "auto")
	if err != nil || len(skipped) > 0 || filepath.Base(path) != "step-000002" {
		t.Errorf("latest after the kill: %s, %v (skipped %v); want step-000002", path, err, skipped)
	}
	return out, took
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

// TestMultiNodeLinkCut cuts host 1's link (ip link set eth0 down) while the 4 ranks train:
// nothing errors, messages just stop arriving, so the watchdog (DISTFLASH_MPI_TIMEOUT, passed
// to every rank with -x) must end the job, in bounded time, naming what it waited for: a
// transfer with a rank on the other host.
func TestMultiNodeLinkCut(t *testing.T) {
	c := newCluster(t, 2, "")
	dir := t.TempDir()
	const timeout = 8 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, out := c.mpirun(t, ctx, []string{"DISTFLASH_MPI_TIMEOUT=" + timeout.String()},
		"--set", "training.steps=1000", "--set", "checkpoint.interval=0", "--set", "run.output_dir="+dir)
	done := make(chan struct{})
	var err error
	go func() { err = cmd.Wait(); close(done) }()
	waitForStep(t, dir, 2, done, out)
	if o, err := c.script("link", "1", "down"); err != nil {
		t.Fatalf("cutting host 1's link: %v\n%s", err, o)
	}
	cut := time.Now()
	select {
	case <-done:
	case <-time.After(timeout + 60*time.Second):
		t.Fatalf("the job still runs %v after the link was cut (watchdog %v):\n%s", time.Since(cut), timeout, out)
	}
	took := time.Since(cut)
	if err == nil {
		t.Fatalf("mpirun succeeded although host 1 was cut off:\n%s", out)
	}
	s := out.String()
	// Every rank whose watchdog fires says what it waited for; a rank of host 0 may wait for
	// another rank of host 0 that is itself stuck on the cut, and its watchdog may fire first
	// (its wait began earlier), so some report, not the first, must name a transfer across the
	// cut link (ranks 0-1 on host 0, 2-3 on host 1) or a collective.
	all := regexp.MustCompile(`MPI rank (\d) \(rank \d of group \w+\) waited \S+ for the (\w+ of \d+ values (?:to|from) rank (\d)|[^;]*)`).FindAllStringSubmatch(s, -1)
	if len(all) == 0 {
		t.Fatalf("no rank's watchdog reported the wait (want \"waited %v for the …\"):\n%s", timeout, s)
	}
	var m []string
	for _, r := range all {
		self, _ := strconv.Atoi(r[1])
		peer, err := strconv.Atoi(r[3])
		if err != nil || self/2 != peer/2 {
			m = r
			break
		}
	}
	if m == nil {
		t.Fatalf("every watchdog report names a rank on its own host, none a transfer across the cut link:\n%s", s)
	}
	t.Logf("job ended %v after the cut (watchdog %v): %s", took, timeout, m[0])
}

// TestMultiNodeKilledRank kills rank 3 (SIGKILL, on host 1) while the 4 ranks train: mpirun
// must end the job on both hosts in bounded time, say which rank died, and leave no rank
// running on either host.
func TestMultiNodeKilledRank(t *testing.T) {
	c := newCluster(t, 2, "")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, out := c.mpirun(t, ctx, []string{"DISTFLASH_MPI_TIMEOUT=60s"},
		"--set", "training.steps=1000", "--set", "checkpoint.interval=0", "--set", "run.output_dir="+dir)
	done := make(chan struct{})
	var err error
	go func() { err = cmd.Wait(); close(done) }()
	waitForStep(t, dir, 2, done, out)
	pid := rankPid(t, c.name+"-h1", 3)
	if err := exec.Command("kill", "-9", strconv.Itoa(pid)).Run(); err != nil {
		t.Fatalf("kill -9 %d (rank 3): %v", pid, err)
	}
	killed := time.Now()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the job still runs %v after rank 3 was killed:\n%s", time.Since(killed), out)
	}
	if err == nil {
		t.Fatalf("mpirun succeeded although rank 3 was killed:\n%s", out)
	}
	s := out.String()
	if !strings.Contains(s, "rank 3") || !(strings.Contains(s, "signal 9") || strings.Contains(s, "Killed")) {
		t.Errorf("mpirun's output does not say rank 3 was killed:\n%s", s)
	}
	for _, h := range []string{"-h0", "-h1"} {
		if p := ranksIn(t, c.name+h); len(p) > 0 {
			t.Errorf("ranks still run on host %s after the job ended: %v", h, p)
		}
	}
	t.Logf("job ended %v after the kill; mpirun said:\n%s", time.Since(killed), lastLines(s, 6))
}
