package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// TestBalanceDocuments: the balanced order is a permutation that moves whole documents, no
// schedule's step time (DocumentTime's span) grows and the work stays the same (for zig-zag
// under short documents the span falls), and attention over the reordered
// sequence gives every token the output and gradients it had in the original order.
func TestBalanceDocuments(t *testing.T) {
	const T, P = 1024, 4
	docs := sampledDocs(T, 150, 3)
	for _, l := range []string{"ring", "burst", "zigzag", "attn2d", "distflash"} {
		perm, start, err := BalanceDocuments(docs, l, P, 1)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.Clone(perm)
		slices.Sort(sorted)
		for i, p := range sorted {
			if p != int32(i) {
				t.Fatalf("%s: not a permutation of the tokens", l)
			}
		}
		for i, p := range perm { // a token keeps its offset in its document
			if int32(i)-start[i] != p-docs[p] {
				t.Fatalf("%s: token %d has offset %d in its document, had %d", l, p, int32(i)-start[i], p-docs[p])
			}
		}
		before, busy, _ := DocumentTime(docs, l, P)
		after, busyB, _ := DocumentTime(start, l, P)
		if after > before || busy != busyB {
			t.Errorf("%s: span %d, was %d; work %d, was %d", l, after, before, busyB, busy)
		}
		t.Logf("%s: idle %.3f -> %.3f", l, 1-float64(busy)/float64(P*before), 1-float64(busyB)/float64(P*after))
		if l == "zigzag" && after >= before {
			t.Errorf("%s: balancing did not shorten the span %d", l, before)
		}
	}
	// the reordered sequence computes the same thing per token
	h := model.Heads{N: 2, KV: 1, Dim: 8}
	in := newInputs(T, h, 2)
	in.docs = docs
	want := in.reference()
	perm, start, err := BalanceDocuments(docs, "zigzag", P, 1)
	if err != nil {
		t.Fatal(err)
	}
	re := attnInputs{T: T, h: h, docs: start}
	gather := func(x []float32, w int) []float32 {
		out := make([]float32, 0, len(x))
		for _, p := range perm {
			out = append(out, x[int(p)*w:int(p+1)*w]...)
		}
		return out
	}
	qw, kw := h.N*h.Dim, h.KV*h.Dim
	re.q, re.k, re.v, re.do = gather(in.q, qw), gather(in.k, kw), gather(in.v, kw), gather(in.do, qw)
	got, err := re.run("zigzag", P, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want []float32
	}{{"o", got.o, gather(want.o, qw)}, {"dq", got.dq, gather(want.dq, qw)}, {"dk", got.dk, gather(want.dk, kw)}, {"dv", got.dv, gather(want.dv, kw)}} {
		if e := relErr(c.got, c.want); e > 1e-5 {
			t.Errorf("reordered %s: rel err %.3g", c.what, e)
		}
	}
}

// recBackend is a CPU backend that records every attention call a schedule makes: its shape,
// what the FLOPs counters added for it and how long it took. With serial set (one mutex shared
// by the ranks) the ranks' calls run one at a time, each on the whole machine, so a call's
// time is its own and not its share of the cores.
type recBackend struct {
	kernels.Backend
	serial *sync.Mutex
	calls  []recCall
}

// recCall is one recorded AttnForward or AttnBackward call.
type recCall struct {
	bwd   bool
	sh    kernels.AttnShape
	flops int64         // what the call added to AttnFwdFLOPs or AttnBwdFLOPs
	dur   time.Duration // how long it ran
}

// record runs call and appends it to the calls, with the FLOPs it added to ctr.
func (b *recBackend) record(bwd bool, sh kernels.AttnShape, ctr *atomic.Int64, call func()) {
	if b.serial != nil {
		b.serial.Lock()
		defer b.serial.Unlock()
	}
	before, t0 := ctr.Load(), time.Now()
	call()
	b.calls = append(b.calls, recCall{bwd: bwd, sh: sh, flops: ctr.Load() - before, dur: time.Since(t0)})
}

func (b *recBackend) AttnForward(s kernels.AttnState, q, k, v kernels.Buf, sh kernels.AttnShape) {
	b.record(false, sh, &b.Counters().AttnFwdFLOPs, func() { b.Backend.AttnForward(s, q, k, v, sh) })
}

func (b *recBackend) AttnBackward(dq, dk, dv, q, k, v, o, do, lse, d kernels.Buf, sh kernels.AttnShape) {
	b.record(true, sh, &b.Counters().AttnBwdFLOPs, func() { b.Backend.AttnBackward(dq, dk, dv, q, k, v, o, do, lse, d, sh) })
}

// phase returns the recorded calls of the forward (bwd false) or the backward.
func (b *recBackend) phase(bwd bool) []recCall {
	var out []recCall
	for _, c := range b.calls {
		if c.bwd == bwd {
			out = append(out, c)
		}
	}
	return out
}

