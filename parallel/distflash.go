package parallel

// DistFlashAttn's load-balanced, sequence-parallel causal attention (papers/distflashattn.txt
// §3.1–3.2, Alg. 1–2, Fig. 1(b), Fig. 2; App. C for the communication volume).
//
// The sequence is split contiguously: rank p holds the n = N/P tokens [p·n, (p+1)·n) (ranks
// are 0-based here, 1-based in the paper). Causal attention needs, for every query block r,
// the key blocks c ≤ r: P diagonal blocks and P(P−1)/2 off-diagonal ones. Write the
// off-diagonal block (r, c) by its offset r−c ∈ [1, P).
//
// Step 0: every rank computes its own diagonal block (Alg. 2 line 2).
//
// Step t = 1 … ⌊P/2⌋ (Alg. 2 lines 3–20) handles the blocks of offset t and of offset P−t:
//
//   - rank p ≥ t fetches k, v of rank p−t and folds block (p, p−t) into its own (o, m, l)
//     (lines 5–7) — the vanilla ring step of Alg. 1;
//   - rank p < t, which in the vanilla ring would be idle (it has no earlier key block left),
//     is the "helper": it fetches q of rank p+P−t and computes block (p+P−t, p) against its own
//     k, v from a fresh state (lines 14–16), then sends the partial (o, m, l) back (line 17),
//     where the owner merges it by its log-sum-exp (rescale, lines 8–11);
//   - for even P the last step t = P/2 has offset t = P−t: those blocks are all done by their
//     query owners and ranks p < P/2 idle (the "t ≠ ⌊P/2⌋" conditions of lines 8 and 14).
//
// So every rank computes exactly one block per step: 1 + ⌊P/2⌋ steps in all, against P for the
// vanilla ring. The idle worker-steps are 0 for odd P and P/2 for even P (all in the last step);
// the paper's 1/(2P) of Eq. (2) is those P/2 idle slots over P² (P workers × the ring's P
// steps); over the balanced schedule's own 1 + P/2 steps they are 1/(P+2) of the time, which is
// what the paper's Fig. 5 "expected speedup 7.2×" for P = 8 (36 blocks / 5 steps) implies.
//
// The backward runs the same pairs on the same ranks at the same steps (the paper: "the
// backward pass follows a similar analysis"): an owner that computes (p, p−t) fetches k, v of
// p−t, adds dq into its own dq and sends the block's dk, dv back to p−t; a helper that computes
// (p+P−t, p) fetches q, dO, lse and D = rowsum(dO∘O) of p+P−t, adds dk, dv into its own and
// sends dq back.
//
// With Options.Overlap (§3.2 "communication and computation overlap", Eq. (3), Fig. 2) the
// transfers of step t+1 are posted before step t computes (step 1's before the diagonal
// block), and the partial results coming back from step t are waited for only after step t+1
// has computed. Without it every step transfers, then computes, then waits for its results.
// The arithmetic and its order are the same either way, so both give bit-identical results.

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

func init() { register("distflash", newDistFlash, nil) }

// Message tags of the schedule; the forward and backward use disjoint ones.
const (
	dfTagFwdK = 100 + iota
	dfTagFwdV
	dfTagFwdQ
	dfTagFwdOML
	dfTagBwdK
	dfTagBwdV
	dfTagBwdQ
	dfTagBwdDO
	dfTagBwdLSE
	dfTagBwdD
	dfTagBwdDKV
	dfTagBwdDQ
)

// Call sites under which the schedule's bytes are counted.
const (
	dfSiteFwdKV  = "distflash.fwd.kv"  // k, v to a later rank (Alg. 2 line 6)
	dfSiteFwdQ   = "distflash.fwd.q"   // q to a helper (line 15)
	dfSiteFwdOML = "distflash.fwd.oml" // a helper's partial (o, m, l) back to the owner (line 17)
	dfSiteBwdKV  = "distflash.bwd.kv"  // k, v to a later rank
	dfSiteBwdDKV = "distflash.bwd.dkv" // that block's dk, dv back to the key owner
	dfSiteBwdQ   = "distflash.bwd.q"   // q, dO, lse, D to a helper
	dfSiteBwdDQ  = "distflash.bwd.dq"  // the helper's dq back to the query owner
)

