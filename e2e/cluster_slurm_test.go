//go:build mpi && slurm

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The Slurm tests start a Slurm cluster with scripts/slurm-local.sh (munged, slurmctld and
// slurmd from Debian's slurm-wlm, as root, all state in a temporary directory, on free
// ports): one node that is this machine, or the hosts of scripts/netns-cluster.sh, one slurmd
// each. They run distflash under `srun --mpi=pmix`, as a Slurm site would. Run them with
// `go test -tags 'mpi slurm' ./e2e -run Slurm`.

// slurmCluster is a cluster made by scripts/slurm-local.sh.
type slurmCluster struct {
	env  []string
	dir  string // the state directory, DFS_DIR
	name string // netns-cluster's DFC_NAME, for hosts > 0
}

// newSlurm starts a cluster for the test, of this machine (hosts = 0) or of that many network
// namespace hosts, and stops it (no daemon, namespace or state left) when the test ends. It
// skips the test when Slurm is not installed or the test is not root.
func newSlurm(t *testing.T, hosts int) *slurmCluster {
	t.Helper()
	for _, tool := range []string{"slurmctld", "slurmd", "srun", "sinfo", "munged"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("Slurm is not installed (%s is not on PATH; Debian: apt-get install slurmd slurmctld slurm-client munge, which .ci/run does)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the Slurm tests start slurmd, which needs root; CI runs them as root")
	}
	// A short path: PMIx's sockets live under the spool directory, and a Unix socket's path
	// has at most 107 bytes.
	dir, err := os.MkdirTemp("", "dfslurm")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(dir) // up makes it, and refuses a cluster that exists
	c := &slurmCluster{dir: dir, env: append(os.Environ(), "DFS_DIR="+dir,
		"DFS_CTLD_PORT="+freePort(t), "DFS_SLURMD_PORT="+freePort(t))}
	if hosts > 0 {
		clusterSeq.Lock()
		clusterSeq.n++
		c.name = fmt.Sprintf("dfst%d", clusterSeq.n)
		clusterSeq.Unlock()
		c.env = append(c.env, "DFC_NAME="+c.name, "DFC_SUBNET=10.213.10")
	}
	start := time.Now()
	if out, err := c.script("up", fmt.Sprint(hosts)); err != nil {
		t.Fatalf("slurm-local.sh up %d: %v\n%s", hosts, err, out)
	}
	t.Logf("slurm-local.sh up: node idle after %v", time.Since(start).Round(time.Millisecond))
	var pids map[string]string
	t.Cleanup(func() {
		if out, err := c.script("down"); err != nil {
			t.Errorf("slurm-local.sh down: %v\n%s", err, out)
		}
		for name, pid := range pids {
			if exec.Command("kill", "-0", pid).Run() == nil {
				t.Errorf("%s (pid %s) still runs after down", name, pid)
			}
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("down left %s: %v", dir, err)
		}
		if out, _ := exec.Command("ip", "netns", "list").Output(); c.name != "" && strings.Contains(string(out), c.name+"-") {
			t.Errorf("namespaces left after down:\n%s", out)
		}
	})
	pids = c.daemons(t, dir)
	if want := 2 + max(hosts, 1); len(pids) != want {
		t.Fatalf("daemons running after up: %v, want munged, slurmctld and %d slurmd", pids, max(hosts, 1))
	}
	return c
}

// freePort is a TCP port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// script runs scripts/slurm-local.sh with args in the cluster's environment.
func (c *slurmCluster) script(args ...string) (string, error) {
	cmd := exec.Command("scripts/slurm-local.sh", args...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// daemons are the pids of munged, slurmctld and each slurmd, read from their pid files in
// the state directory dir.
func (c *slurmCluster) daemons(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("pid file: %v", err)
		}
		pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = strings.TrimSpace(string(b))
	}
	return pids
}

// srun runs `srun -n n --mpi=mpi [wrapper] distflash train` (trainArgs of tiny-sp4) through
// the cluster and returns the output of all tasks, the error and the time it took.
func (c *slurmCluster) srun(t *testing.T, n int, mpi string, wrapper []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	return c.srunWith(t, []string{"-n", fmt.Sprint(n), "--mpi=" + mpi}, wrapper, args...)
}

// srunWith runs `srun opts [wrapper] distflash train` (trainArgs of tiny-sp4) through the
// cluster.
func (c *slurmCluster) srunWith(t *testing.T, opts, wrapper []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	return c.launch(t, append(append([]string{"srun"}, opts...), wrapper...), args...)
}

// launch runs `launcher... distflash train` (trainArgs of tiny-sp4) as a client of the
// cluster and returns the output of all ranks, the error and the time it took.
func (c *slurmCluster) launch(t *testing.T, launcher []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	argv := append([]string{"run"}, launcher...)
	argv = append(argv, bin)
	argv = append(argv, trainArgs(args)...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "scripts/slurm-local.sh", argv...)
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	return out.String(), time.Since(start), err
}

// TestSlurmUpFails: when slurmctld cannot start (its port is taken), `slurm-local.sh up`
// fails naming the daemon and the cause, and leaves no daemon and no state behind.
func TestSlurmUpFails(t *testing.T) {
	for _, tool := range []string{"slurmctld", "slurmd", "sinfo", "munged"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("Slurm is not installed (%s is not on PATH; Debian: apt-get install slurmd slurmctld slurm-client munge, which .ci/run does)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the Slurm tests start slurmd, which needs root; CI runs them as root")
	}
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := filepath.Join(t.TempDir(), "slurm")
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	cmd := exec.Command("scripts/slurm-local.sh", "up")
	cmd.Env = append(os.Environ(), "DFS_DIR="+dir, "DFS_CTLD_PORT="+port, "DFS_SLURMD_PORT="+freePort(t))
	out, err := cmd.CombinedOutput()
	if err == nil {
		exec.Command("scripts/slurm-local.sh", "down").Run()
		t.Fatalf("up succeeded with slurmctld's port %s taken:\n%s", port, out)
	}
	for _, s := range []string{"slurmctld exited", "Address already in use", "up failed, stopping what was started"} {
		if !strings.Contains(string(out), s) {
			t.Errorf("up's output does not say %q:\n%s", s, out)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the failed up left %s: %v", dir, err)
	}
	for _, p := range clusterProcs(dir) {
		t.Errorf("%s still runs after the failed up", p)
	}
}

// clusterProcs lists the processes that belong to the cluster with state directory dir: they
// carry it in their environment (SLURM_CONF: the daemons, a job's slurmstepd, tasks and
// srun) or command line (munged's --socket).
func clusterProcs(dir string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		env, _ := os.ReadFile(filepath.Join(p, "environ"))
		args, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if bytes.Contains(env, []byte("SLURM_CONF="+dir+"/")) || bytes.Contains(args, []byte(dir+"/")) {
			comm, _ := os.ReadFile(filepath.Join(p, "comm"))
			found = append(found, fmt.Sprintf("%s (%s)", p, bytes.TrimSpace(comm)))
		}
	}
	return found
}

// TestSlurmDownEndsJobs: `down` while a job step runs ends the step (slurmd alone would leave
// its slurmstepd and tasks running), its srun, and every daemon.
func TestSlurmDownEndsJobs(t *testing.T) {
	c := newSlurm(t, 0)
	cmd := exec.Command("scripts/slurm-local.sh", "run", "srun", "-n", "2", "sleep", "300")
	cmd.Env = c.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := c.script("run", "squeue", "-h", "-o", "%T")
		if strings.TrimSpace(out) == "RUNNING" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job does not run after 30 s: squeue says %q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := c.script("down"); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("srun still runs 10 s after down")
	}
	if left := clusterProcs(c.dir); len(left) > 0 {
		t.Errorf("left after down: %v", left)
	}
}
