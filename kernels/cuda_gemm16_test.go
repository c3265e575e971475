//go:build cuda

package kernels

// MatMulHalf on the CUDA backend: the cublasGemmEx call it makes (types, compute type,
// leading dimensions, operands, bounds) on the recording fake device, and its values against
// a float64 reference on a GPU.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/kernels/cuda"
)

// TestCUDAHostMatMulHalf drives MatMulHalf on the fake device for every transposition, both
// 16-bit formats and both C types, at sizes whose value counts are odd (a packed buffer of n
// values is (n+1)/2 elements, allocated exactly so that the fake's bounds check sees a read or
// write past the last value): one GEMM each, with A and B of the 16-bit type, C of that type
// or float32, CUBLAS_COMPUTE_32F, alpha 1 and the beta given, cuBLAS's A being MatMul's B
// (row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ), and the leading dimensions
// of the row-major storage in 16-bit values.
func TestCUDAHostMatMulHalf(t *testing.T) {
	c, f := newFakeCUDA(t)
	const m, n, k = 5, 3, 7 // m·k = 35, k·n = 21, m·n = 15 values: every buffer ends half-used
	for _, p := range []Precision{BF16, FP16} {
		for _, cHalf := range []bool{true, false} {
			for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				name := fmt.Sprintf("%v cHalf=%v transA=%v transB=%v", p, cHalf, tr[0], tr[1])
				a, b := c.Alloc((m*k+1)/2), c.Alloc((k*n+1)/2)
				cn := m * n
				if cHalf {
					cn = (m*n + 1) / 2
				}
				cb := c.Alloc(cn)
				beta := float32(0)
				if !cHalf {
					beta = 1 // a weight gradient's accumulation
				}
				before := len(f.gemms)
				c.MatMulHalf(cb, a, b, m, n, k, tr[0], tr[1], beta, p, cHalf)
				if len(f.gemms) != before+1 {
					t.Fatalf("%s: %d GEMMs, want 1", name, len(f.gemms)-before)
				}
				g, op, comp := f.gemms[before], f.gemmOps[before], f.computes[before]
				lda, ldb := leadingDims(m, n, k, tr[0], tr[1])
				ht, ctype := cuda.BFloat16, cuda.Float32
				if p == FP16 {
					ht = cuda.Half
				}
				if cHalf {
					ctype = ht
				}
				want := cuda.Gemm{TransA: tr[1], TransB: tr[0], M: n, N: m, K: k, LDA: ldb, LDB: lda, LDC: n,
					AType: ht, BType: ht, CType: ctype}
				if g != want || comp != cuda.ComputeFP32 {
					t.Errorf("%s: GEMM %+v compute %d, want %+v compute %d (CUBLAS_COMPUTE_32F)", name, g, comp, want, cuda.ComputeFP32)
				}
				if op.a != dbuf(b).ptr() || op.b != dbuf(a).ptr() || op.c != dbuf(cb).ptr() || op.alpha != 1 || op.beta != beta {
					t.Errorf("%s: GEMM of A %#x, B %#x, C %#x, alpha %g, beta %g; want MatMul's B %#x, A %#x, C %#x, 1, %g", name,
						op.a, op.b, op.c, op.alpha, op.beta, dbuf(b).ptr(), dbuf(a).ptr(), dbuf(cb).ptr(), beta)
				}
			}
		}
	}
	if got := c.Counters().MatMulFLOPs.Load(); got != 16*2*m*n*k {
		t.Errorf("MatMulFLOPs %d, want %d", got, 16*2*m*n*k)
	}

	// a slice of a packed buffer at element offset e starts at value 2e: its GEMM reads there
	big := c.Alloc((m*k+1)/2 + 3)
	a := c.Slice(big, 3, (m*k+1)/2)
	c.MatMulHalf(c.Alloc((m*n+1)/2), a, c.Alloc((k*n+1)/2), m, n, k, false, false, 0, BF16, true)
	if got := f.gemmOps[len(f.gemmOps)-1].b; got != dbuf(big).ptr()+12 {
		t.Errorf("A sliced at element 3: the GEMM reads %#x, want the buffer's start + 12 bytes (value 6)", got)
	}

	// k = 0: C = beta·C without a GEMM; a 16-bit C with beta 0 cleared, with another beta
	// widened, scaled and packed again
	l0, g0, m0 := len(f.launches), len(f.gemms), len(f.memsets)
	half := c.Alloc((m*n + 1) / 2)
	c.MatMulHalf(half, c.Alloc(0), c.Alloc(0), m, n, 0, false, false, 0, BF16, true)
	c.MatMulHalf(half, c.Alloc(0), c.Alloc(0), m, n, 0, false, false, 1, BF16, true)
	c.MatMulHalf(half, c.Alloc(0), c.Alloc(0), m, n, 0, false, false, 0.5, FP16, true)
	if len(f.gemms) != g0 || len(f.memsets) != m0+1 || f.memsets[m0].dst != dbuf(half).ptr() || f.memsets[m0].words != (m*n+1)/2 {
		t.Errorf("k = 0, beta 0: %d GEMMs, memsets %+v; want none and one clear of the %d words of C", len(f.gemms)-g0, f.memsets[m0:], (m*n+1)/2)
	}
	if got := strings.Join(f.names(l0), " "); got != "df_unpack_half df_scale df_pack_half" {
		t.Errorf("k = 0, beta 0.5 on a 16-bit C: launched %q, want df_unpack_half df_scale df_pack_half", got)
	}

	// the lengths are the packed ones, and the formats 16-bit
	mustPanic(t, "matmul A (packed) has 35 elements, want 18", func() {
		c.MatMulHalf(c.Alloc(m*n), c.Alloc(m*k), c.Alloc((k*n+1)/2), m, n, k, false, false, 0, BF16, false)
	})
	mustPanic(t, "matmul C has 8 elements, want 15", func() {
		c.MatMulHalf(c.Alloc((m*n+1)/2), c.Alloc((m*k+1)/2), c.Alloc((k*n+1)/2), m, n, k, false, false, 0, BF16, false)
	})
	mustPanic(t, "matmul needs bf16 or fp16, got fp32", func() {
		c.MatMulHalf(c.Alloc(m*n), c.Alloc(m*k), c.Alloc(k*n), m, n, k, false, false, 0, FP32, false)
	})
	// MatMul stays float32 storage with the FAST compute modes
	c.setPrecision(precBF16)
	c.MatMul(c.Alloc(m*n), c.Alloc(m*k), c.Alloc(k*n), m, n, k, false, true, 0)
	c.setPrecision(precFP32)
	if g, comp := f.gemms[len(f.gemms)-1], f.computes[len(f.computes)-1]; g.AType != cuda.Float32 || g.BType != cuda.Float32 ||
		g.CType != cuda.Float32 || comp != cuda.ComputeBF16 {
		t.Errorf("MatMul at bf16: types %v %v %v compute %d, want float32 storage with CUBLAS_COMPUTE_32F_FAST_16BF", g.AType, g.BType, g.CType, comp)
	}
}

