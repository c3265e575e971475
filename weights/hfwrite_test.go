package weights

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/weights/safetensors"
)

// testTensors are three small tensors, of 60, 28 and 64 bytes in F32.
func testTensors() []safetensors.WTensor {
	return []safetensors.WTensor{
		{Name: "a.weight", Shape: []int{3, 5}, Data: make([]float32, 15)},
		{Name: "b.weight", Shape: []int{7}, Data: make([]float32, 7)},
		{Name: "c.weight", Shape: []int{4, 4}, Data: make([]float32, 16)},
	}
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{{"5GB", 5e9}, {"500MB", 5e8}, {"40KB", 40e3}, {"2GiB", 2 << 30}, {"1.5kib", 1536}, {"123", 123}, {"7 B", 7}} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "GB", "-1GB", "0", "5XB", "1e3MB", "five"} {
		if _, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), "want a positive number") {
			t.Errorf("ParseSize(%q): %v, want an error", in, err)
		}
	}
}

// TestWriteHFShards: under the limit one model.safetensors and no index; above it, shards in
// tensor order (a tensor never split, one larger than the limit alone), an index naming each
// tensor's file with the total size, and OpenHF reading it all back.
func TestWriteHFShards(t *testing.T) {
	ts := testTensors() // 60, 28 and 64 bytes in F32
	cfg := []byte(`{"hidden_size": 4, "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 4}` + "\n")
	for _, c := range []struct {
		max   int64
		files [][]string // tensors per shard
	}{
		{0, [][]string{{"a.weight", "b.weight", "c.weight"}}},
		{152, [][]string{{"a.weight", "b.weight", "c.weight"}}},
		{100, [][]string{{"a.weight", "b.weight"}, {"c.weight"}}},
		{50, [][]string{{"a.weight"}, {"b.weight"}, {"c.weight"}}},
	} {
		dir := filepath.Join(t.TempDir(), "out")
		files, err := WriteHF(dir, HFExport{Config: cfg, Tensors: ts, DType: safetensors.DTypeF32, MaxShardSize: c.max})
		if err != nil {
			t.Fatal(err)
		}
		n := len(c.files)
		if want := 1 + n + min(n-1, 1); len(files) != want {
			t.Errorf("max %d: files %v, want %d", c.max, files, want)
		}
		for i, names := range c.files {
			st, err := safetensors.Read(filepath.Join(dir, shardFile(i, n)))
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Names(); !slices.Equal(got, names) {
				t.Errorf("max %d: %s holds %v, want %v", c.max, shardFile(i, n), got, names)
			}
		}
		_, err = os.Stat(filepath.Join(dir, HFIndexFile))
		if n == 1 && err == nil || n > 1 && err != nil {
			t.Errorf("max %d, %d shards: index: %v", c.max, n, err)
		}
		if n > 1 {
			var index struct {
				Metadata  map[string]int64  `json:"metadata"`
				WeightMap map[string]string `json:"weight_map"`
			}
			raw, _ := os.ReadFile(filepath.Join(dir, HFIndexFile))
			if err := json.Unmarshal(raw, &index); err != nil {
				t.Fatal(err)
			}
			if index.Metadata["total_size"] != 152 || len(index.WeightMap) != 3 || index.WeightMap["c.weight"] != shardFile(n-1, n) {
				t.Errorf("max %d: index %+v", c.max, index)
			}
		}
		got, _ := os.ReadFile(filepath.Join(dir, HFConfigFile))
		if string(got) != string(cfg) {
			t.Errorf("config.json %q", got)
		}
		if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".out.tmp-*")); len(left) > 0 {
			t.Errorf("temporary directories left: %v", left)
		}
	}
}

// TestWriteHFRefusesAndLeavesNothing: a non-empty directory is refused and left as it was; a
// failure while writing (a file to copy that does not exist) leaves neither the directory nor
// a temporary one; an empty existing directory is filled.
func TestWriteHFRefusesAndLeavesNothing(t *testing.T) {
	parent := t.TempDir()
	full := filepath.Join(parent, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "keep.txt"), []byte("x"), 0o644)
	e := HFExport{Config: []byte("{}"), Tensors: testTensors(), DType: safetensors.DTypeF32}
	if _, err := WriteHF(full, e); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("non-empty directory: %v", err)
	}
	if ents, _ := os.ReadDir(full); len(ents) != 1 {
		t.Errorf("the non-empty directory was changed: %v", ents)
	}
	bad := e
	bad.Copy = map[string]string{"tokenizer.model": filepath.Join(parent, "missing.model")}
	failed := filepath.Join(parent, "failed")
	if _, err := WriteHF(failed, bad); err == nil || !strings.Contains(err.Error(), "missing.model") {
		t.Errorf("missing file to copy: %v", err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("a failed export left %v beside %s", names, full)
	}
	if _, err := WriteHF(filepath.Join(parent, "x"), HFExport{Config: []byte("{}"), DType: "F16"}); err == nil || !strings.Contains(err.Error(), `dtype "F16"`) {
		t.Errorf("dtype F16: %v", err)
	}
	empty := filepath.Join(parent, "empty")
	os.MkdirAll(empty, 0o755)
	if _, err := WriteHF(empty, e); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, "model.safetensors")); err != nil {
		t.Error(err)
	}
}
