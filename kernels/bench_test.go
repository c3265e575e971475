package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Benchmarks of the dense product and the attention primitive, reporting GFLOP/s.
//
//	go test ./kernels -run xxx -bench . -benchtime 2x
//
// BenchmarkMatMul puts the Backend's MatMul beside a plain Go loop (naiveMatMul) in the same
// run, so the speed-up is measured on the same machine and load. The attention benchmarks count
// FLOPs with the backend's counters (what the kernel computed, tile by tile) and also report the
// usual convention for causal attention: 4·n²·H·hd/2 forward, 2.5× that backward; each also
// runs the 1024³ MatMul between its iterations and reports its ratio to it (xGEMM, and
// naive_xGEMM for the convention's FLOPs), so the ratio holds whatever the machine's load.

// naiveMatMul sets C = A·B (A [m, k], B [k, n], row-major) with the cache-friendly i-k-j loop:
// the innermost loop runs along a row of B and a row of C.
func naiveMatMul(c, a, b []float32, m, n, k int) {
	clear(c)
	for i := 0; i < m; i++ {
		crow := c[i*n : (i+1)*n]
		for p := 0; p < k; p++ {
			aip := a[i*k+p]
			brow := b[p*n : (p+1)*n]
			for j := range crow {
				crow[j] += aip * brow[j]
			}
		}
	}
}

// naiveMatMulTransB sets C = A·Bᵀ (A [m, k], B stored [n, k]): with B transposed, each element is
// a dot product of two contiguous rows, which is the cache-friendly order for this layout.
func naiveMatMulTransB(c, a, b []float32, m, n, k int) {
	for i := 0; i < m; i++ {
		arow := a[i*k : (i+1)*k]
		for j := 0; j < n; j++ {
			brow := b[j*k : (j+1)*k]
			var s float32
			for p, x := range arow {
				s += x * brow[p]
			}
			c[i*n+j] = s
		}
	}
}

// TestNaiveMatMul checks that the benchmark's plain loops compute the same product as the
// Backend (1e-5 of max|C|), so the benchmark compares equal work.
func TestNaiveMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 20))
	m, n, k := 19, 23, 37
	a, b := randVec(r, m*k, 1), randVec(r, k*n, 1)
	zero := make([]float32, m*n)
	c := make([]float32, m*n)
	naiveMatMul(c, a, b, m, n, k)
	if e := maxRelErr(c, refMatMul(zero, a, b, m, n, k, false, false, 0)); e > 1e-5 {
		t.Errorf("naiveMatMul rel err %.3g", e)
	}
	naiveMatMulTransB(c, a, b, m, n, k) // b read as [n, k]
	if e := maxRelErr(c, refMatMul(zero, a, b, m, n, k, false, true, 0)); e > 1e-5 {
		t.Errorf("naiveMatMulTransB rel err %.3g", e)
	}
}

func reportGFLOPs(b *testing.B, flops float64, unit string) {
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, unit)
}

// BenchmarkMatMul: the backend's MatMul (this package's SGEMM), gonum's SGEMM and a plain
// i-k-j loop, in the same run: square C = A·B at 128…1024, and the model's typical linear layer
// tokens × ffn × dim = 1024 × 352 × 128 with B transposed (x·Wᵀ, W stored [ffn, dim]).
// FLOPs = 2·m·n·k per product.
func BenchmarkMatMul(b *testing.B) {
	type shape struct {
		name    string
		m, n, k int
		transB  bool
	}
	var shapes []shape
	for _, s := range []int{128, 256, 512, 1024} {
		shapes = append(shapes, shape{fmt.Sprint(s), s, s, s, false})
	}
	shapes = append(shapes, shape{"1024x352x128_transB", 1024, 352, 128, true})
	for _, impl := range []string{"backend", "gonum", "naive"} {
		for _, s := range shapes {
			b.Run(impl+"/"+s.name, func(b *testing.B) {
				r := rand.New(rand.NewPCG(uint64(s.m), uint64(s.n)))
				a, bm := randVec(r, s.m*s.k, 1), randVec(r, s.k*s.n, 1)
				c := make([]float32, s.m*s.n)
				var step func()
				switch {
				case impl == "backend":
					be := NewCPU()
					cb, ab, bb := upload(be, c), upload(be, a), upload(be, bm)
					step = func() { be.MatMul(cb, ab, bb, s.m, s.n, s.k, false, s.transB, 0) }
				case impl == "gonum":
					tb, ldb := blas.NoTrans, s.n
					if s.transB {
						tb, ldb = blas.Trans, s.k
					}
					step = func() {
						gonum.Implementation{}.Sgemm(blas.NoTrans, tb, s.m, s.n, s.k, 1, a, s.k, bm, ldb, 0, c, s.n)
					}
				case s.transB:
					step = func() { naiveMatMulTransB(c, a, bm, s.m, s.n, s.k) }
				default:
					step = func() { naiveMatMul(c, a, bm, s.m, s.n, s.k) }
				}
				for b.Loop() {
					step()
				}
				reportGFLOPs(b, 2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N), "GFLOP/s")
			})
		}
	}
}

// attnBench sets up causal self-attention over n contiguous positions with 4 query heads,
// 2 key/value heads and head_dim hd, and runs one forward (to have lse and D for the backward).
type attnBench struct {
	be                     *CPU
	sh                     AttnShape
	st                     AttnState
	q, k, v, o, lse, do, d Buf
	dq, dk, dv             Buf
	naiveFwdFLOPs          float64 // 4·n²·H·hd/2
}

