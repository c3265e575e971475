// The kernels around cuDNN's fused attention (kernels/cuda_cudnn.go): operands into the 16-bit
// layouts the cuDNN graphs read, a cuDNN block's (o_b, lse_b) folded into the float32 state, the
// 16-bit gradients cuDNN writes added into the float32 ones. Layouts as in attn_f32.cu: q, o,
// dq, do [nq, H, hd]; k, v, dk, dv [nk, KVH, hd]; m, l, lse, D [H, nq]. rowmap, when not null,
// maps query i of a ragged block to its row of cuDNN's padded statistics [B, H, SQ] (segment
// s, row j: s·H·SQ + j; −1 for a query no segment covers).
#include "common.cuh"

extern "C" {

// df_pad_half converts rows × cols float32 values into 16-bit rows of ld ≥ cols elements, the
// columns from cols on zero (V′ of the backward: V with the columns that meet dO′'s D parts).
__global__ void df_pad_half(uint16_t* __restrict__ dst, const float* __restrict__ src, long long rows, int cols,
                            int ld, int fp16) {
    DF_FOR(i, rows * ld) {
        long long r = i / ld;
        int c = (int)(i - r * ld);
        dst[i] = c < cols ? df_to16(src[r * cols + c], fp16) : (uint16_t)0;
    }
}

// df_to16_rz converts x to 16 bits rounding toward zero (truncation).
__device__ __forceinline__ uint16_t df_to16_rz(float x, int fp16) {
    if (fp16) return __half_as_ushort(__float2half_rz(x));
    return __bfloat16_as_ushort(__float2bfloat16_rz(x));
}

// df_cudnn_dsplit writes the backward's dO′ and O′ rows (ld ≥ hd + 3 elements) so that cuDNN's
// rowsum(dO′ ∘ O′), summed in float, is exactly D: dO′ = [dO, p1, p2, p3, 0…] and O′ =
// [0…, 2^e, 2^e, 2^e, 0…]. e is D's exponent (D = m·2^e, m in [0.5, 1)) clamped to the powers
// of two the 16-bit format holds, and p1, p2, p3 are D·2^−e cut into three pieces by
// truncation: p1 its leading 8 (bfloat16) or 11 (binary16) bits, p2 the next, p3 the rest —
// 3 × 8 or 3 × 11 bits hold float32's 24, each piece is a 16-bit value, and D·2^−e in [0.5, 1)
// keeps the last piece within the format's precision. The pieces have one sign and disjoint
// bits inside D's 24-bit significand, so every partial sum of them is a float32 and their sum
// is D·2^−e in any order; each product p_k·2^e is exact. Exact for every float32 D in bfloat16
// (e in [−126, 127]) and for 2^−25 ≤ |D| < 2^31 in binary16 (e in [−24, 15]). The products of
// dO′'s extra columns with V′'s zero columns add nothing to dP = dO′·V′ᵀ.
__global__ void df_cudnn_dsplit(uint16_t* __restrict__ dop, uint16_t* __restrict__ op, const float* __restrict__ dout,
                                const float* __restrict__ D, int nq, int heads, int hd, int ld, int fp16) {
    DF_FOR(i, (long long)nq * heads * ld) {
        long long row = i / ld;
        int c = (int)(i - row * ld);
        if (c < hd) {
            dop[i] = df_to16(dout[row * hd + c], fp16);
            op[i] = 0;
            continue;
        }
        int k = c - hd;
        if (k >= 3) {
            dop[i] = 0;
            op[i] = 0;
            continue;
        }
        int q = (int)(row / heads), h = (int)(row % heads);
        float d = D[(long long)h * nq + q];
        int e = 0;
        if (d != 0.0f && isfinite(d)) {
            frexpf(d, &e);
            e = fp16 ? max(-24, min(15, e)) : max(-126, min(127, e));
        }
        float x = ldexpf(d, -e);
        uint16_t p = df_to16_rz(x, fp16);
        for (int j = 0; j < k; j++) {
            x = __fsub_rn(x, df_from16(p, fp16));
            p = df_to16_rz(x, fp16);
        }
        dop[i] = p;
        op[i] = df_to16(ldexpf(1.0f, e), fp16);
    }
}

// df_add_half adds rows × cols 16-bit values (rows of ld elements) into float32 dst (rows of
// cols): the gradients cuDNN wrote, accumulated as the Backend's AttnBackward accumulates.
__global__ void df_add_half(float* __restrict__ dst, const uint16_t* __restrict__ src, long long rows, int cols, int ld,
                            int fp16) {
    DF_FOR(i, rows * cols) {
        long long r = i / cols;
        int c = (int)(i - r * cols);
        dst[i] = __fadd_rn(dst[i], df_from16(src[r * ld + c], fp16));
    }
}

// df_cudnn_fold: warp per (query, head) row; folds cuDNN's normalised block output o2 (16-bit,
// [nq, H, hd]) and its log-sum-exp into the state (o1, m1, l1) as df_attn_merge folds a state
// with O = o2, M = lse, L = 1. A row whose lse is −Inf (or that no segment covers) is left.
__global__ void df_cudnn_fold(float* __restrict__ o1, float* __restrict__ m1, float* __restrict__ l1,
                              const uint16_t* __restrict__ o2, const float* __restrict__ stats,
                              const int* __restrict__ rowmap, int nq, int heads, int hd, int sq, int fp16) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    long long j = (long long)h * nq + i;
    float mb;
    if (rowmap == nullptr) {
        mb = stats[j];
    } else {
        int r = rowmap[i];
        if (r < 0) return;
        mb = stats[(long long)r + (long long)h * sq];
    }
    if (mb == DF_NEG_INF || mb != mb) return;
    float ma = m1[j];
    float m = fmaxf(ma, mb);
    float ca = (float)exp((double)__fsub_rn(ma, m));
    float cb = (float)exp((double)__fsub_rn(mb, m));
    float* x = o1 + row * hd;
    const uint16_t* y = o2 + row * hd;
    for (int d = lane; d < hd; d += 32) x[d] = __fadd_rn(__fmul_rn(x[d], ca), __fmul_rn(df_from16(y[d], fp16), cb));
    __syncwarp();
    if (lane == 0) {
        l1[j] = __fadd_rn(__fmul_rn(l1[j], ca), cb);
        m1[j] = m;
    }
}

// df_lse_scatter copies lse ([H, nq]) into cuDNN's padded statistics of a ragged block by
// rowmap; rows no segment covers are not written.
__global__ void df_lse_scatter(float* __restrict__ dst, const float* __restrict__ lse, const int* __restrict__ rowmap,
                               int nq, int heads, int sq) {
    DF_FOR(i, (long long)nq * heads) {
        int q = (int)(i % nq), h = (int)(i / nq);
        int r = rowmap[q];
        if (r >= 0) dst[(long long)r + (long long)h * sq] = lse[i];
    }
}

}  // extern "C"
