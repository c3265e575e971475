package plan

import (
	"fmt"

	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
)

// hybridTraffic predicts one layer's attention bytes per rank (fp32, as the in-process world
// sends them) for the hybrid of parallelism.ulysses_degree = U (parallel/hybrid.go) on SP
// sequence-parallel ranks with T tokens under a sliding window of W (0: none), nodes of gpn
// ranks, the forward run fwdPasses times: the busiest rank's forward and backward bytes, the sum
// over the SP ranks, and the fraction of them that crosses between nodes.
//
// Inside a group of U consecutive ranks (one node when U divides gpn: mpirun's by-slot
// mapping) the all-to-alls send, per rank with n = T/SP tokens, hp = H/U query heads and kvp
// kv heads after the all-to-all, head_dim d, 4 bytes a value:
//
//	forward   (U−1)·n·(2·hp·d + 2·kvp·d + hp)·4     q, k, v, o, lse
//	backward  (U−1)·n·(3·hp·d + 4·kvp·d + 2·hp)·4   q, k, v, do, D and lse; dq, dk, dv back
//
// Between the groups the outer schedule runs on SP/U ranks with hp query heads and kvp kv
// heads over all T tokens (U of them side by side, rank i of every group in ring i): its bytes
// are measured like a plain schedule's (measureTraffic), and which of them cross between nodes
// follows from outer rank g of ring i being rank g·U+i.
func hybridTraffic(name string, h model.Heads, SP, U, gpn, T, W int, fwdPasses float64, prec kernels.Precision) (fwd, bwd, total, cross float64, err error) {
	if SP%U != 0 || h.N%U != 0 {
		return 0, 0, 0, 0, fmt.Errorf("plan: ulysses_degree %d on %d ranks with %d heads", U, SP, h.N)
	}
	hp, kvp := h.N/U, max(h.KV/U, 1)
	G := SP / U
	n, u1 := float64(T)/float64(SP), float64(U-1)
	inFwd := u1 * n * float64(2*hp*h.Dim+2*kvp*h.Dim+hp) * 4
	inBwd := u1 * n * float64(3*hp*h.Dim+4*kvp*h.Dim+2*hp) * 4
	// the all-to-all's pairs in a group that sit on different nodes (none when U divides gpn)
	var pairs, crossPairs float64
	for a := 0; a < U; a++ {
		for b := 0; b < U; b++ {
			if a != b {
				pairs++
				if a/gpn != b/gpn {
					crossPairs++
				}
			}
		}
	}
	inCross := 0.0
	if pairs > 0 {
		inCross = crossPairs / pairs
	}
	fwd, bwd = inFwd, inBwd
	inAll := float64(SP) * (inFwd + inBwd)
	total, cross = inAll, inAll*inCross
	if G > 1 {
		t, err := measureTraffic(name, model.Heads{N: hp, KV: kvp, Dim: h.Dim}, G, T, W, prec)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		oFwd, oBwd, oTot := t.at(float64(T), fwdPasses)
		fwd, bwd = fwd+oFwd, bwd+oBwd
		oAll := float64(U) * oTot
		total += oAll
		cross += oAll * hybridOuterCross(t, U, gpn)
	}
	if total > 0 {
		cross /= total
	}
	return fwd, bwd, total, cross, nil
}

// hybridOuterCross is the fraction of the outer schedule's bytes that cross between nodes of
// gpn ranks when outer rank g of ring i is rank g·U+i: point-to-point bytes by their peers,
// collective bytes as if spread evenly over the other ranks of the ring (as crossFraction).
func hybridOuterCross(t traffic, U, gpn int) float64 {
	G := len(t.peer)
	var cross, all float64
	for i := 0; i < U; i++ {
		node := func(g int) int { return (g*U + i) / gpn }
		var pairs, crossPairs float64
		for a, row := range t.peer {
			for b, x := range row {
				all += x
				if node(a) != node(b) {
					cross += x
				}
				if a != b {
					pairs++
					if node(a) != node(b) {
						crossPairs++
					}
				}
			}
		}
		all += t.other
		if G > 1 {
			cross += t.other * crossPairs / pairs
		}
	}
	if all == 0 {
		return 0
	}
	return cross / all
}

// hybridDegree is the ulysses_degree plan applies to schedule name: 1 (none) for ulysses and
// when the config sets none.
func hybridDegree(cfg config.Config, name string) int {
	if name == "ulysses" {
		return 1
	}
	return dims(cfg).Ulysses
}

// dims are cfg's parallel dimensions (parallel.Dims); a config that does not split (which
// Validate refuses) gets the nearest that does, so that a plan of it can say what is wrong.
func dims(cfg config.Config) parallel.Dims {
	if d, err := cfg.Parallelism.Dims(); err == nil {
		return d
	}
	p := cfg.Parallelism
	return parallel.Dims{World: max(p.WorldSize, 1), SP: max(p.SequenceParallelDegree, 1), Ulysses: max(p.UlyssesDegree, 1), Attention: p.Attention}
}