// dfStep is what one rank does at exchange step t ≥ 1 of the balanced schedule; a peer field
// is −1 when the rank has no such part at that step.
type dfStep struct {
	kvFrom int // compute own q against k, v of this rank (Alg. 2 lines 5–7)
	kvTo   int // send own k, v to this rank, which computes (kvTo, p) (the other side of line 6)
	qFrom  int // helper: compute q of this rank against own k, v and send the result back (lines 14–17)
	qTo    int // own q is helped by this rank, whose result is merged (lines 8–11)
}

// dfSteps is the number of exchange steps after the diagonal one: ⌊P/2⌋ (Alg. 2 line 3).
func dfSteps(P int) int { return P / 2 }

// dfPlan is rank p's part of exchange step t (1 ≤ t ≤ ⌊P/2⌋) on P ranks, 0-based: Alg. 2
// lines 4–19 with p−1 for the paper's p.
func dfPlan(P, p, t int) dfStep {
	s := dfStep{kvFrom: -1, kvTo: -1, qFrom: -1, qTo: -1}
	last := 2*t == P // offsets t and P−t coincide: no helpers (the t ≠ ⌊P/2⌋ of lines 8, 14)
	if p >= t {      // line 5: p > t, 1-based
		s.kvFrom = p - t
	}
	if p+t < P {
		s.kvTo = p + t
	}
	if p < t && !last { // line 13–14
		s.qFrom = p + P - t
	}
	if p+t >= P && !last { // line 8: (p+t) > P, 1-based; r₂ = (p+t) mod P
		s.qTo = p + t - P
	}
	return s
}

// distFlash is one rank's DistFlashAttn schedule.
type distFlash struct {
	c     transport.Comm
	be    kernels.Backend
	opt   Options
	sc    *dfScratch
	steps []dfStep       // this pass's plan of each exchange step (index t), masked by plan
	ops   model.Operands // q, k, v, O, dO in the run's 16-bit format
}

// plan is rank p's dfPlan of every exchange step with the blocks nobody would see left out:
// a pair of ranks exchanges a block only when some query of the one sees some key of the
// other under the causal mask and seq's starts (documents, a sliding window). Both ranks of a
// pair decide from the whole layout and the whole sequence's starts, so they agree, and a
// block the window hides entirely is neither sent nor computed.
func (s *distFlash) plan(seq model.Seq) []dfStep {
	P, p, peer := s.c.Size(), s.c.Rank(), s.sc.peer
	steps := make([]dfStep, dfSteps(P)+1)
	for t := 1; t < len(steps); t++ {
		st := dfPlan(P, p, t)
		if st.kvFrom >= 0 && !pairVisible(peer[p], peer[st.kvFrom], seq) {
			st.kvFrom = -1
		}
		if st.kvTo >= 0 && !pairVisible(peer[st.kvTo], peer[p], seq) {
			st.kvTo = -1
		}
		if st.qFrom >= 0 && !pairVisible(peer[st.qFrom], peer[p], seq) {
			st.qFrom = -1
		}
		if st.qTo >= 0 && !pairVisible(peer[p], peer[st.qTo], seq) {
			st.qTo = -1
		}
		steps[t] = st
	}
	return steps
}

// newDistFlash builds the DistFlashAttn schedule for one rank.
func newDistFlash(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &distFlash{c: c, be: be, opt: opt}
}

// Name implements Schedule.
func (s *distFlash) Name() string { return "distflash" }

// Layout implements Schedule: contiguous blocks (§3.1).
func (s *distFlash) Layout() Layout { return Contiguous }

