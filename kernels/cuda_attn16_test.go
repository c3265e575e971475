//go:build cuda

package kernels

// AttnForwardHalf and AttnBackwardHalf on the CUDA backend: their own-kernel path on the
// recording fake device (the cuDNN path is checked against the stub library in
// cuda_cudnn_stub_test.go, stubHalf), and their values against the CPU backend's on a GPU.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestCUDAHostAttnHalfOwn: without cuDNN (the fake device has none: device.attention = own)
// the 16-bit attention runs the own kernels in the backend's float32 scratch and packs the
// results into the caller's buffers: forward AttnInit (3 memsets), the 16-bit kernel reading
// the packed q, k, v where they are, AttnFinish writing lse, PackHalf writing o; backward D
// from the packed O and dO, the float32 gradients zeroed, the two kernels, PackHalf into dq,
// dk, dv. The kernels are those of the operands' format whatever the MatMul precision, nothing
// waits for the device, and the counters count the blocks.
func TestCUDAHostAttnHalfOwn(t *testing.T) {
	c, f := newFakeCUDA(t) // MatMul precision fp32: the products follow the operands
	r := rand.New(rand.NewPCG(41, 3))
	const nq, nk, H, K = 130, 130, 8, 2
	pos := seqPos(0, nq)
	for _, tc := range []struct {
		p        Precision
		hd       int
		fwd, bwd []string
	}{
		{BF16, 128, []string{"df_attn_fwd_bf16_hd128", "df_attn_finish", "df_pack_half"},
			[]string{"df_attn_prep16", "df_attn_bwd_dq_bf16_hd128", "df_attn_bwd_dkdv_bf16_hd128", "df_attn_dkdv_reduce", "df_pack_half", "df_pack_half", "df_pack_half"}},
		{FP16, 64, []string{"df_attn_fwd_f16_hd64", "df_attn_finish", "df_pack_half"},
			[]string{"df_attn_prep16", "df_attn_bwd_dq_f16_hd64", "df_attn_bwd_dkdv_f16_hd64", "df_attn_dkdv_reduce", "df_pack_half", "df_pack_half", "df_pack_half"}},
		// a head dimension the 16-bit kernels have not: the operands widened for the float32 kernel
		{BF16, 16, []string{"df_unpack_half", "df_unpack_half", "df_unpack_half", "df_attn_fwd_f32", "df_attn_finish", "df_pack_half"},
			[]string{"df_attn_prep16", "df_unpack_half", "df_unpack_half", "df_unpack_half", "df_unpack_half", "df_attn_bwd_dq_f32",
				"df_attn_bwd_dkdv_f32", "df_pack_half", "df_pack_half", "df_pack_half"}},
	} {
		hd := tc.hd
		name := fmt.Sprintf("%v hd %d", tc.p, hd)
		sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: hd, Causal: true, Scale: 0.1, QPos: pos, KPos: pos, Operands: tc.p}
		qn, kn := sh.OperandLen(nq*H*hd), sh.OperandLen(nk*K*hd)
		buf := func(n int) Buf {
			b := c.Alloc(n)
			c.Upload(b, randVec(r, n, 1))
			return b
		}
		q, k, v, o, do := buf(qn), buf(kn), buf(kn), c.Alloc(qn), buf(qn)
		lse, dq, dk, dv := c.Alloc(H*nq), c.Alloc(qn), c.Alloc(kn), c.Alloc(kn)
		ptr := func(b Buf) uint64 { return uint64(dbuf(b).ptr()) }
		c.Counters().Reset()
		l0, m0, s0 := len(f.launches), len(f.memsets), f.syncs
		c.AttnForwardHalf(o, lse, q, k, v, sh)
		if got := f.names(l0); !slices.Equal(got, tc.fwd) {
			t.Errorf("%s: forward launched %v, want %v", name, got, tc.fwd)
			continue
		}
		if len(f.memsets) != m0+3 || f.syncs != s0 {
			t.Errorf("%s: forward made %d memsets and %d syncs, want AttnInit's 3 and none", name, len(f.memsets)-m0, f.syncs-s0)
		}
		ls := f.launches[l0:]
		fwd, fin, pack := ls[len(ls)-3], ls[len(ls)-2], ls[len(ls)-1]
		if hd != 16 && (fwd.args[0] != ptr(q) || fwd.args[1] != ptr(k) || fwd.args[2] != ptr(v)) {
			t.Errorf("%s: the forward kernel reads %#x %#x %#x, not the packed q, k, v", name, fwd.args[0], fwd.args[1], fwd.args[2])
		}
		if fin.args[1] != ptr(lse) || fin.args[0] != fwd.args[3] || pack.args[0] != ptr(o) || pack.args[1] != fin.args[0] ||
			int64(pack.args[2]) != int64(nq*H*hd) || pack.args[3] != map[Precision]uint64{BF16: 0, FP16: 1}[tc.p] {
			t.Errorf("%s: finish %v and pack %v: want lse written, the finished state packed into o in %v", name, fin.args[:2], pack.args, tc.p)
		}
		if n := c.Counters().AttnBlocks.Load(); n != 1 {
			t.Errorf("%s: %d attention blocks counted, want 1", name, n)
		}

		l0, m0 = len(f.launches), len(f.memsets)
		c.AttnBackwardHalf(dq, dk, dv, q, k, v, o, do, lse, sh)
		if got := f.names(l0); !slices.Equal(got, tc.bwd) {
			t.Errorf("%s: backward launched %v, want %v", name, got, tc.bwd)
			continue
		}
		ls = f.launches[l0:]
		prep, dkdv := ls[0], ls[len(ls)-4]
		for _, l := range ls {
			if strings.HasPrefix(l.name, "df_attn_bwd_dkdv") {
				dkdv = l
			}
		}
		if prep.args[1] != ptr(o) || prep.args[2] != ptr(do) || dkdv.args[4] != ptr(lse) || dkdv.args[5] != prep.args[0] {
			t.Errorf("%s: D from %#x, %#x (want the packed o %#x, do %#x) read by the backward as %#x (lse %#x)", name,
				prep.args[1], prep.args[2], ptr(o), ptr(do), dkdv.args[5], dkdv.args[4])
		}
		zeroed := map[uint64]bool{}
		for _, m := range f.memsets[m0:] {
			if m.after <= l0+1 { // after the prep, before the backward kernels
				zeroed[uint64(m.dst)] = true
			}
		}
		for i, g := range []Buf{dq, dk, dv} {
			pk := ls[len(ls)-3+i]
			if pk.args[0] != ptr(g) || !zeroed[pk.args[1]] {
				t.Errorf("%s: gradient %d packed from %#x (zeroed first: %v) into %#x, want into %#x", name, i, pk.args[1], zeroed[pk.args[1]], pk.args[0], ptr(g))
			}
		}
		if len(f.memsets) != m0+3 || f.syncs != s0 || c.Counters().AttnBackwards.Load() != 1 {
			t.Errorf("%s: backward made %d memsets, %d syncs, counted %d backwards; want 3, none, 1", name, len(f.memsets)-m0, f.syncs-s0,
				c.Counters().AttnBackwards.Load())
		}
	}

	// a block the mask hides: o packed from zeros, lse −Inf (AttnFinish); the gradients cleared
	sh := AttnShape{NQ: 4, NK: 3, Heads: 2, KVHeads: 2, HeadDim: 64, Causal: true, Scale: 1, QPos: []int32{0, 1, 2, 3},
		KPos: []int32{4, 5, 6}, Operands: BF16}
	o, lse := c.Alloc(4*2*64/2), c.Alloc(2*4)
	l0, m0 := len(f.launches), len(f.memsets)
	c.AttnForwardHalf(o, lse, c.Alloc(4*2*64/2), c.Alloc(3*2*64/2), c.Alloc(3*2*64/2), sh)
	if got := f.names(l0); !slices.Equal(got, []string{"df_attn_finish", "df_pack_half"}) || len(f.memsets) != m0+3 {
		t.Errorf("hidden block: launched %v after %d memsets, want AttnInit's 3, df_attn_finish and df_pack_half", got, len(f.memsets)-m0)
	}
	dq, dk, dv := c.Alloc(4*2*64/2), c.Alloc(3*2*64/2), c.Alloc(3*2*64/2)
	l0, m0 = len(f.launches), len(f.memsets)
	c.AttnBackwardHalf(dq, dk, dv, c.Alloc(4*2*64/2), c.Alloc(3*2*64/2), c.Alloc(3*2*64/2), o, c.Alloc(4*2*64/2), lse, sh)
	if len(f.launches) != l0 || len(f.memsets) != m0+3 || f.memsets[m0].dst != dbuf(dq).ptr() || f.memsets[m0+1].dst != dbuf(dk).ptr() ||
		f.memsets[m0+2].dst != dbuf(dv).ptr() {
		t.Errorf("hidden block backward: %d launches, memsets %+v; want dq, dk, dv cleared", len(f.launches)-l0, f.memsets[m0:])
	}
	mustPanic(t, "attn o (packed) has 512 elements, want 256", func() {
		c.AttnForwardHalf(c.Alloc(4*2*64), lse, c.Alloc(256), c.Alloc(192), c.Alloc(192), sh)
	})
	mustPanic(t, "attention needs bf16 or fp16, got fp32", func() {
		s := sh
		s.Operands = FP32
		c.AttnForwardHalf(o, lse, c.Alloc(512), c.Alloc(384), c.Alloc(384), s)
	})
}

