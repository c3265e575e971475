package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"distflash/config"
)

// The tests of this file check what the commands refuse before they start, and how: a config
// that is invalid, not UTF-8 or meant for a cluster, a flag whose value means nothing, a run
// that does not fit in memory (or in a cgroup), a model to start from or export that cannot
// be, each named (key, flag, value, file) in the error, with nothing written.

// TestTrainRefusesClusterConfigs: the papers' configs validate, and train says what they need
// instead of starting.
func TestTrainRefusesClusterConfigs(t *testing.T) {
	files, _ := filepath.Glob("configs/llama*.toml")
	if len(files) < 7 {
		t.Fatalf("want the 7 paper configs, found %v", files)
	}
	for _, f := range files {
		_, _, err := cli(t, "train", "--config", f, "--progress=false")
		if cudaBuild {
			// The cuda build goes as far as this machine's GPUs and NCCL let it: here it must
			// still refuse each config, naming it; what they need is the default build's check.
			if err == nil || !strings.Contains(err.Error(), f) {
				t.Errorf("%s (cuda build): %v", f, err)
			}
			continue
		}
		need := `parallelism.backend = "nccl": kernels: parallelism.backend = nccl needs a build with -tags cuda` // the papers' clusters
		if filepath.Base(f) == "llama-1b.toml" {
			need = "-tags cuda" // one GPU (the GPU check's model)
		}
		if err == nil || !strings.Contains(err.Error(), f+": a valid config, but this build cannot train it") || !strings.Contains(err.Error(), need) {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestTrainBadConfig: an invalid value stops train with the key in the message.
func TestTrainBadConfig(t *testing.T) {
	_, _, err := cli(t, "train", "--config", "configs/tiny.toml", "--set", "model.n_kv_heads=3")
	if err == nil || !strings.Contains(err.Error(), "n_kv_heads") || !strings.Contains(err.Error(), "configs/tiny.toml") {
		t.Fatalf("error %v", err)
	}
	if _, _, err := cli(t, "bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestTrainRefusesWhatDoesNotFit: a data.seq_len whose activations do not fit in this
// machine's memory is refused before anything is allocated or written, with plan's estimate
// term by term, the memory available, the longest seq_len that fits and the knobs.
func TestTrainRefusesWhatDoesNotFit(t *testing.T) {
	dir := t.TempDir()
	_, _, err := cli(t, "train", "--progress=false", "--set", "data.seq_len=1048576", "--set", "model.max_seq_len=1048576",
		"--set", "run.output_dir="+filepath.Join(dir, "runs"))
	if err == nil {
		t.Fatal("a 1M-token tiny run was not refused")
	}
	for _, want := range []string{"training needs", "activations", "available", "The longest data.seq_len that fits is", `checkpoint.activation = "auto" took "layer" already`} {
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

// TestConfigUlyssesDegree: parallelism.ulysses_degree must be at least 1 and divide the
// sequence-parallel degree, attn2d takes none, and the Ulysses groups must be able to split
// the heads; each refusal names the file, the key and the value.
func TestConfigUlyssesDegree(t *testing.T) {
	for _, c := range []struct {
		file string
		sets []string
		want []string
	}{
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=3"}, []string{"configs/tiny-sp4.toml", "parallelism.ulysses_degree = 3", "parallelism.sequence_parallel_degree = 4"}},
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=0"}, []string{"parallelism.ulysses_degree = 0", ">= 1"}},
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=2", "parallelism.attention=attn2d"}, []string{"parallelism.ulysses_degree = 2", "attn2d"}},
		{"configs/llama-33h.toml", []string{"parallelism.ulysses_degree=2"}, []string{"configs/llama-33h.toml", "parallelism.ulysses_degree = 2", "n_heads (33)"}},
	} {
		_, err := config.Load(c.file, c.sets)
		if err == nil {
			t.Errorf("%s %v: accepted", c.file, c.sets)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %v: error %q does not say %q", c.file, c.sets, err, w)
			}
		}
	}
	for _, sets := range [][]string{
		{"parallelism.ulysses_degree=2"}, {"parallelism.ulysses_degree=4", "parallelism.attention=burst"},
		{"parallelism.ulysses_degree=2", "parallelism.attention=ulysses"}, {"parallelism.ulysses_degree=1", "parallelism.attention=attn2d"},
	} {
		cfg, err := config.Load("configs/tiny-sp4.toml", sets)
		if err != nil {
			t.Errorf("%v: %v", sets, err)
			continue
		}
		if u := cfg.Parallelism.UlyssesDegree; u > 1 && cfg.Parallelism.Attention != "ulysses" && !strings.Contains(cfg.Summary(), fmt.Sprintf("ulysses groups of %d", u)) {
			t.Errorf("%v: summary %q does not name the groups", sets, cfg.Summary())
		}
	}
}

// TestUnmeantInputIsSaid (issue 33, item 7): input that used to be ignored is refused or
// said: a --set of a [model] key for a checkpoint, which brings its own shape; an argument
// version does not take; a warmup longer than the run, which never reaches training.lr.
func TestUnmeantInputIsSaid(t *testing.T) {
	run := tinyCheckpoint(t)
	for _, set := range []string{"model.sliding_window=16", "model.dim=64"} {
		mustFail(t, []string{"eval", "--model", run, "--data", hfDocs, "--samples", "1", "--set", set},
			"eval: --set "+set+": the model's shape comes from "+run, "a [model] key does not apply to it")
	}
	mustFail(t, []string{"version", "extra-arg"}, `version: unexpected arguments ["extra-arg"]`)
	out := mustSucceed(t, smallRun(t.TempDir(), "--set", "training.steps=1", "--set", "training.warmup_steps=100")...)
	if want := "note: training.warmup_steps = 100 is more than training.steps = 1: the learning rate never reaches training.lr"; !strings.Contains(out, want) {
		t.Errorf("a warmup longer than the run is not said (%q):\n%s", want, out)
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
		{[]string{"eval", "--model", "x", "--sliding-window", "64", "--stride", "0"}, "eval: --stride 0: want at least 1 token; leave the flag out for a quarter of --sliding-window"},
		{[]string{"generate", "--model", "x", "--prompt", "a", "--samples", "0"}, "generate: --samples 0: want at least 1 continuation; leave the flag out for one"},
		{[]string{"train", "--stop-after", "-5"}, "--stop-after -5: want a step >= 1"},
	} {
		_, _, err := cli(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	stdout, _, err := cli(t, "plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu", "--flops", "1e10")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "over 2 ranks per host; --gpu-mem to set it") {
		t.Errorf("a cpu cluster's memory without its source:\n%s", stdout)
	}
	if stdout, _, err = cli(t, "plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu", "--flops", "1e10", "--gpu-mem", "8e9"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "4 CPU ranks, 8.00 GB each,") {
		t.Errorf("--gpu-mem 8e9:\n%s", stdout)
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
		_, _, err := cli(t, "plan", "--config", path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "UTF-") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestInitFromTokenizerHint: --init-from with a data.tokenizer larger than the model's
// vocabulary names the tokenizer given and the source's own, as the key to set.
func TestInitFromTokenizerHint(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	out, code := output(t, smallRun(t.TempDir(), "--init-from", filepath.Join(dir, "tiny"), "--set", "data.tokenizer=data/testdata/tok/llama.model")...)
	for _, w := range []string{`data.tokenizer = "data/testdata/tok/llama.model"`, "has 1000 tokens", "vocabulary has 256", "--set data.tokenizer=byte"} {
		if code == 0 || !strings.Contains(out, w) {
			t.Errorf("exit %d, no %q:\n%s", code, w, out)
		}
	}
}

// TestInitFromBadSources: unsupported HF settings are refused naming the field, through the
// CLI, before anything is written; so are paths that are no model.
func TestInitFromBadSources(t *testing.T) {
	edit := func(key string, v any) string {
		dir := t.TempDir()
		for _, f := range []string{"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
			b, err := os.ReadFile(filepath.Join("weights/testdata/hf/llama-sharded", f))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		path := filepath.Join(dir, "config.json")
		raw, _ := os.ReadFile(path)
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		m[key] = v
		js, _ := json.Marshal(m)
		os.WriteFile(path, js, 0o644)
		return dir
	}
	notModel := t.TempDir()
	for _, c := range []struct{ from, want string }{
		{edit("attention_bias", true), "attention_bias = true"},
		{edit("mlp_bias", true), "mlp_bias = true"},
		{edit("hidden_act", "relu"), `hidden_act = "relu"`},
		{edit("num_local_experts", 8), "num_local_experts = 8"},
		{edit("tie_word_embeddings", true), "tie_word_embeddings = true, but"},
		{notModel, "not a Hugging Face directory"},
		{"weights/testdata/hf/permute.safetensors", "no 2-D model.embed_tokens.weight"},
		{"configs/tiny.toml", "want a Hugging Face LLaMA directory"},
	} {
		out := t.TempDir()
		_, _, err := cli(t, append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", c.from}, initBase(out)...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--init-from %s: %v; want %q", c.from, err, c.want)
		}
		if ents, _ := os.ReadDir(out); len(ents) > 0 {
			t.Errorf("--init-from %s: wrote %d entries into run.output_dir", c.from, len(ents))
		}
	}
}

// TestExportErrors: bad flags and models are refused naming what is wrong, and nothing is
// written; an existing non-empty --out is refused and left alone.
func TestExportErrors(t *testing.T) {
	run := tinyCheckpoint(t)
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "x"), []byte("keep"), 0o644)
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", run, "--out", full}, "exists and is not empty"},
		{[]string{"--model", run, "--out", out, "--dtype", "f16"}, `--dtype "f16": want f32 or bf16`},
		{[]string{"--model", run, "--out", out, "--max-shard-size", "lots"}, "--max-shard-size: size \"lots\""},
		{[]string{"--model", "weights/testdata/hf/llama-sharded", "--out", out}, "want a distflash checkpoint"},
		{[]string{"--model", filepath.Join(dir, "missing"), "--out", out}, "no such file"},
		{[]string{"--model", dir, "--out", out}, "nor a readable distflash checkpoint"},
		{[]string{"--out", out}, "--model CHECKPOINT and --out DIR are required"},
	} {
		_, _, err := cli(t, append([]string{"export"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("export %v: %v; want %q", c.args, err, c.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(full, "x")); err != nil || string(b) != "keep" {
		t.Errorf("the non-empty --out was changed: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("failed exports left %d entries in %s, want only full/", len(ents), dir)
	}
}

// TestGenerateChecksBeforeItWorks: generate refuses an --out it could not write (a missing
// directory, a directory) before it loads the model and generates, and a prompt that does not
// fit in memory in its own terms (the prompt, not eval's --seq-len); the options it writes
// with the samples are named as its flags (issue 33, item 11).
func TestGenerateChecksBeforeItWorks(t *testing.T) {
	dir := t.TempDir()
	_, stderr, err := cli(t, "train", "--progress=false", "--set", "training.steps=1", "--set", "model.max_seq_len=100000000",
		"--set", "data.max_bytes=65536", "--set", "run.output_dir="+dir)
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	model := filepath.Join(dir, "tiny")
	gen := []string{"generate", "--model", model, "--prompt", "func", "--max-new-tokens", "4", "--stream=false"}
	for _, c := range []struct{ out, want string }{
		{filepath.Join(dir, "missing", "g.json"), "no directory " + filepath.Join(dir, "missing") + " to write it in"},
		{dir, "a directory: want the name of a file to write"},
	} {
		stdout, stderr, err := cli(t, append(gen, "--out", c.out)...)
		if err == nil || !strings.Contains(err.Error(), "generate: --out "+c.out+": "+c.want) {
			t.Errorf("--out %s: %v, want %q", c.out, err, c.want)
		}
		if stdout != "" || strings.Contains(stderr, "generate: 4 tokens") {
			t.Errorf("--out %s: generated before the refusal:\n%s%s", c.out, stdout, stderr)
		}
	}
	out := filepath.Join(dir, "g.json")
	succeed(t, append(gen, "--out", out, "--temperature", "0.5", "--top-k", "3", "--top-p", "0.9", "--seed", "2")...)
	var written struct{ Options map[string]any }
	if b, err := os.ReadFile(out); err != nil || json.Unmarshal(b, &written) != nil {
		t.Fatalf("%s: %v", out, err)
	}
	want := map[string]any{"max_new_tokens": 4.0, "temperature": 0.5, "top_k": 3.0, "top_p": 0.9, "seed": 2.0, "stop": nil}
	if fmt.Sprint(written.Options) != fmt.Sprint(want) {
		t.Errorf("options written %v, want %v", written.Options, want)
	}
	// a prompt of 50M tokens on this machine
	prompt := filepath.Join(dir, "prompt.txt")
	if err := os.WriteFile(prompt, []byte(strings.Repeat("x", 50_000_000)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = cli(t, "generate", "--model", model, "--prompt-file", prompt, "--max-new-tokens", "4", "--stream=false")
	if err == nil {
		t.Fatal("a prompt of 50M tokens was not refused")
	}
	msg := err.Error()
	for _, w := range []string{"generate: a prompt of 50000000 tokens needs", "available", "the longest prompt (--prompt, --prompt-file) that fits is"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the refusal lacks %q: %v", w, msg)
		}
	}
	if strings.Contains(msg, "eval") || strings.Contains(msg, "--seq-len") {
		t.Errorf("the refusal speaks of eval's flags: %v", msg)
	}
}

// TestMeaninglessInputIsRefused (issue 43, item 9): input that used to be read silently as
// something else, or refused in words that did not help, is refused naming the flag or the
// --set that gave it, the value and what is wanted, with exit status 2 and nothing written.
func TestMeaninglessInputIsRefused(t *testing.T) {
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	source := filepath.Join(dir, "tiny")
	for _, c := range []struct {
		name string
		args []string // output goes under OUT; a run that is not refused trains a step
		want []string
	}{
		{"shard-tokens 0", []string{"data", "tokenize", "--set", "data.max_bytes=4096", "--out", "OUT/shards", "--shard-tokens", "0"},
			[]string{"data tokenize: --shard-tokens 0: want at least 1 token per shard; leave the flag out for 100000000"}},
		{"init with init-from", smallRun("OUT", "--set", "training.steps=1", "--init-from", source, "--set", "model.init=normal"),
			[]string{`--set model.init=normal: model.init = "normal" draws a new model's weights, but --init-from ` + source + " brings them", "leave model.init out"}},
		{"own attention on the CPU", smallRun("OUT", "--set", "training.steps=1", "--set", "device.attention=own"),
			[]string{`--set device.attention=own: device.attention = "own" with device.kind = "cpu"`, "the CPU has one path"}},
		{"infinite grad_clip", smallRun("OUT", "--set", "training.steps=1", "--set", "training.grad_clip=inf"),
			[]string{"--set training.grad_clip=inf: training.grad_clip = +Inf: must be a finite number >= 0 (0 = no clipping)"}},
		{"time limit without a unit", smallRun("OUT", "--set", "training.steps=1", "--time-limit", "5"),
			[]string{`invalid value "5" for flag -time-limit: a duration needs a unit: 5m, 3h50m, 90s`}},
		{"a built-in default's error names the --set", smallRun("OUT", "--set", "training.steps=1", "--set", "data.seq_len=4096"),
			[]string{"--set data.seq_len=4096: data.seq_len = 4096 exceeds model.max_seq_len = 2048"}},
	} {
		out := t.TempDir()
		args := slices.Clone(c.args)
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, "OUT", out)
		}
		_, stderr, err := cli(t, args...)
		if err == nil {
			t.Errorf("%s: %q succeeded", c.name, args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), strings.ReplaceAll(w, "OUT", out)) {
				t.Errorf("%s: the error does not say %q:\n%s", c.name, w, stderr)
			}
		}
		if strings.Contains(stderr, "built-in config") {
			t.Errorf("%s: the error blames the built-in config:\n%s", c.name, stderr)
		}
		if ents, _ := os.ReadDir(out); len(ents) > 0 {
			t.Errorf("%s: wrote %d entries into %s", c.name, len(ents), out)
		}
	}
}
