package parallel

import (
	"fmt"
	"slices"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// Hybrid sequence parallelism (parallelism.ulysses_degree = U > 1): the S sequence-parallel
// ranks form S/U groups of U consecutive ranks; an all-to-all (DeepSpeed-Ulysses, ulysses.go)
// inside each group, and a sequence schedule (distflash, ring, zigzag, burst) between the
// groups. This is USP, "Unified Sequence Parallelism" (Fang & Zhao 2024, arXiv 2405.07719,
// which a note to Table 1 of papers/attention2d.txt describes as "a combination of Ring Attention and Ulysses
// parallelism"), and the head × context 2-D attention of LoongTrain (Gu et al. 2024).
//
// Ranks. Rank r is index i = r mod U of group g = r / U. Under mpirun's by-slot mapping
// consecutive ranks share a host, so with U dividing the ranks per host the all-to-all never
// leaves a host; the outer schedule's traffic is what crosses hosts. Two transport.Comm.Split calls on the first call (site hybrid.split)
// make the group (color g, key i) and the outer ring (color i, key g: the ranks with the same
// index in every group).
//
// Token placement. Every rank holds the tokens the outer schedule's layout gives it over all S
// ranks: Contiguous, or ZigZag for zigzag. A group then holds, together, exactly the tokens
// that layout gives rank g of S/U: Contiguous over S puts the block [g·T/G, (g+1)·T/G) (G =
// S/U) on group g; ZigZag over S gives rank gU+i chunks gU+i and 2S−1−gU−i of 2S, so group g
// holds chunks gU … gU+U−1, which is chunk g of 2G, and 2S−U(g+1) … 2S−1−gU, which is chunk
// 2G−1−g: zigzag's balance between the groups survives the all-to-all. This is the
// load-balanced placement USP describes: the zigzag split is made at the ring degree and each
// ring chunk is cut across the Ulysses ranks. After the all-to-all a rank holds its
// group's tokens in the group's rank order; a local permutation (no bytes) puts them in the
// order of the outer layout, which the outer schedule expects for its peers' blocks too.
//
// Heads. The all-to-all turns [n tokens, H heads] into [U·n tokens, H/U heads] with the head
// split of Ulysses (headSplit, replicated kv heads when U > n_kv_heads, U a multiple of it),
// and the outer schedule runs on the outer ring with H/U query heads. Every rank of the outer
// ring holds the same head slice, so the outer schedule is plain sequence-parallel attention
// on those heads, and document masks carry over unchanged: positions stay global.
//
// Backward. Like plain Ulysses, the hybrid computes D = rowsum(dO ∘ O) before the all-to-all
// (it is per head and token) and sends it with lse (hybrid.bwd.stats) instead of o, and the
// outer schedule takes it through statsBackward.
//
// Bytes per rank (4-byte values, n tokens per rank, d = head_dim, hp = H/U, kvp the kv heads
// per rank): forward hybrid.fwd.{q,o} (U−1)·n·hp·d, hybrid.fwd.{k,v} (U−1)·n·kvp·d,
// hybrid.fwd.lse (U−1)·n·hp; backward the same for q, k, v, dq, dk, dv, plus hybrid.bwd.do
// (U−1)·n·hp·d and hybrid.bwd.stats 2·(U−1)·n·hp. The outer schedule's own sites count what it
// moves with U·n tokens and hp heads on S/U ranks.
type hybrid struct {
	c      transport.Comm
	be     kernels.Backend
	opt    Options
	name   string // the outer schedule
	U      int
	layout Layout
	inner  *ulysses      // all-to-alls on the group, made on the first call
	outer  statsBackward // on the outer ring, made on the first call
	bufs   burstBufs
	geo    *hybridGeometry
	ops    model.Operands // the run's operand format: D is of the 16-bit O and dO (the outer schedule packs the rest)
}

// statsBackward is a schedule whose backward can take D = rowsum(dO ∘ O) ([H, n]) in place of
// o: every schedule the hybrid runs between its groups.
type statsBackward interface {
	Schedule
	backwardD(dq, dk, dv, q, k, v, d, lse, do kernels.Buf, seq model.Seq, h model.Heads)
}

var (
	_ statsBackward = (*ringAttn)(nil) // ring and zigzag
	_ statsBackward = (*distFlash)(nil)
	_ statsBackward = (*burst)(nil)
)

// hySiteSplit is the call site of the hybrid's two communicator splits; its all-to-alls count
// under hybrid.fwd.* and hybrid.bwd.*.
const hySiteSplit = "hybrid.split"

// newHybrid returns rank c.Rank()'s hybrid of Ulysses groups of U ranks and schedule name
// between them; U must divide c.Size().
func newHybrid(name string, U int, c transport.Comm, be kernels.Backend, opt Options) (Schedule, error) {
	if err := checkHybridShape(name, c.Size(), U); err != nil {
		return nil, err
	}
	opt.UlyssesDegree = 1
	return &hybrid{c: c, be: be, opt: opt, name: name, U: U, layout: layouts[name], bufs: burstBufs{be: be}}, nil
}

// checkHybridShape reports why schedule name cannot run between groups of U of P ranks.
func checkHybridShape(name string, P, U int) error {
	if U < 1 {
		return fmt.Errorf("parallel: parallelism.ulysses_degree = %d: must be at least 1 (1 = no Ulysses groups)", U)
	}
	if P%U != 0 {
		return fmt.Errorf("parallel: parallelism.ulysses_degree = %d: must divide parallelism.sequence_parallel_degree = %d (the ranks split into groups of ulysses_degree)", U, P)
	}
	if _, ok := schedules[name]; !ok {
		return fmt.Errorf("parallel: parallelism.attention = %q: want one of %v", name, Names())
	}
	if name == "attn2d" && U > 1 {
		return fmt.Errorf("parallel: parallelism.ulysses_degree = %d with parallelism.attention = \"attn2d\": attn2d already splits the ranks into a 2-D grid of query and key/value rows on the cyclic layout, "+
			"whose groups do not hold whole blocks of the sequence for an outer schedule; use ulysses_degree = 1 with attn2d, or distflash, ring, zigzag or burst between Ulysses groups", U)
	}
	return nil
}

// CheckHybrid reports whether schedule name with parallelism.ulysses_degree = U can run heads h
// on P sequence-parallel ranks, with an error that says why not. U = 1 is Check; with name =
// "ulysses", U only has to divide P: the all-to-all already spans every rank.
func CheckHybrid(name string, h model.Heads, P, U int) error {
	if err := checkHybridShape(name, P, U); err != nil {
		return err
	}
	if U == 1 || name == "ulysses" {
		return Check(name, h, P)
	}
	if err := checkUlysses(h, U); err != nil {
		return fmt.Errorf("parallel: parallelism.ulysses_degree = %d: the all-to-all inside each group of %d ranks shards attention by head, "+
			"so n_heads (%d) must be divisible by %d, and n_kv_heads (%d) divisible by %d or dividing it; "+
			"pick a ulysses_degree that divides the heads (1 turns the all-to-all off)", U, U, h.N, U, h.KV, U)
	}
	if err := Check(name, newHeadSplit(h, U).local(h), P/U); err != nil {
		return fmt.Errorf("parallel: parallelism.ulysses_degree = %d: %s between the %d groups: %w", U, name, P/U, err)
	}
	return nil
}

// Name implements Schedule: the outer schedule's name (parallelism.attention).
func (s *hybrid) Name() string { return s.name }

// Layout implements Schedule: the outer schedule's layout, over all the ranks.
func (s *hybrid) Layout() Layout { return s.layout }

// split makes the group and the outer ring on the first call (every rank makes its first call
// at the same point, so the collective Splits line up).
func (s *hybrid) split() {
	if s.inner != nil {
		return
	}
	r := s.c.Rank()
	g, i := r/s.U, r%s.U
	ic := s.c.Split(g, i, hySiteSplit)
	oc := s.c.Split(i, g, hySiteSplit)
	s.inner = &ulysses{c: ic, be: s.be, opt: s.opt, bufs: burstBufs{be: s.be}}
	o, ok := schedules[s.name].make(oc, s.be, s.opt).(statsBackward)
	if !ok {
		panic(fmt.Sprintf("parallel: hybrid: schedule %s cannot run between Ulysses groups: its backward does not take D", s.name))
	}
	s.outer = o
}

// hybridGeometry is where a rank's group's tokens go: the outer layout's positions of the
// group (outer), and the runs that permute the gathered rows (group rank order) into that
// order.
type hybridGeometry struct {
	pos      []int32 // this rank's positions
	outer    []int32 // the group's positions in the outer layout's order
	runs     []run   // outer row dst … dst+len comes from gathered row src … src+len
	identity bool    // gathered order is the outer order
}

// run is a stretch of rows copied as one.
type run struct{ dst, src, n int }

// geometry returns (and caches) the permutation for this rank's positions pos.
func (s *hybrid) geometry(pos []int32) *hybridGeometry {
	if s.geo != nil && slices.Equal(s.geo.pos, pos) {
		return s.geo
	}
	S, U, r := s.c.Size(), s.U, s.c.Rank()
	G, g := S/U, r/U
	n := len(pos)
	T := n * S
	if want := s.layout.MustPositions(T, S, r); !slices.Equal(want, pos) {
		panic(fmt.Sprintf("parallel: hybrid %s: rank %d of %d holds positions %v…, not its %s block %v…", s.name, r, S, pos[:min(n, 4)], s.layout, want[:min(n, 4)]))
	}
	at := make(map[int32]int, U*n) // gathered row of each position
	for j := 0; j < U; j++ {
		for i, p := range s.layout.MustPositions(T, S, g*U+j) {
			at[p] = j*n + i
		}
	}
	geo := &hybridGeometry{pos: slices.Clone(pos), outer: s.layout.MustPositions(T, G, g)}
	for t, p := range geo.outer {
		src, ok := at[p]
		if !ok {
			panic(fmt.Sprintf("parallel: hybrid %s: position %d of group %d's %s block is on no rank of the group", s.name, p, g, s.layout))
		}
		if k := len(geo.runs) - 1; k >= 0 && geo.runs[k].src+geo.runs[k].n == src {
			geo.runs[k].n++
		} else {
			geo.runs = append(geo.runs, run{dst: t, src: src, n: 1})
		}
	}
	geo.identity = len(geo.runs) == 1 && geo.runs[0].src == 0
	s.geo = geo
	return geo
}

// rows permutes x ([m rows of w]) between the gathered order and the outer order (toOuter:
// gathered → outer) into the buffer called name; x itself when the orders agree.
func (s *hybrid) rows(name string, x kernels.Buf, w int, geo *hybridGeometry, toOuter bool) kernels.Buf {
	if geo.identity {
		return x
	}
	be := s.be
	out := s.bufs.get(name, x.Len())
	for _, r := range geo.runs {
		d, src := r.dst, r.src
		if !toOuter {
			d, src = src, d
		}
		be.Copy(be.Slice(out, d*w, r.n*w), be.Slice(x, src*w, r.n*w))
	}
	return out
}

// cols permutes the columns of x ([rows, m]) as rows does the rows of a [m, w] buffer.
func (s *hybrid) cols(name string, x kernels.Buf, rows, m int, geo *hybridGeometry, toOuter bool) kernels.Buf {
	if geo.identity {
		return x
	}
	be := s.be
	out := s.bufs.get(name, x.Len())
	for h := 0; h < rows; h++ {
		for _, r := range geo.runs {
			d, src := r.dst, r.src
			if !toOuter {
				d, src = src, d
			}
			be.Copy(be.Slice(out, h*m+d, r.n), be.Slice(x, h*m+src, r.n))
		}
	}
	return out
}

// Forward implements model.Attention.
func (s *hybrid) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	s.split()
	in, U := s.inner, s.U
	n := len(seq.Pos)
	m := U * n
	geo := s.geometry(seq.Pos)
	hs := newHeadSplit(h, U)
	hl := hs.local(h)

	qo := s.rows("q", in.toHeads("q", q, n, h.N, h.Dim, hs.hp, hs.qStart, "hybrid.fwd.q"), hl.N*h.Dim, geo, true)
	ko := s.rows("k", in.toHeads("k", k, n, h.KV, h.Dim, hs.kvp, hs.kvStart, "hybrid.fwd.k"), hl.KV*h.Dim, geo, true)
	vo := s.rows("v", in.toHeads("v", v, n, h.KV, h.Dim, hs.kvp, hs.kvStart, "hybrid.fwd.v"), hl.KV*h.Dim, geo, true)

	oo, lo := s.bufs.get("o", m*hl.N*h.Dim), s.bufs.get("lse", hl.N*m)
	s.outer.Forward(oo, lo, qo, ko, vo, model.Seq{Pos: geo.outer, DocStart: seq.DocStart, Window: seq.Window}, hl)

	in.fromHeads(o, s.rows("o.g", oo, hl.N*h.Dim, geo, false), "o", n, h.N, h.Dim, hs.hp, hs.qStart, false, "hybrid.fwd.o")
	in.statsToTokens(lse, s.cols("lse.g", lo, hl.N, m, geo, false), n, hs.hp, "hybrid.fwd.lse")
}

