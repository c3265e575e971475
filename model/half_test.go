package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"distflash/kernels"
)

// halfRun is what one ForwardBackward of a test produced.
type halfRun struct {
	loss  float64
	count int
	grads []float32
	bytes int64
}

// halfCase is one way to run a model in a test.
type halfCase struct {
	policy      Checkpoint
	prec        kernels.Precision // Model.Precision (and the backend's matmul precision)
	tile, chunk int
	store       bool // a CastStore lends the weights (else the model packs its own Params)
}

// runHalf runs one ForwardBackward of cfg (resolved) on B sequences of T tokens from the
// perturbed initial weights, rounded to round first when it is not FP32, with dscale.
func runHalf(t *testing.T, cfg Config, hc halfCase, round kernels.Precision, B, T int, dscale float32) halfRun {
	t.Helper()
	be := kernels.NewCPU()
	m := New(cfg, hc.policy, be)
	p := perturbedInit(cfg, m.Layout)
	roundHost(p, round)
	m.LoadParams(p)
	m.Precision, m.MLPTile, m.LossChunk = hc.prec, hc.tile, hc.chunk
	be.SetMatMulPrecision(hc.prec)
	if hc.store {
		m.Store = NewCastStore(be, m.Layout, m.Params.Flat, m.Grads.Flat, hc.prec)
	}
	r := rand.New(rand.NewPCG(11, 12))
	ids, tg := randomTokens(r, B*T, cfg.VocabSize), randomTokens(r, B*T, cfg.VocabSize)
	tg[2] = -1
	m.ZeroGrads()
	loss, n := m.ForwardBackward(Batch{IDs: ids, Targets: tg, B: B, Pos: Positions(T)}, dscale)
	return halfRun{loss: loss, count: n, grads: slices.Clone(kernels.Host(m.Grads.Flat)), bytes: m.ActivationBytes()}
}

// roundHost rounds x to p in place (FP32: leaves it).
func roundHost(x []float32, p kernels.Precision) {
	for i, v := range x {
		switch p {
		case kernels.BF16:
			x[i] = kernels.RoundBF16(v)
		case kernels.FP16:
			x[i] = kernels.RoundFP16(v)
		}
	}
}

