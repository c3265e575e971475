package plan

// Document masking in plan (data.document_mask, plan --doc-len N --doc-dist D).
//
// Packed documents see only keys of their own document, so a window of T tokens computes
// fewer score pairs than the causal triangle's T(T+1)/2, and the layouts balanced for one
// triangle lose their balance (parallel/balance.go).
//
// Visible fraction. data.Loader cuts windows of T tokens at fixed strides out of a stream of
// documents, so a window starts inside a document; with i.i.d. lengths n (mean μ) the stream
// is a stationary renewal process and the offset A of a token in its document has
// P(A ≥ a) = E[(n − a)⁺] / μ. A token at window position p sees min(A, p) + 1 keys (the
// part of its document before the window is not in it), so the expected visible pairs are
//
//	V = T + Σ_{a=1}^{T−1} (T − a) · P(A ≥ a),
//
// and the visible fraction is V / (T(T+1)/2). For documents of fixed length L ≪ T that is
// ≈ T·L/2 pairs, L/T of causal; for exponential lengths ≈ T·μ (2μ/T); for log-normal lengths
// with shape σ, E[n²] = μ²·e^{σ²}, so ≈ e^{σ²}·μ/T: long documents carry most pairs. The
// default is log-normal with σ = 1.3, the web-like lengths of parallel's BenchmarkDocMask
// (median 400 tokens there, mean 400·e^{σ²/2} ≈ 931), where E[(n − a)⁺] has the closed form
// μ·Φ(d₁) − a·Φ(d₂), d₁ = (ln(μ/a) + σ²/2)/σ, d₂ = d₁ − σ. Attention FLOPs scale by the
// fraction (the CPU kernels skip tiles the mask hides; a tile with any visible pair is
// computed whole, so the real count is somewhat higher for short documents).
//
// Imbalance. The work model is parallel.DocumentSteps': each visible pair at the rank and step
// where the schedule computes it (DistFlashAttn's helpers included, Burst's key-side
// backward), and the attention time is parallel.DocumentTime's span, the sum over steps of the
// busiest rank's work (every step waits for its slowest rank). plan draws windows of the same
// renewal process with a seeded RNG (the first document length-biased with a uniform offset,
// the rest i.i.d.), and the idle fraction is 1 − Σ busy / (P · Σ span) over the windows: the
// share of the attention time the ranks wait. With parallelism.balance_documents the windows
// are first reordered by parallel.BalanceDocuments, as training does. Ulysses splits heads,
// not tokens, and every rank attends the whole sequence: 0.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"

	"distflash/parallel"
)

// distflashDocNote is what plan says beside distflash's idle under documents.
const distflashDocNote = "under documents the idle is over DistFlashAttn's own 1 + P/2 steps, helpers' blocks where they run (parallel.DocumentTime: 1/(P+1) for one document as long as the window); the causal column is the paper's 1/(2P), over the ring's P steps"

// webDocSigma is the log-normal shape of web-like document lengths (BenchmarkDocMask).
const webDocSigma = 1.3

// defaultDocLen is the mean of web-like documents, log-normal with median 400 tokens and
// σ = 1.3 (400·e^{σ²/2}): what plan assumes under data.document_mask without --doc-len.
var DefaultDocLen = math.Round(400 * math.Exp(webDocSigma*webDocSigma/2))

// docDists are the document length distributions plan knows.
var docDists = []string{"lognormal", "exponential", "fixed"}

// DocLengths is the distribution of the lengths of packed documents, in tokens.
type DocLengths struct {
	Dist    string  `json:"dist"`              // lognormal (σ 1.3) | exponential | fixed
	Mean    float64 `json:"mean"`              // average length
	Assumed bool    `json:"assumed,omitempty"` // data.document_mask without --doc-len: the web-like default
}

// String names the distribution for plan's output.
func (d DocLengths) String() string {
	switch d.Dist {
	case "lognormal":
		return fmt.Sprintf("log-normal lengths (σ %.1f, median %.0f), mean %.0f tokens", webDocSigma, d.Mean*math.Exp(-webDocSigma*webDocSigma/2), d.Mean)
	case "exponential":
		return fmt.Sprintf("exponential lengths, mean %.0f tokens", d.Mean)
	}
	return fmt.Sprintf("every document %.0f tokens", d.Mean)
}