// dfScratch holds one rank's buffers for a sequence of n local tokens with heads h and
// operands in prec (q, k, v, dO: packed in a 16-bit run, the sizes below in values); it is
// reused across calls. Buffers indexed [2] alternate by step parity, so with overlap the next
// step's transfers land in one while the current step computes on the other.
type dfScratch struct {
	n    int
	h    model.Heads
	prec kernels.Precision
	D    kernels.Buf // rowsum(dO∘O) of own queries [H, n]

	st kernels.AttnState // own running (o, m, l)

	kv   [2]kernels.Buf // received k|v [2·n·KV·hd]
	q    [2]kernels.Buf // received q [n·H·hd] (forward)
	hlp  [2]kernels.Buf // a helper's partial o|m|l to send [n·H·hd + 2·n·H]
	back [2]kernels.Buf // a helper's partial o|m|l received [n·H·hd + 2·n·H]

	qb   [2]kernels.Buf // received q|dO|lse|D [2·n·H·hd + 2·n·H] (backward)
	dkv  [2]kernels.Buf // dk|dv computed for another rank [2·n·KV·hd]
	gkv  [2]kernels.Buf // dk|dv received [2·n·KV·hd]
	dq   [2]kernels.Buf // dq computed for another rank [n·H·hd]
	gq   [2]kernels.Buf // dq received [n·H·hd]
	peer [][]int32      // global positions of every rank's tokens
}

func (s *distFlash) scratch(n int, h model.Heads) *dfScratch {
	if s.sc != nil && s.sc.n == n && s.sc.h == h && s.sc.prec == s.ops.Precision() {
		return s.sc
	}
	be, P, ops := s.be, s.c.Size(), &s.ops
	qn, kn, sn := n*h.N*h.Dim, n*h.KV*h.Dim, n*h.N
	sc := &dfScratch{n: n, h: h, prec: ops.Precision(), D: be.Alloc(sn), st: newState(be, n, h)}
	for i := range 2 {
		sc.kv[i] = be.Alloc(2 * ops.Len(kn))
		sc.q[i] = be.Alloc(ops.Len(qn))
		sc.hlp[i] = be.Alloc(qn + 2*sn)
		sc.back[i] = be.Alloc(qn + 2*sn)
		sc.qb[i] = be.Alloc(2*ops.Len(qn) + 2*sn)
		sc.dkv[i] = be.Alloc(2 * kn)
		sc.gkv[i] = be.Alloc(2 * kn)
		sc.dq[i] = be.Alloc(qn)
		sc.gq[i] = be.Alloc(qn)
	}
	for r := 0; r < P; r++ {
		sc.peer = append(sc.peer, Contiguous.MustPositions(n*P, P, r))
	}
	s.sc = sc
	return sc
}

// dfSplit cuts b into consecutive views of the given lengths.
func dfSplit(be kernels.Backend, b kernels.Buf, lens ...int) []kernels.Buf {
	out := make([]kernels.Buf, len(lens))
	off := 0
	for i, n := range lens {
		out[i] = be.Slice(b, off, n)
		off += n
	}
	if off != b.Len() {
		panic(fmt.Sprintf("parallel: split %d values into %d", b.Len(), off))
	}
	return out
}

// dfOML views a packed o|m|l buffer as an attention state.
func dfOML(be kernels.Backend, b kernels.Buf, n int, h model.Heads) kernels.AttnState {
	v := dfSplit(be, b, n*h.N*h.Dim, n*h.N, n*h.N)
	return kernels.AttnState{O: v[0], M: v[1], L: v[2]}
}

// dfReqs is a set of outstanding requests.
type dfReqs []transport.Request

func (r *dfReqs) wait() {
	for _, q := range *r {
		q.Wait()
	}
	*r = (*r)[:0]
}

// dfFwdXfer is one exchange step's inbound transfers of the forward.
type dfFwdXfer struct {
	in  dfReqs // k, v or q of this step
	out dfReqs // own k, v and q sent this step
}