// resolved returns the test config name, resolved.
func resolved(t *testing.T, name string) Config {
	t.Helper()
	cfg := testConfigs()[name]
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tensorErr is the largest difference of got from want over a tensor, relative to want's
// largest element there.
func tensorErr(got, want []float32, ts Tensor) (rel, most float64) {
	var diff float64
	for i := ts.Off; i < ts.Off+ts.Size(); i++ {
		most = math.Max(most, math.Abs(float64(want[i])))
		diff = math.Max(diff, math.Abs(float64(got[i])-float64(want[i])))
	}
	return diff / math.Max(most, 1e-30), most
}

// TestHalfStepMatchesFloat32: the 16-bit step's loss and gradients are the float32 model's on
// the same weights (rounded to the 16-bit format, so that only the activations' roundings
// differ), within bounds that follow from the format's precision, for every test config
// (GQA, 33 heads, one head, MHA) in bf16 and fp16, and they are not the float32 ones (the
// activations were rounded). The gradient is of the summed loss (dscale 1), as a loss
// scaler would scale it: at dscale 1/(tokens) fp16's small gradient temporaries fall below
// its normal range (2⁻¹⁴), where it has fewer bits than bf16 (measured: fp16 errors 4× larger).
//
// The bounds: a 16-bit rounding moves a value by at most 2⁻⁹ of it in bf16 (8 significant
// bits, 2.0e-3) and 2⁻¹² in fp16 (11 bits, 2.4e-4). A gradient passes through about 20
// roundings (the forward's and as many in the backward); as independent errors they grow as
// √20 ≈ 4.5 times one, ≈ 9e-3 (bf16) and 1.1e-3 (fp16) of the gradient's scale, which is
// what they measure (up to 1.2e-2 and 1.5e-3 of their tensor's largest element). The bounds
// are 4× that: 4e-2 and 5e-3. The loss averages 25 tokens' losses whose errors partly cancel:
// measured up to 6.1e-5 (bf16) and 3.9e-6 (fp16) relative, bounds 1e-3 and 1e-4. A wrong slice,
// a missing beta or a transposed operand moves them by order 1.
func TestHalfStepMatchesFloat32(t *testing.T) {
	const B, T = 2, 13
	for _, name := range []string{"gqa", "h33", "h1", "mha"} {
		cfg := resolved(t, name)
		layout := NewLayout(cfg)
		for _, c := range []struct {
			prec       kernels.Precision
			loss, grad float64
		}{{kernels.BF16, 1e-3, 4e-2}, {kernels.FP16, 1e-4, 5e-3}} {
			t.Run(fmt.Sprintf("%s/%v", name, c.prec), func(t *testing.T) {
				ref := runHalf(t, cfg, halfCase{policy: CheckpointNone}, c.prec, B, T, 1)
				got := runHalf(t, cfg, halfCase{policy: CheckpointAttnOutput, prec: c.prec, store: true}, c.prec, B, T, 1)
				if got.count != ref.count || got.count != B*T-1 {
					t.Fatalf("counted %d targets, float32 %d, want %d", got.count, ref.count, B*T-1)
				}
				lossErr := math.Abs(got.loss-ref.loss) / math.Abs(ref.loss)
				if !(lossErr <= c.loss) || got.loss == ref.loss {
					t.Errorf("loss %.7g, float32 %.7g: relative difference %.3g, want 0 < it <= %g", got.loss, ref.loss, lossErr, c.loss)
				}
				var worst float64
				worstName := ""
				for _, ts := range layout.Tensors {
					e, most := tensorErr(got.grads, ref.grads, ts)
					if most == 0 {
						t.Fatalf("%s: float32 gradient all zero", ts.Name)
					}
					if e > worst {
						worst, worstName = e, ts.Name
					}
					if !(e <= c.grad) {
						t.Errorf("gradient of %s off by %.3g of its largest element, want <= %g", ts.Name, e, c.grad)
					}
				}
				if worst == 0 {
					t.Error("gradients equal float32's: the activations were not rounded")
				}
				t.Logf("loss rel %.2g; gradients worst %.2g (%s)", lossErr, worst, worstName)
			})
		}
	}
}

// TestHalfStepPoliciesBitIdentical: in the 16-bit step the recomputation of layer and
// attn_output starts from the kept 16-bit input, which is exactly the forward's, so every
// checkpoint policy gives the same loss and the same gradients bit for bit, untiled and with
// MLP tiles, whole and in loss chunks, with a CastStore and with the model's own 16-bit copy
// (the same values), in bf16 and fp16; the policies keep the activation memory they should
// (none most, layer least). Across tilings and chunkings the loss is bit for bit the same
// (each token's row is its own) and so are the gradients but the MLP's and the head's, whose
// sums over tiles and chunks are added in a different order (within 1e-5 of their largest
// element: float32 accumulation of the same products).
func TestHalfStepPoliciesBitIdentical(t *testing.T) {
	const B, T = 2, 11
	for _, name := range []string{"gqa", "h33"} {
		cfg := resolved(t, name)
		layout := NewLayout(cfg)
		for _, prec := range []kernels.Precision{kernels.BF16, kernels.FP16} {
			if prec == kernels.FP16 && name != "gqa" {
				continue
			}
			var base halfRun
			for _, split := range []struct{ tile, chunk int }{{0, 0}, {5, 0}, {0, 7}, {4, 9}, {B*T - 1, 1}} {
				t.Run(fmt.Sprintf("%s/%v/tile%d/chunk%d", name, prec, split.tile, split.chunk), func(t *testing.T) {
					runs := map[Checkpoint]halfRun{}
					for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
						hc := halfCase{policy: policy, prec: prec, tile: split.tile, chunk: split.chunk, store: policy != CheckpointLayer}
						runs[policy] = runHalf(t, cfg, hc, kernels.FP32, B, T, 1/float32(B*T))
					}
					none := runs[CheckpointNone]
					for policy, r := range runs {
						if math.Float64bits(r.loss) != math.Float64bits(none.loss) {
							t.Errorf("%v: loss %v, none %v", policy, r.loss, none.loss)
						}
						for i := range r.grads {
							if math.Float32bits(r.grads[i]) != math.Float32bits(none.grads[i]) {
								t.Fatalf("%v: gradient %d = %v, none %v", policy, i, r.grads[i], none.grads[i])
							}
						}
					}
					if !(runs[CheckpointNone].bytes > runs[CheckpointAttnOutput].bytes && runs[CheckpointAttnOutput].bytes > runs[CheckpointLayer].bytes) {
						t.Errorf("activation bytes none %d, attn_output %d, layer %d: want decreasing", runs[CheckpointNone].bytes,
							runs[CheckpointAttnOutput].bytes, runs[CheckpointLayer].bytes)
					}
					if split.tile == 0 && split.chunk == 0 {
						base = none
						return
					}
					if none.loss != base.loss {
						t.Errorf("loss %v, untiled and whole %v", none.loss, base.loss)
					}
					for _, ts := range layout.Tensors {
						reordered := split.tile > 0 && (ts.Name[len(ts.Name)-len("proj.weight"):] == "proj.weight" && containsMLP(ts.Name)) ||
							split.chunk > 0 && ts.Name == "lm_head.weight"
						e, _ := tensorErr(none.grads, base.grads, ts)
						if reordered && !(e <= 1e-5) || !reordered && e != 0 {
							t.Errorf("gradient of %s off by %.3g of its largest element from untiled and whole's (reordered sum: %v)", ts.Name, e, reordered)
						}
					}
				})
			}
		}
	}
}