// parseDocLengths reads --doc-len (a size, e.g. 2048 or 2K) and --doc-dist.
func ParseDocLengths(n, dist string) (DocLengths, error) {
	if !slices.Contains(docDists, dist) {
		return DocLengths{}, fmt.Errorf("plan: --doc-dist %q: want one of %s", dist, strings.Join(docDists, ", "))
	}
	v, err := ParseTokens(n)
	if err != nil || v < 1 {
		return DocLengths{}, fmt.Errorf("plan: --doc-len %q: want the average document length in tokens, a positive integer like 2048 or 2K", n)
	}
	return DocLengths{Dist: dist, Mean: float64(v)}, nil
}

// survival is P(A ≥ a) = E[(n − a)⁺] / μ for a ≥ 1: the probability that a token of the
// stream is at offset a or later in its document.
func (d DocLengths) survival(a float64) float64 {
	mu := d.Mean
	switch d.Dist {
	case "lognormal":
		s := webDocSigma
		d1 := (math.Log(mu/a) + s*s/2) / s
		return phi(d1) - a/mu*phi(d1-s)
	case "exponential":
		return math.Exp(-a / mu)
	}
	return max(0, 1-a/mu)
}

// phi is the standard normal distribution function.
func phi(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }

// VisibleFraction is the expected share of the causal score pairs T(T+1)/2 that the document
// mask leaves visible in a window of T tokens (the file comment derives it), under a sliding
// window of W tokens too when W > 0 (a token then sees min(A, p, W − 1) + 1 keys: the sum
// stops at W; planwindow.go).
func (d DocLengths) VisibleFraction(T, W int) float64 {
	end := T
	if W > 0 {
		end = min(T, W)
	}
	v := float64(T)
	for a := 1; a < end; a++ {
		s := d.survival(float64(a))
		if s < 1e-12 {
			break
		}
		v += float64(T-a) * s
	}
	return v / (float64(T) * float64(T+1) / 2)
}

// draw returns one document length; biased draws from the length-biased distribution
// (n·p(n)/μ: the length of the document a random token falls in).
func (d DocLengths) draw(r *rand.Rand, biased bool) int {
	var x float64
	switch d.Dist {
	case "lognormal":
		s := webDocSigma
		m := math.Log(d.Mean) - s*s/2
		if biased {
			m += s * s
		}
		x = math.Exp(m + s*r.NormFloat64())
	case "exponential":
		x = d.Mean * r.ExpFloat64()
		if biased {
			x += d.Mean * r.ExpFloat64()
		}
	default:
		x = d.Mean
	}
	return max(1, int(math.Round(min(x, 1<<40))))
}

// sampleWindow returns the document starts (model.Seq.DocStart) of a window of T tokens cut
// from the stream as data.Loader cuts it: the window starts at a uniform offset inside a
// length-biased document (whose start the window does not hold: 0, as data.DocStarts), then
// i.i.d. documents follow.
func (d DocLengths) sampleWindow(r *rand.Rand, T int) []int32 {
	starts := make([]int32, T)
	first := d.draw(r, true)
	s, end := 0, first-r.IntN(first)
	for p := range starts {
		if p == end {
			s, end = p, p+d.draw(r, false)
		}
		starts[p] = int32(s)
	}
	return starts
}

// DocPlan is what document masking does to one plan's attention.
type DocPlan struct {
	DocLengths
	Visible        float64 `json:"visible"`           // fraction of the causal pairs visible (closed form)
	SampledVisible float64 `json:"sampled_visible"`   // the same counted on the sampled windows
	FixedVisible   float64 `json:"fixed_visible"`     // what documents all of the mean length would leave
	Idle           float64 `json:"idle"`              // ranks' idle fraction, documents as packed
	IdleBalanced   float64 `json:"idle_balanced"`     // after parallel.BalanceDocuments
	Balanced       bool    `json:"balance_documents"` // which of the two the step time uses
	CausalIdle     float64 `json:"causal_idle"`       // the schedule's idle without documents (IdleFraction)
	Windows        int     `json:"windows"`           // windows sampled
	WindowsSeed    uint64  `json:"seed"`
}

// docSampleTokens is about how many tokens plan samples to measure an imbalance.
const docSampleTokens = 1 << 22

// maxDocWindow is the longest window plan samples documents in (BalanceDocuments tries 67
// orders of every window): 4M tokens.
const maxDocWindow = 1 << 22

