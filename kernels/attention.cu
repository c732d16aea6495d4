// Fused attention softmax(scale * q @ k^T + bias + mask) @ v (the IR's Attention op), flash style:
// the [T, S] scores never leave the block. One block per (leading index, tile of 64 query rows);
// K / V tiles of 32 rows stream through shared memory; an online softmax in fp32 rescales the
// fp32 output accumulators; fp16 in, fp16 out. SIMT (the kernel for d > 64, and before sm_80):
// 4 threads per query row, each scoring 8 of the tile's 32 keys and owning every 4th output column.
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

// attention_fwd on the tensor cores (sm_80+) for d, dv <= DP (16, 32 or 64), one pass over the
// keys (flash-attention 2): one block of 4 warps per (leading index, 64 query rows), each warp
// owning 16 rows. Key and value tiles of 64 rows stream through a two-stage cp.async ring. A
// tile's scores stay in the m16n8k16 accumulators (registers) where they are scaled, biased and
// masked; an online softmax in fp32 rescales the output accumulators (each lane knows its rows:
// g and g + 8 of the warp's 16), and P is repacked from the score registers into the A operand
// of P @ V (the m16n8 accumulator and the m16n8k16 A fragment share their layout), so neither
// the scores nor P touch shared memory and the keys are read once.
#define AM_BM 64
#define AM_BN 64

// Rows row0.. of a [rows, ld] fp16 operand (cols features of each) into a [64][DP + 8] tile,
// zeros past nrows and cols: 16-byte cp.async when `vec` (cols, ld and the offset multiples of
// 8, the base 16-byte aligned), element loads otherwise.
template <int DP>
__device__ __forceinline__ void am_tile(half* dst, const half* __restrict__ src, i64 off, int row0, int nrows, int ld,
                                        int cols, bool vec, int tid) {
    constexpr int CH = DP / 8, LD = DP + 8;
    for (int i = tid; i < AM_BN * CH; i += 128) {
        const int r = i / CH, c = (i - r * CH) * 8;
        half* dp = dst + r * LD + c;
        const bool in = row0 + r < nrows;
        const i64 at = off + (i64)(row0 + r) * ld + c;
        if (vec) {
            const bool got = in && c < cols;
            cp_async16(dp, got ? src + at : src, got ? 16 : 0);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) dp[e] = (in && c + e < cols) ? src[at + e] : __float2half(0.f);
        }
    }
}

// One bias or mask value as fp32 (the term's element type is the overload).
__device__ __forceinline__ float am_ld(const float* __restrict__ f, i64 at) { return __ldg(f + at); }
__device__ __forceinline__ float am_ld(const half* __restrict__ f, i64 at) { return __half2float(f[at]); }

// am_terms' one-load-per-key path: rows at rb[0], rb[1], keys j0 + 8j (+1) clamped below S.
template <int NB, typename T>
__device__ __forceinline__ void am_scalar(float (&tb)[NB][4], const T* __restrict__ f, const i64 (&rb)[2], int j0,
                                          int S, int ss) {
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 2; e++) tb[j][2 * h + e] += am_ld(f, rb[h] + (i64)min(j0 + 8 * j + e, S - 1) * ss);
}

// Adds a tile's bias or mask terms (kind 1 fp16, 2 fp32; 0: none) for a lane's scores to tb:
// rows r0 and r1 (already clamped below T), keys j0 + 8j (+1), clamped below S. Every address
// lies inside the operand, so the loads carry no branch or predicate and issue back to back;
// entries past T or S are discarded by the caller. `pair`: 8-byte loads (fp32, unit key stride,
// even offsets, the whole tile inside S).
template <int NB>
__device__ __forceinline__ void am_terms(float (&tb)[NB][4], const void* __restrict__ p, int kind, i64 off, int st,
                                         int ss, bool pair, int r0, int r1, int j0, int S) {
    const i64 rb[2] = {off + (i64)r0 * st, off + (i64)r1 * st};
    if (kind == 2 && pair) {
        const float* f = (const float*)p;
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float2 b = __ldg(reinterpret_cast<const float2*>(f + rb[h] + j0 + 8 * j));
                tb[j][2 * h] += b.x;
                tb[j][2 * h + 1] += b.y;
            }
    } else if (kind == 2) {
        am_scalar<NB>(tb, (const float*)p, rb, j0, S, ss);
    } else if (kind == 1) {
        am_scalar<NB>(tb, (const half*)p, rb, j0, S, ss);
    }
}

__device__ __forceinline__ unsigned am_pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

