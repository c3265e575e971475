// Tiled FlashAttention-2 on tensor cores (mma.sync m16n8k16, sm_80 and later): the block
// forward that folds a block of keys into a running (o, m, l), and the block backward, for
// bfloat16 or binary16 operands with float32 accumulation.
//
// Numerics (the contract the parity tests in kernels/cuda_test.go check):
//   - q, k, v and dO arrive rounded to 16 bits (df_to_half in elementwise.cu, round to nearest
//     even); scores S = q·kᵀ, dP = dO·vᵀ and the products P·V, dS·K, Pᵀ·dO, dSᵀ·Q accumulate in
//     float32 inside the tensor cores;
//   - P = exp(S·scale − m) and dS = P∘(dP − D) are computed in float32 and rounded to 16 bits
//     only as operands of the next product (as FlashAttention-2 does);
//   - the state o, m, l, the lse and D stay float32 in global memory, so partial results from
//     several calls (and merges) combine exactly as on the CPU.
// Nothing N×N is stored: the scores of one 16-row slice of a tile live in registers.
//
// Layouts as kernels/cpu_attn.go: q, o, dq, dO [nq, H, HD]; k, v, dk, dv [nk, KVH, HD]; m, l,
// lse, D [H, nq]; query head h reads kv head h / (H/KVH); key j is visible to query i iff
// !causal || qpos[i] >= kpos[j], and with a document mask (qstart not null, causal only) also
// kpos[j] >= qstart[i], the position at which query i's document starts.
//
// Tiling (mirrored by kernels/cuda_geom.go): 4 warps, each owning 16 rows.
//   forward:   block = 64 queries of one head; key tiles of 64, double-buffered with cp.async.
//   dQ:        block = 64 queries of one head; key tiles of 32.
//   dK, dV:    block = 64 keys of one kv head and one of nsplit interleaved shares of the
//              (query head of the group, query tile of 32) iterations: share s takes iterations
//              s, s + nsplit, ... in order. Share 0 adds into dK and dV; share s > 0 writes its
//              float32 partial sums to part[s − 1], and df_attn_dkdv_reduce adds them in share
//              order after the kernel (so dK and dV need no atomics and are reproducible). The
//              grid is 1-D, key tile slowest: the causal mask gives the first key tiles the most
//              queries, and the blocks are dispatched heaviest first. nsplit comes from the host
//              (kernels/cuda_geom.go, planDKDV): 1 once the key tiles alone fill the GPU.
// A tile is skipped when the causal mask hides it entirely (max qpos < min kpos over the tile,
// bounds precomputed on the host) or the document mask does (min qstart > max kpos), and the
// mask is applied elementwise only on tiles that straddle the diagonal, a document start or the
// end (all visible: min qpos >= max kpos and max qstart <= min kpos).
#include "common.cuh"

#define MMA_NW 4
#define MMA_NT (MMA_NW * 32)
#define LOG2E 1.4426950408889634f
#define DF_INT_MIN (-2147483647 - 1)

// ---- PTX wrappers ----

__device__ __forceinline__ unsigned df_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp_async16 copies 16 bytes global → shared, or writes 16 zero bytes when !full.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool full) {
    int n = full ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(df_smem(smem)), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(df_smem(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(df_smem(p)));
}

// Per-format packing of two floats into one 32-bit operand register and the mma itself:
// D(16×8, f32) += A(16×16, row) · B(16×8, col).
template <typename T>
struct Fmt;

template <>
struct Fmt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <>
struct Fmt<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// ---- fragment helpers (thread = lane; g = lane/4, t = lane%4) ----
//
// A fragment (16×16): {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]}.
// B fragment (16×8):  {B[2t..2t+1][g], B[2t+8..2t+9][g]}.
// C fragment (16×8):  {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}.

// ld_a loads the A fragment of rows r0..r0+15, columns c0..c0+15 of a row-major tile.
template <typename T, int LD>
__device__ __forceinline__ void ld_a(uint32_t a[4], const T* s, int r0, int c0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8);
}

