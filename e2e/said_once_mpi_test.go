//go:build mpi

package e2e

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
	"syscall"
	"testing"
	"time"
)

// mpirun2 is the start of an mpirun command line of 2 processes, as root on a small machine.
func mpirun2(t *testing.T) []string {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatalf("mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run installs it): %v", err)
	}
	return []string{mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}
}

// runMPI runs argv (mpirun's) with a bound of limit, returning stderr, how long it took and the
// exit; the watchdog is set to 60 s, so a job that hangs shows as a long one.
func runMPI(t *testing.T, limit time.Duration, argv []string) (string, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(command().Environ(), "DISTFLASH_MPI_TIMEOUT=60s")
	start := time.Now()
	_, stderr, err := runCmd(t, cmd)
	return stderr, time.Since(start), err
}

// TestMPIProcessesStartedUnlike: processes of one job started with other settings (a --set on
// one side of mpirun's ':'; on a cluster, config files that differ between hosts) are refused
// within seconds, once, naming each key with its value on each rank — where a model.ffn_dim that
// differed ended in a Go panic with a goroutine trace (MPI_ERR_TRUNCATE in the gradient
// all-reduce) and a training.steps that differed hung until the watchdog blamed a dead rank.
func TestMPIProcessesStartedUnlike(t *testing.T) {
	launch := mpirun2(t)
	for _, c := range []struct {
		name       string
		one, other []string // each process's own arguments
		want       []string
	}{
		{"model.ffn_dim", []string{"--set", "model.ffn_dim=352"}, []string{"--set", "model.ffn_dim=384"},
			[]string{"model.ffn_dim: rank 0: 352; rank 1: 384"}},
		{"training.steps", []string{"--set", "training.steps=10"}, []string{"--set", "training.steps=20"},
			[]string{"training.steps: rank 0: 10; rank 1: 20"}},
		{"a flag", []string{"--stop-after", "1"}, []string{"--stop-after", "2"},
			[]string{"command-line flags: rank 0: --stop-after=1; rank 1: --stop-after=2"}},
		// the same config on both, whose data.train names other files on each (as on hosts
		// with copies of the data that differ)
		{"the data", []string{"-x", "DISTFLASH_TEST_DATA=configs"}, []string{"-x", "DISTFLASH_TEST_DATA=docs"},
			[]string{"data.train (on disk): rank 0: ", " files; rank 1: "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			common := []string{"train", "--config", "configs/tiny-sp4.toml", "--progress=false", "--set", "parallelism.world_size=2",
				"--set", "parallelism.sequence_parallel_degree=2", "--set", "run.output_dir=" + t.TempDir()}
			common = append(common, "--set", "data.max_bytes=65536")
			env := func(args []string) ([]string, []string) { // mpirun's -x before the binary
				if len(args) > 0 && args[0] == "-x" {
					return args[:2], nil
				}
				return nil, args
			}
			oneEnv, oneArgs := env(c.one)
			otherEnv, otherArgs := env(c.other)
			if oneEnv != nil {
				common = append(common, "--set", "data.train=$DISTFLASH_TEST_DATA")
			}
			argv := append(append([]string{}, launch...), "-np", "1")
			argv = append(append(append(append(argv, oneEnv...), bin), common...), oneArgs...)
			argv = append(argv, ":", "-np", "1")
			argv = append(append(append(append(argv, otherEnv...), bin), common...), otherArgs...)
			stderr, took, err := runMPI(t, 2*time.Minute, argv)
			if err == nil {
				t.Fatalf("processes started unlike trained:\n%s", stderr)
			}
			if n := strings.Count(stderr, "were not started alike"); n != 1 {
				t.Errorf("the refusal said %d times, want once:\n%s", n, stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("the refusal does not say %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
				t.Errorf("a panic:\n%s", stderr)
			}
			if took > 30*time.Second {
				t.Errorf("refused after %v (the watchdog's 60 s?)", took)
			}
		})
	}
}

// everyRankFlag is a flag of a command's -h, and its type word ("" for a bool).
type everyRankFlag struct{ name, typ string }

// commandFlags reads the flags of `distflash args... -h`.
func commandFlags(t *testing.T, args ...string) []everyRankFlag {
	t.Helper()
	_, stderr, _ := distflash(t, append(args, "-h")...)
	var out []everyRankFlag
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: ([a-z]+))?`).FindAllStringSubmatch(stderr, -1) {
		out = append(out, everyRankFlag{m[1], m[2]})
	}
	if len(out) == 0 {
		t.Fatalf("%v -h lists no flags:\n%s", args, stderr)
	}
	return out
}

// badValue is a value of a flag's type that means nothing: a path under a directory that does
// not exist, a negative number, a word where a number or duration goes, a key no config has.
func badValue(f everyRankFlag) string {
	switch f.typ {
	case "string":
		return "/nonexistent/dir/x.bad"
	case "int", "float":
		return "-7"
	case "uint", "duration":
		return "x"
	case "value":
		return "no.such_key=1"
	}
	return "maybe" // a bool
}

// TestEveryRefusalOnceOverMPI: every refusal of every command that runs on every rank (train,
// eval, generate; the others run on rank 0 alone) reaches the user once under mpirun -np 2, with
// one process's words: each flag of each command given a value that means nothing, and an unknown
// flag, against the commands' working base (a model, a world of 2 ranks), are each run by one
// process first; what it refuses (exit status 2) must be refused by the job, said once, where
// such refusals were said once per rank, once as "rank 1: …", or twice.
func TestEveryRefusalOnceOverMPI(t *testing.T) {
	launch := mpirun2(t)
	model := trainedTiny(t)
	world := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2"}
	bases := map[string][]string{
		"train":    {"--config", "configs/tiny.toml", "--set", "training.steps=1", "--set", "data.max_bytes=65536"},
		"eval":     {"--model", model, "--samples", "2", "--seq-len", "64"},
		"generate": {"--model", model, "--prompt", "x", "--max-new-tokens", "2"},
	}
	cases := 0
	for _, name := range []string{"train", "eval", "generate"} {
		flags := append(commandFlags(t, name), everyRankFlag{name: "no-such-flag", typ: "string"})
		for _, f := range flags {
			if f.name == "progress" || f.name == "stream" {
				continue // how progress is shown: a bool of display, never a refusal
			}
			arg := "--" + f.name + "=" + badValue(f)
			t.Run(name+" "+arg, func(t *testing.T) {
				dir := t.TempDir()
				args := append(append(append([]string{name}, bases[name]...), world...), arg)
				if name != "generate" {
					args = append([]string{name, "--progress=false"}, args[1:]...)
				}
				if name == "train" {
					args = append(args, "--set", "run.output_dir="+dir)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				one := exec.CommandContext(ctx, bin, args...)
				_, oneErr, err := runCmd(t, one)
				if err == nil || one.ProcessState.ExitCode() != 2 {
					t.Skipf("one process does not refuse %s (%v): not a refusal to compare", arg, err)
				}
				cases++
				want := reason(oneErr)
				if name == "train" { // the job's run directory is its own
					dir = t.TempDir()
					args[len(args)-1] = "run.output_dir=" + dir
				}
				stderr, _, err := runMPI(t, 2*time.Minute, append(append(append([]string{}, launch...), "-np", "2", bin), args...))
				if err == nil {
					t.Fatalf("one process refuses %s (%q), the job does not:\n%s", arg, want, stderr)
				}
				// as often as one process says it (a flag's error is the flag package's line,
				// before the usage, and then distflash's)
				if n, once := strings.Count(stderr, want), strings.Count(oneErr, want); n != once || strings.Contains(stderr, "rank 1: "+want) {
					t.Errorf("one process's refusal %q: said %d times by the job, %d by one process (and not as rank 1's):\n%s", want, n, once, stderr)
				}
			})
		}
	}
	if cases < 10 {
		t.Errorf("only %d refusals compared: the flags above mean something again?", cases)
	}
}

// TestMPIRefusalsMidCommand: what stops a command after its world started is said once too: a
// --resume of a step that is not there (said twice before), a passkey length too short for the
// prompt (said 1–3 times), and Ctrl-C during eval (said twice, as "context canceled").
func TestMPIRefusalsMidCommand(t *testing.T) {
	launch := mpirun2(t)
	model := trainedTiny(t)
	world := []string{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2"}
	t.Run("resume of a missing step", func(t *testing.T) {
		dir := t.TempDir()
		args := append([]string{"train", "--progress=false", "--set", "training.steps=2", "--set", "data.max_bytes=65536",
			"--set", "run.output_dir=" + dir}, world...)
		if stderr, _, err := runMPI(t, 3*time.Minute, append(append(append([]string{}, launch...), "-np", "2", bin), args...)); err != nil {
			t.Fatalf("the first run: %v\n%s", err, stderr)
		}
		missing := filepath.Join(dir, "tiny", "step-000099")
		stderr, _, err := runMPI(t, 2*time.Minute, append(append(append(append([]string{}, launch...), "-np", "2", bin), args...), "--resume", missing))
		if err == nil || strings.Count(stderr, "step-000099") != 1 {
			t.Errorf("--resume %s: %v; want the refusal once:\n%s", missing, err, stderr)
		}
	})
	t.Run("passkey too short", func(t *testing.T) {
		args := append([]string{"eval", "--model", model, "--task", "passkey", "--lengths", "16", "--progress=false"}, world...)
		stderr, _, err := runMPI(t, 2*time.Minute, append(append(append([]string{}, launch...), "-np", "2", bin), args...))
		if err == nil || strings.Count(stderr, "distflash:") != 1 || strings.Contains(stderr, "rank 1:") {
			t.Errorf("passkey --lengths 16: %v; want one refusal, rank 0's:\n%s", err, stderr)
		}
	})
	// Ctrl-C reaches every process through mpirun, in some order; the ranks agree to stop at
	// the next sample. Sent to rank 1 alone it is the order in which rank 1's signal stops
	// the evaluation before rank 0's own came (then found the command done): rank 0 still
	// says once that it stops.
	for _, tc := range []struct {
		name   string
		signal func(cmd *exec.Cmd) error
	}{
		{"Ctrl-C during eval", func(cmd *exec.Cmd) error { return cmd.Process.Signal(syscall.SIGINT) }},
		{"Ctrl-C reaching rank 1 first", func(cmd *exec.Cmd) error {
			pid, err := mpiRankPID(cmd.Process.Pid, 1)
			if err != nil {
				return err
			}
			return syscall.Kill(pid, syscall.SIGINT)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"eval", "--model", model, "--samples", "100000", "--seq-len", "128", "--progress=false",
				"--out", filepath.Join(t.TempDir(), "e.json")}, world...)
			argv := append(append(append([]string{}, launch...), "-np", "2", bin), args...)
			cmd := exec.Command(argv[0], argv[1:]...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(8 * time.Second) // into the samples
			if err := tc.signal(cmd); err != nil {
				_ = cmd.Process.Kill()
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				t.Fatalf("eval did not stop within a minute of SIGINT:\n%s", stderr.String())
			}
			out := stderr.String()
			if strings.Count(out, "eval: stopping") != 1 || strings.Count(out, "stopped by a signal after") != 1 || strings.Contains(out, "context canceled") {
				t.Errorf("%s under mpirun: want \"eval: stopping\" and \"stopped by a signal after\" once each, no \"context canceled\":\n%s", tc.name, out)
			}
		})
	}
}

// mpiRankPID is the process id of MPI rank rank among the descendants of process root (an
// mpirun): the one whose environment says OMPI_COMM_WORLD_RANK=rank (Open MPI) or PMI_RANK=rank
// (MPICH's hydra).
func mpiRankPID(root, rank int) (int, error) {
	want := [][]byte{[]byte(fmt.Sprintf("OMPI_COMM_WORLD_RANK=%d\x00", rank)), []byte(fmt.Sprintf("PMI_RANK=%d\x00", rank))}
	parent := func(pid int) int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			return 0
		}
		ppid, _ := strconv.Atoi(f[1])
		return ppid
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == root {
			continue
		}
		under := false
		for p := parent(pid); p > 1 && !under; p = parent(p) {
			under = p == root
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if !under || err != nil {
			continue
		}
		for _, w := range want {
			if bytes.HasPrefix(env, w) || bytes.Contains(env, append([]byte{0}, w...)) {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no process of MPI rank %d under mpirun (pid %d)", rank, root)
}