func containsMLP(name string) bool {
	for i := 0; i+4 <= len(name); i++ {
		if name[i:i+4] == "mlp." {
			return true
		}
	}
	return false
}

// halfReference computes the loss and the gradients of one ForwardBackward of the 16-bit
// step (untiled, whole, no FreshGrads) from the CPU backend's float32 methods on host slices,
// rounding to p with kernels.RoundBF16 / RoundFP16 at the points half.go names: the weights;
// each block's input (from the second block on); both norms' outputs and the FFN norm's input
// copy; the fused q‖k‖v projection, q and k after RoPE; the attention output; gate‖up and the
// activation; dlogits, dnormF; the residual gradient's copy after each norm backward; dact,
// dgate‖dup, dnorm, dattn, dq, dk, dv and dqkv.
func halfReference(cfg Config, params []float32, ids, tg []int32, B, T int, dscale float32, p kernels.Precision) (float64, []float32) {
	be := kernels.NewCPU()
	buf := kernels.HostBuf
	rnd := func(x []float32) []float32 { roundHost(x, p); return x }
	layout := NewLayout(cfg)
	w := rnd(slices.Clone(params))
	grads := make([]float32, layout.Size)
	span := func(x []float32, first, last string) []float32 {
		a, _ := layout.Lookup(first)
		b, _ := layout.Lookup(last)
		return x[a.Off : b.Off+b.Size()]
	}
	one := func(x []float32, name string) []float32 { return span(x, name, name) }
	n, L, D, Q, KV, F, V, H, hd := B*T, cfg.NLayers, cfg.Dim, cfg.QDim(), cfg.KVDim(), cfg.FFNDim, cfg.VocabSize, cfg.NHeads, cfg.HeadDim
	QKV, eps, rope, pos := Q+2*KV, float32(cfg.NormEps), cfg.RoPE(T), Positions(T)
	mk := func(k int) []float32 { return make([]float32, k) }
	mm := func(c, a, b []float32, M, N, K int, ta, tb bool, beta float32) {
		be.MatMul(buf(c), buf(a), buf(b), M, N, K, ta, tb, beta)
	}
	shape := kernels.AttnShape{NQ: T, NK: T, Heads: H, KVHeads: cfg.NKVHeads, HeadDim: hd, Causal: true,
		Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos}
	// cols returns columns [lo, lo+w) of the rows of x (row width width)
	cols := func(x []float32, width, lo, w int) []float32 {
		out := mk(n * w)
		for i := range n {
			copy(out[i*w:(i+1)*w], x[i*width+lo:i*width+lo+w])
		}
		return out
	}
	join := func(width int, parts ...[]float32) []float32 {
		out, lo := mk(n*width), 0
		for _, part := range parts {
			w := len(part) / n
			for i := range n {
				copy(out[i*width+lo:i*width+lo+w], part[i*w:(i+1)*w])
			}
			lo += w
		}
		return out
	}
	type saved struct{ x, n1, rstd1, q, k, v, o, lse, h, n2, rstd2, gu, act []float32 }
	saves := make([]saved, L)
	r := mk(n * D)
	embed := one(w, "model.embed_tokens.weight")
	for i, id := range ids {
		copy(r[i*D:(i+1)*D], embed[int(id)*D:])
	}
	layer := func(l int, name string) string { return fmt.Sprintf("model.layers.%d.%s.weight", l, name) }
	for l := range L {
		if l > 0 {
			rnd(r)
		}
		s := &saves[l]
		s.x, s.n1, s.rstd1 = slices.Clone(r), mk(n*D), mk(n)
		be.RMSNorm(buf(s.n1), buf(s.rstd1), buf(r), buf(one(w, layer(l, "input_layernorm"))), n, D, eps)
		rnd(s.n1)
		qkv := mk(n * QKV)
		mm(qkv, s.n1, span(w, layer(l, "self_attn.q_proj"), layer(l, "self_attn.v_proj")), n, QKV, D, false, true, 0)
		rnd(qkv)
		s.q, s.k, s.v = cols(qkv, QKV, 0, Q), cols(qkv, QKV, Q, KV), cols(qkv, QKV, Q+KV, KV)
		s.o, s.lse = mk(n*Q), mk(n*H)
		for b := range B {
			be.RoPE(buf(s.q[b*T*Q:(b+1)*T*Q]), pos, H, hd, rope, false)
			be.RoPE(buf(s.k[b*T*KV:(b+1)*T*KV]), pos, cfg.NKVHeads, hd, rope, false)
		}
		rnd(s.q)
		rnd(s.k)
		for b := range B {
			st := kernels.AttnState{O: be.Alloc(T * Q), M: be.Alloc(T * H), L: be.Alloc(T * H)}
			be.AttnInit(st)
			be.AttnForward(st, buf(s.q[b*T*Q:(b+1)*T*Q]), buf(s.k[b*T*KV:(b+1)*T*KV]), buf(s.v[b*T*KV:(b+1)*T*KV]), shape)
			be.AttnFinish(buf(s.o[b*T*Q:(b+1)*T*Q]), buf(s.lse[b*T*H:(b+1)*T*H]), st, T, H, hd)
		}
		rnd(s.o)
		mm(r, s.o, one(w, layer(l, "self_attn.o_proj")), n, D, Q, false, true, 1)
		s.n2, s.rstd2 = mk(n*D), mk(n)
		be.RMSNorm(buf(s.n2), buf(s.rstd2), buf(r), buf(one(w, layer(l, "post_attention_layernorm"))), n, D, eps)
		rnd(s.n2)
		s.h = rnd(slices.Clone(r))
		s.gu = mk(n * 2 * F)
		mm(s.gu, s.n2, span(w, layer(l, "mlp.gate_proj"), layer(l, "mlp.up_proj")), n, 2*F, D, false, true, 0)
		rnd(s.gu)
		s.act = mk(n * F)
		be.SwiGLU(buf(s.act), buf(cols(s.gu, 2*F, 0, F)), buf(cols(s.gu, 2*F, F, F)))
		rnd(s.act)
		mm(r, s.act, one(w, layer(l, "mlp.down_proj")), n, D, F, false, true, 1)
	}
	normF, rstdF := mk(n*D), mk(n)
	be.RMSNorm(buf(normF), buf(rstdF), buf(r), buf(one(w, "model.norm.weight")), n, D, eps)
	rnd(normF)
	xOut := rnd(slices.Clone(r))
	head := one(w, "lm_head.weight")
	logits, losses, dl := mk(n*V), mk(n), mk(n*V)
	mm(logits, normF, head, n, V, D, false, true, 0)
	be.CrossEntropy(buf(losses), buf(dl), buf(logits), tg, V, dscale)
	rnd(dl)
	loss := sumLoss(losses, tg)
	dn := mk(n * D)
	mm(dn, dl, head, n, D, V, false, false, 0)
	rnd(dn)
	mm(one(grads, "lm_head.weight"), dl, normF, V, D, n, true, false, 1)
	dx := mk(n * D)
	be.RMSNormBackward(buf(dx), buf(one(grads, "model.norm.weight")), buf(dn), buf(xOut), buf(one(w, "model.norm.weight")), buf(rstdF), n, D)
	dx16 := rnd(slices.Clone(dx))
	for l := L - 1; l >= 0; l-- {
		s := saves[l]
		dact := mk(n * F)
		mm(dact, dx16, one(w, layer(l, "mlp.down_proj")), n, F, D, false, false, 0)
		rnd(dact)
		dg, du := mk(n*F), mk(n*F)
		be.SwiGLUBackward(buf(dg), buf(du), buf(dact), buf(cols(s.gu, 2*F, 0, F)), buf(cols(s.gu, 2*F, F, F)))
		dgu := rnd(join(2*F, dg, du))
		mm(one(grads, layer(l, "mlp.down_proj")), dx16, s.act, D, F, n, true, false, 1)
		dn := mk(n * D)
		mm(dn, dgu, span(w, layer(l, "mlp.gate_proj"), layer(l, "mlp.up_proj")), n, D, 2*F, false, false, 0)
		rnd(dn)
		mm(span(grads, layer(l, "mlp.gate_proj"), layer(l, "mlp.up_proj")), dgu, s.n2, 2*F, D, n, true, false, 1)
		be.RMSNormBackward(buf(dx), buf(one(grads, layer(l, "post_attention_layernorm"))), buf(dn), buf(s.h),
			buf(one(w, layer(l, "post_attention_layernorm"))), buf(s.rstd2), n, D)
		dx16 = rnd(slices.Clone(dx))
		dattn := mk(n * Q)
		mm(dattn, dx16, one(w, layer(l, "self_attn.o_proj")), n, Q, D, false, false, 0)
		rnd(dattn)
		mm(one(grads, layer(l, "self_attn.o_proj")), dx16, s.o, D, Q, n, true, false, 1)
		dq, dk, dv := mk(n*Q), mk(n*KV), mk(n*KV)
		for b := range B {
			qs, ks := func(x []float32) kernels.Buf { return buf(x[b*T*Q : (b+1)*T*Q]) }, func(x []float32) kernels.Buf { return buf(x[b*T*KV : (b+1)*T*KV]) }
			d := mk(T * H)
			be.AttnBackwardPrep(buf(d), qs(s.o), qs(dattn), T, H, hd, kernels.FP32)
			be.AttnBackward(qs(dq), ks(dk), ks(dv), qs(s.q), ks(s.k), ks(s.v), qs(s.o), qs(dattn), buf(s.lse[b*T*H:(b+1)*T*H]), buf(d), shape)
		}
		rnd(dq)
		rnd(dk)
		rnd(dv)
		for b := range B {
			be.RoPE(buf(dq[b*T*Q:(b+1)*T*Q]), pos, H, hd, rope, true)
			be.RoPE(buf(dk[b*T*KV:(b+1)*T*KV]), pos, cfg.NKVHeads, hd, rope, true)
		}
		dqkv := rnd(join(QKV, dq, dk, dv))
		dn = mk(n * D)
		mm(dn, dqkv, span(w, layer(l, "self_attn.q_proj"), layer(l, "self_attn.v_proj")), n, D, QKV, false, false, 0)
		rnd(dn)
		mm(span(grads, layer(l, "self_attn.q_proj"), layer(l, "self_attn.v_proj")), dqkv, s.n1, QKV, D, n, true, false, 1)
		be.RMSNormBackward(buf(dx), buf(one(grads, layer(l, "input_layernorm"))), buf(dn), buf(s.x),
			buf(one(w, layer(l, "input_layernorm"))), buf(s.rstd1), n, D)
		dx16 = rnd(slices.Clone(dx))
	}
	be.EmbeddingBackward(buf(one(grads, "model.embed_tokens.weight")), buf(dx), ids, D)
	return loss, grads
}