// ld_bt loads the B fragments of B = Xᵀ for two 8-column tiles: X rows n0..n0+15 (the n index),
// columns c0..c0+15 (the k index). b[0..1] is n-tile n0, b[2..3] n-tile n0+8.
template <typename T, int LD>
__device__ __forceinline__ void ld_bt(uint32_t b[4], const T* s, int n0, int c0, int lane) {
    ldsm_x4(b, s + (n0 + (lane >> 4) * 8 + (lane & 7)) * LD + c0 + ((lane >> 3) & 1) * 8);
}

// ld_b loads the B fragments of B = X for two 8-column tiles: X rows k0..k0+15 (the k index),
// columns n0..n0+15 (the n index). b[0..1] is n-tile n0, b[2..3] n-tile n0+8.
template <typename T, int LD>
__device__ __forceinline__ void ld_b(uint32_t b[4], const T* s, int k0, int n0, int lane) {
    ldsm_x4_t(b, s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + (lane >> 4) * 8);
}

// c_to_a turns the C fragments of n-tiles 2kc and 2kc+1 into the A fragment of k-chunk kc.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = Fmt<T>::pack(c0[0], c0[1]);
    a[1] = Fmt<T>::pack(c0[2], c0[3]);
    a[2] = Fmt<T>::pack(c1[0], c1[1]);
    a[3] = Fmt<T>::pack(c1[2], c1[3]);
}

// copy_rows issues cp.async copies of rows [r0, r0+R) of a [n, stride] 16-bit tensor (HD
// columns at column offset col) into a shared tile [R][LD]; rows ≥ n are zero-filled.
template <typename T, int HD, int LD, int R>
__device__ __forceinline__ void copy_rows(T* dst, const T* src, int r0, int n, long long stride, int col) {
    constexpr int CH = HD / 8;  // 16-byte chunks per row
    for (int e = threadIdx.x; e < R * CH; e += MMA_NT) {
        int r = e / CH, c = e % CH, i = r0 + r;
        bool ok = i < n;
        cp_async16(dst + r * LD + c * 8, src + (long long)(ok ? i : 0) * stride + col + c * 8, ok);
    }
}

// ---- forward ----

template <typename T, int HD>
__device__ __forceinline__ void attn_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                         float* __restrict__ o, float* __restrict__ ms, float* __restrict__ ls,
                                         const int* __restrict__ qpos, const int* __restrict__ kpos,
                                         const int* __restrict__ qtmin, const int* __restrict__ qtmax,
                                         const int* __restrict__ ktmin, const int* __restrict__ ktmax,
                                         const int* __restrict__ qstart, const int* __restrict__ qsmin,
                                         const int* __restrict__ qsmax, int nq, int nk, int H, int KVH, float scale,
                                         int causal) {
    constexpr int BM = 16 * MMA_NW, BN = 64, LD = HD + 8, KC = HD / 16, NTD = HD / 8, NTK = BN / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    T* sQ = reinterpret_cast<T*>(smraw);
    T* sK = sQ + BM * LD;      // [2][BN][LD]
    T* sV = sK + 2 * BN * LD;  // [2][BN][LD]
    int* sKP = reinterpret_cast<int*>(sV + 2 * BN * LD);  // [2][BN]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tg = lane & 3;
    const int bx = blockIdx.x, h = blockIdx.y, gk = h / (H / KVH), i0 = bx * BM;
    const long long qs = (long long)H * HD, ks = (long long)KVH * HD;
    const int ntk = (nk + BN - 1) / BN;
    const int qmin = causal ? qtmin[bx] : 0, qmax = causal ? qtmax[bx] : 0;
    const bool doc = qstart != nullptr;  // document mask (causal only)
    const int smin = doc ? qsmin[bx] : 0, smax = doc ? qsmax[bx] : 0;

    auto next_visible = [&](int t) {
        while (causal && t < ntk && (qmax < ktmin[t] || (doc && smin > ktmax[t]))) t++;
        return t;
    };
    auto load_kv = [&](int t, int buf) {
        copy_rows<T, HD, LD, BN>(sK + buf * BN * LD, k, t * BN, nk, ks, gk * HD);
        copy_rows<T, HD, LD, BN>(sV + buf * BN * LD, v, t * BN, nk, ks, gk * HD);
        for (int r = threadIdx.x; r < BN; r += MMA_NT) {
            int j = t * BN + r;
            sKP[buf * BN + r] = causal && j < nk ? kpos[j] : 0;
        }
    };

    copy_rows<T, HD, LD, BM>(sQ, q, i0, nq, qs, h * HD);
    cp_async_commit();
    int t = next_visible(0);
    if (t < ntk) load_kv(t, 0);
    cp_async_commit();

    // This thread's two rows and their running state.
    const int r[2] = {i0 + warp * 16 + gr, i0 + warp * 16 + gr + 8};
    bool valid[2];
    int qp[2], qst[2];
    float m_r[2], l_r[2];
    float acc[NTD][4];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        valid[x] = r[x] < nq;
        qp[x] = !valid[x] ? DF_INT_MIN : (causal ? qpos[r[x]] : 0);
        qst[x] = valid[x] && doc ? qstart[r[x]] : DF_INT_MIN;
        m_r[x] = valid[x] ? ms[(long long)h * nq + r[x]] : DF_NEG_INF;
        l_r[x] = valid[x] && tg == 0 ? ls[(long long)h * nq + r[x]] : 0.0f;  // l is summed over the 4 threads of a row
    }
