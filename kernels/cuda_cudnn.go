//go:build cuda

package kernels

// cuDNN's fused attention behind the CUDA backend's AttnForward and AttnBackward. A block that
// cuDNN can compute (cuda_cudnn_route.go: full, causal, band, documents) at BF16/FP16 precision
// runs as one cuDNN graph (kernels/cuda/cudnn_sdpa.go), every other block on the own kernels.
// Every graph has one head dimension for Q, K, V and O, as PyTorch's and TransformerEngine's
// have: the shapes NVIDIA validates and its specialised kernels (64, 128, 256) serve.
//
// Forward: cuDNN computes the block's normalised output o_b and its log-sum-exp lse_b (the
// graph's Stats, float32), and df_cudnn_fold folds them into the float32 state (O, M, L) as
// AttnMerge folds the state (O = o_b, M = lse_b, L = 1): the partial outputs of a block and of
// the blocks before it are merged in float32, as TransformerEngine's context parallelism does.
//
// Backward: cuDNN's graph reads O only to compute softmax_sum = rowsum(dO ∘ O) in float32 from
// the 16-bit operands, which it uses where FlashAttention uses D. Where the block's queries are
// this rank's, the caller passes their final O (AttnBackward's o) and cuDNN gets it in 16 bits,
// as PyTorch and TransformerEngine give it. Where only D travelled with the queries (the helper
// blocks of DistFlashAttn and BurstAttention, a backward given D), cuDNN gets the synthetic O′
// of kernels/oprime.go (df_cudnn_oprime): rowsum(dO ∘ O′) = D to within the 16-bit unit.
//
// The per-block gradients cuDNN writes in 16 bits are added into the float32 dq, dk, dv
// (the Backend's accumulate rule): per-step gradients are rounded to bf16/fp16 once before the
// float32 accumulation across blocks.
//
// The backward is non-deterministic by default (dQ accumulated with atomics in a float32
// buffer, as PyTorch's and TransformerEngine's default): cuDNN's deterministic backward on Hopper
// asks a workspace of b·h·s_q·s_kv·2 bytes, 4 GiB for one 8K block of 32 heads.
// device.deterministic_attention (SetDeterministicAttention) asks for it, up to
// cudnnDeterministicCap of workspace; a block above the cap runs the own kernel, which is
// deterministic too, and that is said once.
//
// Plans are built once per graph (shape, mask, cuDNN version) and kept for the run: no plan is
// evicted, so a run cannot thrash the cache; past cudnnMaxPlans graphs new shapes run the own
// kernel (said once). Their count and build time are in AttentionPaths. The workspace is one
// pooled device buffer, grown on demand; one that cannot be allocated sends the block to the
// own kernel (said once), never a panic.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"distflash/kernels/cuda"
)

// cudnnMaxPlans bounds the plans a backend keeps. Plans hold host descriptors only (a few
// hundred KB each at most); none is evicted, so a run's working set never thrashes.
var cudnnMaxPlans = 1024

// cudnnDeterministicCap is the most workspace a deterministic backward may ask for:
// cudnn-frontend's cap before cuDNN 9.0 and llm.c's, 256 MiB.
const cudnnDeterministicCap = 256 << 20

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
	noticed       map[string]bool
	built         PlanStats

	ws      *cuda.Mem    // the pooled workspace
	scratch [6]*cuda.Mem // 16-bit outputs and O′, padded statistics
	// last is the latest execution of a forward ([0]) and a backward ([1]) plan with its
	// bindings: the GPU check times cuDNN alone with it, to tell its kernel from the glue.
	last  [2]cudnnExec
	paths struct {
		mu       sync.Mutex
		fwd, bwd map[string]int64
	}
}

// Scratch slots of cudnnState (the toHalf slots 0–3 of CUDA hold q, k, v and the real O).
const (
	scrO     = iota // forward: o_b (16-bit); backward: O′
	scrStats        // forward: Stats; backward: lse scattered into the padded statistics, or lse aligned
	scrDO           // backward: dO in 16 bits
	scrDQ           // backward: dq, dk, dv in 16 bits
	scrDK
	scrDV
)