// TestHalfStepMatchesReference: the 16-bit step's loss and every gradient are bit for bit
// those of halfReference, a composition of the CPU backend's float32 methods with the
// rounding to bf16 or fp16 at the stated points, for GQA (3 blocks, 6 heads on 2) and 33 heads
// on 11. Bit for bit because the CPU backend's 16-bit methods are defined as exactly that
// (widen the packed inputs, run the float32 method, round each 16-bit output once), so any
// difference is the model's: a rounding point missing or added, a wrong slice of a packed or
// fused buffer, a wrong beta, transpose or operand.
func TestHalfStepMatchesReference(t *testing.T) {
	const B, T = 2, 7
	for _, name := range []string{"gqa", "h33"} {
		for _, prec := range []kernels.Precision{kernels.BF16, kernels.FP16} {
			t.Run(fmt.Sprintf("%s/%v", name, prec), func(t *testing.T) {
				cfg := resolved(t, name)
				be := kernels.NewCPU()
				m := New(cfg, CheckpointAttnOutput, be)
				params := perturbedInit(cfg, m.Layout)
				m.LoadParams(params)
				m.Precision = prec
				r := rand.New(rand.NewPCG(21, 22))
				ids, tg := randomTokens(r, B*T, cfg.VocabSize), randomTokens(r, B*T, cfg.VocabSize)
				tg[5] = -1
				const dscale = 1.0 / 13
				m.ZeroGrads()
				loss, _ := m.ForwardBackward(Batch{IDs: ids, Targets: tg, B: B, Pos: Positions(T)}, dscale)
				wantLoss, want := halfReference(cfg, params, ids, tg, B, T, dscale, prec)
				if math.Float64bits(loss) != math.Float64bits(wantLoss) {
					t.Errorf("loss %v, reference %v", loss, wantLoss)
				}
				got := kernels.Host(m.Grads.Flat)
				for _, ts := range m.Layout.Tensors {
					for i := ts.Off; i < ts.Off+ts.Size(); i++ {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Errorf("%s[%d] = %v, reference %v", ts.Name, i-ts.Off, got[i], want[i])
							break
						}
					}
				}
			})
		}
	}
}

