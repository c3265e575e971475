package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"distflash/ckpt"
	"distflash/model"
	"distflash/parallel"
	"distflash/train"
)

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

// TestTrainTinyLossFalls trains the default config for 80 steps and checks that the loss falls
// well below ln(vocab) (the loss of a uniform guess) and that metrics.jsonl has every field.
func TestTrainTinyLossFalls(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run([]string{"train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "training.steps=80", "--set", "training.warmup_steps=10", "--set", "run.output_dir=" + dir},
		&stdout, &stderr)
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if len(ms) != 80 {
		t.Fatalf("%d metric lines, want 80", len(ms))
	}
	lnV := math.Log(256)
	if math.Abs(ms[0].Loss-lnV) > 0.1 {
		t.Errorf("first loss %.3f, want ≈ ln 256 = %.3f at initialisation", ms[0].Loss, lnV)
	}
	var tail float64
	for _, m := range ms[70:] {
		tail += m.Loss / 10
	}
	if tail > 0.65*lnV {
		t.Errorf("mean loss of the last 10 steps %.3f, want < %.3f (0.65·ln 256)", tail, 0.65*lnV)
	}
	last := ms[len(ms)-1]
	if last.Step != 80 || last.LR <= 0 || last.GradNorm <= 0 || last.TokensPerSec <= 0 || last.Tokens != 80*1024 || last.AttnForwards != 80*4 {
		t.Errorf("last metrics line incomplete: %+v", last)
	}
	if !strings.Contains(stdout.String(), "trained 80 steps") {
		t.Errorf("stdout: %q", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "tiny", "config.json")); err != nil {
		t.Error(err)
	}
}

// TestTrainRefusesClusterConfigs: the papers' configs validate, and train says what they need
// instead of starting.
func TestTrainRefusesClusterConfigs(t *testing.T) {
	files, _ := filepath.Glob("configs/llama*.toml")
	if len(files) < 7 {
		t.Fatalf("want the 7 paper configs, found %v", files)
	}
	for _, f := range files {
		var stdout, stderr bytes.Buffer
		err := run([]string{"train", "--config", f, "--progress=false"}, &stdout, &stderr)
		need := `parallelism.backend = "nccl": kernels: parallelism.backend = nccl needs a build with -tags cuda` // the papers' clusters
		if filepath.Base(f) == "llama-1b.toml" {
			need = "-tags cuda" // one GPU (the GPU check's model)
		}
		if err == nil || !strings.Contains(err.Error(), "is a valid config") || !strings.Contains(err.Error(), need) {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestTrainBadConfig: an invalid value stops train with the key in the message.
func TestTrainBadConfig(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run([]string{"train", "--config", "configs/tiny.toml", "--set", "model.n_kv_heads=3"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "n_kv_heads") || !strings.Contains(err.Error(), "configs/tiny.toml") {
		t.Fatalf("error %v", err)
	}
	if err := run([]string{"bogus"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestTrainInterrupt builds the real binary, sends it SIGINT during training and expects a
// clean exit (status 0) after the current step, with the metrics written so far and a
// checkpoint of that step, from which --resume auto continues.
func TestTrainInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := buildBinary(t)
	cmd := exec.Command(bin, "train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "run.output_dir="+dir, "--set", "training.steps=100000", "--set", "run.log_interval=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	metrics := filepath.Join(dir, "tiny", "metrics.jsonl")
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var stderr strings.Builder
	timeout := time.After(60 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			stderr.WriteString(l + "\n")
			if !ok {
				t.Fatalf("train ended before SIGINT: %s", stderr.String())
			}
			if strings.HasPrefix(l, "step 2/") {
				break wait
			}
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatalf("no progress within 60s: %s", stderr.String())
		}
	}
	go func() { // drain the rest so the child never blocks on stderr
		for l := range lines {
			stderr.WriteString(l + "\n")
		}
	}()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGINT: %v\nstderr: %s", err, stderr.String())
	}
	var done int
	if _, err := fmt.Sscanf(stdout.String(), "stopped after step %d", &done); err != nil || done < 2 {
		t.Fatalf("stdout %q: want \"stopped after step N\" with N >= 2", stdout.String())
	}
	if n := len(readMetrics(t, metrics)); n != done {
		t.Errorf("%d metric lines after interrupt at step %d", n, done)
	}
	// The interrupt saved a checkpoint at that step, and --resume auto continues from it.
	c, err := ckpt.Open(filepath.Join(dir, "tiny"))
	if err != nil {
		t.Fatalf("checkpoint after SIGINT: %v", err)
	}
	c.Close()
	if c.Manifest().Step != done {
		t.Errorf("checkpoint at step %d, interrupted after %d", c.Manifest().Step, done)
	}
	out, err := exec.Command(bin, "train", "--config", "configs/tiny.toml", "--progress=false", "--resume", "auto",
		"--stop-after", fmt.Sprint(done+2), "--set", "run.output_dir="+dir, "--set", "training.steps=100000").CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("resume: step %d from", done)) {
		t.Fatalf("resume after SIGINT: %v\n%s", err, out)
	}
	if ms := readMetrics(t, metrics); len(ms) != done+2 || ms[done].Step != done+1 {
		t.Errorf("after resuming: %d metric lines, want %d in order", len(ms), done+2)
	}
}

// trainLosses trains configs/tiny.toml (batch 2, 20 steps) with overrides and returns the
// per-step losses.
func trainLosses(t *testing.T, sets ...string) []float64 {
	t.Helper()
	dir := t.TempDir()
	args := []string{"train", "--config", "configs/tiny.toml", "--progress=false", "--set", "run.output_dir=" + dir,
		"--set", "training.steps=20", "--set", "data.batch_size=2", "--set", "data.max_bytes=1048576"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("train %v: %v\n%s", sets, err, stderr.String())
	}
	var out []float64
	for _, m := range readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl")) {
		out = append(out, m.Loss)
	}
	return out
}

// TestSequenceParallelTrainsLikeOneWorker: 4 in-process ranks, each holding a quarter of every
// sequence, follow the loss curve of one worker over 20 steps, for every schedule, under the
// rematerialization-aware checkpoint policy (Ulysses too: it replicates the tiny model's 2 kv
// heads over the 4 ranks). The curves differ only by
// summation order (gradients are all-reduced across ranks): measured ≤ 4e-8 relative over
// 20 steps, so the bound is 1e-6; a wrong mask, position or merge moves the loss by far more.
func TestSequenceParallelTrainsLikeOneWorker(t *testing.T) {
	want := trainLosses(t, "checkpoint.activation=attn_output")
	for _, name := range parallel.Names() {
		P := 4
		if err := parallel.Check(name, model.Heads{N: 4, KV: 2, Dim: 32}, P); err != nil {
			t.Fatalf("%s refuses 4 ranks for the tiny model: %v", name, err)
		}
		t.Run(fmt.Sprintf("%s/P%d", name, P), func(t *testing.T) {
			got := trainLosses(t, "checkpoint.activation=attn_output", fmt.Sprintf("parallelism.world_size=%d", P),
				fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P), "parallelism.attention="+name)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on %d ranks, %.7f on one (rel diff %.2e)", i+1, got[i], P, want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker over %d steps: %.2e",
				got[0], got[len(got)-1], len(got), worst)
		})
	}
}

// writeShortDocs writes n JSON-lines documents of 3 to 120 random words' bytes (few longer
// than the tiny model's 128-token window, so most windows hold several documents) and
// returns the file.
func writeShortDocs(t *testing.T, n int) string {
	t.Helper()
	words := strings.Fields("the of and to in is was for on that with as by at from his her an it were which are this be")
	var b strings.Builder
	for i := 0; i < n; i++ {
		var doc []string
		for w := 0; w < 1+(i*7919)%40; w++ {
			doc = append(doc, words[(i*31+w*17)%len(words)])
		}
		fmt.Fprintf(&b, "{\"text\": %q}\n", strings.Join(doc, " "))
	}
	p := filepath.Join(t.TempDir(), "docs.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDocumentMaskTrainsLikeOneWorker: with packed, document-masked short documents (and
// positions restarting per document) every schedule on 4 ranks (Ulysses on 2) follows one
// worker's loss over 20 steps as closely as unmasked training does, and the mask changes the
// curve (it is not ignored).
func TestDocumentMaskTrainsLikeOneWorker(t *testing.T) {
	docs := writeShortDocs(t, 3000)
	sets := []string{"checkpoint.activation=attn_output", "data.train=" + docs, "data.format=jsonl",
		"data.document_mask=true", "data.position_reset=true"}
	want := trainLosses(t, sets...)
	plain := trainLosses(t, sets[:3]...)
	if math.Abs(plain[len(plain)-1]-want[len(want)-1]) < 1e-4 {
		t.Fatalf("document masking leaves the loss as it was: %.6f vs %.6f", want[len(want)-1], plain[len(plain)-1])
	}
	for _, name := range parallel.Names() {
		P := 4
		if err := parallel.Check(name, model.Heads{N: 4, KV: 2, Dim: 32}, P); err != nil {
			t.Fatalf("%s refuses 4 ranks for the tiny model: %v", name, err)
		}
		t.Run(fmt.Sprintf("%s/P%d", name, P), func(t *testing.T) {
			got := trainLosses(t, append(slices.Clone(sets), fmt.Sprintf("parallelism.world_size=%d", P),
				fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P), "parallelism.attention="+name)...)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on %d ranks, %.7f on one (rel diff %.2e)", i+1, got[i], P, want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker: %.2e", got[0], got[len(got)-1], worst)
		})
	}
	// balanced document order (parallelism.balance_documents): the same tokens, targets and
	// in-document positions in another order, so the same curve up to summation order
	for _, name := range []string{"zigzag", "burst"} {
		got := trainLosses(t, append(slices.Clone(sets), "parallelism.world_size=4", "parallelism.sequence_parallel_degree=4",
			"parallelism.attention="+name, "parallelism.balance_documents=true")...)
		worst := 0.0
		for i := range want {
			worst = math.Max(worst, math.Abs(got[i]-want[i])/want[i])
		}
		if worst > 1e-6 {
			t.Errorf("%s with balanced documents: worst relative loss difference from one worker %.2e > 1e-6", name, worst)
		}
		t.Logf("%s, balanced documents: worst relative difference from one worker %.2e", name, worst)
	}
}

// TestTrainRefusesWhatDoesNotFit: a data.seq_len whose activations do not fit in this
// machine's memory is refused before anything is allocated or written, with plan's estimate
// term by term, the memory available, the longest seq_len that fits and the knobs.
func TestTrainRefusesWhatDoesNotFit(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run([]string{"train", "--progress=false", "--set", "data.seq_len=1048576", "--set", "model.max_seq_len=1048576",
		"--set", "run.output_dir=" + filepath.Join(dir, "runs")}, &stdout, &stderr)
	if err == nil {
		t.Fatal("a 1M-token tiny run was not refused")
	}
	for _, want := range []string{"training needs", "activations", "available", "The longest data.seq_len that fits is", `checkpoint.activation = "layer"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q: %v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "runs")); !os.IsNotExist(err) {
		t.Errorf("the refused run wrote %s: %v", filepath.Join(dir, "runs"), err)
	}
}

// TestTrainRefusesTooSmallCgroup runs the binary inside a new memory cgroup (v1's memory
// controller, or v2) limited to 160 MiB: a run that plan says needs more is refused before
// it allocates, naming the cgroup's limit as the memory available, and the default tiny run
// (about 54 MiB by plan) trains there. Needs root; CI runs it as root.
func TestTrainRefusesTooSmallCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a cgroup needs root; CI runs this as root")
	}
	cg := newMemoryCgroup(t, 160<<20)
	bin := buildBinary(t)
	dir := t.TempDir()
	inCgroup := func(args ...string) (string, error) {
		script := `echo $$ > "$0/cgroup.procs" && exec "$@"`
		out, err := exec.Command("sh", append([]string{"-c", script, cg.dir, bin}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := inCgroup("train", "--progress=false", "--set", "data.seq_len=4096", "--set", "model.max_seq_len=4096",
		"--set", "run.output_dir="+filepath.Join(dir, "big"))
	if err == nil || !strings.Contains(out, "training needs") || !strings.Contains(out, cg.limitFile) {
		t.Errorf("seq_len 4096 in a 160 MiB cgroup: %v; want a refusal naming %s:\n%s", err, cg.limitFile, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); !os.IsNotExist(err) {
		t.Errorf("the refused run wrote its directory: %v", err)
	}
	out, err = inCgroup("train", "--progress=false", "--set", "training.steps=2", "--set", "data.max_bytes=1048576",
		"--set", "run.output_dir="+filepath.Join(dir, "small"))
	if err != nil {
		t.Errorf("the tiny run in a 160 MiB cgroup: %v\n%s", err, out)
	}
}

// memoryCgroup is a cgroup made for a test: its directory and the file that holds its limit.
type memoryCgroup struct{ dir, limitFile string }

// newMemoryCgroup makes a child of this process's memory cgroup (v1's memory controller if
// mounted, else v2) limited to limit bytes, removed when the test ends.
func newMemoryCgroup(t *testing.T, limit int64) memoryCgroup {
	t.Helper()
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var v1, v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory"):
			v1 = f[2]
		case len(f) == 3 && f[0] == "0" && f[1] == "":
			v2 = f[2]
		}
	}
	var parent, limitName string
	switch {
	case v1 != "" && fileExists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
		parent, limitName = filepath.Join("/sys/fs/cgroup/memory", v1), "memory.limit_in_bytes"
	case v2 != "" && fileExists("/sys/fs/cgroup/cgroup.controllers"):
		parent, limitName = filepath.Join("/sys/fs/cgroup", v2), "memory.max"
	default:
		t.Fatalf("no memory cgroup found (/proc/self/cgroup: %q)", own)
	}
	dir := filepath.Join(parent, fmt.Sprintf("distflash-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("make a cgroup as root: %v", err)
	}
	t.Cleanup(func() {
		for range 50 { // the processes in it must have exited first
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	file := filepath.Join(dir, limitName)
	if err := os.WriteFile(file, []byte(fmt.Sprint(limit)), 0o644); err != nil {
		t.Fatalf("set the cgroup's limit: %v", err)
	}
	return memoryCgroup{dir: dir, limitFile: file}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestWindowTrainsLikeOneWorker: a tiny model whose layers 0 and 2 attend within a sliding
// window of 20 tokens (under a quarter rank's 32) follows one worker's loss over 20 steps on 4
// sequence-parallel ranks, for every schedule and the hybrid, as unwindowed training does, and
// the window changes the curve.
func TestWindowTrainsLikeOneWorker(t *testing.T) {
	window := []string{"checkpoint.activation=attn_output", "model.sliding_window=20", "model.sliding_window_layers=[0, 2]"}
	want := trainLosses(t, window...)
	if plain := trainLosses(t, "checkpoint.activation=attn_output"); plain[len(plain)-1] == want[len(want)-1] {
		t.Fatalf("the window left the loss curve as it was")
	}
	cases := map[string][]string{}
	for _, name := range parallel.Names() {
		cases[name] = []string{"parallelism.attention=" + name}
	}
	cases["hybrid ulysses 2 × ring"] = []string{"parallelism.attention=ring", "parallelism.ulysses_degree=2"}
	for name, sets := range cases {
		t.Run(name, func(t *testing.T) {
			got := trainLosses(t, append(append(append([]string{}, window...), "parallelism.world_size=4",
				"parallelism.sequence_parallel_degree=4"), sets...)...)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on 4 ranks, %.7f on one (rel diff %.2e)", i+1, got[i], want[i], d)
				}
			}
			t.Logf("worst relative difference from one worker over %d steps: %.2e", len(got), worst)
		})
	}
}
