package kernels

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"distflash/weights/safetensors"
)

func TestParsePrecision(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Precision
	}{{"fp32", FP32}, {"bf16", BF16}, {"fp16", FP16}} {
		got, err := ParsePrecision(tc.in)
		if err != nil || got != tc.want || got.String() != tc.in {
			t.Errorf("ParsePrecision(%q) = %v (%q), %v; want %v", tc.in, got, got.String(), err, tc.want)
		}
	}
	for _, bad := range []string{"", "FP32", "bfloat16", "f16", "fp8", " bf16"} {
		_, err := ParsePrecision(bad)
		if err == nil {
			t.Errorf("ParsePrecision(%q): no error", bad)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%q", bad)) || !strings.Contains(msg, "fp32, bf16, fp16") {
			t.Errorf("ParsePrecision(%q): error %q must name the value and the accepted ones", bad, msg)
		}
	}
	if s := Precision(7).String(); s != "Precision(7)" {
		t.Errorf("Precision(7).String() = %q", s)
	}
}

// half describes one 16-bit format for the table tests.
type half struct {
	p     Precision
	round func(float32) float32
	bits  func(float32) uint16
	value func(uint16) float32
	quiet uint16 // the quiet bit of a NaN encoding
}

var halves = []half{
	{BF16, RoundBF16, BF16Bits, BF16Value, 0x0040},
	{FP16, RoundFP16, FP16Bits, FP16Value, 0x0200},
}

// isNaN16 reports whether b encodes a NaN in p.
func isNaN16(b uint16, p Precision) bool {
	if p == BF16 {
		return b&0x7f80 == 0x7f80 && b&0x7f != 0
	}
	return b&0x7c00 == 0x7c00 && b&0x3ff != 0
}

func isNaN32(x float32) bool { return x != x }

// TestHalfConvertGolden compares every conversion with PyTorch's (testdata/half/convert,
// written by scripts/reference.py half): the 16-bit encoding must be the same bit pattern,
// and Round must give its value. A NaN may be any quiet NaN (PyTorch writes 0xffff for bf16
// and 0x7e00 / 0xfe00 for fp16). The vector is also checked to hold what it claims to.
func TestHalfConvertGolden(t *testing.T) {
	st, err := safetensors.Read("testdata/half/convert.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	x, _, err := st.Float32("x")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range halves {
		t.Run(h.p.String(), func(t *testing.T) {
			want, _, err := st.Int32(h.p.String())
			if err != nil {
				t.Fatal(err)
			}
			if len(want) != len(x) {
				t.Fatalf("%d inputs, %d outputs", len(x), len(want))
			}
			var nans, infs, zeros, subnormals, ties, bad int
			for i, xi := range x {
				w := uint16(want[i])
				got := h.bits(xi)
				r := h.round(xi)
				ok := got == w && math.Float32bits(r) == math.Float32bits(h.value(w))
				if isNaN16(w, h.p) {
					nans++
					ok = isNaN16(got, h.p) && got&h.quiet != 0 && isNaN32(r) && math.Float32bits(r)&0x00400000 != 0
				}
				if !ok {
					if bad < 10 {
						t.Errorf("x = %v (%#08x): bits %#04x round %v (%#08x); torch %#04x (%v)",
							xi, math.Float32bits(xi), got, r, math.Float32bits(r), w, h.value(w))
					}
					bad++
				}
				u := math.Float32bits(xi)
				switch v := h.value(w); {
				case math.IsInf(float64(v), 0) && !math.IsInf(float64(xi), 0):
					infs++
				case v == 0 && xi != 0:
					zeros++
				case w&0x7fff != 0 && (h.p == FP16 && w&0x7c00 == 0 || h.p == BF16 && w&0x7f80 == 0):
					subnormals++
				}
				if h.p == BF16 && u&0xffff == 0x8000 || h.p == FP16 && u&0x1fff == 0x1000 {
					ties++
				}
			}
			t.Logf("%d values, %d NaN, %d overflow to Inf, %d underflow to 0, %d subnormal results, %d exact ties", len(x), nans, infs, zeros, subnormals, ties)
			if bad > 0 {
				t.Fatalf("%d of %d conversions differ from PyTorch", bad, len(x))
			}
			if len(x) < 10000 || nans < 10 || infs < 20 || zeros < 20 || subnormals < 50 || ties < 200 {
				t.Errorf("the vector does not cover the cases it should")
			}
		})
	}
}

