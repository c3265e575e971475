package kernels

import "math"

// Tile sizes of the CPU attention: a query tile against a key tile is one score tile of
// tileQ×tileK floats, so memory stays O(tile) whatever the sequence length (FlashAttention-2
// tiling, papers/distflashattn.txt §2). tileQ is a multiple of every microkernel's MR.
const (
	tileQ = 96
	tileK = 128
)

var negInf = float32(math.Inf(-1))

// posBounds returns the smallest and largest position of each tile of size t over pos.
func posBounds(pos []int32, n, t int) (lo, hi []int32) {
	for i0 := 0; i0 < n; i0 += t {
		mn, mx := pos[i0], pos[i0]
		for _, p := range pos[i0:min(i0+t, n)] {
			mn, mx = min(mn, p), max(mx, p)
		}
		lo, hi = append(lo, mn), append(hi, mx)
	}
	return lo, hi
}

// attnGrid is the causal structure of one call: for each query tile × key tile, whether any
// key is visible to any query (else the pair is skipped) and whether all are (else the mask is
// applied element by element). It looks only at the positions' bounds, so it holds for any
// layout (contiguous, zig-zag, cyclic, shuffled).
type attnGrid struct {
	nqt, nkt       int
	qlo, qhi       []int32 // per query tile
	slo, shi       []int32 // per query tile: bounds of the queries' document starts (QStart)
	klo, khi       []int32 // per key tile
	causal         bool
	computed       int64 // score elements in visible tiles
	visibleKeyTile []bool
	ksorted        []bool // per key tile: positions non-decreasing, so a row's visible keys are a prefix
}

// tileKPos returns the positions of the key tile's nk keys from j0, or nil when the whole tile
// is visible (all): then no mask reads them, and without a causal mask there are none.
func tileKPos(sh AttnShape, all bool, j0, nk int) []int32 {
	if all {
		return nil
	}
	return sh.KPos[j0 : j0+nk]
}

func newAttnGrid(sh AttnShape) *attnGrid {
	g := &attnGrid{nqt: gemmCeilDiv(sh.NQ, tileQ), nkt: gemmCeilDiv(sh.NK, tileK), causal: sh.Causal}
	if sh.Causal {
		g.qlo, g.qhi = posBounds(sh.QPos, sh.NQ, tileQ)
		if sh.QStart != nil {
			g.slo, g.shi = posBounds(sh.QStart, sh.NQ, tileQ)
		}
		g.klo, g.khi = posBounds(sh.KPos, sh.NK, tileK)
		for j0 := 0; j0 < sh.NK; j0 += tileK {
			kp := sh.KPos[j0:min(j0+tileK, sh.NK)]
			sorted := true
			for j := 1; j < len(kp); j++ {
				sorted = sorted && kp[j-1] <= kp[j]
			}
			g.ksorted = append(g.ksorted, sorted)
		}
	}
	g.visibleKeyTile = make([]bool, g.nkt)
	for it := 0; it < g.nqt; it++ {
		for jt := 0; jt < g.nkt; jt++ {
			if any, _ := g.visible(it, jt); any {
				g.computed += int64(min(tileQ, sh.NQ-it*tileQ) * min(tileK, sh.NK-jt*tileK))
				g.visibleKeyTile[jt] = true
			}
		}
	}
	return g
}

// visible reports whether any key of key tile jt is visible to any query of query tile it,
// and whether all of them are. With a document mask "any" is from bounds and may be true of
// a pair that sees nothing; the element mask then zeroes it.
func (g *attnGrid) visible(it, jt int) (any, all bool) {
	if !g.causal {
		return true, true
	}
	any, all = g.qhi[it] >= g.klo[jt], g.qlo[it] >= g.khi[jt]
	if g.slo != nil {
		any = any && g.slo[it] <= g.khi[jt]
		all = all && g.shi[it] <= g.klo[jt]
	}
	return any, all
}