// TestCUDAAttnHalf compares AttnForwardHalf and AttnBackwardHalf on the GPU with the CPU
// backend's (the reference: float32 attention of the 16-bit values, each output rounded once),
// on cuDNN where it is present and on the own kernels (device.attention = own), for GQA
// causal blocks (the model's layout), a ragged one (documents), one with keys no query sees,
// both formats. Tolerances, relative to the largest reference value of the tensor: o 1.5e-2
// (bf16) / 4e-3 (fp16), lse 1e-4 absolute, gradients 3e-2 (bf16) / 6e-3 (fp16). Both paths
// round P (and dS) to 16 bits where the CPU keeps float32, 2^-9 / 2^-12 relative per term
// (the tensor-core attention's tolerances in cuda_test.go), and the outputs then once more to
// 16 bits, half a unit (2^-9 / 2^-12) of each value, which may land on either side of the
// CPU's rounding: one unit at most. A masking, layout or scaling bug errs by O(1).
func TestCUDAAttnHalf(t *testing.T) {
	d := newDuo(t)
	mode0 := d.gpu.AttentionPaths().Mode
	defer func() {
		if err := d.gpu.SetAttention(mode0); err != nil {
			t.Error(err)
		}
	}()
	r := rand.New(rand.NewPCG(41, 4))
	type block struct {
		name    string
		nq, nk  int
		qp, kp  []int32
		qs      []int32
		H, KVH  int
		hd      int
		formats []Precision
	}
	diag := seqPos(0, 384)
	blocks := []block{
		{"causal gqa", 384, 384, diag, diag, nil, 8, 2, 128, []Precision{BF16, FP16}},
		{"causal mha hd64", 256, 256, seqPos(0, 256), seqPos(0, 256), nil, 4, 4, 64, []Precision{BF16}},
		{"documents", 384, 384, diag, diag, stubStarts(diag, []int32{0, 100, 250}, 0), 8, 2, 128, []Precision{BF16}},
		{"unseen keys", 128, 256, seqPos(0, 128), seqPos(0, 256), nil, 8, 2, 128, []Precision{BF16}},
	}
	for _, mode := range []string{AttentionAuto, AttentionOwn} {
		if err := d.gpu.SetAttention(mode); err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			for _, p := range b.formats {
				name := fmt.Sprintf("%s/%s/%v", mode, b.name, p)
				sh := AttnShape{NQ: b.nq, NK: b.nk, Heads: b.H, KVHeads: b.KVH, HeadDim: b.hd, Causal: true,
					Scale: float32(1 / math.Sqrt(float64(b.hd))), QPos: b.qp, KPos: b.kp, QStart: b.qs, Operands: p}
				before := d.gpu.AttentionPaths()
				checkAttnHalf(t, d, r, name, sh)
				after := d.gpu.AttentionPaths()
				fwd, bwd := pathDelta(before.Forward, after.Forward), pathDelta(before.Backward, after.Backward)
				t.Logf("%s: forward on %q, backward on %q (%s)", name, fwd, bwd, after.Library)
				switch {
				case mode == AttentionOwn && (fwd != "own: device.attention = own" || bwd != fwd):
					t.Errorf("%s: paths %q, %q: want the own kernels", name, fwd, bwd)
				case mode == AttentionAuto && strings.HasPrefix(after.Library, "cuDNN") && strings.HasPrefix(b.name, "causal") &&
					(fwd != "cudnn causal" || bwd != fwd):
					t.Errorf("%s: paths %q, %q with %s: want cuDNN's", name, fwd, bwd, after.Library)
				}
			}
		}
	}
}

