package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"distflash/evaluate"
)

// ranksFlags are the --set flags of P sequence-parallel ranks running schedule attn.
func ranksFlags(P int, attn string) []string {
	return []string{"--set", "parallelism.world_size=" + strconv.Itoa(P), "--set", "parallelism.sequence_parallel_degree=" + strconv.Itoa(P),
		"--set", "parallelism.attention=" + attn}
}

// runCLI runs a command line and returns stdout and stderr, failing the test on an error.
func runCLI(t *testing.T, args ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String(), stderr.String()
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
		stdout, stderr := runCLI(t, append([]string{"generate", "--model", "weights/testdata/hf/mistral-window", "--prompt", c.Prompt,
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
		s, _ := runCLI(t, "generate", "--model", "weights/testdata/hf/llama-sharded", "--prompt", "Once upon", "--max-new-tokens", "16",
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
		var stdout, stderr bytes.Buffer
		err := run(append([]string{"generate", "--model", "weights/testdata/hf/llama-sharded"}, bad.args...), &stdout, &stderr)
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
		stdout, _ := runCLI(t, append([]string{"eval", "--model", "weights/testdata/hf/llama-tied", "--data", hfDocs, "--seq-len", "512",
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
	runCLI(t, "plot", "--positions", filepath.Join(dir, "pos1.json"), filepath.Join(dir, "pos4.json"), "--out", pic)
	checkPNG(t, pic)
	var stdout, stderr bytes.Buffer
	if err := run([]string{"eval", "--model", "weights/testdata/hf/llama-tied", "--data", hfDocs, "--plot", pic}, &stdout, &stderr); err == nil ||
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
		stdout, _ := runCLI(t, append([]string{"eval", "--model", "weights/testdata/hf/llama-sharded", "--task", "passkey",
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
	var stdout, stderr bytes.Buffer
	if err := run([]string{"eval", "--model", "weights/testdata/hf/llama-sharded", "--task", "passkey", "--lengths", "1K"}, &stdout, &stderr); err == nil ||
		!strings.Contains(err.Error(), "--lengths 1024 exceeds the model's longest sequence, 512") {
		t.Errorf("a length past the model's 512: %v", err)
	}
}
