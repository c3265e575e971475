//go:build cuda

package kernels

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
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

// gemmShape is one product of the GEMM table (the review's §1, notes/gpu-step-review.md): the
// 0.85B model's GEMMs at 8K tokens, D 2048, Q 2048, KV 512, F 5632, V 32000, each as model/ops.go
// calls MatMul for a projection y = x·Wᵀ of W [out, in]: the forward (M tokens, N out, K in,
// B transposed), the input gradient dX = dY·W (M tokens, N in, K out) and the weight gradient
// dW += dYᵀ·X (M out, N in, K tokens, A transposed, accumulated). k and v share a shape, so do
// gate and up, and the head's is taken whole (not in loss chunks). Beta is the model's: 1 for
// the accumulated weight gradients and the k/v input gradients (added into the q one), else 0.
type gemmShape struct {
	Role           string
	M, N, K        int
	TransA, TransB bool
	Beta           float32
}

// gemmTable is the 18 shapes; 2·M·N·K is the review's GFLOP column (68.7, 17.2, 68.7, 189, 189,
// 1074 per product), which TestCUDAHostGemmTable checks.
var gemmTable = []gemmShape{
	{"q.fwd", 8192, 2048, 2048, false, true, 0},
	{"q.dX", 8192, 2048, 2048, false, false, 0},
	{"q.dW", 2048, 2048, 8192, true, false, 1},
	{"kv.fwd", 8192, 512, 2048, false, true, 0},
	{"kv.dX", 8192, 2048, 512, false, false, 1},
	{"kv.dW", 512, 2048, 8192, true, false, 1},
	{"o.fwd", 8192, 2048, 2048, false, true, 0},
	{"o.dX", 8192, 2048, 2048, false, false, 0},
	{"o.dW", 2048, 2048, 8192, true, false, 1},
	{"gate_up.fwd", 8192, 5632, 2048, false, true, 0},
	{"gate_up.dX", 8192, 2048, 5632, false, false, 0},
	{"gate_up.dW", 5632, 2048, 8192, true, false, 1},
	{"down.fwd", 8192, 2048, 5632, false, true, 0},
	{"down.dX", 8192, 5632, 2048, false, false, 0},
	{"down.dW", 2048, 5632, 8192, true, false, 1},
	{"head.fwd", 8192, 32000, 2048, false, true, 0},
	{"head.dX", 8192, 2048, 32000, false, false, 0},
	{"head.dW", 32000, 2048, 8192, true, false, 1},
}

// The modes of the GEMM table: today's MatMul (float32 A, B and C, bf16 products through
// CUBLAS_COMPUTE_32F_FAST_16BF, the shape's beta); MatMulHalf with bf16 A, B and C (beta 0);
// MatMulHalf with bf16 A and B into a float32 C (the shape's beta: a weight gradient, the
// residual stream). bench/torch_gemm.py adds "torch-bf16".
const (
	gemmFP32Storage = "fp32-storage"
	gemmBF16        = "bf16"
	gemmBF16F32C    = "bf16-f32c"
)

var gemmModes = []string{gemmFP32Storage, gemmBF16, gemmBF16F32C}

// gemmResult is one row of the table's JSON (DISTFLASH_GEMM_OUT; bench/torch_gemm.py writes
// the same): the mean time of one product and its rate, 2·M·N·K / time.
type gemmResult struct {
	Role   string  `json:"role"`
	M      int     `json:"m"`
	N      int     `json:"n"`
	K      int     `json:"k"`
	TransA bool    `json:"transA"`
	TransB bool    `json:"transB"`
	Mode   string  `json:"mode"`
	MS     float64 `json:"ms"`
	TFLOPs float64 `json:"tflops"`
}

// gemmTableBufs are one shape's matrices in every mode's storage: float32 A, B, C and packed
// bf16 A, B, C, A and B of random values (the same in both), C 0.
type gemmTableBufs struct {
	a, b, c, ah, bh, ch Buf
}

// newGemmTableBufs allocates and fills the operands of s on be.
func newGemmTableBufs(be *CUDA, s gemmShape, r *rand.Rand) gemmTableBufs {
	o := gemmTableBufs{a: be.Alloc(s.M * s.K), b: be.Alloc(s.K * s.N), c: be.Alloc(s.M * s.N),
		ah: be.Alloc((s.M*s.K + 1) / 2), bh: be.Alloc((s.K*s.N + 1) / 2), ch: be.Alloc((s.M*s.N + 1) / 2)}
	benchFill(be, o.a, r)
	benchFill(be, o.b, r)
	be.PackHalf(o.ah, o.a, BF16)
	be.PackHalf(o.bh, o.b, BF16)
	return o
}