#pragma unroll
    for (int nt = 0; nt < NTD; nt++) {
#pragma unroll
        for (int x = 0; x < 2; x++) {
            float2 val = make_float2(0, 0);
            if (valid[x]) val = *reinterpret_cast<const float2*>(o + r[x] * qs + h * HD + nt * 8 + tg * 2);
            acc[nt][2 * x] = val.x;
            acc[nt][2 * x + 1] = val.y;
        }
    }

    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) ld_a<T, LD>(qf[kc], sQ, warp * 16, kc * 16, lane);

    int buf = 0;
    while (t < ntk) {
        const int tn = next_visible(t + 1);
        if (tn < ntk) load_kv(tn, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* Kb = sK + buf * BN * LD;
        const T* Vb = sV + buf * BN * LD;
        const int* KPb = sKP + buf * BN;
        const int j0 = t * BN;

        float s[NTK][4];
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
#pragma unroll
            for (int np = 0; np < NTK / 2; np++) {
                uint32_t b[4];
                ld_bt<T, LD>(b, Kb, np * 16, kc * 16, lane);
                Fmt<T>::mma(s[2 * np], qf[kc], b);
                Fmt<T>::mma(s[2 * np + 1], qf[kc], b + 2);
            }
        }

        const bool allv = j0 + BN <= nk && (!causal || (qmin >= ktmax[t] && (!doc || smax <= ktmin[t])));
        float mx[2] = {DF_NEG_INF, DF_NEG_INF};
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1, jj = nt * 8 + tg * 2 + (e & 1);
                float val = s[nt][e] * scale;
                if (!allv && (j0 + jj >= nk || (causal && (KPb[jj] > qp[x] || KPb[jj] < qst[x])))) val = DF_NEG_INF;
                s[nt][e] = val;
                mx[x] = fmaxf(mx[x], val);
            }
        }
        float msafe[2], corr[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            const float mnew = fmaxf(m_r[x], mx[x]);
            msafe[x] = mnew == DF_NEG_INF ? 0.0f : mnew;  // a row with no visible key yet keeps p = 0
            corr[x] = exp2f((m_r[x] - msafe[x]) * LOG2E);  // 0 when m was −Inf
            m_r[x] = mnew;
        }
        float rs[2] = {0, 0};
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1;
                const float p = exp2f((s[nt][e] - msafe[x]) * LOG2E);  // masked: exp2(−Inf) = 0
                s[nt][e] = p;
                rs[x] += p;
            }
        }
#pragma unroll
        for (int x = 0; x < 2; x++) l_r[x] = l_r[x] * corr[x] + rs[x];
