//go:build cuda

package cuda

// cuDNN's fused scaled-dot-product attention, forward (with the softmax statistics, the LSE)
// and backward, as operation graphs of the backend API. The graphs are those cudnn-frontend
// builds for its composite SDPA nodes (include/cudnn_frontend/node/
// scaled_dot_product_flash_attention.h: CompositeSDPANode and CompositeSDPABackwardNode, with the
// composite softmax of softmax.h, the masks of utils/attn_score_modifiers.h and the composite
// diagonal band of diagonal_band_mask.h), which cuDNN's heuristics lower onto its fused
// flash-attention engines; the version-dependent forms the frontend chooses by cuDNN version are
// chosen here the same way (SDPA.Version). cudnn-frontend's single-operation SDPA (cuDNN ≥
// 9.13.1) and its unified softmax and band operations (≥ 9.21) are not used: the composite
// graph is what every cuDNN 9 accepts.

import (
	"errors"
	"fmt"
	"math"
)

// Unique ids of the non-virtual tensors of the SDPA graphs (Plan.Execute takes their
// addresses by these ids). By-value scalars have ids from 100 up, virtual tensors from 1000.
const (
	UIDQ          = 1  // queries [B, H, SQ, D]
	UIDK          = 2  // keys [B, KVH, SKV, D] (the graph reads Kᵀ)
	UIDV          = 3  // values [B, KVH, SKV, D]
	UIDO          = 4  // output [B, H, SQ, D] (forward: written; backward: read, the real O or the synthetic O′)
	UIDStats      = 5  // log-sum-exp [B, H, SQ, 1], float (forward: written; backward: read)
	UIDdO         = 6  // output gradient [B, H, SQ, D]
	UIDdQ         = 7  // query gradient [B, H, SQ, D]
	UIDdK         = 8  // key gradient [B, KVH, SKV, D]
	UIDdV         = 9  // value gradient [B, KVH, SKV, D]
	UIDSeqQ       = 10 // query rows of each batch [B], int32 (padding mask)
	UIDSeqKV      = 11 // key rows of each batch [B], int32
	UIDOffQ       = 12 // ragged offsets [B+1], int32, in elements: Q, dQ
	UIDOffK       = 13 // K, dK
	UIDOffV       = 14 // V, dV
	UIDOffO       = 15 // O, dO (forward: O)
	UIDSoftmaxSum = 20 // backward: rowsum(dO ∘ O) [B, H, SQ, 1], float, in the workspace
	UIDdQAccum    = 21 // backward, non-deterministic: dQ accumulated in float [B, H, SQ, D], in the workspace
)

// Mask is the attention mask of an SDPA graph, in cuDNN's terms: rows are queries and columns
// keys of one batch.
type Mask struct {
	// Causal sets a right bound: column c is visible to row r iff c ≤ r + Shift (top-left
	// alignment) or c ≤ r + SKV − SQ (BottomRight; per batch, from the sequence lengths, with
	// a padding mask).
	Causal      bool
	BottomRight bool
	Shift       int64 // the top-left diagonal's shift (≥ 0; 0 is the causal diagonal)
	// Left, when positive, is a left bound (a sliding window): column c is visible to row r
	// only if c > r − Left (top-left) or c > r + SKV − SQ − Left (bottom-right).
	Left int64
}

// SDPA describes one graph. Q, K, V, O and their gradients are packed [tokens, heads, dim]
// arrays (row stride heads·dim); with Ragged, batch b's rows start at the ragged offsets
// (UIDOff*) and number the sequence lengths (UIDSeqQ, UIDSeqKV), and SQ and SKV are maxima.
type SDPA struct {
	Backward bool
	IO       DataType // BFloat16 or Half: Q, K, V, O, dO and the gradients
	B        int64    // batches: 1, or the segments of a ragged block
	H, KVH   int64    // query and key/value heads (H a multiple of KVH: GQA)
	SQ, SKV  int64    // query and key rows (per batch)
	// D is the head dimension of Q, K, V, O and the gradients: one for all, as PyTorch's and
	// TransformerEngine's graphs have it (a d_qk ≠ d_v graph lands on cuDNN's generic, slower
	// backward and, at 128 and above on Hopper, outside the versions NVIDIA supports).
	D      int64
	Scale  float32 // multiplies Q·Kᵀ
	Mask   Mask
	Ragged bool // segments by ragged offsets and sequence lengths (implies the padding mask)
	// Padding applies the padding mask from the sequence lengths without ragged offsets (set
	// by SDPABackward's workaround for cuDNN ≤ 9.15, as cudnn-frontend does).
	Padding       bool
	Deterministic bool // backward: dQ straight from dS·K (no float accumulator, no atomics)
	Version       int  // the cuDNN version the graph is for
	SM            int  // the GPU's compute capability ·10 (90 for H100)
}

