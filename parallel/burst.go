package parallel

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// BurstAttention (papers/burstattention.txt) on the Contiguous layout: rank r holds the tokens
// [r·n, (r+1)·n) of a sequence of N = n·P tokens.
//
// Forward, the global attention optimisation GAO (§3.3, Alg. 1): the K, V blocks travel once
// around the ring (rank r sends to r+1 and receives from r−1); each rank folds every block it
// holds into its running (o, m, l) with the online softmax of the attention primitive
// (Alg. 1 lines 7–16 are exactly kernels.Backend.AttnForward) and finishes with o = o / l,
// lse = m + log l (lines 18–19, AttnFinish). Blocks that the causal mask hides entirely are not
// computed (§3.5: "the local attention operations on these partitions can be skipped
// directly"); they still travel, because a rank further on may need them — up to the last step
// at which some rank sees a block it holds (burstLastStep): under a sliding window or short
// documents the ring stops there, and the older blocks nobody sees are not sent.
//
// Backward (§3.3, Alg. 2): K, V and the dK, dV accumulators stay where they are; what travels
// is the query side: Q, dO, D = rowsum(dO ∘ O), lse (Alg. 2 line 3) and the query gradient dQ,
// here from rank r to r−1, so that a block meets the keys its queries see first (the later
// queries see the earlier keys) and the ring can stop after burstLastStep steps.
// At each step a rank adds the visiting block's contribution to its own dK, dV and to the
// visiting dQ (lines 8–14, AttnBackward); after the ring is closed every dQ is back at its
// owner. Per rank and step that is 3·n·H·d + 2·n·H values (Q, dQ, dO, D, lse) against the
// 4·n·KV·d (K, V, dK, dV) of a ring that moves the key side (Table 1, "Backward": 3BZNd
// against RingAttention's K, V, dK, dV).
//
// The dQ accumulator of a query block starts at zero on the rank after its owner, so it needs
// no transfer for its first hop: it travels as many hops as the ring has steps, the last one
// home, like Q, dO, D and lse.
// Every rank computes its contribution into a zeroed buffer and then adds the dQ it received,
// in the same order with or without overlap, so the two modes give bit-identical gradients.
//
// With Options.Overlap the next transfer is posted before the current block is computed
// (DistFlashAttn §3.2's prefetch, which BurstAttention's ring permits just as well); without it
// a rank computes, then communicates.
type burst struct {
	c    transport.Comm
	be   kernels.Backend
	opt  Options
	bufs burstBufs
	ops  model.Operands // q, k, v, O, dO in the run's 16-bit format
}

func init() { register("burst", newBurst, nil) }

// newBurst returns rank c.Rank()'s BurstAttention.
func newBurst(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &burst{c: c, be: be, opt: opt, bufs: burstBufs{be: be}}
}

// Name implements Schedule.
func (b *burst) Name() string { return "burst" }

// Layout implements Schedule.
func (b *burst) Layout() Layout { return Contiguous }

// Message tags of the Burst ring, one per stream so that the streams of one step never mix.
const (
	burstTagK = 0x4275 << 4 // "Bu"
	burstTagV = burstTagK + iota
	burstTagQ
	burstTagDO
	burstTagD
	burstTagLSE
	burstTagDQ
)

// Forward implements model.Attention (Alg. 1).
func (b *burst) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	be, c := b.be, b.c
	P, r := c.Size(), c.Rank()
	n := len(pos)
	blocks := burstBlockPositions(pos, P, r)
	next, prev := (r+1)%P, (r-1+P)%P
	ops := &b.ops
	ops.Begin(be)
	q, k, v = ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v)
	kvLen := ops.Len(n * h.KV * h.Dim)

	st := kernels.AttnState{O: b.bufs.get("o", n*h.N*h.Dim), M: b.bufs.get("m", n*h.N), L: b.bufs.get("l", n*h.N)}
	be.AttnInit(st) // Alg. 1 line 1
	kb := [2]kernels.Buf{b.bufs.get("k0", kvLen), b.bufs.get("k1", kvLen)}
	vb := [2]kernels.Buf{b.bufs.get("v0", kvLen), b.bufs.get("v1", kvLen)}

	curK, curV := k, v // line 2: the local K, V enter the ring
	steps := burstLastStep(blocks, seq)
	for s := 0; s <= steps; s++ {
		j := (r - s + P) % P // the block held at step s started on rank j
		nxtK, nxtV := kb[s%2], vb[s%2]
		var reqs []transport.Request
		post := func() { // line 17 and line 4 of the next round
			reqs = append(reqs,
				c.Isend(curK, next, burstTagK, "burst.fwd.kv"), c.Isend(curV, next, burstTagV, "burst.fwd.kv"),
				c.Irecv(nxtK, prev, burstTagK, "burst.fwd.kv"), c.Irecv(nxtV, prev, burstTagV, "burst.fwd.kv"))
			transport.Start(c)
		}
		last := s == steps
		if b.opt.Overlap && !last {
			post()
		}
		if visibleDoc(be, pos, blocks[j], seq) { // lines 7–16; fully masked blocks are skipped (§3.5)
			be.AttnForward(st, q, curK, curV, ops.Shape(blockShape(pos, blocks[j], seq, h)))
		}
		if !b.opt.Overlap && !last {
			post()
		}
		for _, rq := range reqs {
			rq.Wait()
		}
		curK, curV = nxtK, nxtV
	}
	be.AttnFinish(o, lse, st, n, h.N, h.Dim) // lines 18–19
}