// TestHalfAll16BitPatterns: every 16-bit encoding converts to float32 and back unchanged
// (a NaN comes back quiet with its sign; a quiet one exactly), its value is a fixed point
// of Round, and FP16Value agrees with the definition (-1)^s · 2^(e-15) · (1 + m/1024),
// subnormals (-1)^s · m · 2^-24.
func TestHalfAll16BitPatterns(t *testing.T) {
	for _, h := range halves {
		for i := 0; i < 1<<16; i++ {
			b := uint16(i)
			v := h.value(b)
			back := h.bits(v)
			if h.p == FP16 && fp16Float(uint32(b)) != math.Float32bits(v) {
				t.Fatalf("fp16Float(%#04x) = %#08x, FP16Value %v", b, fp16Float(uint32(b)), v)
			}
			if isNaN16(b, h.p) {
				if !isNaN32(v) || !isNaN16(back, h.p) || back&0x8000 != b&0x8000 || back&h.quiet == 0 || (b&h.quiet != 0 && back != b) {
					t.Fatalf("%v NaN %#04x: value %v, back %#04x", h.p, b, v, back)
				}
				continue
			}
			if back != b || math.Float32bits(h.round(v)) != math.Float32bits(v) {
				t.Fatalf("%v %#04x: value %v, back %#04x, round %v", h.p, b, v, back, h.round(v))
			}
			if h.p == FP16 {
				s, e, m := 1.0, int(b>>10&0x1f), float64(b&0x3ff)
				if b&0x8000 != 0 {
					s = -1
				}
				var def float64
				switch e {
				case 0:
					def = s * math.Ldexp(m, -24)
				case 0x1f:
					def = math.Inf(int(s))
				default:
					def = s * math.Ldexp(1+m/1024, e-15)
				}
				if float64(v) != def || math.Signbit(float64(v)) != (s < 0) {
					t.Fatalf("FP16Value(%#04x) = %v, want %v", b, v, def)
				}
			}
		}
	}
}

// refRound is an independent nearest-value search: the two values of the format that
// bracket x (found among all finite encodings, sorted), the nearer one, ties to the even
// encoding; |x| at or past the half-way point above the largest finite value gives Inf.
type refRound struct {
	vals []float64 // finite non-negative values, ascending
	enc  []uint16
	max  float64 // largest finite value
	step float64 // spacing just below max (so the overflow threshold is max + step/2)
}

func newRefRound(h half) *refRound {
	r := &refRound{}
	for i := 0; i < 0x8000; i++ {
		v := float64(h.value(uint16(i)))
		if math.IsInf(v, 0) || math.IsNaN(v) {
			continue
		}
		r.vals, r.enc = append(r.vals, v), append(r.enc, uint16(i))
	}
	n := len(r.vals)
	if !slices.IsSorted(r.vals) {
		panic("encodings not ordered by value")
	}
	r.max, r.step = r.vals[n-1], r.vals[n-1]-r.vals[n-2]
	return r
}

func (r *refRound) round(x float32) float64 {
	a := math.Abs(float64(x))
	s := 1.0
	if math.Signbit(float64(x)) {
		s = -1
	}
	if a >= r.max+r.step/2 {
		return s * math.Inf(1)
	}
	i, _ := slices.BinarySearch(r.vals, a) // vals[i-1] < a <= vals[i]
	if i == len(r.vals) {
		return s * r.max
	}
	if r.vals[i] == a || i == 0 {
		return s * r.vals[i]
	}
	lo, hi := r.vals[i-1], r.vals[i]
	switch {
	case a-lo < hi-a:
		return s * lo
	case a-lo > hi-a:
		return s * hi
	case r.enc[i-1]&1 == 0:
		return s * lo
	}
	return s * hi
}