// docSeed seeds plan's windows, so the same plan prints the same numbers.
const docSeed = 0x9e3779b9

// docWindows is the number of windows of T tokens plan samples: about docSampleTokens, at
// least 4 and at most 256.
func docWindows(T int) int { return min(256, max(4, docSampleTokens/max(T, 1))) }

var (
	docMu    sync.Mutex
	docCache = map[string]DocPlan{}
)

// planDocuments measures document masking with lengths d for schedule name on P ranks and
// windows of T tokens, in a layer with a sliding window of W tokens (0: none). Results are
// cached.
func planDocuments(d DocLengths, name string, P, T, W int, balanced bool) (DocPlan, error) {
	key := fmt.Sprintf("%s/%g/%s/%d/%d/%d", d.Dist, d.Mean, name, P, T, W)
	docMu.Lock()
	defer docMu.Unlock()
	dp, ok := docCache[key]
	if !ok {
		var err error
		if dp, err = measureDocuments(d, name, P, T, W); err != nil {
			return DocPlan{}, err
		}
		docCache[key] = dp
	}
	dp.DocLengths, dp.Balanced = d, balanced
	return dp, nil
}

// measureDocuments computes a DocPlan: the closed-form visible fraction and the sampled
// idle fractions, with and without BalanceDocuments, under a sliding window of W (0: none)
// applied to the documents as packed and as balanced (windowStarts).
func measureDocuments(d DocLengths, name string, P, T, W int) (DocPlan, error) {
	if T > maxDocWindow {
		return DocPlan{}, fmt.Errorf("plan samples documents in windows of at most %d tokens to measure the imbalance, not seq_len %d", maxDocWindow, T)
	}
	dp := DocPlan{
		DocLengths: d, Visible: d.VisibleFraction(T, W), FixedVisible: DocLengths{Dist: "fixed", Mean: d.Mean}.VisibleFraction(T, W),
		CausalIdle: IdleFraction(name, P), Windows: docWindows(T), WindowsSeed: docSeed,
	}
	r := rand.New(rand.NewPCG(docSeed, uint64(T)))
	var pairs, sum, worst, sumB, worstB float64
	for i := range dp.Windows {
		docs := d.sampleWindow(r, T)
		starts := docs
		if W > 0 {
			starts = windowStarts(T, W, docs)
		}
		for p, s := range starts {
			pairs += float64(p - int(s) + 1)
		}
		if P <= 1 || name == "ulysses" {
			continue
		}
		span, busy, err := parallel.DocumentTime(starts, name, P)
		if err != nil {
			return DocPlan{}, fmt.Errorf("plan: documents on %s: %w", name, err)
		}
		_, bal, err := parallel.BalanceDocuments(docs, name, P, uint64(i))
		if err != nil {
			return DocPlan{}, fmt.Errorf("plan: balancing documents for %s: %w", name, err)
		}
		if W > 0 {
			bal = windowStarts(T, W, bal)
		}
		spanB, busyB, err := parallel.DocumentTime(bal, name, P)
		if err != nil {
			return DocPlan{}, fmt.Errorf("plan: documents on %s: %w", name, err)
		}
		sum, worst = sum+float64(busy)/float64(P), worst+float64(span)
		sumB, worstB = sumB+float64(busyB)/float64(P), worstB+float64(spanB)
	}
	dp.SampledVisible = pairs / float64(dp.Windows) / (float64(T) * float64(T+1) / 2)
	if worst > 0 {
		dp.Idle, dp.IdleBalanced = 1-sum/worst, 1-sumB/worstB
	}
	return dp, nil
}

// meanMax returns the mean and the largest of the ranks' work.
func meanMax(w []int64) (mean, largest float64) {
	for _, x := range w {
		mean += float64(x)
		largest = max(largest, float64(x))
	}
	return mean / float64(len(w)), largest
}

// docSummary is the line plan prints about the documents it assumed.
func docSummary(dp DocPlan, T int) string {
	how := "--doc-len"
	if dp.Assumed {
		how = "assumed: data.document_mask = true and no --doc-len gives web-like documents (parallel's BenchmarkDocMask); --doc-len N --doc-dist D say otherwise"
	}
	return fmt.Sprintf("%s in windows of %s (%s)", dp.DocLengths, seqName(T), how)
}
