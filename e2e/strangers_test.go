package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"distflash/ckpt"
	"distflash/config"
)

// Models from strangers: a config.json or a checkpoint manifest whose sizes no machine can
// hold gets a clear error and exit code 2 from every command that loads a model, before
// anything is allocated (it used to panic in makeslice, or ask the kernel for terabytes).

// absurdShapes are config.json shapes beyond any machine: the (hidden_size 1000000,
// num_hidden_layers 100000), a real-looking one needing terabytes, and sizes at 2^53 whose
// parameter count overflows int64.
var absurdShapes = []struct {
	name   string
	config string
	want   string // a key and value the error names
}{
	{"issue", `{"hidden_size":1000000,"intermediate_size":2700000,"num_hidden_layers":100000,"num_attention_heads":8,"vocab_size":32000}`,
		"hidden_size 1000000"},
	{"terabytes", `{"hidden_size":16384,"intermediate_size":53248,"num_hidden_layers":200,"num_attention_heads":128,"vocab_size":128256}`,
		"num_hidden_layers 200"},
	{"overflow", `{"hidden_size":4503599627370496,"intermediate_size":4503599627370496,"num_hidden_layers":4503599627370496,"num_attention_heads":2,"vocab_size":4503599627370496}`,
		"vocab_size 4503599627370496"},
}

