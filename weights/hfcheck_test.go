package weights

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distflash/weights/safetensors"
)

// TestHFUnsupportedArchitecture: each setting distflash's LLaMA does not implement is refused
// by OpenHF, naming config.json, the key and the value; the same keys switched off (null,
// false, 0) load.
func TestHFUnsupportedArchitecture(t *testing.T) {
	const src = "testdata/hf/llama-sharded"
	for _, c := range []struct {
		key   string
		value any
		want  string
	}{
		{"attention_bias", true, "attention_bias = true"},
		{"mlp_bias", true, "mlp_bias = true"},
		{"hidden_act", "gelu", `hidden_act = "gelu"`},
		{"num_local_experts", 8, "num_local_experts = 8: mixture-of-experts"},
		{"num_experts_per_tok", 2, "num_experts_per_tok = 2"},
		{"n_routed_experts", 64, "n_routed_experts = 64"},
		{"use_sliding_window", true, "use_sliding_window = true"},
		{"quantization_config", map[string]any{"quant_method": "gptq", "bits": 4}, `quantization_config = {"bits":4,"quant_method":"gptq"}`},
		{"model_type", "qwen2", `model_type = "qwen2"`},
		{"sliding_window", -1, "sliding_window = -1"},
	} {
		t.Run(c.key, func(t *testing.T) {
			dir := copyDir(t, src)
			editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { m[c.key] = c.value })
			_, err := OpenHF(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), HFConfigFile) {
				t.Errorf("%s = %v: %v; want an error naming config.json and %q", c.key, c.value, err, c.want)
			}
		})
	}
	dir := copyDir(t, src)
	editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) {
		m["sliding_window"], m["num_local_experts"], m["use_sliding_window"], m["quantization_config"] = nil, 0, false, nil
	})
	h, err := OpenHF(dir)
	if err != nil {
		t.Fatalf("the keys switched off: %v", err)
	}
	if err := loadAll(h); err != nil {
		t.Fatal(err)
	}
}

// TestHFTiedMismatch: tie_word_embeddings = true with an lm_head.weight that is not the
// embedding is refused (transformers would drop that head); an identical stored head loads;
// tie_word_embeddings = false without a head is refused by Load.
func TestHFTiedMismatch(t *testing.T) {
	dir := copyDir(t, "testdata/hf/llama-sharded") // untied: its lm_head differs from its embedding
	editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { m["tie_word_embeddings"] = true })
	_, err := OpenHF(dir)
	if err == nil || !strings.Contains(err.Error(), "tie_word_embeddings = true") || !strings.Contains(err.Error(), "lm_head.weight") {
		t.Errorf("tied config with a different head: %v", err)
	}

	// The same head as the embedding, stored twice: fine.
	st, err := safetensors.Read("testdata/hf/llama-tied/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	same := t.TempDir()
	raw, _ := os.ReadFile("testdata/hf/llama-tied/config.json")
	os.WriteFile(filepath.Join(same, HFConfigFile), raw, 0o644)
	var ts []safetensors.WTensor
	for _, name := range st.Names() {
		v, shape, _ := st.Float32(name)
		ts = append(ts, safetensors.WTensor{Name: name, Shape: shape, Data: v})
		if name == "model.embed_tokens.weight" {
			ts = append(ts, safetensors.WTensor{Name: "lm_head.weight", Shape: shape, Data: v})
		}
	}
	if err := safetensors.Write(filepath.Join(same, "model.safetensors"), ts, safetensors.DTypeF32, nil); err != nil {
		t.Fatal(err)
	}
	h, err := OpenHF(same)
	if err != nil {
		t.Fatalf("tied with an identical stored head: %v", err)
	}
	if err := loadAll(h); err != nil {
		t.Fatal(err)
	}

	untied := copyDir(t, "testdata/hf/llama-tied") // no lm_head in its file
	editJSON(t, filepath.Join(untied, HFConfigFile), func(m map[string]any) { m["tie_word_embeddings"] = false })
	h, err = OpenHF(untied)
	if err == nil {
		err = loadAll(h)
	}
	if err == nil || !strings.Contains(err.Error(), `no tensor "lm_head.weight"`) || !strings.Contains(err.Error(), "tie_word_embeddings is false") {
		t.Errorf("untied config without a head: %v", err)
	}
}

// TestHFSlidingWindow: sliding_window is read for llama (absent: none) and mistral (absent:
// MistralConfig's 4096); null turns it off.
func TestHFSlidingWindow(t *testing.T) {
	src := "testdata/hf/llama-sharded"
	for _, c := range []struct {
		edit map[string]any
		want int
		err  string // "": opens
	}{
		{map[string]any{}, 0, ""},
		{map[string]any{"sliding_window": nil}, 0, ""},
		{map[string]any{"sliding_window": 0}, 0, ""},
		{map[string]any{"sliding_window": 64}, 64, ""},
		{map[string]any{"sliding_window": -1}, 0, "sliding_window = -1: want a positive window"},
		{map[string]any{"model_type": "mistral"}, 4096, ""},
		{map[string]any{"model_type": "mistral", "sliding_window": 32}, 32, ""},
		{map[string]any{"model_type": "mistral", "sliding_window": nil}, 0, ""},
		{map[string]any{"model_type": "mistral", "sliding_window": -3}, 0, "sliding_window = -3: want a positive window"},
		{map[string]any{"model_type": "mistral", "sliding_window": 2.5}, 0, "sliding_window = 2.5: want an integer"},
	} {
		dir := copyDir(t, src)
		editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) {
			for k, v := range c.edit {
				m[k] = v
			}
		})
		h, err := OpenHF(dir)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), HFConfigFile) {
				t.Errorf("%v: %v, want an error naming %s and %q", c.edit, err, HFConfigFile, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.edit, err)
		}
		if h.Config.SlidingWindow != c.want {
			t.Errorf("%v: sliding window %d, want %d", c.edit, h.Config.SlidingWindow, c.want)
		}
		// a LLaMA with a window is noted (transformers would ignore it), a Mistral is not
		if note := h.Config.WindowNote(); (note != "") != (c.want > 0 && h.Config.ModelType == "llama") {
			t.Errorf("%v: note %q", c.edit, note)
		}
	}
}
