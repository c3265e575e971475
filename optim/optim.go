// Package optim holds what turns gradients into parameter updates: AdamW with decoupled
// weight decay and bias correction (Loshchilov & Hutter 2019) on fp32 state, learning-rate
// schedules (linear warmup, then cosine, linear or constant) and global-norm gradient clipping.
package optim

import (
	"fmt"
	"math"

	"distflash/kernels"
)

// Schedule gives the learning rate of each step.
type Schedule struct {
	Kind   string  // "cosine", "linear" or "constant" (after warmup)
	LR     float64 // peak learning rate
	MinLR  float64 // final learning rate of cosine and linear decay
	Warmup int     // steps of linear warmup from LR/Warmup to LR
	Steps  int     // total steps
}

// Validate checks the schedule's values.
func (s Schedule) Validate() error {
	switch s.Kind {
	case "cosine", "linear", "constant":
	default:
		return fmt.Errorf("optim: training.lr_schedule = %q: want cosine, linear or constant", s.Kind)
	}
	if s.Warmup < 0 || s.Steps <= 0 || s.LR <= 0 || s.MinLR < 0 || s.MinLR > s.LR {
		return fmt.Errorf("optim: schedule lr %g min_lr %g warmup %d steps %d: want lr > 0, 0 <= min_lr <= lr, warmup >= 0, steps > 0", s.LR, s.MinLR, s.Warmup, s.Steps)
	}
	return nil
}

// At returns the learning rate of update number step (0-based): (step+1)/Warmup·LR during
// warmup, then a decay from LR at the end of warmup to MinLR at the last step.
func (s Schedule) At(step int) float64 {
	if step < s.Warmup {
		return s.LR * float64(step+1) / float64(s.Warmup)
	}
	if s.Kind == "constant" {
		return s.LR
	}
	span := s.Steps - 1 - s.Warmup
	progress := 1.0
	if span > 0 {
		progress = math.Min(1, float64(step-s.Warmup)/float64(span))
	}
	if s.Kind == "linear" {
		return s.LR - (s.LR-s.MinLR)*progress
	}
	return s.MinLR + (s.LR-s.MinLR)*0.5*(1+math.Cos(math.Pi*progress))
}

// Segment is a run of parameters that share a weight-decay setting.
type Segment struct {
	Off, N int
	Decay  bool
}

// Hyper are AdamW's hyper-parameters.
type Hyper struct {
	Beta1, Beta2, Eps, WeightDecay float64
}

// AdamW keeps the first and second moments of every parameter in fp32 and applies the update.
type AdamW struct {
	Hyper
	Step int64       // updates applied so far
	M, V kernels.Buf // moments, laid out like the parameters
	// Ops, when set, is the per-op profile the update is recorded in (kernels.OpProfile).
	Ops *kernels.OpProfile

	be   kernels.Backend
	segs []kernels.AdamWSegment
	n    int // parameters in the segments
}

// NewAdamW returns an optimizer for size parameters cut into segs.
func NewAdamW(be kernels.Backend, size int, segs []Segment, h Hyper) *AdamW {
	o := &AdamW{Hyper: h, M: be.Alloc(size), V: be.Alloc(size), be: be}
	for _, s := range segs {
		o.segs = append(o.segs, kernels.AdamWSegment{Off: s.Off, N: s.N, Decay: s.Decay})
		o.n += s.N
	}
	return o
}

// Update applies one AdamW step with learning rate lr to params, using grads·gradScale: every
// segment in one call (kernels.Backend.AdamWSegments).
func (o *AdamW) Update(params, grads kernels.Buf, lr float64, gradScale float32) {
	o.Step++
	hp := kernels.AdamWStep{LR: lr, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay,
		Step: o.Step, GradScale: gradScale}
	o.Ops.Begin(kernels.OpOptimizer, kernels.PhaseStep)
	o.be.AdamWSegments(params, grads, o.M, o.V, o.segs, hp)
	o.Ops.End(kernels.AdamWCost(o.n))
}

// UpdateHalf is Update that also writes every updated parameter, rounded to prec (BF16 or
// FP16), into half: the 16-bit compute copy of params (packed, kernels.Backend.PackHalf's
// layout, laid out like params), refreshed in the same pass as the update
// (kernels.Backend.AdamWSegmentsHalf). params, the moments and half end as Update followed by
// PackHalf(half, params, prec) leaves them, bit for bit; the copy's parameters outside the
// segments are not written.
func (o *AdamW) UpdateHalf(params, grads, half kernels.Buf, prec kernels.Precision, lr float64, gradScale float32) {
	o.Step++
	hp := kernels.AdamWStep{LR: lr, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay,
		Step: o.Step, GradScale: gradScale}
	o.Ops.Begin(kernels.OpOptimizer, kernels.PhaseStep)
	o.be.AdamWSegmentsHalf(params, grads, o.M, o.V, half, o.segs, hp, prec)
	o.Ops.End(kernels.AdamWCost(o.n).Plus(kernels.OpCost{Bytes: 2 * int64(o.n)})) // and the 16-bit copy written
}

// GradNorm returns the global L2 norm of grads.
func GradNorm(be kernels.Backend, grads kernels.Buf) float64 { return math.Sqrt(be.SumSquares(grads)) }

// ClipScale returns the factor that brings a gradient of norm norm down to maxNorm
// (1 when it is already within, or when maxNorm is 0: clipping off).
func ClipScale(norm, maxNorm float64) float32 {
	if maxNorm <= 0 || norm <= maxNorm {
		return 1
	}
	return float32(maxNorm / (norm + 1e-6))
}
