package weights

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"distflash/data"
	"distflash/model"
	"distflash/weights/safetensors"
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
		UseCache: true, TorchDtype: map[string]string{safetensors.DTypeF32: "float32", safetensors.DTypeBF16: "bfloat16"}[dtype],
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

// ExportOptions are how ExportHF stores the weights.
type ExportOptions struct {
	DType    string   // safetensors.DTypeF32 or safetensors.DTypeBF16
	MaxShard int64    // most tensor bytes per safetensors file (HFExport.MaxShardSize); 0: one file
	Hooks    *HFHooks // see HFExport.Hooks; nil: none
}

// Exported is what ExportHF read and wrote.
type Exported struct {
	Checkpoint string       // the step directory read
	Step       int          // its step
	Model      model.Config // the model's shape
	Arch       string       // the architecture config.json names: LlamaForCausalLM or MistralForCausalLM
	Files      []string     // names in the directory
	Bytes      int64        // their total size
	Tokenizer  string       // the tokenizer's name
	NoTokFiles bool         // the tokenizer has no Hugging Face files (the byte tokenizer): none written
}

// ExportHF writes the distflash checkpoint at path (a step directory, or a run directory for
// its newest intact step, as LoadCheckpoint reads it; what it read is noted on stderr) as a
// Hugging Face directory out, which must not exist or be empty, with WriteHF: config.json
// (LlamaForCausalLM, or MistralForCausalLM for a model windowed on every layer) with the BOS
// and EOS of the run's data.tokenizer when it has them, the weights as safetensors, and the
// tokenizer's files (TokenizerFiles). A model windowed on some layers only is refused before
// anything is written: config.json has a window on every layer or none. Tensor names and the
// q/k row layout are already Hugging Face's (see hf.go), so the weights are written as they
// are.
func ExportHF(path, out string, o ExportOptions, stderr io.Writer) (Exported, error) {
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
		return Exported{}, fmt.Errorf("export: --out %s exists and is not empty: export writes a new directory", out)
	}
	if fi, err := os.Stat(path); err != nil {
		return Exported{}, fmt.Errorf("export: --model: %w", err)
	} else if !fi.IsDir() || IsHFDir(path) {
		return Exported{}, fmt.Errorf("export: --model %s: want a distflash checkpoint (a step directory or a run directory)", path)
	}
	saved, params, dir, step, err := LoadCheckpoint(path, stderr)
	if err != nil {
		return Exported{}, fmt.Errorf("export: --model %w", err)
	}
	fmt.Fprintf(stderr, "export: %s (step %d)\n", dir, step)
	mc := saved.Model
	ex := Exported{Checkpoint: dir, Step: step, Model: mc, Arch: "LlamaForCausalLM"}
	if mc.SlidingWindow > 0 {
		// Mistral's config.json has one window for every layer and no way to say "these
		// layers only": exporting a model windowed on some layers would give another model
		var global []int
		for l := range mc.NLayers {
			if mc.Window(l) == 0 {
				global = append(global, l)
			}
		}
		if len(global) > 0 {
			return Exported{}, fmt.Errorf("export: --model %s: model.sliding_window = %d leaves layers %v of %d without the window (model.sliding_window_layers = %v, model.sliding_window_pattern = %d): a Hugging Face LLaMA or Mistral config.json has a window on every layer or none; nothing written",
				dir, mc.SlidingWindow, global, mc.NLayers, mc.SlidingWindowLayers, mc.SlidingWindowPattern)
		}
		ex.Arch = "MistralForCausalLM"
	}
	tokenizer := saved.Data.Tokenizer
	tok, err := data.NewTokenizer(tokenizer)
	if err != nil {
		return Exported{}, fmt.Errorf("export: the run's data.tokenizer %q: %w", tokenizer, err)
	}
	bos, eos := int32(-1), int32(-1)
	if st, ok := tok.(data.SpecialTokens); ok {
		bos, eos = st.Specials()
	}
	cfgJSON, err := ExportConfig(HFConfigOf(mc), o.DType, bos, eos)
	if err != nil {
		return Exported{}, err
	}
	copies, err := TokenizerFiles(tokenizer)
	if err != nil {
		return Exported{}, fmt.Errorf("export: the run's data.tokenizer %q: %w", tokenizer, err)
	}
	files, err := WriteHF(out, HFExport{Config: cfgJSON, Tensors: Tensors(mc, params), DType: o.DType, MaxShardSize: o.MaxShard, Copy: copies, Hooks: o.Hooks})
	if err != nil {
		return Exported{}, fmt.Errorf("export: %w", err)
	}
	ex.Files, ex.Tokenizer, ex.NoTokFiles = files, tok.Name(), len(copies) == 0
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(out, f)); err == nil {
			ex.Bytes += fi.Size()
		}
	}
	return ex, nil
}
