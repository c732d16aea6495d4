// InstanceNorm / GroupNorm on NDHWC fp16, deterministic (fixed-order reductions, no atomics, so
// an OOM retry reproduces every bit): per-(block, channel) sums of values shifted by the first
// value of the channel's group (reduces the cancellation of E[x^2] - E[x]^2) in fp32, then one
// thread per (n, c) adds the blocks' partials in order in fp64 and writes scale/shift, then
// normalise with the activation fused (16-byte vectors when C % 8 == 0). The input is fp16, or
// fp32 (`_f32` kernels) when the producing conv kept it so (see out_store1 in common.cuh).

// The dynamic shared memory of every partial kernel, declared once: template and plain kernels
// declaring it each would clash in linkage.
__device__ __forceinline__ float* norm_smem() {
    extern __shared__ float norm_sh[];
    return norm_sh;
}

// Block tail shared by both partial kernels: sh holds [rows][C][2] per-thread sums; each
// channel adds its rows in order and writes the block's partial.
__device__ __forceinline__ void norm_block_partial(const float* sh, int rows, int C, float* __restrict__ part) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f, q = 0.f;
        for (int r = 0; r < rows; r++) {
            s += sh[(r * C + c) * 2];
            q += sh[(r * C + c) * 2 + 1];
        }
        part[c * 2] = s;
        part[c * 2 + 1] = q;
    }
}

// Vectors a partial-sum thread loads before adding them (in the order it would one at a time):
// a sample's one-window norm runs 2 blocks per SM (`norm_blocks`), too few threads to keep the
// memory busy with one load each in flight.
#define NORM_LOADS 4

// Adds the 8 values `v`, each shifted by its channel's shf, to the sums s and the squares q.
__device__ __forceinline__ void sums8(const float (&v)[8], const float (&shf)[8], float (&s)[8], float (&q)[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float a = v[k] - shf[k];
        s[k] += a;
        q[k] += a * a;
    }
}

// C % 8 == 0, C <= 2048: thread (r, cv) sums channels cv*8..+8 over pixels p0+r, p0+r+rows, ...
// with 16-byte loads. grid (blocks per sample, N), block 256, dynamic smem rows*C*2 floats.
// part: [N][gridDim.x][C][2] fp32.
template <typename T>
__device__ __forceinline__ void norm_partial_v8_t(const T* __restrict__ x, i64 P, int C, int groups, i64 chunk,
                                                  float* __restrict__ part) {
    float* sh = norm_smem();
    const int n = blockIdx.y, tid = threadIdx.x;
    const int vpp = C >> 3;
    const int rows = blockDim.x / vpp;
    const int cpg = C / groups;
    const T* xn = x + (i64)n * P * C;
    if (tid < rows * vpp) {
        const int r = tid / vpp, cv = tid - r * vpp;
        float shf[8], s[8], q[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int c = cv * 8 + k;
            shf[k] = to_f(xn[(c / cpg) * cpg]);
            s[k] = q[k] = 0.f;
        }
        const i64 p0 = (i64)blockIdx.x * chunk;
        const i64 p1 = min(p0 + chunk, P);
        i64 p = p0 + r;
        for (; p + (NORM_LOADS - 1) * rows < p1; p += NORM_LOADS * rows) {
            float v[NORM_LOADS][8];
#pragma unroll
            for (int u = 0; u < NORM_LOADS; u++) load8(xn, (p + u * rows) * C + cv * 8, v[u]);
#pragma unroll
            for (int u = 0; u < NORM_LOADS; u++) sums8(v[u], shf, s, q);
        }
        for (; p < p1; p += rows) {
            float v[8];
            load8(xn, p * C + cv * 8, v);
            sums8(v, shf, s, q);
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            sh[(r * C + cv * 8 + k) * 2] = s[k];
            sh[(r * C + cv * 8 + k) * 2 + 1] = q[k];
        }
    }
    __syncthreads();
    norm_block_partial(sh, rows, C, part + ((i64)n * gridDim.x + blockIdx.x) * C * 2);
}
// The kernels of a partial-sum template, one per input type (fp16, or fp32 from a conv kept so).
#define NORM_PARTIAL_ENTRY(NAME, T, IMPL)                                                             \
    extern "C" __global__ void NAME(const T* __restrict__ x, i64 P, int C, int groups, i64 chunk,       \
                                    float* __restrict__ part) {                                         \
        IMPL(x, P, C, groups, chunk, part);                                                             \
    }
