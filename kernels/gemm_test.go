package kernels

import (
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Tolerance: with u = 2^-24 the float32 rounding unit, a length-k dot product accumulated
// in order (fused or not), scaled by alpha and added to beta·c, is within about
// (k+3)·u·(|alpha|·Σ_p |a_ip·b_pj| + |beta·c_ij|) of the exact value. The tests accept
// |got − exact| ≤ gemmTol·(k+4)·that scale with gemmTol = 2e-7 ≈ 3.4u, i.e. a relative
// error of about 2e-7·k (≈ 1e-4 at k = 513) against the absolute-value scale; the exact
// value is computed in float64.
const gemmTol = 2e-7

type gemmCase struct {
	ta, tb  bool
	m, n, k int
	pad     int // extra columns in every leading dimension
}

// gemmOperands builds random A, B, C for a case (with padding), C's padding holding a
// sentinel that must survive. When nanC, C's visible part is NaN.
func gemmOperands(r *rand.Rand, tc gemmCase, nanC bool) (a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	ar, ac := tc.m, tc.k
	if tc.ta {
		ar, ac = tc.k, tc.m
	}
	br, bc := tc.k, tc.n
	if tc.tb {
		br, bc = tc.n, tc.k
	}
	lda, ldb, ldc = max(1, ac+tc.pad), max(1, bc+tc.pad), max(1, tc.n+tc.pad)
	a = randMat(r, ar, ac, lda)
	b = randMat(r, br, bc, ldb)
	c = randMat(r, tc.m, tc.n, ldc)
	for i := range c {
		if i%ldc >= tc.n {
			c[i] = 12345
		} else if nanC {
			c[i] = float32(math.NaN())
		}
	}
	return
}

func randMat(r *rand.Rand, rows, cols, ld int) []float32 {
	if rows == 0 {
		return nil
	}
	s := make([]float32, (rows-1)*ld+cols)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// gemmRef returns the exact (float64) result and the error scale for every element of C.
func gemmRef(tc gemmCase, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (ref, scale []float64) {
	ref = make([]float64, tc.m*tc.n)
	scale = make([]float64, tc.m*tc.n)
	for i := 0; i < tc.m; i++ {
		for j := 0; j < tc.n; j++ {
			var s, sa float64
			for p := 0; p < tc.k; p++ {
				var av, bv float32
				if tc.ta {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if tc.tb {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(av) * float64(bv)
				sa += math.Abs(float64(av) * float64(bv))
			}
			v := float64(alpha) * s
			sc := math.Abs(float64(alpha)) * sa
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
				sc += math.Abs(float64(beta) * float64(c[i*ldc+j]))
			}
			ref[i*tc.n+j], scale[i*tc.n+j] = v, sc
		}
	}
	return
}

// gemmVerify checks got against the reference and that C's padding is untouched.
func gemmVerify(t *testing.T, what string, tc gemmCase, got []float32, ldc int, ref, scale []float64) {
	t.Helper()
	bad := 0
	for i := range got {
		row, col := i/ldc, i%ldc
		if col >= tc.n {
			if got[i] != 12345 {
				t.Fatalf("%s: padding of C overwritten at (%d,%d): %v", what, row, col, got[i])
			}
			continue
		}
		g, want, sc := float64(got[i]), ref[row*tc.n+col], scale[row*tc.n+col]
		err := math.Abs(g - want)
		lim := gemmTol * float64(tc.k+4) * sc
		if !(err <= lim) { // also catches NaN
			if bad < 5 {
				t.Errorf("%s: C[%d,%d] = %v, want %v (err %.3g > %.3g)", what, row, col, g, want, err, lim)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d bad elements", what, bad)
	}
}

var gemmShapes = [][3]int{
	{1, 1, 1}, {5, 7, 3}, {17, 33, 65}, {100, 1, 300}, {1, 100, 300},
	{64, 352, 128}, {300, 257, 513}, {6, 16, 256}, {12, 32, 257}, {7, 17, 1},
	{3, 4, 0}, {0, 5, 3}, {5, 0, 3}, {7, 4200, 9}, // n > gemmNC
}

// gemmImpls returns every microkernel to test: the portable one and those the CPU runs.
func gemmImpls() []gemmImpl {
	return append([]gemmImpl{gemmGo}, gemmAsmImpls()...)
}

func TestSgemmMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for _, impl := range gemmImpls() {
		for _, sh := range gemmShapes {
			for _, pad := range []int{0, 5} {
				for tr := 0; tr < 4; tr++ {
					tc := gemmCase{ta: tr&1 != 0, tb: tr&2 != 0, m: sh[0], n: sh[1], k: sh[2], pad: pad}
					big := tc.m*tc.n*tc.k > 1<<20
					for _, alpha := range []float32{1, 0.5} {
						for _, beta := range []float32{0, 1, -0.5} {
							if big && (alpha != 1 || beta == 1) && pad == 0 {
								continue // keep the float64 reference affordable
							}
							a, lda, b, ldb, c, ldc := gemmOperands(r, tc, beta == 0)
							ref, scale := gemmRef(tc, alpha, a, lda, b, ldb, beta, c, ldc)
							sgemmWith(&impl, 2, tc.ta, tc.tb, tc.m, tc.n, tc.k, alpha, a, lda, b, ldb, beta, c, ldc)
							what := fmt.Sprintf("%s %+v alpha=%v beta=%v", impl.name, tc, alpha, beta)
							gemmVerify(t, what, tc, c, ldc, ref, scale)
						}
					}
				}
			}
		}
	}
}

// TestSgemmDefault checks the sgemm entry point itself (whichever kernel is installed),
// including alpha == 0, k == 0 and NaN-filled C with beta == 0.
func TestSgemmDefault(t *testing.T) {
	t.Logf("microkernel: %s (%d×%d)", gemmKernel.name, gemmKernel.mr, gemmKernel.nr)
	r := rand.New(rand.NewSource(2))
	for _, tc := range []gemmCase{
		{false, false, 37, 45, 70, 3}, {true, true, 37, 45, 70, 0}, {true, false, 8, 9, 0, 2}, {false, true, 130, 20, 600, 1},
	} {
		for _, alpha := range []float32{1, 0.5, 0} {
			for _, beta := range []float32{0, 1, -0.5} {
				a, lda, b, ldb, c, ldc := gemmOperands(r, tc, beta == 0)
				ref, scale := gemmRef(tc, alpha, a, lda, b, ldb, beta, c, ldc)
				if alpha == 0 {
					for i := range a {
						a[i] = float32(math.NaN()) // BLAS: A and B are not referenced when alpha == 0
					}
				}
				sgemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, alpha, a, lda, b, ldb, beta, c, ldc)
				gemmVerify(t, fmt.Sprintf("%+v alpha=%v beta=%v", tc, alpha, beta), tc, c, ldc, ref, scale)
			}
		}
	}
}

// TestSgemmMatchesGonum compares with gonum's Sgemm on random data.
func TestSgemmMatchesGonum(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	var impl gonum.Implementation
	for _, sh := range [][3]int{{64, 352, 128}, {300, 257, 513}, {129, 65, 1000}, {1, 100, 300}} {
		for tr := 0; tr < 4; tr++ {
			tc := gemmCase{ta: tr&1 != 0, tb: tr&2 != 0, m: sh[0], n: sh[1], k: sh[2], pad: 2}
			a, lda, b, ldb, c, ldc := gemmOperands(r, tc, false)
			c2 := append([]float32(nil), c...)
			_, scale := gemmRef(tc, 0.5, a, lda, b, ldb, -0.5, c, ldc)
			sgemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, -0.5, c, ldc)
			ta, tb := blas.NoTrans, blas.NoTrans
			if tc.ta {
				ta = blas.Trans
			}
			if tc.tb {
				tb = blas.Trans
			}
			impl.Sgemm(ta, tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, -0.5, c2, ldc)
			worst := 0.0
			for i := 0; i < tc.m; i++ {
				for j := 0; j < tc.n; j++ {
					err := math.Abs(float64(c[i*ldc+j]) - float64(c2[i*ldc+j]))
					lim := 2 * gemmTol * float64(tc.k+4) * scale[i*tc.n+j]
					if !(err <= lim) {
						t.Fatalf("%+v: C[%d,%d] = %v, gonum %v (err %.3g > %.3g)", tc, i, j, c[i*ldc+j], c2[i*ldc+j], err, lim)
					}
					worst = max(worst, err/scale[i*tc.n+j])
				}
			}
			t.Logf("%+v: max |ours-gonum|/scale = %.3g", tc, worst)
		}
	}
}

// TestSgemmDeterministic checks bit-identical results whatever the thread count, through
// both the thread argument and GOMAXPROCS itself.
func TestSgemmDeterministic(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, impl := range gemmImpls() {
		for _, tc := range []gemmCase{
			{false, false, 300, 257, 513, 3},
			{false, true, 1024, 352, 128, 0},
			{true, false, 352, 128, 1024, 0},
			{true, true, 50, 700, 600, 1},
			{false, false, 4200, 20, 40, 0}, // more rows than one packed A block
		} {
			for _, beta := range []float32{0, -0.5} {
				a, lda, b, ldb, c0, ldc := gemmOperands(r, tc, false)
				var want []float32
				for _, threads := range []int{1, 2, 3, 8} {
					for _, viaProcs := range []bool{false, true} {
						c := append([]float32(nil), c0...)
						if viaProcs {
							if impl.name != gemmKernel.name {
								continue
							}
							runtime.GOMAXPROCS(threads)
							sgemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, beta, c, ldc)
						} else {
							sgemmWith(&impl, threads, tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, beta, c, ldc)
						}
						if want == nil {
							want = c
							continue
						}
						for i := range c {
							if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s %+v beta=%v: %d threads (GOMAXPROCS=%v) differ at %d: %v vs %v",
									impl.name, tc, beta, threads, viaProcs, i, c[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestSgemmKernelsAgree checks that the assembly microkernels (AVX2 and AVX-512 where the
// CPU has them) give bit-identical results: they do the same operations in the same order.
func TestSgemmKernelsAgree(t *testing.T) {
	impls := gemmAsmImpls()
	if len(impls) < 2 {
		t.Skipf("%d assembly microkernels on this CPU", len(impls))
	}
	r := rand.New(rand.NewSource(6))
	for _, tc := range []gemmCase{{false, false, 300, 257, 513, 3}, {true, true, 50, 700, 600, 1}, {false, true, 37, 45, 70, 0}} {
		for _, beta := range []float32{0, -0.5} {
			a, lda, b, ldb, c0, ldc := gemmOperands(r, tc, false)
			var want []float32
			for _, impl := range impls {
				c := append([]float32(nil), c0...)
				sgemmWith(&impl, 2, tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, beta, c, ldc)
				if want == nil {
					want = c
					continue
				}
				for i := range c {
					if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%+v beta=%v: %s differs from %s at %d: %v vs %v", tc, beta, impl.name, impls[0].name, i, c[i], want[i])
					}
				}
			}
		}
	}
}

func TestSgemmBadArgs(t *testing.T) {
	mustPanic := func(name string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		fn()
	}
	a, b, c := make([]float32, 12), make([]float32, 12), make([]float32, 9)
	mustPanic("lda", func() { sgemm(false, false, 3, 3, 4, 1, a, 3, b, 3, 0, c, 3) })
	mustPanic("short C", func() { sgemm(false, false, 3, 3, 4, 1, a, 4, b, 3, 0, c[:8], 3) })
	mustPanic("short B", func() { sgemm(false, true, 3, 3, 4, 1, a, 4, b[:11], 4, 0, c, 3) })
	mustPanic("negative", func() { sgemm(false, false, -1, 3, 4, 1, a, 4, b, 3, 0, c, 3) })
	sgemm(false, false, 3, 3, 4, 1, a, 4, b, 3, 0, c, 3)
}

func BenchmarkSgemm(b *testing.B) {
	type shape struct {
		name    string
		m, n, k int
		ta, tb  bool
	}
	shapes := []shape{
		{"128", 128, 128, 128, false, false},
		{"256", 256, 256, 256, false, false},
		{"512", 512, 512, 512, false, false},
		{"1024", 1024, 1024, 1024, false, false},
		{"1024x352x128_transB", 1024, 352, 128, false, true},
		{"352x128x1024_transA", 352, 128, 1024, true, false},
	}
	var gn gonum.Implementation
	for _, who := range []string{"ours", "gonum"} {
		for _, s := range shapes {
			b.Run(who+"/"+s.name, func(b *testing.B) {
				r := rand.New(rand.NewSource(5))
				tc := gemmCase{ta: s.ta, tb: s.tb, m: s.m, n: s.n, k: s.k}
				a, lda, bb, ldb, c, ldc := gemmOperands(r, tc, false)
				ta, tb := blas.NoTrans, blas.NoTrans
				if s.ta {
					ta = blas.Trans
				}
				if s.tb {
					tb = blas.Trans
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if who == "ours" {
						sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, c, ldc)
					} else {
						gn.Sgemm(ta, tb, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, c, ldc)
					}
				}
				b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
