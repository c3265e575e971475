package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"distflash/ckpt"
	"distflash/config"
)

// The tests of this file run the real binary the way a user whose machine fails would: two
// runs on one directory, a kill -9, a fresh run over an old one, a full disk, a diverging run,
// Ctrl-C twice, a resume with changed keys, an eval of a damaged run.

// smallRun are train arguments for a run that takes a second or two: the tiny model on 1 MiB
// of text, batch 2.
func smallRun(dir string, args ...string) []string {
	return append([]string{"train", "--progress=false", "--set", "run.output_dir=" + dir,
		"--set", "data.max_bytes=1048576", "--set", "data.batch_size=2", "--set", "training.warmup_steps=2"}, args...)
}

// distflash runs the binary and returns its combined output and exit status.
func distflash(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(buildBinary(t), args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("distflash %v: %v", args, err)
	return "", 0
}

// mustSucceed is distflash that fails the test on a non-zero exit.
func mustSucceed(t *testing.T, args ...string) string {
	t.Helper()
	out, code := distflash(t, args...)
	if code != 0 {
		t.Fatalf("distflash %v: exit %d\n%s", args, code, out)
	}
	return out
}

// mustFail is distflash that fails the test unless it exits non-zero with an output holding
// every one of want.
func mustFail(t *testing.T, args []string, want ...string) string {
	t.Helper()
	out, code := distflash(t, args...)
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

// TestRunEndsWithCheckpoint: the default run (checkpoint.interval = 0) ends with its final
// weights saved and `latest` naming them; eval of the run directory scores that step; a
// --stop-after beyond training.steps and a run resumed to its end do the same.
func TestRunEndsWithCheckpoint(t *testing.T) {
	dir := t.TempDir()
	out := mustSucceed(t, smallRun(dir, "--set", "training.steps=3")...)
	run := filepath.Join(dir, "tiny")
	if !strings.Contains(out, "model in "+filepath.Join(run, "step-000003")) {
		t.Errorf("train output does not say where the model is:\n%s", out)
	}
	if fi, err := os.Stat(filepath.Join(run, "metrics.png")); err != nil || fi.Size() == 0 {
		t.Errorf("the run drew no metrics.png: %v", err)
	}
	c, err := ckpt.Open(run)
	if err != nil {
		t.Fatalf("no checkpoint after a default run: %v", err)
	}
	c.Close()
	if c.Manifest().Step != 3 {
		t.Errorf("latest is step %d, want 3", c.Manifest().Step)
	}
	// eval of the run directory: the checkpoint's data.eval (the built-in default) and
	// data.seq_len, the step in the output and the JSON, the JSON beside the model.
	out = mustSucceed(t, "eval", "--model", run, "--samples", "2")
	if !strings.Contains(out, "step-000003 (step 3): loss") {
		t.Errorf("eval output does not name the step:\n%s", out)
	}
	if i, j := strings.Index(out, ": loss "), strings.Index(out, "eval: wrote"); i < 0 || j < i {
		t.Errorf("eval must print its result before writing it:\n%s", out)
	}
	var rep struct {
		Step   *int `json:"step"`
		SeqLen int  `json:"seq_len"`
	}
	b, err := os.ReadFile(filepath.Join(run, "step-000003.eval.json"))
	if err != nil {
		t.Fatalf("eval result not beside the model: %v", err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || rep.Step == nil || *rep.Step != 3 || rep.SeqLen != 128 {
		t.Errorf("eval JSON %s: step %v, seq_len %d; want step 3, the checkpoint's data.seq_len 128", b, rep.Step, rep.SeqLen)
	}
	// --stop-after beyond training.steps, and resuming to the end.
	mustSucceed(t, smallRun(dir, "--set", "run.name=b", "--set", "training.steps=2", "--stop-after", "9")...)
	mustSucceed(t, smallRun(dir, "--set", "run.name=c", "--set", "training.steps=4", "--stop-after", "2")...)
	mustSucceed(t, smallRun(dir, "--set", "run.name=c", "--set", "training.steps=4", "--resume", "auto")...)
	for name, step := range map[string]int{"b": 2, "c": 4} {
		c, err := ckpt.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("run %s: %v", name, err)
		}
		c.Close()
		if c.Manifest().Step != step {
			t.Errorf("run %s: latest is step %d, want %d", name, c.Manifest().Step, step)
		}
	}
}

// startTrain starts a long training in dir and returns once it has trained a step; the
// caller kills it.
func startTrain(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(buildBinary(t), smallRun(dir, append([]string{"--set", "training.steps=100000", "--set", "run.log_interval=1"}, args...)...)...)
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
		cmds[i] = exec.Command(buildBinary(t), args...)
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

// TestResumeSaysWhatChanged: every changed key is printed old → new with what it does; a key
// that cannot continue the same training is refused by name.
func TestResumeSaysWhatChanged(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--stop-after", "2")...)
	out := mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--resume", "auto", "--set", "training.lr=0.001",
		"--set", "checkpoint.keep=2", "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2", "--stop-after", "3")...)
	for _, want := range []string{
		"resume: training.lr: 0.003 → 0.001 (WARNING: the continuation is not the same run",
		"resume: checkpoint.keep: 3 → 2 (no effect on the training)",
		"resume: parallelism.sequence_parallel_degree: 1 → 2 (the same training, equal up to floating-point rounding)",
		"resume: parallelism.world_size: 1 → 2 (the same training, equal up to floating-point rounding)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("resume output lacks %q:\n%s", want, out)
		}
	}
	out = mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--resume", "auto", "--set", "parallelism.world_size=2", "--stop-after", "4")...)
	if !strings.Contains(out, "parallelism.sequence_parallel_degree: 2 → 1 (WARNING") || !strings.Contains(out, "2 data-parallel replicas, was 1") {
		t.Errorf("a change of data-parallel replicas is not warned about:\n%s", out)
	}
	for _, key := range []string{"data.seq_len=64", "run.seed=7", "model.ffn_dim=64"} {
		mustFail(t, smallRun(dir, "--set", "training.steps=8", "--resume", "auto", "--set", key),
			strings.Split(key, "=")[0]+" changed")
	}
}

// TestDivergenceIsNamed: a run whose loss blows up stops with "diverged at step N", a
// non-zero exit, every metrics line valid JSON (null for what is not a number), and the
// last good checkpoint untouched.
func TestDivergenceIsNamed(t *testing.T) {
	dir := t.TempDir()
	out := mustFail(t, smallRun(dir, "--set", "training.steps=50", "--set", "training.lr=1e4", "--set", "training.grad_clip=0",
		"--set", "training.warmup_steps=0", "--set", "checkpoint.interval=1"), "diverged at step", "lower training.lr", "is untouched")
	var step int
	if i := strings.Index(out, "diverged at step "); i >= 0 {
		fmt.Sscanf(out[i:], "diverged at step %d", &step)
	}
	ms := validMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if len(ms) != step || step < 1 {
		t.Fatalf("diverged at step %d with %d metrics lines", step, len(ms))
	}
	if last := ms[len(ms)-1]; last["loss"] != nil && last["grad_norm"] != nil {
		t.Errorf("the diverged step's line has no null: %v", last)
	}
	c, err := ckpt.Open(filepath.Join(dir, "tiny"))
	if step == 1 {
		if err == nil {
			t.Errorf("a checkpoint of the diverged step 1")
		}
		return
	}
	if err != nil {
		t.Fatalf("the last good checkpoint: %v", err)
	}
	c.Close()
	if c.Manifest().Step != step-1 {
		t.Errorf("latest is step %d, diverged at %d", c.Manifest().Step, step)
	}
}

// TestDiskFull: a checkpoint that does not fit on a small tmpfs removes its partial save and
// says how many bytes it needs and how many are free; `latest` stays the last good one and
// metrics.jsonl stays whole. Mounting a tmpfs needs root, which CI and the development
// machines have.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	// The tiny model's checkpoint takes about 8 MB: the first fits in 12 MB, the second not.
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	out := mustFail(t, smallRun(dir, "--set", "training.steps=4", "--set", "checkpoint.interval=2"),
		"checkpoint at step 4: disk full", "needs about", "MB are free", "checkpoint.keep = 3", "step-000002, is untouched")
	if tmps, _ := filepath.Glob(filepath.Join(dir, "tiny", "step-*.tmp")); len(tmps) > 0 {
		t.Errorf("partial saves left behind: %v\n%s", tmps, out)
	}
	c, err := ckpt.Open(filepath.Join(dir, "tiny"))
	if err != nil {
		t.Fatalf("latest after a full disk: %v", err)
	}
	c.Close()
	if c.Manifest().Step != 2 {
		t.Errorf("latest is step %d, want 2", c.Manifest().Step)
	}
	validMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
}