#pragma unroll
        for (int nt = 0; nt < NTD; nt++) {
            acc[nt][0] *= corr[0];
            acc[nt][1] *= corr[0];
            acc[nt][2] *= corr[1];
            acc[nt][3] *= corr[1];
        }
        // O += P·V
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t pa[4];
            c_to_a<T>(pa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ld_b<T, LD>(b, Vb, kc * 16, dp * 16, lane);
                Fmt<T>::mma(acc[2 * dp], pa, b);
                Fmt<T>::mma(acc[2 * dp + 1], pa, b + 2);
            }
        }
        __syncthreads();  // every warp is done with buf before it is refilled
        buf ^= 1;
        t = tn;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int x = 0; x < 2; x++) {
        l_r[x] += __shfl_xor_sync(0xffffffffu, l_r[x], 1);
        l_r[x] += __shfl_xor_sync(0xffffffffu, l_r[x], 2);
        if (!valid[x]) continue;
#pragma unroll
        for (int nt = 0; nt < NTD; nt++)
            *reinterpret_cast<float2*>(o + r[x] * qs + h * HD + nt * 8 + tg * 2) =
                make_float2(acc[nt][2 * x], acc[nt][2 * x + 1]);
        if (tg == 0) {
            ms[(long long)h * nq + r[x]] = m_r[x];
            ls[(long long)h * nq + r[x]] = l_r[x];
        }
    }
}

// ---- backward: dQ ----

