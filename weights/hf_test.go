package weights

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/weights/safetensors"
)

// The fixtures in testdata/hf are written by `/usr/bin/python3 scripts/reference.py hf`: two
// tiny LlamaForCausalLM directories (llama-sharded: two shards, F32 and BF16, with
// model.safetensors.index.json; llama-tied: one F16 file, tied embeddings, an inv_freq
// buffer), the evaluation text, expected.json (PyTorch's per-tensor checksums of the stored
// values and its evaluation losses) and permute.safetensors (Meta → HF q/k permutation).

type hfExpected struct {
	BOS    int `json:"bos_token_id"`
	Models map[string]struct {
		Config  map[string]float64 `json:"config"`
		Tied    bool               `json:"tie_word_embeddings"`
		Tensors map[string]struct {
			Shape []int     `json:"shape"`
			DType string    `json:"dtype"`
			Sum   float64   `json:"sum"`
			SumSq float64   `json:"sum_sq"`
			Head  []float64 `json:"head"`
		} `json:"tensors"`
	} `json:"models"`
}

func readHFExpected(t *testing.T) hfExpected {
	t.Helper()
	raw, err := os.ReadFile("testdata/hf/expected.json")
	if err != nil {
		t.Fatalf("%v (regenerate: /usr/bin/python3 scripts/reference.py hf)", err)
	}
	var e hfExpected
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	if len(e.Models) != 3 {
		t.Fatalf("expected.json has %d models, want 3", len(e.Models))
	}
	return e
}

// TestOpenHFFixtures loads the PyTorch-written directories and checks every tensor against
// the checksums PyTorch computed from the stored values (F32, BF16, F16 converted exactly, so
// the sums agree to float64 rounding), the config against the shape PyTorch used, and the
// tied head against the embedding.
func TestOpenHFFixtures(t *testing.T) {
	e := readHFExpected(t)
	for name, want := range e.Models {
		t.Run(name, func(t *testing.T) {
			h, err := OpenHF(filepath.Join("testdata/hf", name))
			if err != nil {
				t.Fatal(err)
			}
			c := h.Config
			got := map[string]float64{"dim": float64(c.HiddenSize), "n_layers": float64(c.NumHiddenLayers),
				"n_heads": float64(c.NumAttentionHeads), "n_kv_heads": float64(c.NumKeyValueHeads),
				"head_dim": float64(c.HeadDim), "ffn_dim": float64(c.IntermediateSize), "vocab_size": float64(c.VocabSize),
				"norm_eps": c.RMSNormEps, "rope_theta": c.RopeTheta, "sliding_window": float64(c.SlidingWindow)}
			for k, v := range want.Config {
				if got[k] != v {
					t.Errorf("config %s = %v, PyTorch used %v", k, got[k], v)
				}
			}
			if c.TieWordEmbeddings != want.Tied || c.BOSTokenID != e.BOS || h.Tokenizer != "" {
				t.Errorf("tied %v bos %d tokenizer %q; want tied %v bos %d no tokenizer", c.TieWordEmbeddings, c.BOSTokenID, h.Tokenizer, want.Tied, e.BOS)
			}
			var dsts []Dest
			for n, w := range want.Tensors {
				dsts = append(dsts, Dest{Name: n, Shape: w.Shape, Data: make([]float32, shapeSize(w.Shape))})
			}
			embed := want.Tensors["model.embed_tokens.weight"]
			if want.Tied {
				dsts = append(dsts, Dest{Name: "lm_head.weight", Shape: embed.Shape, Data: make([]float32, shapeSize(embed.Shape))})
			}
			if err := h.Load(dsts); err != nil {
				t.Fatal(err)
			}
			dtypes := map[string]bool{}
			for _, d := range dsts {
				w, ok := want.Tensors[d.Name]
				if !ok { // the tied head
					w = embed
				}
				dtypes[w.DType] = true
				var sum, sq float64
				for _, v := range d.Data {
					sum += float64(v)
					sq += float64(v) * float64(v)
				}
				if math.Abs(sum-w.Sum) > 1e-9*math.Max(1, w.SumSq) || math.Abs(sq-w.SumSq) > 1e-9*w.SumSq {
					t.Errorf("%s (%s): sum %v, sum of squares %v; PyTorch %v, %v", d.Name, w.DType, sum, sq, w.Sum, w.SumSq)
				}
				for i, v := range w.Head {
					if float64(d.Data[i]) != v {
						t.Errorf("%s[%d] = %v, PyTorch stored %v", d.Name, i, d.Data[i], v)
					}
				}
			}
			t.Logf("%d tensors, dtypes %v", len(dsts), slices.Sorted(func(y func(string) bool) {
				for k := range dtypes {
					if !y(k) {
						return
					}
				}
			}))
		})
	}
}

