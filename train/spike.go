package train

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"distflash/config"
)

// Spike detection. A step's loss is a loss spike when it lies more than SpikeLossZ robust
// standard deviations (1.4826 × the median absolute deviation) above the median loss of the
// SpikeWindow steps before it and is more than SpikeLossRatio times that median; its gradient
// norm (before clipping) is a gradient-norm spike when it is more than SpikeGradNormRatio times
// their median gradient norm. Neither is looked for before SpikeMinSteps steps have run. Medians,
// not means, so that one spike does not hide the next; the deviation scales the loss's test to
// the run's own batch-to-batch noise (small batches of varied text swing more than large ones),
// and the ratio keeps a run whose loss barely moves from calling its noise a spike.
//
// The statistics are the all-gathered ones of gatherStats, the same on every rank, so every rank
// decides alike (training.skip_spikes skips the update on all or none).
//
// The thresholds are above what sound runs show: the default run (tiny on the Go tree, 1K
// tokens a step, 600 steps) has losses up to 3.8 deviations and 1.39× the median above it (a
// window of tables or test vectors among code) and gradient norms up to 3.9× theirs.
//
// Skipping (training.skip_spikes) acts on loss spikes only. A gradient norm alone does not
// tell a bad batch from an ordinary one: a run that learns a repeated sentence to a loss of
// 0.01 (batches of 2 × 64 tokens, 300 steps) has ordinary batches whose gradient norms are up
// to 24× the median of the 32 before (the norm of small batches near a memorised text is
// heavy-tailed: it falls and rises by 10× over a few steps), while their losses stay within
// 3.7 deviations; a window of random bytes planted in it gives a loss 80–220× the median
// (over 100 deviations) with a gradient norm only 17–43× it. Skipping on the norm skipped 11
// ordinary batches of that run, 5 in a row once (a skipped step leaves the weights, so the
// next batch's norm is as high). grad_clip bounds what an outlier gradient does anyway. A
// gradient-norm spike is reported, not skipped.
//
// And skipping is bounded: at most training.skip_spikes_max_consecutive steps of a run of
// loss spikes in a row (the rest of the run is applied: a loss that stays up is the model's,
// not a batch's, and skipping cannot bring it down) and training.skip_spikes_max_total in all
// (then skipping stops, said once).
const (
	SpikeWindow        = 32
	SpikeMinSteps      = 8
	SpikeLossZ         = 6.0
	SpikeLossRatio     = 1.2
	SpikeGradNormRatio = 8.0
)

// spikeWatch holds the recent steps' loss and gradient norm, and counts the spikes seen. It
// is saved in checkpoints (trainState), so a resumed run decides as the one that never
// stopped.
type spikeWatch struct {
	Losses     []float64 `json:"losses"`     // the last SpikeWindow steps' losses, oldest first
	Norms      []float64 `json:"grad_norms"` // their gradient norms
	LossSpikes int       `json:"loss_spikes"`
	NormSpikes int       `json:"grad_norm_spikes"`
	Spiked     int       `json:"spiked"`  // steps with a spike of either
	Skipped    int       `json:"skipped"` // updates skipped for a spike (training.skip_spikes)
	Steps      []int     `json:"steps"`   // the steps with a spike, the first spikeStepsKept
	// Run is the number of loss spikes in a row up to the last step (0: it had none).
	Run int `json:"loss_spike_run,omitempty"`
}

// spikeStepsKept is how many spike steps the end line names.
const spikeStepsKept = 10

// skipRule is what training.skip_spikes and its bounds ask.
type skipRule struct {
	on                       bool
	maxConsecutive, maxTotal int
}

// skipRuleOf reads the rule from the [training] section.
func skipRuleOf(t config.TrainingConfig) skipRule {
	return skipRule{on: t.SkipSpikes, maxConsecutive: t.SkipSpikesMaxConsecutive, maxTotal: t.SkipSpikesMaxTotal}
}

// A loss spike's update is applied for one of these reasons, or skipped (heldNone).
const (
	heldNone        = iota
	heldOff         // training.skip_spikes is false
	heldConsecutive // maxConsecutive loss spikes in a row were skipped just before
	heldTotal       // maxTotal updates were skipped already
)

// spike is what check found in one step: which spikes, against which medians, and whether the
// update is skipped.
type spike struct {
	loss, norm             bool
	lossMedian, normMedian float64
	lossSigma              float64 // 1.4826 × the losses' median absolute deviation
	skip                   bool    // the update is skipped (a loss spike, training.skip_spikes, within the bounds)
	held                   int     // a loss spike not skipped: why (heldOff, heldConsecutive, heldTotal)
	rule                   skipRule
	skipped                int // updates skipped before this step
	run                    int // loss spikes in a row just before this step
}

func (s spike) any() bool { return s.loss || s.norm }

