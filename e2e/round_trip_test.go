package e2e

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
	"distflash/evaluate"
	"distflash/kernels"
	"distflash/model"
	"distflash/train"
	"distflash/weights"
	"distflash/weights/safetensors"
)

// The tests of this file check models in and out: a checkpoint exported to Hugging Face's format
// (f32, bf16, sharded, a SentencePiece tokenizer, every RoPE scaling, Mistral's window) holds and
// evaluates to the checkpoint's weights and loss, the committed exports match what PyTorch read,
// and train --init-from every kind of source starts from exactly its weights.

// testdata/export holds a tiny model trained by distflash and exported twice (f32 in one
// file; bf16 in two shards with an index), and the losses PyTorch computes from those files
// with its own safetensors reader (scripts/export_fixture.sh, scripts/reference.py read-hf).
const exportFixtures = "testdata/export"

// evalReportOf runs `eval` on model (extra flags after) over the HF fixture documents and
// returns its report.
func evalReportOf(t *testing.T, modelPath string, seqLen int, extra ...string) evaluate.Report {
	t.Helper()
	out := filepath.Join(t.TempDir(), "eval.json")
	args := append([]string{"eval", "--model", modelPath, "--data", hfDocs, "--samples", "5",
		"--seq-len", fmt.Sprint(seqLen), "--out", out, "--progress=false"}, extra...)
	if _, stderr, err := cli(t, args...); err != nil {
		t.Fatalf("eval %s: %v\n%s", modelPath, err, stderr)
	}
	var r evaluate.Report
	readJSON(t, out, &r)
	return r
}

// exportTo runs `export` and returns its stdout.
func exportTo(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := cli(t, append([]string{"export"}, args...)...)
	if err != nil {
		t.Fatalf("export %v: %v\n%s", args, err, stderr)
	}
	return stdout
}

