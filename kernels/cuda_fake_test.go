//go:build cuda

package kernels

// The CUDA backend's Go side run against a fake device that records what it is asked to do:
// every Backend method's launches are checked against the kernels' parameter types in the
// embedded PTX (by CUDA.launch itself), their geometry against the hardware limits, and every
// copy against the allocations it touches. Needs no GPU.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"distflash/kernels/cuda"
)

type fakeLaunch struct {
	name             string
	gx, gy, bx, smem int
	args             []uint64
}

// fakeDevice hands out disjoint address ranges and records launches and GEMMs.
type fakeDevice struct {
	t        *testing.T
	next     cuda.Ptr
	allocs   []*cuda.Mem
	launches []fakeLaunch
	gemms    []cuda.Gemm
	computes []cuda.Compute
	gemmOps  []fakeGemm // each GEMM's matrices and scalars, beside gemms
	optin    int
	events   int         // events made
	recorded map[int]int // event ID → the launches and GEMMs queued before its last record
	memsets  []fakeMemset
	copies   []fakeCopy // device-to-device copies
	syncs    int
	onSync   func()   // called at each Sync (a test's mark in a log)
	maxAlloc int      // allocations above this many bytes fail (0: no limit)
	trace    []string // with tracing on (a non-nil slice): one line per launch, GEMM, copy to the host and sync, in order
}

// fakeGemm is where one GEMM reads and writes (cuBLAS's A, B and C) and its alpha and beta.
type fakeGemm struct {
	a, b, c     cuda.Ptr
	alpha, beta float32
}

// fakeCopy is one DtoD.
type fakeCopy struct {
	dst, src cuda.Ptr
	bytes    int
}

// fakeMemset is one Memset32: its range, and how many launches were queued before it.
type fakeMemset struct {
	dst   cuda.Ptr
	words int
	after int
}

func newFakeCUDA(t *testing.T) (*CUDA, *fakeDevice) {
	f := &fakeDevice{t: t, next: 1 << 20, optin: 232448}
	sigs := map[string][]string{}
	for _, mod := range moduleNames() {
		ptx, err := cuda.PTX(mod)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range ptxSignatures(string(ptx)) {
			sigs[k] = v
		}
	}
	c := newCUDAOn(f, deviceInfo{name: "fake", major: 9, sms: 132, smemOptin: f.optin}, sigs)
	c.dnn.mode = AttentionOwn // the fake has no cuDNN (TestCUDAHostCUDNNStub drives that path)
	return c, f
}

func (f *fakeDevice) Alloc(bytes int) (*cuda.Mem, error) {
	if f.maxAlloc > 0 && bytes > f.maxAlloc {
		return nil, fmt.Errorf("out of memory (fake device: %d bytes asked, %d at most)", bytes, f.maxAlloc)
	}
	m := &cuda.Mem{Bytes: bytes}
	if bytes > 0 {
		m.Ptr = f.next
		f.next += cuda.Ptr((bytes + 511) &^ 255)
	}
	f.allocs = append(f.allocs, m)
	return m, nil
}

// check reports a byte range outside every allocation.
func (f *fakeDevice) check(what string, p cuda.Ptr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	for _, a := range f.allocs {
		if a.Bytes > 0 && p >= a.Ptr && p+cuda.Ptr(bytes) <= a.Ptr+cuda.Ptr(a.Bytes) {
			return nil
		}
	}
	return fmt.Errorf("%s of %d bytes at %#x: outside every allocation", what, bytes, p)
}

func (f *fakeDevice) HtoD(dst cuda.Ptr, _ unsafe.Pointer, bytes int) error {
	return f.check("HtoD", dst, bytes)
}

func (f *fakeDevice) DtoH(dst unsafe.Pointer, src cuda.Ptr, bytes int) error {
	f.traced("dtoh")
	clear(unsafe.Slice((*byte)(dst), bytes))
	return f.check("DtoH", src, bytes)
}

