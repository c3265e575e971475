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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The helpers of the MPI tests: mpirun of the -tags mpi binary on this machine, and clusters
// of hosts made by scripts/netns-cluster.sh.

// mpirunTrain runs `mpirun -np np distflash train` (the -tags mpi binary) with the tiny-sp4
// config's world and args, and returns the output of all ranks, the error and the run time.
// As root (CI) mpirun needs --allow-run-as-root; --oversubscribe lets 4 ranks share 2 cores,
// and --bind-to none lets each rank's Go runtime use both.
func mpirunTrain(t *testing.T, np int, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	envs := make([][]string, np) // rank 0 runs with env, the others without
	envs[0] = env
	return mpirunRanks(t, envs, args...)
}

// mpirunRanks is mpirunTrain with rank i's environment variables envs[i] (MPMD: an app
// context for each run of ranks alike).
func mpirunRanks(t *testing.T, envs [][]string, args ...string) (string, time.Duration, error) {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run installs it): %v", err)
	}
	argv := []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}
	for i, j := 0, 0; i < len(envs); i = j {
		for j = i + 1; j < len(envs) && slices.Equal(envs[j], envs[i]); j++ {
		}
		if i > 0 {
			argv = append(argv, ":")
		}
		argv = append(argv, "-np", fmt.Sprint(j-i))
		if len(envs[i]) > 0 {
			argv = append(append(argv, "env"), envs[i]...)
		}
		argv = append(append(argv, bin), trainArgs(args)...)
	}
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

// runBinArgs runs the binary with args in this process's environment.
func runBinArgs(t *testing.T, args []string) (string, error) {
	t.Helper()
	b, err := command(args...).CombinedOutput()
	return string(b), err
}

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

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
