//go:build cuda

package kernels

// Host-side planning of the CUDA backend, in plain Go so that it is unit-tested without a GPU
// (cuda_geom_test.go): launch geometry, the tiles of the attention kernels and their causal
// bounds, the row-major → column-major mapping of cuBLAS calls, the grouping of embedding
// gradients and the encoding of kernel parameters. The constants must match the .cu sources.

import (
	"fmt"
	"math"
	"regexp"
	"slices"

	"distflash/kernels/cuda"
)

// cudaPrec is the precision of the operands of the CUDA backend's products (GEMMs and the
// attention's tensor-core products). Its values are those of kernels.Precision (FP32, BF16,
// FP16), so that the backend's SetMatMulPrecision is a conversion.
type cudaPrec uint8

const (
	precFP32 cudaPrec = iota // exact float32 (cuBLAS CUBLAS_COMPUTE_32F, attention on CUDA cores)
	precBF16                 // bfloat16 operands, float32 accumulation (tensor cores)
	precFP16                 // binary16 operands, float32 accumulation (tensor cores)
)

func (p cudaPrec) String() string {
	switch p {
	case precFP32:
		return "fp32"
	case precBF16:
		return "bf16"
	case precFP16:
		return "fp16"
	}
	return fmt.Sprintf("cudaPrec(%d)", uint8(p))
}

// Launch geometry of the elementwise kernels (grid-stride loops: any grid is correct, this one
// fills the GPU without launching more blocks than elements).
const (
	ewThreads   = 256     // threads per block of elementwise and row kernels
	maxGridX    = 1 << 20 // cap on blocks of grid-stride kernels
	warpThreads = 32
)

// ewGrid is the number of blocks for a grid-stride loop over n elements.
func ewGrid(n int) int {
	return int(min(max((int64(n)+ewThreads-1)/ewThreads, 1), maxGridX))
}

// rowGrid is the number of blocks for a block-per-row kernel over rows rows.
func rowGrid(rows int) int { return min(max(rows, 1), maxGridX) }

// warpRowGrid is the number of blocks for a warp-per-row kernel (ewThreads/32 rows a block).
func warpRowGrid(rows int) int {
	per := ewThreads / warpThreads
	return int(min(max((int64(rows)+int64(per)-1)/int64(per), 1), math.MaxInt32))
}

// sumsqParts is the number of partial sums of SumSquares over n elements. It depends only on n,
// so the float64 result is the same run to run.
func sumsqParts(n int) int { return int(min(max((int64(n)+65535)/65536, 1), 1024)) }

// rmsParts is the number of row partitions of the RMSNorm weight gradient (depends on rows only).
func rmsParts(rows int) int { return min(max(rows, 1), 64) }

// cublasPlan maps the row-major product of MatMul, C[m,n] = op(A)·op(B), onto column-major
// cuBLAS: a row-major X with row stride ld is the column-major Xᵀ with leading dimension ld, so
// the call computes Cᵀ = op(B)ᵀ·op(A)ᵀ. The returned Gemm's A operand is therefore MatMul's B
// and its B operand MatMul's A. A dimension past cuBLAS's 32-bit int panics.
func cublasPlan(m, n, k int, transA, transB bool) cuda.Gemm {
	for _, d := range []int{m, n, k} {
		if d > math.MaxInt32 {
			panic(fmt.Sprintf("kernels: matmul dimension %d exceeds cuBLAS's 32-bit range", d))
		}
	}
	lda, ldb := leadingDims(m, n, k, transA, transB)
	return cuda.Gemm{TransA: transB, TransB: transA, M: n, N: m, K: k, LDA: ldb, LDB: lda, LDC: n}
}

// kernelArgs encodes kernel parameters one per 64-bit slot, as Device.Launch passes them: device
// pointers (devPtr, or a cudaBuf for its address) and int64 (C long long) fill a slot, int32 (C int) and float32 its low half, float64
// (C double) all of it. Go int is refused: the width of a C int parameter must be explicit.
func kernelArgs(args []any) []uint64 {
	out := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case devPtr:
			out[i] = uint64(v)
		case cudaBuf:
			out[i] = uint64(v.ptr())
		case int32:
			out[i] = uint64(uint32(v))
		case int64:
			out[i] = uint64(v)
		case float32:
			out[i] = uint64(math.Float32bits(v))
		case float64:
			out[i] = math.Float64bits(v)
		default:
			panic(fmt.Sprintf("kernels: cuda kernel parameter %d has Go type %T", i, a))
		}
	}
	return out
}

