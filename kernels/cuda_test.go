//go:build cuda

package kernels

// Parity tests of the CUDA backend against the CPU backend (itself checked against float64
// references and PyTorch in the untagged tests). They need a GPU of compute capability 8.0 or
// later and fail, naming the driver's error, without one:
//
//	go test -tags cuda ./kernels
//
// Tolerances (max |cuda − cpu| relative to max |cpu| of the tensor unless stated):
//
//   - exact (bit-identical): copies, Add, Scale, Embedding, EmbeddingBackward (same additions in
//     the same order), the 16-bit casts, AllFinite;
//   - 1e-6 elementwise: RMSNorm, RoPE, SwiGLU, cross-entropy, AdamW, attention merge/finish —
//     kernels that repeat the CPU's float32 operations but whose exp/log/sincos/sqrt come from
//     CUDA's libm in double (≤ 1 ulp of the double, rarely visible in float32) or whose float64
//     sums run in another order;
//   - 1e-12: SumSquares (float64 partial sums in another order);
//   - 1e-5: RMSNorm backward, MatMul at FP32 (cuBLAS sums in another order; no TF32), attention
//     at FP32 forward; 5e-5 its gradients (sums over many keys);
//   - MatMul at BF16 / FP16: |Δ| ≤ 2^-7 (bf16) or 2^-10 (fp16) · (|op(A)|·|op(B)|) + 1e-5: what
//     rounding both operands costs, whichever rounding cuBLAS uses;
//   - tensor-core attention, with q, k, v and dO already representable in the format (so the
//     only differences are the 16-bit P and dS operands and the summation order): output
//     1e-2 (bf16) / 2e-3 (fp16), lse 1e-4 absolute, gradients 2e-2 (bf16) / 4e-3 (fp16).
//     P and dS carry 8 (bf16) or 11 (fp16) significant bits: relative errors of 2^-9 and 2^-12
//     per term, which average down over the keys.
//
// Each tolerance is far below what a layout, masking, scaling or accumulate-vs-overwrite bug
// produces (errors of 1e-1 to O(1)).

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

var testGPU struct {
	once sync.Once
	be   *CUDA
	err  error
}

// gpu returns the shared CUDA backend at FP32 precision with reset counters; it fails the test
// when there is no usable GPU.
func gpu(t testing.TB) *CUDA {
	t.Helper()
	testGPU.once.Do(func() { testGPU.be, testGPU.err = newCUDA(0) })
	if testGPU.err != nil {
		t.Fatalf("the cuda-tagged tests need a GPU: %v", testGPU.err)
	}
	testGPU.be.setPrecision(precFP32)
	testGPU.be.Counters().Reset()
	return testGPU.be
}

// duo runs the same calls on the CPU backend (index 0) and the CUDA backend (index 1).
type duo struct {
	cpu *CPU
	gpu *CUDA
}

func newDuo(t testing.TB) duo { return duo{NewCPU(), gpu(t)} }

func (d duo) backends() [2]Backend { return [2]Backend{d.cpu, d.gpu} }

// buf uploads x to both backends.
func (d duo) buf(x []float32) [2]Buf {
	var b [2]Buf
	for i, be := range d.backends() {
		b[i] = be.Alloc(len(x))
		be.Upload(b[i], x)
	}
	return b
}

func (d duo) zeros(n int) [2]Buf { return [2]Buf{d.cpu.Alloc(n), d.gpu.Alloc(n)} }

// get downloads both copies.
func (d duo) get(b [2]Buf) (c, g []float32) {
	c = make([]float32, b[0].Len())
	g = make([]float32, b[1].Len())
	d.cpu.Download(c, b[0])
	d.gpu.Download(g, b[1])
	return c, g
}

// each runs fn on both backends.
func (d duo) each(fn func(be Backend, i int)) {
	for i, be := range d.backends() {
		fn(be, i)
	}
}

// firstDiff is the first index where a and b differ in bits, or -1.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		// Two NaNs agree: IEEE 754 leaves a NaN result's payload and sign open (the GPU returns
		// its canonical NaN where the CPU keeps the operand's).
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			return i
		}
	}
	return -1
}

// exact fails unless the two copies of b are bit-identical.
func (d duo) exact(t *testing.T, what string, b [2]Buf) {
	t.Helper()
	c, g := d.get(b)
	if i := firstDiff(c, g); i >= 0 {
		t.Errorf("%s: element %d: cuda %g, cpu %g (want bit-identical)", what, i, g[i], c[i])
	}
}

// close fails when the copies differ by more than tol relative to max |cpu|.
func (d duo) close(t *testing.T, what string, b [2]Buf, tol float64) {
	t.Helper()
	c, g := d.get(b)
	if e := maxRelErr(g, f64s(c)); !(e <= tol) {
		t.Errorf("%s: relative error %.3g > %.1g", what, e, tol)
	}
}

// closeElem fails when an element differs by more than tol relative to itself (or floor).
func (d duo) closeElem(t *testing.T, what string, b [2]Buf, tol, floor float64) {
	t.Helper()
	c, g := d.get(b)
	if e := elemRelErr(g, f64s(c), floor); !(e <= tol) {
		t.Errorf("%s: elementwise relative error %.3g > %.1g", what, e, tol)
	}
}

