//go:build cuda

package kernels

import (
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"distflash/kernels/cuda"
)

// CUDA is the GPU backend (build tag cuda): the kernels of kernels/cuda/*.cu, compiled to PTX
// by scripts/build_cuda.sh and embedded in the binary, launched through the CUDA driver API, and
// GEMMs through cuBLAS. All work of one backend is queued, in call order, on one stream of the
// device's primary context; Download and the reductions (SumSquares, AllFinite) wait for it.
// Kernel errors are therefore reported (as panics, like every Backend failure) by the next
// call that waits.
//
// Numerics. At the default precision (FP32) every kernel computes in float32 or float64 and
// agrees with the CPU backend to a few ulps: the elementwise kernels reproduce the CPU's order
// of float32 operations (kernels/cuda/common.cuh), reductions accumulate in float64 over a fixed
// partition (bit-reproducible run to run, as on the CPU), EmbeddingBackward adds in the CPU's
// order (bit-identical), MatMul is cuBLAS SGEMM without TF32, and attention runs in float32 on
// CUDA cores. At BF16 or FP16 precision (setPrecision; kernels.Backend's SetMatMulPrecision once
// that method exists) MatMul rounds its operands to 16 bits inside cuBLAS and accumulates in
// float32, and attention runs the tensor-core FlashAttention-2 kernels of attn_mma.cu (16-bit
// q, k, v, dO, P and dS operands, float32 accumulation and state) for head dimensions 32, 64
// and 128. Buffers stay float32 at the interface in every mode, but for attention operands a
// 16-bit run's schedules pass packed (AttnShape.Operands), which the kernels read as they are.
// The 16-bit step's methods (MatMulHalf, AttnForwardHalf, …) read and write packed buffers as
// the plain bf16/fp16 arrays they are on the device: MatMulHalf is cublasGemmEx on 16-bit A and
// B (tensor cores, float32 accumulation), the attention cuDNN's graphs on the caller's buffers
// (cuda_attn16.go).
//
// A CUDA backend is meant to be driven by one goroutine (one per rank); its methods are
// nevertheless safe to call concurrently.
type CUDA struct {
	counters Counters
	dev      gpuDevice
	info     deviceInfo
	sigs     map[string][]string // parameter types of every kernel, from the PTX (ptxSignatures)

	mu     sync.Mutex // guards the scratch buffers and prec
	prec   cudaPrec
	ints   *cuda.Mem    // positions, ids, targets, tile bounds
	f64s   *cuda.Mem    // reduction partials, RoPE frequencies
	flag   *cuda.Mem    // AllFinite's flag
	segs   *cuda.Mem    // AdamWSegments' table
	halves [5]*cuda.Mem // 16-bit operands of the attention: q, k, v, dO (or O), and a packed dO realigned

	dkdvPart  *cuda.Mem // the own dK/dV kernel's partials (planDKDV; guarded by mu)
	dkdvSplit int       // forces the dK/dV kernel's split when > 0 (tests; planDKDV's rule otherwise)

	dnn cudnnState // cuDNN's fused attention (cuda_cudnn.go)

	a16mu  sync.Mutex    // guards a16 (taken before mu)
	a16    attn16Scratch // the float32 state of the 16-bit attention's own path (cuda_attn16.go)
	step16 halfState     // the 16-bit step's state on the device, guarded by mu: RoPE tables (cuda_half.go)
}

