// Fused attention softmax(scale * q @ k^T + bias + mask) @ v (the IR's Attention op), flash style:
// the [T, S] scores never leave the block. One block per (leading index, tile of 64 query rows);
// K / V tiles of 32 rows stream through shared memory; an online softmax in fp32 rescales the
// fp32 output accumulators; fp16 in, fp16 out. SIMT (no tensor cores yet): 4 threads per query
// row, each scoring 8 of the tile's 32 keys and owning every 4th output column.
//
// Operands are row-major fp16 [.., T, d], [.., S, d], [.., S, dv] with row strides ldq / ldk /
// ldv (elements); `offs[l * 6 + {0..5}]` gives the element offset of leading index l in q, k, v,
// the bias, the mask and the output (broadcast leading dims are resolved by the host). The bias
// and the mask (kind 0: none, 1: fp16, 2: fp32) are read at offs + t * ?_t + s * ?_s (0 strides
// broadcast).
// Limits: d, dv <= ATT_DMAX (checked by the launch wrapper).

#define ATT_BM 64
#define ATT_BN 32
#define ATT_DMAX 128
#define ATT_QPAD (ATT_DMAX + 2)
#define ATT_THREADS 256

__device__ __forceinline__ float att_bias(const void* bias, int kind, i64 off) {
    if (kind == 1) return __half2float(((const half*)bias)[off]);
    if (kind == 2) return ((const float*)bias)[off];
    return 0.f;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_fwd(
    const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
    const void* __restrict__ bias, const void* __restrict__ mask, half* __restrict__ o,
    const i64* __restrict__ offs, int T, int S, int d, int dv, int ldq, int ldk, int ldv, int ldo,
    int bias_kind, int bias_t, int bias_s, int mask_kind, int mask_t, int mask_s, float scale) {
    __shared__ half Qs[ATT_BM][ATT_QPAD];
    __shared__ half Ks[ATT_BN][ATT_QPAD];
    __shared__ half Vs[ATT_BN][ATT_DMAX];
    __shared__ float Ps[ATT_BM][ATT_BN + 1];

    const int tiles = (T + ATT_BM - 1) / ATT_BM;
    const int l = blockIdx.x / tiles;
    const int t0 = (blockIdx.x % tiles) * ATT_BM;
    const int tid = threadIdx.x;
    const int row = tid >> 2, r4 = tid & 3;
    const int t = t0 + row;
    const i64 qo = offs[l * 6], ko = offs[l * 6 + 1], vo = offs[l * 6 + 2];
    const i64 bo = offs[l * 6 + 3], mo = offs[l * 6 + 4], oo = offs[l * 6 + 5];
    const int nc = (dv + 3) >> 2;  // output columns per thread: r4, r4 + 4, ...

    for (int i = tid; i < ATT_BM * d; i += ATT_THREADS) {
        int r = i / d, f = i - r * d;
        Qs[r][f] = (t0 + r < T) ? q[qo + (i64)(t0 + r) * ldq + f] : __float2half(0.f);
    }

    float acc[ATT_DMAX / 4];
#pragma unroll
    for (int c = 0; c < ATT_DMAX / 4; ++c) acc[c] = 0.f;
    float m = NEG_INF, lsum = 0.f;

    for (int s0 = 0; s0 < S; s0 += ATT_BN) {
        __syncthreads();  // the previous tile is consumed (and Qs written, first time)
        for (int i = tid; i < ATT_BN * d; i += ATT_THREADS) {
            int r = i / d, f = i - r * d;
            Ks[r][f] = (s0 + r < S) ? k[ko + (i64)(s0 + r) * ldk + f] : __float2half(0.f);
        }
        const int vw = nc * 4;  // columns dv..vw-1 are zero so the accumulation needs no guard
        for (int i = tid; i < ATT_BN * vw; i += ATT_THREADS) {
            int r = i / vw, f = i - r * vw;
            Vs[r][f] = (s0 + r < S && f < dv) ? v[vo + (i64)(s0 + r) * ldv + f] : __float2half(0.f);
        }
        __syncthreads();

        float sc[ATT_BN / 4];
        float mt = NEG_INF;
#pragma unroll
        for (int i = 0; i < ATT_BN / 4; ++i) {
            const int j = r4 + 4 * i, js = s0 + j;
            float x = NEG_INF;
            if (js < S) {
                float dot = 0.f;
                for (int f = 0; f < d; ++f)
                    dot += __half2float(Qs[row][f]) * __half2float(Ks[j][f]);
                x = dot * scale;
                if (bias_kind != 0 && t < T)
                    x += att_bias(bias, bias_kind, bo + (i64)t * bias_t + (i64)js * bias_s);
                if (mask_kind != 0 && t < T)
                    x += att_bias(mask, mask_kind, mo + (i64)t * mask_t + (i64)js * mask_s);
            }
            sc[i] = x;
            mt = fmaxf(mt, x);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m, mt);
        // Rows whose scores are all -inf so far keep m = -inf and add nothing.
        const float alpha = (mn == NEG_INF) ? 1.f : __expf(m - mn);
        float ps = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_BN / 4; ++i) {
            const float p = (mn == NEG_INF || sc[i] == NEG_INF) ? 0.f : __expf(sc[i] - mn);
            Ps[row][r4 + 4 * i] = p;
            ps += p;
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        lsum = lsum * alpha + ps;
        m = mn;
#pragma unroll
        for (int c = 0; c < ATT_DMAX / 4; ++c) acc[c] *= alpha;
        __syncwarp();  // the row's four threads (one warp) wrote Ps[row]
        const int jn = min(ATT_BN, S - s0);
        for (int j = 0; j < jn; ++j) {
            const float p = Ps[row][j];
#pragma unroll
            for (int c = 0; c < ATT_DMAX / 4; ++c)
                if (c < nc) acc[c] += p * __half2float(Vs[j][c * 4 + r4]);
        }
    }
    if (t < T) {
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
        for (int c = 0; c < ATT_DMAX / 4; ++c) {
            const int col = c * 4 + r4;
            if (c < nc && col < dv) o[oo + (i64)t * ldo + col] = __float2half(acc[c] * inv);
        }
    }
}

// attention_fwd on the tensor cores for d, dv <= DP (16, 32 or 64): one block of 4 warps per
// (leading index, 64 query rows), each warp owning 16 rows. Two passes over the keys, in tiles of
// 32: the first computes each row's max and sum of exp (fp32), the second P = exp(x - max) / sum
// (fp16) and O += P @ V in wmma accumulators, so O never needs rescaling. Scores live in shared
// memory a tile at a time (never in global memory); q @ k^T runs twice, on the tensor cores.
#include <mma.h>
#define AW_BM 64
#define AW_BN 32
#define AW_LDS (AW_BN + 4)
#define AW_LDP (AW_BN + 8)

// acc[j] += A (16 x K, row-major, lda) @ B_j (K x 16) for j < NJ, on one warp: B_j's fragment at
// kk starts at B + kk * bk + j * bj (layout L, leading dimension ldb).
template <int NJ, int K, typename L>
__device__ __forceinline__ void warp_mma(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[NJ],
                                         const half* A, int lda, const half* B, int bk, int bj, int ldb) {
    using namespace nvcuda;
#pragma unroll
    for (int kk = 0; kk < K; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, A + kk, lda);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, L> fb;
            wmma::load_matrix_sync(fb, B + kk * bk + j * bj, ldb);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
    }
}