// Backward implements model.Attention (Alg. 2).
func (b *burst) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	n := len(seq.Pos)
	be, ops := b.be, &b.ops
	ops.Begin(be)
	d := b.bufs.get("d", n*h.N)
	o, do = ops.Pack(be, "o", o), ops.Pack(be, "do", do)
	be.AttnBackwardPrep(d, o, do, n, h.N, h.Dim, ops.Precision()) // line 2: D = rowsum(dO ∘ O)
	b.backward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), o, d, lse, do, seq, h)
}

// backwardD implements statsBackward: Backward with D = rowsum(dO ∘ O) ([H, n]) given.
func (b *burst) backwardD(dq, dk, dv, q, k, v, d, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	be, ops := b.be, &b.ops
	ops.Begin(be)
	b.backward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), nil, d, lse, ops.Pack(be, "do", do), seq, h)
}

// backward is Backward (Alg. 2) from line 3 on, with D at hand and q, k, v, o, do in the call's
// operand format; o is this rank's output (nil when only D is known), which the diagonal block
// passes to the backend (the visiting query blocks bring their D only).
func (b *burst) backward(dq, dk, dv, q, k, v, o, d, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	be, c := b.be, b.c
	P, r := c.Size(), c.Rank()
	n := len(pos)
	blocks := burstBlockPositions(pos, P, r)
	// The query side travels backwards, r to r−1: the block held at step s is rank r+s's, so
	// the later queries, which see this rank's keys, come first, and under a sliding window the
	// ring stops after the last step at which some rank sees what it holds.
	next, prev := (r-1+P)%P, (r+1)%P
	steps := burstLastStep(blocks, seq)
	qLen, sLen := n*h.N*h.Dim, n*h.N

	// Double buffers for the travelling query-side bundle (Q, dO, D, lse) and for the dQ
	// accumulator this rank sends on; dqIn receives the accumulator from the previous rank.
	type bundle struct{ q, do, d, lse kernels.Buf }
	var bufs [2]bundle
	var dqOut [2]kernels.Buf
	for i := range bufs {
		bufs[i] = bundle{
			q: b.bufs.get(fmt.Sprint("q", i), b.ops.Len(qLen)), do: b.bufs.get(fmt.Sprint("do", i), b.ops.Len(qLen)),
			d: b.bufs.get(fmt.Sprint("D", i), sLen), lse: b.bufs.get(fmt.Sprint("lse", i), sLen),
		}
		dqOut[i] = b.bufs.get(fmt.Sprint("dqOut", i), qLen)
	}
	dqIn := b.bufs.get("dqIn", qLen)
	var dqSent [2]transport.Request

	cur := bundle{q, do, d, lse} // line 3: the local query side enters the ring
	var sendDQ func()            // the send of this step's dQ accumulator, made at the start of the next
	for s := 0; s <= steps; s++ {
		j := (r + s) % P // the query block held at step s belongs to rank j
		nxt := bufs[s%2]
		var reqs []transport.Request
		post := func() { // line 16 and line 5 of the next round
			reqs = append(reqs,
				c.Isend(cur.q, next, burstTagQ, "burst.bwd.q"), c.Isend(cur.do, next, burstTagDO, "burst.bwd.do"),
				c.Isend(cur.d, next, burstTagD, "burst.bwd.stats"), c.Isend(cur.lse, next, burstTagLSE, "burst.bwd.stats"),
				c.Irecv(nxt.q, prev, burstTagQ, "burst.bwd.q"), c.Irecv(nxt.do, prev, burstTagDO, "burst.bwd.do"),
				c.Irecv(nxt.d, prev, burstTagD, "burst.bwd.stats"), c.Irecv(nxt.lse, prev, burstTagLSE, "burst.bwd.stats"))
			transport.Start(c)
		}
		last := s == steps
		// The previous step's dQ accumulator leaves at the start of this step, with this
		// step's receive of the one that comes here, before the next round's block: so on
		// every link both ranks post the same messages in the same order, and no wait for a
		// round's blocks waits for a send whose receive is posted only in the next step,
		// as a communicator that pairs messages by order, runs them in order and completes a
		// send only when it is received (NCCL) needs.
		if sendDQ != nil {
			sendDQ()
			sendDQ = nil
		}
		var dqReq transport.Request
		if s >= 2 { // the accumulator of block j, from ranks j+1 … r−1
			dqReq = c.Irecv(dqIn, prev, burstTagDQ, "burst.bwd.dq")
		}
		if b.opt.Overlap && !last {
			post()
		}
		transport.Start(c)
		vis := visibleDoc(be, blocks[j], pos, seq)
		if s == 0 {
			// The diagonal block: the own queries' gradient goes straight into dq.
			if vis {
				be.AttnBackward(dq, dk, dv, q, k, v, o, do, lse, d, b.ops.Shape(blockShape(pos, pos, seq, h)))
			}
		} else {
			// A visiting block (lines 8–14): dK, dV stay here, dQ_j travels on.
			out := dqOut[s%2]
			if dqSent[s%2] != nil {
				dqSent[s%2].Wait()
			}
			be.Zero(out)
			if vis {
				be.AttnBackward(out, dk, dv, cur.q, k, v, nil, cur.do, cur.lse, cur.d, b.ops.Shape(blockShape(blocks[j], pos, seq, h)))
			}
			if dqReq != nil {
				dqReq.Wait()
				be.Add(out, out, dqIn)
			}
			to := next
			if last {
				to = j // the accumulator has visited every rank that sees block j: home
			}
			sendDQ = func() { dqSent[s%2] = c.Isend(out, to, burstTagDQ, "burst.bwd.dq") }
		}
		if !b.opt.Overlap && !last {
			post()
		}

		for _, rq := range reqs {
			rq.Wait()
		}
		cur = nxt
	}
	if sendDQ != nil {
		sendDQ()
	}
	if steps > 0 { // line 17: this rank's dQ is back, with every other rank's contribution
		c.Irecv(dqIn, (r-steps+P)%P, burstTagDQ, "burst.bwd.dq").Wait()
		be.Add(dq, dq, dqIn)
	}
	for _, rq := range dqSent {
		if rq != nil {
			rq.Wait()
		}
	}
}