// Backward implements model.Attention.
func (s *hybrid) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	s.split()
	be, in, U := s.be, s.inner, s.U
	n := len(seq.Pos)
	m := U * n
	geo := s.geometry(seq.Pos)
	hs := newHeadSplit(h, U)
	hl := hs.local(h)
	qw, kw := hl.N*h.Dim, hl.KV*h.Dim

	d := s.bufs.get("d", h.N*n)
	s.ops.Begin(be)
	be.AttnBackwardPrep(d, s.ops.Pack(be, "o", o), s.ops.Pack(be, "do", do), n, h.N, h.Dim, s.ops.Precision()) // D = rowsum(dO ∘ O), [H, n]

	qo := s.rows("q", in.toHeads("q", q, n, h.N, h.Dim, hs.hp, hs.qStart, "hybrid.bwd.q"), qw, geo, true)
	ko := s.rows("k", in.toHeads("k", k, n, h.KV, h.Dim, hs.kvp, hs.kvStart, "hybrid.bwd.k"), kw, geo, true)
	vo := s.rows("v", in.toHeads("v", v, n, h.KV, h.Dim, hs.kvp, hs.kvStart, "hybrid.bwd.v"), kw, geo, true)
	doo := s.rows("do", in.toHeads("do", do, n, h.N, h.Dim, hs.hp, hs.qStart, "hybrid.bwd.do"), qw, geo, true)
	dh, lseh := s.bufs.get("dh", hl.N*m), s.bufs.get("lseh", hl.N*m)
	in.statsToHeads([]kernels.Buf{dh, lseh}, []kernels.Buf{d, lse}, n, hs.hp, "hybrid.bwd.stats")
	do2, lo := s.cols("d", dh, hl.N, m, geo, true), s.cols("lse", lseh, hl.N, m, geo, true)

	dqo, dko, dvo := s.bufs.get("dq", qo.Len()), s.bufs.get("dk", ko.Len()), s.bufs.get("dv", vo.Len())
	be.Zero(dqo)
	be.Zero(dko)
	be.Zero(dvo)
	s.outer.backwardD(dqo, dko, dvo, qo, ko, vo, do2, lo, doo, model.Seq{Pos: geo.outer, DocStart: seq.DocStart, Window: seq.Window}, hl)

	in.fromHeads(dq, s.rows("dq.g", dqo, qw, geo, false), "dq", n, h.N, h.Dim, hs.hp, hs.qStart, true, "hybrid.bwd.dq")
	in.fromHeads(dk, s.rows("dk.g", dko, kw, geo, false), "dk", n, h.KV, h.Dim, hs.kvp, hs.kvStart, true, "hybrid.bwd.dk")
	in.fromHeads(dv, s.rows("dv.g", dvo, kw, geo, false), "dv", n, h.KV, h.Dim, hs.kvp, hs.kvStart, true, "hybrid.bwd.dv")
}