// firstVisible returns how many keys of the non-decreasing kpos lie before start, the
// document start of a query: the masked head of its row.
func firstVisible(kpos []int32, start int32) int {
	lo, hi := 0, len(kpos)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if kpos[m] < start {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// visiblePrefix returns how many keys of the non-decreasing kpos a query at qp sees.
func visiblePrefix(kpos []int32, qp int32) int {
	lo, hi := 0, len(kpos)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if kpos[m] <= qp {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// maskTile sets the scores of keys later than their query, or (qstart not nil) before the
// start of its document, to -Inf in the nq×nk tile s (row stride lds), skipping rows that see
// the whole key tile (qpos ≥ kmax and qstart ≤ kmin).
func maskTile(s []float32, lds int, qpos, qstart, kpos []int32, kmin, kmax int32) {
	for i, qp := range qpos {
		qs := int32(math.MinInt32)
		if qstart != nil {
			qs = qstart[i]
		}
		if qp >= kmax && qs <= kmin {
			continue
		}
		row := s[i*lds : i*lds+len(kpos)]
		for j, kp := range kpos {
			if kp > qp || kp < qs {
				row[j] = negInf
			}
		}
	}
}

// rowStarts returns the query document starts of rows [i0, i0+nq), or nil without a
// document mask.
func rowStarts(sh AttnShape, i0, nq int) []int32 {
	if sh.QStart == nil {
		return nil
	}
	return sh.QStart[i0 : i0+nq]
}

// AttnInit implements Backend.
func (c *CPU) AttnInit(s AttnState) {
	clear(f(s.O))
	clear(f(s.L))
	m := f(s.M)
	for i := range m {
		m[i] = negInf
	}
}

// attnKV holds K and V of one call packed for the microkernel, per key/value head and key
// tile: K as the B operand of S = Q·Kᵀ (lanes = keys, steps = head_dim) and V as the B
// operand of O += P·V (lanes = head_dim, steps = keys).
type attnKV struct {
	buf        *[]float32
	kSize, per int // floats of packed K per tile, and of K and V per tile
	nkt        int
}

func (kv *attnKV) k(g, jt int) []float32 {
	off := (g*kv.nkt + jt) * kv.per
	return (*kv.buf)[off : off+kv.kSize]
}

func (kv *attnKV) v(g, jt int) []float32 {
	off := (g*kv.nkt+jt)*kv.per + kv.kSize
	return (*kv.buf)[off : off+kv.per-kv.kSize]
}

// packKV packs the key tiles that grid marks visible (parallel over heads × tiles).
func packKV(impl *gemmImpl, k, v []float32, sh AttnShape, grid *attnGrid) *attnKV {
	hd, ks, nr := sh.HeadDim, sh.KVHeads*sh.HeadDim, impl.nr
	kSize := roundUp(tileK, nr) * hd
	kv := &attnKV{kSize: kSize, per: kSize + roundUp(hd, nr)*tileK, nkt: grid.nkt}
	kv.buf = gemmGetBuf(sh.KVHeads * grid.nkt * kv.per)
	parallel(sh.KVHeads*grid.nkt, func(item int) {
		g, jt := item/grid.nkt, item%grid.nkt
		if !grid.visibleKeyTile[jt] {
			return
		}
		j0 := jt * tileK
		nk := min(tileK, sh.NK-j0)
		packLanes(kv.k(g, jt), k[j0*ks+g*hd:], ks, nk, hd, nr)
		packSteps(kv.v(g, jt), v[j0*ks+g*hd:], ks, hd, nk, nr)
	})
	return kv
}

// AttnForward implements Backend. Work items are (query head, query tile) pairs; each walks
// the visible key tiles in order with an online softmax per row (FlashAttention-2, §3.1 of
// papers/distflashattn.txt): S = scale·Q·Kᵀ and O += P·V by the SGEMM microkernel on packed
// tiles, P = exp(S − m) by the vector exponential, O rescaled when a row's maximum grows.
// An item's arithmetic does not depend on which worker runs it, so results are identical
// for any thread count.
func (c *CPU) AttnForward(st AttnState, qb, kb, vb Buf, sh AttnShape) {
	if err := sh.Validate(); err != nil {
		panic(err)
	}
	if sh.Operands != FP32 {
		H, KV, hd := sh.Heads, sh.KVHeads, sh.HeadDim
		qb, kb, vb = sh.widened(c, "attn q", qb, sh.NQ*H*hd), sh.widened(c, "attn k", kb, sh.NK*KV*hd), sh.widened(c, "attn v", vb, sh.NK*KV*hd)
		sh.Operands = FP32
	}
	q, k, v, o, ms, ls := f(qb), f(kb), f(vb), f(st.O), f(st.M), f(st.L)
	H, hd := sh.Heads, sh.HeadDim
	qs, ks := H*hd, sh.KVHeads*hd
	mustLen("attn q", q, sh.NQ*qs)
	mustLen("attn k", k, sh.NK*ks)
	mustLen("attn v", v, sh.NK*ks)
	mustLen("attn o", o, sh.NQ*qs)
	mustLen("attn m", ms, H*sh.NQ)
	mustLen("attn l", ls, H*sh.NQ)
	grid := newAttnGrid(sh)
	if grid.computed == 0 {
		c.counters.AttnSkipped.Add(1)
		return
	}
	c.counters.AttnBlocks.Add(1)
	c.counters.AttnFwdFLOPs.Add(4 * grid.computed * int64(hd*H))
	impl := &gemmKernel
	mr, nr := impl.mr, impl.nr
	kv := packKV(impl, k, v, sh, grid)
	defer gemmPutBuf(kv.buf)
	group := H / sh.KVHeads
	tkp, hdp := roundUp(tileK, nr), roundUp(hd, nr)
	parallel(H*grid.nqt, func(item int) {
		buf := gemmGetBuf(tileQ * (hd + tkp + tileK + hdp)) // pooled, not zeroed: every use writes first
		defer gemmPutBuf(buf)
		ar := arena(*buf)
		var w struct{ qp, s, pp, ot []float32 }
		w.qp, w.s, w.pp, w.ot = ar.take(tileQ*hd), ar.take(tileQ*tkp), ar.take(tileQ*tileK), ar.take(tileQ*hdp)
		h, it := item%H, item/H
		g := h / group
		i0 := it * tileQ
		nq := min(tileQ, sh.NQ-i0)
		nqp := roundUp(nq, mr)
		m, l := ms[h*sh.NQ+i0:h*sh.NQ+i0+nq], ls[h*sh.NQ+i0:h*sh.NQ+i0+nq]
		packLanes(w.qp, q[i0*qs+h*hd:], qs, nq, hd, mr)
		// the running output of the tile, padded to whole microkernel tiles
		ot := w.ot[:nqp*hdp]
		clear(ot)
		for i := 0; i < nq; i++ {
			copy(ot[i*hdp:i*hdp+hd], o[(i0+i)*qs+h*hd:(i0+i)*qs+h*hd+hd])
		}
		for jt := 0; jt < grid.nkt; jt++ {
			any, all := grid.visible(it, jt)
			if !any {
				continue
			}
			j0 := jt * tileK
			nk := min(tileK, sh.NK-j0)
			nkp := roundUp(nk, nr)
			s := w.s[:nqp*tkp]
			tileMul(impl, w.qp, kv.k(g, jt), hd, s, tkp, nqp, nkp, sh.Scale, 0)
			kpos, prefix := tileKPos(sh, all, j0, nk), !all && grid.ksorted[jt]
			if !all && !prefix {
				maskTile(s, tkp, sh.QPos[i0:i0+nq], rowStarts(sh, i0, nq), kpos, grid.klo[jt], grid.khi[jt])
			}
			for i := 0; i < nq; i++ {
				row := s[i*tkp : i*tkp+nk]
				if prefix { // the masked keys are the row's tail (P = 0 there) and, with documents, its head
					cut := visiblePrefix(kpos, sh.QPos[i0+i])
					clear(row[cut:])
					row = row[:cut]
					if sh.QStart != nil {
						for j := range row[:min(cut, firstVisible(kpos, sh.QStart[i0+i]))] {
							row[j] = negInf
						}
					}
				}
				mx := rowMax(row)
				if mx == negInf { // every key of this tile is masked for this query
					clear(row)
					continue
				}
				mNew := max(m[i], mx)
				sum := expShift(row, row, mNew)
				if mNew != m[i] {
					corr := float32(math.Exp(float64(m[i] - mNew))) // 0 when m[i] = -Inf
					l[i] *= corr
					orow := ot[i*hdp : i*hdp+hd]
					for d := range orow {
						orow[d] *= corr
					}
					m[i] = mNew
				}
				l[i] += sum
			}
			// O_tile += P · V_tile
			packLanes(w.pp, s, tkp, nq, nk, mr)
			tileMul(impl, w.pp, kv.v(g, jt), nk, ot, hdp, nqp, hdp, 1, 1)
		}
		for i := 0; i < nq; i++ {
			copy(o[(i0+i)*qs+h*hd:(i0+i)*qs+h*hd+hd], ot[i*hdp:i*hdp+hd])
		}
	})
}

// arena hands out consecutive pieces of a scratch buffer.
type arena []float32

// take returns the next n floats.
func (a *arena) take(n int) []float32 {
	s := (*a)[:n:n]
	*a = (*a)[n:]
	return s
}

// AttnMerge implements Backend: with m = max(m1, m2), o = o1·e^(m1−m) + o2·e^(m2−m) and
// l = l1·e^(m1−m) + l2·e^(m2−m).
func (c *CPU) AttnMerge(dst, src AttnState, nq, heads, headDim int) {
	o1, m1, l1 := f(dst.O), f(dst.M), f(dst.L)
	o2, m2, l2 := f(src.O), f(src.M), f(src.L)
	mustLen("merge o", o2, len(o1))
	mustLen("merge m", m2, heads*nq)
	qs := heads * headDim
	chunks(nq, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for h := 0; h < heads; h++ {
				j := h*nq + i // same (head, query) in both states
				if m2[j] == negInf {
					continue
				}
				m := max(m1[j], m2[j])
				ca := float32(math.Exp(float64(m1[j] - m)))
				cb := float32(math.Exp(float64(m2[j] - m)))
				l1[j] = l1[j]*ca + l2[j]*cb
				m1[j] = m
				x, y := o1[i*qs+h*headDim:i*qs+(h+1)*headDim], o2[i*qs+h*headDim:i*qs+(h+1)*headDim]
				for d := range x {
					x[d] = x[d]*ca + y[d]*cb
				}
			}
		}
	})
}

// AttnFinish implements Backend.
func (c *CPU) AttnFinish(ob, lseb Buf, s AttnState, nq, heads, headDim int) {
	o, lse, so, m, l := f(ob), f(lseb), f(s.O), f(s.M), f(s.L)
	mustLen("finish o", o, len(so))
	mustLen("finish lse", lse, heads*nq)
	qs := heads * headDim
	chunks(nq, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for h := 0; h < heads; h++ {
				x, y := o[i*qs+h*headDim:i*qs+(h+1)*headDim], so[i*qs+h*headDim:i*qs+(h+1)*headDim]
				li := l[h*nq+i]
				if li == 0 {
					clear(x)
					lse[h*nq+i] = negInf
					continue
				}
				inv := 1 / li
				for d := range x {
					x[d] = y[d] * inv
				}
				lse[h*nq+i] = m[h*nq+i] + float32(math.Log(float64(li)))
			}
		}
	})
}

