package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"distflash/kernels"
)

// opTable is the per-op table wantOps builds: its rows by "op phase".
type opTable map[string]opWant

// add puts calls more calls of op in phase, each costing each, into their row; 0 calls add no row.
func (w opTable) add(op, phase string, calls int, each kernels.OpCost) {
	if calls == 0 {
		return
	}
	k := op + " " + phase
	x := w[k]
	x.calls += calls
	x.cost = x.cost.Plus(kernels.OpCost{Bytes: int64(calls) * each.Bytes, FLOPs: int64(calls) * each.FLOPs})
	w[k] = x
}

// opWant is what one row of the per-op table must hold for one step: its calls and their
// summed cost.
type opWant struct {
	calls int
	cost  kernels.OpCost
}

// TestOpProfileOfAStep runs real ForwardBackward steps on the CPU backend with a per-op profile
// timed by a fake clock (one tick per op and per gap) and checks the table row by row: every
// op class in every phase with its calls (L layers × 7 projections forward, each again in the
// recomputation, two GEMMs each in the backward, …), its bytes and FLOPs by the cost formulas
// (attention's FLOPs: what the backend counted), its time, its floor and the ratio; and that a
// step outside BeginStep … EndStep is not timed.
func TestOpProfileOfAStep(t *testing.T) {
	cfg := testConfigs()["gqa"]
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	const B, T = 2, 19
	for _, tc := range []struct {
		name        string
		policy      Checkpoint
		tile, chunk int
		prec        kernels.Precision
		step16      bool // the 16-bit step (Model.Precision), not 16-bit kept activations
	}{
		{"none", CheckpointNone, 0, 0, kernels.FP32, false},
		{"layer", CheckpointLayer, 0, 0, kernels.FP32, false},
		{"attn_output", CheckpointAttnOutput, 0, 0, kernels.FP32, false},
		{"attn_output tiled chunked bf16", CheckpointAttnOutput, 7, 10, kernels.BF16, false},
		{"16-bit step none", CheckpointNone, 0, 0, kernels.BF16, true},
		{"16-bit step layer tiled", CheckpointLayer, 7, 0, kernels.BF16, true},
		{"16-bit step none tiled chunked", CheckpointNone, 7, 10, kernels.FP16, true},
		{"16-bit step attn_output chunked", CheckpointAttnOutput, 0, 10, kernels.BF16, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := kernels.NewCPU()
			m := New(cfg, tc.policy, be)
			m.LoadParams(perturbedInit(cfg, m.Layout))
			m.MLPTile, m.LossChunk = tc.tile, tc.chunk
			if tc.prec != kernels.FP32 {
				be.SetMatMulPrecision(tc.prec)
				m.ActPrecision = tc.prec
				m.Store = NewCastStore(be, m.Layout, m.Params.Flat, m.Grads.Flat, tc.prec)
			}
			if tc.step16 {
				m.Precision = tc.prec
			}
			clock := kernels.NewTickTimer(1e-3)
			ceil := kernels.Ceilings{BytesPerSec: 2e9, FLOPsPerSec: 1e11, Source: "test"}
			m.Ops = kernels.NewOpProfile(clock, ceil)
			r := rand.New(rand.NewPCG(3, 4))
			bt := Batch{IDs: randomTokens(r, B*T, cfg.VocabSize), Targets: randomTokens(r, B*T, cfg.VocabSize), B: B, Pos: Positions(T)}
			m.ZeroGrads()
			m.ForwardBackward(bt, 1) // not profiled: outside a step
			if clock.Marked() != 0 {
				t.Fatalf("%d marks outside a profiled step", clock.Marked())
			}
			be.Counters().Reset()
			m.Ops.BeginStep()
			m.ForwardBackward(bt, 1)
			m.Ops.EndStep()
			marks := clock.Marked()
			m.ForwardBackward(bt, 1)
			if clock.Marked() != marks {
				t.Fatalf("%d marks after the profiled step", clock.Marked()-marks)
			}
			want := wantOps(cfg, tc.policy, B, T, tc.tile, tc.chunk, tc.prec != kernels.FP32)
			if tc.step16 {
				want = wantOpsHalf(cfg, tc.policy, B, T, tc.tile, tc.chunk)
			}
			fwd, bwd := be.Counters().AttnFwdFLOPs.Load()/2, be.Counters().AttnBwdFLOPs.Load()/2 // two steps counted
			tab := m.Ops.Table("cpu")
			spans := 0
			for _, row := range tab.Rows {
				if row.Op == "gaps" {
					continue
				}
				k := row.Op + " " + row.Phase
				w, ok := want[k]
				if !ok {
					t.Errorf("%s: unexpected row %+v", k, row)
					continue
				}
				delete(want, k)
				spans += w.calls
				cost := w.cost
				if row.Op == "attention" { // the FLOPs the backend counted, split evenly over the forward's passes
					cost.FLOPs = bwd
					if row.Phase != "bwd" {
						cost.FLOPs = fwd
						if tc.policy == CheckpointLayer {
							cost.FLOPs = fwd / 2
						}
					}
				}
				// at these tiny shapes every op's bytes take longer than its FLOPs at the
				// ceilings, so a row's floor is its bytes over the bandwidth
				floor := float64(cost.Bytes) / ceil.BytesPerSec
				if float64(cost.FLOPs)/ceil.FLOPsPerSec > floor {
					t.Fatalf("%s: compute-bound at these ceilings; the test assumes bytes-bound floors", k)
				}
				secs := float64(w.calls) * 1e-3
				if row.Calls != float64(w.calls) || row.Bytes != float64(cost.Bytes) || row.FLOPs != float64(cost.FLOPs) ||
					!near(row.Seconds, secs) || !near(row.FloorSeconds, floor) || !near(row.Ratio, secs/floor) {
					t.Errorf("%s: %v calls, %v bytes, %v FLOPs, %v s, floor %v s, ratio %v; want %d, %d, %d, %v, %v, %v", k, row.Calls, row.Bytes,
						row.FLOPs, row.Seconds, row.FloorSeconds, row.Ratio, w.calls, cost.Bytes, cost.FLOPs, secs, floor, secs/floor)
				}
			}
			for k, w := range want {
				t.Errorf("%s: missing (want %d calls)", k, w.calls)
			}
			t.Logf("the table (go test -v):\n%s", tab.Text())
			// marks: the step's first and last, and two per op; every gap lasts a tick
			if marks != 2+2*spans || !near(tab.StepSeconds, float64(2*spans+1)*1e-3) || !near(tab.GapSeconds, float64(spans+1)*1e-3) {
				t.Errorf("%d marks for %d ops; step %v s, gaps %v s", marks, spans, tab.StepSeconds, tab.GapSeconds)
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(b), 1e-12) }

// wantOps is the table of one step of ForwardBackward, by the model's structure: B sequences
// of T tokens, MLP tiles of tile tokens and loss chunks of chunk (0: whole), half: a bf16
// compute copy of the weights (CastStore) and kept activations in bf16.
func wantOps(c Config, policy Checkpoint, B, T, tile, chunk int, half bool) map[string]opWant {
	L, D, Q, KV, F, V, H, hd := c.NLayers, c.Dim, c.QDim(), c.KVDim(), c.FFNDim, c.VocabSize, c.NHeads, c.HeadDim
	n := B * T
	w := opTable{}
	mm := kernels.MatMulCost
	re := 0 // the forward again in the backward
	if policy != CheckpointNone {
		re = 1
	}
	// a projection of rows tokens: forward, recomputed, and its two backward GEMMs (dW, then
	// dx set or added)
	proj := func(op string, rows, out, in, fwd, rec, bwd int, beta float32) {
		w.add(op, "fwd", fwd, mm(rows, out, in, 0))
		w.add(op, "recompute", rec, mm(rows, out, in, 0))
		w.add(op, "bwd", bwd, mm(out, in, rows, 1))
		w.add(op, "bwd", bwd, mm(rows, in, out, beta))
	}
	proj("gemm.q", n, Q, D, L, re*L, L, 0)
	proj("gemm.k", n, KV, D, L, re*L, L, 1)
	proj("gemm.v", n, KV, D, L, re*L, L, 1)
	proj("gemm.o", n, D, Q, L, re*L, L, 0)
	sw := kernels.SwiGLUBackwardActCost
	if policy == CheckpointNone && tile == 0 {
		sw = kernels.SwiGLUBackwardCost
	}
	step := n
	if tile > 0 {
		step = tile
	}
	for i0 := 0; i0 < n; i0 += step {
		rows := min(step, n-i0)
		rec := re // untiled, the recomputed forward makes gate and up; tiled, the backward makes each tile's
		if tile > 0 {
			rec = 1
		}
		proj("gemm.gate", rows, F, D, L, rec*L, L, 0)
		proj("gemm.up", rows, F, D, L, rec*L, L, 1)
		proj("gemm.down", rows, D, F, L, 0, L, 0)
		w.add("swiglu", "fwd", L, kernels.SwiGLUCost(rows*F))
		w.add("swiglu", "bwd", L, sw(rows*F))
		w.add("residual", "fwd", L, kernels.AddCost(rows*D))
	}
	step = n
	if chunk > 0 {
		step = chunk
	}
	for i0 := 0; i0 < n; i0 += step {
		rows := min(step, n-i0)
		proj("gemm.head", rows, V, D, 1, 0, 1, 0)
		w.add("loss", "fwd", 1, kernels.CrossEntropyCost(rows, V, true))
	}
	shape := kernels.AttnShape{NQ: T, NK: T, Heads: H, KVHeads: c.NKVHeads, HeadDim: hd}
	w.add("attention", "fwd", B*L, kernels.AttnCost(shape, false, 0))
	if policy == CheckpointLayer {
		w.add("attention", "recompute", B*L, kernels.AttnCost(shape, false, 0))
	}
	w.add("attention", "bwd", B*L, kernels.AttnCost(shape, true, 0))
	w.add("rmsnorm", "fwd", L+1, kernels.RMSNormCost(n, D))
	w.add("rmsnorm", "recompute", re*L, kernels.RMSNormCost(n, D))
	w.add("rmsnorm", "bwd", 2*L+1, kernels.RMSNormBackwardCost(n, D))
	w.add("add+rmsnorm", "fwd", L, kernels.AddRMSNormCost(n, D))
	w.add("add+rmsnorm", "recompute", re*L, kernels.AddRMSNormCost(n, D))
	for _, ph := range []string{"fwd", "recompute", "bwd"} {
		k := 1
		if ph == "recompute" {
			k = re
		}
		w.add("rope", ph, k*B*L, kernels.RoPECost(T, H, hd))
		w.add("rope", ph, k*B*L, kernels.RoPECost(T, c.NKVHeads, hd))
	}
	w.add("embedding", "fwd", 1, kernels.EmbeddingCost(n, D, false))
	w.add("embedding", "bwd", 1, kernels.EmbeddingCost(n, D, true))
	w.add("zero", "bwd", 1, kernels.ZeroCost(n*D))
	w.add("zero", "bwd", L, kernels.ZeroCost(n*Q))
	w.add("zero", "bwd", 2*L, kernels.ZeroCost(n*KV))
	if half {
		// the weights widened unit by unit: all in the forward, the head and the blocks in
		// the backward; each block's input and attention output kept in 16 bits in the
		// forward and widened in the recomputation
		units := NewLayout(c).Units()
		for i, u := range units {
			w.add("cast", "fwd", 1, kernels.HalfCost(u.N))
			if i > 0 {
				w.add("cast", "bwd", 1, kernels.HalfCost(u.N))
			}
		}
		w.add("cast", "fwd", L, kernels.HalfCost(n*D))
		w.add("cast", "fwd", L, kernels.HalfCost(n*Q))
		w.add("cast", "recompute", L, kernels.HalfCost(n*D))
		w.add("cast", "recompute", L, kernels.HalfCost(n*Q))
	}
	return w
}

// wantOpsHalf is wantOps for the 16-bit step (half.go) with a CastStore, which lends its
// 16-bit weights as they are (no cast): the fused projections under gemm.qkv and gemm.gate+up, the
// block inputs rounded (cast, L−1 times) and, recomputing, unpacked from the kept X.
func wantOpsHalf(c Config, policy Checkpoint, B, T, tile, chunk int) map[string]opWant {
	L, D, Q, KV, F, V, H, hd := c.NLayers, c.Dim, c.QDim(), c.KVDim(), c.FFNDim, c.VocabSize, c.NHeads, c.HeadDim
	n, QKV := B*T, Q+2*KV
	w := opTable{}
	mm := halfMatMulCost
	re := 0
	if policy != CheckpointNone {
		re = 1
	}
	w.add("embedding", "fwd", 1, halfEmbeddingCost(n, D))
	w.add("embedding", "bwd", 1, kernels.EmbeddingCost(n, D, true))
	w.add("cast", "fwd", L-1, kernels.OpCost{Bytes: 8 * int64(n*D), FLOPs: int64(n * D)})
	w.add("cast", "recompute", re*L, kernels.HalfCost(n*D))
	w.add("zero", "bwd", 1, kernels.ZeroCost(n*D))
	// norms: the attention norm keeps X in the forward; the FFN norm keeps H under none in
	// the forward and in the recomputation
	w.add("rmsnorm", "fwd", L+1, halfRMSNormCost(n, D, true))
	w.add("rmsnorm", "fwd", L, halfRMSNormCost(n, D, policy == CheckpointNone))
	w.add("rmsnorm", "recompute", re*L, halfRMSNormCost(n, D, false))
	w.add("rmsnorm", "recompute", re*L, halfRMSNormCost(n, D, true))
	w.add("rmsnorm", "bwd", 2*L, halfRMSNormBackwardCost(n, D, true))
	w.add("rmsnorm", "bwd", 1, halfRMSNormBackwardCost(n, D, false))
	for _, ph := range []string{"fwd", "recompute"} {
		k := 1
		if ph == "recompute" {
			k = re
		}
		w.add("gemm.qkv", ph, k*L, mm(n, QKV, D, 0, true))
		w.add("gemm.o", ph, k*L, mm(n, D, Q, 1, false))
		w.add("rope", ph, k*B*L, halfRoPEQKVCost(T, Q, KV))
	}
	w.add("rope", "bwd", B*L, halfRoPEQKVCost(T, Q, KV))
	w.add("gemm.qkv", "bwd", L, mm(n, D, QKV, 0, true))
	w.add("gemm.qkv", "bwd", L, mm(QKV, D, n, 1, false))
	w.add("gemm.o", "bwd", L, mm(n, Q, D, 0, true))
	w.add("gemm.o", "bwd", L, mm(D, Q, n, 1, false))
	step := n
	if tile > 0 {
		step = tile
	}
	for i0 := 0; i0 < n; i0 += step {
		rows := min(step, n-i0)
		rec := re
		if tile > 0 {
			rec = 1
		}
		w.add("gemm.gate+up", "fwd", L, mm(rows, 2*F, D, 0, true))
		w.add("gemm.gate+up", "recompute", rec*L, mm(rows, 2*F, D, 0, true))
		w.add("swiglu", "fwd", L, halfSwiGLUCost(rows*F))
		w.add("gemm.down", "fwd", L, mm(rows, D, F, 1, false))
		w.add("gemm.down", "bwd", L, mm(rows, F, D, 0, true))
		w.add("gemm.down", "bwd", L, mm(D, F, rows, 1, false))
		w.add("swiglu", "bwd", L, halfSwiGLUBackwardCost(rows*F, policy != CheckpointNone || tile > 0))
		w.add("gemm.gate+up", "bwd", L, mm(rows, D, 2*F, 0, true))
		w.add("gemm.gate+up", "bwd", L, mm(2*F, D, rows, 1, false))
	}
	step = n
	if chunk > 0 {
		step = chunk
	}
	for i0 := 0; i0 < n; i0 += step {
		rows := min(step, n-i0)
		w.add("gemm.head", "fwd", 1, mm(rows, V, D, 0, false))
		w.add("loss", "fwd", 1, halfCrossEntropyCost(rows, V))
		w.add("gemm.head", "bwd", 1, mm(rows, D, V, 0, true))
		w.add("gemm.head", "bwd", 1, mm(V, D, rows, 1, false))
	}
	shape := kernels.AttnShape{NQ: T, NK: T, Heads: H, KVHeads: c.NKVHeads, HeadDim: hd}
	w.add("attention", "fwd", B*L, halfAttnCost(shape, false, 0))
	if policy == CheckpointLayer {
		w.add("attention", "recompute", B*L, halfAttnCost(shape, false, 0))
	}
	w.add("attention", "bwd", B*L, halfAttnCost(shape, true, 0))
	return w
}