// callSteps splits one rank's calls of one phase into the model's steps (steps[s][rank], as
// DocumentSteps gives them): every non-empty step must be a run of consecutive calls whose
// visible pairs add up to the model's, and no call may be left over. It returns the FLOPs the
// counters counted at each step and the time its calls took.
func callSteps(calls []recCall, steps [][]int64, rank int) (flops []int64, dur []time.Duration, err error) {
	flops, dur = make([]int64, len(steps)), make([]time.Duration, len(steps))
	i := 0
	for s, st := range steps {
		var got int64
		for got < st[rank] && i < len(calls) {
			got += shapePairs(calls[i].sh)
			flops[s] += calls[i].flops
			dur[s] += calls[i].dur
			i++
		}
		if got != st[rank] {
			return nil, nil, fmt.Errorf("step %d: the model has %d pairs, the schedule's calls from there %d", s, st[rank], got)
		}
	}
	if i != len(calls) {
		return nil, nil, fmt.Errorf("%d calls left over after the model's steps %v", len(calls)-i, steps)
	}
	return flops, dur, nil
}

// shapePairs counts the pairs of a call that its mask leaves visible, one by one: key j is
// visible to query i iff QStart[i] ≤ KPos[j] ≤ QPos[i] (kernels.AttnShape).
func shapePairs(sh kernels.AttnShape) int64 {
	var n int64
	for i, qp := range sh.QPos {
		lo := int32(-1 << 31)
		if sh.QStart != nil {
			lo = sh.QStart[i]
		}
		for _, kp := range sh.KPos {
			if lo <= kp && kp <= qp {
				n++
			}
		}
	}
	return n
}

// tilePairs counts the pairs of the tq×tk tiles of a call that the CPU kernel computes, the
// level at which its FLOPs counters count (kernels.Counters): a tile is computed whole when
// its largest query position is at least its smallest key position and, with documents, its
// smallest query document start is at most its largest key position.
func tilePairs(sh kernels.AttnShape, tq, tk int) int64 {
	bounds := func(x []int32, i0, t int) (lo, hi int32) {
		lo, hi = x[i0], x[i0]
		for _, v := range x[i0:min(i0+t, len(x))] {
			lo, hi = min(lo, v), max(hi, v)
		}
		return lo, hi
	}
	var n int64
	for i0 := 0; i0 < sh.NQ; i0 += tq {
		_, qhi := bounds(sh.QPos, i0, tq)
		slo := int32(-1 << 31)
		if sh.QStart != nil {
			slo, _ = bounds(sh.QStart, i0, tq)
		}
		for j0 := 0; j0 < sh.NK; j0 += tk {
			klo, khi := bounds(sh.KPos, j0, tk)
			if qhi >= klo && slo <= khi {
				n += int64(min(tq, sh.NQ-i0) * min(tk, sh.NK-j0))
			}
		}
	}
	return n
}

// sampledDocs returns a document-start table of T tokens whose document lengths are
// log-normal with the given median (σ 1.3); the first document starts before the window
// (start 0, as data.DocStarts gives a window cut inside a document).
func sampledDocs(T, median int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 17))
	d := make([]int32, T)
	s := -r.IntN(median) // the window starts inside its first document
	for s < T {
		n := max(1, int(math.Exp(math.Log(float64(median))+1.3*r.NormFloat64())))
		for p := max(s, 0); p < min(T, s+n); p++ {
			d[p] = int32(max(s, 0))
		}
		s += n
	}
	return d
}