// AttnBackwardPrep implements Backend.
func (c *CPU) AttnBackwardPrep(db, ob, dob Buf, nq, heads, headDim int, p Precision) {
	if p != FP32 {
		sh := AttnShape{Operands: p}
		ob, dob = sh.widened(c, "prep o", ob, nq*heads*headDim), sh.widened(c, "prep do", dob, nq*heads*headDim)
	}
	d, o, do := f(db), f(ob), f(dob)
	mustLen("prep o", o, nq*heads*headDim)
	mustLen("prep do", do, len(o))
	mustLen("prep D", d, heads*nq)
	chunks(nq, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for h := 0; h < heads; h++ {
				off := (i*heads + h) * headDim
				var s float64
				for j := 0; j < headDim; j++ {
					s += float64(o[off+j]) * float64(do[off+j])
				}
				d[h*nq+i] = float32(s)
			}
		}
	})
}

// attnBwdChunks is the number of key-tile classes a key/value head's backward is split into
// when the head alone cannot keep the cores busy: class c takes key tiles c, c+C, c+2C, …
// and adds its dQ into a partial buffer of its own; the partials are added to dQ in class
// order. C depends only on the shape (attnBwdSplit), so results do not depend on the
// number of threads.
const attnBwdChunks = 4

// attnBwdSplit returns the number of key-tile classes per key/value head.
func attnBwdSplit(kvHeads, keyTiles int) int {
	return max(1, min(keyTiles, attnBwdChunks/kvHeads))
}

