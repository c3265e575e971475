package weights

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"distflash/weights/safetensors"
)

// Hugging Face LLaMA import.
//
// A Hugging Face LLaMA directory (what transformers' save_pretrained writes and the Hub
// serves) holds config.json (LlamaConfig), the weights as one model.safetensors or as shards
// listed by model.safetensors.index.json, and usually tokenizer.model (SentencePiece) and/or
// tokenizer.json. Tensor names are LlamaForCausalLM's, which are distflash's own parameter
// names (model.NewLayout), so import is a copy by name with a dtype conversion.
//
// Layout of the q and k projections. RoPE rotates pairs of features of each head. Meta's
// original LLaMA code (consolidated.*.pth) pairs neighbours (2i, 2i+1) and treats them as one
// complex number; Hugging Face's LlamaAttention pairs i with i+head_dim/2 (rotate_half), and
// transformers' convert_llama_weights_to_hf.py permutes the rows of q_proj and k_proj of every
// head so both give the same attention. distflash's RoPE (kernels.Backend.RoPE) is the
// rotate-half one, so:
//
//   - Hugging Face directories (and distflash's own checkpoints, which use the same names
//     and layout) load as they are;
//   - Meta's original checkpoints need PermuteQK on every q and k projection (UnpermuteQK
//     goes back).

// HFConfig is the part of a Hugging Face LLaMA config.json (transformers' LlamaConfig) that
// distflash reads. Keys other than these are ignored, except the ones that change the
// architecture, which ReadHFConfig refuses (see there).
type HFConfig struct {
	HiddenSize            int     // hidden_size (required)
	IntermediateSize      int     // intermediate_size (required)
	NumHiddenLayers       int     // num_hidden_layers (required)
	NumAttentionHeads     int     // num_attention_heads (required)
	NumKeyValueHeads      int     // num_key_value_heads; absent or null: num_attention_heads
	HeadDim               int     // head_dim; absent or null: hidden_size / num_attention_heads
	VocabSize             int     // vocab_size (required)
	RMSNormEps            float64 // rms_norm_eps; absent: 1e-6 (LlamaConfig's default)
	RopeTheta             float64 // rope_theta (or rope_parameters.rope_theta); absent: 10000
	MaxPositionEmbeddings int     // max_position_embeddings; absent: 2048
	TieWordEmbeddings     bool    // tie_word_embeddings: lm_head.weight is embed_tokens.weight
	TorchDtype            string  // torch_dtype, informational ("bfloat16", "float16", "float32")
	BOSTokenID            int     // bos_token_id; absent: 1 (LlamaConfig's default); null: -1, none
	// ModelType is model_type: "llama" or "mistral" (LLaMA with a sliding window).
	ModelType string
	// SlidingWindow is sliding_window: a key at j is visible to a query at i iff i − W < j ≤ i.
	// 0: none (null, or absent for llama); absent for mistral: 4096, MistralConfig's default.
	SlidingWindow int
	// RopeScaling is rope_parameters or rope_scaling (absent, null or type "default": the
	// zero value), in distflash's terms (see ReadHFConfig).
	RopeScaling HFRopeScaling
}

// ContextLength is the longest sequence the model is meant for: max_position_embeddings, or,
// where rope_scaling extends a context that max_position_embeddings names as the pretrained
// one (dynamic; yarn without its own original_max_position_embeddings), that times the
// factor.
func (c HFConfig) ContextLength() int {
	rs := c.RopeScaling
	switch {
	case rs.Type == "dynamic", rs.Type == "yarn" && rs.OriginalMaxPositionEmbeddings == c.MaxPositionEmbeddings:
		return int(float64(c.MaxPositionEmbeddings) * rs.Factor)
	}
	return c.MaxPositionEmbeddings
}

