package kernels

// The CPU backend's 16-bit step (cpu_half.go) against hand compositions written here: the 16-bit
// inputs unpacked value by value with BF16Value / FP16Value, the float32 method of the CPU
// backend run on them, and every 16-bit output packed value by value with BF16Bits / FP16Bits.
// The methods promise exactly those values, so every comparison is bit for bit, in both formats,
// on odd lengths where the method allows them (the pad half of an odd-length output must be 0).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// packed16 packs x value by value (rounded to h's format) two per element, as PackHalf lays
// them out: value i in the low (even i) or high (odd i) half of element i/2, a last odd value's
// high half 0.
func packed16(x []float32, h half) []float32 {
	w := make([]uint32, (len(x)+1)/2)
	for i, v := range x {
		w[i/2] |= uint32(h.bits(v)) << (16 * (i % 2))
	}
	out := make([]float32, len(w))
	copy(words(out), w)
	return out
}

// unpacked16 returns the n values of the packed p, value by value.
func unpacked16(p []float32, n int, h half) []float32 {
	w := words(p)
	out := make([]float32, n)
	for i := range out {
		out[i] = h.value(uint16(w[i/2] >> (16 * (i % 2))))
	}
	return out
}

// halfInput returns n random values of scale s and their packing in h's format.
func halfInput(r *rand.Rand, n int, s float64, h half) (packed, values []float32) {
	packed = packed16(randVec(r, n, s), h)
	return packed, unpacked16(packed, n, h)
}

// sameWords fails unless got and want hold the same bits.
func sameWords(t *testing.T, what string, got Buf, want []float32) {
	t.Helper()
	g := Host(got)
	if len(g) != len(want) {
		t.Fatalf("%s: %d elements, want %d", what, len(g), len(want))
	}
	gw, ww := words(g), words(want)
	for i := range gw {
		if gw[i] != ww[i] {
			t.Fatalf("%s: element %d is %#08x, want %#08x", what, i, gw[i], ww[i])
		}
	}
}

// hostBuf is a CPU buffer holding a copy of x.
func hostBuf(x []float32) Buf { return HostBuf(slices.Clone(x)) }

func TestCPUEmbeddingHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 1))
	for _, h := range halves {
		for _, c := range []struct{ vocab, dim, ntok int }{{11, 6, 9}, {1, 2, 1}, {50, 64, 300}, {7, 4, 0}} {
			table, tv := halfInput(r, c.vocab*c.dim, 1, h)
			ids := make([]int32, c.ntok)
			for i := range ids {
				ids[i] = int32(r.IntN(c.vocab))
			}
			want := be.Alloc(c.ntok * c.dim)
			be.Embedding(want, hostBuf(tv), ids, c.dim)
			out := be.Alloc(c.ntok * c.dim)
			be.EmbeddingHalf(out, hostBuf(table), ids, c.dim, h.p)
			sameWords(t, fmt.Sprintf("%v %+v", h.p, c), out, Host(want))
		}
		mustPanicCPU(t, "even width", func() { be.EmbeddingHalf(be.Alloc(3), be.Alloc(8), []int32{1}, 3, h.p) })
		mustPanicCPU(t, "token id 4 outside vocabulary of 4", func() { be.EmbeddingHalf(be.Alloc(4), be.Alloc(8), []int32{4}, 4, h.p) })
	}
	mustPanicCPU(t, "embedding needs bf16 or fp16", func() { be.EmbeddingHalf(be.Alloc(4), be.Alloc(8), []int32{0}, 4, FP32) })
}

func TestCPURMSNormHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 2))
	for _, h := range halves {
		for _, c := range []struct {
			rows, dim int
			keep      bool
		}{{3, 5, true}, {3, 5, false}, {4, 8, true}, {1, 1, true}, {7, 33, false}, {16, 64, true}, {0, 4, true}} {
			name := fmt.Sprintf("%v %+v", h.p, c)
			x := randVec(r, c.rows*c.dim, 2)
			w, wv := halfInput(r, c.dim, 1, h)
			out32, rstdWant := be.Alloc(c.rows*c.dim), be.Alloc(c.rows)
			be.RMSNorm(out32, rstdWant, hostBuf(x), hostBuf(wv), c.rows, c.dim, 1e-5)

			out, rstd := be.Alloc((c.rows*c.dim+1)/2), be.Alloc(c.rows)
			var keep Buf
			if c.keep {
				keep = be.Alloc((c.rows*c.dim + 1) / 2)
			}
			be.RMSNormHalf(out, keep, rstd, hostBuf(x), hostBuf(w), c.rows, c.dim, 1e-5, h.p)
			sameWords(t, name+" out", out, packed16(Host(out32), h))
			sameWords(t, name+" rstd", rstd, Host(rstdWant))
			if c.keep {
				sameWords(t, name+" keep", keep, packed16(x, h))
			}
		}
		mustPanicCPU(t, "rmsnorm out (packed) has 2 elements, want 3", func() {
			be.RMSNormHalf(be.Alloc(2), nil, be.Alloc(1), be.Alloc(5), be.Alloc(3), 1, 5, 1, h.p)
		})
	}
}

func TestCPURMSNormBackwardHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 3))
	for _, h := range halves {
		for _, c := range []struct {
			rows, dim int
			beta      float32
			dxHalf    bool
		}{{3, 5, 0, true}, {3, 5, 1, false}, {4, 8, 1, true}, {1, 1, 0, true}, {33, 64, 0, true}, {17, 7, 1, true}, {0, 6, 0, false}} {
			name := fmt.Sprintf("%v %+v", h.p, c)
			n := c.rows * c.dim
			dout, dov := halfInput(r, n, 1, h)
			x, xv := halfInput(r, n, 2, h)
			w, wv := halfInput(r, c.dim, 1, h)
			rstd := randVec(r, c.rows, 1)
			for i := range rstd {
				rstd[i] = float32(math.Abs(float64(rstd[i]))) + 0.1
			}
			dx0, dw0 := randVec(r, n, 1), randVec(r, c.dim, 1)
			if c.beta == 0 {
				dw0[0] = float32(math.NaN()) // beta 0 overwrites: the NaN must not be read
			}

			dxWant, dwWant := hostBuf(dx0), hostBuf(dw0)
			if c.beta == 0 {
				clear(Host(dwWant))
			}
			be.RMSNormBackward(dxWant, dwWant, hostBuf(dov), hostBuf(xv), hostBuf(wv), hostBuf(rstd), c.rows, c.dim)

			dx, dw := hostBuf(dx0), hostBuf(dw0)
			var dxh Buf
			if c.dxHalf {
				dxh = be.Alloc((n + 1) / 2)
			}
			be.RMSNormBackwardHalf(dx, dxh, dw, hostBuf(dout), hostBuf(x), hostBuf(w), hostBuf(rstd), c.rows, c.dim, c.beta, h.p)
			sameWords(t, name+" dx", dx, Host(dxWant))
			sameWords(t, name+" dw", dw, Host(dwWant))
			if c.dxHalf {
				sameWords(t, name+" dxHalf", dxh, packed16(Host(dxWant), h))
			}
		}
		mustPanicCPU(t, "dw beta 0.5: want 0 or 1", func() {
			be.RMSNormBackwardHalf(be.Alloc(2), nil, be.Alloc(2), be.Alloc(1), be.Alloc(1), be.Alloc(1), be.Alloc(1), 1, 2, 0.5, h.p)
		})
	}
}

// ropeCase is a shape of RoPEQKV's tests: GQA, odd head dimensions and odd token counts among
// them (hd%4 != 0 takes the CUDA kernel's one-value path).
type ropeCase struct{ n, heads, kvHeads, hd int }

var ropeCases = []ropeCase{{5, 4, 2, 8}, {3, 3, 1, 6}, {3, 3, 1, 5}, {1, 1, 1, 2}, {7, 8, 2, 64}, {4, 2, 2, 1}}

// ropeTable is a scaled table (frequencies not powers of one base, cos and sin × 1.1386) for hd.
func ropeTable(hd int) RoPETable {
	t := DefaultRoPE(10000, hd)
	for i := range t.InvFreq {
		t.InvFreq[i] /= 1 + float64(i%3)
	}
	t.Scale = 1.1386
	return t
}