template <typename T, int HD>
__device__ __forceinline__ void attn_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                            const T* __restrict__ dout, const float* __restrict__ lse,
                                            const float* __restrict__ dd, float* __restrict__ dq,
                                            const int* __restrict__ qpos, const int* __restrict__ kpos,
                                            const int* __restrict__ qtmin, const int* __restrict__ qtmax,
                                            const int* __restrict__ ktmin, const int* __restrict__ ktmax,
                                            const int* __restrict__ qstart, const int* __restrict__ qsmin,
                                            const int* __restrict__ qsmax, int nq, int nk, int H, int KVH, float scale,
                                            int causal) {
    constexpr int BM = 16 * MMA_NW, BN = 32, LD = HD + 8, KC = HD / 16, NTD = HD / 8, NTK = BN / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    T* sQ = reinterpret_cast<T*>(smraw);
    T* sO = sQ + BM * LD;
    T* sK = sO + BM * LD;      // [2][BN][LD]
    T* sV = sK + 2 * BN * LD;  // [2][BN][LD]
    int* sKP = reinterpret_cast<int*>(sV + 2 * BN * LD);  // [2][BN]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tg = lane & 3;
    const int bx = blockIdx.x, h = blockIdx.y, gk = h / (H / KVH), i0 = bx * BM;
    const long long qs = (long long)H * HD, ks = (long long)KVH * HD;
    const int ntk = (nk + BN - 1) / BN;
    const int qmin = causal ? qtmin[bx] : 0, qmax = causal ? qtmax[bx] : 0;
    const bool doc = qstart != nullptr;  // document mask (causal only)
    const int smin = doc ? qsmin[bx] : 0, smax = doc ? qsmax[bx] : 0;

    auto next_visible = [&](int t) {
        while (causal && t < ntk && (qmax < ktmin[t] || (doc && smin > ktmax[t]))) t++;
        return t;
    };
    auto load_kv = [&](int t, int buf) {
        copy_rows<T, HD, LD, BN>(sK + buf * BN * LD, k, t * BN, nk, ks, gk * HD);
        copy_rows<T, HD, LD, BN>(sV + buf * BN * LD, v, t * BN, nk, ks, gk * HD);
        for (int r = threadIdx.x; r < BN; r += MMA_NT) {
            int j = t * BN + r;
            sKP[buf * BN + r] = causal && j < nk ? kpos[j] : 0;
        }
    };

    copy_rows<T, HD, LD, BM>(sQ, q, i0, nq, qs, h * HD);
    copy_rows<T, HD, LD, BM>(sO, dout, i0, nq, qs, h * HD);
    cp_async_commit();
    int t = next_visible(0);
    if (t < ntk) load_kv(t, 0);
    cp_async_commit();

    const int r[2] = {i0 + warp * 16 + gr, i0 + warp * 16 + gr + 8};
    bool live[2];
    int qp[2], qst[2];
    float L[2], D[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const bool valid = r[x] < nq;
        L[x] = valid ? lse[(long long)h * nq + r[x]] : DF_NEG_INF;
        D[x] = valid ? dd[(long long)h * nq + r[x]] : 0.0f;
        live[x] = L[x] != DF_NEG_INF;  // a query that saw no key has no gradient
        qp[x] = causal && valid ? qpos[r[x]] : 0;
        qst[x] = doc && valid ? qstart[r[x]] : DF_INT_MIN;
    }
    float acc[NTD][4];
#pragma unroll
    for (int nt = 0; nt < NTD; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;

    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[KC][4], of[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        ld_a<T, LD>(qf[kc], sQ, warp * 16, kc * 16, lane);
        ld_a<T, LD>(of[kc], sO, warp * 16, kc * 16, lane);
    }

    int buf = 0;
    while (t < ntk) {
        const int tn = next_visible(t + 1);
        if (tn < ntk) load_kv(tn, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* Kb = sK + buf * BN * LD;
        const T* Vb = sV + buf * BN * LD;
        const int* KPb = sKP + buf * BN;
        const int j0 = t * BN;

        float s[NTK][4], dp[NTK][4];
#pragma unroll
        for (int nt = 0; nt < NTK; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
#pragma unroll
            for (int np = 0; np < NTK / 2; np++) {
                uint32_t b[4];
                ld_bt<T, LD>(b, Kb, np * 16, kc * 16, lane);
                Fmt<T>::mma(s[2 * np], qf[kc], b);
                Fmt<T>::mma(s[2 * np + 1], qf[kc], b + 2);
                ld_bt<T, LD>(b, Vb, np * 16, kc * 16, lane);
                Fmt<T>::mma(dp[2 * np], of[kc], b);
                Fmt<T>::mma(dp[2 * np + 1], of[kc], b + 2);
            }
        }
        const bool allv = j0 + BN <= nk && (!causal || (qmin >= ktmax[t] && (!doc || smax <= ktmin[t])));
#pragma unroll
        for (int nt = 0; nt < NTK; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1, jj = nt * 8 + tg * 2 + (e & 1);
                bool ok = live[x];
                if (!allv && (j0 + jj >= nk || (causal && (KPb[jj] > qp[x] || KPb[jj] < qst[x])))) ok = false;
                const float p = ok ? exp2f((s[nt][e] * scale - L[x]) * LOG2E) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - D[x]);  // dS
            }
        }
        // dQ += dS·K
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t a[4];
            c_to_a<T>(a, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t b[4];
                ld_b<T, LD>(b, Kb, kc * 16, np * 16, lane);
                Fmt<T>::mma(acc[2 * np], a, b);
                Fmt<T>::mma(acc[2 * np + 1], a, b + 2);
            }
        }
        __syncthreads();
        buf ^= 1;
        t = tn;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int x = 0; x < 2; x++) {
        if (r[x] >= nq) continue;
#pragma unroll
        for (int nt = 0; nt < NTD; nt++) {
            float2* p = reinterpret_cast<float2*>(dq + r[x] * qs + h * HD + nt * 8 + tg * 2);
            float2 cur = *p;
            cur.x = fmaf(scale, acc[nt][2 * x], cur.x);
            cur.y = fmaf(scale, acc[nt][2 * x + 1], cur.y);
            *p = cur;
        }
    }
}

// ---- backward: dK, dV ----