NORM_PARTIAL_ENTRY(norm_partial_v8, half, norm_partial_v8_t)
NORM_PARTIAL_ENTRY(norm_partial_v8_f32, float, norm_partial_v8_t)

// Any C: thread (r, c0) sums channels c0, c0+cg, ... over pixels p0+r, p0+r+rows, ...
// (cg = min(C, blockDim)), smem [rows][C][2] floats. Same partial layout as the v8 kernel.
template <typename T>
__device__ __forceinline__ void norm_partial_t(const T* __restrict__ x, i64 P, int C, int groups, i64 chunk,
                                               float* __restrict__ part) {
    float* sh = norm_smem();
    const int n = blockIdx.y, tid = threadIdx.x;
    const int cg = C < (int)blockDim.x ? C : (int)blockDim.x;
    const int rows = blockDim.x / cg;
    const int cpg = C / groups;
    const T* xn = x + (i64)n * P * C;
    const i64 p0 = (i64)blockIdx.x * chunk;
    const i64 p1 = min(p0 + chunk, P);
    if (tid < rows * cg) {
        const int r = tid / cg;
        for (int c = tid - r * cg; c < C; c += cg) {
            float shift = to_f(xn[(c / cpg) * cpg]);
            float s = 0.f, q = 0.f;
            for (i64 pp = p0 + r; pp < p1; pp += rows) {
                float v = to_f(xn[pp * C + c]) - shift;
                s += v;
                q += v * v;
            }
            sh[(r * C + c) * 2] = s;
            sh[(r * C + c) * 2 + 1] = q;
        }
    }
    __syncthreads();
    norm_block_partial(sh, rows, C, part + ((i64)n * gridDim.x + blockIdx.x) * C * 2);
}
NORM_PARTIAL_ENTRY(norm_partial, half, norm_partial_t)
NORM_PARTIAL_ENTRY(norm_partial_f32, float, norm_partial_t)

// Vectors of 8 halves over channel counts that are not multiples of 8 (P * C % 8 == 0): a sample is
// a flat run of 16-byte vectors, vector v holding channels (8v + k) % C, which repeat every
// `period` = C / gcd(C, 8) vectors. So thread t of a block whose first vector is a multiple of
// period (chunkv is) and whose vector stride T is one too sees the same 8 channels at every step.
__device__ __forceinline__ int flat8_period(int C) {
    int g = 8;
    while (C % g) g >>= 1;
    return C / g;
}

// Partial sums for C % 8 != 0 (flat vectors, see flat8_period): block b sums vectors
// [b * chunkv, (b + 1) * chunkv) with its first T = (blockDim / period) * period threads, then
// channel c adds its (thread, lane) slots in a fixed order. smem T * 8 * 2 floats. Same partial
// layout as the other partial kernels. A vector is 8 values: 16 bytes of fp16, 32 of fp32.
template <typename T>
__device__ __forceinline__ void norm_partial_flat8_t(const T* __restrict__ x, i64 P, int C, int groups, i64 chunkv,
                                                     float* __restrict__ part) {
    float* sh = norm_smem();
    const int n = blockIdx.y, tid = threadIdx.x;
    const int period = flat8_period(C);
    const int TH = ((int)blockDim.x / period) * period;
    const int cpg = C / groups;
    const T* xn = x + (i64)n * P * C;
    const i64 nv = P * C / 8;
    const i64 v0 = (i64)blockIdx.x * chunkv;
    const i64 v1 = min(v0 + chunkv, nv);
    if (tid < TH) {
        float shf[8], s[8], q[8];
        const int c0 = (8 * tid) % C;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int c = (c0 + k) % C;
            shf[k] = to_f(xn[(c / cpg) * cpg]);
            s[k] = q[k] = 0.f;
        }
        i64 v = v0 + tid;
        for (; v + (NORM_LOADS - 1) * TH < v1; v += NORM_LOADS * TH) {
            float u[NORM_LOADS][8];
#pragma unroll
            for (int l = 0; l < NORM_LOADS; l++) load8(xn, (v + l * TH) * 8, u[l]);
#pragma unroll
            for (int l = 0; l < NORM_LOADS; l++) sums8(u[l], shf, s, q);
        }
        for (; v < v1; v += TH) {
            float u[8];
            load8(xn, v * 8, u);
            sums8(u, shf, s, q);
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            sh[(tid * 8 + k) * 2] = s[k];
            sh[(tid * 8 + k) * 2 + 1] = q[k];
        }
    }
    __syncthreads();
    float* pb = part + ((i64)n * gridDim.x + blockIdx.x) * C * 2;
    for (int c = tid; c < C; c += blockDim.x) {
        float s = 0.f, q = 0.f;
        // Phase ph's vectors start at channel c0 = 8 ph % C; lane k holds c where k = c - c0
        // (mod C), and again every C lanes: the same (ph, k, t) order as a search over all k.
        for (int ph = 0, c0 = 0; ph < period; ph++, c0 = (c0 + 8) % C) {
            for (int k = c >= c0 ? c - c0 : c - c0 + C; k < 8; k += C) {
                for (int t = ph; t < TH; t += period) {
                    s += sh[(t * 8 + k) * 2];
                    q += sh[(t * 8 + k) * 2 + 1];
                }
            }
        }
        pb[c * 2] = s;
        pb[c * 2 + 1] = q;
    }
}
NORM_PARTIAL_ENTRY(norm_partial_flat8, half, norm_partial_flat8_t)
NORM_PARTIAL_ENTRY(norm_partial_flat8_f32, float, norm_partial_flat8_t)