// mustPanic fails unless fn panics with a message containing want.
func mustPanic(t *testing.T, want string, fn func()) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), want) {
			t.Errorf("recovered %v, want a panic containing %q", r, want)
		}
	}()
	fn()
}

func TestCUDABuffers(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(1, 1))
	z := d.gpu.Alloc(1000)
	got := make([]float32, 1000)
	d.gpu.Download(got, z)
	for i, v := range got {
		if v != 0 {
			t.Fatalf("Alloc: element %d = %g, want 0", i, v)
		}
	}
	x := randVec(r, 1000, 3)
	x[17] = float32(math.NaN())
	x[18] = float32(math.Inf(-1))
	b := d.buf(x)
	d.exact(t, "upload/download", b)

	// A slice shares memory with its parent, at its offset.
	s := d.buf(randVec(r, 10, 1))
	d.each(func(be Backend, i int) { be.Copy(be.Slice(b[i], 100, 10), s[i]) })
	d.exact(t, "copy into slice", b)
	d.each(func(be Backend, i int) { be.Zero(be.Slice(b[i], 990, 10)) })
	d.exact(t, "zero a slice", b)
	c, g := d.get(b)
	if g[995] != 0 || g[989] != c[989] || g[100] != c[100] {
		t.Errorf("slice views: got %g %g %g", g[995], g[989], g[100])
	}

	a2, b2 := d.buf(randVec(r, 5001, 1)), d.buf(randVec(r, 5001, 1e3))
	d.each(func(be Backend, i int) { be.Add(a2[i], a2[i], b2[i]) }) // dst aliases a
	d.exact(t, "add", a2)
	d.each(func(be Backend, i int) { be.Scale(a2[i], -0.3) })
	d.exact(t, "scale", a2)
	mustPanic(t, "is not a CUDA buffer", func() { d.gpu.Zero(d.cpu.Alloc(3)) })
	mustPanic(t, "slice [5, 15) of a buffer of 10 elements", func() { d.gpu.Slice(d.gpu.Alloc(10), 5, 10) })
	mustPanic(t, "upload has 10 elements, want 3", func() { d.gpu.Upload(d.gpu.Alloc(10), make([]float32, 3)) })
}

func TestCUDAReductions(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(2, 2))
	for _, n := range []int{0, 1, 1000, 300001} {
		b := d.buf(randVec(r, n, 2))
		want, got := d.cpu.SumSquares(b[0]), d.gpu.SumSquares(b[1])
		if e := math.Abs(got-want) / math.Max(want, 1e-300); e > 1e-12 {
			t.Errorf("SumSquares n=%d: cuda %v, cpu %v", n, got, want)
		}
		if again := d.gpu.SumSquares(b[1]); again != got {
			t.Errorf("SumSquares n=%d not reproducible: %v then %v", n, got, again)
		}
	}
	for _, c := range []struct {
		at  int
		val float64
	}{{-1, 0}, {0, math.NaN()}, {99999, math.Inf(1)}, {5000, math.Inf(-1)}} {
		x := randVec(r, 100000, 1)
		if c.at >= 0 {
			x[c.at] = float32(c.val)
		}
		b := d.buf(x)
		if got, want := d.gpu.AllFinite(b[1]), d.cpu.AllFinite(b[0]); got != want || want != (c.at < 0) {
			t.Errorf("AllFinite with %v at %d: cuda %v, cpu %v", c.val, c.at, got, want)
		}
	}
}

// roundBF16Ref and roundFP16Ref are float32 → 16-bit → float32 round trips (to nearest, ties
// to even), written here from the formats' definitions for finite inputs.
func roundBF16Ref(x float32) float32 {
	b := math.Float32bits(x)
	if x != x {
		return x
	}
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b & 0xffff0000)
}

func roundFP16Ref(x float32) float32 {
	v := float64(x)
	a := math.Abs(v)
	if a >= 65520 {
		return float32(math.Copysign(math.Inf(1), v))
	}
	q := math.Ldexp(1, -24) // subnormal quantum
	if a >= math.Ldexp(1, -14) {
		_, e := math.Frexp(a) // a = f·2^e, f in [0.5, 1)
		q = math.Ldexp(1, e-11)
	}
	return float32(math.RoundToEven(v/q) * q)
}

