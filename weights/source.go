package weights

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"distflash/config"
	"distflash/model"
	"distflash/weights/safetensors"
)

// train --init-from's source: a model to start a new run from, read from a Hugging Face LLaMA
// directory, a .safetensors file with distflash's (Hugging Face's) tensor names, or a
// distflash checkpoint (a step directory, or a run directory for its newest step; only its
// weights are used). Which [model] and tokenizer the run takes from it is package train's
// (LoadInitConfig).

// Source is a model loaded to start a run from (LoadSource).
type Source struct {
	Path      string
	Kind      string       // "hf", "safetensors" or "checkpoint"
	Model     model.Config // its shape (resolved); for a .safetensors file, the config's with the shapes the file implies
	Params    []float32    // in model.NewLayout(Model) order
	Tokenizer string       // the source's tokenizer: an HF directory's file, a checkpoint's data.tokenizer ("" none)
}

// LoadSource loads --init-from path (see above). mc is the config's [model], which a
// .safetensors file needs for what its shapes do not say. A Hugging Face directory is refused
// before its weights are read when training it (the whole fp32 state) would not fit in
// memory.
func LoadSource(path string, mc model.Config, stderr io.Writer) (*Source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--init-from: %w", err)
	}
	switch {
	case fi.IsDir() && IsHFDir(path):
		h, err := OpenHF(path)
		if err != nil {
			return nil, fmt.Errorf("--init-from: %w", err)
		}
		if note := h.Config.WindowNote(); note != "" {
			fmt.Fprintf(stderr, "init: note: %s: %s\n", filepath.Join(path, HFConfigFile), note)
		}
		src := &Source{Path: path, Kind: "hf", Model: h.Config.ModelConfig(), Tokenizer: h.Tokenizer}
		if err := src.Model.Resolve(); err != nil {
			return nil, fmt.Errorf("--init-from %s: config.json: %w", path, err)
		}
		// Training it keeps the whole fp32 state: refuse it before loading the weights.
		if err := config.CheckModelMemory("--init-from: training the model of "+hfShape(path, h.Config), src.Model, 1, config.StateBytesPerParam); err != nil {
			return nil, err
		}
		if src.Params, err = h.params(src.Model); err != nil {
			return nil, fmt.Errorf("--init-from: %w", err)
		}
		return src, nil
	case fi.IsDir():
		saved, params, _, _, err := LoadCheckpoint(path, io.Discard)
		if err != nil {
			return nil, fmt.Errorf("--init-from %w", err)
		}
		return &Source{Path: path, Kind: "checkpoint", Model: saved.Model, Params: params, Tokenizer: saved.Data.Tokenizer}, nil
	case strings.HasSuffix(path, ".safetensors"):
		st, err := safetensors.Read(path)
		if err != nil {
			return nil, fmt.Errorf("--init-from: %w", err)
		}
		m, err := safetensorsShape(st, mc)
		if err != nil {
			return nil, fmt.Errorf("--init-from: %w", err)
		}
		params, err := safetensorsParams(st, m)
		if err != nil {
			return nil, fmt.Errorf("--init-from: %w", err)
		}
		return &Source{Path: path, Kind: "safetensors", Model: m, Params: params}, nil
	}
	return nil, fmt.Errorf("--init-from %s: want a Hugging Face LLaMA directory (config.json and *.safetensors), a distflash checkpoint (step or run directory), or a .safetensors file", path)
}

// safetensorsShape is mc with the sizes the tensors of st fix: vocab_size and dim from the
// embedding, n_layers from the blocks present, ffn_dim from the first gate projection.
func safetensorsShape(st *safetensors.File, mc model.Config) (model.Config, error) {
	emb, ok := st.Tensors["model.embed_tokens.weight"]
	if !ok || len(emb.Shape) != 2 {
		return mc, fmt.Errorf("%s: no 2-D model.embed_tokens.weight: not a model with distflash's (Hugging Face) tensor names", st.Path)
	}
	mc.VocabSize, mc.Dim = emb.Shape[0], emb.Shape[1]
	layers := 0
	for _, name := range st.Names() {
		var i int
		var rest string
		if n, _ := fmt.Sscanf(name, "model.layers.%d.%s", &i, &rest); n == 2 {
			layers = max(layers, i+1)
		}
	}
	mc.NLayers = layers
	if g, ok := st.Tensors["model.layers.0.mlp.gate_proj.weight"]; ok && len(g.Shape) == 2 {
		mc.FFNDim = g.Shape[0]
	}
	if mc.HeadDim == 0 && mc.NHeads > 0 {
		mc.HeadDim = mc.Dim / mc.NHeads
	}
	if err := mc.Resolve(); err != nil {
		return mc, fmt.Errorf("%s: the shape its tensors and the config's [model] give: %w", st.Path, err)
	}
	return mc, nil
}