func (f *fakeDevice) DtoD(dst, src cuda.Ptr, bytes int) error {
	f.copies = append(f.copies, fakeCopy{dst, src, bytes})
	if err := f.check("DtoD source", src, bytes); err != nil {
		return err
	}
	return f.check("DtoD destination", dst, bytes)
}

func (f *fakeDevice) Memset32(dst cuda.Ptr, _ uint32, n int) error {
	f.memsets = append(f.memsets, fakeMemset{dst: dst, words: n, after: len(f.launches)})
	return f.check("memset", dst, 4*n)
}

// NewEvent, RecordEvent and EventSeconds give a clock on which every launch and GEMM takes a
// microsecond: an event reads the work queued before it was recorded.
func (f *fakeDevice) NewEvent() (*cuda.Event, error) {
	f.events++
	return &cuda.Event{ID: f.events}, nil
}

func (f *fakeDevice) RecordEvent(e *cuda.Event) error {
	if f.recorded == nil {
		f.recorded = map[int]int{}
	}
	f.recorded[e.ID] = len(f.launches) + len(f.gemms)
	return nil
}

func (f *fakeDevice) EventSeconds(from, to *cuda.Event) (float64, error) {
	a, ok1 := f.recorded[from.ID]
	b, ok2 := f.recorded[to.ID]
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("event %d or %d not recorded", from.ID, to.ID)
	}
	return float64(b-a) * 1e-6, nil
}

func (f *fakeDevice) Sync() error {
	f.traced("sync")
	f.syncs++
	if f.onSync != nil {
		f.onSync()
	}
	return nil
}
func (f *fakeDevice) Close() error { return nil }

func (f *fakeDevice) Launch(name string, gx, gy, bx, smem int, args []uint64) error {
	switch {
	case gx < 1 || gx > math.MaxInt32 || gy < 1 || gy > 65535:
		return fmt.Errorf("%s: grid %d×%d", name, gx, gy)
	case bx < 32 || bx > 1024 || bx%32 != 0:
		return fmt.Errorf("%s: block of %d threads", name, bx)
	case smem < 0 || smem > f.optin:
		return fmt.Errorf("%s: %d bytes of shared memory", name, smem)
	}
	f.launches = append(f.launches, fakeLaunch{name, gx, gy, bx, smem, slices.Clone(args)})
	f.traced("launch " + name)
	return nil
}

// Gemm checks the GEMM as cuBLAS would take it: a combination of types cuda.Gemm allows, and
// each matrix (its last column ends at LD·(cols−1) + rows elements of its type) inside one
// allocation.
func (f *fakeDevice) Gemm(g cuda.Gemm, a, b, c cuda.Ptr, alpha, beta float32, compute cuda.Compute) error {
	if err := g.Check(compute); err != nil {
		return err
	}
	rowsA, colsA, rowsB, colsB := g.M, g.K, g.K, g.N
	if g.TransA {
		rowsA, colsA = colsA, rowsA
	}
	if g.TransB {
		rowsB, colsB = colsB, rowsB
	}
	extent := func(t cuda.DataType, ld, rows, cols int) int {
		return gemmElemBytes[t] * (ld*(cols-1) + rows)
	}
	for _, e := range []error{
		f.check("GEMM A", a, extent(g.AType, g.LDA, rowsA, colsA)), f.check("GEMM B", b, extent(g.BType, g.LDB, rowsB, colsB)),
		f.check("GEMM C", c, extent(g.CType, g.LDC, g.M, g.N)),
	} {
		if e != nil {
			return e
		}
	}
	if g.LDA < rowsA || g.LDB < rowsB || g.LDC < g.M {
		return fmt.Errorf("GEMM %+v: leading dimension below the rows", g)
	}
	f.gemms = append(f.gemms, g)
	f.traced(fmt.Sprintf("gemm %s %s %s", g.AType, g.BType, g.CType))
	f.computes = append(f.computes, compute)
	f.gemmOps = append(f.gemmOps, fakeGemm{a, b, c, alpha, beta})
	return nil
}

