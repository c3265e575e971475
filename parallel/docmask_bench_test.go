package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"distflash/model"
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
//   - P4/<schedule>/{causal,web}: every schedule on 4 in-process ranks without documents and
//     with web-like document lengths (webDocs). The ranks share this machine's cores, so
//     tokens/s is the total work; the balance is read from each rank's attention FLOPs
//     counters (forward + backward, the score tiles each rank's kernel computed): idle-% is
//     1 − mean/max over the ranks, the share of the slowest rank's time the others wait
//     in a schedule whose ranks synchronise each step, and max/mean the imbalance factor;
//     web-balanced is the same documents in the order BalanceDocuments picks for the
//     schedule's layout (the remedy).
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
		}{{"causal", nil}, {"web", web}, {"web-balanced", balanced}} {
			b.Run(fmt.Sprintf("P%d/%s/%s", P, name, c.name), func(b *testing.B) {
				in.docs = c.docs
				var run scheduleRun
				for i := 0; i < b.N; i++ {
					var err error
					if run, err = in.run(name, P, Options{Overlap: true}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
				var sum, worst float64
				for _, w := range run.work {
					x := float64(w.AttnFwdFLOPs + w.AttnBwdFLOPs)
					sum += x
					worst = math.Max(worst, x)
				}
				mean := sum / float64(len(run.work))
				b.ReportMetric(100*(1-mean/worst), "idle-%")
				b.ReportMetric(worst/mean, "max/mean")
				b.ReportMetric(sum/1e9, "GFLOP")
			})
		}
	}
}
