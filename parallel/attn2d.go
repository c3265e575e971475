package parallel

// Attention2D: 2-D (query × key/value) parallel causal attention (papers/attention2d.txt §3,
// Alg. 1 forward, Alg. 3 backward, App. A reduce-scatter with the log-sum-exp merge).
//
// Grid. The P ranks form a Pr × Pc grid, Pr the largest divisor of P with Pr ≤ √P (square when
// P is a square, otherwise the most nearly square rectangle, §3.2: "the processors can be
// arranged in a rectangular grid that approximates the optimal size"; 2×4 for 8, 1×3 for 3).
// Rank p sits at row i = p mod Pr, column j = p / Pr: the paper's column-major numbering of
// P_{i,j}. Row i is a sub-communicator (transport.Comm.Split, color i, key j: rank a of the row is world
// rank i + a·Pr), column j another (color j, key i: rank b of the column is world rank
// b + j·Pr).
//
// Layout. Cyclic (§3.2 "cyclic 1D distribution"): rank p holds the n = N/P tokens p, p+P,
// p+2P, … of q, k, v, and gets back o, lse, dq, dk, dv for the same tokens.
//
// Forward (Alg. 1), on rank (i, j):
//
//	line 2  (optional, see below) k, v are transposed from the column-major to the row-major
//	        assignment: rank (i, j) gets the k, v of world rank i·Pc + j, point to point.
//	line 3  q is all-gathered in row i: the Pc query blocks of world ranks i + a·Pr,
//	        a = 0 … Pc−1, i.e. every query whose position is ≡ i (mod Pr).
//	line 4  k, v are all-gathered in column j: Pr key blocks, one per column member.
//	line 5  every (query block a, key block b) pair is folded into the partial result
//	        (o, m, l) of query block a with the attention primitive; the causal masks come from
//	        the blocks' global positions, so no mask is built (pairs the mask hides entirely
//	        are skipped).
//	line 6  the partials are reduce-scattered in row i with the log-sum-exp merge (AttnFix,
//	        Alg. 2): the partial of query block a goes to row member a, which merges the Pc
//	        partials of its own queries in row-rank order 0 … Pc−1 (AttnMerge), so the result
//	        is deterministic and the same whatever order the messages arrive in. This is the
//	        reduce-scatter of App. A (Alg. 7) done as a direct exchange (an all-to-all of the
//	        partials) instead of a ring: each rank sends the same (Pc−1) blocks, in one step
//	        instead of Pc−1.
//	line 7  AttnFinish normalises o = O/l and writes lse = m + log l.
//
// Backward (Alg. 3), on rank (i, j): D = rowsum(dO ∘ O) is computed for the rank's own queries
// (AttnBackwardPrep), then q, dO, lse and D are all-gathered in the row (the paper gathers O
// and dO and forms D after the gather; gathering D, [H, n], instead of O, [n, H, hd], moves
// less) and k, v in the column (lines 4–5); every (query block, key block) pair adds its
// gradients with the FlashAttention-2 block backward (line 6); dq is reduce-scattered (summed,
// in rank order) in the row (line 7) and dk, dv in the column (line 8).
//
// The transpose of line 2 (and its inverse for dk, dv, Alg. 3 line 9) is not needed here, and
// the registered schedule does not do it. The paper transposes so that each processor's block
// of the attention matrix is lower triangular, because the FlashAttention kernel it builds on
// only takes triangular causal masks (§3.2 footnote 3, §4 on Attention2D-O). This project's
// primitive takes the mask from global positions, and every (query block, key block) pair of
// cyclic shards is a triangle anyway (queries r + P·t against keys x + P·u: key u is visible to
// query t iff u ≤ t, or u < t when x > r), so any partition of the keys over the column
// computes the same attention with the same balance. Without the transpose, column member b
// contributes its own k, v (world rank b + j·Pr, the positions ≡ j·Pr + b mod P) and dk, dv
// come straight back to their owners from the column reduce-scatter. The paper's variant is
// kept behind attn2d.transpose (used by the tests): it moves 2·n·KV·hd more values per rank in
// the forward and 4·n·KV·hd more in the backward (the paper saves the transposed k, v for the
// backward; a model.Attention keeps nothing between the forward and backward of a layer, so
// the backward transposes k, v again as well as dk, dv back).
//
// Communication per rank and layer, in float32 values (the sites under which the
// communicator counts the bytes, 4 per value), with n = N/P, qn = n·H·hd, kn = n·KV·hd:
//
//	attn2d.fwd.q     (Pc−1)·qn               all-gather of q in the row
//	attn2d.fwd.kv    (Pr−1)·2·kn             all-gather of k, v in the column
//	attn2d.fwd.out   (Pc−1)·n·H·(hd+2)       reduce-scatter of the partial (o, m, l) in the row
//	attn2d.bwd.q     (Pc−1)·(2·qn + 2·n·H)   all-gather of q, dO, lse, D in the row
//	attn2d.bwd.kv    (Pr−1)·2·kn             all-gather of k, v in the column
//	attn2d.bwd.dq    (Pc−1)·qn               reduce-scatter of dq in the row
//	attn2d.bwd.dkv   (Pr−1)·2·kn             reduce-scatter of dk, dv in the column
//
// plus, with the transpose, 2·kn under each of attn2d.fwd.transpose, attn2d.bwd.transpose
// and attn2d.bwd.dkv.transpose on every rank whose row-major index differs from its own
// (i·Pc + j ≠ p), and once, on the first call, the two transport.Comm.Split calls under attn2d.split.
// On a square grid (Pr = Pc = √P) and MHA this is ≈ (2√P−2)·(2·qn) per rank forward against
// ring attention's 2·(P−1)·kn: the √P shrink of §3.3.
//
// Overlap (Options.Overlap, Attention2D-O, §3.4 and App. B in spirit). Without it the three
// phases run one after another on the communicator's collectives (AllGather, AllToAll,
// ReduceScatter), as in Attention2D-NO. With it the row and column all-gathers are posted as
// point-to-point transfers before any compute, each (query block, key block) pair waits only
// for its own two blocks (own blocks first, so the first pair starts without waiting on the
// network except for a transposed k, v), and the partial output (forward) or dq (backward) of
// a query block is sent to its owner as soon as its last key block is folded, while the next
// query block computes: the gather–compute–scatter interleaving of Alg. 4–6, on direct
// transfers rather than rings. The dk, dv reduce-scatter stays at the end (a key block is
// complete only after every query block). Both modes do the same arithmetic in the same
// order, so their results are bit-identical; they also send the same bytes.

