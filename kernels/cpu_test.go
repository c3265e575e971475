package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// Tests of every non-attention CPU kernel against an independent float64 reference written
// here from the textbook formula (not from cpu.go). Tolerances, unless a test says otherwise:
//
//   - elementwise float32 kernels (a handful of roundings per element): 1e-6 relative, which is
//     ~8 float32 ulps (2^-23 ≈ 1.2e-7);
//   - reductions over tens to hundreds of float32 products (MatMul, RMSNorm backward): 1e-5
//     relative to the tensor's largest value;
//   - reductions the kernel accumulates in float64 (SumSquares): 1e-12.
//
// Each tolerance is far below the size of a plausible bug (a missing factor, a wrong transpose,
// overwrite instead of accumulate, a float32 angle at long positions): those show up as errors
// of 1e-3 to O(1), and some tests check that explicitly.

// upload returns a new CPU buffer holding x.
func upload(be *CPU, x []float32) Buf {
	b := be.Alloc(len(x))
	be.Upload(b, x)
	return b
}

// f64s converts to float64.
func f64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// elemRelErr is max_i |a_i − b_i| / max(|b_i|, floor): the per-element relative error, for
// elementwise kernels where every element, not only the largest, must be accurate.
func elemRelErr(a []float32, b []float64, floor float64) float64 {
	if len(a) != len(b) {
		panic(fmt.Sprintf("comparing %d values with %d", len(a), len(b)))
	}
	var e float64
	for i := range b {
		d := math.Abs(float64(a[i]) - b[i])
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		e = math.Max(e, d/math.Max(math.Abs(b[i]), floor))
	}
	return e
}

// relErr64 is maxRelErr for two float64 vectors (used to validate references against each other).
func relErr64(a, b []float64) float64 {
	num, den := 0.0, 0.0
	for i := range b {
		num = math.Max(num, math.Abs(a[i]-b[i]))
		den = math.Max(den, math.Abs(b[i]))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// centralDiff returns the gradient of loss at x by central finite differences in float64:
// (L(x+h e_i) − L(x−h e_i)) / 2h. With h = 1e-5 the truncation error is O(h²) ≈ 1e-10 and the
// rounding error O(1e-16/h) ≈ 1e-11, relative to the function's scale.
func centralDiff(x []float64, loss func() float64) []float64 {
	const h = 1e-5
	g := make([]float64, len(x))
	for i := range x {
		x0 := x[i]
		x[i] = x0 + h
		lp := loss()
		x[i] = x0 - h
		lm := loss()
		x[i] = x0
		g[i] = (lp - lm) / (2 * h)
	}
	return g
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// ---------------------------------------------------------------------------------------------
// MatMul

// refMatMul is C = op(A)·op(B) + beta·C0 by the definition, in float64.
func refMatMul(c0, a, b []float32, m, n, k int, transA, transB bool, beta float64) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := beta * float64(c0[i*n+j])
			for p := 0; p < k; p++ {
				var av, bv float64
				if transA { // A stored [k, m]
					av = float64(a[p*m+i])
				} else {
					av = float64(a[i*k+p])
				}
				if transB { // B stored [n, k]
					bv = float64(b[j*k+p])
				} else {
					bv = float64(b[p*n+j])
				}
				s += av * bv
			}
			out[i*n+j] = s
		}
	}
	return out
}

// TestMatMul checks all four transpose combinations, beta 0 and 1 (and 0.5), odd shapes, k = 0
// and empty outputs. Tolerance 1e-5 of max|C|: k ≤ 65 float32 products per element. A wrong
// transpose, a dropped beta or an operand read with the wrong leading dimension gives O(1).
func TestMatMul(t *testing.T) {
	shapes := []struct{ m, n, k int }{{5, 7, 3}, {33, 17, 65}, {1, 1, 1}, {64, 3, 130}, {4, 6, 0}, {0, 5, 3}, {3, 0, 2}}
	for _, sh := range shapes {
		for _, transA := range []bool{false, true} {
			for _, transB := range []bool{false, true} {
				for _, beta := range []float32{0, 1, 0.5} {
					name := fmt.Sprintf("%dx%dx%d_tA%v_tB%v_beta%v", sh.m, sh.n, sh.k, transA, transB, beta)
					t.Run(name, func(t *testing.T) {
						r := rand.New(rand.NewPCG(uint64(sh.m*10000+sh.n*100+sh.k), 11))
						be := NewCPU()
						m, n, k := sh.m, sh.n, sh.k
						a, b, c0 := randVec(r, m*k, 1), randVec(r, k*n, 1), randVec(r, m*n, 1)
						cb := upload(be, c0)
						be.MatMul(cb, upload(be, a), upload(be, b), m, n, k, transA, transB, beta)
						want := refMatMul(c0, a, b, m, n, k, transA, transB, float64(beta))
						if e := maxRelErr(Host(cb), want); e > 1e-5 {
							t.Errorf("rel err %.3g", e)
						}
						if got := be.Counters().MatMulFLOPs.Load(); got != int64(2*m*n*k) {
							t.Errorf("MatMulFLOPs = %d, want %d", got, 2*m*n*k)
						}
					})
				}
			}
		}
	}
}

// TestMatMulDetectsTranspose checks the test is sensitive: for a non-symmetric product, the
// reference with the wrong transpose flag is far outside the tolerance.
func TestMatMulDetectsTranspose(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 9
	a, b, c0 := randVec(r, n*n, 1), randVec(r, n*n, 1), make([]float32, n*n)
	be := NewCPU()
	cb := upload(be, c0)
	be.MatMul(cb, upload(be, a), upload(be, b), n, n, n, false, true, 0)
	if e := maxRelErr(Host(cb), refMatMul(c0, a, b, n, n, n, false, false, 0)); e < 0.1 {
		t.Fatalf("A·Bᵀ vs A·B differ by only %.3g: the MatMul test could not see a transpose bug", e)
	}
}

