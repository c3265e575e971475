package main

import (
	"errors"
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

	"distflash/ckpt"
	"distflash/data"
	"distflash/train/tensorboard"
)

// startWatched starts the binary on args with stdout and stderr into one buffer.
func startWatched(t *testing.T, args ...string) (*exec.Cmd, *safeBuffer) {
	t.Helper()
	cmd := exec.Command(buildBinary(t), args...)
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

// TestSignalDuringSave: SIGTERM while the periodic checkpoint of step 2 is being written (a
// model of 19M parameters, whose save takes about a second) stops there: the message says so,
// no step 3 is trained and no second checkpoint is written, on two in-process ranks that agree.
func TestSignalDuringSave(t *testing.T) {
	dir := t.TempDir()
	cmd, buf := startWatched(t, smallRun(dir, "--set", "training.steps=100", "--set", "run.log_interval=1",
		"--set", "checkpoint.interval=2", "--set", "model.dim=384", "--set", "model.n_layers=8", "--set", "model.n_heads=6",
		"--set", "model.n_kv_heads=6", "--set", "model.ffn_dim=1536", "--set", "data.seq_len=64",
		"--set", "parallelism.world_size=2")...)
	waitOutput(t, buf, "step 2/100")
	began := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, buf.String())
	}
	out := buf.String()
	if !strings.Contains(out, "checkpoint: step 2 saved") {
		t.Fatalf("the save of step 2 did not complete:\n%s", out)
	}
	if !strings.Contains(out, "stopping after the checkpoint of step 2, now being saved") {
		t.Skipf("the signal did not arrive during the save (%.0f ms after step 2's line):\n%s", time.Since(began).Seconds()*1e3, out)
	}
	if strings.Contains(out, "step 3/") || strings.Count(out, "checkpoint: step") != 1 {
		t.Errorf("trained or saved past the checkpoint the signal arrived in:\n%s", out)
	}
	if !strings.Contains(out, "stopped after step 2 of 100") {
		t.Errorf("no \"stopped after step 2 of 100\":\n%s", out)
	}
	if s := latestStep(t, filepath.Join(dir, "tiny")); s != 2 {
		t.Errorf("latest is step %d, want 2", s)
	}
}

// TestSignalDuringLongStep: SIGTERM in the middle of a step says how long the step has run and
// how long one takes, then stops after it with a checkpoint.
func TestSignalDuringLongStep(t *testing.T) {
	dir := t.TempDir()
	cmd, buf := startWatched(t, smallRun(dir, "--set", "training.steps=100", "--set", "run.log_interval=1",
		"--set", "data.seq_len=2048", "--set", "model.max_seq_len=2048")...)
	waitOutput(t, buf, "step 2/100")
	time.Sleep(100 * time.Millisecond) // inside step 3
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, buf.String())
	}
	out := buf.String()
	re := regexp.MustCompile(`stopping after step (\d+) \(it has run (\d+)(ms|s); a step takes about (\d+)(ms|s)\) and saving; until that save completes, no checkpoint is saved yet`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no message of how long the step has run:\n%s", out)
	}
	if !strings.Contains(out, "stopped after step "+m[1]+" of 100") {
		t.Errorf("the message named step %s, the run stopped elsewhere:\n%s", m[1], out)
	}
	if s := latestStep(t, filepath.Join(dir, "tiny")); strconv.Itoa(s) != m[1] {
		t.Errorf("latest is step %d, the message named %s", s, m[1])
	}
}