// benchFill fills x with normal values: a chunk of up to 1M uploaded, then copied over the rest
// on the device, each copy doubling what is filled (no host copy of a gigabyte).
func benchFill(be Backend, x Buf, r *rand.Rand) {
	n := x.Len()
	chunk := min(n, 1<<20)
	if chunk == 0 {
		return
	}
	be.Upload(be.Slice(x, 0, chunk), randVec(r, chunk, 1))
	for done := chunk; done < n; {
		m := min(done, n-done)
		be.Copy(be.Slice(x, done, m), be.Slice(x, 0, m))
		done += m
	}
}

// run queues one product of s in mode (the backend's MatMul precision set to bf16 for
// fp32-storage by the caller).
func (o gemmTableBufs) run(be *CUDA, s gemmShape, mode string) {
	switch mode {
	case gemmFP32Storage:
		be.MatMul(o.c, o.a, o.b, s.M, s.N, s.K, s.TransA, s.TransB, s.Beta)
	case gemmBF16:
		be.MatMulHalf(o.ch, o.ah, o.bh, s.M, s.N, s.K, s.TransA, s.TransB, 0, BF16, true)
	case gemmBF16F32C:
		be.MatMulHalf(o.c, o.ah, o.bh, s.M, s.N, s.K, s.TransA, s.TransB, s.Beta, BF16, false)
	default:
		panic("gemm table mode " + mode)
	}
}

// BenchmarkCUDAGemmTable times the 18 shapes of gemmTable in each of gemmModes: one product
// queued first (cuBLAS's heuristics, first use of the buffers), then b.N products back to back
// between two events on the stream, so that no host round trip is in the time. It reports ms
// and TFLOP/s per product and, when DISTFLASH_GEMM_OUT names a file, writes every row there as
// JSON (gemmResult), for the GPU check to set beside bench/torch_gemm.py's:
//
//	kernels.test -test.run '^$' -test.bench BenchmarkCUDAGemmTable -test.benchtime 20x
//
// Sub-benchmarks are named MODE/ROLE (fp32-storage/q.fwd, …). The head's operands take about
// 2 GB of device memory at once.
func BenchmarkCUDAGemmTable(b *testing.B) {
	be := gpu(b)
	gemmTableBench(b, be, gemmTable, os.Getenv("DISTFLASH_GEMM_OUT"))
}

// gemmTableBench is BenchmarkCUDAGemmTable on be for the shapes rows, writing the JSON to out
// when it is not "".
func gemmTableBench(b *testing.B, be *CUDA, rows []gemmShape, out string) {
	prec := be.precision()
	be.setPrecision(precBF16)
	defer be.setPrecision(prec)
	r := rand.New(rand.NewPCG(41, 41))
	var results []gemmResult
	for _, s := range rows {
		ops := newGemmTableBufs(be, s, r)
		for _, mode := range gemmModes {
			b.Run(mode+"/"+s.Role, func(b *testing.B) {
				ops.run(be, s, mode)
				tm := be.NewOpTimer()
				tm.Mark()
				n := 0
				for b.Loop() {
					ops.run(be, s, mode)
					n++
				}
				tm.Mark()
				sec := tm.Times()[1] / float64(n)
				flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
				res := gemmResult{Role: s.Role, M: s.M, N: s.N, K: s.K, TransA: s.TransA, TransB: s.TransB, Mode: mode,
					MS: 1e3 * sec, TFLOPs: flops / sec / 1e12}
				b.ReportMetric(res.MS, "ms/gemm")
				b.ReportMetric(res.TFLOPs, "TFLOP/s")
				if i := slices.IndexFunc(results, func(x gemmResult) bool { return x.Role == s.Role && x.Mode == mode }); i >= 0 {
					results[i] = res
				} else {
					results = append(results, res)
				}
			})
		}
	}
	if out == "" {
		return
	}
	js, err := json.MarshalIndent(results, "", "  ")
	if err == nil {
		err = os.WriteFile(out, append(js, '\n'), 0o644)
	}
	if err != nil {
		b.Fatalf("DISTFLASH_GEMM_OUT: %v", err)
	}
}
