package model

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Config is the shape of a LLaMA-family model: the [model] section of a run's TOML file.
type Config struct {
	Dim       int     `toml:"dim" json:"dim"`               // residual stream width
	NLayers   int     `toml:"n_layers" json:"n_layers"`     // transformer blocks
	NHeads    int     `toml:"n_heads" json:"n_heads"`       // query heads
	NKVHeads  int     `toml:"n_kv_heads" json:"n_kv_heads"` // key/value heads; 0 means n_heads
	HeadDim   int     `toml:"head_dim" json:"head_dim"`     // 0 means dim / n_heads
	FFNDim    int     `toml:"ffn_dim" json:"ffn_dim"`       // SwiGLU hidden width
	VocabSize int     `toml:"vocab_size" json:"vocab_size"` // embedding rows and logits
	NormEps   float64 `toml:"norm_eps" json:"norm_eps"`     // RMSNorm epsilon
	RopeTheta float64 `toml:"rope_theta" json:"rope_theta"` // RoPE base
	MaxSeqLen int     `toml:"max_seq_len" json:"max_seq_len"`
	// RopeScaling stretches RoPE to longer contexts, as Hugging Face's rope_scaling does.
	RopeScaling RopeScaling `toml:"rope_scaling" json:"rope_scaling"`
	// SlidingWindow is the attention window W of the windowed layers (Mistral's
	// sliding_window): a key at position j is visible to a query at i iff i − W < j ≤ i (and,
	// with data.document_mask, in the query's document). 0: no window.
	SlidingWindow int `toml:"sliding_window" json:"sliding_window,omitempty"`
	// SlidingWindowLayers lists the windowed layers (0-based), for models that alternate local
	// and global layers; empty: every layer, when SlidingWindow is set.
	SlidingWindowLayers []int `toml:"sliding_window_layers" json:"sliding_window_layers,omitempty"`
	// SlidingWindowPattern, when N > 0, windows every layer but each N-th (layers N−1, 2N−1, …
	// attend to the whole prefix), as Gemma 3's and Cohere 2's sliding_window_pattern: the
	// interleaved local and global layers as one number. 0: SlidingWindowLayers says.
	SlidingWindowPattern int `toml:"sliding_window_pattern" json:"sliding_window_pattern,omitempty"`
	// Init is how a fresh model's weights are drawn (InitParams): "scaled" (or empty, the
	// default), "normal" or "torchtitan".
	Init string `toml:"init" json:"init,omitempty"`
}

// Window is the attention window of layer l: SlidingWindow where the layer is windowed, else
// 0 (the whole causal prefix).
func (c Config) Window(l int) int {
	switch {
	case c.SlidingWindow <= 0:
		return 0
	case c.SlidingWindowPattern > 0:
		if (l+1)%c.SlidingWindowPattern == 0 {
			return 0
		}
		return c.SlidingWindow
	}
	if len(c.SlidingWindowLayers) == 0 || slices.Contains(c.SlidingWindowLayers, l) {
		return c.SlidingWindow
	}
	return 0
}

// RopeScaling is the [model.rope_scaling] table: Hugging Face's rope_scaling, with the same
// names. Type "" (or "none") leaves RoPE as LLaMA-2 defines it. Config.Resolve checks it
// (see RopeTypes for the types and rope.go for what each computes) and Config.RoPE turns it
// into the table the kernels apply.
type RopeScaling struct {
	Type   string  `toml:"type" json:"rope_type"` // "" | none | default | linear | dynamic | yarn | llama3
	Factor float64 `toml:"factor" json:"factor"`  // context extension factor
	// OriginalMaxPositionEmbeddings is the context the model was pretrained at (yarn, llama3,
	// dynamic); 0 means model.max_seq_len / factor where a variant needs it.
	OriginalMaxPositionEmbeddings int     `toml:"original_max_position_embeddings" json:"original_max_position_embeddings,omitempty"`
	LowFreqFactor                 float64 `toml:"low_freq_factor" json:"low_freq_factor,omitempty"`   // llama3
	HighFreqFactor                float64 `toml:"high_freq_factor" json:"high_freq_factor,omitempty"` // llama3
	BetaFast                      float64 `toml:"beta_fast" json:"beta_fast,omitempty"`               // yarn; 0 means HF's 32
	BetaSlow                      float64 `toml:"beta_slow" json:"beta_slow,omitempty"`               // yarn; 0 means HF's 1
	AttentionFactor               float64 `toml:"attention_factor" json:"attention_factor,omitempty"` // yarn; 0 means HF's 0.1·ln(factor)+1
}

