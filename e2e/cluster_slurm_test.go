//go:build mpi && slurm

package main

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

	"distflash/ckpt"
)

// The Slurm tests start a Slurm cluster with scripts/slurm-local.sh (munged, slurmctld and
// slurmd from Debian's slurm-wlm, as root, all state in a temporary directory, on free
// ports): one node that is this machine, or the hosts of scripts/netns-cluster.sh, one slurmd
// each. They run distflash under `srun --mpi=pmix`, as a Slurm site would. Run them with
// `go test -tags 'mpi slurm' . -run Slurm`.

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
	argv = append(argv, buildBinary(t))
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

// TestSlurmTrainsLikeInProcess: `srun -n 4 --mpi=pmix distflash train` on one node (Open
// MPI's ranks wired up by Slurm's PMIx server, no mpirun) gives bit-identical losses and
// checkpointed weights to world_size = 4 in one process, with and without FSDP; and so does
// `srun -N 2 --ntasks-per-node=2 --mpi=pmix` on 2 Slurm nodes (network namespace hosts, one
// slurmd each), whose ranks' traffic crosses the hosts' links (the PMIx servers of the two
// nodes wire up the ranks of both), and, with FSDP, mpirun in an allocation of those 2 nodes.
func TestSlurmTrainsLikeInProcess(t *testing.T) {
	one, two := newSlurm(t, 0), newSlurm(t, 2)
	link := func() int64 { return (&netCluster{name: two.name}).linkBytes(t, 1) }
	for _, fsdp := range []string{"false", "true"} {
		t.Run("fsdp="+fsdp, func(t *testing.T) {
			set := []string{"--set", "parallelism.fsdp=" + fsdp, "--set", "checkpoint.interval=3"}
			inproc := t.TempDir()
			if out, err := runBinArgs(t, append(trainArgs(set), "--set", "run.output_dir="+inproc)); err != nil {
				t.Fatalf("in-process: %v\n%s", err, out)
			}
			// same checks that the run in dir trained like the in-process one.
			same := func(what, launcher, dir, out string) {
				t.Helper()
				for _, s := range []string{"mpi: started by " + launcher + ";", "mpi: 4 processes"} {
					if !strings.Contains(out, s) {
						t.Errorf("%s: rank 0 did not say %q:\n%s", what, s, out)
					}
				}
				if strings.Contains(out, "without PMIx") {
					t.Errorf("%s: a rank warned of a launch without PMIx:\n%s", what, out)
				}
				if n := strings.Count(out, "trained 6 steps"); n != 1 {
					t.Errorf("%s: %d ranks printed the summary, want rank 0 only:\n%s", what, n, out)
				}
				a, b := lossesOf(t, filepath.Join(inproc, "tiny-sp4")), lossesOf(t, filepath.Join(dir, "tiny-sp4"))
				if len(a) != 6 || fmt.Sprint(a) != fmt.Sprint(b) {
					t.Errorf("losses in-process %v\n%s %v", a, what, b)
				}
				step := func(dir string) string { return filepath.Join(dir, "tiny-sp4", "step-000006") }
				if err := sameState(stateOf(t, step(inproc)), stateOf(t, step(dir))); err != nil {
					t.Errorf("step 6 in-process vs %s: %v", what, err)
				}
			}
			dir := t.TempDir()
			out, took, err := one.srun(t, 4, "pmix", nil, append(set, "--set", "run.output_dir="+dir)...)
			if err != nil {
				t.Fatalf("srun: %v\n%s", err, out)
			}
			t.Logf("srun -n 4 --mpi=pmix on one node: %v", took)
			same("srun on one node", "srun", dir, out)

			// On 2 nodes: srun without FSDP; with FSDP mpirun in an allocation (salloc), which
			// takes the nodes and ranks from it and starts its daemons there through Slurm.
			dir = t.TempDir()
			before := link()
			what, launcher := "srun -N 2 --ntasks-per-node=2 --mpi=pmix", "srun"
			if fsdp == "true" {
				what, launcher = "salloc -N 2 --ntasks-per-node=2 mpirun", "Open MPI's mpirun"
				out, took, err = two.launch(t, []string{"salloc", "-N", "2", "--ntasks-per-node=2", "mpirun", "--allow-run-as-root", "--bind-to", "none"},
					append(set, "--set", "run.output_dir="+dir)...)
			} else {
				out, took, err = two.srunWith(t, []string{"-N", "2", "--ntasks-per-node=2", "--mpi=pmix"}, nil,
					append(set, "--set", "run.output_dir="+dir)...)
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", what, err, out)
			}
			// Ranks 2 and 3 run on host 1: what they exchange with ranks 0 and 1 crosses its
			// link. Ranks on one host would leave only Slurm's own traffic there, a few KB.
			crossed := link() - before
			if crossed < 1<<20 {
				t.Errorf("host 1's link carried %d bytes during the run; the ranks did not talk over it", crossed)
			}
			t.Logf("%s: %v; host 1's link carried %.1f MB", what, took, float64(crossed)/1e6)
			same(what, launcher, dir, out)
		})
	}
}