// ptxSignatures reads the parameter types of every kernel entry of a PTX module, e.g.
// df_add → [u64 u64 u64 u64]: pointers and long long are u64, int u32, float f32, double f64.
func ptxSignatures(ptx string) map[string][]string {
	sigs := map[string][]string{}
	for _, m := range ptxEntry.FindAllStringSubmatch(ptx, -1) {
		var types []string
		for _, p := range ptxParam.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
		}
		sigs[m[1]] = types
	}
	return sigs
}

var (
	ptxEntry = regexp.MustCompile(`\.visible \.entry (\w+)\(([^)]*)\)`)
	ptxParam = regexp.MustCompile(`\.param \.(\w+) `)
)

// argKind is the PTX parameter type a Go kernel argument fills.
func argKind(a any) string {
	switch a.(type) {
	case devPtr, cudaBuf, int64:
		return "u64"
	case int32:
		return "u32"
	case float32:
		return "f32"
	case float64:
		return "f64"
	}
	return fmt.Sprintf("Go %T", a)
}

// checkSignature reports arguments that do not match a kernel's parameter types.
func checkSignature(name string, sig []string, args []any) error {
	if sig == nil {
		return fmt.Errorf("kernel %s: no such kernel in the loaded PTX", name)
	}
	if len(args) != len(sig) {
		return fmt.Errorf("kernel %s takes %d parameters, launched with %d", name, len(sig), len(args))
	}
	for i, a := range args {
		if k := argKind(a); k != sig[i] {
			return fmt.Errorf("kernel %s: parameter %d is .%s, launched with %s (%T)", name, i, sig[i], k, a)
		}
	}
	return nil
}

// embedGroups groups the token indices of ids by id for EmbeddingBackward: order lists the
// tokens sorted by id and, within an id, by token index; group u is order[start[u]:start[u+1]].
// Adding each group's rows in that order is the CPU's order of additions for that id.
func embedGroups(ids []int32) (order, start []int32) {
	order = make([]int32, len(ids))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return int(ids[a]) - int(ids[b]) })
	for k := range order {
		if k == 0 || ids[order[k]] != ids[order[k-1]] {
			start = append(start, int32(k))
		}
	}
	start = append(start, int32(len(order)))
	return order, start
}

// Attention tiles (attn_mma.cu, attn_f32.cu): every kernel tiles queries and keys in 64s and 32s.
const (
	attnT64    = 64
	attnT32    = 32
	attnThread = 128 // threads of an mma attention block (4 warps)
	f32Threads = 64  // threads of an f32 attention block (one query or key each)
)

// attnPlan is how one attention call runs.
type attnPlan struct {
	mma         bool   // tensor-core kernels (else float32 on CUDA cores)
	suffix      string // kernel name suffix of the mma kernels, e.g. "bf16_hd128"
	fwdBK       int    // key tile of the forward (64 mma, 32 f32)
	threads     int
	smemFwd     int // dynamic shared memory of each kernel, bytes
	smemDQ      int
	smemDKDV    int
	half        bool // operands are converted to 16 bits first
	halfIsFP16  bool
	headDim     int
	precision   cudaPrec
	description string
}

// mmaHeadDims are the head dimensions with tensor-core instantiations (attn_mma.cu).
var mmaHeadDims = []int{32, 64, 128}