// Key is a string that identifies the graph (its plan cache key).
func (s SDPA) Key() string { return fmt.Sprintf("%+v", s) }

// padding reports whether the graph has the padding mask (and so sequence-length tensors).
func (s SDPA) padding() bool { return s.Ragged || s.Padding }

// BackwardWorkaround reports whether cudnn-frontend would add its padding-mask workaround to
// this backward graph (cuDNN ≤ 9.15, SKV not a multiple of 128, no padding of its own):
// sequence lengths of SQ and SKV per batch, which the caller then provides (UIDSeqQ, UIDSeqKV).
func (s SDPA) BackwardWorkaround() bool {
	return s.Backward && !s.padding() && s.SKV%128 != 0 && s.Version <= 91500
}

// Check reports what cuDNN cannot compute of s, or computes wrongly, on s's version and GPU
// (the first of SupportRules that refuses it), or nil.
func (s SDPA) Check() error {
	for _, r := range SupportRules {
		if why := r.refuse(s); why != "" {
			return errors.New(why)
		}
	}
	return nil
}

// SupportRule is one line of the support table Check applies: a class of graph that cuDNN
// does not compute, or computes wrongly, on the versions and GPUs it names. The table is
// TransformerEngine's (nvte_get_fused_attn_backend, which is stricter than cudnn-frontend's
// composite checks where NVIDIA found bugs), cudnn-frontend v1.23's support surface
// (sdpa_support_surface.h, CompositeSDPABackwardNode::pre_validate_node) and the issue threads
// the cuDNN review cites; docs/gpu.md writes it out, one row per rule.
type SupportRule struct {
	Line   string // the rule as docs/gpu.md's table writes it
	refuse func(s SDPA) string
}

// Refuses is the reason this rule alone refuses s, or "".
func (r SupportRule) Refuses(s SDPA) string { return r.refuse(s) }

