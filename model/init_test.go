package model

import (
	"math"
	"strings"
	"testing"
)

// TestInitSchemes: each model.init scheme draws each tensor with the spread it names (the
// sample standard deviation of a tensor within 4% of its std: the tensors hold at least 8,192
// values, whose sample std strays by about 1/√(2n) ≤ 0.8%, while the schemes' stds differ by
// 30% or more where they differ), norms are ones, torchtitan's head lies within ±3σ, the empty
// scheme is "scaled" bit for bit, and Resolve refuses an unknown scheme naming the key.
func TestInitSchemes(t *testing.T) {
	base := Config{Dim: 128, NLayers: 3, NHeads: 4, NKVHeads: 2, FFNDim: 256, VocabSize: 300,
		NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 64}
	resid := 0.02 / math.Sqrt(6)
	want := map[string]func(name string, layer int) float64{
		"scaled": func(name string, layer int) float64 {
			if strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight") {
				return resid
			}
			return 0.02
		},
		"normal": func(string, int) float64 { return 0.02 },
		"torchtitan": func(name string, layer int) float64 {
			switch {
			case name == "model.embed_tokens.weight":
				return 1
			case name == "lm_head.weight":
				return 0.0884 * 0.9866 // dim^−½, narrowed by the cut at ±3σ (the truncated normal's std)
			case strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight") || strings.HasSuffix(name, "up_proj.weight"):
				return 0.02 / math.Sqrt(2*float64(layer+1))
			}
			return 0.02
		},
	}
	var scaled []float32
	for _, scheme := range []string{"scaled", "normal", "torchtitan"} {
		cfg := base
		cfg.Init = scheme
		if err := cfg.Resolve(); err != nil {
			t.Fatal(err)
		}
		layout := NewLayout(cfg)
		p := InitParams(cfg, layout, 7)
		if scheme == "scaled" {
			scaled = p
		}
		for _, tn := range layout.Tensors {
			x := p[tn.Off : tn.Off+tn.Size()]
			if len(tn.Shape) == 1 {
				for _, v := range x {
					if v != 1 {
						t.Fatalf("%s: norm %s holds %g, want ones", scheme, tn.Name, v)
					}
				}
				continue
			}
			layer := -1
			if i := strings.Index(tn.Name, "layers."); i >= 0 {
				layer = int(tn.Name[i+len("layers.")] - '0')
			}
			var ss, biggest float64
			for _, v := range x {
				ss += float64(v) * float64(v)
				biggest = max(biggest, math.Abs(float64(v)))
			}
			std, w := math.Sqrt(ss/float64(len(x))), want[scheme](tn.Name, layer)
			if math.Abs(std/w-1) > 0.04 {
				t.Errorf("%s: %s drawn with std %.5f, want %.5f", scheme, tn.Name, std, w)
			}
			if scheme == "torchtitan" && tn.Name == "lm_head.weight" && biggest > 3/math.Sqrt(128) {
				t.Errorf("torchtitan: the head holds %g, beyond ±3σ = %g", biggest, 3/math.Sqrt(128))
			}
		}
	}
	cfg := base
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	for i, v := range InitParams(cfg, NewLayout(cfg), 7) {
		if v != scaled[i] {
			t.Fatalf("model.init = \"\" differs from \"scaled\" at %d: %g vs %g", i, v, scaled[i])
		}
	}
	cfg.Init = "xavier"
	if err := cfg.Resolve(); err == nil || !strings.Contains(err.Error(), `model.init = "xavier"`) {
		t.Errorf("model.init = xavier: %v, want a refusal naming the key and value", err)
	}
}
