package weights

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distflash/internal/fuzztest"
	"distflash/weights/safetensors"
)

// Fuzz targets for the Hugging Face files this package reads from outside: config.json
// (FuzzReadHFConfig) and model.safetensors.index.json (FuzzOpenHFIndex); the safetensors files
// themselves are fuzzed in package weights/safetensors. Their seed corpora in testdata/fuzz/
// hold hand-made attacks and run as ordinary tests; `go test -fuzz` explores from there. Each
// target asserts that whatever the bytes, the reader returns (no panic, no allocation beyond
// what the file justifies) and that every error names the file it is about.

func FuzzReadHFConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzztest.Watchdog(b)()
		path := fuzztest.File(t, HFConfigFile, b)
		c, err := ReadHFConfig(path)
		if err != nil {
			fuzztest.MustName(t, err, path)
			return
		}
		if c.HiddenSize <= 0 || c.NumHiddenLayers <= 0 || c.VocabSize <= 0 || c.HeadDim*c.NumAttentionHeads != c.HiddenSize ||
			c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
			t.Fatalf("accepted an inconsistent config: %+v", c)
		}
		if err := CheckHFArchitecture(path); err != nil {
			fuzztest.MustName(t, err, path)
		}
	})
}

// fuzzHFDir is a Hugging Face directory with a valid config.json and one shard,
// part-1.safetensors, holding tensor "a"; a sibling directory holds outside.safetensors,
// which an index must not be able to reach.
func fuzzHFDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "model")
	for _, d := range []string{dir, filepath.Join(root, "other")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := `{"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":16}`
	if err := os.WriteFile(filepath.Join(dir, HFConfigFile), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	a := []safetensors.WTensor{{Name: "a", Shape: []int{2}, Data: []float32{1, 2}}}
	if err := safetensors.Write(filepath.Join(dir, "part-1.safetensors"), a, "F32", nil); err != nil {
		t.Fatal(err)
	}
	b := []safetensors.WTensor{{Name: "b", Shape: []int{1}, Data: []float32{3}}}
	if err := safetensors.Write(filepath.Join(root, "other", "outside.safetensors"), b, "F32", nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "other", "outside.safetensors"), filepath.Join(dir, "link.safetensors")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func FuzzOpenHFIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, index []byte) {
		defer fuzztest.Watchdog(index)()
		dir := fuzzHFDir(t)
		path := filepath.Join(dir, HFIndexFile)
		if err := os.WriteFile(path, index, 0o644); err != nil {
			t.Fatal(err)
		}
		h, err := OpenHF(dir)
		if err != nil {
			if !strings.Contains(err.Error(), dir) {
				t.Fatalf("error does not name %s: %v", dir, err)
			}
			return
		}
		for name, file := range h.Files {
			if filepath.Dir(file) != dir || filepath.Base(file) != "part-1.safetensors" {
				t.Fatalf("tensor %q is read from %s, outside %s's own shard", name, file, dir)
			}
		}
	})
}
