//go:build cuda

package kernels

// TestCUDACUDNNFirst is the first run of cuDNN's fused attention on a GPU: the cuDNN review's
// D0–D6 in order (D7, one training step of two schedules, is the GPU check's, through the
// binary), each a subtest that prints its figures as one line "CUDNNFIRST {json}" for the
// GPU check's report (bench/gpu_check.py, phase cudnn-first):
//
//	D0  the cuDNN and NVRTC loaded, their versions and files
//	D1  forward of one block (B 1, 16 heads of 128, 2048 tokens, bf16), full and causal: the
//	    plan (engine, heuristics, workspace), O and the log-sum-exp against the own kernel
//	D2  backward of the same blocks, with the real O and with the synthetic O′ of D: dQ, dK,
//	    dV against the own kernel, and cuDNN's softmax_sum (read from its workspace) against D
//	D3  the two backward forms against each other: time (20 of each) and gradients
//	D4  the workspace of the 8192-token backward of 32 heads, deterministic and not
//	D5  the mask matrix at 1024 tokens: bottom-right, shifted, bands, packed documents, GQA
//	    32/8, fp16, 960 and 1000 keys; each forward and backward against the own kernel, or
//	    the reason cuDNN does not take it
//	D6  forward+backward TFLOP/s, cuDNN and the own kernel, causal, head_dim 64 and 128, 4K–16K
//	    tokens, with the operands packed in bf16 as a bf16 run's attention hands them over, and
//	    the share of the time outside cuDNN's own kernels (the glue)
//
// With DISTFLASH_CUDNN_FIRST=stub it runs on the recording fake device with the stub cuDNN
// and NVRTC (cuda_cudnn_stub_test.go) instead of a GPU: the GPU check's dry run. Every step
// then checks the routing, the plans and what they ask, and reports "dry" where a number
// needs a GPU.

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"unsafe"

	"distflash/kernels/cuda"
)

// cudnnFirstEnv selects the stub (the dry run) instead of a GPU.
const cudnnFirstEnv = "DISTFLASH_CUDNN_FIRST"

// firstRig is the backend the steps run on.
type firstRig struct {
	t    *testing.T
	c    *CUDA
	stub bool
}

// report prints one step's figures for the GPU check.
func (r firstRig) report(step string, v any) {
	b, err := json.Marshal(map[string]any{"step": step, "dry": r.stub, "result": v})
	if err != nil {
		r.t.Fatal(err)
	}
	fmt.Printf("CUDNNFIRST %s\n", b)
}

func newFirstRig(t *testing.T) firstRig {
	if os.Getenv(cudnnFirstEnv) != "stub" {
		c := gpu(t)
		if err := c.SetAttention(AttentionCUDNN); err != nil {
			t.Fatalf("D0: %v", err)
		}
		c.SetMatMulPrecision(BF16)
		t.Cleanup(func() {
			c.SetMatMulPrecision(FP32)
			if err := c.SetAttention(AttentionAuto); err != nil {
				t.Error(err)
			}
		})
		return firstRig{t: t, c: c}
	}
	lib := buildCUDNNStub(t)
	nv := stubNVRTC(t, lib)
	for k, v := range map[string]string{"DISTFLASH_LIBCUDNN": lib, "DISTFLASH_LIBCUDA": lib, "DISTFLASH_LIBNVRTC": nv.lib13,
		"CUDNNSTUB_VERSION": "92600"} {
		t.Setenv(k, v)
	}
	c, _ := newFakeCUDA(t)
	c.initCUDNN()
	c.dnn.open = func() (*cuda.DNN, error) { return cuda.OpenDNNOn(stubCtx, stubStream) }
	if err := c.SetAttention(AttentionCUDNN); err != nil {
		t.Fatalf("D0 (stub): %v", err)
	}
	c.SetMatMulPrecision(BF16)
	return firstRig{t: t, c: c, stub: true}
}

// firstData is a block's inputs on the host: q, k, v, dO random, and the forward's o and lse
// (the own kernel's) for the backwards.
type firstData struct {
	sh          AttnShape
	q, k, v, do []float32
	o, lse      []float32
}

func firstInputs(sh AttnShape, seed uint64) *firstData {
	rng := rand.New(rand.NewPCG(seed, 99))
	gen := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	qn, kn := sh.NQ*sh.Heads*sh.HeadDim, sh.NK*sh.KVHeads*sh.HeadDim
	return &firstData{sh: sh, q: gen(qn), k: gen(kn), v: gen(kn), do: gen(qn)}
}