// TestCUDAHostGemmChecks: the fake device (as cuBLAS) refuses a GEMM reaching past its
// operand's allocation by one 16-bit value, and cuda.Gemm.Check the combinations cuBLAS's
// COMPUTE_32F modes do not have.
func TestCUDAHostGemmChecks(t *testing.T) {
	c, f := newFakeCUDA(t)
	const m, n, k = 4, 3, 5
	a, b, cb := c.Alloc(m*k/2), c.Alloc((k*n+1)/2), c.Alloc(m*n/2)
	ok := cuda.Gemm{M: n, N: m, K: k, LDA: n, LDB: k, LDC: n, AType: cuda.BFloat16, BType: cuda.BFloat16, CType: cuda.BFloat16}
	if err := f.Gemm(ok, dbuf(b).ptr(), dbuf(a).ptr(), dbuf(cb).ptr(), 1, 0, cuda.ComputeFP32); err != nil {
		t.Fatalf("an in-bounds GEMM: %v", err)
	}
	over := ok
	over.LDB = k + 1 // A's last row then ends one value past its allocation
	if err := f.Gemm(over, dbuf(b).ptr(), dbuf(a).ptr(), dbuf(cb).ptr(), 1, 0, cuda.ComputeFP32); err == nil || !strings.Contains(err.Error(), "GEMM B") {
		t.Errorf("a GEMM reading past B: %v, want an out-of-bounds error", err)
	}
	f32c := ok
	f32c.CType = cuda.Float32 // a float32 C of m·n values does not fit in m·n/2 elements
	if err := f.Gemm(f32c, dbuf(b).ptr(), dbuf(a).ptr(), dbuf(cb).ptr(), 1, 0, cuda.ComputeFP32); err == nil || !strings.Contains(err.Error(), "GEMM C") {
		t.Errorf("a float32 C in a packed buffer: %v, want an out-of-bounds error", err)
	}
	for _, tc := range []struct {
		g       cuda.Gemm
		compute cuda.Compute
		err     string
	}{
		{cuda.Gemm{}, cuda.ComputeBF16, ""},
		{cuda.Gemm{AType: cuda.BFloat16, BType: cuda.BFloat16}, cuda.ComputeFP32, ""},
		{cuda.Gemm{AType: cuda.Half, BType: cuda.Half, CType: cuda.Half}, cuda.ComputeFP32, ""},
		{cuda.Gemm{AType: cuda.BFloat16, BType: cuda.Half}, cuda.ComputeFP32, "GEMM of bfloat16 A and half B"},
		{cuda.Gemm{AType: cuda.BFloat16, BType: cuda.BFloat16, CType: cuda.Half}, cuda.ComputeFP32, "into a half C"},
		{cuda.Gemm{AType: cuda.BFloat16, BType: cuda.BFloat16}, cuda.ComputeBF16, "take CUBLAS_COMPUTE_32F"},
		{cuda.Gemm{AType: cuda.Int32, BType: cuda.Int32}, cuda.ComputeFP32, "GEMM of int32 operands"},
		{cuda.Gemm{CType: cuda.BFloat16}, cuda.ComputeFP32, "GEMM of float operands into a bfloat16 C"},
	} {
		err := tc.g.Check(tc.compute)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v compute %d: %v, want %q", tc.g, tc.compute, err, tc.err)
		}
	}
	if cuda.BLASWorkspaceBytes(9) != 32<<20 || cuda.BLASWorkspaceBytes(8) != 4<<20 {
		t.Errorf("cuBLAS workspace %d (Hopper), %d (Ampere): want NVIDIA's 32 MiB and 4 MiB", cuda.BLASWorkspaceBytes(9), cuda.BLASWorkspaceBytes(8))
	}
}

