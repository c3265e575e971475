// The 16-bit step's elementwise kernels of the distflash CUDA backend (kernels/cuda_half.go):
// the embedding gather from a 16-bit table, RMSNorm with 16-bit outputs and its one-pass
// backward, RoPE on the fused q|k|v rows, SwiGLU on the fused gate|up rows, cross-entropy with a
// 16-bit gradient, the gradient statistics, and AdamW writing the 16-bit copy.
//
// Numerics: each kernel computes every value as the float32 kernel of elementwise.cu does (and
// so as the CPU backend's reference, kernels/cpu_half.go: the float32 method on the exact values
// of the 16-bit inputs), with the same _rn intrinsics against contraction and the same float64
// steps, and rounds each 16-bit output once, to nearest even (common.cuh, df_to16).
//
// Layout: a 16-bit array is uint16_t, value i at byte 2i, which is PackHalf's packed buffer
// (two values a float32 element). The Go side hands every buffer at a 4-byte-aligned address, so
// the word of values 2k and 2k+1 is aligned. A thread writes whole values: the pair of a word
// (one 32-bit store) when the row lengths are even, else one value (a 16-bit store), so no two
// threads ever read-modify-write the same word. As PackHalf does, the pad half of the last word
// of an output of odd length is written 0 (h_pad).
#include "common.cuh"

// h_ld is value i of a 16-bit array.
__device__ __forceinline__ float h_ld(const uint16_t* p, long long i, int fp16) { return df_from16(p[i], fp16); }

// h_st stores v, rounded, as value i.
__device__ __forceinline__ void h_st(uint16_t* p, long long i, float v, int fp16) { p[i] = df_to16(v, fp16); }

// h_ld2 is the pair of values i and i+1 (i even: one aligned 32-bit load).
__device__ __forceinline__ float2 h_ld2(const uint16_t* p, long long i, int fp16) {
    uint32_t w = *reinterpret_cast<const uint32_t*>(p + i);
    return make_float2(df_from16((uint16_t)(w & 0xffffu), fp16), df_from16((uint16_t)(w >> 16), fp16));
}

// h_st2 stores a and b, rounded, as values i and i+1 (i even: one aligned 32-bit store).
__device__ __forceinline__ void h_st2(uint16_t* p, long long i, float a, float b, int fp16) {
    *reinterpret_cast<uint32_t*>(p + i) = (uint32_t)df_to16(a, fp16) | ((uint32_t)df_to16(b, fp16) << 16);
}

// h_pad zeroes the pad half of the last word of an array of n values when n is odd.
__device__ __forceinline__ void h_pad(uint16_t* p, long long n) {
    if (n & 1) p[n] = 0;
}

// h_rot0 and h_rot1 turn the pair (a, b) by the angle of (c, s) as the CPU's RoPE does:
// a·c − b·s and b·c + a·s, each product rounded.
__device__ __forceinline__ float h_rot0(float a, float b, float c, float s) {
    return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
__device__ __forceinline__ float h_rot1(float a, float b, float c, float s) {
    return __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// h_silu_up is silu(g)·u = g / (1 + exp(−g)) · u with exp in double, as df_swiglu.
__device__ __forceinline__ float h_silu_up(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, (float)exp(-(double)g))), u);
}

// h_swiglu_bwd is df_swiglu_bwd_act's element: act = silu(g)·u, du = d·g·s and
// dg = d·u·s·(1 + g·(1 − s)) with s = sigmoid(g), exp(−g) in double taken once.
__device__ __forceinline__ void h_swiglu_bwd(float g, float u, float d, float* act, float* dg, float* du) {
    double e = exp(-(double)g);
    *act = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, (float)e)), u);
    float s = (float)(1.0 / (1.0 + e));
    *du = __fmul_rn(__fmul_rn(d, g), s);
    float t = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s)));
    *dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), s), t);
}

