package ckpt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"distflash/data"
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
	SlidingWindow         int            `json:"sliding_window,omitempty"` // Mistral's window
}

// exportRopeScaling is config.json's rope_scaling for rs (nil: none) with only the keys
// transformers reads for its rope_type, and the max_position_embeddings that makes
// transformers (and ReadHFConfig with HFConfig.ContextLength) compute the model's table for a
// context of maxSeqLen: dynamic scaling takes max_position_embeddings as the pretrained
// length, so it is original_max_position_embeddings there; the other types keep maxSeqLen
// (model.max_seq_len) and name the pretrained length in rope_scaling.
func exportRopeScaling(rs HFRopeScaling, maxSeqLen int) (map[string]any, int) {
	m := map[string]any{"rope_type": rs.Type, "factor": rs.Factor}
	put := func(key string, v float64) {
		if v != 0 {
			m[key] = v
		}
	}
	switch rs.Type {
	case "", "none":
		return nil, maxSeqLen
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
	return m, maxSeqLen
}

// ExportConfig is the config.json of a model of shape c stored as dtype, with BOS and EOS
// token ids (null where negative): LlamaForCausalLM, or MistralForCausalLM with its
// sliding_window when c has a window (on every layer: the caller refuses a window on some). c is in distflash's terms: MaxPositionEmbeddings is the
// model's context (model.max_seq_len), and the file's max_position_embeddings follows
// rope_scaling (exportRopeScaling); BOSTokenID and TorchDtype are not read.
func ExportConfig(c HFConfig, dtype string, bos, eos int32) ([]byte, error) {
	j := hfConfigJSON{
		Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama", SlidingWindow: c.SlidingWindow,
		HiddenSize: c.HiddenSize, IntermediateSize: c.IntermediateSize, NumHiddenLayers: c.NumHiddenLayers,
		NumAttentionHeads: c.NumAttentionHeads, NumKeyValueHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim,
		HiddenAct: "silu", RMSNormEps: c.RMSNormEps,
		RopeTheta: c.RopeTheta, VocabSize: c.VocabSize, PretrainingTP: 1, InitializerRange: 0.02,
		UseCache: true, TorchDtype: map[string]string{DTypeF32: "float32", DTypeBF16: "bfloat16"}[dtype],
	}
	j.RopeScaling, j.MaxPositionEmbeddings = exportRopeScaling(c.RopeScaling, c.MaxPositionEmbeddings)
	if c.SlidingWindow > 0 { // a window on every layer: Mistral, which transformers masks so
		j.Architectures, j.ModelType = []string{"MistralForCausalLM"}, "mistral"
	}
	if bos >= 0 {
		j.BOSTokenID = &bos
	}
	if eos >= 0 {
		j.EOSTokenID = &eos
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(j); err != nil {
		return nil, fmt.Errorf("export: encode config.json: %w", err)
	}
	return b.Bytes(), nil
}

// TokenizerFiles are the files of the tokenizer name (data.tokenizer) to copy into an
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

// Exported is what ExportLlama wrote.
type Exported struct {
	Files      []string // names in the directory
	Bytes      int64    // their total size
	Tokenizer  string   // the tokenizer's name
	NoTokFiles bool     // the tokenizer has no Hugging Face files (the byte tokenizer): none written
}

// ExportLlama writes a model of shape c (as ExportConfig takes it) with the given tensors
// (Hugging Face's names and q/k row layout, which are distflash's) as a LLaMA directory out,
// which must not exist or be empty: config.json with the BOS and EOS of the tokenizer
// (data.tokenizer) when it has them, the weights as safetensors of dtype (DTypeF32 or
// DTypeBF16) in shards of at most maxShard bytes, and the tokenizer's files (TokenizerFiles).
func ExportLlama(out string, c HFConfig, tensors []WTensor, tokenizer, dtype string, maxShard int64, hooks *HFHooks) (Exported, error) {
	tok, err := data.NewTokenizer(tokenizer)
	if err != nil {
		return Exported{}, fmt.Errorf("export: the run's data.tokenizer %q: %w", tokenizer, err)
	}
	bos, eos := int32(-1), int32(-1)
	if st, ok := tok.(data.SpecialTokens); ok {
		bos, eos = st.Specials()
	}
	cfgJSON, err := ExportConfig(c, dtype, bos, eos)
	if err != nil {
		return Exported{}, err
	}
	copies, err := TokenizerFiles(tokenizer)
	if err != nil {
		return Exported{}, fmt.Errorf("export: the run's data.tokenizer %q: %w", tokenizer, err)
	}
	files, err := WriteHF(out, HFExport{Config: cfgJSON, Tensors: tensors, DType: dtype, MaxShardSize: maxShard, Copy: copies, Hooks: hooks})
	if err != nil {
		return Exported{}, fmt.Errorf("export: %w", err)
	}
	ex := Exported{Files: files, Tokenizer: tok.Name(), NoTokFiles: len(copies) == 0}
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(out, f)); err == nil {
			ex.Bytes += fi.Size()
		}
	}
	return ex, nil
}
