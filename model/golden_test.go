package model

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"distflash/kernels"
	"distflash/weights/safetensors"
)

// Golden parity with an independent PyTorch LLaMA (scripts/reference.py writes
// testdata/golden/*.safetensors: fp32 weights, tokens, and the fp64 logits, loss and every
// parameter gradient).
//
// Tolerances. The reference is computed in fp64, so the difference is this model's fp32
// rounding alone. Each tensor is compared on its own scale, max|got−want| / max|want|.
// Measured (TestGoldenParity -v): forward ≤ 4.1e-7, gradients ≤ 9.8e-7 over all variants, a few
// fp32 ulps (6e-8) accumulated through ~10 chained matmuls and norms, twice that in backward.
// The bounds leave 5× (forward) and 10× (gradients) of margin for other summation orders
// (another GEMM, another CPU) and no more: TestGoldenToleranceCatchesBugs shows that RoPE's
// base off by 1% or RMSNorm's epsilon 100× too large, bugs far smaller than real ones, exceed them.
const (
	tolForward  = 2e-6
	tolGradient = 1e-5
)

type goldenCase struct {
	name    string
	cfg     Config
	B, T    int
	st      *safetensors.File
	weights []float32 // in Layout order
	layout  Layout
	ids     []int32
	targets []int32
	seqLen  int // Model.SeqLen of compare (0: the default, max(pos)+1)
}

func loadGolden(t *testing.T, path string) goldenCase {
	t.Helper()
	st, err := safetensors.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Config
		Batch  int `json:"batch"`
		SeqLen int `json:"seq_len"`
	}
	if err := json.Unmarshal([]byte(st.Metadata["config"]), &meta); err != nil {
		t.Fatalf("%s: config metadata: %v", path, err)
	}
	cfg := meta.Config
	cfg.MaxSeqLen = max(meta.SeqLen, 1)
	if err := cfg.Resolve(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	g := goldenCase{name: filepath.Base(path), cfg: cfg, B: meta.Batch, T: meta.SeqLen, st: st, layout: NewLayout(cfg)}
	g.weights = make([]float32, g.layout.Size)
	for _, tn := range g.layout.Tensors {
		w, shape, err := st.Float32(tn.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(shape, tn.Shape) {
			t.Fatalf("%s: %s has shape %v, layout says %v", path, tn.Name, shape, tn.Shape)
		}
		copy(g.weights[tn.Off:], w)
	}
	if g.ids, _, err = st.Int32("tokens"); err != nil {
		t.Fatal(err)
	}
	if g.targets, _, err = st.Int32("targets"); err != nil {
		t.Fatal(err)
	}
	if len(g.ids) != g.B*g.T || len(g.targets) != g.B*g.T {
		t.Fatalf("%s: %d tokens, %d targets for batch %d × %d", path, len(g.ids), len(g.targets), g.B, g.T)
	}
	return g
}

func goldenFiles(t *testing.T) []string {
	files, err := filepath.Glob("testdata/golden/*.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("want the golden vectors of at least 5 variants in testdata/golden, found %d (regenerate: /usr/bin/python3 scripts/reference.py golden)", len(files))
	}
	return files
}

// relErr is max|got−want| / max|want|.
func relErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-float64(want[i])))
		den = math.Max(den, math.Abs(float64(want[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// compare runs the model on a golden case and returns the worst relative error of forward
// values and of gradients, and the tensor it came from.
func (g goldenCase) compare(t *testing.T, cfg Config, policy Checkpoint) (fwdErr, gradErr float64, worst string) {
	t.Helper()
	m := New(cfg, policy, kernels.NewCPU())
	m.LoadParams(g.weights)
	b := Batch{IDs: g.ids, Targets: g.targets, B: g.B, Pos: Positions(g.T), SeqLen: g.seqLen}
	lossSum, n := m.Forward(b)
	wantLogits, _, err := g.st.Float32("logits")
	if err != nil {
		t.Fatal(err)
	}
	fwdErr = relErr(kernels.Host(m.Logits()), wantLogits)
	wantLoss, _, err := g.st.Float32("loss")
	if err != nil {
		t.Fatal(err)
	}
	fwdErr = math.Max(fwdErr, relErr([]float32{float32(lossSum / float64(n))}, wantLoss))

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

// TestGoldenParity: logits, loss and every parameter gradient equal PyTorch's for MHA, GQA,
// MQA, 33 heads and a single head, under every checkpoint policy.
func TestGoldenParity(t *testing.T) {
	for _, path := range goldenFiles(t) {
		g := loadGolden(t, path)
		for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
			t.Run(fmt.Sprintf("%s/%v", g.name, policy), func(t *testing.T) {
				fe, ge, worst := g.compare(t, g.cfg, policy)
				t.Logf("heads %d/%d hd %d: forward rel err %.2e, worst gradient rel err %.2e (%s)",
					g.cfg.NHeads, g.cfg.NKVHeads, g.cfg.HeadDim, fe, ge, worst)
				if fe > tolForward {
					t.Errorf("logits/loss rel err %.3g > %g", fe, tolForward)
				}
				if ge > tolGradient {
					t.Errorf("gradient %s rel err %.3g > %g", worst, ge, tolGradient)
				}
			})
		}
	}
}

// TestGoldenToleranceCatchesBugs: the tolerances are tight enough to see small mistakes —
// RoPE's base off by 1%, or the RMSNorm epsilon 100× too large.
func TestGoldenToleranceCatchesBugs(t *testing.T) {
	for _, path := range goldenFiles(t) {
		g := loadGolden(t, path)
		for name, mutate := range map[string]func(*Config){
			"rope_theta+1%":  func(c *Config) { c.RopeTheta *= 1.01 },
			"norm_eps×100":   func(c *Config) { c.NormEps *= 100 },
			"norm_eps×10000": func(c *Config) { c.NormEps *= 10000 },
		} {
			cfg := g.cfg
			mutate(&cfg)
			fe, ge, _ := g.compare(t, cfg, CheckpointNone)
			if fe <= tolForward && ge <= tolGradient {
				t.Errorf("%s with %s: forward err %.2e, gradient err %.2e pass the tolerances", g.name, name, fe, ge)
			}
		}
	}
}