// hfParams reads the weights of an HF directory as eval does (model.NewLayout order).
func hfParams(t *testing.T, dir string) (model.Config, []float32) {
	t.Helper()
	em, err := weights.Load(dir, config.Default(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return em.Config, em.Params
}

// TestExportEvalRoundTrip: a trained checkpoint exported in f32 (one file, and sharded)
// holds exactly the checkpoint's weights and evaluates to exactly the checkpoint's loss; in
// bf16 every weight is the checkpoint's rounded to nearest even and the loss stays within
// bf16's precision. The export's config.json has every field transformers reads.
func TestExportEvalRoundTrip(t *testing.T) {
	run := tinyCheckpoint(t)
	_, want, _, _, err := weights.LoadCheckpoint(run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ref := evalReportOf(t, run, 128)
	dir := t.TempDir()
	for _, c := range []struct {
		name  string
		args  []string
		files int
	}{
		{"f32", nil, 2},
		{"f32-sharded", []string{"--max-shard-size", "30KB"}, 7},
		{"bf16", []string{"--dtype", "bf16", "--max-shard-size", "40KB"}, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, c.name)
			msg := exportTo(t, append([]string{"--model", run, "--out", out}, c.args...)...)
			if !strings.Contains(msg, "no Hugging Face tokenizer file") {
				t.Errorf("export does not say the byte tokenizer has no file: %q", msg)
			}
			ents, _ := os.ReadDir(out)
			if len(ents) != c.files {
				t.Errorf("%d files, want %d: %v", len(ents), c.files, ents)
			}
			mc, got := hfParams(t, out)
			if len(got) != len(want) {
				t.Fatalf("%d weights, the checkpoint has %d", len(got), len(want))
			}
			bf16 := strings.HasPrefix(c.name, "bf16")
			for i := range want {
				w := want[i]
				if bf16 {
					w = math.Float32frombits(uint32(safetensors.BF16Bits(w)) << 16)
				}
				if math.Float32bits(got[i]) != math.Float32bits(w) {
					t.Fatalf("weight %d: %v, want %v", i, got[i], w)
				}
			}
			if mc.Dim != 32 || mc.NLayers != 2 || mc.MaxSeqLen != 256 || mc.NKVHeads != 2 {
				t.Errorf("model from config.json %+v", mc)
			}
			r := evalReportOf(t, out, 128)
			if r.Source != "hf" || r.BOS != -1 || r.Tokens != ref.Tokens || r.Tokenizer != "byte" {
				t.Errorf("eval of the export: source %s, BOS %d, %d tokens, tokenizer %s; want hf, -1, %d, byte", r.Source, r.BOS, r.Tokens, r.Tokenizer, ref.Tokens)
			}
			if bf16 {
				if d := relDiff(r.Loss, ref.Loss); d > 1e-3 || d == 0 {
					t.Errorf("bf16 loss %.9g, checkpoint %.9g (rel %.1e: want (0, 1e-3])", r.Loss, ref.Loss, d)
				}
				t.Logf("bf16 export: loss %.9g vs checkpoint %.9g (rel %.1e)", r.Loss, ref.Loss, relDiff(r.Loss, ref.Loss))
			} else if math.Float64bits(r.Loss) != math.Float64bits(ref.Loss) {
				t.Errorf("loss %.17g, checkpoint %.17g: want bit-identical", r.Loss, ref.Loss)
			}
			var cfg map[string]any
			raw, _ := os.ReadFile(filepath.Join(out, "config.json"))
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			for key, v := range map[string]any{"model_type": "llama", "hidden_act": "silu", "tie_word_embeddings": false,
				"attention_bias": false, "mlp_bias": false, "hidden_size": 32.0, "intermediate_size": 64.0,
				"num_hidden_layers": 2.0, "num_attention_heads": 4.0, "num_key_value_heads": 2.0, "head_dim": 8.0,
				"vocab_size": 256.0, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256.0,
				"rope_scaling": nil, "bos_token_id": nil, "eos_token_id": nil,
				"torch_dtype": map[bool]string{false: "float32", true: "bfloat16"}[bf16]} {
				if got, ok := cfg[key]; !ok || fmt.Sprint(got) != fmt.Sprint(v) {
					t.Errorf("config.json %s = %v (present %v), want %v", key, got, ok, v)
				}
			}
			if a, _ := cfg["architectures"].([]any); len(a) != 1 || a[0] != "LlamaForCausalLM" {
				t.Errorf("architectures %v", cfg["architectures"])
			}
		})
	}
	// The export is a model to start from, too: --init-from it gives the checkpoint's weights.
	cfg, params, err := train.LoadInitConfig("configs/tiny.toml", setsOf(initBase(t.TempDir())), filepath.Join(dir, "f32"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model.Dim != 32 || len(params) != len(want) || math.Float32bits(params[len(params)-1]) != math.Float32bits(want[len(want)-1]) {
		t.Errorf("--init-from the export: dim %d, %d weights", cfg.Model.Dim, len(params))
	}
}

// TestExportTokenizer: a run trained with a SentencePiece tokenizer exports its
// tokenizer.model and the tokenizer's BOS and EOS ids; eval of the export reads that
// tokenizer and, without the BOS that distflash's runs do not train with, gives exactly the
// checkpoint's loss.
func TestExportTokenizer(t *testing.T) {
	run := tinyCheckpoint(t, "--set", "data.tokenizer=data/testdata/tok/llama.model", "--set", "model.vocab_size=1024")
	out := filepath.Join(t.TempDir(), "hf")
	msg := exportTo(t, "--model", run, "--out", out)
	if strings.Contains(msg, "no Hugging Face tokenizer file") || !strings.Contains(msg, "tokenizer.model") {
		t.Errorf("export output %q", msg)
	}
	a, _ := os.ReadFile("data/testdata/tok/llama.model")
	b, err := os.ReadFile(filepath.Join(out, "tokenizer.model"))
	if err != nil || !bytes.Equal(a, b) {
		t.Errorf("tokenizer.model not copied: %v", err)
	}
	raw, _ := os.ReadFile(filepath.Join(out, "config.json"))
	var cfg struct {
		BOS *int `json:"bos_token_id"`
		EOS *int `json:"eos_token_id"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.BOS == nil || *cfg.BOS != 1 || cfg.EOS == nil || *cfg.EOS != 2 {
		t.Errorf("bos/eos in config.json: %v %v, want 1 2", cfg.BOS, cfg.EOS)
	}
	ref := evalReportOf(t, run, 64)
	r := evalReportOf(t, out, 64, "--bos", "none")
	if r.Tokenizer != filepath.Join(out, "tokenizer.model") || math.Float64bits(r.Loss) != math.Float64bits(ref.Loss) {
		t.Errorf("eval of the export: tokenizer %s loss %.17g; checkpoint %.17g", r.Tokenizer, r.Loss, ref.Loss)
	}
	if r := evalReportOf(t, out, 64); r.BOS != 1 {
		t.Errorf("eval of the export with --bos auto: BOS %d, want config.json's 1", r.BOS)
	}
}

type referenceLoss struct {
	Loss    float64 `json:"loss"`
	Tokens  int64   `json:"tokens"`
	Samples int     `json:"samples"`
	SeqLen  int     `json:"seq_len"`
}

// TestExportFixtureMatchesPyTorch: the committed exports evaluate to the loss PyTorch
// computed from their files (float64, its own safetensors reader): distflash's export means
// to an independent reader what it means to distflash. Measured rel diff: 1.4e-10 (f32),
// 1.1e-9 (bf16); tolPyTorch is 1e-5.
func TestExportFixtureMatchesPyTorch(t *testing.T) {
	for _, d := range []string{"f32", "bf16"} {
		raw, err := os.ReadFile(filepath.Join(exportFixtures, d+".reference.json"))
		if err != nil {
			t.Fatalf("%v (regenerate: sh scripts/export_fixture.sh)", err)
		}
		var want referenceLoss
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		for _, P := range []int{1, 4} {
			r := evalReportOf(t, filepath.Join(exportFixtures, d), want.SeqLen,
				"--set", fmt.Sprintf("parallelism.world_size=%d", P), "--set", fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P))
			if r.Tokens != want.Tokens || r.Samples != want.Samples {
				t.Errorf("%s P=%d: %d tokens of %d samples, PyTorch %d of %d", d, P, r.Tokens, r.Samples, want.Tokens, want.Samples)
			}
			if diff := relDiff(r.Loss, want.Loss); diff > tolPyTorch {
				t.Errorf("%s P=%d: loss %.12g, PyTorch %.12g (rel %.1e > %g)", d, P, r.Loss, want.Loss, diff, tolPyTorch)
			} else {
				t.Logf("%s P=%d: loss %.12g, PyTorch %.12g (rel %.1e)", d, P, r.Loss, want.Loss, diff)
			}
		}
	}
}

// TestExportWritesFixtureBytes: export today writes the committed fixtures byte for byte
// (from the f32 fixture's weights, which are the checkpoint's), so what PyTorch read is what
// the exporter writes.
func TestExportWritesFixtureBytes(t *testing.T) {
	mc, params := hfParams(t, filepath.Join(exportFixtures, "f32"))
	ts := weights.Tensors(mc, params)
	for _, c := range []struct {
		dir, dtype string
		shard      int64
	}{{"f32", safetensors.DTypeF32, 5e9}, {"bf16", safetensors.DTypeBF16, 40e3}} {
		cfgJSON, err := weights.ExportConfig(weights.HFConfigOf(mc), c.dtype, -1, -1)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), c.dir)
		files, err := weights.WriteHF(out, weights.HFExport{Config: cfgJSON, Tensors: ts, DType: c.dtype, MaxShardSize: c.shard})
		if err != nil {
			t.Fatal(err)
		}
		committed, _ := os.ReadDir(filepath.Join(exportFixtures, c.dir))
		if len(committed) != len(files) {
			t.Errorf("%s: wrote %v, the fixture has %d files", c.dir, files, len(committed))
		}
		for _, f := range files {
			a, err := os.ReadFile(filepath.Join(exportFixtures, c.dir, f))
			if err != nil {
				t.Errorf("%s: %v", c.dir, err)
				continue
			}
			b, _ := os.ReadFile(filepath.Join(out, f))
			if !bytes.Equal(a, b) {
				t.Errorf("%s/%s differs from the committed file (regenerate: sh scripts/export_fixture.sh)", c.dir, f)
			}
		}
	}
}

// TestExportConfigRopeScaling: config.json carries [model.rope_scaling] under Hugging Face's
// names, and null when there is none ("" or "none").
func TestExportConfigRopeScaling(t *testing.T) {
	mc := model.DefaultConfig()
	if err := mc.Resolve(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rs   model.RopeScaling
		want string
	}{
		{model.RopeScaling{}, `"rope_scaling": null`},
		{model.RopeScaling{Type: "none", Factor: 2}, `"rope_scaling": null`},
		{model.RopeScaling{Type: "linear", Factor: 4}, `"rope_scaling": {"factor": 4, "rope_type": "linear"}`},
		{model.RopeScaling{Type: "llama3", Factor: 8, OriginalMaxPositionEmbeddings: 8192, LowFreqFactor: 1, HighFreqFactor: 4},
			`"rope_scaling": {"factor": 8, "high_freq_factor": 4, "low_freq_factor": 1, "original_max_position_embeddings": 8192, "rope_type": "llama3"}`},
	} {
		mc.RopeScaling = c.rs
		js, err := weights.ExportConfig(weights.HFConfigOf(mc), safetensors.DTypeF32, -1, -1)
		if err != nil {
			t.Fatal(err)
		}
		flat := strings.Join(strings.Fields(string(js)), " ")
		flat = strings.NewReplacer("{ ", "{", " }", "}").Replace(flat)
		if !strings.Contains(flat, c.want) {
			t.Errorf("%+v: config.json %s\nwant %s", c.rs, flat, c.want)
		}
	}
}

// TestExportRopeScalingRoundTrip trains a model under each rope scaling for 2 steps at 4× its
// pretrained length, exports it and evaluates both: the Hugging Face directory reads back the
// same model (shape, rope_scaling, context length) and gives the checkpoint's loss bit for bit
// at the long length, which only holds if the exported config computes the same RoPE table.
func TestExportRopeScalingRoundTrip(t *testing.T) {
	for _, c := range [][]string{
		{"model.rope_theta=40000"},
		{"model.rope_scaling.type=linear", "model.rope_scaling.factor=4"},
		{"model.rope_scaling.type=dynamic", "model.rope_scaling.factor=4"},
		{"model.rope_scaling.type=yarn", "model.rope_scaling.factor=4", "model.rope_scaling.beta_fast=16"},
		{"model.rope_scaling.type=llama3", "model.rope_scaling.factor=4", "model.rope_scaling.low_freq_factor=1",
			"model.rope_scaling.high_freq_factor=4"},
	} {
		t.Run(c[0], func(t *testing.T) {
			var extra []string
			for _, s := range c {
				extra = append(extra, "--set", s)
			}
			run := tinyCheckpoint(t, extra...)
			out := filepath.Join(t.TempDir(), "hf")
			exportTo(t, "--model", run, "--out", out)
			ref := evalReportOf(t, run, 200)
			got := evalReportOf(t, out, 200)
			if got.Loss != ref.Loss || got.Tokens != ref.Tokens {
				t.Errorf("exported: loss %v over %d tokens, the checkpoint %v over %d", got.Loss, got.Tokens, ref.Loss, ref.Tokens)
			}
			mc, _ := hfParams(t, out)
			want := config.Default()
			for _, s := range append(setsOf(extra), "model.dim=32", "model.n_layers=2", "model.ffn_dim=64", "model.max_seq_len=256") {
				if err := want.Set(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := want.Model.Resolve(); err != nil {
				t.Fatal(err)
			}
			if mc.RopeScaling != want.Model.RopeScaling || mc.RopeTheta != want.Model.RopeTheta || mc.MaxSeqLen != want.Model.MaxSeqLen {
				t.Errorf("read back: rope_theta %g, %+v, max_seq_len %d; want %g, %+v, %d", mc.RopeTheta, mc.RopeScaling, mc.MaxSeqLen,
					want.Model.RopeTheta, want.Model.RopeScaling, want.Model.MaxSeqLen)
			}
		})
	}
}

// TestExportMistralRoundTrip: a Mistral model (a sliding window on every layer) goes through
// --init-from, training and export and comes back the same. The run takes the source's window
// (its first loss is the windowed model's on that batch); the export's config.json is a
// MistralForCausalLM with the window; the export evaluates to exactly the checkpoint's loss on
// one rank and to 1e-6 on four, and the same weights without the window give another loss, so
// the window is what travelled. A model windowed on some layers only is refused, nothing
// written.
func TestExportMistralRoundTrip(t *testing.T) {
	const src = "weights/testdata/hf/mistral-window" // sliding_window 16
	dir := t.TempDir()
	args := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", src},
		append(initBase(dir), "--set", "training.steps=2", "--set", "checkpoint.interval=2")...)
	_, stderr, err := cli(t, args...)
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "sliding_window = 16") {
		t.Errorf("init does not say the window came from the source:\n%s", stderr)
	}
	cfg, _, err := train.LoadInitConfig("configs/tiny.toml", setsOf(args), src, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if want := firstBatchLoss(t, cfg, src); len(ms) != 2 || relDiff(ms[0].Loss, want) > 1e-6 {
		t.Errorf("metrics %+v: want 2 steps, the first of loss %.9g (the windowed source's)", ms, want)
	}
	runDir := filepath.Join(dir, "tiny")
	saved, _, _, _, err := weights.LoadCheckpoint(runDir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if saved.Model.SlidingWindow != 16 || len(saved.Model.SlidingWindowLayers) != 0 {
		t.Fatalf("checkpoint's [model]: sliding_window %d on %v, want 16 on every layer", saved.Model.SlidingWindow, saved.Model.SlidingWindowLayers)
	}
	ref := evalReportOf(t, runDir, 128)

	out := filepath.Join(t.TempDir(), "mistral")
	if msg := exportTo(t, "--model", runDir, "--out", out); !strings.Contains(msg, "(MistralForCausalLM, ") {
		t.Errorf("export says %q, want MistralForCausalLM", msg)
	}
	raw, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hc map[string]any
	if err := json.Unmarshal(raw, &hc); err != nil {
		t.Fatal(err)
	}
	if a, _ := hc["architectures"].([]any); hc["model_type"] != "mistral" || hc["sliding_window"] != 16.0 || len(a) != 1 || a[0] != "MistralForCausalLM" {
		t.Errorf("config.json: model_type %v, sliding_window %v, architectures %v", hc["model_type"], hc["sliding_window"], hc["architectures"])
	}
	if r := evalReportOf(t, out, 128); math.Float64bits(r.Loss) != math.Float64bits(ref.Loss) || r.Tokens != ref.Tokens {
		t.Errorf("export: loss %.17g over %d tokens, checkpoint %.17g over %d: want bit-identical", r.Loss, r.Tokens, ref.Loss, ref.Tokens)
	}
	r4 := evalReportOf(t, out, 128, "--set", "parallelism.world_size=4", "--set", "parallelism.sequence_parallel_degree=4")
	if d := relDiff(r4.Loss, ref.Loss); d > 1e-6 {
		t.Errorf("export on 4 ranks: loss %.9g, checkpoint %.9g (rel %.1e)", r4.Loss, ref.Loss, d)
	}
	// the same weights as a LLaMA, without the window
	delete(hc, "sliding_window")
	hc["model_type"], hc["architectures"] = "llama", []string{"LlamaForCausalLM"}
	js, _ := json.Marshal(hc)
	if err := os.WriteFile(filepath.Join(out, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := evalReportOf(t, out, 128); relDiff(r.Loss, ref.Loss) < 1e-4 {
		t.Errorf("without the window the loss is %.9g, with it %.9g: the test proves nothing", r.Loss, ref.Loss)
	}

	layered := tinyCheckpoint(t, "--set", "model.sliding_window=8", "--set", "model.sliding_window_layers=[0]")
	refused := filepath.Join(t.TempDir(), "out")
	_, _, err = cli(t, "export", "--model", layered, "--out", refused)
	if err == nil || !strings.Contains(err.Error(), "model.sliding_window = 8 leaves layers [1] of 2 without the window") {
		t.Errorf("export of a model windowed on layer 0 of 2: %v", err)
	}
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Errorf("the refused export left %s: %v", refused, err)
	}
}

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
	if _, stderr, err := cli(t, args...); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	return filepath.Join(dir, "src")
}

// sourceSafetensors writes the weights of the HF fixture llama-sharded as one F32
// .safetensors file with distflash's names; edit, when not nil, may change each tensor's
// values first.
func sourceSafetensors(t *testing.T, edit func(name string, v []float32)) string {
	t.Helper()
	em, err := weights.Load("weights/testdata/hf/llama-sharded", config.Default(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ts := weights.Tensors(em.Config, em.Params)
	if edit != nil {
		for _, x := range ts {
			edit(x.Name, x.Data)
		}
	}
	path := filepath.Join(t.TempDir(), "weights.safetensors")
	if err := safetensors.Write(path, ts, safetensors.DTypeF32, nil); err != nil {
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
		{"safetensors", sourceSafetensors(t, nil)},
		{"checkpoint", ckptDir},
		{"checkpoint", filepath.Join(ckptDir, "step-000003")},
	} {
		t.Run(src.kind+"/"+filepath.Base(src.path), func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", src.path,
				"--set", "checkpoint.interval=1"}, initBase(dir)...)
			_, stderr, err := cli(t, args...)
			if err != nil {
				t.Fatalf("train: %v\n%s", err, stderr)
			}
			if !strings.Contains(stderr, "init: ") || !strings.Contains(stderr, "("+src.kind+", ") {
				t.Errorf("stderr does not report the init:\n%s", stderr)
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
	if em, err := weights.Load(llamaWindow, config.Default(), &notes); err != nil || em.Config.SlidingWindow != 16 || !strings.HasPrefix(notes.String(), "note: ") {
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
	if _, stderr, err := cli(t, "export", "--model", run, "--out", hf); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
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
