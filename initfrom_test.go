package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/train"
	"distflash/weights"
	"distflash/weights/safetensors"
)

// initBase are the train overrides of the short --init-from runs: a little data, short
// sequences, one step.
func initBase(dir string) []string {
	return []string{"--set", "data.max_bytes=65536", "--set", "data.seq_len=64", "--set", "data.batch_size=2",
		"--set", "training.steps=1", "--set", "training.warmup_steps=0", "--set", "run.output_dir=" + dir}
}

// setsOf returns the values of --set flags in args.
func setsOf(args []string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--set" {
			out = append(out, args[i+1])
		}
	}
	return out
}

// tinyCheckpoint trains a small model (dim 32, byte tokenizer) for 3 steps and returns its
// run directory, which holds the checkpoint of step 3.
func tinyCheckpoint(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "model.dim=32", "--set", "model.n_layers=2", "--set", "model.ffn_dim=64", "--set", "model.max_seq_len=256",
		"--set", "data.max_bytes=65536", "--set", "data.seq_len=64", "--set", "data.batch_size=2",
		"--set", "training.steps=3", "--set", "training.warmup_steps=1", "--set", "checkpoint.interval=3",
		"--set", "run.name=src", "--set", "run.output_dir=" + dir}, extra...)
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	return filepath.Join(dir, "src")
}

