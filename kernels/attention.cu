// Fused attention softmax(scale * q @ k^T + bias) @ v (the IR's Attention op), flash style:
// the [T, S] scores never leave the block. One block per (leading index, tile of 64 query rows);
// K / V tiles of 32 rows stream through shared memory; an online softmax in fp32 rescales the
// fp32 output accumulators; fp16 in, fp16 out. SIMT (no tensor cores yet): 4 threads per query
// row, each scoring 8 of the tile's 32 keys and owning every 4th output column.
//
// Operands are row-major fp16 [.., T, d], [.., S, d], [.., S, dv] with row strides ldq / ldk /
// ldv (elements); `offs[l * 5 + {0..4}]` gives the element offset of leading index l in q, k, v,
// the bias and the output (broadcast leading dims are resolved by the host). The bias (kind 0:
// none, 1: fp16, 2: fp32) is read at offs + t * bias_t + s * bias_s (0 strides broadcast).
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
    const void* __restrict__ bias, half* __restrict__ o, const i64* __restrict__ offs, int T,
    int S, int d, int dv, int ldq, int ldk, int ldv, int ldo, int bias_kind, int bias_t,
    int bias_s, float scale) {
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
    const i64 qo = offs[l * 5], ko = offs[l * 5 + 1], vo = offs[l * 5 + 2];
    const i64 bo = offs[l * 5 + 3], oo = offs[l * 5 + 4];
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