// TestHalfStridedFloat32 checks every 4099th float32 bit pattern (about a million, all
// exponents and signs): Round equals the independent nearest-value search, and the
// encoding round-trips to Round's value.
func TestHalfStridedFloat32(t *testing.T) {
	const stride = 4099
	for _, h := range halves {
		ref := newRefRound(h)
		bad := 0
		for u := uint64(0); u < 1<<32; u += stride {
			x := math.Float32frombits(uint32(u))
			r := h.round(x)
			rt := h.value(h.bits(x))
			if w := [...]func(uint32) uint32{BF16: bf16Word, FP16: fp16Word}[h.p](uint32(u)); w != uint32(h.bits(x)) {
				t.Fatalf("%v %#08x: packing encodes %#04x, %vBits %#04x", h.p, u, w, h.p, h.bits(x))
			}
			if isNaN32(x) {
				if !isNaN32(r) || !isNaN32(rt) || math.Signbit(float64(r)) != math.Signbit(float64(x)) {
					t.Fatalf("%v NaN %#08x: round %v, round trip %v", h.p, u, r, rt)
				}
				continue
			}
			want := ref.round(x)
			if float64(r) != want || math.Signbit(float64(r)) != math.Signbit(want) || math.Float32bits(rt) != math.Float32bits(r) {
				if bad < 10 {
					t.Errorf("%v %v (%#08x): round %v, want %v, round trip %v", h.p, x, u, r, want, rt)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Fatalf("%v: %d bad", h.p, bad)
		}
	}
}

// specialValues are inputs every buffer test mixes in: zeros, infinities, NaNs (a
// signalling one too), overflow, subnormals, ties.
var specialValues = []float32{
	0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
	float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffa00000),
	65504, 65519.99, 65520, -1e5, 3.4e38, math.Float32frombits(0x7f7f8000),
	1e-8, 2.98e-8, 5.96e-8, -6.1e-5, 1e-40, math.Float32frombits(0x3f808000), math.Float32frombits(0x3f801000),
}

func halfTestVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch i % 5 {
		case 0:
			x[i] = specialValues[r.IntN(len(specialValues))]
		case 1:
			x[i] = math.Float32frombits(r.Uint32())
		default:
			x[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-20)))
		}
	}
	return x
}

func sameBits(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }

// TestRoundPackUnpack checks the Backend methods against the scalar functions on buffers of
// odd and even lengths (large ones run in parallel pieces): Round is elementwise RoundX,
// PackHalf holds the encodings two per word, and UnpackHalf(PackHalf(x)) == Round(x) bit for
// bit, also after the packed words went through Copy (a word may be a signalling-NaN pattern).
func TestRoundPackUnpack(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(40, 41))
	for _, h := range halves {
		for _, n := range []int{0, 1, 2, 3, 7, 8, 1000, 100001} {
			x := halfTestVec(r, n)
			xb := upload(be, x)
			packed := be.Alloc((n + 1) / 2)
			be.PackHalf(packed, xb, h.p)
			moved := be.Alloc(packed.Len())
			be.Copy(moved, packed)
			back := be.Alloc(n)
			be.UnpackHalf(back, moved, h.p)
			be.Round(xb, h.p)
			w := words(Host(packed))
			for i, v := range x {
				want := h.round(v)
				if got := Host(xb)[i]; !sameBits(got, want) {
					t.Fatalf("%v n=%d: Round[%d] of %v = %v, want %v", h.p, n, i, v, got, want)
				}
				if got := Host(back)[i]; !sameBits(got, want) && !(isNaN32(got) && isNaN32(want)) {
					t.Fatalf("%v n=%d: unpacked[%d] of %v = %v, want %v", h.p, n, i, v, got, want)
				}
				if got := uint16(w[i/2] >> (16 * (i % 2))); got != h.bits(v) {
					t.Fatalf("%v n=%d: packed half %d of %v = %#04x, want %#04x", h.p, n, i, v, got, h.bits(v))
				}
			}
			if n%2 == 1 && w[n/2]>>16 != 0 {
				t.Fatalf("%v n=%d: high half past the end is %#04x, want 0", h.p, n, w[n/2]>>16)
			}
			if !slices.Equal(words(Host(moved)), w) {
				t.Fatalf("%v n=%d: Copy changed packed words", h.p, n)
			}
		}
		// A packed word that is a signalling NaN as float32: low half 0x0001, high half Inf.
		x := upload(be, []float32{h.value(1), float32(math.Inf(1))})
		p, q, back := be.Alloc(1), be.Alloc(1), be.Alloc(2)
		be.PackHalf(p, x, h.p)
		be.Copy(q, p)
		be.UnpackHalf(back, q, h.p)
		if !slices.Equal(Host(back), Host(x)) || words(Host(q))[0]&0xffff != 1 {
			t.Errorf("%v: packed %#08x, moved %#08x, back %v", h.p, words(Host(p))[0], words(Host(q))[0], Host(back))
		}
	}
	// FP32 rounding leaves every bit pattern alone.
	x := halfTestVec(r, 1001)
	xb := upload(be, x)
	be.Round(xb, FP32)
	if !slices.Equal(words(Host(xb)), words(x)) {
		t.Error("Round(FP32) changed the buffer")
	}
}

