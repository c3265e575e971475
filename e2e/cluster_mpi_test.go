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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The multi-node tests run mpirun across hosts made by scripts/netns-cluster.sh: 2 network
// namespaces with their own address, hostname and link (a veth to a bridge in a third
// namespace), 2 ranks each, Open MPI entering a host through ip netns exec instead of ssh.
// They need root (CI runs as root) and the subnet 10.213.7.0/24, which exists only inside
// the namespaces they make.

// netCluster is a cluster of hosts made by scripts/netns-cluster.sh.
type netCluster struct {
	name string
	env  []string
}

var clusterSeq struct {
	sync.Mutex
	n int
}

// newCluster makes a cluster of n hosts (2 ranks each) named after the test, and removes it
// when the test ends. It skips the test when not root: network namespaces need root.
func newCluster(t *testing.T, n int, rate string) *netCluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("multi-node tests need root (network namespaces: ip netns add); CI runs them as root")
	}
	for _, tool := range []string{"ip", "tc", "unshare", "mpirun"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH (Debian: iproute2, util-linux, openmpi-bin): %v", tool, err)
		}
	}
	clusterSeq.Lock()
	clusterSeq.n++
	id := clusterSeq.n
	clusterSeq.Unlock()
	c := &netCluster{name: fmt.Sprintf("dfct%d", id)}
	c.env = append(os.Environ(), "DFC_NAME="+c.name, "DFC_SUBNET=10.213.7", "DFC_RATE="+rate,
		"DFC_TCP_RETRIES2=5") // a cut link ends mpirun's connections in ~13 s, not ~15 min
	if out, err := c.script("up", strconv.Itoa(n)); err != nil {
		t.Fatalf("netns-cluster.sh up %d: %v\n%s", n, err, out)
	}
	t.Cleanup(func() {
		if out, err := c.script("down"); err != nil {
			t.Errorf("netns-cluster.sh down: %v\n%s", err, out)
		}
		if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), c.name+"-") {
			t.Errorf("namespaces left after down:\n%s", out)
		}
	})
	return c
}

// script runs scripts/netns-cluster.sh with args.
func (c *netCluster) script(args ...string) (string, error) {
	cmd := exec.Command("scripts/netns-cluster.sh", args...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// linkBytes is the bytes host i's link carried (sent plus received, at the host's eth0).
func (c *netCluster) linkBytes(t *testing.T, i int) int64 {
	t.Helper()
	var sum int64
	for _, f := range []string{"tx_bytes", "rx_bytes"} {
		out, err := exec.Command("ip", "netns", "exec", fmt.Sprintf("%s-h%d", c.name, i),
			"cat", "/sys/class/net/eth0/statistics/"+f).Output()
		if err != nil {
			t.Fatalf("reading %s of host %d: %v", f, i, err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatalf("%s of host %d: %v", f, i, err)
		}
		sum += v
	}
	return sum
}

// mpirun starts `mpirun -np 4 distflash train` (tiny-sp4, trainArgs) on host 0, ranks 0-1
// on host 0 and 2-3 on host 1, passing env (NAME=VALUE) to every rank with -x. It returns the
// started command and its output buffer.
func (c *netCluster) mpirun(t *testing.T, ctx context.Context, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	bin := buildBinary(t)
	argv := []string{"run", "mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "4"}
	for _, e := range env {
		argv = append(argv, "-x", e)
	}
	argv = append(argv, bin)
	argv = append(argv, trainArgs(args)...)
	cmd := exec.CommandContext(ctx, "scripts/netns-cluster.sh", argv...)
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mpirun on the cluster: %v", err)
	}
	return cmd, &out
}

// train runs c.mpirun to the end.
func (c *netCluster) train(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, out := c.mpirun(t, ctx, nil, args...)
	err := cmd.Wait()
	return out.String(), err
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

// waitForStep waits until the run in dir has logged step n (metrics.jsonl), or fails.
func waitForStep(t *testing.T, dir string, n int, done <-chan struct{}, out *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(dir, "tiny-sp4", "metrics.jsonl"))
		if bytes.Count(b, []byte("\n")) >= n {
			return
		}
		select {
		case <-done:
			t.Fatalf("the run ended before step %d:\n%s", n, out)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("the run did not reach step %d in 2 minutes:\n%s", n, out)
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

// ranksIn lists the distflash rank processes in namespace ns: pid → OMPI_COMM_WORLD_RANK.
func ranksIn(t *testing.T, ns string) map[int]int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", ns, err)
	}
	ranks := map[int]int{}
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if filepath.Base(exe) != "distflash" {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("OMPI_COMM_WORLD_RANK=")); ok {
				ranks[pid], _ = strconv.Atoi(string(v))
			}
		}
	}
	return ranks
}

// rankPid is the pid of MPI rank r in namespace ns.
func rankPid(t *testing.T, ns string, r int) int {
	t.Helper()
	ranks := ranksIn(t, ns)
	for pid, rank := range ranks {
		if rank == r {
			return pid
		}
	}
	t.Fatalf("no process of rank %d in %s (found %v)", r, ns, ranks)
	return 0
}