func TestCUDAMatMul(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(3, 3))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {3, 5, 7}, {64, 48, 80}, {129, 65, 257}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, beta := range []float32{0, 1, 0.5} {
				name := fmt.Sprintf("%dx%dx%d_t%v%v_beta%g", s.m, s.n, s.k, tr[0], tr[1], beta)
				a, b := randVec(r, s.m*s.k, 1), randVec(r, s.k*s.n, 1)
				c0, cref := randVec(r, s.m*s.n, 1), make([]float32, s.m*s.n)
				if beta == 0 {
					for i := range c0 {
						c0[i] = float32(math.NaN()) // must be overwritten, not read
					}
				} else {
					copy(cref, c0)
				}
				ref := refMatMul(cref, a, b, s.m, s.n, s.k, tr[0], tr[1], float64(beta))
				for _, p := range []cudaPrec{precFP32, precBF16, precFP16} {
					d.gpu.setPrecision(p)
					C := d.gpu.Alloc(len(c0))
					d.gpu.Upload(C, c0)
					A, B := d.gpu.Alloc(len(a)), d.gpu.Alloc(len(b))
					d.gpu.Upload(A, a)
					d.gpu.Upload(B, b)
					d.gpu.MatMul(C, A, B, s.m, s.n, s.k, tr[0], tr[1], beta)
					got := make([]float32, len(c0))
					d.gpu.Download(got, C)
					if p == precFP32 {
						if e := maxRelErr(got, ref); !(e <= 1e-5) {
							t.Errorf("%s fp32: relative error %.3g", name, e)
						}
						continue
					}
					// |Δ| ≤ u·(|op(A)|·|op(B)|)_ij + 1e-5·max|C|, u = 2^-7 (bf16) or 2^-10 (fp16).
					u, rnd := math.Ldexp(1, -7), roundBF16Ref
					if p == precFP16 {
						u, rnd = math.Ldexp(1, -10), roundFP16Ref
					}
					abs := func(x []float32) []float32 {
						y := make([]float32, len(x))
						for i, v := range x {
							y[i] = float32(math.Abs(float64(v)))
						}
						return y
					}
					bound := refMatMul(make([]float32, len(c0)), abs(a), abs(b), s.m, s.n, s.k, tr[0], tr[1], 0)
					var scale, worst, emul float64
					for _, v := range ref {
						scale = math.Max(scale, math.Abs(v))
					}
					ra, rb := make([]float32, len(a)), make([]float32, len(b))
					for i := range a {
						ra[i] = rnd(a[i])
					}
					for i := range b {
						rb[i] = rnd(b[i])
					}
					refR := refMatMul(cref, ra, rb, s.m, s.n, s.k, tr[0], tr[1], float64(beta))
					for i := range got {
						e := math.Abs(float64(got[i])-ref[i]) / (u*bound[i] + 1e-5*scale)
						worst = math.Max(worst, e)
						emul = math.Max(emul, math.Abs(float64(got[i])-refR[i])/scale)
					}
					if !(worst <= 1) {
						t.Errorf("%s %v: error %.3g × the rounding bound", name, p, worst)
					}
					t.Logf("%s %v: max |cuda − round-to-nearest emulation| / max|C| = %.2g", name, p, emul)
				}
				d.gpu.setPrecision(precFP32)
			}
		}
	}
	// k = 0: C = beta·C, and C is overwritten (NaN included) when beta is 0.
	for _, beta := range []float32{0, 2} {
		c := d.buf([]float32{float32(math.NaN()), 1, 2, 3, 4, 5})
		e := d.zeros(0)
		d.each(func(be Backend, i int) { be.MatMul(c[i], e[i], e[i], 2, 3, 0, false, false, beta) })
		d.exact(t, fmt.Sprintf("k=0 beta=%g", beta), c)
	}
}

func TestCUDAEmbedding(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(4, 4))
	const vocab, dim = 50, 37
	table := d.buf(randVec(r, vocab*dim, 1))
	ids := make([]int32, 300)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab / 3)) // many repeats
	}
	out := d.zeros(len(ids) * dim)
	d.each(func(be Backend, i int) { be.Embedding(out[i], table[i], ids, dim) })
	d.exact(t, "embedding", out)
	dt, dout := d.buf(randVec(r, vocab*dim, 1)), d.buf(randVec(r, len(ids)*dim, 1))
	d.each(func(be Backend, i int) { be.EmbeddingBackward(dt[i], dout[i], ids, dim) })
	d.exact(t, "embedding backward", dt)
	mustPanic(t, "token id 50 outside vocabulary of 50", func() { d.gpu.Embedding(d.gpu.Alloc(2*dim), table[1], []int32{1, 50}, dim) })
}

func TestCUDARMSNorm(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(5, 5))
	for _, s := range []struct{ rows, dim int }{{1, 1}, {7, 64}, {300, 4097}} {
		name := fmt.Sprintf("%dx%d", s.rows, s.dim)
		x, w := d.buf(randVec(r, s.rows*s.dim, 2)), d.buf(randVec(r, s.dim, 1))
		out, rstd := d.zeros(s.rows*s.dim), d.zeros(s.rows)
		d.each(func(be Backend, i int) { be.RMSNorm(out[i], rstd[i], x[i], w[i], s.rows, s.dim, 1e-5) })
		d.closeElem(t, name+" out", out, 1e-6, 1e-6)
		d.closeElem(t, name+" rstd", rstd, 1e-6, 0)
		dout := d.buf(randVec(r, s.rows*s.dim, 1))
		dx, dw := d.buf(randVec(r, s.rows*s.dim, 1)), d.buf(randVec(r, s.dim, 1)) // accumulated into
		d.each(func(be Backend, i int) { be.RMSNormBackward(dx[i], dw[i], dout[i], x[i], w[i], rstd[i], s.rows, s.dim) })
		d.close(t, name+" dx", dx, 1e-5)
		d.close(t, name+" dw", dw, 1e-5)
	}
}

