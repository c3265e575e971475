package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"distflash/kernels"
)

// Tensor is one named parameter inside the flat parameter buffer.
type Tensor struct {
	Name  string // Hugging Face LlamaForCausalLM name, e.g. "model.layers.0.self_attn.q_proj.weight"
	Shape []int  // row-major; a Linear weight is [out, in] as in PyTorch
	Off   int    // offset in the flat buffer, in elements
	Decay bool   // AdamW weight decay applies (matrices yes, norm weights no)
}

// Size is the number of elements.
func (t Tensor) Size() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Layout is the order and placement of every parameter in one flat buffer. Parameters,
// gradients and optimizer moments share it, which is what FSDP later shards.
type Layout struct {
	Tensors []Tensor
	Size    int
	index   map[string]int
}

// NewLayout places the parameters of cfg: the embedding, each block in order, the final norm
// and the (untied) output head.
func NewLayout(cfg Config) Layout {
	l := Layout{index: map[string]int{}}
	add := func(name string, decay bool, shape ...int) {
		t := Tensor{Name: name, Shape: shape, Off: l.Size, Decay: decay}
		l.index[name] = len(l.Tensors)
		l.Tensors = append(l.Tensors, t)
		l.Size += t.Size()
	}
	D, F, Q, KV := cfg.Dim, cfg.FFNDim, cfg.QDim(), cfg.KVDim()
	add("model.embed_tokens.weight", true, cfg.VocabSize, D)
	for i := 0; i < cfg.NLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", false, D)
		add(p+"self_attn.q_proj.weight", true, Q, D)
		add(p+"self_attn.k_proj.weight", true, KV, D)
		add(p+"self_attn.v_proj.weight", true, KV, D)
		add(p+"self_attn.o_proj.weight", true, D, Q)
		add(p+"post_attention_layernorm.weight", false, D)
		add(p+"mlp.gate_proj.weight", true, F, D)
		add(p+"mlp.up_proj.weight", true, F, D)
		add(p+"mlp.down_proj.weight", true, D, F)
	}
	add("model.norm.weight", false, D)
	add("lm_head.weight", true, cfg.VocabSize, D)
	return l
}

// Lookup returns the tensor called name.
func (l Layout) Lookup(name string) (Tensor, bool) {
	i, ok := l.index[name]
	if !ok {
		return Tensor{}, false
	}
	return l.Tensors[i], true
}

// LayerWeights are the views of one transformer block's parameters (or gradients).
type LayerWeights struct {
	AttnNorm, Wq, Wk, Wv, Wo kernels.Buf
	FFNNorm, Gate, Up, Down  kernels.Buf
}

// Weights are views of every parameter (or gradient) tensor into one flat buffer.
type Weights struct {
	Flat   kernels.Buf
	Embed  kernels.Buf
	Layers []LayerWeights
	Norm   kernels.Buf
	Head   kernels.Buf
}

// NewWeights cuts flat into the tensors of layout.
func NewWeights(be kernels.Backend, layout Layout, nLayers int, flat kernels.Buf) Weights {
	if flat.Len() != layout.Size {
		panic(fmt.Sprintf("model: flat buffer of %d elements for a layout of %d", flat.Len(), layout.Size))
	}
	views := make([]kernels.Buf, len(layout.Tensors))
	for i, t := range layout.Tensors {
		views[i] = be.Slice(flat, t.Off, t.Size())
	}
	w := Weights{Flat: flat, Embed: views[0], Norm: views[len(views)-2], Head: views[len(views)-1]}
	for i := 0; i < nLayers; i++ {
		w.Layers = append(w.Layers, layerWeights(views[1+9*i:]))
	}
	return w
}

// InitParams returns freshly initialised parameters on the host, deterministic in seed, drawn
// as cfg.Init says (initOf); norm weights are 1 under every scheme.
func InitParams(cfg Config, layout Layout, seed uint64) []float32 {
	out := make([]float32, layout.Size)
	InitParamsEach(cfg, layout, seed, initBlock, func(off int, vals []float32) { copy(out[off:], vals) })
	return out
}

// initSchemes are the values of model.init ("" is "scaled").
var initSchemes = []string{"", "scaled", "normal", "torchtitan"}

// initOf is how a matrix of cfg is drawn: N(0, std²), values beyond ±cut·std drawn again when
// cut > 0. The schemes (model.init):
//   - "scaled" (the default), GPT-2's and llm.c's: std 0.02, the two projections that write
//     into the residual stream (o_proj, down_proj) 0.02/√(2·n_layers) so that the stream's
//     variance does not grow with depth; the head is untied, 0.02 like the embedding.
//   - "normal", Hugging Face's LlamaPreTrainedModel with initializer_range 0.02: std 0.02 for
//     every matrix, the embedding and the head too.
//   - "torchtitan", its LLaMA with depth_init: the embedding N(0, 1); q, k, v and gate 0.02; o,
//     up and down 0.02/√(2·(layer+1)) (layer 0-based); the head dim^−½ cut at ±3σ.
func initOf(cfg Config, name string) (std, cut float64) {
	layer := -1
	if rest, ok := strings.CutPrefix(name, "model.layers."); ok {
		n, _, _ := strings.Cut(rest, ".")
		layer, _ = strconv.Atoi(n)
	}
	residual := strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight")
	switch cfg.Init {
	case "normal":
		return 0.02, 0
	case "torchtitan":
		switch {
		case name == "model.embed_tokens.weight":
			return 1, 0
		case name == "lm_head.weight":
			return 1 / math.Sqrt(float64(cfg.Dim)), 3
		case residual || strings.HasSuffix(name, "up_proj.weight"):
			return 0.02 / math.Sqrt(2*float64(layer+1)), 0
		}
		return 0.02, 0
	}
	if residual {
		return 0.02 / math.Sqrt(2*float64(cfg.NLayers)), 0
	}
	return 0.02, 0
}

// initBlock is how many values InitParams generates at a time.
const initBlock = 1 << 20

// InitParamsEach generates the values InitParams returns, in Layout order, block values at a
// time (a tensor's values are cut into blocks; a block holds one tensor's), calling visit
// with each block's offset in the flat buffer and its values. The buffer is reused: visit
// copies what it keeps. It holds one block, never the model, so a rank that keeps a shard
// (FSDP over MPI) needs only the shard.
func InitParamsEach(cfg Config, layout Layout, seed uint64, block int, visit func(off int, vals []float32)) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	buf := make([]float32, block)
	for _, t := range layout.Tensors {
		std, cut := initOf(cfg, t.Name)
		for lo := 0; lo < t.Size(); lo += block {
			x := buf[:min(block, t.Size()-lo)]
			for i := range x {
				if len(t.Shape) == 1 {
					x[i] = 1
					continue
				}
				v := r.NormFloat64()
				for cut > 0 && math.Abs(v) > cut {
					v = r.NormFloat64()
				}
				x[i] = float32(v * std)
			}
			visit(t.Off+lo, x)
		}
	}
}