// minimalHFConfig has only the required keys.
const minimalHFConfig = `{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "vocab_size": 300}`

func writeHFConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// with returns minimalHFConfig with key set to the JSON value v (or removed when v is "").
func with(t *testing.T, key, v string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(minimalHFConfig), &m); err != nil {
		t.Fatal(err)
	}
	if v == "" {
		delete(m, key)
	} else {
		m[key] = json.RawMessage(v)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestReadHFConfigDefaults(t *testing.T) {
	c, err := ReadHFConfig(writeHFConfig(t, minimalHFConfig))
	if err != nil {
		t.Fatal(err)
	}
	want := HFConfig{HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 4, HeadDim: 16, VocabSize: 300, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 2048, BOSTokenID: 1, ModelType: "llama"}
	if c != want {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
	for _, tc := range []struct {
		key, value string
		check      func(HFConfig) bool
	}{
		{"bos_token_id", "null", func(c HFConfig) bool { return c.BOSTokenID == -1 }},
		{"bos_token_id", "128000", nil}, // out of range: checked below as an error
		{"num_key_value_heads", "null", func(c HFConfig) bool { return c.NumKeyValueHeads == 4 }},
		{"num_key_value_heads", "1", func(c HFConfig) bool { return c.NumKeyValueHeads == 1 }},
		{"head_dim", "16", func(c HFConfig) bool { return c.HeadDim == 16 }},
		{"rope_scaling", "null", func(c HFConfig) bool { return true }},
		{"rope_scaling", `{"rope_type": "default"}`, func(c HFConfig) bool { return c.RopeScaling == HFRopeScaling{} }},
		{"rope_scaling", `{"type": "linear", "factor": 2.0}`, func(c HFConfig) bool { return c.RopeScaling == HFRopeScaling{Type: "linear", Factor: 2} }},
		// dynamic: transformers' pretrained length is max_position_embeddings (2048 here).
		{"rope_scaling", `{"rope_type": "dynamic", "factor": 2.0}`, func(c HFConfig) bool {
			return c.RopeScaling == HFRopeScaling{Type: "dynamic", Factor: 2, OriginalMaxPositionEmbeddings: 2048}
		}},
		// yarn without original_max_position_embeddings: max_position_embeddings is the pretrained length.
		{"rope_scaling", `{"rope_type": "yarn", "factor": 4.0, "attention_factor": null}`, func(c HFConfig) bool {
			return c.RopeScaling == HFRopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 2048}
		}},
		{"rope_scaling", `{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.2}`, func(c HFConfig) bool {
			return c.RopeScaling == HFRopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 512, BetaFast: 16, BetaSlow: 2, AttentionFactor: 1.2}
		}},
		// LLaMA 3.1's own rope_scaling.
		{"rope_scaling", `{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}`, func(c HFConfig) bool {
			return c.RopeScaling == HFRopeScaling{Type: "llama3", Factor: 8, OriginalMaxPositionEmbeddings: 8192, LowFreqFactor: 1, HighFreqFactor: 4}
		}},
		{"tie_word_embeddings", "true", func(c HFConfig) bool { return c.TieWordEmbeddings }},
		{"rope_theta", "500000.0", func(c HFConfig) bool { return c.RopeTheta == 5e5 }},
		{"max_position_embeddings", "4096", func(c HFConfig) bool { return c.MaxPositionEmbeddings == 4096 }},
	} {
		c, err := ReadHFConfig(writeHFConfig(t, with(t, tc.key, tc.value)))
		if tc.check == nil {
			if err == nil {
				t.Errorf("%s = %s: no error", tc.key, tc.value)
			}
			continue
		}
		if err != nil || !tc.check(c) {
			t.Errorf("%s = %s: %+v, %v", tc.key, tc.value, c, err)
		}
	}
}