// ptxKernels lists the embedded modules and the kernels each defines: the backend loads every
// module named here (moduleNames), so a new kernels/cuda/NAME.cu is one entry more.
var ptxKernels = map[string][]string{
	"elementwise": {
		"df_add", "df_scale", "df_sumsq_partial", "df_allfinite", "df_embedding", "df_embedding_bwd",
		"df_rmsnorm", "df_rmsnorm_bwd_dx", "df_rmsnorm_bwd_dw_partial", "df_rmsnorm_bwd_dw_final",
		"df_rope", "df_swiglu", "df_swiglu_bwd", "df_xent", "df_adamw", "df_round", "df_pack_half",
		"df_unpack_half", "df_to_half", "df_add_rmsnorm", "df_swiglu_bwd_act", "df_adamw_multi",
	},
	"attn_f32": {
		"df_attn_merge", "df_attn_finish", "df_attn_prep", "df_attn_prep16", "df_attn_fwd_f32", "df_attn_bwd_dq_f32",
		"df_attn_bwd_dkdv_f32",
	},
	"attn_mma": mmaKernelNames(),
	"cudnn_aux": {
		"df_cudnn_oprime", "df_add_half3", "df_cudnn_fold", "df_lse_scatter",
	},
	"half": {
		"df_embedding16", "df_rmsnorm16", "df_rmsnorm16_bwd", "df_rmsnorm16_dw", "df_rope_qkv16", "df_swiglu16",
		"df_swiglu16_bwd", "df_xent16", "df_gradstats", "df_adamw_multi16",
	},
}

// mmaKernelNames lists the kernels of attn_mma.cu: the tensor-core attention kernels and the
// reduction of the dK/dV kernel's partials.
func mmaKernelNames() []string {
	var names []string
	for _, f := range []string{"bf16", "f16"} {
		for _, hd := range mmaHeadDims {
			for _, k := range []string{"fwd", "bwd_dq", "bwd_dkdv"} {
				names = append(names, fmt.Sprintf("df_attn_%s_%s_hd%d", k, f, hd))
			}
		}
	}
	return append(names, "df_attn_dkdv_reduce")
}

// NewCUDA opens CUDA device number device (0 is the first GPU) and loads the backend's kernels.
// It fails when there is no usable driver or device, when the device is older than compute
// capability 8.0 (the attention kernels use bf16 tensor-core instructions), or when the driver
// cannot compile the embedded PTX.
func NewCUDA(device int) (Backend, error) {
	c, err := newCUDA(device)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// gpuDevice is what the backend needs of a GPU: a *cuda.Device, or a recording fake in the
// host-side tests (cuda_fake_test.go).
type gpuDevice interface {
	Alloc(bytes int) (*cuda.Mem, error)
	HtoD(dst cuda.Ptr, src unsafe.Pointer, bytes int) error
	DtoH(dst unsafe.Pointer, src cuda.Ptr, bytes int) error
	DtoD(dst, src cuda.Ptr, bytes int) error
	Memset32(dst cuda.Ptr, v uint32, n int) error
	Sync() error
	Launch(name string, gx, gy, bx, smem int, args []uint64) error
	Gemm(g cuda.Gemm, a, b, c cuda.Ptr, alpha, beta float32, compute cuda.Compute) error
	NewEvent() (*cuda.Event, error)
	RecordEvent(e *cuda.Event) error
	EventSeconds(from, to *cuda.Event) (float64, error)
	Close() error
}

// deviceInfo describes the GPU.
type deviceInfo struct {
	name              string
	major, minor, sms int
	smemOptin         int // bytes of shared memory a block may use
}

func newCUDA(ordinal int) (*CUDA, error) {
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("kernels: cuda: %w", err)
	}
	fail := func(err error) (*CUDA, error) {
		d.Close()
		return nil, fmt.Errorf("kernels: cuda device %d (%s): %w", ordinal, d.Name, err)
	}
	if _, err := ptxArch(d.Major, d.Minor); err != nil {
		return fail(err)
	}
	sigs := map[string][]string{}
	mode, err := AttentionFromEnv()
	if err != nil {
		return fail(err)
	}
	cubins := os.Getenv("DISTFLASH_CUDA_IMAGE") == "cubin"
	for _, name := range moduleNames() {
		ptx, err := cuda.PTX(name)
		if err != nil {
			return fail(err)
		}
		img, imgFile := ptx, cuda.PTXFile(name)
		if cf := cubinFile(name, d.Major, d.Minor); cubins && cf != "" {
			if img, err = cuda.Image.ReadFile(cf); err != nil {
				return fail(err)
			}
			imgFile = cf
		}
		if err := d.LoadModule(imgFile, img, ptxKernels[name]); err != nil {
			return fail(err)
		}
		for k, sig := range ptxSignatures(string(ptx)) {
			sigs[k] = sig
		}
	}
	c := newCUDAOn(d, deviceInfo{name: d.Name, major: d.Major, minor: d.Minor, sms: d.SMs, smemOptin: d.SmemOptin}, sigs)
	c.dnn.mode = mode
	return c, nil
}