template <int DP>
__device__ __forceinline__ void attention_mma(const half* __restrict__ q, const half* __restrict__ k,
                                              const half* __restrict__ v, const void* __restrict__ bias,
                                              const void* __restrict__ mask, half* __restrict__ o,
                                              const i64* __restrict__ offs, int T, int S, int d, int dv, int ldq,
                                              int ldk, int ldv, int ldo, int bias_kind, int bias_t, int bias_s,
                                              int mask_kind, int mask_t, int mask_s, float scale) {
    constexpr int LD = DP + 8, TILE = AM_BN * LD, NB = AM_BN / 8, DB = DP / 8;
    __shared__ __align__(128) half smem[AM_BM * LD + 4 * TILE];
    half* Qs = smem;
    half* Ks = smem + AM_BM * LD;  // two stages
    half* Vs = Ks + 2 * TILE;      // two stages

    const int tiles = (T + AM_BM - 1) / AM_BM;
    const int l = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * AM_BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c2 = (lane & 3) * 2;
    const i64 qo = offs[l * 6], ko = offs[l * 6 + 1], vo = offs[l * 6 + 2];
    const i64 bo = offs[l * 6 + 3], mo = offs[l * 6 + 4], oo = offs[l * 6 + 5];
    auto al16 = [](const void* p, int n, int ld, i64 off) {
        return ((reinterpret_cast<unsigned long long>(p) & 15) | ((n | ld | (int)(off & 7)) & 7)) == 0;
    };
    const bool vq = al16(q, d, ldq, qo), vk = al16(k, d, ldk, ko), vv = al16(v, dv, ldv, vo);
    const bool bpair = bias_s == 1 && ((bo | bias_t) & 1) == 0 && (reinterpret_cast<unsigned long long>(bias) & 7) == 0;
    const bool mpair = mask_s == 1 && ((mo | mask_t) & 1) == 0 && (reinterpret_cast<unsigned long long>(mask) & 7) == 0;

    const int ntiles = (S + AM_BN - 1) / AM_BN;
    am_tile<DP>(Qs, q, qo, t0, T, ldq, d, vq, tid);
    am_tile<DP>(Ks, k, ko, 0, S, ldk, d, vk, tid);
    am_tile<DP>(Vs, v, vo, 0, S, ldv, dv, vv, tid);
    cp_async_commit();

    const bool live = t0 + warp * 16 < T;  // a warp past the last row only helps load
    const int row0 = t0 + warp * 16 + g;  // this lane's rows: row0 and row0 + 8
    float acc[DB][4];
#pragma unroll
    for (int j = 0; j < DB; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, lsum[2] = {0.f, 0.f};
    unsigned qf[DP / 16][4];

    for (int it = 0; it < ntiles; it++) {
        const int s0 = it * AM_BN, buf = it & 1;
        if (it + 1 < ntiles) {
            am_tile<DP>(Ks + (buf ^ 1) * TILE, k, ko, s0 + AM_BN, S, ldk, d, vk, tid);
            am_tile<DP>(Vs + (buf ^ 1) * TILE, v, vo, s0 + AM_BN, S, ldv, dv, vv, tid);
        }
        cp_async_commit();
        // This tile's bias and mask terms, requested before the wait so that their latency hides
        // behind it and behind q.k^T.
        float tb[NB][4];
#pragma unroll
        for (int j = 0; j < NB; j++) tb[j][0] = tb[j][1] = tb[j][2] = tb[j][3] = 0.f;
        if (live) {
            const bool full = s0 + AM_BN <= S;
            const int r0 = min(row0, T - 1), r1 = min(row0 + 8, T - 1), j0 = s0 + c2;
            if (bias_kind != 0) am_terms<NB>(tb, bias, bias_kind, bo, bias_t, bias_s, bpair && full, r0, r1, j0, S);
            if (mask_kind != 0) am_terms<NB>(tb, mask, mask_kind, mo, mask_t, mask_s, mpair && full, r0, r1, j0, S);
        }
        cp_async_wait<1>();
        __syncthreads();  // tile it (and Q, the first time) landed for every thread
        if (live) {
            if (it == 0) {
#pragma unroll
                for (int kk = 0; kk < DP / 16; kk++)
                    ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
            }
            const half* Kt = Ks + buf * TILE;
            const half* Vt = Vs + buf * TILE;
            const int kv = min(AM_BN, S - s0);  // keys of this tile
            float sc[NB][4];
#pragma unroll
            for (int j = 0; j < NB; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int j2 = 0; j2 < NB / 2; j2++) {
                if (j2 * 16 >= kv) continue;
#pragma unroll
                for (int kk = 0; kk < DP / 16; kk++) {
                    unsigned b[4];
                    ldsm_x4(b, Kt + (j2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma16816(sc[2 * j2], qf[kk], b[0], b[1]);
                    mma16816(sc[2 * j2 + 1], qf[kk], b[2], b[3]);
                }
            }
            // Scale, add the terms; -inf past S. Lane holds keys s0 + 8j + c2 (+1) of rows g, g + 8.
            float mt[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const int js = s0 + j * 8 + c2;
                const bool one = js < S, two = js + 1 < S;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float x0 = one ? sc[j][2 * h] * scale + tb[j][2 * h] : NEG_INF;
                    const float x1 = two ? sc[j][2 * h + 1] * scale + tb[j][2 * h + 1] : NEG_INF;
                    sc[j][2 * h] = x0;
                    sc[j][2 * h + 1] = x1;
                    mt[h] = fmaxf(mt[h], fmaxf(x0, x1));
                }
            }
            // Online softmax: the row max over the quad, rescale what the earlier tiles summed.
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
                mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
                const float mn = fmaxf(m[h], mt[h]);
                // A row whose scores are all -inf so far keeps m = -inf and adds nothing.
                const float alpha = mn == NEG_INF ? 1.f : __expf(m[h] - mn);
                float ps = 0.f;
#pragma unroll
                for (int j = 0; j < NB; j++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float x = sc[j][2 * h + e];
                        const float p = mn == NEG_INF ? 0.f : __expf(x - mn);
                        sc[j][2 * h + e] = p;
                        ps += p;
                    }
                }
                lsum[h] = lsum[h] * alpha + ps;  // this lane's columns; the quad sums at the end
                m[h] = mn;
#pragma unroll
                for (int j = 0; j < DB; j++) {
                    acc[j][2 * h] *= alpha;
                    acc[j][2 * h + 1] *= alpha;
                }
            }
            // O += P @ V, 16 keys per step; V^T fragments by ldmatrix.trans from the [key][feature] tile.
#pragma unroll
            for (int kj = 0; kj < AM_BN / 16; kj++) {
                if (kj * 16 >= kv) continue;
                const unsigned a[4] = {am_pack(sc[2 * kj][0], sc[2 * kj][1]), am_pack(sc[2 * kj][2], sc[2 * kj][3]),
                                       am_pack(sc[2 * kj + 1][0], sc[2 * kj + 1][1]),
                                       am_pack(sc[2 * kj + 1][2], sc[2 * kj + 1][3])};
#pragma unroll
                for (int n2 = 0; n2 < DP / 16; n2++) {
                    unsigned b[4];
                    ldsm_x4_trans(b, Vt + (kj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n2 * 16 + (lane >> 4) * 8);
                    mma16816(acc[2 * n2], a, b[0], b[1]);
                    mma16816(acc[2 * n2 + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // tile it consumed: the next iteration refills its buffer
    }
    if (!live) return;
    const bool pair = ((oo | ldo | dv) & 1) == 0 && (reinterpret_cast<unsigned long long>(o) & 3) == 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float s = lsum[h];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        const float inv = s > 0.f ? 1.f / s : 0.f;
        if ((row0 + 8 * h) >= T) continue;
        const i64 ob = oo + (i64)(row0 + 8 * h) * ldo;
#pragma unroll
        for (int j = 0; j < DB; j++) {
            const int col = j * 8 + c2;
            const float y0 = acc[j][2 * h] * inv, y1 = acc[j][2 * h + 1] * inv;
            if (pair && col + 1 < dv) {
                *reinterpret_cast<__half2*>(o + ob + col) = __floats2half2_rn(y0, y1);
            } else {
                if (col < dv) o[ob + col] = __float2half(y0);
                if (col + 1 < dv) o[ob + col + 1] = __float2half(y1);
            }
        }
    }
}

#define ATTMMA_ENTRY(NAME, DP, MINB)                                                                            \
    extern "C" __global__ void __launch_bounds__(128, MINB) NAME(                                                    \
        const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,                      \
        const void* __restrict__ bias, const void* __restrict__ mask, half* __restrict__ o,                      \
        const i64* __restrict__ offs, int T, int S, int d, int dv, int ldq, int ldk, int ldv, int ldo,           \
        int bias_kind, int bias_t, int bias_s, int mask_kind, int mask_t, int mask_s, float scale) {             \
        attention_mma<DP>(q, k, v, bias, mask, o, offs, T, S, d, dv, ldq, ldk, ldv, ldo, bias_kind, bias_t,     \
                          bias_s, mask_kind, mask_t, mask_s, scale);                                             \
    }
ATTMMA_ENTRY(attention_mma_d16, 16, 4)
ATTMMA_ENTRY(attention_mma_d32, 32, 4)
ATTMMA_ENTRY(attention_mma_d64, 64, 3)
