package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/model"
	"distflash/weights"
)

// The tests of this file check what eval scores: Hugging Face models and distflash's own files
// against PyTorch's losses (totals and per document), eval during training against eval of the
// checkpoint, a damaged latest skipped, the evaluated model's heads checked, a replaced result
// said, and what eval refuses.

// The fixtures are written by `/usr/bin/python3 scripts/reference.py hf` (see weights/hf_test.go):
// two tiny Hugging Face LLaMA directories, five documents, and the losses PyTorch computes
// (its own LlamaForCausalLM, in float64, on exactly the stored weights) for
// `eval --seq-len 40 --samples 4` and `--seq-len 512 --samples 5`.
const (
	hfFixtures = "weights/testdata/hf"
	hfDocs     = hfFixtures + "/docs/*.txt"
)

// Tolerance against PyTorch. The reference is float64 on the same (dequantized) weights, so
// the difference is distflash's float32 arithmetic alone: measured ≤ 7.3e-9 relative on these
// losses (TestEvalMatchesPyTorch -v). 1e-5 leaves room for other summation orders and
// catches real mistakes: loading the q/k projections in Meta's layout moves the per-document
// losses by about 1%.
const tolPyTorch = 1e-5

type hfEval struct {
	SeqLen      int       `json:"seq_len"`
	Samples     int       `json:"samples"`
	Loss        float64   `json:"loss"`
	Perplexity  float64   `json:"perplexity"`
	BitsPerByte float64   `json:"bits_per_byte"`
	Tokens      int64     `json:"tokens"`
	Bytes       int64     `json:"bytes"`
	SampleLoss  []float64 `json:"sample_loss_sums"`
	SampleCount []int     `json:"sample_tokens"`
}

