package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// scheduleRun is what a schedule produced on P ranks, gathered back into sequence order, with
// the per-rank counts.
type scheduleRun struct {
	o, lse, dq, dk, dv []float32 // o, dq [T, H, hd]; lse [H, T]; dk, dv [T, KV, hd]
	traffic            []transport.Traffic
	work               []kernels.Snapshot
}

// attnInputs are random q, k, v and output gradient for one sequence of T tokens.
type attnInputs struct {
	T           int
	h           model.Heads
	q, k, v, do []float32
	docs        []int32 // document start of every position (model.Seq.DocStart); nil: one document
	window      int     // sliding window (model.Seq.Window); 0: none
	// prec is the backends' matmul precision: FP32, or a 16-bit run whose schedules keep their
	// operands packed (model.Operands)
	prec kernels.Precision
}

// seq is the placement of the tokens at pos, with the inputs' documents and window.
func (in attnInputs) seq(pos []int32) model.Seq {
	return model.Seq{Pos: pos, DocStart: in.docs, Window: in.window}
}

func newInputs(T int, h model.Heads, seed uint64) attnInputs {
	r := rand.New(rand.NewPCG(seed, 99))
	vec := func(n int, scale float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		return x
	}
	return attnInputs{T: T, h: h, q: vec(T*h.N*h.Dim, 1.5), k: vec(T*h.KV*h.Dim, 1.5), v: vec(T*h.KV*h.Dim, 1), do: vec(T*h.N*h.Dim, 1)}
}

// reference is single-worker attention over the whole sequence.
func (in attnInputs) reference() scheduleRun {
	be := kernels.NewCPU()
	be.SetMatMulPrecision(in.prec)
	h, T := in.h, in.T
	up := func(x []float32) kernels.Buf { b := be.Alloc(len(x)); be.Upload(b, x); return b }
	q, k, v, do := up(in.q), up(in.k), up(in.v), up(in.do)
	o, lse := be.Alloc(T*h.N*h.Dim), be.Alloc(h.N*T)
	dq, dk, dv := be.Alloc(q.Len()), be.Alloc(k.Len()), be.Alloc(v.Len())
	a := model.NewLocalAttention(be)
	pos := model.Positions(T)
	a.Forward(o, lse, q, k, v, in.seq(pos), h)
	a.Backward(dq, dk, dv, q, k, v, o, lse, do, in.seq(pos), h)
	return scheduleRun{o: kernels.Host(o), lse: kernels.Host(lse), dq: kernels.Host(dq), dk: kernels.Host(dk), dv: kernels.Host(dv)}
}

// run runs schedule name on P in-process ranks, each holding its layout's shard.
func (in attnInputs) run(name string, P int, opt Options) (scheduleRun, error) {
	return in.runOn(transport.NewWorld(P), name, opt)
}

// runOn is run on a given world (one with a simulated link, say).
func (in attnInputs) runOn(w *transport.World, name string, opt Options) (scheduleRun, error) {
	out := in.newRun(w.Size())
	err := w.Run(func(c transport.Comm) error {
		be := kernels.NewCPU()
		be.SetMatMulPrecision(in.prec)
		s, err := NewAttention(name, c, be, opt)
		if err != nil {
			return err
		}
		return in.runRank(s, c, be, &out)
	})
	return out, err
}

// newRun allocates the gathered outputs of a run on P ranks.
func (in attnInputs) newRun(P int) scheduleRun {
	return scheduleRun{
		o: make([]float32, len(in.q)), lse: make([]float32, in.h.N*in.T),
		dq: make([]float32, len(in.q)), dk: make([]float32, len(in.k)), dv: make([]float32, len(in.v)),
		traffic: make([]transport.Traffic, P), work: make([]kernels.Snapshot, P),
	}
}

