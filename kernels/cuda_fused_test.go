//go:build cuda

package kernels

// The fused kernels (cuda_fused.go) and the per-op profile's event timer (cuda_timer.go):
// TestCUDAHost* drive them on the recording fake device (no GPU: launch geometry, arguments,
// argument checks, the events of the timer); TestCUDA* compare them with the CPU backend and
// with the unfused kernels on a GPU.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// lastLaunch is the fake's last launch, which must be of kernel name.
func lastLaunch(t *testing.T, f *fakeDevice, name string) fakeLaunch {
	t.Helper()
	if len(f.launches) == 0 || f.launches[len(f.launches)-1].name != name {
		t.Fatalf("launched %v, want %s last", f.names(max(len(f.launches)-3, 0)), name)
	}
	return f.launches[len(f.launches)-1]
}

// TestCUDAHostFusedKernels: each fused method launches its kernel once, with the geometry of
// the kernels it replaces and its buffers in the kernel's parameter order (the launch itself
// checks the types against the PTX), launches nothing on empty input, and refuses buffers of
// the wrong length with the CPU's messages.
func TestCUDAHostFusedKernels(t *testing.T) {
	c, f := newFakeCUDA(t)
	ptr := func(b Buf) uint64 { return uint64(dbuf(b).ptr()) }
	for _, s := range []struct{ rows, dim int }{{1, 1}, {300, 4097}, {5, 2048}} {
		n := s.rows * s.dim
		sum, out, rstd, a, b, w := c.Alloc(n), c.Alloc(n), c.Alloc(s.rows), c.Alloc(n), c.Alloc(n), c.Alloc(s.dim)
		c.AddRMSNorm(sum, out, rstd, a, b, w, s.rows, s.dim, 1e-5)
		l := lastLaunch(t, f, "df_add_rmsnorm")
		want := []uint64{ptr(sum), ptr(out), ptr(rstd), ptr(a), ptr(b), ptr(w), uint64(s.rows), uint64(s.dim), uint64(math.Float32bits(1e-5))}
		if l.gx != rowGrid(s.rows) || l.gy != 1 || l.bx != ewThreads || l.smem != 0 || !slices.Equal(l.args, want) {
			t.Errorf("%dx%d: launch %+v, want %d blocks of %d and args %v", s.rows, s.dim, l, rowGrid(s.rows), ewThreads, want)
		}
		c.AddRMSNorm(a, out, rstd, a, b, w, s.rows, s.dim, 1e-5) // sum aliasing a, as the model calls it
		if l := lastLaunch(t, f, "df_add_rmsnorm"); l.args[0] != l.args[3] {
			t.Errorf("aliased sum: %v", l.args)
		}
	}
	n0 := len(f.launches)
	c.AddRMSNorm(c.Alloc(0), c.Alloc(0), c.Alloc(0), c.Alloc(0), c.Alloc(0), c.Alloc(8), 0, 8, 1e-5)
	for _, n := range []int{1, 999, 1 << 21} {
		act, dg, du, do, g, u := c.Alloc(n), c.Alloc(n), c.Alloc(n), c.Alloc(n), c.Alloc(n), c.Alloc(n)
		c.SwiGLUBackwardAct(act, dg, du, do, g, u)
		l := lastLaunch(t, f, "df_swiglu_bwd_act")
		want := []uint64{ptr(act), ptr(dg), ptr(du), ptr(do), ptr(g), ptr(u), uint64(n)}
		if l.gx != ewGrid(n) || l.bx != ewThreads || !slices.Equal(l.args, want) {
			t.Errorf("swiglu %d: launch %+v, want %d blocks and args %v", n, l, ewGrid(n), want)
		}
	}
	if got := len(f.launches) - n0; got != 3 {
		t.Errorf("%d launches for three SwiGLU calls and an empty AddRMSNorm", got)
	}
	mustPanic(t, "add+rmsnorm b has 8 elements, want 16", func() {
		c.AddRMSNorm(c.Alloc(16), c.Alloc(16), c.Alloc(2), c.Alloc(16), c.Alloc(8), c.Alloc(8), 2, 8, 1)
	})
	mustPanic(t, "swiglu act has 5 elements, want 6", func() {
		c.SwiGLUBackwardAct(c.Alloc(5), c.Alloc(6), c.Alloc(6), c.Alloc(6), c.Alloc(6), c.Alloc(6))
	})

	// AdamWSegments: the table uploaded, one launch over the longest segment's grid
	const np = 1 << 20
	p, g, m, v := c.Alloc(np), c.Alloc(np), c.Alloc(np), c.Alloc(np)
	segs := []AdamWSegment{{0, 2048, false}, {2048, 600000, true}, {700000, 3, false}, {800000, 248576, true}}
	hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
	c.AdamWSegments(p, g, m, v, segs, hp)
	l := lastLaunch(t, f, "df_adamw_multi")
	table, longest := adamwSegTable(segs)
	if longest != 600000 || !slices.Equal(table, []int64{0, 2048, 0, 2048, 600000, 1, 700000, 3, 0, 800000, 248576, 1}) {
		t.Errorf("table %v, longest %d", table, longest)
	}
	if l.gx != ewGrid(longest) || l.bx != ewThreads || l.args[0] != ptr(p) || l.args[3] != ptr(v) || l.args[4] != uint64(c.segs.Ptr) ||
		l.args[5] != 4 || l.args[12] != uint64(math.Float32bits(0.5)) || l.args[13] != uint64(math.Float32bits(0.1)) {
		t.Errorf("adamw launch %+v", l)
	}
	n0 = len(f.launches)
	c.AdamWSegments(p, g, m, v, nil, hp)
	c.AdamWSegments(p, g, m, v, []AdamWSegment{{5, 0, true}}, hp)
	if len(f.launches) != n0 {
		t.Errorf("empty segments launched %v", f.names(n0))
	}
	mustPanic(t, "adamw segment 1 [10, 10+5): not after the previous one (ending at 12)", func() {
		c.AdamWSegments(p, g, m, v, []AdamWSegment{{2, 10, true}, {10, 5, true}}, hp)
	})
	mustPanic(t, "adamw segment 0 [1048570, 1048570+10)", func() { c.AdamWSegments(p, g, m, v, []AdamWSegment{{np - 6, 10, true}}, hp) })
	mustPanic(t, "adamw m has 5 elements", func() { c.AdamWSegments(p, g, c.Alloc(5), v, segs, hp) })
}

