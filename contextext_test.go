package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"distflash/data"
)

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
	dir := t.TempDir()
	sh := func(args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := run(args, &stdout, &stderr); err != nil {
			t.Fatalf("distflash %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
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
