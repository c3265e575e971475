package parallel

import (
	"math"
	"slices"
	"testing"

	"distflash/model"
	"distflash/parallel/transport"
)

// TestDistFlashPlan checks the balanced schedule itself (papers/distflashattn.txt Alg. 2,
// Fig. 1(b)) for P = 1 … 16: every off-diagonal block (r, c < r) is computed exactly once, by
// its query owner r or by the helper c; every send has its receive; every rank computes at most
// one block per step; and the idle worker-steps are P/2 for even P (all at the last step t =
// P/2, ranks 0 … P/2−1) and 0 for odd P.
func TestDistFlashPlan(t *testing.T) {
	for P := 1; P <= 16; P++ {
		seen := map[[2]int]int{}
		idle := 0
		for s := 1; s <= dfSteps(P); s++ {
			for p := 0; p < P; p++ {
				st := dfPlan(P, p, s)
				if st.kvFrom >= 0 && st.qFrom >= 0 {
					t.Fatalf("P=%d step %d rank %d computes two blocks: %+v", P, s, p, st)
				}
				switch {
				case st.kvFrom >= 0:
					seen[[2]int{p, st.kvFrom}]++
					if dfPlan(P, st.kvFrom, s).kvTo != p {
						t.Errorf("P=%d step %d: rank %d expects k, v from %d, which does not send them", P, s, p, st.kvFrom)
					}
				case st.qFrom >= 0:
					seen[[2]int{st.qFrom, p}]++
					if dfPlan(P, st.qFrom, s).qTo != p {
						t.Errorf("P=%d step %d: helper %d expects q from %d, which does not send it", P, s, p, st.qFrom)
					}
				default:
					idle++
				}
			}
		}
		for r := 0; r < P; r++ {
			for c := 0; c < r; c++ {
				if seen[[2]int{r, c}] != 1 {
					t.Errorf("P=%d: block (%d, %d) computed %d times", P, r, c, seen[[2]int{r, c}])
				}
			}
		}
		if want := (1 - P%2) * P / 2; idle != want {
			t.Errorf("P=%d: %d idle worker-steps, want %d", P, idle, want)
		}
	}
}

// dfPlanWork is the number of attention blocks rank p computes, its diagonal one included.
func dfPlanWork(P, p int) int64 {
	w := int64(1)
	for s := 1; s <= dfSteps(P); s++ {
		if st := dfPlan(P, p, s); st.kvFrom >= 0 || st.qFrom >= 0 {
			w++
		}
	}
	return w
}