// SupportRules is Check's table, in the order it is applied.
var SupportRules = []SupportRule{
	{"cuDNN older than 9.0.0", func(s SDPA) string {
		return when(s.Version < MinCUDNN, "cuDNN %s is older than %s", CUDNNVersionString(s.Version), CUDNNVersionString(MinCUDNN))
	}},
	{"cuDNN 9.10.0 and 9.10.1 (known SDPA bugs; cudnn-frontend refuses them)", func(s SDPA) string {
		return when(s.Version == 91000 || s.Version == 91001, "cuDNN %s has known SDPA bugs (cudnn-frontend refuses 9.10.0 and 9.10.1)",
			CUDNNVersionString(s.Version))
	}},
	{"operands not bf16 or fp16", func(s SDPA) string {
		return when(s.IO != BFloat16 && s.IO != Half, "fused attention runs on bf16/fp16 operands, not %s", s.IO)
	}},
	{"query heads not a multiple of the kv heads", func(s SDPA) string {
		return when(s.KVH < 1 || s.H%s.KVH != 0, "%d query heads over %d kv heads", s.H, s.KVH)
	}},
	{"head dimension not a multiple of 8", func(s SDPA) string {
		return when(s.D%8 != 0, "head dimension %d: cuDNN needs a multiple of 8", s.D)
	}},
	{"head dimension above 256 (every version)", func(s SDPA) string {
		return when(s.D > 256, "head dimension %d > 256", s.D)
	}},
	{"GPU older than sm_80", func(s SDPA) string {
		return when(s.SM < 80, "compute capability %d.%d: cuDNN's fused attention needs 8.0", s.SM/10, s.SM%10)
	}},
	{"sm_8x backward, head dimension above 128 (every version)", func(s SDPA) string {
		return when(s.SM/10 == 8 && s.Backward && s.D > 128, "a backward with head dimension %d > 128 on sm_%d (Ampere/Ada: ≤ 128 at every version)", s.D, s.SM)
	}},
	{"sm_8x forward, head dimension above 128: cuDNN ≥ 9.10.2", func(s SDPA) string {
		return when(s.SM/10 == 8 && !s.Backward && s.D > 128 && s.Version < 91002, "head dimension %d > 128 on sm_%d needs cuDNN ≥ 9.10.2", s.D, s.SM)
	}},
	{"sm_90 forward, head dimension above 128: cuDNN ≥ 9.1", func(s SDPA) string {
		return when(s.SM/10 == 9 && !s.Backward && s.D > 128 && s.Version < 90100, "head dimension %d > 128 on Hopper needs cuDNN ≥ 9.1", s.D)
	}},
	{"sm_90 backward, head dimension above 128: cuDNN ≥ 9.5", func(s SDPA) string {
		return when(s.SM/10 == 9 && s.Backward && s.D > 128 && s.Version < 90500, "a backward with head dimension %d > 128 on Hopper needs cuDNN ≥ 9.5", s.D)
	}},
	{"sm_100 and later, head dimension above 128: forward cuDNN ≥ 9.9, backward never (not validated here)", func(s SDPA) string {
		return when(s.SM >= 100 && s.D > 128 && (s.Backward || s.Version < 90900), "head dimension %d > 128 on sm_%d (forward from cuDNN 9.9; no backward)", s.D, s.SM)
	}},
	{"backward with s_q = s_kv = 1", func(s SDPA) string {
		return when(s.Backward && s.SQ == 1 && s.SKV == 1, "s_q = s_kv = 1 (cuDNN's backward refuses it)")
	}},
	{"sm_90 backward with s_q = 1 (NaN on 9.25 and 9.26, cudnn-frontend #1072; every version)", func(s SDPA) string {
		return when(s.SM/10 == 9 && s.Backward && s.SQ == 1, "a backward with one query row on Hopper (NaN in cuDNN 9.25/9.26)")
	}},
	{"sm_90 backward with s_kv % 128 = 64: cuDNN ≥ 9.26 (NaN before, cudnn-frontend #160)", func(s SDPA) string {
		return when(s.SM/10 == 9 && s.Backward && s.SKV%128 == 64 && s.Version < 92600,
			"a backward with %d key rows (s_kv %% 128 = 64) on Hopper needs cuDNN ≥ 9.26 (NaN before)", s.SKV)
	}},
	{"a negative diagonal shift", func(s SDPA) string {
		return when(s.Mask.Causal && s.Mask.Shift < 0, "a negative diagonal shift %d", s.Mask.Shift)
	}},
	{"bottom-right without the padding mask, s_q > s_kv", func(s SDPA) string {
		return when(s.Mask.BottomRight && !s.padding() && s.SQ > s.SKV, "bottom-right alignment with %d query rows > %d key rows", s.SQ, s.SKV)
	}},
	{"bottom-right without the padding mask: cuDNN ≥ 9.3", func(s SDPA) string {
		return when(s.Mask.BottomRight && !s.padding() && s.Version < 90300, "bottom-right alignment needs cuDNN ≥ 9.3")
	}},
	{"bottom-right with s_q or s_kv not a multiple of 64: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Mask.BottomRight && s.Version < 90600 && (s.SQ%64 != 0 || s.SKV%64 != 0),
			"bottom-right alignment with %d×%d rows (not multiples of 64) needs cuDNN ≥ 9.6", s.SQ, s.SKV)
	}},
	{"shifted diagonal: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Mask.Causal && s.Mask.Shift > 0 && s.Version < 90600, "a shifted diagonal (right bound %d) needs cuDNN ≥ 9.6", s.Mask.Shift)
	}},
	{"shifted diagonal with s_q > s_kv (every version)", func(s SDPA) string {
		return when(s.Mask.Causal && s.Mask.Shift > 0 && s.SQ > s.SKV, "a shifted diagonal with %d query rows > %d key rows", s.SQ, s.SKV)
	}},
	{"sliding window (left bound): cuDNN ≥ 9.2", func(s SDPA) string {
		return when(s.Mask.Left > 0 && s.Version < 90200, "a sliding window (left bound) needs cuDNN ≥ 9.2")
	}},
	{"left bound without a right bound: cuDNN ≥ 9.10.2", func(s SDPA) string {
		return when(s.Mask.Left > 0 && !s.Mask.Causal && s.Version < 91002, "a left bound without a right bound needs cuDNN ≥ 9.10.2")
	}},
	{"cuDNN 9.14.0, left bound without a right bound, s_kv above 1024", func(s SDPA) string {
		return when(s.Mask.Left > 0 && !s.Mask.Causal && s.Version/100 == 914 && s.SKV > 1024,
			"a left bound without a right bound over %d key rows on cuDNN 9.14 (wrong results)", s.SKV)
	}},
	{"sliding window without the padding mask, s_q > s_kv", func(s SDPA) string {
		return when(s.Mask.Left > 0 && !s.padding() && s.SQ > s.SKV, "a sliding window with %d query rows > %d key rows", s.SQ, s.SKV)
	}},
	{"bottom-right sliding window with s_q ≠ s_kv: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Mask.Left > 0 && s.Mask.BottomRight && s.Version < 90600 && s.SQ != s.SKV,
			"a bottom-right sliding window with %d ≠ %d rows needs cuDNN ≥ 9.6", s.SQ, s.SKV)
	}},
	{"sm_90, bottom-right sliding window with s_q = s_kv: cuDNN ≥ 9.10.2", func(s SDPA) string {
		return when(s.Mask.Left > 0 && s.Mask.BottomRight && s.SQ == s.SKV && s.Version < 91002 && s.SM/10 == 9,
			"this bottom-right sliding window is refused on Hopper by cuDNN before 9.10.2")
	}},
	{"ragged offsets (packed documents): cuDNN ≥ 9.1", func(s SDPA) string {
		return when(s.Ragged && s.Version < 90100, "ragged offsets need cuDNN ≥ 9.1")
	}},
	{"ragged offsets on sm_8x: cuDNN ≥ 9.18.1", func(s SDPA) string {
		return when(s.Ragged && s.SM < 90 && s.Version < 91801, "ragged offsets on sm_%d need cuDNN ≥ 9.18.1", s.SM)
	}},
	{"ragged offsets with grouped-query attention: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Ragged && s.H != s.KVH && s.Version < 90600, "ragged offsets with grouped-query attention need cuDNN ≥ 9.6")
	}},
	{"ragged offsets with bottom-right: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Ragged && s.Mask.BottomRight && s.Version < 90600, "ragged offsets with bottom-right alignment need cuDNN ≥ 9.6")
	}},
	{"ragged, bottom-right, s_q or s_kv not a multiple of 64: cuDNN ≥ 9.7", func(s SDPA) string {
		return when(s.Ragged && s.Mask.BottomRight && s.Version < 90700 && (s.SQ%64 != 0 || s.SKV%64 != 0),
			"ragged bottom-right with %d×%d rows (not multiples of 64) needs cuDNN ≥ 9.7", s.SQ, s.SKV)
	}},
	{"ragged offsets with a sliding window: cuDNN ≥ 9.6", func(s SDPA) string {
		return when(s.Ragged && s.Mask.Left > 0 && s.Version < 90600, "a sliding window with ragged offsets needs cuDNN ≥ 9.6")
	}},
	{"sm_90 ragged backward: cuDNN ≥ 9.18 (NaN from an uninitialised workspace before, TransformerEngine #2186)", func(s SDPA) string {
		return when(s.Ragged && s.Backward && s.SM/10 == 9 && s.Version < 91800, "a ragged backward on Hopper needs cuDNN ≥ 9.18 (NaN before)")
	}},
	{"deterministic backward on sm_100 and later (cudnn-frontend picks knobbed engines there, this binding cannot)", func(s SDPA) string {
		return when(s.Deterministic && s.Backward && s.SM >= 100, "a deterministic backward on sm_%d", s.SM)
	}},
	{"deterministic ragged backward on sm_8x", func(s SDPA) string {
		return when(s.Deterministic && s.Backward && s.Ragged && s.SM/10 == 8, "a deterministic ragged backward is not supported on sm_8x")
	}},
}