// ---------------------------------------------------------------------------------------------
// Embedding

// TestEmbedding checks the row gather exactly and the scatter-add with repeated ids into a
// nonzero gradient table (float64 reference sums; 1e-6 relative: at most 4 terms per element).
func TestEmbedding(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	vocab, dim := 10, 6
	ids := []int32{3, 1, 3, 0, 9, 3, 1}
	be := NewCPU()
	table := randVec(r, vocab*dim, 1)
	out := be.Alloc(len(ids) * dim)
	be.Embedding(out, upload(be, table), ids, dim)
	for ti, id := range ids {
		for j := 0; j < dim; j++ {
			if got, want := Host(out)[ti*dim+j], table[int(id)*dim+j]; got != want {
				t.Fatalf("out[%d][%d] = %v, want table[%d][%d] = %v", ti, j, got, id, j, want)
			}
		}
	}

	dt0, dout := randVec(r, vocab*dim, 1), randVec(r, len(ids)*dim, 1)
	want := f64s(dt0)
	for ti, id := range ids {
		for j := 0; j < dim; j++ {
			want[int(id)*dim+j] += float64(dout[ti*dim+j])
		}
	}
	dt := upload(be, dt0)
	be.EmbeddingBackward(dt, upload(be, dout), ids, dim)
	if e := elemRelErr(Host(dt), want, 1e-3); e > 1e-6 {
		t.Errorf("dtable rel err %.3g", e)
	}
	for _, row := range []int{2, 4, 5, 6, 7, 8} { // ids never used: untouched, bit for bit
		if !slices.Equal(Host(dt)[row*dim:(row+1)*dim], dt0[row*dim:(row+1)*dim]) {
			t.Errorf("row %d of dtable changed though no token uses it", row)
		}
	}

	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("Embedding with id %d in a vocabulary of %d did not panic", vocab, vocab)
			}
		}()
		be.Embedding(be.Alloc(dim), upload(be, table), []int32{int32(vocab)}, dim)
	}()
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

// refRMSNorm is out = x / sqrt(mean(x²) + eps) · w per row, in float64.
func refRMSNorm(x, w []float64, rows, dim int, eps float64) (out, rstd []float64) {
	out, rstd = make([]float64, rows*dim), make([]float64, rows)
	for i := 0; i < rows; i++ {
		row := x[i*dim : (i+1)*dim]
		var ms float64
		for _, v := range row {
			ms += v * v
		}
		ms /= float64(dim)
		rstd[i] = 1 / math.Sqrt(ms+eps)
		for j, v := range row {
			out[i*dim+j] = v * rstd[i] * w[j]
		}
	}
	return
}

// refRMSNormGrad is the analytic gradient of L = Σ dout ∘ rmsnorm(x, w): with r = (mean(x²)+eps)^-½,
// ∂r/∂x_k = −r³ x_k / dim, so ∂L/∂x_k = r w_k dout_k − (r³ x_k / dim) Σ_j dout_j w_j x_j and
// ∂L/∂w_j = Σ_rows dout_j x_j r.
func refRMSNormGrad(x, w, dout []float64, rows, dim int, eps float64) (dx, dw []float64) {
	dx, dw = make([]float64, rows*dim), make([]float64, dim)
	for i := 0; i < rows; i++ {
		xr, dr := x[i*dim:(i+1)*dim], dout[i*dim:(i+1)*dim]
		var ms, s float64
		for j := range xr {
			ms += xr[j] * xr[j]
			s += dr[j] * w[j] * xr[j]
		}
		r := 1 / math.Sqrt(ms/float64(dim)+eps)
		for k := range xr {
			dx[i*dim+k] = r*w[k]*dr[k] - r*r*r*xr[k]/float64(dim)*s
			dw[k] += dr[k] * xr[k] * r
		}
	}
	return
}

// TestRMSNormReferenceGradient validates the analytic reference gradient against central finite
// differences of the reference forward (float64; agreement to 1e-7 relative, the FD error being
// ~1e-10). The eps is large here (0.1) so that a reference dropping eps from ∂r/∂x would fail.
func TestRMSNormReferenceGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 1))
	rows, dim, eps := 3, 7, 0.1
	x, w, dout := f64s(randVec(r, rows*dim, 1.3)), f64s(randVec(r, dim, 1)), f64s(randVec(r, rows*dim, 1))
	loss := func() float64 { o, _ := refRMSNorm(x, w, rows, dim, eps); return dot64(o, dout) }
	dx, dw := refRMSNormGrad(x, w, dout, rows, dim, eps)
	if e := relErr64(dx, centralDiff(x, loss)); e > 1e-7 {
		t.Errorf("reference dx vs finite differences: rel err %.3g", e)
	}
	if e := relErr64(dw, centralDiff(w, loss)); e > 1e-7 {
		t.Errorf("reference dw vs finite differences: rel err %.3g", e)
	}
}

