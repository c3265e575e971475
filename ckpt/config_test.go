package ckpt

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestCheckConfig(t *testing.T) {
	saved := json.RawMessage(`{"run":{"name":"x"},"model":{"dim":64,"n_layers":2,"norm_eps":1e-05,"rope_theta":10000},"data":{"tokenizer":"byte","seq_len":128,"include":["*.go"]},"training":{"steps":600},"parallelism":{"world_size":4,"fsdp":false}}`)
	for _, tc := range []struct {
		name    string
		current string
		diffs   []string // keys that differ
		fatal   []string // error must name these (nil: no error)
	}{
		{"same", string(saved), nil, nil},
		{"same, other number spelling and key order", `{"parallelism":{"fsdp":false,"world_size":4},"model":{"rope_theta":1e4,"norm_eps":0.00001,"n_layers":2,"dim":64},"data":{"include":["*.go"],"tokenizer":"byte","seq_len":128},"training":{"steps":600.0},"run":{"name":"x"}}`, nil, nil},
		{"allowed: steps, world size, data", `{"run":{"name":"y"},"model":{"dim":64,"n_layers":2,"norm_eps":1e-05,"rope_theta":10000},"data":{"tokenizer":"byte","seq_len":256,"include":["*.md"]},"training":{"steps":1200},"parallelism":{"world_size":8,"fsdp":true}}`,
			[]string{"data.include", "data.seq_len", "parallelism.fsdp", "parallelism.world_size", "run.name", "training.steps"}, nil},
		{"model shape", `{"run":{"name":"x"},"model":{"dim":128,"n_layers":3,"norm_eps":1e-05,"rope_theta":10000},"data":{"tokenizer":"byte","seq_len":128,"include":["*.go"]},"training":{"steps":600},"parallelism":{"world_size":4,"fsdp":false}}`,
			[]string{"model.dim", "model.n_layers"}, []string{"model.dim = 64 in the checkpoint, 128 now", "model.n_layers = 2 in the checkpoint, 3 now"}},
		{"rope theta", `{"run":{"name":"x"},"model":{"dim":64,"n_layers":2,"norm_eps":1e-05,"rope_theta":500000},"data":{"tokenizer":"byte","seq_len":128,"include":["*.go"]},"training":{"steps":600},"parallelism":{"world_size":4,"fsdp":false}}`,
			[]string{"model.rope_theta"}, []string{"model.rope_theta = 10000 in the checkpoint, 500000 now"}},
		{"tokenizer and a new model key", `{"run":{"name":"x"},"model":{"dim":64,"n_layers":2,"norm_eps":1e-05,"rope_theta":10000,"n_kv_heads":2},"data":{"tokenizer":"bpe","seq_len":128,"include":["*.go"]},"training":{"steps":600},"parallelism":{"world_size":4,"fsdp":false}}`,
			[]string{"data.tokenizer", "model.n_kv_heads"}, []string{`data.tokenizer = "byte" in the checkpoint, "bpe" now`, "model.n_kv_heads = (absent) in the checkpoint, 2 now"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diffs, err := DiffConfig(saved, json.RawMessage(tc.current))
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, d := range diffs {
				keys = append(keys, d.Key)
				if d.Fatal != slices.ContainsFunc(tc.fatal, func(f string) bool { return strings.HasPrefix(f, d.Key+" ") }) {
					t.Errorf("%s: Fatal = %v", d, d.Fatal)
				}
			}
			if !slices.Equal(keys, tc.diffs) {
				t.Errorf("differences %v, want %v", keys, tc.diffs)
			}
			m := Manifest{Step: 100, Config: saved}
			err = CheckConfig(m, json.RawMessage(tc.current))
			if (err != nil) != (tc.fatal != nil) {
				t.Fatalf("CheckConfig = %v, want an error naming %v", err, tc.fatal)
			}
			for _, f := range tc.fatal {
				if !strings.Contains(err.Error(), f) || !strings.Contains(err.Error(), "step 100") {
					t.Errorf("CheckConfig = %q, want it to say %q", err, f)
				}
			}
			h1, _ := HashConfig(saved)
			h2, _ := HashConfig(json.RawMessage(tc.current))
			if (h1 == h2) != (tc.fatal == nil) {
				t.Errorf("hashes equal = %v, fatal differences %v", h1 == h2, tc.fatal)
			}
		})
	}
	if _, err := DiffConfig(saved, json.RawMessage(`[1]`)); err == nil || !strings.Contains(err.Error(), "want an object") {
		t.Errorf("DiffConfig of an array: %v", err)
	}
	if err := CheckConfig(Manifest{Step: 3}, saved); err == nil || !strings.Contains(err.Error(), "no config") {
		t.Errorf("CheckConfig without a saved config: %v", err)
	}
}

// TestCheckpointCheckConfig checks the method names the checkpoint's directory.
func TestCheckpointCheckConfig(t *testing.T) {
	ts := newTensors(1, map[string]int{"params": 10})
	c := checkContents(t, mustSave(t, t.TempDir(), 1, ts, chunkPieces(ts, 1), Options{}, 0), ts)
	if err := c.CheckConfig(testConfig(64, 5)); err != nil {
		t.Errorf("other training.steps: %v", err)
	}
	err := c.CheckConfig(testConfig(32, 1000))
	if err == nil || !strings.Contains(err.Error(), c.Dir()) || !strings.Contains(err.Error(), "model.dim = 64 in the checkpoint, 32 now") {
		t.Errorf("other model.dim: %v", err)
	}
}
