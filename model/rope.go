package model

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"distflash/kernels"
)

// RoPE scaling: the variants of Hugging Face transformers' modeling_rope_utils.py, which
// differ only in the table of inverse frequencies and a factor on cos and sin.
//
//   - none: inv_freq[i] = rope_theta^(−2i/head_dim). Changing rope_theta alone is the "base
//     frequency" adjustment of LLaMA-2-Long and Code Llama.
//   - linear (position interpolation, Chen et al. 2023): inv_freq / factor.
//   - dynamic ("Dynamic NTK", Peng et al. 2023 §3.3): when the sequence length L exceeds
//     original_max_position_embeddings L0, the base becomes
//     rope_theta·(factor·L/L0 − (factor−1))^(d/(d−2)); at or below L0 it is plain RoPE.
//   - yarn (Peng et al. 2023, "YaRN", §3.2 and §3.4): per frequency, a ramp between
//     extrapolation (the plain frequency) and interpolation (frequency / factor), by how many
//     turns the frequency makes over L0 (beta_fast, beta_slow); cos and sin are multiplied by
//     attention_factor, 0.1·ln(factor) + 1 unless given, so attention logits by its square.
//   - llama3 (LLaMA 3.1): wavelengths shorter than L0/high_freq_factor are kept, longer than
//     L0/low_freq_factor divided by factor, and those between interpolated smoothly.

