package model

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"distflash/kernels"
)

// TestDocumentMaskParity: with packed documents (Model.Docs) and, in two variants, positions
// restarting per document (ResetPositions), logits, loss and every parameter gradient equal
// PyTorch's with an explicit block-diagonal causal mask (scripts/reference.py docmask writes
// testdata/docmask), under every checkpoint policy, within the golden tolerances. Without
// the documents (or with the positions reset wrongly) the same files fail them.
func TestDocumentMaskParity(t *testing.T) {
	files, err := filepath.Glob("testdata/docmask/*.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("want 3 document-mask vectors in testdata/docmask, found %d (regenerate: /usr/bin/python3 scripts/reference.py docmask)", len(files))
	}
	for _, path := range files {
		g := loadGolden(t, path)
		var meta struct {
			PositionReset bool `json:"position_reset"`
		}
		if err := json.Unmarshal([]byte(g.st.Metadata["config"]), &meta); err != nil {
			t.Fatal(err)
		}
		ids, _, err := g.st.Int32("doc_id")
		if err != nil {
			t.Fatal(err)
		}
		docs := make([]int32, len(ids)) // document start of each position, per sequence
		for b := 0; b < g.B; b++ {
			for p := 0; p < g.T; p++ {
				i := b*g.T + p
				if p > 0 && ids[i] == ids[i-1] {
					docs[i] = docs[i-1]
				} else {
					docs[i] = int32(p)
				}
			}
		}
		for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
			t.Run(fmt.Sprintf("%s/%v", g.name, policy), func(t *testing.T) {
				fe, ge, worst := g.compareDocs(t, policy, docs, meta.PositionReset)
				t.Logf("position_reset=%v: forward rel err %.2e, worst gradient rel err %.2e (%s)", meta.PositionReset, fe, ge, worst)
				if fe > tolForward || ge > tolGradient {
					t.Errorf("forward %.3g (tol %g), gradient %s %.3g (tol %g)", fe, tolForward, worst, ge, tolGradient)
				}
			})
		}
		// RoPE scores depend only on the distance between positions, and the mask keeps every
		// pair inside one document, so resetting positions leaves exact results unchanged: the
		// vectors cannot tell a wrong reset, the RoPE positions are checked directly instead.
		if fe, ge, _ := g.compareDocs(t, CheckpointNone, nil, false); fe <= tolForward && ge <= tolGradient {
			t.Errorf("%s without documents: forward err %.2e, gradient err %.2e pass the tolerances", g.name, fe, ge)
		}
	}
}

// TestResetPositions: with ResetPositions RoPE turns each token by its distance from its
// document's start; without, by its global position.
func TestResetPositions(t *testing.T) {
	cfg := Config{Dim: 16, NLayers: 1, NHeads: 2, NKVHeads: 1, FFNDim: 16, VocabSize: 7, MaxSeqLen: 8, NormEps: 1e-5, RopeTheta: 1e4}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	docs := []int32{0, 0, 0, 3, 3, 5, 5, 5, 0, 1, 1, 1, 1, 1, 1, 1}
	for _, reset := range []bool{false, true} {
		m := New(cfg, CheckpointNone, kernels.NewCPU())
		m.Forward(Batch{IDs: make([]int32, 16), Targets: make([]int32, 16), B: 2, Pos: Positions(8), Docs: docs, ResetPositions: reset})
		for b := 0; b < 2; b++ {
			for i, p := range m.rpos[b] {
				want := int32(i)
				if reset {
					want = int32(i) - docs[b*8+i]
				}
				if p != want {
					t.Fatalf("reset=%v: sequence %d RoPE positions %v", reset, b, m.rpos[b])
				}
			}
		}
	}
}

// compareDocs is goldenCase.compare with the documents docs ([B·T] document starts) and
// position reset.
func (g goldenCase) compareDocs(t *testing.T, policy Checkpoint, docs []int32, reset bool) (fwdErr, gradErr float64, worst string) {
	t.Helper()
	m := New(g.cfg, policy, kernels.NewCPU())
	m.LoadParams(g.weights)
	b := Batch{IDs: g.ids, Targets: g.targets, B: g.B, Pos: Positions(g.T), Docs: docs, ResetPositions: reset}
	lossSum, n := m.Forward(b)
	wantLogits, _, err := g.st.Float32("logits")
	if err != nil {
		t.Fatal(err)
	}
	wantLoss, _, err := g.st.Float32("loss")
	if err != nil {
		t.Fatal(err)
	}
	fwdErr = math.Max(relErr(kernels.Host(m.Logits()), wantLogits), relErr([]float32{float32(lossSum / float64(n))}, wantLoss))
	m.ZeroGrads()
	m.ForwardBackward(b, float32(1/float64(g.B*g.T)))
	grads := kernels.Host(m.Grads.Flat)
	for _, tn := range g.layout.Tensors {
		want, _, err := g.st.Float32("grad." + tn.Name)
		if err != nil {
			t.Fatal(err)
		}
		if e := relErr(grads[tn.Off:tn.Off+tn.Size()], want); e > gradErr {
			gradErr, worst = e, tn.Name
		}
	}
	return fwdErr, gradErr, worst
}