// pathDelta is the path a block took: the key of m whose count grew over before.
func pathDelta(before, after map[string]int64) string {
	for k, n := range after {
		if n > before[k] {
			return k
		}
	}
	return ""
}

// forward runs the block's forward on the backend's current path and returns o and lse.
func (r firstRig) forward(in *firstData) (o, lse []float32, path string) {
	c, sh := r.c, in.sh
	H, hd := sh.Heads, sh.HeadDim
	up := func(x []float32) Buf { b := c.Alloc(len(x)); c.Upload(b, x); return b }
	q, k, v := up(in.q), up(in.k), up(in.v)
	st := AttnState{O: c.Alloc(sh.NQ * H * hd), M: c.Alloc(H * sh.NQ), L: c.Alloc(H * sh.NQ)}
	ob, lb := c.Alloc(sh.NQ*H*hd), c.Alloc(H*sh.NQ)
	before := c.AttentionPaths().Forward
	c.AttnInit(st)
	c.AttnForward(st, q, k, v, sh)
	c.AttnFinish(ob, lb, st, sh.NQ, H, hd)
	path = pathDelta(before, c.AttentionPaths().Forward)
	o, lse = make([]float32, ob.Len()), make([]float32, lb.Len())
	c.Download(o, ob)
	c.Download(lse, lb)
	return o, lse, path
}

// backward runs the block's backward on the current path from in's o and lse, with O (withO)
// or with D only, and returns dq, dk, dv and D.
func (r firstRig) backward(in *firstData, withO bool) (dq, dk, dv, d []float32, path string) {
	c, sh := r.c, in.sh
	H, hd := sh.Heads, sh.HeadDim
	up := func(x []float32) Buf { b := c.Alloc(len(x)); c.Upload(b, x); return b }
	q, k, v, do, o, lse := up(in.q), up(in.k), up(in.v), up(in.do), up(in.o), up(in.lse)
	db := c.Alloc(H * sh.NQ)
	c.AttnBackwardPrep(db, o, do, sh.NQ, H, hd, FP32)
	g := [3]Buf{c.Alloc(q.Len()), c.Alloc(k.Len()), c.Alloc(v.Len())}
	var ob Buf
	if withO {
		ob = o
	}
	before := c.AttentionPaths().Backward
	c.AttnBackward(g[0], g[1], g[2], q, k, v, ob, do, lse, db, sh)
	path = pathDelta(before, c.AttentionPaths().Backward)
	out := make([][]float32, 4)
	for i, b := range []Buf{g[0], g[1], g[2], db} {
		out[i] = make([]float32, b.Len())
		c.Download(out[i], b)
	}
	return out[0], out[1], out[2], out[3], path
}

// firstErr is the worst element of got against want, in units of tol·(|want_i| + rms(want)):
// above 1 fails.
func firstErr(got, want []float32, tol float64) (worst float64, at int) {
	var ss float64
	for _, w := range want {
		ss += float64(w) * float64(w)
	}
	rms := math.Sqrt(ss / float64(max(len(want), 1)))
	for i := range want {
		e := math.Abs(float64(got[i])-float64(want[i])) / (tol * (math.Abs(float64(want[i])) + rms))
		if e > worst || math.IsNaN(e) {
			worst, at = e, i
		}
	}
	return worst, at
}

// The tolerances of cuDNN against the own kernel, both in bf16 (fp16's are 8× tighter units but
// the same counts). Forward: both round q, k, v and P to 16 bits (2^-8 relative in bf16) and sum
// in float32 in different orders; cuDNN writes O rounded once more: 4 units of 2^-8 around each
// element's size. A mask off by one key moves the early rows (a few keys each) by a sizeable
// part of a value, far beyond. The log-sum-exp comes from float32 sums of the same 16-bit
// products: 1e-4 relative. Backward: P and dS are rounded to 16 bits in both, the gradients are
// sums over up to 2048 keys in different float32 orders, and cuDNN writes them in 16 bits: 8
// units; a wrong D, scale or block of keys is far beyond.
const (
	firstTolO   = 4 * 0x1p-8
	firstTolLSE = 1e-4
	firstTolGrd = 8 * 0x1p-8
)