// HFRopeScaling is a config.json RoPE scaling (rope_parameters or rope_scaling) that
// distflash implements. Its fields are model.RopeScaling's, so one converts to the other;
// the JSON keys are transformers' own.
type HFRopeScaling struct {
	Type                          string  // rope_type (or the legacy "type"): linear, dynamic, yarn, llama3; "" for none
	Factor                        float64 // factor
	OriginalMaxPositionEmbeddings int     // pretrained context (see ReadHFConfig for where it comes from)
	LowFreqFactor                 float64 // low_freq_factor (llama3)
	HighFreqFactor                float64 // high_freq_factor (llama3)
	BetaFast                      float64 // beta_fast (yarn); 0: 32
	BetaSlow                      float64 // beta_slow (yarn); 0: 1
	AttentionFactor               float64 // attention_factor (yarn); 0: 0.1·ln(factor) + 1
}

// hfRopeKeys are the rope_parameters (or rope_scaling) keys distflash reads for each
// rope_type besides rope_type (or type), rope_theta and partial_rotary_factor (which must be
// 1); an object with any other key that is not null is refused.
var hfRopeKeys = map[string][]string{
	"default": nil,
	"linear":  {"factor"},
	"dynamic": {"factor", "original_max_position_embeddings"},
	"yarn":    {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"},
	"llama3":  {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}

// HF file names inside a model directory.
const (
	HFConfigFile = "config.json"
	HFIndexFile  = "model.safetensors.index.json"
)

// WindowNote returns a note for a LLaMA config that carries a sliding window, "" otherwise:
// distflash applies the window the file states, while transformers' LlamaForCausalLM attends
// to the whole causal prefix whatever sliding_window says, so the two would run different
// models from the same directory.
func (c HFConfig) WindowNote() string {
	if c.ModelType != "llama" || c.SlidingWindow == 0 {
		return ""
	}
	return fmt.Sprintf("model_type \"llama\" with sliding_window = %d: the window is applied (transformers' LlamaForCausalLM ignores it; set sliding_window to null to attend to the whole prefix, or model_type to \"mistral\" for transformers to apply it too)", c.SlidingWindow)
}

// ReadHFConfig reads a Hugging Face LLaMA config.json. A required key that is missing, a
// value of the wrong type or out of range, and a setting distflash's LLaMA does not
// implement (model_type other than "llama" or "mistral", hidden_act other than "silu", a RoPE
// type or key other than those below, partial_rotary_factor other than 1, attention_bias or
// mlp_bias true) is an error naming the file, the key and the value; each bad key is named
// once, without the errors that would follow from it.
//
// RoPE is read in both of transformers' forms: transformers ≥ 5 writes "rope_parameters":
// {"rope_type", "rope_theta", scaling keys}; earlier versions wrote a top-level "rope_theta"
// and "rope_scaling" (transformers 5 still reads those, and "rope_theta" inside
// rope_scaling). A config that gives a setting in both places must give it the same
// value: rope_theta (top level, in rope_parameters, in rope_scaling), and the scaling of
// rope_parameters and rope_scaling; a disagreement is an error naming both keys and values.
//
// The scaling is read as transformers computes it (modeling_rope_utils.py), for rope_type
// (or the legacy "type") default, linear, dynamic, yarn and llama3, and
// OriginalMaxPositionEmbeddings is always set for the types that use one: dynamic takes
// max_position_embeddings as the pretrained length (an original_max_position_embeddings
// that differs is refused); yarn takes original_max_position_embeddings, else
// max_position_embeddings, and the explicit factor (as transformers ≥ 4.57 does; earlier
// versions replace factor by max_position_embeddings / original_max_position_embeddings when
// both are set); llama3 requires original_max_position_embeddings, low_freq_factor and
// high_freq_factor. A top-level original_max_position_embeddings, which transformers lets
// override (5) or rescale (4.57, yarn) the scaling's, must agree with it.
func ReadHFConfig(path string) (HFConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return HFConfig{}, fmt.Errorf("weights: read %s: %w", path, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return HFConfig{}, fmt.Errorf("weights: %s: %w", path, err)
	}
	r := hfReader{path: path, m: m, bad: map[string]bool{}}
	c := HFConfig{
		HiddenSize:            r.int("hidden_size", -1),
		IntermediateSize:      r.int("intermediate_size", -1),
		NumHiddenLayers:       r.int("num_hidden_layers", -1),
		NumAttentionHeads:     r.int("num_attention_heads", -1),
		VocabSize:             r.int("vocab_size", -1),
		NumKeyValueHeads:      r.int("num_key_value_heads", 0),
		HeadDim:               r.int("head_dim", 0),
		MaxPositionEmbeddings: r.int("max_position_embeddings", 2048),
		RMSNormEps:            r.float("rms_norm_eps", 1e-6),
		TieWordEmbeddings:     r.bool("tie_word_embeddings", false),
		TorchDtype:            r.string("torch_dtype", ""),
		BOSTokenID:            r.int("bos_token_id", 1),
	}
	if c.TorchDtype == "" { // transformers ≥ 5 writes "dtype"
		c.TorchDtype = r.string("dtype", "")
	}
	switch c.ModelType = r.string("model_type", "llama"); c.ModelType {
	case "llama": // some LLaMA configs carry a window (see WindowNote)
		c.SlidingWindow = r.int("sliding_window", 0)
		if c.SlidingWindow < 0 {
			r.fail("sliding_window = %d: want a positive window, or null for none", c.SlidingWindow)
		}
	case "mistral": // LLaMA's architecture with a sliding window on every layer
		c.SlidingWindow = r.int("sliding_window", 4096)
		if c.SlidingWindow < 0 {
			r.fail("sliding_window = %d: want a positive window, or null for none", c.SlidingWindow)
		}
	default:
		r.fail("model_type = %q: distflash implements LLaMA (model_type \"llama\") and Mistral (\"mistral\")", c.ModelType)
	}
	if v, ok := m["sliding_window"]; ok && isNull(v) {
		c.SlidingWindow = 0
	}
	act := r.string("hidden_act", "silu")
	if act != "silu" && !r.bad["hidden_act"] {
		r.fail("hidden_act = %q: distflash's MLP is SwiGLU, which needs \"silu\"", act)
	}
	c.RopeTheta, c.RopeScaling = r.rope(c.MaxPositionEmbeddings)
	for _, key := range []string{"attention_bias", "mlp_bias"} {
		if r.bool(key, false) {
			r.fail("%s = true: distflash's LLaMA has no biases; want false", key)
		}
	}
	r.positive("hidden_size", c.HiddenSize)
	r.positive("intermediate_size", c.IntermediateSize)
	r.positive("num_hidden_layers", c.NumHiddenLayers)
	r.positive("num_attention_heads", c.NumAttentionHeads)
	r.positive("num_key_value_heads", c.NumKeyValueHeads)
	r.positive("head_dim", c.HeadDim)
	r.positive("vocab_size", c.VocabSize)
	r.positive("max_position_embeddings", c.MaxPositionEmbeddings)
	if c.NumKeyValueHeads <= 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.HeadDim <= 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if v, ok := m["bos_token_id"]; ok && isNull(v) {
		c.BOSTokenID = -1
	}
	// The checks across keys, each only when its keys were read well (a bad key is named
	// once, where it was read).
	if r.good("num_attention_heads", "num_key_value_heads") && c.NumAttentionHeads > 0 && c.NumKeyValueHeads > 0 && c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		r.fail("num_attention_heads = %d is not a multiple of num_key_value_heads = %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if r.good("head_dim", "num_attention_heads", "hidden_size") && c.NumAttentionHeads > 0 &&
		(c.HeadDim <= 0 || c.HeadDim%2 != 0 || c.HeadDim*c.NumAttentionHeads != c.HiddenSize) {
		r.fail("head_dim = %d with num_attention_heads = %d and hidden_size = %d: distflash needs an even head_dim with num_attention_heads × head_dim = hidden_size",
			c.HeadDim, c.NumAttentionHeads, c.HiddenSize)
	}
	if r.good("rms_norm_eps") && (!(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0)) {
		r.fail("rms_norm_eps = %g: must be a positive number", c.RMSNormEps)
	}
	if r.good("bos_token_id", "vocab_size") && (c.BOSTokenID < -1 || c.BOSTokenID >= c.VocabSize && c.VocabSize > 0) {
		r.fail("bos_token_id = %d: must be in [0, vocab_size = %d) or null", c.BOSTokenID, c.VocabSize)
	}
	if len(r.errs) > 0 {
		return HFConfig{}, errors.Join(r.errs...)
	}
	return c, nil
}

// hfReader reads typed keys of a config.json object, collecting one error per bad key.
type hfReader struct {
	path string
	m    map[string]json.RawMessage
	errs []error
	// bad holds the keys already reported (of a wrong type, or required and missing): the
	// checks that combine keys skip them, so that one mistake gives one error.
	bad map[string]bool
}

func (r *hfReader) fail(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("weights: %s: "+format, append([]any{r.path}, args...)...))
}

// failKey is fail for a value of key that is wrong in itself, which marks key bad.
func (r *hfReader) failKey(key, format string, args ...any) {
	if r.bad == nil {
		r.bad = map[string]bool{}
	}
	r.bad[key] = true
	r.fail(format, args...)
}

// good reports whether none of keys has been reported bad.
func (r *hfReader) good(keys ...string) bool {
	for _, k := range keys {
		if r.bad[k] {
			return false
		}
	}
	return true
}

// get returns the raw value of key, or nil when it is absent or null. A required key
// (required true) that is absent or null is an error.
func (r *hfReader) get(key string, required bool) json.RawMessage {
	v, ok := r.m[key]
	if !ok || isNull(v) {
		if required {
			if ok {
				r.failKey(key, "%s is null: it is required", key)
			} else {
				r.failKey(key, "key %q is missing: it is required", key)
			}
		}
		return nil
	}
	return v
}

// int reads an integer key; def < 0 marks the key required.
func (r *hfReader) int(key string, def int) int {
	v := r.get(key, def < 0)
	if v == nil {
		return max(def, 0)
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		r.failKey(key, "%s = %s: want an integer", key, compact(v))
		return max(def, 0)
	}
	return int(f)
}

func (r *hfReader) float(key string, def float64) float64 {
	v := r.get(key, false)
	if v == nil {
		return def
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		r.failKey(key, "%s = %s: want a number", key, compact(v))
		return def
	}
	return f
}

func (r *hfReader) bool(key string, def bool) bool {
	v := r.get(key, false)
	if v == nil {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		r.failKey(key, "%s = %s: want true or false", key, compact(v))
		return def
	}
	return b
}

func (r *hfReader) string(key string, def string) string {
	v := r.get(key, false)
	if v == nil {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		r.failKey(key, "%s = %s: want a string", key, compact(v))
		return def
	}
	return s
}

// positive reports a key that is present with a value <= 0 (absent keys are reported, or
// defaulted, where they are read; keys of a wrong type were reported there).
func (r *hfReader) positive(key string, v int) {
	if raw, ok := r.m[key]; ok && !isNull(raw) && v <= 0 && !r.bad[key] {
		r.failKey(key, "%s = %d: must be > 0", key, v)
	}
}

// object returns the JSON object at key, its keys prefixed with "key.", or nil when key is
// absent, null or {} (which transformers treats as absent).
func (r *hfReader) object(key string) map[string]json.RawMessage {
	v := r.get(key, false)
	if v == nil {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		r.failKey(key, "%s = %s: want an object or null", key, compact(v))
		return nil
	}
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]json.RawMessage, len(m))
	for k, x := range m {
		out[key+"."+k] = x
	}
	return out
}

