//go:build cuda

package kernels_test

// A whole training step on the CUDA backend against the CPU backend: forward, loss, backward
// through every layer, gradient norm, clipping and an AdamW update, then the loss of the
// updated model. Tolerances (relative to the largest value of each tensor):
//
//   - FP32: losses 1e-5, every gradient tensor 1e-4, parameters after the update 1e-6 — except
//     an element whose gradient is within 1e-3 of the tensor's largest gradient of zero, where
//     AdamW's first step (≈ lr·sign(g)) may go either way: |Δp| ≤ 2.1·lr there.
//   - BF16 (16-bit GEMM operands and tensor-core attention): losses 1e-2, gradients 0.1.

import (
	"math"
	"math/rand/v2"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
)

// stepResult is what one training step produced on one backend.
type stepResult struct {
	loss, lossAfter float64
	grads, params   []float32
}

func trainStep(t *testing.T, be kernels.Backend, cfg model.Config, ids, tg []int32, B, T int, lr float64) stepResult {
	t.Helper()
	m := model.New(cfg, model.CheckpointAttnOutput, be)
	m.LoadParams(model.InitParams(cfg, m.Layout, 7))
	var segs []optim.Segment
	for _, ts := range m.Layout.Tensors {
		segs = append(segs, optim.Segment{Off: ts.Off, N: ts.Size(), Decay: ts.Decay})
	}
	opt := optim.NewAdamW(be, m.Layout.Size, segs, optim.Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
	pos := model.Positions(T)
	m.ZeroGrads()
	loss, n := m.ForwardBackward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: pos}, float32(1/float64(B*T)))
	res := stepResult{loss: loss / float64(n), grads: make([]float32, m.Layout.Size), params: make([]float32, m.Layout.Size)}
	be.Download(res.grads, m.Grads.Flat)
	norm := optim.GradNorm(be, m.Grads.Flat)
	opt.Update(m.Params.Flat, m.Grads.Flat, lr, optim.ClipScale(norm, 1))
	be.Download(res.params, m.Params.Flat)
	after, n := m.Forward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: pos})
	res.lossAfter = after / float64(n)
	return res
}