// TestRMSNorm checks forward (out, rstd) and backward (dx, dw accumulated into nonzero
// buffers) of the kernel against the float64 reference. Rows include all zeros (rstd = eps^-½)
// and a large scale (1e3). x has rms ≈ 2, so r ≈ 0.5 and r² vs r³ in the backward differs by 2×.
// Forward: 1e-6 per element (rstd in float64, then 2 float32 multiplications). Backward: 1e-5
// of the tensor's max (dot over dim = 97 terms, dw over 37 rows).
func TestRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	rows, dim := 37, 97
	eps := float32(1e-5)
	x := randVec(r, rows*dim, 2)
	for j := 0; j < dim; j++ {
		x[3*dim+j] = 0       // zero row
		x[5*dim+j] *= 500    // large row
		x[6*dim+j] *= 0.0005 // small row (eps matters)
	}
	w := randVec(r, dim, 1)
	for j := range w {
		w[j] += 1
	}
	be := NewCPU()
	out, rstd := be.Alloc(rows*dim), be.Alloc(rows)
	xb, wb := upload(be, x), upload(be, w)
	be.RMSNorm(out, rstd, xb, wb, rows, dim, eps)
	wantOut, wantRstd := refRMSNorm(f64s(x), f64s(w), rows, dim, float64(eps))
	if e := elemRelErr(Host(out), wantOut, 1e-30); e > 1e-6 {
		t.Errorf("out rel err %.3g", e)
	}
	if e := elemRelErr(Host(rstd), wantRstd, 0); e > 1e-6 {
		t.Errorf("rstd rel err %.3g", e)
	}

	dout := randVec(r, rows*dim, 1)
	dx0, dw0 := randVec(r, rows*dim, 0.5), randVec(r, dim, 5)
	dx, dw := upload(be, dx0), upload(be, dw0)
	be.RMSNormBackward(dx, dw, upload(be, dout), xb, wb, rstd, rows, dim)
	gx, gw := refRMSNormGrad(f64s(x), f64s(w), f64s(dout), rows, dim, float64(eps))
	for i := range gx {
		gx[i] += float64(dx0[i])
	}
	for i := range gw {
		gw[i] += float64(dw0[i])
	}
	// dx is compared row by row, since rows of very different scale (×500, ×0.0005) have
	// gradients of very different scale (∝ r).
	for i := 0; i < rows; i++ {
		if e := maxRelErr(Host(dx)[i*dim:(i+1)*dim], gx[i*dim:(i+1)*dim]); e > 1e-5 {
			t.Errorf("dx row %d rel err %.3g", i, e)
		}
	}
	if e := maxRelErr(Host(dw), gw); e > 1e-5 {
		t.Errorf("dw rel err %.3g", e)
	}
}

// ---------------------------------------------------------------------------------------------
// RoPE

// refRoPE applies the rotary embedding exactly as Hugging Face LLaMA writes it, in float64:
// inv_freq = 1 / theta^(arange(0, hd, 2)/hd), emb = cat(freqs, freqs) with freqs = pos·inv_freq,
// out = x·cos(emb) + rotate_half(x)·sin(emb), rotate_half(x) = cat(−x2, x1).
// sign = −1 turns by the opposite angle.
func refRoPE(x []float32, pos []int32, heads, hd int, theta float64, sign float64) []float64 {
	half := hd / 2
	out := make([]float64, len(x))
	emb := make([]float64, hd)
	rot := make([]float64, hd)
	for t, p := range pos {
		for i := 0; i < half; i++ {
			fr := float64(p) * (1 / math.Pow(theta, float64(2*i)/float64(hd)))
			emb[i], emb[i+half] = fr, fr
		}
		for h := 0; h < heads; h++ {
			v := x[(t*heads+h)*hd : (t*heads+h+1)*hd]
			for i := 0; i < half; i++ {
				rot[i], rot[i+half] = -float64(v[i+half]), float64(v[i])
			}
			for d := 0; d < hd; d++ {
				out[(t*heads+h)*hd+d] = float64(v[d])*math.Cos(emb[d]) + rot[d]*math.Sin(sign*emb[d])
			}
		}
	}
	return out
}

var ropePositions = []int32{0, 1, 2, 7, 100, 4097, 65535, 131071, 300001, 524287}

// TestRoPEMatchesHF checks the forward and inverse rotation against the HF formula for
// positions up to 524287 and theta 10000 and 500000. Tolerance 1e-6 of each head vector's
// scale (cos and sin rounded to float32, two products and a sum). A kernel computing the angle
// in float32 (as HF itself does) is off by ~5e-3 at position 524287, thousands of times the
// tolerance; the test checks that too.
func TestRoPEMatchesHF(t *testing.T) {
	for _, theta := range []float64{10000, 500000} {
		for _, hd := range []int{8, 64, 128} {
			for _, inverse := range []bool{false, true} {
				t.Run(fmt.Sprintf("theta%g_hd%d_inv%v", theta, hd, inverse), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(hd), uint64(theta)))
					heads := 3
					x := randVec(r, len(ropePositions)*heads*hd, 1)
					sign := 1.0
					if inverse {
						sign = -1
					}
					want := refRoPE(x, ropePositions, heads, hd, theta, sign)
					be := NewCPU()
					xb := upload(be, x)
					be.RoPE(xb, ropePositions, heads, hd, DefaultRoPE(theta, hd), inverse)
					for v := 0; v < len(x)/hd; v++ {
						if e := maxRelErr(Host(xb)[v*hd:(v+1)*hd], want[v*hd:(v+1)*hd]); e > 1e-6 {
							t.Errorf("token %d (pos %d) head %d: rel err %.3g", v/heads, ropePositions[v/heads], v%heads, e)
						}
					}
				})
			}
		}
	}

	// Sensitivity: angles computed in float32 at these positions are far outside the tolerance.
	hd, theta := 64, 10000.0
	x := randVec(rand.New(rand.NewPCG(1, 1)), hd, 1)
	p := ropePositions[len(ropePositions)-1]
	want := refRoPE(x, []int32{p}, 1, hd, theta, 1)
	bad := make([]float32, hd)
	for i := 0; i < hd/2; i++ {
		ang := float32(p) * float32(1/math.Pow(theta, float64(2*i)/float64(hd)))
		c, s := float32(math.Cos(float64(ang))), float32(math.Sin(float64(ang)))
		bad[i], bad[i+hd/2] = x[i]*c-x[i+hd/2]*s, x[i+hd/2]*c+x[i]*s
	}
	if e := maxRelErr(bad, want); e < 1e-3 {
		t.Errorf("float32 angles at position %d differ from the reference by only %.3g", p, e)
	}
}