template <typename T, int HD>
__device__ __forceinline__ void attn_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k,
                                              const T* __restrict__ v, const T* __restrict__ dout,
                                              const float* __restrict__ lse, const float* __restrict__ dd,
                                              float* __restrict__ dk, float* __restrict__ dv,
                                              const int* __restrict__ qpos, const int* __restrict__ kpos,
                                              const int* __restrict__ qtmin, const int* __restrict__ qtmax,
                                              const int* __restrict__ kbmin, const int* __restrict__ kbmax,
                                              const int* __restrict__ qstart, const int* __restrict__ qsmin,
                                              const int* __restrict__ qsmax, int nq, int nk, int H, int KVH,
                                              float scale, int causal, float* __restrict__ part, int nsplit) {
    constexpr int BN = 16 * MMA_NW, BM = 32, LD = HD + 8, KC = HD / 16, NTD = HD / 8, NTQ = BM / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    T* sK = reinterpret_cast<T*>(smraw);
    T* sV = sK + BN * LD;
    T* sQ = sV + BN * LD;      // [2][BM][LD]
    T* sO = sQ + 2 * BM * LD;  // [2][BM][LD]
    float* sL = reinterpret_cast<float*>(sO + 2 * BM * LD);  // [2][BM]
    float* sD = sL + 2 * BM;                                 // [2][BM]
    int* sQP = reinterpret_cast<int*>(sD + 2 * BM);          // [2][BM]
    int* sQS = sQP + 2 * BM;                                 // [2][BM]: document starts

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tg = lane & 3;
    const int per = KVH * nsplit, bx = blockIdx.x / per, gk = blockIdx.x % per / nsplit, share = blockIdx.x % nsplit;
    const int group = H / KVH, j0 = bx * BN;
    const long long qs = (long long)H * HD, ks = (long long)KVH * HD;
    const int ntq = (nq + BM - 1) / BM, nit = group * ntq;  // iterations: (query head, query tile)
    const int kmin = causal ? kbmin[bx] : 0, kmax = causal ? kbmax[bx] : 0;
    const bool doc = qstart != nullptr;  // document mask (causal only)

    auto next_visible = [&](int it) {
        while (causal && it < nit && (qtmax[it % ntq] < kmin || (doc && qsmin[it % ntq] > kmax))) it += nsplit;
        return it;
    };
    auto load_q = [&](int it, int buf) {
        const int h = gk * group + it / ntq, i0 = (it % ntq) * BM;
        copy_rows<T, HD, LD, BM>(sQ + buf * BM * LD, q, i0, nq, qs, h * HD);
        copy_rows<T, HD, LD, BM>(sO + buf * BM * LD, dout, i0, nq, qs, h * HD);
        for (int r = threadIdx.x; r < BM; r += MMA_NT) {
            const int i = i0 + r;
            const bool ok = i < nq;
            sL[buf * BM + r] = ok ? lse[(long long)h * nq + i] : DF_NEG_INF;
            sD[buf * BM + r] = ok ? dd[(long long)h * nq + i] : 0.0f;
            sQP[buf * BM + r] = causal && ok ? qpos[i] : 0;
            sQS[buf * BM + r] = doc && ok ? qstart[i] : DF_INT_MIN;
        }
    };

    copy_rows<T, HD, LD, BN>(sK, k, j0, nk, ks, gk * HD);
    copy_rows<T, HD, LD, BN>(sV, v, j0, nk, ks, gk * HD);
    cp_async_commit();
    int it = next_visible(share);
    if (it < nit) load_q(it, 0);
    cp_async_commit();

    const int r[2] = {j0 + warp * 16 + gr, j0 + warp * 16 + gr + 8};  // this thread's two keys
    int kp[2];
#pragma unroll
    for (int x = 0; x < 2; x++) kp[x] = causal && r[x] < nk ? kpos[r[x]] : 0;
    float dka[NTD][4], dva[NTD][4];
#pragma unroll
    for (int nt = 0; nt < NTD; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[nt][e] = dva[nt][e] = 0;

    int buf = 0;
    while (it < nit) {
        const int itn = next_visible(it + nsplit);
        if (itn < nit) load_q(itn, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* Qb = sQ + buf * BM * LD;
        const T* Ob = sO + buf * BM * LD;
        const float* Lb = sL + buf * BM;
        const float* Db = sD + buf * BM;
        const int* QPb = sQP + buf * BM;
        const int* QSb = sQS + buf * BM;
        const int tq = it % ntq;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys × 32 queries.
        float s[NTQ][4], dp[NTQ][4];
#pragma unroll
        for (int nt = 0; nt < NTQ; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            uint32_t ka[4], va[4];
            ld_a<T, LD>(ka, sK, warp * 16, kc * 16, lane);
            ld_a<T, LD>(va, sV, warp * 16, kc * 16, lane);
#pragma unroll
            for (int np = 0; np < NTQ / 2; np++) {
                uint32_t b[4];
                ld_bt<T, LD>(b, Qb, np * 16, kc * 16, lane);
                Fmt<T>::mma(s[2 * np], ka, b);
                Fmt<T>::mma(s[2 * np + 1], ka, b + 2);
                ld_bt<T, LD>(b, Ob, np * 16, kc * 16, lane);
                Fmt<T>::mma(dp[2 * np], va, b);
                Fmt<T>::mma(dp[2 * np + 1], va, b + 2);
            }
        }
        const bool allv = !causal || (qtmin[tq] >= kmax && (!doc || qsmax[tq] <= kmin));
#pragma unroll
        for (int nt = 0; nt < NTQ; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1, ii = nt * 8 + tg * 2 + (e & 1);
                const float Li = Lb[ii];  // −Inf for a query past the end or one that saw no key
                bool ok = Li != DF_NEG_INF;
                if (!allv && (kp[x] > QPb[ii] || kp[x] < QSb[ii])) ok = false;
                const float p = ok ? exp2f((s[nt][e] * scale - Li) * LOG2E) : 0.0f;
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - Db[ii]);  // dSᵀ
            }
        }
        // dV += Pᵀ·dO and dK += dSᵀ·Q
#pragma unroll
        for (int kc = 0; kc < BM / 16; kc++) {
            uint32_t pa[4], sa[4];
            c_to_a<T>(pa, s[2 * kc], s[2 * kc + 1]);
            c_to_a<T>(sa, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t b[4];
                ld_b<T, LD>(b, Ob, kc * 16, np * 16, lane);
                Fmt<T>::mma(dva[2 * np], pa, b);
                Fmt<T>::mma(dva[2 * np + 1], pa, b + 2);
                ld_b<T, LD>(b, Qb, kc * 16, np * 16, lane);
                Fmt<T>::mma(dka[2 * np], sa, b);
                Fmt<T>::mma(dka[2 * np + 1], sa, b + 2);
            }
        }
        __syncthreads();
        buf ^= 1;
        it = itn;
    }
    cp_async_wait<0>();

    if (share > 0) {  // a partial: part[share − 1] of dK (unscaled), part[nsplit − 1 + share − 1] of dV
        const long long n = (long long)nk * ks;
        float* pk0 = part + (long long)(share - 1) * n;
        float* pv0 = part + (long long)(nsplit - 1 + share - 1) * n;
#pragma unroll
        for (int x = 0; x < 2; x++) {
            if (r[x] >= nk) continue;
#pragma unroll
            for (int nt = 0; nt < NTD; nt++) {
                const long long off = r[x] * ks + gk * HD + nt * 8 + tg * 2;
                *reinterpret_cast<float2*>(pk0 + off) = make_float2(dka[nt][2 * x], dka[nt][2 * x + 1]);
                *reinterpret_cast<float2*>(pv0 + off) = make_float2(dva[nt][2 * x], dva[nt][2 * x + 1]);
            }
        }
        return;
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        if (r[x] >= nk) continue;
#pragma unroll
        for (int nt = 0; nt < NTD; nt++) {
            const long long off = r[x] * ks + gk * HD + nt * 8 + tg * 2;
            float2* pk = reinterpret_cast<float2*>(dk + off);
            float2* pv = reinterpret_cast<float2*>(dv + off);
            float2 ck = *pk, cv = *pv;
            ck.x = fmaf(scale, dka[nt][2 * x], ck.x);
            ck.y = fmaf(scale, dka[nt][2 * x + 1], ck.y);
            cv.x += dva[nt][2 * x];
            cv.y += dva[nt][2 * x + 1];
            *pk = ck;
            *pv = cv;
        }
    }
}