// h_norm_bwd is one column of RMSNorm's backward (kernels.CPU.RMSNormBackward's float64
// operations, each rounded: no contraction): it adds dout·x·rs into *acc (the weight gradient's
// sum) and returns dx + (float)(rs·w·dout − k·x).
__device__ __forceinline__ float h_norm_bwd(double* acc, float dx, double rs, double k, float w, float d, float x) {
    *acc = __dadd_rn(*acc, __dmul_rn(__dmul_rn((double)d, (double)x), rs));
    return __fadd_rn(dx, (float)__dsub_rn(__dmul_rn(__dmul_rn(rs, (double)w), (double)d), __dmul_rn(k, (double)x)));
}

extern "C" {

// df_embedding16: block t widens row ids[t] of the 16-bit table (dim even: dim/2 words a row)
// into row t of the float32 out.
__global__ void df_embedding16(float* __restrict__ out, const uint32_t* __restrict__ table,
                               const int* __restrict__ ids, int ntok, int dim, int fp16) {
    int words = dim / 2;
    for (int t = blockIdx.x; t < ntok; t += gridDim.x) {
        const uint32_t* src = table + (long long)ids[t] * words;
        float* dst = out + (long long)t * dim;
        for (int k = threadIdx.x; k < words; k += blockDim.x) {
            uint32_t w = src[k];
            dst[2 * k] = df_from16((uint16_t)(w & 0xffffu), fp16);
            dst[2 * k + 1] = df_from16((uint16_t)(w >> 16), fp16);
        }
    }
}

// df_rmsnorm16: block per row of the float32 x; rstd = 1/sqrt(mean(x²) + eps) in double as
// df_rmsnorm, out = x·rstd·w with w and out 16-bit, and keep (when not null) = x rounded.
__global__ void df_rmsnorm16(uint16_t* __restrict__ out, uint16_t* __restrict__ keep, float* __restrict__ rstd,
                             const float* __restrict__ x, const uint16_t* __restrict__ w, int rows, int dim,
                             float eps, int fp16) {
    __shared__ double sh[32];
    long long total = (long long)rows * dim;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        long long off = (long long)r * dim;
        const float* xr = x + off;
        double ss = 0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            double v = xr[j];
            ss += v * v;
        }
        ss = df_block_sum_d(ss, sh);
        float rs = (float)(1.0 / sqrt(ss / dim + (double)eps));
        if (threadIdx.x == 0) rstd[r] = rs;
        if ((dim & 1) == 0) {
            for (int j = 2 * threadIdx.x; j < dim; j += 2 * blockDim.x) {
                float a = xr[j], b = xr[j + 1];
                float2 wj = h_ld2(w, j, fp16);
                h_st2(out, off + j, __fmul_rn(__fmul_rn(a, rs), wj.x), __fmul_rn(__fmul_rn(b, rs), wj.y), fp16);
                if (keep) h_st2(keep, off + j, a, b, fp16);
            }
        } else {
            for (int j = threadIdx.x; j < dim; j += blockDim.x) {
                float a = xr[j];
                h_st(out, off + j, __fmul_rn(__fmul_rn(a, rs), h_ld(w, j, fp16)), fp16);
                if (keep) h_st(keep, off + j, a, fp16);
            }
            if (r == rows - 1 && threadIdx.x == 0) {
                h_pad(out, total);
                if (keep) h_pad(keep, total);
            }
        }
    }
}