// fwdPost posts step t's k, v and q transfers (Alg. 2 lines 6 and 15, both sides).
func (s *distFlash) fwdPost(t int, q, k, v kernels.Buf) *dfFwdXfer {
	c, sc := s.c, s.sc
	st := s.steps[t]
	x := &dfFwdXfer{}
	if st.kvFrom >= 0 {
		kv := dfSplit(s.be, sc.kv[t%2], k.Len(), v.Len())
		x.in = append(x.in, c.Irecv(kv[0], st.kvFrom, dfTagFwdK, dfSiteFwdKV), c.Irecv(kv[1], st.kvFrom, dfTagFwdV, dfSiteFwdKV))
	}
	if st.qFrom >= 0 {
		x.in = append(x.in, c.Irecv(sc.q[t%2], st.qFrom, dfTagFwdQ, dfSiteFwdQ))
	}
	if st.kvTo >= 0 {
		x.out = append(x.out, c.Isend(k, st.kvTo, dfTagFwdK, dfSiteFwdKV), c.Isend(v, st.kvTo, dfTagFwdV, dfSiteFwdKV))
	}
	if st.qTo >= 0 {
		x.out = append(x.out, c.Isend(q, st.qTo, dfTagFwdQ, dfSiteFwdQ))
	}
	transport.Start(c)
	return x
}

// Forward implements model.Attention: Alg. 2 of worker p, with the prefetch of Eq. (3) when
// Options.Overlap is set.
func (s *distFlash) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	P, be, ops := s.c.Size(), s.be, &s.ops
	n := len(pos)
	ops.Begin(be)
	q, k, v = ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v)
	sc := s.scratch(n, h)
	S := dfSteps(P)
	s.steps = s.plan(seq)
	be.AttnInit(sc.st) // line 1

	var next *dfFwdXfer
	if s.opt.Overlap && S > 0 {
		next = s.fwdPost(1, q, k, v) // step 1's fetch overlaps the diagonal block (Fig. 2)
	}
	if visibleDoc(be, pos, pos, seq) {
		be.AttnForward(sc.st, q, k, v, ops.Shape(blockShape(pos, pos, seq, h))) // line 2
	}

	var sends dfReqs        // sends of the previous step, waited for one step later
	var back dfReqs         // the helper's partial of the previous step, merged one step later
	var backBuf kernels.Buf // where it lands (nil: none)
	merge := func() {       // lines 10–11: rescale(o_p, s_p, o′, s′)
		back.wait()
		if backBuf != nil {
			be.AttnMerge(sc.st, dfOML(be, backBuf, n, h), n, h.N, h.Dim)
			backBuf = nil
		}
	}
	for t := 1; t <= S; t++ { // line 3
		st := s.steps[t]
		cur := next
		if !s.opt.Overlap {
			cur = s.fwdPost(t, q, k, v)
		} else if t < S {
			next = s.fwdPost(t+1, q, k, v)
		}
		var in dfReqs
		var inBuf kernels.Buf
		if st.qTo >= 0 { // line 10: the helper's result for this step
			inBuf = sc.back[t%2]
			in = append(in, s.c.Irecv(inBuf, st.qTo, dfTagFwdOML, dfSiteFwdOML))
		}
		cur.in.wait()
		switch {
		case st.kvFrom >= 0: // line 7: o_p, s_p = attn(q_p, k_r, v_r, o_p, s_p)
			kv := dfSplit(be, sc.kv[t%2], k.Len(), v.Len())
			if visibleDoc(be, pos, sc.peer[st.kvFrom], seq) {
				be.AttnForward(sc.st, q, kv[0], kv[1], ops.Shape(blockShape(pos, sc.peer[st.kvFrom], seq, h)))
			}
		case st.qFrom >= 0: // lines 16–17: o_r, s_r = attn(q_r, k_p, v_p, o⁰, s⁰), sent to r
			hs := dfOML(be, sc.hlp[t%2], n, h)
			be.AttnInit(hs)
			if visibleDoc(be, sc.peer[st.qFrom], pos, seq) { // else the empty partial goes back
				be.AttnForward(hs, sc.q[t%2], k, v, ops.Shape(blockShape(sc.peer[st.qFrom], pos, seq, h)))
			}
			cur.out = append(cur.out, s.c.Isend(sc.hlp[t%2], st.qFrom, dfTagFwdOML, dfSiteFwdOML))
		}
		merge() // the previous step's helper result
		sends.wait()
		sends = cur.out
		back, backBuf = in, inBuf
		if !s.opt.Overlap { // transfer, then compute: this step's traffic completes here
			sends.wait()
			back.wait()
		}
	}
	merge()
	sends.wait()
	be.AttnFinish(o, lse, sc.st, n, h.N, h.Dim) // line 21 (Alg. 3 lines 18–19: lse on the last block)
}

