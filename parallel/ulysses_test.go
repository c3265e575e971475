package parallel

import (
	"fmt"
	"strings"
	"testing"

	"distflash/model"
	"distflash/parallel/transport"
)

// TestUlyssesTraffic: every all-to-all sends (P−1)/P of the tensor a rank holds (the chunk for
// itself stays), so per rank, with n = N/P tokens, H query heads, KV kv heads, head_dim d and
// 4-byte values:
//
//	forward  ulysses.fwd.{q,o}         (P−1)/P · n·H·d · 4 each
//	         ulysses.fwd.{k,v}         (P−1)/P · n·KV·d · 4 each
//	         ulysses.fwd.lse           (P−1)/P · n·H · 4
//	backward ulysses.bwd.{q,do,dq}     (P−1)/P · n·H·d · 4 each
//	         ulysses.bwd.{k,v,dk,dv}   (P−1)/P · n·KV·d · 4 each
//	         ulysses.bwd.stats         (P−1)/P · 2·n·H · 4   (D and lse)
//
// Beside it the DeepSpeed-Ulysses paper's forward volume per link, 4·N·h/P for q, k, v, o
// with h = H·d (multi-head; (2H + 2KV)·N·d/P with GQA's smaller k, v): the measured forward
// without lse is (P−1)/P of it, the chunk each rank keeps. The backward re-gathers q, k, v, because the schedules are stateless
// between Forward and Backward (an autograd implementation keeps them: 4·N·h/P). The test
// logs the table. With fewer kv heads than ranks (GQA2 on 4 and 8 ranks) each rank receives
// the one kv head its query heads read, so k and v send (P−1)·n·d·4 each, and dk, dv come
// back the same way (the replicas' gradients are added at the owner).
func TestUlyssesTraffic(t *testing.T) {
	const T = 48
	var table []string
	heads := map[string]model.Heads{"MHA": {N: 8, KV: 8, Dim: 8}, "GQA": {N: 16, KV: 8, Dim: 4}, "GQA2": {N: 8, KV: 2, Dim: 8}}
	for _, hn := range []string{"MHA", "GQA", "GQA2"} {
		h := heads[hn]
		for _, P := range []int{1, 2, 4, 8} {
			if err := checkUlysses(h, P); err != nil {
				continue
			}
			got, err := newInputs(T, h, 9).run("ulysses", P, Options{})
			if err != nil {
				t.Fatal(err)
			}
			n, d, H, KV := int64(T/P), int64(h.Dim), int64(h.N), int64(h.KV)
			part := func(x int64) int64 { return x * int64(P-1) / int64(P) } // exact: P divides H and KV
			qs, kvs, st := part(n*H*d*4), part(n*KV*d*4), part(n*H*4)
			if KV < int64(P) { // replicated kv heads: one kv head to each of the P−1 peers
				kvs = int64(P-1) * n * d * 4
			}
			want := map[string]int64{
				"ulysses.fwd.q": qs, "ulysses.fwd.k": kvs, "ulysses.fwd.v": kvs, "ulysses.fwd.o": qs, "ulysses.fwd.lse": st,
				"ulysses.bwd.q": qs, "ulysses.bwd.k": kvs, "ulysses.bwd.v": kvs, "ulysses.bwd.do": qs, "ulysses.bwd.stats": 2 * st,
				"ulysses.bwd.dq": qs, "ulysses.bwd.dk": kvs, "ulysses.bwd.dv": kvs,
			}
			for r, tr := range got.traffic {
				for site, w := range want {
					if tr[site] != w {
						t.Errorf("%s P=%d rank %d: %s sent %d bytes, want %d", hn, P, r, site, tr[site], w)
					}
				}
				if tot, w := tr.Total(), transport.Traffic(want).Total(); tot != w {
					t.Errorf("%s P=%d rank %d: %d bytes in all (%v), want %d", hn, P, r, tot, tr, w)
				}
			}
			if P == 1 {
				continue
			}
			fwd, bwd := got.traffic[0].Sum("ulysses.fwd"), got.traffic[0].Sum("ulysses.bwd")
			ds := (2*H + 2*KV) * int64(T) * d * 4 / int64(P) // DeepSpeed-Ulysses' 4Nh/P for q, k, v, o, with GQA's smaller k, v
			burstFwd := int64(P-1) * 2 * n * KV * d * 4
			if KV < int64(P) { // replicated: k, v send (P−1)·n·d each instead of (P−1)/P·n·KV·d
				ds = 2*H*int64(T)*d*4/int64(P) + 2*n*d*4*int64(P)
			}
			if fwd-st != ds*int64(P-1)/int64(P) {
				t.Errorf("%s P=%d: forward without lse %d bytes, want (P−1)/P of %d", hn, P, fwd-st, ds)
			}
			table = append(table, fmt.Sprintf("%-4s %2d | %8d %8d | %14d  %11.3f  %7.3f | %8d",
				hn, P, fwd, bwd, ds, float64(fwd-st)/float64(ds), float64(P-1)/float64(P), burstFwd))
		}
	}
	t.Logf("Ulysses bytes per rank (N=%d, 4-byte values):\n"+
		"(DeepSpeed-Ulysses' 4Nh/P per link for q, k, v, o, written (2H+2KV)·N·d/P to cover GQA; Burst's ring forward beside)\n"+
		"hds   P | fwd      bwd      | (2H+2KV)Nd/P·4  (fwd−lse)/it  (P−1)/P | burst fwd\n%s",
		T, strings.Join(table, "\n"))
}

