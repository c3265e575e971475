package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSyntheticO checks the bound the synthetic O′ promises cuDNN's backward (oprime.go): for
// the 16-bit dO it writes, rowsum(dO ∘ O′) is D to within u·(w* + u)·|D| in exact arithmetic
// (u the 16-bit unit through float32: 2^-8 + 2^-24 for bf16, 2^-11 + 2^-24 for fp16; w* the
// largest column's share of ‖dO‖²), plus the absolute half-step of the 16-bit subnormals at
// the largest column; and summed in float32 in column order, as cuDNN's softmax_sum is, within
// that plus (hd − 1)·2^-24 of the sum of the products' magnitudes (every product has D's sign,
// and is exact in float32). The rows are random (hd 64 and 128, D from O·dO) and adversarial: dO
// concentrated in one column, one large column beside tiny ones, D tiny or at the top of its
// range, a zero row, D = 0 with dO ≠ 0, a negative D, large O beside a small dO. Rows given a D
// without an O keep |D| ≤ ‖O‖·‖dO‖ for an O a 16-bit format holds, as every real D does.
// It also checks |O′| ≤ ‖O‖·(1 + u·hd)·‖dO‖/‖dO₁₆‖ (Cauchy–Schwarz with the last column's
// correction): O′ is as far from overflow as the real O.
func TestSyntheticO(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	type row struct {
		name string
		o    []float32 // the real O, when the row has one (D is then O·dO in float32)
		do   []float32
		d    float32 // D when o is nil
	}
	normal := func(n int, scale float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * scale)
		}
		return x
	}
	var rows []row
	for i := range 400 {
		hd := []int{64, 128}[i%2]
		rows = append(rows, row{name: "random", o: normal(hd, []float64{0.05, 1, 3}[i%3]), do: normal(hd, []float64{1e-4, 1e-2, 1}[i%3])})
	}
	one := func(hd, c int, v float32) []float32 {
		x := make([]float32, hd)
		x[c] = v
		return x
	}
	spike := normal(128, 1e-6)
	spike[77] = 3
	rows = append(rows,
		row{name: "concentrated", do: one(128, 5, 0.37), d: 1.25},
		row{name: "concentrated, last column", do: one(64, 63, -2), d: -0.003},
		row{name: "one large column beside tiny ones", do: spike, d: 0.8},
		row{name: "tiny D", do: normal(128, 1), d: 1e-30},
		row{name: "D near float32's smallest normal", do: normal(64, 1), d: 2e-38},
		row{name: "large O, small dO", o: normal(128, 300), do: normal(128, 1e-3)},
		row{name: "O near fp16's limit, dO spread", o: normal(64, 3e3), do: normal(64, 1)},
		row{name: "negative D", do: normal(128, 0.5), d: -7.5},
		row{name: "zero row", do: make([]float32, 128), d: 0},
		row{name: "D = 0, dO ≠ 0", do: normal(128, 1), d: 0},
	)
	for _, p := range []Precision{BF16, FP16} {
		u, sub := 0x1p-8+0x1p-24, 0x1p-134 // the unit; half the smallest subnormal
		if p == FP16 {
			u, sub = 0x1p-11+0x1p-24, 0x1p-25
		}
		_, from16 := halfCodec(p)
		for _, r := range rows {
			d := r.d
			if r.o != nil {
				var s float64
				for c := range r.o {
					s += float64(r.o[c]) * float64(r.do[c])
				}
				d = float32(s)
			}
			if p == FP16 && math.Abs(float64(d)) < 1e-6 && d != 0 {
				continue // below what fp16's dO can carry: the bound's absolute term is all of D
			}
			hd := len(r.do)
			dop, op := make([]uint16, hd), make([]uint16, hd)
			SyntheticO(dop, op, r.do, d, p)
			var exact, n2, maxX, mag float64
			sum := float32(0)
			for c := range hd {
				x, o := float64(from16(dop[c])), float64(from16(op[c]))
				prod := x * o
				if float64(float32(prod)) != prod {
					t.Fatalf("%v %s: column %d: the product %g·%g is not exact in float32", p, r.name, c, x, o)
				}
				if prod*float64(d) < 0 {
					t.Errorf("%v %s: column %d: the product %g has not D's sign (D = %g)", p, r.name, c, prod, d)
				}
				exact += prod
				sum += float32(prod)
				mag += math.Abs(prod)
				n2 += x * x
				maxX = max(maxX, math.Abs(x))
			}
			ws := 0.0
			if n2 > 0 {
				ws = maxX * maxX / n2
			}
			bound := u*(ws+u)*math.Abs(float64(d)) + maxX*sub
			if err := math.Abs(exact - float64(d)); err > bound {
				t.Errorf("%v %s: rowsum(dO ∘ O′) = %g, D = %g: error %.3g above %.3g (u(w*+u)|D| with w* = %.3f)", p, r.name, exact, d, err,
					bound, ws)
			}
			if err := math.Abs(float64(sum) - float64(d)); err > bound+float64(hd-1)*0x1p-24*mag {
				t.Errorf("%v %s: the float32 rowsum %g, D = %g: error %.3g above %.3g", p, r.name, sum, d, err, bound+float64(hd-1)*0x1p-24*mag)
			}
			if r.o != nil && n2 > 0 {
				var no, ndo float64
				for c := range hd {
					no += float64(r.o[c]) * float64(r.o[c])
					ndo += float64(r.do[c]) * float64(r.do[c])
				}
				limit := math.Sqrt(no) * (1 + u*float64(hd)) * math.Sqrt(ndo/n2) * (1 + 2*u)
				for c := range hd {
					if o := math.Abs(float64(from16(op[c]))); o > limit {
						t.Errorf("%v %s: |O′[%d]| = %g above ‖O‖·(1+u·hd)·‖dO‖/‖dO₁₆‖ = %g", p, r.name, c, o, limit)
					}
				}
			}
		}
	}
}