// rope reads rope_theta and the RoPE scaling from either of transformers' forms (see
// ReadHFConfig); maxPos is max_position_embeddings.
func (r *hfReader) rope(maxPos int) (float64, HFRopeScaling) {
	params, scaling := r.object("rope_parameters"), r.object("rope_scaling")
	sub := hfReader{path: r.path, m: map[string]json.RawMessage{}, bad: r.bad}
	for k, v := range r.m {
		sub.m[k] = v
	}
	for k, v := range params {
		sub.m[k] = v
	}
	for k, v := range scaling {
		sub.m[k] = v
	}

	// rope_theta: wherever it is given, one value.
	theta, thetaKey := 10000.0, ""
	for _, key := range []string{"rope_theta", "rope_parameters.rope_theta", "rope_scaling.rope_theta"} {
		if sub.get(key, false) == nil {
			continue
		}
		v := sub.float(key, 0)
		switch {
		case sub.bad[key]:
		case !(v > 1) || math.IsInf(v, 0):
			sub.failKey(key, "%s = %s: must be a number > 1", key, compact(sub.m[key]))
		case thetaKey == "":
			theta, thetaKey = v, key
		case v != theta:
			sub.fail("%s = %s and %s = %s disagree: give RoPE's base once, or the same value in both (transformers 4 reads rope_theta, transformers 5 the one in rope_parameters or rope_scaling)",
				thetaKey, compact(sub.m[thetaKey]), key, compact(sub.m[key]))
		}
	}

	// partial_rotary_factor: distflash rotates every feature of a head.
	for _, key := range []string{"partial_rotary_factor", "rope_parameters.partial_rotary_factor", "rope_scaling.partial_rotary_factor"} {
		if sub.get(key, false) == nil {
			continue
		}
		if v := sub.float(key, 1); v != 1 && !sub.bad[key] {
			sub.failKey(key, "%s = %s: RoPE on part of each head is not implemented (distflash rotates all head_dim features); want 1 or absent", key, compact(sub.m[key]))
		}
	}

	// The scaling: from rope_parameters, from rope_scaling, and if both, the same.
	var rs HFRopeScaling
	var from map[string]json.RawMessage
	var fromKey string
	for _, o := range []struct {
		key string
		m   map[string]json.RawMessage
	}{{"rope_parameters", params}, {"rope_scaling", scaling}} {
		if o.m == nil {
			continue
		}
		got, ok := sub.ropeScaling(o.key, maxPos)
		switch {
		case !ok:
		case from == nil:
			rs, from, fromKey = got, o.m, o.key
		case got != rs:
			sub.fail("%s = %s and %s = %s disagree: give the RoPE scaling once, or the same in both (transformers 4 reads rope_scaling, transformers 5 rope_parameters unless rope_scaling is set)",
				fromKey, compactN(r.m[fromKey], 400), o.key, compactN(r.m[o.key], 400))
		}
	}

	// A top-level original_max_position_embeddings: transformers 5 puts it in place of the
	// scaling's for yarn and llama3, and 4.57's yarn divides max_position_embeddings by it for
	// the factor.
	if v := sub.get("original_max_position_embeddings", false); v != nil && (rs.Type == "yarn" || rs.Type == "llama3") {
		o := sub.int("original_max_position_embeddings", 0)
		switch {
		case sub.bad["original_max_position_embeddings"]:
		case o != rs.OriginalMaxPositionEmbeddings:
			sub.fail("original_max_position_embeddings = %d and %s.original_max_position_embeddings = %d disagree: transformers uses the top-level one for rope_type %q; give one value",
				o, fromKey, rs.OriginalMaxPositionEmbeddings, rs.Type)
		case rs.Type == "yarn" && float64(maxPos) != rs.Factor*float64(o):
			sub.fail("original_max_position_embeddings = %d with %s.factor = %g and max_position_embeddings = %d: transformers 4 takes yarn's factor as max_position_embeddings / original_max_position_embeddings = %g there; drop the top-level key",
				o, fromKey, rs.Factor, maxPos, float64(maxPos)/float64(o))
		}
	}
	r.errs = append(r.errs, sub.errs...)
	return theta, rs
}