// TestTimeLimit: --time-limit stops after the last step that, with a save, ends before the
// limit, saves there and says why; the run's own clock stays inside the limit. A negative
// limit and a negative --stop-after are refused.
func TestTimeLimit(t *testing.T) {
	dir := t.TempDir()
	const limit = 5 * time.Second
	out, code := distflash(t, append(smallRun(dir, "--set", "training.steps=100000", "--set", "run.log_interval=1"),
		"--time-limit", limit.String())...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	re := regexp.MustCompile(`time limit 5s: stopping after step (\d+), `)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no time-limit message:\n%s", out)
	}
	step, _ := strconv.Atoi(m[1])
	if step < 2 || !strings.Contains(out, fmt.Sprintf("stopped after step %d of 100000", step)) {
		t.Fatalf("stopped at step %d:\n%s", step, out)
	}
	if s := latestStep(t, filepath.Join(dir, "tiny")); s != step {
		t.Errorf("latest is step %d, want %d", s, step)
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if last := ms[len(ms)-1]; last.ElapsedSec >= limit.Seconds() || last.Step != step {
		t.Errorf("last step %d at %.2fs, the limit %s", last.Step, last.ElapsedSec, limit)
	}
	for _, args := range [][]string{{"--time-limit", "-1h"}, {"--stop-after", "-5"}, {"--profile", dir, "--profile-steps", "5..2"}} {
		out, code := distflash(t, append(smallRun(t.TempDir()), args...)...)
		if code == 0 || !strings.Contains(out, args[len(args)-2]) || !strings.Contains(out, "want") {
			t.Errorf("%v: exit %d:\n%s", args, code, out)
		}
	}
}

// TestLogLineTimeAndMFU: log lines carry FLOP/s, elapsed time and the time left; metrics.jsonl
// carries flops_per_s = tokens/s × plan's FLOPs per token, and mfu against device.peak_tflops;
// the end of the run quotes the mean loss of the last 10 steps.
func TestLogLineTimeAndMFU(t *testing.T) {
	dir := t.TempDir()
	out, code := distflash(t, smallRun(dir, "--set", "training.steps=12", "--set", "run.log_interval=4", "--set", "device.peak_tflops=0.5")...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	re := regexp.MustCompile(`step 4/12  loss [\d.]+  lr \S+  grad_norm [\d.]+  \d+ tok/s  [\d.]+ [MGT]FLOP/s  mfu [\d.]+%  elapsed \S+  eta \S+\n`)
	if !re.MatchString(out) {
		t.Errorf("no log line with FLOP/s, mfu, elapsed and eta:\n%s", out)
	}
	if !regexp.MustCompile(`step 12/12 .* elapsed \S+\n`).MatchString(out) || regexp.MustCompile(`step 12/12 [^\n]* eta`).MatchString(out) {
		t.Errorf("the last step's line:\n%s", out)
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	// 6N + 6·L·q·S per token, N and the shape from the run's summary line
	n := regexp.MustCompile(`LLaMA ([\d.]+)K params \(dim (\d+), (\d+) layers, (\d+) heads[^,]*, head_dim (\d+).* seq (\d+) `).FindStringSubmatch(out)
	if n == nil {
		t.Fatalf("no summary line:\n%s", out)
	}
	for _, m := range ms {
		if m.FLOPsPerSec <= 0 || m.MFU <= 0 || abs(m.MFU-m.FLOPsPerSec/0.5e12) > 1e-12 {
			t.Errorf("step %d: flops_per_s %g, mfu %g", m.Step, m.FLOPsPerSec, m.MFU)
		}
		perToken := m.FLOPsPerSec / m.TokensPerSec
		kparams, _ := strconv.ParseFloat(n[1], 64)
		L, _ := strconv.Atoi(n[3])
		H, _ := strconv.Atoi(n[4])
		hd, _ := strconv.Atoi(n[5])
		S, _ := strconv.Atoi(n[6])
		want := 6*kparams*1e3 + 6*float64(L*H*hd*S)
		if abs(perToken-want) > 0.001*want { // the summary rounds N to 0.1K
			t.Errorf("step %d: %g FLOPs per token, want 6N + 6·L·q·S = %g", m.Step, perToken, want)
		}
	}
	mean := 0.0
	for _, m := range ms[2:] {
		mean += m.Loss / 10
	}
	want := fmt.Sprintf("-> %.4f (mean of the last 10 steps; the last step's %.4f)", mean, ms[11].Loss)
	if !strings.Contains(out, want) {
		t.Errorf("no %q:\n%s", want, out)
	}
}

// TestProfile: --profile writes rank 0's CPU and heap profiles of the steps asked, in pprof's
// format (gzipped protobuf), and says where.
func TestProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "prof")
	out, code := distflash(t, append(smallRun(dir, "--set", "training.steps=6"), "--profile", prof, "--profile-steps", "2..4")...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "profile: CPU of steps 2–4") || !strings.Contains(out, "go tool pprof -top") {
		t.Errorf("the profile was not announced:\n%s", out)
	}
	for _, f := range []string{"cpu.pprof", "heap.pprof"} {
		b, err := os.ReadFile(filepath.Join(prof, f))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 100 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s: %d bytes, not a gzipped profile", f, len(b))
		}
	}
	var ee *exec.ExitError
	if _, err := exec.LookPath("go"); err == nil {
		cmd := exec.Command("go", "tool", "pprof", "-top", buildBinary(t), filepath.Join(prof, "cpu.pprof"))
		top, err := cmd.CombinedOutput()
		if errors.As(err, &ee) || err != nil || !strings.Contains(string(top), "distflash/") {
			t.Errorf("go tool pprof -top: %v\n%s", err, top)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestExportInterruptedAndStale: SIGINT during an export removes its partial output and says so
// (exit status 130, nothing at --out, no .OUT.tmp-* left); a partial output that a killed export
// left is named and removed by the next export of the same directory, which completes.
func TestExportInterruptedAndStale(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1", "--set", "model.dim=512", "--set", "model.n_layers=8",
		"--set", "model.n_heads=8", "--set", "model.n_kv_heads=8", "--set", "model.ffn_dim=2048", "--set", "data.seq_len=32")...)
	out := filepath.Join(dir, "hf")
	partials := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, ".hf.tmp-*"))
		return m
	}
	cmd, buf := startWatched(t, "export", "--model", run, "--out", out)
	waitOutput(t, buf, "export: "+run)
	time.Sleep(50 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if err == nil {
		t.Skipf("the export ended before the signal:\n%s", buf.String())
	}
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(buf.String(), "export: interrupted") {
		t.Fatalf("after SIGINT: %v\n%s", err, buf.String())
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) || len(partials()) > 0 {
		t.Fatalf("an interrupted export left %v and %v:\n%s", err, partials(), buf.String())
	}
	// what an export killed by SIGKILL leaves: a temporary directory with a partial file
	stale := filepath.Join(dir, ".hf.tmp-123456")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "model.safetensors"), make([]byte, 3e6), 0o644); err != nil {
		t.Fatal(err)
	}
	got, code := distflash(t, "export", "--model", run, "--out", out)
	if code != 0 || !strings.Contains(got, "removing "+stale+" (3.0 MB), the partial output of an earlier export") {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	if len(partials()) > 0 {
		t.Errorf("left %v", partials())
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err != nil {
		t.Error(err)
	}
}

// TestTokenizeKilled: a tokenize killed by SIGKILL mid-way leaves no shard at --out (its shards
// are staged beside it), so train cannot read a partial set as whole; the next tokenize of the
// same --out names and removes what the killed one left, and completes.
func TestTokenizeKilled(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "tokens")
	args := []string{"data", "tokenize", "--out", out, "--shard-tokens", "20000", "--progress=false", "--workers", "1",
		"--set", "data.max_bytes=0", "--set", "data.train=$GOROOT/src"}
	cmd, buf := startWatched(t, args...)
	deadline := time.Now().Add(time.Minute)
	var staged []string
	for len(staged) < 3 { // a few shards written
		if time.Now().After(deadline) {
			t.Fatalf("no staged shards within a minute:\n%s", buf.String())
		}
		staged, _ = filepath.Glob(filepath.Join(dir, ".tokens.tokenize-*", "shards", "shard-*.tokens"))
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if got, _ := filepath.Glob(filepath.Join(out, "*.tokens")); len(got) > 0 {
		t.Fatalf("a killed tokenize left %d shards at --out", len(got))
	}
	if o, code := distflash(t, smallRun(dir, "--set", "training.steps=1", "--set", "data.format=tokens", "--set", "data.train="+out)...); code == 0 {
		t.Fatalf("train read what a killed tokenize left:\n%s", o)
	}
	o, code := distflash(t, "data", "tokenize", "--out", out, "--progress=false", "--set", "data.max_bytes=200000")
	if code != 0 || !strings.Contains(o, "the partial output of an earlier tokenize of "+out+" that was killed") {
		t.Fatalf("exit %d:\n%s", code, o)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".tokens.tokenize-*")); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	if got, _ := filepath.Glob(filepath.Join(out, "*.tokens")); len(got) != 1 {
		t.Errorf("%d shards after the second tokenize, want 1", len(got))
	}
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1", "--set", "data.format=tokens", "--set", "data.train="+out)...)
}