func newAttnBench(n, hd int) *attnBench {
	const H, K = 4, 2
	r := rand.New(rand.NewPCG(uint64(n), uint64(hd)))
	be := NewCPU()
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(i)
	}
	a := &attnBench{be: be,
		sh: AttnShape{NQ: n, NK: n, Heads: H, KVHeads: K, HeadDim: hd, Causal: true,
			Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos},
		st: AttnState{O: be.Alloc(n * H * hd), M: be.Alloc(H * n), L: be.Alloc(H * n)},
		q:  upload(be, randVec(r, n*H*hd, 1)), k: upload(be, randVec(r, n*K*hd, 1)), v: upload(be, randVec(r, n*K*hd, 1)),
		o: be.Alloc(n * H * hd), lse: be.Alloc(H * n), do: upload(be, randVec(r, n*H*hd, 1)), d: be.Alloc(H * n),
		dq: be.Alloc(n * H * hd), dk: be.Alloc(n * K * hd), dv: be.Alloc(n * K * hd),
		naiveFwdFLOPs: 4 * float64(n) * float64(n) * H * float64(hd) / 2,
	}
	a.forward()
	be.AttnFinish(a.o, a.lse, a.st, n, H, hd)
	be.AttnBackwardPrep(a.d, a.o, a.do, n, H, hd, FP32)
	be.Counters().Reset()
	return a
}

func (a *attnBench) forward() {
	a.be.AttnInit(a.st)
	a.be.AttnForward(a.st, a.q, a.k, a.v, a.sh)
}

var attnBenchSizes = []struct{ n, hd int }{{512, 32}, {512, 64}, {512, 128}, {2048, 32}, {2048, 64}, {2048, 128}}

// attnGemmRef is the reference of the attention benchmarks: the backend's 1024³ MatMul (the
// BenchmarkMatMul/backend/1024 product), run between a benchmark's iterations whenever it has
// had less time than the attention so far, so that both see the same load on a shared machine.
type attnGemmRef struct {
	be      *CPU
	a, b, c Buf
	spent   time.Duration
	runs    int
}

func newAttnGemmRef() *attnGemmRef {
	const n = 1024
	r := rand.New(rand.NewPCG(n, n))
	be := NewCPU()
	g := &attnGemmRef{be: be, a: upload(be, randVec(r, n*n, 1)), b: upload(be, randVec(r, n*n, 1)), c: be.Alloc(n * n)}
	g.be.MatMul(g.c, g.a, g.b, n, n, n, false, false, 0) // warm the pack buffers and helpers
	return g
}

// keepUp runs the product until it has had at least the attention's time t.
func (g *attnGemmRef) keepUp(t time.Duration) {
	for g.spent < t || g.runs == 0 {
		t0 := time.Now()
		g.be.MatMul(g.c, g.a, g.b, 1024, 1024, 1024, false, false, 0)
		g.spent += time.Since(t0)
		g.runs++
	}
}

func (g *attnGemmRef) gflops() float64 {
	return 2 * 1024 * 1024 * 1024 * float64(g.runs) / g.spent.Seconds() / 1e9
}

// attnLoop runs step under b.Loop with the reference product interleaved, and reports the
// attention's GFLOP/s (flops from the backend's counters, and naive: the causal convention
// naiveFlops per call), the product's GFLOP/s, and their ratios xGEMM and naive_xGEMM.
func attnLoop(b *testing.B, a *attnBench, step func(), counted func() int64, naiveFlops float64) {
	ref := newAttnGemmRef()
	var spent time.Duration
	runs := 0
	for b.Loop() {
		t0 := time.Now()
		step()
		spent += time.Since(t0)
		runs++
		b.StopTimer()
		ref.keepUp(spent)
		b.StartTimer()
	}
	got := float64(counted()) / spent.Seconds() / 1e9
	naive := naiveFlops * float64(runs) / spent.Seconds() / 1e9
	b.ReportMetric(got, "GFLOP/s")
	b.ReportMetric(naive, "naiveGFLOP/s")
	b.ReportMetric(ref.gflops(), "GEMM_GFLOP/s")
	b.ReportMetric(got/ref.gflops(), "xGEMM")
	b.ReportMetric(naive/ref.gflops(), "naive_xGEMM")
}

// BenchmarkAttnForward: one causal block forward (AttnInit + AttnForward) over all n keys.
// GFLOP/s counts Counters().AttnFwdFLOPs (whole tiles the kernel computed); naiveGFLOP/s
// counts 4·n²·H·hd/2 per call; xGEMM and naive_xGEMM divide them by the GFLOP/s of the
// 1024³ MatMul interleaved with the iterations (attnGemmRef).
func BenchmarkAttnForward(b *testing.B) {
	for _, s := range attnBenchSizes {
		b.Run(fmt.Sprintf("n%d/hd%d", s.n, s.hd), func(b *testing.B) {
			a := newAttnBench(s.n, s.hd)
			attnLoop(b, a, a.forward, a.be.Counters().AttnFwdFLOPs.Load, a.naiveFwdFLOPs)
		})
	}
}

// BenchmarkAttnBackward: one causal block backward (AttnBackward, given lse and D).
// GFLOP/s counts Counters().AttnBwdFLOPs; naiveGFLOP/s counts 2.5 × 4·n²·H·hd/2 per call;
// ratios as in BenchmarkAttnForward.
func BenchmarkAttnBackward(b *testing.B) {
	for _, s := range attnBenchSizes {
		b.Run(fmt.Sprintf("n%d/hd%d", s.n, s.hd), func(b *testing.B) {
			a := newAttnBench(s.n, s.hd)
			step := func() { a.be.AttnBackward(a.dq, a.dk, a.dv, a.q, a.k, a.v, nil, a.do, a.lse, a.d, a.sh) }
			attnLoop(b, a, step, a.be.Counters().AttnBwdFLOPs.Load, 2.5*a.naiveFwdFLOPs)
		})
	}
}