// traced appends line to the trace when tracing is on.
func (f *fakeDevice) traced(line string) {
	if f.trace != nil {
		f.trace = append(f.trace, line)
	}
}

// last returns the last launch of a kernel whose name starts with prefix.
func (f *fakeDevice) last(prefix string) fakeLaunch {
	for i := len(f.launches) - 1; i >= 0; i-- {
		if strings.HasPrefix(f.launches[i].name, prefix) {
			return f.launches[i]
		}
	}
	f.t.Fatalf("no launch of %s*", prefix)
	return fakeLaunch{}
}

// gemmElemBytes is the size of an element of each GEMM type.
var gemmElemBytes = map[cuda.DataType]int{cuda.Float32: 4, cuda.BFloat16: 2, cuda.Half: 2}

// names returns the kernels launched since launch i.
func (f *fakeDevice) names(i int) []string {
	var n []string
	for _, l := range f.launches[i:] {
		n = append(n, l.name)
	}
	return n
}

func TestCUDAHostPTXSignatures(t *testing.T) {
	c, _ := newFakeCUDA(t)
	want := map[string]string{
		"df_add":                 "u64 u64 u64 u64",
		"df_xent":                "u64 u64 u64 u64 u32 u64 f32",
		"df_adamw":               "u64 u64 u64 u64 u64 f32 f32 f32 f32 f32 f32 f32 f32",
		"df_rope":                "u64 u64 u64 u32 u32 u32 u32 f64",
		"df_attn_fwd_bf16_hd128": "u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u32 u32 u32 u32 f32 u32",
		"df_attn_bwd_dkdv_f32":   "u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u64 u32 u32 u32 u32 u32 f32 u32",
	}
	for k, w := range want {
		if got := strings.Join(c.sigs[k], " "); got != w {
			t.Errorf("%s: signature %q, want %q", k, got, w)
		}
	}
	for _, names := range ptxKernels {
		for _, k := range names {
			if len(c.sigs[k]) == 0 {
				t.Errorf("%s: no signature", k)
			}
		}
	}
	mustPanic(t, "kernel df_add takes 4 parameters, launched with 1", func() { c.launch("df_add", 1, 1, 32, 0, int32(1)) })
	mustPanic(t, "kernel df_scale: parameter 2 is .u64, launched with u32", func() {
		c.launch("df_scale", 1, 1, 32, 0, devPtr(0), float32(1), int32(5))
	})
}