// TestSlurmKilledRank kills rank 0 (SIGKILL, from inside) while it saves step 4, after it
// wrote its shard: Slurm ends the whole step in bounded time and says a task was killed, and
// the checkpoint of step 2 stays `latest`.
func TestSlurmKilledRank(t *testing.T) {
	c := newSlurm(t, 0)
	dir := t.TempDir()
	set := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
		"--set", "checkpoint.interval=2", "--set", "run.output_dir=" + dir}
	if out, _, err := c.srun(t, 2, "pmix", nil, append(set, "--stop-after", "2")...); err != nil {
		t.Fatalf("srun to step 2: %v\n%s", err, out)
	}
	// Only task 0 gets the variable: srun passes one environment to every task.
	wrap := []string{"sh", "-c", `[ "$SLURM_PROCID" = 0 ] && export ` + ckpt.KillAtEnv + `="shard written"; exec "$@"`, "sh"}
	out, took, err := c.srun(t, 2, "pmix", wrap, append(set, "--resume", "auto")...)
	if err == nil {
		t.Fatalf("srun succeeded although rank 0 was killed:\n%s", out)
	}
	if took > 60*time.Second {
		t.Errorf("the step took %v to end after a rank died", took)
	}
	if !strings.Contains(out, "task 0: Killed") {
		t.Errorf("srun's output does not say task 0 was killed:\n%s", out)
	}
	path, skipped, err := ckpt.Resolve(filepath.Join(dir, "tiny-sp4"), "auto")
	if err != nil || len(skipped) > 0 || filepath.Base(path) != "step-000002" {
		t.Errorf("latest after the kill: %s, %v (skipped %v); want step-000002", path, err, skipped)
	}
	t.Logf("step ended %v after start; srun said:\n%s", took, lastLines(out, 6))
}

// TestSlurmWithoutPMIx: srun --mpi=pmi2 (and none) gives Open MPI no PMIx server, and
// Debian's Open MPI has no PMI-2 client: the step must fail at once, rank 0 saying to use
// --mpi=pmix, and no rank may train on its own.
func TestSlurmWithoutPMIx(t *testing.T) {
	c := newSlurm(t, 0)
	for _, mpi := range []string{"pmi2", "none"} {
		t.Run(mpi, func(t *testing.T) {
			dir := t.TempDir()
			out, took, err := c.srun(t, 4, mpi, nil, "--set", "run.output_dir="+dir)
			if err == nil {
				t.Fatalf("srun --mpi=%s succeeded:\n%s", mpi, out)
			}
			if want := "4 ranks with --mpi=" + mpi + ", without PMIx"; !strings.Contains(out, want) || !strings.Contains(out, "run srun --mpi=pmix") {
				t.Errorf("rank 0 did not say %q and how to fix it:\n%s", want, out)
			}
			if _, err := os.Stat(filepath.Join(dir, "tiny-sp4", "metrics.jsonl")); !os.IsNotExist(err) {
				t.Errorf("a rank trained although MPI did not start: %v", err)
			}
			t.Logf("srun --mpi=%s failed after %v:\n%s", mpi, took, lastLines(out, 4))
		})
	}
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
