package optim

import (
	"math"
	"testing"

	"distflash/kernels"
)

func TestScheduleShape(t *testing.T) {
	for _, kind := range []string{"cosine", "linear", "constant"} {
		s := Schedule{Kind: kind, LR: 1e-3, MinLR: 1e-4, Warmup: 10, Steps: 100}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := s.At(0); math.Abs(got-1e-4) > 1e-12 {
			t.Errorf("%s: first warmup lr %g, want 1e-4", kind, got)
		}
		if got := s.At(9); math.Abs(got-1e-3) > 1e-12 {
			t.Errorf("%s: end of warmup %g, want 1e-3", kind, got)
		}
		want := 1e-4
		if kind == "constant" {
			want = 1e-3
		}
		if got := s.At(99); math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: last step lr %g, want %g", kind, got, want)
		}
		for st := 10; st < 99; st++ {
			if s.At(st+1) > s.At(st)+1e-15 {
				t.Fatalf("%s: lr rises after warmup at step %d", kind, st)
			}
		}
	}
	// cosine midpoint is the mean of lr and min_lr
	s := Schedule{Kind: "cosine", LR: 1, MinLR: 0, Warmup: 0, Steps: 101}
	if got := s.At(50); math.Abs(got-0.5) > 1e-12 {
		t.Errorf("cosine midpoint %g, want 0.5", got)
	}
	for _, bad := range []Schedule{{Kind: "step", LR: 1, Steps: 1}, {Kind: "cosine", LR: 1, MinLR: 2, Steps: 1}, {Kind: "cosine", LR: 0, Steps: 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func TestClip(t *testing.T) {
	be := kernels.NewCPU()
	g := be.Alloc(4)
	be.Upload(g, []float32{3, 0, 4, 0})
	n := GradNorm(be, g)
	if n != 5 {
		t.Fatalf("norm %g, want 5", n)
	}
	if s := ClipScale(n, 1); math.Abs(float64(s)-0.2) > 1e-6 {
		t.Errorf("clip scale %g, want 0.2", s)
	}
	if ClipScale(n, 10) != 1 || ClipScale(n, 0) != 1 {
		t.Error("clip scale must be 1 within the bound and when clipping is off")
	}
}

// TestAdamWFirstStepAndDecay: AdamW's first bias-corrected step moves each parameter by
// lr·sign(g) (plus decoupled decay lr·λ·p on decayed segments only).
func TestAdamWFirstStepAndDecay(t *testing.T) {
	be := kernels.NewCPU()
	p, g := be.Alloc(4), be.Alloc(4)
	be.Upload(p, []float32{1, 1, 1, 1})
	be.Upload(g, []float32{0.5, -2, 0.5, -2})
	o := NewAdamW(be, 4, []Segment{{0, 2, true}, {2, 2, false}}, Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-12, WeightDecay: 0.1})
	o.Update(p, g, 0.01, 1)
	want := []float64{1 - 0.01 - 0.001, 1 + 0.01 - 0.001, 1 - 0.01, 1 + 0.01}
	for i, w := range want {
		if got := kernels.Host(p)[i]; math.Abs(float64(got)-w) > 1e-6 {
			t.Errorf("p[%d] = %v, want %v", i, got, w)
		}
	}
}

// TestAdamWMinimisesQuadratic: a few hundred steps bring f(p) = Σ (p−c)² to its minimum.
func TestAdamWMinimisesQuadratic(t *testing.T) {
	be := kernels.NewCPU()
	c := []float32{3, -1, 0.5, 2}
	p, g := be.Alloc(4), be.Alloc(4)
	o := NewAdamW(be, 4, []Segment{{0, 4, false}}, Hyper{Beta1: 0.9, Beta2: 0.99, Eps: 1e-8})
	s := Schedule{Kind: "cosine", LR: 0.1, MinLR: 0.001, Warmup: 10, Steps: 500}
	for step := 0; step < s.Steps; step++ {
		for i := range c {
			kernels.Host(g)[i] = 2 * (kernels.Host(p)[i] - c[i])
		}
		o.Update(p, g, s.At(step), 1)
	}
	for i := range c {
		if d := math.Abs(float64(kernels.Host(p)[i] - c[i])); d > 1e-2 {
			t.Errorf("p[%d] = %v, want %v", i, kernels.Host(p)[i], c[i])
		}
	}
	if o.Step != 500 {
		t.Errorf("step count %d", o.Step)
	}
}

func TestLossScaler(t *testing.T) {
	s, err := NewLossScaler(65536, 3)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		finite    bool
		skip      bool
		wantScale float64
	}{
		{true, false, 65536}, {true, false, 65536}, {true, false, 131072}, // third clean step doubles
		{false, true, 65536}, // overflow halves and skips
		{true, false, 65536}, {false, true, 32768}, {false, true, 16384},
		{true, false, 16384}, {true, false, 16384}, {true, false, 32768},
	}
	for i, st := range steps {
		if skip := s.Update(st.finite); skip != st.skip || s.Scale != st.wantScale {
			t.Fatalf("step %d (finite %v): skip %v scale %g, want %v %g", i, st.finite, skip, s.Scale, st.skip, st.wantScale)
		}
	}
	if s.Skipped != 3 {
		t.Errorf("Skipped = %d, want 3", s.Skipped)
	}
	if _, err := NewLossScaler(0, 10); err == nil {
		t.Error("scale 0 accepted")
	}
}

