package parallel

// Ring attention: the vanilla, unbalanced sequence-parallel causal attention of DistFlashAttn
// Alg. 1 (papers/distflashattn.txt §3.1), with the key/value prefetch of §3.2 Eq. (3), and the
// ring-attention backward (papers/ring-attention-explained.txt; papers/burstattention.txt §3.4
// calls it RingAttention's backward).
//
// The sequence is split contiguously: rank p holds the n = N/P tokens [p·n, (p+1)·n) (0-based
// ranks; the paper's are 1-based). The ranks form a ring, p sends to p+1 and receives from
// p−1 (mod P).
//
// Forward (Alg. 1). Step 0 folds the local block (q_p, k_p, v_p) into the running (o, m, l)
// (line 2). At step t = 1 … P−1 every rank passes the block it holds to p+1 and receives the
// block of rank r = p−t (mod P) from p−1 (lines 4–5), then folds it (line 6). Causally only
// r < p is visible; the blocks with r > p (they arrive after the wrap-around) are fully masked,
// so rank p skips their compute, but as a vanilla ring it still receives and passes them on:
// rank p computes p+1 blocks while every rank moves P−1 blocks, which is the imbalance of
// DistFlashAttn Fig. 1(a) — idle fraction (P²−P)/(2P²) (§3.2). The ring runs up to the last
// step L at which some rank sees a key of the block it holds (lastStep: L = P−1 under the
// causal mask alone): under a sliding window W on the contiguous layout of n tokens a rank,
// L = ⌈(W−1)/n⌉, so with W ≤ n + 1 each block moves one hop, and the blocks nobody sees are
// never sent. With Options.Overlap the
// transfer of step t+1 is posted before step t computes (Eq. (3), Fig. 2); without it each
// step transfers, waits, then computes. The arithmetic and its order are the same either way.
//
// Backward. Each rank keeps its q, dO, lse and D = rowsum(dO∘O) (AttnBackwardPrep) and
// circulates (k, v, dk, dv) around the same ring: at step t it holds the block of rank
// r = p−t, adds the block's dq into its own dq, and adds the block's dk, dv into the block's
// travelling accumulator, which it then passes on with the block. After step P−1 rank p holds
// the accumulator of block p+1, which has now visited every rank, and sends it home to p+1: so
// k, v move P−1 times and dk, dv P times. With Options.Overlap the next k, v are fetched while
// the current block computes, and each block's contribution is computed into a fresh buffer so
// the accumulator arriving from p−1 is waited for only after the compute (as in
// ring-flash-attention); both modes do the same additions in the same order.
//
// Communication per rank and layer, with B = (N/P)·KV·hd·4 bytes (one of k, v, dk, dv of a
// rank, fp32): forward 2·L·B under "ring.fwd.kv"; backward 2·L·B under "ring.bwd.kv" plus
// 2·(L+1)·B under "ring.bwd.dkv" (0 when L = 0); L = P−1 without a window. Summed over the ranks that is 2·(P−1)/P·N·d
// forward and ≈ 4·N·d backward for d = KV·hd, against DistFlashAttn's causal Nd and 2Nd
// (App. C): the vanilla ring also moves the blocks nobody needs.
//
// The same code runs the zig-zag schedule (zigzag.go): there each rank holds two chunks, and
// every (query chunk, key chunk) pair is a separate primitive call, skipped when fully masked.

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

func init() { register("ring", newRing, nil) }

// Offsets of the message tags from a ring schedule's tag base; forward and backward use
// disjoint tags, and a pair of ranks exchanges at most one outstanding message per tag.
const (
	ringTagFwdK = iota
	ringTagFwdV
	ringTagBwdK
	ringTagBwdV
	ringTagBwdDKV
)

// ringSites are the call sites under which a ring schedule's bytes are counted.
type ringSites struct {
	fwdKV  string // k, v to the next rank (Alg. 1 line 5)
	bwdKV  string // k, v to the next rank in the backward
	bwdDKV string // a block's travelling dk, dv accumulator to the next rank
}