// AttnBackward implements Backend (FlashAttention-2 backward, papers/distflashattn.txt §3.1):
// per tile, P = exp(S − lse), dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += scale·dS·K,
// dK += scale·dSᵀ·Q, every product by the SGEMM microkernel on packed tiles. Work items are
// (key/value head, class of key tiles): an item owns the dK and dV rows of its key tiles and
// walks the group's query heads, then the query tiles (each packed once), then its visible
// key tiles (K and V packed once per call) in a fixed order, adding into dK, dV and dQ (or
// its class's partial dQ, see attnBwdChunks), so no two items write the same element.
// The CPU computes from D alone (o, when given, is only checked): D is what the schedules
// compute and send, and what FlashAttention-2's backward uses.
func (c *CPU) AttnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db Buf, sh AttnShape) {
	if err := sh.Validate(); err != nil {
		panic(err)
	}
	if sh.Operands != FP32 {
		H, KV, hd := sh.Heads, sh.KVHeads, sh.HeadDim
		qb, kb, vb = sh.widened(c, "attn bwd q", qb, sh.NQ*H*hd), sh.widened(c, "attn bwd k", kb, sh.NK*KV*hd), sh.widened(c, "attn bwd v", vb, sh.NK*KV*hd)
		dob = sh.widened(c, "attn bwd do", dob, sh.NQ*H*hd)
		if ob != nil { // not read: checked only
			mustLen("attn bwd o (packed)", f(ob), sh.OperandLen(sh.NQ*H*hd))
		}
		ob = nil
		sh.Operands = FP32
	}
	if ob != nil {
		mustLen("attn bwd o", f(ob), sh.NQ*sh.Heads*sh.HeadDim)
	}
	dq, dk, dv, q, k, v, do, lse, d := f(dqb), f(dkb), f(dvb), f(qb), f(kb), f(vb), f(dob), f(lseb), f(db)
	H, hd := sh.Heads, sh.HeadDim
	qs, ks := H*hd, sh.KVHeads*hd
	mustLen("attn bwd q", q, sh.NQ*qs)
	mustLen("attn bwd dq", dq, sh.NQ*qs)
	mustLen("attn bwd do", do, sh.NQ*qs)
	mustLen("attn bwd k", k, sh.NK*ks)
	mustLen("attn bwd dk", dk, sh.NK*ks)
	mustLen("attn bwd v", v, sh.NK*ks)
	mustLen("attn bwd dv", dv, sh.NK*ks)
	mustLen("attn bwd lse", lse, H*sh.NQ)
	mustLen("attn bwd D", d, H*sh.NQ)
	grid := newAttnGrid(sh)
	if grid.computed == 0 {
		return
	}
	c.counters.AttnBackwards.Add(1)
	c.counters.AttnBwdFLOPs.Add(10 * grid.computed * int64(hd*H))
	impl := &gemmKernel
	mr, nr := impl.mr, impl.nr
	group := H / sh.KVHeads
	split := attnBwdSplit(sh.KVHeads, grid.nkt)
	var parts *[]float32
	if split > 1 {
		parts = gemmGetBuf(split * len(dq))
		clear(*parts)
		defer gemmPutBuf(parts)
	}
	tkp, hdp := roundUp(tileK, nr), roundUp(hd, nr)
	tkm := roundUp(tileK, mr)
	// K and V of every visible key tile, packed once: K as the B operand of S = Q·Kᵀ and of
	// dQ = dS·K, V as the B operand of dP = dO·Vᵀ.
	kSize, kSSize := tkp*hd, hdp*tileK
	per := 2*kSize + kSSize
	kvBuf := gemmGetBuf(sh.KVHeads * grid.nkt * per)
	defer gemmPutBuf(kvBuf)
	packed := func(g, jt int) (kB, vB, kS []float32) {
		ar := arena((*kvBuf)[(g*grid.nkt+jt)*per:])
		return ar.take(kSize), ar.take(kSize), ar.take(kSSize)
	}
	parallel(sh.KVHeads*grid.nkt, func(item int) {
		g, jt := item/grid.nkt, item%grid.nkt
		if !grid.visibleKeyTile[jt] {
			return
		}
		j0 := jt * tileK
		nk := min(tileK, sh.NK-j0)
		kB, vB, kS := packed(g, jt)
		kj, vj := k[j0*ks+g*hd:], v[j0*ks+g*hd:]
		packLanes(kB, kj, ks, nk, hd, nr)
		packLanes(vB, vj, ks, nk, hd, nr)
		packSteps(kS, kj, ks, hd, nk, nr)
	})
	parallel(sh.KVHeads*split, func(item int) {
		g, cls := item/split, item%split
		dqt := dq
		if split > 1 {
			dqt = (*parts)[cls*len(dq) : (cls+1)*len(dq)]
		}
		// scratch from the pack-buffer pool, not zeroed: every use below writes before it reads
		buf := gemmGetBuf(2*tileQ*hd + 2*hdp*tileQ + 2*tileQ*tkp + 2*tkm*tileQ + tileQ*tileK)
		defer gemmPutBuf(buf)
		ar := arena(*buf)
		var (
			qA, doA = ar.take(tileQ * hd), ar.take(tileQ * hd)
			qB, doB = ar.take(hdp * tileQ), ar.take(hdp * tileQ)
			s, dp   = ar.take(tileQ * tkp), ar.take(tileQ * tkp)
			pT, dsT = ar.take(tkm * tileQ), ar.take(tkm * tileQ)
			dsA     = ar.take(tileQ * tileK)
			cut     = make([]int, tileQ) // visible keys of each row (a prefix when masked)
		)
		for h := g * group; h < (g+1)*group; h++ {
			L, D := lse[h*sh.NQ:(h+1)*sh.NQ], d[h*sh.NQ:(h+1)*sh.NQ]
			for it := 0; it < grid.nqt; it++ {
				needed := false
				for jt := cls; jt < grid.nkt && !needed; jt += split {
					needed, _ = grid.visible(it, jt)
				}
				if !needed {
					continue
				}
				i0 := it * tileQ
				nq := min(tileQ, sh.NQ-i0)
				nqp := roundUp(nq, mr)
				qi, doi := q[i0*qs+h*hd:], do[i0*qs+h*hd:]
				packLanes(qA, qi, qs, nq, hd, mr)
				packSteps(qB, qi, qs, hd, nq, nr)
				packLanes(doA, doi, qs, nq, hd, mr)
				packSteps(doB, doi, qs, hd, nq, nr)
				for jt := cls; jt < grid.nkt; jt += split {
					any, all := grid.visible(it, jt)
					if !any {
						continue
					}
					j0 := jt * tileK
					nk := min(tileK, sh.NK-j0)
					nkp := roundUp(nk, nr)
					kB, vB, kS := packed(g, jt)
					dkj, dvj := dk[j0*ks+g*hd:], dv[j0*ks+g*hd:]
					// P = exp(scale·Q·Kᵀ − lse), masked: exp(-Inf) = 0
					tileMul(impl, qA, kB, hd, s, tkp, nqp, nkp, sh.Scale, 0)
					kpos, prefix := tileKPos(sh, all, j0, nk), !all && grid.ksorted[jt]
					if !all && !prefix {
						maskTile(s, tkp, sh.QPos[i0:i0+nq], rowStarts(sh, i0, nq), kpos, grid.klo[jt], grid.khi[jt])
					}
					for i := 0; i < nq; i++ {
						row, li := s[i*tkp:i*tkp+nk], L[i0+i]
						cut[i] = nk
						if li == negInf {
							cut[i] = 0
						} else if prefix {
							cut[i] = visiblePrefix(kpos, sh.QPos[i0+i])
							if sh.QStart != nil { // the keys before the query's document: P = 0
								for j := range row[:min(cut[i], firstVisible(kpos, sh.QStart[i0+i]))] {
									row[j] = negInf
								}
							}
						}
						clear(row[cut[i]:])
						expShift(row[:cut[i]], row[:cut[i]], li)
					}
					// dV_tile += Pᵀ · dO_tile
					packSteps(pT, s, tkp, nk, nq, mr)
					tileMul(impl, pT, doB, nq, dvj, ks, nk, hd, 1, 1)
					// dP = dO_tile · V_tileᵀ ; dS = P ∘ (dP − D)
					tileMul(impl, doA, vB, hd, dp, tkp, nqp, nkp, 1, 0)
					for i := 0; i < nq; i++ { // P = 0 past cut, so dS = 0 there
						drow := dp[i*tkp : i*tkp+nk]
						dsRow(s[i*tkp:i*tkp+cut[i]], drow[:cut[i]], D[i0+i])
						clear(drow[cut[i]:])
					}
					// dQ_tile += scale · dS · K_tile ; dK_tile += scale · dSᵀ · Q_tile
					packLanes(dsA, dp, tkp, nq, nk, mr)
					tileMul(impl, dsA, kS, nk, dqt[i0*qs+h*hd:], qs, nq, hd, sh.Scale, 1)
					packSteps(dsT, dp, tkp, nk, nq, mr)
					tileMul(impl, dsT, qB, nq, dkj, ks, nk, hd, sh.Scale, 1)
				}
			}
		}
	})
	if split > 1 {
		p := *parts
		chunks(len(dq), 1<<14, func(lo, hi int) {
			for x := lo; x < hi; x++ {
				acc := dq[x]
				for c := 0; c < split; c++ {
					acc += p[c*len(dq)+x]
				}
				dq[x] = acc
			}
		})
	}
}