import (
	"fmt"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

func init() { register("attn2d", newAttn2D, nil) }

// newAttn2D builds the Attention2D schedule for one rank, without the k, v transpose of
// Alg. 1 line 2 (see the file comment).
func newAttn2D(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &attn2d{c: c, be: be, opt: opt}
}

// attn2dGrid returns the processor grid of Attention2D on P ranks: Pr rows × Pc columns with
// Pr the largest divisor of P such that Pr ≤ √P (§3.2).
func attn2dGrid(P int) (rows, cols int) {
	if P < 1 {
		panic(fmt.Sprintf("parallel: attn2d grid for %d ranks", P))
	}
	rows = 1
	for d := 1; d*d <= P; d++ {
		if P%d == 0 {
			rows = d
		}
	}
	return rows, P / rows
}

// attn2dRowMajor is the row-major index i·Pc + j of the world rank p = i + j·Pr: with the
// transpose (Alg. 1 line 2), rank p computes with the keys and values of world rank
// attn2dRowMajor(p).
func attn2dRowMajor(p, rows, cols int) int { return (p%rows)*cols + p/rows }

// attn2dColMajor is the inverse of attn2dRowMajor: the world rank whose row-major index is x,
// to which world rank x sends its k, v in the transpose.
func attn2dColMajor(x, rows, cols int) int { return x/cols + (x%cols)*rows }

// Message tags of the schedule's point-to-point transfers. The transposes run on the world
// communicator, the overlapped gathers and scatters on the row and column ones; forward and
// backward use disjoint tags.
const (
	a2dTagFwdTK  = 0x2D00 + iota // "2D": transposed k, forward
	a2dTagFwdTV                  // transposed v, forward
	a2dTagFwdQ                   // q blocks in the row (overlap)
	a2dTagFwdKV                  // k|v blocks in the column (overlap)
	a2dTagFwdOut                 // partial (o, m, l) blocks in the row (overlap)
	a2dTagBwdTK                  // transposed k, backward
	a2dTagBwdTV                  // transposed v, backward
	a2dTagBwdQ                   // q|dO|lse|D blocks in the row (overlap)
	a2dTagBwdKV                  // k|v blocks in the column (overlap)
	a2dTagBwdDQ                  // dq blocks in the row (overlap)
	a2dTagBwdDK                  // dk back to its owner (transpose)
	a2dTagBwdDV                  // dv back to its owner (transpose)
)

// Call sites under which the schedule's bytes are counted (see the file comment).
const (
	a2dSiteSplit   = "attn2d.split"
	a2dSiteFwdT    = "attn2d.fwd.transpose"
	a2dSiteFwdQ    = "attn2d.fwd.q"
	a2dSiteFwdKV   = "attn2d.fwd.kv"
	a2dSiteFwdOut  = "attn2d.fwd.out"
	a2dSiteBwdT    = "attn2d.bwd.transpose"
	a2dSiteBwdQ    = "attn2d.bwd.q"
	a2dSiteBwdKV   = "attn2d.bwd.kv"
	a2dSiteBwdDQ   = "attn2d.bwd.dq"
	a2dSiteBwdDKV  = "attn2d.bwd.dkv"
	a2dSiteBwdDKVT = "attn2d.bwd.dkv.transpose"
)

// attn2d is one rank's Attention2D schedule.
type attn2d struct {
	c   transport.Comm
	be  kernels.Backend
	opt Options
	// transpose selects the paper's k, v transpose from the column-major to the row-major
	// assignment (Alg. 1 line 2, Alg. 3 line 9); the registered schedule leaves it off.
	transpose bool

	rows, cols int            // Pr, Pc
	i, j       int            // this rank's grid row and column
	row, col   transport.Comm // row i and column j of the grid (nil until the first call)
	sc         *a2dScratch
	ops        model.Operands // q, k, v, O, dO in the run's 16-bit format
}

// Name implements Schedule.
func (s *attn2d) Name() string { return "attn2d" }

// Layout implements Schedule: the cyclic layout of §3.2.
func (s *attn2d) Layout() Layout { return Cyclic }

// setup splits the row and column communicators off c on the first call (every rank makes its
// first call at the same point, so the collective Split lines up).
func (s *attn2d) setup() {
	if s.row != nil {
		return
	}
	P, p := s.c.Size(), s.c.Rank()
	s.rows, s.cols = attn2dGrid(P)
	s.i, s.j = p%s.rows, p/s.rows
	s.row = s.c.Split(s.i, s.j, a2dSiteSplit)
	s.col = s.c.Split(s.j, s.i, a2dSiteSplit)
	if s.row.Rank() != s.j || s.row.Size() != s.cols || s.col.Rank() != s.i || s.col.Size() != s.rows {
		panic(fmt.Sprintf("parallel: attn2d rank %d: row %d/%d, column %d/%d, want %d/%d, %d/%d",
			p, s.row.Rank(), s.row.Size(), s.col.Rank(), s.col.Size(), s.j, s.cols, s.i, s.rows))
	}
}

// kvOwner is the world rank whose k, v column member b contributes (after the transpose, if
// any): world rank b·Pc + j with the transpose, b + j·Pr (the member itself) without.
func (s *attn2d) kvOwner(b int) int {
	if s.transpose {
		return b*s.cols + s.j
	}
	return b + s.j*s.rows
}

// a2dScratch holds one rank's buffers for n local tokens and heads h, the operands (q, k, v,
// dO) in the format prec (packed in a 16-bit run: per values a buffer element), reused across
// calls.
type a2dScratch struct {
	n    int
	h    model.Heads
	prec kernels.Precision
	per  int
	qPos [][]int32 // positions of query block a of the row (world rank i + a·Pr)
	kPos [][]int32 // positions of key block b of the column (world rank kvOwner(b))

	kv   kernels.Buf // [k|v] of the key block this rank contributes to its column [2·kn]
	kvg  kernels.Buf // the column's key blocks [Pr][k|v]
	qg   kernels.Buf // the row's query blocks [Pc][qn] (forward)
	part kernels.Buf // this rank's partial (o, m, l) of each query block of the row [Pc][slab]
	recv kernels.Buf // the row's partials of this rank's queries [Pc][slab]
	rq   kernels.Buf // this rank's q|dO|lse|D [rslab] (backward)
	rqg  kernels.Buf // the row's q|dO|lse|D blocks [Pc][rslab]
	dqg  kernels.Buf // this rank's dq contribution to each query block of the row [Pc][qn]
	dqr  kernels.Buf // the row's dq contributions to this rank's queries [Pc][qn] (overlap)
	dq   kernels.Buf // the summed dq of this rank's queries [qn]
	dkvg kernels.Buf // this rank's dk|dv contribution to each key block of the column [Pr][2·kn]
	dkv  kernels.Buf // the summed dk|dv of this rank's key block [2·kn]
}

// Sizes of one block of each kind: qn, kn in values (float32 buffers), oqn, okn in buffer
// elements of operands (q, dO; k, v), slab and rslab in elements.
func (sc *a2dScratch) qn() int    { return sc.n * sc.h.N * sc.h.Dim }
func (sc *a2dScratch) kn() int    { return sc.n * sc.h.KV * sc.h.Dim }
func (sc *a2dScratch) oqn() int   { return sc.qn() / sc.per }
func (sc *a2dScratch) okn() int   { return sc.kn() / sc.per }
func (sc *a2dScratch) slab() int  { return sc.n * sc.h.N * (sc.h.Dim + 2) }
func (sc *a2dScratch) rslab() int { return 2*sc.oqn() + 2*sc.n*sc.h.N }

func (s *attn2d) scratch(n int, h model.Heads) *a2dScratch {
	if s.sc != nil && s.sc.n == n && s.sc.h == h && s.sc.prec == s.ops.Precision() {
		return s.sc
	}
	be, P := s.be, s.c.Size()
	T := n * P
	sc := &a2dScratch{n: n, h: h, prec: s.ops.Precision(), per: s.ops.Per()}
	for a := 0; a < s.cols; a++ {
		sc.qPos = append(sc.qPos, Cyclic.MustPositions(T, P, s.i+a*s.rows))
	}
	for b := 0; b < s.rows; b++ {
		sc.kPos = append(sc.kPos, Cyclic.MustPositions(T, P, s.kvOwner(b)))
	}
	qn, kn, slab, rslab := sc.qn(), sc.kn(), sc.slab(), sc.rslab()
	sc.kv, sc.kvg = be.Alloc(2*sc.okn()), be.Alloc(s.rows*2*sc.okn())
	sc.qg, sc.part, sc.recv = be.Alloc(s.cols*sc.oqn()), be.Alloc(s.cols*slab), be.Alloc(s.cols*slab)
	sc.rq, sc.rqg = be.Alloc(rslab), be.Alloc(s.cols*rslab)
	sc.dqg, sc.dq = be.Alloc(s.cols*qn), be.Alloc(qn)
	if s.opt.Overlap {
		sc.dqr = be.Alloc(s.cols * qn)
	}
	sc.dkvg, sc.dkv = be.Alloc(s.rows*2*kn), be.Alloc(2*kn)
	s.sc = sc
	return sc
}

// block returns block r of a buffer of equal blocks of size values each.
func (s *attn2d) block(b kernels.Buf, r, size int) kernels.Buf { return s.be.Slice(b, r*size, size) }

// state returns the partial result (o, m, l) held in a slab [O | M | L] of n queries.
func (s *attn2d) state(slab kernels.Buf) kernels.AttnState {
	sc, be := s.sc, s.be
	qn, nh := sc.qn(), sc.n*sc.h.N
	return kernels.AttnState{O: be.Slice(slab, 0, qn), M: be.Slice(slab, qn, nh), L: be.Slice(slab, qn+nh, nh)}
}

// a2dReqs is a set of outstanding requests.
type a2dReqs []transport.Request

func (r *a2dReqs) wait() {
	for _, q := range *r {
		q.Wait()
	}
	*r = (*r)[:0]
}

// a2dGather is an all-gather in flight: blocks of size values from every member of c into
// dst. Without overlap it is the communicator's collective, complete on return; with overlap
// it is point-to-point, and each block is waited for when it is first needed.
type a2dGather struct {
	recv  []transport.Request // receive of block r, nil once complete
	sends a2dReqs
}

// gather starts the all-gather of src (size values) into dst ([c.Size()][size]) on c.
func (s *attn2d) gather(c transport.Comm, dst, src kernels.Buf, tag int, site string) *a2dGather {
	g := &a2dGather{recv: make([]transport.Request, c.Size())}
	if !s.opt.Overlap {
		c.AllGather(dst, src, site)
		return g
	}
	me, size := c.Rank(), src.Len()
	for r := 0; r < c.Size(); r++ {
		if r != me {
			g.recv[r] = c.Irecv(s.block(dst, r, size), r, tag, site)
		}
	}
	for r := 0; r < c.Size(); r++ {
		if r != me {
			g.sends = append(g.sends, c.Isend(src, r, tag, site))
		}
	}
	transport.Start(c)
	s.be.Copy(s.block(dst, me, size), src)
	return g
}

// wait blocks until block r has arrived.
func (g *a2dGather) wait(r int) {
	if g.recv[r] != nil {
		g.recv[r].Wait()
		g.recv[r] = nil
	}
}

// done waits for every transfer of the gather.
func (g *a2dGather) done() {
	for r := range g.recv {
		g.wait(r)
	}
	g.sends.wait()
}

// fetchKV fills sc.kv with the [k|v] of the key block this rank contributes to its column:
// its own k, v, or with the transpose (Alg. 1 line 2) those of world rank i·Pc + j, received
// point to point while its own go to the rank whose row-major index it is.
func (s *attn2d) fetchKV(k, v kernels.Buf, tagK, tagV int, site string) a2dReqs {
	sc, be := s.sc, s.be
	kn := sc.okn()
	dk, dv := be.Slice(sc.kv, 0, kn), be.Slice(sc.kv, kn, kn)
	p := s.c.Rank()
	src := p
	if s.transpose {
		src = attn2dRowMajor(p, s.rows, s.cols)
	}
	if src == p {
		be.Copy(dk, k)
		be.Copy(dv, v)
		return nil
	}
	dst := attn2dColMajor(p, s.rows, s.cols)
	reqs := a2dReqs{
		s.c.Irecv(dk, src, tagK, site), s.c.Irecv(dv, src, tagV, site),
		s.c.Isend(k, dst, tagK, site), s.c.Isend(v, dst, tagV, site),
	}
	transport.Start(s.c)
	return reqs
}

// earlyRow reports whether the row's partial outputs (forward) and dq blocks (backward) travel
// as each is complete, into receives posted before the loop (overlap), or in one collective
// after it. On a communicator that queues its operations on an in-order stream (NCCL) a receive
// posted early would hold every later operation of the row behind it, the gathers the loop
// waits for included: there the gathers still overlap, the exchange comes after the loop.
func (s *attn2d) earlyRow() bool { return s.opt.Overlap && !transport.Queues(s.row) }

// attn2dOrder returns the blocks 0 … m−1 starting at own and going round: the order in which a
// rank visits the query blocks of its row (own = j) and the key blocks of its column (own = i),
// the same with and without overlap.
func attn2dOrder(m, own int) []int {
	o := make([]int, m)
	for t := range o {
		o[t] = (own + t) % m
	}
	return o
}

// Forward implements model.Attention: Alg. 1 on rank (i, j).
func (s *attn2d) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	s.setup()
	be, ops := s.be, &s.ops
	n := len(pos)
	ops.Begin(be)
	q, k, v = ops.Pack(be, "q", q), ops.Pack(be, "k", k), ops.Pack(be, "v", v)
	sc := s.scratch(n, h)
	qn, kn, slab := sc.oqn(), sc.okn(), sc.slab()
	me := s.row.Rank()

	// Partials of this rank's queries arrive from the row (line 6), posted first with overlap.
	var outRecv, outSend a2dReqs
	early := s.earlyRow()
	if early {
		for a := 0; a < s.cols; a++ {
			if a != me {
				outRecv = append(outRecv, s.row.Irecv(s.block(sc.recv, a, slab), a, a2dTagFwdOut, a2dSiteFwdOut))
			}
		}
	}
	tr := s.fetchKV(k, v, a2dTagFwdTK, a2dTagFwdTV, a2dSiteFwdT) // line 2
	qg := s.gather(s.row, sc.qg, q, a2dTagFwdQ, a2dSiteFwdQ)     // line 3
	tr.wait()
	kvg := s.gather(s.col, sc.kvg, sc.kv, a2dTagFwdKV, a2dSiteFwdKV) // line 4

	for _, a := range attn2dOrder(s.cols, me) { // line 5
		st := s.state(s.block(sc.part, a, slab))
		be.AttnInit(st)
		qg.wait(a)
		qa := s.block(sc.qg, a, qn)
		for _, b := range attn2dOrder(s.rows, s.col.Rank()) {
			kvg.wait(b)
			if !visibleDoc(be, sc.qPos[a], sc.kPos[b], seq) {
				continue
			}
			kvb := s.block(sc.kvg, b, 2*kn)
			be.AttnForward(st, qa, be.Slice(kvb, 0, kn), be.Slice(kvb, kn, kn), ops.Shape(blockShape(sc.qPos[a], sc.kPos[b], seq, h)))
		}
		if early && a != me { // query block a is done: on its way while the next computes
			outSend = append(outSend, s.row.Isend(s.block(sc.part, a, slab), a, a2dTagFwdOut, a2dSiteFwdOut))
		}
	}
	qg.done()
	kvg.done()

	// Line 6: reduce-scatter with AttnFix, merging in row-rank order.
	if early {
		be.Copy(s.block(sc.recv, me, slab), s.block(sc.part, me, slab))
		outRecv.wait()
		outSend.wait()
	} else {
		s.row.AllToAll(sc.recv, sc.part, a2dSiteFwdOut)
	}
	acc := s.state(s.block(sc.recv, 0, slab))
	for a := 1; a < s.cols; a++ {
		be.AttnMerge(acc, s.state(s.block(sc.recv, a, slab)), n, h.N, h.Dim)
	}
	be.AttnFinish(o, lse, acc, n, h.N, h.Dim) // line 7
}

