// Package weights is every model format distflash reads and writes: Hugging Face LLaMA and
// Mistral directories (config.json, safetensors weights in one file or in shards with their
// index, the tokenizer files: OpenHF reads them, WriteHF and ExportHF write them), a
// .safetensors file of distflash's parameter names (LoadSafetensors), and distflash's own
// checkpoints read as a model (LoadCheckpoint); and the loaders of the commands on top of them:
// Load (eval and generate), LoadSource (train --init-from) and ExportHF (export). The
// safetensors format itself is package weights/safetensors; the training checkpoint format
// (manifest, shards, commit, locks) is package ckpt.
//
// Layer: weights imports config, model, data, ckpt and weights/safetensors; evaluate, train
// and the commands import it.
package weights

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/model"
	"distflash/weights/safetensors"
)

// Model is a model loaded to evaluate or generate with (Load).
type Model struct {
	Config    model.Config
	Params    []float32      // in model.NewLayout(cfg) order
	Tokenizer data.Tokenizer // the model's tokenizer
	BOS       int32          // BOS token prepended to every sample; -1: none
	Source    string         // "hf", "safetensors" or "checkpoint"
	Path      string         // what was loaded: the step directory of a checkpoint, else the path given
	Step      int            // a checkpoint's step; -1 for other models
	Saved     *config.Config // a checkpoint's training config; nil for other models
}

// Describe names what was loaded: "runs/tiny/step-000600 (step 600)" for a checkpoint, else
// its path.
func (m Model) Describe() string {
	if m.Step >= 0 {
		return fmt.Sprintf("%s (step %d)", m.Path, m.Step)
	}
	return m.Path
}

// Load loads eval's and generate's --model (its errors are the command's to prefix): a Hugging Face LLaMA directory (a config.json that
// is not distflash's own, see IsHFDir, and safetensors weights), a .safetensors file holding
// distflash's parameter names for the config's [model] shape, or a checkpoint directory of
// this program. cfg's data.tokenizer is the tokenizer of a .safetensors file, and of a Hugging
// Face directory without tokenizer files; its sequence_parallel_degree counts the copies of
// the weights that the memory check of a Hugging Face directory allows for.
func Load(path string, cfg config.Config, stderr io.Writer) (Model, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Model{}, fmt.Errorf("--model: %w", err)
	}
	switch {
	case fi.IsDir() && IsHFDir(path):
		return loadHF(path, cfg, stderr)
	case fi.IsDir():
		saved, params, dir, step, err := LoadCheckpoint(path, stderr)
		if err != nil {
			return Model{}, fmt.Errorf("--model %w", err)
		}
		tok, err := configTokenizer(saved) // the tokenizer the model was trained with
		if err != nil {
			return Model{}, err
		}
		return Model{Config: saved.Model, Params: params, Tokenizer: tok, BOS: -1, Source: "checkpoint",
			Path: dir, Step: step, Saved: &saved}, nil
	case strings.HasSuffix(path, ".safetensors"):
		if err := cfg.Model.Resolve(); err != nil {
			return Model{}, fmt.Errorf("%s: the config's [model] gives its shape: %w", path, err)
		}
		params, err := LoadSafetensors(path, cfg.Model)
		if err != nil {
			return Model{}, err
		}
		tok, err := configTokenizer(cfg)
		if err != nil {
			return Model{}, err
		}
		return Model{Config: cfg.Model, Params: params, Tokenizer: tok, BOS: -1, Source: "safetensors", Path: path, Step: -1}, nil
	}
	return Model{}, fmt.Errorf("--model %s: want a Hugging Face LLaMA directory (config.json and *.safetensors), a checkpoint directory of distflash, or a .safetensors file", path)
}

