//go:build cuda

package kernels

// cuDNN's fused attention behind the CUDA backend's AttnForward and AttnBackward. A block that
// cuDNN can compute (cuda_cudnn_route.go: full, causal, band, documents) at BF16/FP16 precision
// runs as one cuDNN graph (kernels/cuda/cudnn_sdpa.go), every other block on the own kernels.
//
// Forward: cuDNN computes the block's normalised output o_b and its log-sum-exp lse_b (the
// graph's Stats, float32), and df_cudnn_fold folds them into the float32 state (O, M, L) as
// AttnMerge folds the state (O = o_b, M = lse_b, L = 1): the partial outputs of a block and of
// the blocks before it are merged in float32, as TransformerEngine's context parallelism does.
//
// Backward: the Backend passes the final merged lse and D = rowsum(dO ∘ O) (AttnBackwardPrep),
// not O, and the schedules send D (not O) to the ranks that compute the other blocks of a
// query. cuDNN's backward graph reads O only to compute softmax_sum = rowsum(dO ∘ O), in
// float32, which it then uses as D. So the backward hands it O′ and dO′ with eight more
// columns: dO′ = [dO, p1, p2, p3, 0…], O′ = [0…, s, s, s, 0…], V′ = [V, 0…], where s is the
// power of two of D's exponent and p1, p2, p3 are D/s cut by truncation into three 16-bit pieces
// (3 × 8 bits of bf16 or 3 × 11 of fp16 hold float32's 24-bit significand): rowsum(dO′ ∘ O′) =
// p1·s + p2·s + p3·s = D exactly — every product is a 16-bit value times a power of two (or
// zero), and the pieces have one sign and disjoint bits of D's significand, so every partial
// sum is a float32 and the float32 sum is exact in any order (every float32 D in bf16;
// 2^−25 ≤ |D| < 2^31 in fp16: TestCUDAHostCUDNNDSplit). The extra columns
// meet V′'s zeros in dP = dO′·V′ᵀ and add nothing; dV′'s extra columns are dropped. cuDNN thus
// uses the very D the schedule computed, on every rank, and no schedule changes. The price is a
// head dimension of D+8 for V, dO and O in the backward (see docs/gpu.md).
//
// The per-block gradients cuDNN writes in 16 bits are added into the float32 dq, dk, dv
// (the Backend's accumulate rule): per-step gradients are rounded to bf16/fp16 once before the
// float32 accumulation across blocks.
//
// Plans are built once per graph (shape, mask, cuDNN version) and cached; the workspace is one
// pooled device buffer, grown on demand.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"distflash/kernels/cuda"
)

// cudnnPadDV is how many columns the backward adds to V, dO and O to carry D (cuDNN needs
// head dimensions that are multiples of 8; three are used).
const cudnnPadDV = 8

// cudnnMaxPlans bounds the plan cache (a plan holds host descriptors only).
const cudnnMaxPlans = 128

// cudnnNotice writes the CUDA backend's one-time notices about cuDNN (to standard error).
var cudnnNotice = func(msg string) { fmt.Fprintln(os.Stderr, "distflash:", msg) }

// cudnnState is the CUDA backend's cuDNN side.
type cudnnState struct {
	mu   sync.Mutex
	mode string
	// open opens cuDNN on the backend's device (the host tests put a stub's handle here)
	open          func() (*cuda.DNN, error)
	loaded        bool
	err           error // why cuDNN is not used (after the first try)
	dnn           *cuda.DNN
	deterministic bool
	plans         map[string]*cudnnPlan
	order         []string // plan keys, oldest first
	noticed       map[string]bool

	ws      *cuda.Mem    // the pooled workspace
	scratch [9]*cuda.Mem // 16-bit operands and outputs, padded statistics
	paths   struct {
		mu       sync.Mutex
		fwd, bwd map[string]int64
	}
}

// Scratch slots of cudnnState (the toHalf slots 0–2 of CUDA hold q, k, v).
const (
	scrO     = iota // forward: o_b (16-bit); backward: O′
	scrStats        // forward: Stats; backward (ragged): the lse scattered into the padded statistics
	scrV            // backward: V′
	scrDO           // backward: dO′
	scrDQ           // backward: dq, dk, dv in 16 bits
	scrDK
	scrDV
)

// cudnnPlan is a cached plan, or why the graph has none (err).
type cudnnPlan struct {
	plan *cuda.Plan
	lay  *cuda.SDPALayout
	ws   int64 // total workspace bytes
	err  error
}

