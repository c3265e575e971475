package plan

import (
	"fmt"

	"distflash/config"
)

// A GPU's compute time of a step, component by component, on issue 41's path (the 16-bit step
// of issue 41's review of the CUDA step, its §6): every product a GEMM of 16-bit operands at the
// rate native bf16 cuBLAS reaches, the attention at cuDNN's rate (or the own kernel's), every
// other kernel memory-bound at a fraction of the HBM bandwidth, and the optimizer phase as the
// bytes its fused passes move. These are predictions from assumed rates, not measurements: the
// GPU check's per-op tables (train --profile) are what confirm or replace them.
//
// The rates, as fractions of the GPU's datasheet figures (GPUType), and where they come from:
//
//   - GEMMs: gemmFraction of the dense bf16 peak (of the float32 peak in an fp32 run).
//   - Attention: cudnnAttnFraction of the bf16 peak for cuDNN's fused attention
//     (device.attention auto or cudnn, in bf16 or fp16), ownAttnFraction for the own
//     FlashAttention-2 kernels (device.attention = own; of the float32 peak in fp32).
//   - Memory-bound kernels and the optimizer: hbmFraction of the HBM bandwidth.
//
// --mfu and --attn-mfu replace the GEMMs' and the attention's fractions.
const (
	// gemmFraction: bf16 cuBLAS with 16-bit A and B reaches 600–720 TF/s of the H100's 989 on
	// the 0.85B's shapes in torchtitan and llm.c (the review's §1); 650 TF/s taken. Assumed,
	// not measured by distflash.
	gemmFraction = 0.65
	// cudnnAttnFraction: PyTorch's SDPA (cuDNN) ran 455–560 TF/s forward and backward at
	// head_dim 128, causal, on an H100 (the review's §0 and §6); 480 TF/s taken.
	cudnnAttnFraction = 0.485
	// ownAttnFraction: the own kernels' benchmark gave 97–119 TF/s forward and backward at
	// head_dim 128 on an H100 (kernels/cuda_bench_test.go, MHA; the model's GQA backward at 8K
	// ran about 86 by the review's fit); 110 TF/s taken.
	ownAttnFraction = 0.11
	// hbmFraction: memory-bound kernels at 2.6 of the H100's 3.35 TB/s (the review's §6).
	hbmFraction = 0.78
)

// TimeComponent is one part of a GPU's predicted compute time of a step.
type TimeComponent struct {
	Name    string  `json:"name"`    // gemm, attention, elementwise, optimizer
	Work    float64 `json:"work"`    // FLOPs (gemm, attention) or bytes (elementwise, optimizer), per rank
	Rate    float64 `json:"rate"`    // FLOP/s or bytes/s assumed
	Seconds float64 `json:"seconds"` // Work / Rate (attention: stretched by the schedule's idle fraction)
	Basis   string  `json:"basis"`   // what the rate is
}