func TestCUDARoPE(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(6, 6))
	pos := []int32{0, 1, 2, 77, 4095, 65536, 524287, 3}
	for _, hd := range []int{8, 128} {
		for _, inverse := range []bool{false, true} {
			x := d.buf(randVec(r, len(pos)*3*hd, 1))
			d.each(func(be Backend, i int) { be.RoPE(x[i], pos, 3, hd, DefaultRoPE(500000, hd), inverse) })
			d.close(t, fmt.Sprintf("hd%d inverse=%v", hd, inverse), x, 1e-6)
			// A scaled table (YaRN-like: frequencies not powers of one base, cos and sin × 1.1386).
			tab := DefaultRoPE(10000, hd)
			for i := range tab.InvFreq {
				tab.InvFreq[i] /= 1 + float64(i%3)
			}
			tab.Scale = 1.1386
			x = d.buf(randVec(r, len(pos)*3*hd, 1))
			d.each(func(be Backend, i int) { be.RoPE(x[i], pos, 3, hd, tab, inverse) })
			d.close(t, fmt.Sprintf("scaled table hd%d inverse=%v", hd, inverse), x, 1e-6)
		}
	}
}

func TestCUDASwiGLU(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(7, 7))
	const n = 10007
	gate, up := d.buf(randVec(r, n, 8)), d.buf(randVec(r, n, 1))
	out := d.zeros(n)
	d.each(func(be Backend, i int) { be.SwiGLU(out[i], gate[i], up[i]) })
	d.closeElem(t, "swiglu", out, 1e-6, 1e-6)
	dout := d.buf(randVec(r, n, 1))
	dg, du := d.buf(randVec(r, n, 1)), d.buf(randVec(r, n, 1)) // overwritten
	d.each(func(be Backend, i int) { be.SwiGLUBackward(dg[i], du[i], dout[i], gate[i], up[i]) })
	d.closeElem(t, "swiglu dgate", dg, 1e-6, 1e-6)
	d.closeElem(t, "swiglu dup", du, 1e-6, 1e-6)
}

func TestCUDACrossEntropy(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(8, 8))
	for _, vocab := range []int{5, 32000} {
		const rows = 9
		targets := make([]int32, rows)
		for i := range targets {
			targets[i] = int32(r.IntN(vocab))
		}
		targets[3] = -1 // ignored row
		x := randVec(r, rows*vocab, 4)
		for _, mode := range []string{"separate", "aliased", "nil"} {
			name := fmt.Sprintf("vocab%d %s", vocab, mode)
			logits, losses, dl := d.buf(x), d.zeros(rows), d.buf(randVec(r, rows*vocab, 1))
			d.each(func(be Backend, i int) {
				switch mode {
				case "separate":
					be.CrossEntropy(losses[i], dl[i], logits[i], targets, vocab, 0.5)
				case "aliased":
					be.CrossEntropy(losses[i], logits[i], logits[i], targets, vocab, 0.5)
				default:
					be.CrossEntropy(losses[i], nil, logits[i], targets, vocab, 0.5)
				}
			})
			d.closeElem(t, name+" losses", losses, 1e-6, 1e-6)
			switch mode {
			case "separate":
				d.close(t, name+" dlogits", dl, 1e-6)
			case "aliased":
				d.close(t, name+" dlogits in logits", logits, 1e-6)
			default:
				d.exact(t, name+" logits untouched", logits)
			}
		}
	}
	mustPanic(t, "target 5 outside vocabulary of 5", func() {
		d.gpu.CrossEntropy(d.gpu.Alloc(1), nil, d.gpu.Alloc(5), []int32{5}, 5, 1)
	})
}

func TestCUDAAdamW(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(9, 9))
	const n = 5000
	for _, decay := range []bool{true, false} {
		p, m, v := d.buf(randVec(r, n, 1)), d.zeros(n), d.zeros(n)
		for step := int64(1); step <= 3; step++ {
			g := d.buf(randVec(r, n, 1e-2))
			hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: 0.7}
			d.each(func(be Backend, i int) { be.AdamW(p[i], g[i], m[i], v[i], hp, decay) })
		}
		d.closeElem(t, fmt.Sprintf("decay=%v p", decay), p, 1e-6, 1e-12)
		d.closeElem(t, fmt.Sprintf("decay=%v m", decay), m, 1e-6, 1e-12)
		d.closeElem(t, fmt.Sprintf("decay=%v v", decay), v, 1e-6, 1e-20)
	}
}