// df_rmsnorm16_bwd: RMSNorm's backward in one pass over the rows, with dout, x and w 16-bit.
// Block b takes the rows [b·rows/P, (b+1)·rows/P) (P = gridDim.x, a partition that depends on
// rows only) one after the other. For each row, with r = rstd and dot = Σ w·dout·x (float64,
// over the block's fixed tree), k = r³·dot/dim:
//   dx += (float)(r·w·dout − k·x), and dxh (when not null) = the new dx rounded;
//   acc += dout·x·r in float64, per column, kept by the thread that owns the column.
// The block's acc row ends in part[b·dim …]: in dynamic shared memory (accShared 1, 8·dim bytes)
// and copied out at the end, or (accShared 0, when dim is too wide) in part itself. The float64
// operations are those of the CPU (RMSNormBackward), each rounded (no contraction).
__global__ void df_rmsnorm16_bwd(float* __restrict__ dx, uint16_t* __restrict__ dxh, double* __restrict__ part,
                                 const uint16_t* __restrict__ dout, const uint16_t* __restrict__ x,
                                 const uint16_t* __restrict__ w, const float* __restrict__ rstd, int rows, int dim,
                                 int accShared, int fp16) {
    extern __shared__ double dyn[];
    __shared__ double sh[32];
    int P = gridDim.x, b = blockIdx.x;
    int lo = (int)((long long)rows * b / P), hi = (int)((long long)rows * (b + 1) / P);
    double* acc = accShared ? dyn : part + (long long)b * dim;
    // Thread threadIdx.x owns the columns j ≡ threadIdx.x (mod blockDim.x), or the pairs
    // (2k, 2k+1) with k ≡ threadIdx.x when dim is even: the same columns in every row.
    bool pairs = (dim & 1) == 0;
    int first = pairs ? 2 * threadIdx.x : threadIdx.x, stride = pairs ? 2 * blockDim.x : blockDim.x;
    for (int j = first; j < dim; j += stride) {
        acc[j] = 0;
        if (pairs) acc[j + 1] = 0;
    }
    long long total = (long long)rows * dim;
    for (int r = lo; r < hi; r++) {
        long long off = (long long)r * dim;
        double dot = 0;
        if (pairs) {
            for (int j = first; j < dim; j += stride) {
                float2 wj = h_ld2(w, j, fp16), dj = h_ld2(dout, off + j, fp16), xj = h_ld2(x, off + j, fp16);
                dot = __dadd_rn(dot, __dmul_rn(__dmul_rn((double)wj.x, (double)dj.x), (double)xj.x));
                dot = __dadd_rn(dot, __dmul_rn(__dmul_rn((double)wj.y, (double)dj.y), (double)xj.y));
            }
        } else {
            for (int j = first; j < dim; j += stride)
                dot = __dadd_rn(dot, __dmul_rn(__dmul_rn((double)h_ld(w, j, fp16), (double)h_ld(dout, off + j, fp16)),
                                               (double)h_ld(x, off + j, fp16)));
        }
        dot = df_block_sum_d(dot, sh);
        double rs = rstd[r];
        double k = __ddiv_rn(__dmul_rn(__dmul_rn(__dmul_rn(rs, rs), rs), dot), (double)dim);
        if (pairs) {
            for (int j = first; j < dim; j += stride) {
                float2 wj = h_ld2(w, j, fp16), dj = h_ld2(dout, off + j, fp16), xj = h_ld2(x, off + j, fp16);
                float n0 = h_norm_bwd(&acc[j], dx[off + j], rs, k, wj.x, dj.x, xj.x);
                float n1 = h_norm_bwd(&acc[j + 1], dx[off + j + 1], rs, k, wj.y, dj.y, xj.y);
                dx[off + j] = n0;
                dx[off + j + 1] = n1;
                if (dxh) h_st2(dxh, off + j, n0, n1, fp16);
            }
        } else {
            for (int j = first; j < dim; j += stride) {
                float n0 = h_norm_bwd(&acc[j], dx[off + j], rs, k, h_ld(w, j, fp16), h_ld(dout, off + j, fp16),
                                      h_ld(x, off + j, fp16));
                dx[off + j] = n0;
                if (dxh) h_st(dxh, off + j, n0, fp16);
            }
            if (dxh && r == rows - 1 && threadIdx.x == 0) h_pad(dxh, total);
        }
    }
    if (accShared) {
        double* out = part + (long long)b * dim;
        for (int j = first; j < dim; j += stride) {
            out[j] = acc[j];
            if (pairs) out[j + 1] = acc[j + 1];
        }
    }
}

