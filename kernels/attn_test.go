package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// naiveAttn is softmax attention written the obvious way in float64: S = scale·QKᵀ, mask,
// P = softmax(S), O = PV, and its analytic backward. It is the reference the block primitive
// is checked against.
func naiveAttn(q, k, v, do []float32, sh AttnShape) (o, lse, dq, dk, dv []float64) {
	H, K, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	o = make([]float64, sh.NQ*H*hd)
	lse = make([]float64, H*sh.NQ)
	dq = make([]float64, len(o))
	dk = make([]float64, sh.NK*K*hd)
	dv = make([]float64, len(dk))
	for h := 0; h < H; h++ {
		g := h / (H / K)
		for i := 0; i < sh.NQ; i++ {
			s := make([]float64, sh.NK)
			mx := math.Inf(-1)
			for j := range s {
				if sh.Causal && (sh.KPos[j] > sh.QPos[i] || sh.QStart != nil && sh.KPos[j] < sh.QStart[i]) {
					s[j] = math.Inf(-1)
					continue
				}
				for d := 0; d < hd; d++ {
					s[j] += float64(q[(i*H+h)*hd+d]) * float64(k[(j*K+g)*hd+d])
				}
				s[j] *= float64(sh.Scale)
				mx = math.Max(mx, s[j])
			}
			if math.IsInf(mx, -1) { // sees no key: o = 0, lse = -Inf, no gradient
				lse[h*sh.NQ+i] = mx
				continue
			}
			var sum float64
			for j := range s {
				s[j] = math.Exp(s[j] - mx)
				sum += s[j]
			}
			lse[h*sh.NQ+i] = mx + math.Log(sum)
			for j := range s {
				s[j] /= sum // now P
				for d := 0; d < hd; d++ {
					o[(i*H+h)*hd+d] += s[j] * float64(v[(j*K+g)*hd+d])
				}
			}
			// backward: dP_j = dO·V_j, D = Σ_j P_j dP_j, dS_j = P_j (dP_j − D)
			dp := make([]float64, sh.NK)
			var D float64
			for j := range s {
				for d := 0; d < hd; d++ {
					dp[j] += float64(do[(i*H+h)*hd+d]) * float64(v[(j*K+g)*hd+d])
					dv[(j*K+g)*hd+d] += s[j] * float64(do[(i*H+h)*hd+d])
				}
				D += s[j] * dp[j]
			}
			for j := range s {
				ds := s[j] * (dp[j] - D) * float64(sh.Scale)
				for d := 0; d < hd; d++ {
					dq[(i*H+h)*hd+d] += ds * float64(k[(j*K+g)*hd+d])
					dk[(j*K+g)*hd+d] += ds * float64(q[(i*H+h)*hd+d])
				}
			}
		}
	}
	return
}

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// maxRelErr returns max|a−b| / max|b|: the error relative to the tensor's scale.
func maxRelErr(a []float32, b []float64) float64 { return maxRelErrFloor(a, b, 0) }