// One warp per (n, c): lane l adds blocks l, l+32, ... of the channel's group (fp64), then a
// fixed shuffle tree; writes ab[n][c] = {gamma*rstd, beta - mean*gamma*rstd}. Same order every
// run. block 128 (4 warps).
// x_f32: x is fp32 (only its group's first value is read: the shift of the partial sums).
extern "C" __global__ void norm_finalize(const float* __restrict__ part, int nblk, const void* __restrict__ x,
                                         int x_f32, int N, i64 P, int C, int groups, float eps,
                                         const float* __restrict__ gamma, const float* __restrict__ beta,
                                         float* __restrict__ ab) {
    int e = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (e >= N * C) return;
    int n = e / C, c = e % C;
    int cpg = C / groups;
    int g0 = (c / cpg) * cpg;
    double s = 0.0, q = 0.0;
    for (int b = lane; b < nblk; b += 32) {
        const float* pb = part + ((i64)n * nblk + b) * C * 2;
        for (int k = g0; k < g0 + cpg; k++) {
            s += (double)pb[k * 2];
            q += (double)pb[k * 2 + 1];
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        q += __shfl_xor_sync(0xffffffffu, q, o);
    }
    if (lane != 0) return;
    double cnt = (double)P * cpg;
    double ms = s / cnt;                       // mean of shifted values
    double var = q / cnt - ms * ms;
    if (var < 0.0) var = 0.0;
    const i64 first = (i64)n * P * C + g0;
    const float shift = x_f32 ? static_cast<const float*>(x)[first] : __half2float(static_cast<const half*>(x)[first]);
    double mean = ms + (double)shift;
    double rstd = 1.0 / sqrt(var + (double)eps);
    double a = (double)gamma[c] * rstd;
    ab[e * 2] = (float)a;
    ab[e * 2 + 1] = (float)((double)beta[c] - mean * a);
}

// Sum over a block of 256 threads in a fixed order (a shuffle tree per warp, then the warps in
// order); every thread gets the total. `red`: 9 doubles of shared memory.
__device__ __forceinline__ double block_sum256(double v, double* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < 8; w++) t += red[w];
        red[8] = t;
    }
    __syncthreads();
    const double t = red[8];
    __syncthreads();  // `red` may be reused
    return t;
}