// dfBwdXfer is one exchange step's inbound and outbound transfers of the backward.
type dfBwdXfer struct {
	in  dfReqs
	out dfReqs
}

// bwdPost posts step t's k, v and q, dO, lse, D transfers, both sides.
func (s *distFlash) bwdPost(t int, q, k, v, do, lse kernels.Buf) *dfBwdXfer {
	c, sc, be := s.c, s.sc, s.be
	st := s.steps[t]
	x := &dfBwdXfer{}
	if st.kvFrom >= 0 {
		kv := dfSplit(be, sc.kv[t%2], k.Len(), v.Len())
		x.in = append(x.in, c.Irecv(kv[0], st.kvFrom, dfTagBwdK, dfSiteBwdKV), c.Irecv(kv[1], st.kvFrom, dfTagBwdV, dfSiteBwdKV))
	}
	if st.qFrom >= 0 {
		b := dfSplit(be, sc.qb[t%2], q.Len(), do.Len(), lse.Len(), sc.D.Len())
		x.in = append(x.in, c.Irecv(b[0], st.qFrom, dfTagBwdQ, dfSiteBwdQ), c.Irecv(b[1], st.qFrom, dfTagBwdDO, dfSiteBwdQ),
			c.Irecv(b[2], st.qFrom, dfTagBwdLSE, dfSiteBwdQ), c.Irecv(b[3], st.qFrom, dfTagBwdD, dfSiteBwdQ))
	}
	if st.kvTo >= 0 {
		x.out = append(x.out, c.Isend(k, st.kvTo, dfTagBwdK, dfSiteBwdKV), c.Isend(v, st.kvTo, dfTagBwdV, dfSiteBwdKV))
	}
	if st.qTo >= 0 {
		x.out = append(x.out, c.Isend(q, st.qTo, dfTagBwdQ, dfSiteBwdQ), c.Isend(do, st.qTo, dfTagBwdDO, dfSiteBwdQ),
			c.Isend(lse, st.qTo, dfTagBwdLSE, dfSiteBwdQ), c.Isend(sc.D, st.qTo, dfTagBwdD, dfSiteBwdQ))
	}
	transport.Start(c)
	return x
}

// Backward implements model.Attention: the balanced schedule of the forward run on the
// FlashAttention-2 block backward (App. A: "the backward pass is similar … we only need to use
// the logsumexp stored in the forward pass"), each block computed once by the rank the forward
// gave it to, its foreign gradients sent back to their owners.
func (s *distFlash) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	n := len(seq.Pos)
	be, ops := s.be, &s.ops
	ops.Begin(be)
	o, do = ops.Pack(be, "o", o), ops.Pack(be, "do", do)
	be.AttnBackwardPrep(s.scratch(n, h).D, o, do, n, h.N, h.Dim, ops.Precision())
	s.backward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), o, lse, do, seq, h)
}

// backwardD implements statsBackward: Backward with D = rowsum(dO ∘ O) ([H, n]) given.
func (s *distFlash) backwardD(dq, dk, dv, q, k, v, d, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	be, ops := s.be, &s.ops
	ops.Begin(be)
	be.Copy(s.scratch(len(seq.Pos), h).D, d)
	s.backward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), nil, lse, ops.Pack(be, "do", do), seq, h)
}