// df_rmsnorm16_dw: dw[j] = (beta 0: 0, else dw[j]) + (float)Σ_p part[p·dim + j]. A block takes
// 32 columns with blockDim.x/32 lanes each: lane l adds the parts p ≡ l (mod lanes) in order, and
// the lanes' sums are added in lane order, a fixed tree (parts 0 leaves dw[j] + 0).
__global__ void df_rmsnorm16_dw(float* __restrict__ dw, const double* __restrict__ part, int dim, int parts,
                                float beta) {
    __shared__ double sh[32][33];
    int c = threadIdx.x & 31, l = threadIdx.x >> 5, lanes = blockDim.x >> 5;
    int j = blockIdx.x * 32 + c;
    double s = 0;
    if (j < dim)
        for (int p = l; p < parts; p += lanes) s += part[(long long)p * dim + j];
    sh[l][c] = s;
    __syncthreads();
    if (l == 0 && j < dim) {
        double t = 0;
        for (int q = 0; q < lanes; q++) t += sh[q][c];
        dw[j] = __fadd_rn(beta != 0.0f ? dw[j] : 0.0f, (float)t);
    }
}

// df_rope_qkv16: block per token t. With Q = heads·hd, KV = kvheads·hd, the fused row
// qkv[t] = q | k | v (Q + 2·KV values) and the rows q[t] (Q), k[t] (KV), v[t] (KV), all 16-bit:
//   bwd 0: q[t], k[t] = RoPE(the q and k parts), v[t] = the v part;
//   bwd 1: qkv[t] = RoPE⁻¹(q[t]) | RoPE⁻¹(k[t]) | v[t].
// The angles pos·invfreq[i], their sine and cosine in double, times scale and rounded to float32
// as df_rope; each head's pair (i, i + hd/2) turned as the CPU turns it. An odd hd's last value
// of each head is copied, as the CPU leaves it. Dynamic shared memory: 2·(hd/2) floats.
__global__ void df_rope_qkv16(uint16_t* qkv, uint16_t* q, uint16_t* k, uint16_t* v, const int* __restrict__ pos,
                              const double* __restrict__ invfreq, int ntok, int heads, int kvheads, int hd,
                              double scale, int bwd, int fp16) {
    extern __shared__ float cs[];
    int half = hd / 2;
    float* cosv = cs;
    float* sinv = cs + half;
    long long Q = (long long)heads * hd, KV = (long long)kvheads * hd, W = Q + 2 * KV;
    int nh = heads + kvheads;
    for (int t = blockIdx.x; t < ntok; t += gridDim.x) {
        df_rope_angles(cosv, sinv, half, pos[t], invfreq, scale, bwd);
        uint16_t* row = qkv + t * W;
        uint16_t* qt = q + t * Q;
        uint16_t* kt = k + t * KV;
        // Head h < heads is q's, the others k's: at h·hd in the fused row either way.
        if ((hd & 3) == 0) {  // value pairs (i, i+1) of each half: whole aligned words
            int hp = half / 2;
            for (int e = threadIdx.x; e < nh * hp; e += blockDim.x) {
                int h = e / hp, i = 2 * (e % hp);
                uint16_t* f = row + (long long)h * hd;
                uint16_t* s = h < heads ? qt + (long long)h * hd : kt + (long long)(h - heads) * hd;
                const uint16_t* src = bwd ? s : f;
                uint16_t* dst = bwd ? f : s;
                float2 a = h_ld2(src, i, fp16), b = h_ld2(src, i + half, fp16);
                float c0 = cosv[i], s0 = sinv[i], c1 = cosv[i + 1], s1 = sinv[i + 1];
                h_st2(dst, i, h_rot0(a.x, b.x, c0, s0), h_rot0(a.y, b.y, c1, s1), fp16);
                h_st2(dst, i + half, h_rot1(a.x, b.x, c0, s0), h_rot1(a.y, b.y, c1, s1), fp16);
            }
        } else {
            for (int e = threadIdx.x; e < nh * half; e += blockDim.x) {
                int h = e / half, i = e % half;
                uint16_t* f = row + (long long)h * hd;
                uint16_t* s = h < heads ? qt + (long long)h * hd : kt + (long long)(h - heads) * hd;
                const uint16_t* src = bwd ? s : f;
                uint16_t* dst = bwd ? f : s;
                float a = h_ld(src, i, fp16), b = h_ld(src, i + half, fp16);
                h_st(dst, i, h_rot0(a, b, cosv[i], sinv[i]), fp16);
                h_st(dst, i + half, h_rot1(a, b, cosv[i], sinv[i]), fp16);
            }
            if (hd & 1) {
                for (int h = threadIdx.x; h < nh; h += blockDim.x) {
                    uint16_t* f = row + (long long)h * hd + hd - 1;
                    uint16_t* s = (h < heads ? qt + (long long)h * hd : kt + (long long)(h - heads) * hd) + hd - 1;
                    if (bwd) *f = *s;
                    else *s = *f;
                }
            }
        }
        uint16_t* vf = row + Q + KV;
        uint16_t* vt = v + t * KV;
        if ((hd & 1) == 0) {  // Q, KV and the rows even: copy words
            uint32_t* d = reinterpret_cast<uint32_t*>(bwd ? vf : vt);
            const uint32_t* s = reinterpret_cast<const uint32_t*>(bwd ? vt : vf);
            for (long long j = threadIdx.x; j < KV / 2; j += blockDim.x) d[j] = s[j];
        } else {
            uint16_t* d = bwd ? vf : vt;
            const uint16_t* s = bwd ? vt : vf;
            for (long long j = threadIdx.x; j < KV; j += blockDim.x) d[j] = s[j];
        }
        if (t == ntok - 1 && threadIdx.x == 0) {
            if (bwd) {
                h_pad(qkv, ntok * W);
            } else {
                h_pad(q, ntok * Q);
                h_pad(k, ntok * KV);
                h_pad(v, ntok * KV);
            }
        }
    }
}