// TestCUDAHalfCasts checks round16, pack16 and unpack16 against the rounding written above, on
// ties (both parities), values next to ties, subnormals, overflow, signed zeros and specials.
func TestCUDAHalfCasts(t *testing.T) {
	be := gpu(t)
	r := rand.New(rand.NewPCG(10, 10))
	x := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/256 + 1.0/65536,
		1 + 1.0/2048, 1 + 3.0/2048, 65504, 65519.99, 65520, -70000, 6e-8, 3e-8, 1e-40, 1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	x = append(x, randVec(r, 997, 100)...) // odd length
	for _, fp16 := range []bool{false, true} {
		rnd := roundBF16Ref
		if fp16 {
			rnd = roundFP16Ref
		}
		want := make([]float32, len(x))
		for i, v := range x {
			want[i] = rnd(v)
		}
		b := be.Alloc(len(x))
		be.Upload(b, x)
		be.round16(b, fp16)
		got := make([]float32, len(x))
		be.Download(got, b)
		packed, back := be.Alloc((len(x)+1)/2), be.Alloc(len(x))
		be.Upload(b, x)
		be.pack16(packed, b, fp16)
		be.unpack16(back, packed, fp16)
		unpacked := make([]float32, len(x))
		be.Download(unpacked, back)
		for i := range x {
			nan := x[i] != x[i]
			if (nan && got[i] == got[i]) || (!nan && math.Float32bits(got[i]) != math.Float32bits(want[i])) {
				t.Errorf("fp16=%v round(%g) = %g, want %g", fp16, x[i], got[i], want[i])
			}
			if math.Float32bits(unpacked[i]) != math.Float32bits(got[i]) && !nan {
				t.Errorf("fp16=%v unpack(pack(%g)) = %g, want %g", fp16, x[i], unpacked[i], got[i])
			}
		}
	}
}

// attnCase is one attention shape for the parity tests.
type attnCase struct {
	name           string
	nq, nk, h, kv  int
	hd             int
	causal         bool
	qpos, kpos     []int32
	qstart         []int32 // document start of each query (AttnShape.QStart), nil: no document mask
	emptyQueryRows bool    // some queries see no key (positions before every key, or before their document)
}

// docStarts returns the document start of each position of pos under the document-start
// table doc (indexed by position).
func docStarts(pos, doc []int32) []int32 {
	s := make([]int32, len(pos))
	for i, p := range pos {
		s[i] = doc[p]
	}
	return s
}

func attnCases(r *rand.Rand, hds []int) []attnCase {
	var cs []attnCase
	for _, hd := range hds {
		for _, hc := range []struct{ h, kv int }{{4, 2}, {2, 2}, {33, 3}, {3, 1}} {
			ls := layouts(150, r)
			for _, name := range slices.Sorted(maps.Keys(ls)) { // a fixed order: the cases consume r
				pos := ls[name]
				cs = append(cs, attnCase{name: fmt.Sprintf("hd%d_H%d_KV%d_%s", hd, hc.h, hc.kv, name),
					nq: 150, nk: 150, h: hc.h, kv: hc.kv, hd: hd, causal: true, qpos: pos, kpos: pos})
			}
		}
		// cross attention: 70 queries at positions 40.. against 130 keys at 60..: the first
		// 20 queries see no key at all.
		q, k := make([]int32, 70), make([]int32, 130)
		for i := range q {
			q[i] = int32(40 + i)
		}
		for j := range k {
			k[j] = int32(60 + j)
		}
		cs = append(cs,
			attnCase{name: fmt.Sprintf("hd%d_cross_masked", hd), nq: 70, nk: 130, h: 4, kv: 2, hd: hd, causal: true, qpos: q, kpos: k, emptyQueryRows: true},
			attnCase{name: fmt.Sprintf("hd%d_noncausal", hd), nq: 70, nk: 130, h: 4, kv: 1, hd: hd},
			attnCase{name: fmt.Sprintf("hd%d_one_query", hd), nq: 1, nk: 97, h: 2, kv: 2, hd: hd, causal: true, qpos: []int32{96}, kpos: layouts(97, r)["contiguous"]},
			// GQA groups of 4 (the 0.85B's) over blocks of 2 and 4 key tiles: the dK/dV kernel's split shares
			attnCase{name: fmt.Sprintf("hd%d_gqa4_300", hd), nq: 300, nk: 300, h: 8, kv: 2, hd: hd, causal: true, qpos: seqPos(0, 300), kpos: seqPos(0, 300)},
		)
		cs = append(cs, docAttnCases(r, hd)...)
	}
	return cs
}

