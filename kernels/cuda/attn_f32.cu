// Attention in float32 on the CUDA cores: the state kernels (merge, finish, backward prep) that
// every precision uses, and the block forward and backward used when the backend's precision is
// FP32 or the head dimension has no tensor-core instantiation (attn_mma.cu). Same semantics as
// kernels/cpu_attn.go: q, o, dq, do are [nq, H, hd]; k, v, dk, dv [nk, KVH, hd]; m, l, lse, D
// [H, nq]; query head h reads kv head h / (H / KVH); key j is visible to query i iff
// !causal || qpos[i] >= kpos[j], and with a document mask (qstart not null, causal only) also
// kpos[j] >= qstart[i], the position at which query i's document starts.
//
// Tiling (kernels/cuda_geom.go computes the same tiles on the host, for the counters and the
// launch): a block of F32_BQ = 64 threads holds 64 queries of one head, one per thread, and walks
// the keys in tiles of F32_BK = 32 staged in shared memory. A tile whose keys are all later than
// every query of the block (qmax[block] < kmin[tile], bounds precomputed on the host), or with
// a document mask all earlier than every query's document start (qsmin[block] > kmax[tile]), is
// skipped.
// The block backward is two kernels, one for dQ (per query block) and one for dK and dV (per key
// block of a kv head, looping over the query heads of its group in order), so that no gradient
// needs atomics and results are reproducible run to run.
#include "common.cuh"

#define F32_BQ 64
#define F32_BK 32
#define F32_INT_MIN (-2147483647 - 1)

extern "C" {

// df_attn_merge: warp per (query, head) row; folds state 2 into state 1 by their maxima.
__global__ void df_attn_merge(float* __restrict__ o1, float* __restrict__ m1, float* __restrict__ l1,
                              const float* __restrict__ o2, const float* __restrict__ m2,
                              const float* __restrict__ l2, int nq, int heads, int hd) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    long long j = (long long)h * nq + i;
    float mb = m2[j];
    if (mb == DF_NEG_INF) return;
    float ma = m1[j];
    float m = fmaxf(ma, mb);
    float ca = (float)exp((double)__fsub_rn(ma, m));
    float cb = (float)exp((double)__fsub_rn(mb, m));
    float* x = o1 + row * hd;
    const float* y = o2 + row * hd;
    for (int d = lane; d < hd; d += 32) x[d] = __fadd_rn(__fmul_rn(x[d], ca), __fmul_rn(y[d], cb));
    __syncwarp();
    if (lane == 0) {
        l1[j] = __fadd_rn(__fmul_rn(l1[j], ca), __fmul_rn(l2[j], cb));
        m1[j] = m;
    }
}

// df_attn_finish: warp per row; o = so / l and lse = m + log(l); a row that saw no key (l = 0)
// gets o = 0 and lse = −Inf. o may be so.
__global__ void df_attn_finish(float* o, float* __restrict__ lse, const float* so, const float* __restrict__ m,
                               const float* __restrict__ l, int nq, int heads, int hd) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    long long j = (long long)h * nq + i;
    float li = l[j];
    float* x = o + row * hd;
    const float* y = so + row * hd;
    if (li == 0) {
        for (int d = lane; d < hd; d += 32) x[d] = 0;
        if (lane == 0) lse[j] = DF_NEG_INF;
        return;
    }
    float inv = __fdiv_rn(1.0f, li);
    for (int d = lane; d < hd; d += 32) x[d] = __fmul_rn(y[d], inv);
    if (lane == 0) lse[j] = __fadd_rn(m[j], (float)log((double)li));
}

// df_attn_prep: warp per row; D = Σ_d o·do in double.
__global__ void df_attn_prep(float* __restrict__ dd, const float* __restrict__ o, const float* __restrict__ dout,
                             int nq, int heads, int hd) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    double s = 0;
    for (int d = lane; d < hd; d += 32) s += (double)o[row * hd + d] * (double)dout[row * hd + d];
    s = df_warp_sum_d(s);
    if (lane == 0) dd[(long long)h * nq + i] = (float)s;
}