// ringAttn is one rank's ring schedule, on the contiguous layout with one chunk per rank
// (ring) or on the zig-zag layout with two (zigzag).
type ringAttn struct {
	c      transport.Comm
	be     kernels.Backend
	opt    Options
	name   string
	layout Layout
	chunks int // chunks per rank, each a run of consecutive positions
	tag    int // tag base
	site   ringSites
	sc     *ringScratch
	ops    model.Operands // q, k, v, O, dO in the run's 16-bit format
}

// newRing builds the vanilla ring schedule (DistFlashAttn Alg. 1) for one rank.
func newRing(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &ringAttn{c: c, be: be, opt: opt, name: "ring", layout: Contiguous, chunks: 1, tag: 200,
		site: ringSites{fwdKV: "ring.fwd.kv", bwdKV: "ring.bwd.kv", bwdDKV: "ring.bwd.dkv"}}
}

// Name implements Schedule.
func (s *ringAttn) Name() string { return s.name }

// Layout implements Schedule.
func (s *ringAttn) Layout() Layout { return s.layout }

// ringScratch holds one rank's buffers for n local tokens with heads h and operands in prec,
// reused across calls. Buffers indexed [2] alternate by step parity, so a transfer lands in one
// while the other computes.
type ringScratch struct {
	n    int
	h    model.Heads
	prec kernels.Precision
	peer [][]int32 // global positions of every rank's tokens

	st  []kernels.AttnState // running (o, m, l) of each own query chunk [c queries]
	lse []kernels.Buf       // lse of each own query chunk [H, c] (only with several chunks)
	d   []kernels.Buf       // D = rowsum(dO∘O) of each own query chunk [H, c]

	k, v [2]kernels.Buf // a received block's k and v [n·KV·hd values, packed in a 16-bit run]
	acc  [2]kernels.Buf // a block's travelling dk|dv accumulator [2·n·KV·hd]
	g    kernels.Buf    // this rank's dk|dv contribution to the block at hand [2·n·KV·hd]
}

func (s *ringAttn) scratch(n int, h model.Heads) *ringScratch {
	if s.sc != nil && s.sc.n == n && s.sc.h == h && s.sc.prec == s.ops.Precision() {
		return s.sc
	}
	be, P, C := s.be, s.c.Size(), s.chunks
	if n%C != 0 {
		panic(fmt.Sprintf("parallel: %s schedule: %d local tokens do not split into %d chunks", s.name, n, C))
	}
	c, kn := n/C, n*h.KV*h.Dim
	sc := &ringScratch{n: n, h: h, prec: s.ops.Precision(), g: be.Alloc(2 * kn)}
	for r := 0; r < P; r++ {
		sc.peer = append(sc.peer, s.layout.MustPositions(n*P, P, r))
	}
	for i := 0; i < C; i++ {
		sc.st = append(sc.st, newState(be, c, h))
		sc.d = append(sc.d, be.Alloc(h.N*c))
		if C > 1 {
			sc.lse = append(sc.lse, be.Alloc(h.N*c))
		}
	}
	for i := range 2 {
		sc.k[i], sc.v[i] = be.Alloc(s.ops.Len(kn)), be.Alloc(s.ops.Len(kn))
		sc.acc[i] = be.Alloc(2 * kn)
	}
	s.sc = sc
	return sc
}

// lastStep is the last ring step at which some rank's queries see a key of the block it holds
// (rank p holds rank p−t's block at step t): P−1 under the plain causal mask, fewer when a
// sliding window or the documents (seq.DocStart) hide the older blocks from every rank. All
// ranks compute it from the whole layout and the whole sequence's starts, so they agree: the
// ring stops there, and the blocks nobody would see are never sent.
func (s *ringAttn) lastStep(seq model.Seq) int {
	P, sc := s.c.Size(), s.sc
	last := 0
	for t := 1; t < P; t++ {
		for p := 0; p < P; p++ {
			if pairVisible(sc.peer[p], sc.peer[(p-t+P)%P], seq) {
				last = t
				break
			}
		}
	}
	return last
}