// moduleNames are the modules the backend loads, sorted: those of ptxKernels, each
// scripts/build_cuda.sh's image of one kernels/cuda/NAME.cu (cuda.PTX, cuda.Cubin).
func moduleNames() []string { return slices.Sorted(maps.Keys(ptxKernels)) }

// cubinFile names, in cuda.Image, the cubin of module name for a GPU of compute capability
// major.minor, or "" when none runs on it: sm_80 code runs on 8.x, sm_90a code on 9.0 only.
// The backend loads cubins instead of PTX when DISTFLASH_CUDA_IMAGE=cubin (the default, PTX,
// is JIT-compiled by the driver).
func cubinFile(name string, major, minor int) string {
	switch {
	case major == 8:
		return cuda.CubinFile(name, "sm_80")
	case major == 9 && minor == 0:
		return cuda.CubinFile(name, "sm_90a")
	}
	return ""
}

// newCUDAOn returns a backend on an opened device whose kernels have the given signatures.
func newCUDAOn(d gpuDevice, info deviceInfo, sigs map[string][]string) *CUDA {
	c := &CUDA{dev: d, info: info, sigs: sigs}
	c.flag = c.alloc(4)
	c.initCUDNN()
	return c
}

// ptxArch returns the virtual architecture of the embedded PTX (cuda.PTXTarget, compute_80),
// which the driver JIT-compiles for every GPU of compute capability 8.0 or later, or an error
// for an older GPU.
func ptxArch(major, minor int) (string, error) {
	if major < 8 {
		return "", fmt.Errorf("compute capability %d.%d: the CUDA backend needs 8.0 or later (bf16 tensor cores)", major, minor)
	}
	return cuda.PTXTarget, nil
}

// Close releases the device's stream, modules, cuBLAS handle and context reference. Buffers
// of the backend must not be used afterwards.
func (c *CUDA) Close() error {
	err := c.dev.Sync()
	if derr := c.dnn.close(); err == nil {
		err = derr
	}
	if cerr := c.dev.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kernels: cuda: %w", err)
	}
	return nil
}

// Device describes the GPU, e.g. "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)".
func (c *CUDA) Device() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs)", c.info.name, c.info.major, c.info.minor, c.info.sms)
}

// Sync waits until every queued kernel and copy has finished (for timing).
func (c *CUDA) Sync() { must(c.dev.Sync()) }

// must panics with a kernels-prefixed message when a driver call failed. The Backend interface
// has no error results: a failed call on a working device is out of memory or a bug.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("kernels: cuda: %v", err))
	}
}

// devPtr is a device address.
type devPtr = cuda.Ptr

func (c *CUDA) alloc(bytes int) *cuda.Mem {
	m, err := c.dev.Alloc(bytes)
	must(err)
	return m
}

func (c *CUDA) htod(dst devPtr, src unsafe.Pointer, bytes int) { must(c.dev.HtoD(dst, src, bytes)) }
func (c *CUDA) dtoh(dst unsafe.Pointer, src devPtr, bytes int) { must(c.dev.DtoH(dst, src, bytes)) }
func (c *CUDA) memset32(dst devPtr, v uint32, n int)           { must(c.dev.Memset32(dst, v, n)) }

