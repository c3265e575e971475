package optim

import "fmt"

// LossScaler is dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision
// Training"; papers/parallelism-overview.txt): the loss, and so every gradient, is multiplied
// by Scale so that small gradients do not flush to zero in fp16. A step whose gradients
// contain Inf or NaN is skipped and halves the scale; GrowthInterval clean steps in a row
// double it. The state is plain data so a checkpoint can hold it.
type LossScaler struct {
	Scale          float64 `json:"scale"`
	GrowthInterval int     `json:"growth_interval"`
	Clean          int     `json:"clean"`   // clean steps since the last change
	Skipped        int64   `json:"skipped"` // steps skipped so far
}

// NewLossScaler starts at scale, doubling after growthInterval clean steps.
func NewLossScaler(scale float64, growthInterval int) (*LossScaler, error) {
	if !(scale >= 1) || growthInterval < 1 {
		return nil, fmt.Errorf("optim: loss scale %g with growth interval %d: want scale >= 1 and interval >= 1", scale, growthInterval)
	}
	return &LossScaler{Scale: scale, GrowthInterval: growthInterval}, nil
}

// Update records whether this step's gradients were all finite and reports whether the
// step must be skipped.
func (s *LossScaler) Update(finite bool) (skip bool) {
	if !finite {
		s.Scale = max(s.Scale/2, 1)
		s.Clean = 0
		s.Skipped++
		return true
	}
	s.Clean++
	if s.Clean >= s.GrowthInterval {
		s.Scale *= 2
		s.Clean = 0
	}
	return false
}
