package parallel

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
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
// GQA grouping survives contiguous head slices exactly when P divides both H and KV
// (checkUlysses); that head-count limitation is the one DistFlashAttn §4.3 and §4.7 point out
// for head-partitioned attention (LLaMA-33H: 33 heads).
//
// Backward is stateless, like every schedule here: it gathers q, k, v and dO by head again,
// with the statistics lse and D = rowsum(dO ∘ O) (computed before the all-to-all, where O and
// dO are at hand: it is per head and token, so the sharding does not change it; sending D
// instead of O saves head_dim − 1 values per head and token), runs the primitive's backward
// and sends dq, dk, dv back by sequence.
//
// Every all-to-all moves (P−1)/P of the tensor each rank holds; Options.Overlap has nothing to
// overlap in this schedule (the collectives stand between the phases) and is ignored.
type ulysses struct {
	c    Comm
	be   kernels.Backend
	opt  Options
	bufs burstBufs
}

func init() { register("ulysses", newUlysses, checkUlysses) }

// newUlysses returns rank c.Rank()'s DeepSpeed-Ulysses attention.
func newUlysses(c Comm, be kernels.Backend, opt Options) Schedule {
	return &ulysses{c: c, be: be, opt: opt, bufs: burstBufs{be: be}}
}

// checkUlysses reports why Ulysses cannot run heads h on P ranks: it needs whole query heads
// and whole kv heads on every rank.
func checkUlysses(h model.Heads, P int) error {
	if P >= 1 && h.N%P == 0 && h.KV%P == 0 {
		return nil
	}
	return fmt.Errorf("parallel: ulysses needs n_heads (%d) and n_kv_heads (%d) divisible by the %d sequence-parallel ranks: "+
		"it shards attention by head, so every rank must hold whole query heads and the kv heads they share; "+
		"this is the head-count limitation of head-partitioned attention that DistFlashAttn §4.3 measures on LLaMA-33H (33 heads); "+
		"use parallelism.attention = distflash, ring, zigzag, burst or attn2d, which split the sequence and run any head count",
		h.N, h.KV, P)
}

// Name implements Schedule.
func (u *ulysses) Name() string { return "ulysses" }

// Layout implements Schedule.
func (u *ulysses) Layout() Layout { return Contiguous }

// geometry checks the call and returns the positions 0 … N−1 of the gathered sequence and the
// query and kv heads per rank.
func (u *ulysses) geometry(pos []int32, h model.Heads) (all []int32, hp, kvp int) {
	P, r := u.c.Size(), u.c.Rank()
	if err := checkUlysses(h, P); err != nil {
		panic(err)
	}
	for _, b := range burstBlockPositions(pos, P, r) {
		all = append(all, b...)
	}
	return all, h.N / P, h.KV / P
}

// ulyssesShape is the primitive's shape for the gathered sequence in this rank's head slice.
func ulyssesShape(all []int32, hp, kvp int, seq model.Seq, h model.Heads) kernels.AttnShape {
	return blockShape(all, all, seq, model.Heads{N: hp, KV: kvp, Dim: h.Dim})
}

// toHeads all-to-alls x ([n, heads, hd], this rank's tokens) into [N, heads/P, hd] (every
// token, this rank's head slice), through the send buffer and into the buffer called name.
func (u *ulysses) toHeads(name string, x kernels.Buf, n, heads, hd int, site string) kernels.Buf {
	be, P := u.be, u.c.Size()
	hp := heads / P
	send := u.bufs.get(name+".send", x.Len())
	for j := 0; j < P; j++ { // chunk j: head slice j of every local token, for rank j
		for i := 0; i < n; i++ {
			be.Copy(be.Slice(send, (j*n+i)*hp*hd, hp*hd), be.Slice(x, (i*heads+j*hp)*hd, hp*hd))
		}
	}
	out := u.bufs.get(name, x.Len())
	u.c.AllToAll(out, send, site) // chunk j: rank j's tokens in this rank's heads = tokens in order
	return out
}

// fromHeads all-to-alls x ([N, heads/P, hd]) back to this rank's tokens with every head and
// writes (or, with add, adds) the result into dst ([n, heads, hd]).
func (u *ulysses) fromHeads(dst, x kernels.Buf, name string, n, heads, hd int, add bool, site string) {
	be, P := u.be, u.c.Size()
	hp := heads / P
	recv := u.bufs.get(name+".recv", x.Len())
	u.c.AllToAll(recv, x, site) // chunk j of x is rank j's tokens; chunk j of recv is head slice j
	for j := 0; j < P; j++ {
		for i := 0; i < n; i++ {
			d, s := be.Slice(dst, (i*heads+j*hp)*hd, hp*hd), be.Slice(recv, (j*n+i)*hp*hd, hp*hd)
			if add {
				be.Add(d, d, s)
			} else {
				be.Copy(d, s)
			}
		}
	}
}