// checkAttnHalf runs one block forward and backward on both backends and compares them
// (TestCUDAAttnHalf).
func checkAttnHalf(t *testing.T, d duo, r *rand.Rand, name string, sh AttnShape) {
	t.Helper()
	p := sh.Operands
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	nq, nk := sh.NQ*H*hd, sh.NK*KVH*hd
	packed := func(n int) [2]Buf { // n random values packed in p on both backends
		var out [2]Buf
		x := randVec(r, n, 1)
		d.each(func(be Backend, i int) {
			w := be.Alloc(n)
			be.Upload(w, x)
			out[i] = be.Alloc((n + 1) / 2)
			be.PackHalf(out[i], w, p)
		})
		return out
	}
	q, k, v, do := packed(nq), packed(nk), packed(nk), packed(nq)
	// the outputs start as NaN (0xffff in both 16-bit formats) on the GPU: a row left unwritten shows
	garbage := func(n int) [2]Buf {
		b := d.zeros(n)
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(0xffffffff)
		}
		d.gpu.Upload(b[1], x)
		return b
	}
	o, lse := garbage((nq+1)/2), garbage(H*sh.NQ)
	dq, dk, dv := garbage((nq+1)/2), garbage((nk+1)/2), garbage((nk+1)/2)
	tolO, tolG := 1.5e-2, 3e-2
	if p == FP16 {
		tolO, tolG = 4e-3, 6e-3
	}
	d.each(func(be Backend, i int) { be.AttnForwardHalf(o[i], lse[i], q[i], k[i], v[i], sh) })
	closeHalf(t, d, name+" o", o, nq, p, tolO)
	cl, gl := d.get(lse)
	for i := range cl {
		if e := math.Abs(float64(gl[i]) - float64(cl[i])); !(e <= 1e-4) {
			t.Errorf("%s lse[%d] = %g, cpu %g", name, i, gl[i], cl[i])
			break
		}
	}
	// the backward of each backend from the CPU's o and lse: the gradients then differ by the
	// backward's arithmetic alone
	d.gpu.Upload(o[1], download(d.cpu, o[0]))
	d.gpu.Upload(lse[1], cl)
	d.each(func(be Backend, i int) {
		be.AttnBackwardHalf(dq[i], dk[i], dv[i], q[i], k[i], v[i], o[i], do[i], lse[i], sh)
	})
	for _, g := range []struct {
		what string
		b    [2]Buf
		n    int
	}{{"dq", dq, nq}, {"dk", dk, nk}, {"dv", dv, nk}} {
		closeHalf(t, d, name+" "+g.what, g.b, g.n, p, tolG)
	}
}

