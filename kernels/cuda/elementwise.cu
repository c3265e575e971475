// Non-attention kernels of the distflash CUDA backend: vector arithmetic, reductions, embedding,
// RMSNorm, RoPE, SwiGLU, cross-entropy, AdamW and 16-bit casts. Each mirrors the CPU kernel of
// the same name in kernels/cpu.go (see there for the formulas); the launch geometry is chosen in
// kernels/cuda_geom.go. Sizes that can pass 2^31 elements (logits, parameters) are long long.
#include "common.cuh"

extern "C" {

__global__ void df_add(float* __restrict__ d, const float* a, const float* b, long long n) {
    DF_FOR(i, n) d[i] = __fadd_rn(a[i], b[i]);
}

__global__ void df_scale(float* x, float s, long long n) {
    DF_FOR(i, n) x[i] = __fmul_rn(x[i], s);
}

// df_sumsq_partial: block b sums the squares of the elements [b·n/G, (b+1)·n/G) in double
// into part[b] (G = gridDim.x). The host adds the G partials in order.
__global__ void df_sumsq_partial(const float* __restrict__ x, long long n, double* __restrict__ part) {
    __shared__ double sh[32];
    long long lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1) / gridDim.x;
    double s = 0;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double v = x[i];
        s += v * v;
    }
    s = df_block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// df_allfinite sets *bad = 1 when an element is Inf or NaN (the host zeroes *bad first).
__global__ void df_allfinite(const float* __restrict__ x, long long n, int* bad) {
    int found = 0;
    DF_FOR(i, n) found |= !isfinite(x[i]);
    if (__syncthreads_or(found) && threadIdx.x == 0) *bad = 1;
}

// df_embedding: block t copies row ids[t] of table into row t of out.
__global__ void df_embedding(float* __restrict__ out, const float* __restrict__ table,
                             const int* __restrict__ ids, int ntok, int dim) {
    for (int t = blockIdx.x; t < ntok; t += gridDim.x) {
        const float* src = table + (long long)ids[t] * dim;
        float* dst = out + (long long)t * dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
    }
}

// df_embedding_bwd: group u holds the tokens order[start[u]..start[u+1]) that share one id, in
// increasing token order; its block adds their gradient rows into dtable[id] one after the
// other, the same float32 additions in the same order as the CPU, without atomics.
__global__ void df_embedding_bwd(float* __restrict__ dtable, const float* __restrict__ dout,
                                 const int* __restrict__ ids, const int* __restrict__ order,
                                 const int* __restrict__ start, int ngroups, int dim) {
    for (int u = blockIdx.x; u < ngroups; u += gridDim.x) {
        int s0 = start[u], s1 = start[u + 1];
        float* row = dtable + (long long)ids[order[s0]] * dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float acc = row[j];
            for (int k = s0; k < s1; k++) acc = __fadd_rn(acc, dout[(long long)order[k] * dim + j]);
            row[j] = acc;
        }
    }
}

// df_rmsnorm: block per row; out = x·rstd·w with rstd = 1/sqrt(mean(x²) + eps) in double.
__global__ void df_rmsnorm(float* __restrict__ out, float* __restrict__ rstd, const float* __restrict__ x,
                           const float* __restrict__ w, int rows, int dim, float eps) {
    __shared__ double sh[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * dim;
        double ss = 0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            double v = xr[j];
            ss += v * v;
        }
        ss = df_block_sum_d(ss, sh);
        float rs = (float)(1.0 / sqrt(ss / dim + (double)eps));
        if (threadIdx.x == 0) rstd[r] = rs;
        float* orow = out + (long long)r * dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) orow[j] = __fmul_rn(__fmul_rn(xr[j], rs), w[j]);
    }
}

// df_add_rmsnorm: block per row; sum = a + b (sum may alias a or b), then out and rstd as
// df_rmsnorm computes them from sum: each thread reads back the sums it wrote, and the squares
// are summed by the same threads in the same tree, so the values equal df_add then df_rmsnorm.
__global__ void df_add_rmsnorm(float* sum, float* __restrict__ out, float* __restrict__ rstd, const float* a,
                               const float* b, const float* __restrict__ w, int rows, int dim, float eps) {
    __shared__ double sh[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        long long off = (long long)r * dim;
        double ss = 0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float h = __fadd_rn(a[off + j], b[off + j]);
            sum[off + j] = h;
            double v = h;
            ss += v * v;
        }
        ss = df_block_sum_d(ss, sh);
        float rs = (float)(1.0 / sqrt(ss / dim + (double)eps));
        if (threadIdx.x == 0) rstd[r] = rs;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) out[off + j] = __fmul_rn(__fmul_rn(sum[off + j], rs), w[j]);
    }
}