// Forward implements model.Attention.
func (u *ulysses) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	be, P := u.be, u.c.Size()
	n := len(pos)
	N := n * P
	all, hp, kvp := u.geometry(pos, h)

	qh := u.toHeads("q", q, n, h.N, h.Dim, "ulysses.fwd.q")
	kh := u.toHeads("k", k, n, h.KV, h.Dim, "ulysses.fwd.k")
	vh := u.toHeads("v", v, n, h.KV, h.Dim, "ulysses.fwd.v")

	st := kernels.AttnState{O: u.bufs.get("st.o", N*hp*h.Dim), M: u.bufs.get("st.m", N*hp), L: u.bufs.get("st.l", N*hp)}
	be.AttnInit(st)
	be.AttnForward(st, qh, kh, vh, ulyssesShape(all, hp, kvp, seq, h))
	oh, lseh := st.O, u.bufs.get("lse", hp*N)
	be.AttnFinish(oh, lseh, st, N, hp, h.Dim) // o may be s.O

	u.fromHeads(o, oh, "o", n, h.N, h.Dim, false, "ulysses.fwd.o")
	// lse: [hp, N] here → chunk j = [hp, n] of rank j's tokens; what comes back, chunk j =
	// head slice j of this rank's tokens, is [H, n] in order.
	send := u.bufs.get("lse.send", hp*N)
	for j := 0; j < P; j++ {
		for hl := 0; hl < hp; hl++ {
			be.Copy(be.Slice(send, (j*hp+hl)*n, n), be.Slice(lseh, hl*N+j*n, n))
		}
	}
	u.c.AllToAll(lse, send, "ulysses.fwd.lse")
}

// Backward implements model.Attention.
func (u *ulysses) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	be, P := u.be, u.c.Size()
	n := len(pos)
	N := n * P
	all, hp, kvp := u.geometry(pos, h)

	d := u.bufs.get("d", h.N*n)
	be.AttnBackwardPrep(d, o, do, n, h.N, h.Dim) // D = rowsum(dO ∘ O), [H, n]

	qh := u.toHeads("q", q, n, h.N, h.Dim, "ulysses.bwd.q")
	kh := u.toHeads("k", k, n, h.KV, h.Dim, "ulysses.bwd.k")
	vh := u.toHeads("v", v, n, h.KV, h.Dim, "ulysses.bwd.v")
	doh := u.toHeads("do", do, n, h.N, h.Dim, "ulysses.bwd.do")

	// Statistics: chunk j = [D rows of head slice j | lse rows of head slice j] ([2, hp, n]);
	// chunk j received = this rank's heads for rank j's tokens, scattered into [hp, N].
	send, recv := u.bufs.get("stats.send", 2*h.N*n), u.bufs.get("stats.recv", 2*h.N*n)
	for j := 0; j < P; j++ {
		be.Copy(be.Slice(send, 2*j*hp*n, hp*n), be.Slice(d, j*hp*n, hp*n))
		be.Copy(be.Slice(send, (2*j+1)*hp*n, hp*n), be.Slice(lse, j*hp*n, hp*n))
	}
	u.c.AllToAll(recv, send, "ulysses.bwd.stats")
	dh, lseh := u.bufs.get("dh", hp*N), u.bufs.get("lseh", hp*N)
	for j := 0; j < P; j++ {
		for hl := 0; hl < hp; hl++ {
			be.Copy(be.Slice(dh, hl*N+j*n, n), be.Slice(recv, (2*j*hp+hl)*n, n))
			be.Copy(be.Slice(lseh, hl*N+j*n, n), be.Slice(recv, ((2*j+1)*hp+hl)*n, n))
		}
	}

	dqh, dkh, dvh := u.bufs.get("dqh", qh.Len()), u.bufs.get("dkh", kh.Len()), u.bufs.get("dvh", vh.Len())
	be.Zero(dqh)
	be.Zero(dkh)
	be.Zero(dvh)
	be.AttnBackward(dqh, dkh, dvh, qh, kh, vh, doh, lseh, dh, ulyssesShape(all, hp, kvp, seq, h))

	u.fromHeads(dq, dqh, "dq", n, h.N, h.Dim, true, "ulysses.bwd.dq")
	u.fromHeads(dk, dkh, "dk", n, h.KV, h.Dim, true, "ulysses.bwd.dk")
	u.fromHeads(dv, dvh, "dv", n, h.KV, h.Dim, true, "ulysses.bwd.dv")
}