// LoadCheckpoint reads a checkpoint written by distflash train: a step directory, or a
// run directory, meaning its newest intact checkpoint (its latest, or, when that is damaged,
// the newest older one that verifies, as --resume auto chooses, each one passed over named on
// stderr). It returns the config the model was trained with, its parameters in
// model.NewLayout order, verified (every shard's checksum) before use, and the step
// directory and step read.
func LoadCheckpoint(path string, stderr io.Writer) (cfg config.Config, params []float32, dir string, step int, err error) {
	spec := path
	if _, err := os.Stat(filepath.Join(path, ckpt.ManifestFile)); err != nil {
		spec = "auto" // a run directory
	}
	var c *ckpt.Checkpoint
	var skipped []error
	if where, id, ok := runCheckpointDir(path); spec == "auto" && ok {
		// a run that saved into its checkpoint.dir: its own checkpoints there
		fmt.Fprintf(stderr, "%s saves its checkpoints in %s (checkpoint.dir): reading the newest of %s there\n", path, where, id)
		c, skipped, err = ckpt.ResolveOpenRun(where, "auto", id)
	} else {
		c, skipped, err = ckpt.ResolveOpen(path, spec)
	}
	for _, s := range skipped {
		fmt.Fprintf(stderr, "skipping damaged checkpoint: %v\n", s)
	}
	if err == nil && c == nil {
		err = fmt.Errorf("%s holds no checkpoint (no %s, no step-NNNNNN directory)", path, ckpt.ManifestFile)
	}
	if err != nil {
		return config.Config{}, nil, "", 0, fmt.Errorf("%s: not a Hugging Face directory (no config.json of one) nor a readable distflash checkpoint: %w", path, err)
	}
	defer c.Close()
	dir, step = c.Dir(), c.Manifest().Step
	saved := config.Default()
	if err := json.Unmarshal(c.Manifest().Config, &saved); err != nil {
		return config.Config{}, nil, "", 0, fmt.Errorf("%s: config in the manifest: %w", c.Dir(), err)
	}
	if err := saved.Model.Resolve(); err != nil {
		return config.Config{}, nil, "", 0, fmt.Errorf("%s: model in the manifest: %w", c.Dir(), err)
	}
	m := saved.Model
	what := fmt.Sprintf("the model of %s (model.dim %d, model.ffn_dim %d, model.n_layers %d, model.vocab_size %d)",
		filepath.Join(c.Dir(), ckpt.ManifestFile), m.Dim, m.FFNDim, m.NLayers, m.VocabSize)
	if err := config.CheckModelMemory(what, m, 1, config.WeightBytesPerParam); err != nil {
		return config.Config{}, nil, "", 0, err
	}
	params, err = c.ReadTensor("params")
	if err != nil {
		return config.Config{}, nil, "", 0, err
	}
	if want := model.NewLayout(saved.Model).Size; len(params) != want {
		return config.Config{}, nil, "", 0, fmt.Errorf("%s: %d parameters, the model in its manifest has %d", c.Dir(), len(params), want)
	}
	if err := CheckFinite(c.Dir(), saved.Model, params); err != nil {
		return config.Config{}, nil, "", 0, err
	}
	return saved, params, dir, step, nil
}

// runCheckpointDir reads a run directory's config.json and run.json: where the run saved its
// checkpoints when its checkpoint.dir is elsewhere, and the run's identity; ok is false for a
// run that saved them in its own directory (or a directory that is no run).
func runCheckpointDir(run string) (dir string, id ckpt.RunID, ok bool) {
	b, err := os.ReadFile(filepath.Join(run, "config.json"))
	if err != nil {
		return "", id, false
	}
	var cfg config.Config
	if json.Unmarshal(b, &cfg) != nil || cfg.Checkpoint.Dir == "" || filepath.Clean(cfg.Checkpoint.Dir) == filepath.Clean(run) {
		return "", id, false
	}
	id, ok, err = ckpt.ReadRunID(run)
	if err != nil || !ok {
		return "", id, false
	}
	return cfg.Checkpoint.Dir, id, true
}

// configTokenizer is the tokenizer named by data.tokenizer.
func configTokenizer(cfg config.Config) (data.Tokenizer, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("data.tokenizer: %w", err)
	}
	return tok, nil
}

// ModelConfig is the model.Config of a Hugging Face LLaMA config (HFConfigOf is its inverse).
func (c HFConfig) ModelConfig() model.Config {
	return model.Config{Dim: c.HiddenSize, NLayers: c.NumHiddenLayers, NHeads: c.NumAttentionHeads,
		NKVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, FFNDim: c.IntermediateSize, VocabSize: c.VocabSize,
		NormEps: c.RMSNormEps, RopeTheta: c.RopeTheta, MaxSeqLen: c.ContextLength(), RopeScaling: model.RopeScaling(c.RopeScaling),
		SlidingWindow: c.SlidingWindow, SlidingWindowLayers: []int{}}
}

// HFConfigOf is the Hugging Face config of model mc, in ExportConfig's terms (the inverse of
// HFConfig.ModelConfig).
func HFConfigOf(mc model.Config) HFConfig {
	return HFConfig{HiddenSize: mc.Dim, IntermediateSize: mc.FFNDim, NumHiddenLayers: mc.NLayers,
		NumAttentionHeads: mc.NHeads, NumKeyValueHeads: mc.NKVHeads, HeadDim: mc.HeadDim, VocabSize: mc.VocabSize,
		RMSNormEps: mc.NormEps, RopeTheta: mc.RopeTheta, MaxPositionEmbeddings: mc.MaxSeqLen,
		RopeScaling: HFRopeScaling(mc.RopeScaling), SlidingWindow: mc.SlidingWindow}
}

// Tensors are the parameters of model mc (params in model.NewLayout order) as the tensors
// WriteHF writes, sharing params' memory.
func Tensors(mc model.Config, params []float32) []safetensors.WTensor {
	layout := model.NewLayout(mc)
	ts := make([]safetensors.WTensor, len(layout.Tensors))
	for i, t := range layout.Tensors {
		ts[i] = safetensors.WTensor{Name: t.Name, Shape: t.Shape, Data: params[t.Off : t.Off+t.Size()]}
	}
	return ts
}