func TestHalfBadArgs(t *testing.T) {
	be := NewCPU()
	mustPanic := func(name string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		fn()
	}
	x, p := be.Alloc(5), be.Alloc(3)
	mustPanic("pack fp32", func() { be.PackHalf(p, x, FP32) })
	mustPanic("unpack fp32", func() { be.UnpackHalf(x, p, FP32) })
	mustPanic("pack short", func() { be.PackHalf(be.Alloc(2), x, BF16) })
	mustPanic("pack long", func() { be.PackHalf(be.Alloc(4), x, BF16) })
	mustPanic("unpack short", func() { be.UnpackHalf(x, be.Alloc(2), FP16) })
	mustPanic("round unknown", func() { be.Round(x, Precision(3)) })
	mustPanic("matmul precision", func() { be.SetMatMulPrecision(Precision(3)) })
}

// matmulHalfCase is one testdata/half/matmul_*.safetensors file.
type matmulHalfCase struct {
	name                  string
	M, N, K               int
	TransA, TransB        bool
	Beta                  float32
	Precision             string
	prec                  Precision
	a, b, c0, want, scale []float32
}

func loadMatmulHalf(t *testing.T) []*matmulHalfCase {
	t.Helper()
	files, err := filepath.Glob("testdata/half/matmul_*.safetensors")
	if err != nil || len(files) < 5 {
		t.Fatalf("want 5 matmul vectors in testdata/half, found %d (%v)", len(files), err)
	}
	var cases []*matmulHalfCase
	for _, path := range files {
		st, err := safetensors.Read(path)
		if err != nil {
			t.Fatal(err)
		}
		c := &matmulHalfCase{name: filepath.Base(path)}
		var cfg struct {
			M, N, K   int
			TransA    bool `json:"trans_a"`
			TransB    bool `json:"trans_b"`
			Beta      float32
			Precision string
		}
		if err := json.Unmarshal([]byte(st.Metadata["config"]), &cfg); err != nil {
			t.Fatalf("%s: config: %v", path, err)
		}
		c.M, c.N, c.K, c.TransA, c.TransB, c.Beta, c.Precision = cfg.M, cfg.N, cfg.K, cfg.TransA, cfg.TransB, cfg.Beta, cfg.Precision
		if c.prec, err = ParsePrecision(c.Precision); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, p := range []struct {
			name string
			dst  *[]float32
			n    int
		}{{"a", &c.a, c.M * c.K}, {"b", &c.b, c.K * c.N}, {"c0", &c.c0, c.M * c.N}, {"c", &c.want, c.M * c.N}, {"scale", &c.scale, c.M * c.N}} {
			if *p.dst, _, err = st.Float32(p.name); err != nil || len(*p.dst) != p.n {
				t.Fatalf("%s: %s: %d values (want %d), %v", path, p.name, len(*p.dst), p.n, err)
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// check compares C with the reference: Inf where PyTorch has Inf, else within the fp32
// GEMM bound gemmTol·(k+4)·scale (accumulation is float32; the operands are exact).
func (c *matmulHalfCase) check(got []float32) (bad int, worst float64, firstBad string) {
	for i, g := range got {
		w, sc := float64(c.want[i]), float64(c.scale[i])
		if math.IsInf(w, 0) {
			if float64(g) != w {
				bad++
				firstBad = fmt.Sprintf("C[%d] = %v, want %v", i, g, w)
			}
			continue
		}
		err := math.Abs(float64(g) - w)
		if !(err <= gemmTol*float64(c.K+4)*sc) {
			if bad == 0 {
				firstBad = fmt.Sprintf("C[%d] = %v, want %v (err %.3g, scale %.3g)", i, g, w, err, sc)
			}
			bad++
		}
		if sc > 0 {
			worst = max(worst, err/sc)
		}
	}
	return
}

// TestMatMulHalfGolden runs PyTorch's bf16 / fp16 products (testdata/half/matmul_*) through
// MatMul with the matching precision: C equals round(A)·round(B) + beta·C to float32-GEMM
// accuracy, an overflowing fp16 operand gives Inf, A and B are not changed, and the same
// call at FP32 precision misses the reference (so the rounding is really applied).
func TestMatMulHalfGolden(t *testing.T) {
	be := NewCPU()
	if be.MatMulPrecision() != FP32 {
		t.Fatalf("default matmul precision %v", be.MatMulPrecision())
	}
	for _, c := range loadMatmulHalf(t) {
		t.Run(c.name, func(t *testing.T) {
			run := func(p Precision) []float32 {
				be.SetMatMulPrecision(p)
				defer be.SetMatMulPrecision(FP32)
				if be.MatMulPrecision() != p {
					t.Fatalf("MatMulPrecision() = %v after setting %v", be.MatMulPrecision(), p)
				}
				a, b, cb := upload(be, c.a), upload(be, c.b), upload(be, c.c0)
				be.MatMul(cb, a, b, c.M, c.N, c.K, c.TransA, c.TransB, c.Beta)
				if !slices.Equal(Host(a), c.a) || !slices.Equal(Host(b), c.b) {
					t.Fatal("MatMul changed its operands")
				}
				return Host(cb)
			}
			bad, worst, first := c.check(run(c.prec))
			if bad > 0 {
				t.Fatalf("%s: %d elements off, first %s", c.Precision, bad, first)
			}
			t.Logf("%s %dx%dx%d transA=%v transB=%v beta=%v: max |err|/scale %.2e (bound %.2e)",
				c.Precision, c.M, c.N, c.K, c.TransA, c.TransB, c.Beta, worst, gemmTol*float64(c.K+4))
			if bad32, _, _ := c.check(run(FP32)); bad32 == 0 {
				t.Errorf("the fp32 product also passes: the test cannot see the rounding")
			}
			// Every microkernel (portable Go and the assembly ones) rounds the same way.
			for _, impl := range gemmImpls() {
				got := slices.Clone(c.c0)
				lda, ldb := c.K, c.N
				if c.TransA {
					lda = c.M
				}
				if c.TransB {
					ldb = c.K
				}
				sgemmRun(&impl, 2, c.prec, c.TransA, c.TransB, c.M, c.N, c.K, 1, c.a, lda, c.b, ldb, c.Beta, got, c.N)
				if bad, _, first := c.check(got); bad > 0 {
					t.Errorf("%s kernel: %d elements off, first %s", impl.name, bad, first)
				}
			}
		})
	}
}

// TestSgemmPrecDeterministic: with rounded operands the product is still bit-identical for
// any thread count, for every microkernel, and the rounding equals rounding A and B first.
func TestSgemmPrecDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 43))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, p := range []Precision{BF16, FP16} {
		for _, tc := range []gemmCase{
			{false, false, 200, 130, 300, 3},
			{true, true, 70, 300, 260, 0},
		} {
			ar, ac, br, bc := tc.m, tc.k, tc.k, tc.n
			if tc.ta {
				ar, ac = ac, ar
			}
			if tc.tb {
				br, bc = bc, br
			}
			lda, ldb, ldc := ac+tc.pad, bc+tc.pad, tc.n+tc.pad
			a, b := randVec(r, ar*lda, 1), randVec(r, br*ldb, 1)
			c0 := randVec(r, tc.m*ldc, 1)
			// Reference: the fp32 product of operands rounded beforehand.
			a2, b2 := slices.Clone(a), slices.Clone(b)
			roundSlice(a2, p)
			roundSlice(b2, p)
			for _, impl := range gemmImpls() {
				want := slices.Clone(c0)
				sgemmRun(&impl, 1, FP32, tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a2, lda, b2, ldb, -0.5, want, ldc)
				for _, threads := range []int{1, 2, 3, 8} {
					c := slices.Clone(c0)
					sgemmRun(&impl, threads, p, tc.ta, tc.tb, tc.m, tc.n, tc.k, 0.5, a, lda, b, ldb, -0.5, c, ldc)
					for i := range c {
						if !sameBits(c[i], want[i]) {
							t.Fatalf("%v %s %+v: %d threads differ at %d: %v vs %v", p, impl.name, tc, threads, i, c[i], want[i])
						}
					}
				}
			}
			// Through the Backend, varying GOMAXPROCS.
			be := NewCPU()
			be.SetMatMulPrecision(p)
			if tc.pad == 0 {
				var want []float32
				for _, procs := range []int{1, 2, 5} {
					runtime.GOMAXPROCS(procs)
					cb := upload(be, c0[:tc.m*tc.n])
					be.MatMul(cb, upload(be, a), upload(be, b), tc.m, tc.n, tc.k, tc.ta, tc.tb, 1)
					if want == nil {
						want = Host(cb)
					} else if !slices.EqualFunc(want, Host(cb), sameBits) {
						t.Fatalf("%v %+v: GOMAXPROCS=%d changes MatMul", p, tc, procs)
					}
				}
			}
		}
	}
}

// TestMatMulHalfOverflowInf: an fp16 operand beyond 65520 becomes Inf in the product's row,
// one at 65519 stays finite (65504), while bf16 keeps both finite.
func TestMatMulHalfOverflowInf(t *testing.T) {
	be := NewCPU()
	const m, n, k = 3, 40, 300
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = 1
	}
	for i := range b {
		b[i] = 0.5
	}
	a[0*k+290], a[1*k+7] = 70000, 65519
	for _, p := range []Precision{FP16, BF16} {
		be.SetMatMulPrecision(p)
		c := be.Alloc(m * n)
		be.MatMul(c, upload(be, a), upload(be, b), m, n, k, false, false, 0)
		got := Host(c)
		for j := 0; j < n; j++ {
			r0, r1, r2 := got[j], got[n+j], got[2*n+j]
			wantR1 := float32(299*0.5 + 65504*0.5)
			if p == BF16 {
				wantR1 = float32(299*0.5 + 65536*0.5) // 65519 rounds to 65536 in bf16
			}
			if p == FP16 && !math.IsInf(float64(r0), 1) || p == BF16 && r0 != float32(299*0.5+70144*0.5) || r1 != wantR1 || r2 != 150 {
				t.Fatalf("%v column %d: rows %v %v %v", p, j, r0, r1, r2)
			}
		}
	}
}