// ropeScaling reads the RoPE scaling of the object at key (rope_parameters or rope_scaling,
// its keys in r.m as "key.name"; see ReadHFConfig); maxPos is max_position_embeddings. It
// reports false when the object is refused.
func (r *hfReader) ropeScaling(key string, maxPos int) (HFRopeScaling, bool) {
	n := len(r.errs)
	var names []string
	for k := range r.m {
		if name, ok := strings.CutPrefix(k, key+"."); ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	typ := r.string(key+".rope_type", "")
	if legacy := r.string(key+".type", ""); typ == "" {
		typ = legacy
	} else if legacy != "" && legacy != typ {
		r.fail("%s.rope_type = %q and %s.type = %q disagree", key, typ, key, legacy)
	}
	if typ == "" {
		typ = "default"
	}
	keys, ok := hfRopeKeys[typ]
	if !ok {
		r.failKey(key+".rope_type", "%s.rope_type = %q: not implemented; distflash implements default, linear, dynamic, yarn, llama3", key, typ)
	}
	for _, k := range names {
		switch {
		case !ok, k == "rope_type", k == "type", k == "rope_theta", k == "partial_rotary_factor":
		case isNull(r.m[key+"."+k]), slices.Contains(keys, k):
		default:
			r.failKey(key+"."+k, "%s.%s = %s: not implemented for rope_type %q (distflash reads %s)", key, k, compact(r.m[key+"."+k]), typ,
				strings.Join(append([]string{"rope_type", "rope_theta"}, keys...), ", "))
		}
	}
	rs := HFRopeScaling{
		Factor:                        r.float(key+".factor", 0),
		OriginalMaxPositionEmbeddings: r.int(key+".original_max_position_embeddings", 0),
		LowFreqFactor:                 r.float(key+".low_freq_factor", 0),
		HighFreqFactor:                r.float(key+".high_freq_factor", 0),
		BetaFast:                      r.float(key+".beta_fast", 0),
		BetaSlow:                      r.float(key+".beta_slow", 0),
		AttentionFactor:               r.float(key+".attention_factor", 0),
	}
	if ok && typ != "default" {
		rs.Type = typ
		required := []string{"factor"}
		if typ == "llama3" {
			required = keys
		}
		for _, k := range required {
			r.get(key+"."+k, true)
		}
	}
	if f := r.m[key+".factor"]; rs.Type != "" && !(rs.Factor >= 1) && f != nil && !isNull(f) && r.good(key+".factor") {
		r.fail("%s.factor = %s: must be ≥ 1", key, compact(f))
	}
	switch typ {
	case "dynamic":
		if o := rs.OriginalMaxPositionEmbeddings; o != 0 && o != maxPos {
			r.fail("%s.original_max_position_embeddings = %d differs from max_position_embeddings = %d: transformers' dynamic scaling takes max_position_embeddings as the pretrained length", key, o, maxPos)
		}
		rs.OriginalMaxPositionEmbeddings = maxPos
	case "yarn":
		if rs.OriginalMaxPositionEmbeddings == 0 {
			rs.OriginalMaxPositionEmbeddings = maxPos
		}
	}
	if !ok || rs.Type == "" {
		rs = HFRopeScaling{Type: rs.Type}
	}
	return rs, len(r.errs) == n
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// compact shortens a JSON value for an error message.
func compact(v json.RawMessage) string { return compactN(v, 80) }

// compactN is v without its spaces, cut to n bytes.
func compactN(v json.RawMessage, n int) string {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	s := b.String()
	if len(s) > n {
		s = s[:n-3] + "..."
	}
	return s
}

// HFModel is a Hugging Face LLaMA directory opened by OpenHF: its config, which file holds
// each tensor, and its tokenizer file.
type HFModel struct {
	Dir    string
	Config HFConfig
	// Tokenizer is the path of the directory's tokenizer.json, else of its tokenizer.model
	// (SentencePiece), else "": Hugging Face's fast tokenizers prefer tokenizer.json too.
	Tokenizer string
	// Files maps each tensor name to the safetensors file that holds it.
	Files map[string]string
}

// IsHFDir reports whether dir is meant as a Hugging Face model directory: it has a
// config.json that is not distflash's own (the resolved TOML config train writes into a run
// directory, an object with "run" and "model" sections). A broken config.json counts, so that
// OpenHF reports what is wrong with it.
func IsHFDir(dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, HFConfigFile))
	if err != nil {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return true
	}
	_, run := m["run"]
	_, mod := m["model"]
	return !(run && mod)
}