// TestDirectoryInUse: a fresh run in a directory another run is training in says that it is in
// use and by which process, not that it holds an earlier run to --resume.
func TestDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	cmd, buf := startWatched(t, smallRun(dir, "--set", "training.steps=100000", "--set", "run.log_interval=1")...)
	waitOutput(t, buf, "step 2/")
	out, code := distflash(t, smallRun(dir, "--set", "training.steps=5")...)
	if code == 0 || !strings.Contains(out, "is in use by pid "+strconv.Itoa(cmd.Process.Pid)) || strings.Contains(out, "--resume auto") {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

// TestExportAndTokenizeDiskFull: an export or a tokenize that fills a small tmpfs says how many
// bytes it needs and how many were free, names the path once, and leaves nothing behind.
// Mounting a tmpfs needs root, which CI and the development machines have.
func TestExportAndTokenizeDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	small := filepath.Join(dir, "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	defer exec.Command("umount", small).Run()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"export", "--model", run, "--out", filepath.Join(small, "hf")},
			[]string{"disk full: the export to " + filepath.Join(small, "hf") + " needs 3.2 MB and 1.0 MB was free", "nothing is at"}},
		{[]string{"data", "tokenize", "--out", filepath.Join(small, "tok"), "--set", "data.max_bytes=4000000", "--progress=false"},
			[]string{"disk full beside " + filepath.Join(small, "tok") + " after 1.0 MB of shards, which need about", "1.0 MB was free at the start"}},
	} {
		out, code := distflash(t, c.args...)
		for _, w := range c.want {
			if code == 0 || !strings.Contains(out, w) {
				t.Errorf("%v: exit %d, no %q:\n%s", c.args[0], code, w, out)
			}
		}
		if strings.Count(out, ".tmp-") > 0 || strings.Count(out, ".tokenize-") > 0 {
			t.Errorf("%v: the message names the temporary path:\n%s", c.args[0], out)
		}
		if left, _ := os.ReadDir(small); len(left) > 0 {
			t.Errorf("%v left %v", c.args[0], left)
		}
	}
}