// TestDistFlashLoadBalance measures the per-rank attention work (AttnForward calls that
// computed something, the diagonal block included, and AttnBackward calls likewise) for
// P = 2 … 8 and compares the idle fraction with the paper's (Fig. 1 caption, §3.2 Eq. (2)).
//
// The balanced schedule has steps = 1 + ⌊P/2⌋ time steps (the diagonal block, then Alg. 2's
// t = 1 … ⌊P/2⌋), each rank computing at most one block per step, P(P+1)/2 blocks in all. So:
//
//	idle worker-steps          = P·steps − P(P+1)/2 = P/2 (even P), 0 (odd P)
//	1 − Σ work / (P·steps)     = 1/(P+2) (even P), 0 (odd P)
//	idle worker-steps / P²     = 1/(2P) (even P), 0 (odd P)   ← the paper's Eq. (2)
//
// The paper's 1/(2P) divides the P/2 idle slots by P² (P workers × the ring's P steps); over
// the balanced schedule's own length the idle fraction is 1/(P+2), which is what the paper's
// own Fig. 5 numbers give for P = 8: 36 blocks in 5 steps, "expected speedup 7.2×" = 8·(1 − 1/10).
// The vanilla ring (Alg. 1) takes P steps for the same P(P+1)/2 blocks:
// 1 − Σ work/(P·P) = (P²−P)/(2P²).
func TestDistFlashLoadBalance(t *testing.T) {
	h := testHeads["GQA"]
	t.Logf("%2s %5s %8s %8s | %-17s %9s %9s | %9s %9s", "P", "steps", "blocks", "per-rank", "", "idle", "formula", "idle/P²", "1/(2P)")
	for P := 2; P <= 8; P++ {
		in := newInputs(6*P, h, uint64(P))
		got, err := in.run("distflash", P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		steps := 1 + dfSteps(P)
		var fwd, bwd int64
		var per []int64
		for r := 0; r < P; r++ {
			w := got.work[r]
			if want := dfPlanWork(P, r); w.AttnBlocks != want || w.AttnBackwards != want {
				t.Errorf("P=%d rank %d: %d forward and %d backward blocks, want %d", P, r, w.AttnBlocks, w.AttnBackwards, want)
			}
			if w.AttnSkipped != 0 {
				t.Errorf("P=%d rank %d: %d fully masked blocks called", P, r, w.AttnSkipped)
			}
			fwd += w.AttnBlocks
			bwd += w.AttnBackwards
			per = append(per, w.AttnBlocks)
		}
		if want := int64(P * (P + 1) / 2); fwd != want || bwd != want {
			t.Errorf("P=%d: %d forward and %d backward blocks, want %d", P, fwd, bwd, want)
		}
		idle := 1 - float64(fwd)/float64(P*steps)
		slots := float64(int64(P*steps) - fwd)
		want, paper := 0.0, 0.0
		if P%2 == 0 {
			want, paper = 1/float64(P+2), 1/float64(2*P)
		}
		if math.Abs(idle-want) > 1e-12 || math.Abs(slots/float64(P*P)-paper) > 1e-12 {
			t.Errorf("P=%d: idle fraction %.4f (want %.4f), idle slots / P² %.4f (paper %.4f)", P, idle, want, slots/float64(P*P), paper)
		}
		t.Logf("%2d %5d %8d %8v | %-17s %9.4f %9.4f | %9.4f %9.4f", P, steps, fwd, per, "distflash", idle, want, slots/float64(P*P), paper)

		ringFormula := float64(P*P-P) / float64(2*P*P)
		if slices.Contains(Names(), "ring") {
			r, err := in.run("ring", P, Options{Overlap: true})
			if err != nil {
				t.Logf("ring on P=%d: %v", P, err)
				continue
			}
			var rw int64
			var rper []int64
			for _, w := range r.work {
				rw += w.AttnBlocks
				rper = append(rper, w.AttnBlocks)
			}
			t.Logf("%2d %5d %8d %8v | %-17s %9.4f %9.4f |", P, P, rw, rper, "ring (measured)", 1-float64(rw)/float64(P*P), ringFormula)
		} else {
			t.Logf("%2d %5d %8d %8s | %-17s %9s %9.4f |", P, P, P*(P+1)/2, "", "ring (formula)", "", ringFormula)
		}
	}
}

// dfBytes is the bytes rank p of P sends under each of the schedule's call sites in one
// forward and one backward, derived from the plan in closed form (4-byte values; n tokens per
// rank; S = ⌊P/2⌋ exchange steps, S′ = ⌊(P−1)/2⌋ of them with helpers):
//
//	fwd.kv  min(S, P−1−p) · 2·n·KV·hd     k, v to p+1 … p+S (those < P)
//	fwd.q   max(0, p−S) · n·H·hd          q to a helper, at steps t ≥ P−p
//	fwd.oml max(0, S′−p) · (n·H·hd + 2·n·H)   as helper at steps t > p: partial o, m, l back
//	bwd.kv  min(S, P−1−p) · 2·n·KV·hd     as forward
//	bwd.dkv min(S, p) · 2·n·KV·hd         dk, dv of block (p, p−t) back to p−t
//	bwd.q   max(0, p−S) · (2·n·H·hd + 2·n·H)  q, dO, lse, D to a helper
//	bwd.dq  max(0, S′−p) · n·H·hd         as helper: dq back
func dfBytes(P, p, n int, h model.Heads) transport.Traffic {
	S, S1 := P/2, (P-1)/2
	qn, kn, sn := int64(n*h.N*h.Dim), int64(n*h.KV*h.Dim), int64(n*h.N)
	tr := transport.Traffic{}
	add := func(site string, count int, floats int64) {
		if count > 0 {
			tr[site] += 4 * int64(count) * floats
		}
	}
	add(dfSiteFwdKV, min(S, P-1-p), 2*kn)
	add(dfSiteFwdQ, p-S, qn)
	add(dfSiteFwdOML, S1-p, qn+2*sn)
	add(dfSiteBwdKV, min(S, P-1-p), 2*kn)
	add(dfSiteBwdDKV, min(S, p), 2*kn)
	add(dfSiteBwdQ, p-S, 2*qn+2*sn)
	add(dfSiteBwdDQ, S1-p, qn)
	return tr
}

// TestDistFlashTraffic compares the bytes every rank sends in one forward and one backward,
// per call site, exactly with dfBytes, for P = 2 … 8, MHA, GQA and 33 heads, overlap on and
// off; and prints them beside papers/distflashattn.txt App. C, whose "2·(N/P)·d × P = 2Nd"
// is what one worker fetches of K and V over all steps, halved by causality to ≈ Nd in the
// forward, and ≈ 2Nd in the backward (K, V and their gradients), d = H·hd.
//
// Summed over ranks, with K = Σ_{t≤S} (P−t) blocks done by their query owners and
// Hc = S′(S′+1)/2 by helpers (K + Hc = P(P−1)/2), in values:
//
//	forward  = K·2·n·KV·hd + Hc·(2·n·H·hd + 2·n·H)    → MHA: (P−1)·N·d + stats
//	backward = K·4·n·KV·hd + Hc·(3·n·H·hd + 2·n·H)    → MHA: ≈ (15/8)·(P−1)·N·d for large P
//
// so per rank (the paper's unit) the forward is (P−1)/P·Nd ≈ Nd and the backward a little
// under 2Nd: a helped block moves q (and o back) where the owner's would move k, v (and dk, dv
// back), the same in the forward and ¾ of it in the backward. With GQA the k, v parts shrink
// by KV/H.
func TestDistFlashTraffic(t *testing.T) {
	for _, hn := range []string{"MHA", "GQA", "33H"} {
		h := testHeads[hn]
		t.Logf("%s (H=%d, KV=%d, hd=%d); per-rank values in units of N·d, d = H·hd:", hn, h.N, h.KV, h.Dim)
		t.Logf("%2s | %10s %7s %7s %7s | %10s %7s %7s %7s | %s", "P", "fwd bytes", "mean", "max", "paper", "bwd bytes", "mean", "max", "paper", "fwd+bwd mean (paper 3Nd)")
		for P := 2; P <= 8; P++ {
			n := 6
			N := n * P
			in := newInputs(N, h, uint64(7*P))
			var runs [2]scheduleRun
			for i, overlap := range []bool{false, true} {
				got, err := in.run("distflash", P, Options{Overlap: overlap})
				if err != nil {
					t.Fatal(err)
				}
				runs[i] = got
				for r := 0; r < P; r++ {
					want := dfBytes(P, r, n, h)
					if got.traffic[r].String() != want.String() {
						t.Errorf("%s P=%d rank %d overlap=%v: sent %v, want %v", hn, P, r, overlap, got.traffic[r], want)
					}
				}
			}
			nd := float64(N * h.N * h.Dim * 4) // N·d values, in bytes
			var fwd, bwd, fmax, bmax int64
			for _, tr := range runs[1].traffic {
				f, b := tr.Sum("distflash.fwd."), tr.Sum("distflash.bwd.")
				fwd, bwd, fmax, bmax = fwd+f, bwd+b, max(fmax, f), max(bmax, b)
			}
			// the closed-form totals
			S, S1 := P/2, (P-1)/2
			K, Hc := int64(S*P-S*(S+1)/2), int64(S1*(S1+1)/2)
			qn, kn, sn := int64(n*h.N*h.Dim), int64(n*h.KV*h.Dim), int64(n*h.N)
			if K+Hc != int64(P*(P-1)/2) {
				t.Fatalf("P=%d: %d + %d blocks", P, K, Hc)
			}
			if want := 4 * (K*2*kn + Hc*(2*qn+2*sn)); fwd != want {
				t.Errorf("%s P=%d: forward %d bytes, want %d", hn, P, fwd, want)
			}
			if want := 4 * (K*4*kn + Hc*(3*qn+2*sn)); bwd != want {
				t.Errorf("%s P=%d: backward %d bytes, want %d", hn, P, bwd, want)
			}
			fp, bp := float64(fwd)/float64(P)/nd, float64(bwd)/float64(P)/nd
			t.Logf("%2d | %10d %7.3f %7.3f %7s | %10d %7.3f %7.3f %7s | %.3f", P, fwd, fp, float64(fmax)/nd, "≈1",
				bwd, bp, float64(bmax)/nd, "≈2", fp+bp)
		}
	}
}