// when is fmt.Sprintf(format, args...) when refused, else "".
func when(refused bool, format string, args ...any) string {
	if !refused {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// negInf is the value masked scores get: −Inf, or the lowest float before cuDNN 9.10 (which
// prefers it, cudnn-frontend says).
func (s SDPA) negInf() float32 {
	if s.Version < 91000 {
		return -math.MaxFloat32
	}
	return float32(math.Inf(-1))
}

// packed returns the strides of a packed [tokens, heads, dim] array seen as [B, heads, rows,
// dim].
func packed(heads, rows, dim int64) []int64 { return []int64{rows * heads * dim, dim, heads * dim, 1} }

// transposed swaps the last two dimensions of dims and strides (K → Kᵀ).
func transposed(dims, strides []int64) ([]int64, []int64) {
	d, s := append([]int64(nil), dims...), append([]int64(nil), strides...)
	d[2], d[3] = d[3], d[2]
	s[2], s[3] = s[3], s[2]
	return d, s
}

// sdpaGraph holds the graph under construction and the tensors its parts share.
type sdpaGraph struct {
	*Graph
	s                  SDPA
	seqQ, seqKV        *Tensor
	offQ, offK, offV   *Tensor
	offO               *Tensor
	nextScalar         int64
	scoreDims, scoreSt []int64
}

func (g *sdpaGraph) scalarF(name string, v float32) *Tensor {
	g.nextScalar++
	return g.ScalarFloat(100+g.nextScalar, name, v)
}

func (g *sdpaGraph) scalarI(name string, v int32) *Tensor {
	g.nextScalar++
	return g.ScalarInt(100+g.nextScalar, name, v)
}

// score makes a virtual tensor of the scores' shape [B, H, SQ, SKV].
func (g *sdpaGraph) score(name string, t DataType) *Tensor {
	return g.Virtual(name, t, g.scoreDims, g.scoreSt...)
}

// rowStat makes a virtual [B, H, SQ, 1] float tensor.
func (g *sdpaGraph) rowStat(name string) *Tensor {
	s := g.s
	return g.Virtual(name, Float32, []int64{s.B, s.H, s.SQ, 1}, s.H*s.SQ, s.SQ, 1, 1)
}

// io adds a non-virtual packed tensor of the IO type.
func (g *sdpaGraph) io(uid int64, name string, heads, rows, dim int64, ragged *Tensor) *Tensor {
	s := g.s
	return g.Tensor(TensorSpec{UID: uid, Name: name, Type: s.IO, Dims: []int64{s.B, heads, rows, dim},
		Strides: packed(heads, rows, dim), Ragged: ragged})
}

// inputs adds the sequence-length and ragged-offset tensors the graph needs.
func (g *sdpaGraph) inputs() {
	s := g.s
	vec := func(uid int64, name string, n int64) *Tensor {
		return g.Tensor(TensorSpec{UID: uid, Name: name, Type: Int32, Dims: []int64{n, 1, 1, 1}, Strides: []int64{1, 1, 1, 1}})
	}
	if s.padding() || (s.Backward && s.BackwardWorkaround()) {
		g.seqQ = vec(UIDSeqQ, "seq_len_q", s.B)
		g.seqKV = vec(UIDSeqKV, "seq_len_kv", s.B)
	}
	if s.Ragged {
		g.offQ = vec(UIDOffQ, "ragged_offset_q", s.B+1)
		g.offK = vec(UIDOffK, "ragged_offset_k", s.B+1)
		g.offV = vec(UIDOffV, "ragged_offset_v", s.B+1)
		g.offO = vec(UIDOffO, "ragged_offset_o", s.B+1)
	}
}

// paddingMask is attn_score_modifiers.h's padding_mask: scores of rows ≥ seq_len_q or columns
// ≥ seq_len_kv are masked. suffix names the second application in the backward.
func (g *sdpaGraph) paddingMask(x *Tensor, suffix string) *Tensor {
	row := g.score("gen_row_idx"+suffix, Int32)
	g.Pointwise("gen_row_idx"+suffix, PwGenIndex, Int32, 2, row, x)
	col := g.score("gen_col_idx"+suffix, Int32)
	g.Pointwise("gen_col_idx"+suffix, PwGenIndex, Int32, 3, col, x)
	rm := g.score("lt_row_sq"+suffix, Boolean)
	g.Pointwise("lt_row_sq"+suffix, PwCmpLT, Boolean, -1, rm, row, g.seqQ)
	cm := g.score("lt_col_skv"+suffix, Boolean)
	g.Pointwise("lt_col_skv"+suffix, PwCmpLT, Boolean, -1, cm, col, g.seqKV)
	m := g.score("and_row_col"+suffix, Boolean)
	g.Pointwise("and_row_col"+suffix, PwLogicalAnd, Boolean, -1, m, rm, cm)
	y := g.score("select"+suffix, Float32)
	g.Pointwise("select"+suffix, PwBinarySelect, Float32, -1, y, x, g.scalarF("negative_inf_padding", g.s.negInf()), m)
	return y
}

// windowMask is attn_score_modifiers.h's sliding_window_mask with the composite diagonal band
// of diagonal_band_mask.h: the right bound (causal, top-left shifted or bottom-right), then the
// left bound.
func (g *sdpaGraph) windowMask(x *Tensor) *Tensor {
	s, m := g.s, g.s.Mask
	if m.Causal {
		row := g.score("right_bound.row", Int32)
		g.Pointwise("gen_row_index", PwGenIndex, Float32, 2, row, x)
		col := g.score("right_bound.col", Int32)
		g.Pointwise("gen_col_index", PwGenIndex, Float32, 3, col, x)
		if m.BottomRight {
			skv, sq := g.seqKV, g.seqQ
			if skv == nil {
				skv, sq = g.scalarI("s_kv", int32(s.SKV)), g.scalarI("s_q", int32(s.SQ))
			}
			r := g.score("row+skv", Int32)
			g.Pointwise("row+skv", PwAdd, Int32, -1, r, row, skv)
			row = g.score("row+skv-sq", Int32)
			g.Pointwise("row+skv-sq", PwSub, Int32, -1, row, r, sq)
		}
		if m.Shift != 0 {
			r := g.score("row+window", Int32)
			g.Pointwise("row+window", PwAdd, Int32, -1, r, row, g.scalarI("shift_right_bound", int32(m.Shift)))
			row = r
		}
		cmp := g.score("row>col", Boolean)
		g.Pointwise("row>col", PwCmpGE, Boolean, -1, cmp, row, col)
		y := g.score("right_bound_diagonal_mask", Float32)
		g.Pointwise("binary_select", PwBinarySelect, Float32, -1, y, x, g.scalarF("negative_inf", s.negInf()), cmp)
		x = y
	}
	if m.Left > 0 {
		row := g.score("left_bound.row", Int32)
		g.Pointwise("gen_row_index", PwGenIndex, Float32, 2, row, x)
		col := g.score("left_bound.col", Int32)
		g.Pointwise("gen_col_index", PwGenIndex, Float32, 3, col, x)
		switch {
		case !m.BottomRight:
			c := g.score("col+window", Float32)
			g.Pointwise("col+window", PwAdd, Float32, -1, c, col, g.scalarF("left_bound", float32(m.Left)))
			col = c
		case g.seqKV == nil:
			c := g.score("col+window", Float32)
			g.Pointwise("col+window", PwAdd, Float32, -1, c, col, g.scalarF("left_bound", float32(m.Left-s.SKV+s.SQ)))
			col = c
		default:
			c := g.score("col+window", Int32)
			g.Pointwise("col+window", PwAdd, Int32, -1, c, col, g.scalarI("left_bound", int32(m.Left)))
			c2 := g.score("col+window-skv", Int32)
			g.Pointwise("col+window-skv", PwSub, Int32, -1, c2, c, g.seqKV)
			col = g.score("col+window-skv+sq", Int32)
			g.Pointwise("col+window-skv+sq", PwAdd, Int32, -1, col, c2, g.seqQ)
		}
		cmp := g.score("col>row", Boolean)
		g.Pointwise("col>row", PwCmpGT, Boolean, -1, cmp, col, row)
		y := g.score("left_bound_diagonal_mask", Float32)
		g.Pointwise("binary_select", PwBinarySelect, Float32, -1, y, x, g.scalarF("negative_inf", s.negInf()), cmp)
		x = y
	}
	return x
}

// BuildSDPA builds and finalises the forward or backward graph of s (Check first), returning
// its plan. The plan's FEWorkspace tensors (softmax_sum, dQ_accum) live in the workspace after
// cuDNN's own (Plan.TotalWorkspace).
func (n *DNN) BuildSDPA(s SDPA) (*Plan, *SDPALayout, error) {
	if err := s.Check(); err != nil {
		return nil, nil, err
	}
	g := &sdpaGraph{Graph: n.NewGraph(), s: s}
	lay := g.build()
	p, err := g.Build()
	if err != nil {
		return nil, nil, err
	}
	lay.plan = p
	return p, lay, nil
}

// DescribeSDPA builds s's graph without cuDNN (no descriptors), for tests and messages: the
// tensors and operations BuildSDPA would make, and the workspace tensors. Graph.Err reports a
// graph that is malformed (two tensors with one unique id, an operation with the wrong number
// of tensors).
func DescribeSDPA(s SDPA) (*Graph, *SDPALayout) {
	g := &sdpaGraph{Graph: &Graph{nextUID: 1000, describe: true}, s: s}
	lay := g.build()
	return g.Graph, lay
}

// SDPALayout is where a plan's workspace-resident tensors lie, after cuDNN's workspace.
type SDPALayout struct {
	plan *Plan
	// Extra lists the tensors the graph keeps in the workspace (cudnn-frontend's "fe
	// workspace"): unique id, bytes, and whether it must be zeroed before each execution.
	Extra []WorkspaceTensor
}

// WorkspaceTensor is one tensor kept in the workspace.
type WorkspaceTensor struct {
	UID   int64
	Bytes int64
	Zero  bool
	Off   int64 // from the start of the workspace
}

// Layout fills the workspace offsets (after cuDNN's Workspace bytes, 256-aligned) and returns
// the workspace's total size.
func (l *SDPALayout) Layout() int64 {
	off := (l.plan.Workspace + 255) &^ 255
	for i := range l.Extra {
		l.Extra[i].Off = off
		off += (l.Extra[i].Bytes + 255) &^ 255
	}
	return off
}

// build adds every tensor and operation of the graph.
func (g *sdpaGraph) build() *SDPALayout {
	s := g.s
	g.scoreDims = []int64{s.B, s.H, s.SQ, s.SKV}
	g.scoreSt = []int64{s.H * s.SQ * s.SKV, s.SQ * s.SKV, s.SKV, 1}
	if s.Backward {
		return g.backward()
	}
	return g.forward()
}

func (g *sdpaGraph) forward() *SDPALayout {
	s := g.s
	g.inputs()
	q := g.io(UIDQ, "Q", s.H, s.SQ, s.D, g.offQ)
	kDims, kSt := []int64{s.B, s.KVH, s.SKV, s.D}, packed(s.KVH, s.SKV, s.D)
	ktDims, ktSt := transposed(kDims, kSt)
	kt := g.Tensor(TensorSpec{UID: UIDK, Name: "K", Type: s.IO, Dims: ktDims, Strides: ktSt, Ragged: g.offK})
	v := g.io(UIDV, "V", s.KVH, s.SKV, s.D, g.offV)
	o := g.io(UIDO, "O", s.H, s.SQ, s.D, g.offO)
	stats := g.Tensor(TensorSpec{UID: UIDStats, Name: "Stats", Type: Float32, Dims: []int64{s.B, s.H, s.SQ, 1},
		Strides: []int64{s.H * s.SQ, s.SQ, 1, 1}})

	x := g.score("bmm1", Float32)
	g.Matmul("bmm1", x, q, kt, g.seqQ, g.seqKV, nil)
	y := g.score("attn_scale", Float32)
	g.Pointwise("attn_scale", PwMul, Float32, -1, y, x, g.scalarF("attn_scale", s.Scale))
	x = y
	if s.padding() {
		x = g.paddingMask(x, "_padding")
	}
	x = g.windowMask(x)

	// cudnn-frontend's CompositeSoftmaxNode with Stats: max, sub, exp, sum, log, add, div
	mx := g.rowStat("Max")
	g.Reduction("Max", ReduceMax, mx, x)
	sub := g.score("sub_M", Float32)
	g.Pointwise("sub", PwSub, Float32, -1, sub, x, mx)
	e := g.score("exp_sub_M", Float32)
	g.Pointwise("exp", PwExp, Float32, -1, e, sub)
	sum := g.rowStat("SumExp")
	g.Reduction("sum", ReduceAdd, sum, e)
	lg := g.rowStat("log")
	g.Pointwise("log", PwLog, Float32, -1, lg, sum)
	g.Pointwise("add", PwAdd, Float32, -1, stats, mx, lg)
	p := g.score("softmax", s.IO)
	g.Pointwise("div", PwDiv, Float32, -1, p, e, sum)

	g.Matmul("bmm2", o, p, v, g.seqQ, nil, g.seqKV)
	return &SDPALayout{}
}

func (g *sdpaGraph) backward() *SDPALayout {
	s := g.s
	lay := &SDPALayout{}
	g.inputs()
	q := g.io(UIDQ, "Q", s.H, s.SQ, s.D, g.offQ)
	kDims, kSt := []int64{s.B, s.KVH, s.SKV, s.D}, packed(s.KVH, s.SKV, s.D)
	ktDims, ktSt := transposed(kDims, kSt)
	kt := g.Tensor(TensorSpec{UID: UIDK, Name: "K", Type: s.IO, Dims: ktDims, Strides: ktSt, Ragged: g.offK})
	vtDims, vtSt := transposed([]int64{s.B, s.KVH, s.SKV, s.D}, packed(s.KVH, s.SKV, s.D))
	vt := g.Tensor(TensorSpec{UID: UIDV, Name: "V", Type: s.IO, Dims: vtDims, Strides: vtSt, Ragged: g.offV})
	o := g.io(UIDO, "O", s.H, s.SQ, s.D, g.offO)
	stats := g.Tensor(TensorSpec{UID: UIDStats, Name: "Stats", Type: Float32, Dims: []int64{s.B, s.H, s.SQ, 1},
		Strides: []int64{s.H * s.SQ, s.SQ, 1, 1}})
	dO := g.io(UIDdO, "dO", s.H, s.SQ, s.D, g.offO)
	dQ := g.io(UIDdQ, "dQ", s.H, s.SQ, s.D, g.offQ)
	dK := g.io(UIDdK, "dK", s.KVH, s.SKV, s.D, g.offK)
	dV := g.io(UIDdV, "dV", s.KVH, s.SKV, s.D, g.offV)
	one := g.scalarF("one", 1)
	scale := g.scalarF("attn_scale", s.Scale)
	padding := s.padding() || s.BackwardWorkaround()

	// "dO * O => softmax_sum"
	t := g.Virtual("mul_dO_O", Float32, []int64{s.B, s.H, s.SQ, s.D}, s.H*s.SQ*s.D, s.SQ*s.D, s.H*s.D, 1)
	g.Pointwise("mul_dO_O", PwMul, Float32, -1, t, dO, o)
	r := g.rowStat("reduce_dO_o")
	g.Reduction("reduce_dO_o", ReduceAdd, r, t)
	softmaxSum := g.Tensor(TensorSpec{UID: UIDSoftmaxSum, Name: "softmax_sum", Type: Float32,
		Dims: []int64{s.B, s.H, s.SQ, 1}, Strides: []int64{s.H * s.SQ, s.SQ, 1, 1}})
	g.Pointwise("scale_dropout_inv", PwMul, Float32, -1, softmaxSum, r, one)
	lay.Extra = append(lay.Extra, WorkspaceTensor{UID: UIDSoftmaxSum, Bytes: 4 * s.B * s.H * s.SQ})

	// "Q @ KT => exp_softmax => dV"
	x := g.score("matmul_Q_KT", Float32)
	g.Matmul("matmul_Q_KT", x, q, kt, g.seqQ, g.seqKV, nil)
	y := g.score("mul_s_attn_scale", Float32)
	g.Pointwise("mul_s_attn_scale", PwMul, Float32, -1, y, x, scale)
	x = y
	if padding {
		x = g.paddingMask(x, "_padding")
	}
	y = g.score("sub_s_m", Float32)
	g.Pointwise("sub_s_m", PwSub, Float32, -1, y, x, stats)
	x = y
	if padding && s.Version >= 90000 && s.Version < 91000 {
		x = g.paddingMask(x, "_2nd_padding")
	}
	x = g.windowMask(x)
	expS := g.score("exp_s", Float32)
	g.Pointwise("exp_s", PwExp, Float32, -1, expS, x)
	pT := g.Virtual("reshape_p", s.IO, []int64{s.B, s.H, s.SKV, s.SQ}, s.H*s.SQ*s.SKV, s.SQ*s.SKV, 1, s.SKV)
	g.Reshape("reshape_p", pT, expS)
	if s.H == s.KVH {
		g.Matmul("matmul_pT_dO", dV, pT, dO, g.seqKV, nil, g.seqQ)
	} else {
		full := g.Virtual("dV_fullhead", s.IO, []int64{s.B, s.H, s.SKV, s.D}, s.H*s.SKV*s.D, s.SKV*s.D, s.D, 1)
		g.Matmul("matmul_pT_dO", full, pT, dO, g.seqKV, nil, g.seqQ)
		g.Reduction("red_dV_head", ReduceAdd, dV, full)
	}

	// "dO @ VT => dS => dK"
	dP := g.score("matmul_dO_VT", Float32)
	g.Matmul("matmul_dO_VT", dP, dO, vt, g.seqQ, g.seqKV, nil)
	y = g.score("sub_dP_softmax_sum", Float32)
	g.Pointwise("sub_dP_softmax_sum", PwSub, Float32, -1, y, dP, softmaxSum)
	z := g.score("mul_dP_exp_s", Float32)
	g.Pointwise("mul_dP_exp_s", PwMul, Float32, -1, z, y, expS)
	dS := g.score("mul_dS_attn_scale", Float32)
	g.Pointwise("mul_dS_attn_scale", PwMul, Float32, -1, dS, z, scale)
	dST := g.Virtual("reshape_dS", s.IO, []int64{s.B, s.H, s.SKV, s.SQ}, s.H*s.SQ*s.SKV, s.SQ*s.SKV, 1, s.SKV)
	g.Reshape("reshape_dS", dST, dS)
	if s.H == s.KVH {
		g.Matmul("matmul_dST_Q", dK, dST, q, g.seqKV, nil, g.seqQ)
	} else {
		full := g.Virtual("dK_fullhead", s.IO, []int64{s.B, s.H, s.SKV, s.D}, s.H*s.SKV*s.D, s.SKV*s.D, s.D, 1)
		g.Matmul("matmul_dST_Q", full, dST, q, g.seqKV, nil, g.seqQ)
		g.Reduction("red_dK_head", ReduceAdd, dK, full)
	}

	// "dS @ K => dQ"
	kr := g.Tensor(TensorSpec{Name: "reshape_k", Type: s.IO, Dims: kDims, Strides: kSt, Virtual: true, Ragged: g.offK})
	g.Reshape("reshape_k", kr, kt)
	if s.Deterministic {
		g.Matmul("matmul_dS_K", dQ, dS, kr, g.seqQ, nil, g.seqKV)
	} else {
		acc := g.Tensor(TensorSpec{UID: UIDdQAccum, Name: "dQ_accum", Type: Float32, Dims: []int64{s.B, s.H, s.SQ, s.D},
			Strides: []int64{s.H * s.SQ * s.D, s.SQ * s.D, s.D, 1}})
		g.Matmul("matmul_dS_K", acc, dS, kr, g.seqQ, nil, g.seqKV)
		g.Pointwise("identity_dQ", PwIdentity, Float32, -1, dQ, acc)
		lay.Extra = append(lay.Extra, WorkspaceTensor{UID: UIDdQAccum, Bytes: 4 * s.B * s.H * s.SQ * s.D, Zero: s.Version < 90600})
	}
	return lay
}