// docAttnCases are the document-masked cases (data.document_mask) at head dimension hd:
// every layout under short documents (one-token ones among them) and documents cut at the
// quarters, so that tiles straddle document starts and are hidden by the document mask
// alone; 300 tokens of short documents, where most tiles are skipped, and of two documents,
// whose tiles are wholly visible, straddle the start or are hidden; and
// queries against an earlier block of keys that the documents hide from some queries
// entirely (rows with no visible key: o = 0, lse = −Inf, no gradient) and from every query
// in its first third (a whole call skipped).
func docAttnCases(r *rand.Rand, hd int) []attnCase {
	var cs []attnCase
	for _, hc := range []struct{ h, kv int }{{4, 2}, {33, 3}} {
		ls, docs := layouts(150, r), docTables(150, r)
		for _, name := range slices.Sorted(maps.Keys(ls)) {
			for _, dn := range []string{"quarters", "short"} {
				pos := ls[name]
				cs = append(cs, attnCase{name: fmt.Sprintf("hd%d_H%d_KV%d_%s_docs_%s", hd, hc.h, hc.kv, name, dn),
					nq: 150, nk: 150, h: hc.h, kv: hc.kv, hd: hd, causal: true, qpos: pos, kpos: pos, qstart: docStarts(pos, docs[dn])})
			}
		}
	}
	long := layouts(300, r)["contiguous"]
	halves := make([]int32, 300) // two documents, at 0 and 150: tiles wholly inside one are computed unmasked
	for p := range halves {
		halves[p] = int32(p / 150 * 150)
	}
	cs = append(cs,
		attnCase{name: fmt.Sprintf("hd%d_docs_short_300", hd), nq: 300, nk: 300, h: 2, kv: 1, hd: hd, causal: true,
			qpos: long, kpos: long, qstart: docStarts(long, docTables(300, r)["short"])},
		attnCase{name: fmt.Sprintf("hd%d_docs_halves_300", hd), nq: 300, nk: 300, h: 2, kv: 1, hd: hd, causal: true,
			qpos: long, kpos: long, qstart: docStarts(long, halves)},
		// sliding windows: a band narrower than a tile, one of several tiles, with documents
		attnCase{name: fmt.Sprintf("hd%d_docs_window17_300", hd), nq: 300, nk: 300, h: 2, kv: 1, hd: hd, causal: true,
			qpos: long, kpos: long, qstart: docStarts(long, windowTable(300, 17, nil))},
		attnCase{name: fmt.Sprintf("hd%d_docs_window100_short_300", hd), nq: 300, nk: 300, h: 4, kv: 2, hd: hd, causal: true,
			qpos: long, kpos: long, qstart: docStarts(long, windowTable(300, 100, docTables(300, r)["short"]))})
	// Queries at 100..169 against keys at 0..119, documents starting at 0, 50, 95, 110, 111
	// and 140: the queries from 140 on see no key, and keys 0..39 (the first block of
	// attnRun) no query.
	doc := make([]int32, 170)
	for p := range doc {
		for _, st := range []int32{0, 50, 95, 110, 111, 140} {
			if int32(p) >= st {
				doc[p] = st
			}
		}
	}
	q, k := make([]int32, 70), make([]int32, 120)
	for i := range q {
		q[i] = int32(100 + i)
	}
	for j := range k {
		k[j] = int32(j)
	}
	cs = append(cs, attnCase{name: fmt.Sprintf("hd%d_docs_cross_masked", hd), nq: 70, nk: 120, h: 4, kv: 2, hd: hd, causal: true,
		qpos: q, kpos: k, qstart: docStarts(q, doc), emptyQueryRows: true})
	return cs
}

// attnRun computes, on both backends, a forward over the keys cut into two blocks (the first
// folded into one state, the second into another, then merged), the finish, D, and the backward
// block by block, accumulating into non-zero gradients. Inputs are rounded by rnd first.
func attnRun(d duo, r *rand.Rand, c attnCase, rnd func(float32) float32) (o, lse, dq, dk, dv [2]Buf) {
	H, K, hd := c.h, c.kv, c.hd
	vec := func(n int) []float32 {
		x := randVec(r, n, 1)
		for i := range x {
			x[i] = rnd(x[i])
		}
		return x
	}
	q, k, v, do := d.buf(vec(c.nq*H*hd)), d.buf(vec(c.nk*K*hd)), d.buf(vec(c.nk*K*hd)), d.buf(vec(c.nq*H*hd))
	o, lse = d.zeros(c.nq*H*hd), d.zeros(H*c.nq)
	dq, dk, dv = d.buf(randVec(r, c.nq*H*hd, 0.1)), d.buf(randVec(r, c.nk*K*hd, 0.1)), d.buf(randVec(r, c.nk*K*hd, 0.1))
	D := d.zeros(H * c.nq)
	split := c.nk / 3
	shape := func(j0, j1 int) AttnShape {
		sh := AttnShape{NQ: c.nq, NK: j1 - j0, Heads: H, KVHeads: K, HeadDim: hd, Causal: c.causal,
			Scale: float32(1 / math.Sqrt(float64(hd))), QPos: c.qpos, QStart: c.qstart}
		if c.causal {
			sh.KPos = c.kpos[j0:j1]
		}
		return sh
	}
	d.each(func(be Backend, i int) {
		sl := func(b Buf, j0, j1 int) Buf { return be.Slice(b, j0*K*hd, (j1-j0)*K*hd) }
		s1 := AttnState{O: be.Alloc(c.nq * H * hd), M: be.Alloc(H * c.nq), L: be.Alloc(H * c.nq)}
		s2 := AttnState{O: be.Alloc(c.nq * H * hd), M: be.Alloc(H * c.nq), L: be.Alloc(H * c.nq)}
		be.AttnInit(s1)
		be.AttnInit(s2)
		be.AttnForward(s1, q[i], sl(k[i], 0, split), sl(v[i], 0, split), shape(0, split))
		be.AttnForward(s2, q[i], sl(k[i], split, c.nk), sl(v[i], split, c.nk), shape(split, c.nk))
		be.AttnMerge(s1, s2, c.nq, H, hd)
		be.AttnFinish(o[i], lse[i], s1, c.nq, H, hd)
		be.AttnBackwardPrep(D[i], o[i], do[i], c.nq, H, hd, FP32)
		// the first block with the queries' O (a backward on the rank that owns them), the
		// second with D alone (a helper's): cuDNN gets the real O, then the synthetic O′
		for j, blk := range [][2]int{{0, split}, {split, c.nk}} {
			var ob Buf
			if j == 0 {
				ob = o[i]
			}
			be.AttnBackward(dq[i], sl(dk[i], blk[0], blk[1]), sl(dv[i], blk[0], blk[1]), q[i],
				sl(k[i], blk[0], blk[1]), sl(v[i], blk[0], blk[1]), ob, do[i], lse[i], D[i], shape(blk[0], blk[1]))
		}
	})
	return o, lse, dq, dk, dv
}