// maxRelErrFloor is maxRelErr with the scale max|b| raised to at least floor.
func maxRelErrFloor(a []float32, b []float64, floor float64) float64 {
	if len(a) != len(b) {
		panic(fmt.Sprintf("comparing %d values with %d", len(a), len(b)))
	}
	num, den := 0.0, floor
	for i := range b {
		num = math.Max(num, math.Abs(float64(a[i])-b[i]))
		den = math.Max(den, math.Abs(b[i]))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// layouts returns the positions of n tokens under the token layouts the schedules use.
func layouts(n int, r *rand.Rand) map[string][]int32 {
	contig := make([]int32, n)
	for i := range contig {
		contig[i] = int32(i)
	}
	// zig-zag over 2 ranks: chunks 0 and 3 then 1 and 2.
	c := n / 4
	var zig []int32
	for _, ch := range []int{0, 3, 1, 2} {
		for i := ch * c; i < (ch+1)*c; i++ {
			zig = append(zig, int32(i))
		}
	}
	for i := 4 * c; i < n; i++ {
		zig = append(zig, int32(i))
	}
	perm := make([]int32, n)
	for i, p := range r.Perm(n) {
		perm[i] = int32(p)
	}
	return map[string][]int32{"contiguous": contig, "zigzag": zig, "shuffled": perm}
}

// TestAttnBlocksMatchNaive cuts the keys into blocks of random sizes, folds them in a random
// order, part into one state and part into another that is merged in at the end, and checks
// output, lse and the block-by-block backward against naive attention, for MHA, GQA, MQA,
// 33 heads and a single head under several token layouts.
func TestAttnBlocksMatchNaive(t *testing.T) {
	heads := []struct{ h, kv, hd int }{{2, 2, 8}, {4, 2, 16}, {4, 1, 8}, {33, 3, 4}, {1, 1, 32}}
	for _, hc := range heads {
		for _, n := range []int{1, 7, 150} {
			r := rand.New(rand.NewPCG(uint64(hc.h*1000+n), 7))
			for name, pos := range layouts(n, r) {
				t.Run(fmt.Sprintf("H%d_KV%d_hd%d_n%d_%s", hc.h, hc.kv, hc.hd, n, name), func(t *testing.T) {
					checkBlocks(t, r, hc.h, hc.kv, hc.hd, pos, nil, true)
				})
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 3))
	checkBlocks(t, r, 3, 1, 6, layouts(40, r)["shuffled"], nil, false)
}

// docTables returns document-start tables (indexed by position) for n positions: many short
// documents, one document over everything, and documents cut at every quarter (the edges of
// four ranks' contiguous blocks).
func docTables(n int, r *rand.Rand) map[string][]int32 {
	table := func(starts func(p int) bool) []int32 {
		d := make([]int32, n)
		for p := range d {
			if p > 0 && !starts(p) {
				d[p] = d[p-1]
			} else {
				d[p] = int32(p)
			}
		}
		return d
	}
	return map[string][]int32{
		"short":    table(func(int) bool { return r.IntN(6) == 0 }),
		"one":      table(func(int) bool { return false }),
		"quarters": table(func(p int) bool { return n >= 4 && p%(n/4) == 0 }),
	}
}

// TestAttnDocumentMaskMatchesNaive checks the document mask (QStart) against naive attention
// with the mask written out: keys blocked and merged as in TestAttnBlocksMatchNaive, so
// many blocks hold queries that see none of their keys, under every layout, with documents
// short, whole and cut at block edges, and one long block of several tiles.
func TestAttnDocumentMaskMatchesNaive(t *testing.T) {
	heads := []struct{ h, kv, hd int }{{2, 2, 8}, {4, 1, 8}, {33, 3, 4}}
	for _, hc := range heads {
		for _, n := range []int{1, 7, 150, 520} {
			r := rand.New(rand.NewPCG(uint64(hc.h*1000+n), 9))
			for name, pos := range layouts(n, r) {
				for dn, doc := range docTables(n, r) {
					t.Run(fmt.Sprintf("H%d_KV%d_n%d_%s_%s", hc.h, hc.kv, n, name, dn), func(t *testing.T) {
						checkBlocks(t, r, hc.h, hc.kv, hc.hd, pos, doc, true)
					})
				}
			}
		}
	}
}

// TestAttnWindowMatchesNaive checks sliding windows, given to the kernel as per-query starts
// (QStart = max(document start, position − W + 1), as model.Seq.Start makes them), against
// naive attention with the band written out: windows of 1 (only itself), 3, a quarter of the
// positions and longer than all of them, alone and with short documents, under every layout.
func TestAttnWindowMatchesNaive(t *testing.T) {
	heads := []struct{ h, kv, hd int }{{2, 2, 8}, {4, 1, 8}, {33, 3, 4}}
	for _, hc := range heads {
		for _, n := range []int{7, 150, 300} {
			r := rand.New(rand.NewPCG(uint64(hc.h*1000+n), 11))
			docs := docTables(n, r)["short"]
			for name, pos := range layouts(n, r) {
				for _, W := range []int{1, 3, max(n/4, 1) + 1, 2 * n} {
					for dn, doc := range map[string][]int32{"window": nil, "window+docs": docs} {
						start := windowTable(n, W, doc)
						t.Run(fmt.Sprintf("H%d_KV%d_n%d_%s_W%d_%s", hc.h, hc.kv, n, name, W, dn), func(t *testing.T) {
							checkBlocks(t, r, hc.h, hc.kv, hc.hd, pos, start, true)
						})
					}
				}
			}
		}
	}
}

// windowTable is the start table (indexed by position) of a sliding window of W over n
// positions, with the document starts doc (nil: none): max(doc[p], p − W + 1).
func windowTable(n, W int, doc []int32) []int32 {
	start := make([]int32, n)
	for p := range start {
		start[p] = int32(max(0, p-W+1))
		if doc != nil {
			start[p] = max(start[p], doc[p])
		}
	}
	return start
}

// TestAttnWindowSkipsTiles: with a window the kernel computes only the tiles that hold a
// visible pair, and its FLOPs counters say so: at T = 4096 and W = 256 the forward and backward
// count at least the band's pairs (T·W − W(W−1)/2, 4·hd·H and 10·hd·H FLOPs each) and at most
// the tiles the band touches, far below the causal count.
func TestAttnWindowSkipsTiles(t *testing.T) {
	const T, W, H, hd = 4096, 256, 1, 16
	be := NewCPU()
	pos, start := make([]int32, T), make([]int32, T)
	for p := range pos {
		pos[p], start[p] = int32(p), int32(max(0, p-W+1))
	}
	r := rand.New(rand.NewPCG(1, 1))
	up := func(x []float32) Buf { b := be.Alloc(len(x)); be.Upload(b, x); return b }
	q, k, v, do := up(randVec(r, T*H*hd, 1)), up(randVec(r, T*H*hd, 1)), up(randVec(r, T*H*hd, 1)), up(randVec(r, T*H*hd, 1))
	flops := func(qstart []int32) (fwd, bwd int64) {
		sh := AttnShape{NQ: T, NK: T, Heads: H, KVHeads: H, HeadDim: hd, Causal: true, Scale: 0.25, QPos: pos, KPos: pos, QStart: qstart}
		st := AttnState{O: be.Alloc(T * H * hd), M: be.Alloc(H * T), L: be.Alloc(H * T)}
		be.AttnInit(st)
		before := be.Counters().Snapshot()
		be.AttnForward(st, q, k, v, sh)
		o, lse := be.Alloc(T*H*hd), be.Alloc(H*T)
		be.AttnFinish(o, lse, st, T, H, hd)
		d := be.Alloc(H * T)
		be.AttnBackwardPrep(d, o, do, T, H, hd, FP32)
		dq, dk, dv := be.Alloc(T*H*hd), be.Alloc(T*H*hd), be.Alloc(T*H*hd)
		be.AttnBackward(dq, dk, dv, q, k, v, nil, do, lse, d, sh)
		after := be.Counters().Snapshot()
		return after.AttnFwdFLOPs - before.AttnFwdFLOPs, after.AttnBwdFLOPs - before.AttnBwdFLOPs
	}
	cf, cb := flops(nil)
	wf, wb := flops(start)
	band := int64(T*W - W*(W-1)/2)
	if wf < 4*hd*H*band || wb < 10*hd*H*band {
		t.Errorf("window: %d forward / %d backward FLOPs count fewer than the band's %d pairs", wf, wb, band)
	}
	// the band touches, per query tile, at most ⌈(W + tile)/key tile⌉ + 1 key tiles
	if r := float64(wf) / float64(cf); r > 0.25 || float64(wb)/float64(cb) > 0.25 {
		t.Errorf("window of %d in %d tokens: forward %.3f, backward %.3f of the causal FLOPs, want ≤ 0.25 (tiles outside the band skipped)", W, T, r, float64(wb)/float64(cb))
	}
	t.Logf("T %d, W %d: forward %.4f, backward %.4f of the causal FLOPs; the band is %.4f of the causal pairs", T, W,
		float64(wf)/float64(cf), float64(wb)/float64(cb), float64(band)/float64(T*(T+1)/2))
}

// checkBlocks runs attention over pos in random key blocks (doc, when not nil, is the
// document-start table of the positions) and compares it with naiveAttn.
func checkBlocks(t *testing.T, r *rand.Rand, H, K, hd int, pos, doc []int32, causal bool) {
	t.Helper()
	be := NewCPU()
	n := len(pos)
	q, k, v, do := randVec(r, n*H*hd, 1.5), randVec(r, n*K*hd, 1.5), randVec(r, n*K*hd, 1), randVec(r, n*H*hd, 1)
	full := AttnShape{NQ: n, NK: n, Heads: H, KVHeads: K, HeadDim: hd, Causal: causal,
		Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos}
	if !causal { // positions are optional without the mask: leave them out, as callers may
		full.QPos, full.KPos = nil, nil
	}
	if doc != nil {
		full.QStart = make([]int32, n)
		for i, p := range pos {
			full.QStart[i] = doc[p]
		}
	}
	wo, wlse, wdq, wdk, wdv := naiveAttn(q, k, v, do, full)

	// random key blocks
	var cuts []int
	for i := 0; i < n; {
		cuts = append(cuts, i)
		i += 1 + r.IntN(max(n/3, 1))
	}
	cuts = append(cuts, n)
	order := r.Perm(len(cuts) - 1)
	newState := func() AttnState {
		s := AttnState{O: be.Alloc(n * H * hd), M: be.Alloc(H * n), L: be.Alloc(H * n)}
		be.AttnInit(s)
		return s
	}
	a, b := newState(), newState()
	block := func(bi int) (Buf, Buf, AttnShape) {
		j0, j1 := cuts[bi], cuts[bi+1]
		sh := full
		sh.NK = j1 - j0
		if causal {
			sh.KPos = pos[j0:j1]
		}
		kb, vb := be.Alloc((j1-j0)*K*hd), be.Alloc((j1-j0)*K*hd)
		be.Upload(kb, k[j0*K*hd:j1*K*hd])
		be.Upload(vb, v[j0*K*hd:j1*K*hd])
		return kb, vb, sh
	}
	qb := be.Alloc(len(q))
	be.Upload(qb, q)
	for idx, bi := range order {
		kb, vb, sh := block(bi)
		dst := a
		if idx%2 == 1 {
			dst = b
		}
		be.AttnForward(dst, qb, kb, vb, sh)
	}
	be.AttnMerge(a, b, n, H, hd)
	o, lse := be.Alloc(n*H*hd), be.Alloc(H*n)
	be.AttnFinish(o, lse, a, n, H, hd)
	if e := maxRelErr(Host(o), wo); e > 2e-6 {
		t.Errorf("output rel err %.3g", e)
	}
	// lse is a log: compare on an absolute scale of at least 1 (a lone cancelling score can be ~0).
	if e := maxRelErrFloor(Host(lse), wlse, 1); e > 2e-6 {
		t.Errorf("lse rel err %.3g", e)
	}

	dob, D := be.Alloc(len(do)), be.Alloc(H*n)
	be.Upload(dob, do)
	be.AttnBackwardPrep(D, o, dob, n, H, hd, FP32)
	dq, dk, dv := be.Alloc(len(q)), be.Alloc(len(k)), be.Alloc(len(v))
	for _, bi := range order {
		kb, vb, sh := block(bi)
		dkb, dvb := be.Alloc(kb.Len()), be.Alloc(vb.Len())
		be.AttnBackward(dq, dkb, dvb, qb, kb, vb, nil, dob, lse, D, sh)
		copy(Host(dk)[cuts[bi]*K*hd:], Host(dkb))
		copy(Host(dv)[cuts[bi]*K*hd:], Host(dvb))
	}
	for _, c := range []struct {
		name string
		got  Buf
		want []float64
	}{{"dq", dq, wdq}, {"dk", dk, wdk}, {"dv", dv, wdv}} {
		if e := maxRelErr(Host(c.got), c.want); e > 1e-5 {
			t.Errorf("%s rel err %.3g", c.name, e)
		}
		for i, x := range Host(c.got) {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("%s[%d] = %v", c.name, i, x)
			}
		}
	}
}

// TestAttnFullyMaskedQuery checks that a query that sees no key gets o = 0 and lse = -Inf,
// and contributes nothing in backward.
func TestAttnFullyMaskedQuery(t *testing.T) {
	be := NewCPU()
	sh := AttnShape{NQ: 2, NK: 2, Heads: 1, KVHeads: 1, HeadDim: 2, Causal: true, Scale: 1,
		QPos: []int32{0, 5}, KPos: []int32{3, 4}}
	s := AttnState{O: be.Alloc(4), M: be.Alloc(2), L: be.Alloc(2)}
	be.AttnInit(s)
	q, k, v := be.Alloc(4), be.Alloc(4), be.Alloc(4)
	be.Upload(q, []float32{1, 2, 3, 4})
	be.Upload(k, []float32{1, 0, 0, 1})
	be.Upload(v, []float32{1, 2, 3, 4})
	be.AttnForward(s, q, k, v, sh)
	o, lse := be.Alloc(4), be.Alloc(2)
	be.AttnFinish(o, lse, s, 2, 1, 2)
	if got := Host(o)[:2]; got[0] != 0 || got[1] != 0 || !math.IsInf(float64(Host(lse)[0]), -1) {
		t.Fatalf("masked query: o = %v lse = %v", got, Host(lse)[0])
	}
	do, D := be.Alloc(4), be.Alloc(2)
	be.Upload(do, []float32{1, 1, 1, 1})
	be.AttnBackwardPrep(D, o, do, 2, 1, 2, FP32)
	dq, dk, dv := be.Alloc(4), be.Alloc(4), be.Alloc(4)
	be.AttnBackward(dq, dk, dv, q, k, v, nil, do, lse, D, sh)
	for _, x := range append(Host(dq)[:2:2], Host(dk)...) {
		if x != x {
			t.Fatalf("NaN in backward: dq %v dk %v", Host(dq), Host(dk))
		}
	}
	if Host(dq)[0] != 0 || Host(dq)[1] != 0 {
		t.Fatalf("masked query got gradient %v", Host(dq)[:2])
	}
}

// TestAttnSkipsHiddenBlocks checks the causal skip: a key block entirely after every query is
// not computed, and is counted as skipped.
func TestAttnSkipsHiddenBlocks(t *testing.T) {
	be := NewCPU()
	n := 8
	pos, later := make([]int32, n), make([]int32, n)
	for i := range pos {
		pos[i], later[i] = int32(i), int32(n+i)
	}
	sh := AttnShape{NQ: n, NK: n, Heads: 1, KVHeads: 1, HeadDim: 4, Causal: true, Scale: 0.5, QPos: pos, KPos: later}
	s := AttnState{O: be.Alloc(n * 4), M: be.Alloc(n), L: be.Alloc(n)}
	be.AttnInit(s)
	x := be.Alloc(n * 4)
	be.AttnForward(s, x, x, x, sh)
	snap := be.Counters().Snapshot()
	if snap.AttnSkipped != 1 || snap.AttnBlocks != 0 || snap.AttnFwdFLOPs != 0 {
		t.Fatalf("counters after a hidden block: %+v", snap)
	}
	sh.KPos = pos
	be.AttnForward(s, x, x, x, sh)
	if snap = be.Counters().Snapshot(); snap.AttnBlocks != 1 || snap.AttnFwdFLOPs != int64(4*n*n*4) {
		t.Fatalf("counters after a visible block: %+v", snap)
	}
}

// TestAttnLongBlockMatchesNaive runs one block of 520 keys, long enough for several query and
// key tiles and for the backward to split each key/value head's key tiles into attnBwdChunks
// classes with partial dQ buffers (multi-query: one key/value head), against naive attention,
// under the contiguous (sorted: masked tails skipped) and shuffled (masked element by element)
// layouts.
func TestAttnLongBlockMatchesNaive(t *testing.T) {
	const n, H, K, hd = 520, 2, 1, 8
	if got := attnBwdSplit(K, gemmCeilDiv(n, tileK)); got != attnBwdChunks {
		t.Fatalf("attnBwdSplit(%d, %d) = %d, want %d: the test no longer covers the split", K, gemmCeilDiv(n, tileK), got, attnBwdChunks)
	}
	r := rand.New(rand.NewPCG(520, 1))
	for _, name := range []string{"contiguous", "shuffled"} {
		t.Run(name, func(t *testing.T) {
			pos := layouts(n, r)[name]
			be := NewCPU()
			q, k, v, do := randVec(r, n*H*hd, 1.5), randVec(r, n*K*hd, 1.5), randVec(r, n*K*hd, 1), randVec(r, n*H*hd, 1)
			sh := AttnShape{NQ: n, NK: n, Heads: H, KVHeads: K, HeadDim: hd, Causal: true,
				Scale: float32(1 / math.Sqrt(float64(hd))), QPos: pos, KPos: pos}
			wo, wlse, wdq, wdk, wdv := naiveAttn(q, k, v, do, sh)
			st := AttnState{O: be.Alloc(n * H * hd), M: be.Alloc(H * n), L: be.Alloc(H * n)}
			be.AttnInit(st)
			qb, kb, vb := upload(be, q), upload(be, k), upload(be, v)
			be.AttnForward(st, qb, kb, vb, sh)
			o, lse := be.Alloc(n*H*hd), be.Alloc(H*n)
			be.AttnFinish(o, lse, st, n, H, hd)
			dob, D := upload(be, do), be.Alloc(H*n)
			be.AttnBackwardPrep(D, o, dob, n, H, hd, FP32)
			dq, dk, dv := be.Alloc(n*H*hd), be.Alloc(n*K*hd), be.Alloc(n*K*hd)
			be.AttnBackward(dq, dk, dv, qb, kb, vb, nil, dob, lse, D, sh)
			for _, c := range []struct {
				name  string
				got   Buf
				want  []float64
				floor float64
				tol   float64
			}{{"o", o, wo, 0, 2e-6}, {"lse", lse, wlse, 1, 2e-6}, {"dq", dq, wdq, 0, 1e-5}, {"dk", dk, wdk, 0, 1e-5}, {"dv", dv, wdv, 0, 1e-5}} {
				if e := maxRelErrFloor(Host(c.got), c.want, c.floor); e > c.tol {
					t.Errorf("%s rel err %.3g > %g", c.name, e, c.tol)
				}
			}
		})
	}
}