// TestCUDAMatMulHalf compares MatMulHalf on the GPU with a float64 product of the same 16-bit
// values, for every transposition, both formats, both C types, beta 0 (C filled with NaN,
// which must be overwritten), 1 and 0.5, at sizes with odd value counts, and with A a slice one
// element into its buffer (4 bytes past a 16-byte boundary). Tolerance, per element:
// |Δ| ≤ 1e-5·(|op(A)|·|op(B)|)_ij + 1e-6·|beta·C|_ij for a float32 C (float32 accumulation in
// cuBLAS's order, k ≤ 257: a few units of 2^-24 per term, 1e-5 is ten times that), plus u·|ref|
// for a 16-bit C, u = 2^-8 (bf16) or 2^-11 (fp16): the one rounding of the sum, half a unit in
// the last place. A layout or transposition bug errs by O(|C|).
func TestCUDAMatMulHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 1))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {3, 5, 7}, {64, 48, 80}, {129, 65, 257}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, p := range []Precision{BF16, FP16} {
				for _, cHalf := range []bool{true, false} {
					for _, beta := range []float32{0, 1, 0.5} {
						name := fmt.Sprintf("%dx%dx%d_t%v%v_%v_cHalf%v_beta%g", s.m, s.n, s.k, tr[0], tr[1], p, cHalf, beta)
						checkMatMulHalf(t, d.gpu, r, name, s.m, s.n, s.k, tr[0], tr[1], beta, p, cHalf, s.m == 129)
					}
				}
			}
		}
	}
}