// planAttn picks the attention kernels for head dimension hd at precision p: tensor cores when
// the precision is 16-bit and hd has an instantiation, float32 on CUDA cores otherwise.
func planAttn(hd int, p cudaPrec) attnPlan {
	if p != precFP32 && slices.Contains(mmaHeadDims, hd) {
		ld := hd + 8 // padded shared-memory row (conflict-free ldmatrix)
		name := "bf16"
		if p == precFP16 {
			name = "f16"
		}
		return attnPlan{
			mma: true, suffix: fmt.Sprintf("%s_hd%d", name, hd), fwdBK: attnT64, threads: attnThread,
			smemFwd:  (attnT64*ld+4*attnT64*ld)*2 + 2*attnT64*4,
			smemDQ:   (2*attnT64*ld+4*attnT32*ld)*2 + 2*attnT32*4,
			smemDKDV: (2*attnT64*ld+4*attnT32*ld)*2 + 8*attnT32*4, // lse, D, qpos, qstart: [2][32] each
			half:     true, halfIsFP16: p == precFP16, headDim: hd, precision: p,
			description: fmt.Sprintf("tensor cores, %s operands, fp32 accumulation", p),
		}
	}
	s := 2 * attnT32 * hd * 4
	return attnPlan{fwdBK: attnT32, threads: f32Threads, smemFwd: s, smemDQ: s, smemDKDV: s, headDim: hd,
		precision: precFP32, description: "fp32 on CUDA cores"}
}

// The grid of the tensor-core dK/dV kernel (attn_mma.cu): blocks of 64 keys of one kv head,
// each taking one of split interleaved shares of the (query head of the group, query tile of 32)
// iterations; shares after the first write float32 partials that df_attn_dkdv_reduce adds in
// share order. Without the split the grid is ⌈nk/64⌉ × kvHeads blocks: 512 at 8K for the
// 0.85B's 4 kv heads, under two waves of an H100's 264 resident blocks, with the causal
// triangle's heaviest blocks in the tail.
const (
	dkdvWaves    = 4  // the waves of resident blocks the grid fills at least (when split allows)
	dkdvMaxSplit = 16 // most shares per (key tile, kv head)
	smRegisters  = 65536
	smMaxBlocks  = 16 // an SM's 64 warps in blocks of 4
)

// mmaDKDVRegisters is the registers per thread of the dK/dV kernel at each head dimension, the
// most over bf16/fp16 and sm_80/sm_90a (kernels/cuda/image/PTXAS.md; TestCUDAHostDKDVPlan
// holds them to it).
var mmaDKDVRegisters = map[int]int{32: 128, 64: 164, 128: 239}

// dkdvResident is how many blocks of the dK/dV kernel at head dimension hd one SM holds at
// once: its register file (65,536; registers are allocated per warp in units of 8 per
// thread), its shared memory (smemOptin plus the 1 KB the driver reserves per block, the
// per-SM total of A100 and H100) and 16 blocks of 4 warps. A head dimension without a kernel
// counts the most registers a thread may have (255).
func dkdvResident(hd, smem, smemOptin int) int {
	regs, ok := mmaDKDVRegisters[hd]
	if !ok {
		regs = 255
	}
	regs = (regs + 7) &^ 7
	return max(1, min(smRegisters/(regs*attnThread), (smemOptin+1024)/(smem+1024), smMaxBlocks))
}

// dkdvGrid is the launch of the tensor-core dK/dV kernel.
type dkdvGrid struct {
	tiles  int // key tiles of 64
	split  int // shares per (key tile, kv head)
	blocks int // tiles × kvHeads × split, the 1-D grid
	slots  int // blocks resident on the whole GPU at once (sms × dkdvResident)
}

// waves is how many times the grid fills the GPU's resident blocks.
func (g dkdvGrid) waves() float64 { return float64(g.blocks) / float64(g.slots) }

// partFloats is the float32 elements of the partials of shares 1..split−1 (dK and dV).
func (g dkdvGrid) partFloats(nk, kvHeads, hd int) int { return 2 * (g.split - 1) * nk * kvHeads * hd }

// planDKDV is the dK/dV grid of nq queries and nk keys in heads query heads over kvHeads kv
// heads: the rule is the least split that makes at least dkdvWaves waves of the GPU's resident
// blocks, split = ⌈dkdvWaves·slots / (tiles·kvHeads)⌉, at most dkdvMaxSplit and at most the
// iterations of a block (group · ⌈nq/32⌉); 1 when the key tiles alone fill that many waves.
// Its partials then hold fewer than dkdvWaves·slots key tiles of dK and dV: at most 69 MB at
// head dimension 128 on an H100, at any sequence length. split > 0 forces a split (tests).
func planDKDV(nq, nk, heads, kvHeads, hd, sms, smemOptin, split int) dkdvGrid {
	g := dkdvGrid{tiles: ceilDiv(nk, attnT64), slots: sms * dkdvResident(hd, planAttn(hd, precBF16).smemDKDV, smemOptin)}
	base := g.tiles * kvHeads
	if split <= 0 {
		split = min(ceilDiv(dkdvWaves*g.slots, max(base, 1)), dkdvMaxSplit, heads/kvHeads*ceilDiv(nq, attnT32))
	}
	g.split = max(split, 1)
	g.blocks = base * g.split
	return g
}