// norm_finalize from the statistics a conv's epilogue took per output tile (kernels/
// tile_stats.cuh: float4 (sum, sum of squares, shift, count) at part[n][tile][C], each sum of
// values less the tile's shift), in place of the partial-sum pass: one block of 256 per
// (n, c). The group's mean in fp64 first, then its squared deviations: each entry's own about
// its mean plus its count times its mean's distance from the group's squared (Chan's parallel
// variance), so no E[x^2] - E[x]^2 of the whole group. Fixed orders: the same bits every run.
extern "C" __global__ void __launch_bounds__(256) norm_finalize_tiles(
    const float4* __restrict__ part, int ntiles, int C, int groups, float eps, const float* __restrict__ gamma,
    const float* __restrict__ beta, float* __restrict__ ab) {
    __shared__ double red[9];
    const int e = blockIdx.x, n = e / C, c = e % C;
    const int cpg = C / groups, g0 = (c / cpg) * cpg;
    const int entries = ntiles * cpg;
    const float4* pn = part + (i64)n * ntiles * C + g0;
    // Entry i of the group, NORM_LOADS of a thread's entries loaded before they are added (in
    // the order one at a time would add them): one block per (n, c) is few threads.
    auto entry = [&](int i) { return pn[(i64)(i / cpg) * C + i % cpg]; };
    constexpr int U = NORM_LOADS, S = 256 * NORM_LOADS;
    double s = 0.0, cnt = 0.0;
    int i = threadIdx.x;
    for (; i + S - 256 < entries; i += S) {
        float4 f[U];
#pragma unroll
        for (int u = 0; u < U; u++) f[u] = entry(i + u * 256);
#pragma unroll
        for (int u = 0; u < U; u++) {
            s += (double)f[u].z * (double)f[u].w + (double)f[u].x;
            cnt += (double)f[u].w;
        }
    }
    for (; i < entries; i += 256) {
        const float4 f = entry(i);
        s += (double)f.z * (double)f.w + (double)f.x;
        cnt += (double)f.w;
    }
    s = block_sum256(s, red);
    cnt = block_sum256(cnt, red);
    const double mean = cnt > 0.0 ? s / cnt : 0.0;
    double m2 = 0.0;
    // The entry's squared deviations about the group's mean.
    auto dev = [&](const float4& f) {
        if (f.w > 0.f) {
            const double d = (double)f.x / (double)f.w;  // the entry's mean less its shift
            const double dm = (double)f.z + d - mean;
            m2 += ((double)f.y - (double)f.x * d) + (double)f.w * dm * dm;
        }
    };
    i = threadIdx.x;
    for (; i + S - 256 < entries; i += S) {
        float4 f[U];
#pragma unroll
        for (int u = 0; u < U; u++) f[u] = entry(i + u * 256);
#pragma unroll
        for (int u = 0; u < U; u++) dev(f[u]);
    }
    for (; i < entries; i += 256) dev(entry(i));
    m2 = block_sum256(m2, red);
    if (threadIdx.x != 0) return;
    double var = cnt > 0.0 ? m2 / cnt : 0.0;
    if (var < 0.0) var = 0.0;
    const double rstd = 1.0 / sqrt(var + (double)eps);
    const double a = (double)gamma[c] * rstd;
    ab[e * 2] = (float)a;
    ab[e * 2 + 1] = (float)((double)beta[c] - mean * a);
}

// y = act(x * a[n][c] + b[n][c]); ab_nstride 0 broadcasts one (a, b) per channel (ChannelAffine).
// res (or null): a residual Add fused after the activation (`host::fusion::fusable_residual`),
// dense fp16 at y's index: the value is rounded to fp16 as the norm stores it, then added in fp32
// and rounded again, as `binary_v8` adds the two stored operands.
__device__ __forceinline__ half res_add(half v, const half* __restrict__ res, i64 i) {
    return res ? __float2half(__half2float(v) + __half2float(res[i])) : v;
}
__device__ __forceinline__ __half2 res_add2(__half2 v, const __half2& r) {
    const float2 a = __half22float2(v), b = __half22float2(r);
    return __floats2half2_rn(a.x + b.x, a.y + b.y);
}
// res_add2 over a 16-byte vector's four pairs.
__device__ __forceinline__ void res_add8(__half2 (&h)[4], const uint4& r) {
    const __half2* rh = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = res_add2(h[k], rh[k]);
}
template <typename T>
__device__ __forceinline__ void affine_act_t(const T* __restrict__ x, half* __restrict__ y, i64 total, i64 P,
                                             int C, const float* __restrict__ ab, int ab_nstride, int act,
                                             float alpha, const float* __restrict__ slope, int slope_n,
                                             const half* __restrict__ res) {
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        int n = (int)(e / ((i64)C * P));
        const float* q = ab + ((i64)n * ab_nstride + c) * 2;
        float v = to_f(x[e]) * q[0] + q[1];
        y[e] = res_add(__float2half(act_apply(v, c, act, alpha, slope, slope_n)), res, e);
    }
}
extern "C" __global__ void affine_act(const half* __restrict__ x, half* __restrict__ y, i64 total, i64 P,
                                      int C, const float* __restrict__ ab, int ab_nstride, int act,
                                      float alpha, const float* __restrict__ slope, int slope_n,
                                      const half* __restrict__ res) {
    affine_act_t(x, y, total, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res);
}
extern "C" __global__ void affine_act_f32(const float* __restrict__ x, half* __restrict__ y, i64 total, i64 P,
                                          int C, const float* __restrict__ ab, int ab_nstride, int act,
                                          float alpha, const float* __restrict__ slope, int slope_n,
                                          const half* __restrict__ res) {
    affine_act_t(x, y, total, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res);
}