// String writes the scaling as a TOML inline table of the keys that are set, e.g.
// `{type = "linear", factor = 4}`, and `none` without one.
func (r RopeScaling) String() string {
	if r.Type == "" || r.Type == "none" || r.Type == "default" {
		return "none"
	}
	parts := []string{fmt.Sprintf("type = %q", r.Type), "factor = " + strconv.FormatFloat(r.Factor, 'g', -1, 64)}
	if r.OriginalMaxPositionEmbeddings != 0 {
		parts = append(parts, fmt.Sprintf("original_max_position_embeddings = %d", r.OriginalMaxPositionEmbeddings))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"low_freq_factor", r.LowFreqFactor}, {"high_freq_factor", r.HighFreqFactor}, {"beta_fast", r.BetaFast},
		{"beta_slow", r.BetaSlow}, {"attention_factor", r.AttentionFactor}} {
		if f.v != 0 {
			parts = append(parts, f.name+" = "+strconv.FormatFloat(f.v, 'g', -1, 64))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// DefaultConfig is the tiny model that trains on a laptop CPU in a minute or two.
func DefaultConfig() Config {
	return Config{Dim: 128, NLayers: 4, NHeads: 4, NKVHeads: 2, FFNDim: 352, VocabSize: 256,
		NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 2048, SlidingWindowLayers: []int{}, Init: "scaled"}
}

// Resolve fills the derived fields (n_kv_heads, head_dim) and checks that the shape is a valid
// LLaMA: every problem is reported with the key it concerns.
func (c *Config) Resolve() error {
	if c.NKVHeads == 0 {
		c.NKVHeads = c.NHeads
	}
	if c.HeadDim == 0 && c.NHeads > 0 && c.Dim%c.NHeads == 0 {
		c.HeadDim = c.Dim / c.NHeads
	}
	switch {
	case c.Dim <= 0:
		return fmt.Errorf("model.dim = %d: must be > 0", c.Dim)
	case c.NLayers <= 0:
		return fmt.Errorf("model.n_layers = %d: must be > 0", c.NLayers)
	case c.NHeads <= 0:
		return fmt.Errorf("model.n_heads = %d: must be > 0", c.NHeads)
	case c.NKVHeads <= 0:
		return fmt.Errorf("model.n_kv_heads = %d: must be > 0", c.NKVHeads)
	case c.NHeads%c.NKVHeads != 0:
		return fmt.Errorf("model.n_heads = %d is not a multiple of model.n_kv_heads = %d: each key/value head must serve a whole group of query heads", c.NHeads, c.NKVHeads)
	case c.HeadDim <= 0:
		return fmt.Errorf("model.head_dim is absent and model.dim = %d is not divisible by model.n_heads = %d", c.Dim, c.NHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("model.head_dim = %d: RoPE needs an even head dimension", c.HeadDim)
	case c.NHeads*c.HeadDim != c.Dim:
		return fmt.Errorf("model.dim = %d does not equal model.n_heads × model.head_dim = %d × %d = %d", c.Dim, c.NHeads, c.HeadDim, c.NHeads*c.HeadDim)
	case c.FFNDim <= 0:
		return fmt.Errorf("model.ffn_dim = %d: must be > 0", c.FFNDim)
	case c.VocabSize <= 0:
		return fmt.Errorf("model.vocab_size = %d: must be > 0", c.VocabSize)
	case !(c.NormEps > 0) || math.IsInf(c.NormEps, 0):
		return fmt.Errorf("model.norm_eps = %g: must be a positive number", c.NormEps)
	case !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("model.rope_theta = %g: must be a number > 1", c.RopeTheta)
	case c.MaxSeqLen <= 0:
		return fmt.Errorf("model.max_seq_len = %d: must be > 0", c.MaxSeqLen)
	case c.SlidingWindow < 0:
		return fmt.Errorf("model.sliding_window = %d: must be >= 0 (0: no window)", c.SlidingWindow)
	case c.SlidingWindow == 0 && len(c.SlidingWindowLayers) > 0:
		return fmt.Errorf("model.sliding_window_layers = %v: the layers need a window, model.sliding_window", c.SlidingWindowLayers)
	case c.SlidingWindowPattern < 0:
		return fmt.Errorf("model.sliding_window_pattern = %d: must be >= 0 (N: every N-th layer global, the others windowed; 0: none)", c.SlidingWindowPattern)
	case c.SlidingWindowPattern > 0 && c.SlidingWindow == 0:
		return fmt.Errorf("model.sliding_window_pattern = %d: the windowed layers need a window, model.sliding_window", c.SlidingWindowPattern)
	case !slices.Contains(initSchemes, c.Init):
		return fmt.Errorf("model.init = %q: want \"scaled\" (the default: N(0, 0.02²), o_proj and down_proj by 1/√(2·n_layers)), \"normal\" (Hugging Face's initializer_range 0.02 for every matrix) or \"torchtitan\" (its depth_init)", c.Init)
	case c.SlidingWindowPattern > 0 && len(c.SlidingWindowLayers) > 0:
		return fmt.Errorf("model.sliding_window_pattern = %d and model.sliding_window_layers = %v: set one of the two", c.SlidingWindowPattern, c.SlidingWindowLayers)
	}
	seen := map[int]bool{}
	for _, l := range c.SlidingWindowLayers {
		if l < 0 || l >= c.NLayers || seen[l] {
			return fmt.Errorf("model.sliding_window_layers = %v: want distinct layers from 0 to model.n_layers − 1 = %d, %d is not", c.SlidingWindowLayers, c.NLayers-1, l)
		}
		seen[l] = true
	}
	return c.RopeScaling.resolve(c.HeadDim, c.MaxSeqLen)
}

// QDim is the width of the concatenated query heads, n_heads × head_dim.
func (c Config) QDim() int { return c.NHeads * c.HeadDim }

// KVDim is the width of the concatenated key (or value) heads, n_kv_heads × head_dim.
func (c Config) KVDim() int { return c.NKVHeads * c.HeadDim }

// NumParams is the number of scalar parameters, embeddings and head included. It is exact
// up to 2^53 parameters (ParamCount), far beyond any model memory can hold; check
// ParamCount before trusting it for a shape read from a file.
func (c Config) NumParams() int64 { return int64(c.ParamCount()) }

// ParamCount is the number of scalar parameters as a float64, which does not overflow for
// any shape: the count to check a shape read from a file against memory before anything
// is allocated.
func (c Config) ParamCount() float64 {
	d, q, kv, f, v := float64(c.Dim), float64(c.NHeads)*float64(c.HeadDim), float64(c.NKVHeads)*float64(c.HeadDim), float64(c.FFNDim), float64(c.VocabSize)
	perLayer := 2*d + d*q + 2*d*kv + q*d + 3*d*f
	return float64(c.NLayers)*perLayer + 2*v*d + d
}