// ---- entry points: one per format and head dimension ----

#define DF_ATTN_MMA(NAME, T, HD)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MMA_NT) df_attn_fwd_##NAME##_hd##HD(                               \
        const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o, float* m, float* l, const int* qpos,     \
        const int* kpos, const int* qtmin, const int* qtmax, const int* ktmin, const int* ktmax,                   \
        const int* qstart, const int* qsmin, const int* qsmax, int nq, int nk, int H, int KVH, float scale,        \
        int causal) {                                                                                               \
        attn_fwd<T, HD>(reinterpret_cast<const T*>(q), reinterpret_cast<const T*>(k),                              \
                        reinterpret_cast<const T*>(v), o, m, l, qpos, kpos, qtmin, qtmax, ktmin, ktmax, qstart,     \
                        qsmin, qsmax, nq, nk, H, KVH, scale, causal);                                               \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMA_NT) df_attn_bwd_dq_##NAME##_hd##HD(                            \
        const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,          \
        const float* dd, float* dq, const int* qpos, const int* kpos, const int* qtmin, const int* qtmax,          \
        const int* ktmin, const int* ktmax, const int* qstart, const int* qsmin, const int* qsmax, int nq, int nk, \
        int H, int KVH, float scale, int causal) {                                                                  \
        attn_bwd_dq<T, HD>(reinterpret_cast<const T*>(q), reinterpret_cast<const T*>(k),                           \
                           reinterpret_cast<const T*>(v), reinterpret_cast<const T*>(dout), lse, dd, dq, qpos,    \
                           kpos, qtmin, qtmax, ktmin, ktmax, qstart, qsmin, qsmax, nq, nk, H, KVH, scale, causal); \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(MMA_NT) df_attn_bwd_dkdv_##NAME##_hd##HD(                          \
        const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,          \
        const float* dd, float* dk, float* dv, const int* qpos, const int* kpos, const int* qtmin,                 \
        const int* qtmax, const int* kbmin, const int* kbmax, const int* qstart, const int* qsmin,                 \
        const int* qsmax, int nq, int nk, int H, int KVH, float scale, int causal, float* part, int nsplit) {      \
        attn_bwd_dkdv<T, HD>(reinterpret_cast<const T*>(q), reinterpret_cast<const T*>(k),                         \
                             reinterpret_cast<const T*>(v), reinterpret_cast<const T*>(dout), lse, dd, dk, dv,    \
                             qpos, kpos, qtmin, qtmax, kbmin, kbmax, qstart, qsmin, qsmax, nq, nk, H, KVH, scale, \
                             causal, part, nsplit);                                                                 \
    }