// download is be's buffer b on the host.
func download(be Backend, b Buf) []float32 {
	x := make([]float32, b.Len())
	be.Download(x, b)
	return x
}

// closeHalf compares the n values packed in p of two backends' buffers: max |Δ| ≤ tol·max|cpu|.
func closeHalf(t *testing.T, d duo, what string, b [2]Buf, n int, p Precision, tol float64) {
	t.Helper()
	var vals [2][]float32
	d.each(func(be Backend, i int) {
		w := be.Alloc(n)
		be.UnpackHalf(w, b[i], p)
		vals[i] = download(be, w)
	})
	ref := make([]float64, n)
	for i, v := range vals[0] {
		ref[i] = float64(v)
	}
	if e := maxRelErr(vals[1], ref); !(e <= tol) {
		t.Errorf("%s: max |cuda − cpu| / max |cpu| = %.3g, want ≤ %g", what, e, tol)
	}
}

// TestCUDAHostCUDNNKeysUnseen checks cudnnKeysUnseen, which decides whether the 16-bit
// backward clears dK and dV before cuDNN, against every (query, key) pair of the reference
// mask, on the blocks a rank makes and random ones that cuDNN takes without ragged offsets.
func TestCUDAHostCUDNNKeysUnseen(t *testing.T) {
	shape := func(qp, kp, qs []int32) AttnShape {
		return AttnShape{NQ: len(qp), NK: len(kp), Heads: 2, KVHeads: 1, HeadDim: 64, Causal: true, QPos: qp, KPos: kp, QStart: qs}
	}
	diag := seqPos(0, 100)
	cases := []struct {
		name string
		sh   AttnShape
		want bool
	}{
		{"diagonal", shape(diag, diag, nil), false},
		{"past", shape(seqPos(100, 50), diag, nil), false},
		{"bottom-right", shape(seqPos(60, 40), diag, nil), false},
		{"top-left, fewer queries", shape(seqPos(0, 40), diag, nil), true},
		{"shifted, the last query sees all", shape(seqPos(10, 100), diag, nil), false},
		{"band", shape(diag, diag, stubStarts(diag, nil, 7)), false},
		{"band bottom-right: the first keys out of every window", shape(seqPos(60, 40), diag, stubStarts(seqPos(60, 40), nil, 30)), true},
	}
	r := rand.New(rand.NewPCG(41, 5))
	for i := range 300 {
		nq, nk := 1+r.IntN(60), 1+r.IntN(60)
		q0, k0 := r.IntN(80), r.IntN(80)
		qp, kp := seqPos(q0, nq), seqPos(k0, nk)
		var qs []int32
		if r.IntN(2) == 0 {
			qs = stubStarts(qp, nil, 1+r.IntN(40))
		}
		cases = append(cases, struct {
			name string
			sh   AttnShape
			want bool
		}{fmt.Sprintf("random %d", i), shape(qp, kp, qs), false})
	}
	checked := 0
	for i, c := range cases {
		blk, why := classifyCUDNN(c.sh)
		if why != "" || blk.ragged {
			if i < 7 {
				t.Errorf("%s: not a plain cuDNN block (%q, ragged %v)", c.name, why, blk.ragged)
			}
			continue
		}
		want := false
		for j := range c.sh.NK {
			seen := false
			for q := range c.sh.NQ {
				seen = seen || visibleRef(c.sh, q, j)
			}
			want = want || !seen
		}
		if i < 7 && want != c.want {
			t.Fatalf("%s: the reference says %v, the case %v", c.name, want, c.want)
		}
		if got := cudnnKeysUnseen(c.sh, blk); got != want {
			t.Errorf("%s (%s): cudnnKeysUnseen = %v, want %v", c.name, blk.kind, got, want)
		}
		checked++
	}
	if checked < 100 {
		t.Errorf("only %d plain blocks checked", checked)
	}
}