// ringReqs is a set of outstanding requests.
type ringReqs []transport.Request

func (r *ringReqs) wait() {
	for _, q := range *r {
		q.Wait()
	}
	*r = (*r)[:0]
}

// rows returns the view of chunk i (c tokens of width w values each) of a token-major buffer.
func (s *ringAttn) rows(b kernels.Buf, i, c, w int) kernels.Buf {
	return s.be.Slice(b, i*c*w, c*w)
}

// shift posts one ring step: cur k, v to the next rank and the next block from the previous
// rank into the buffers of parity t.
func (s *ringAttn) shift(t int, k, v kernels.Buf, tagK, tagV int, site string) ringReqs {
	P, p, sc := s.c.Size(), s.c.Rank(), s.sc
	next, prev := (p+1)%P, (p+P-1)%P
	reqs := ringReqs{
		s.c.Irecv(sc.k[t%2], prev, s.tag+tagK, site), s.c.Irecv(sc.v[t%2], prev, s.tag+tagV, site),
		s.c.Isend(k, next, s.tag+tagK, site), s.c.Isend(v, next, s.tag+tagV, site),
	}
	transport.Start(s.c)
	return reqs
}

// fold is attn(q_p, k_r, v_r, o_p, s_p) of Alg. 1 (line 2 and 6): it folds the block k, v at
// positions kPos into the running states, one primitive call per visible (query chunk, key
// chunk) pair; fully masked pairs are not computed. q, k, v are in the call's operand format.
func (s *ringAttn) fold(q, k, v kernels.Buf, qPos, kPos []int32, seq model.Seq, h model.Heads) {
	C, sc, be, ops := s.chunks, s.sc, s.be, &s.ops
	c, qw, kw := len(qPos)/C, h.N*h.Dim, h.KV*h.Dim
	for i := 0; i < C; i++ {
		qp := qPos[i*c : (i+1)*c]
		for j := 0; j < C; j++ {
			kp := kPos[j*c : (j+1)*c]
			if !visibleDoc(s.be, qp, kp, seq) {
				continue
			}
			s.be.AttnForward(sc.st[i], ops.Rows(be, q, i, c, qw), ops.Rows(be, k, j, c, kw), ops.Rows(be, v, j, c, kw),
				ops.Shape(blockShape(qp, kp, seq, h)))
		}
	}
}

// Forward implements model.Attention: Alg. 1 of worker p, with the prefetch of Eq. (3) when
// Options.Overlap is set.
func (s *ringAttn) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	P, p, be := s.c.Size(), s.c.Rank(), s.be
	n := len(pos)
	s.ops.Begin(be)
	q, k, v = s.ops.Pack(be, "q", q), s.ops.Pack(be, "k", k), s.ops.Pack(be, "v", v)
	sc := s.scratch(n, h)
	for _, st := range sc.st {
		be.AttnInit(st) // line 1
	}
	curK, curV := k, v
	var reqs ringReqs
	last := s.lastStep(seq)
	for t := 0; t <= last; t++ { // step 0 is line 2, steps 1 … P−1 are lines 3–7
		if t > 0 {
			if !s.opt.Overlap { // fetch, then compute
				reqs = s.shift(t, curK, curV, ringTagFwdK, ringTagFwdV, s.site.fwdKV)
			}
			reqs.wait()
			curK, curV = sc.k[t%2], sc.v[t%2]
		}
		if s.opt.Overlap && t+1 <= last { // Eq. (3): fetch block t+1 while block t computes
			reqs = s.shift(t+1, curK, curV, ringTagFwdK, ringTagFwdV, s.site.fwdKV)
		}
		s.fold(q, curK, curV, pos, sc.peer[(p-t+P)%P], seq, h)
	}
	reqs.wait()
	s.finish(o, lse, h)
}