// TestRoPEInverseAndOrthogonal checks that the inverse undoes the forward (round trip to 1e-6)
// and that the rotation is orthogonal: the inverse is the transpose, <R x, y> = <x, R⁻¹ y>
// (to 1e-6 of |x|·|y|), and R preserves each head vector's norm (1e-6 relative).
func TestRoPEInverseAndOrthogonal(t *testing.T) {
	for _, theta := range []float64{10000, 500000} {
		r := rand.New(rand.NewPCG(3, uint64(theta)))
		heads, hd := 2, 32
		n := len(ropePositions) * heads * hd
		x, y := randVec(r, n, 1), randVec(r, n, 1)
		be := NewCPU()

		rt := upload(be, x)
		be.RoPE(rt, ropePositions, heads, hd, DefaultRoPE(theta, hd), false)
		rx := slices.Clone(Host(rt))
		be.RoPE(rt, ropePositions, heads, hd, DefaultRoPE(theta, hd), true)
		if e := maxRelErr(Host(rt), f64s(x)); e > 1e-6 {
			t.Errorf("theta %g: inverse(forward(x)) differs from x by %.3g", theta, e)
		}

		yb := upload(be, y)
		be.RoPE(yb, ropePositions, heads, hd, DefaultRoPE(theta, hd), true)
		riy := Host(yb)
		for v := 0; v < n/hd; v++ {
			s := v * hd
			xs, ys := f64s(x[s:s+hd]), f64s(y[s:s+hd])
			rxs, riys := f64s(rx[s:s+hd]), f64s(riy[s:s+hd])
			scale := math.Sqrt(dot64(xs, xs) * dot64(ys, ys))
			if d := math.Abs(dot64(rxs, ys)-dot64(xs, riys)) / scale; d > 1e-6 {
				t.Errorf("theta %g vector %d: <Rx,y> − <x,R⁻¹y> = %.3g of |x||y|", theta, v, d)
			}
			if d := math.Abs(math.Sqrt(dot64(rxs, rxs)/dot64(xs, xs)) - 1); d > 1e-6 {
				t.Errorf("theta %g vector %d: |Rx|/|x| − 1 = %.3g", theta, v, d)
			}
		}
	}
}

// TestRoPEScaledTable checks an arbitrary table (the scaled variants' inverse frequencies are
// not powers of one base) with Scale ≠ 1 (YaRN's attention factor multiplies cos and sin):
// the forward against x·cos·s + rotate_half(x)·sin·s in float64, and the inverse flag as the
// transpose, <F x, y> = <x, Fᵀ y>, which is what the backward needs. Dividing by the scale in
// the transpose instead (an inverse rather than a transpose) is caught by the same check.
func TestRoPEScaledTable(t *testing.T) {
	const heads, hd, scale = 2, 16, 1.1386
	r := rand.New(rand.NewPCG(9, 9))
	inv := make([]float64, hd/2)
	for i := range inv {
		inv[i] = math.Pow(10000, -float64(2*i)/hd) / (1 + 3*r.Float64())
	}
	tab := RoPETable{InvFreq: inv, Scale: scale}
	n := len(ropePositions) * heads * hd
	x, y := randVec(r, n, 1), randVec(r, n, 1)
	ref := func(v []float32, sign float64, s float64) []float64 {
		out := make([]float64, len(v))
		for tok, p := range ropePositions {
			for h := 0; h < heads; h++ {
				o := (tok*heads + h) * hd
				for i := 0; i < hd/2; i++ {
					sn, cs := math.Sincos(sign * float64(p) * inv[i])
					a, b := float64(v[o+i]), float64(v[o+i+hd/2])
					out[o+i] = s * (a*cs - b*sn)
					out[o+i+hd/2] = s * (b*cs + a*sn)
				}
			}
		}
		return out
	}
	be := NewCPU()
	xb, yb := upload(be, x), upload(be, y)
	be.RoPE(xb, ropePositions, heads, hd, tab, false)
	be.RoPE(yb, ropePositions, heads, hd, tab, true)
	fx, fty := Host(xb), Host(yb)
	for _, c := range []struct {
		name string
		got  []float32
		want []float64
	}{{"forward", fx, ref(x, 1, scale)}, {"transpose", fty, ref(y, -1, scale)}} {
		for v := 0; v < n/hd; v++ {
			if e := maxRelErr(c.got[v*hd:(v+1)*hd], c.want[v*hd:(v+1)*hd]); e > 1e-6 {
				t.Errorf("%s vector %d: rel err %.3g", c.name, v, e)
			}
		}
	}
	adjoint := func(fty []float64) (worst float64) {
		for v := 0; v < n/hd; v++ {
			s := v * hd
			xs, ys := f64s(x[s:s+hd]), f64s(y[s:s+hd])
			d := math.Abs(dot64(f64s(fx[s:s+hd]), ys)-dot64(xs, fty[s:s+hd])) / math.Sqrt(dot64(xs, xs)*dot64(ys, ys))
			worst = max(worst, d)
		}
		return worst
	}
	if d := adjoint(f64s(fty)); d > 1e-6 {
		t.Errorf("<Fx,y> − <x,Fᵀy> = %.3g of |x||y|", d)
	}
	if d := adjoint(ref(y, -1, 1/scale)); d < 1e-2 {
		t.Errorf("the inverse map (scale 1/s) passes the transpose check: %.3g", d)
	}
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

func refSigmoid(g float64) float64 { return 1 / (1 + math.Exp(-g)) }

// refSwiGLU is silu(g)·u = g·σ(g)·u.
func refSwiGLU(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		out[i] = g[i] * refSigmoid(g[i]) * u[i]
	}
	return out
}