// countingBackend counts the downloads a model makes.
type countingBackend struct {
	kernels.Backend
	downloads int
}

func (c *countingBackend) Download(dst []float32, src kernels.Buf) {
	c.downloads++
	c.Backend.Download(dst, src)
}

// stepBatches are a few micro-batches of cfg's tokens: two of B×T, then one of a different
// shape, with an ignored target each.
func stepBatches(cfg Config, B, T int) []Batch {
	r := rand.New(rand.NewPCG(31, 32))
	var out []Batch
	for _, s := range []struct{ B, T int }{{B, T}, {B, T}, {1, T + 3}} {
		ids, tg := randomTokens(r, s.B*s.T, cfg.VocabSize), randomTokens(r, s.B*s.T, cfg.VocabSize)
		tg[1] = -1
		out = append(out, Batch{IDs: ids, Targets: tg, B: s.B, Pos: Positions(s.T)})
	}
	return out
}

// TestDeferLoss: with DeferLoss neither Forward nor ForwardBackward downloads anything (a
// backend that counts downloads sees none inside the calls), each returns a loss sum of 0 and
// the right count, and TakeLoss downloads the pending calls' losses once and returns exactly
// (bit for bit) the sum of what the calls return without DeferLoss, in the float32 path and
// the 16-bit step, across a change of batch shape and a Forward among the steps; the
// gradients are the same, TokenLosses gives the last call's losses after TakeLoss and before
// it (downloading them then), and a second TakeLoss returns 0.
func TestDeferLoss(t *testing.T) {
	cfg := resolved(t, "gqa")
	const B, T = 2, 9
	for _, prec := range []kernels.Precision{kernels.FP32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			run := func(deferLoss bool) (sum float64, counts []int, grads []float32, tokens []float32, m *Model, be *countingBackend) {
				be = &countingBackend{Backend: kernels.NewCPU()}
				m = New(cfg, CheckpointAttnOutput, be)
				m.LoadParams(perturbedInit(cfg, m.Layout))
				m.Precision, m.MLPTile, m.LossChunk, m.DeferLoss = prec, 5, 7, deferLoss
				m.ZeroGrads()
				for i, bt := range stepBatches(cfg, B, T) {
					var l float64
					var n int
					if i == 1 {
						l, n = m.Forward(bt)
					} else {
						l, n = m.ForwardBackward(bt, 0.05)
					}
					if deferLoss && l != 0 {
						t.Errorf("call %d: deferred loss sum %v, want 0", i, l)
					}
					sum += l
					counts = append(counts, n)
				}
				if !deferLoss {
					tokens = slices.Clone(m.TokenLosses())
				}
				return sum, counts, slices.Clone(kernels.Host(m.Grads.Flat)), tokens, m, be
			}
			want, wantCounts, wantGrads, wantTokens, _, _ := run(false)
			_, counts, grads, _, m, be := run(true)
			if be.downloads != 0 {
				t.Errorf("%d downloads in deferred calls, want 0", be.downloads)
			}
			if !slices.Equal(counts, wantCounts) {
				t.Errorf("counts %v, want %v", counts, wantCounts)
			}
			if !slices.Equal(grads, wantGrads) {
				t.Error("deferring the loss changed the gradients")
			}
			got := m.TakeLoss()
			if be.downloads != 1 {
				t.Errorf("TakeLoss made %d downloads, want 1", be.downloads)
			}
			if math.Float64bits(got) != math.Float64bits(want) || want == 0 {
				t.Errorf("TakeLoss %v, the calls' sums add up to %v", got, want)
			}
			if tok := m.TokenLosses(); !slices.Equal(tok, wantTokens) {
				t.Errorf("TokenLosses after TakeLoss %v, want %v", tok, wantTokens)
			}
			if again := m.TakeLoss(); again != 0 {
				t.Errorf("a second TakeLoss %v, want 0", again)
			}
			// TokenLosses before TakeLoss: downloaded there
			bt := stepBatches(cfg, B, T)[2]
			m.ForwardBackward(bt, 0.05)
			before := be.downloads
			if tok := m.TokenLosses(); !slices.Equal(tok, wantTokens) || be.downloads != before+1 {
				t.Errorf("TokenLosses before TakeLoss %v (%d downloads), want %v (1)", tok, be.downloads-before, wantTokens)
			}
			if got := m.TakeLoss(); got != sumLoss(wantTokens, bt.Targets) {
				t.Errorf("TakeLoss after TokenLosses %v, want %v", got, sumLoss(wantTokens, bt.Targets))
			}
		})
	}
}