// TestDocumentStepsMatchSchedules runs every schedule in process on sampled document tables
// with a backend that records each attention call, and checks DocumentSteps against what the
// schedules compute: each rank's visible pairs per phase equal the model's exactly (counted
// pair by pair from the calls' masks, so DistFlashAttn's helper blocks are where the schedule
// computes them), the calls fall into the model's steps in order (each non-empty step of the
// model is a run of consecutive calls whose pairs add up to it), and the FLOPs counters count
// 4·hd·H (forward) and 10·hd·H (backward) per pair of the kernel's computed tiles, which
// hold every visible pair.
func TestDocumentStepsMatchSchedules(t *testing.T) {
	type tc struct {
		T, P int
		docs []int32
		what string
	}
	var cases []tc
	for _, P := range []int{2, 3, 4, 5} {
		const T = 840
		cases = append(cases, tc{T, P, make([]int32, T), "causal"})
		for i, med := range []int{30, 150, 600} {
			cases = append(cases, tc{T, P, sampledDocs(T, med, uint64(10*P+i)), fmt.Sprintf("median %d", med)})
		}
	}
	cases = append(cases, tc{1024, 8, sampledDocs(1024, 200, 3), "median 200"}, tc{1024, 8, make([]int32, 1024), "causal"})
	for _, c := range cases {
		for _, name := range Names() {
			h := model.Heads{N: c.P, KV: c.P, Dim: 4} // ulysses splits heads over the ranks
			if err := Check(name, h, c.P); err != nil {
				t.Fatalf("%s on %d ranks: %v", name, c.P, err)
			}
			fwd, bwd, err := DocumentSteps(c.docs, name, c.P)
			if err != nil {
				t.Fatal(err)
			}
			in := newInputs(c.T, h, 1)
			in.docs = c.docs
			recs := make([]*recBackend, c.P)
			out := in.newRun(c.P)
			err = transport.NewWorld(c.P).Run(func(cm transport.Comm) error {
				be := &recBackend{Backend: kernels.NewCPU()}
				recs[cm.Rank()] = be
				s, err := NewAttention(name, cm, be, Options{Overlap: true})
				if err != nil {
					return err
				}
				return in.runRank(s, cm, be, &out)
			})
			if err != nil {
				t.Fatal(err)
			}
			var total int64
			for p, s := range c.docs {
				total += int64(p - int(s) + 1)
			}
			for r, rec := range recs {
				for _, ph := range []struct {
					bwd   bool
					steps [][]int64
					flops int64
					w     int64
				}{{false, fwd, out.work[r].AttnFwdFLOPs, 4}, {true, bwd, out.work[r].AttnBwdFLOPs, 10}} {
					calls := rec.phase(ph.bwd)
					what := fmt.Sprintf("%s on %d ranks, T %d, %s, rank %d, backward %v", name, c.P, c.T, c.what, r, ph.bwd)
					var flops int64
					for _, cl := range calls {
						pairs, tiles := shapePairs(cl.sh), tilePairs(cl.sh, 96, 128)
						if want := ph.w * int64(h.Dim*cl.sh.Heads) * tiles; cl.flops != want || tiles < pairs {
							t.Fatalf("%s: a call of %d visible pairs in %d tile pairs counted %d FLOPs, want %d", what, pairs, tiles, cl.flops, want)
						}
						flops += cl.flops
					}
					if flops != ph.flops {
						t.Fatalf("%s: calls counted %d FLOPs, the backend %d: a call was not recorded", what, flops, ph.flops)
					}
					if name == "ulysses" { // one call over all pairs, on 1/P of the heads
						if len(calls) != 1 || shapePairs(calls[0].sh) != total || calls[0].sh.Heads*c.P != h.N || ph.steps[0][r] != (total+int64(c.P)-1)/int64(c.P) {
							t.Fatalf("%s: %d calls, model %d pairs per head for %d visible", what, len(calls), ph.steps[0][r], total)
						}
						continue
					}
					for _, cl := range calls {
						if cl.sh.Heads != h.N {
							t.Fatalf("%s: a call on %d heads", what, cl.sh.Heads)
						}
					}
					if _, _, err := callSteps(calls, ph.steps, r); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
			}
		}
	}
}

// TestDocumentTimeCausal: one document as long as the window is causal attention, whose step
// times have closed forms on n = T/P tokens a rank: a diagonal block has n(n+1)/2 pairs, a
// full one n². The ring computes the diagonal then P−1 steps whose busiest rank has a full
// block; DistFlashAttn the diagonal then ⌊P/2⌋ full steps (helpers take the far blocks), so
// its idle is 1/(P+1) on even P (the P/2 idle slots of its last step, Alg. 2), against the
// ring's (P−1)/(2P−1); zig-zag has every step balanced.
func TestDocumentTimeCausal(t *testing.T) {
	const T = 960
	for _, P := range []int{2, 4, 6, 8} {
		n := int64(T / P)
		diag, full := n*(n+1)/2, n*n
		busy := int64(T*(T+1)/2) * 14
		for _, c := range []struct {
			name string
			span int64
		}{
			{"ring", 14 * (diag + int64(P-1)*full)},
			{"burst", 14 * (diag + int64(P-1)*full)},
			{"distflash", 14 * (diag + int64(P/2)*full)},
			{"zigzag", busy / int64(P)},
		} {
			span, b, err := DocumentTime(make([]int32, T), c.name, P)
			if err != nil {
				t.Fatal(err)
			}
			if span != c.span || b != busy {
				t.Errorf("%s on %d ranks: span %d, busy %d; want %d, %d", c.name, P, span, b, c.span, busy)
			}
			if c.name == "distflash" {
				if idle := 1 - float64(b)/float64(int64(P)*span); math.Abs(idle-1/float64(P+1)) > 1/float64(n) {
					t.Errorf("distflash on %d ranks: idle %.4f, want about 1/(P+1) = %.4f", P, idle, 1/float64(P+1))
				}
			}
		}
	}
}

// TestDocumentStepsErrors: bad tables and splits are refused with what was expected.
func TestDocumentStepsErrors(t *testing.T) {
	for _, c := range []struct {
		docs     []int32
		schedule string
		P        int
		want     string
	}{
		{[]int32{0, 0, 3, 3}, "ring", 2, "document start 3 at position 2"},
		{[]int32{0, 0, 0, 0, 0, 0}, "zigzag", 2, "multiple of 4"},
		{[]int32{0, 0}, "nope", 2, "parallelism.attention"},
	} {
		if _, _, err := DocumentSteps(c.docs, c.schedule, c.P); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %s P=%d: %v, want an error with %q", c.docs, c.schedule, c.P, err, c.want)
		}
	}
}
