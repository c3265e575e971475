package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"distflash/data"
	"distflash/evaluate"
)

// The tests of this file check the long-context tools through the binary: generate (PyTorch's
// tokens on 1 and 4 ranks), eval --positions and --task passkey (the same on 1 and 4 ranks), and
// a small version of the README's worked example of context extension.

// ranksFlags are the --set flags of P sequence-parallel ranks running schedule attn.
func ranksFlags(P int, attn string) []string {
	return []string{"--set", "parallelism.world_size=" + strconv.Itoa(P), "--set", "parallelism.sequence_parallel_degree=" + strconv.Itoa(P),
		"--set", "parallelism.attention=" + attn}
}

// checkPNG fails unless path is a PNG picture.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}

// TestGenerateCommand: `generate` on one rank and on 4 (zigzag, the cache sharded) writes
// PyTorch's greedy tokens for the mistral fixture (a window of 16 the prompt outgrows), says
// the prefill's and the decoding's tokens/s and, on 4 ranks, the bytes per token by call site;
// sampling with a seed repeats; bad flags are refused by name.
func TestGenerateCommand(t *testing.T) {
	raw, err := os.ReadFile("weights/testdata/hf/generate.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Cases []struct {
			Model, Prompt string
			Tokens        []int32
		}
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	c := ref.Cases[11] // mistral-window, the 52-byte prompt
	if c.Model != "mistral-window" || len(c.Prompt) < 40 {
		t.Fatalf("case 11 is %s %q", c.Model, c.Prompt)
	}
	dir := t.TempDir()
	var texts []string
	for _, P := range []int{1, 4} {
		out := filepath.Join(dir, "gen"+strconv.Itoa(P)+".json")
		stdout, stderr := succeed(t, append([]string{"generate", "--model", "weights/testdata/hf/mistral-window", "--prompt", c.Prompt,
			"--max-new-tokens", "24", "--out", out}, ranksFlags(P, "zigzag")...)...)
		var got struct {
			Samples []struct {
				Text   string  `json:"text"`
				Tokens []int32 `json:"tokens"`
			} `json:"samples"`
		}
		b, _ := os.ReadFile(out)
		if err := json.Unmarshal(b, &got); err != nil || len(got.Samples) != 1 {
			t.Fatalf("P=%d: %s: %v", P, out, err)
		}
		if !slices.Equal(got.Samples[0].Tokens, c.Tokens) {
			t.Errorf("P=%d: tokens %v, PyTorch %v", P, got.Samples[0].Tokens, c.Tokens)
		}
		text := make([]byte, len(c.Tokens)) // the byte tokenizer: a token is a byte
		for i, tok := range c.Tokens {
			text[i] = byte(tok)
		}
		if stdout != string(text)+"\n" {
			t.Errorf("P=%d: stdout %q, the tokens' bytes %q", P, stdout, text)
		}
		if !strings.Contains(stderr, "prefill 53 tokens in") || !strings.Contains(stderr, "decoding 23 tokens in") {
			t.Errorf("P=%d: stderr lacks the prefill's and the decoding's rates:\n%s", P, stderr)
		}
		if (P > 1) != strings.Contains(stderr, "decode.attn") {
			t.Errorf("P=%d: bytes per token by site:\n%s", P, stderr)
		}
		texts = append(texts, stdout)
	}
	if texts[0] != texts[1] {
		t.Errorf("1 rank wrote %q, 4 ranks %q", texts[0], texts[1])
	}
	sampled := func() string {
		s, _ := succeed(t, "generate", "--model", "weights/testdata/hf/llama-sharded", "--prompt", "Once upon", "--max-new-tokens", "16",
			"--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--seed", "7", "--samples", "2")
		return s
	}
	if a, b := sampled(), sampled(); a != b || strings.Count(a, "--- sample") != 2 {
		t.Errorf("two runs with seed 7: %q and %q", a, b)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "a", "--prompt-file", "x"}, "not both"},
		{[]string{"--prompt", "a", "--max-new-tokens", "600"}, "exceed the model's longest sequence, 512"},
		{[]string{"--prompt", "a", "--temperature", "-1"}, "--temperature -1"},
		{[]string{"--prompt", "a", "--top-p", "2"}, "--top-p 2"},
		{[]string{"--prompt-file", filepath.Join(dir, "missing")}, "--prompt-file"},
	} {
		_, _, err := cli(t, append([]string{"generate", "--model", "weights/testdata/hf/llama-sharded"}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("generate %v: %v, want %q", bad.args, err, bad.want)
		}
	}
}