// refSwiGLUGrad: ∂/∂u = dout·silu(g); ∂/∂g = dout·u·σ(g)·(1 + g·(1 − σ(g))).
func refSwiGLUGrad(g, u, dout []float64) (dg, du []float64) {
	dg, du = make([]float64, len(g)), make([]float64, len(g))
	for i := range g {
		s := refSigmoid(g[i])
		du[i] = dout[i] * g[i] * s
		dg[i] = dout[i] * u[i] * s * (1 + g[i]*(1-s))
	}
	return
}

// TestSwiGLUReferenceGradient validates the analytic reference against central differences of
// the reference forward (1e-7 relative).
func TestSwiGLUReferenceGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	n := 40
	g, u, dout := f64s(randVec(r, n, 3)), f64s(randVec(r, n, 1)), f64s(randVec(r, n, 1))
	loss := func() float64 { return dot64(refSwiGLU(g, u), dout) }
	dg, du := refSwiGLUGrad(g, u, dout)
	if e := relErr64(dg, centralDiff(g, loss)); e > 1e-7 {
		t.Errorf("reference dgate vs finite differences: rel err %.3g", e)
	}
	if e := relErr64(du, centralDiff(u, loss)); e > 1e-7 {
		t.Errorf("reference dup vs finite differences: rel err %.3g", e)
	}
}

// TestSwiGLU checks forward (1e-6 per element, values below 1e-20 counted absolutely: silu of
// −100 underflows float32) and backward (1e-6 of the tensor's max: σ is rounded to float32
// before 1 − σ, and dsilu crosses zero near g = −1.28, so per element it is not well conditioned)
// including gates of ±20, ±100 and 0. The gradient buffers start as NaN: backward overwrites.
func TestSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	n := 5000
	g, u, dout := randVec(r, n, 3), randVec(r, n, 1), randVec(r, n, 1)
	copy(g, []float32{0, 20, -20, 100, -100, 1e-4, -1.2785, 88, -88, -90})
	be := NewCPU()
	gb, ub := upload(be, g), upload(be, u)
	out := be.Alloc(n)
	be.SwiGLU(out, gb, ub)
	if e := elemRelErr(Host(out), refSwiGLU(f64s(g), f64s(u)), 1e-20); e > 1e-6 {
		t.Errorf("forward rel err %.3g", e)
	}
	nan := make([]float32, n)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	dg, du := upload(be, nan), upload(be, nan)
	be.SwiGLUBackward(dg, du, upload(be, dout), gb, ub)
	wdg, wdu := refSwiGLUGrad(f64s(g), f64s(u), f64s(dout))
	if e := maxRelErr(Host(dg), wdg); !(e <= 1e-6) {
		t.Errorf("dgate rel err %.3g", e)
	}
	if e := maxRelErr(Host(du), wdu); !(e <= 1e-6) {
		t.Errorf("dup rel err %.3g", e)
	}
}

// ---------------------------------------------------------------------------------------------
// CrossEntropy

// refCrossEntropy is loss = logsumexp(row) − row[t] and dlogits = (softmax(row) − onehot(t))·dscale
// in float64; rows with t < 0 get 0 and 0.
func refCrossEntropy(logits []float32, targets []int32, vocab int, dscale float64) (loss, dl []float64) {
	loss, dl = make([]float64, len(targets)), make([]float64, len(logits))
	for i, t := range targets {
		if t < 0 {
			continue
		}
		row := f64s(logits[i*vocab : (i+1)*vocab])
		mx := slices.Max(row)
		var sum float64
		for _, v := range row {
			sum += math.Exp(v - mx)
		}
		lse := mx + math.Log(sum)
		loss[i] = lse - row[t]
		for j, v := range row {
			dl[i*vocab+j] = math.Exp(v-lse) * dscale
		}
		dl[i*vocab+int(t)] -= dscale
	}
	return
}