// compare runs the block on cuDNN and on the own kernel, forward and both backwards, and checks
// and returns what the GPU check reports.
func (r firstRig) compare(name string, in *firstData) map[string]any {
	t, c := r.t, r.c
	res := map[string]any{"block": name, "nq": in.sh.NQ, "nk": in.sh.NK, "heads": in.sh.Heads, "kv_heads": in.sh.KVHeads,
		"head_dim": in.sh.HeadDim}
	must(c.SetAttention(AttentionOwn))
	oRef, lseRef, _ := r.forward(in)
	in.o, in.lse = oRef, lseRef
	dqRef, dkRef, dvRef, dRef, _ := r.backward(in, false)
	must(c.SetAttention(AttentionCUDNN))
	o, lse, path := r.forward(in)
	res["forward"] = path
	if r.stub || !strings.HasPrefix(path, "cudnn") {
		res["backward_o"] = r.pathOnly(in, true)
		res["backward_d"] = r.pathOnly(in, false)
		return res
	}
	eo, _ := firstErr(o, oRef, firstTolO)
	var el float64
	for i := range lse {
		if math.IsInf(float64(lseRef[i]), -1) && math.IsInf(float64(lse[i]), -1) {
			continue
		}
		el = max(el, math.Abs(float64(lse[i]-lseRef[i]))/(firstTolLSE*math.Abs(float64(lseRef[i]))+1e-6))
	}
	res["o_err"], res["lse_err"] = eo, el
	if eo > 1 || el > 1 {
		t.Errorf("%s forward: O at %.2f and lse at %.2f of their tolerances", name, eo, el)
	}
	for _, withO := range []bool{true, false} {
		dq, dk, dv, _, bpath := r.backward(in, withO)
		key := map[bool]string{true: "backward_o", false: "backward_d"}[withO]
		b := map[string]any{"path": bpath}
		if strings.HasPrefix(bpath, "cudnn") {
			eq, _ := firstErr(dq, dqRef, firstTolGrd)
			ek, _ := firstErr(dk, dkRef, firstTolGrd)
			ev, _ := firstErr(dv, dvRef, firstTolGrd)
			b["dq_err"], b["dk_err"], b["dv_err"] = eq, ek, ev
			if eq > 1 || ek > 1 || ev > 1 {
				t.Errorf("%s %s: dq, dk, dv at %.2f, %.2f, %.2f of their tolerances", name, key, eq, ek, ev)
			}
			b["softmax_sum"] = r.softmaxSum(in, dRef, withO)
		}
		res[key] = b
	}
	return res
}

// pathOnly runs a backward and returns its path (the stub, or a block cuDNN does not take).
func (r firstRig) pathOnly(in *firstData, withO bool) string {
	if in.o == nil {
		in.o, in.lse = make([]float32, len(in.q)), make([]float32, in.sh.Heads*in.sh.NQ)
	}
	_, _, _, _, p := r.backward(in, withO)
	return p
}

// softmaxSum reads cuDNN's softmax_sum of the last backward from its workspace and compares it
// with D: with the real O, with Σ round16(dO)·round16(O) in float64 (cuDNN sums those float32
// products in float32: hd·2^-24 of the sum of magnitudes); with O′, with D itself (SyntheticO's
// bound plus that summation).
func (r firstRig) softmaxSum(in *firstData, d []float32, withO bool) map[string]any {
	c, sh := r.c, in.sh
	last := c.dnn.last[1]
	var off int64 = -1
	for _, x := range last.plan.lay.Extra {
		if x.UID == cuda.UIDSoftmaxSum {
			off = x.Off
		}
	}
	if off < 0 || last.plan.lay == nil {
		r.t.Errorf("no softmax_sum in the workspace")
		return nil
	}
	H, hd, nq := sh.Heads, sh.HeadDim, sh.NQ
	ss := make([]float32, H*nq)
	c.Sync()
	must(c.dev.DtoH(unsafe.Pointer(&ss[0]), last.ws+devPtr(off), 4*len(ss)))
	r16 := func(x float32) float64 { return float64(RoundBF16(x)) }
	worst := 0.0
	for h := range H {
		for i := range nq {
			var want, mag float64
			for j := range hd {
				at := (i*H+h)*hd + j
				p := r16(in.do[at]) * r16(in.o[at])
				want += p
				mag += math.Abs(p)
			}
			tol := float64(hd)*0x1p-24*mag + 1e-30
			if !withO {
				want = float64(d[h*nq+i])
				tol = ((0x1p-8+0x1p-24)*(1+0x1p-8)+float64(hd)*0x1p-24)*math.Abs(want) + 1e-30
			}
			worst = max(worst, math.Abs(float64(ss[h*nq+i])-want)/tol)
		}
	}
	if worst > 1 {
		r.t.Errorf("softmax_sum (with O %v) at %.2f of its tolerance", withO, worst)
	}
	return map[string]any{"err": worst}
}