func TestCPURoPEQKV(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 4))
	for _, h := range halves {
		for _, c := range ropeCases {
			name := fmt.Sprintf("%v %+v", h.p, c)
			Q, KV := c.heads*c.hd, c.kvHeads*c.hd
			pos := make([]int32, c.n)
			for i := range pos {
				pos[i] = int32(r.IntN(600000))
			}
			for ti, tab := range []RoPETable{DefaultRoPE(500000, c.hd), ropeTable(c.hd)} {
				name := fmt.Sprintf("%s table %d", name, ti)
				qkv, all := halfInput(r, c.n*(Q+2*KV), 1, h)
				qs, ks, vs := make([]float32, c.n*Q), make([]float32, c.n*KV), make([]float32, c.n*KV)
				for i := range c.n {
					row := all[i*(Q+2*KV):]
					copy(qs[i*Q:], row[:Q])
					copy(ks[i*KV:], row[Q:Q+KV])
					copy(vs[i*KV:], row[Q+KV:Q+2*KV])
				}
				be.RoPE(HostBuf(qs), pos, c.heads, c.hd, tab, false)
				be.RoPE(HostBuf(ks), pos, c.kvHeads, c.hd, tab, false)
				q, k, v := be.Alloc((c.n*Q+1)/2), be.Alloc((c.n*KV+1)/2), be.Alloc((c.n*KV+1)/2)
				be.RoPEQKV(q, k, v, hostBuf(qkv), pos, c.heads, c.kvHeads, c.hd, tab, h.p)
				sameWords(t, name+" q", q, packed16(qs, h))
				sameWords(t, name+" k", k, packed16(ks, h))
				sameWords(t, name+" v", v, packed16(vs, h))

				dq, dqv := halfInput(r, c.n*Q, 1, h)
				dk, dkv := halfInput(r, c.n*KV, 1, h)
				dv, dvv := halfInput(r, c.n*KV, 1, h)
				be.RoPE(HostBuf(dqv), pos, c.heads, c.hd, tab, true)
				be.RoPE(HostBuf(dkv), pos, c.kvHeads, c.hd, tab, true)
				want := make([]float32, 0, c.n*(Q+2*KV))
				for i := range c.n {
					want = append(append(append(want, dqv[i*Q:(i+1)*Q]...), dkv[i*KV:(i+1)*KV]...), dvv[i*KV:(i+1)*KV]...)
				}
				dqkv := be.Alloc((c.n*(Q+2*KV) + 1) / 2)
				be.RoPEQKVBackward(dqkv, hostBuf(dq), hostBuf(dk), hostBuf(dv), pos, c.heads, c.kvHeads, c.hd, tab, h.p)
				sameWords(t, name+" dqkv", dqkv, packed16(want, h))
			}
		}
	}
}

// splitGU returns the gate and up halves of rows [rows, 2·ffn].
func splitGU(x []float32, rows, ffn int) (g, u []float32) {
	for i := range rows {
		g = append(g, x[2*i*ffn:(2*i+1)*ffn]...)
		u = append(u, x[(2*i+1)*ffn:(2*i+2)*ffn]...)
	}
	return g, u
}

func TestCPUSwiGLUHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 5))
	for _, h := range halves {
		for _, c := range []struct {
			rows, ffn int
			act       bool
		}{{3, 5, true}, {3, 5, false}, {4, 8, true}, {1, 1, true}, {9, 64, false}, {0, 4, true}} {
			name := fmt.Sprintf("%v %+v", h.p, c)
			n := c.rows * c.ffn
			gu, guv := halfInput(r, 2*n, 4, h)
			gv, uv := splitGU(guv, c.rows, c.ffn)
			actWant := be.Alloc(n)
			be.SwiGLU(actWant, HostBuf(gv), HostBuf(uv))
			act := be.Alloc((n + 1) / 2)
			be.SwiGLUHalf(act, hostBuf(gu), c.rows, c.ffn, h.p)
			sameWords(t, name+" act", act, packed16(Host(actWant), h))

			dact, dav := halfInput(r, n, 1, h)
			dg, du := be.Alloc(n), be.Alloc(n)
			be.SwiGLUBackward(dg, du, HostBuf(dav), HostBuf(gv), HostBuf(uv))
			var want []float32
			for i := range c.rows {
				want = append(append(want, Host(dg)[i*c.ffn:(i+1)*c.ffn]...), Host(du)[i*c.ffn:(i+1)*c.ffn]...)
			}
			dgu := be.Alloc(n)
			var act2 Buf
			if c.act {
				act2 = be.Alloc((n + 1) / 2)
			}
			be.SwiGLUBackwardHalf(dgu, act2, hostBuf(dact), hostBuf(gu), c.rows, c.ffn, h.p)
			sameWords(t, name+" dgu", dgu, packed16(want, h))
			if c.act {
				sameWords(t, name+" backward's act", act2, packed16(Host(actWant), h))
			}
		}
	}
}

func TestCPUCrossEntropyHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 6))
	for _, h := range halves {
		for _, c := range []struct{ rows, vocab int }{{5, 7}, {4, 10}, {1, 1}, {3, 1000}} {
			name := fmt.Sprintf("%v %+v", h.p, c)
			targets := make([]int32, c.rows)
			for i := range targets {
				targets[i] = int32(r.IntN(c.vocab))
			}
			targets[c.rows/2] = -1 // an ignored row: loss 0, gradient 0
			logits := randVec(r, c.rows*c.vocab, 4)
			lossWant, dlWant := be.Alloc(c.rows), be.Alloc(c.rows*c.vocab)
			be.CrossEntropy(lossWant, dlWant, hostBuf(logits), targets, c.vocab, 0.37)
			losses, dl := be.Alloc(c.rows), be.Alloc((c.rows*c.vocab+1)/2)
			be.CrossEntropyHalf(losses, dl, hostBuf(logits), targets, c.vocab, 0.37, h.p)
			sameWords(t, name+" losses", losses, Host(lossWant))
			sameWords(t, name+" dlogits", dl, packed16(Host(dlWant), h))
		}
	}
}