// TestFreshGrads: a ForwardBackward with FreshGrads on gradient buffers full of garbage (NaN,
// Inf, huge values) gives bit for bit the gradients of ZeroGrads then ForwardBackward, for
// the float32 path and the 16-bit step, every policy, tiled and chunked or not, with the
// model's own Grads and through a CastStore; the flag is cleared by the call, so the next
// micro-batch adds into them as usual.
func TestFreshGrads(t *testing.T) {
	cfg := resolved(t, "gqa")
	const B, T = 2, 9
	batches := stepBatches(cfg, B, T)
	for _, prec := range []kernels.Precision{kernels.FP32, kernels.BF16} {
		for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
			for _, split := range []int{0, 5} {
				for _, store := range []bool{false, true} {
					if store && prec == kernels.FP32 {
						continue
					}
					t.Run(fmt.Sprintf("%v/%v/split%d/store=%v", prec, policy, split, store), func(t *testing.T) {
						run := func(fresh bool) ([]float32, []float32) {
							be := kernels.NewCPU()
							m := New(cfg, policy, be)
							m.LoadParams(perturbedInit(cfg, m.Layout))
							m.Precision, m.MLPTile, m.LossChunk = prec, split, split+2
							be.SetMatMulPrecision(prec)
							if store {
								m.Store = NewCastStore(be, m.Layout, m.Params.Flat, m.Grads.Flat, prec)
							}
							if fresh {
								g := make([]float32, m.Layout.Size)
								for i := range g {
									g[i] = []float32{float32(math.NaN()), float32(math.Inf(-1)), 3e38, -1}[i%4]
								}
								be.Upload(m.Grads.Flat, g)
								m.FreshGrads = true
							} else {
								m.ZeroGrads()
							}
							m.ForwardBackward(batches[0], 0.05)
							if m.FreshGrads {
								t.Fatal("FreshGrads still set after the call")
							}
							first := slices.Clone(kernels.Host(m.Grads.Flat))
							m.ForwardBackward(batches[1], 0.05)
							return first, slices.Clone(kernels.Host(m.Grads.Flat))
						}
						want1, want2 := run(false)
						got1, got2 := run(true)
						for i := range want1 {
							if math.Float32bits(got1[i]) != math.Float32bits(want1[i]) {
								t.Fatalf("gradient %d = %v, ZeroGrads then ForwardBackward gives %v", i, got1[i], want1[i])
							}
							if math.Float32bits(got2[i]) != math.Float32bits(want2[i]) {
								t.Fatalf("after a second micro-batch gradient %d = %v, want %v", i, got2[i], want2[i])
							}
						}
					})
				}
			}
		}
	}
}