// Backward implements model.Attention: Alg. 3 on rank (i, j).
func (s *attn2d) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	pos := seq.Pos
	s.setup()
	be, ops := s.be, &s.ops
	n := len(pos)
	ops.Begin(be)
	sc := s.scratch(n, h)
	qn, kn, rslab := sc.qn(), sc.kn(), sc.rslab()
	oqn, okn := sc.oqn(), sc.okn()
	nh := n * h.N
	me := s.row.Rank()

	var dqRecv, dqSend a2dReqs
	early := s.earlyRow()
	if early {
		for a := 0; a < s.cols; a++ {
			if a != me {
				dqRecv = append(dqRecv, s.row.Irecv(s.block(sc.dqr, a, qn), a, a2dTagBwdDQ, a2dSiteBwdDQ))
			}
		}
	}
	// This rank's q | dO | lse | D (q and dO in the call's operand format), with D =
	// rowsum(dO ∘ O) of its own queries.
	do, o = ops.Pack(be, "do", do), ops.Pack(be, "o", o)
	be.Copy(be.Slice(sc.rq, 0, oqn), ops.Pack(be, "q", q))
	be.Copy(be.Slice(sc.rq, oqn, oqn), do)
	be.Copy(be.Slice(sc.rq, 2*oqn, nh), lse)
	be.AttnBackwardPrep(be.Slice(sc.rq, 2*oqn+nh, nh), o, do, n, h.N, h.Dim, ops.Precision())

	tr := s.fetchKV(ops.Pack(be, "k", k), ops.Pack(be, "v", v), a2dTagBwdTK, a2dTagBwdTV, a2dSiteBwdT)
	rqg := s.gather(s.row, sc.rqg, sc.rq, a2dTagBwdQ, a2dSiteBwdQ) // line 4
	tr.wait()
	kvg := s.gather(s.col, sc.kvg, sc.kv, a2dTagBwdKV, a2dSiteBwdKV) // line 5

	be.Zero(sc.dqg)
	be.Zero(sc.dkvg)
	for _, a := range attn2dOrder(s.cols, me) { // line 6
		rqg.wait(a)
		ra := s.block(sc.rqg, a, rslab)
		qa, doa := be.Slice(ra, 0, oqn), be.Slice(ra, oqn, oqn)
		lsea, da := be.Slice(ra, 2*oqn, nh), be.Slice(ra, 2*oqn+nh, nh)
		dqa := s.block(sc.dqg, a, qn)
		for _, b := range attn2dOrder(s.rows, s.col.Rank()) {
			kvg.wait(b)
			if !visibleDoc(be, sc.qPos[a], sc.kPos[b], seq) {
				continue
			}
			kvb, dkvb := s.block(sc.kvg, b, 2*okn), s.block(sc.dkvg, b, 2*kn)
			var oa kernels.Buf // this rank's own queries come with their O; the row's others with D
			if a == me {
				oa = o
			}
			be.AttnBackward(dqa, be.Slice(dkvb, 0, kn), be.Slice(dkvb, kn, kn),
				qa, be.Slice(kvb, 0, okn), be.Slice(kvb, okn, okn), oa, doa, lsea, da, ops.Shape(blockShape(sc.qPos[a], sc.kPos[b], seq, h)))
		}
		if early && a != me { // dq of query block a is complete: send it to its owner
			dqSend = append(dqSend, s.row.Isend(dqa, a, a2dTagBwdDQ, a2dSiteBwdDQ))
		}
	}
	rqg.done()
	kvg.done()

	// Line 7: reduce-scatter dq in the row, summed in row-rank order.
	if early {
		dqRecv.wait()
		be.Zero(sc.dq)
		for a := 0; a < s.cols; a++ {
			part := s.block(sc.dqr, a, qn)
			if a == me {
				part = s.block(sc.dqg, a, qn)
			}
			be.Add(sc.dq, sc.dq, part)
		}
		dqSend.wait()
	} else {
		s.row.ReduceScatter(sc.dq, sc.dqg, a2dSiteBwdDQ)
	}
	be.Add(dq, dq, sc.dq)

	// Line 8: reduce-scatter dk, dv in the column; line 9: back to their owner if transposed.
	s.col.ReduceScatter(sc.dkv, sc.dkvg, a2dSiteBwdDKV)
	p := s.c.Rank()
	if !s.transpose || attn2dRowMajor(p, s.rows, s.cols) == p {
		be.Add(dk, dk, be.Slice(sc.dkv, 0, kn))
		be.Add(dv, dv, be.Slice(sc.dkv, kn, kn))
		return
	}
	// The column's dk|dv contributions (the reduce-scatter's input, float32) are free now: the
	// first block receives this rank's own dk, dv.
	back := s.block(sc.dkvg, 0, 2*kn)
	owner, from := attn2dRowMajor(p, s.rows, s.cols), attn2dColMajor(p, s.rows, s.cols)
	reqs := a2dReqs{
		s.c.Irecv(be.Slice(back, 0, kn), from, a2dTagBwdDK, a2dSiteBwdDKVT),
		s.c.Irecv(be.Slice(back, kn, kn), from, a2dTagBwdDV, a2dSiteBwdDKVT),
		s.c.Isend(be.Slice(sc.dkv, 0, kn), owner, a2dTagBwdDK, a2dSiteBwdDKVT),
		s.c.Isend(be.Slice(sc.dkv, kn, kn), owner, a2dTagBwdDV, a2dSiteBwdDKVT),
	}
	reqs.wait()
	be.Add(dk, dk, be.Slice(back, 0, kn))
	be.Add(dv, dv, be.Slice(back, kn, kn))
}