// TestCheckUlysses: Ulysses runs exactly when P divides the query heads and the kv heads
// split evenly (P divides KV) or are replicated (KV divides P), and otherwise says so, naming the head counts, the ranks and DistFlashAttn §4.3.
func TestCheckUlysses(t *testing.T) {
	for _, c := range []struct {
		H, KV, P int
		ok       bool
	}{
		{32, 32, 8, true},   // LLaMA-7B
		{32, 8, 8, true},    // LLaMA-GQA
		{32, 8, 16, true},   // kv heads replicated: 2 ranks per kv head
		{32, 8, 12, false},  // 12 ranks: neither divides the 32 query heads nor a multiple of 8
		{8, 2, 4, true},     // GQA test heads, kv replicated
		{8, 2, 8, true},     // one query head per rank, 4 copies of each kv head
		{12, 3, 6, true},    // 2 query heads per rank, kv replicated twice
		{12, 4, 6, false},   // 6 ranks: 4 kv heads neither divide nor are divided
		{16, 8, 32, false},  // query heads run out
		{33, 33, 4, false},  // LLaMA-33H, the case §4.3 measures
		{33, 33, 3, true},   // 33 heads on 3 ranks is fine
		{33, 11, 3, false},  // query heads divide, kv heads do not
		{33, 11, 11, true},  // both divide
		{4, 4, 8, false},    // more ranks than heads
		{16, 16, 32, false}, // LLaMA-16H beyond its head count (§4.3 "less number of heads")
		{1, 1, 1, true},
	} {
		err := checkUlysses(model.Heads{N: c.H, KV: c.KV, Dim: 64}, c.P)
		if (err == nil) != c.ok {
			t.Errorf("H=%d KV=%d P=%d: ok=%v, got %v", c.H, c.KV, c.P, c.ok, err)
			continue
		}
		if err == nil {
			continue
		}
		msg := err.Error()
		for _, part := range []string{"head", fmt.Sprintf("n_heads (%d)", c.H), fmt.Sprintf("n_kv_heads (%d)", c.KV),
			fmt.Sprintf("the %d sequence-parallel ranks", c.P), "DistFlashAttn §4.3", "33 heads"} {
			if !strings.Contains(msg, part) {
				t.Errorf("H=%d KV=%d P=%d: refusal %q does not contain %q", c.H, c.KV, c.P, msg, part)
			}
		}
	}
	if err := Check("ulysses", model.Heads{N: 33, KV: 33, Dim: 4}, 4); err == nil || !strings.Contains(err.Error(), "head") {
		t.Errorf("Check(ulysses, 33 heads, 4 ranks) = %v, want the head refusal", err)
	}
}

// TestUlyssesGQAGrouping: with several kv heads per rank, each serving several query heads,
// the contiguous head slices keep query head h on kv head h/(H/KV) (the exactness test's GQA
// case has one kv head per rank), and 33 heads run whenever P divides them.
func TestUlyssesGQAGrouping(t *testing.T) {
	for _, c := range []struct {
		T, P int
		h    model.Heads
	}{
		{48, 3, model.Heads{N: 12, KV: 6, Dim: 8}},  // 4 query heads, 2 kv heads per rank
		{48, 2, model.Heads{N: 16, KV: 4, Dim: 8}},  // 8 query heads, 2 kv heads per rank
		{48, 4, model.Heads{N: 8, KV: 4, Dim: 4}},   // 2 query heads, 1 kv head per rank
		{48, 3, model.Heads{N: 33, KV: 33, Dim: 4}}, // LLaMA-33H-like, P = 3
		{44, 11, model.Heads{N: 33, KV: 11, Dim: 4}},
		{48, 4, model.Heads{N: 8, KV: 2, Dim: 4}},  // kv replicated: 2 ranks per kv head
		{48, 8, model.Heads{N: 16, KV: 2, Dim: 4}}, // 4 ranks per kv head, 2 query heads each
		{48, 6, model.Heads{N: 12, KV: 3, Dim: 4}}, // P = 2·KV, not a power of two
		{48, 4, model.Heads{N: 4, KV: 1, Dim: 8}},  // multi-query attention: one kv head on every rank
	} {
		t.Run(fmt.Sprintf("H%d/KV%d/P%d", c.h.N, c.h.KV, c.P), func(t *testing.T) {
			if err := checkUlysses(c.h, c.P); err != nil {
				t.Fatal(err)
			}
			in := newInputs(c.T, c.h, 13)
			got, err := in.run("ulysses", c.P, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkExact(t, got, in.reference())
		})
	}
}