// causalBlock is a block of n queries and n keys at one diagonal.
func causalBlock(n, heads, kvHeads, hd int) AttnShape {
	pos := seqPos(0, n)
	return AttnShape{NQ: n, NK: n, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Causal: true, Scale: float32(1 / math.Sqrt(float64(hd))),
		QPos: pos, KPos: pos}
}

// planOf is the cached plan of block sh in the direction given (after a block of its shape ran).
func (r firstRig) planOf(sh AttnShape, backward bool) map[string]any {
	c := r.c
	blk, why := classifyCUDNN(sh)
	if why != "" {
		return map[string]any{"own": why}
	}
	c.dnn.mu.Lock()
	defer c.dnn.mu.Unlock()
	if err := c.dnn.load(); err != nil {
		return map[string]any{"error": err.Error()}
	}
	spec := c.sdpaSpec(sh, blk, backward, c.precision())
	p := c.dnn.plan(spec)
	if p == nil || p.err != nil || p.plan == nil {
		return map[string]any{"error": fmt.Sprint(p)}
	}
	return map[string]any{"engine": p.plan.Engine, "heuristic": p.plan.Heuristic, "cudnn_workspace": p.plan.Workspace,
		"workspace": p.ws, "tried": p.plan.Tried}
}

func TestCUDACUDNNFirst(t *testing.T) {
	r := newFirstRig(t)
	t.Run("D0", func(t *testing.T) {
		v, f, err := cuda.LoadCUDNN()
		if err != nil {
			t.Fatal(err)
		}
		n := cuda.LoadedNVRTC()
		if n.File == "" || n.Builtins == "" {
			t.Errorf("NVRTC %+v: not loaded", n)
		}
		r.report("D0", map[string]any{"cudnn": cuda.CUDNNVersionString(v), "file": f, "cuda_major": cuda.CUDACompiledFor(), "nvrtc": n,
			"device": r.c.Device()})
	})
	base := causalBlock(2048, 16, 16, 128)
	full := base
	full.Causal, full.QPos, full.KPos = false, nil, nil
	blocks := map[string]*firstData{"full": firstInputs(full, 1), "causal": firstInputs(base, 2)}
	t.Run("D1-D2", func(t *testing.T) {
		for _, name := range []string{"full", "causal"} {
			res := r.compare(name, blocks[name])
			res["plan_forward"] = r.planOf(blocks[name].sh, false)
			res["plan_backward"] = r.planOf(blocks[name].sh, true)
			r.report("D1-D2 "+name, res)
			if p := res["forward"]; p != "cudnn "+name {
				t.Errorf("%s forward took %q", name, p)
			}
		}
	})
	t.Run("D3", func(t *testing.T) {
		in := blocks["causal"]
		if in.o == nil { // D1–D2 stopped before the own forward
			must(r.c.SetAttention(AttentionOwn))
			in.o, in.lse, _ = r.forward(in)
			must(r.c.SetAttention(AttentionCUDNN))
		}
		res := map[string]any{}
		var grads [2][3][]float32
		for i, withO := range []bool{true, false} {
			var dq, dk, dv []float32
			dq, dk, dv, _, _ = r.backward(in, withO) // the plan, and the gradients
			grads[i] = [3][]float32{dq, dk, dv}
			if !r.stub {
				res[map[bool]string{true: "ms_with_o", false: "ms_with_d"}[withO]] = 1e3 * r.timeBackward(in, withO, 20) / 20
			}
		}
		if !r.stub {
			var worst float64
			for j := range 3 {
				e, _ := firstErr(grads[1][j], grads[0][j], firstTolGrd)
				worst = max(worst, e)
			}
			res["o_vs_d_err"] = worst
			if worst > 1 {
				t.Errorf("the backward with O′ against the one with O: %.2f of the tolerance", worst)
			}
		}
		r.report("D3", res)
	})
	t.Run("D4", func(t *testing.T) {
		sh := causalBlock(8192, 32, 32, 128)
		res := map[string]any{"nq": 8192, "heads": 32}
		for _, det := range []bool{false, true} {
			r.c.SetDeterministicAttention(det)
			res[map[bool]string{false: "nondeterministic", true: "deterministic"}[det]] = r.planOf(sh, true)
		}
		r.c.SetDeterministicAttention(false)
		r.report("D4", res)
		det, _ := res["deterministic"].(map[string]any)
		non, _ := res["nondeterministic"].(map[string]any)
		dws, _ := det["workspace"].(int64)
		nws, _ := non["workspace"].(int64)
		// the reason the default is the non-deterministic backward (the review predicts 4 GiB
		// against a few MiB of cuDNN's own, besides the 128 MiB float32 dQ accumulator)
		if nws <= 0 || dws <= nws {
			t.Errorf("the 8192×8192 backward of 32 heads asks %d bytes deterministic, %d not", dws, nws)
		}
		if r.stub && dws < 4<<30 {
			t.Errorf("the stub's deterministic workspace %d: want the dP workspace, 4 GiB", dws)
		}
	})
	t.Run("D5", func(t *testing.T) {
		for _, b := range firstMaskMatrix() {
			if b.fp16 {
				r.c.SetMatMulPrecision(FP16)
			}
			res := r.compare(b.name, firstInputs(b.sh, 3))
			r.c.SetMatMulPrecision(BF16)
			res["fp16"] = b.fp16
			r.report("D5 "+b.name, res)
		}
	})
	t.Run("D6", func(t *testing.T) {
		hds, ns := []int{64, 128}, []int{4096, 8192, 16384}
		if r.stub { // the same calls, once, on the fake device's clock of a microsecond a launch
			hds, ns = []int{128}, []int{1024}
		}
		for _, hd := range hds {
			for _, n := range ns {
				sh := causalBlock(n, 2048/hd, 2048/hd, hd)
				in := firstInputs(sh, 4)
				res := map[string]any{"head_dim": hd, "seq": n, "heads": sh.Heads}
				flops := 3.5 * attnFLOPs(n, sh.Heads, hd, true)
				for _, mode := range []string{AttentionOwn, AttentionCUDNN} {
					must(r.c.SetAttention(mode))
					before := r.c.AttentionPaths()
					sec := r.timeFwdBwd(in, 3)
					if p := r.c.AttentionPaths(); mode == AttentionCUDNN && (pathDelta(before.Forward, p.Forward) != "cudnn causal" ||
						pathDelta(before.Backward, p.Backward) != "cudnn causal") {
						t.Errorf("D6 hd %d n %d: the timed blocks took %v / %v", hd, n, p.Forward, p.Backward)
					}
					res[mode+"_tflops"] = flops / sec / 1e12
					if mode == AttentionCUDNN {
						alone := r.timeExecOnly(3)
						res["glue_share"] = 1 - alone/sec
					}
				}
				r.report("D6", res)
			}
		}
	})
}