// relMax is max|a−b| / max|b| over [off, off+n).
func relMax(a, b []float32, off, n int) float64 {
	var num, den float64
	for i := off; i < off+n; i++ {
		num = math.Max(num, math.Abs(float64(a[i])-float64(b[i])))
		den = math.Max(den, math.Abs(float64(b[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func TestCUDATrainStep(t *testing.T) {
	gpu, err := kernels.NewCUDA(0)
	if err != nil {
		t.Fatalf("the cuda-tagged tests need a GPU: %v", err)
	}
	configs := []struct {
		name string
		cfg  model.Config
		prec string
	}{
		{"gqa_hd8_fp32", model.Config{Dim: 48, NLayers: 2, NHeads: 6, NKVHeads: 2, FFNDim: 40, VocabSize: 29, NormEps: 1e-6, RopeTheta: 500000, MaxSeqLen: 128}, "fp32"},
		{"gqa_hd64_fp32", model.Config{Dim: 256, NLayers: 2, NHeads: 4, NKVHeads: 2, FFNDim: 96, VocabSize: 101, NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 128}, "fp32"},
		{"gqa_hd64_bf16", model.Config{Dim: 256, NLayers: 2, NHeads: 4, NKVHeads: 2, FFNDim: 96, VocabSize: 101, NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 128}, "bf16"},
	}
	const B, T, lr = 2, 96, 1e-3
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			if err := cfg.Resolve(); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			ids, tg := make([]int32, B*T), make([]int32, B*T)
			for i := range ids {
				ids[i], tg[i] = int32(r.IntN(cfg.VocabSize)), int32(r.IntN(cfg.VocabSize))
			}
			tg[5] = -1 // an ignored target
			kernels.SetCUDAPrecisionForTest(gpu, c.prec)
			defer kernels.SetCUDAPrecisionForTest(gpu, "fp32")
			want := trainStep(t, kernels.NewCPU(), cfg, ids, tg, B, T, lr)
			got := trainStep(t, gpu, cfg, ids, tg, B, T, lr)
			tolLoss, tolGrad := 1e-5, 1e-4
			if c.prec != "fp32" {
				tolLoss, tolGrad = 1e-2, 0.1
			}
			t.Logf("loss cpu %.7f cuda %.7f; after the update cpu %.7f cuda %.7f", want.loss, got.loss, want.lossAfter, got.lossAfter)
			for _, l := range [][2]float64{{got.loss, want.loss}, {got.lossAfter, want.lossAfter}} {
				if e := math.Abs(l[0]-l[1]) / l[1]; !(e <= tolLoss) {
					t.Errorf("loss %.7f, cpu %.7f: relative error %.3g > %.1g", l[0], l[1], e, tolLoss)
				}
			}
			if want.lossAfter >= want.loss {
				t.Errorf("the step did not lower the loss on the CPU (%.5f → %.5f): the test checks nothing", want.loss, want.lossAfter)
			}
			layout := model.NewLayout(cfg)
			for _, ts := range layout.Tensors {
				if e := relMax(got.grads, want.grads, ts.Off, ts.Size()); !(e <= tolGrad) {
					t.Errorf("gradient of %s: relative error %.3g > %.1g", ts.Name, e, tolGrad)
				}
				if c.prec != "fp32" {
					continue
				}
				var gmax, pmax float64
				for i := ts.Off; i < ts.Off+ts.Size(); i++ {
					gmax = math.Max(gmax, math.Abs(float64(want.grads[i])))
					pmax = math.Max(pmax, math.Abs(float64(want.params[i])))
				}
				loose, zero := 0, 0
				for i := ts.Off; i < ts.Off+ts.Size(); i++ {
					// A gradient that is exactly zero on both backends (an embedding row of a
					// token not in the batch) leaves only weight decay: checked tightly. A tiny
					// non-zero one can flip Adam's step sign on rounding noise: up to 2·lr apart.
					tol := 1e-6 * pmax
					switch {
					case want.grads[i] == 0 && got.grads[i] == 0:
						zero++
					case math.Abs(float64(want.grads[i])) < 1e-3*gmax:
						tol, loose = 2.1*lr, loose+1
					}
					if d := math.Abs(float64(got.params[i] - want.params[i])); !(d <= tol) {
						t.Errorf("%s[%d] after the update: cuda %g, cpu %g", ts.Name, i-ts.Off, got.params[i], want.params[i])
						break
					}
				}
				if loose > (ts.Size()-zero)/10 {
					t.Errorf("%s: %d of %d elements with a gradient have near-zero ones: the update check is too weak", ts.Name, loose, ts.Size()-zero)
				}
			}
		})
	}
}

// BenchmarkCUDATrainStep times whole training steps (forward, backward, gradient norm, AdamW)
// of a 4-layer LLaMA of width 1024 (8 heads of 128, SwiGLU 2816, vocabulary 32000) on one
// sequence of 4096 tokens, at bf16 precision, and reports tokens per second.
func BenchmarkCUDATrainStep(b *testing.B) {
	gpu, err := kernels.NewCUDA(0)
	if err != nil {
		b.Fatalf("the cuda-tagged benchmarks need a GPU: %v", err)
	}
	kernels.SetCUDAPrecisionForTest(gpu, "bf16")
	cfg := model.Config{Dim: 1024, NLayers: 4, NHeads: 8, NKVHeads: 8, FFNDim: 2816, VocabSize: 32000,
		NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 4096}
	if err := cfg.Resolve(); err != nil {
		b.Fatal(err)
	}
	const B, T = 1, 4096
	m := model.New(cfg, model.CheckpointAttnOutput, gpu)
	m.LoadParams(model.InitParams(cfg, m.Layout, 1))
	opt := optim.NewAdamW(gpu, m.Layout.Size, []optim.Segment{{Off: 0, N: m.Layout.Size, Decay: true}},
		optim.Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
	r := rand.New(rand.NewPCG(3, 4))
	ids, tg := make([]int32, B*T), make([]int32, B*T)
	for i := range ids {
		ids[i], tg[i] = int32(r.IntN(cfg.VocabSize)), int32(r.IntN(cfg.VocabSize))
	}
	pos := model.Positions(T)
	step := func() {
		m.ZeroGrads()
		m.ForwardBackward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: pos}, 1.0/(B*T))
		norm := optim.GradNorm(gpu, m.Grads.Flat)
		opt.Update(m.Params.Flat, m.Grads.Flat, 1e-4, optim.ClipScale(norm, 1))
		gpu.(interface{ Sync() }).Sync()
	}
	step()
	for b.Loop() {
		step()
	}
	b.ReportMetric(float64(B*T*b.N)/b.Elapsed().Seconds(), "tokens/s")
}
