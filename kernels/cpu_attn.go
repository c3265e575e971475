package kernels

import "math"

// Tile sizes of the CPU attention: a query tile against a key tile is one pair of SGEMMs
// with a score scratch of tileQ×tileK floats, so memory stays O(tile) whatever the
// sequence length (FlashAttention-2 tiling, papers/distflashattn.txt §2).
const (
	tileQ = 64
	tileK = 128
)

var negInf = float32(math.Inf(-1))

// tileVisible reports whether any key of the tile is visible to any query of the tile, and
// whether all of them are (so the mask need not be applied).
func tileVisible(sh AttnShape, i0, i1, j0, j1 int) (any, all bool) {
	if !sh.Causal {
		return true, true
	}
	qmin, qmax := sh.QPos[i0], sh.QPos[i0]
	for _, p := range sh.QPos[i0:i1] {
		qmin, qmax = min(qmin, p), max(qmax, p)
	}
	kmin, kmax := sh.KPos[j0], sh.KPos[j0]
	for _, p := range sh.KPos[j0:j1] {
		kmin, kmax = min(kmin, p), max(kmax, p)
	}
	return qmax >= kmin, qmin >= kmax
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

// scores computes S = scale·Q_h·K_gᵀ for one tile into s (rows i0..i1, keys j0..j1) and applies
// the position mask; it returns the number of columns (the tile's leading dimension).
func (c *CPU) scores(s, q, k []float32, sh AttnShape, h, g, i0, i1, j0, j1 int, all bool) int {
	hd, qs, ks := sh.HeadDim, sh.Heads*sh.HeadDim, sh.KVHeads*sh.HeadDim
	nq, nk := i1-i0, j1-j0
	sgemm(false, true, nq, nk, hd, sh.Scale,
		q[i0*qs+h*hd:], qs, k[j0*ks+g*hd:], ks, 0, s, nk)
	if !all {
		for i := 0; i < nq; i++ {
			qp := sh.QPos[i0+i]
			row := s[i*nk : (i+1)*nk]
			for j, kp := range sh.KPos[j0:j1] {
				if kp > qp {
					row[j] = negInf
				}
			}
		}
	}
	return nk
}

// AttnForward implements Backend. Work is parallel over query heads; each head walks query
// tiles × key tiles, skipping tiles that the causal mask hides entirely.
func (c *CPU) AttnForward(st AttnState, qb, kb, vb Buf, sh AttnShape) {
	if err := sh.Validate(); err != nil {
		panic(err)
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
	group := H / sh.KVHeads
	var computed int64
	type tile struct{ i0, i1, j0, j1 int }
	var tiles []tile
	for i0 := 0; i0 < sh.NQ; i0 += tileQ {
		i1 := min(i0+tileQ, sh.NQ)
		for j0 := 0; j0 < sh.NK; j0 += tileK {
			j1 := min(j0+tileK, sh.NK)
			if any, _ := tileVisible(sh, i0, i1, j0, j1); any {
				tiles = append(tiles, tile{i0, i1, j0, j1})
				computed += int64((i1 - i0) * (j1 - j0))
			}
		}
	}
	if len(tiles) == 0 {
		c.counters.AttnSkipped.Add(1)
		return
	}
	c.counters.AttnBlocks.Add(1)
	c.counters.AttnFwdFLOPs.Add(4 * computed * int64(hd*H))
	parallel(H, func(h int) {
		g := h / group
		s := make([]float32, tileQ*tileK)
		m, l := ms[h*sh.NQ:(h+1)*sh.NQ], ls[h*sh.NQ:(h+1)*sh.NQ]
		for _, t := range tiles {
			_, all := tileVisible(sh, t.i0, t.i1, t.j0, t.j1)
			nk := c.scores(s, q, k, sh, h, g, t.i0, t.i1, t.j0, t.j1, all)
			for i := t.i0; i < t.i1; i++ {
				row := s[(i-t.i0)*nk : (i-t.i0+1)*nk]
				mx := negInf
				for _, x := range row {
					mx = max(mx, x)
				}
				if mx == negInf { // every key of this tile is masked for this query
					clear(row)
					continue
				}
				mNew := max(m[i], mx)
				corr := float32(math.Exp(float64(m[i] - mNew))) // 0 when m[i] = -Inf
				var sum float32
				for j, x := range row {
					p := float32(math.Exp(float64(x - mNew)))
					row[j] = p
					sum += p
				}
				l[i] = l[i]*corr + sum
				m[i] = mNew
				if corr != 1 {
					orow := o[i*qs+h*hd : i*qs+h*hd+hd]
					for d := range orow {
						orow[d] *= corr
					}
				}
			}
			// O_tile += P · V_tile
			sgemm(false, false, t.i1-t.i0, hd, nk, 1,
				s, nk, v[t.j0*ks+g*hd:], ks, 1, o[t.i0*qs+h*hd:], qs)
		}
	})
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
func (c *CPU) AttnBackwardPrep(db, ob, dob Buf, nq, heads, headDim int) {
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

// AttnBackward implements Backend (FlashAttention-2 backward, papers/distflashattn.txt §3.1):
// per tile, P = exp(S − lse), dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += scale·dS·K,
// dK += scale·dSᵀ·Q. Work is parallel over key/value heads, so the query heads of one group,
// which all add into the same dK and dV, run on one goroutine in a fixed order.
func (c *CPU) AttnBackward(dqb, dkb, dvb, qb, kb, vb, dob, lseb, db Buf, sh AttnShape) {
	if err := sh.Validate(); err != nil {
		panic(err)
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
	group := H / sh.KVHeads
	var computed int64
	type tile struct {
		i0, i1, j0, j1 int
		all            bool
	}
	var tiles []tile
	for j0 := 0; j0 < sh.NK; j0 += tileK {
		j1 := min(j0+tileK, sh.NK)
		for i0 := 0; i0 < sh.NQ; i0 += tileQ {
			i1 := min(i0+tileQ, sh.NQ)
			if any, all := tileVisible(sh, i0, i1, j0, j1); any {
				tiles = append(tiles, tile{i0, i1, j0, j1, all})
				computed += int64((i1 - i0) * (j1 - j0))
			}
		}
	}
	if len(tiles) == 0 {
		return
	}
	c.counters.AttnBackwards.Add(1)
	c.counters.AttnBwdFLOPs.Add(10 * computed * int64(hd*H))
	parallel(sh.KVHeads, func(g int) {
		p := make([]float32, tileQ*tileK)
		dp := make([]float32, tileQ*tileK)
		for h := g * group; h < (g+1)*group; h++ {
			L, D := lse[h*sh.NQ:(h+1)*sh.NQ], d[h*sh.NQ:(h+1)*sh.NQ]
			for _, t := range tiles {
				nq := t.i1 - t.i0
				nk := c.scores(p, q, k, sh, h, g, t.i0, t.i1, t.j0, t.j1, t.all)
				for i := 0; i < nq; i++ {
					row, li := p[i*nk:(i+1)*nk], L[t.i0+i]
					if li == negInf {
						clear(row)
						continue
					}
					for j, x := range row {
						row[j] = float32(math.Exp(float64(x - li))) // masked: exp(-Inf) = 0
					}
				}
				// dV_tile += Pᵀ · dO_tile
				sgemm(true, false, nk, hd, nq, 1,
					p, nk, do[t.i0*qs+h*hd:], qs, 1, dv[t.j0*ks+g*hd:], ks)
				// dP = dO_tile · V_tileᵀ
				sgemm(false, true, nq, nk, hd, 1,
					do[t.i0*qs+h*hd:], qs, v[t.j0*ks+g*hd:], ks, 0, dp, nk)
				for i := 0; i < nq; i++ {
					di := D[t.i0+i]
					prow, drow := p[i*nk:(i+1)*nk], dp[i*nk:(i+1)*nk]
					for j := range prow {
						drow[j] = prow[j] * (drow[j] - di)
					}
				}
				// dQ_tile += scale · dS · K_tile ; dK_tile += scale · dSᵀ · Q_tile
				sgemm(false, false, nq, hd, nk, sh.Scale,
					dp, nk, k[t.j0*ks+g*hd:], ks, 1, dq[t.i0*qs+h*hd:], qs)
				sgemm(true, false, nk, hd, nq, sh.Scale,
					dp, nk, q[t.i0*qs+h*hd:], qs, 1, dk[t.j0*ks+g*hd:], ks)
			}
		}
	})
}
