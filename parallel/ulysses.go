package parallel

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// DeepSpeed-Ulysses (Jacobs et al., 2023; compared with in papers/distflashattn.txt §4.5 and
// §4.7) on the Contiguous layout: rank r holds the tokens [r·n, (r+1)·n) of a sequence of
// N = n·P tokens with all H heads. An all-to-all turns the sequence sharding of q, k, v
// ([n tokens, H heads]) into a head sharding ([N tokens, H/P heads]); each rank then runs the
// attention primitive over the whole sequence (positions 0 … N−1, causal) for its heads, and an
// all-to-all brings o and lse back to the sequence sharding.
//
// Rank r gets query heads [r·H/P, (r+1)·H/P) and key/value heads [r·KV/P, (r+1)·KV/P). With
// g = H/KV, global query head h reads kv head h/g; its local index h − r·H/P reads local kv
// head (h − r·H/P)/g = h/g − r·KV/P (as r·H/P = g·r·KV/P), which is the same kv head. So the
// GQA grouping survives contiguous head slices when P divides both H and KV.
//
// With fewer kv heads than ranks (P > KV, P a multiple of KV, P dividing H), the kv heads are
// replicated instead, as DeepSpeed's ALST (Arctic Long Sequence Training) does: the H/P query
// heads of rank r all read kv head r·KV/P (floor), since H/P = g·KV/P divides g (H = P·a and
// P = m·KV give g = m·a, H/P = a), so rank r receives that one kv head. P/KV ranks then hold a
// copy of each kv head; in backward each copy's dk, dv cover only its own query heads, and the
// all-to-all back adds the P/KV copies into the owner's dk, dv (exact: the gradient of a
// shared input is the sum over its readers). Each rank sends one kv head per peer instead of
// KV/P of them. Other head counts are refused (checkUlysses): that is the head-count
// limitation of head-partitioned attention that DistFlashAttn §4.3 and §4.7 point out
// (LLaMA-33H: 33 heads).
//
// Backward is stateless, like every schedule here: it gathers q, k, v and dO by head again,
// with the statistics lse and D = rowsum(dO ∘ O) (computed before the all-to-all, where O and
// dO are at hand: it is per head and token, so the sharding does not change it; sending D
// instead of O saves head_dim − 1 values per head and token), runs the primitive's backward
// and sends dq, dk, dv back by sequence.
//
// Every all-to-all moves (P−1)/P of the tensor each rank holds (k and v with replicated kv
// heads: P−1 chunks of one head); Options.Overlap has nothing to overlap in this schedule (the
// collectives stand between the phases) and is ignored.
type ulysses struct {
	c    transport.Comm
	be   kernels.Backend
	opt  Options
	bufs burstBufs
	ops  model.Operands // q, k, v, dO in the run's 16-bit format: the all-to-alls move them packed
}

func init() { register("ulysses", newUlysses, checkUlysses) }

// newUlysses returns rank c.Rank()'s DeepSpeed-Ulysses attention.
func newUlysses(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &ulysses{c: c, be: be, opt: opt, bufs: burstBufs{be: be}}
}

// checkUlysses reports why Ulysses cannot run heads h on P ranks: it needs whole query heads on
// every rank, and kv heads that either split evenly or are replicated whole (headSplit).
func checkUlysses(h model.Heads, P int) error {
	if P >= 1 && h.KV >= 1 && h.N%P == 0 && (h.KV%P == 0 || P%h.KV == 0) {
		return nil
	}
	return fmt.Errorf("parallel: ulysses needs n_heads (%d) divisible by the %d sequence-parallel ranks, and n_kv_heads (%d) divisible by them "+
		"or dividing them (then each kv head is replicated on the ranks whose query heads read it): "+
		"it shards attention by head, so every rank must hold whole query heads and the kv heads they share; "+
		"this is the head-count limitation of head-partitioned attention that DistFlashAttn §4.3 measures on LLaMA-33H (33 heads); "+
		"use parallelism.attention = distflash, ring, zigzag, burst or attn2d, which split the sequence and run any head count",
		h.N, P, h.KV)
}

// headSplit is how Ulysses deals the heads of h over P ranks: rank r gets the hp query heads
// [r·hp, (r+1)·hp) and the kvp kv heads [kvStart(r), kvStart(r)+kvp). When P divides KV the kv
// heads split like the query heads (kvp = KV/P); when KV divides P each rank gets the one kv
// head its query heads read (kvp = 1, replicated on P/KV ranks).
type headSplit struct {
	P, hp, kvp, kv int
}