// TestEvalSaysWhatItReplaces: an eval whose default --out holds an eval of other data says that
// it replaces it; the same eval again does not.
func TestEvalSaysWhatItReplaces(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	evalOn := func(data string) string {
		out, code := distflash(t, "eval", "--model", run, "--data", data, "--samples", "2", "--seq-len", "64")
		if code != 0 {
			t.Fatalf("eval on %s: exit %d:\n%s", data, code, out)
		}
		return out
	}
	root, err := data.ExpandPath("$GOROOT")
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(root, "src", "sort"), filepath.Join(root, "src", "strings")
	evalOn(a)
	if out := evalOn(a); strings.Contains(out, "replacing") {
		t.Errorf("the same eval again:\n%s", out)
	}
	if out := evalOn(b); !strings.Contains(out, "eval: replacing "+run) || !strings.Contains(out, "which held an eval of 2 samples of "+a) {
		t.Errorf("an eval on other data:\n%s", out)
	}
}

// TestModelRunFollowsCheckpointDir: eval and export --model RUN of a run that saved into a
// checkpoint.dir elsewhere read that run's newest checkpoint there.
func TestModelRunFollowsCheckpointDir(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=2", "--set", "checkpoint.dir="+shared)...)
	run := filepath.Join(dir, "tiny")
	out, code := distflash(t, "eval", "--model", run, "--samples", "2", "--seq-len", "64")
	if code != 0 || !strings.Contains(out, "eval: "+filepath.Join(shared, "step-000002")+" (step 2)") {
		t.Errorf("eval: exit %d:\n%s", code, out)
	}
	out, code = distflash(t, "export", "--model", run, "--out", filepath.Join(dir, "hf"))
	if code != 0 || !strings.Contains(out, "saves its checkpoints in "+shared) {
		t.Errorf("export: exit %d:\n%s", code, out)
	}
}

