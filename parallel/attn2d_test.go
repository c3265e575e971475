package parallel

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// attn2dRunMany runs the Attention2D schedule, with or without the paper's k, v transpose
// (Alg. 1 line 2, Alg. 3 line 9), on P in-process ranks over each of ins in turn, on one
// schedule instance per rank (so its buffers and sub-communicators are reused across calls).
// It is scheduleRun's run for a schedule built directly rather than by name; each result's
// traffic is the cumulative count after that call.
func attn2dRunMany(ins []attnInputs, P int, opt Options, transpose bool) ([]scheduleRun, error) {
	outs := make([]scheduleRun, len(ins))
	for i, in := range ins {
		outs[i] = in.newRun(P)
	}
	err := transport.NewWorld(P).Run(func(c transport.Comm) error {
		be := kernels.NewCPU()
		s := &attn2d{c: c, be: be, opt: opt, transpose: transpose}
		for i, in := range ins {
			if err := in.runRank(s, c, be, &outs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return outs, err
}

// TestAttn2DGrid: the grid is Pr × Pc with Pr the largest divisor of P not above √P (§3.2),
// and the transpose of Alg. 1 line 2 (column-major index i + j·Pr to row-major i·Pc + j) is a
// permutation whose inverse is attn2dColMajor.
func TestAttn2DGrid(t *testing.T) {
	want := map[int][2]int{
		1: {1, 1}, 2: {1, 2}, 3: {1, 3}, 4: {2, 2}, 5: {1, 5}, 6: {2, 3}, 7: {1, 7}, 8: {2, 4},
		9: {3, 3}, 10: {2, 5}, 11: {1, 11}, 12: {3, 4}, 13: {1, 13}, 14: {2, 7}, 15: {3, 5}, 16: {4, 4},
	}
	for P := 1; P <= 16; P++ {
		r, c := attn2dGrid(P)
		if [2]int{r, c} != want[P] {
			t.Errorf("P=%d: grid %d×%d, want %d×%d", P, r, c, want[P][0], want[P][1])
		}
		seen := make([]bool, P)
		for p := 0; p < P; p++ {
			x := attn2dRowMajor(p, r, c)
			if x < 0 || x >= P || seen[x] {
				t.Fatalf("P=%d: row-major index of rank %d is %d: not a permutation", P, p, x)
			}
			seen[x] = true
			if back := attn2dColMajor(x, r, c); back != p {
				t.Errorf("P=%d: attn2dColMajor(%d) = %d, want %d", P, x, back, p)
			}
		}
	}
}

// TestAttn2DExact: output, lse and gradients equal single-worker attention on grids that
// TestSchedulesExact does not reach (1×5, 2×3, 3×3, 3×4, 4×4) and, for every P, with the
// paper's transpose; overlap on and off are bit-identical, with the transpose too. The
// schedule is also reused across calls of different lengths and head geometries.
func TestAttn2DExact(t *testing.T) {
	for _, transpose := range []bool{false, true} {
		for _, P := range []int{1, 2, 3, 4, 5, 6, 8, 9, 12, 16} {
			if !transpose && P <= 4 || !transpose && P == 8 {
				continue // TestSchedulesExact's
			}
			for hn, h := range testHeads {
				t.Run(fmt.Sprintf("transpose=%v/P%d/%s", transpose, P, hn), func(t *testing.T) {
					in := newInputs(6*P, h, uint64(P*31+h.N))
					want := in.reference()
					var runs [2]scheduleRun
					for i, overlap := range []bool{false, true} {
						got, err := attn2dRunMany([]attnInputs{in}, P, Options{Overlap: overlap}, transpose)
						if err != nil {
							t.Fatal(err)
						}
						t.Logf("overlap=%v", overlap)
						checkExact(t, got[0], want)
						runs[i] = got[0]
					}
					a, b := runs[0], runs[1]
					for _, c := range []struct {
						what string
						x, y []float32
					}{{"o", a.o, b.o}, {"lse", a.lse, b.lse}, {"dq", a.dq, b.dq}, {"dk", a.dk, b.dk}, {"dv", a.dv, b.dv}} {
						if !slices.Equal(c.x, c.y) {
							t.Errorf("%s differs between overlap off and on", c.what)
						}
					}
				})
			}
		}
	}
	for _, transpose := range []bool{false, true} {
		for _, overlap := range []bool{false, true} {
			ins := []attnInputs{newInputs(24, testHeads["MHA"], 1), newInputs(24, testHeads["MHA"], 2),
				newInputs(36, testHeads["GQA"], 3), newInputs(12, testHeads["33H"], 4)}
			got, err := attn2dRunMany(ins, 6, Options{Overlap: overlap}, transpose)
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range ins {
				t.Logf("repeated calls, transpose=%v overlap=%v, call %d", transpose, overlap, i)
				checkExact(t, got[i], in.reference())
			}
		}
	}
}

// attn2dBytes is the exact number of bytes rank p sends, per call site, in one forward and
// one backward of Attention2D on P ranks with n tokens per rank (the first call, so it
// includes the two Splits), derived for this implementation (see attn2d.go) from §3.3:
//
//	split           2 Splits, each an all-gather of (color, key):      2·(P−1)·2
//	fwd.q           all-gather of q in the row:                        (Pc−1)·qn
//	fwd.kv          all-gather of k, v in the column:                  (Pr−1)·2·kn
//	fwd.out         reduce-scatter of (o, m, l) in the row:            (Pc−1)·(qn + 2·n·H)
//	bwd.q           all-gather of q, dO, lse, D in the row:            (Pc−1)·(2·qn + 2·n·H)
//	bwd.kv          all-gather of k, v in the column:                  (Pr−1)·2·kn
//	bwd.dq          reduce-scatter of dq in the row:                   (Pc−1)·qn
//	bwd.dkv         reduce-scatter of dk, dv in the column:            (Pr−1)·2·kn
//	*.transpose     with the transpose, when i·Pc + j ≠ p: 2·kn each (fwd k, v; bwd k, v;
//	                bwd dk, dv)
//
// values of 4 bytes, qn = n·H·hd, kn = n·KV·hd.
func attn2dBytes(P, p, n int, h model.Heads, transpose bool) transport.Traffic {
	Pr, Pc := attn2dGrid(P)
	qn, kn, nh := n*h.N*h.Dim, n*h.KV*h.Dim, n*h.N
	t := transport.Traffic{}
	add := func(site string, values int) {
		if values > 0 {
			t[site] += 4 * int64(values)
		}
	}
	add(a2dSiteSplit, 2*(P-1)*2)
	add(a2dSiteFwdQ, (Pc-1)*qn)
	add(a2dSiteFwdKV, (Pr-1)*2*kn)
	add(a2dSiteFwdOut, (Pc-1)*(qn+2*nh))
	add(a2dSiteBwdQ, (Pc-1)*(2*qn+2*nh))
	add(a2dSiteBwdKV, (Pr-1)*2*kn)
	add(a2dSiteBwdDQ, (Pc-1)*qn)
	add(a2dSiteBwdDKV, (Pr-1)*2*kn)
	if transpose && attn2dRowMajor(p, Pr, Pc) != p {
		add(a2dSiteFwdT, 2*kn)
		add(a2dSiteBwdT, 2*kn)
		add(a2dSiteBwdDKVT, 2*kn)
	}
	return t
}

// attn2dPaperValues is §3.3's per-rank count for a square √P × √P grid, single batch, per
// head of dimension d (MHA), in values: forward the transpose of k, v (2·N·d/P, line 2), the
// all-gathers of q, k, v (3·(√P−1)·N·d/P, lines 3–4) and the reduce-scatter of o
// ((√P−1)·N·d/P, line 6; m and l not counted); backward the all-gathers of q, O, dO, k, v and
// reduce-scatters of dq, dk, dv (8·(√P−1)·N·d/P, Alg. 3 lines 4, 5, 7, 8) and the transpose
// of dk, dv (2·N·d/P, line 9).
func attn2dPaperValues(P, n, hd, heads int) (fwd, bwd float64) {
	s := math.Sqrt(float64(P))
	nd := float64(n * hd * heads)
	return 2*nd + 4*(s-1)*nd, 8*(s-1)*nd + 2*nd
}

// TestAttn2DTraffic: every rank sends exactly attn2dBytes per call site, for P = 1 … 16 on
// every grid shape, MHA, GQA and 33 heads, overlap on and off, with and without the
// transpose; and a table, for P = 4, 8, 9, 16, of per-rank bytes per layer against ring
// attention's 2·(P−1)·kn forward and (2·(P−1) + 2·P)·kn backward, and against §3.3's count
// for square grids.
func TestAttn2DTraffic(t *testing.T) {
	for _, transpose := range []bool{false, true} {
		for _, P := range []int{1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16} {
			T := 8 * P
			for hn, h := range testHeads {
				for _, overlap := range []bool{false, true} {
					in := newInputs(T, h, 11)
					var got scheduleRun
					if transpose {
						runs, err := attn2dRunMany([]attnInputs{in}, P, Options{Overlap: overlap}, true)
						if err != nil {
							t.Fatal(err)
						}
						got = runs[0]
					} else {
						var err error
						if got, err = in.run("attn2d", P, Options{Overlap: overlap}); err != nil {
							t.Fatal(err)
						}
					}
					for r := 0; r < P; r++ {
						want := attn2dBytes(P, r, T/P, h, transpose)
						if got.traffic[r].String() != want.String() {
							t.Errorf("transpose=%v P=%d %s overlap=%v rank %d: sent %v, want %v", transpose, P, hn, overlap, r, got.traffic[r], want)
						}
					}
				}
			}
		}
	}

	const T = 144 // a multiple of every P of the table
	for _, hn := range []string{"MHA", "GQA"} {
		h := testHeads[hn]
		t.Logf("%s (H=%d, KV=%d, hd=%d), T=%d: bytes per rank per layer, max over ranks", hn, h.N, h.KV, h.Dim, T)
		t.Logf("%3s %5s | %9s %9s | %9s %9s | %9s %9s | %9s %9s | %9s %9s", "P", "grid",
			"a2d fwd", "a2d bwd", "+T fwd", "+T bwd", "§3.3 fwd", "§3.3 bwd", "ring fwd", "ring bwd", "a2d/ring", "+T/ring")
		for _, P := range []int{4, 8, 9, 16} {
			in := newInputs(T, h, 13)
			n := T / P
			Pr, Pc := attn2dGrid(P)
			got, err := in.run("attn2d", P, Options{})
			if err != nil {
				t.Fatal(err)
			}
			gotT, err := attn2dRunMany([]attnInputs{in}, P, Options{}, true)
			if err != nil {
				t.Fatal(err)
			}
			maxOver := func(tr []transport.Traffic, prefix string) int64 {
				var m int64
				for _, x := range tr {
					m = max(m, x.Sum(prefix))
				}
				return m
			}
			af, ab := maxOver(got.traffic, "attn2d.fwd."), maxOver(got.traffic, "attn2d.bwd.")
			tf, tb := maxOver(gotT[0].traffic, "attn2d.fwd."), maxOver(gotT[0].traffic, "attn2d.bwd.")
			kn := int64(n * h.KV * h.Dim)
			rf, rb := 4*2*int64(P-1)*kn, 4*(2*int64(P-1)+2*int64(P))*kn
			if slices.Contains(Names(), "ring") {
				r, err := in.run("ring", P, Options{})
				if err != nil {
					t.Fatal(err)
				}
				rf, rb = 0, 0
				for _, x := range r.traffic {
					rf, rb = max(rf, x["ring.fwd.kv"]), max(rb, x["ring.bwd.kv"]+x["ring.bwd.dkv"])
				}
			}
			paper := "        -         -"
			if Pr == Pc && h.N == h.KV {
				pf, pb := attn2dPaperValues(P, n, h.Dim, h.N)
				paper = fmt.Sprintf("%9.0f %9.0f", 4*pf, 4*pb)
			}
			t.Logf("%3d %2d×%-2d | %9d %9d | %9d %9d | %s | %9d %9d | %9.2f %9.2f", P, Pr, Pc, af, ab, tf, tb, paper, rf, rb,
				float64(af+ab)/float64(rf+rb), float64(tf+tb)/float64(rf+rb))
		}
	}
}

// attn2dVisiblePairs counts the (query, key) pairs the causal mask leaves visible to rank
// (i, j) of the grid: its row's queries against its column's keys, from their positions.
func attn2dVisiblePairs(T, P, p int) int64 {
	Pr, Pc := attn2dGrid(P)
	i, j := p%Pr, p/Pr
	var c int64
	for a := 0; a < Pc; a++ {
		for b := 0; b < Pr; b++ {
			for _, qp := range Cyclic.MustPositions(T, P, i+a*Pr) {
				for _, kp := range Cyclic.MustPositions(T, P, b+j*Pr) {
					if qp >= kp {
						c++
					}
				}
			}
		}
	}
	return c
}

// TestAttn2DLoadBalance: the cyclic layout balances the causal work (§3.2, Fig. 2). Rank
// (i, j) computes Pc·Pr blocks, query block of world rank r (positions r + P·t) against key
// block of world rank x (positions x + P·u); key u is visible to query t iff u ≤ t (x ≤ r) or
// u < t (x > r), so each block has n(n+1)/2 or n(n−1)/2 visible pairs, and
//
//	max/min over ranks of the visible pairs ≤ (n+1)/(n−1).
//
// The counted FLOPs (per 64×128 tile with a visible pair) of the two kinds of block are equal
// unless n ≡ 1 (mod 128), so the measured AttnFwdFLOPs and AttnBwdFLOPs are within the same
// bound (equal here). For contrast, the contiguous layout's ratio is about 2P−1.
func TestAttn2DLoadBalance(t *testing.T) {
	const T = 2304 // a multiple of every P below; n − 1 is never a multiple of 128
	h := model.Heads{N: 2, KV: 1, Dim: 8}
	in := newInputs(T, h, 17)
	for _, P := range []int{2, 3, 4, 8, 9, 16} {
		got, err := in.run("attn2d", P, Options{})
		if err != nil {
			t.Fatal(err)
		}
		n := T / P
		bound := float64(n+1) / float64(n-1)
		ratio := func(x func(r int) int64) (float64, int64, int64) {
			lo, hi := int64(math.MaxInt64), int64(0)
			for r := 0; r < P; r++ {
				lo, hi = min(lo, x(r)), max(hi, x(r))
			}
			return float64(hi) / float64(lo), lo, hi
		}
		fwd, fLo, fHi := ratio(func(r int) int64 { return got.work[r].AttnFwdFLOPs })
		bwd, _, _ := ratio(func(r int) int64 { return got.work[r].AttnBwdFLOPs })
		pairs, _, _ := ratio(func(r int) int64 { return attn2dVisiblePairs(T, P, r) })
		contig := (float64(P-1)*float64(n)*float64(n) + float64(n)*float64(n+1)/2) / (float64(n) * float64(n+1) / 2)
		Pr, Pc := attn2dGrid(P)
		t.Logf("P=%2d (%d×%d) n=%4d: max/min fwd FLOPs %.4f (%d … %d), bwd FLOPs %.4f, visible pairs %.4f, bound %.4f; contiguous layout %.1f",
			P, Pr, Pc, n, fwd, fLo, fHi, bwd, pairs, bound, contig)
		for _, c := range []struct {
			what string
			r    float64
		}{{"fwd FLOPs", fwd}, {"bwd FLOPs", bwd}, {"visible pairs", pairs}} {
			if c.r > bound {
				t.Errorf("P=%d: %s max/min %.4f > (n+1)/(n−1) = %.4f", P, c.what, c.r, bound)
			}
		}
	}
}