// checkLSE compares log-sum-exps: equal −Inf where a query saw no key, else within tol.
func checkLSE(t *testing.T, d duo, lse [2]Buf, tol float64, wantEmpty bool) {
	t.Helper()
	c, g := d.get(lse)
	empty := 0
	for i := range c {
		if math.IsInf(float64(c[i]), -1) {
			empty++
			if !math.IsInf(float64(g[i]), -1) {
				t.Errorf("lse[%d]: cuda %g, want -Inf", i, g[i])
			}
			continue
		}
		if e := math.Abs(float64(g[i] - c[i])); !(e <= tol) {
			t.Errorf("lse[%d]: cuda %g, cpu %g", i, g[i], c[i])
			return
		}
	}
	if (empty > 0) != wantEmpty {
		t.Errorf("%d queries saw no key, want some: %v", empty, wantEmpty)
	}
}

// checkEmptyRows checks the GPU's results where a query saw no key (lse = −Inf): its output
// is exactly 0, and every output and gradient is finite.
func checkEmptyRows(t *testing.T, d duo, c attnCase, o, lse, dq, dk, dv [2]Buf) {
	t.Helper()
	_, lg := d.get(lse)
	_, og := d.get(o)
	for j, l := range lg {
		if !math.IsInf(float64(l), -1) {
			continue
		}
		h, i := j/c.nq, j%c.nq
		for x, v := range og[(i*c.h+h)*c.hd : (i*c.h+h+1)*c.hd] {
			if v != 0 {
				t.Errorf("query %d head %d saw no key but o[%d] = %g, want 0", i, h, x, v)
				return
			}
		}
	}
	for _, b := range []struct {
		name string
		buf  [2]Buf
	}{{"o", o}, {"dq", dq}, {"dk", dk}, {"dv", dv}} {
		_, g := d.get(b.buf)
		for x, v := range g {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Errorf("%s[%d] = %g, want finite", b.name, x, v)
				break
			}
		}
	}
}

// TestCUDAAttnFP32 checks the float32 attention kernels (any head dimension) against the CPU.
func TestCUDAAttnFP32(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(11, 11))
	for _, c := range attnCases(r, []int{6, 16, 128}) {
		t.Run(c.name, func(t *testing.T) {
			o, lse, dq, dk, dv := attnRun(d, r, c, func(x float32) float32 { return x })
			d.close(t, "o", o, 1e-5)
			checkLSE(t, d, lse, 1e-5, c.emptyQueryRows)
			checkEmptyRows(t, d, c, o, lse, dq, dk, dv)
			d.close(t, "dq", dq, 5e-5)
			d.close(t, "dk", dk, 5e-5)
			d.close(t, "dv", dv, 5e-5)
		})
	}
}

// TestCUDAAttnTensorCores checks the bf16 and fp16 FlashAttention-2 kernels against the CPU
// backend run on the same (already 16-bit-representable) inputs.
func TestCUDAAttnTensorCores(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(12, 12))
	for _, p := range []cudaPrec{precBF16, precFP16} {
		rnd, tolO, tolG := roundBF16Ref, 1e-2, 2e-2
		if p == precFP16 {
			rnd, tolO, tolG = roundFP16Ref, 2e-3, 4e-3
		}
		for _, c := range attnCases(r, mmaHeadDims) {
			t.Run(p.String()+"_"+c.name, func(t *testing.T) {
				d.gpu.setPrecision(p)
				defer d.gpu.setPrecision(precFP32)
				if !planAttn(c.hd, p).mma {
					t.Fatalf("hd %d at %v does not use the tensor-core kernels", c.hd, p)
				}
				o, lse, dq, dk, dv := attnRun(d, r, c, rnd)
				d.close(t, "o", o, tolO)
				checkLSE(t, d, lse, 1e-4, c.emptyQueryRows)
				checkEmptyRows(t, d, c, o, lse, dq, dk, dv)
				d.close(t, "dq", dq, tolG)
				d.close(t, "dk", dk, tolG)
				d.close(t, "dv", dv, tolG)
			})
		}
	}
}