// initCUDNN sets the cuDNN side's defaults: attention mode auto, cuDNN opened on the
// backend's device, and the determinism of cuDNN's backward from
// $DISTFLASH_CUDNN_DETERMINISTIC (default 1: dQ without atomics, reproducible run to run as the
// own kernels are; 0 lets cuDNN accumulate dQ with atomics, as PyTorch does).
func (c *CUDA) initCUDNN() {
	c.dnn.mode = AttentionAuto
	c.dnn.deterministic = os.Getenv("DISTFLASH_CUDNN_DETERMINISTIC") != "0"
	c.dnn.open = func() (*cuda.DNN, error) {
		d, ok := c.dev.(interface{ DNN() (*cuda.DNN, error) })
		if !ok {
			return nil, errors.New("this device has no cuDNN")
		}
		return d.DNN()
	}
}

// SetAttention implements AttentionRouter.
func (c *CUDA) SetAttention(mode string) error {
	if err := ValidateAttention(mode); err != nil {
		return err
	}
	s := &c.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = mode
	if mode != AttentionCUDNN {
		return nil
	}
	if err := s.load(); err != nil {
		return fmt.Errorf("kernels: device.attention = cudnn: %w", err)
	}
	return nil
}

// AttentionPaths implements AttentionRouter.
func (c *CUDA) AttentionPaths() AttentionPaths {
	s := &c.dnn
	s.mu.Lock()
	p := AttentionPaths{Mode: s.mode}
	switch {
	case s.dnn != nil:
		p.Library = fmt.Sprintf("cuDNN %s (%s)", cuda.CUDNNVersionString(s.dnn.Version), s.dnn.File)
	case s.err != nil:
		p.Library = "no cuDNN: " + s.err.Error()
	}
	s.mu.Unlock()
	s.paths.mu.Lock()
	defer s.paths.mu.Unlock()
	p.Forward, p.Backward = map[string]int64{}, map[string]int64{}
	for k, n := range s.paths.fwd {
		p.Forward[k] = n
	}
	for k, n := range s.paths.bwd {
		p.Backward[k] = n
	}
	return p
}

// count records the path one block took.
func (s *cudnnState) count(backward bool, path string) {
	s.paths.mu.Lock()
	defer s.paths.mu.Unlock()
	m := &s.paths.fwd
	if backward {
		m = &s.paths.bwd
	}
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[path]++
}

// notice says msg once per process state (s.mu held).
func (s *cudnnState) notice(msg string) {
	if s.noticed == nil {
		s.noticed = map[string]bool{}
	}
	if !s.noticed[msg] {
		s.noticed[msg] = true
		cudnnNotice(msg)
	}
}

// load opens cuDNN once (s.mu held); a failure is kept and returned again.
func (s *cudnnState) load() error {
	if s.loaded {
		return s.err
	}
	s.loaded = true
	d, err := s.open()
	if err != nil {
		s.err = err
		return err
	}
	s.dnn = d
	return nil
}

// close releases the plans and the handle.
func (s *cudnnState) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.plans {
		if p.plan != nil {
			p.plan.Close()
		}
	}
	s.plans, s.order = nil, nil
	if s.dnn == nil {
		return nil
	}
	err := s.dnn.Close()
	s.dnn = nil
	return err
}

// cudnnRoute decides whether cuDNN computes block sh; it returns the block, its graph's
// description and plan, or false after counting the own path the block takes (s.mu is not
// held by the caller).
func (c *CUDA) cudnnRoute(sh AttnShape, backward bool) (cudnnBlock, cuda.SDPA, *cudnnPlan, bool) {
	s := &c.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	own := func(why string) (cudnnBlock, cuda.SDPA, *cudnnPlan, bool) {
		s.count(backward, "own: "+why)
		return cudnnBlock{}, cuda.SDPA{}, nil, false
	}
	if s.mode == AttentionOwn {
		return own("device.attention = own")
	}
	prec := c.precision()
	if prec == precFP32 {
		return own("fp32")
	}
	if err := s.load(); err != nil {
		s.notice(fmt.Sprintf("cuDNN is not used, every attention block runs the own kernel: %v", err))
		return own("no cuDNN")
	}
	if s.dnn.Version == 91000 || s.dnn.Version == 91001 {
		s.notice(fmt.Sprintf("cuDNN %s has known SDPA bugs (cudnn-frontend refuses 9.10.0 and 9.10.1): "+
			"every attention block runs the own kernel", cuda.CUDNNVersionString(s.dnn.Version)))
		return own("cuDNN " + cuda.CUDNNVersionString(s.dnn.Version))
	}
	blk, why := classifyCUDNN(sh)
	if why != "" {
		return own(why)
	}
	spec := c.sdpaSpec(sh, blk, backward)
	if err := spec.Check(); err != nil {
		return own(err.Error())
	}
	p := s.plan(spec)
	if p.err != nil {
		return own("cuDNN has no plan: " + p.err.Error())
	}
	s.count(backward, "cudnn "+blk.kind)
	return blk, spec, p, true
}

