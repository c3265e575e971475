package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"distflash/ckpt"
	"distflash/train"
)

var (
	// bin is the distflash binary that TestMain built for this test binary.
	bin string
	// binTags are the build tags of that binary: those of this test binary (tags_mpi_test.go,
	// tags_slurm_test.go and tags_cuda_test.go add theirs).
	binTags []string
	// cudaBuild says the binary is the cuda build (go test -tags cuda).
	cudaBuild bool
)

// TestMain runs the tests from the repository's root, so that the relative paths they name
// (configs/tiny.toml, weights/testdata/hf/...) are the repository's, and builds the binary
// once, into a temporary directory removed at the end; after the tests it tells go test's
// cache what they depend on (logInputs). Listing the tests (-list) builds nothing.
func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err == nil {
		_, err = os.Stat(filepath.Join(root, "go.mod"))
	}
	if err == nil {
		err = os.Chdir(root)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: the repository's root: %v\n", err)
		return 1
	}
	if l := flag.Lookup("test.list"); l != nil && l.Value.String() != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "distflash-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "distflash")
	args := []string{"build", "-o", bin}
	if len(binTags) > 0 {
		args = append(args, "-tags", strings.Join(binTags, ","))
	}
	args = append(args, ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go %s: %v\n%s", strings.Join(args, " "), err, out)
		return 1
	}
	code := m.Run()
	if err := logInputs(root); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v (go test will not cache this result)\n", err)
	}
	return code
}

// logInputs tells go test's cache what these tests depend on beyond what their own process
// read: the program they run is not part of their test binary, and the files it is built from
// and reads (configs, fixtures) are read by the go command and the binary, not by the test. go
// test keys a cached result on the test binary and on the files and variables the test process
// used, which package testing logs during m.Run into the file of -test.testlogfile ("# test
// log", then one "op name" a line, read by the go command once the test binary exits). Added
// to that log: a chdir to the root before the tests' entries (TestMain's came before the log
// began, and the tests' relative paths are the root's), and a stat of every directory and file
// of the repository but .git, runs/ and build outputs after them, so that a change anywhere
// reruns the tests instead of replaying a pass. A log the go command cannot read only keeps it
// from caching the result.
func logInputs(root string) error {
	f := flag.Lookup("test.testlogfile")
	if f == nil || f.Value.String() == "" {
		return nil // not run by go test's cache
	}
	path := f.Value.String()
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const magic = "# test log\n"
	if !bytes.HasPrefix(b, []byte(magic)) {
		return fmt.Errorf("%s: not a test log", path)
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "%schdir %s\n%s", magic, root, b[len(magic):])
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		switch {
		case d.IsDir() && p != root && (strings.HasPrefix(name, ".") || name == "runs" || name == "__pycache__"):
			return filepath.SkipDir
		case p == filepath.Join(root, "distflash") || strings.HasSuffix(name, ".test") || strings.HasSuffix(name, ".prof"):
			return nil
		}
		fmt.Fprintf(&out, "stat %s\n", p)
		return nil
	})
	if err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// slow skips t in the -short tier (go test -short ./..., the edit-test loop), saying which
// faster tests cover its behaviour there. The full run never skips it.
func slow(t *testing.T, coveredBy string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("slow through the binary; in -short, %s", coveredBy)
	}
}

// command is the binary with args, in this process's environment and directory: for a test
// that sets the environment, the directory, stdin or a context, or starts the process and
// watches it.
func command(args ...string) *exec.Cmd {
	return exec.Command(bin, args...)
}

// runCmd runs cmd (the binary, set up by the caller) and returns its stdout, its stderr and
// the error of its exit: nil for status 0, an *exec.ExitError otherwise. A binary that does
// not start fails the test.
func runCmd(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%q: %v", cmd.Args, err)
	}
	return o.String(), e.String(), err
}

// distflash runs the binary with args and returns its stdout, its stderr and the error of its
// exit: nil for status 0, an *exec.ExitError otherwise.
func distflash(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runCmd(t, command(args...))
}

// cli runs the binary with args as the tests ran the command line in process: its stdout, its
// stderr and, for a failure, the error the command returned, which the binary prints last on
// stderr ("distflash: MESSAGE") before it exits with status 2. Any other failure (another
// status, a signal, an exit 2 without the message, as a panic's) fails the test.
func cli(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	stdout, stderr, err = distflash(t, args...)
	if err == nil {
		return stdout, stderr, nil
	}
	msg, ok := errorMessage(stderr)
	if code := err.(*exec.ExitError).ExitCode(); code != 2 || !ok {
		t.Errorf("distflash %q: %v, want exit status 2 after a \"distflash: \" line\n%s", args, err, stderr)
		return stdout, stderr, errors.New(stderr)
	}
	return stdout, stderr, errors.New(msg)
}