// TestCrossEntropy checks losses (1e-6 relative, floor 1) and dlogits (1e-6 of max|dlogits|,
// i.e. of dscale) with ignored rows (target −1: loss and gradient exactly 0 even over garbage),
// dscale = 1/7, without dlogits, with dlogits aliasing logits (bit-identical to the separate
// buffer), and with logits offset by ±1e4 or one logit at 1e4 (must stay finite and accurate).
func TestCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	rows, vocab := 12, 37
	logits := randVec(r, rows*vocab, 2)
	targets := []int32{3, -1, 0, 36, 3, -1, 17, 5, 5, 0, 36, 9}
	for j := 0; j < vocab; j++ {
		logits[7*vocab+j] += 1e4  // large positive offset
		logits[8*vocab+j] -= 1e4  // large negative offset
		logits[9*vocab+j] = 0     // uniform row: loss = log(vocab)
		logits[11*vocab+j] *= 0.1 // nearly uniform
	}
	logits[10*vocab+36] = 1e4 // target has all the mass: loss ≈ 0
	logits[11*vocab+2] = 1e4  // a non-target has all the mass: loss ≈ 1e4
	dscale := float32(1.0 / 7)
	wantLoss, wantDl := refCrossEntropy(logits, targets, vocab, float64(dscale))
	if math.Abs(wantLoss[9]-math.Log(float64(vocab))) > 1e-12 {
		t.Fatalf("reference loss of a uniform row is %v, want log(%d)", wantLoss[9], vocab)
	}

	be := NewCPU()
	check := func(name string, losses, dl Buf) {
		t.Helper()
		if !be.AllFinite(losses) || (dl != nil && !be.AllFinite(dl)) {
			t.Errorf("%s: non-finite loss or gradient", name)
		}
		if e := maxRelErrFloor(Host(losses), wantLoss, 1); e > 1e-6 {
			t.Errorf("%s: loss rel err %.3g", name, e)
		}
		for i := 0; i < rows; i++ { // per row: loss on its own scale (floor 1)
			if e := elemRelErr(Host(losses)[i:i+1], wantLoss[i:i+1], 1); e > 1e-6 {
				t.Errorf("%s: row %d loss %v, want %v", name, i, Host(losses)[i], wantLoss[i])
			}
		}
		if dl == nil {
			return
		}
		if e := maxRelErr(Host(dl), wantDl); e > 1e-6 {
			t.Errorf("%s: dlogits rel err %.3g", name, e)
		}
		for i, tg := range targets {
			if tg >= 0 {
				continue
			}
			if Host(losses)[i] != 0 {
				t.Errorf("%s: ignored row %d has loss %v", name, i, Host(losses)[i])
			}
			for _, v := range Host(dl)[i*vocab : (i+1)*vocab] {
				if v != 0 {
					t.Errorf("%s: ignored row %d has gradient %v", name, i, v)
					break
				}
			}
		}
	}

	garbage := make([]float32, rows*vocab)
	for i := range garbage {
		garbage[i] = float32(math.NaN())
	}
	lgb := upload(be, logits)
	losses, dl := upload(be, garbage[:rows]), upload(be, garbage)
	be.CrossEntropy(losses, dl, lgb, targets, vocab, dscale)
	check("separate", losses, dl)

	l2 := upload(be, garbage[:rows])
	be.CrossEntropy(l2, nil, lgb, targets, vocab, dscale)
	check("no dlogits", l2, nil)

	alias := upload(be, logits)
	l3 := be.Alloc(rows)
	be.CrossEntropy(l3, alias, alias, targets, vocab, dscale)
	check("aliased", l3, alias)
	if !slices.Equal(Host(alias), Host(dl)) || !slices.Equal(Host(l3), Host(losses)) {
		t.Errorf("aliased dlogits == logits differs from separate buffers")
	}

	// Sensitivity: dlogits without dscale would be 7× too large.
	if e := maxRelErr(Host(dl), func() []float64 { _, d := refCrossEntropy(logits, targets, vocab, 1); return d }()); e < 0.5 {
		t.Errorf("dscale 1/7 vs 1 differ by only %.3g", e)
	}
}

// ---------------------------------------------------------------------------------------------
// AdamW

// refAdamW is one AdamW step in float64 (Loshchilov & Hutter, as in PyTorch AdamW):
// g ← g·gradScale; m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²; m̂ = m/(1−β1^t), v̂ = v/(1−β2^t);
// p ← p − lr·(m̂/(√v̂ + ε) + λ p), λ = 0 when decay is off.
func refAdamW(p, g, m, v []float64, hp AdamWStep, decay, biasCorrection bool) {
	c1, c2 := 1-math.Pow(hp.Beta1, float64(hp.Step)), 1-math.Pow(hp.Beta2, float64(hp.Step))
	if !biasCorrection {
		c1, c2 = 1, 1
	}
	wd := hp.WeightDecay
	if !decay {
		wd = 0
	}
	for i := range p {
		gi := g[i] * float64(hp.GradScale)
		m[i] = hp.Beta1*m[i] + (1-hp.Beta1)*gi
		v[i] = hp.Beta2*v[i] + (1-hp.Beta2)*gi*gi
		p[i] -= hp.LR * (m[i]/c1/(math.Sqrt(v[i]/c2)+hp.Eps) + wd*p[i])
	}
}