// hfShape names an HF directory's config.json with the keys that size its model.
func hfShape(dir string, c HFConfig) string {
	return fmt.Sprintf("%s (hidden_size %d, intermediate_size %d, num_hidden_layers %d, num_attention_heads %d, num_key_value_heads %d, vocab_size %d)",
		filepath.Join(dir, HFConfigFile), c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize)
}

// params loads the weights of h, a model of shape mc (its config's, resolved), into a new
// slice in model.NewLayout(mc) order.
func (h *HFModel) params(mc model.Config) ([]float32, error) {
	params := make([]float32, model.NewLayout(mc).Size)
	ts := Tensors(mc, params)
	dsts := make([]Dest, len(ts))
	for i, t := range ts {
		dsts[i] = Dest(t)
	}
	if err := h.Load(dsts); err != nil {
		return nil, err
	}
	return params, CheckFinite(h.Dir, mc, params)
}

// loadHF loads a Hugging Face LLaMA directory: the shape from config.json, the weights
// as they are (HF's q/k layout is distflash's, see hf.go), the directory's tokenizer
// when it has one (else data.tokenizer), and config.json's bos_token_id.
func loadHF(dir string, cfg config.Config, stderr io.Writer) (Model, error) {
	h, err := OpenHF(dir)
	if err != nil {
		return Model{}, err
	}
	if note := h.Config.WindowNote(); note != "" {
		fmt.Fprintf(stderr, "note: %s: %s\n", filepath.Join(dir, HFConfigFile), note)
	}
	mc := h.Config.ModelConfig()
	if err := mc.Resolve(); err != nil {
		return Model{}, fmt.Errorf("%s: %w", filepath.Join(dir, HFConfigFile), err)
	}
	// The weights as read; the ranks' copies are the caller's to check (the eval command
	// checks each rank's share against the memory the rank has, package evaluate).
	copies := 1.0
	if err := config.CheckModelMemory("the model of "+hfShape(dir, h.Config), mc, copies, config.WeightBytesPerParam); err != nil {
		return Model{}, err
	}
	params, err := h.params(mc)
	if err != nil {
		return Model{}, err
	}
	tokName := cfg.Data.Tokenizer
	if h.Tokenizer != "" {
		tokName = h.Tokenizer
	}
	tok, err := data.NewTokenizer(tokName)
	if err != nil {
		return Model{}, fmt.Errorf("tokenizer %s: %w", tokName, err)
	}
	return Model{Config: mc, Params: params, Tokenizer: tok, BOS: int32(h.Config.BOSTokenID), Source: "hf", Path: dir, Step: -1}, nil
}

// LoadSafetensors reads a safetensors file holding every parameter of the model shape mc
// under distflash's (Hugging Face) names, and nothing else, and returns them in
// model.NewLayout(mc) order. A tensor missing, of another shape or of another name is an
// error naming the file and the tensor.
func LoadSafetensors(path string, mc model.Config) ([]float32, error) {
	st, err := safetensors.Read(path)
	if err != nil {
		return nil, err
	}
	return safetensorsParams(st, mc)
}

// safetensorsParams is LoadSafetensors of the file st, read.
func safetensorsParams(st *safetensors.File, mc model.Config) ([]float32, error) {
	layout := model.NewLayout(mc)
	params := make([]float32, layout.Size)
	for _, t := range layout.Tensors {
		v, shape, err := st.Float32(t.Name)
		if err != nil {
			return nil, fmt.Errorf("%w (the config's [model] must be the file's shape)", err)
		}
		if !slices.Equal(shape, t.Shape) {
			return nil, fmt.Errorf("%s: tensor %q has shape %v, the config's [model] needs %v", st.Path, t.Name, shape, t.Shape)
		}
		copy(params[t.Off:], v)
	}
	for _, name := range st.Names() {
		if _, ok := layout.Lookup(name); !ok {
			return nil, fmt.Errorf("%s: tensor %q is not a parameter of the config's [model]", st.Path, name)
		}
	}
	return params, CheckFinite(st.Path, mc, params)
}

// CheckFinite refuses weights that hold a NaN or an infinity: params (model.NewLayout(mc)
// order) read from where. The error names the tensor, the first such value's index in it and
// its row and column, so that a damaged file is found before it is evaluated, generated from
// or trained on.
func CheckFinite(where string, mc model.Config, params []float32) error {
	for _, t := range model.NewLayout(mc).Tensors {
		for i, v := range params[t.Off : t.Off+t.Size()] {
			if f := float64(v); !math.IsNaN(f) && !math.IsInf(f, 0) {
				continue
			}
			at := fmt.Sprintf("index %d", i)
			if len(t.Shape) == 2 {
				at += fmt.Sprintf(" (row %d, column %d)", i/t.Shape[1], i%t.Shape[1])
			}
			return fmt.Errorf("%s: tensor %s %v holds %g at %s: the weights are damaged (not a number or infinite); nothing was run on them",
				where, t.Name, t.Shape, v, at)
		}
	}
	return nil
}
