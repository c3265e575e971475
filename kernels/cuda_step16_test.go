//go:build cuda

package kernels_test

// A bf16 training step on the CUDA backend, run on the recording fake device (no GPU): what
// the host asks of the device from the first launch of ForwardBackward to the update. Issue
// 41's acceptance: no GEMM of the step reads float32 operands (every product is MatMulHalf's,
// 16-bit A and B), nothing waits for the device inside the forward and backward (no copy to
// the host, no sync), the gradient statistics and the update queue without a wait either, and
// the step's losses come down in one copy.

import (
	"fmt"
	"strings"
	"testing"

	"distflash/kernels"
	"distflash/kernels/cuda"
	"distflash/model"
)

func TestCUDAHostHalfStepTrace(t *testing.T) {
	cfg := model.Config{Dim: 256, NLayers: 2, NHeads: 4, NKVHeads: 2, FFNDim: 96, VocabSize: 101, NormEps: 1e-5,
		RopeTheta: 10000, MaxSeqLen: 128}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	const B, T, L = 2, 64, 2
	n := B * T
	// GEMMs per layer: the forward's fused q‖k‖v, o, gate‖up and down; the backward's dX and
	// dW of each of those four; the recomputation's q‖k‖v, o and gate‖up (attention itself is
	// not a GEMM). The head: logits, dX and dW per loss chunk.
	for _, tc := range []struct {
		policy        model.Checkpoint
		tile, chunk   int
		perLayer, hdr int
	}{
		{model.CheckpointNone, 0, 0, 4 + 8, 3},
		{model.CheckpointAttnOutput, 0, 0, 4 + 3 + 8, 3},
		{model.CheckpointLayer, 0, 0, 4 + 3 + 8, 3},
		// tiled in 3 tiles of 48, 48, 32 tokens: gate‖up and down per tile, in the forward, the
		// recomputation (gate‖up) and the backward (four per tile); 2 loss chunks
		{model.CheckpointAttnOutput, 48, 64, 2 + 3*2 + 2 + 3*1 + 4 + 3*4, 6},
	} {
		name := fmt.Sprintf("%v/tile%d/chunk%d", tc.policy, tc.tile, tc.chunk)
		be, trace := kernels.NewTracingCUDAForTest(t)
		be.SetMatMulPrecision(kernels.BF16)
		m := model.New(cfg, tc.policy, be)
		m.LoadParams(model.InitParams(cfg, m.Layout, 3))
		cast := model.NewCastStore(be, m.Layout, m.Params.Flat, m.Grads.Flat, kernels.BF16)
		m.Store, m.Precision, m.DeferLoss, m.FreshGrads = cast, kernels.BF16, true, true
		m.MLPTile, m.LossChunk = tc.tile, tc.chunk
		ids, tg := make([]int32, n), make([]int32, n)
		for i := range ids {
			ids[i], tg[i] = int32(i*7%cfg.VocabSize), int32(i*11%cfg.VocabSize)
		}
		trace()
		if _, count := m.ForwardBackward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: model.Positions(T)}, 1/float32(n)); count != n {
			t.Fatalf("%s: %d targets counted, want %d", name, count, n)
		}
		gemms, widened := 0, 0
		for _, line := range trace() {
			switch f := strings.Fields(line); f[0] {
			case "dtoh", "sync":
				t.Errorf("%s: the forward and backward wait for the device (%s)", name, line)
			case "gemm":
				gemms++
				if f[1] != fmt.Sprint(cuda.BFloat16) || f[2] != fmt.Sprint(cuda.BFloat16) {
					t.Errorf("%s: a GEMM of %s and %s operands in a bf16 step", name, f[1], f[2])
				}
			case "launch":
				if f[1] == "df_unpack_half" {
					widened++
				}
			}
		}
		if want := L*tc.perLayer + tc.hdr; gemms != want {
			t.Errorf("%s: %d GEMMs, want %d", name, gemms, want)
		}
		// nothing is widened but, under a recomputing policy, each block's kept 16-bit input
		// into the float32 residual its recomputation starts from (no weight, no activation
		// operand)
		if want := map[bool]int{false: 0, true: L}[tc.policy != model.CheckpointNone]; widened != want {
			t.Errorf("%s: %d widenings, want %d", name, widened, want)
		}

		// the optimizer phase: statistics and the update with the 16-bit copy, without a wait
		// and without a separate refresh
		stats := be.Alloc(3)
		be.GradStats(stats, m.Grads.Flat)
		var segs []kernels.AdamWSegment
		for _, ts := range m.Layout.Tensors {
			segs = append(segs, kernels.AdamWSegment{Off: ts.Off, N: ts.Size(), Decay: ts.Decay})
		}
		size := m.Layout.Size
		be.AdamWSegmentsHalf(m.Params.Flat, m.Grads.Flat, be.Alloc(size), be.Alloc(size), cast.Packed(), segs,
			kernels.AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Step: 1, GradScale: 1}, kernels.BF16)
		for _, line := range trace() {
			if line == "dtoh" || line == "sync" || line == "launch df_pack_half" {
				t.Errorf("%s: the optimizer phase made %q", name, line)
			}
		}
		m.TakeLoss()
		if tr := trace(); len(tr) != 1 || tr[0] != "dtoh" {
			t.Errorf("%s: taking the step's losses made %v, want one copy to the host", name, tr)
		}
	}
}