// TestCtrlCTwice: the first SIGINT says it stops after the step and saves; a second one ends
// the process at once with a non-zero status, leaving the last complete checkpoint `latest`.
func TestCtrlCTwice(t *testing.T) {
	dir := t.TempDir()
	cmd, buf := startWatched(t, smallRun(dir, "--set", "training.steps=100000", "--set", "run.log_interval=1", "--set", "checkpoint.interval=2")...)
	waitOutput(t, buf, "checkpoint: step 2 saved")
	_ = cmd.Process.Signal(syscall.SIGINT)
	waitOutput(t, buf, "Ctrl-C again to stop now")
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("after two SIGINTs: %v, want exit status 130\n%s", err, buf.String())
	}
	if !strings.Contains(buf.String(), "stopping after step ") || !strings.Contains(buf.String(), "stopped at once") {
		t.Errorf("the two signals were not explained:\n%s", buf.String())
	}
	c, err := ckpt.Open(filepath.Join(dir, "tiny"))
	if err != nil {
		t.Fatalf("latest after two SIGINTs: %v", err)
	}
	c.Close()
	validMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
}

// TestEvalFallsBackPastDamagedLatest: eval of a run directory whose latest checkpoint is
// damaged names it, scores the newest intact one, and says which step it scored.
func TestEvalFallsBackPastDamagedLatest(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--set", "checkpoint.interval=2")...)
	shard := filepath.Join(dir, "tiny", "step-000004", ckpt.ShardFile(0))
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustSucceed(t, "eval", "--model", filepath.Join(dir, "tiny"), "--samples", "1", "--seq-len", "64")
	for _, want := range []string{"skipping damaged checkpoint", "rank-00000.zst", "step-000002 (step 2): loss"} {
		if !strings.Contains(out, want) {
			t.Errorf("eval output lacks %q:\n%s", want, out)
		}
	}
}