// Calls BODY<T, ACT> with the activation fixed where it is one the networks use (`BY_ACT`).
#define AFFINE_BY_ACT(BODY, T, ...) BY_ACT(act, return BODY<T, ACT_T>(__VA_ARGS__))

// Vector e's 8 values v (channels c0..) through their (a, b) pairs and the activation, rounded
// to fp16, plus the residual's vector (rv, or null), stored as y's vector e.
// The pairs `q` already loaded (affine_act_v8_shifted_runs loads them once a run).
template <int ACT>
__device__ __forceinline__ void affine8q(const float (&v)[8], const float2 (&q)[8], int c0, int act, float alpha,
                                         const float* __restrict__ slope, int slope_n,
                                         const uint4* __restrict__ rv, uint4* __restrict__ yv, unsigned e) {
    __align__(16) __half2 h[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float a = act_of<ACT>(v[2 * k] * q[2 * k].x + q[2 * k].y, c0 + 2 * k, act, alpha, slope, slope_n);
        float b = act_of<ACT>(v[2 * k + 1] * q[2 * k + 1].x + q[2 * k + 1].y, c0 + 2 * k + 1, act, alpha, slope,
                              slope_n);
        h[k] = __floats2half2_rn(a, b);
    }
    if (rv) res_add8(h, rv[e]);
    yv[e] = *reinterpret_cast<const uint4*>(h);
}
template <int ACT>
__device__ __forceinline__ void affine8(const float (&v)[8], const float2* __restrict__ abn, int c0, int act,
                                        float alpha, const float* __restrict__ slope, int slope_n,
                                        const uint4* __restrict__ rv, uint4* __restrict__ yv, unsigned e) {
    float2 q[8];
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = abn[c0 + k];
    affine8q<ACT>(v, q, c0, act, alpha, slope, slope_n, rv, yv, e);
}

// affine_act for C % 8 == 0 with P*C/8 < 2^32: 16-byte vectors, sample n = blockIdx.y, 32-bit
// index math, the vector's 8 (a, b) pairs read once.
template <typename T, int ACT>
__device__ __forceinline__ void affine_act_v8_b(const T* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                const float* __restrict__ ab, int ab_nstride, int act, float alpha,
                                                const float* __restrict__ slope, int slope_n,
                                                const half* __restrict__ res) {
    const int n = blockIdx.y;
    const unsigned vpp = (unsigned)C >> 3;
    const unsigned nv = (unsigned)P * vpp;
    const T* xn = x + (i64)n * P * C;
    uint4* yv = reinterpret_cast<uint4*>(y + (i64)n * P * C);
    const uint4* rv = res ? reinterpret_cast<const uint4*>(res + (i64)n * P * C) : nullptr;
    const float2* abn = reinterpret_cast<const float2*>(ab) + (i64)n * ab_nstride;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < nv; e += gridDim.x * blockDim.x) {
        const int c0 = (int)(e % vpp) * 8;
        float v[8];
        load8(xn, (i64)e * 8, v);
        affine8<ACT>(v, abn, c0, act, alpha, slope, slope_n, rv, yv, e);
    }
}
template <typename T>
__device__ __forceinline__ void affine_act_v8_t(const T* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                const float* __restrict__ ab, int ab_nstride, int act, float alpha,
                                                const float* __restrict__ slope, int slope_n,
                                                const half* __restrict__ res) {
    AFFINE_BY_ACT(affine_act_v8_b, T, x, y, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res)
}
// The kernels of a vector affine template, one per input type (fp16, or fp32 from a conv kept so).
#define AFFINE_VEC_ENTRY(NAME, T, IMPL)                                                               \
    extern "C" __global__ void NAME(const T* __restrict__ x, half* __restrict__ y, i64 P, int C,         \
                                    const float* __restrict__ ab, int ab_nstride, int act, float alpha,  \
                                    const float* __restrict__ slope, int slope_n,                        \
                                    const half* __restrict__ res) {                                      \
        IMPL(x, y, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res);                               \
    }