// TestCUDAHostOpTimer: the event timer on the fake device (whose clock counts a microsecond
// per launch or GEMM): each mark records an event, Times reads each after the first, Reset
// reuses the events; and a per-op profile of backend calls through it.
func TestCUDAHostOpTimer(t *testing.T) {
	c, f := newFakeCUDA(t)
	tm := TimerOf(c)
	if _, ok := tm.(*cudaTimer); !ok {
		t.Fatalf("TimerOf(CUDA) is %T", tm)
	}
	x := c.Alloc(1000)
	for round := range 2 {
		tm.Reset()
		tm.Mark()
		c.Add(x, x, x)
		c.Scale(x, 2)
		tm.Mark()
		tm.Mark()
		c.MatMul(c.Alloc(4), c.Alloc(6), c.Alloc(6), 2, 2, 3, false, false, 0)
		tm.Mark()
		if got := tm.Times(); !slices.Equal(got, []float64{0, 2e-6, 2e-6, 3e-6}) {
			t.Errorf("round %d: times %v", round, got)
		}
		if f.events != 4 {
			t.Errorf("round %d: %d events made, want 4 (reused after Reset)", round, f.events)
		}
	}
	p := NewOpProfile(tm, Ceilings{BytesPerSec: 1e12, FLOPsPerSec: 1e15})
	p.BeginStep()
	p.Begin(OpResidual, PhaseForward)
	c.Add(x, x, x)
	p.End(AddCost(1000))
	c.Scale(x, 3) // outside every op: a gap of one launch
	p.Begin(OpSwiGLU, PhaseBackward)
	c.SwiGLUBackwardAct(x, x, x, x, x, x)
	p.End(SwiGLUBackwardActCost(1000))
	p.EndStep()
	tab := p.Table(c.Device())
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-15 }
	if !near(tab.StepSeconds, 3e-6) || !near(tab.GapSeconds, 1e-6) || len(tab.Rows) != 3 || tab.Rows[0].Op != "swiglu" ||
		!near(tab.Rows[0].Seconds, 1e-6) || tab.Rows[1].Op != "residual" || !near(tab.Rows[1].Seconds, 1e-6) {
		t.Errorf("table %+v", tab)
	}
	if tab.Device != "fake (sm_90, 132 SMs)" {
		t.Errorf("device %q", tab.Device)
	}
}

// gpuSame fails unless each pair of GPU buffers (fused, unfused) is bit-identical.
func gpuSame(t *testing.T, g *CUDA, what string, pairs ...[2]Buf) {
	t.Helper()
	for _, pair := range pairs {
		x, y := make([]float32, pair[0].Len()), make([]float32, pair[1].Len())
		g.Download(x, pair[0])
		g.Download(y, pair[1])
		if i := firstDiff(x, y); i >= 0 {
			t.Errorf("%s: element %d: fused %g, unfused %g", what, i, x[i], y[i])
		}
	}
}