// firstMask is one block of the mask matrix.
type firstMask struct {
	name string
	sh   AttnShape
	fp16 bool
}

// firstMaskMatrix is D5's blocks at 1024 tokens, 8 heads of 128 (GQA 32/8 at 64).
func firstMaskMatrix() []firstMask {
	sc := float32(1 / math.Sqrt(128))
	mk := func(qp, kp, qs []int32, heads, kvh int) AttnShape {
		return AttnShape{NQ: len(qp), NK: len(kp), Heads: heads, KVHeads: kvh, HeadDim: 128, Causal: true, Scale: sc, QPos: qp, KPos: kp, QStart: qs}
	}
	diag := seqPos(0, 1024)
	gqa := causalBlock(1024, 32, 8, 64)
	return []firstMask{
		{"causal bottom-right 512×1024", mk(seqPos(512, 512), seqPos(0, 1024), nil, 8, 8), false},
		{"causal shifted 256", mk(seqPos(256, 1024), seqPos(0, 1024), nil, 8, 8), false},
		{"band top-left, window 128", mk(diag, diag, stubStarts(diag, nil, 128), 8, 8), false},
		{"band shifted, window 384", mk(seqPos(256, 1024), seqPos(0, 1024), stubStarts(seqPos(256, 1024), nil, 384), 8, 8), false},
		{"band bottom-right 512×1024, window 128", mk(seqPos(512, 512), seqPos(0, 1024), stubStarts(seqPos(512, 512), nil, 128), 8, 8), false},
		{"documents causal, 3 segments", mk(diag, diag, stubStarts(diag, []int32{0, 300, 700}, 0), 8, 8), false},
		{"documents full, past block", mk(seqPos(1024, 1024), diag, stubStarts(seqPos(1024, 1024), []int32{0, 400, 1500}, 0), 8, 8), false},
		{"documents band, window 128", mk(diag, diag, stubStarts(diag, []int32{0, 300, 700}, 128), 8, 8), false},
		{"GQA 32/8 causal", gqa, false},
		{"fp16 causal", causalBlock(1024, 8, 8, 128), true},
		{"960 keys (s_kv % 128 = 64), causal bottom-right", mk(seqPos(448, 512), seqPos(0, 960), nil, 8, 8), false},
		{"1000 keys, not a multiple of 128, full", func() AttnShape {
			s := causalBlock(1000, 8, 8, 128)
			s.Causal, s.QPos, s.KPos = false, nil, nil
			return s
		}(), false},
	}
}