// burstLastStep is the last ring step at which some rank sees a block it holds: rank r holds
// rank r−s's keys at step s of the forward (and rank r+s's queries at step s of the backward,
// the same pairs): P−1 under the plain causal mask, fewer when a sliding window or documents
// hide the older blocks from every rank. Every rank computes it from the whole layout, so all
// stop together and nothing hidden is sent.
func burstLastStep(blocks [][]int32, seq model.Seq) int {
	P, last := len(blocks), 0
	for s := 1; s < P; s++ {
		for r := 0; r < P; r++ {
			if pairVisible(blocks[r], blocks[(r-s+P)%P], seq) {
				last = s
				break
			}
		}
	}
	return last
}

// burstBlockPositions returns the global positions of every rank's tokens on the Contiguous
// layout of a sequence of len(pos)·P tokens, after checking that pos is rank's own block.
// It is how the ring schedules here know the positions of the blocks they receive without
// sending them.
func burstBlockPositions(pos []int32, P, rank int) [][]int32 {
	T := len(pos) * P
	blocks := make([][]int32, P)
	for j := range blocks {
		blocks[j] = Contiguous.MustPositions(T, P, j)
	}
	for i, p := range pos {
		if blocks[rank][i] != p {
			panic(fmt.Sprintf("parallel: rank %d of %d holds positions %v…, not its contiguous block %d…", rank, P, pos[:min(len(pos), 4)], blocks[rank][0]))
		}
	}
	return blocks
}

// burstBufs is a rank's named scratch buffers (used by Burst and Ulysses), kept between calls
// so that the per-layer, per-sequence attention calls do not allocate. A buffer is reallocated
// when its length changes; its contents are whatever the last user left there.
type burstBufs struct {
	be kernels.Backend
	m  map[string]kernels.Buf
}

// get returns the buffer called name with n elements.
func (s *burstBufs) get(name string, n int) kernels.Buf {
	if b, ok := s.m[name]; ok && b.Len() == n {
		return b
	}
	if s.m == nil {
		s.m = map[string]kernels.Buf{}
	}
	b := s.be.Alloc(n)
	s.m[name] = b
	return b
}
