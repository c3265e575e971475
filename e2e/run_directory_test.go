package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"distflash/ckpt"
)

// The tests of this file check that a run directory belongs to one run: a second run on a
// directory in use is refused naming the holder, a fresh run never destroys an earlier one,
// a checkpoint.dir shared by two runs never mixes them, and eval and export of a run find
// its checkpoints wherever checkpoint.dir put them.

// snapshot returns the names, sizes and contents' lengths of every file under dir, to show
// that a refused command changed nothing.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[p] = fmt.Sprintf("%d %x", fi.Size(), b[:min(len(b), 64)])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameSnapshot fails the test where a and b differ.
func sameSnapshot(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s changed %s", what, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			t.Errorf("%s wrote %s", what, k)
		}
	}
}

// TestOneRunPerDirectory: a second train on a run directory in use is refused, naming the
// holder; a kill -9 of the holder leaves no stale lock. Two runs started at the same moment
// into a fresh directory: one trains, the other is refused; after killing the winner with
// SIGKILL, --resume auto continues its run.
func TestOneRunPerDirectory(t *testing.T) {
	dir := t.TempDir()
	a := startTrain(t, dir, "--set", "checkpoint.interval=1")
	out := mustFail(t, smallRun(dir, "--set", "training.steps=100000", "--resume", "auto"),
		"is in use by", fmt.Sprintf("pid %d", a.Process.Pid))
	if strings.Contains(out, "resume: step") {
		t.Errorf("the refused run resumed:\n%s", out)
	}
	_ = a.Process.Signal(syscall.SIGKILL)
	_ = a.Wait()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=100000", "--resume", "auto", "--stop-after", "3")...)

	// A concurrent start into a fresh directory.
	fresh := t.TempDir()
	args := smallRun(fresh, "--set", "training.steps=100000", "--set", "run.log_interval=1", "--set", "checkpoint.interval=1")
	cmds := make([]*exec.Cmd, 2)
	outs := make([]*bytes.Buffer, 2)
	for i := range cmds {
		cmds[i] = command(args...)
		outs[i] = new(bytes.Buffer)
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
	}
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// One of them is refused (the lock, or the other's run found under it) and exits;
	// the other trains until killed.
	refused := make(chan int, 2)
	for i, c := range cmds {
		go func() { _ = c.Wait(); refused <- i }()
	}
	var loser int
	select {
	case loser = <-refused:
	case <-time.After(2 * time.Minute):
		t.Fatal("neither of two concurrent runs was refused")
	}
	winner := 1 - loser
	if lo := outs[loser].String(); !strings.Contains(lo, "is in use by") && !strings.Contains(lo, "holds an earlier run") {
		t.Errorf("the refused run says:\n%s", lo)
	}
	metrics := filepath.Join(fresh, "tiny", "metrics.jsonl")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := ckpt.Open(filepath.Join(fresh, "tiny")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the winner saved no checkpoint:\n%s", outs[winner])
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmds[winner].Process.Signal(syscall.SIGKILL)
	<-refused
	validMetrics(t, metrics)
	out = mustSucceed(t, smallRun(fresh, "--set", "training.steps=100000", "--set", "checkpoint.interval=1", "--resume", "auto", "--stop-after", "4")...)
	if !strings.Contains(out, "resume: step") {
		t.Errorf("after the kill, --resume auto did not continue:\n%s", out)
	}
	if ms := validMetrics(t, metrics); len(ms) != 4 {
		t.Errorf("%d metric lines after resuming to step 4", len(ms))
	}
}

// TestFreshRunNeverDestroys: a fresh train into a directory holding a run is refused and
// changes nothing; --fresh moves the old run aside; a launch that fails validation writes
// nothing; a checkpoint.dir shared by two runs never resumes one from the other's checkpoint
// unless named.
func TestFreshRunNeverDestroys(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=2")...)
	before := snapshot(t, dir)
	mustFail(t, smallRun(dir, "--set", "training.steps=2"), "holds an earlier run", "--resume auto", "run.name", "--fresh")
	mustFail(t, smallRun(dir, "--set", "training.steps=2", "--fresh", "--set", "data.train="+filepath.Join(dir, "missing")), "data.train")
	mustFail(t, smallRun(dir, "--set", "training.steps=2", "--resume", "auto", "--set", "data.tokenizer="+filepath.Join(dir, "no-tokenizer.json")), "data.tokenizer")
	sameSnapshot(t, "a refused train", before, snapshot(t, dir))

	out := mustSucceed(t, smallRun(dir, "--set", "training.steps=3", "--fresh")...)
	olds, _ := filepath.Glob(filepath.Join(dir, "tiny.old-*"))
	if len(olds) != 1 || !strings.Contains(out, "moved the earlier run") {
		t.Fatalf("--fresh: %v moved aside\n%s", olds, out)
	}
	if c, err := ckpt.Open(olds[0]); err != nil || c.Manifest().Step != 2 {
		t.Errorf("the run moved aside lost its checkpoint: %v", err)
	} else {
		c.Close()
	}

	// Two runs, one checkpoint.dir.
	shared := filepath.Join(dir, "shared-ckpt")
	mustSucceed(t, smallRun(dir, "--set", "run.name=a", "--set", "checkpoint.dir="+shared, "--set", "training.steps=2")...)
	before = snapshot(t, shared)
	mustFail(t, smallRun(dir, "--set", "run.name=b", "--set", "checkpoint.dir="+shared, "--set", "training.steps=4"), `holds checkpoints of run "a"`)
	mustFail(t, smallRun(dir, "--set", "run.name=b", "--set", "checkpoint.dir="+shared, "--set", "training.steps=4", "--resume", "auto"),
		"another run", `run "a"`, "--resume "+filepath.Join(shared, "step-000002"))
	sameSnapshot(t, "run b", before, snapshot(t, shared))
	out = mustSucceed(t, smallRun(dir, "--set", "run.name=b", "--set", "checkpoint.dir="+shared, "--set", "training.steps=4",
		"--resume", filepath.Join(shared, "step-000002"))...)
	if !strings.Contains(out, "resume: step 2 from") {
		t.Errorf("naming the checkpoint did not continue from it:\n%s", out)
	}
}

// TestDirectoryInUse: a fresh run in a directory another run is training in says that it is in
// use and by which process, not that it holds an earlier run to --resume.
func TestDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	cmd, buf := startWatched(t, smallRun(dir, "--set", "training.steps=100000", "--set", "run.log_interval=1")...)
	waitOutput(t, buf, "step 2/")
	out, code := output(t, smallRun(dir, "--set", "training.steps=5")...)
	if code == 0 || !strings.Contains(out, "is in use by pid "+strconv.Itoa(cmd.Process.Pid)) || strings.Contains(out, "--resume auto") {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

// TestModelRunFollowsCheckpointDir: eval and export --model RUN of a run that saved into a
// checkpoint.dir elsewhere read that run's newest checkpoint there.
func TestModelRunFollowsCheckpointDir(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=2", "--set", "checkpoint.dir="+shared)...)
	run := filepath.Join(dir, "tiny")
	out, code := output(t, "eval", "--model", run, "--samples", "2", "--seq-len", "64")
	if code != 0 || !strings.Contains(out, "eval: "+filepath.Join(shared, "step-000002")+" (step 2)") {
		t.Errorf("eval: exit %d:\n%s", code, out)
	}
	out, code = output(t, "export", "--model", run, "--out", filepath.Join(dir, "hf"))
	if code != 0 || !strings.Contains(out, "saves its checkpoints in "+shared) {
		t.Errorf("export: exit %d:\n%s", code, out)
	}
}

// TestSharedCheckpointDir: a fresh run whose checkpoint.dir holds another run's checkpoints is
// told whose they are and what applies (continue that run by its name, a checkpoint.dir of its
// own); after it starts over with --fresh, the other run's --resume auto says where its
// checkpoints went, and continues there when told.
func TestSharedCheckpointDir(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	runAs := func(name string, args ...string) []string {
		return append(smallRun(dir, "--set", "run.name="+name, "--set", "checkpoint.dir="+shared, "--set", "training.steps=2"), args...)
	}
	mustSucceed(t, runAs("a")...)
	out, code := output(t, runAs("b")...)
	for _, w := range []string{`holds checkpoints of run "a"`, "--set run.name=a --resume auto", "--set checkpoint.dir=" + shared + "-b"} {
		if code == 0 || !strings.Contains(out, w) {
			t.Errorf("b over a's checkpoint.dir: exit %d, no %q:\n%s", code, w, out)
		}
	}
	if strings.Contains(out, "--set run.name=OTHER") {
		t.Errorf("suggests a new run.name, which does not change checkpoint.dir:\n%s", out)
	}
	mustSucceed(t, runAs("b", "--fresh")...)
	olds, _ := filepath.Glob(shared + ".old-*")
	if len(olds) != 1 {
		t.Fatalf("--fresh moved %v", olds)
	}
	out, code = output(t, runAs("a", "--resume", "auto", "--set", "training.steps=3")...)
	if want := "continue there with --set checkpoint.dir=" + olds[0] + " --resume auto"; code == 0 || !strings.Contains(out, want) {
		t.Fatalf("a's resume after b's --fresh: exit %d, no %q:\n%s", code, want, out)
	}
	mustSucceed(t, smallRun(dir, "--set", "run.name=a", "--set", "checkpoint.dir="+olds[0], "--set", "training.steps=3", "--resume", "auto")...)
	if s := latestStep(t, olds[0]); s != 3 {
		t.Errorf("a continued to step %d, want 3", s)
	}
}