// launch queues a kernel after checking args against the kernel's parameter types in the PTX
// (a Go argument of the wrong width would otherwise shift every later parameter silently).
func (c *CUDA) launch(name string, gx, gy, bx, smem int, args ...any) {
	if err := checkSignature(name, c.sigs[name], args); err != nil {
		panic(fmt.Sprintf("kernels: cuda: %v", err))
	}
	must(c.dev.Launch(name, gx, gy, bx, smem, kernelArgs(args)))
	runtime.KeepAlive(args) // the buffers among args are reachable until the launch is queued
}

// setPrecision sets the precision of MatMul operands and of the attention products (see CUDA).
func (c *CUDA) setPrecision(p cudaPrec) {
	if p > precFP16 {
		panic(fmt.Sprintf("kernels: cuda precision %d", p))
	}
	c.mu.Lock()
	c.prec = p
	c.mu.Unlock()
}

// precision returns the current precision.
func (c *CUDA) precision() cudaPrec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prec
}

// cudaBuf is a view of a device allocation: n float32 elements from element off.
type cudaBuf struct {
	mem    *cuda.Mem
	off, n int
}

func (b cudaBuf) Len() int { return b.n }

// ptr is the device address of the view (0 for the zero value, which stands for a nil Buf).
func (b cudaBuf) ptr() devPtr {
	if b.mem == nil {
		return 0
	}
	return b.mem.Ptr + devPtr(4*b.off)
}

// dbuf returns the device buffer behind b; it panics for a buffer of another backend.
func dbuf(b Buf) cudaBuf {
	d, ok := b.(cudaBuf)
	if !ok {
		panic(fmt.Sprintf("kernels: %T is not a CUDA buffer", b))
	}
	return d
}

// dptr is dbuf(b) with a length check; a nil Buf gives the zero cudaBuf (a null pointer).
// Kernel launches take the cudaBuf itself, not its address, so that its allocation stays
// reachable (and is not returned to the pool by its cleanup) until the launch is queued.
func dptr(what string, b Buf, n int) cudaBuf {
	if b == nil {
		return cudaBuf{}
	}
	d := dbuf(b)
	if d.n != n {
		panic(fmt.Sprintf("kernels: %s has %d elements, want %d", what, d.n, n))
	}
	return d
}

// grow returns a device allocation of at least bytes, reusing *m when it is large enough.
// Reuse is safe because all work is ordered on one stream.
func (c *CUDA) grow(m **cuda.Mem, bytes int) devPtr {
	if *m == nil || (*m).Bytes < bytes {
		*m = c.alloc(max(bytes, 4096))
	}
	return (*m).Ptr
}

// uploadInts copies xs into the int scratch buffer and returns its device address (c.mu held).
func (c *CUDA) uploadInts(xs []int32) devPtr {
	p := c.grow(&c.ints, 4*len(xs))
	if len(xs) > 0 {
		c.htod(p, unsafe.Pointer(&xs[0]), 4*len(xs))
	}
	return p
}

// Name implements Backend.
func (c *CUDA) Name() string { return "cuda" }

// DeviceName is the GPU's name as the driver gives it (e.g. "NVIDIA H200"): train looks up the
// peak that MFU divides by with it.
func (c *CUDA) DeviceName() string { return c.info.name }

// Counters implements Backend.
func (c *CUDA) Counters() *Counters { return &c.counters }

// Alloc implements Backend.
func (c *CUDA) Alloc(n int) Buf {
	if n < 0 {
		panic(fmt.Sprintf("kernels: alloc of %d elements", n))
	}
	return cudaBuf{mem: c.alloc(4 * n), n: n}
}

// Slice implements Backend.
func (c *CUDA) Slice(b Buf, off, n int) Buf {
	d := dbuf(b)
	if off < 0 || n < 0 || off+n > d.n {
		panic(fmt.Sprintf("kernels: slice [%d, %d) of a buffer of %d elements", off, off+n, d.n))
	}
	return cudaBuf{mem: d.mem, off: d.off + off, n: n}
}

