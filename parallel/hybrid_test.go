package parallel

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// hybridOuter are the schedules that run between Ulysses groups.
var hybridOuter = []string{"distflash", "ring", "zigzag", "burst"}

// hybridHeads are the head counts of the hybrid tests: MHA, GQA with 2 kv heads (replicated
// when U = 4 or 8), 33 heads (only U = 3 divides them) and 33 heads over 11 kv heads (no U ≤ 8
// runs: 3 divides the query heads, not the kv heads).
var hybridHeads = map[string]model.Heads{
	"MHA":      {N: 4, KV: 4, Dim: 8},
	"GQA":      {N: 8, KV: 2, Dim: 8},
	"33H":      {N: 33, KV: 33, Dim: 4},
	"33H/11KV": {N: 33, KV: 11, Dim: 4},
}

// runHybrid runs schedule name between Ulysses groups of U on P in-process ranks.
func (in attnInputs) runHybrid(name string, P, U int, opt Options) (scheduleRun, error) {
	opt.UlyssesDegree = U
	return in.runOn(transport.NewWorld(P), name, opt)
}

// TestHybridExact: every factorisation P = U × P/U with P ≤ 8 and U > 1, every outer
// schedule, MHA, GQA and 33 heads, with and without document masks, gives the output, lse and
// dQ, dK, dV of single-worker attention. A head count U does not divide is refused by
// CheckHybrid naming the key, the heads and U.
func TestHybridExact(t *testing.T) {
	docNames := []string{"", "short", "rankedges", "singles"}
	for P := 2; P <= 8; P++ {
		T := 6 * P // two zigzag chunks of 3 tokens per rank
		for U := 2; U <= P; U++ {
			if P%U != 0 {
				continue
			}
			for _, name := range hybridOuter {
				for hn, h := range hybridHeads {
					t.Run(fmt.Sprintf("P%d/U%d/%s/%s", P, U, name, hn), func(t *testing.T) {
						if err := CheckHybrid(name, h, P, U); err != nil {
							for _, part := range []string{fmt.Sprintf("parallelism.ulysses_degree = %d", U), fmt.Sprintf("n_heads (%d)", h.N), fmt.Sprintf("n_kv_heads (%d)", h.KV)} {
								if !strings.Contains(err.Error(), part) {
									t.Errorf("refusal %q does not say %q", err, part)
								}
							}
							if h.N%U == 0 && (h.KV%U == 0 || U%h.KV == 0) {
								t.Errorf("refused heads U divides: %v", err)
							}
							return
						}
						for i, dn := range docNames {
							in := newInputs(T, h, uint64(P*100+U*10+h.N))
							if dn != "" {
								in.docs = docTables(T, P, uint64(P))[dn]
							}
							want := in.reference()
							got, err := in.runHybrid(name, P, U, Options{Overlap: i%2 == 0})
							if err != nil {
								t.Fatal(err)
							}
							t.Run("docs="+dn, func(t *testing.T) {
								checkExact(t, got, want)
								for _, x := range slices.Concat(got.o, got.dq, got.dk, got.dv) {
									if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
										t.Fatalf("non-finite value %v", x)
									}
								}
							})
						}
					})
				}
			}
		}
	}
}

// TestHybridGroupsHoldOuterBlocks: the token placement the hybrid relies on (hybrid.go): the
// U consecutive ranks of group g hold, together, exactly the tokens that the outer layout
// gives rank g of P/U, for the layouts of the outer schedules; Cyclic (attn2d) does not unless
// one group holds every rank, which is one reason attn2d refuses ulysses_degree > 1.
func TestHybridGroupsHoldOuterBlocks(t *testing.T) {
	for _, l := range []Layout{Contiguous, ZigZag, Cyclic} {
		for P := 2; P <= 8; P++ {
			for U := 2; U <= P; U++ {
				if P%U != 0 {
					continue
				}
				T := 2 * P * 3
				holds := true
				for g := 0; g < P/U; g++ {
					var group []int32
					for j := 0; j < U; j++ {
						group = append(group, l.MustPositions(T, P, g*U+j)...)
					}
					slices.Sort(group)
					want := slices.Sorted(slices.Values(l.MustPositions(T, P/U, g)))
					holds = holds && slices.Equal(group, want)
				}
				if holds != (l != Cyclic || U == P) { // one group holds everything
					t.Errorf("%s P=%d U=%d: groups hold the outer blocks = %v", l, P, U, holds)
				}
			}
		}
	}
}

