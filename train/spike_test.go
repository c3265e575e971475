package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestSpikeSkipRule drives the spike watch over synthetic runs of loss and gradient norm, one
// step at a time as the trainer does (check, then add), and checks which updates are skipped.
func TestSpikeSkipRule(t *testing.T) {
	on := skipRule{on: true, maxConsecutive: 3, maxTotal: 4}
	rng := rand.New(rand.NewPCG(1, 2))
	noise := func(sd float64) float64 { return math.Exp(sd * rng.NormFloat64()) }
	// drift: the loss falls from 3 to about 1.5 over 600 steps, 5% batch-to-batch noise; the
	// gradient norm falls to a third and rises again 4×, with 30% noise.
	drift := func(step int) (float64, float64) {
		x := float64(step) / 600
		return 3 * math.Exp(-0.7*x) * noise(0.05), (1 - 0.9*x + 1.6*x*x) * noise(0.3)
	}
	tests := []struct {
		name    string
		rule    skipRule
		steps   int
		at      func(step int) (loss, norm float64)
		skipped []int
		say     []string // in the log lines of the spikes
		norms   bool     // gradient-norm spikes without a loss spike expected (reported, applied)
	}{
		{name: "slow drift", rule: on, steps: 600, at: drift},
		{name: "gradient norm rises 20× and falls over 10 steps (memorised text)", rule: on, steps: 300, norms: true,
			at: func(step int) (float64, float64) {
				l, n := 0.05*noise(0.3), 0.3*noise(0.3)
				if step >= 150 && step < 160 {
					n *= 20 * noise(0.2)
				}
				return l, n
			},
			say: []string{"update applied (training.skip_spikes skips loss spikes, not a gradient norm alone)"}},
		{name: "one loss spike", rule: on, steps: 300, skipped: []int{200},
			at: func(step int) (float64, float64) {
				l, n := drift(step)
				if step == 200 {
					l, n = 5.5, 30*n
				}
				return l, n
			},
			say: []string{"step 200: loss spike", "update skipped (training.skip_spikes)"}},
		{name: "skip_spikes off", rule: skipRule{maxConsecutive: 3, maxTotal: 4}, steps: 300,
			at: func(step int) (float64, float64) {
				l, n := drift(step)
				if step == 200 {
					l, n = 5.5, 30*n
				}
				return l, n
			},
			say: []string{"update applied (training.skip_spikes = true skips such a step)"}},
		{name: "a run of 8 spikes, then 3 more apart", rule: on, steps: 300, skipped: []int{100, 101, 102, 150},
			at: func(step int) (float64, float64) {
				l, n := drift(step)
				if step >= 100 && step < 108 || step == 150 || step == 200 || step == 250 {
					l = 5.5
				}
				return l, n
			},
			say: []string{
				"step 103: loss spike", "update applied: the loss has spiked 4 steps in a row, more than training.skip_spikes_max_consecutive = 3",
				"step 107: loss spike", "the loss has spiked 8 steps in a row",
				"step 150: loss spike", "training.skip_spikes: 4 updates skipped, training.skip_spikes_max_total = 4: no more are skipped in this run",
				"step 200: loss spike", "update applied: 4 updates were skipped already, training.skip_spikes_max_total = 4",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := &spikeWatch{}
			var skipped []int
			var log strings.Builder
			norms := 0
			for step := 1; step <= tc.steps; step++ {
				loss, norm := tc.at(step)
				s := w.check(loss, norm, tc.rule)
				if s.skip {
					skipped = append(skipped, step)
				}
				if s.norm && !s.loss {
					norms++
				}
				if s.any() {
					log.WriteString(s.message(Metrics{Step: step, Loss: loss, GradNorm: norm, SpikeSkipped: s.skip}, 64) + "\n")
				}
				w.add(step, loss, norm, s)
			}
			if !slices.Equal(skipped, tc.skipped) || w.Skipped != len(tc.skipped) {
				t.Errorf("skipped %v (counted %d), want %v:\n%s", skipped, w.Skipped, tc.skipped, log.String())
			}
			if (norms > 0) != tc.norms {
				t.Errorf("%d gradient-norm spikes without a loss spike; want some: %v\n%s", norms, tc.norms, log.String())
			}
			for _, s := range tc.say {
				if !strings.Contains(log.String(), s) {
					t.Errorf("the log lacks %q:\n%s", s, log.String())
				}
			}
			if n := strings.Count(log.String(), "no more are skipped"); n > 1 {
				t.Errorf("the total reached said %d times", n)
			}
		})
	}
}

// TestSpikeSummary: the end line's account, with and without skip_spikes.
func TestSpikeSummary(t *testing.T) {
	on := skipRule{on: true, maxConsecutive: 4, maxTotal: 20}
	w := &spikeWatch{}
	if got := w.summary(skipRule{}); got != "" {
		t.Errorf("no spikes, skip_spikes off: %q, want none", got)
	}
	if got, want := w.summary(on), "; spikes: none, 0 updates skipped (training.skip_spikes: at most 4 in a row, 20 in all)"; got != want {
		t.Errorf("no spikes, skip_spikes on: %q, want %q", got, want)
	}
	w = &spikeWatch{LossSpikes: 2, NormSpikes: 1, Spiked: 2, Skipped: 1, Steps: []int{7, 9}}
	if got, want := w.summary(on), "; spikes: 2 of the loss, 1 of the gradient norm (steps 7, 9), 1 updates skipped (training.skip_spikes: at most 4 in a row, 20 in all)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