// Upload implements Backend.
func (c *CUDA) Upload(dst Buf, src []float32) {
	p := dptr("upload", dst, len(src))
	if len(src) > 0 {
		c.htod(p.ptr(), unsafe.Pointer(&src[0]), 4*len(src))
	}
	runtime.KeepAlive(p)
}

// Download implements Backend.
func (c *CUDA) Download(dst []float32, src Buf) {
	p := dptr("download", src, len(dst))
	if len(dst) == 0 {
		must(c.dev.Sync())
		return
	}
	c.dtoh(unsafe.Pointer(&dst[0]), p.ptr(), 4*len(dst))
	runtime.KeepAlive(p)
}

// Zero implements Backend.
func (c *CUDA) Zero(b Buf) {
	d := dbuf(b)
	c.memset32(d.ptr(), 0, d.n)
	runtime.KeepAlive(d)
}

// Copy implements Backend.
func (c *CUDA) Copy(dst, src Buf) {
	d := dbuf(dst)
	s := dptr("copy", src, d.n)
	must(c.dev.DtoD(d.ptr(), s.ptr(), 4*d.n))
	runtime.KeepAlive(d)
	runtime.KeepAlive(s)
}

// Add implements Backend.
func (c *CUDA) Add(dst, a, b Buf) {
	n := dbuf(dst).n
	pa, pb := dptr("add a", a, n), dptr("add b", b, n)
	c.launch("df_add", ewGrid(n), 1, ewThreads, 0, dbuf(dst), pa, pb, int64(n))
}

// Scale implements Backend.
func (c *CUDA) Scale(b Buf, s float32) {
	d := dbuf(b)
	c.launch("df_scale", ewGrid(d.n), 1, ewThreads, 0, d, s, int64(d.n))
}

// SumSquares implements Backend: float64 partial sums over a partition fixed by the length,
// added in order on the host.
func (c *CUDA) SumSquares(b Buf) float64 {
	d := dbuf(b)
	if d.n == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := sumsqParts(d.n)
	p := c.grow(&c.f64s, 8*parts)
	c.launch("df_sumsq_partial", parts, 1, ewThreads, 0, d, int64(d.n), p)
	host := make([]float64, parts)
	c.dtoh(unsafe.Pointer(&host[0]), p, 8*parts)
	var s float64
	for _, v := range host {
		s += v
	}
	return s
}

// AllFinite implements Backend.
func (c *CUDA) AllFinite(b Buf) bool {
	d := dbuf(b)
	if d.n == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.memset32(c.flag.Ptr, 0, 1)
	c.launch("df_allfinite", ewGrid(d.n), 1, ewThreads, 0, d, int64(d.n), c.flag.Ptr)
	var bad int32
	c.dtoh(unsafe.Pointer(&bad), c.flag.Ptr, 4)
	return bad == 0
}

// MatMul implements Backend through cublasGemmEx (see cublasPlan for the layout mapping).
func (c *CUDA) MatMul(cb, ab, bb Buf, m, n, k int, transA, transB bool, beta float32) {
	C, A, B := dptr("matmul C", cb, m*n), dptr("matmul A", ab, m*k), dptr("matmul B", bb, k*n)
	c.counters.MatMulFLOPs.Add(int64(2 * m * n * k))
	if m == 0 || n == 0 {
		return
	}
	if k == 0 { // C = beta·C; C is not read when beta is 0 (BLAS rule: NaNs are overwritten)
		if beta == 0 {
			c.Zero(cb)
		} else {
			c.Scale(cb, beta)
		}
		return
	}
	g := cublasPlan(m, n, k, transA, transB)
	must(c.dev.Gemm(g, B.ptr(), A.ptr(), C.ptr(), 1, beta, cuda.Compute(c.precision())))
	runtime.KeepAlive([]cudaBuf{A, B, C})
}