// checkMatMulHalf runs one MatMulHalf on be and checks it (TestCUDAMatMulHalf).
func checkMatMulHalf(t *testing.T, be *CUDA, r *rand.Rand, name string, m, n, k int, transA, transB bool, beta float32, p Precision,
	cHalf, sliced bool) {
	t.Helper()
	rnd, u := roundBF16Ref, math.Ldexp(1, -8)
	if p == FP16 {
		rnd, u = roundFP16Ref, math.Ldexp(1, -11)
	}
	exact := func(n int) []float32 {
		x := randVec(r, n, 1)
		for i := range x {
			x[i] = rnd(x[i])
		}
		return x
	}
	packed := func(x []float32) Buf { // x's 16-bit values packed on the device
		w := be.Alloc(len(x))
		be.Upload(w, x)
		h := be.Alloc((len(x) + 1) / 2)
		be.PackHalf(h, w, p)
		return h
	}
	a, b, c0 := exact(m*k), exact(k*n), exact(m*n)
	A, B := packed(a), packed(b)
	if sliced {
		big := be.Alloc(A.Len() + 1)
		A2 := be.Slice(big, 1, A.Len())
		be.Copy(A2, A)
		A = A2
	}
	cref := make([]float32, m*n)
	var C Buf
	switch {
	case beta == 0:
		nan := make([]float32, m*n)
		for i := range nan {
			nan[i] = math.Float32frombits(0xffffffff) // a NaN, and packed two 16-bit NaNs (0xffff) in either format
		}
		if cHalf {
			C = be.Alloc((m*n + 1) / 2)
			be.Upload(C, nan[:(m*n+1)/2])
		} else {
			C = be.Alloc(m * n)
			be.Upload(C, nan)
		}
	case cHalf:
		C, cref = packed(c0), c0
	default:
		C, cref = be.Alloc(m*n), c0
		be.Upload(C, c0)
	}
	be.MatMulHalf(C, A, B, m, n, k, transA, transB, beta, p, cHalf)
	got := make([]float32, m*n)
	if cHalf {
		w := be.Alloc(m * n)
		be.UnpackHalf(w, C, p)
		be.Download(got, w)
	} else {
		be.Download(got, C)
	}
	ref := refMatMul(cref, a, b, m, n, k, transA, transB, float64(beta))
	abs := func(x []float32) []float32 {
		y := make([]float32, len(x))
		for i, v := range x {
			y[i] = float32(math.Abs(float64(v)))
		}
		return y
	}
	bound := refMatMul(make([]float32, m*n), abs(a), abs(b), m, n, k, transA, transB, 0)
	worst := 0.0
	for i := range got {
		tol := 1e-5*bound[i] + 1e-6*math.Abs(float64(beta)*float64(cref[i])) + 1e-30
		if cHalf {
			tol += u * math.Abs(ref[i])
		}
		worst = math.Max(worst, math.Abs(float64(got[i])-ref[i])/tol)
	}
	if !(worst <= 1) {
		t.Errorf("%s: error %.3g × the tolerance", name, worst)
	}
}

// TestCUDAHostCalibrate: on the CUDA backend the profiler's GEMM ceiling is a 16-bit cuBLAS
// GEMM (bf16 A, B and C, CUBLAS_COMPUTE_32F), not MatMul's float32 storage, timed on the
// device's events (the fake's clock gives each GEMM a microsecond), and the ceilings name the
// GPU's catalogue peak.
func TestCUDAHostCalibrate(t *testing.T) {
	c, f := newFakeCUDA(t)
	c.info.name = "NVIDIA H200"
	k := Calibration{CopyElems: 4096, GEMM: 64, Reps: 2}
	ceil := Calibrate(c, TimerOf(c), k)
	if len(f.gemms) != 1+k.Reps {
		t.Fatalf("%d GEMMs, want %d", len(f.gemms), 1+k.Reps)
	}
	for i, g := range f.gemms {
		if g.AType != cuda.BFloat16 || g.BType != cuda.BFloat16 || g.CType != cuda.BFloat16 || f.computes[i] != cuda.ComputeFP32 ||
			g.M != 64 || g.N != 64 || g.K != 64 {
			t.Errorf("calibration GEMM %d: %+v compute %d, want 64³ of bf16 with CUBLAS_COMPUTE_32F", i, g, f.computes[i])
		}
	}
	if ceil.FLOPsPerSec != 2*64*64*64/1e-6 || ceil.GEMM != "64³ bf16" || ceil.PeakName != "H200" || ceil.PeakFLOPsPerSec != 989e12 {
		t.Errorf("ceilings %+v", ceil)
	}
}