// ropeTypes are the values of model.rope_scaling.type, with the keys each one reads besides
// type and factor.
var ropeTypes = []struct {
	name string
	keys []string
}{
	{"none", nil},
	{"linear", nil},
	{"dynamic", []string{"original_max_position_embeddings"}},
	{"yarn", []string{"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}},
	{"llama3", []string{"original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}},
}

// RopeTypes lists the known values of model.rope_scaling.type ("" and "default" are "none").
func RopeTypes() []string {
	var n []string
	for _, t := range ropeTypes {
		n = append(n, t.name)
	}
	return n
}

// YaRN's defaults (Peng et al. 2023, §3.2, and transformers).
const (
	yarnBetaFast = 32
	yarnBetaSlow = 1
)

// fields lists the keys of s with their values, in the table's order.
func (s RopeScaling) fields() []struct {
	key string
	val float64
} {
	return []struct {
		key string
		val float64
	}{
		{"factor", s.Factor},
		{"original_max_position_embeddings", float64(s.OriginalMaxPositionEmbeddings)},
		{"low_freq_factor", s.LowFreqFactor},
		{"high_freq_factor", s.HighFreqFactor},
		{"beta_fast", s.BetaFast},
		{"beta_slow", s.BetaSlow},
		{"attention_factor", s.AttentionFactor},
	}
}

// resolve checks [model.rope_scaling] for a model of head dimension headDim trained at
// maxSeqLen tokens: the type must be known ("none" and "default" become ""), the keys it
// reads in range, and the keys it does not read absent. An absent
// original_max_position_embeddings is set to maxSeqLen / factor for the types that read it.
func (s *RopeScaling) resolve(headDim, maxSeqLen int) error {
	if s.Type == "none" || s.Type == "default" {
		s.Type = ""
	}
	name := s.Type
	if name == "" {
		name = "none"
	}
	var reads []string
	known := false
	for _, t := range ropeTypes {
		if t.name == name {
			known = true
			reads = append([]string{"type"}, t.keys...)
			if name != "none" {
				reads = append([]string{"type", "factor"}, t.keys...)
			}
		}
	}
	if !known {
		return fmt.Errorf("model.rope_scaling.type = %q: unknown; want one of %s", s.Type, strings.Join(RopeTypes(), ", "))
	}
	for _, f := range s.fields() {
		if f.val != 0 && !slices.Contains(reads, f.key) {
			return fmt.Errorf("model.rope_scaling.%s = %g: not a parameter of rope_scaling.type %s (it reads %s)",
				f.key, f.val, name, strings.Join(reads, ", "))
		}
		if math.IsNaN(f.val) || math.IsInf(f.val, 0) {
			return fmt.Errorf("model.rope_scaling.%s = %g: must be a finite number", f.key, f.val)
		}
	}
	if name == "none" {
		return nil
	}
	if !(s.Factor >= 1) {
		return fmt.Errorf("model.rope_scaling.factor = %g: must be ≥ 1", s.Factor)
	}
	if slices.Contains(reads, "original_max_position_embeddings") {
		switch o := s.OriginalMaxPositionEmbeddings; {
		case o < 0:
			return fmt.Errorf("model.rope_scaling.original_max_position_embeddings = %d: must be > 0 (or absent: model.max_seq_len / factor)", o)
		case o == 0:
			l0 := float64(maxSeqLen) / s.Factor
			if l0 != math.Trunc(l0) || l0 < 1 {
				return fmt.Errorf("model.rope_scaling.original_max_position_embeddings is absent and model.max_seq_len / model.rope_scaling.factor = %d / %g is not a whole number: set it", maxSeqLen, s.Factor)
			}
			s.OriginalMaxPositionEmbeddings = int(l0)
		}
	}
	switch name {
	case "dynamic":
		if headDim <= 2 {
			return fmt.Errorf("model.rope_scaling.type = dynamic needs model.head_dim > 2 (the base is raised to head_dim/(head_dim−2)), have %d", headDim)
		}
	case "yarn":
		switch {
		case s.BetaFast < 0:
			return fmt.Errorf("model.rope_scaling.beta_fast = %g: must be > 0 (or absent: %d)", s.BetaFast, yarnBetaFast)
		case s.BetaSlow < 0:
			return fmt.Errorf("model.rope_scaling.beta_slow = %g: must be > 0 (or absent: %d)", s.BetaSlow, yarnBetaSlow)
		case s.AttentionFactor < 0:
			return fmt.Errorf("model.rope_scaling.attention_factor = %g: must be > 0 (or absent: 0.1·ln(factor) + 1)", s.AttentionFactor)
		}
		if fast, slow := s.betas(); fast < slow {
			return fmt.Errorf("model.rope_scaling.beta_fast = %g is below model.rope_scaling.beta_slow = %g: beta_fast counts the turns of the fast frequencies and must be ≥ beta_slow", fast, slow)
		}
	case "llama3":
		switch {
		case !(s.LowFreqFactor > 0):
			return fmt.Errorf("model.rope_scaling.low_freq_factor = %g: must be > 0 (LLaMA 3.1 uses 1)", s.LowFreqFactor)
		case !(s.HighFreqFactor > s.LowFreqFactor):
			return fmt.Errorf("model.rope_scaling.high_freq_factor = %g: must be > model.rope_scaling.low_freq_factor = %g (LLaMA 3.1 uses 4 and 1)", s.HighFreqFactor, s.LowFreqFactor)
		}
	}
	return nil
}

// betas are YaRN's beta_fast and beta_slow with their defaults.
func (s RopeScaling) betas() (fast, slow float64) {
	fast, slow = s.BetaFast, s.BetaSlow
	if fast == 0 {
		fast = yarnBetaFast
	}
	if slow == 0 {
		slow = yarnBetaSlow
	}
	return fast, slow
}

// RoPE returns the rotary embedding of c (resolved) for a forward over sequences of seqLen
// tokens. seqLen is the length of the whole sequence: with sequence parallelism, where each
// rank holds a slice of the positions, it is the global length, not the rank's. Only type
// dynamic depends on it; Hugging Face takes max(position_ids)+1, which is the same for
// sequences at positions 0..seqLen−1, but keeps the table of the longest sequence it has
// seen (until one at or below original_max_position_embeddings resets it), where this is a
// function of seqLen alone.
func (c Config) RoPE(seqLen int) kernels.RoPETable {
	s, d, theta := c.RopeScaling, c.HeadDim, c.RopeTheta
	t := kernels.DefaultRoPE(theta, d)
	l0 := float64(s.OriginalMaxPositionEmbeddings)
	switch s.Type {
	case "linear":
		for i := range t.InvFreq {
			t.InvFreq[i] /= s.Factor
		}
	case "dynamic":
		// At seqLen ≤ L0 the base factor is 1 (up to rounding); plain RoPE exactly.
		if seqLen > s.OriginalMaxPositionEmbeddings {
			base := theta * math.Pow(s.Factor*float64(seqLen)/l0-(s.Factor-1), float64(d)/float64(d-2))
			t = kernels.DefaultRoPE(base, d)
		}
	case "yarn":
		fast, slow := s.betas()
		// The dimension index at which a frequency makes rot turns over L0 positions.
		dimOf := func(rot float64) float64 {
			return float64(d) * math.Log(l0/(rot*2*math.Pi)) / (2 * math.Log(theta))
		}
		lo := max(math.Floor(dimOf(fast)), 0)
		hi := min(math.Ceil(dimOf(slow)), float64(d-1))
		if lo == hi {
			hi += 0.001
		}
		for i, extra := range t.InvFreq {
			// ramp 0: extrapolate (keep the frequency); 1: interpolate (divide by factor).
			ramp := min(max((float64(i)-lo)/(hi-lo), 0), 1)
			t.InvFreq[i] = extra/s.Factor*ramp + extra*(1-ramp)
		}
		t.Scale = s.AttentionFactor
		if t.Scale == 0 {
			t.Scale = 0.1*math.Log(s.Factor) + 1
		}
	case "llama3":
		lowWave, highWave := l0/s.LowFreqFactor, l0/s.HighFreqFactor
		for i, f := range t.InvFreq {
			switch wave := 2 * math.Pi / f; {
			case wave < highWave:
			case wave > lowWave:
				t.InvFreq[i] = f / s.Factor
			default:
				smooth := (l0/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				t.InvFreq[i] = (1-smooth)*f/s.Factor + smooth*f
			}
		}
	}
	return t
}