// cudnnExec is one execution of a plan: the plan, the tensors' addresses and the workspace.
type cudnnExec struct {
	plan *cudnnPlan
	ptrs map[int64]cuda.Ptr
	ws   devPtr
}

// cudnnPlan is a cached plan, or why the graph has none (err).
type cudnnPlan struct {
	plan     *cuda.Plan
	lay      *cuda.SDPALayout
	ws       int64 // total workspace bytes
	backward bool
	err      error
}

// initCUDNN sets the cuDNN side's defaults: attention mode auto, the non-deterministic
// backward, cuDNN opened on the backend's device.
func (c *CUDA) initCUDNN() {
	c.dnn.mode = AttentionAuto
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

// SetDeterministicAttention implements AttentionRouter.
func (c *CUDA) SetDeterministicAttention(on bool) {
	s := &c.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deterministic = on
}

// AttentionPaths implements AttentionRouter.
func (c *CUDA) AttentionPaths() AttentionPaths {
	s := &c.dnn
	s.mu.Lock()
	p := AttentionPaths{Mode: s.mode, Deterministic: s.deterministic, Plans: s.built}
	switch {
	case s.dnn != nil:
		p.Library = fmt.Sprintf("cuDNN %s (%s)", cuda.CUDNNVersionString(s.dnn.Version), s.dnn.File)
		if n := cuda.LoadedNVRTC(); n.File != "" {
			p.Library += fmt.Sprintf(", NVRTC %d.%d", n.Major, n.Minor)
		}
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

// close releases the plans and the handle. The caller has synchronised the device's stream
// (CUDA.Close): no queued execution of a plan outlives it.
func (s *cudnnState) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.plans {
		if p.plan != nil {
			p.plan.Close()
		}
	}
	s.plans = nil
	if s.dnn == nil {
		return nil
	}
	err := s.dnn.Close()
	s.dnn = nil
	return err
}

// cudnnRoute decides whether cuDNN computes block sh; it returns the block, its graph's
// description and plan, or false after counting the own path the block takes (s.mu is not
// held by the caller). The caller counts the cuDNN path once the block ran (cudnnRan).
func (c *CUDA) cudnnRoute(sh AttnShape, backward bool, prec cudaPrec) (cudnnBlock, cuda.SDPA, *cudnnPlan, bool) {
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
	if prec == precFP32 {
		return own("fp32")
	}
	if err := s.load(); err != nil {
		s.notice(fmt.Sprintf("cuDNN attention is off, every attention block runs the own kernel: %v", err))
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
	spec := c.sdpaSpec(sh, blk, backward, prec)
	if err := spec.Check(); err != nil {
		return own(err.Error())
	}
	p := s.plan(spec)
	if p == nil {
		s.notice(fmt.Sprintf("cuDNN: %d attention plans built, the most a run keeps: blocks of new shapes run the own kernel", cudnnMaxPlans))
		return own("cuDNN plan cache full")
	}
	if p.err != nil {
		if h := compileHint(p.err); h != "" {
			s.notice(fmt.Sprintf("cuDNN cannot build its fused attention (%s): those blocks run the own kernel: %v", h, p.err))
		}
		return own("cuDNN has no plan: " + p.err.Error())
	}
	if spec.Deterministic && backward && p.ws > cudnnDeterministicCap {
		s.notice(fmt.Sprintf("device.deterministic_attention: cuDNN's deterministic backward asks %s of workspace for a %d×%d block of %d heads "+
			"(more than %s): such blocks run the own kernel, which is deterministic too", bytesText(p.ws), spec.SQ, spec.SKV, spec.H,
			bytesText(cudnnDeterministicCap)))
		return own(fmt.Sprintf("deterministic workspace %s above %s", bytesText(p.ws), bytesText(cudnnDeterministicCap)))
	}
	return blk, spec, p, true
}

// compileHint says what a plan failure means when every engine failed for want of NVRTC or
// with a failed compilation, else "".
func compileHint(err error) string {
	var ce cuda.CUDNNError
	if !errors.As(err, &ce) {
		return ""
	}
	for _, code := range []int{3008, 4001} {
		if ce.Code == code || containsStatus(ce.Last, code) {
			return cuda.StatusHint(code)
		}
	}
	return ""
}

// containsStatus reports whether an engine list (cuda.Plan.Tried, joined) names the status.
func containsStatus(s string, code int) bool {
	return strings.Contains(s, fmt.Sprintf("cudnnStatus_t %d", code))
}

// cudnnRan counts the cuDNN path of a block that ran.
func (c *CUDA) cudnnRan(blk cudnnBlock, backward bool) { c.dnn.count(backward, "cudnn "+blk.kind) }

// cudnnOwn counts the own path of a block that cuDNN could not run after all (its memory did
// not fit), saying why once.
func (c *CUDA) cudnnOwn(backward bool, err error) {
	s := &c.dnn
	s.mu.Lock()
	if !s.noticed["memory"] {
		s.notice(fmt.Sprintf("cuDNN attention: %v: such blocks run the own kernel", err))
		s.noticed["memory"] = true
	}
	s.mu.Unlock()
	s.count(backward, "own: "+err.Error())
}

// bytesText writes a byte count in MiB or GiB.
func bytesText(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

// sdpaSpec is block blk of sh as a cuDNN graph description, its operands in 16-bit precision
// prec.
func (c *CUDA) sdpaSpec(sh AttnShape, blk cudnnBlock, backward bool, prec cudaPrec) cuda.SDPA {
	io := cuda.BFloat16
	if prec == precFP16 {
		io = cuda.Half
	}
	return cuda.SDPA{Backward: backward, IO: io, B: blk.b, H: int64(sh.Heads), KVH: int64(sh.KVHeads),
		SQ: blk.sq, SKV: blk.skv, D: int64(sh.HeadDim), Scale: sh.Scale, Mask: blk.mask,
		Ragged: blk.ragged, Deterministic: backward && c.dnn.deterministic, Version: c.dnn.dnn.Version,
		SM: 10*c.info.major + c.info.minor}
}

// plan returns the cached plan of spec, building it the first time, or nil when the cache is
// full (s.mu held).
func (s *cudnnState) plan(spec cuda.SDPA) *cudnnPlan {
	key := spec.Key()
	if p, ok := s.plans[key]; ok {
		return p
	}
	if len(s.plans) >= cudnnMaxPlans {
		return nil
	}
	p := &cudnnPlan{backward: spec.Backward}
	start := time.Now()
	p.plan, p.lay, p.err = s.dnn.BuildSDPA(spec)
	sec := time.Since(start).Seconds()
	if p.err == nil {
		p.ws = p.lay.Layout()
		s.built.Built++
		s.built.Seconds += sec
		s.built.Slowest = max(s.built.Slowest, sec)
		s.built.Workspace = max(s.built.Workspace, p.ws)
	} else {
		s.built.Failed++
	}
	if s.plans == nil {
		s.plans = map[string]*cudnnPlan{}
	}
	s.plans[key] = p
	return p
}

// tryGrow is grow for memory cuDNN's path can do without: an allocation that fails is
// returned as an error (the block then runs the own kernel) instead of a panic.
func (c *CUDA) tryGrow(m **cuda.Mem, bytes int, what string) (devPtr, error) {
	if *m == nil || (*m).Bytes < bytes {
		n, err := c.dev.Alloc(max(bytes, 4096))
		if err != nil {
			return 0, fmt.Errorf("%s of %s does not fit in device memory (%v)", what, bytesText(int64(bytes)), err)
		}
		*m = n
	}
	return (*m).Ptr, nil
}

// cudnnMem holds the allocations of one cuDNN block, made before anything is queued so that a
// failure leaves nothing half done.
type cudnnMem struct {
	c   *CUDA
	err error
}

// at returns scratch slot i grown to bytes, rounded up to whole 32-bit words (the memsets of
// the 16-bit outputs clear words) (c.mu held).
func (m *cudnnMem) at(i, bytes int) devPtr {
	if m.err != nil {
		return 0
	}
	p, err := m.c.tryGrow(&m.c.dnn.scratch[i], (bytes+3)&^3, "cuDNN's scratch")
	m.err = err
	return p
}

// workspace returns the workspace grown to p's size (c.mu held).
func (m *cudnnMem) workspace(p *cudnnPlan) devPtr {
	if m.err != nil {
		return 0
	}
	ws, err := m.c.tryGrow(&m.c.dnn.ws, int(p.ws), "cuDNN's workspace")
	m.err = err
	return ws
}

// cudnnExecute runs plan p with the tensors given and the workspace at ws, its zeroed tensors
// cleared (c.mu held).
func (c *CUDA) cudnnExecute(p *cudnnPlan, ptrs map[int64]cuda.Ptr, ws devPtr) {
	for _, t := range p.lay.Extra {
		ptrs[t.UID] = ws + devPtr(t.Off)
		if t.Zero {
			c.memset32(ws+devPtr(t.Off), 0, int((t.Bytes+3)/4))
		}
	}
	must(p.plan.Execute(ptrs, ws))
	i := 0
	if p.backward {
		i = 1
	}
	c.dnn.last[i] = cudnnExec{plan: p, ptrs: ptrs, ws: ws}
}

// raggedPtrs uploads a ragged block's integers and binds them (c.mu held); it returns the row
// map's address.
func (c *CUDA) raggedPtrs(ptrs map[int64]cuda.Ptr, blk cudnnBlock, sh AttnShape) devPtr {
	H, hd, KVH := sh.Heads, sh.HeadDim, sh.KVHeads
	ri, err := packRagged(blk, sh.NQ, H, H*hd, KVH*hd, KVH*hd, H*hd)
	must(err)
	ip := c.uploadInts(ri.data)
	at := func(off int) devPtr { return ip + devPtr(4*off) }
	ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = at(ri.seqQ), at(ri.seqKV)
	ptrs[cuda.UIDOffQ], ptrs[cuda.UIDOffK], ptrs[cuda.UIDOffV], ptrs[cuda.UIDOffO] = at(ri.offQ), at(ri.offK), at(ri.offV), at(ri.offO)
	return at(ri.rowmap)
}

// cudnnForward computes block sh with cuDNN and folds it into st, or returns false (the own
// kernel then runs it).
func (c *CUDA) cudnnForward(st AttnState, qb, kb, vb Buf, sh AttnShape, prec cudaPrec) bool {
	blk, spec, p, ok := c.cudnnRoute(sh, false, prec)
	if !ok {
		return false
	}
	H, hd := sh.Heads, sh.HeadDim
	o, m, l := dbuf(st.O), dbuf(st.M), dbuf(st.L)
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := &cudnnMem{c: c}
	oh := mem.at(scrO, 2*sh.NQ*H*hd)
	stats := mem.at(scrStats, int(4*spec.B*spec.H*spec.SQ))
	ws := mem.workspace(p)
	if mem.err != nil {
		c.cudnnOwn(false, mem.err)
		return false
	}
	fp16 := spec.IO == cuda.Half
	hq, hk, hv := c.operand(0, qb, sh, fp16), c.operand(1, kb, sh, fp16), c.operand(2, vb, sh, fp16)
	ptrs := map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: hv, cuda.UIDO: oh, cuda.UIDStats: stats}
	var rowmap devPtr
	if blk.ragged {
		rowmap = c.raggedPtrs(ptrs, blk, sh)
	}
	c.cudnnExecute(p, ptrs, ws)
	c.launch("df_cudnn_fold", warpRowGrid(sh.NQ*H), 1, ewThreads, 0, o, m, l, oh, stats, rowmap,
		int32(sh.NQ), int32(H), int32(hd), int32(spec.SQ), boolInt(fp16))
	c.cudnnRan(blk, false)
	runtime.KeepAlive([]Buf{qb, kb, vb})
	return true
}

// cudnnBackward adds block sh's gradients computed by cuDNN into dq, dk, dv, or returns false
// (the own kernels then compute them). ob, when not nil, is the queries' final output: cuDNN
// gets it in 16 bits; else the synthetic O′ of D.
func (c *CUDA) cudnnBackward(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb, db Buf, sh AttnShape, prec cudaPrec) bool {
	blk, spec, p, ok := c.cudnnRoute(sh, true, prec)
	if !ok {
		return false
	}
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	dq, dk, dv := dbuf(dqb), dbuf(dkb), dbuf(dvb)
	do, lse, d := dbuf(dob), dbuf(lseb), dbuf(db)
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := &cudnnMem{c: c}
	nq, nk := sh.NQ*H*hd, sh.NK*KVH*hd
	var dop, op devPtr
	if sh.Operands == FP32 {
		dop = mem.at(scrDO, 2*nq)
	}
	if ob == nil {
		op = mem.at(scrO, 2*nq)
	}
	gq, gk, gv := mem.at(scrDQ, 2*nq), mem.at(scrDK, 2*nk), mem.at(scrDV, 2*nk)
	stats := lse.ptr()
	// cuDNN reads the statistics at the 16-byte alignment every tensor declares: a ragged
	// block's are scattered into padded rows, a misaligned slice's copied
	switch {
	case blk.ragged:
		stats = mem.at(scrStats, int(4*spec.B*spec.H*spec.SQ))
	case stats%16 != 0:
		stats = mem.at(scrStats, 4*H*sh.NQ)
	}
	ws := mem.workspace(p)
	if mem.err != nil {
		c.cudnnOwn(true, mem.err)
		return false
	}
	fp16 := spec.IO == cuda.Half
	f16 := boolInt(fp16)
	hq, hk, hv := c.operand(0, qb, sh, fp16), c.operand(1, kb, sh, fp16), c.operand(2, vb, sh, fp16)
	// dO in 16 bits: converted into its scratch, or the packed operand itself
	var do16 devPtr
	if sh.Operands != FP32 {
		do16 = c.operand(4, dob, sh, fp16)
		dop = do16
	}
	switch {
	case ob != nil:
		op = c.operand(3, ob, sh, fp16)
		if do16 == 0 {
			c.launch("df_to_half", ewGrid(nq), 1, ewThreads, 0, dop, do, int64(nq), f16)
		}
	case do16 == 0:
		c.launch("df_cudnn_oprime", warpRowGrid(sh.NQ*H), 1, ewThreads, 0, dop, op, do, devPtr(0), d,
			int32(sh.NQ), int32(H), int32(hd), f16)
	default:
		c.launch("df_cudnn_oprime", warpRowGrid(sh.NQ*H), 1, ewThreads, 0, devPtr(0), op, devPtr(0), do16, d,
			int32(sh.NQ), int32(H), int32(hd), f16)
	}
	// cuDNN need not write the rows of keys (or queries) that see nothing: start from zero
	c.memset32(gq, 0, (nq+1)/2)
	c.memset32(gk, 0, (nk+1)/2)
	c.memset32(gv, 0, (nk+1)/2)
	ptrs := map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: hv, cuda.UIDO: op, cuda.UIDdO: dop,
		cuda.UIDStats: stats, cuda.UIDdQ: gq, cuda.UIDdK: gk, cuda.UIDdV: gv}
	switch {
	case blk.ragged:
		rowmap := c.raggedPtrs(ptrs, blk, sh)
		// the padded rows must hold finite statistics: −Inf − (−Inf) is NaN in the masked scores
		c.memset32(stats, 0, int(spec.B*spec.H*spec.SQ))
		c.launch("df_lse_scatter", ewGrid(sh.NQ*H), 1, ewThreads, 0, stats, lse, rowmap, int32(sh.NQ), int32(H), int32(spec.SQ))
	case stats != lse.ptr():
		must(c.dev.DtoD(stats, lse.ptr(), 4*H*sh.NQ))
	}
	if spec.BackwardWorkaround() {
		// seq_len_q and seq_len_kv, each at a 16-byte boundary
		ip := c.uploadInts([]int32{int32(spec.SQ), 0, 0, 0, int32(spec.SKV)})
		ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = ip, ip+16
	}
	c.cudnnExecute(p, ptrs, ws)
	c.launch("df_add_half3", ewGrid(nq+2*nk), 1, ewThreads, 0, dq, gq, int64(nq), dk, gk, dv, gv, int64(nk), f16)
	c.cudnnRan(blk, true)
	runtime.KeepAlive([]Buf{qb, kb, vb, ob, dob, lseb, db})
	return true
}

// The 16-bit attention of one rank (AttnForwardHalf, AttnBackwardHalf; cuda_attn16.go) on
// cuDNN: q, k, v, O and dO are the caller's packed buffers, read where they are (copied only
// when one does not start on a 16-byte boundary, as every tensor declares), and cuDNN writes
// O, the statistics and dQ, dK, dV straight into the caller's o, lse, dq, dk, dv: no
// conversion, no fold into a float32 state, no finish, no pack, no float32 gradients to add
// into, and the backward reads the real O (no synthetic O′). The graphs are the schedules'
// (one head dimension for Q, K, V and O). cuDNN's Stats, [B, H, SQ, 1] with strides
// [H·SQ, SQ, 1, 1], is the Backend's lse [Heads, NQ] when B is 1 and SQ is NQ: a block that is
// not ragged. A ragged block's statistics live in padded rows [B, H, SQ]: its backward scatters
// lse into them (df_lse_scatter), and its forward takes the float32 state's path (fold, finish,
// pack; cuda_attn16.go) rather than a gather kernel of its own.

// out is where cuDNN writes the output buffer b: b itself when it starts on a 16-byte boundary,
// as every tensor declares, else scratch slot, from which copyOut moves it to b after.
func (m *cudnnMem) out(slot int, b cudaBuf) devPtr {
	if p := b.ptr(); p%16 == 0 {
		return p
	}
	return m.at(slot, 4*b.n)
}

// copyOut moves an output cuDNN wrote at at (cudnnMem.out) into b, where it was not b itself.
func (c *CUDA) copyOut(b cudaBuf, at devPtr) {
	if at != b.ptr() {
		must(c.dev.DtoD(b.ptr(), at, 4*b.n))
	}
}

// cudnnForwardHalf runs block sh (routed to cuDNN as blk, spec, p; not ragged) writing o and
// lse, or returns false, having counted the own path, when its memory does not fit.
func (c *CUDA) cudnnForwardHalf(ob, lseb, qb, kb, vb Buf, sh AttnShape, blk cudnnBlock, spec cuda.SDPA, p *cudnnPlan) bool {
	o, lse := dbuf(ob), dbuf(lseb)
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := &cudnnMem{c: c}
	op, sp := mem.out(scrO, o), mem.out(scrStats, lse)
	ws := mem.workspace(p)
	if mem.err != nil {
		c.cudnnOwn(false, mem.err)
		return false
	}
	fp16 := spec.IO == cuda.Half
	hq, hk, hv := c.operand(0, qb, sh, fp16), c.operand(1, kb, sh, fp16), c.operand(2, vb, sh, fp16)
	c.cudnnExecute(p, map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: hv, cuda.UIDO: op, cuda.UIDStats: sp}, ws)
	c.copyOut(o, op)
	c.copyOut(lse, sp)
	c.cudnnRan(blk, false)
	runtime.KeepAlive([]Buf{ob, lseb, qb, kb, vb})
	return true
}

// cudnnBackwardHalf runs the backward of block sh (routed to cuDNN as blk, spec, p) from the
// real O, writing dq, dk, dv, or returns false, having counted the own path, when its memory
// does not fit. Only where cuDNN may leave rows of a gradient unwritten are they cleared first:
// a ragged block's (queries and keys outside every segment), and the dK and dV of keys that no
// query sees (cudnnKeysUnseen).
func (c *CUDA) cudnnBackwardHalf(dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb Buf, sh AttnShape, blk cudnnBlock, spec cuda.SDPA, p *cudnnPlan) bool {
	dq, dk, dv, lse := dbuf(dqb), dbuf(dkb), dbuf(dvb), dbuf(lseb)
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := &cudnnMem{c: c}
	gq, gk, gv := mem.out(scrDQ, dq), mem.out(scrDK, dk), mem.out(scrDV, dv)
	stats := lse.ptr()
	switch {
	case blk.ragged:
		stats = mem.at(scrStats, int(4*spec.B*spec.H*spec.SQ))
	case stats%16 != 0:
		stats = mem.at(scrStats, 4*lse.n)
	}
	ws := mem.workspace(p)
	if mem.err != nil {
		c.cudnnOwn(true, mem.err)
		return false
	}
	fp16 := spec.IO == cuda.Half
	hq, hk, hv := c.operand(0, qb, sh, fp16), c.operand(1, kb, sh, fp16), c.operand(2, vb, sh, fp16)
	ho, hdo := c.operand(3, ob, sh, fp16), c.operand(4, dob, sh, fp16)
	if blk.ragged {
		c.memset32(gq, 0, dq.n)
	}
	if blk.ragged || cudnnKeysUnseen(sh, blk) {
		c.memset32(gk, 0, dk.n)
		c.memset32(gv, 0, dv.n)
	}
	ptrs := map[int64]cuda.Ptr{cuda.UIDQ: hq, cuda.UIDK: hk, cuda.UIDV: hv, cuda.UIDO: ho, cuda.UIDdO: hdo,
		cuda.UIDStats: stats, cuda.UIDdQ: gq, cuda.UIDdK: gk, cuda.UIDdV: gv}
	switch {
	case blk.ragged:
		rowmap := c.raggedPtrs(ptrs, blk, sh)
		// the padded rows must hold finite statistics: −Inf − (−Inf) is NaN in the masked scores
		c.memset32(stats, 0, int(spec.B*spec.H*spec.SQ))
		c.launch("df_lse_scatter", ewGrid(sh.NQ*sh.Heads), 1, ewThreads, 0, stats, lse, rowmap, int32(sh.NQ), int32(sh.Heads), int32(spec.SQ))
	case stats != lse.ptr():
		must(c.dev.DtoD(stats, lse.ptr(), 4*lse.n))
	}
	if spec.BackwardWorkaround() {
		// seq_len_q and seq_len_kv, each at a 16-byte boundary
		ip := c.uploadInts([]int32{int32(spec.SQ), 0, 0, 0, int32(spec.SKV)})
		ptrs[cuda.UIDSeqQ], ptrs[cuda.UIDSeqKV] = ip, ip+16
	}
	c.cudnnExecute(p, ptrs, ws)
	c.copyOut(dq, gq)
	c.copyOut(dk, gk)
	c.copyOut(dv, gv)
	c.cudnnRan(blk, true)
	runtime.KeepAlive([]Buf{dqb, dkb, dvb, qb, kb, vb, ob, dob, lseb})
	return true
}

// cudnnKeysUnseen reports whether some key of block sh, which classifyCUDNN made blk (not
// ragged: every query sees a key), is visible to no query: cuDNN need not write its rows of dK
// and dV. A full block's keys are all seen; in the others the keys are at consecutive positions
// and query i sees the interval [QStart[i], QPos[i]] of them.
func cudnnKeysUnseen(sh AttnShape, blk cudnnBlock) bool {
	if !sh.Causal || blk.kind == "full" || sh.NK == 0 {
		return false
	}
	k0 := sh.KPos[0]
	cover := make([]int32, sh.NK+1) // the change in the number of queries seeing key j, at j
	for i := range sh.NQ {
		hi := min(sh.NK-1, int(sh.QPos[i]-k0))
		lo := 0
		if sh.QStart != nil {
			lo = max(0, int(sh.QStart[i]-k0))
		}
		if lo <= hi {
			cover[lo]++
			cover[hi+1]--
		}
	}
	seen := int32(0)
	for j := range sh.NK {
		if seen += cover[j]; seen == 0 {
			return true
		}
	}
	return false
}