// errorMessage is what follows the last line start "distflash: " of stderr, to its end: the
// error main prints before it exits.
func errorMessage(stderr string) (string, bool) {
	i := strings.LastIndex(stderr, "\ndistflash: ") + 1
	if i == 0 && !strings.HasPrefix(stderr, "distflash: ") {
		return "", false
	}
	return strings.TrimSuffix(stderr[i+len("distflash: "):], "\n"), true
}

// succeed is cli that fails the test when the command fails.
func succeed(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := cli(t, args...)
	if err != nil {
		t.Fatalf("distflash %q: %v\n%s", args, err, stderr)
	}
	return stdout, stderr
}

// output runs the binary and returns its stdout and stderr as one stream, in the order it
// wrote them (what a terminal shows), and its exit status.
func output(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := command(args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("distflash %q: %v", args, err)
	return "", 0
}

// mustSucceed is output that fails the test on a non-zero exit.
func mustSucceed(t *testing.T, args ...string) string {
	t.Helper()
	out, code := output(t, args...)
	if code != 0 {
		t.Fatalf("distflash %v: exit %d\n%s", args, code, out)
	}
	return out
}

// mustFail is output that fails the test unless it exits non-zero with an output holding
// every one of want.
func mustFail(t *testing.T, args []string, want ...string) string {
	t.Helper()
	out, code := output(t, args...)
	if code == 0 {
		t.Fatalf("distflash %v succeeded, want an error\n%s", args, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("distflash %v: output lacks %q:\n%s", args, w, out)
		}
	}
	return out
}

// smallRun are train arguments for a run that takes a second or two: the tiny model on 1 MiB
// of text, batch 2.
func smallRun(dir string, args ...string) []string {
	return append([]string{"train", "--progress=false", "--set", "run.output_dir=" + dir,
		"--set", "data.max_bytes=1048576", "--set", "data.batch_size=2", "--set", "training.warmup_steps=2"}, args...)
}

// startWatched starts the binary on args with stdout and stderr into one buffer, and kills it
// when the test ends.
func startWatched(t *testing.T, args ...string) (*exec.Cmd, *safeBuffer) {
	t.Helper()
	cmd := command(args...)
	buf := &safeBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, buf
}

// waitOutput waits (at most 2 minutes) until buf holds what.
func waitOutput(t *testing.T, buf *safeBuffer, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(buf.String(), what) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 2 minutes:\n%s", what, buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startTrain starts a long training in dir and returns once it has trained a step; the
// caller kills it.
func startTrain(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := command(smallRun(dir, append([]string{"--set", "training.steps=100000", "--set", "run.log_interval=1"}, args...)...)...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		ok := false
		for sc.Scan() {
			if !ok && strings.HasPrefix(sc.Text(), "step 1/") {
				ok = true
				started <- true
			}
		}
		if !ok {
			started <- false
		}
	}()
	select {
	case ok := <-started:
		if !ok {
			t.Fatalf("train %v ended before its first step", args)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("train %v: no step within 2 minutes", args)
	}
	return cmd
}

// safeBuffer is a bytes.Buffer that a process's output and the test may use at once.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// readMetrics reads a run's metrics.jsonl.
func readMetrics(t *testing.T, path string) []train.Metrics {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []train.Metrics
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m train.Metrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v in %q", path, err, sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// validMetrics reads metrics.jsonl and fails the test on any line that is not a whole JSON
// object; it returns the lines as generic objects.
func validMetrics(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Errorf("%s ends in a partial line", path)
	}
	var out []map[string]any
	for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Errorf("%s line %d is not JSON (%v): %q", path, i+1, err, line)
		}
		out = append(out, m)
	}
	return out
}

// lossesOf reads the per-step losses of a run directory.
func lossesOf(t *testing.T, runDir string) []float64 {
	t.Helper()
	var out []float64
	for _, m := range readMetrics(t, filepath.Join(runDir, "metrics.jsonl")) {
		out = append(out, m.Loss)
	}
	return out
}

// stateOf reads the weights and AdamW moments of a checkpoint.
func stateOf(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	c, err := ckpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := map[string][]float32{}
	for _, name := range train.StateTensors {
		if out[name], err = c.ReadTensor(name); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sameState reports the first difference between two checkpoints' tensors, bit for bit.
func sameState(a, b map[string][]float32) error {
	for _, name := range train.StateTensors {
		x, y := a[name], b[name]
		if len(x) != len(y) {
			return fmt.Errorf("%s: %d vs %d elements", name, len(x), len(y))
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return fmt.Errorf("%s[%d]: %v vs %v", name, i, x[i], y[i])
			}
		}
	}
	return nil
}

// latestStep is the step of the run directory's newest checkpoint.
func latestStep(t *testing.T, run string) int {
	t.Helper()
	c, err := ckpt.Open(run)
	if err != nil {
		t.Fatalf("latest of %s: %v", run, err)
	}
	c.Close()
	return c.Manifest().Step
}

// readJSON decodes the JSON file at path into v, failing t if it cannot.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