// TestReadHFConfigErrors: every refusal names the file, the key and the value.
func TestReadHFConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       []string
	}{
		{"hidden_size", "", []string{`"hidden_size" is missing`}},
		{"vocab_size", "null", []string{"vocab_size is null"}},
		{"num_hidden_layers", `"two"`, []string{`num_hidden_layers = "two"`, "integer"}},
		{"num_hidden_layers", "2.5", []string{"num_hidden_layers = 2.5", "integer"}},
		{"intermediate_size", "0", []string{"intermediate_size = 0", "> 0"}},
		{"rope_scaling", `{"type": "longrope", "factor": 2.0}`, []string{`rope_scaling.rope_type = "longrope": not implemented`, "default, linear, dynamic, yarn, llama3"}},
		{"rope_scaling", `{"rope_type": "default", "factor": 2.0}`, []string{`rope_scaling.factor = 2.0: not implemented for rope_type "default"`}},
		{"rope_scaling", `{"rope_type": "yarn", "factor": 4.0, "mscale": 0.707}`, []string{`rope_scaling.mscale = 0.707: not implemented for rope_type "yarn"`, "beta_fast"}},
		{"rope_scaling", `{"rope_type": "yarn", "factor": 4.0, "truncate": false}`, []string{`rope_scaling.truncate = false: not implemented`}},
		{"rope_scaling", `{"rope_type": "linear", "factor": 0.5}`, []string{`rope_scaling.factor = 0.5: must be ≥ 1`}},
		{"rope_scaling", `{"rope_type": "linear"}`, []string{`"rope_scaling.factor" is missing`}},
		{"rope_scaling", `{"rope_type": "linear", "factor": "2"}`, []string{`rope_scaling.factor = "2": want a number`}},
		{"rope_scaling", `{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}`, []string{`"rope_scaling.original_max_position_embeddings" is missing`}},
		{"rope_scaling", `{"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 1024}`, []string{"rope_scaling.original_max_position_embeddings = 1024 differs from max_position_embeddings = 2048"}},
		{"rope_scaling", `{"rope_type": "linear", "type": "dynamic", "factor": 2.0}`, []string{`rope_scaling.rope_type = "linear" and rope_scaling.type = "dynamic" disagree`}},
		{"rope_scaling", `[1]`, []string{`rope_scaling = [1]: want an object or null`}},
		{"hidden_act", `"gelu"`, []string{`hidden_act = "gelu"`, "silu"}},
		{"attention_bias", "true", []string{"attention_bias = true"}},
		{"mlp_bias", "true", []string{"mlp_bias = true"}},
		{"model_type", `"gemma"`, []string{`model_type = "gemma"`}},
		{"num_key_value_heads", "3", []string{"num_attention_heads = 4", "num_key_value_heads = 3"}},
		{"head_dim", "8", []string{"head_dim = 8", "hidden_size = 64"}},
		{"rms_norm_eps", "-1", []string{"rms_norm_eps = -1"}},
		{"tie_word_embeddings", `"yes"`, []string{`tie_word_embeddings = "yes"`, "true or false"}},
		{"bos_token_id", "300", []string{"bos_token_id = 300", "vocab_size = 300"}},
	} {
		path := writeHFConfig(t, with(t, tc.key, tc.value))
		_, err := ReadHFConfig(path)
		if err == nil {
			t.Errorf("%s = %s: no error", tc.key, tc.value)
			continue
		}
		for _, w := range append(tc.want, path) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s = %s: error %q does not mention %q", tc.key, tc.value, err, w)
			}
		}
	}
	if _, err := ReadHFConfig(writeHFConfig(t, "{not json")); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("bad JSON: %v", err)
	}
}