// TestSyntheticOEdges checks what is written besides the bound: dO rounded to nearest, O′ = 0
// for a zero row or D = 0, a non-finite D carried into O′ (so that a NaN still reaches the
// gradients), and the largest column (the lowest on ties) taking the residual.
func TestSyntheticOEdges(t *testing.T) {
	do := []float32{0.1, -0.30000001, 0.30000001, 0.2}
	dop, op := make([]uint16, 4), make([]uint16, 4)
	SyntheticO(dop, op, do, 0.05, BF16)
	for c, v := range do {
		if dop[c] != BF16Bits(v) {
			t.Errorf("dO[%d] = %#x, want round-to-nearest %#x", c, dop[c], BF16Bits(v))
		}
	}
	// the residual goes to column 1 (|−0.3| ties 0.3 at column 2; the lower wins): every other
	// column is round16(α·x_c) exactly
	x := func(c int) float64 { return float64(BF16Value(dop[c])) }
	n2 := x(0)*x(0) + x(1)*x(1) + x(2)*x(2) + x(3)*x(3)
	alpha := 0.05 / n2
	for _, c := range []int{0, 2, 3} {
		if want := BF16Bits(float32(alpha * x(c))); op[c] != want {
			t.Errorf("O′[%d] = %#x, want round16(α·x) = %#x", c, op[c], want)
		}
	}
	for _, d := range []float32{0, float32(math.NaN()), float32(math.Inf(-1))} {
		SyntheticO(dop, op, do, d, FP16)
		for c := range op {
			v := FP16Value(op[c])
			switch {
			case d == 0 && v != 0:
				t.Errorf("D = 0: O′[%d] = %g", c, v)
			case math.IsNaN(float64(d)) && !math.IsNaN(float64(v)):
				t.Errorf("D = NaN: O′[%d] = %g, want NaN", c, v)
			case math.IsInf(float64(d), -1) && !math.IsInf(float64(v), -1):
				t.Errorf("D = −Inf: O′[%d] = %g, want −Inf", c, v)
			}
		}
	}
	SyntheticO(dop, op, make([]float32, 4), 1, BF16)
	for c := range op {
		if op[c] != 0 {
			t.Errorf("a zero row of dO: O′[%d] = %#x, want 0", c, op[c])
		}
	}
}

