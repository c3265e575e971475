package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// webDocs returns the document-start table (model.Seq.DocStart) of a sequence of T tokens
// packed with documents whose lengths are drawn like web text: log-normal with median 400
// tokens and σ = 1.3 (about 70% of documents under 1K tokens, a tail longer than the window);
// the last document is cut by the window.
func webDocs(T int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 5))
	d := make([]int32, T)
	for s := 0; s < T; {
		n := max(1, int(math.Exp(math.Log(400)+1.3*r.NormFloat64())))
		for p := s; p < min(T, s+n); p++ {
			d[p] = int32(s)
		}
		s += n
	}
	return d
}

// fixedDocs is the document-start table of T tokens in documents of n tokens each.
func fixedDocs(T, n int) []int32 {
	d := make([]int32, T)
	for p := range d {
		d[p] = int32(p / n * n)
	}
	return d
}

// BenchmarkDocMask measures document-masked attention (forward + backward of one sequence of
// 16K tokens) against plain causal attention:
//
//   - P1/local/{causal,docs1k}: single-worker attention without masks and with 1K-token
//     documents, whose visible work is 1/16 of causal (tokens/s; the ratio is what masking
//     saves);
//   - P4/<schedule>/{causal,web,web-balanced}: every schedule on 4 in-process ranks without
//     documents, with web-like document lengths (webDocs), and with the same documents in the
//     order BalanceDocuments picks for the schedule (the remedy). The ranks share this
//     machine's cores, so tokens/s is the total work, not the step time of 4 devices. The
//     balance is read from each rank's attention FLOPs counters (forward + backward, the score
//     tiles each rank's kernel computed), recorded call by call after the timed runs:
//     idle-% is 1 − mean/max of the ranks' totals (what the ranks would wait if they never
//     synchronised before the end), step-idle-% is 1 − mean/span with span the sum over the
//     steps of the busiest rank's FLOPs at that step (the calls split into steps as
//     DocumentSteps places them, which TestDocumentStepsMatchSchedules checks): what they
//     wait when every step waits for its slowest rank (balance.go). model-step-idle-% is
//     the same from DocumentTime's exact visible pairs (no tile rounding), the measure
//     BalanceDocuments minimises and plan reports. sim-tokens/s is what 4 devices would do if
//     every step waited for its slowest rank: the recorded run's calls execute one at a
//     time, each timed, and the step's time is its slowest rank's (countedIdle); tokens/s
//     of 16K over the sum of those, attention calls only (no communication, no merges).
//
// Run with -benchtime=1x: one iteration is seconds.
func BenchmarkDocMask(b *testing.B) {
	const T = 16384
	h := model.Heads{N: 4, KV: 4, Dim: 16}
	in := newInputs(T, h, 1)
	for _, c := range []struct {
		name string
		docs []int32
	}{{"causal", nil}, {"docs1k", fixedDocs(T, 1024)}} {
		b.Run("P1/local/"+c.name, func(b *testing.B) {
			in.docs = c.docs
			for i := 0; i < b.N; i++ {
				in.reference()
			}
			b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
	const P = 4
	web := webDocs(T, 1)
	for _, name := range Names() {
		_, balanced, err := BalanceDocuments(web, name, P, 1)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			docs []int32
		}{{"causal", make([]int32, T)}, {"web", web}, {"web-balanced", balanced}} {
			b.Run(fmt.Sprintf("P%d/%s/%s", P, name, c.name), func(b *testing.B) {
				in.docs = c.docs
				if c.name == "causal" {
					in.docs = nil
				}
				for i := 0; i < b.N; i++ {
					if _, err := in.run(name, P, Options{Overlap: true}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
				b.StopTimer()
				idle, stepIdle, flops, stepTime, err := countedIdle(in, name, P, c.docs)
				if err != nil {
					b.Fatal(err)
				}
				span, busy, err := DocumentTime(c.docs, name, P)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(100*idle, "idle-%")
				b.ReportMetric(100*stepIdle, "step-idle-%")
				b.ReportMetric(100*(1-float64(busy)/float64(P*span)), "model-step-idle-%")
				b.ReportMetric(flops/1e9, "GFLOP")
				b.ReportMetric(T/stepTime.Seconds(), "sim-tokens/s")
			})
		}
	}
}

// countedIdle runs schedule name once on P ranks with recording backends whose calls run
// one at a time, and returns the idle fractions of the counted attention FLOPs (forward +
// backward): over the ranks' totals and over the steps (the calls split into DocumentSteps'
// steps), the FLOPs of all ranks, and the attention time P devices would take if each step
// waited for its slowest rank: the sum over steps of the largest rank's measured call times.
func countedIdle(in attnInputs, name string, P int, docs []int32) (idle, stepIdle, flops float64, stepTime time.Duration, err error) {
	fwd, bwd, err := DocumentSteps(docs, name, P)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	recs := make([]*recBackend, P)
	out := in.newRun(P)
	var serial sync.Mutex
	err = transport.NewWorld(P).Run(func(c transport.Comm) error {
		be := &recBackend{Backend: kernels.NewCPU(), serial: &serial}
		recs[c.Rank()] = be
		s, err := NewAttention(name, c, be, Options{Overlap: true})
		if err != nil {
			return err
		}
		return in.runRank(s, c, be, &out)
	})
	if err != nil {
		return 0, 0, 0, 0, err
	}
	var worst, span float64
	for _, ph := range []struct {
		bwd   bool
		steps [][]int64
	}{{false, fwd}, {true, bwd}} {
		perStep := make([][]int64, P)        // [rank][step] FLOPs
		perDur := make([][]time.Duration, P) // [rank][step] time
		for r, rec := range recs {
			calls := rec.phase(ph.bwd)
			if len(ph.steps) == 1 { // one phase (attn2d, ulysses): no split needed
				perStep[r], perDur[r] = []int64{0}, []time.Duration{0}
				for _, c := range calls {
					perStep[r][0] += c.flops
					perDur[r][0] += c.dur
				}
				continue
			}
			if perStep[r], perDur[r], err = callSteps(calls, ph.steps, r); err != nil {
				return 0, 0, 0, 0, fmt.Errorf("%s rank %d: %w", name, r, err)
			}
		}
		for s := range ph.steps {
			var m int64
			var d time.Duration
			for r := range recs {
				m, d = max(m, perStep[r][s]), max(d, perDur[r][s])
			}
			span += float64(m)
			stepTime += d
		}
	}
	for r := range recs {
		x := float64(out.work[r].AttnFwdFLOPs + out.work[r].AttnBwdFLOPs)
		flops += x
		worst = max(worst, x)
	}
	mean := flops / float64(P)
	return 1 - mean/worst, 1 - mean/span, flops, stepTime, nil
}