// MatMulHalf implements Backend through cublasGemmEx with A and B of cuBLAS type CUDA_R_16BF
// (p BF16) or CUDA_R_16F (FP16), read where they are (a packed buffer is a plain 16-bit array;
// leading dimensions count 16-bit values), and C of the same type (cHalf) or CUDA_R_32F, with
// CUBLAS_COMPUTE_32F: tensor cores, float32 accumulation, alpha 1 and the float32 beta given,
// the sum rounded once into a 16-bit C (the handle disallows reduced-precision split-K
// reductions, kernels/cuda/driver.go). The layout mapping is MatMul's (cublasPlan).
func (c *CUDA) MatMulHalf(cb, ab, bb Buf, m, n, k int, transA, transB bool, beta float32, p Precision, cHalf bool) {
	mustHalf("matmul", p)
	packed := func(n int) int { return (n + 1) / 2 }
	A, B := dptr("matmul A (packed)", ab, packed(m*k)), dptr("matmul B (packed)", bb, packed(k*n))
	ct := cuda.Float32
	cn := m * n
	if cHalf {
		ct, cn = halfType(p), packed(m*n)
	}
	C := dptr("matmul C", cb, cn)
	c.counters.MatMulFLOPs.Add(int64(2 * m * n * k))
	if m == 0 || n == 0 {
		return
	}
	if k == 0 { // C = beta·C; C is not read when beta is 0 (BLAS rule: NaNs are overwritten)
		switch {
		case beta == 0:
			c.Zero(cb)
		case beta == 1:
		case cHalf:
			x := c.Alloc(m * n)
			c.unpack16(x, cb, p == FP16)
			c.Scale(x, beta)
			c.pack16(cb, x, p == FP16)
		default:
			c.Scale(cb, beta)
		}
		return
	}
	g := cublasPlan(m, n, k, transA, transB)
	g.AType, g.BType, g.CType = halfType(p), halfType(p), ct
	must(c.dev.Gemm(g, B.ptr(), A.ptr(), C.ptr(), 1, beta, cuda.ComputeFP32))
	runtime.KeepAlive([]cudaBuf{A, B, C})
}

// halfType is the cuBLAS and cuDNN element type of 16-bit precision p.
func halfType(p Precision) cuda.DataType {
	if p == FP16 {
		return cuda.Half
	}
	return cuda.BFloat16
}

// Embedding implements Backend.
func (c *CUDA) Embedding(out, table Buf, ids []int32, dim int) {
	o := dptr("embedding out", out, len(ids)*dim)
	t := dbuf(table)
	vocab := t.n / dim
	checkIDs(ids, vocab)
	if len(ids) == 0 || dim == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.uploadInts(ids)
	c.launch("df_embedding", rowGrid(len(ids)), 1, ewThreads, 0, o, t, p, int32(len(ids)), int32(dim))
}

// checkIDs panics on a token id outside [0, vocab), with the CPU backend's message.
func checkIDs(ids []int32, vocab int) {
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			panic(fmt.Sprintf("kernels: token id %d outside vocabulary of %d", id, vocab))
		}
	}
}

// EmbeddingBackward implements Backend: the tokens of each id are added in token order, so
// the result is bit-identical to the CPU's.
func (c *CUDA) EmbeddingBackward(dtable, dout Buf, ids []int32, dim int) {
	do := dptr("embedding dout", dout, len(ids)*dim)
	dt := dbuf(dtable)
	checkIDs(ids, dt.n/max(dim, 1))
	if len(ids) == 0 || dim == 0 {
		return
	}
	order, start := embedGroups(ids)
	ints := make([]int32, 0, len(ids)+len(order)+len(start))
	ints = append(append(append(ints, ids...), order...), start...)
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.uploadInts(ints)
	groups := len(start) - 1
	c.launch("df_embedding_bwd", rowGrid(groups), 1, ewThreads, 0, dt, do,
		p, p+devPtr(4*len(ids)), p+devPtr(4*(len(ids)+len(order))), int32(groups), int32(dim))
}