// df_attn_prep16: df_attn_prep of o and dout packed in 16 bits (bf16, or fp16 when fp16 is set).
__global__ void df_attn_prep16(float* __restrict__ dd, const uint16_t* __restrict__ o, const uint16_t* __restrict__ dout,
                               int nq, int heads, int hd, int fp16) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)nq * heads) return;
    int i = (int)(row / heads), h = (int)(row % heads);
    double s = 0;
    for (int d = lane; d < hd; d += 32)
        s += (double)df_from16(o[row * hd + d], fp16) * (double)df_from16(dout[row * hd + d], fp16);
    s = df_warp_sum_d(s);
    if (lane == 0) dd[(long long)h * nq + i] = (float)s;
}

// df_attn_fwd_f32 folds keys/values k, v into the state (o, m, l) of queries q.
// Grid (ceil(nq/64), H), block 64 threads; dynamic shared memory 2·32·hd floats.
// qtmax are the maxima of qpos over the 64-query tiles, ktmin the minima of kpos over the 32-key
// tiles (unused, may be null, when not causal). qstart, the document start of each query, is
// null without a document mask; with one, qtsmin are its minima over the 64-query tiles and
// ktmax the maxima of kpos over the 32-key tiles.
__global__ void __launch_bounds__(F32_BQ) df_attn_fwd_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    float* __restrict__ o, float* __restrict__ ms, float* __restrict__ ls,
    const int* __restrict__ qpos, const int* __restrict__ kpos,
    const int* __restrict__ qtmax, const int* __restrict__ ktmin,
    const int* __restrict__ qstart, const int* __restrict__ qtsmin, const int* __restrict__ ktmax,
    int nq, int nk, int H, int KVH, int hd, float scale, int causal) {
    extern __shared__ float sm[];
    float* sK = sm;
    float* sV = sm + F32_BK * hd;
    __shared__ int sKP[F32_BK];
    int h = blockIdx.y, g = h / (H / KVH);
    int i = blockIdx.x * F32_BQ + threadIdx.x;
    bool valid = i < nq;
    int qp = valid && causal ? qpos[i] : 0;
    int qst = valid && qstart ? qstart[i] : F32_INT_MIN;
    long long qs = (long long)H * hd, ks = (long long)KVH * hd;
    const float* qrow = q + (valid ? i : 0) * qs + h * hd;
    float* orow = o + (valid ? i : 0) * qs + h * hd;
    float mi = valid ? ms[(long long)h * nq + i] : DF_NEG_INF;
    float li = valid ? ls[(long long)h * nq + i] : 0.0f;
    float s[F32_BK];
    int ntiles = (nk + F32_BK - 1) / F32_BK;
    for (int t = 0; t < ntiles; t++) {
        if (causal && (qtmax[blockIdx.x] < ktmin[t] || (qstart && qtsmin[blockIdx.x] > ktmax[t])))
            continue;  // uniform over the block
        int j0 = t * F32_BK, nj = min(F32_BK, nk - j0);
        __syncthreads();
        for (int e = threadIdx.x; e < nj * hd; e += F32_BQ) {
            int jj = e / hd, d = e % hd;
            sK[jj * hd + d] = k[(j0 + jj) * ks + g * hd + d];
            sV[jj * hd + d] = v[(j0 + jj) * ks + g * hd + d];
        }
        if (threadIdx.x < nj) sKP[threadIdx.x] = causal ? kpos[j0 + threadIdx.x] : 0;
        __syncthreads();
        if (!valid) continue;
        float mx = DF_NEG_INF;
        for (int jj = 0; jj < F32_BK; jj++) {
            float x = DF_NEG_INF;
            if (jj < nj && (!causal || (sKP[jj] <= qp && sKP[jj] >= qst))) {
                float acc = 0;
                for (int d = 0; d < hd; d++) acc = fmaf(qrow[d], sK[jj * hd + d], acc);
                x = acc * scale;
            }
            s[jj] = x;
            mx = fmaxf(mx, x);
        }
        if (mx == DF_NEG_INF) continue;  // every key of this tile is masked for this query
        float mnew = fmaxf(mi, mx);
        float corr = expf(mi - mnew);  // 0 when mi = −Inf
        float sum = 0;
        for (int jj = 0; jj < F32_BK; jj++) {
            float p = expf(s[jj] - mnew);  // masked: exp(−Inf) = 0
            s[jj] = p;
            sum += p;
        }
        li = li * corr + sum;
        mi = mnew;
        for (int d = 0; d < hd; d++) {
            float acc = 0;
            for (int jj = 0; jj < nj; jj++) acc = fmaf(s[jj], sV[jj * hd + d], acc);
            orow[d] = fmaf(orow[d], corr, acc);
        }
    }
    if (valid) {
        ms[(long long)h * nq + i] = mi;
        ls[(long long)h * nq + i] = li;
    }
}