// df_rmsnorm_bwd_dx: block per row; dx += r·w∘dout − r³/dim·x·(Σ w∘dout∘x), in double.
__global__ void df_rmsnorm_bwd_dx(float* __restrict__ dx, const float* __restrict__ dout,
                                  const float* __restrict__ x, const float* __restrict__ w,
                                  const float* __restrict__ rstd, int rows, int dim) {
    __shared__ double sh[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        long long off = (long long)r * dim;
        double dot = 0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            dot += (double)w[j] * (double)dout[off + j] * (double)x[off + j];
        dot = df_block_sum_d(dot, sh);
        double rs = rstd[r];
        double k = rs * rs * rs * dot / dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            dx[off + j] = __fadd_rn(dx[off + j], (float)(rs * (double)w[j] * (double)dout[off + j] - k * (double)x[off + j]));
    }
}

// df_rmsnorm_bwd_dw_partial: part[p·dim + j] = Σ over the rows [p·rows/P, (p+1)·rows/P) of
// dout·x·rstd in double (P = gridDim.y: a partition that depends only on rows).
__global__ void df_rmsnorm_bwd_dw_partial(double* __restrict__ part, const float* __restrict__ dout,
                                          const float* __restrict__ x, const float* __restrict__ rstd,
                                          int rows, int dim) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    int p = blockIdx.y, P = gridDim.y;
    int lo = (int)((long long)rows * p / P), hi = (int)((long long)rows * (p + 1) / P);
    double acc = 0;
    for (int r = lo; r < hi; r++) {
        long long off = (long long)r * dim + j;
        acc += (double)dout[off] * (double)x[off] * (double)rstd[r];
    }
    part[(long long)p * dim + j] = acc;
}

// df_rmsnorm_bwd_dw_final: dw[j] += Σ_p part[p·dim + j], the parts added in order.
__global__ void df_rmsnorm_bwd_dw_final(float* __restrict__ dw, const double* __restrict__ part, int dim, int parts) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    double s = 0;
    for (int p = 0; p < parts; p++) s += part[(long long)p * dim + j];
    dw[j] = __fadd_rn(dw[j], (float)s);
}

// df_rope: block per token; the angles pos·invfreq[i] and their sine and cosine are computed in
// double (exact at 512K positions), multiplied by scale (YaRN's attention factor, else 1),
// rounded to float32, then every head of the token is turned. Dynamic shared memory: 2·(hd/2)
// floats.
__global__ void df_rope(float* __restrict__ x, const int* __restrict__ pos, const double* __restrict__ invfreq,
                        int ntok, int heads, int hd, int inverse, double scale) {
    extern __shared__ float cs[];
    int half = hd / 2;
    float* cosv = cs;
    float* sinv = cs + half;
    for (int t = blockIdx.x; t < ntok; t += gridDim.x) {
        df_rope_angles(cosv, sinv, half, pos[t], invfreq, scale, inverse);
        float* xt = x + (long long)t * heads * hd;
        for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
            int h = e / half, i = e % half;
            float* v = xt + h * hd;
            float a = v[i], b = v[i + half];
            v[i] = __fsub_rn(__fmul_rn(a, cosv[i]), __fmul_rn(b, sinv[i]));
            v[i + half] = __fadd_rn(__fmul_rn(b, cosv[i]), __fmul_rn(a, sinv[i]));
        }
    }
}

// df_swiglu: out = silu(g)·u with silu(x) = x / (1 + exp(−x)), exp in double as on the CPU.
__global__ void df_swiglu(float* __restrict__ out, const float* __restrict__ g, const float* __restrict__ u, long long n) {
    DF_FOR(i, n) {
        float x = g[i];
        float s = __fdiv_rn(x, __fadd_rn(1.0f, (float)exp(-(double)x)));
        out[i] = __fmul_rn(s, u[i]);
    }
}

// df_swiglu_bwd overwrites dg and du: with s = sigmoid(g), du = dout·g·s and
// dg = dout·u·s·(1 + g·(1 − s)).
__global__ void df_swiglu_bwd(float* __restrict__ dg, float* __restrict__ du, const float* __restrict__ dout,
                              const float* __restrict__ g, const float* __restrict__ u, long long n) {
    DF_FOR(i, n) {
        float gi = g[i], d = dout[i];
        float s = (float)(1.0 / (1.0 + exp(-(double)gi)));
        du[i] = __fmul_rn(__fmul_rn(d, gi), s);
        float t = __fadd_rn(1.0f, __fmul_rn(gi, __fsub_rn(1.0f, s)));
        dg[i] = __fmul_rn(__fmul_rn(__fmul_rn(d, u[i]), s), t);
    }
}