// TestHalfStepOddWidths: a model with an odd width (here the FFN's) cannot run the 16-bit
// step; with Precision BF16 it computes in float32 and keeps its activations in bf16, exactly
// as ActPrecision BF16 does (the loss bit for bit the float32 one, the gradients those of
// 16-bit kept activations).
func TestHalfStepOddWidths(t *testing.T) {
	cfg := testConfigs()["gqa"]
	cfg.FFNDim = 41
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	const B, T = 2, 9
	run := func(set func(m *Model)) (float64, []float32) {
		m := New(cfg, CheckpointAttnOutput, kernels.NewCPU())
		m.LoadParams(perturbedInit(cfg, m.Layout))
		set(m)
		m.ZeroGrads()
		l, _ := m.ForwardBackward(stepBatches(cfg, B, T)[0], 0.05)
		if m.half {
			t.Fatal("the 16-bit step ran with an odd width")
		}
		return l, slices.Clone(kernels.Host(m.Grads.Flat))
	}
	l32, _ := run(func(*Model) {})
	lp, gp := run(func(m *Model) { m.Precision = kernels.BF16 })
	la, ga := run(func(m *Model) { m.ActPrecision = kernels.BF16 })
	if lp != l32 || la != l32 {
		t.Errorf("losses %v (Precision) and %v (ActPrecision), float32 %v", lp, la, l32)
	}
	if !slices.Equal(gp, ga) {
		t.Error("Precision BF16 with an odd width differs from ActPrecision BF16")
	}
}

// TestHalfStepActivationBytes: ActivationBytes of the 16-bit step is the sum of the buffers
// half.go lists per policy (packed ones at 2 bytes a value, rounded up to a word), untiled
// and tiled, whole and chunked, with LocalAttention and with an Attention that takes float32
// operands only (its per-sequence float32 copies counted); the list is what plan mirrors.
func TestHalfStepActivationBytes(t *testing.T) {
	cfg := resolved(t, "gqa")
	const B, T = 2, 9
	n, L, D, Q, KV, F, V, H := B*T, cfg.NLayers, cfg.Dim, cfg.QDim(), cfg.KVDim(), cfg.FFNDim, cfg.VocabSize, cfg.NHeads
	pk := func(values int) int64 { return 4 * int64((values+1)/2) }
	fl := func(values int) int64 { return 4 * int64(values) }
	for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
		for _, split := range []struct{ tile, chunk int }{{0, 0}, {5, 7}} {
			for _, float := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/tile%d/chunk%d/float=%v", policy, split.tile, split.chunk, float), func(t *testing.T) {
					m := New(cfg, policy, kernels.NewCPU())
					m.Precision, m.MLPTile, m.LossChunk = kernels.BF16, split.tile, split.chunk
					if float {
						m.Attn = floatOnly{m.Attn}
					}
					m.Forward(stepBatches(cfg, B, T)[0])
					rows, chunk := n, n
					if split.tile > 0 {
						rows = split.tile
					}
					if split.chunk > 0 {
						chunk = split.chunk
					}
					mlp := int64(0) // untiled: the block's GU and Act
					if split.tile == 0 {
						mlp = pk(n*2*F) + pk(n*F)
					}
					all := 4*pk(n*D) + 2*pk(n*Q) + 2*pk(n*KV) + 2*fl(n) + fl(n*H) + mlp
					var want int64
					switch policy {
					case CheckpointNone:
						want = int64(L) * all
					case CheckpointLayer:
						want = int64(L)*pk(n*D) + all - pk(n*D)
					case CheckpointAttnOutput:
						want = int64(L)*(pk(n*D)+pk(n*Q)+fl(n*H)) + all - pk(n*D) - pk(n*Q) - fl(n*H)
					}
					if split.tile > 0 {
						want += pk(rows*2*F) + pk(rows*F)
					}
					want += fl(n*D) + pk(n*(Q+2*KV)) + 2*pk(n*D) + fl(n) + fl(chunk*V) + pk(chunk*V) + fl(n)
					want += fl(n*D) + 2*pk(n*D) + 2*pk(n*Q) + 2*pk(n*KV) + pk(n*(Q+2*KV)) + pk(rows*2*F) + pk(rows*F)
					if float {
						want += 4*fl(T*Q) + 4*fl(T*KV)
					}
					if got := m.ActivationBytes(); got != want {
						t.Errorf("ActivationBytes %d, want %d", got, want)
					}
				})
			}
		}
	}
}