// newHeadSplit splits h over P ranks; h and P must pass checkUlysses.
func newHeadSplit(h model.Heads, P int) headSplit {
	if err := checkUlysses(h, P); err != nil {
		panic(err)
	}
	return headSplit{P: P, hp: h.N / P, kvp: max(h.KV/P, 1), kv: h.KV}
}

// qStart is rank r's first query head.
func (s headSplit) qStart(r int) int { return r * s.hp }

// kvStart is rank r's first kv head.
func (s headSplit) kvStart(r int) int { return r * s.kv / s.P }

// local is the heads of one rank's slice.
func (s headSplit) local(h model.Heads) model.Heads {
	return model.Heads{N: s.hp, KV: s.kvp, Dim: h.Dim}
}

// Name implements Schedule.
func (u *ulysses) Name() string { return "ulysses" }

// Layout implements Schedule.
func (u *ulysses) Layout() Layout { return Contiguous }

// geometry checks the call and returns the positions 0 … N−1 of the gathered sequence and the
// head split.
func (u *ulysses) geometry(pos []int32, h model.Heads) (all []int32, hs headSplit) {
	P, r := u.c.Size(), u.c.Rank()
	hs = newHeadSplit(h, P)
	for _, b := range burstBlockPositions(pos, P, r) {
		all = append(all, b...)
	}
	return all, hs
}

// toHeads all-to-alls x ([n, heads, hd], this rank's tokens) into [P·n, cnt, hd]: every token of
// the group in rank order, the cnt heads from start(Rank) on. Chunk j of the send buffer is
// heads [start(j), start(j)+cnt) of every local token, for rank j. The result is the buffer
// called name.
func (u *ulysses) toHeads(name string, x kernels.Buf, n, heads, hd, cnt int, start func(int) int, site string) kernels.Buf {
	be, P := u.be, u.c.Size()
	send := u.bufs.get(name+".send", P*n*cnt*hd)
	for j := 0; j < P; j++ {
		for i := 0; i < n; i++ {
			be.Copy(be.Slice(send, (j*n+i)*cnt*hd, cnt*hd), be.Slice(x, (i*heads+start(j))*hd, cnt*hd))
		}
	}
	out := u.bufs.get(name, send.Len())
	u.c.AllToAll(out, send, site) // chunk j: rank j's tokens in this rank's heads = tokens in order
	return out
}

// fromHeads all-to-alls x ([P·n, cnt, hd], this rank's heads) back to this rank's tokens and
// writes (or, with add, adds) chunk j, heads [start(j), start(j)+cnt), into dst ([n, heads,
// hd]). When several ranks hold the same heads (replicated kv heads) add sums their
// contributions in rank order.
func (u *ulysses) fromHeads(dst, x kernels.Buf, name string, n, heads, hd, cnt int, start func(int) int, add bool, site string) {
	be, P := u.be, u.c.Size()
	recv := u.bufs.get(name+".recv", x.Len())
	u.c.AllToAll(recv, x, site) // chunk j of x is rank j's tokens; chunk j of recv is rank j's heads
	for j := 0; j < P; j++ {
		for i := 0; i < n; i++ {
			d, s := be.Slice(dst, (i*heads+start(j))*hd, cnt*hd), be.Slice(recv, (j*n+i)*cnt*hd, cnt*hd)
			if add {
				be.Add(d, d, s)
			} else {
				be.Copy(d, s)
			}
		}
	}
}

// statsToTokens all-to-alls per-head statistics xh ([hp, P·n], this rank's query heads, every
// token) back to this rank's tokens, dst [H, n] (H = P·hp): chunk j sent is the columns of
// rank j's tokens; chunk j received is head slice j of this rank's tokens, so it lands in
// order.
func (u *ulysses) statsToTokens(dst, xh kernels.Buf, n, hp int, site string) {
	be, P := u.be, u.c.Size()
	N := P * n
	send := u.bufs.get("stats.tok.send", hp*N)
	for j := 0; j < P; j++ {
		for hl := 0; hl < hp; hl++ {
			be.Copy(be.Slice(send, (j*hp+hl)*n, n), be.Slice(xh, hl*N+j*n, n))
		}
	}
	u.c.AllToAll(dst, send, site)
}

// statsToHeads all-to-alls per-head statistics xs ([H, n] each, this rank's tokens) into
// dsts ([hp, P·n] each, this rank's query heads, every token), in one all-to-all.
func (u *ulysses) statsToHeads(dsts, xs []kernels.Buf, n, hp int, site string) {
	be, P, m := u.be, u.c.Size(), len(xs)
	N := P * n
	// Chunk j = [m, hp, n]: the rows of head slice j of each statistic.
	send, recv := u.bufs.get("stats.send", m*P*hp*n), u.bufs.get("stats.recv", m*P*hp*n)
	for j := 0; j < P; j++ {
		for s, x := range xs {
			be.Copy(be.Slice(send, (j*m+s)*hp*n, hp*n), be.Slice(x, j*hp*n, hp*n))
		}
	}
	u.c.AllToAll(recv, send, site)
	for j := 0; j < P; j++ {
		for s, d := range dsts {
			for hl := 0; hl < hp; hl++ {
				be.Copy(be.Slice(d, hl*N+j*n, n), be.Slice(recv, ((j*m+s)*hp+hl)*n, n))
			}
		}
	}
}