// runRank is one rank's part of a run: it takes its layout's shard of the inputs, runs the
// schedule's forward and backward, and writes its outputs, traffic and work counts into out.
func (in attnInputs) runRank(s Schedule, c transport.Comm, be kernels.Backend, out *scheduleRun) error {
	h, T, P := in.h, in.T, c.Size()
	pos, err := s.Layout().Positions(T, P, c.Rank())
	if err != nil {
		return err
	}
	n := len(pos)
	up := func(x []float32, width int) kernels.Buf {
		sh := Shard(x, 1, T, width, pos)
		b := be.Alloc(len(sh))
		be.Upload(b, sh)
		return b
	}
	q, k, v, do := up(in.q, h.N*h.Dim), up(in.k, h.KV*h.Dim), up(in.v, h.KV*h.Dim), up(in.do, h.N*h.Dim)
	o, lse := be.Alloc(n*h.N*h.Dim), be.Alloc(h.N*n)
	dq, dk, dv := be.Alloc(q.Len()), be.Alloc(k.Len()), be.Alloc(v.Len())
	s.Forward(o, lse, q, k, v, in.seq(pos), h)
	s.Backward(dq, dk, dv, q, k, v, o, lse, do, in.seq(pos), h)
	Unshard(out.o, kernels.Host(o), 1, T, h.N*h.Dim, pos)
	Unshard(out.dq, kernels.Host(dq), 1, T, h.N*h.Dim, pos)
	Unshard(out.dk, kernels.Host(dk), 1, T, h.KV*h.Dim, pos)
	Unshard(out.dv, kernels.Host(dv), 1, T, h.KV*h.Dim, pos)
	l := kernels.Host(lse)
	for hh := 0; hh < h.N; hh++ {
		for i, p := range pos {
			out.lse[hh*T+int(p)] = l[hh*n+i]
		}
	}
	out.traffic[c.Rank()] = c.Traffic()
	out.work[c.Rank()] = be.Counters().Snapshot()
	return nil
}

func relErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-float64(want[i])))
		den = math.Max(den, math.Abs(float64(want[i])))
	}
	return num / math.Max(den, 1e-30)
}

var testHeads = map[string]model.Heads{
	"MHA": {N: 4, KV: 4, Dim: 8},
	"GQA": {N: 8, KV: 2, Dim: 8},
	"33H": {N: 33, KV: 11, Dim: 4},
}

// TestSchedulesExact: every schedule × P ∈ {1,2,3,4,8} × {MHA, GQA, 33 heads} gives the output,
// lse and dQ, dK, dV of single-worker causal attention on the gathered sequence. A combination
// a schedule cannot run must be refused by Check with an error that says why.
func TestSchedulesExact(t *testing.T) {
	const T = 48 // a multiple of 2P for every P below
	for _, name := range Names() {
		for _, P := range []int{1, 2, 3, 4, 8} {
			for hn, h := range testHeads {
				for _, overlap := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/P%d/%s/overlap=%v", name, P, hn, overlap), func(t *testing.T) {
						if err := Check(name, h, P); err != nil {
							if !strings.Contains(err.Error(), "head") {
								t.Fatalf("refusal does not say why: %v", err)
							}
							t.Logf("refused, as it should: %v", err)
							return
						}
						in := newInputs(T, h, uint64(P*100+h.N))
						want := in.reference()
						got, err := in.run(name, P, Options{Overlap: overlap})
						if err != nil {
							t.Fatal(err)
						}
						checkExact(t, got, want)
					})
				}
			}
		}
	}
}

