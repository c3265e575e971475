package model

import (
	"fmt"
	"math"
	"math/rand/v2"
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

// InitParams returns freshly initialised parameters on the host, deterministic in seed:
// matrices ~ N(0, 0.02²) as in LLaMA and GPT-2, the two projections that write into the
// residual stream (o_proj, down_proj) scaled by 1/√(2·n_layers) so the stream's variance does
// not grow with depth, norm weights 1.
func InitParams(cfg Config, layout Layout, seed uint64) []float32 {
	out := make([]float32, layout.Size)
	InitParamsEach(cfg, layout, seed, initBlock, func(off int, vals []float32) { copy(out[off:], vals) })
	return out
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
	resid := 0.02 / math.Sqrt(2*float64(cfg.NLayers))
	for _, t := range layout.Tensors {
		std := 0.02
		if strings.HasSuffix(t.Name, "o_proj.weight") || strings.HasSuffix(t.Name, "down_proj.weight") {
			std = resid
		}
		for lo := 0; lo < t.Size(); lo += block {
			x := buf[:min(block, t.Size()-lo)]
			for i := range x {
				if len(t.Shape) == 1 {
					x[i] = 1
				} else {
					x[i] = float32(r.NormFloat64() * std)
				}
			}
			visit(t.Off+lo, x)
		}
	}
}