// OpenHF reads dir's config.json and finds its weights: the shards that
// model.safetensors.index.json lists when it exists (each must exist and hold the tensors
// the index puts there), otherwise every *.safetensors file in dir. Only the safetensors
// headers are read here (and, with tie_word_embeddings, a stored lm_head.weight, which must be
// the embedding); Load reads the data. Architecture keys distflash does not implement are
// refused (CheckHFArchitecture).
func OpenHF(dir string) (*HFModel, error) {
	cfg, err := ReadHFConfig(filepath.Join(dir, HFConfigFile))
	if err != nil {
		return nil, err
	}
	if err := CheckHFArchitecture(filepath.Join(dir, HFConfigFile)); err != nil {
		return nil, err
	}
	h := &HFModel{Dir: dir, Config: cfg, Files: map[string]string{}}
	for _, name := range []string{"tokenizer.json", "tokenizer.model"} { // as HF's fast tokenizers choose
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() {
			h.Tokenizer = filepath.Join(dir, name)
			break
		}
	}
	indexPath := filepath.Join(dir, HFIndexFile)
	raw, err := os.ReadFile(indexPath)
	switch {
	case err == nil:
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &index); err != nil {
			return nil, fmt.Errorf("weights: %s: %w", indexPath, err)
		}
		if len(index.WeightMap) == 0 {
			return nil, fmt.Errorf("weights: %s: weight_map is empty or missing", indexPath)
		}
		byFile := map[string][]string{}
		for name, file := range index.WeightMap {
			byFile[file] = append(byFile[file], name)
		}
		for _, file := range slices.Sorted(maps.Keys(byFile)) {
			path, err := localFile(fmt.Sprintf("%s (for tensor %q)", indexPath, slices.Min(byFile[file])), dir, file)
			if err != nil {
				return nil, err
			}
			names, err := safetensors.ReadNames(path)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil, fmt.Errorf("weights: %s lists shard %s (for %d tensors, e.g. %q), which is missing: %w",
						indexPath, file, len(byFile[file]), slices.Min(byFile[file]), err)
				}
				return nil, err
			}
			for _, name := range byFile[file] {
				if !slices.Contains(names, name) {
					return nil, fmt.Errorf("weights: %s puts tensor %q in %s, which does not hold it", indexPath, name, path)
				}
				h.Files[name] = path
			}
		}
	case errors.Is(err, fs.ErrNotExist):
		files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		if len(files) == 0 {
			return nil, fmt.Errorf("weights: %s: no model.safetensors, %s or other *.safetensors file (PyTorch .bin weights are not read: convert them to safetensors)", dir, HFIndexFile)
		}
		sort.Strings(files)
		for _, path := range files {
			if _, err := localFile(dir, dir, filepath.Base(path)); err != nil {
				return nil, err
			}
			names, err := safetensors.ReadNames(path)
			if err != nil {
				return nil, err
			}
			for _, name := range names {
				if prev, dup := h.Files[name]; dup {
					return nil, fmt.Errorf("weights: %s: tensor %q is in both %s and %s", dir, name, prev, path)
				}
				h.Files[name] = path
			}
		}
	default:
		return nil, fmt.Errorf("weights: read %s: %w", indexPath, err)
	}
	if err := h.checkTied(); err != nil {
		return nil, err
	}
	return h, nil
}