// gpuStepTime predicts a GPU rank's compute time of one step of cfg (resolved: a policy, a tile
// and a chunk) over tokens tokens (its micro-batches' together), whose attention is attnFLOPs
// of work stretched to stretched by the schedule's idle: the GEMMs, the attention, the other
// kernels' bytes and the optimizer phase's.
//
// GEMM FLOPs: 6 × (each block's projection weights: D·(Q+2KV) + Q·D + 3·D·F, times the
// layers, plus the head's V·D) per token, and what the policy recomputes, per block and token:
// attn_output 2·(D·(Q+2KV) + Q·D + 2·D·F) (the q|k|v, output and gate|up products), layer
// 2·(D·(Q+2KV) + Q·D + 3·D·F) (the whole block), none with the MLP in tiles 2·2·D·F (each tile's
// gate and up), none whole nothing. The embedding is a gather, not a product.
//
// Elementwise bytes (each operand read once and each result written once, activations h bytes
// a value: 2 in bf16/fp16, 4 in fp32; the residual stream, statistics and logits float32), per
// block and token: forward 8·D + 4·h·D (the two norms: the float32 residual in, the normed
// output and the kept input out) + 2·h·(Q+2KV) (RoPE of the fused q|k|v) + 3·h·F (SwiGLU);
// backward 16·D + 6·h·D (the two norms' backward: dout, x, dx read and written in float32,
// its 16-bit copy) + 2·h·(Q+2KV) (RoPE's inverse) + 6·h·F (SwiGLU's backward: dact and gate|up
// in, dgate|dup and the activation out); the recomputation the forward's again (attn_output,
// layer) or SwiGLU's (none in tiles). The head: the final norm (12·D + 4·h·D) and the loss
// (the float32 logits read twice, their gradient written: (8 + h)·V), the embedding (12·D).
//
// The optimizer phase per parameter the rank holds: AdamW's 28 bytes (parameter, moments read
// and written, gradient read), the 16-bit copy written in the same pass (2 bytes, bf16/fp16),
// and the gradient read once more for Σg² and finiteness (GradStats: 4 bytes).
func gpuStepTime(cfg config.Config, cl Cluster, tokens, attnFLOPs, stretched float64) []TimeComponent {
	m := cfg.Model
	L := float64(m.NLayers)
	D, Q, KV, F, V := float64(m.Dim), float64(m.QDim()), float64(m.KVDim()), float64(m.FFNDim), float64(m.VocabSize)
	h := elemBytes(cfg)
	qkv, o, gu, down := D*(Q+2*KV), Q*D, 2*D*F, F*D
	gemm := 6 * (L*(qkv+o+gu+down) + V*D)
	n := tokens / float64(max(cfg.Training.GradAccumSteps, 1))
	tiled := cfg.Training.MLPTile > 0 && float64(cfg.Training.MLPTile) < n
	fwd := 8*D + 4*h*D + 2*h*(Q+2*KV) + 3*h*F
	bwd := 16*D + 6*h*D + 2*h*(Q+2*KV) + 6*h*F
	var rec, recBytes float64
	switch cfg.Checkpoint.Activation {
	case "attn_output":
		rec, recBytes = 2*(qkv+o+gu), fwd
	case "layer":
		rec, recBytes = 2*(qkv+o+gu+down), fwd
	case "none":
		if tiled {
			rec, recBytes = 2*gu, 3*h*F
		}
	}
	gemm += L * rec
	elem := L*(fwd+bwd+recBytes) + 12*D + 4*h*D + (8+h)*V + 12*D
	held := m.ParamCount()
	if cfg.Parallelism.FSDP {
		held /= float64(dims(cfg).World)
	}
	opt := 28.0 + 4
	if h < 4 {
		opt += 2
	}

	peak, peakName := cl.GPU.FLOPS, "bf16"
	if h == 4 {
		peak, peakName = cl.GPU.FP32FLOPS, "float32"
	}
	gemmFrac, gemmBasis := cl.MFU, fmt.Sprintf("%.2f of the %s peak: native 16-bit cuBLAS, assumed", cl.MFU, peakName)
	if cl.MFU != cl.GPU.MFU {
		gemmBasis = fmt.Sprintf("%.2f of the %s peak: given (--mfu)", cl.MFU, peakName)
	}
	attnFrac, attnBasis := attnFraction(cfg, cl)
	attnBasis = fmt.Sprintf("%.3f of the %s peak: %s", attnFrac, peakName, attnBasis)
	hbm := cl.GPU.HBMBW * hbmFraction
	hbmBasis := fmt.Sprintf("%.2f of %.2f TB/s HBM, assumed", hbmFraction, cl.GPU.HBMBW/1e12)
	comps := []TimeComponent{
		{Name: "gemm", Work: gemm * tokens, Rate: peak * gemmFrac, Basis: gemmBasis},
		{Name: "attention", Work: attnFLOPs, Rate: peak * attnFrac, Basis: attnBasis},
		{Name: "elementwise", Work: elem * tokens, Rate: hbm, Basis: hbmBasis},
		{Name: "optimizer", Work: opt * held, Rate: hbm, Basis: hbmBasis},
	}
	for i := range comps {
		c := &comps[i]
		if c.Rate > 0 {
			c.Seconds = c.Work / c.Rate
		}
	}
	if attnFLOPs > 0 {
		comps[1].Seconds *= stretched / attnFLOPs
	}
	return comps
}

// attnFraction is the fraction of the peak the run's attention reaches, and why: --attn-mfu
// when given, else cuDNN's (a 16-bit run whose device.attention is auto or cudnn) or the own
// kernels' (device.attention = own, or fp32, which cuDNN's fused attention does not run).
func attnFraction(cfg config.Config, cl Cluster) (float64, string) {
	if cl.AttnMFU != cl.GPU.AttnMFU {
		return cl.AttnMFU, "given (--attn-mfu, or --mfu)"
	}
	if elemBytes(cfg) == 4 || cfg.Device.Attention == "own" {
		return cl.GPU.OwnAttnMFU, "the own FlashAttention-2 kernels (device.attention = own, or fp32), as their benchmark ran"
	}
	return cl.AttnMFU, "cuDNN's fused attention, as PyTorch's SDPA ran"
}