// tileBounds returns the minimum and maximum of pos over consecutive tiles of the given size.
func tileBounds(pos []int32, tile int) (mins, maxs []int32) {
	n := (len(pos) + tile - 1) / tile
	mins, maxs = make([]int32, n), make([]int32, n)
	for t := range n {
		lo, hi := pos[t*tile], pos[t*tile]
		for _, p := range pos[t*tile : min((t+1)*tile, len(pos))] {
			lo, hi = min(lo, p), max(hi, p)
		}
		mins[t], maxs[t] = lo, hi
	}
	return mins, maxs
}

// visiblePairs counts the (query, key) pairs of the bq×bk tiles that a kernel computes: all of
// them without a causal mask, else those of tiles with max(qpos of the tile) ≥ min(kpos of the
// tile) and, with a document mask, min(qstart of the tile) ≤ max(kpos of the tile): the
// kernels' skip rule.
func visiblePairs(sh AttnShape, bq, bk int) int64 {
	if !sh.Causal {
		return int64(sh.NQ) * int64(sh.NK)
	}
	_, qmax := tileBounds(sh.QPos, bq)
	kmin, kmax := tileBounds(sh.KPos, bk)
	var smin []int32
	if sh.QStart != nil {
		smin, _ = tileBounds(sh.QStart, bq)
	}
	var n int64
	for i, qm := range qmax {
		rows := int64(min(bq, sh.NQ-i*bq))
		for j, km := range kmin {
			if qm >= km && (smin == nil || smin[i] <= kmax[j]) {
				n += rows * int64(min(bk, sh.NK-j*bk))
			}
		}
	}
	return n
}

// attnInts is the int32 array an attention call uploads: the positions and the causal tile
// bounds at 64 and 32, with a document mask the queries' document starts and their tile
// bounds, and the offset of each part (in elements).
type attnInts struct {
	data                                                                       []int32
	qpos, kpos, q64min, q64max, q32min, q32max, k64min, k64max, k32min, k32max int
	qstart, qs64min, qs64max, qs32min, qs32max                                 int
}

// packAttnInts lays out the positions and bounds of a causal call (nothing for a non-causal one,
// whose kernels read no positions), and the document starts and their bounds when the call
// masks by document.
func packAttnInts(sh AttnShape) attnInts {
	var a attnInts
	if !sh.Causal {
		return a
	}
	add := func(xs []int32) int {
		off := len(a.data)
		a.data = append(a.data, xs...)
		return off
	}
	a.qpos, a.kpos = add(sh.QPos), add(sh.KPos)
	q64min, q64max := tileBounds(sh.QPos, attnT64)
	q32min, q32max := tileBounds(sh.QPos, attnT32)
	k64min, k64max := tileBounds(sh.KPos, attnT64)
	k32min, k32max := tileBounds(sh.KPos, attnT32)
	a.q64min, a.q64max, a.q32min, a.q32max = add(q64min), add(q64max), add(q32min), add(q32max)
	a.k64min, a.k64max, a.k32min, a.k32max = add(k64min), add(k64max), add(k32min), add(k32max)
	if sh.QStart != nil {
		qs64min, qs64max := tileBounds(sh.QStart, attnT64)
		qs32min, qs32max := tileBounds(sh.QStart, attnT32)
		a.qstart = add(sh.QStart)
		a.qs64min, a.qs64max, a.qs32min, a.qs32max = add(qs64min), add(qs64max), add(qs32min), add(qs32max)
	}
	return a
}

// ceilDiv is ⌈a/b⌉ for positive b.
func ceilDiv(a, b int) int { return (a + b - 1) / b }
