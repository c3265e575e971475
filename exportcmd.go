package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"distflash/ckpt"
	"distflash/data"
	"distflash/model"
)

// `distflash export`: a checkpoint of distflash as a Hugging Face LLaMA directory that
// transformers' LlamaForCausalLM.from_pretrained loads: config.json, the weights as
// safetensors (sharded above --max-shard-size, with model.safetensors.index.json) and the
// tokenizer files of the run's data.tokenizer. Tensor names and the q/k row layout are
// already Hugging Face's (see package ckpt), so the weights are written as they are.

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
// transformers (and ckpt.ReadHFConfig with HFConfig.ContextLength) compute mc's table:
// dynamic scaling takes max_position_embeddings as the pretrained length, so it is
// original_max_position_embeddings there; the other types keep model.max_seq_len and name the
// pretrained length in rope_scaling.
func hfRopeScaling(mc model.Config) (map[string]any, int) {
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
func exportConfig(mc model.Config, dtype string, tok data.Tokenizer) ([]byte, error) {
	c := hfConfigJSON{
		Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama",
		HiddenSize: mc.Dim, IntermediateSize: mc.FFNDim, NumHiddenLayers: mc.NLayers,
		NumAttentionHeads: mc.NHeads, NumKeyValueHeads: mc.NKVHeads, HeadDim: mc.HeadDim,
		HiddenAct: "silu", MaxPositionEmbeddings: mc.MaxSeqLen, RMSNormEps: mc.NormEps,
		RopeTheta: mc.RopeTheta, VocabSize: mc.VocabSize, PretrainingTP: 1, InitializerRange: 0.02,
		UseCache: true, TorchDtype: map[string]string{ckpt.DTypeF32: "float32", ckpt.DTypeBF16: "bfloat16"}[dtype],
	}
	c.RopeScaling, c.MaxPositionEmbeddings = hfRopeScaling(mc)
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
func tokenizerFiles(name string) (map[string]string, error) {
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

// runExport is `distflash export`.
func runExport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "distflash checkpoint: a step directory, or a run directory for its newest step (required)")
	out := fs.String("out", "", "the Hugging Face directory to write; must not exist or be empty (required)")
	dtype := fs.String("dtype", "f32", "stored weights: f32 (exact) or bf16 (rounded to nearest even)")
	maxShard := fs.String("max-shard-size", "5GB", "most tensor bytes per safetensors file, as Hugging Face's max_shard_size (5GB, 500MB, 2GiB…); above it the weights are sharded with model.safetensors.index.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("export: unexpected arguments %q", fs.Args())
	}
	if *modelPath == "" || *out == "" {
		return errors.New("export: --model CHECKPOINT and --out DIR are required")
	}
	st := map[string]string{"f32": ckpt.DTypeF32, "bf16": ckpt.DTypeBF16}[*dtype]
	if st == "" {
		return fmt.Errorf("export: --dtype %q: want f32 or bf16", *dtype)
	}
	shardSize, err := ckpt.ParseSize(*maxShard)
	if err != nil {
		return fmt.Errorf("export: --max-shard-size: %w", err)
	}
	if ents, err := os.ReadDir(*out); err == nil && len(ents) > 0 {
		return fmt.Errorf("export: --out %s exists and is not empty: export writes a new directory", *out)
	}
	if fi, err := os.Stat(*modelPath); err != nil {
		return fmt.Errorf("export: --model: %w", err)
	} else if !fi.IsDir() || ckpt.IsHFDir(*modelPath) {
		return fmt.Errorf("export: --model %s: want a distflash checkpoint (a step directory or a run directory)", *modelPath)
	}
	saved, params, dir, step, err := loadCheckpointParams(*modelPath, stderr)
	if err != nil {
		return fmt.Errorf("export: --model %w", err)
	}
	fmt.Fprintf(stderr, "export: %s (step %d)\n", dir, step)
	mc := saved.Model
	tok, err := data.NewTokenizer(saved.Data.Tokenizer)
	if err != nil {
		return fmt.Errorf("export: the run's data.tokenizer %q: %w", saved.Data.Tokenizer, err)
	}
	cfgJSON, err := exportConfig(mc, st, tok)
	if err != nil {
		return err
	}
	copies, err := tokenizerFiles(saved.Data.Tokenizer)
	if err != nil {
		return fmt.Errorf("export: the run's data.tokenizer %q: %w", saved.Data.Tokenizer, err)
	}
	layout := model.NewLayout(mc)
	tensors := make([]ckpt.WTensor, len(layout.Tensors))
	for i, t := range layout.Tensors {
		tensors[i] = ckpt.WTensor{Name: t.Name, Shape: t.Shape, Data: params[t.Off : t.Off+t.Size()]}
	}
	files, err := ckpt.WriteHF(*out, ckpt.HFExport{Config: cfgJSON, Tensors: tensors, DType: st,
		MaxShardSize: shardSize, Copy: copies})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	var size int64
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(*out, f)); err == nil {
			size += fi.Size()
		}
	}
	fmt.Fprintf(stdout, "export: %s -> %s (LlamaForCausalLM, %s params, %s, %.1f MB): %s\n",
		*modelPath, *out, count(mc.NumParams()), *dtype, float64(size)/1e6, strings.Join(files, ", "))
	if len(copies) == 0 {
		fmt.Fprintf(stdout, "export: the run used the %s tokenizer, which has no Hugging Face tokenizer file: none written (one token per UTF-8 byte, ids 0-255, no BOS/EOS)\n", tok.Name())
	}
	return nil
}
