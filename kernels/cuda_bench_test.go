//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

// cudaBenchList reads the comma-separated positive integers of environment variable name, or
// returns def when it is unset.
func cudaBenchList(b *testing.B, name string, def []int) []int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: %q is not a positive integer", name, s, f)
		}
		out = append(out, n)
	}
	return out
}

// cudaBenchHeads is the number of independent (sequence, head) pairs BenchmarkCUDAAttn runs at
// sequence length n and head dimension hd: the heads of a 2048-wide model (2048/hd) times a
// batch of max(1, 16384/n) sequences, folded into the head axis (they are independent), so
// that every shape has at least 16K tokens × 2048 and fills the GPU. bench/cuda_attn.py uses
// the same rule for PyTorch (batch and heads kept apart there).
func cudaBenchHeads(n, hd int) int { return 2048 / hd * max(1, 16384/n) }

// BenchmarkCUDAAttn times causal self-attention of n tokens with head dimension hd (MHA, heads
// by cudaBenchHeads) on tensor cores (bf16 operands, fp32 accumulation), as one full-sequence
// call of the block primitive: fwd = AttnInit + AttnForward + AttnFinish (the 16-bit conversion
// of q, k, v included), bwd = AttnBackwardPrep + AttnBackward. TFLOP/s counts the useful work,
// 4·n(n+1)/2·hd·H for the forward and 2.5× that for the backward (the convention of the
// FlashAttention papers and of bench/cuda_attn.py for PyTorch's SDPA). Sequence lengths: 4K to
// 64K, or DISTFLASH_BENCH_SEQS; head dimensions: 128, or DISTFLASH_BENCH_HEADDIMS (32, 64, 128).
// Sub-benchmarks are named fwd|bwd/hdHD/nN/hHEADS.
func BenchmarkCUDAAttn(b *testing.B) {
	be := gpu(b)
	be.setPrecision(precBF16)
	defer be.setPrecision(precFP32)
	seqs := cudaBenchList(b, "DISTFLASH_BENCH_SEQS", []int{4096, 8192, 16384, 32768, 65536})
	for _, hd := range cudaBenchList(b, "DISTFLASH_BENCH_HEADDIMS", []int{128}) {
		for _, n := range seqs {
			benchAttnShape(b, be, n, cudaBenchHeads(n, hd), 0, hd)
		}
	}
}

// BenchmarkCUDAAttnGQA times the 0.85B model's attention (configs/llama-1b.toml: 16 heads of
// 128 over 4 kv heads, one sequence) as BenchmarkCUDAAttn times MHA: the shape whose dK/dV
// kernel the GQA split serves (kernels/cuda_geom.go, planDKDV), at 8K and 64K tokens, or
// DISTFLASH_BENCH_GQA_SEQS. Sub-benchmarks are named fwd|bwd/hd128/nN/h16/kv4 (the
// BenchmarkCUDAAttn lines that bench/cuda_attn.py reads are not among them).
func BenchmarkCUDAAttnGQA(b *testing.B) {
	be := gpu(b)
	be.setPrecision(precBF16)
	defer be.setPrecision(precFP32)
	for _, n := range cudaBenchList(b, "DISTFLASH_BENCH_GQA_SEQS", []int{8192, 65536}) {
		benchAttnShape(b, be, n, 16, 4, 128)
	}
}

// benchAttnShape runs the fwd and bwd sub-benchmarks of one shape: H query heads over KVH kv
// heads (0: MHA, KVH = H).
func benchAttnShape(b *testing.B, be *CUDA, n, H, KVH, hd int) {
	r := rand.New(rand.NewPCG(uint64(n), uint64(hd)))
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(i)
	}
	name := fmt.Sprintf("hd%d/n%d/h%d", hd, n, H)
	if KVH == 0 {
		KVH = H
	} else {
		name += fmt.Sprintf("/kv%d", KVH)
	}
	sh := AttnShape{NQ: n, NK: n, Heads: H, KVHeads: KVH, HeadDim: hd, Causal: true,
		Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos}
	buf := func(heads int, scale float64) Buf {
		x := be.Alloc(n * heads * hd)
		be.Upload(x, randVec(r, n*heads*hd, scale))
		return x
	}
	q, k, v, do := buf(H, 1), buf(KVH, 1), buf(KVH, 1), buf(H, 1)
	o, dq, dk, dv := be.Alloc(n*H*hd), be.Alloc(n*H*hd), be.Alloc(n*KVH*hd), be.Alloc(n*KVH*hd)
	lse, d := be.Alloc(H*n), be.Alloc(H*n)
	st := AttnState{O: be.Alloc(n * H * hd), M: be.Alloc(H * n), L: be.Alloc(H * n)}
	fwd := func() {
		be.AttnInit(st)
		be.AttnForward(st, q, k, v, sh)
		be.AttnFinish(o, lse, st, n, H, hd)
	}
	flops := attnFLOPs(n, H, hd, true)
	b.Run("fwd/"+name, func(b *testing.B) {
		fwd()
		be.Sync()
		for b.Loop() {
			fwd()
			be.Sync()
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
	})
	b.Run("bwd/"+name, func(b *testing.B) {
		fwd()
		for b.Loop() {
			be.AttnBackwardPrep(d, o, do, n, H, hd, FP32)
			be.AttnBackward(dq, dk, dv, q, k, v, nil, do, lse, d, sh)
			be.Sync()
		}
		b.ReportMetric(2.5*flops*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
	})
}

// BenchmarkCUDAMatMul times cuBLAS through MatMul at n×n×n for each precision.
func BenchmarkCUDAMatMul(b *testing.B) {
	be := gpu(b)
	defer be.setPrecision(precFP32)
	r := rand.New(rand.NewPCG(2, 2))
	for _, n := range []int{1024, 4096, 8192} {
		a, x, c := be.Alloc(n*n), be.Alloc(n*n), be.Alloc(n*n)
		be.Upload(a, randVec(r, n*n, 1))
		be.Upload(x, randVec(r, n*n, 1))
		for _, p := range []cudaPrec{precFP32, precBF16, precFP16} {
			b.Run(fmt.Sprintf("%v/n%d", p, n), func(b *testing.B) {
				be.setPrecision(p)
				be.MatMul(c, a, x, n, n, n, false, true, 0)
				be.Sync()
				for b.Loop() {
					be.MatMul(c, a, x, n, n, n, false, true, 0)
					be.Sync()
				}
				b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
			})
		}
	}
}