// median of xs (not modified).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// check looks at a step's loss and gradient norm against the steps before it, and decides
// under r whether its update is skipped. It does not change w, so every rank of the process
// may call it concurrently.
func (w *spikeWatch) check(loss, norm float64, r skipRule) spike {
	if w == nil || len(w.Losses) < SpikeMinSteps || !finite(loss) || !finite(norm) {
		return spike{}
	}
	s := spike{lossMedian: median(w.Losses), normMedian: median(w.Norms), rule: r, skipped: w.Skipped, run: w.Run}
	dev := make([]float64, len(w.Losses))
	for i, l := range w.Losses {
		dev[i] = math.Abs(l - s.lossMedian)
	}
	s.lossSigma = 1.4826 * median(dev)
	s.loss = loss-s.lossMedian > SpikeLossZ*s.lossSigma && loss > SpikeLossRatio*s.lossMedian
	s.norm = norm > SpikeGradNormRatio*s.normMedian
	if s.loss {
		switch {
		case !r.on:
			s.held = heldOff
		case w.Run >= r.maxConsecutive:
			s.held = heldConsecutive
		case w.Skipped >= r.maxTotal:
			s.held = heldTotal
		default:
			s.skip = true
		}
	}
	return s
}

// add records a step after it ran: its values join the window and its spikes the counts.
func (w *spikeWatch) add(step int, loss, norm float64, s spike) {
	if !finite(loss) || !finite(norm) {
		return
	}
	if w.Losses = append(w.Losses, loss); len(w.Losses) > SpikeWindow {
		w.Losses = w.Losses[1:]
	}
	if w.Norms = append(w.Norms, norm); len(w.Norms) > SpikeWindow {
		w.Norms = w.Norms[1:]
	}
	if s.loss {
		w.LossSpikes++
		w.Run++
	} else {
		w.Run = 0
	}
	if s.norm {
		w.NormSpikes++
	}
	if s.skip {
		w.Skipped++
	}
	if s.any() {
		if w.Spiked++; len(w.Steps) < spikeStepsKept {
			w.Steps = append(w.Steps, step)
		}
	}
}

// message is the log line of a spike at step m: the step, the values against the medians,
// where its batch lies in the data and what was done; and, on the update that reaches
// training.skip_spikes_max_total, a second line saying that no more are skipped.
func (s spike) message(m Metrics, seqLen int) string {
	var what []string
	if s.loss {
		what = append(what, fmt.Sprintf("loss spike: loss %.4f is %.2f× the median %.4f of the last %d steps (%.0f deviations above it)",
			m.Loss, m.Loss/s.lossMedian, s.lossMedian, SpikeWindow, (m.Loss-s.lossMedian)/s.lossSigma))
	}
	if s.norm {
		what = append(what, fmt.Sprintf("gradient-norm spike: grad_norm %.4g is %.1f× the median %.4g", m.GradNorm, m.GradNorm/s.normMedian, s.normMedian))
	}
	var act string
	switch {
	case s.skip:
		act = "update skipped (training.skip_spikes)"
	case !s.loss:
		act = "update applied (training.skip_spikes skips loss spikes, not a gradient norm alone)"
	case s.held == heldOff:
		act = "update applied (training.skip_spikes = true skips such a step)"
	case s.held == heldConsecutive:
		act = fmt.Sprintf("update applied: the loss has spiked %d steps in a row, more than training.skip_spikes_max_consecutive = %d (a loss that stays up is the model's, not a batch's)",
			s.run+1, s.rule.maxConsecutive)
	case s.held == heldTotal:
		act = fmt.Sprintf("update applied: %d updates were skipped already, training.skip_spikes_max_total = %d", s.skipped, s.rule.maxTotal)
	}
	line := fmt.Sprintf("step %d: %s; its batch is %s; %s", m.Step, strings.Join(what, "; "), windowsText(m.Windows, m.Sources, seqLen), act)
	if s.skip && s.skipped+1 == s.rule.maxTotal {
		line += fmt.Sprintf("\ntraining.skip_spikes: %d updates skipped, training.skip_spikes_max_total = %d: no more are skipped in this run", s.rule.maxTotal, s.rule.maxTotal)
	}
	return line
}

// windowsText says where the sequences of a batch lie in the training data: the loader's
// windows and their first tokens, and with a mixture (sources, per window) their sources'
// names.
func windowsText(ws []int, sources []string, seqLen int) string {
	if len(ws) == 0 {
		return "not known"
	}
	var parts []string
	for i, w := range ws {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("… (%d windows)", len(ws)))
			break
		}
		of := ""
		if i < len(sources) {
			of = " of " + sources[i]
		}
		parts = append(parts, fmt.Sprintf("%d%s (tokens %d..%d)", w, of, w*seqLen, w*seqLen+seqLen))
	}
	return "window " + strings.Join(parts, ", ")
}

// summary is the end line's account of the spikes, "; spikes: …": how many of each, at which
// steps, and, under training.skip_spikes, how many updates were skipped within which bounds.
// "" when there were none and skip_spikes is off.
func (w *spikeWatch) summary(r skipRule) string {
	if w == nil {
		return ""
	}
	bounds := ""
	if r.on {
		bounds = fmt.Sprintf(" (training.skip_spikes: at most %d in a row, %d in all)", r.maxConsecutive, r.maxTotal)
	}
	if w.LossSpikes+w.NormSpikes == 0 {
		if !r.on {
			return ""
		}
		return "; spikes: none, 0 updates skipped" + bounds
	}
	steps := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		steps[i] = fmt.Sprint(s)
	}
	more := ""
	if w.Spiked > len(w.Steps) {
		more = ", …"
	}
	return fmt.Sprintf("; spikes: %d of the loss, %d of the gradient norm (steps %s%s), %d updates skipped%s",
		w.LossSpikes, w.NormSpikes, strings.Join(steps, ", "), more, w.Skipped, bounds)
}