// backward is Backward once D is in the scratch and q, k, v, o, do are in the call's operand
// format; o is this rank's output (nil when only D is known), which the blocks of its own
// queries pass to the backend.
func (s *distFlash) backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	P, be, ops := s.c.Size(), s.be, &s.ops
	n := len(pos)
	sc := s.scratch(n, h)
	S := dfSteps(P)
	s.steps = s.plan(seq)

	var next *dfBwdXfer
	if s.opt.Overlap && S > 0 {
		next = s.bwdPost(1, q, k, v, do, lse)
	}
	if visibleDoc(be, pos, pos, seq) {
		be.AttnBackward(dq, dk, dv, q, k, v, o, do, lse, sc.D, ops.Shape(blockShape(pos, pos, seq, h))) // diagonal
	}

	var sends dfReqs
	var back dfReqs         // gradients of the previous step coming back
	var gkv, gq kernels.Buf // where they land (nil: none)
	accumulate := func() {
		back.wait()
		if gkv != nil {
			g := dfSplit(be, gkv, dk.Len(), dv.Len())
			be.Add(dk, dk, g[0])
			be.Add(dv, dv, g[1])
		}
		if gq != nil {
			be.Add(dq, dq, gq)
		}
		gkv, gq = nil, nil
	}
	for t := 1; t <= S; t++ {
		st := s.steps[t]
		cur := next
		if !s.opt.Overlap {
			cur = s.bwdPost(t, q, k, v, do, lse)
		} else if t < S {
			next = s.bwdPost(t+1, q, k, v, do, lse)
		}
		var in dfReqs
		var ngkv, ngq kernels.Buf
		if st.kvTo >= 0 { // dk, dv of block (p+t, p), computed by p+t
			ngkv = sc.gkv[t%2]
			in = append(in, s.c.Irecv(ngkv, st.kvTo, dfTagBwdDKV, dfSiteBwdDKV))
		}
		if st.qTo >= 0 { // dq of block (p, p+t−P), computed by the helper p+t−P
			ngq = sc.gq[t%2]
			in = append(in, s.c.Irecv(ngq, st.qTo, dfTagBwdDQ, dfSiteBwdDQ))
		}
		cur.in.wait()
		switch {
		case st.kvFrom >= 0: // block (p, p−t): dq here, dk and dv back to p−t
			kv := dfSplit(be, sc.kv[t%2], k.Len(), v.Len())
			g := dfSplit(be, sc.dkv[t%2], dk.Len(), dv.Len())
			be.Zero(sc.dkv[t%2])
			if visibleDoc(be, pos, sc.peer[st.kvFrom], seq) { // else zero gradients go back
				be.AttnBackward(dq, g[0], g[1], q, kv[0], kv[1], o, do, lse, sc.D, ops.Shape(blockShape(pos, sc.peer[st.kvFrom], seq, h)))
			}
			cur.out = append(cur.out, s.c.Isend(sc.dkv[t%2], st.kvFrom, dfTagBwdDKV, dfSiteBwdDKV))
		case st.qFrom >= 0: // block (p+P−t, p) as helper: dk, dv here, dq back
			b := dfSplit(be, sc.qb[t%2], q.Len(), do.Len(), lse.Len(), sc.D.Len())
			be.Zero(sc.dq[t%2])
			if visibleDoc(be, sc.peer[st.qFrom], pos, seq) {
				// a helper has the queries' D, not their O (the backend builds what it needs from D)
				be.AttnBackward(sc.dq[t%2], dk, dv, b[0], k, v, nil, b[1], b[2], b[3], ops.Shape(blockShape(sc.peer[st.qFrom], pos, seq, h)))
			}
			cur.out = append(cur.out, s.c.Isend(sc.dq[t%2], st.qFrom, dfTagBwdDQ, dfSiteBwdDQ))
		}
		accumulate() // the previous step's returned gradients
		sends.wait()
		sends = cur.out
		back, gkv, gq = in, ngkv, ngq
		if !s.opt.Overlap {
			sends.wait()
			back.wait()
		}
	}
	accumulate()
	sends.wait()
}