// df_swiglu16: block per row; act[r] = silu(gate)·up from the fused row gu[r] = gate | up
// (2·ffn values), all 16-bit.
__global__ void df_swiglu16(uint16_t* __restrict__ act, const uint16_t* __restrict__ gu, int rows, int ffn, int fp16) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const uint16_t* g = gu + (long long)r * 2 * ffn;
        const uint16_t* u = g + ffn;
        long long off = (long long)r * ffn;
        if ((ffn & 1) == 0) {
            for (int j = 2 * threadIdx.x; j < ffn; j += 2 * blockDim.x) {
                float2 gj = h_ld2(g, j, fp16), uj = h_ld2(u, j, fp16);
                h_st2(act, off + j, h_silu_up(gj.x, uj.x), h_silu_up(gj.y, uj.y), fp16);
            }
        } else {
            for (int j = threadIdx.x; j < ffn; j += blockDim.x)
                h_st(act, off + j, h_silu_up(h_ld(g, j, fp16), h_ld(u, j, fp16)), fp16);
            if (r == rows - 1 && threadIdx.x == 0) h_pad(act, (long long)rows * ffn);
        }
    }
}

// df_swiglu16_bwd: block per row; from dact[r] (ffn values) and gu[r] = gate | up, writes
// dgu[r] = dgate | dup and, when act is not null, act[r] = silu(gate)·up, all 16-bit, each value
// as df_swiglu_bwd_act computes it.
__global__ void df_swiglu16_bwd(uint16_t* __restrict__ dgu, uint16_t* __restrict__ act,
                                const uint16_t* __restrict__ dact, const uint16_t* __restrict__ gu, int rows,
                                int ffn, int fp16) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        long long row2 = (long long)r * 2 * ffn, off = (long long)r * ffn;
        const uint16_t* g = gu + row2;
        const uint16_t* u = g + ffn;
        uint16_t* dg = dgu + row2;
        uint16_t* du = dg + ffn;
        if ((ffn & 1) == 0) {
            for (int j = 2 * threadIdx.x; j < ffn; j += 2 * blockDim.x) {
                float2 gj = h_ld2(g, j, fp16), uj = h_ld2(u, j, fp16), dj = h_ld2(dact, off + j, fp16);
                float a0, a1, g0, g1, u0, u1;
                h_swiglu_bwd(gj.x, uj.x, dj.x, &a0, &g0, &u0);
                h_swiglu_bwd(gj.y, uj.y, dj.y, &a1, &g1, &u1);
                h_st2(dg, j, g0, g1, fp16);
                h_st2(du, j, u0, u1, fp16);
                if (act) h_st2(act, off + j, a0, a1, fp16);
            }
        } else {
            for (int j = threadIdx.x; j < ffn; j += blockDim.x) {
                float a0, g0, u0;
                h_swiglu_bwd(h_ld(g, j, fp16), h_ld(u, j, fp16), h_ld(dact, off + j, fp16), &a0, &g0, &u0);
                h_st(dg, j, g0, fp16);
                h_st(du, j, u0, fp16);
                if (act) h_st(act, off + j, a0, fp16);
            }
            if (act && r == rows - 1 && threadIdx.x == 0) h_pad(act, (long long)rows * ffn);
        }
    }
}