// BenchmarkMatMulPrecision: C = A·B at 1024³ through the Backend at each operand precision
// (the rounding happens while packing, so the GFLOP/s ratio to fp32 is its whole cost).
//
//	go test ./kernels -run xxx -bench 'MatMulPrecision|Half'
func BenchmarkMatMulPrecision(b *testing.B) {
	const s = 1024
	r := rand.New(rand.NewPCG(1, 2))
	be := NewCPU()
	a, bm, c := upload(be, randVec(r, s*s, 1)), upload(be, randVec(r, s*s, 1)), be.Alloc(s*s)
	for _, p := range []Precision{FP32, BF16, FP16} {
		b.Run(p.String(), func(b *testing.B) {
			be.SetMatMulPrecision(p)
			for b.Loop() {
				be.MatMul(c, a, bm, s, s, s, false, false, 0)
			}
			reportGFLOPs(b, 2*s*s*s*float64(b.N), "GFLOP/s")
		})
	}
}

// BenchmarkHalf: Round (in place), PackHalf and UnpackHalf over 4M elements; MB/s counts
// the float32 side (4 bytes per element).
func BenchmarkHalf(b *testing.B) {
	const n = 4 << 20
	r := rand.New(rand.NewPCG(3, 4))
	be := NewCPU()
	x := upload(be, randVec(r, n, 1))
	y := be.Alloc(n)
	packed := be.Alloc(n / 2)
	for _, p := range []Precision{BF16, FP16} {
		for _, op := range []struct {
			name string
			fn   func()
		}{
			{"round", func() { be.Round(y, p) }},
			{"pack", func() { be.PackHalf(packed, x, p) }},
			{"unpack", func() { be.UnpackHalf(y, packed, p) }},
		} {
			b.Run(p.String()+"/"+op.name, func(b *testing.B) {
				be.Copy(y, x)
				be.PackHalf(packed, x, p)
				b.SetBytes(4 * n)
				for b.Loop() {
					op.fn()
				}
			})
		}
	}
}