// sdpaSpec is block blk of sh as a cuDNN graph description.
func (c *CUDA) sdpaSpec(sh AttnShape, blk cudnnBlock, backward bool) cuda.SDPA {
	io := cuda.BFloat16
	if c.precision() == precFP16 {
		io = cuda.Half
	}
	dv := int64(sh.HeadDim)
	if backward {
		dv += cudnnPadDV
	}
	s := cuda.SDPA{Backward: backward, IO: io, B: blk.b, H: int64(sh.Heads), KVH: int64(sh.KVHeads),
		SQ: blk.sq, SKV: blk.skv, D: int64(sh.HeadDim), DV: dv, Scale: sh.Scale, Mask: blk.mask,
		Ragged: blk.ragged, Deterministic: c.dnn.deterministic, Version: c.dnn.dnn.Version,
		SM: 10*c.info.major + c.info.minor}
	return s
}

// plan returns the cached plan of spec, building it the first time (s.mu held).
func (s *cudnnState) plan(spec cuda.SDPA) *cudnnPlan {
	key := spec.Key()
	if p, ok := s.plans[key]; ok {
		return p
	}
	p := &cudnnPlan{}
	p.plan, p.lay, p.err = s.dnn.BuildSDPA(spec)
	if p.err == nil {
		p.ws = p.lay.Layout()
	}
	if s.plans == nil {
		s.plans = map[string]*cudnnPlan{}
	}
	if len(s.order) >= cudnnMaxPlans {
		old := s.order[0]
		s.order = s.order[1:]
		if q := s.plans[old]; q != nil && q.plan != nil {
			q.plan.Close()
		}
		delete(s.plans, old)
	}
	s.plans[key] = p
	s.order = append(s.order, key)
	return p
}

// scratchAt returns scratch slot i grown to bytes, rounded up to whole 32-bit words (the
// memsets of the 16-bit outputs clear words) (c.mu held).
func (c *CUDA) scratchAt(i, bytes int) devPtr { return c.grow(&c.dnn.scratch[i], (bytes+3)&^3) }

// cudnnExecute runs plan p with the tensors given, the workspace grown to the plan's size and
// its zeroed tensors cleared (c.mu held).
func (c *CUDA) cudnnExecute(p *cudnnPlan, ptrs map[int64]cuda.Ptr) {
	ws := c.grow(&c.dnn.ws, int(p.ws))
	for _, t := range p.lay.Extra {
		ptrs[t.UID] = ws + devPtr(t.Off)
		if t.Zero {
			c.memset32(ws+devPtr(t.Off), 0, int((t.Bytes+3)/4))
		}
	}
	must(p.plan.Execute(ptrs, ws))
}

// cudnnForward computes block sh with cuDNN and folds it into st, or returns false (the own
// kernel then runs it).
func (c *CUDA) cudnnForward(st AttnState, qb, kb, vb Buf, sh AttnShape) bool {
	blk, spec, p, ok := c.cudnnRoute(sh, false)
	if !ok {
		return false
	}
	H, hd := sh.Heads, sh.HeadDim
	o, m, l := dbuf(st.O), dbuf(st.M), dbuf(st.L)
	c.mu.Lock()
	defer c.mu.Unlock()
	fp16 := spec.IO == cuda.Half
	hq, hk, hv := c.toHalf(0, qb, fp16), c.toHalf(1, kb, fp16), c.toHalf(2, vb, fp16)
	oh := c.scratchAt(scrO, 2*sh.NQ*H*hd)
	stats := c.scratchAt(scrStats, int(4*spec.B*spec.H*spec.SQ))
	ptrs := map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: hv, cuda.UIDO: oh, cuda.UIDStats: stats}
	var rowmap devPtr
	if blk.ragged {
		ri, err := packRagged(blk, sh.NQ, H, H*hd, sh.KVHeads*hd, sh.KVHeads*hd, H*hd)
		must(err)
		ip := c.uploadInts(ri.data)
		at := func(off int) devPtr { return ip + devPtr(4*off) }
		ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = at(ri.seqQ), at(ri.seqKV)
		ptrs[cuda.UIDOffQ], ptrs[cuda.UIDOffK], ptrs[cuda.UIDOffV], ptrs[cuda.UIDOffO] = at(ri.offQ), at(ri.offK), at(ri.offV), at(ri.offO)
		rowmap = at(ri.rowmap)
	}
	c.cudnnExecute(p, ptrs)
	c.launch("df_cudnn_fold", warpRowGrid(sh.NQ*H), 1, ewThreads, 0, o, m, l, oh, stats, rowmap,
		int32(sh.NQ), int32(H), int32(hd), int32(spec.SQ), boolInt(fp16))
	runtime.KeepAlive([]Buf{qb, kb, vb})
	return true
}

