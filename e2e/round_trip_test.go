package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distflash/config"
	"distflash/evaluate"
	"distflash/model"
	"distflash/train"
	"distflash/weights"
	"distflash/weights/safetensors"
)

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
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("eval %s: %v\n%s", modelPath, err, stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r evaluate.Report
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// exportTo runs `export` and returns its stdout.
func exportTo(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(append([]string{"export"}, args...), &stdout, &stderr); err != nil {
		t.Fatalf("export %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
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
		var stdout, stderr bytes.Buffer
		err := runExport(c.args, &stdout, &stderr)
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
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "sliding_window = 16") {
		t.Errorf("init does not say the window came from the source:\n%s", stderr.String())
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
	err = run([]string{"export", "--model", layered, "--out", refused}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "model.sliding_window = 8 leaves layers [1] of 2 without the window") {
		t.Errorf("export of a model windowed on layer 0 of 2: %v", err)
	}
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Errorf("the refused export left %s: %v", refused, err)
	}
}