// TestAdamWUpdateHalf (issue 41, change 4): the fused update that writes the 16-bit compute
// copy leaves the parameters and moments bit for bit as Update does, and the copy bit for bit
// as PackHalf of the updated parameters (the refresh it replaces), over steps of varied
// gradients, segments with and without decay, a gradient scale, and an odd count (the last
// packed element holds one value), in bf16 and fp16. Bits, not a tolerance: the two are the
// same arithmetic and must not differ in any bit.
func TestAdamWUpdateHalf(t *testing.T) {
	const n, steps = 1001, 7
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.FP16} {
		be := kernels.NewCPU()
		segs := []Segment{{0, 600, true}, {600, 401, false}}
		h := Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
		ref, fused := NewAdamW(be, n, segs, h), NewAdamW(be, n, segs, h)
		pRef, pFused, g := be.Alloc(n), be.Alloc(n), be.Alloc(n)
		half, want := be.Alloc((n+1)/2), be.Alloc((n+1)/2)
		init := make([]float32, n)
		for i := range init {
			init[i] = float32(math.Sin(float64(i))) * 0.05
		}
		be.Upload(pRef, init)
		be.Upload(pFused, init)
		for s := 0; s < steps; s++ {
			gh := make([]float32, n)
			for i := range gh {
				gh[i] = float32(math.Cos(float64(i*(s+3)))) * float32(s+1) * 1e-2
			}
			be.Upload(g, gh)
			lr, scale := 1e-3*float64(s+1), float32(0.5+0.1*float64(s))
			ref.Update(pRef, g, lr, scale)
			be.PackHalf(want, pRef, prec)
			fused.UpdateHalf(pFused, g, half, prec, lr, scale)
			for _, c := range []struct {
				what      string
				got, want kernels.Buf
			}{{"params", pFused, pRef}, {"m", fused.M, ref.M}, {"v", fused.V, ref.V}, {"16-bit copy", half, want}} {
				a, b := kernels.Host(c.got), kernels.Host(c.want)
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
						t.Fatalf("%v step %d: %s[%d] = %#x, want %#x", prec, s+1, c.what, i, math.Float32bits(a[i]), math.Float32bits(b[i]))
					}
				}
			}
		}
		if fused.Step != steps || ref.Step != steps {
			t.Errorf("%v: steps %d and %d, want %d", prec, fused.Step, ref.Step, steps)
		}
	}
}