// cudnnBackward adds block sh's gradients computed by cuDNN into dq, dk, dv, or returns false
// (the own kernels then compute them).
func (c *CUDA) cudnnBackward(dqb, dkb, dvb, qb, kb, vb, dob, lseb, db Buf, sh AttnShape) bool {
	blk, spec, p, ok := c.cudnnRoute(sh, true)
	if !ok {
		return false
	}
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	ld := hd + cudnnPadDV
	dq, dk, dv := dbuf(dqb), dbuf(dkb), dbuf(dvb)
	do, lse, d, v := dbuf(dob), dbuf(lseb), dbuf(db), dbuf(vb)
	c.mu.Lock()
	defer c.mu.Unlock()
	fp16 := spec.IO == cuda.Half
	f16 := boolInt(fp16)
	hq, hk := c.toHalf(0, qb, fp16), c.toHalf(1, kb, fp16)
	vp := c.scratchAt(scrV, 2*sh.NK*KVH*ld)
	c.launch("df_pad_half", ewGrid(sh.NK*KVH*ld), 1, ewThreads, 0, vp, v, int64(sh.NK*KVH), int32(hd), int32(ld), f16)
	dop, op := c.scratchAt(scrDO, 2*sh.NQ*H*ld), c.scratchAt(scrO, 2*sh.NQ*H*ld)
	c.launch("df_cudnn_dsplit", ewGrid(sh.NQ*H*ld), 1, ewThreads, 0, dop, op, do, d,
		int32(sh.NQ), int32(H), int32(hd), int32(ld), f16)
	gq, gk, gv := c.scratchAt(scrDQ, 2*sh.NQ*H*hd), c.scratchAt(scrDK, 2*sh.NK*KVH*hd), c.scratchAt(scrDV, 2*sh.NK*KVH*ld)
	// cuDNN need not write the rows of keys (or queries) that see nothing: start from zero
	c.memset32(gq, 0, (sh.NQ*H*hd+1)/2)
	c.memset32(gk, 0, (sh.NK*KVH*hd+1)/2)
	c.memset32(gv, 0, (sh.NK*KVH*ld+1)/2)
	ptrs := map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: vp, cuda.UIDO: op, cuda.UIDdO: dop,
		cuda.UIDStats: lse.ptr(), cuda.UIDdQ: gq, cuda.UIDdK: gk, cuda.UIDdV: gv}
	switch {
	case blk.ragged:
		ri, err := packRagged(blk, sh.NQ, H, H*hd, KVH*hd, KVH*ld, H*ld)
		must(err)
		ip := c.uploadInts(ri.data)
		at := func(off int) devPtr { return ip + devPtr(4*off) }
		ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = at(ri.seqQ), at(ri.seqKV)
		ptrs[cuda.UIDOffQ], ptrs[cuda.UIDOffK], ptrs[cuda.UIDOffV], ptrs[cuda.UIDOffO] = at(ri.offQ), at(ri.offK), at(ri.offV), at(ri.offO)
		stats := c.scratchAt(scrStats, int(4*spec.B*spec.H*spec.SQ))
		c.launch("df_lse_scatter", ewGrid(sh.NQ*H), 1, ewThreads, 0, stats, lse, at(ri.rowmap), int32(sh.NQ), int32(H), int32(spec.SQ))
		ptrs[cuda.UIDStats] = stats
	case spec.BackwardWorkaround():
		ip := c.uploadInts([]int32{int32(spec.SQ), int32(spec.SKV)})
		ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = ip, ip+4
	}
	c.cudnnExecute(p, ptrs)
	c.launch("df_add_half", ewGrid(sh.NQ*H*hd), 1, ewThreads, 0, dq, gq, int64(sh.NQ*H), int32(hd), int32(hd), f16)
	c.launch("df_add_half", ewGrid(sh.NK*KVH*hd), 1, ewThreads, 0, dk, gk, int64(sh.NK*KVH), int32(hd), int32(hd), f16)
	c.launch("df_add_half", ewGrid(sh.NK*KVH*hd), 1, ewThreads, 0, dv, gv, int64(sh.NK*KVH), int32(hd), int32(ld), f16)
	runtime.KeepAlive([]Buf{qb, kb, lseb})
	return true
}
