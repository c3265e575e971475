package weights

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"distflash/model"
	"distflash/weights/safetensors"
)

// TestCheckFinite: a NaN or an infinity anywhere in the weights is refused, naming the tensor,
// the index and its row and column; the loaders of every format check what they read (a
// .safetensors file here), and finite weights pass.
func TestCheckFinite(t *testing.T) {
	mc := model.Config{Dim: 8, NLayers: 2, NHeads: 2, NKVHeads: 1, FFNDim: 12, VocabSize: 11, MaxSeqLen: 16, NormEps: 1e-5, RopeTheta: 1e4}
	if err := mc.Resolve(); err != nil {
		t.Fatal(err)
	}
	layout := model.NewLayout(mc)
	params := model.InitParams(mc, layout, 1)
	if err := CheckFinite("x", mc, params); err != nil {
		t.Fatalf("finite weights: %v", err)
	}
	q, ok := layout.Lookup("model.layers.1.self_attn.q_proj.weight")
	if !ok {
		t.Fatal("no q_proj in the layout")
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		p := append([]float32(nil), params...)
		p[q.Off+2*q.Shape[1]+3] = bad
		err := CheckFinite("m.safetensors", mc, p)
		if err == nil || !strings.Contains(err.Error(), "m.safetensors: tensor model.layers.1.self_attn.q_proj.weight") ||
			!strings.Contains(err.Error(), "(row 2, column 3)") {
			t.Errorf("%g in q_proj: %v", bad, err)
		}
		path := filepath.Join(t.TempDir(), "m.safetensors")
		if err := safetensors.Write(path, Tensors(mc, p), safetensors.DTypeF32, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadSafetensors(path, mc); err == nil || !strings.Contains(err.Error(), "q_proj.weight") {
			t.Errorf("LoadSafetensors of a file with %g: %v", bad, err)
		}
	}
}