// df_attn_bwd_dq_f32 adds one block of keys' contribution to dq: per key, P = exp(S − lse),
// dS = P·(dO·V − D), dq += scale·dS·K. Geometry and masks as df_attn_fwd_f32.
__global__ void __launch_bounds__(F32_BQ) df_attn_bwd_dq_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dd,
    float* __restrict__ dq, const int* __restrict__ qpos, const int* __restrict__ kpos,
    const int* __restrict__ qtmax, const int* __restrict__ ktmin,
    const int* __restrict__ qstart, const int* __restrict__ qtsmin, const int* __restrict__ ktmax,
    int nq, int nk, int H, int KVH, int hd, float scale, int causal) {
    extern __shared__ float sm[];
    float* sK = sm;
    float* sV = sm + F32_BK * hd;
    __shared__ int sKP[F32_BK];
    int h = blockIdx.y, g = h / (H / KVH);
    int i = blockIdx.x * F32_BQ + threadIdx.x;
    long long qs = (long long)H * hd, ks = (long long)KVH * hd;
    float li = i < nq ? lse[(long long)h * nq + i] : DF_NEG_INF;
    bool valid = i < nq && li != DF_NEG_INF;  // a query that saw no key has no gradient
    int qp = valid && causal ? qpos[i] : 0;
    int qst = valid && qstart ? qstart[i] : F32_INT_MIN;
    float di = valid ? dd[(long long)h * nq + i] : 0.0f;
    const float* qrow = q + (valid ? i : 0) * qs + h * hd;
    const float* dorow = dout + (valid ? i : 0) * qs + h * hd;
    float* dqrow = dq + (valid ? i : 0) * qs + h * hd;
    float ds[F32_BK];
    int ntiles = (nk + F32_BK - 1) / F32_BK;
    for (int t = 0; t < ntiles; t++) {
        if (causal && (qtmax[blockIdx.x] < ktmin[t] || (qstart && qtsmin[blockIdx.x] > ktmax[t]))) continue;
        int j0 = t * F32_BK, nj = min(F32_BK, nk - j0);
        __syncthreads();
        for (int e = threadIdx.x; e < nj * hd; e += F32_BQ) {
            int jj = e / hd, d = e % hd;
            sK[jj * hd + d] = k[(j0 + jj) * ks + g * hd + d];
            sV[jj * hd + d] = v[(j0 + jj) * ks + g * hd + d];
        }
        if (threadIdx.x < nj) sKP[threadIdx.x] = causal ? kpos[j0 + threadIdx.x] : 0;
        __syncthreads();
        if (!valid) continue;
        bool any = false;
        for (int jj = 0; jj < nj; jj++) {
            ds[jj] = 0;
            if (causal && (sKP[jj] > qp || sKP[jj] < qst)) continue;
            float sc = 0, dp = 0;
            for (int d = 0; d < hd; d++) {
                sc = fmaf(qrow[d], sK[jj * hd + d], sc);
                dp = fmaf(dorow[d], sV[jj * hd + d], dp);
            }
            float p = expf(sc * scale - li);
            ds[jj] = p * (dp - di);
            any = true;
        }
        if (!any) continue;
        for (int d = 0; d < hd; d++) {
            float acc = 0;
            for (int jj = 0; jj < nj; jj++) acc = fmaf(ds[jj], sK[jj * hd + d], acc);
            dqrow[d] = fmaf(scale, acc, dqrow[d]);
        }
    }
}