// TestEvalPositionsCommand: `eval --positions` gives the same buckets on 1 and 4 ranks (1e-6),
// their tokens add up to the evaluated ones, the picture is drawn, and `plot --positions`
// overlays two reports.
func TestEvalPositionsCommand(t *testing.T) {
	dir := t.TempDir()
	var reps []evaluate.Report
	for _, P := range []int{1, 4} {
		out, pic := filepath.Join(dir, "pos"+strconv.Itoa(P)+".json"), filepath.Join(dir, "pos"+strconv.Itoa(P)+".png")
		stdout, _ := succeed(t, append([]string{"eval", "--model", "weights/testdata/hf/llama-tied", "--data", hfDocs, "--seq-len", "512",
			"--positions", "--plot", pic, "--out", out}, ranksFlags(P, "ring")...)...)
		if !strings.Contains(stdout, "eval: positions [0, 64): loss") {
			t.Errorf("P=%d: stdout lacks the buckets:\n%s", P, stdout)
		}
		checkPNG(t, pic)
		var r evaluate.Report
		b, _ := os.ReadFile(out)
		if err := json.Unmarshal(b, &r); err != nil || r.Positions == nil || r.Scoring != "truncate" {
			t.Fatalf("P=%d: report %v %+v", P, err, r)
		}
		var n int64
		for _, k := range r.Positions.Tokens {
			n += k
		}
		if n != r.Tokens || len(r.Positions.Lo) < 2 {
			t.Errorf("P=%d: buckets %v hold %d tokens of %d", P, r.Positions.Lo, n, r.Tokens)
		}
		reps = append(reps, r)
	}
	for i := range reps[0].Positions.Loss {
		a, b := reps[0].Positions.Loss[i], reps[1].Positions.Loss[i]
		if math.Abs(a-b) > 1e-6*math.Abs(a) {
			t.Errorf("bucket %d: 1 rank %g, 4 ranks %g", i, a, b)
		}
	}
	pic := filepath.Join(dir, "both.png")
	succeed(t, "plot", "--positions", filepath.Join(dir, "pos1.json"), filepath.Join(dir, "pos4.json"), "--out", pic)
	checkPNG(t, pic)
	if _, _, err := cli(t, "eval", "--model", "weights/testdata/hf/llama-tied", "--data", hfDocs, "--plot", pic); err == nil ||
		!strings.Contains(err.Error(), "--plot draws --task passkey or --positions") {
		t.Errorf("--plot without a picture to draw: %v", err)
	}
}

// TestEvalPasskeyCommand: `eval --task passkey` runs both scorings on 1 and 4 ranks with the
// same trials and answers, writes the report and the heat map; a length past the model is
// refused by name.
func TestEvalPasskeyCommand(t *testing.T) {
	dir := t.TempDir()
	var reps []evaluate.PasskeyReport
	for _, P := range []int{1, 4} {
		out, pic := filepath.Join(dir, "pk"+strconv.Itoa(P)+".json"), filepath.Join(dir, "pk"+strconv.Itoa(P)+".png")
		stdout, _ := succeed(t, append([]string{"eval", "--model", "weights/testdata/hf/llama-sharded", "--task", "passkey",
			"--lengths", "300,400", "--trials", "3", "--depth-bins", "3", "--plot", pic, "--out", out}, ranksFlags(P, "distflash")...)...)
		if !strings.Contains(stdout, "eval: passkey 400 tokens: generated") {
			t.Errorf("P=%d: stdout:\n%s", P, stdout)
		}
		checkPNG(t, pic)
		var r evaluate.PasskeyReport
		b, _ := os.ReadFile(out)
		if err := json.Unmarshal(b, &r); err != nil || r.Task != "passkey" || len(r.Passkey.Records) != 6 || r.SequenceParallel != P {
			t.Fatalf("P=%d: report %v %+v", P, err, r)
		}
		reps = append(reps, r)
	}
	if !slices.Equal(reps[0].Passkey.Records, reps[1].Passkey.Records) {
		t.Errorf("1 rank %+v\n4 ranks %+v", reps[0].Passkey.Records, reps[1].Passkey.Records)
	}
	if _, _, err := cli(t, "eval", "--model", "weights/testdata/hf/llama-sharded", "--task", "passkey", "--lengths", "1K"); err == nil ||
		!strings.Contains(err.Error(), "--lengths 1024 exceeds the model's longest sequence, 512") {
		t.Errorf("a length past the model's 512: %v", err)
	}
}

