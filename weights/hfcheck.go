package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"distflash/weights/safetensors"
)

// Architecture checks of Hugging Face directories beyond the keys ReadHFConfig reads: a
// setting that would make the model something other than distflash's LLaMA is refused by
// name, never ignored.

// unsupportedHFKeys are config.json keys of LLaMA relatives (Mixtral, Mistral, Qwen2-MoE,
// DeepSeek, quantized exports…) that distflash does not implement, with what each would
// need. Each is refused when present with a value that turns it on: not null, false, 0 or
// an empty object.
var unsupportedHFKeys = []struct{ key, what string }{
	{"num_local_experts", "mixture-of-experts MLPs (Mixtral)"},
	{"num_experts", "mixture-of-experts MLPs"},
	{"n_routed_experts", "mixture-of-experts MLPs (DeepSeek)"},
	{"num_experts_per_tok", "mixture-of-experts routing"},
	{"moe_intermediate_size", "mixture-of-experts MLPs"},
	{"use_sliding_window", "sliding-window attention (Qwen2)"},
	{"quantization_config", "quantized weights (GPTQ, AWQ, bitsandbytes…); export the model in float16, bfloat16 or float32"},
	{"attn_logit_softcapping", "attention logit soft-capping"},
	{"final_logit_softcapping", "output logit soft-capping"},
	{"qk_layernorm", "normalized queries and keys"},
	{"use_qk_norm", "normalized queries and keys"},
	{"no_rope_layers", "layers without RoPE"},
	{"attention_multiplier", "a scaled attention (Granite)"},
	{"embedding_multiplier", "a scaled embedding (Granite)"},
	{"residual_multiplier", "a scaled residual stream (Granite)"},
	{"logits_scaling", "scaled logits (Granite)"},
}

// CheckHFArchitecture reads the config.json at path and refuses every key that turns on an
// architecture feature distflash's LLaMA does not have (see unsupportedHFKeys), naming the
// file, the key and its value. Keys ReadHFConfig reads (hidden_act, attention_bias,
// mlp_bias, rope_theta, rope_parameters, rope_scaling, partial_rotary_factor,
// original_max_position_embeddings, head_dim, model_type) are checked there.
func CheckHFArchitecture(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("weights: read %s: %w", path, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("weights: %s: %w", path, err)
	}
	var errs []error
	for _, u := range unsupportedHFKeys {
		v, ok := m[u.key]
		if !ok || isOff(v) {
			continue
		}
		errs = append(errs, fmt.Errorf("weights: %s: %s = %s: %s is not implemented; want null or absent", path, u.key, compact(v), u.what))
	}
	return errors.Join(errs...)
}

// isOff reports whether a JSON value leaves a feature off: null, false, 0, "" or {}.
func isOff(v json.RawMessage) bool {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return false
	}
	switch x := x.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// checkTied refuses a directory whose config says tie_word_embeddings but whose files hold
// an lm_head.weight that is not the embedding: transformers would tie the two and drop the
// stored head, so loading either one would give another model than the files describe. (The
// other mismatch, tie_word_embeddings false with no lm_head.weight, is refused by Load.)
func (h *HFModel) checkTied() error {
	headFile, ok := h.Files["lm_head.weight"]
	if !h.Config.TieWordEmbeddings || !ok {
		return nil
	}
	embFile, ok := h.Files["model.embed_tokens.weight"]
	if !ok {
		return nil // Load reports the missing embedding
	}
	head, err := safetensors.ReadTensor(headFile, "lm_head.weight")
	if err != nil {
		return err
	}
	emb, err := safetensors.ReadTensor(embFile, "model.embed_tokens.weight")
	if err != nil {
		return err
	}
	if head.DType != emb.DType || !slices.Equal(head.Shape, emb.Shape) || string(head.Data) != string(emb.Data) {
		return fmt.Errorf("weights: %s: tie_word_embeddings = true, but %s holds an lm_head.weight (%s %v) that differs from model.embed_tokens.weight (%s %v): set tie_word_embeddings to false to use the separate head, or drop lm_head.weight",
			filepath.Join(h.Dir, HFConfigFile), filepath.Base(headFile), head.DType, head.Shape, emb.DType, emb.Shape)
	}
	return nil
}