// df_attn_bwd_dkdv_f32 adds dk and dv for one block of 64 keys (one per thread) of kv head g =
// blockIdx.y, over the query heads of its group in order and the queries in tiles of 32 staged in
// shared memory: dv += Σ P·dO, dk += scale·Σ dS·Q. Dynamic shared memory 2·32·hd floats.
// kbmin are the minima of kpos over the 64-key blocks, qtmax the maxima of qpos over 32-query tiles;
// with a document mask (qstart not null) qtsmin are the minima of qstart over the 32-query tiles
// and kbmax the maxima of kpos over the 64-key blocks.
__global__ void __launch_bounds__(F32_BQ) df_attn_bwd_dkdv_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dd,
    float* __restrict__ dk, float* __restrict__ dv, const int* __restrict__ qpos, const int* __restrict__ kpos,
    const int* __restrict__ qtmax, const int* __restrict__ kbmin,
    const int* __restrict__ qstart, const int* __restrict__ qtsmin, const int* __restrict__ kbmax,
    int nq, int nk, int H, int KVH, int hd, float scale, int causal) {
    extern __shared__ float sm[];
    float* sQ = sm;
    float* sO = sm + F32_BK * hd;
    __shared__ int sQP[F32_BK], sQS[F32_BK];
    __shared__ float sL[F32_BK], sD[F32_BK];
    int g = blockIdx.y, group = H / KVH;
    int j = blockIdx.x * F32_BQ + threadIdx.x;
    bool valid = j < nk;
    int kp = valid && causal ? kpos[j] : 0;
    long long qs = (long long)H * hd, ks = (long long)KVH * hd;
    const float* krow = k + (valid ? j : 0) * ks + g * hd;
    const float* vrow = v + (valid ? j : 0) * ks + g * hd;
    float* dkrow = dk + (valid ? j : 0) * ks + g * hd;
    float* dvrow = dv + (valid ? j : 0) * ks + g * hd;
    float p[F32_BK], ds[F32_BK];
    int ntiles = (nq + F32_BK - 1) / F32_BK;
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int t = 0; t < ntiles; t++) {
            if (causal && (qtmax[t] < kbmin[blockIdx.x] || (qstart && qtsmin[t] > kbmax[blockIdx.x]))) continue;
            int i0 = t * F32_BK, ni = min(F32_BK, nq - i0);
            __syncthreads();
            for (int e = threadIdx.x; e < ni * hd; e += F32_BQ) {
                int ii = e / hd, d = e % hd;
                sQ[ii * hd + d] = q[(i0 + ii) * qs + h * hd + d];
                sO[ii * hd + d] = dout[(i0 + ii) * qs + h * hd + d];
            }
            if (threadIdx.x < ni) {
                sQP[threadIdx.x] = causal ? qpos[i0 + threadIdx.x] : 0;
                sQS[threadIdx.x] = qstart ? qstart[i0 + threadIdx.x] : F32_INT_MIN;
                sL[threadIdx.x] = lse[(long long)h * nq + i0 + threadIdx.x];
                sD[threadIdx.x] = dd[(long long)h * nq + i0 + threadIdx.x];
            }
            __syncthreads();
            if (!valid) continue;
            bool any = false;
            for (int ii = 0; ii < ni; ii++) {
                p[ii] = 0;
                ds[ii] = 0;
                if ((causal && (kp > sQP[ii] || kp < sQS[ii])) || sL[ii] == DF_NEG_INF) continue;
                float sc = 0, dp = 0;
                for (int d = 0; d < hd; d++) {
                    sc = fmaf(sQ[ii * hd + d], krow[d], sc);
                    dp = fmaf(sO[ii * hd + d], vrow[d], dp);
                }
                p[ii] = expf(sc * scale - sL[ii]);
                ds[ii] = p[ii] * (dp - sD[ii]);
                any = true;
            }
            if (!any) continue;
            for (int d = 0; d < hd; d++) {
                float av = 0, ak = 0;
                for (int ii = 0; ii < ni; ii++) {
                    av = fmaf(p[ii], sO[ii * hd + d], av);
                    ak = fmaf(ds[ii], sQ[ii * hd + d], ak);
                }
                dvrow[d] += av;
                dkrow[d] = fmaf(scale, ak, dkrow[d]);
            }
        }
    }
}

}  // extern "C"