// RMSNorm implements Backend.
func (c *CUDA) RMSNorm(out, rstd, x, w Buf, rows, dim int, eps float32) {
	xp, op := dptr("rmsnorm x", x, rows*dim), dptr("rmsnorm out", out, rows*dim)
	rp, wp := dptr("rmsnorm rstd", rstd, rows), dptr("rmsnorm w", w, dim)
	if rows == 0 {
		return
	}
	c.launch("df_rmsnorm", rowGrid(rows), 1, ewThreads, 0, op, rp, xp, wp, int32(rows), int32(dim), eps)
}

// RMSNormBackward implements Backend: dx per row, dw from float64 partial sums over a fixed
// partition of the rows, added in order.
func (c *CUDA) RMSNormBackward(dx, dw, dout, x, w, rstd Buf, rows, dim int) {
	dxp, dop := dptr("rmsnorm dx", dx, rows*dim), dptr("rmsnorm dout", dout, rows*dim)
	dwp, xp := dptr("rmsnorm dw", dw, dim), dptr("rmsnorm x", x, rows*dim)
	wp, rp := dptr("rmsnorm w", w, dim), dptr("rmsnorm rstd", rstd, rows)
	if rows == 0 || dim == 0 {
		return
	}
	c.launch("df_rmsnorm_bwd_dx", rowGrid(rows), 1, ewThreads, 0, dxp, dop, xp, wp, rp, int32(rows), int32(dim))
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := rmsParts(rows)
	part := c.grow(&c.f64s, 8*parts*dim)
	c.launch("df_rmsnorm_bwd_dw_partial", ceilDiv(dim, ewThreads), parts, ewThreads, 0, part, dop, xp, rp, int32(rows), int32(dim))
	c.launch("df_rmsnorm_bwd_dw_final", ceilDiv(dim, ewThreads), 1, ewThreads, 0, dwp, part, int32(dim), int32(parts))
}

// RoPE implements Backend. The table's inverse frequencies are uploaded as they are (float64);
// angles, sines and cosines and their product with the scale are computed in double on the
// device, as on the CPU.
func (c *CUDA) RoPE(x Buf, pos []int32, heads, headDim int, t RoPETable, inverse bool) {
	xp := dptr("rope x", x, len(pos)*heads*headDim)
	t.check(headDim)
	if len(pos) == 0 || headDim < 2 {
		return
	}
	half := headDim / 2
	c.mu.Lock()
	defer c.mu.Unlock()
	fp := c.grow(&c.f64s, 8*half)
	c.htod(fp, unsafe.Pointer(&t.InvFreq[0]), 8*half)
	pp := c.uploadInts(pos)
	inv := int32(0)
	if inverse {
		inv = 1
	}
	c.launch("df_rope", rowGrid(len(pos)), 1, ewThreads, 2*half*4, xp, pp, fp, int32(len(pos)), int32(heads), int32(headDim), inv, t.Scale)
}

// SwiGLU implements Backend.
func (c *CUDA) SwiGLU(out, gate, up Buf) {
	n := dbuf(out).n
	g, u := dptr("swiglu gate", gate, n), dptr("swiglu up", up, n)
	c.launch("df_swiglu", ewGrid(n), 1, ewThreads, 0, dbuf(out), g, u, int64(n))
}

// SwiGLUBackward implements Backend.
func (c *CUDA) SwiGLUBackward(dgate, dup, dout, gate, up Buf) {
	n := dbuf(dout).n
	dg, du := dptr("swiglu dgate", dgate, n), dptr("swiglu dup", dup, n)
	g, u := dptr("swiglu gate", gate, n), dptr("swiglu up", up, n)
	c.launch("df_swiglu_bwd", ewGrid(n), 1, ewThreads, 0, dg, du, dbuf(dout), g, u, int64(n))
}

