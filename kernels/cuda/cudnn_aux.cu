// The kernels around cuDNN's fused attention (kernels/cuda_cudnn.go): the backward's 16-bit dO
// and synthetic O′, a cuDNN block's (o_b, lse_b) folded into the float32 state, the 16-bit
// gradients cuDNN writes added into the float32 ones. Layouts as in attn_f32.cu: q, o,
// dq, do [nq, H, hd]; k, v, dk, dv [nk, KVH, hd]; m, l, lse, D [H, nq]. rowmap, when not null,
// maps query i of a ragged block to its row of cuDNN's padded statistics [B, H, SQ] (segment
// s, row j: s·H·SQ + j; −1 for a query no segment covers).
#include "common.cuh"

extern "C" {

// df_cudnn_oprime: warp per (query, head) row; writes the backward's 16-bit dO (rounded to
// nearest) and the synthetic O′ whose rowsum with it is D to within the 16-bit unit, for the
// blocks whose real O is not on this rank (kernels/oprime.go says why and how; its SyntheticO is
// this kernel's reference, with the same arithmetic in the same order: lane l takes the columns
// l, l+32, …, and the lane sums meet in the xor butterfly).
// dO comes as float32 (dout; its 16-bit values are written to dop) or already in 16 bits
// (dout16, a schedule's packed operand; dout and dop are then null).
__global__ void df_cudnn_oprime(uint16_t* __restrict__ dop, uint16_t* __restrict__ op, const float* __restrict__ dout,
                                const uint16_t* __restrict__ dout16, const float* __restrict__ D, int nq, int heads, int hd,
                                int fp16) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    float d = D[(long long)h * nq + i];
    const uint16_t* xo = dout16 != nullptr ? dout16 + row * hd : dop + row * hd;
    uint16_t* o = op + row * hd;
    double n2 = 0.0, best = -1.0;
    int star = hd;
    for (int c = lane; c < hd; c += 32) {
        uint16_t b;
        if (dout16 != nullptr) {
            b = xo[c];
        } else {
            b = df_to16(dout[row * hd + c], fp16);
            dop[row * hd + c] = b;
        }
        double x = (double)df_from16(b, fp16);
        n2 = __dadd_rn(n2, __dmul_rn(x, x));
        if (fabs(x) > best) {
            best = fabs(x);
            star = c;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        n2 = __dadd_rn(n2, __shfl_xor_sync(0xffffffffu, n2, off));
        double ob = __shfl_xor_sync(0xffffffffu, best, off);
        int oc = __shfl_xor_sync(0xffffffffu, star, off);
        if (ob > best || (ob == best && oc < star)) {
            best = ob;
            star = oc;
        }
    }
    if (!isfinite(d)) {
        for (int c = lane; c < hd; c += 32) o[c] = df_to16(d, fp16);
        return;
    }
    if (d == 0.0f || n2 == 0.0 || isinf(n2)) {
        for (int c = lane; c < hd; c += 32) o[c] = 0;
        return;
    }
    double alpha = __ddiv_rn((double)d, n2);
    double s = 0.0;
    for (int c = lane; c < hd; c += 32) {
        if (c == star) continue;
        double x = (double)df_from16(xo[c], fp16);
        uint16_t b = df_to16(__double2float_rn(__dmul_rn(alpha, x)), fp16);
        o[c] = b;
        s = __dadd_rn(s, __dmul_rn(x, (double)df_from16(b, fp16)));
    }
    for (int off = 16; off > 0; off >>= 1) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
    if ((star & 31) == lane) {
        double xs = (double)df_from16(xo[star], fp16);
        o[star] = df_to16(__double2float_rn(__ddiv_rn(__dsub_rn((double)d, s), xs)), fp16);
    }
}

// df_add_half3 adds the three 16-bit gradients cuDNN wrote into the float32 ones, in one pass:
// dq[i] += gq[i] for i < nq, dk[i] += gk[i] and dv[i] += gv[i] for i < nk (as the Backend's
// AttnBackward accumulates).
__global__ void df_add_half3(float* __restrict__ dq, const uint16_t* __restrict__ gq, long long nq, float* __restrict__ dk,
                             const uint16_t* __restrict__ gk, float* __restrict__ dv, const uint16_t* __restrict__ gv,
                             long long nk, int fp16) {
    DF_FOR(i, nq + 2 * nk) {
        if (i < nq) {
            dq[i] = __fadd_rn(dq[i], df_from16(gq[i], fp16));
        } else if (i < nq + nk) {
            long long j = i - nq;
            dk[j] = __fadd_rn(dk[j], df_from16(gk[j], fp16));
        } else {
            long long j = i - nq - nk;
            dv[j] = __fadd_rn(dv[j], df_from16(gv[j], fp16));
        }
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