// floatOnly hides an Attention's HalfAttention methods: what a sequence-parallel schedule is.
type floatOnly struct{ Attention }

// TestHalfStepFloatAttention: an Attention that takes float32 operands only (a sequence-
// parallel schedule; here LocalAttention with its 16-bit methods hidden) runs in the 16-bit
// step on the packed operands widened, its output and gradients packed: on one rank that is
// bit for bit the HalfAttention path, since the widened values are the 16-bit ones, which the
// attention packs again exactly in a 16-bit run (Operands); under every policy. WarmAttention
// runs either way and leaves the gradients as they were.
func TestHalfStepFloatAttention(t *testing.T) {
	cfg := resolved(t, "h33")
	bt := stepBatches(cfg, 2, 9)[0]
	for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
		run := func(float bool) (float64, []float32) {
			be := kernels.NewCPU()
			be.SetMatMulPrecision(kernels.BF16)
			m := New(cfg, policy, be)
			m.LoadParams(perturbedInit(cfg, m.Layout))
			m.Precision = kernels.BF16
			if float {
				m.Attn = floatOnly{m.Attn}
			}
			m.WarmAttention(bt.Pos)
			m.ZeroGrads()
			l, _ := m.ForwardBackward(bt, 0.05)
			return l, slices.Clone(kernels.Host(m.Grads.Flat))
		}
		l1, g1 := run(false)
		l2, g2 := run(true)
		if l1 != l2 || !slices.Equal(g1, g2) {
			t.Errorf("%v: float32-operand attention gives loss %v, 16-bit %v; gradients equal: %v", policy, l2, l1, slices.Equal(g1, g2))
		}
	}
}

// TestHalfStepKVHook: in the 16-bit step the forward hands KVHook each layer's keys and values
// once, widened to float32 ([B·T, kvheads·hd], as the float32 path does): bf16 values, not
// all zero; a Decoder's prefill of a 16-bit model runs on them.
func TestHalfStepKVHook(t *testing.T) {
	cfg := resolved(t, "gqa")
	m := New(cfg, CheckpointAttnOutput, kernels.NewCPU())
	m.LoadParams(perturbedInit(cfg, m.Layout))
	m.Precision = kernels.BF16
	bt := stepBatches(cfg, 2, 9)[0]
	calls := map[int]int{}
	m.KVHook = func(l int, k, v kernels.Buf) {
		calls[l]++
		for _, b := range []kernels.Buf{k, v} {
			x := kernels.Host(b)
			nonzero := false
			for _, e := range x {
				nonzero = nonzero || e != 0
				if kernels.RoundBF16(e) != e {
					t.Fatalf("layer %d: hooked value %v is not a bf16 value", l, e)
				}
			}
			if len(x) != 2*9*cfg.KVDim() || !nonzero {
				t.Errorf("layer %d: %d hooked values, want %d, not all zero", l, len(x), 2*9*cfg.KVDim())
			}
		}
	}
	m.ZeroGrads()
	m.ForwardBackward(bt, 0.05)
	for l := range cfg.NLayers {
		if calls[l] != 1 {
			t.Errorf("layer %d hooked %d times, want 1", l, calls[l])
		}
	}
	m.KVHook = nil
	d := NewDecoder(m, nil)
	logits := d.Prefill(bt.IDs[:9], Positions(9), 9, 2)
	if d.Cached() != 9 || len(logits) != cfg.VocabSize {
		t.Errorf("prefill cached %d tokens and gave %d logits", d.Cached(), len(logits))
	}
}
