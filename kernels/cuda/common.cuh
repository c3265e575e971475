// Shared device helpers of the distflash CUDA kernels (kernels/cuda_*.go loads the PTX built
// from the .cu files of this directory by scripts/build_cuda.sh).
//
// Numerics: every kernel that mirrors a CPU kernel (kernels/cpu.go) follows the CPU's order of
// float32 operations and uses the _rn intrinsics where nvcc would otherwise contract a*b+c into
// one fused multiply-add, so that the elementwise kernels agree with the CPU to the last bit or
// within a few ulps (exp/log/sincos in double differ from Go's math package by at most an ulp
// of the double, which rarely shows after rounding to float32). Reductions accumulate in double
// over a fixed tree, so they are bit-reproducible run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define DF_NEG_INF __int_as_float(0xff800000)

// df_block_sum_d returns the sum of v over the block (blockDim.x a multiple of 32, at most
// 1024) to every thread. sh must hold 32 doubles. The tree is fixed, so the result is
// reproducible.
__device__ __forceinline__ double df_block_sum_d(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// df_block_max_f returns the maximum of v over the block (same rules as df_block_sum_d).
__device__ __forceinline__ float df_block_max_f(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : DF_NEG_INF;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// df_row_lse returns, to every thread of the block, log Σ exp(row[j]) over the vocab values of
// row: the maximum in float32, exp of each difference and their sum in double, as the CPU's
// CrossEntropy takes them (df_xent, df_xent16).
__device__ __forceinline__ double df_row_lse(const float* row, long long vocab, double* shd, float* shf) {
    float mx = DF_NEG_INF;
    for (long long j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = df_block_max_f(mx, shf);
    double sum = 0;
    for (long long j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp((double)__fsub_rn(row[j], mx));
    sum = df_block_sum_d(sum, shd);
    return (double)mx + log(sum);
}

// df_adamw_elem: one AdamW update of element i (decoupled weight decay wd; c1, c2 the bias
// corrections), in the CPU's order of float32 operations; it returns the updated parameter
// (df_adamw, df_adamw_multi, and df_adamw_multi16, which also stores it in 16 bits).
__device__ __forceinline__ float df_adamw_elem(float* __restrict__ p, const float* __restrict__ g,
                                               float* __restrict__ m, float* __restrict__ v, long long i,
                                               float b1, float b2, float c1, float c2, float lr, float eps,
                                               float gs, float wd) {
    float gi = __fmul_rn(g[i], gs);
    float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(__fsub_rn(1.0f, b1), gi));
    float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
    m[i] = mi;
    v[i] = vi;
    float mh = __fdiv_rn(mi, c1), vh = __fdiv_rn(vi, c2);
    float pi = p[i];
    float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), eps)), __fmul_rn(wd, pi));
    pi = __fsub_rn(pi, __fmul_rn(lr, upd));
    p[i] = pi;
    return pi;
}

// df_rope_angles fills, for the block, cosv[i] and sinv[i] (i < half) with the cosine and sine
// of pos·invfreq[i] (negated sine when inverse), computed in double (exact at 512K positions),
// times scale and rounded to float32 (df_rope, df_rope_qkv16). It begins and ends with a
// barrier: the block's earlier reads of the table are done, and every value is there after.
__device__ __forceinline__ void df_rope_angles(float* cosv, float* sinv, int half, int pos,
                                               const double* __restrict__ invfreq, double scale, int inverse) {
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos((double)pos * invfreq[i], &s, &c);
        cosv[i] = (float)(c * scale);
        sinv[i] = (float)((inverse ? -s : s) * scale);
    }
    __syncthreads();
}

// df_warp_sum_d is the sum of v over the 32 lanes of a warp, to every lane.
__device__ __forceinline__ double df_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define DF_FOR(i, n)                                                                   \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);      \
         i += (long long)gridDim.x * blockDim.x)

// 16-bit floating-point formats: fp16 = 0 selects bfloat16, 1 selects IEEE binary16.
// Conversions round to nearest, ties to even (as kernels.RoundBF16 / RoundFP16 on the CPU).
__device__ __forceinline__ uint16_t df_to16(float x, int fp16) {
    if (fp16) return __half_as_ushort(__float2half_rn(x));
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float df_from16(uint16_t b, int fp16) {
    if (fp16) return __half2float(__ushort_as_half(b));
    return __bfloat162float(__ushort_as_bfloat16(b));
}