AFFINE_VEC_ENTRY(affine_act_v8, half, affine_act_v8_t)
AFFINE_VEC_ENTRY(affine_act_v8_f32, float, affine_act_v8_t)

// affine_act_v8 over a conv's OUT_SHIFTED output (common.cuh; `CudaOptions::norm_shifted`): x
// is fp16 less the shift of its voxel's output tile, whose statistics the conv left in `part`
// ([n][tile][C] float4 (sum, sum of squares, shift, count), tile_stats.cuh; per sample `tiles`
// tiles of TZ x TY x TX voxels in `tile_origin`'s order over a D x H x W output), a voxel's
// values `xs` halves from the next one's (C; 2C where a split conv's last part stored them in
// its fp32 sums' place). The value is x + shift in fp32, then as affine_act_v8.
// A thread's unit is one channel group of RUN voxels along x: `affine_act_v8_shifted` takes
// RUN 1; `affine_act_v8_shifted_runs` NORM_RUN (`CudaOptions::norm_runs`; W and the tile's x
// multiples of it, so a run lies in one row of one tile), loading the tile's 8 shifts and the
// 8 (a, b) pairs and computing the tile (5 divisions) once a run rather than once a voxel (192
// bytes of L1 loads for 16 bytes of input). The same arithmetic either way (the same bits); a
// run's loads are issued first. NORM_RUN 4: 87 registers, none spilled (8 took 167). Mirrors
// `NORM_RUN` in abi.rs.
constexpr int NORM_RUN = 4;
template <int ACT, int RUN>
__device__ __forceinline__ void affine_act_v8_shifted_b(const half* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                        const float* __restrict__ ab, int ab_nstride, int act,
                                                        float alpha, const float* __restrict__ slope, int slope_n,
                                                        const half* __restrict__ res, const float4* __restrict__ part,
                                                        int H, int W, int tz, int ty, int tx, int tiles, int xs) {
    const int n = blockIdx.y;
    const unsigned vpp = (unsigned)C >> 3;
    const unsigned nu = ((unsigned)P / RUN) * vpp;
    const unsigned ntx = (W + tx - 1) / tx, nty = (H + ty - 1) / ty;
    const half* xn = x + (i64)n * P * xs;
    uint4* yv = reinterpret_cast<uint4*>(y + (i64)n * P * C);
    const uint4* rv = res ? reinterpret_cast<const uint4*>(res + (i64)n * P * C) : nullptr;
    const float2* abn = reinterpret_cast<const float2*>(ab) + (i64)n * ab_nstride;
    const float4* pn = part + (i64)n * tiles * C;
    for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < nu; u += gridDim.x * blockDim.x) {
        const unsigned run = u / vpp, c0 = (u - run * vpp) * 8, vox0 = run * RUN;
        const unsigned xw = vox0 % (unsigned)W, r = vox0 / (unsigned)W, yh = r % (unsigned)H, z = r / (unsigned)H;
        const float4* sh = pn + (((z / tz) * nty + yh / ty) * ntx + xw / tx) * C + c0;
        uint4 raw[RUN];
#pragma unroll
        for (int i = 0; i < RUN; i++) raw[i] = __ldg(reinterpret_cast<const uint4*>(xn + (i64)(vox0 + i) * xs + c0));
        float s[8];
        float2 q[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            s[k] = sh[k].z;
            q[k] = abn[c0 + k];
        }
#pragma unroll
        for (int i = 0; i < RUN; i++) {
            const __half2* hv = reinterpret_cast<const __half2*>(&raw[i]);
            float v[8];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 f = __half22float2(hv[k]);
                v[2 * k] = f.x;
                v[2 * k + 1] = f.y;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] += s[k];
            affine8q<ACT>(v, q, c0, act, alpha, slope, slope_n, rv, yv, (vox0 + i) * vpp + (c0 >> 3));
        }
    }
}
// Five blocks an SM at 48 registers, as before the runs shared its body (55 unbounded).
extern "C" __global__ void __launch_bounds__(256, 5) affine_act_v8_shifted(const half* __restrict__ x,
                                                                           half* __restrict__ y, i64 P, int C,
                                                                           const float* __restrict__ ab, int ab_nstride,
                                                                           int act, float alpha,
                                                                           const float* __restrict__ slope, int slope_n,
                                                                           const half* __restrict__ res,
                                                                           const float4* __restrict__ part, int H,
                                                                           int W, int tz, int ty, int tx, int tiles,
                                                                           int xs) {
    BY_ACT(act, return affine_act_v8_shifted_b<ACT_T, 1>(x, y, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res,
                                                         part, H, W, tz, ty, tx, tiles, xs))
}
extern "C" __global__ void affine_act_v8_shifted_runs(const half* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                      const float* __restrict__ ab, int ab_nstride, int act,
                                                      float alpha, const float* __restrict__ slope, int slope_n,
                                                      const half* __restrict__ res, const float4* __restrict__ part,
                                                      int H, int W, int tz, int ty, int tx, int tiles, int xs) {
    BY_ACT(act, return affine_act_v8_shifted_b<ACT_T, NORM_RUN>(x, y, P, C, ab, ab_nstride, act, alpha, slope,
                                                                slope_n, res, part, H, W, tz, ty, tx, tiles, xs))
}