// Dest is a tensor to fill: the name to load, the shape it must have, and where its values go
// (len(Data) = the product of Shape).
type Dest struct {
	Name  string
	Shape []int
	Data  []float32
}

// ignoredHFTensor reports whether a tensor of a Hugging Face checkpoint carries no weights
// (older LLaMA checkpoints store RoPE's inverse frequencies, which are computed, not learned).
func ignoredHFTensor(name string) bool { return strings.HasSuffix(name, ".rotary_emb.inv_freq") }

// Load fills every dest from the model's files, converting F32, F16, BF16 and F64 values to
// float32; with tie_word_embeddings, lm_head.weight is read from model.embed_tokens.weight.
// Each file is read once. A tensor that is missing, has another shape or an integer dtype is
// an error naming the file, as is a tensor of the files that no dest asks for (a bias, say,
// which would mean an architecture distflash does not implement); RoPE's rotary_emb.inv_freq
// buffers are skipped.
func (h *HFModel) Load(dsts []Dest) error {
	byFile := map[string][]int{} // file → indexes into dsts
	src := make([]string, len(dsts))
	wanted := map[string]bool{}
	for i, d := range dsts {
		src[i] = d.Name
		if d.Name == "lm_head.weight" && h.Config.TieWordEmbeddings {
			if _, ok := h.Files[d.Name]; !ok {
				src[i] = "model.embed_tokens.weight"
			}
		}
		file, ok := h.Files[src[i]]
		if !ok {
			msg := fmt.Sprintf("weights: %s: no tensor %q in its safetensors files", h.Dir, src[i])
			if d.Name == "lm_head.weight" {
				msg += " (and tie_word_embeddings is false)"
			}
			return errors.New(msg)
		}
		if n := shapeSize(d.Shape); len(d.Data) != n {
			return fmt.Errorf("weights: Load %s: %d values for shape %v", d.Name, len(d.Data), d.Shape)
		}
		byFile[file] = append(byFile[file], i)
		wanted[src[i]] = true
	}
	for _, name := range slices.Sorted(maps.Keys(h.Files)) {
		if !wanted[name] && !ignoredHFTensor(name) {
			return fmt.Errorf("weights: %s: tensor %q is not a parameter of the model (a bias, or another architecture?)", h.Files[name], name)
		}
	}
	for _, file := range slices.Sorted(maps.Keys(byFile)) {
		st, err := safetensors.Read(file)
		if err != nil {
			return err
		}
		for _, i := range byFile[file] {
			if err := loadTensor(st, src[i], dsts[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadTensor copies tensor name of s into d, checking its dtype and shape.
func loadTensor(s *safetensors.File, name string, d Dest) error {
	t, ok := s.Tensors[name]
	if !ok {
		return fmt.Errorf("weights: %s: no tensor %q", s.Path, name)
	}
	switch t.DType {
	case "F32", "F16", "BF16", "F64":
	default:
		return fmt.Errorf("weights: %s: tensor %q has dtype %s: want a floating-point dtype (F32, F16, BF16, F64)", s.Path, name, t.DType)
	}
	if !slices.Equal(t.Shape, d.Shape) {
		return fmt.Errorf("weights: %s: tensor %q has shape %v, the model (from config.json) needs %v", s.Path, name, t.Shape, d.Shape)
	}
	v, _, err := s.Float32(name)
	if err != nil {
		return err
	}
	copy(d.Data, v)
	return nil
}

func shapeSize(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// PermuteQK converts the rows of a q or k projection ([heads·headDim, in], row-major) from
// Meta's original LLaMA layout, where RoPE rotates neighbouring features (2i, 2i+1) of a head,
// to the Hugging Face layout distflash uses, where it rotates i and i+headDim/2 (rotate-half):
// row h·headDim + 2i + c moves to h·headDim + c·headDim/2 + i (c = 0, 1). It is the permute of
// transformers' convert_llama_weights_to_hf.py. heads is n_heads for q_proj and n_kv_heads
// for k_proj. It returns a new slice; UnpermuteQK is its inverse.
func PermuteQK(w []float32, heads, headDim, in int) []float32 {
	return permuteQK(w, heads, headDim, in, false)
}

// UnpermuteQK is the inverse of PermuteQK: Hugging Face (rotate-half) rows to Meta's
// interleaved ones.
func UnpermuteQK(w []float32, heads, headDim, in int) []float32 {
	return permuteQK(w, heads, headDim, in, true)
}

func permuteQK(w []float32, heads, headDim, in int, inverse bool) []float32 {
	if heads <= 0 || headDim <= 0 || headDim%2 != 0 || in <= 0 || len(w) != heads*headDim*in {
		panic(fmt.Sprintf("weights: PermuteQK of %d values as %d heads × %d (even) × %d", len(w), heads, headDim, in))
	}
	out := make([]float32, len(w))
	half := headDim / 2
	for h := 0; h < heads; h++ {
		for i := 0; i < half; i++ {
			for c := 0; c < 2; c++ {
				meta := h*headDim + 2*i + c
				hf := h*headDim + c*half + i
				from, to := meta, hf
				if inverse {
					from, to = hf, meta
				}
				copy(out[to*in:(to+1)*in], w[from*in:(from+1)*in])
			}
		}
	}
	return out
}