// writeLongDocs writes the documents that `python3 scripts/longdocs.py --src src --out out --docs
// n --period period --repeats repeats` writes (its JSON may escape differently): each is a
// period-byte ASCII piece of a *.go file under src, repeated, so that from byte period on every
// byte equals the one period bytes back. An out ending in .jsonl gets one JSON object a line,
// another out a new directory of text files 00000.txt, 00001.txt...
func writeLongDocs(t *testing.T, src, out string, n, period, repeats int) {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			paths = append(paths, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(paths)
	var docs []string
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
	pieces:
		for i := 0; i+period <= len(raw) && len(docs) < n; i += period {
			piece := raw[i : i+period]
			for _, b := range piece {
				if b == 0 || b >= 128 {
					continue pieces
				}
			}
			docs = append(docs, strings.Repeat(string(piece), repeats))
		}
	}
	if len(docs) < n {
		t.Fatalf("%s: %d pieces of %d ASCII bytes, want %d", src, len(docs), period, n)
	}
	if !strings.HasSuffix(out, ".jsonl") {
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, d := range docs {
			if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("%05d.txt", i)), []byte(d), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	var buf bytes.Buffer
	for _, d := range docs {
		line, err := json.Marshal(map[string]string{"text": d})
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(append(line, '\n'))
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestContextExtensionExample runs a small version of the README's worked example of context
// extension. The data's documents repeat a 96-byte passage of Go source four times, so from
// token 96 on a model that sees 96 tokens back can copy; one trained at 64 tokens cannot. A
// model trained at 64 tokens (positions to 256) is exported as Hugging Face LLaMA; a new run
// starts from that directory (--init-from) at 4× the length with linear RoPE scaling and
// document-masked packing on 4 sequence-parallel ranks; a control continues the short model at
// 64 tokens for the same steps and tokens. On held-out documents (from the Go test suite, the
// training ones from the Go source) at 256 tokens, the extended model must beat the short model
// (as it is, and with linear scaling written into its config.json: the "before") and the control
// by a clear margin, and do better at 256 tokens than at 64 (it uses the longer context); its
// export evaluates to exactly its checkpoint's loss.
func TestContextExtensionExample(t *testing.T) {
	slow(t, "TestExportRopeScalingRoundTrip and TestInitFromSources cover the export and --init-from it chains, and model's TestRopeParity each RoPE scaling")
	dir := t.TempDir()
	sh := func(args ...string) {
		t.Helper()
		if _, stderr, err := cli(t, args...); err != nil {
			t.Fatalf("distflash %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
	}
	train, eval := filepath.Join(dir, "train.jsonl"), filepath.Join(dir, "eval")
	goroot, err := data.ExpandPath("$GOROOT")
	if err != nil {
		t.Fatal(err)
	}
	writeLongDocs(t, filepath.Join(goroot, "src"), train, 2000, 96, 4)
	writeLongDocs(t, filepath.Join(goroot, "test"), eval, 32, 96, 4)
	common := []string{"--progress=false", "--set", "run.output_dir=" + dir, "--set", "data.format=jsonl",
		"--set", "data.train=" + train, "--set", "data.max_bytes=0", "--set", "data.document_mask=true",
		"--set", "training.warmup_steps=10"}
	// 1. The short model: 64 tokens (positions to 256), exported as Hugging Face LLaMA.
	sh(append([]string{"train", "--set", "run.name=short", "--set", "model.dim=64", "--set", "model.n_layers=2",
		"--set", "model.n_heads=2", "--set", "model.n_kv_heads=2", "--set", "model.ffn_dim=128", "--set", "model.max_seq_len=256",
		"--set", "data.seq_len=64", "--set", "data.batch_size=8", "--set", "training.steps=400"}, common...)...)
	short := filepath.Join(dir, "short-hf")
	sh("export", "--model", filepath.Join(dir, "short"), "--out", short)
	// The short model with linear scaling, as a user would edit an HF config.json.
	shortLinear := filepath.Join(dir, "short-linear-hf")
	if err := os.CopyFS(shortLinear, os.DirFS(short)); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(shortLinear, "config.json")
	var hc map[string]any
	raw, err := os.ReadFile(cfgPath)
	if err == nil {
		err = json.Unmarshal(raw, &hc)
	}
	if err != nil {
		t.Fatal(err)
	}
	hc["rope_scaling"] = map[string]any{"type": "linear", "factor": 4.0}
	if raw, err = json.Marshal(hc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// 2. Extended: from the HF directory, 4× the length, linear RoPE scaling, 4 ranks; and the
	// control: the same steps and tokens at 64.
	const steps = 350
	sh(append([]string{"train", "--init-from", short, "--set", "run.name=long", "--set", "model.max_seq_len=256",
		"--set", "model.rope_scaling.type=linear", "--set", "model.rope_scaling.factor=4",
		"--set", "data.seq_len=256", "--set", "data.batch_size=2", "--set", fmt.Sprint("training.steps=", steps),
		"--set", "training.lr=3e-3", "--set", "parallelism.world_size=4", "--set", "parallelism.sequence_parallel_degree=4"}, common...)...)
	sh(append([]string{"train", "--init-from", short, "--set", "run.name=control", "--set", "model.max_seq_len=256",
		"--set", "data.seq_len=64", "--set", "data.batch_size=8", "--set", fmt.Sprint("training.steps=", steps),
		"--set", "training.lr=3e-3"}, common...)...)
	long, control := filepath.Join(dir, "long-hf"), filepath.Join(dir, "control-hf")
	sh("export", "--model", filepath.Join(dir, "long"), "--out", long)
	sh("export", "--model", filepath.Join(dir, "control"), "--out", control)

	// 3. Held-out perplexity at 64 and 256 tokens.
	evalAt := func(model string, seqLen int) float64 {
		t.Helper()
		r := evalReportOf(t, model, seqLen, "--data", eval, "--samples", "32")
		if want := int64(32 * seqLen); r.Tokens != want {
			t.Fatalf("eval %s at %d: %d tokens, want %d", model, seqLen, r.Tokens, want)
		}
		return r.Loss
	}
	before, beforeLinear, ctl := evalAt(short, 256), evalAt(shortLinear, 256), evalAt(control, 256)
	after, after64 := evalAt(long, 256), evalAt(long, 64)
	t.Logf("held-out loss at 256 tokens: short %.4f, short with linear scaling %.4f, control (%d more steps at 64) %.4f, extended %.4f (at 64: %.4f)",
		before, beforeLinear, steps, ctl, after, after64)
	const margin = 0.15 // nats per token; measured: 0.25 below the best of them
	for _, c := range []struct {
		name string
		loss float64
	}{{"the short model", before}, {"the short model with linear scaling", beforeLinear}, {"the control", ctl}} {
		if !(after < c.loss-margin) {
			t.Errorf("at 256 tokens the extended model's loss %.4f is not %.2f below %s's %.4f", after, margin, c.name, c.loss)
		}
	}
	if !(after < after64) {
		t.Errorf("the extended model's loss at 256 tokens %.4f is not below its loss at 64 %.4f: it does not use the longer context", after, after64)
	}
	ckpt := evalReportOf(t, filepath.Join(dir, "long"), 256, "--data", eval, "--samples", "32", "--set", "data.format=text")
	if ckpt.Loss != after {
		t.Errorf("the export of the extended run: loss %v, its checkpoint %v", after, ckpt.Loss)
	}
}