// finish normalises the running states into o and lse (Alg. 3 lines 18–19).
func (s *ringAttn) finish(o, lse kernels.Buf, h model.Heads) {
	be, sc, C := s.be, s.sc, s.chunks
	n := sc.n
	c := n / C
	if C == 1 {
		be.AttnFinish(o, lse, sc.st[0], n, h.N, h.Dim)
		return
	}
	for i := 0; i < C; i++ {
		be.AttnFinish(s.rows(o, i, c, h.N*h.Dim), sc.lse[i], sc.st[i], c, h.N, h.Dim)
		for hh := 0; hh < h.N; hh++ { // lse is [H, n]: chunk i is c values of every head's row
			be.Copy(be.Slice(lse, hh*n+i*c, c), be.Slice(sc.lse[i], hh*c, c))
		}
	}
}

// chunkLSE returns the lse of each own query chunk ([H, c] each), gathered from lse [H, n].
func (s *ringAttn) chunkLSE(lse kernels.Buf, h model.Heads) []kernels.Buf {
	be, sc, C := s.be, s.sc, s.chunks
	if C == 1 {
		return []kernels.Buf{lse}
	}
	n := sc.n
	c := n / C
	for i := 0; i < C; i++ {
		for hh := 0; hh < h.N; hh++ {
			be.Copy(be.Slice(sc.lse[i], hh*c, c), be.Slice(lse, hh*n+i*c, c))
		}
	}
	return sc.lse
}

// grad adds the gradients of block k, v at kPos: dq into dq, dk|dv into g (zeroed here). It
// reports whether any pair was visible. q, k, v, o, do are in the call's operand format.
func (s *ringAttn) grad(dq, g, q, k, v, o, do kernels.Buf, lse []kernels.Buf, qPos, kPos []int32, seq model.Seq, h model.Heads) bool {
	be, sc, C, ops := s.be, s.sc, s.chunks, &s.ops
	c, qw, kw := len(qPos)/C, h.N*h.Dim, h.KV*h.Dim
	kn := g.Len() / 2
	dk, dv := be.Slice(g, 0, kn), be.Slice(g, kn, kn)
	any := false
	for i := 0; i < C; i++ {
		qp := qPos[i*c : (i+1)*c]
		for j := 0; j < C; j++ {
			kp := kPos[j*c : (j+1)*c]
			if !visibleDoc(s.be, qp, kp, seq) {
				continue
			}
			if !any {
				be.Zero(g)
				any = true
			}
			var oi kernels.Buf
			if o != nil {
				oi = ops.Rows(be, o, i, c, qw)
			}
			be.AttnBackward(s.rows(dq, i, c, qw), s.rows(dk, j, c, kw), s.rows(dv, j, c, kw),
				ops.Rows(be, q, i, c, qw), ops.Rows(be, k, j, c, kw), ops.Rows(be, v, j, c, kw), oi, ops.Rows(be, do, i, c, qw),
				lse[i], sc.d[i], ops.Shape(blockShape(qp, kp, seq, h)))
		}
	}
	return any
}

// Backward implements model.Attention: the ring-attention backward, (k, v, dk, dv) passed
// around the ring while q, dO, lse and D stay home, on the FlashAttention-2 block backward
// (DistFlashAttn App. A).
func (s *ringAttn) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	n := len(seq.Pos)
	be, ops := s.be, &s.ops
	ops.Begin(be)
	sc := s.scratch(n, h)
	c, qw := n/s.chunks, h.N*h.Dim
	o, do = ops.Pack(be, "o", o), ops.Pack(be, "do", do)
	for i := 0; i < s.chunks; i++ {
		be.AttnBackwardPrep(sc.d[i], ops.Rows(be, o, i, c, qw), ops.Rows(be, do, i, c, qw), c, h.N, h.Dim, ops.Precision())
	}
	s.backward(dq, dk, dv, ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), o, lse, do, seq, h)
}