// TestFlagsThatMeanAValue: a flag given with 0 (or a value no machine has) is refused, not read
// as "the default"; a cpu cluster's memory per rank says where it comes from.
func TestFlagsThatMeanAValue(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--inter-bw", "0"}, "--inter-bw 0: want bytes/s"},
		{[]string{"plan", "--inter-bw", "1e-300"}, "--inter-bw 1e-300: want bytes/s"},
		{[]string{"plan", "--gpu-mem", "-1"}, "--gpu-mem -1: want bytes"},
		{[]string{"plan", "--mfu", "0"}, "--mfu 0: want a fraction"},
		{[]string{"eval", "--model", "x", "--samples", "0"}, "--samples 0: want at least 1"},
		{[]string{"eval", "--model", "x", "--seq-len", "-3"}, "--seq-len -3: want at least 1"},
		{[]string{"train", "--stop-after", "-5"}, "--stop-after -5: want a step >= 1"},
	} {
		var stdout, stderr strings.Builder
		err := run(c.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	var stdout, stderr strings.Builder
	if err := run([]string{"plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu", "--flops", "1e10"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "over 2 ranks per host; --gpu-mem to set it") {
		t.Errorf("a cpu cluster's memory without its source:\n%s", stdout.String())
	}
	stdout.Reset()
	if err := run([]string{"plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu", "--flops", "1e10", "--gpu-mem", "8e9"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "4 GPUs, 8.00 GB each,") {
		t.Errorf("--gpu-mem 8e9:\n%s", stdout.String())
	}
}

// TestTensorBoardEvents: a run writes TensorBoard event files under <run>/tb/ that a reader
// built on the protobuf library decodes, every CRC checked: one event per step with the same
// loss, learning rate, gradient norm, tokens/s, FLOP/s and MFU as metrics.jsonl (as float32),
// and the eval loss on the steps it ran. A resumed run adds a second file; run.tensorboard =
// false writes none.
func TestTensorBoardEvents(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=6", "--stop-after", "4", "--set", "device.peak_tflops=1",
		"--set", "eval.interval=2", "--set", "eval.samples=2")...)
	mustSucceed(t, smallRun(dir, "--set", "training.steps=6", "--resume", "auto", "--set", "device.peak_tflops=1",
		"--set", "eval.interval=2", "--set", "eval.samples=2")...)
	files, _ := filepath.Glob(filepath.Join(dir, "tiny", "tb", "events.out.tfevents.*"))
	if len(files) != 2 {
		t.Fatalf("%d event files, want 2 (the run and its resumption): %v", len(files), files)
	}
	bySteps := map[int64]tensorboard.Event{}
	for _, f := range files {
		evs, err := tensorboard.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 || evs[0].FileVersion != "brain.Event:2" {
			t.Fatalf("%s: no file_version record first", f)
		}
		for _, e := range evs[1:] {
			bySteps[e.Step] = e
		}
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if len(bySteps) != len(ms) || len(ms) != 6 {
		t.Fatalf("%d events, %d metric lines, want 6 each", len(bySteps), len(ms))
	}
	for _, m := range ms {
		e := bySteps[int64(m.Step)]
		want := map[string]float64{"train/loss": m.Loss, "train/lr": m.LR, "train/grad_norm": m.GradNorm,
			"perf/tokens_per_s": m.TokensPerSec, "perf/flops_per_s": m.FLOPsPerSec, "perf/mfu": m.MFU}
		if m.Step%2 == 0 {
			want["eval/loss"] = m.EvalLoss
		}
		for tag, v := range want {
			if got, ok := e.Values[tag]; !ok || got != float32(v) {
				t.Errorf("step %d %s: %v (present %v), metrics.jsonl %v", m.Step, tag, got, ok, v)
			}
		}
		if _, ok := e.Values["eval/loss"]; ok != (m.Step%2 == 0) {
			t.Errorf("step %d: eval/loss present %v", m.Step, ok)
		}
		if e.Values["memory/largest_rank_gib"] <= 0 {
			t.Errorf("step %d: no memory", m.Step)
		}
	}
	off := t.TempDir()
	mustSucceed(t, smallRun(off, "--set", "training.steps=1", "--set", "run.tensorboard=false")...)
	if _, err := os.Stat(filepath.Join(off, "tiny", "tb")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run.tensorboard = false: %v", err)
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
	out, code := distflash(t, runAs("b")...)
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
	out, code = distflash(t, runAs("a", "--resume", "auto", "--set", "training.steps=3")...)
	if want := "continue there with --set checkpoint.dir=" + olds[0] + " --resume auto"; code == 0 || !strings.Contains(out, want) {
		t.Fatalf("a's resume after b's --fresh: exit %d, no %q:\n%s", code, want, out)
	}
	mustSucceed(t, smallRun(dir, "--set", "run.name=a", "--set", "checkpoint.dir="+olds[0], "--set", "training.steps=3", "--resume", "auto")...)
	if s := latestStep(t, olds[0]); s != 3 {
		t.Errorf("a continued to step %d, want 3", s)
	}
}

// TestInitFromTokenizerHint: --init-from with a data.tokenizer larger than the model's
// vocabulary names the tokenizer given and the source's own, as the key to set.
func TestInitFromTokenizerHint(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	out, code := distflash(t, smallRun(t.TempDir(), "--init-from", filepath.Join(dir, "tiny"), "--set", "data.tokenizer=data/testdata/tok/llama.model")...)
	for _, w := range []string{`data.tokenizer = "data/testdata/tok/llama.model"`, "has 1000 tokens", "vocabulary has 256", "--set data.tokenizer=byte"} {
		if code == 0 || !strings.Contains(out, w) {
			t.Errorf("exit %d, no %q:\n%s", code, w, out)
		}
	}
}

// TestConfigNotUTF8: a config file that is not UTF-8 (Latin-1 bytes, UTF-16 from an editor) is
// refused naming the file, not read as an empty config of defaults.
func TestConfigNotUTF8(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string][]byte{
		"latin1.toml": []byte("[run]\nname = \"caf\xe9\"\n"),
		"utf16.toml":  {0xff, 0xfe, '[', 0, 'r', 0, 'u', 0, 'n', 0, ']', 0, '\n', 0},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr strings.Builder
		err := run([]string{"plan", "--config", path}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "UTF-") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