// copyDir copies the files of a fixture directory into a fresh temporary one.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	files, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// loadAll loads every tensor the config of h implies (HF LLaMA names, as model.NewLayout).
func loadAll(h *HFModel) error {
	c := h.Config
	D, F, Q, KV, V := c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim, c.VocabSize
	var dsts []Dest
	add := func(name string, shape ...int) {
		dsts = append(dsts, Dest{Name: name, Shape: shape, Data: make([]float32, shapeSize(shape))})
	}
	add("model.embed_tokens.weight", V, D)
	for i := 0; i < c.NumHiddenLayers; i++ {
		p := "model.layers." + string(rune('0'+i)) + "."
		add(p+"input_layernorm.weight", D)
		add(p+"self_attn.q_proj.weight", Q, D)
		add(p+"self_attn.k_proj.weight", KV, D)
		add(p+"self_attn.v_proj.weight", KV, D)
		add(p+"self_attn.o_proj.weight", D, Q)
		add(p+"post_attention_layernorm.weight", D)
		add(p+"mlp.gate_proj.weight", F, D)
		add(p+"mlp.up_proj.weight", F, D)
		add(p+"mlp.down_proj.weight", D, F)
	}
	add("model.norm.weight", D)
	add("lm_head.weight", V, D)
	return h.Load(dsts)
}