// TestAdamW runs 6 steps with fresh gradients each step against the float64 reference, with
// weight decay on and off and GradScale 1, 0.25 and 3. Compared: the moments m and v (1e-6
// relative; they carry GradScale, which m̂/√v̂ cancels) and the parameter change p − p0 (1e-5
// relative: p ≈ 1 is rounded to float32 at every step while the change is ≈ 0.3). Without bias
// correction the change would be off by ~25%, and switching weight decay moves it by ~40%; both
// are checked to be far outside the tolerance.
func TestAdamW(t *testing.T) {
	for _, decay := range []bool{true, false} {
		for _, gs := range []float32{1, 0.25, 3} {
			t.Run(fmt.Sprintf("decay%v_gradscale%v", decay, gs), func(t *testing.T) {
				r := rand.New(rand.NewPCG(12, uint64(gs*4)))
				n := 1000
				p0 := randVec(r, n, 1)
				for i := range p0 {
					p0[i] += 1 // weight decay has something to pull on
				}
				be := NewCPU()
				pb, mb, vb := upload(be, p0), be.Alloc(n), be.Alloc(n)
				p, m, v := f64s(p0), make([]float64, n), make([]float64, n)
				pNoBC, mNoBC, vNoBC := f64s(p0), make([]float64, n), make([]float64, n)
				pFlip, mFlip, vFlip := f64s(p0), make([]float64, n), make([]float64, n)
				for step := int64(1); step <= 6; step++ {
					g := randVec(r, n, 0.1)
					hp := AdamWStep{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: gs}
					be.AdamW(pb, upload(be, g), mb, vb, hp, decay)
					refAdamW(p, f64s(g), m, v, hp, decay, true)
					refAdamW(pNoBC, f64s(g), mNoBC, vNoBC, hp, decay, false)
					refAdamW(pFlip, f64s(g), mFlip, vFlip, hp, !decay, true)
				}
				delta := func(p []float64) []float64 {
					d := make([]float64, n)
					for i := range d {
						d[i] = p[i] - float64(p0[i])
					}
					return d
				}
				got := make([]float64, n)
				for i, x := range Host(pb) {
					got[i] = float64(x) - float64(p0[i])
				}
				if e := relErr64(got, delta(p)); e > 1e-5 {
					t.Errorf("p − p0 rel err %.3g", e)
				}
				if e := maxRelErr(Host(mb), m); e > 1e-6 {
					t.Errorf("m rel err %.3g", e)
				}
				if e := maxRelErr(Host(vb), v); e > 1e-6 {
					t.Errorf("v rel err %.3g", e)
				}
				if e := relErr64(delta(pNoBC), delta(p)); e < 100*1e-5 {
					t.Errorf("no bias correction changes p − p0 by only %.3g", e)
				}
				if e := relErr64(delta(pFlip), delta(p)); e < 100*1e-5 {
					t.Errorf("weight decay on/off changes p − p0 by only %.3g", e)
				}
			})
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Small buffer operations

// TestSumSquares checks Σx² against a float64 sum (the kernel accumulates in float64: 1e-12) for
// empty, tiny and large odd lengths.
func TestSumSquares(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 13))
	be := NewCPU()
	for _, n := range []int{0, 1, 15, 16, 17, 1000, 100003} {
		x := randVec(r, n, 3)
		var want float64
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		got := be.SumSquares(upload(be, x))
		if d := math.Abs(got - want); d > 1e-12*want {
			t.Errorf("n=%d: SumSquares = %v, want %v", n, got, want)
		}
	}
	// float32 values whose squares overflow float32 are fine in float64.
	if got := be.SumSquares(upload(be, []float32{3e30, 4e30})); math.Abs(got-25e60)/25e60 > 1e-6 {
		t.Errorf("SumSquares(3e30, 4e30) = %v, want 2.5e61", got)
	}
}

// TestAllFinite checks Inf, −Inf and NaN at the start, middle and end of a buffer longer than one
// partition, MaxFloat32 (finite) and the empty buffer.
func TestAllFinite(t *testing.T) {
	be := NewCPU()
	n := 1001
	if !be.AllFinite(be.Alloc(0)) {
		t.Errorf("empty buffer is not finite")
	}
	base := randVec(rand.New(rand.NewPCG(1, 3)), n, 1)
	base[500] = math.MaxFloat32
	base[501] = -math.MaxFloat32
	if !be.AllFinite(upload(be, base)) {
		t.Errorf("finite buffer (with ±MaxFloat32) reported non-finite")
	}
	for _, bad := range []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())} {
		for _, at := range []int{0, 1, 437, n - 1} {
			x := slices.Clone(base)
			x[at] = bad
			if be.AllFinite(upload(be, x)) {
				t.Errorf("%v at %d reported finite", bad, at)
			}
		}
	}
}

// TestAddScaleCopy checks Add (including dst aliasing a, b or both), Scale, Copy, Zero and
// Upload/Download exactly: a single float32 operation is correctly rounded, and so is the float64
// result rounded to float32 (float64 holds the exact sum and product of two float32 values).
func TestAddScaleCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 14))
	n := 20001 // more than one parallel chunk
	a, b := randVec(r, n, 1), randVec(r, n, 100)
	wantAdd := make([]float32, n)
	for i := range wantAdd {
		wantAdd[i] = float32(float64(a[i]) + float64(b[i]))
	}
	be := NewCPU()
	dst := be.Alloc(n)
	be.Add(dst, upload(be, a), upload(be, b))
	if !slices.Equal(Host(dst), wantAdd) {
		t.Errorf("Add into a fresh buffer differs")
	}
	ab, bb := upload(be, a), upload(be, b)
	be.Add(ab, ab, bb) // dst = a
	if !slices.Equal(Host(ab), wantAdd) {
		t.Errorf("Add with dst == a differs")
	}
	ab = upload(be, a)
	be.Add(bb, ab, bb) // dst = b
	if !slices.Equal(Host(bb), wantAdd) {
		t.Errorf("Add with dst == b differs")
	}
	ab = upload(be, a)
	be.Add(ab, ab, ab) // 2a
	for i, v := range Host(ab) {
		if v != 2*a[i] {
			t.Fatalf("Add(a, a, a)[%d] = %v, want %v", i, v, 2*a[i])
		}
	}

	s := float32(-0.37)
	sb := upload(be, b)
	be.Scale(sb, s)
	for i, v := range Host(sb) {
		if want := float32(float64(b[i]) * float64(s)); v != want {
			t.Fatalf("Scale[%d] = %v, want %v", i, v, want)
		}
	}

	cb := be.Alloc(n)
	be.Copy(cb, upload(be, a))
	down := make([]float32, n)
	be.Download(down, cb)
	if !slices.Equal(down, a) {
		t.Errorf("Copy/Download round trip differs")
	}
	be.Zero(cb)
	if slices.ContainsFunc(Host(cb), func(v float32) bool { return v != 0 }) {
		t.Errorf("Zero left nonzero values")
	}
}