// TestHybridRefusals: what the hybrid cannot run is refused, by CheckHybrid and by
// NewAttention, with the key, the value and the reason.
func TestHybridRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		h     model.Heads
		P, U  int
		parts []string
	}{
		{"zigzag", testHeads["MHA"], 4, 3, []string{"parallelism.ulysses_degree = 3", "sequence_parallel_degree = 4", "must divide"}},
		{"ring", testHeads["MHA"], 8, 0, []string{"parallelism.ulysses_degree = 0", "at least 1"}},
		{"attn2d", testHeads["MHA"], 4, 2, []string{"parallelism.ulysses_degree = 2", "attn2d", "cyclic"}},
		{"distflash", model.Heads{N: 33, KV: 33, Dim: 4}, 4, 2, []string{"parallelism.ulysses_degree = 2", "n_heads (33)", "divisible by 2"}},
		{"burst", model.Heads{N: 33, KV: 11, Dim: 4}, 6, 3, []string{"parallelism.ulysses_degree = 3", "n_kv_heads (11)"}},
		{"ring", model.Heads{N: 12, KV: 4, Dim: 4}, 6, 6, []string{"parallelism.ulysses_degree = 6", "n_kv_heads (4)"}},
		{"ulysses", testHeads["MHA"], 4, 3, []string{"parallelism.ulysses_degree = 3", "must divide"}},
	} {
		err := CheckHybrid(c.name, c.h, c.P, c.U)
		if err == nil {
			t.Errorf("%s H=%d KV=%d P=%d U=%d: accepted", c.name, c.h.N, c.h.KV, c.P, c.U)
			continue
		}
		for _, part := range c.parts {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("%s P=%d U=%d: refusal %q does not say %q", c.name, c.P, c.U, err, part)
			}
		}
		if c.U > 1 && (c.P%c.U != 0 || c.name == "attn2d") {
			w := transport.NewWorld(c.P)
			if _, err := NewAttention(c.name, w.Comm(0), kernels.NewCPU(), Options{UlyssesDegree: c.U}); err == nil {
				t.Errorf("NewAttention(%s, P=%d, U=%d) accepted", c.name, c.P, c.U)
			}
		}
	}
	// ulysses_degree with the ulysses schedule is plain Ulysses over every rank; 1 is off
	for _, c := range []struct {
		name string
		P, U int
	}{{"ulysses", 4, 2}, {"ulysses", 4, 4}, {"attn2d", 4, 1}, {"zigzag", 4, 1}} {
		if err := CheckHybrid(c.name, testHeads["MHA"], c.P, c.U); err != nil {
			t.Errorf("%s P=%d U=%d: %v", c.name, c.P, c.U, err)
		}
	}
}