func readHFEvals(t *testing.T) map[string][]hfEval {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(hfFixtures, "expected.json"))
	if err != nil {
		t.Fatalf("%v (regenerate: /usr/bin/python3 scripts/reference.py hf)", err)
	}
	var e struct {
		Models map[string]struct {
			Evals []hfEval `json:"evals"`
		} `json:"models"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	out := map[string][]hfEval{}
	for name, m := range e.Models {
		out[name] = m.Evals
	}
	if len(out) != 3 {
		t.Fatalf("expected.json: %d models, want 3", len(out))
	}
	return out
}

func relDiff(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }

// TestEvalMatchesPyTorch runs the real binary on the PyTorch-written Hugging Face directories
// (two shards F32 + BF16 with an index; one F16 file with tied embeddings; a Mistral one with a
// sliding window of 16, which PyTorch applies as an explicit banded mask) and checks loss,
// perplexity, bits per byte, tokens and bytes against PyTorch, on one worker and on 4
// sequence-parallel ranks.
func TestEvalMatchesPyTorch(t *testing.T) {
	dir := t.TempDir()
	for name, evals := range readHFEvals(t) {
		for _, want := range evals {
			for _, P := range []int{1, 4} {
				t.Run(fmt.Sprintf("%s/seq%d/P%d", name, want.SeqLen, P), func(t *testing.T) {
					out := filepath.Join(dir, fmt.Sprintf("%s-%d-%d.json", name, want.SeqLen, P))
					stdout, stderr, err := distflash(t, "eval", "--model", filepath.Join(hfFixtures, name), "--data", hfDocs,
						"--samples", fmt.Sprint(want.Samples), "--seq-len", fmt.Sprint(want.SeqLen), "--out", out,
						"--set", fmt.Sprintf("parallelism.world_size=%d", P),
						"--set", fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P))
					if err != nil {
						t.Fatalf("%v\n%s", err, stderr)
					}
					raw, err := os.ReadFile(out)
					if err != nil {
						t.Fatal(err)
					}
					var got evaluate.Report
					if err := json.Unmarshal(raw, &got); err != nil {
						t.Fatal(err)
					}
					if got.Tokens != want.Tokens || got.Bytes != want.Bytes || got.Samples != want.Samples ||
						got.SeqLen != want.SeqLen || got.SequenceParallel != P || got.Source != "hf" || got.BOS != 1 {
						t.Errorf("report %+v\nwant %d tokens, %d bytes, %d samples, seq_len %d, P %d, source hf, BOS 1",
							got, want.Tokens, want.Bytes, want.Samples, want.SeqLen, P)
					}
					for _, q := range []struct {
						what      string
						got, want float64
					}{{"loss", got.Loss, want.Loss}, {"perplexity", got.Perplexity, want.Perplexity},
						{"bits_per_byte", got.BitsPerByte, want.BitsPerByte}} {
						if d := relDiff(q.got, q.want); d > tolPyTorch {
							t.Errorf("%s %.9g, PyTorch %.9g (rel diff %.2e > %g)", q.what, q.got, q.want, d, tolPyTorch)
						}
					}
					if !strings.Contains(stdout, fmt.Sprintf("loss %.6f", got.Loss)) || !strings.Contains(stdout, out) {
						t.Errorf("stdout %q", stdout)
					}
					t.Logf("loss %.9f, PyTorch %.9f: rel diff %.2e", got.Loss, want.Loss, relDiff(got.Loss, want.Loss))
				})
			}
		}
	}
}

// hfEvaluator loads a fixture model into an evaluator on P ranks running schedule attn.
func hfEvaluator(t *testing.T, name string, P int, attn string) (*evaluate.Evaluator, weights.Model) {
	t.Helper()
	cfg := config.Default()
	em, err := weights.Load(filepath.Join(hfFixtures, name), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	par := cfg.Parallelism
	par.WorldSize, par.SequenceParallelDegree, par.Attention = P, P, attn
	ev, err := evaluate.Local(em.Config, par, em.Params)
	if err != nil {
		t.Fatal(err)
	}
	return ev, em
}

func fixtureSamples(t *testing.T, em weights.Model, seqLen, n int) []evaluate.Sample {
	t.Helper()
	ss, err := evaluate.LoadSamples(hfDocs, config.Default().Data, em.Tokenizer, em.BOS, seqLen, em.Config.VocabSize, n)
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// TestEvalPerSampleMatchesPyTorch: every document's summed loss and token count equal
// PyTorch's, not only the totals.
func TestEvalPerSampleMatchesPyTorch(t *testing.T) {
	for name, evals := range readHFEvals(t) {
		ev, em := hfEvaluator(t, name, 1, "")
		for _, want := range evals {
			ss := fixtureSamples(t, em, want.SeqLen, want.Samples)
			if len(ss) != len(want.SampleLoss) {
				t.Fatalf("%s seq %d: %d samples, PyTorch %d", name, want.SeqLen, len(ss), len(want.SampleLoss))
			}
			for i, s := range ss {
				l, n, err := ev.Score(s)
				if err != nil {
					t.Fatal(err)
				}
				if n != want.SampleCount[i] || relDiff(l, want.SampleLoss[i]) > tolPyTorch {
					t.Errorf("%s seq %d doc %d: loss sum %.9g over %d tokens, PyTorch %.9g over %d", name, want.SeqLen, i, l, n, want.SampleLoss[i], want.SampleCount[i])
				}
			}
		}
	}
}

// writeSafetensorsF32 writes float32 tensors in the safetensors format.
func writeSafetensorsF32(t *testing.T, path string, names []string, values map[string][]float32, shapes map[string][]int) {
	t.Helper()
	header := map[string]any{}
	var blob []byte
	for _, n := range names {
		start := len(blob)
		for _, v := range values[n] {
			blob = binary.LittleEndian.AppendUint32(blob, math.Float32bits(v))
		}
		header[n] = map[string]any{"dtype": "F32", "shape": shapes[n], "data_offsets": []int{start, len(blob)}}
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	if err := os.WriteFile(path, append(append(out, h...), blob...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// shardedModelSets is the [model] of the llama-sharded fixture as --set overrides.
var shardedModelSets = []string{"model.dim=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
	"model.ffn_dim=64", "model.vocab_size=256", "model.norm_eps=1e-5", "model.rope_theta=10000", "model.max_seq_len=512"}

// TestEvalOwnSafetensors: the weights of the sharded fixture, written as one F32 file under
// distflash's names and evaluated with the config's [model], give the Hugging Face directory's
// loss bit for bit with the same BOS; without one (the default for distflash's own models)
// the one-byte document is skipped and the first byte of each is not predicted.
func TestEvalOwnSafetensors(t *testing.T) {
	em, err := weights.Load(filepath.Join(hfFixtures, "llama-sharded"), config.Default(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	layout := model.NewLayout(em.Config)
	var names []string
	values, shapes := map[string][]float32{}, map[string][]int{}
	for _, tn := range layout.Tensors {
		names = append(names, tn.Name)
		values[tn.Name] = em.Params[tn.Off : tn.Off+tn.Size()]
		shapes[tn.Name] = tn.Shape
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "own.safetensors")
	writeSafetensorsF32(t, path, names, values, shapes)

	evalJSON := func(extra ...string) evaluate.Report {
		t.Helper()
		out := filepath.Join(dir, "eval.json")
		args := []string{"eval", "--model", path, "--data", hfDocs, "--samples", "4", "--seq-len", "40", "--out", out, "--progress=false"}
		for _, s := range shardedModelSets {
			args = append(args, "--set", s)
		}
		if _, stderr, err := cli(t, append(args, extra...)...); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var r evaluate.Report
		readJSON(t, out, &r)
		return r
	}
	var hf evaluate.Report
	{
		out := filepath.Join(dir, "hf.json")
		if _, stderr, err := cli(t, "eval", "--model", filepath.Join(hfFixtures, "llama-sharded"), "--data", hfDocs,
			"--samples", "4", "--seq-len", "40", "--out", out); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		raw, _ := os.ReadFile(out)
		if err := json.Unmarshal(raw, &hf); err != nil {
			t.Fatal(err)
		}
	}
	with := evalJSON("--bos", "1")
	if with.Loss != hf.Loss || with.Tokens != hf.Tokens || with.Source != "safetensors" {
		t.Errorf("own safetensors with BOS 1: loss %v over %d tokens (%s); HF directory %v over %d", with.Loss, with.Tokens, with.Source, hf.Loss, hf.Tokens)
	}
	without := evalJSON()
	// Documents of 44, 107, 78, 1 and 45 bytes: the 1-byte one predicts nothing, so the
	// samples are documents 0, 1, 2 and 4, 40 predicted bytes each.
	if without.BOS != -1 || without.Tokens != 160 || without.Bytes != 160 || without.Samples != 4 {
		t.Errorf("without BOS: %+v; want BOS -1, 160 tokens and bytes, 4 samples", without)
	}
}

// TestEvalErrors: bad models, data and flags stop eval with the file, key or value named.
func TestEvalErrors(t *testing.T) {
	sharded := filepath.Join(hfFixtures, "llama-sharded")
	broken := func(edit func(dir string)) string {
		dir := t.TempDir()
		files, _ := os.ReadDir(sharded)
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(sharded, f.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		edit(dir)
		return dir
	}
	setKey := func(dir, key, value string) {
		path := filepath.Join(dir, "config.json")
		raw, _ := os.ReadFile(path)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if value == "" {
			delete(m, key)
		} else {
			m[key] = json.RawMessage(value)
		}
		b, _ := json.Marshal(m)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	notModel := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"missing config key", []string{"--model", broken(func(d string) { setKey(d, "hidden_size", "") })},
			[]string{"config.json", `"hidden_size" is missing`}},
		{"missing shard", []string{"--model", broken(func(d string) { os.Remove(filepath.Join(d, "model-00002-of-00002.safetensors")) })},
			[]string{"model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"}},
		{"shape mismatch", []string{"--model", broken(func(d string) { setKey(d, "vocab_size", "300") })},
			[]string{"model-00001-of-00002.safetensors", `"model.embed_tokens.weight"`, "[256 32]", "[300 32]"}},
		{"rope scaling", []string{"--model", broken(func(d string) { setKey(d, "rope_scaling", `{"type":"longrope","factor":2}`) })},
			[]string{"config.json", "rope_scaling.rope_type", "longrope"}},
		{"rope scaling factor", []string{"--model", broken(func(d string) { setKey(d, "rope_scaling", `{"type":"yarn","factor":2,"beta_fast":0.5}`) })},
			[]string{"config.json", "model.rope_scaling.beta_fast = 0.5 is below model.rope_scaling.beta_slow = 1"}},
		{"hidden_act", []string{"--model", broken(func(d string) { setKey(d, "hidden_act", `"gelu_pytorch_tanh"`) })},
			[]string{"config.json", `hidden_act = "gelu_pytorch_tanh"`}},
		{"not a model", []string{"--model", notModel}, []string{notModel, "nor a readable distflash checkpoint"}},
		{"no such model", []string{"--model", filepath.Join(notModel, "nope")}, []string{"nope", "no such file"}},
		{"seq-len too long", []string{"--model", sharded, "--seq-len", "1024"}, []string{"--seq-len 1024", "512"}},
		{"no data", []string{"--model", sharded, "--data", "", "--set", "data.eval="}, []string{"--data"}},
		{"missing data", []string{"--model", sharded, "--data", filepath.Join(notModel, "x.txt")}, []string{"x.txt"}},
		{"own safetensors, wrong shape", []string{"--model", "model/testdata/golden/mha.safetensors"},
			[]string{"mha.safetensors", `"model.embed_tokens.weight"`, "[61 32]", "[256 128]"}},
		{"bad bos", []string{"--model", sharded, "--bos", "first"}, []string{`--bos "first"`}},
		{"bos outside vocab", []string{"--model", sharded, "--bos", "256"}, []string{"BOS token 256", "256"}},
		{"no model", nil, []string{"--model is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"eval", "--out", filepath.Join(t.TempDir(), "e.json")}, tc.args...)
			if !slices.Contains(tc.args, "--data") {
				args = append(args, "--data", hfDocs)
			}
			_, _, err := cli(t, args...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestEvalRefusesWhatDoesNotFit: an evaluation whose samples would not fit in this machine's
// memory is refused before the model's ranks are built, naming the need, the memory available
// and the longest --seq-len that fits, and writes no result.
func TestEvalRefusesWhatDoesNotFit(t *testing.T) {
	dir := t.TempDir()
	if _, stderr, err := cli(t, "train", "--progress=false", "--set", "training.steps=1", "--set", "model.max_seq_len=100000000",
		"--set", "data.max_bytes=65536", "--set", "run.output_dir="+dir); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	out := filepath.Join(dir, "result.json")
	_, _, err := cli(t, "eval", "--model", filepath.Join(dir, "tiny"), "--seq-len", "50000000", "--data", "weights/testdata/hf/docs",
		"--out", out, "--progress=false")
	if err == nil {
		t.Fatal("a 50M-token evaluation was not refused")
	}
	for _, want := range []string{"needs", "available", "the longest --seq-len that fits is"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q: %v", want, err)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the refused evaluation wrote %s: %v", out, err)
	}
}

// TestEvalDuringTrainingAndOfCheckpoint: eval.interval evaluates on data.eval during training
// (logged, and in metrics.jsonl), and `distflash eval` of the checkpoint saved at that step
// gives the same loss, from the checkpoint's own weights, through the real binary.
func TestEvalDuringTrainingAndOfCheckpoint(t *testing.T) {
	dir := t.TempDir()
	out := mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=4", "--set", "eval.interval=4",
		"--set", "data.eval=$GOROOT/src/strings", "--set", "eval.samples=3")
	if !strings.Contains(out, "eval step 4: loss") || !strings.Contains(out, "eval step 8: loss") {
		t.Fatalf("no eval lines in the log:\n%s", out)
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if ms[3].EvalLoss == 0 || ms[7].EvalLoss == 0 || ms[4].EvalLoss != 0 {
		t.Fatalf("eval_loss in metrics at steps 4 and 8 only: %v %v %v", ms[3].EvalLoss, ms[4].EvalLoss, ms[7].EvalLoss)
	}
	res := filepath.Join(dir, "eval.json")
	b, err := command("eval", "--model", filepath.Join(dir, "tiny", "step-000004"),
		"--data", "$GOROOT/src/strings", "--samples", "3", "--out", res).CombinedOutput()
	if err != nil {
		t.Fatalf("eval of the checkpoint: %v\n%s", err, b)
	}
	var r evaluate.Result
	raw, err := os.ReadFile(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.Loss-ms[3].EvalLoss) > 1e-9*ms[3].EvalLoss {
		t.Errorf("eval of step-000004: loss %.9f, eval during training at step 4: %.9f", r.Loss, ms[3].EvalLoss)
	}
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

// TestEvalSaysWhatItReplaces: an eval whose default --out holds an eval of other data says that
// it replaces it; the same eval again does not.
func TestEvalSaysWhatItReplaces(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=1")...)
	evalOn := func(data string) string {
		out, code := output(t, "eval", "--model", run, "--data", data, "--samples", "2", "--seq-len", "64")
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

// TestEvalDamagedWeights (issue 33, item 4): a NaN in an HF directory's q_proj, which used to
// give a finite loss and generated text, is refused by eval and generate naming the tensor
// and where in it, before anything is run and with no result file; weights that are finite
// but overflow the arithmetic give a result said to be not a finite number, in the text and
// as null (named in "non_finite") in the JSON, instead of failing to write it.
func TestEvalDamagedWeights(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(hfFixtures, "llama-tied", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "model.safetensors" {
			n := binary.LittleEndian.Uint64(b)
			var header map[string]struct {
				DType   string `json:"dtype"`
				Offsets []int  `json:"data_offsets"`
			}
			if err := json.Unmarshal(b[8:8+n], &header); err != nil {
				t.Fatal(err)
			}
			q := header["model.layers.0.self_attn.q_proj.weight"]
			if q.DType != "F16" {
				t.Fatalf("the fixture's q_proj is %s, want F16", q.DType)
			}
			binary.LittleEndian.PutUint16(b[8+int(n)+q.Offsets[0]+2*5:], 0x7e00) // an F16 NaN at row 0, column 5
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := filepath.Join(t.TempDir(), "result.json")
	for _, args := range [][]string{
		{"eval", "--model", dir, "--data", hfDocs, "--samples", "2", "--seq-len", "40", "--out", res, "--progress=false"},
		{"generate", "--model", dir, "--prompt", "Once upon", "--max-new-tokens", "4", "--stream=false", "--out", res},
	} {
		out := mustFail(t, args, "model.layers.0.self_attn.q_proj.weight", "holds NaN at index ", ", column 5)",
			"the weights are damaged", "nothing was run on them")
		if strings.Contains(out, "loss") || fileExists(res) {
			t.Errorf("%s of damaged weights reported a loss or wrote %s:\n%s", args[0], res, out)
		}
	}

	// Finite weights whose products overflow float32: the final norm's and the output
	// projection's at 1e20 make logits of about ±1e40, infinite.
	path := sourceSafetensors(t, func(name string, v []float32) {
		if name == "model.norm.weight" || name == "lm_head.weight" {
			for i := range v {
				v[i] = 1e20
			}
		}
	})
	args := []string{"eval", "--model", path, "--data", hfDocs, "--samples", "2", "--seq-len", "40", "--out", res, "--progress=false"}
	for _, s := range shardedModelSets {
		args = append(args, "--set", s)
	}
	out, code := output(t, args...)
	if code != 0 || !strings.Contains(out, "loss, perplexity, bits_per_byte not a finite number: the model's arithmetic overflowed") {
		t.Errorf("eval of overflowing weights (exit %d) does not say its loss is not a finite number:\n%s", code, out)
	}
	var m map[string]any
	readJSON(t, res, &m)
	if v, ok := m["loss"]; !ok || v != nil || !strings.Contains(fmt.Sprint(m["non_finite"]), "loss") {
		t.Errorf("the JSON of a non-finite result: loss %v (present %v), non_finite %v; want loss null and named", v, ok, m["non_finite"])
	}
}