// df_swiglu_bwd_act is df_swiglu and df_swiglu_bwd in one pass: act = silu(g)·u, and dg and du
// overwritten as df_swiglu_bwd writes them. exp(−g) in double, which both take, is computed
// once: the same values.
__global__ void df_swiglu_bwd_act(float* __restrict__ act, float* __restrict__ dg, float* __restrict__ du,
                                  const float* __restrict__ dout, const float* __restrict__ g,
                                  const float* __restrict__ u, long long n) {
    DF_FOR(i, n) {
        float gi = g[i], d = dout[i], ui = u[i];
        double e = exp(-(double)gi);
        act[i] = __fmul_rn(__fdiv_rn(gi, __fadd_rn(1.0f, (float)e)), ui);
        float s = (float)(1.0 / (1.0 + e));
        du[i] = __fmul_rn(__fmul_rn(d, gi), s);
        float t = __fadd_rn(1.0f, __fmul_rn(gi, __fsub_rn(1.0f, s)));
        dg[i] = __fmul_rn(__fmul_rn(__fmul_rn(d, ui), s), t);
    }
}

// df_xent: block per row of logits. losses[r] = lse − logit[target] (0 for a negative target);
// when dlogits is not null it is overwritten by (softmax − onehot)·dscale (0 for an ignored row).
// dlogits may be logits: every element is read (max, sum) before any is written.
__global__ void df_xent(float* __restrict__ losses, float* dlogits, const float* logits,
                        const int* __restrict__ targets, int rows, long long vocab, float dscale) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = logits + (long long)r * vocab;
        int t = targets[r];
        double lse = df_row_lse(row, vocab, shd, shf);
        if (threadIdx.x == 0) losses[r] = t < 0 ? 0.0f : (float)(lse - (double)row[t]);
        if (dlogits == nullptr) continue;
        __syncthreads();  // every thread has read row[t] before it may be overwritten
        float* drow = dlogits + (long long)r * vocab;
        for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
            if (t < 0) {
                drow[j] = 0;
                continue;
            }
            float p = __fmul_rn((float)exp((double)row[j] - lse), dscale);
            drow[j] = j == t ? __fsub_rn(p, dscale) : p;
        }
    }
}

// df_adamw: one AdamW update of the n elements.
__global__ void df_adamw(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                         float* __restrict__ v, long long n, float b1, float b2, float c1, float c2,
                         float lr, float eps, float gs, float wd) {
    DF_FOR(i, n) df_adamw_elem(p, g, m, v, i, b1, b2, c1, c2, lr, eps, gs, wd);
}

// df_adamw_multi: the AdamW update of every segment in one launch (multi-tensor): segment s is
// the elements [seg[3s], seg[3s] + seg[3s+1]) with weight decay wd when seg[3s+2] is 1, none
// when 0; the grid strides over each segment in turn. Elements outside the segments are left.
__global__ void df_adamw_multi(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                               float* __restrict__ v, const long long* __restrict__ seg, int nseg, float b1,
                               float b2, float c1, float c2, float lr, float eps, float gs, float wd) {
    for (int s = 0; s < nseg; s++) {
        long long off = seg[3 * s], n = seg[3 * s + 1];
        float w = seg[3 * s + 2] ? wd : 0.0f;
        DF_FOR(i, n) df_adamw_elem(p, g, m, v, off + i, b1, b2, c1, c2, lr, eps, gs, w);
    }
}

// df_round rounds every element to the nearest bfloat16 (fp16 = 0) or binary16 (fp16 = 1) value.
__global__ void df_round(float* x, long long n, int fp16) {
    DF_FOR(i, n) x[i] = df_from16(df_to16(x[i], fp16), fp16);
}

// df_pack_half writes the 16-bit encodings of the n values of src two per 32-bit word: element
// 2i in the low half of dst[i], 2i+1 in the high half (0 past the end).
__global__ void df_pack_half(uint32_t* __restrict__ dst, const float* __restrict__ src, long long n, int fp16) {
    long long words = (n + 1) / 2;
    DF_FOR(i, words) {
        uint32_t lo = df_to16(src[2 * i], fp16);
        uint32_t hi = 2 * i + 1 < n ? df_to16(src[2 * i + 1], fp16) : 0;
        dst[i] = lo | (hi << 16);
    }
}

// df_unpack_half is the inverse of df_pack_half: n float32 values from the packed words.
__global__ void df_unpack_half(float* __restrict__ dst, const uint32_t* __restrict__ src, long long n, int fp16) {
    DF_FOR(i, n) {
        uint32_t w = src[i / 2];
        dst[i] = df_from16((uint16_t)((i & 1) ? (w >> 16) : (w & 0xffffu)), fp16);
    }
}

// df_to_half converts n float32 values into 16-bit storage (the attention kernels' operands).
__global__ void df_to_half(uint16_t* __restrict__ dst, const float* __restrict__ src, long long n, int fp16) {
    DF_FOR(i, n) dst[i] = df_to16(src[i], fp16);
}

}  // extern "C"