func TestCUDAAddRMSNorm(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(36, 2))
	for _, s := range []struct{ rows, dim int }{{1, 1}, {7, 64}, {300, 4097}, {64, 2048}} {
		name := fmt.Sprintf("%dx%d", s.rows, s.dim)
		n := s.rows * s.dim
		av, bv, wv := randVec(r, n, 2), randVec(r, n, 1), randVec(r, s.dim, 1)
		a, b, w := d.buf(av), d.buf(bv), d.buf(wv)
		sum, out, rstd := d.zeros(n), d.zeros(n), d.zeros(s.rows)
		d.each(func(be Backend, i int) { be.AddRMSNorm(sum[i], out[i], rstd[i], a[i], b[i], w[i], s.rows, s.dim, 1e-5) })
		d.exact(t, name+" sum", sum)
		d.closeElem(t, name+" out", out, 1e-6, 1e-6)
		d.closeElem(t, name+" rstd", rstd, 1e-6, 0)
		// on the GPU, bit for bit the unfused kernels, with the sum aliasing a
		g := d.gpu
		h, o2, r2 := g.Alloc(n), g.Alloc(n), g.Alloc(s.rows)
		g.Upload(h, av)
		g.Add(h, h, b[1])
		g.RMSNorm(o2, r2, h, w[1], s.rows, s.dim, 1e-5)
		g.AddRMSNorm(a[1], out[1], rstd[1], a[1], b[1], w[1], s.rows, s.dim, 1e-5)
		gpuSame(t, g, name, [2]Buf{a[1], h}, [2]Buf{out[1], o2}, [2]Buf{rstd[1], r2})
	}
}

func TestCUDASwiGLUBackwardAct(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(36, 3))
	const n = 100003
	gv := randVec(r, n, 8)
	gv[0], gv[1], gv[2] = 0, 90, -90
	gate, up, dout := d.buf(gv), d.buf(randVec(r, n, 1)), d.buf(randVec(r, n, 1))
	act, dg, du := d.buf(randVec(r, n, 1)), d.buf(randVec(r, n, 1)), d.buf(randVec(r, n, 1)) // overwritten
	d.each(func(be Backend, i int) { be.SwiGLUBackwardAct(act[i], dg[i], du[i], dout[i], gate[i], up[i]) })
	d.closeElem(t, "act", act, 1e-6, 1e-6)
	d.closeElem(t, "dgate", dg, 1e-6, 1e-6)
	d.closeElem(t, "dup", du, 1e-6, 1e-6)
	g := d.gpu
	act2, dg2, du2 := g.Alloc(n), g.Alloc(n), g.Alloc(n)
	g.SwiGLU(act2, gate[1], up[1])
	g.SwiGLUBackward(dg2, du2, dout[1], gate[1], up[1])
	gpuSame(t, g, "swiglu act, dgate, dup", [2]Buf{act[1], act2}, [2]Buf{dg[1], dg2}, [2]Buf{du[1], du2})
}

func TestCUDAAdamWSegments(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(36, 4))
	const n = 300000
	segs := []AdamWSegment{{0, 2048, false}, {2048, 200000, true}, {202048, 7, false}, {250000, 50000, true}}
	p0 := randVec(r, n, 1)
	p, m, v := d.buf(p0), d.zeros(n), d.zeros(n)
	g := d.gpu
	p2, m2, v2 := g.Alloc(n), g.Alloc(n), g.Alloc(n)
	g.Upload(p2, p0)
	for step := int64(1); step <= 3; step++ {
		gr := d.buf(randVec(r, n, 1e-2))
		hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: 0.7}
		d.each(func(be Backend, i int) { be.AdamWSegments(p[i], gr[i], m[i], v[i], segs, hp) })
		for _, s := range segs {
			g.AdamW(g.Slice(p2, s.Off, s.N), g.Slice(gr[1], s.Off, s.N), g.Slice(m2, s.Off, s.N), g.Slice(v2, s.Off, s.N), hp, s.Decay)
		}
	}
	d.closeElem(t, "p", p, 1e-6, 1e-12)
	d.closeElem(t, "m", m, 1e-6, 1e-12)
	d.closeElem(t, "v", v, 1e-6, 1e-20)
	gpuSame(t, g, "one launch against one per segment: p, m, v", [2]Buf{p[1], p2}, [2]Buf{m[1], m2}, [2]Buf{v[1], v2})
}

// TestCUDAOpTimer: the events on a GPU give increasing times, and a copy of 256 MiB takes
// between 0.02 ms (a bandwidth 10× any GPU's) and 100 ms.
func TestCUDAOpTimer(t *testing.T) {
	g := gpu(t)
	tm := TimerOf(g)
	src, dst := g.Alloc(32<<20), g.Alloc(32<<20)
	for range 2 {
		tm.Reset()
		tm.Mark()
		g.Copy(dst, src)
		tm.Mark()
		g.Copy(dst, src)
		g.Copy(dst, src)
		tm.Mark()
		ts := tm.Times()
		if len(ts) != 3 || !(ts[1] > 2e-5 && ts[1] < 0.1) || !(ts[2] > ts[1]) {
			t.Errorf("times %v", ts)
		}
	}
	c := Calibrate(g, tm, CalibrationFor(g))
	t.Logf("%s: %.0f GB/s copy, %.1f TFLOP/s %s GEMM (catalogue %s: %.0f)", g.Device(), c.BytesPerSec/1e9, c.FLOPsPerSec/1e12, c.GEMM, c.PeakName, c.PeakFLOPsPerSec/1e12)
	if c.BytesPerSec < 1e11 || c.FLOPsPerSec < 1e12 {
		t.Errorf("ceilings %+v", c)
	}
}