template <int DP>
__device__ __forceinline__ void aw_load_rows(half* dst, const half* __restrict__ src, i64 off, int row0, int rows,
                                             int nrows, int ld, int cols, int tid) {
    for (int i = tid; i < rows * DP; i += 128) {
        int r = i / DP, f = i - r * DP;
        dst[r * (DP + 8) + f] = (row0 + r < nrows && f < cols) ? src[off + (i64)(row0 + r) * ld + f] : __float2half(0.f);
    }
}

template <int DP>
__device__ __forceinline__ void attention_wmma(const half* __restrict__ q, const half* __restrict__ k,
                                               const half* __restrict__ v, const void* __restrict__ bias,
                                               const void* __restrict__ mask, half* __restrict__ o,
                                               const i64* __restrict__ offs, int T, int S, int d, int dv, int ldq,
                                               int ldk, int ldv, int ldo, int bias_kind, int bias_t, int bias_s,
                                               int mask_kind, int mask_t, int mask_s, float scale) {
    using namespace nvcuda;
    constexpr int LDQ = DP + 8;
    constexpr int QB = AW_BM * LDQ * 2, KB = AW_BN * LDQ * 2, SB = AW_BM * AW_LDS * 4, PB = AW_BM * AW_LDP * 2;
    __shared__ __align__(128) unsigned char smem[QB + 2 * KB + SB + PB];
    half* Qs = reinterpret_cast<half*>(smem);
    half* Ks = reinterpret_cast<half*>(smem + QB);
    half* Vs = reinterpret_cast<half*>(smem + QB + KB);
    float* Ss = reinterpret_cast<float*>(smem + QB + 2 * KB);
    half* Ps = reinterpret_cast<half*>(smem + QB + 2 * KB + SB);
    float* Os = reinterpret_cast<float*>(smem + QB);  // after the last tile: [AW_BM][DP + 4]

    const int tiles = (T + AW_BM - 1) / AW_BM;
    const int l = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * AW_BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const i64 qo = offs[l * 6], ko = offs[l * 6 + 1], vo = offs[l * 6 + 2];
    const i64 bo = offs[l * 6 + 3], mo = offs[l * 6 + 4], oo = offs[l * 6 + 5];
    // This lane's row of the warp's 16 and its half of the tile's 32 columns.
    const int rw = lane >> 1, c0 = (lane & 1) * 16;
    float* srow = Ss + (warp * 16 + rw) * AW_LDS;

    aw_load_rows<DP>(Qs, q, qo, t0, AW_BM, T, ldq, d, tid);

    // Scores of key tile s0 for the warp's rows into Ss (scaled, biased, -inf past S).
    auto scores = [&](int s0) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[AW_BN / 16];
#pragma unroll
        for (int j = 0; j < AW_BN / 16; j++) wmma::fill_fragment(acc[j], 0.f);
        // k^T: column-major over Ks (key j's features in row j).
        warp_mma<AW_BN / 16, DP, wmma::col_major>(acc, Qs + warp * 16 * LDQ, LDQ, Ks, 1, 16 * LDQ, LDQ);
#pragma unroll
        for (int j = 0; j < AW_BN / 16; j++)
            wmma::store_matrix_sync(Ss + warp * 16 * AW_LDS + j * 16, acc[j], AW_LDS, wmma::mem_row_major);
        __syncwarp();
        // Scale, bias and mask one row of the warp's 16 at a time, lane = key column, so a warp's
        // bias and mask loads are 32 consecutive keys of one row (coalesced); the softmax below
        // reads the rows back per lane.
        const int js = s0 + lane;
#pragma unroll 4
        for (int r = 0; r < 16; r++) {
            const int tr = t0 + warp * 16 + r;
            float* sr = Ss + (warp * 16 + r) * AW_LDS;
            float x = NEG_INF;
            if (js < S) {
                x = sr[lane] * scale;
                if (tr < T) {
                    if (bias_kind != 0) x += att_bias(bias, bias_kind, bo + (i64)tr * bias_t + (i64)js * bias_s);
                    if (mask_kind != 0) x += att_bias(mask, mask_kind, mo + (i64)tr * mask_t + (i64)js * mask_s);
                }
            }
            sr[lane] = x;
        }
        __syncwarp();
    };

    // Pass 1: row max and sum of exp.
    float m = NEG_INF, lsum = 0.f;
    for (int s0 = 0; s0 < S; s0 += AW_BN) {
        __syncthreads();  // Qs written / the previous tile consumed
        aw_load_rows<DP>(Ks, k, ko, s0, AW_BN, S, ldk, d, tid);
        __syncthreads();
        scores(s0);
        float mt = NEG_INF;
#pragma unroll
        for (int c = c0; c < c0 + 16; c++) mt = fmaxf(mt, srow[c]);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        const float mn = fmaxf(m, mt);
        float ps = 0.f;
        if (mn != NEG_INF) {
#pragma unroll
            for (int c = c0; c < c0 + 16; c++) ps += __expf(srow[c] - mn);
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        lsum = (m == NEG_INF ? 0.f : lsum * __expf(m - mn)) + ps;
        m = mn;
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;

    // Pass 2: P = exp(x - m) / sum, O += P @ V.
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc[DP / 16];
#pragma unroll
    for (int j = 0; j < DP / 16; j++) wmma::fill_fragment(oacc[j], 0.f);
    half* prow = Ps + (warp * 16 + rw) * AW_LDP;
    for (int s0 = 0; s0 < S; s0 += AW_BN) {
        __syncthreads();
        aw_load_rows<DP>(Ks, k, ko, s0, AW_BN, S, ldk, d, tid);
        aw_load_rows<DP>(Vs, v, vo, s0, AW_BN, S, ldv, dv, tid);
        __syncthreads();
        scores(s0);
#pragma unroll
        for (int c = c0; c < c0 + 16; c++) {
            const float x = srow[c];
            prow[c] = __float2half((m == NEG_INF || x == NEG_INF) ? 0.f : __expf(x - m) * inv);
        }
        __syncwarp();
        warp_mma<DP / 16, AW_BN, wmma::row_major>(oacc, Ps + warp * 16 * AW_LDP, AW_LDP, Vs, LDQ, 16, LDQ);
    }
    __syncthreads();  // every warp is done with Qs / Ks / Vs: O is staged over them
#pragma unroll
    for (int j = 0; j < DP / 16; j++)
        wmma::store_matrix_sync(Os + warp * 16 * (DP + 4) + j * 16, oacc[j], DP + 4, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * dv; i += 32) {
        const int r = i / dv, c = i - r * dv, tr = t0 + warp * 16 + r;
        if (tr < T) o[oo + (i64)tr * ldo + c] = __float2half(Os[(warp * 16 + r) * (DP + 4) + c]);
    }
}

#define ATTWMMA_ENTRY(NAME, DP)                                                                            \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                                      \
        const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,                      \
        const void* __restrict__ bias, const void* __restrict__ mask, half* __restrict__ o,                      \
        const i64* __restrict__ offs, int T, int S, int d, int dv, int ldq, int ldk, int ldv, int ldo,           \
        int bias_kind, int bias_t, int bias_s, int mask_kind, int mask_t, int mask_s, float scale) {             \
        attention_wmma<DP>(q, k, v, bias, mask, o, offs, T, S, d, dv, ldq, ldk, ldv, ldo, bias_kind, bias_t,    \
                           bias_s, mask_kind, mask_t, mask_s, scale);                                            \
    }
ATTWMMA_ENTRY(attention_wmma_d16, 16)
ATTWMMA_ENTRY(attention_wmma_d32, 32)
ATTWMMA_ENTRY(attention_wmma_d64, 64)
