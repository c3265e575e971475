package evaluate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Loss by position (eval --positions) and the sliding-window scoring (eval --sliding-window W
// --stride S).
//
// Position i is the prediction of token i+1 from tokens 0..i of the sample: its loss says how
// well the model uses a context of i+1 tokens. The buckets are [0, 64), [64, 128), [128, 256)
// and on, doubling, the last one ending at the evaluation length: so a model trained at 4K and
// evaluated at 16K shows, bucket by bucket, whether its loss keeps falling past 4K.
//
// Two ways to score a sample longer than a model's context, as the long-context literature
// does (YaRN's eval/perplexity.py, Position Interpolation §3.2):
//   - truncate (the default): one forward over the sample's first seq_len tokens, every
//     position scored;
//   - sliding window: windows of W tokens every S tokens (W, W+S, …: the positions of each
//     window start at 0), each scoring only the targets no earlier window scored (the first
//     window all of its own): every target once, each with at most W tokens of context, and at
//     least W − S past the first window.
//
// Both score every target of the sample once, so the loss, perplexity and bits per byte are
// comparable; the positions are the sample's.

// EvalOptions are the ways Evaluate can score samples.
type EvalOptions struct {
	Positions bool // record the loss by position
	Window    int  // sliding-window scoring with windows of Window tokens; 0: truncate
	Stride    int  // the windows' stride (with Window)
}

// Validate reports options that cannot score a sample.
func (o EvalOptions) Validate() error {
	switch {
	case o.Window < 0 || o.Stride < 0:
		return fmt.Errorf("eval: --sliding-window %d --stride %d: want positive sizes", o.Window, o.Stride)
	case o.Window == 0 && o.Stride > 0:
		return fmt.Errorf("eval: --stride %d needs --sliding-window, the window it moves", o.Stride)
	case o.Window > 0 && (o.Stride < 1 || o.Stride > o.Window):
		return fmt.Errorf("eval: --sliding-window %d --stride %d: the stride must be between 1 and the window (every target scored once)", o.Window, o.Stride)
	}
	return nil
}

// Mode names the scoring: "truncate" or "sliding_window".
func (o EvalOptions) Mode() string {
	if o.Window > 0 {
		return "sliding_window"
	}
	return "truncate"
}

// PositionResult is the loss by position of one evaluation.
type PositionResult struct {
	Mode   string    `json:"mode"`             // truncate | sliding_window
	Window int       `json:"window,omitempty"` // sliding_window: the windows' length
	Stride int       `json:"stride,omitempty"` // sliding_window: their stride
	Lo     []int     `json:"lo"`               // bucket i holds positions [Lo[i], Hi[i])
	Hi     []int     `json:"hi"`
	Loss   []float64 `json:"loss"`   // mean loss of the bucket, nats; null where it is empty
	Tokens []int64   `json:"tokens"` // targets in the bucket
	sum    []float64
}

// PositionBuckets returns the buckets of positions below n: [0, 64), [64, 128), then doubling,
// the last one cut at n.
func PositionBuckets(n int) (lo, hi []int) {
	for a, b := 0, 64; a < n; a, b = b, 2*b {
		lo, hi = append(lo, a), append(hi, min(b, n))
	}
	return lo, hi
}

func newPositionResult(n int, opt EvalOptions) *PositionResult {
	r := &PositionResult{Mode: opt.Mode(), Window: opt.Window, Stride: opt.Stride}
	r.Lo, r.Hi = PositionBuckets(n)
	r.Loss, r.Tokens, r.sum = make([]float64, len(r.Lo)), make([]int64, len(r.Lo)), make([]float64, len(r.Lo))
	return r
}

// add counts the loss of position p.
func (r *PositionResult) add(p int, loss float64) {
	for i := range r.Lo {
		if p >= r.Lo[i] && p < r.Hi[i] {
			r.sum[i] += loss
			r.Tokens[i]++
			return
		}
	}
}

// finish sets the means (NaN where a bucket is empty, null in JSON).
func (r *PositionResult) finish() {
	for i := range r.Loss {
		r.Loss[i] = math.NaN()
		if r.Tokens[i] > 0 {
			r.Loss[i] = r.sum[i] / float64(r.Tokens[i])
		}
	}
}

// MarshalJSON writes empty buckets' loss as null.
func (r PositionResult) MarshalJSON() ([]byte, error) {
	type plain PositionResult
	loss := make([]*float64, len(r.Loss))
	for i := range r.Loss {
		if !math.IsNaN(r.Loss[i]) {
			loss[i] = &r.Loss[i]
		}
	}
	return json.Marshal(struct {
		plain
		Loss []*float64 `json:"loss"`
	}{plain(r), loss})
}

// UnmarshalJSON reads null losses as NaN.
func (r *PositionResult) UnmarshalJSON(b []byte) error {
	type plain PositionResult
	var aux struct {
		plain
		Loss []*float64 `json:"loss"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*r = PositionResult(aux.plain)
	r.Loss = make([]float64, len(aux.Loss))
	for i, l := range aux.Loss {
		r.Loss[i] = math.NaN()
		if l != nil {
			r.Loss[i] = *l
		}
	}
	return nil
}

// windows are the forwards that score a sample as opt says: one over the whole sample, or the
// sliding windows, each scoring only the targets no earlier window scored.
func windows(s Sample, opt EvalOptions) []request {
	n := len(s.IDs)
	if opt.Window == 0 || opt.Window >= n {
		return []request{{ids: s.IDs, targets: s.Targets}}
	}
	var out []request
	for begin, scored := 0, 0; scored < n; begin += opt.Stride {
		end := min(begin+opt.Window, n)
		targets := slices.Clone(s.Targets[begin:end])
		for i := 0; i < scored-begin; i++ {
			targets[i] = -1 // scored by an earlier window
		}
		out = append(out, request{ids: s.IDs[begin:end], targets: targets})
		scored = end
	}
	return out
}

// assemble is the loss of each target of s (by position) from the outcomes of its windows,
// the first of outs, each window's own targets at their positions; it returns the outcomes
// left.
func assemble(s Sample, opt EvalOptions, outs []outcome) (losses []float32, rest []outcome) {
	losses = make([]float32, len(s.IDs))
	begin := 0
	for _, q := range windows(s, opt) {
		o := outs[0]
		outs = outs[1:]
		for j, t := range q.targets {
			if t >= 0 {
				losses[begin+j] = o.losses[j]
			}
		}
		begin += opt.Stride
	}
	return losses, outs
}

// scoreSample scores one sample as opt says and returns the loss of each target (by position).
func (e *Evaluator) scoreSample(s Sample, opt EvalOptions) ([]float32, error) {
	outs, err := e.forwardAll(windows(s, opt))
	if err != nil {
		return nil, err
	}
	losses, _ := assemble(s, opt, outs)
	return losses, nil
}

// EvaluateWith is Evaluate with the scoring of opt, and the loss by position when it asks. The
// samples go to the replicas a round at a time (as many samples as replicas); their losses
// are added up in sample order, so the result is the same on any number of ranks.
func (e *Evaluator) EvaluateWith(ctx context.Context, samples []Sample, opt EvalOptions, progress func(done int, loss float64)) (Result, *PositionResult, error) {
	if err := opt.Validate(); err != nil {
		return Result{}, nil, err
	}
	start := time.Now()
	longest := 0
	for _, s := range samples {
		longest = max(longest, len(s.IDs))
	}
	var pr *PositionResult
	if opt.Positions {
		pr = newPositionResult(longest, opt)
	}
	var lossSum float64
	var tokens, nbytes int64
	dp := e.w.Dims.DP()
	for i0 := 0; i0 < len(samples); i0 += dp {
		if e.stopped(ctx) {
			return Result{}, nil, fmt.Errorf("eval: %w after %d of %d samples; no report was written", ErrStopped, i0, len(samples))
		}
		group := samples[i0:min(i0+dp, len(samples))]
		var reqs []request
		for _, s := range group {
			reqs = append(reqs, windows(s, opt)...)
		}
		outs, err := e.forwardAll(reqs)
		if err != nil {
			return Result{}, nil, fmt.Errorf("eval: samples %d-%d: %w", i0+1, i0+len(group), err)
		}
		for k, s := range group {
			i := i0 + k
			var losses []float32
			losses, outs = assemble(s, opt, outs)
			for p, t := range s.Targets { // in sequence order: the same sum on any number of ranks
				if t < 0 {
					continue
				}
				lossSum += float64(losses[p])
				tokens++
				if pr != nil {
					pr.add(p, float64(losses[p]))
				}
			}
			nbytes += int64(s.Bytes)
			if progress != nil {
				progress(i+1, lossSum/float64(tokens))
			}
		}
	}
	if tokens == 0 {
		return Result{}, nil, errors.New("eval: no tokens to evaluate")
	}
	if pr != nil {
		pr.finish()
	}
	elapsed := time.Since(start).Seconds()
	loss := lossSum / float64(tokens)
	r := Result{Loss: loss, Perplexity: math.Exp(loss), Tokens: tokens, Bytes: nbytes,
		Samples: len(samples), SequenceParallel: e.P(), Attention: e.Attn(),
		ElapsedSec: elapsed, TokensPerSec: float64(tokens) / elapsed}
	if nbytes > 0 {
		r.BitsPerByte = lossSum / math.Ln2 / float64(nbytes)
	}
	return r, pr, nil
}
