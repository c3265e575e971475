package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/data"
	"distflash/data/datatest"
)

// llama3Dir writes LLaMA-3's tokenizer.json (fetched by scripts/fetch_llama3_tokenizer.sh)
// into a new directory, as a model directory holds it, and returns the directory.
func llama3Dir(t *testing.T) string {
	t.Helper()
	b := datatest.Llama3TokenizerJSON(t, filepath.Join("data", "testdata", "tok", "llama3.tokenizer.json.gz"))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDataTokenizeTrainLlama3 runs data tokenize and train with data.tokenizer naming a
// directory with LLaMA-3's tokenizer.json: the shards hold uint32 ids (the vocabulary is
// 128256), the same ids as tokenizing the C4 files directly, and train refuses a model
// vocabulary smaller than the tokenizer's, naming both sizes, then trains with one that
// covers it.
func TestDataTokenizeTrainLlama3(t *testing.T) {
	tok := llama3Dir(t)
	c4 := writeC4(t, 1, 20)
	out := filepath.Join(t.TempDir(), "shards")
	var stdout, stderr bytes.Buffer
	err := run([]string{"data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train=" + c4, "--set", "data.format=c4", "--set", "data.tokenizer=" + tok,
		"--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr.String())
	}
	shards, _ := filepath.Glob(filepath.Join(out, "*.tokens"))
	if len(shards) != 1 {
		t.Fatalf("%d shards, want 1", len(shards))
	}
	h, err := data.ReadShardHeader(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	if h.TokenBytes != 4 || h.VocabSize != 128256 {
		t.Errorf("shard header: %d bytes per token, vocabulary %d; want 4 and 128256", h.TokenBytes, h.VocabSize)
	}
	l3, err := data.NewTokenizer(tok)
	if err != nil {
		t.Fatal(err)
	}
	want, err := data.LoadTokens(data.Source{Path: c4, Format: "c4", Seed: 1337}, l3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := data.LoadTokens(data.Source{Path: out, Format: "tokens"}, l3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || len(want) == 0 {
		t.Fatalf("the shards hold %d tokens, not the %d of the C4 files", len(got), len(want))
	}

	train := func(vocab string) error {
		stdout.Reset()
		stderr.Reset()
		return run([]string{"train", "--config", "configs/tiny.toml", "--progress=false",
			"--set", "data.format=tokens", "--set", "data.train=" + out, "--set", "data.tokenizer=" + tok,
			"--set", "model.vocab_size=" + vocab, "--set", "model.dim=32", "--set", "model.n_layers=1",
			"--set", "model.n_heads=2", "--set", "model.n_kv_heads=1", "--set", "model.ffn_dim=64",
			"--set", "data.seq_len=16", "--set", "data.batch_size=1", "--set", "training.steps=1",
			"--set", "run.output_dir=" + t.TempDir()}, &stdout, &stderr)
	}
	if err := train("32000"); err == nil || !strings.Contains(err.Error(), "128256") || !strings.Contains(err.Error(), "32000") {
		t.Errorf("train with model.vocab_size 32000: error %v, want one naming 128256 and 32000", err)
	}
	if err := train("128256"); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	if all := stdout.String() + stderr.String(); !strings.Contains(all, "vocab 128256") {
		t.Errorf("train output does not mention vocab 128256:\n%s", all)
	}
}