// backwardD implements statsBackward: Backward with D = rowsum(dO ∘ O) ([H, n]) given.
func (s *ringAttn) backwardD(dq, dk, dv, q, k, v, d, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	n := len(seq.Pos)
	be, ops := s.be, &s.ops
	ops.Begin(be)
	q, k, v, do = ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v), ops.Pack(be, "do", do)
	sc := s.scratch(n, h)
	c := n / s.chunks
	for i := 0; i < s.chunks; i++ {
		for hh := 0; hh < h.N; hh++ {
			s.be.Copy(s.be.Slice(sc.d[i], hh*c, c), s.be.Slice(d, hh*n+i*c, c))
		}
	}
	s.backward(dq, dk, dv, q, k, v, nil, lse, do, seq, h)
}

// backward is Backward once D is in the scratch and q, k, v, o, do are in the call's operand
// format; o is this rank's output (nil when only D is known): the queries stay home, so every
// block of the ring can pass it to the backend.
func (s *ringAttn) backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	P, p, be := s.c.Size(), s.c.Rank(), s.be
	sc := s.scratch(len(pos), h)
	lseC := s.chunkLSE(lse, h)
	next, prev := (p+1)%P, (p+P-1)%P
	tagDKV := s.tag + ringTagBwdDKV

	curK, curV := k, v
	var kvReqs, accIn, accOut ringReqs
	last := s.lastStep(seq)
	for t := 0; t <= last; t++ {
		if t > 0 {
			if !s.opt.Overlap { // fetch block t and its accumulator, then compute
				// the accumulator first: the previous rank sent it at the end of step t−1,
				// before block t, and NCCL pairs a link's messages by order, not by tag
				accIn = ringReqs{s.c.Irecv(sc.acc[t%2], prev, tagDKV, s.site.bwdDKV)}
				kvReqs = s.shift(t, curK, curV, ringTagBwdK, ringTagBwdV, s.site.bwdKV)
				// The previous step's send completes only once its receiver has posted
				// this step's receive (true MPI/NCCL sends need not be eager).
				accOut.wait()
			}
			kvReqs.wait()
			curK, curV = sc.k[t%2], sc.v[t%2]
		}
		if s.opt.Overlap && t+1 <= last {
			kvReqs = s.shift(t+1, curK, curV, ringTagBwdK, ringTagBwdV, s.site.bwdKV)
		}
		acc := sc.acc[t%2]
		if !s.opt.Overlap {
			accIn.wait()
		}
		computed := s.grad(dq, sc.g, q, curK, curV, o, do, lseC, pos, sc.peer[(p-t+P)%P], seq, h)
		if t == 0 {
			be.Zero(acc) // block p starts its round here
		} else {
			accIn.wait()
		}
		if computed {
			be.Add(acc, acc, sc.g)
		}
		if last == 0 {
			continue
		}
		accOut.wait() // acc of step t−1, whose buffer the next receive reuses
		if t < last {
			accOut = ringReqs{s.c.Isend(acc, next, tagDKV, s.site.bwdDKV)}
			if s.opt.Overlap { // block t+1's accumulator
				accIn = ringReqs{s.c.Irecv(sc.acc[(t+1)%2], prev, tagDKV, s.site.bwdDKV)}
			}
		} else { // the last step: the accumulator goes home to its block's rank, ours comes back
			accOut = ringReqs{s.c.Isend(acc, (p-last+P)%P, tagDKV, s.site.bwdDKV)}
			accIn = ringReqs{s.c.Irecv(sc.acc[(t+1)%2], (p+last)%P, tagDKV, s.site.bwdDKV)}
		}
	}
	kvReqs.wait()
	accIn.wait()
	accOut.wait()
	home := sc.acc[(last+1)%2]
	if last == 0 {
		home = sc.acc[0]
	}
	kn := dk.Len()
	be.Add(dk, dk, be.Slice(home, 0, kn))
	be.Add(dv, dv, be.Slice(home, kn, kn))
}
