package parallel

import (
	"fmt"
	"strings"
	"testing"

	"distflash/model"
	"distflash/parallel/transport"
)

// TestBurstTraffic: the bytes every rank sends, per call site, equal BurstAttention's
// formulas exactly (papers/burstattention.txt Table 1 and §4.2), for n = N/P tokens per rank,
// H query heads, KV kv heads, head_dim d and 4-byte values:
//
//	forward  burst.fwd.kv    (P−1) · 2·n·KV·d · 4       (K, V once around the ring, Alg. 1)
//	backward burst.bwd.q     (P−1) · n·H·d · 4          (Alg. 2: Q, dO, dQ travel …)
//	         burst.bwd.do    (P−1) · n·H·d · 4
//	         burst.bwd.dq    (P−1) · n·H·d · 4          (dQ starts at zero after its owner: P−1 hops, the last home)
//	         burst.bwd.stats (P−1) · 2·n·H · 4          (… with the O(N) statistics D and lse)
//
// With n = N/P that is, per rank, (P−1)/P of Table 1's forward Θ(2BZNd) (B = 1, Z → KV: the
// K, V that travel have KV heads) and (P−1)/P·(3·H·N·d + 2·H·N) in backward, beside §4.2's
// Θ(3BZNd + 2BNZ/G): the paper's statistics term counts D and lse of one step (N/G tokens),
// while they travel P−1 steps like Q, so the exact count is 2·H·N·(P−1)/P. The rank's own
// block never travels, hence the (P−1)/P.
//
// A ring that moves the key side in backward (K, V, dK, dV) sends (P−1)·4·n·KV·d·4 per rank:
// Burst's backward is smaller when H·(3d+2) < 4·KV·d, i.e. for multi-head attention with
// d > 2, but larger under GQA once H/KV > 4d/(3d+2) ≈ 4/3, because the query side is H/KV
// times the size of the key side. The test logs the table.
func TestBurstTraffic(t *testing.T) {
	const T = 48
	var table []string
	for _, hn := range []string{"MHA", "GQA", "33H"} {
		h := testHeads[hn]
		for _, P := range []int{1, 2, 3, 4, 8} {
			for _, overlap := range []bool{false, true} {
				got, err := newInputs(T, h, 7).run("burst", P, Options{Overlap: overlap})
				if err != nil {
					t.Fatal(err)
				}
				n, d, H, KV := int64(T/P), int64(h.Dim), int64(h.N), int64(h.KV)
				steps := int64(P - 1)
				want := map[string]int64{
					"burst.fwd.kv":    steps * 2 * n * KV * d * 4,
					"burst.bwd.q":     steps * n * H * d * 4,
					"burst.bwd.do":    steps * n * H * d * 4,
					"burst.bwd.dq":    steps * n * H * d * 4,
					"burst.bwd.stats": steps * 2 * n * H * 4,
				}
				for r, tr := range got.traffic {
					for site, w := range want {
						if tr[site] != w {
							t.Errorf("%s P=%d overlap=%v rank %d: %s sent %d bytes, want %d", hn, P, overlap, r, site, tr[site], w)
						}
					}
					if tot, w := tr.Total(), transport.Traffic(want).Total(); tot != w {
						t.Errorf("%s P=%d rank %d: %d bytes in all (%v), want %d", hn, P, r, tot, tr, w)
					}
				}
				if overlap || (P != 2 && P != 4 && P != 8) {
					continue
				}
				fwd, bwd := got.traffic[0].Sum("burst.fwd"), got.traffic[0].Sum("burst.bwd")
				N, G := int64(T), int64(P)
				fwdF := (G - 1) * 2 * KV * N * d * 4 / G    // (P−1)/P · 2·KV·N·d
				bwdF := (G - 1) * (3*H*N*d + 2*H*N) * 4 / G // (P−1)/P · (3·H·N·d + 2·H·N)
				paperFwd := 2 * KV * N * d * 4              // Table 1: 2BZNd (Z → KV: K, V travel)
				paperBwd := (3*H*N*d + 2*H*N/G) * 4         // §4.2: 3BZNd + 2BNZ/G, as printed
				ringBwd := steps * 4 * n * KV * d * 4       // K, V, dK, dV around a ring
				if fwd != fwdF || bwd != bwdF {
					t.Errorf("%s P=%d: rank 0 sent %d forward, %d backward; formulas %d, %d", hn, P, fwd, bwd, fwdF, bwdF)
				}
				table = append(table, fmt.Sprintf("%-3s %d | %6d %6d %6d | %6d %6d %6d | %6d %5.2f",
					hn, P, fwd, fwdF, paperFwd, bwd, bwdF, paperBwd, ringBwd, float64(bwd)/float64(ringBwd)))
				if (H*(3*d+2) < 4*KV*d) != (bwd < ringBwd) {
					t.Errorf("%s P=%d: Burst backward %d vs ring K,V,dK,dV %d contradicts H(3d+2) < 4·KV·d", hn, P, bwd, ringBwd)
				}
			}
		}
	}
	t.Logf("BurstAttention bytes sent per rank (N=%d, 4-byte values), measured | formula | paper:\n"+
		"        forward: measured, (P−1)/P·2·KV·N·d·4, Table 1 2ZNd·4\n"+
		"        backward: measured, (P−1)/P·(3HNd+2HN)·4, §4.2 (3ZNd+2NZ/G)·4\n"+
		"        ring: K, V, dK, dV per rank in backward, (P−1)·4·n·KV·d·4, and Burst's backward / ring's\n"+
		"hds P |    fwd  (P−1)/P  2ZNd |    bwd  (P−1)/P  paper |   ring burst/ring\n%s",
		T, strings.Join(table, "\n"))
}

// TestBurstSkipsMaskedBlocks: on the Contiguous layout rank r computes the forward blocks of
// ranks 0 … r (r+1 AttnForward calls) and the backward blocks of the queries of ranks r … P−1
// (P−r AttnBackward calls); the fully masked blocks are not handed to the kernel at all
// (BurstAttention §3.5), though they still travel the ring.
func TestBurstSkipsMaskedBlocks(t *testing.T) {
	const T = 48
	for _, P := range []int{1, 2, 3, 4, 8} {
		got, err := newInputs(T, testHeads["GQA"], 3).run("burst", P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		for r, w := range got.work {
			if w.AttnBlocks != int64(r+1) || w.AttnSkipped != 0 || w.AttnBackwards != int64(P-r) {
				t.Errorf("P=%d rank %d: %d forward blocks (%d skipped by the kernel), %d backward blocks; want %d, 0, %d",
					P, r, w.AttnBlocks, w.AttnSkipped, w.AttnBackwards, r+1, P-r)
			}
		}
	}
}

// TestBurstEdgeShapes: one token per rank, odd rank counts and a head_dim of 1 are exact too.
func TestBurstEdgeShapes(t *testing.T) {
	for _, c := range []struct {
		T, P int
		h    model.Heads
	}{
		{8, 8, model.Heads{N: 4, KV: 2, Dim: 8}},
		{3, 3, model.Heads{N: 33, KV: 11, Dim: 4}},
		{35, 5, model.Heads{N: 3, KV: 1, Dim: 1}},
		{14, 7, model.Heads{N: 6, KV: 3, Dim: 16}},
	} {
		t.Run(fmt.Sprintf("T%d/P%d/H%d/KV%d/d%d", c.T, c.P, c.h.N, c.h.KV, c.h.Dim), func(t *testing.T) {
			in := newInputs(c.T, c.h, 11)
			got, err := in.run("burst", c.P, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			checkExact(t, got, in.reference())
		})
	}
}