// Forward implements model.Attention.
func (u *ulysses) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	be, P := u.be, u.c.Size()
	n := len(seq.Pos)
	N := n * P
	all, hs := u.geometry(seq.Pos, h)
	ops := &u.ops
	ops.Begin(be)
	w := h.Dim / ops.Per() // buffer elements per head of a token: a packed word holds two values

	qh := u.toHeads("q", ops.Pack(be, "q", q), n, h.N, w, hs.hp, hs.qStart, "ulysses.fwd.q")
	kh := u.toHeads("k", ops.Pack(be, "k", k), n, h.KV, w, hs.kvp, hs.kvStart, "ulysses.fwd.k")
	vh := u.toHeads("v", ops.Pack(be, "v", v), n, h.KV, w, hs.kvp, hs.kvStart, "ulysses.fwd.v")

	hp := hs.hp
	st := kernels.AttnState{O: u.bufs.get("st.o", N*hp*h.Dim), M: u.bufs.get("st.m", N*hp), L: u.bufs.get("st.l", N*hp)}
	be.AttnInit(st)
	be.AttnForward(st, qh, kh, vh, ops.Shape(blockShape(all, all, seq, hs.local(h))))
	oh, lseh := st.O, u.bufs.get("lse", hp*N)
	be.AttnFinish(oh, lseh, st, N, hp, h.Dim) // o may be s.O

	u.fromHeads(o, oh, "o", n, h.N, h.Dim, hp, hs.qStart, false, "ulysses.fwd.o")
	u.statsToTokens(lse, lseh, n, hp, "ulysses.fwd.lse")
}

// Backward implements model.Attention.
func (u *ulysses) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	be, P := u.be, u.c.Size()
	n := len(seq.Pos)
	N := n * P
	all, hs := u.geometry(seq.Pos, h)
	hp := hs.hp

	ops := &u.ops
	ops.Begin(be)
	w := h.Dim / ops.Per()
	d := u.bufs.get("d", h.N*n)
	dop := ops.Pack(be, "do", do)
	be.AttnBackwardPrep(d, ops.Pack(be, "o", o), dop, n, h.N, h.Dim, ops.Precision()) // D = rowsum(dO ∘ O), [H, n]

	qh := u.toHeads("q", ops.Pack(be, "q", q), n, h.N, w, hp, hs.qStart, "ulysses.bwd.q")
	kh := u.toHeads("k", ops.Pack(be, "k", k), n, h.KV, w, hs.kvp, hs.kvStart, "ulysses.bwd.k")
	vh := u.toHeads("v", ops.Pack(be, "v", v), n, h.KV, w, hs.kvp, hs.kvStart, "ulysses.bwd.v")
	doh := u.toHeads("do", dop, n, h.N, w, hp, hs.qStart, "ulysses.bwd.do")

	dh, lseh := u.bufs.get("dh", hp*N), u.bufs.get("lseh", hp*N)
	u.statsToHeads([]kernels.Buf{dh, lseh}, []kernels.Buf{d, lse}, n, hp, "ulysses.bwd.stats")

	dqh, dkh, dvh := u.bufs.get("dqh", N*hp*h.Dim), u.bufs.get("dkh", N*hs.kvp*h.Dim), u.bufs.get("dvh", N*hs.kvp*h.Dim)
	be.Zero(dqh)
	be.Zero(dkh)
	be.Zero(dvh)
	// the output in the heads layout would cost one more all-to-all of n·H·hd values (or a kept
	// copy of the forward's): D, H·n values, travels instead, and a backend that wants O builds
	// it from D
	be.AttnBackward(dqh, dkh, dvh, qh, kh, vh, nil, doh, lseh, dh, ops.Shape(blockShape(all, all, seq, hs.local(h))))

	u.fromHeads(dq, dqh, "dq", n, h.N, h.Dim, hp, hs.qStart, true, "ulysses.bwd.dq")
	u.fromHeads(dk, dkh, "dk", n, h.KV, h.Dim, hs.kvp, hs.kvStart, true, "ulysses.bwd.dk")
	u.fromHeads(dv, dvh, "dv", n, h.KV, h.Dim, hs.kvp, hs.kvStart, true, "ulysses.bwd.dv")
}