// sourceSafetensors writes the weights of the HF fixture llama-sharded as one F32
// .safetensors file with distflash's names.
func sourceSafetensors(t *testing.T) string {
	t.Helper()
	em, err := weights.Load("weights/testdata/hf/llama-sharded", config.Default(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "weights.safetensors")
	if err := safetensors.Write(path, weights.Tensors(em.Config, em.Params), safetensors.DTypeF32, nil); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestInitFromSources runs `train --init-from` from each kind of source through the CLI: the
// run starts at step 0 (its first metrics line is step 1) with the source's weights: its first
// loss is the source's loss on that batch (computed apart), which is not the loss of a fresh
// initialisation; [model] comes from the source; the checkpoint written is of step 1.
func TestInitFromSources(t *testing.T) {
	ckptDir := tinyCheckpoint(t)
	for _, src := range []struct{ kind, path string }{
		{"hf", "weights/testdata/hf/llama-sharded"},
		{"hf", "weights/testdata/hf/llama-tied"},
		{"hf", "weights/testdata/hf/mistral-window"},
		{"safetensors", sourceSafetensors(t)},
		{"checkpoint", ckptDir},
		{"checkpoint", filepath.Join(ckptDir, "step-000003")},
	} {
		t.Run(src.kind+"/"+filepath.Base(src.path), func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", src.path,
				"--set", "checkpoint.interval=1"}, initBase(dir)...)
			var stdout, stderr bytes.Buffer
			if err := run(args, &stdout, &stderr); err != nil {
				t.Fatalf("train: %v\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), "init: ") || !strings.Contains(stderr.String(), "("+src.kind+", ") {
				t.Errorf("stderr does not report the init:\n%s", stderr.String())
			}
			ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
			if len(ms) != 1 || ms[0].Step != 1 {
				t.Fatalf("metrics %+v, want one line of step 1", ms)
			}
			cfg, _, err := train.LoadInitConfig("configs/tiny.toml", setsOf(args), src.path, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			want := firstBatchLoss(t, cfg, src.path)
			if d := relDiff(ms[0].Loss, want); d > 1e-6 {
				t.Errorf("first loss %.9g, the source's on that batch %.9g (rel %.1e)", ms[0].Loss, want, d)
			}
			if fresh := freshBatchLoss(t, cfg); math.Abs(want-fresh) < 1e-3 {
				t.Errorf("the source's loss %.6f is that of a fresh initialisation (%.6f): the test proves nothing", want, fresh)
			}
			if cfg.Model.Dim == model.DefaultConfig().Dim {
				t.Errorf("[model] dim %d: not the source's", cfg.Model.Dim)
			}
			if _, err := os.Stat(filepath.Join(dir, "tiny", "step-000001")); err != nil {
				t.Errorf("checkpoint of step 1: %v", err)
			}
		})
	}
}

// TestInitFromModelKeys: keys left at their defaults come from the source; rope_theta,
// max_seq_len, rope_scaling and the sliding window may be changed; any other key set otherwise must agree, and a
// disagreement names the key and both values; an agreeing explicit [model] is accepted.
func TestInitFromModelKeys(t *testing.T) {
	const src = "weights/testdata/hf/llama-sharded" // dim 32, 2 layers, 4/2 heads, ffn 64, vocab 256, 512 positions
	base := setsOf(initBase(t.TempDir()))
	cfg, _, err := train.LoadInitConfig("configs/tiny.toml", append(base, "model.max_seq_len=2048", "model.rope_theta=40000"), src, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := model.Config{Dim: 32, NLayers: 2, NHeads: 4, NKVHeads: 2, HeadDim: 8, FFNDim: 64, VocabSize: 256,
		NormEps: 1e-5, RopeTheta: 40000, MaxSeqLen: 2048, SlidingWindowLayers: []int{}}
	if !reflect.DeepEqual(cfg.Model, want) {
		t.Errorf("[model] %+v\nwant %+v", cfg.Model, want)
	}
	// a window may be added to a LLaMA, and a Mistral's changed or dropped; a LLaMA config
	// that carries one is read with a note
	llamaWindow := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join("weights/testdata/hf/mistral-window", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "config.json" {
			b = bytes.Replace(b, []byte(`"model_type": "mistral"`), []byte(`"model_type": "llama"`), 1)
		}
		os.WriteFile(filepath.Join(llamaWindow, f), b, 0o644)
	}
	var notes bytes.Buffer
	if cfg, _, err := train.LoadInitConfig("configs/tiny.toml", base, llamaWindow, &notes); err != nil || cfg.Model.SlidingWindow != 16 ||
		!strings.Contains(notes.String(), `init: note: `+filepath.Join(llamaWindow, "config.json")+`: model_type "llama" with sliding_window = 16: the window is applied`) {
		t.Errorf("a LLaMA config with sliding_window 16: %v, notes:\n%s", err, notes.String())
	}
	notes.Reset()
	if em, err := weights.Load(llamaWindow, config.Default(), &notes); err != nil || em.Config.SlidingWindow != 16 || !strings.Contains(notes.String(), "eval: note: ") {
		t.Errorf("eval of a LLaMA config with sliding_window 16: %v, notes:\n%s", err, notes.String())
	}
	for _, c := range []struct {
		src    string
		sets   []string
		window int
		layers []int
	}{
		{src, []string{"model.sliding_window=8", "model.sliding_window_layers=[1]"}, 8, []int{1}},
		{"weights/testdata/hf/mistral-window", nil, 16, []int{}},
		{"weights/testdata/hf/mistral-window", []string{"model.sliding_window=4"}, 4, []int{}},
		{"weights/testdata/hf/mistral-window", []string{"model.sliding_window=0"}, 0, []int{}},
	} {
		var notes bytes.Buffer
		cfg, _, err := train.LoadInitConfig("configs/tiny.toml", append(slices.Clone(base), c.sets...), c.src, &notes)
		if err != nil {
			t.Fatalf("%s %v: %v", c.src, c.sets, err)
		}
		if cfg.Model.SlidingWindow != c.window || !slices.Equal(cfg.Model.SlidingWindowLayers, c.layers) {
			t.Errorf("%s %v: window %d on %v, want %d on %v", c.src, c.sets, cfg.Model.SlidingWindow, cfg.Model.SlidingWindowLayers, c.window, c.layers)
		}
		if len(c.sets) > 0 && !strings.Contains(notes.String(), "changed by the config: sliding_window") {
			t.Errorf("%s %v: the change is not reported:\n%s", c.src, c.sets, notes.String())
		}
	}
	agree := filepath.Join(t.TempDir(), "agree.toml")
	os.WriteFile(agree, []byte("[model]\ndim = 32\nn_heads = 4\nn_kv_heads = 2\nffn_dim = 64\nmax_seq_len = 512\n"), 0o644)
	if _, _, err := train.LoadInitConfig(agree, base, src, io.Discard); err != nil {
		t.Errorf("a config that agrees with the source: %v", err)
	}
	for _, c := range []struct {
		sets []string
		want []string
	}{
		{[]string{"model.dim=64"}, []string{"model.dim = 64, the source has 32"}},
		{[]string{"model.n_kv_heads=4", "model.ffn_dim=128"}, []string{"model.n_kv_heads = 4, the source has 2", "model.ffn_dim = 128, the source has 64"}},
		{[]string{"model.norm_eps=1e-6"}, []string{"model.norm_eps = 1e-06, the source has 1e-05"}},
		{[]string{"model.n_layers=4"}, []string{"model.n_layers = 4, the source has 2"}},
		{[]string{"model.vocab_size=128"}, []string{"the source's vocabulary of 256 tokens exceeds model.vocab_size = 128"}},
		{[]string{"model.vocab_size=512"}, []string{"model.vocab_size = 512, the source has 256"}},
		{[]string{"data.seq_len=1024"}, []string{"data.seq_len = 1024 exceeds model.max_seq_len = 512"}},
		{[]string{"data.tokenizer=data/testdata/tok/llama.model"}, []string{"has 1000 tokens, but the model's vocabulary has 256"}},
	} {
		_, _, err := train.LoadInitConfig("configs/tiny.toml", append(slices.Clone(base), c.sets...), src, io.Discard)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v; want %q", c.sets, err, w)
			}
		}
	}
}

// TestInitFromTokenizer: the tokenizer of an HF directory is used unless the config names one.
// The source is an export of a run trained with a SentencePiece tokenizer (1000 tokens), so
// its directory holds tokenizer.model.
func TestInitFromTokenizer(t *testing.T) {
	run := tinyCheckpoint(t, "--set", "data.tokenizer=data/testdata/tok/llama.model", "--set", "model.vocab_size=1024")
	hf := filepath.Join(t.TempDir(), "hf")
	var stdout, stderr bytes.Buffer
	if err := runExport([]string{"--model", run, "--out", hf}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	base := setsOf(initBase(t.TempDir()))
	cfg, _, err := train.LoadInitConfig("configs/tiny.toml", base, hf, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Data.Tokenizer != filepath.Join(hf, "tokenizer.model") || cfg.Model.VocabSize != 1024 {
		t.Errorf("tokenizer %q, vocab %d; want the export's tokenizer.model and 1024", cfg.Data.Tokenizer, cfg.Model.VocabSize)
	}
	cfg, _, err = train.LoadInitConfig("configs/tiny.toml", append(base, "data.tokenizer=byte"), hf, io.Discard)
	if err != nil || cfg.Data.Tokenizer != "byte" {
		t.Errorf("--set data.tokenizer=byte: %q, %v", cfg.Data.Tokenizer, err)
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
		var stdout, stderr bytes.Buffer
		err := run(append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", c.from}, initBase(out)...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--init-from %s: %v; want %q", c.from, err, c.want)
		}
		if ents, _ := os.ReadDir(out); len(ents) > 0 {
			t.Errorf("--init-from %s: wrote %d entries into run.output_dir", c.from, len(ents))
		}
	}
}

// TestInitFromResume: a run started with --init-from, stopped at step 2 and resumed with
// the same --init-from and --resume auto, ends bit-identical to the run that never stopped
// (the checkpoint's weights, moments and data position replace the source's).
func TestInitFromResume(t *testing.T) {
	const src = "weights/testdata/hf/llama-sharded"
	straight, split := t.TempDir(), t.TempDir()
	args := func(dir string, extra ...string) []string {
		a := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", src}, initBase(dir)...)
		return append(a, append([]string{"--set", "training.steps=4", "--set", "checkpoint.interval=2"}, extra...)...)
	}
	for _, a := range [][]string{args(straight), args(split, "--stop-after", "2"), args(split, "--resume", "auto")} {
		var stdout, stderr bytes.Buffer
		if err := run(a, &stdout, &stderr); err != nil {
			t.Fatalf("%v: %v\n%s", a, err, stderr.String())
		}
	}
	if err := sameState(stateOf(t, filepath.Join(straight, "tiny", "step-000004")), stateOf(t, filepath.Join(split, "tiny", "step-000004"))); err != nil {
		t.Errorf("straight vs stopped at 2 and resumed: %v", err)
	}
	if a, b := lossesOf(t, filepath.Join(straight, "tiny")), lossesOf(t, filepath.Join(split, "tiny")); fmt.Sprint(a) != fmt.Sprint(b) || len(a) != 4 {
		t.Errorf("losses %v and %v", a, b)
	}
}

// firstBatchLoss is the loss of the weights of src (read as eval reads them) on the first
// batch a run of cfg trains on, computed by one plain model.
func firstBatchLoss(t *testing.T, cfg config.Config, src string) float64 {
	t.Helper()
	em, err := weights.Load(src, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := train.NewLoader(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b := loader.Next()
	m := model.New(cfg.Model, model.CheckpointNone, kernels.NewCPU())
	m.LoadParams(em.Params)
	sum, n := m.Forward(model.Batch{IDs: b.Inputs, Targets: b.Targets, B: b.B, Pos: model.Positions(b.T)})
	return sum / float64(n)
}

// freshBatchLoss is the loss on the first batch of cfg's data of the weights a run without
// --init-from starts from.
func freshBatchLoss(t *testing.T, cfg config.Config) float64 {
	t.Helper()
	loader, err := train.NewLoader(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b := loader.Next()
	m := model.New(cfg.Model, model.CheckpointNone, kernels.NewCPU())
	m.LoadParams(model.InitParams(cfg.Model, model.NewLayout(cfg.Model), cfg.Run.Seed))
	sum, n := m.Forward(model.Batch{IDs: b.Inputs, Targets: b.Targets, B: b.B, Pos: model.Positions(b.T)})
	return sum / float64(n)
}