// timeBackward times reps backwards of the block on cuDNN (with O or with D), in seconds.
func (r firstRig) timeBackward(in *firstData, withO bool, reps int) float64 {
	c, sh := r.c, in.sh
	up := func(x []float32) Buf { b := c.Alloc(len(x)); c.Upload(b, x); return b }
	q, k, v, do, o, lse := up(in.q), up(in.k), up(in.v), up(in.do), up(in.o), up(in.lse)
	d := c.Alloc(sh.Heads * sh.NQ)
	c.AttnBackwardPrep(d, o, do, sh.NQ, sh.Heads, sh.HeadDim, FP32)
	g := [3]Buf{c.Alloc(q.Len()), c.Alloc(k.Len()), c.Alloc(v.Len())}
	var ob Buf
	if withO {
		ob = o
	}
	tm := c.NewOpTimer()
	tm.Mark()
	for range reps {
		c.AttnBackward(g[0], g[1], g[2], q, k, v, ob, do, lse, d, sh)
	}
	tm.Mark()
	return tm.Times()[1]
}

// timeFwdBwd times one forward (into a fresh state, finished) and backward with O, the mean of
// reps after one untimed, in seconds: as a bf16 run's single-rank attention does them
// (model.LocalAttention), q, k, v and dO packed in 16 bits beforehand (the schedules convert
// them once per layer), O packed after the forward, D of the 16-bit O and dO.
func (r firstRig) timeFwdBwd(in *firstData, reps int) float64 {
	c, sh := r.c, in.sh
	H, hd := sh.Heads, sh.HeadDim
	sh.Operands = BF16
	n16 := sh.OperandLen
	pack := func(x []float32) Buf {
		b, p := c.Alloc(len(x)), c.Alloc(n16(len(x)))
		c.Upload(b, x)
		c.PackHalf(p, b, BF16)
		return p
	}
	q, k, v, do := pack(in.q), pack(in.k), pack(in.v), pack(in.do)
	st := AttnState{O: c.Alloc(sh.NQ * H * hd), M: c.Alloc(H * sh.NQ), L: c.Alloc(H * sh.NQ)}
	o, o16, lse, d := c.Alloc(sh.NQ*H*hd), c.Alloc(n16(sh.NQ*H*hd)), c.Alloc(H*sh.NQ), c.Alloc(H*sh.NQ)
	g := [3]Buf{c.Alloc(len(in.q)), c.Alloc(len(in.k)), c.Alloc(len(in.v))}
	step := func() {
		c.AttnInit(st)
		c.AttnForward(st, q, k, v, sh)
		c.AttnFinish(o, lse, st, sh.NQ, H, hd)
		c.PackHalf(o16, o, BF16)
		c.AttnBackwardPrep(d, o16, do, sh.NQ, H, hd, BF16)
		for _, b := range g {
			c.Zero(b)
		}
		c.AttnBackward(g[0], g[1], g[2], q, k, v, o16, do, lse, d, sh)
	}
	step()
	tm := c.NewOpTimer()
	tm.Mark()
	for range reps {
		step()
	}
	tm.Mark()
	return tm.Times()[1] / float64(reps)
}

// timeExecOnly times cuDNN's last forward and backward executions alone (the same bindings,
// without the glue around them), the mean of reps, in seconds.
func (r firstRig) timeExecOnly(reps int) float64 {
	c := r.c
	tm := c.NewOpTimer()
	tm.Mark()
	for range reps {
		for _, e := range c.dnn.last {
			ptrs := map[int64]cuda.Ptr{}
			for k, v := range e.ptrs {
				ptrs[k] = v
			}
			must(e.plan.plan.Execute(ptrs, e.ws))
		}
	}
	tm.Mark()
	return tm.Times()[1] / float64(reps)
}
