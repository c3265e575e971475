package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestOpProfileBookkeeping: spans per class and phase, nested brackets (only the outermost
// counts), ops outside a step (not timed), gaps, floors and the text.
func TestOpProfileBookkeeping(t *testing.T) {
	ft := NewTickTimer(1e-3)
	p := NewOpProfile(ft, Ceilings{BytesPerSec: 1e9, FLOPsPerSec: 1e12, Source: "test"})
	p.Begin(OpGemmQ, PhaseForward) // outside a step: nothing
	p.End(OpCost{1, 1})
	if ft.Marked() != 0 || p.Active() {
		t.Fatalf("%d marks outside a step", ft.Marked())
	}
	var nilProfile *OpProfile
	nilProfile.BeginStep()
	nilProfile.Begin(OpGemmQ, PhaseForward)
	nilProfile.End(OpCost{})
	nilProfile.EndStep()
	gemm := MatMulCost(64, 32, 16, 0)
	for range 2 {
		p.BeginStep()
		p.Begin(OpGemmQ, PhaseForward)
		p.End(gemm)
		p.Begin(OpAttention, PhaseBackward)
		p.Begin(OpComm, PhaseStep) // nested: attention's time
		p.End(OpCost{Bytes: 1 << 20})
		p.End(OpCost{Bytes: 3e6, FLOPs: 5e9})
		p.Begin(OpSwiGLU, PhaseBackward)
		p.End(SwiGLUCost(1000))
		p.Begin(OpSwiGLU, PhaseBackward)
		p.End(SwiGLUCost(1000))
		p.EndStep()
	}
	if want := 2 * (2 + 2*4); ft.Marked() != want {
		t.Errorf("%d marks, want %d", ft.Marked(), want)
	}
	tab := p.Table("fake")
	if tab.Steps != 2 || math.Abs(tab.StepSeconds-9e-3) > 1e-15 || math.Abs(tab.GapSeconds-5e-3) > 1e-15 {
		t.Errorf("steps %d, step %g s, gaps %g s; want 2, 9 ms (marks 0..9), 5 ms", tab.Steps, tab.StepSeconds, tab.GapSeconds)
	}
	want := []OpRow{
		{Op: "gemm.q", Phase: "fwd", Calls: 1, Seconds: 1e-3, Bytes: float64(gemm.Bytes), FLOPs: float64(gemm.FLOPs)},
		{Op: "attention", Phase: "bwd", Calls: 1, Seconds: 1e-3, Bytes: 3e6, FLOPs: 5e9},
		{Op: "swiglu", Phase: "bwd", Calls: 2, Seconds: 2e-3, Bytes: 24000, FLOPs: 10000},
		{Op: "gaps", Phase: "step", Seconds: 5e-3},
	}
	// floors: the GEMM's bytes at 1 GB/s (its FLOPs at 1 TFLOP/s take less); attention's 5e9
	// FLOPs at 1 TFLOP/s (5 ms) above its 3e6 bytes (3 ms); SwiGLU's bytes only
	want[0].FloorSeconds = float64(gemm.Bytes) / 1e9
	want[1].FloorSeconds = 5e-3
	want[2].FloorSeconds = 24000 / 1e9
	for i := range 3 {
		want[i].Ratio = want[i].Seconds / want[i].FloorSeconds
	}
	if len(tab.Rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", tab.Rows, want)
	}
	for i, r := range tab.Rows {
		w := want[i]
		if r.Op != w.Op || r.Phase != w.Phase || r.Calls != w.Calls || math.Abs(r.Seconds-w.Seconds) > 1e-15 || r.Bytes != w.Bytes ||
			r.FLOPs != w.FLOPs || math.Abs(r.FloorSeconds-w.FloorSeconds) > 1e-15 || math.Abs(r.Ratio-w.Ratio) > 1e-9*w.Ratio {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
	}
	text := tab.Text()
	for _, s := range []string{"per-op profile of 2 steps on fake: 9.000 ms a step", "floors (test): bytes at 1 GB/s, GEMM and attention FLOPs at 1 TFLOP/s",
		"attention    bwd             1      1.000  11.1%        3.0       5.000", "gaps         step                   5.000  55.6%",
		"ops          all             4      4.000  44.4%"} {
		if !strings.Contains(text, s) {
			t.Errorf("text lacks %q:\n%s", s, text)
		}
	}
}

// TestCalibrate: the ceilings are the copy's bytes (read and written) and the product's FLOPs
// over the fastest repetition, on the timer's clock.
func TestCalibrate(t *testing.T) {
	ft := NewTickTimer(2e-3)
	k := Calibration{CopyElems: 1000, GEMM: 10, Reps: 3}
	c := Calibrate(NewCPU(), ft, k)
	if c.Source != "measured" || c.BytesPerSec != 8000/2e-3 || math.Abs(c.FLOPsPerSec-2000/2e-3) > 1e-6 {
		t.Errorf("ceilings %+v, want 4e6 B/s and 1e6 FLOP/s", c)
	}
	if ft.Marked() != 1+2*k.Reps {
		t.Errorf("%d marks, want %d", ft.Marked(), 1+2*k.Reps)
	}
	host := TimerOf(NewCPU())
	host.Mark()
	host.Mark()
	if ts := host.Times(); len(ts) != 2 || ts[0] != 0 || ts[1] < 0 {
		t.Errorf("host timer: %v", ts)
	}
	host.Reset()
	if len(host.Times()) != 0 {
		t.Errorf("host timer keeps its marks after Reset")
	}
}

// copyWatch is the CPU backend noting, at each Copy, whether the source had been written with
// values that are not 0 and the destination written at all (Calibrate's buffers, first use).
type copyWatch struct {
	*CPU
	copies, srcUnwritten, dstUnwritten int
	written                            map[*float32]bool // the first element of each buffer written
}

func (w *copyWatch) Upload(dst Buf, src []float32) {
	w.CPU.Upload(dst, src)
	w.written[&f(dst)[0]] = true
}

func (w *copyWatch) Zero(b Buf) {
	w.CPU.Zero(b)
	w.written[&f(b)[0]] = true
}

func (w *copyWatch) Copy(dst, src Buf) {
	if w.copies++; w.copies == 1 {
		s := f(src)
		if !w.written[&s[0]] || slices.Contains(s, 0) {
			w.srcUnwritten++
		}
		if !w.written[&f(dst)[0]] {
			w.dstUnwritten++
		}
	}
	w.CPU.Copy(dst, src)
}

// TestCalibrateWritesFirst: the copy's buffers are written before they are timed, the source
// with no 0 in it (memory never written reads as one cached page of zeros: the ceiling came
// out 3.4 times a real copy's), across chunks of the fill.
func TestCalibrateWritesFirst(t *testing.T) {
	w := &copyWatch{CPU: NewCPU(), written: map[*float32]bool{}}
	Calibrate(w, NewTickTimer(1e-3), Calibration{CopyElems: 1<<20 + 5, GEMM: 4, Reps: 2})
	if w.copies != 3 || w.srcUnwritten != 0 || w.dstUnwritten != 0 {
		t.Errorf("%d copies; the first with its source unwritten or holding 0: %d, its destination unwritten: %d", w.copies, w.srcUnwritten, w.dstUnwritten)
	}
}

// gemmWatch is the CPU backend naming a GPU and noting the products asked of it.
type gemmWatch struct {
	*CPU
	device  string
	matmuls int
	halves  []halfGemm
}

// halfGemm is one MatMulHalf: its sizes, format, C type, and whether every 16-bit value of A
// and B is finite and not 0.
type halfGemm struct {
	m, n, k   int
	p         Precision
	cHalf     bool
	nonZeroAB bool
}

func (w *gemmWatch) DeviceName() string { return w.device }

func (w *gemmWatch) MatMul(c, a, b Buf, m, n, k int, transA, transB bool, beta float32) {
	w.matmuls++
	w.CPU.MatMul(c, a, b, m, n, k, transA, transB, beta)
}

func (w *gemmWatch) MatMulHalf(c, a, b Buf, m, n, k int, transA, transB bool, beta float32, p Precision, cHalf bool) {
	ok := true
	s := w.CPU.scratch()
	defer s.free()
	for _, x := range [][]float32{s.widen("a", a, m*k, p), s.widen("b", b, k*n, p)} {
		for _, v := range x {
			ok = ok && v != 0 && !math.IsInf(float64(v), 0) && !math.IsNaN(float64(v))
		}
	}
	w.halves = append(w.halves, halfGemm{m, n, k, p, cHalf, ok})
	w.CPU.MatMulHalf(c, a, b, m, n, k, transA, transB, beta, p, cHalf)
}

// TestCalibrateHalfGEMM: the GEMM ceiling is a 16-bit-operand product (MatMulHalf, C 16-bit;
// fp16 when the run's MatMul precision is fp16, else bf16), never MatMul's float32 storage, on
// operands written with values that are not 0; the ceilings name the GPU's catalogue peak, and
// the table's text says both.
func TestCalibrateHalfGEMM(t *testing.T) {
	k := Calibration{CopyElems: 1000, GEMM: 8, Reps: 3}
	for _, tc := range []struct {
		prec, want Precision
	}{{FP32, BF16}, {BF16, BF16}, {FP16, FP16}} {
		w := &gemmWatch{CPU: NewCPU(), device: "NVIDIA H100 80GB HBM3"}
		w.SetMatMulPrecision(tc.prec)
		c := Calibrate(w, NewTickTimer(1e-3), k)
		if w.matmuls != 0 || len(w.halves) != 1+k.Reps {
			t.Errorf("precision %v: %d MatMul and %d MatMulHalf calls, want none and %d", tc.prec, w.matmuls, len(w.halves), 1+k.Reps)
		}
		for _, h := range w.halves {
			if h != (halfGemm{8, 8, 8, tc.want, true, true}) {
				t.Errorf("precision %v: MatMulHalf %+v, want 8³ in %v into a 16-bit C, operands finite and not 0", tc.prec, h, tc.want)
			}
		}
		if c.GEMM != "8³ "+tc.want.String() || c.FLOPsPerSec != 2*512/1e-3 || c.PeakName != "H100 SXM" || c.PeakFLOPsPerSec != 989e12 {
			t.Errorf("precision %v: ceilings %+v", tc.prec, c)
		}
		text := OpTable{Device: "gpu", Ceil: c}.Text()
		for _, want := range []string{"GEMM and attention FLOPs at 1.024e-06 TFLOP/s (a 8³ " + tc.want.String() + " GEMM)",
			"catalogue: H100 SXM, dense bf16 peak 989 TFLOP/s (the measured GEMM rate is 0% of it)"} {
			if !strings.Contains(text, want) {
				t.Errorf("text lacks %q:\n%s", want, text)
			}
		}
	}
	if c := Calibrate(NewCPU(), NewTickTimer(1e-3), k); c.PeakName != "" || c.PeakFLOPsPerSec != 0 ||
		strings.Contains(OpTable{Ceil: c}.Text(), "catalogue") {
		t.Errorf("the CPU backend names no catalogue peak: %+v", c)
	}
}

// TestCataloguePeak: the dense bf16 peaks by the names the driver gives, the variants of
// another peak not named.
func TestCataloguePeak(t *testing.T) {
	for _, tc := range []struct {
		device, name string
		tflops       float64
	}{
		{"NVIDIA H100 80GB HBM3", "H100 SXM", 989},
		{"NVIDIA H100 SXM5 80GB", "H100 SXM", 989},
		{"NVIDIA H100 PCIe", "H100 PCIe", 756},
		{"NVIDIA H200", "H200", 989},
		{"NVIDIA GH200 480GB", "GH200", 989},
		{"NVIDIA A100-SXM4-80GB", "A100", 312},
		{"NVIDIA A100 80GB PCIe", "A100", 312},
		{"NVIDIA L40S", "L40S", 362},
		{"NVIDIA GeForce RTX 4090", "RTX 4090", 165},
		{"NVIDIA H100 NVL", "", 0},
		{"NVIDIA H200 NVL", "", 0},
		{"NVIDIA L40", "", 0},
		{"NVIDIA GeForce RTX 3090", "", 0},
		{"fake", "", 0},
	} {
		name, flops := CataloguePeak(tc.device)
		if name != tc.name || flops != tc.tflops*1e12 {
			t.Errorf("CataloguePeak(%q) = %q, %g; want %q, %g", tc.device, name, flops, tc.name, tc.tflops*1e12)
		}
	}
}

// TestCalibrationFor: the CPU copies two buffers each 4 times the last-level cache, within
// 128–512 MiB; the cache is read from sysfs (testdata/cache: this machine's, an AMD EPYC's).
func TestCalibrationFor(t *testing.T) {
	if got := lastLevelCache("testdata/cache"); got != 32<<20 {
		t.Errorf("last-level cache of testdata/cache: %d, want 32 MiB (index3, level 3, Unified)", got)
	}
	if got := lastLevelCache(t.TempDir()); got != 0 {
		t.Errorf("no caches described: %d, want 0", got)
	}
	for _, tc := range []struct {
		in   string
		want int64
	}{{"32768K", 32 << 20}, {"1M", 1 << 20}, {"512", 512}, {"x", 0}, {"", 0}} {
		if got := cacheSize(tc.in); got != tc.want {
			t.Errorf("cacheSize(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
	k := CalibrationFor(NewCPU())
	bytes, want := int64(4*k.CopyElems), min(max(4*LastLevelCache(), 128<<20), 512<<20)
	if bytes != want || k.Reps < 3 {
		t.Errorf("CPU calibration %+v: %d bytes a buffer, want %d (last-level cache %d)", k, bytes, want, LastLevelCache())
	}
}

// TestOpCosts: each method's bytes and FLOPs, written out for one size.
func TestOpCosts(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  OpCost
		want OpCost
	}{
		{"matmul", MatMulCost(2, 3, 4, 0), OpCost{4 * (6 + 8 + 12), 48}},
		{"matmul beta 1", MatMulCost(2, 3, 4, 1), OpCost{4 * (6 + 8 + 12 + 6), 48}},
		{"rmsnorm", RMSNormCost(3, 5), OpCost{4 * (30 + 5 + 3), 60}},
		{"rmsnorm bwd", RMSNormBackwardCost(3, 5), OpCost{4 * (60 + 15 + 3), 150}},
		{"add+rmsnorm", AddRMSNormCost(3, 5), OpCost{4 * (60 + 5 + 3), 75}},
		{"rope", RoPECost(3, 2, 8), OpCost{4 * (96 + 3), 144}},
		{"swiglu", SwiGLUCost(7), OpCost{84, 35}},
		{"swiglu bwd", SwiGLUBackwardCost(7), OpCost{140, 70}},
		{"swiglu bwd act", SwiGLUBackwardActCost(7), OpCost{168, 84}},
		{"add", AddCost(7), OpCost{84, 7}},
		{"zero", ZeroCost(7), OpCost{28, 0}},
		{"half", HalfCost(7), OpCost{42, 7}},
		{"embedding", EmbeddingCost(3, 5, false), OpCost{4 * (30 + 3), 0}},
		{"embedding bwd", EmbeddingCost(3, 5, true), OpCost{4 * (45 + 3), 15}},
		{"loss", CrossEntropyCost(3, 10, false), OpCost{4 * (30 + 9), 90}},
		{"loss grad", CrossEntropyCost(3, 10, true), OpCost{4 * (60 + 9), 150}},
		{"adamw", AdamWCost(7), OpCost{196, 119}},
		{"attention", AttnCost(AttnShape{NQ: 4, NK: 6, Heads: 4, KVHeads: 2, HeadDim: 8}, false, 99), OpCost{4 * (2*128 + 2*96 + 16), 99}},
		{"attention bwd", AttnCost(AttnShape{NQ: 4, NK: 6, Heads: 4, KVHeads: 2, HeadDim: 8}, true, 99), OpCost{4 * (5*128 + 6*96 + 16), 99}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, tc.got, tc.want)
		}
	}
	if got := MatMulCost(2, 3, 4, 0).Plus(ZeroCost(1)); got != (OpCost{108, 48}) {
		t.Errorf("Plus: %+v", got)
	}
	for c := range numOpClasses {
		if strings.HasPrefix(c.String(), "OpClass") || c.computeBound() != (strings.HasPrefix(c.String(), "gemm.") || c == OpAttention) {
			t.Errorf("class %d: %q, compute-bound %v", c, c, c.computeBound())
		}
	}
	if PhaseRecompute.String() != "recompute" || Phase(9).String() != "Phase(9)" || OpClass(99).String() != "OpClass(99)" {
		t.Errorf("names: %v %v %v", PhaseRecompute, Phase(9), OpClass(99))
	}
}

// TestFusedMatchUnfused: each fused method gives, bit for bit, what the calls it fuses give,
// on both CPU backends (the model's results do not change where it calls them).
func TestFusedMatchUnfused(t *testing.T) {
	r := rand.New(rand.NewPCG(36, 1))
	for _, be := range []*CPU{NewCPU(), NewDeviceCPU()} {
		get := func(b Buf) []float32 {
			x := make([]float32, b.Len())
			be.Download(x, b)
			return x
		}
		buf := func(x []float32) Buf {
			b := be.Alloc(len(x))
			be.Upload(b, x)
			return b
		}
		same := func(what string, a, b Buf) {
			t.Helper()
			x, y := get(a), get(b)
			for i := range x {
				if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
					t.Fatalf("%s %s: element %d: fused %g, unfused %g", be.Name(), what, i, x[i], y[i])
				}
			}
		}
		for _, s := range []struct{ rows, dim int }{{1, 1}, {7, 64}, {33, 130}} {
			n := s.rows * s.dim
			a, b, w := randVec(r, n, 3), randVec(r, n, 1), randVec(r, s.dim, 1)
			// unfused: Add, then RMSNorm
			h1, o1, r1 := buf(a), be.Alloc(n), be.Alloc(s.rows)
			be.Add(h1, h1, buf(b))
			be.RMSNorm(o1, r1, h1, buf(w), s.rows, s.dim, 1e-5)
			// fused, sum aliasing a (as the model calls it), and into a separate buffer
			h2, o2, r2 := buf(a), be.Alloc(n), be.Alloc(s.rows)
			be.AddRMSNorm(h2, o2, r2, h2, buf(b), buf(w), s.rows, s.dim, 1e-5)
			same("add+rmsnorm sum", h2, h1)
			same("add+rmsnorm out", o2, o1)
			same("add+rmsnorm rstd", r2, r1)
			h3 := be.Alloc(n)
			be.AddRMSNorm(h3, o2, r2, buf(a), buf(b), buf(w), s.rows, s.dim, 1e-5)
			same("add+rmsnorm separate sum", h3, h1)
		}
		const n = 10007
		g, u, d := randVec(r, n, 8), randVec(r, n, 1), randVec(r, n, 1)
		g[0], g[1], g[2] = 0, 90, -90 // exp(±90): saturated sigmoids
		act1, dg1, du1 := be.Alloc(n), be.Alloc(n), be.Alloc(n)
		be.SwiGLU(act1, buf(g), buf(u))
		be.SwiGLUBackward(dg1, du1, buf(d), buf(g), buf(u))
		act2, dg2, du2 := be.Alloc(n), be.Alloc(n), be.Alloc(n)
		be.SwiGLUBackwardAct(act2, dg2, du2, buf(d), buf(g), buf(u))
		same("swiglu act", act2, act1)
		same("swiglu dgate", dg2, dg1)
		same("swiglu dup", du2, du1)

		const np = 1000
		segs := []AdamWSegment{{0, 100, true}, {100, 3, false}, {200, 500, true}, {900, 100, false}}
		p0, g0 := randVec(r, np, 1), randVec(r, np, 1e-2)
		p1, m1, v1, p2, m2, v2 := buf(p0), be.Alloc(np), be.Alloc(np), buf(p0), be.Alloc(np), be.Alloc(np)
		gb := buf(g0)
		for step := int64(1); step <= 3; step++ {
			hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: 0.7}
			for _, s := range segs {
				be.AdamW(be.Slice(p1, s.Off, s.N), be.Slice(gb, s.Off, s.N), be.Slice(m1, s.Off, s.N), be.Slice(v1, s.Off, s.N), hp, s.Decay)
			}
			be.AdamWSegments(p2, gb, m2, v2, segs, hp)
		}
		same("adamw p", p2, p1)
		same("adamw m", m2, m1)
		same("adamw v", v2, v1)
		if got := get(p2); !slices.Equal(got[700:900], p0[700:900]) {
			t.Errorf("%s: AdamWSegments changed parameters outside its segments", be.Name())
		}
		for _, bad := range [][]AdamWSegment{{{0, 10, true}, {5, 10, true}}, {{0, 10, true}, {995, 10, true}}, {{-1, 1, true}}, {{3, -1, true}}} {
			mustPanicCPU(t, "kernels: adamw segment", func() { be.AdamWSegments(p2, gb, m2, v2, bad, AdamWStep{Step: 1}) })
		}
	}
}

// mustPanicCPU fails unless fn panics with a message containing want.
func mustPanicCPU(t *testing.T, want string, fn func()) {
	t.Helper()
	defer func() {
		if r, _ := recover().(string); !strings.Contains(r, want) {
			t.Errorf("recovered %q, want a panic containing %q", r, want)
		}
	}()
	fn()
}