// TestCUDAHostEveryMethod drives every Backend method on the fake device: each launch must
// match its kernel's signature and the limits, each copy its buffers.
func TestCUDAHostEveryMethod(t *testing.T) {
	c, f := newFakeCUDA(t)
	r := rand.New(rand.NewPCG(1, 1))
	buf := func(n int) Buf {
		b := c.Alloc(n)
		c.Upload(b, randVec(r, n, 1))
		return b
	}
	x, y := buf(1000), buf(1000)
	c.Add(x, x, y)
	c.Scale(c.Slice(x, 10, 20), 2)
	c.Copy(c.Slice(y, 500, 100), c.Slice(x, 0, 100))
	c.Zero(c.Slice(x, 999, 1))
	if s := c.SumSquares(x); s != 0 { // the fake's partial sums are zeros
		t.Errorf("SumSquares on the fake = %v", s)
	}
	if !c.AllFinite(x) {
		t.Errorf("AllFinite on the fake = false")
	}
	c.Download(make([]float32, 20), c.Slice(y, 980, 20))
	for _, p := range []cudaPrec{precFP32, precBF16, precFP16} {
		c.setPrecision(p)
		c.MatMul(buf(6*5), buf(7*6), buf(5*7), 6, 5, 7, true, true, 1)
		if g, want := f.gemms[len(f.gemms)-1], cublasPlan(6, 5, 7, true, true); g != want || f.computes[len(f.computes)-1] != cuda.Compute(p) {
			t.Errorf("%v: GEMM %+v compute %v, want %+v %v", p, g, f.computes[len(f.computes)-1], want, p)
		}
	}
	c.setPrecision(precFP32)
	ids := []int32{3, 1, 3, 0, 9}
	c.Embedding(buf(5*8), buf(10*8), ids, 8)
	c.EmbeddingBackward(buf(10*8), buf(5*8), ids, 8)
	c.RMSNorm(buf(6*8), buf(6), buf(6*8), buf(8), 6, 8, 1e-5)
	c.RMSNormBackward(buf(6*8), buf(8), buf(6*8), buf(6*8), buf(8), buf(6), 6, 8)
	c.RoPE(buf(5*3*8), []int32{0, 1, 2, 9, 4}, 3, 8, DefaultRoPE(1e4, 8), true)
	c.SwiGLU(buf(99), buf(99), buf(99))
	c.SwiGLUBackward(buf(99), buf(99), buf(99), buf(99), buf(99))
	c.CrossEntropy(buf(4), buf(4*11), buf(4*11), []int32{1, -1, 10, 0}, 11, 0.25)
	c.CrossEntropy(buf(4), nil, buf(4*11), []int32{1, -1, 10, 0}, 11, 0.25)
	c.AdamW(buf(77), buf(77), buf(77), buf(77), AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Step: 2, GradScale: 1}, true)
	c.round16(buf(9), true)
	c.pack16(buf(5), buf(9), false)
	c.unpack16(buf(9), buf(5), true)

	for _, tc := range []struct {
		p      cudaPrec
		hd     int
		causal bool
		fwd    []string
		bwd    []string
	}{
		{precFP32, 6, true, []string{"df_attn_fwd_f32"}, []string{"df_attn_bwd_dq_f32", "df_attn_bwd_dkdv_f32"}},
		{precBF16, 64, true, []string{"df_to_half", "df_to_half", "df_to_half", "df_attn_fwd_bf16_hd64"},
			[]string{"df_to_half", "df_to_half", "df_to_half", "df_to_half", "df_attn_bwd_dq_bf16_hd64", "df_attn_bwd_dkdv_bf16_hd64", "df_attn_dkdv_reduce"}},
		{precFP16, 128, false, []string{"df_to_half", "df_to_half", "df_to_half", "df_attn_fwd_f16_hd128"},
			[]string{"df_to_half", "df_to_half", "df_to_half", "df_to_half", "df_attn_bwd_dq_f16_hd128", "df_attn_bwd_dkdv_f16_hd128", "df_attn_dkdv_reduce"}},
		{precBF16, 16, true, []string{"df_attn_fwd_f32"}, []string{"df_attn_bwd_dq_f32", "df_attn_bwd_dkdv_f32"}},
	} {
		c.setPrecision(tc.p)
		const nq, nk, H, K = 130, 70, 6, 2
		hd := tc.hd
		pos := layouts(nq+nk, r)["shuffled"]
		sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: hd, Causal: tc.causal, Scale: 0.3}
		if tc.causal {
			sh.QPos, sh.KPos = pos[:nq], pos[nq:]
		}
		st := AttnState{O: c.Alloc(nq * H * hd), M: c.Alloc(H * nq), L: c.Alloc(H * nq)}
		q, k, v := buf(nq*H*hd), buf(nk*K*hd), buf(nk*K*hd)
		c.AttnInit(st)
		n0 := len(f.launches)
		c.AttnForward(st, q, k, v, sh)
		if got := f.names(n0); !slices.Equal(got, tc.fwd) {
			t.Errorf("%v hd %d: forward launched %v, want %v", tc.p, hd, got, tc.fwd)
		}
		plan := planAttn(hd, tc.p)
		l := f.launches[len(f.launches)-1]
		if l.gx != ceilDiv(nq, attnT64) || l.gy != H || l.bx != plan.threads || l.smem != plan.smemFwd {
			t.Errorf("%v hd %d: forward launch %d×%d blocks of %d, %d bytes", tc.p, hd, l.gx, l.gy, l.bx, l.smem)
		}
		st2 := AttnState{O: c.Alloc(nq * H * hd), M: c.Alloc(H * nq), L: c.Alloc(H * nq)}
		c.AttnMerge(st, st2, nq, H, hd)
		o, lse, d, do := c.Alloc(nq*H*hd), c.Alloc(H*nq), c.Alloc(H*nq), buf(nq*H*hd)
		c.AttnFinish(o, lse, st, nq, H, hd)
		c.AttnBackwardPrep(d, o, do, nq, H, hd, FP32)
		n0 = len(f.launches)
		c.AttnBackward(c.Alloc(nq*H*hd), c.Alloc(nk*K*hd), c.Alloc(nk*K*hd), q, k, v, nil, do, lse, d, sh)
		if got := f.names(n0); !slices.Equal(got, tc.bwd) {
			t.Errorf("%v hd %d: backward launched %v, want %v", tc.p, hd, got, tc.bwd)
		}
		dkdv := f.last("df_attn_bwd_dkdv_")
		wantX, wantY := ceilDiv(nk, attnT64), K
		if plan.mma { // 1-D, split (TestCUDAHostDKDVLaunch checks the split's launches)
			wantX, wantY = planDKDV(nq, nk, H, K, hd, c.info.sms, c.info.smemOptin, 0).blocks, 1
		}
		if dkdv.gx != wantX || dkdv.gy != wantY || dkdv.smem != plan.smemDKDV {
			t.Errorf("%v hd %d: dK/dV launch %d×%d, %d bytes", tc.p, hd, dkdv.gx, dkdv.gy, dkdv.smem)
		}
	}
	c.setPrecision(precFP32)

	// With a document mask every attention kernel gets the document starts and their tile
	// bounds (non-null), at the offsets packAttnInts gives; without one, null.
	for _, tc := range []struct {
		p    cudaPrec
		hd   int
		args [3][3]int // per kernel (forward, dQ, dK/dV): index of the qpos, qstart and first document bound arguments
	}{
		{precFP32, 6, [3][3]int{{6, 10, 11}, {7, 11, 12}, {8, 12, 13}}},
		{precBF16, 64, [3][3]int{{6, 12, 13}, {7, 13, 14}, {8, 14, 15}}},
	} {
		c.setPrecision(tc.p)
		const nq, nk, H, K = 130, 70, 6, 2
		pos := layouts(nq+nk, r)["contiguous"]
		sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: tc.hd, Causal: true, Scale: 0.3,
			QPos: pos[nk:], KPos: pos[:nk], QStart: make([]int32, nq)}
		for i := range sh.QStart {
			sh.QStart[i] = int32(nk + i/20*20 - 30) // documents of 20 tokens, the first reaching into the keys
		}
		st := AttnState{O: c.Alloc(nq * H * tc.hd), M: c.Alloc(H * nq), L: c.Alloc(H * nq)}
		q, k, v, do := buf(nq*H*tc.hd), buf(nk*K*tc.hd), buf(nk*K*tc.hd), buf(nq*H*tc.hd)
		c.AttnInit(st)
		for _, masked := range []bool{true, false} {
			s := sh
			if !masked {
				s.QStart = nil
			}
			n0 := len(f.launches)
			c.AttnForward(st, q, k, v, s)
			c.AttnBackward(c.Alloc(nq*H*tc.hd), c.Alloc(nk*K*tc.hd), c.Alloc(nk*K*tc.hd), q, k, v, nil, do, buf(H*nq), buf(H*nq), s)
			var attn []fakeLaunch
			for _, l := range f.launches[n0:] {
				if strings.HasPrefix(l.name, "df_attn_") && l.name != "df_attn_dkdv_reduce" {
					attn = append(attn, l)
				}
			}
			if len(attn) != 3 {
				t.Fatalf("%v masked=%v: %d attention launches, want 3", tc.p, masked, len(attn))
			}
			ai := packAttnInts(s)
			for i, l := range attn {
				qp, qs, bound := l.args[tc.args[i][0]], l.args[tc.args[i][1]], l.args[tc.args[i][2]]
				if masked != (qs != 0) || masked != (bound != 0) {
					t.Errorf("%v masked=%v: %s gets qstart %#x, bound %#x", tc.p, masked, l.name, qs, bound)
				}
				wantBound := ai.qs64min // forward and dQ tile queries by 64, dK/dV by 32
				if i == 2 {
					wantBound = ai.qs32min
				}
				if masked && (qs != qp+uint64(4*(ai.qstart-ai.qpos)) || bound != qp+uint64(4*(wantBound-ai.qpos))) {
					t.Errorf("%v: %s gets qstart at qpos%+d bytes, bound at %+d, want %+d and %+d", tc.p, l.name,
						int64(qs-qp), int64(bound-qp), 4*(ai.qstart-ai.qpos), 4*(wantBound-ai.qpos))
				}
			}
		}
	}
	c.setPrecision(precFP32)

	// A block the mask hides launches nothing and is counted as skipped.
	c.Counters().Reset()
	n0 := len(f.launches)
	st := AttnState{O: c.Alloc(4 * 2 * 8), M: c.Alloc(2 * 4), L: c.Alloc(2 * 4)}
	c.AttnForward(st, c.Alloc(4*2*8), c.Alloc(3*2*8), c.Alloc(3*2*8), AttnShape{NQ: 4, NK: 3, Heads: 2, KVHeads: 2,
		HeadDim: 8, Causal: true, Scale: 1, QPos: []int32{0, 1, 2, 3}, KPos: []int32{4, 5, 6}})
	if len(f.launches) != n0 || c.Counters().AttnSkipped.Load() != 1 {
		t.Errorf("hidden block: %d launches, %d skipped", len(f.launches)-n0, c.Counters().AttnSkipped.Load())
	}
	mustPanic(t, "token id 10 outside vocabulary of 10", func() { c.Embedding(c.Alloc(8), c.Alloc(80), []int32{10}, 8) })
	mustPanic(t, "rmsnorm w has 7 elements, want 8", func() { c.RMSNorm(c.Alloc(8), c.Alloc(1), c.Alloc(8), c.Alloc(7), 1, 8, 1) })
	// A block the document mask alone hides launches nothing either.
	c.AttnForward(st, c.Alloc(4*2*8), c.Alloc(3*2*8), c.Alloc(3*2*8), AttnShape{NQ: 4, NK: 3, Heads: 2, KVHeads: 2,
		HeadDim: 8, Causal: true, Scale: 1, QPos: []int32{4, 5, 6, 7}, KPos: []int32{0, 1, 2}, QStart: []int32{3, 3, 6, 6}})
	if len(f.launches) != n0 || c.Counters().AttnSkipped.Load() != 2 {
		t.Errorf("block hidden by documents: %d launches, %d skipped", len(f.launches)-n0, c.Counters().AttnSkipped.Load())
	}
	mustPanic(t, "head_dim 1024 needs", func() {
		c.AttnForward(st, c.Alloc(1024), c.Alloc(1024), c.Alloc(1024), AttnShape{NQ: 1, NK: 1, Heads: 1, KVHeads: 1, HeadDim: 1024, Scale: 1})
	})
}

