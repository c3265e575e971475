package ckpt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"distflash/data"
	"distflash/model"
)

// hfConfigJSON is the config.json export writes: every field transformers' LlamaConfig reads,
// in its usual order.
type hfConfigJSON struct {
	Architectures         []string       `json:"architectures"`
	ModelType             string         `json:"model_type"`
	HiddenSize            int            `json:"hidden_size"`
	IntermediateSize      int            `json:"intermediate_size"`
	NumHiddenLayers       int            `json:"num_hidden_layers"`
	NumAttentionHeads     int            `json:"num_attention_heads"`
	NumKeyValueHeads      int            `json:"num_key_value_heads"`
	HeadDim               int            `json:"head_dim"`
	HiddenAct             string         `json:"hidden_act"`
	MaxPositionEmbeddings int            `json:"max_position_embeddings"`
	RMSNormEps            float64        `json:"rms_norm_eps"`
	RopeTheta             float64        `json:"rope_theta"`
	RopeScaling           map[string]any `json:"rope_scaling"`
	VocabSize             int            `json:"vocab_size"`
	TieWordEmbeddings     bool           `json:"tie_word_embeddings"`
	AttentionBias         bool           `json:"attention_bias"`
	AttentionDropout      float64        `json:"attention_dropout"`
	MLPBias               bool           `json:"mlp_bias"`
	PretrainingTP         int            `json:"pretraining_tp"`
	InitializerRange      float64        `json:"initializer_range"`
	UseCache              bool           `json:"use_cache"`
	BOSTokenID            *int32         `json:"bos_token_id"`
	EOSTokenID            *int32         `json:"eos_token_id"`
	TorchDtype            string         `json:"torch_dtype"`
}

// hfRopeScaling is config.json's rope_scaling for mc (nil: none) with only the keys
// transformers reads for its rope_type, and the max_position_embeddings that makes
// transformers (and ReadHFConfig with HFConfig.ContextLength) compute mc's table:
// dynamic scaling takes max_position_embeddings as the pretrained length, so it is
// original_max_position_embeddings there; the other types keep model.max_seq_len and name the
// pretrained length in rope_scaling.
func exportRopeScaling(mc model.Config) (map[string]any, int) {
	rs := mc.RopeScaling
	m := map[string]any{"rope_type": rs.Type, "factor": rs.Factor}
	put := func(key string, v float64) {
		if v != 0 {
			m[key] = v
		}
	}
	switch rs.Type {
	case "", "none":
		return nil, mc.MaxSeqLen
	case "dynamic":
		return m, rs.OriginalMaxPositionEmbeddings
	case "yarn":
		m["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
		put("beta_fast", rs.BetaFast)
		put("beta_slow", rs.BetaSlow)
		put("attention_factor", rs.AttentionFactor)
	case "llama3":
		m["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
		m["low_freq_factor"], m["high_freq_factor"] = rs.LowFreqFactor, rs.HighFreqFactor
	}
	return m, mc.MaxSeqLen
}

// exportConfig is the config.json of model mc stored as dtype, with the tokenizer's BOS and
// EOS ids when it has them (null otherwise).
func ExportConfig(mc model.Config, dtype string, tok data.Tokenizer) ([]byte, error) {
	c := hfConfigJSON{
		Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama",
		HiddenSize: mc.Dim, IntermediateSize: mc.FFNDim, NumHiddenLayers: mc.NLayers,
		NumAttentionHeads: mc.NHeads, NumKeyValueHeads: mc.NKVHeads, HeadDim: mc.HeadDim,
		HiddenAct: "silu", MaxPositionEmbeddings: mc.MaxSeqLen, RMSNormEps: mc.NormEps,
		RopeTheta: mc.RopeTheta, VocabSize: mc.VocabSize, PretrainingTP: 1, InitializerRange: 0.02,
		UseCache: true, TorchDtype: map[string]string{DTypeF32: "float32", DTypeBF16: "bfloat16"}[dtype],
	}
	c.RopeScaling, c.MaxPositionEmbeddings = exportRopeScaling(mc)
	if st, ok := tok.(data.SpecialTokens); ok {
		bos, eos := st.Specials()
		if bos >= 0 {
			c.BOSTokenID = &bos
		}
		if eos >= 0 {
			c.EOSTokenID = &eos
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("export: encode config.json: %w", err)
	}
	return b.Bytes(), nil
}

// tokenizerFiles are the files of the tokenizer name (data.tokenizer) to copy into an
// exported directory: the tokenizer file under its Hugging Face name (tokenizer.json or
// tokenizer.model), and tokenizer_config.json, special_tokens_map.json and the other of the
// two tokenizer files when they lie beside it. The byte tokenizer has none.
func TokenizerFiles(name string) (map[string]string, error) {
	if name == "" || name == "byte" {
		return nil, nil
	}
	path, err := data.ExpandPath(name)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	dir, files := path, map[string]string{}
	if !fi.IsDir() {
		dir = filepath.Dir(path)
		head := make([]byte, 64)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		n, _ := io.ReadFull(f, head)
		f.Close()
		if t := bytes.TrimLeft(head[:n], " \t\r\n"); len(t) > 0 && t[0] == '{' {
			files["tokenizer.json"] = path
		} else {
			files["tokenizer.model"] = path
		}
	}
	for _, f := range []string{"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"} {
		if _, ok := files[f]; ok {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, f)); err == nil && fi.Mode().IsRegular() {
			files[f] = filepath.Join(dir, f)
		}
	}
	return files, nil
}