// TestHybridUlyssesIsPlain: parallelism.attention = "ulysses" with ulysses_degree = U < P runs
// plain Ulysses over the P ranks: the same bits and the same bytes.
func TestHybridUlyssesIsPlain(t *testing.T) {
	in := newInputs(24, testHeads["GQA"], 4)
	a, err := in.run("ulysses", 4, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := in.runHybrid("ulysses", 4, 2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.o, b.o) || !slices.Equal(a.dk, b.dk) || a.traffic[0].String() != b.traffic[0].String() {
		t.Errorf("ulysses with ulysses_degree = 2 differs from plain ulysses: traffic %v vs %v", b.traffic[0], a.traffic[0])
	}
}

// TestHybridTraffic counts the hybrid's bytes per call site on every rank. With n = T/P tokens
// per rank, d = head_dim, hp = H/U query heads and kvp kv heads per rank after the all-to-all
// (kvp = KV/U, or 1 with replicated kv heads), 4-byte values:
//
//	hybrid.fwd.{q,o}, hybrid.bwd.{q,do,dq}     (U−1)·n·hp·d·4 each
//	hybrid.fwd.{k,v}, hybrid.bwd.{k,v,dk,dv}   (U−1)·n·kvp·d·4 each
//	hybrid.fwd.lse                             (U−1)·n·hp·4
//	hybrid.bwd.stats                           2·(U−1)·n·hp·4 (D and lse)
//	hybrid.split                               2 Splits, each an all-gather of (color, key): 2·(P−1)·2·4
//
// and the outer schedule's own sites carry, on rank (g, i), exactly what rank g of the outer
// schedule run alone on P/U ranks with hp query heads and kvp kv heads over the whole sequence
// sends. The hybrid's all-to-all sites are the only traffic inside a group; the outer sites
// the only traffic between groups. Document masks change no byte.
func TestHybridTraffic(t *testing.T) {
	const T = 48
	for _, c := range []struct {
		name string
		hn   string
		P, U int
	}{
		{"zigzag", "MHA", 4, 2}, {"distflash", "GQA", 8, 2}, {"ring", "GQA", 8, 4}, {"burst", "GQA", 8, 8},
		{"zigzag", "33H", 6, 3}, {"distflash", "MHA", 6, 2},
	} {
		t.Run(fmt.Sprintf("%s/%s/P%d/U%d", c.name, c.hn, c.P, c.U), func(t *testing.T) {
			h := hybridHeads[c.hn]
			if err := CheckHybrid(c.name, h, c.P, c.U); err != nil {
				t.Fatal(err)
			}
			in := newInputs(T, h, 7)
			got, err := in.runHybrid(c.name, c.P, c.U, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			in.docs = docTables(T, c.P, 7)["short"]
			masked, err := in.runHybrid(c.name, c.P, c.U, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			hs := newHeadSplit(h, c.U)
			G := c.P / c.U
			outer, err := newInputs(T, hs.local(h), 7).run(c.name, G, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			n, d, U1 := int64(T/c.P), int64(h.Dim), int64(c.U-1)
			qs, kvs, st := U1*n*int64(hs.hp)*d*4, U1*n*int64(hs.kvp)*d*4, U1*n*int64(hs.hp)*4
			want := transport.Traffic{
				"hybrid.fwd.q": qs, "hybrid.fwd.k": kvs, "hybrid.fwd.v": kvs, "hybrid.fwd.o": qs, "hybrid.fwd.lse": st,
				"hybrid.bwd.q": qs, "hybrid.bwd.k": kvs, "hybrid.bwd.v": kvs, "hybrid.bwd.do": qs,
				"hybrid.bwd.stats": 2 * st, "hybrid.bwd.dq": qs, "hybrid.bwd.dk": kvs, "hybrid.bwd.dv": kvs,
				hySiteSplit: int64(2 * (c.P - 1) * 2 * 4),
			}
			for r, tr := range got.traffic {
				w := transport.Traffic{}
				for k, v := range want {
					w[k] = v
				}
				for k, v := range outer.traffic[r/c.U] {
					w[k] = v
				}
				if tr.String() != w.String() {
					t.Errorf("rank %d sent\n  %v\nwant\n  %v", r, tr, w)
				}
				for site, b := range masked.traffic[r] { // documents add no bytes (a ring may send fewer)
					if b > tr[site] || strings.HasPrefix(site, "hybrid.") && b != tr[site] {
						t.Errorf("rank %d: %s moves %d bytes with documents, %d without", r, site, b, tr[site])
					}
				}
			}
			t.Logf("rank 0: inside the group (all-to-all) %d bytes, between groups (%s on %d ranks) %d bytes",
				got.traffic[0].Sum("hybrid.")-want[hySiteSplit], c.name, G, outer.traffic[0].Total())
		})
	}
}

// TestHybridOverlapBitIdentical: overlap changes when the outer schedule's transfers happen,
// not the arithmetic.
func TestHybridOverlapBitIdentical(t *testing.T) {
	for _, name := range hybridOuter {
		in := newInputs(48, hybridHeads["GQA"], 3)
		a, err := in.runHybrid(name, 8, 2, Options{Overlap: false})
		if err != nil {
			t.Fatal(err)
		}
		b, err := in.runHybrid(name, 8, 2, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.o, b.o) || !slices.Equal(a.lse, b.lse) || !slices.Equal(a.dq, b.dq) || !slices.Equal(a.dk, b.dk) || !slices.Equal(a.dv, b.dv) {
			t.Errorf("%s: results differ between overlap off and on", name)
		}
	}
}