// df_xent16: df_xent with a 16-bit dlogits (its own buffer, never logits): block per row,
// losses[r] = lse − logit[target] (0 for a negative target), dlogits[r] = (softmax −
// onehot)·dscale rounded (0 for an ignored row).
__global__ void df_xent16(float* __restrict__ losses, uint16_t* __restrict__ dlogits, const float* __restrict__ logits,
                          const int* __restrict__ targets, int rows, long long vocab, float dscale, int fp16) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = logits + (long long)r * vocab;
        int t = targets[r];
        double lse = df_row_lse(row, vocab, shd, shf);
        if (threadIdx.x == 0) losses[r] = t < 0 ? 0.0f : (float)(lse - (double)row[t]);
        uint16_t* drow = dlogits + (long long)r * vocab;
        if ((vocab & 1) == 0) {
            for (long long j = 2 * threadIdx.x; j < vocab; j += 2 * blockDim.x) {
                float p0 = 0, p1 = 0;
                if (t >= 0) {
                    p0 = __fmul_rn((float)exp((double)row[j] - lse), dscale);
                    p1 = __fmul_rn((float)exp((double)row[j + 1] - lse), dscale);
                    if (j == t) p0 = __fsub_rn(p0, dscale);
                    if (j + 1 == t) p1 = __fsub_rn(p1, dscale);
                }
                h_st2(drow, j, p0, p1, fp16);
            }
        } else {
            for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
                float p = 0;
                if (t >= 0) {
                    p = __fmul_rn((float)exp((double)row[j] - lse), dscale);
                    if (j == t) p = __fsub_rn(p, dscale);
                }
                h_st(drow, j, p, fp16);
            }
            if (r == rows - 1 && threadIdx.x == 0) h_pad(dlogits, (long long)rows * vocab);
        }
    }
}

// df_gradstats: one block. s = Σ part[0..parts) in float64 over the block's fixed tree (the
// partial sums of squares df_sumsq_partial wrote over a partition fixed by the length), then
// dst = {hi = (float)s, lo = (float)(s − hi), 0}, or {hi, 0, 1} when s is Inf or NaN: Σ g² of
// float32 values in float64 is finite exactly when every g is (kernels.CPU.GradStats).
__global__ void df_gradstats(float* __restrict__ dst, const double* __restrict__ part, int parts) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
    s = df_block_sum_d(s, sh);
    if (threadIdx.x == 0) {
        float hi = (float)s, lo = (float)(s - (double)hi), bad = 0;
        if (isinf(s) || isnan(s)) {
            lo = 0;
            bad = 1;
        }
        dst[0] = hi;
        dst[1] = lo;
        dst[2] = bad;
    }
}

// df_adamw_multi16: df_adamw_multi that also stores every updated parameter, rounded, into the
// 16-bit copy half (n values, laid out like p; its pad half is zeroed with the last element).
__global__ void df_adamw_multi16(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, uint16_t* __restrict__ half,
                                 const long long* __restrict__ seg, int nseg, float b1, float b2, float c1,
                                 float c2, float lr, float eps, float gs, float wd, long long n, int fp16) {
    for (int s = 0; s < nseg; s++) {
        long long off = seg[3 * s], len = seg[3 * s + 1];
        float w = seg[3 * s + 2] ? wd : 0.0f;
        DF_FOR(i, len) {
            long long e = off + i;
            h_st(half, e, df_adamw_elem(p, g, m, v, e, b1, b2, c1, c2, lr, eps, gs, w), fp16);
            if (e == n - 1) h_pad(half, n);
        }
    }
}

}  // extern "C"