// TestEvalChecksTheEvaluatedModel: the sequence-parallel schedule is checked against the
// heads of the model evaluated (a 4-head, 2-kv-head Hugging Face model under Ulysses on 2
// ranks, which the default config's heads would not decide), and eval pads samples for any
// number of ranks (3 ranks, a sequence length they do not divide). A directory with both
// tokenizer.json and tokenizer.model uses tokenizer.json and says so.
func TestEvalChecksTheEvaluatedModel(t *testing.T) {
	hf := filepath.Join("weights", "testdata", "hf", "llama-sharded")
	docs := filepath.Join("weights", "testdata", "hf", "docs", "*.txt")
	for _, sets := range [][]string{
		{"parallelism.attention=ulysses", "parallelism.sequence_parallel_degree=2", "parallelism.world_size=2"},
		{"parallelism.attention=distflash", "parallelism.sequence_parallel_degree=3", "parallelism.world_size=3", "data.seq_len=100"},
	} {
		args := []string{"eval", "--model", hf, "--data", docs, "--samples", "2", "--seq-len", "50", "--out", filepath.Join(t.TempDir(), "e.json")}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		mustSucceed(t, args...)
	}
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"} {
		b, err := os.ReadFile(filepath.Join(hf, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for src, dst := range map[string]string{"llama.tokenizer.json": "tokenizer.json", "llama.model": "tokenizer.model"} {
		b, err := os.ReadFile(filepath.Join("data", "testdata", "tok", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The fixture's vocabulary (256) is smaller than the tokenizers' (1000): the refusal names
	// the tokenizer file eval chose.
	mustFail(t, []string{"eval", "--model", dir, "--data", docs, "--samples", "1"}, filepath.Join(dir, "tokenizer.json"))
}

// TestCLIBasics: every command's --help exits 0; version names the build; train without
// --config uses the built-in defaults from any directory; the config.toml a run writes is
// accepted by --config and gives the same config.
func TestCLIBasics(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"train", "--help"}, {"eval", "-h"}, {"plan", "--help"},
		{"data", "--help"}, {"data", "tokenize", "--help"}, {"data", "fetch", "-h"}, {"version"}} {
		out, code := distflash(t, args...)
		if code != 0 {
			t.Errorf("distflash %v: exit %d\n%s", args, code, out)
		}
	}
	if out, _ := distflash(t, "version"); !strings.HasPrefix(out, "distflash ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: %q", out)
	}
	dir := t.TempDir()
	cmd := exec.Command(buildBinary(t), "train", "--progress=false", "--set", "training.steps=1", "--set", "data.max_bytes=65536")
	cmd.Dir = dir // no configs/ here
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("train without --config in an empty directory: %v\n%s", err, out)
	}
	written := filepath.Join(dir, "runs", "tiny", "config.toml")
	cfg, err := config.Load(written, nil)
	if err != nil {
		t.Fatalf("the written config.toml: %v", err)
	}
	want := config.Default()
	want.Training.Steps, want.Data.MaxBytes = 1, 65536
	cfg.Path, want.Path = "", ""
	_ = want.Model.Resolve()
	a, _ := json.Marshal(cfg)
	b, _ := json.Marshal(want)
	if !bytes.Equal(a, b) {
		t.Errorf("config.toml reads back as\n%s\nwant\n%s", a, b)
	}
}

// outside matches a relative path that leaves the repository.
var outside = regexp.MustCompile(`\.\./[A-Za-z_]`)

// TestDocsStandAlone: the README and docs/ point nowhere outside the repository.
func TestDocsStandAlone(t *testing.T) {
	files, _ := filepath.Glob("docs/*.md")
	for _, f := range append(files, "README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// a path that climbs out: ../shared/DESIGN.md, ../papers (a bare `../` is an attack's name)
		for _, loc := range outside.FindAllIndex(b, -1) {
			i := loc[0]
			t.Errorf("%s points outside the repository: %q", f, b[max(0, i-40):min(len(b), i+40)])
		}
	}
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