// TestSliceSharesMemory checks that Slice is a view: writes through the view (Upload, Scale,
// Add, AdamW, kernels) land in the parent at the offset, and nothing outside [off, off+n) moves.
func TestSliceSharesMemory(t *testing.T) {
	be := NewCPU()
	n := 10
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i + 1)
	}
	parent := upload(be, x)
	view := be.Slice(parent, 3, 4)
	if view.Len() != 4 {
		t.Fatalf("view Len = %d, want 4", view.Len())
	}
	be.Scale(view, 10)
	be.Upload(be.Slice(view, 1, 2), []float32{-1, -2}) // a view of a view: parent [4, 6)
	want := []float32{1, 2, 3, 40, -1, -2, 70, 8, 9, 10}
	if !slices.Equal(Host(parent), want) {
		t.Fatalf("parent after writes through views = %v, want %v", Host(parent), want)
	}
	Host(parent)[6] = 99 // and writes to the parent show in the view
	if got := Host(view)[3]; got != 99 {
		t.Fatalf("view does not see a write to the parent: %v", got)
	}
	be.Zero(view)
	if want := []float32{1, 2, 3, 0, 0, 0, 0, 8, 9, 10}; !slices.Equal(Host(parent), want) {
		t.Fatalf("parent after Zero(view) = %v, want %v", Host(parent), want)
	}
	if tail := be.Slice(parent, n, 0); tail.Len() != 0 {
		t.Fatalf("empty view at the end has Len %d", tail.Len())
	}
}

// ---------------------------------------------------------------------------------------------
// Reproducibility

// TestBitReproducibleAcrossGOMAXPROCS runs the reductions and the parallel kernels with
// GOMAXPROCS 1 and 4 and requires bit-identical results (the package doc's promise): the
// RMSNorm backward (dw reduced over rows), SumSquares, MatMul large enough for gonum's
// parallel SGEMM, and attention forward + backward with GQA and a causal mask.
func TestBitReproducibleAcrossGOMAXPROCS(t *testing.T) {
	run := func() map[string][]float32 {
		r := rand.New(rand.NewPCG(15, 15))
		be := NewCPU()
		res := map[string][]float32{}

		rows, dim := 301, 64
		x, w, dout := randVec(r, rows*dim, 1), randVec(r, dim, 1), randVec(r, rows*dim, 1)
		xb, wb := upload(be, x), upload(be, w)
		out, rstd := be.Alloc(rows*dim), be.Alloc(rows)
		be.RMSNorm(out, rstd, xb, wb, rows, dim, 1e-5)
		dx, dw := be.Alloc(rows*dim), upload(be, randVec(r, dim, 1))
		be.RMSNormBackward(dx, dw, upload(be, dout), xb, wb, rstd, rows, dim)
		res["rmsnorm out"], res["rmsnorm dx"], res["rmsnorm dw"] = Host(out), Host(dx), Host(dw)

		// the float64 sum, bit for bit, as two 32-bit halves
		ss := math.Float64bits(be.SumSquares(upload(be, randVec(r, 100003, 1))))
		res["sumsquares"] = []float32{math.Float32frombits(uint32(ss >> 32)), math.Float32frombits(uint32(ss))}

		m, n, k := 300, 260, 270
		a, b := randVec(r, m*k, 1), randVec(r, k*n, 1)
		for _, tr := range [][2]bool{{false, false}, {true, true}} {
			c := upload(be, randVec(r, m*n, 1))
			be.MatMul(c, upload(be, a), upload(be, b), m, n, k, tr[0], tr[1], 1)
			res[fmt.Sprintf("matmul %v", tr)] = Host(c)
		}

		N, H, K, hd := 300, 4, 2, 16
		pos := make([]int32, N)
		for i := range pos {
			pos[i] = int32(i)
		}
		sh := AttnShape{NQ: N, NK: N, Heads: H, KVHeads: K, HeadDim: hd, Causal: true,
			Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos}
		q, kk, v := upload(be, randVec(r, N*H*hd, 1)), upload(be, randVec(r, N*K*hd, 1)), upload(be, randVec(r, N*K*hd, 1))
		st := AttnState{O: be.Alloc(N * H * hd), M: be.Alloc(H * N), L: be.Alloc(H * N)}
		be.AttnInit(st)
		be.AttnForward(st, q, kk, v, sh)
		o, lse := be.Alloc(N*H*hd), be.Alloc(H*N)
		be.AttnFinish(o, lse, st, N, H, hd)
		do, D := upload(be, randVec(r, N*H*hd, 1)), be.Alloc(H*N)
		be.AttnBackwardPrep(D, o, do, N, H, hd, FP32)
		dq, dk, dv := be.Alloc(N*H*hd), be.Alloc(N*K*hd), be.Alloc(N*K*hd)
		be.AttnBackward(dq, dk, dv, q, kk, v, nil, do, lse, D, sh)
		res["attn o"], res["attn lse"], res["attn D"] = Host(o), Host(lse), Host(D)
		res["attn dq"], res["attn dk"], res["attn dv"] = Host(dq), Host(dk), Host(dv)
		return res
	}
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	one := run()
	runtime.GOMAXPROCS(4)
	four := run()
	for name, a := range one {
		b := four[name]
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Errorf("%s[%d]: %v with GOMAXPROCS 1, %v with 4", name, i, a[i], b[i])
				break
			}
		}
	}
}

// TestMatMulBeta0K0OverwritesNaN: with k = 0 and beta = 0, C is set to zero without being read.
func TestMatMulBeta0K0OverwritesNaN(t *testing.T) {
	be := NewCPU()
	c := be.Alloc(4)
	be.Upload(c, []float32{float32(math.NaN()), float32(math.Inf(1)), 1, 2})
	be.MatMul(c, be.Alloc(0), be.Alloc(0), 2, 2, 0, false, false, 0)
	for i, v := range Host(c) {
		if v != 0 {
			t.Errorf("C[%d] = %v, want 0", i, v)
		}
	}
}