DF_ATTN_MMA(bf16, __nv_bfloat16, 32)
DF_ATTN_MMA(bf16, __nv_bfloat16, 64)
DF_ATTN_MMA(bf16, __nv_bfloat16, 128)
DF_ATTN_MMA(f16, __half, 32)
DF_ATTN_MMA(f16, __half, 64)
DF_ATTN_MMA(f16, __half, 128)

// df_attn_dkdv_reduce adds the partial sums of the dK/dV kernel's shares 1..nsplit−1 (part, as
// that kernel writes them: nsplit−1 arrays of n = nk·KVH·HD for dK, then as many for dV) to dK
// and dV, which share 0 has updated: dk += scale·(p₁ + … + p_{nsplit−1}), dv += (the same of
// the dV partials), summed in share order, so the result is the same run to run.
extern "C" __global__ void __launch_bounds__(256) df_attn_dkdv_reduce(float* dk, float* dv, const float* part,
                                                                       long long n, int nsplit, float scale) {
    const float* pv = part + (long long)(nsplit - 1) * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        float sk = 0.0f, sv = 0.0f;
        for (int s = 0; s < nsplit - 1; s++) {
            sk += part[(long long)s * n + e];
            sv += pv[(long long)s * n + e];
        }
        dk[e] = fmaf(scale, sk, dk[e]);
        dv[e] += sv;
    }
}