// TestCUDAHostGemmTable checks the GEMM table and its benchmark without a GPU: the 18 shapes
// are the model's projections (model/ops.go: forward, input and weight gradient of y = x·Wᵀ)
// at the review's sizes, each product's FLOPs the review's GFLOP column; the benchmark, run on
// the fake device at 1/256 of the sizes, makes in each mode the GEMM it names (float32 storage
// with the FAST_16BF compute type; bf16 A, B, C with beta 0; bf16 A, B into a float32 C with
// the shape's beta) and writes the JSON the GPU check reads, every key of it; and
// bench/torch_gemm.py --dry lists the same shapes (with PyTorch: it is skipped without one,
// and fails under CI, which installs it).
func TestCUDAHostGemmTable(t *testing.T) {
	const tokens, dim, qdim, kv, ffn, vocab = 8192, 2048, 2048, 512, 5632, 32000
	review := map[string]float64{"q": 68.7, "kv": 17.2, "o": 68.7, "gate_up": 189, "down": 189, "head": 1074}
	var want []gemmShape
	for _, p := range []struct {
		role    string
		out, in int
		dxBeta  float32
	}{{"q", qdim, dim, 0}, {"kv", kv, dim, 1}, {"o", dim, qdim, 0}, {"gate_up", ffn, dim, 0}, {"down", dim, ffn, 0}, {"head", vocab, dim, 0}} {
		want = append(want,
			gemmShape{p.role + ".fwd", tokens, p.out, p.in, false, true, 0},        // linear: MatMul(y, x, w, n, out, in, false, true, 0)
			gemmShape{p.role + ".dX", tokens, p.in, p.out, false, false, p.dxBeta}, // gradX: MatMul(dx, dy, w, n, in, out, false, false, beta)
			gemmShape{p.role + ".dW", p.out, p.in, tokens, true, false, 1})         // gradW: MatMul(dw, dy, x, out, in, n, true, false, 1)
	}
	if !slices.Equal(gemmTable, want) {
		t.Errorf("gemmTable:\n%v\nwant\n%v", gemmTable, want)
	}
	for _, s := range gemmTable {
		g, w := 2*float64(s.M)*float64(s.N)*float64(s.K)/1e9, review[strings.Split(s.Role, ".")[0]]
		if math.Abs(g-w) > 0.005*w {
			t.Errorf("%s: %.1f GFLOP, the review's table says %g", s.Role, g, w)
		}
	}

	// the benchmark on the fake device, every size divided by 256
	c, f := newFakeCUDA(t)
	small := make([]gemmShape, len(gemmTable))
	for i, s := range gemmTable {
		small[i] = s
		small[i].M, small[i].N, small[i].K = max(s.M/256, 1), max(s.N/256, 1), max(s.K/256, 1)
	}
	out := filepath.Join(t.TempDir(), "gemm.json")
	g0 := len(f.gemms)
	bt := flag.Lookup("test.benchtime")
	old := bt.Value.String()
	if err := bt.Value.Set("3x"); err != nil { // the fake's GEMMs are free: bound the loops by count
		t.Fatal(err)
	}
	testing.Benchmark(func(b *testing.B) { gemmTableBench(b, c, small, out) })
	if err := bt.Value.Set(old); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3*len(small) {
		t.Fatalf("%d rows written, want %d", len(rows), 3*len(small))
	}
	keys := []string{"k", "m", "mode", "ms", "n", "role", "tflops", "transA", "transB"}
	for i, r := range rows {
		s, mode := small[i/3], gemmModes[i%3]
		if got := slices.Sorted(maps.Keys(r)); !slices.Equal(got, keys) {
			t.Fatalf("row %d has keys %v, want %v", i, got, keys)
		}
		// the fake's clock gives each GEMM a microsecond
		flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
		if r["role"] != s.Role || r["mode"] != mode || r["m"] != float64(s.M) || r["n"] != float64(s.N) || r["k"] != float64(s.K) ||
			r["transA"] != s.TransA || r["transB"] != s.TransB || r["ms"] != 1e-3 || math.Abs(r["tflops"].(float64)-flops/1e-6/1e12) > 1e-9 {
			t.Errorf("row %d: %v, want %s %s %d×%d×%d, 0.001 ms", i, r, s.Role, mode, s.M, s.N, s.K)
		}
	}
	// each sub-benchmark's GEMMs (its warm-up and its b.N) are its mode's
	byMode := map[string]int{}
	for i, g := range f.gemms[g0:] {
		op, comp := f.gemmOps[g0+i], f.computes[g0+i]
		var mode string
		switch {
		case g.AType == cuda.Float32 && g.CType == cuda.Float32 && comp == cuda.ComputeBF16:
			mode = gemmFP32Storage
		case g.AType == cuda.BFloat16 && g.CType == cuda.BFloat16 && comp == cuda.ComputeFP32 && op.beta == 0:
			mode = gemmBF16
		case g.AType == cuda.BFloat16 && g.CType == cuda.Float32 && comp == cuda.ComputeFP32:
			mode = gemmBF16F32C
		default:
			t.Fatalf("GEMM %d: %+v compute %d beta %g: no mode of the table", i, g, comp, op.beta)
		}
		byMode[mode]++
	}
	for _, m := range gemmModes {
		if byMode[m] < 2*len(small) {
			t.Errorf("mode %s: %d GEMMs for %d shapes", m, byMode[m], len(small))
		}
	}
	// beta: the shape's in fp32-storage and bf16-f32c (checked on the last product of each)
	for _, s := range small {
		c.setPrecision(precBF16)
		ops := newGemmTableBufs(c, s, rand.New(rand.NewPCG(1, 1)))
		for _, mode := range []string{gemmFP32Storage, gemmBF16F32C} {
			ops.run(c, s, mode)
			if b := f.gemmOps[len(f.gemmOps)-1].beta; b != s.Beta {
				t.Errorf("%s %s: beta %g, want %g", s.Role, mode, b, s.Beta)
			}
		}
		c.setPrecision(precFP32)
	}

	// bench/torch_gemm.py's shapes
	py := os.Getenv("DISTFLASH_TORCH_PYTHON")
	if py == "" {
		if d, err := os.UserCacheDir(); err == nil {
			py = filepath.Join(d, "distflash", "torch", "bin", "python")
		}
	}
	tout := filepath.Join(t.TempDir(), "torch.json")
	if b, err := exec.Command(py, filepath.Join("..", "bench", "torch_gemm.py"), "--dry", "--out", tout).CombinedOutput(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && !strings.Contains(string(b), "No module named 'torch'") {
			t.Fatalf("bench/torch_gemm.py --dry: %v\n%s", err, b)
		}
		msg := fmt.Sprintf("no PyTorch (%s: %v): bench/torch_gemm.py's shapes not compared (scripts/install_torch.sh installs it)", py, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	js, err = os.ReadFile(tout)
	if err != nil {
		t.Fatal(err)
	}
	var trows []gemmResult
	if err := json.Unmarshal(js, &trows); err != nil {
		t.Fatal(err)
	}
	if len(trows) != len(gemmTable) {
		t.Fatalf("bench/torch_gemm.py: %d rows, want %d", len(trows), len(gemmTable))
	}
	for i, r := range trows {
		s := gemmTable[i]
		if r.Role != s.Role || r.M != s.M || r.N != s.N || r.K != s.K || r.TransA != s.TransA || r.TransB != s.TransB || r.Mode != "torch-bf16" {
			t.Errorf("bench/torch_gemm.py row %d: %+v, want %+v in mode torch-bf16", i, r, s)
		}
	}
}