// TestCUDAAttnCounters checks that a block the mask hides is skipped and leaves the state
// alone, and that a computed block counts 4·hd·H FLOPs per pair of its kernel's tiles.
func TestCUDAAttnCounters(t *testing.T) {
	be := gpu(t)
	r := rand.New(rand.NewPCG(13, 13))
	const H, K, hd, n = 4, 2, 64, 200
	for _, p := range []cudaPrec{precFP32, precBF16} {
		be.setPrecision(p)
		be.Counters().Reset()
		pos := layouts(n, r)["contiguous"]
		later := make([]int32, n)
		for i := range later {
			later[i] = int32(n + i)
		}
		st := AttnState{O: be.Alloc(n * H * hd), M: be.Alloc(H * n), L: be.Alloc(H * n)}
		be.AttnInit(st)
		q, k, v := be.Alloc(n*H*hd), be.Alloc(n*K*hd), be.Alloc(n*K*hd)
		for _, b := range []Buf{q, k, v} {
			be.Upload(b, randVec(r, b.Len(), 1))
		}
		sh := AttnShape{NQ: n, NK: n, Heads: H, KVHeads: K, HeadDim: hd, Causal: true, Scale: 0.125, QPos: pos, KPos: later}
		be.AttnForward(st, q, k, v, sh)
		m := make([]float32, H*n)
		be.Download(m, st.M)
		for i, x := range m {
			if !math.IsInf(float64(x), -1) {
				t.Fatalf("%v: hidden block changed m[%d] to %g", p, i, x)
			}
		}
		// Keys the causal mask shows but the document mask hides: every query's document
		// starts after them.
		docHidden := sh
		docHidden.QPos, docHidden.KPos, docHidden.QStart = later, pos, make([]int32, n)
		for i := range docHidden.QStart {
			docHidden.QStart[i] = int32(n)
		}
		be.AttnForward(st, q, k, v, docHidden)
		be.Download(m, st.M)
		for i, x := range m {
			if !math.IsInf(float64(x), -1) {
				t.Fatalf("%v: block hidden by documents changed m[%d] to %g", p, i, x)
			}
		}
		sh.KPos = pos
		be.AttnForward(st, q, k, v, sh)
		// Documents of 50 tokens: the tiles wholly before a query tile's documents are
		// skipped and not counted.
		docs := sh
		docs.QStart = make([]int32, n)
		for i, qp := range pos {
			docs.QStart[i] = qp / 50 * 50
		}
		be.AttnForward(st, q, k, v, docs)
		s := be.Counters().Snapshot()
		bk := planAttn(hd, p).fwdBK
		want := 4 * (visiblePairs(sh, attnT64, bk) + visiblePairs(docs, attnT64, bk)) * hd * H
		if s.AttnSkipped != 2 || s.AttnBlocks != 2 || s.AttnFwdFLOPs != want || visiblePairs(docs, attnT64, bk) >= visiblePairs(sh, attnT64, bk) {
			t.Errorf("%v: counters %+v, want 2 skipped, 2 blocks, %d FLOPs, fewer with documents", p, s, want)
		}
	}
	be.setPrecision(precFP32)
}

// TestCUDADeterministic checks that results are bit-identical run to run where the design
// promises it: the attention backward (no atomics), SumSquares and the RMSNorm weight gradient.
func TestCUDADeterministic(t *testing.T) {
	d := newDuo(t)
	for _, p := range []cudaPrec{precFP32, precBF16} {
		d.gpu.setPrecision(p)
		var first [3][]float32
		for run := 0; run < 2; run++ {
			r := rand.New(rand.NewPCG(14, 14))
			c := attnCases(r, []int{64})[0]
			_, _, dq, dk, dv := attnRun(d, r, c, roundBF16Ref)
			for i, b := range [][2]Buf{dq, dk, dv} {
				_, g := d.get(b)
				if run == 0 {
					first[i] = g
				} else if j := firstDiff(first[i], g); j >= 0 {
					t.Errorf("%v: gradient %d element %d differs between runs: %g, %g", p, i, j, first[i][j], g[j])
				}
			}
		}
	}
	d.gpu.setPrecision(precFP32)
	r := rand.New(rand.NewPCG(15, 15))
	const rows, dim = 513, 300
	x, w, dout, rstd := d.buf(randVec(r, rows*dim, 1)), d.buf(randVec(r, dim, 1)), d.buf(randVec(r, rows*dim, 1)), d.zeros(rows)
	out := d.zeros(rows * dim)
	d.gpu.RMSNorm(out[1], rstd[1], x[1], w[1], rows, dim, 1e-6)
	var dws [2][]float32
	for run := range dws {
		dx, dw := d.gpu.Alloc(rows*dim), d.gpu.Alloc(dim)
		d.gpu.RMSNormBackward(dx, dw, dout[1], x[1], w[1], rstd[1], rows, dim)
		dws[run] = make([]float32, dim)
		d.gpu.Download(dws[run], dw)
	}
	if j := firstDiff(dws[0], dws[1]); j >= 0 {
		t.Errorf("RMSNorm dw element %d differs between runs", j)
	}
}