// CrossEntropy implements Backend.
func (c *CUDA) CrossEntropy(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32) {
	rows := len(targets)
	lg, ls := dptr("cross-entropy logits", logits, rows*vocab), dptr("cross-entropy losses", losses, rows)
	dl := dptr("cross-entropy dlogits", dlogits, rows*vocab) // 0 when dlogits is nil
	checkTargets(targets, vocab)
	if rows == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := c.uploadInts(targets)
	c.launch("df_xent", rowGrid(rows), 1, ewThreads, 0, ls, dl, lg, tp, int32(rows), int64(vocab), dscale)
}

// AdamW implements Backend, with the CPU's float32 arithmetic.
func (c *CUDA) AdamW(pb, gb, mb, vb Buf, hp AdamWStep, decay bool) {
	n := dbuf(pb).n
	g, m, v := dptr("adamw g", gb, n), dptr("adamw m", mb, n), dptr("adamw v", vb, n)
	c1 := float32(1 - math.Pow(hp.Beta1, float64(hp.Step)))
	c2 := float32(1 - math.Pow(hp.Beta2, float64(hp.Step)))
	wd := float32(0)
	if decay {
		wd = float32(hp.WeightDecay)
	}
	c.launch("df_adamw", ewGrid(n), 1, ewThreads, 0, dbuf(pb), g, m, v, int64(n),
		float32(hp.Beta1), float32(hp.Beta2), c1, c2, float32(hp.LR), float32(hp.Eps), hp.GradScale, wd)
}

// SetMatMulPrecision implements Backend: MatMul operands are rounded to p by cuBLAS, and,
// unlike the CPU backend, whose setting covers MatMul only, BF16/FP16 also select the
// tensor-core attention kernels. (cudaPrec's values mirror Precision's.)
func (c *CUDA) SetMatMulPrecision(p Precision) { c.setPrecision(cudaPrec(p)) }

// MatMulPrecision implements Backend.
func (c *CUDA) MatMulPrecision() Precision { return Precision(c.precision()) }

// Round implements Backend.
func (c *CUDA) Round(b Buf, p Precision) {
	if p != FP32 {
		c.round16(b, p == FP16)
	}
}

// PackHalf implements Backend.
func (c *CUDA) PackHalf(dst, src Buf, p Precision) { c.pack16(dst, src, p == FP16) }

// UnpackHalf implements Backend.
func (c *CUDA) UnpackHalf(dst, src Buf, p Precision) { c.unpack16(dst, src, p == FP16) }

// round16 rounds every element of b to the nearest bfloat16 (fp16 false) or binary16 value:
// the device side of Backend.Round.
func (c *CUDA) round16(b Buf, fp16 bool) {
	d := dbuf(b)
	c.launch("df_round", ewGrid(d.n), 1, ewThreads, 0, d, int64(d.n), boolInt(fp16))
}

// pack16 writes the 16-bit encodings of src two per element of dst (element 2i in the low
// half): the device side of Backend.PackHalf.
func (c *CUDA) pack16(dst, src Buf, fp16 bool) {
	s := dbuf(src)
	d := dptr("pack dst", dst, (s.n+1)/2)
	c.launch("df_pack_half", ewGrid((s.n+1)/2), 1, ewThreads, 0, d, s, int64(s.n), boolInt(fp16))
}

// unpack16 is the inverse of pack16: the device side of Backend.UnpackHalf.
func (c *CUDA) unpack16(dst, src Buf, fp16 bool) {
	d := dbuf(dst)
	s := dptr("unpack src", src, (d.n+1)/2)
	c.launch("df_unpack_half", ewGrid(d.n), 1, ewThreads, 0, d, s, int64(d.n), boolInt(fp16))
}

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

var _ Backend = (*CUDA)(nil)