// absurdHFDir is a Hugging Face directory with config config and a small (unrelated)
// model.safetensors, so that the shape is the first thing refused.
func absurdHFDir(t *testing.T, config string) string {
	t.Helper()
	dir := t.TempDir()
	st, err := os.ReadFile(filepath.Join("weights", "testdata", "hf", "llama-tied", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"config.json": []byte(config), "model.safetensors": st} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// mustRefuseMemory runs distflash with args and fails t unless it exits with code 2 and an
// error naming every one of want and the bytes needed and available.
func mustRefuseMemory(t *testing.T, args []string, want ...string) {
	t.Helper()
	out, code := output(t, args...)
	if code != 2 {
		t.Fatalf("distflash %v: exit %d, want 2\n%s", args, code, out)
	}
	for _, w := range append(want, "bytes", "available", "parameters") {
		if !strings.Contains(out, w) {
			t.Errorf("distflash %v: output lacks %q:\n%s", args, w, out)
		}
	}
	if strings.Contains(out, "panic") || strings.Contains(out, "goroutine") {
		t.Errorf("distflash %v panicked:\n%s", args, out)
	}
}

func TestAbsurdHFConfig(t *testing.T) {
	docs := filepath.Join(t.TempDir(), "docs.txt")
	if err := os.WriteFile(docs, []byte("some text to evaluate on\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range absurdShapes {
		t.Run(tt.name, func(t *testing.T) {
			dir := absurdHFDir(t, tt.config)
			cfg := filepath.Join(dir, "config.json")
			mustRefuseMemory(t, []string{"eval", "--model", dir, "--data", docs, "--samples", "1"}, "eval:", cfg, tt.want)
			out := t.TempDir()
			mustRefuseMemory(t, []string{"train", "--config", "configs/tiny.toml", "--init-from", dir, "--progress=false",
				"--set", "run.output_dir=" + out}, "--init-from", cfg, tt.want)
			if entries, _ := os.ReadDir(out); len(entries) != 0 {
				t.Errorf("train --init-from wrote %d entries in run.output_dir before refusing", len(entries))
			}
		})
	}
}

// TestAbsurdCheckpointModel: a checkpoint whose manifest (checksum and all intact) describes a
// model no machine holds is refused by export and eval before its parameters are read.
func TestAbsurdCheckpointModel(t *testing.T) {
	run := t.TempDir()
	tmp, err := ckpt.BeginStep(run, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ckpt.WriteShard(tmp, 0, []ckpt.Piece{{Tensor: "params", Off: 0, Data: []float32{1, 2, 3, 4}}}, ckpt.Options{}); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Model.Dim, cfg.Model.NLayers, cfg.Model.NHeads, cfg.Model.NKVHeads, cfg.Model.FFNDim, cfg.Model.VocabSize = 1000000, 100000, 8, 8, 2700000, 32000
	cj, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := ckpt.Manifest{Version: ckpt.Version, Step: 1, Config: cj, State: json.RawMessage(`{}`),
		World: ckpt.WorldLayout{Size: 1, SequenceParallel: 1, DataParallel: 1}, Tensors: []ckpt.TensorInfo{{Name: "params", Len: 4, DType: "f32"}}}
	dir, err := ckpt.Commit(run, tmp, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, ckpt.ManifestFile)
	out := filepath.Join(t.TempDir(), "export")
	mustRefuseMemory(t, []string{"export", "--model", run, "--out", out}, manifest, "model.dim 1000000", "model.n_layers 100000")
	if _, err := os.Stat(out); err == nil {
		t.Errorf("export created %s before refusing", out)
	}
	docs := filepath.Join(t.TempDir(), "docs.txt")
	os.WriteFile(docs, []byte("text\n"), 0o644)
	mustRefuseMemory(t, []string{"eval", "--model", run, "--data", docs}, manifest, fmt.Sprint("model.ffn_dim ", 2700000))
}

// corpus reads the seed inputs of a fuzz target in dir/testdata/fuzz/target: file name →
// the target's arguments (each a []byte).
func corpus(t *testing.T, dir, target string) map[string][][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "testdata", "fuzz", target, "*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no seeds for %s in %s: %v", target, dir, err)
	}
	out := map[string][][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a Go fuzz corpus file", p)
		}
		for _, l := range lines[1:] {
			s, ok := strings.CutPrefix(l, "[]byte(")
			if !ok || !strings.HasSuffix(s, ")") {
				t.Fatalf("%s: line %q is not a []byte", p, l)
			}
			v, err := strconv.Unquote(strings.TrimSuffix(s, ")"))
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			out[filepath.Base(p)] = append(out[filepath.Base(p)], []byte(v))
		}
	}
	return out
}

// copyFixture copies the HF fixture llama-sharded (config, two shards, index) into a new
// directory and returns it.
func copyFixture(t *testing.T) string {
	t.Helper()
	src, dir := filepath.Join("weights", "testdata", "hf", "llama-sharded"), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSeedsThroughCLI runs the fuzz seeds of the model and tokenizer files through the real
// binary, as a user downloading them would meet them: `eval --model` of an HF directory with
// the seed as its config.json, index, tokenizer.json or tokenizer.model, of the seed as a
// .safetensors file, and of a checkpoint with the seed as manifest and shard; `data
// tokenize` of each jsonl seed, `train` on each token shard seed, and `plan --config` of
// each TOML seed. None may panic; each ends in exit code 0 or 2, and a
// refusal names the directory or file.
func TestSeedsThroughCLI(t *testing.T) {
	slow(t, "every package runs its fuzz seeds in process, and TestAbsurdHFConfig refuses models through the binary")
	docs := filepath.Join(t.TempDir(), "docs.txt")
	if err := os.WriteFile(docs, []byte("Hello world, café 日本 🙂\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(path string, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T, name string, args []string, names string) {
		out, code := output(t, args...)
		if strings.Contains(out, "panic:") || strings.Contains(out, "goroutine ") || code != 0 && code != 2 {
			t.Fatalf("%s: distflash %v: exit %d\n%s", name, args, code, out)
		}
		if code == 2 && !strings.Contains(out, names) {
			t.Errorf("%s: distflash %v: the error does not name %s:\n%s", name, args, names, out)
		}
	}
	eval := func(model string) []string {
		return []string{"eval", "--model", model, "--data", docs, "--samples", "1", "--seq-len", "16", "--out", filepath.Join(t.TempDir(), "e.json")}
	}
	for _, tt := range []struct {
		pkg, target string
		run         func(t *testing.T, name string, args [][]byte)
	}{
		{"weights", "FuzzReadHFConfig", func(t *testing.T, name string, args [][]byte) {
			dir := copyFixture(t)
			write(filepath.Join(dir, "config.json"), args[0])
			check(t, name, eval(dir), dir)
		}},
		{"weights", "FuzzOpenHFIndex", func(t *testing.T, name string, args [][]byte) {
			dir := copyFixture(t)
			write(filepath.Join(dir, "model.safetensors.index.json"), args[0])
			check(t, name, eval(dir), dir)
		}},
		{"weights/safetensors", "FuzzReadSafetensors", func(t *testing.T, name string, args [][]byte) {
			path := filepath.Join(t.TempDir(), "model.safetensors")
			write(path, args[0])
			check(t, name, append(eval(path), "--config", "configs/tiny.toml"), path)
		}},
		{"ckpt", "FuzzOpenCheckpoint", func(t *testing.T, name string, args [][]byte) {
			dir := t.TempDir()
			write(filepath.Join(dir, ckpt.ManifestFile), args[0])
			write(filepath.Join(dir, ckpt.ShardFile(0)), args[1])
			check(t, name, eval(dir), dir)
		}},
		{"data", "FuzzHFTokenizer", func(t *testing.T, name string, args [][]byte) {
			dir := copyFixture(t)
			write(filepath.Join(dir, "tokenizer.json"), args[0])
			check(t, name, eval(dir), dir)
		}},
		{"data", "FuzzSentencePiece", func(t *testing.T, name string, args [][]byte) {
			dir := copyFixture(t)
			write(filepath.Join(dir, "tokenizer.model"), args[0])
			check(t, name, eval(dir), dir)
		}},
		{"data", "FuzzReadDocuments", func(t *testing.T, name string, args [][]byte) {
			path := filepath.Join(t.TempDir(), "docs.jsonl")
			write(path, args[0])
			check(t, name, []string{"data", "tokenize", "--config", "configs/tiny.toml", "--set", "data.train=" + path,
				"--set", "data.format=jsonl", "--set", "data.max_bytes=65536", "--out", filepath.Join(t.TempDir(), "x.tokens")}, path)
		}},
		{"data", "FuzzReadShard", func(t *testing.T, name string, args [][]byte) {
			path := filepath.Join(t.TempDir(), "data.tokens")
			write(path, args[0])
			check(t, name, []string{"train", "--config", "configs/tiny.toml", "--progress=false", "--set", "data.train=" + path,
				"--set", "data.format=tokens", "--set", "training.steps=1", "--set", "run.output_dir=" + t.TempDir()}, path)
		}},
		{"plan", "FuzzLoadConfig", func(t *testing.T, name string, args [][]byte) {
			path := filepath.Join(t.TempDir(), "run.toml")
			write(path, args[0])
			check(t, name, []string{"plan", "--config", path}, path)
		}},
	} {
		t.Run(tt.target, func(t *testing.T) {
			for name, args := range corpus(t, tt.pkg, tt.target) {
				tt.run(t, name, args)
			}
		})
	}
}