// TestAttnPackedOperands: on the CPU, attention with its operands packed in 16 bits
// (AttnShape.Operands) is, bit for bit, attention on the float32 values the packing rounded
// to: forward (output, statistics) and backward (dq, dk, dv), causal GQA, bf16 and fp16.
func TestAttnPackedOperands(t *testing.T) {
	be := NewCPU()
	rng := rand.New(rand.NewPCG(3, 4))
	const nq, nk, H, K, hd = 37, 53, 4, 2, 16
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	qpos, kpos := make([]int32, nq), make([]int32, nk)
	for i := range kpos {
		kpos[i] = int32(i)
	}
	for i := range qpos {
		qpos[i] = int32(nk - nq + i)
	}
	for _, p := range []Precision{BF16, FP16} {
		sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: hd, Causal: true, Scale: 0.25, QPos: qpos, KPos: kpos}
		in := [][]float32{vec(nq * H * hd), vec(nk * K * hd), vec(nk * K * hd), vec(nq * H * hd)} // q, k, v, dO
		run := func(packed bool) [][]float32 {
			var b [4]Buf
			for i, x := range in {
				r := be.Alloc(len(x))
				be.Upload(r, x)
				if packed {
					b[i] = be.Alloc((len(x) + 1) / 2)
					be.PackHalf(b[i], r, p)
				} else {
					be.Round(r, p)
					b[i] = r
				}
			}
			s := sh
			if packed {
				s.Operands = p
			}
			st := AttnState{O: be.Alloc(nq * H * hd), M: be.Alloc(H * nq), L: be.Alloc(H * nq)}
			be.AttnInit(st)
			be.AttnForward(st, b[0], b[1], b[2], s)
			o, lse, d := be.Alloc(nq*H*hd), be.Alloc(H*nq), be.Alloc(H*nq)
			be.AttnFinish(o, lse, st, nq, H, hd)
			do := be.Alloc(nq * H * hd)
			be.Upload(do, in[3])
			be.Round(do, p)
			be.AttnBackwardPrep(d, o, do, nq, H, hd, FP32)
			dq, dk, dv := be.Alloc(nq*H*hd), be.Alloc(nk*K*hd), be.Alloc(nk*K*hd)
			be.AttnBackward(dq, dk, dv, b[0], b[1], b[2], nil, b[3], lse, d, s)
			return [][]float32{Host(o), Host(lse), Host(dq), Host(dk), Host(dv)}
		}
		want, got := run(false), run(true)
		for i, name := range []string{"o", "lse", "dq", "dk", "dv"} {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("%v: %s with packed operands differs from the rounded float32 ones", p, name)
			}
		}
	}
}

// TestAttnBackwardPrepPacked: D of O and dO packed in 16 bits is, bit for bit, D of the
// float32 values they round to (not of the unrounded ones: that D would not match the dP a
// backward forms from the 16-bit dO, and biases dQ; TestMixedPrecisionTrains in train saw it).
func TestAttnBackwardPrepPacked(t *testing.T) {
	be := NewCPU()
	rng := rand.New(rand.NewPCG(5, 6))
	const nq, H, hd = 29, 3, 16
	for _, p := range []Precision{BF16, FP16} {
		o, do := be.Alloc(nq*H*hd), be.Alloc(nq*H*hd)
		x := make([]float32, nq*H*hd)
		for _, b := range []Buf{o, do} {
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			be.Upload(b, x)
		}
		po, pdo := be.Alloc((nq*H*hd+1)/2), be.Alloc((nq*H*hd+1)/2)
		be.PackHalf(po, o, p)
		be.PackHalf(pdo, do, p)
		got, want, unrounded := be.Alloc(H*nq), be.Alloc(H*nq), be.Alloc(H*nq)
		be.AttnBackwardPrep(got, po, pdo, nq, H, hd, p)
		be.AttnBackwardPrep(unrounded, o, do, nq, H, hd, FP32)
		be.Round(o, p)
		be.Round(do, p)
		be.AttnBackwardPrep(want, o, do, nq, H, hd, FP32)
		if !slices.Equal(Host(got), Host(want)) {
			t.Errorf("%v: D of packed O, dO differs from D of the rounded float32 values", p)
		}
		if slices.Equal(Host(got), Host(unrounded)) {
			t.Errorf("%v: D of packed O, dO equals D of the unrounded values: the test cannot tell them apart", p)
		}
	}
}