func TestCPUGradStats(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 7))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		name string
		n    int
		set  map[int]float32
		bad  bool
	}{
		{"empty", 0, nil, false},
		{"one", 1, nil, false},
		{"finite", 100003, nil, false},
		{"NaN", 100003, map[int]float32{77777: nan}, true},
		{"+Inf", 1001, map[int]float32{0: inf}, true},
		{"-Inf", 1001, map[int]float32{1000: -inf}, true},
		{"NaN and Inf", 1001, map[int]float32{3: inf, 500: nan}, true},
		{"Σg² beyond float32", 64, map[int]float32{5: 3e38, 6: -3e38}, false},
	} {
		g := randVec(r, c.n, 1e-2)
		for i, v := range c.set {
			g[i] = v
		}
		dst := be.Alloc(3)
		be.GradStats(dst, HostBuf(g))
		d := Host(dst)
		ss := be.SumSquares(HostBuf(g))
		if bad := !be.AllFinite(HostBuf(g)); bad != c.bad {
			t.Fatalf("%s: the case is wrong: AllFinite says bad=%v", c.name, bad)
		}
		hi := float32(ss)
		want := [3]float32{hi, float32(ss - float64(hi)), 0}
		if c.bad {
			want[1], want[2] = 0, 1
		}
		if !sameBits(d[0], want[0]) && !(isNaN32(d[0]) && isNaN32(want[0])) || !sameBits(d[1], want[1]) || !sameBits(d[2], want[2]) {
			t.Errorf("%s: GradStats %v, want %v (Σg² %v)", c.name, d, want, ss)
		}
		if !c.bad && !math.IsInf(float64(hi), 0) {
			if got := float64(d[0]) + float64(d[1]); math.Abs(got-ss) > ss*0x1p-46 {
				t.Errorf("%s: hi + lo = %v, Σg² = %v", c.name, got, ss)
			}
		}
		if c.name == "NaN" && !isNaN32(d[0]) || c.name == "+Inf" && !math.IsInf(float64(d[0]), 1) {
			t.Errorf("%s: hi %v", c.name, d[0])
		}
	}
	mustPanicCPU(t, "grad stats has 2 elements, want 3", func() { be.GradStats(be.Alloc(2), be.Alloc(5)) })
}

func TestCPUAdamWSegmentsHalf(t *testing.T) {
	be := NewCPU()
	r := rand.New(rand.NewPCG(41, 8))
	for _, h := range halves {
		for _, c := range []struct {
			n    int
			segs []AdamWSegment
		}{
			{10001, []AdamWSegment{{0, 2048, false}, {2048, 5000, true}, {7051, 7, false}, {8000, 2001, true}}},
			{1, []AdamWSegment{{0, 1, true}}},
			{8, nil},
		} {
			name := fmt.Sprintf("%v n=%d", h.p, c.n)
			p0, m0, v0 := randVec(r, c.n, 1), randVec(r, c.n, 1e-2), randVec(r, c.n, 1e-4)
			for i := range v0 {
				v0[i] *= v0[i]
			}
			pw, mw, vw := hostBuf(p0), hostBuf(m0), hostBuf(v0)
			p, m, v := hostBuf(p0), hostBuf(m0), hostBuf(v0)
			half := hostBuf(packed16(randVec(r, c.n, 1), h)) // overwritten everywhere
			for step := int64(1); step <= 2; step++ {
				g := randVec(r, c.n, 1e-2)
				hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: 0.7}
				be.AdamWSegments(pw, hostBuf(g), mw, vw, c.segs, hp)
				be.AdamWSegmentsHalf(p, hostBuf(g), m, v, half, c.segs, hp, h.p)
			}
			sameWords(t, name+" p", p, Host(pw))
			sameWords(t, name+" m", m, Host(mw))
			sameWords(t, name+" v", v, Host(vw))
			sameWords(t, name+" 16-bit copy", half, packed16(Host(pw), h))
		}
		mustPanicCPU(t, "adamw copy needs bf16 or fp16", func() {
			be.AdamWSegmentsHalf(be.Alloc(2), be.Alloc(2), be.Alloc(2), be.Alloc(2), be.Alloc(1), nil, AdamWStep{}, FP32)
		})
	}
}