// TestSchedules16BitOperands: in a bf16 or fp16 run every schedule keeps q, k, v, O and dO
// packed in 16 bits (model.Operands), converted once per call, and sends them so: its output and
// lse are those of single-worker attention on the same 16-bit operands within the float32
// bounds of TestSchedulesExact (the packing rounds each operand once, on every rank as on one;
// only the merge order differs), and dQ, dK, dV within 1e-3 of their scale: D is the rowsum of
// the 16-bit O, and an O that the merge order moves by a float32 ulp can round to the next
// 16-bit value (measured 1.8e-5; a block missed or counted twice moves them by far more); over
// P ∈ {2, 3, 4}, MHA, GQA, 33 heads, overlap on and off, with documents. At every call site
// that carries only operands the bytes are half the float32 run's, while the statistics and
// gradients are not halved.
func TestSchedules16BitOperands(t *testing.T) {
	const T = 48
	for _, name := range Names() {
		for _, P := range []int{2, 3, 4} {
			for hn, h := range testHeads {
				if Check(name, h, P) != nil {
					continue
				}
				for _, prec := range []kernels.Precision{kernels.BF16, kernels.FP16} {
					if prec == kernels.FP16 && hn != "GQA" {
						continue
					}
					t.Run(fmt.Sprintf("%s/P%d/%s/%v", name, P, hn, prec), func(t *testing.T) {
						in := newInputs(T, h, uint64(P*100+h.N))
						in.prec = prec
						if P == 3 {
							in.docs = docTables(T, P, 1)["short"]
						}
						want := in.reference()
						got, err := in.run(name, P, Options{Overlap: P%2 == 0})
						if err != nil {
							t.Fatal(err)
						}
						if d := diffWithin(got, want, 2e-6, 1e-3); d != "" {
							t.Error(d)
						}
						if d := exactDiff(got, func() scheduleRun { f := in; f.prec = kernels.FP32; return f.reference() }()); d == "" {
							t.Errorf("the %v run equals the float32 reference: the operands were not rounded", prec)
						}
					})
				}
			}
		}
	}
	// the Ulysses × ring hybrid: its outer schedule packs what its all-to-alls gathered
	t.Run("hybrid ulysses 2 × ring/P4/GQA/bf16", func(t *testing.T) {
		in := newInputs(T, testHeads["GQA"], 9)
		in.prec = kernels.BF16
		got, err := in.run("ring", 4, Options{Overlap: true, UlyssesDegree: 2})
		if err != nil {
			t.Fatal(err)
		}
		if d := diffWithin(got, in.reference(), 2e-6, 1e-3); d != "" {
			t.Error(d)
		}
	})
	// operand-only call sites halve; statistics and gradients do not
	operandSites := map[string][]string{
		"ring": {"ring.fwd.kv", "ring.bwd.kv"}, "zigzag": {"zigzag.fwd.kv", "zigzag.bwd.kv"},
		"distflash": {"distflash.fwd.kv", "distflash.fwd.q", "distflash.bwd.kv"}, "burst": {"burst.fwd.kv", "burst.bwd.q", "burst.bwd.do"},
		"ulysses": {"ulysses.fwd.q", "ulysses.fwd.k", "ulysses.fwd.v", "ulysses.bwd.q", "ulysses.bwd.k", "ulysses.bwd.v", "ulysses.bwd.do"},
		"attn2d":  {"attn2d.fwd.q", "attn2d.fwd.kv", "attn2d.bwd.kv"},
	}
	gradSites := map[string][]string{
		"ring": {"ring.bwd.dkv"}, "zigzag": {"zigzag.bwd.dkv"}, "distflash": {"distflash.bwd.dkv", "distflash.bwd.dq", "distflash.fwd.oml"},
		"burst": {"burst.bwd.dq", "burst.bwd.stats"}, "ulysses": {"ulysses.bwd.dq", "ulysses.bwd.stats"}, "attn2d": {"attn2d.bwd.dq", "attn2d.fwd.out"},
	}
	for _, name := range Names() {
		in := newInputs(T, testHeads["GQA"], 7)
		f32, err := in.run(name, 4, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		in.prec = kernels.BF16
		b16, err := in.run(name, 4, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		sum := func(r scheduleRun, site string) (n int64) {
			for _, tr := range r.traffic {
				n += tr[site]
			}
			return n
		}
		for _, site := range operandSites[name] {
			if a, b := sum(f32, site), sum(b16, site); a == 0 || 2*b != a {
				t.Errorf("%s: %s moves %d bytes in bf16, %d in float32: want half", name, site, b, a)
			}
		}
		for _, site := range gradSites[name] {
			if a, b := sum(f32, site), sum(b16, site); a == 0 || a != b {
				t.Errorf("%s: %s moves %d bytes in bf16, %d in float32: want the same (float32 on the wire)", name, site, b, a)
			}
		}
	}
}

// docTables returns document-start tables (model.Seq.DocStart) for a sequence of T tokens on
// P ranks: many short documents of random lengths, one document spanning every rank,
// documents starting exactly at every rank edge of the contiguous layout, and a document
// starting at every position (each query sees only itself; whole ranks' blocks are masked).
func docTables(T, P int, seed uint64) map[string][]int32 {
	r := rand.New(rand.NewPCG(seed, 17))
	table := func(starts func(p int) bool) []int32 {
		d := make([]int32, T)
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
		"short":     table(func(int) bool { return r.IntN(5) == 0 }),
		"spanning":  table(func(int) bool { return false }),
		"rankedges": table(func(p int) bool { return p%(T/P) == 0 || p%(T/P) == T/P/2+1 }),
		"singles":   table(func(int) bool { return true }),
	}
}

// TestSchedulesExactDocuments: every schedule × P ∈ {1,2,3,4,8} × {MHA, GQA, 33 heads} ×
// document layouts gives the output, lse and dQ, dK, dV of single-worker document-masked
// attention, with every value finite.
func TestSchedulesExactDocuments(t *testing.T) {
	const T = 48
	for _, name := range Names() {
		for _, P := range []int{1, 2, 3, 4, 8} {
			for hn, h := range testHeads {
				if Check(name, h, P) != nil {
					continue // refusals are TestSchedulesExact's
				}
				for dn, docs := range docTables(T, P, uint64(P)) {
					t.Run(fmt.Sprintf("%s/P%d/%s/%s", name, P, hn, dn), func(t *testing.T) {
						in := newInputs(T, h, uint64(P*100+h.N))
						in.docs = docs
						want := in.reference()
						got, err := in.run(name, P, Options{Overlap: P%2 == 0})
						if err != nil {
							t.Fatal(err)
						}
						checkExact(t, got, want)
						for _, x := range slices.Concat(got.o, got.dq, got.dk, got.dv) {
							if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
								t.Fatalf("non-finite value %v", x)
							}
						}
						// (ring, burst and distflash do not even fetch the blocks the
						// documents hide: TestDocumentMaskShipsNoMoreBytes)
						if dn == "singles" && P > 1 && (name == "zigzag" || name == "attn2d") {
							var skipped int64
							for _, w := range got.work {
								skipped += w.AttnDocSkipped
							}
							if skipped == 0 {
								t.Errorf("one-token documents: no block skipped by the document mask")
							}
						}
					})
				}
			}
		}
	}
}

// TestDocumentMaskDiffers: the document mask changes the result (so the exactness test above
// does not pass by ignoring it).
func TestDocumentMaskDiffers(t *testing.T) {
	in := newInputs(48, testHeads["MHA"], 1)
	plain := in.reference()
	in.docs = docTables(48, 4, 1)["rankedges"]
	masked := in.reference()
	if relErr(masked.o, plain.o) < 1e-2 {
		t.Fatal("document-masked output equals the unmasked one")
	}
}

// checkExact fails t when a run differs from single-worker attention by more than fp32 bounds:
// 2e-6 of each tensor's scale for o and lse, 1e-5 for the gradients (measured errors are
// ~1e-7 and ~1e-6).
func checkExact(t *testing.T, got, want scheduleRun) {
	t.Helper()
	if d := exactDiff(got, want); d != "" {
		t.Error(d)
	}
}

// exactDiff is checkExact's verdict: "" when got is the single-worker result within the
// tolerances, else what differs.
func exactDiff(got, want scheduleRun) string { return diffWithin(got, want, 2e-6, 1e-5) }

// diffWithin is exactDiff with the tolerances of the forward (o, lse) and the gradients given.
func diffWithin(got, want scheduleRun, fwd, grad float64) string {
	var diffs []string
	for _, c := range []struct {
		what      string
		got, want []float32
		tol       float64
	}{
		{"o", got.o, want.o, fwd}, {"lse", got.lse, want.lse, fwd},
		{"dq", got.dq, want.dq, grad}, {"dk", got.dk, want.dk, grad}, {"dv", got.dv, want.dv, grad},
	} {
		if e := relErr(c.got, c.want); e > c.tol {
			diffs = append(diffs, fmt.Sprintf("%s: rel err %.3g > %g", c.what, e, c.tol))
		}
	}
	return strings.Join(diffs, "; ")
}

// TestOverlapBitIdentical: prefetching changes when transfers happen, not the arithmetic or
// its order, so every schedule gives the same bits with overlap on and off.
func TestOverlapBitIdentical(t *testing.T) {
	for _, name := range Names() {
		for _, P := range []int{2, 3, 4} {
			h := testHeads["33H"]
			if Check(name, h, P) != nil {
				h = testHeads["GQA"]
				if Check(name, h, P) != nil {
					continue
				}
			}
			in := newInputs(24*P, h, 5)
			a, err := in.run(name, P, Options{Overlap: false})
			if err != nil {
				t.Fatal(err)
			}
			b, err := in.run(name, P, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				what string
				x, y []float32
			}{{"o", a.o, b.o}, {"lse", a.lse, b.lse}, {"dq", a.dq, b.dq}, {"dk", a.dk, b.dk}, {"dv", a.dv, b.dv}} {
				if !slices.Equal(c.x, c.y) {
					t.Errorf("%s P=%d: %s differs between overlap off and on", name, P, c.what)
				}
			}
		}
	}
}

// TestDocumentMaskShipsNoMoreBytes: every rank holds the whole sequence's document starts, so
// the document mask adds nothing to any transfer: every schedule moves at most the bytes at
// every call site with documents as without; ring (which stops once no rank sees the block it
// would receive) and distflash (which exchanges no block nobody sees) move fewer when short
// documents hide the older blocks.
func TestDocumentMaskShipsNoMoreBytes(t *testing.T) {
	const T, P = 48, 4
	h := testHeads["MHA"]
	for _, name := range Names() {
		in := newInputs(T, h, 3)
		plain, err := in.run(name, P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		in.docs = docTables(T, P, 3)["short"]
		masked, err := in.run(name, P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		for r := range plain.traffic {
			if plain.traffic[r].Total() == 0 {
				t.Errorf("%s rank %d: no traffic", name, r)
			}
			for site, b := range masked.traffic[r] {
				if b > plain.traffic[r][site] {
					t.Errorf("%s rank %d: %s moves %d bytes with documents, %d without", name, r, site, b, plain.traffic[r][site])
				}
			}
		}
		if name == "ring" || name == "burst" || name == "distflash" {
			var m, p int64
			for r := range plain.traffic {
				m, p = m+masked.traffic[r].Total(), p+plain.traffic[r].Total()
			}
			if !(m < p) {
				t.Errorf("%s: %d bytes with short documents, %d without: the hidden blocks were sent", name, m, p)
			}
		}
	}
}

// TestSchedulesExactWindows: every schedule × P ∈ {1,2,3,4,8} × {MHA, GQA, 33 heads} × sliding
// windows {1, 5, T/P, T/P + 1, larger than T} × {one document, short documents} gives the
// output, lse and dQ, dK, dV of single-worker windowed attention (model.Seq.Window).
func TestSchedulesExactWindows(t *testing.T) {
	const T = 48
	for _, name := range Names() {
		for _, P := range []int{1, 2, 3, 4, 8} {
			for hn, h := range testHeads {
				if Check(name, h, P) != nil {
					continue
				}
				for _, W := range []int{1, 5, T / P, T/P + 1, 2 * T} {
					for dn, docs := range map[string][]int32{"onedoc": nil, "short": docTables(T, P, uint64(P))["short"]} {
						t.Run(fmt.Sprintf("%s/P%d/%s/W%d/%s", name, P, hn, W, dn), func(t *testing.T) {
							in := newInputs(T, h, uint64(P*100+h.N+W))
							in.docs, in.window = docs, W
							want := in.reference()
							got, err := in.run(name, P, Options{Overlap: P%2 == 0})
							if err != nil {
								t.Fatal(err)
							}
							checkExact(t, got, want)
						})
					}
				}
			}
		}
	}
}

// TestWindowDiffers: a window shorter than the sequence changes the result, one longer does
// not.
func TestWindowDiffers(t *testing.T) {
	in := newInputs(48, model.Heads{N: 4, KV: 2, Dim: 8}, 5)
	plain := in.reference()
	in.window = 7
	if slices.Equal(in.reference().o, plain.o) {
		t.Error("a window of 7 left the output as it was")
	}
	in.window = 48
	if !slices.Equal(in.reference().o, plain.o) {
		t.Error("a window as long as the sequence changed the output")
	}
}

// TestWindowTraffic: under a sliding window the ring runs L = ⌈(W−1)/n⌉ steps (n tokens a rank)
// and each rank moves exactly 2·L·B forward, 2·L·B + 2·(L+1)·B backward (B one of k, v, dk, dv
// of a rank); with W ≤ n + 1 that is one hop, 1/(P−1) of the unwindowed forward bytes. Burst
// and distflash send fewer bytes under a window than without, zigzag, attn2d and ulysses no
// more (their layouts or all-to-all put visible pairs on every exchange).
func TestWindowTraffic(t *testing.T) {
	const T, P = 48, 4
	const n = T / P
	h := testHeads["GQA"]
	B := int64(n * h.KV * h.Dim * 4)
	plain := map[string]scheduleRun{}
	for _, name := range Names() {
		r, err := newInputs(T, h, 3).run(name, P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		plain[name] = r
	}
	for _, W := range []int{1, n, n + 1, n + 2, 2*n + 2, 2 * T} {
		L := int64(min(P-1, (W-1+n-1)/n))
		for _, name := range Names() {
			in := newInputs(T, h, 3)
			in.window = W
			got, err := in.run(name, P, Options{Overlap: true})
			if err != nil {
				t.Fatal(err)
			}
			var sum, was int64
			for r := range got.traffic {
				sum, was = sum+got.traffic[r].Total(), was+plain[name].traffic[r].Total()
				if name != "ring" {
					continue
				}
				want := transport.Traffic{"ring.fwd.kv": 2 * L * B, "ring.bwd.kv": 2 * L * B, "ring.bwd.dkv": 2 * (L + 1) * B}
				if L == 0 {
					want = transport.Traffic{}
				}
				for site, b := range want {
					if got.traffic[r][site] != b {
						t.Errorf("ring W=%d rank %d: %s %d bytes, want %d (L = %d)", W, r, site, got.traffic[r][site], b, L)
					}
				}
			}
			switch {
			case sum > was:
				t.Errorf("%s W=%d: %d bytes, %d without the window", name, W, sum, was)
			case (name == "ring" || name == "burst" || name == "distflash") && W <= n+1 && !(sum < was):
				t.Errorf("%s W=%d: %d bytes, as many as without the window (%d)", name, W, sum, was)
			}
			if W == n {
				t.Logf("%s W=%d: %d bytes over the ranks, %d without (%.2f)", name, W, sum, was, float64(sum)/float64(was))
			}
		}
	}
}