// TestOpenHFErrors: broken directories fail with the file and the tensor named.
func TestOpenHFErrors(t *testing.T) {
	const sharded = "testdata/hf/llama-sharded"
	const shard2 = "model-00002-of-00002.safetensors"
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"missing shard", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, shard2)) },
			[]string{HFIndexFile, "shard " + shard2, "missing"}},
		{"missing config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, HFConfigFile)) },
			[]string{HFConfigFile, "no such file"}},
		{"missing config key", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { delete(m, "num_attention_heads") })
		}, []string{HFConfigFile, `"num_attention_heads" is missing`}},
		{"index names a tensor its shard lacks", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFIndexFile), func(m map[string]any) {
				m["weight_map"].(map[string]any)["model.norm.weight"] = "model-00001-of-00002.safetensors"
			})
		}, []string{HFIndexFile, `"model.norm.weight"`, "model-00001-of-00002.safetensors", "does not hold it"}},
		{"no weights", func(t *testing.T, dir string) {
			for _, f := range []string{HFIndexFile, shard2, "model-00001-of-00002.safetensors"} {
				os.Remove(filepath.Join(dir, f))
			}
		}, []string{"no model.safetensors"}},
		{"shape mismatch", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { m["intermediate_size"] = 48 })
		}, []string{"model-00001-of-00002.safetensors", `"model.layers.0.mlp.gate_proj.weight"`, "shape [64 32]", "needs [48 32]"}},
		{"missing tensor", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { m["num_hidden_layers"] = 3 })
		}, []string{`no tensor "model.layers.2.input_layernorm.weight"`}},
		{"extra tensor", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFConfigFile), func(m map[string]any) { m["num_hidden_layers"] = 1 })
		}, []string{shard2, `"model.layers.1.`, "not a parameter of the model"}},
		{"untied without lm_head", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, HFIndexFile), func(m map[string]any) { delete(m["weight_map"].(map[string]any), "lm_head.weight") })
			// The shard still holds lm_head.weight, but the index no longer says so.
		}, []string{`no tensor "lm_head.weight"`, "tie_word_embeddings is false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, sharded)
			tc.break_(t, dir)
			h, err := OpenHF(dir)
			if err == nil {
				err = loadAll(h)
			}
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
	// The intact fixtures load.
	for _, d := range []string{sharded, "testdata/hf/llama-tied"} {
		h, err := OpenHF(d)
		if err == nil {
			err = loadAll(h)
		}
		if err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}

func editJSON(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, _ := json.Marshal(m)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestIsHFDir(t *testing.T) {
	own := t.TempDir() // a distflash run directory: config.json of the TOML config
	if err := os.WriteFile(filepath.Join(own, "config.json"), []byte(`{"run": {}, "model": {"dim": 128}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := t.TempDir() // meant as HF: OpenHF says what is wrong
	if err := os.WriteFile(filepath.Join(broken, "config.json"), []byte(`{"hidden_size": 3`), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]bool{"testdata/hf/llama-sharded": true, "testdata/hf/llama-tied": true,
		"testdata/hf": false, own: false, broken: true, "testdata/nonexistent": false} {
		if got := IsHFDir(dir); got != want {
			t.Errorf("IsHFDir(%s) = %v, want %v", dir, got, want)
		}
	}
}

// TestPermuteQK: PermuteQK equals the permute of transformers' convert_llama_weights_to_hf.py
// as PyTorch computed it (testdata/hf/permute.safetensors; the script also checks that the
// permuted weights under rotate-half RoPE give the attention scores of Meta's weights under
// Meta's interleaved RoPE), bit for bit, and UnpermuteQK undoes it.
func TestPermuteQK(t *testing.T) {
	st, err := safetensors.Read("testdata/hf/permute.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		H   int `json:"n_heads"`
		K   int `json:"n_kv_heads"`
		HD  int `json:"head_dim"`
		Dim int `json:"dim"`
	}
	if err := json.Unmarshal([]byte(st.Metadata["config"]), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		which string
		heads int
	}{{"q", cfg.H}, {"k", cfg.K}} {
		meta, _, err := st.Float32("meta_" + tc.which)
		if err != nil {
			t.Fatal(err)
		}
		hf, _, err := st.Float32("hf_" + tc.which)
		if err != nil {
			t.Fatal(err)
		}
		if got := PermuteQK(meta, tc.heads, cfg.HD, cfg.Dim); !slices.Equal(got, hf) {
			t.Errorf("%s: PermuteQK differs from transformers' permute", tc.which)
		}
		if got := UnpermuteQK(hf, tc.heads, cfg.HD, cfg.Dim); !slices.Equal(got, meta) {
			t.Errorf("%s: UnpermuteQK does not invert it", tc.which)
		}
		if slices.Equal(meta, hf) {
			t.Errorf("%s: the fixture's permutation is the identity", tc.which)
		}
	}
	// By hand: one head of 4 features, one input. Meta pairs rows (0,1) and (2,3); HF pairs
	// (0,2) and (1,3), so Meta's rows 0 1 2 3 become HF rows 0 2 1 3.
	if got := PermuteQK([]float32{10, 11, 12, 13}, 1, 4, 1); !slices.Equal(got, []float32{10, 12, 11, 13}) {
		t.Errorf("PermuteQK by hand: %v", got)
	}
	// Two heads of 6, two inputs: within each head Meta rows 0..5 = pairs (0,1)(2,3)(4,5) go
	// to 0 3 1 4 2 5.
	w := make([]float32, 2*6*2)
	for i := range w {
		w[i] = float32(i / 2) // row index, twice
	}
	want := []float32{0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11}
	got := PermuteQK(w, 2, 6, 2)
	for r, v := range want {
		if got[2*r] != v || got[2*r+1] != v {
			t.Fatalf("PermuteQK rows %v, want %v", got, want)
		}
	}
}

// withKeys returns minimalHFConfig with each key of kv set to its JSON value.
func withKeys(t *testing.T, kv map[string]string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(minimalHFConfig), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range kv {
		m[k] = json.RawMessage(v)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestReadHFConfigRopeForms: RoPE is read from transformers 5's rope_parameters and from
// transformers 4's rope_theta and rope_scaling alike, and from both when they agree.
func TestReadHFConfigRopeForms(t *testing.T) {
	llama3 := HFRopeScaling{Type: "llama3", Factor: 8, OriginalMaxPositionEmbeddings: 8192, LowFreqFactor: 1, HighFreqFactor: 4}
	const llama3JSON = `"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192`
	for _, tc := range []struct {
		name  string
		kv    map[string]string
		theta float64
		rs    HFRopeScaling
	}{
		{"v5 theta", map[string]string{"rope_parameters": `{"rope_type": "default", "rope_theta": 500000.0}`}, 5e5, HFRopeScaling{}},
		{"v5 llama3", map[string]string{"rope_parameters": `{"rope_type": "llama3", "rope_theta": 500000.0, ` + llama3JSON + `}`}, 5e5, llama3},
		{"v5 linear, legacy type too", map[string]string{"rope_parameters": `{"type": "linear", "rope_type": "linear", "factor": 2.0, "rope_theta": 40000}`},
			4e4, HFRopeScaling{Type: "linear", Factor: 2}},
		{"v5 dynamic", map[string]string{"rope_parameters": `{"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}`},
			1e4, HFRopeScaling{Type: "dynamic", Factor: 2, OriginalMaxPositionEmbeddings: 2048}},
		{"v5 yarn", map[string]string{"rope_parameters": `{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 16, "rope_theta": 1e6}`},
			1e6, HFRopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 512, BetaFast: 16}},
		{"v5 without rope_theta: the top-level one", map[string]string{"rope_theta": "250000", "rope_parameters": `{"rope_type": "default"}`}, 2.5e5, HFRopeScaling{}},
		{"v5 empty rope_parameters", map[string]string{"rope_parameters": `{}`}, 1e4, HFRopeScaling{}},
		{"v4 llama3", map[string]string{"rope_theta": "500000.0", "rope_scaling": `{"rope_type": "llama3", ` + llama3JSON + `}`}, 5e5, llama3},
		{"both, agreeing", map[string]string{"rope_theta": "500000.0", "rope_scaling": `{"rope_type": "llama3", ` + llama3JSON + `}`,
			"rope_parameters": `{"rope_type": "llama3", "rope_theta": 500000.0, ` + llama3JSON + `}`}, 5e5, llama3},
		{"rope_theta inside rope_scaling", map[string]string{"rope_scaling": `{"rope_type": "linear", "factor": 2, "rope_theta": 1e5}`}, 1e5, HFRopeScaling{Type: "linear", Factor: 2}},
		{"partial_rotary_factor 1", map[string]string{"partial_rotary_factor": "1.0", "rope_parameters": `{"rope_type": "default", "partial_rotary_factor": 1}`}, 1e4, HFRopeScaling{}},
		{"top-level original_max_position_embeddings that agrees", map[string]string{"max_position_embeddings": "32768", "original_max_position_embeddings": "8192",
			"rope_parameters": `{"rope_type": "llama3", "rope_theta": 500000.0, ` + llama3JSON + `}`}, 5e5, llama3},
		{"top-level original_max_position_embeddings, unused by linear", map[string]string{"original_max_position_embeddings": "1024",
			"rope_parameters": `{"rope_type": "linear", "factor": 2}`}, 1e4, HFRopeScaling{Type: "linear", Factor: 2}},
	} {
		c, err := ReadHFConfig(writeHFConfig(t, withKeys(t, tc.kv)))
		if err != nil || c.RopeTheta != tc.theta || c.RopeScaling != tc.rs {
			t.Errorf("%s: rope_theta %g, %+v, %v; want %g, %+v", tc.name, c.RopeTheta, c.RopeScaling, err, tc.theta, tc.rs)
		}
	}
}

// TestReadHFConfigRopeRefusals: a RoPE setting given twice with two values, or one distflash
// does not implement, in either form, is refused naming the keys and values; and one bad
// value gives one error, not the errors that would follow from it.
func TestReadHFConfigRopeRefusals(t *testing.T) {
	for _, tc := range []struct {
		kv   map[string]string
		want []string
	}{
		{map[string]string{"rope_theta": "10000.0", "rope_parameters": `{"rope_type": "default", "rope_theta": 500000.0}`},
			[]string{"rope_theta = 10000.0 and rope_parameters.rope_theta = 500000.0 disagree"}},
		{map[string]string{"rope_parameters": `{"rope_type": "default", "rope_theta": 500000.0}`, "rope_scaling": `{"type": "default", "rope_theta": 1e4}`},
			[]string{"rope_parameters.rope_theta = 500000.0 and rope_scaling.rope_theta = 1e4 disagree"}},
		{map[string]string{"rope_parameters": `{"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0}`, "rope_scaling": `{"type": "linear", "factor": 4.0}`},
			[]string{`rope_parameters = {"rope_type":"yarn","factor":4.0,"rope_theta":500000.0} and rope_scaling = {"type":"linear","factor":4.0} disagree`}},
		{map[string]string{"rope_parameters": `{"rope_type": "linear", "factor": 4.0}`, "rope_scaling": `{"rope_type": "linear", "factor": 2.0}`},
			[]string{`rope_parameters = {"rope_type":"linear","factor":4.0} and rope_scaling = {"rope_type":"linear","factor":2.0} disagree`}},
		{map[string]string{"partial_rotary_factor": "0.5"}, []string{"partial_rotary_factor = 0.5: RoPE on part of each head is not implemented"}},
		{map[string]string{"rope_parameters": `{"rope_type": "default", "partial_rotary_factor": 0.25}`}, []string{"rope_parameters.partial_rotary_factor = 0.25"}},
		{map[string]string{"rope_parameters": `{"rope_type": "longrope", "short_factor": [1], "long_factor": [2]}`},
			[]string{`rope_parameters.rope_type = "longrope": not implemented`, "default, linear, dynamic, yarn, llama3"}},
		{map[string]string{"rope_parameters": `{"rope_type": "proportional", "rope_theta": 1e6}`}, []string{`rope_parameters.rope_type = "proportional": not implemented`}},
		{map[string]string{"rope_parameters": `{"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707}`},
			[]string{`rope_parameters.mscale = 0.707: not implemented for rope_type "yarn"`, `rope_parameters.mscale_all_dim = 0.707`}},
		{map[string]string{"rope_parameters": `{"rope_type": "yarn", "factor": 4.0, "truncate": false}`}, []string{`rope_parameters.truncate = false: not implemented`}},
		{map[string]string{"rope_parameters": `{"rope_type": "llama3", "factor": 8.0}`}, []string{`"rope_parameters.low_freq_factor" is missing`}},
		{map[string]string{"rope_parameters": `{"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}`},
			[]string{`rope_parameters.full_attention = {"rope_type":"default"}: not implemented`}},
		{map[string]string{"rope_parameters": `"default"`}, []string{`rope_parameters = "default": want an object or null`}},
		{map[string]string{"rope_parameters": `{"rope_type": "default", "rope_theta": "1e4"}`}, []string{`rope_parameters.rope_theta = "1e4": want a number`}},
		{map[string]string{"rope_parameters": `{"rope_type": "default", "rope_theta": 0.5}`}, []string{`rope_parameters.rope_theta = 0.5: must be a number > 1`}},
		{map[string]string{"max_position_embeddings": "32768", "original_max_position_embeddings": "4096",
			"rope_parameters": `{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}`},
			[]string{"original_max_position_embeddings = 4096 and rope_parameters.original_max_position_embeddings = 8192 disagree"}},
		{map[string]string{"max_position_embeddings": "4096", "original_max_position_embeddings": "512",
			"rope_scaling": `{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}`},
			[]string{"original_max_position_embeddings = 512 with rope_scaling.factor = 4 and max_position_embeddings = 4096", "= 8"}},
	} {
		path := writeHFConfig(t, withKeys(t, tc.kv))
		_, err := ReadHFConfig(path)
		if err == nil {
			t.Errorf("%v: no error", tc.kv)
			continue
		}
		for _, w := range append(tc.want, path) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not mention %q", tc.kv, err, w)
			}
		}
		if n := strings.Count(err.Error(), "weights: "); n != 1 && len(tc.kv) > 1 {
			t.Errorf("%v: %d errors, want the one: %v", tc.kv, n, err)
		}
	}
}

// TestReadHFConfigOneErrorPerMistake: a value of the wrong type (or a required key missing)
// is named once, without the errors of the checks that use it.
func TestReadHFConfigOneErrorPerMistake(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{"hidden_size", `"64"`, `hidden_size = "64": want an integer`},
		{"hidden_size", "", `"hidden_size" is missing`},
		{"num_attention_heads", `"4"`, `num_attention_heads = "4": want an integer`},
		{"num_key_value_heads", `2.5`, `num_key_value_heads = 2.5: want an integer`},
		{"head_dim", `"16"`, `head_dim = "16": want an integer`},
		{"vocab_size", `"300"`, `vocab_size = "300": want an integer`},
		{"rms_norm_eps", `"1e-6"`, `rms_norm_eps = "1e-6": want a number`},
		{"rope_theta", `"5e5"`, `rope_theta = "5e5": want a number`},
		{"hidden_act", `1`, `hidden_act = 1: want a string`},
	} {
		path := writeHFConfig(t, with(t, tc.key, tc.value))
		_, err := ReadHFConfig(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "weights: ") != 1 {
			t.Errorf("%s = %s: %v; want the one error %q", tc.key, tc.value, err, tc.want)
		}
	}
}