// affine_act for C % 8 != 0 with P * C % 8 == 0 (flat vectors, see flat8_period): sample n =
// blockIdx.y; the channel of a vector's first value is (8v) % C, the next ones follow with wrap.
template <typename T, int ACT>
__device__ __forceinline__ void affine_act_flat8_b(const T* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                   const float* __restrict__ ab, int ab_nstride, int act,
                                                   float alpha, const float* __restrict__ slope, int slope_n,
                                                   const half* __restrict__ res) {
    const int n = blockIdx.y;
    const i64 nv = P * C / 8;
    const T* xn = x + (i64)n * P * C;
    uint4* yv = reinterpret_cast<uint4*>(y + (i64)n * P * C);
    const uint4* rv = res ? reinterpret_cast<const uint4*>(res + (i64)n * P * C) : nullptr;
    const float2* abn = reinterpret_cast<const float2*>(ab) + (i64)n * ab_nstride;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < nv; e += (i64)gridDim.x * blockDim.x) {
        int c = (int)((e * 8) % C);
        float v[8];
        load8(xn, e * 8, v);
        __align__(16) __half2 h[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int ca = c;
            c = c + 1 == C ? 0 : c + 1;
            const int cb = c;
            c = c + 1 == C ? 0 : c + 1;
            float2 q0 = abn[ca], q1 = abn[cb];
            float a = act_of<ACT>(v[2 * k] * q0.x + q0.y, ca, act, alpha, slope, slope_n);
            float b = act_of<ACT>(v[2 * k + 1] * q1.x + q1.y, cb, act, alpha, slope, slope_n);
            h[k] = __floats2half2_rn(a, b);
        }
        if (rv) res_add8(h, rv[e]);
        yv[e] = *reinterpret_cast<const uint4*>(h);
    }
}
template <typename T>
__device__ __forceinline__ void affine_act_flat8_t(const T* __restrict__ x, half* __restrict__ y, i64 P, int C,
                                                   const float* __restrict__ ab, int ab_nstride, int act,
                                                   float alpha, const float* __restrict__ slope, int slope_n,
                                                   const half* __restrict__ res) {
    AFFINE_BY_ACT(affine_act_flat8_b, T, x, y, P, C, ab, ab_nstride, act, alpha, slope, slope_n, res)
}
AFFINE_VEC_ENTRY(affine_act_flat8, half, affine_act_flat8_t)
AFFINE_VEC_ENTRY(affine_act_flat8_f32, float, affine_act_flat8_t)