// TestCUDAHostPackedOperands: attention operands packed in 16 bits (AttnShape.Operands, as a
// 16-bit run's schedules keep them) reach the own tensor-core kernels as they are, with no
// conversion launched; for a head dimension the 16-bit kernels have not, they are widened
// (df_unpack_half) for the float32 kernel; the lengths are the packed ones.
func TestCUDAHostPackedOperands(t *testing.T) {
	c, f := newFakeCUDA(t)
	c.setPrecision(precBF16)
	const nq, nk, H, K = 130, 70, 6, 2
	pos := seqPos(0, nq+nk)
	for _, tc := range []struct {
		hd       int
		fwd, bwd []string
	}{
		{64, []string{"df_attn_fwd_bf16_hd64"}, []string{"df_attn_bwd_dq_bf16_hd64", "df_attn_bwd_dkdv_bf16_hd64", "df_attn_dkdv_reduce"}},
		{16, []string{"df_unpack_half", "df_unpack_half", "df_unpack_half", "df_attn_fwd_f32"},
			[]string{"df_unpack_half", "df_unpack_half", "df_unpack_half", "df_unpack_half", "df_attn_bwd_dq_f32", "df_attn_bwd_dkdv_f32"}},
	} {
		hd := tc.hd
		sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: hd, Causal: true, Scale: 0.3, QPos: pos[nk:], KPos: pos[:nk],
			Operands: BF16}
		q, k, v, do := c.Alloc(sh.OperandLen(nq*H*hd)), c.Alloc(sh.OperandLen(nk*K*hd)), c.Alloc(sh.OperandLen(nk*K*hd)), c.Alloc(sh.OperandLen(nq*H*hd))
		st := AttnState{O: c.Alloc(nq * H * hd), M: c.Alloc(H * nq), L: c.Alloc(H * nq)}
		n0 := len(f.launches)
		c.AttnForward(st, q, k, v, sh)
		if got := f.names(n0); !slices.Equal(got, tc.fwd) {
			t.Errorf("hd %d: forward launched %v, want %v", hd, got, tc.fwd)
		}
		if hd == 64 {
			if a := f.launches[len(f.launches)-1].args; a[0] != uint64(dbuf(q).ptr()) || a[1] != uint64(dbuf(k).ptr()) || a[2] != uint64(dbuf(v).ptr()) {
				t.Errorf("hd 64: the forward reads %#x, %#x, %#x, not the packed q, k, v", a[0], a[1], a[2])
			}
		}
		n0 = len(f.launches)
		c.AttnBackward(c.Alloc(nq*H*hd), c.Alloc(nk*K*hd), c.Alloc(nk*K*hd), q, k, v, nil, do, c.Alloc(H*nq), c.Alloc(H*nq), sh)
		if got := f.names(n0); !slices.Equal(got, tc.bwd) {
			t.Errorf("hd %d: backward launched %v, want %v", hd, got, tc.bwd)
		}
		if hd == 64 {
			if a := f.last("df_attn_bwd_dkdv_").args; a[3] != uint64(dbuf(do).ptr()) {
				t.Errorf("hd 64: the dK/dV kernel reads dO at %#x, not the packed %#x", a[3], dbuf(do).ptr())
			}
		}
		n0 = len(f.launches)
		c.AttnBackwardPrep(c.Alloc(H*nq), c.Alloc(sh.OperandLen(nq*H*hd)), do, nq, H, hd, BF16)
		if got := f.names(n0); !slices.Equal(got, []string{"df_attn_prep16"}) || f.launches[n0].args[len(f.launches[n0].args)-1] != 0 {
			t.Errorf("hd %d: D of packed O and dO launched %v (args %v), want df_attn_prep16 for bf16", hd, got, f.launches[n0].args)
		}
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "elements, want") {
					t.Errorf("hd %d: a float32-sized q with packed operands: %v", hd, r)
				}
			}()
			c.AttnForward(st, c.Alloc(nq*H*hd), k, v, sh)
		}()
	}
}
