// Conv3d and ConvTranspose3d as one implicit GEMM on tensor cores (wmma 16x16x16, fp16 in,
// fp32 accumulate). Activations are NDHWC fp16, so the GEMM's K (taps x Cin) is contiguous for
// each tap; weights are re-laid at prepare as [Cout_pad][K_pad] fp16 (zero padded), so the B
// tile loads need no bounds checks. M = output pixels (N*Do*Ho*Wo), N = Cout.
// The transposed conv uses the gather formulation: input i contributes to output o through tap k
// when o + pad - k*dil = i*stride (stride-divisible and in range); the other entries are zeros.
#include <mma.h>
using namespace nvcuda;


#define BM 128
#define BK 32
#define LDS (BK + 8)   // +8 halves: rows start 16 bytes apart in different banks

// Input coordinate of output coordinate `o` through tap `k` along one axis, or -1 when none.
__device__ __forceinline__ int in_coord(int o, int k, int s, int p, int d, int n, int transposed) {
    if (!transposed) {
        int i = o * s - p + k * d;
        return (i >= 0 && i < n) ? i : -1;
    }
    int num = o + p - k * d;
    if (num < 0) return -1;
    int i = num / s;
    return (i * s == num && i < n) ? i : -1;
}

// One BK-deep step of the warp's 32 x BN tile.
template <int BN>
__device__ __forceinline__ void mma_tile(const half* As, const half* Bs, int warp,
                                         wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[2][BN / 16]) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b;
#pragma unroll
        for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], As + (warp * 32 + i * 16) * LDS + kk, LDS);
#pragma unroll
        for (int j = 0; j < BN / 16; j++) {
            wmma::load_matrix_sync(b, Bs + j * 16 * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
        }
    }
}

template <int BN, bool VEC>
__device__ __forceinline__ void conv_igemm(const ConvParams& p, const half* __restrict__ x,
                                           const half* __restrict__ w, const float* __restrict__ bias,
                                           half* __restrict__ y, const float* __restrict__ slope) {
    // Two stages of A (BM x BK) and B (BN x BK) tiles; the fp32 epilogue tile reuses them.
    __shared__ __align__(128) unsigned char smem[(BM * (BN + 4) * 4) > (2 * (BM + BN) * LDS * 2)
                                                     ? (BM * (BN + 4) * 4)
                                                     : (2 * (BM + BN) * LDS * 2)];
    half* As = reinterpret_cast<half*>(smem);
    half* Bs = As + BM * LDS;
    float* Cs = reinterpret_cast<float*>(smem);

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const i64 M = (i64)p.n * p.do_ * p.ho * p.wo;
    const i64 m0 = (i64)blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;
    const int taps_hw = p.kh * p.kw;
    const int K = p.kd * taps_hw * p.cin;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][BN / 16];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < BN / 16; j++) wmma::fill_fragment(acc[i][j], 0.f);

    // Each thread owns fixed A rows for the whole K loop: decode their pixels once.
    constexpr int ROWS = VEC ? 4 : 1;
    int rn[ROWS], rz[ROWS], ry[ROWS], rx[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = VEC ? (tid >> 2) + 32 * r : tid;
        i64 m = m0 + row;
        if (m < M) {
            rx[r] = (int)(m % p.wo); i64 t = m / p.wo;
            ry[r] = (int)(t % p.ho); t /= p.ho;
            rz[r] = (int)(t % p.do_); rn[r] = (int)(t / p.do_);
        } else {
            rn[r] = -1; rz[r] = ry[r] = rx[r] = 0;
        }
    }

    if (VEC) {
        // Two-stage pipeline: cp.async copies tile k+1 into the other buffers while the tensor
        // cores work on tile k. Out-of-range gathers are zero-filled (source size 0).
        const int v = tid & 3;
        auto load_tile = [&](int stage, int k0) {
            half* as = As + stage * (BM + BN) * LDS;
            half* bs = as + BM * LDS;
            const int k = k0 + v * 8;
            int tap = k / p.cin, ci = k - tap * p.cin;
            int tz = tap / taps_hw, rem = tap - tz * taps_hw;
            int ty = rem / p.kw, tx = rem - ty * p.kw;
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                int row = (tid >> 2) + 32 * r;
                const half* src = x;
                int bytes = 0;
                if (rn[r] >= 0 && k < K) {
                    int iz = in_coord(rz[r], tz, p.sd, p.pd, p.dd, p.di, p.transposed);
                    int iy = in_coord(ry[r], ty, p.sh, p.ph, p.dh, p.hi, p.transposed);
                    int ix = in_coord(rx[r], tx, p.sw, p.pw, p.dw, p.wi, p.transposed);
                    if (iz >= 0 && iy >= 0 && ix >= 0) {
                        src = x + ((((i64)rn[r] * p.di + iz) * p.hi + iy) * p.wi + ix) * p.cin + ci;
                        bytes = 16;
                    }
                }
                cp_async16(as + row * LDS + v * 8, src, bytes);
            }
            for (int idx = tid; idx < BN * (BK / 8); idx += blockDim.x) {
                int nrow = idx / (BK / 8), vv = idx % (BK / 8);
                cp_async16(bs + nrow * LDS + vv * 8, w + (i64)(n0 + nrow) * p.kpad + k0 + vv * 8, 16);
            }
            cp_async_commit();
        };
        const int nk = (K + BK - 1) / BK;
        load_tile(0, 0);
        for (int kt = 0; kt < nk; kt++) {
            if (kt + 1 < nk) {
                load_tile((kt + 1) & 1, (kt + 1) * BK);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const half* as = As + (kt & 1) * (BM + BN) * LDS;
            const half* bs = as + BM * LDS;
            mma_tile<BN>(as, bs, warp, acc);
            __syncthreads();
        }
    } else {
        for (int k0 = 0; k0 < K; k0 += BK) {
            // Small or odd Cin (the 1-channel first conv): one row per thread, element gathers.
            const int row = tid;
            for (int j = 0; j < BK; j++) {
                int k = k0 + j;
                half val = __float2half(0.f);
                if (rn[0] >= 0 && k < K) {
                    int tap = k / p.cin, ci = k - tap * p.cin;
                    int tz = tap / taps_hw, rem = tap - tz * taps_hw;
                    int ty = rem / p.kw, tx = rem - ty * p.kw;
                    int iz = in_coord(rz[0], tz, p.sd, p.pd, p.dd, p.di, p.transposed);
                    int iy = in_coord(ry[0], ty, p.sh, p.ph, p.dh, p.hi, p.transposed);
                    int ix = in_coord(rx[0], tx, p.sw, p.pw, p.dw, p.wi, p.transposed);
                    if (iz >= 0 && iy >= 0 && ix >= 0)
                        val = x[((((i64)rn[0] * p.di + iz) * p.hi + iy) * p.wi + ix) * p.cin + ci];
                }
                As[row * LDS + j] = val;
            }
            for (int idx = tid; idx < BN * (BK / 8); idx += blockDim.x) {
                int nrow = idx / (BK / 8), v = idx % (BK / 8);
                *reinterpret_cast<uint4*>(Bs + nrow * LDS + v * 8) =
                    *reinterpret_cast<const uint4*>(w + (i64)(n0 + nrow) * p.kpad + k0 + v * 8);
            }
            __syncthreads();
            mma_tile<BN>(As, Bs, warp, acc);
            __syncthreads();
        }
    }

    // Epilogue through shared memory: bias + activation, fp16 store, coalesced along channels.
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < BN / 16; j++)
            wmma::store_matrix_sync(Cs + (warp * 32 + i * 16) * (BN + 4) + j * 16, acc[i][j], BN + 4,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < BM * BN; idx += blockDim.x) {
        int r = idx / BN, c = idx % BN;
        i64 m = m0 + r;
        int co = n0 + c;
        if (m < M && co < p.cout) {
            float v = Cs[r * (BN + 4) + c];
            if (bias) v += bias[co];
            v = act_apply(v, co, p.act, p.alpha, slope, p.slope_n);
            out_store1(p, y, m * p.ldc + p.coff + co, v);
        }
    }
}

#define CONV_ENTRY(NAME, BN, VEC)                                                              \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                    \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_igemm<BN, VEC>(p, x, w, bias, y, slope);                                          \
    }
CONV_ENTRY(conv_igemm_n64_v8, 64, true)
CONV_ENTRY(conv_igemm_n32_v8, 32, true)
CONV_ENTRY(conv_igemm_n64_v1, 64, false)
CONV_ENTRY(conv_igemm_n32_v1, 32, false)

// ---------------------------------------------------------------------------------------------
// conv_mma_*: the fast implicit GEMM (Ampere/Hopper): mma.sync.m16n8k16 fed by ldmatrix from
// padded shared memory, STAGES-deep cp.async pipeline, TBM x TBN block tile split over WM x WN warps,
// fp32 accumulators in registers, bias + activation epilogue stored straight from the
// accumulators as half2. Non-transposed convs only (plus the kernel==stride transposed conv run
// as a 1x1x1 GEMM with the scatter epilogue, see ConvParams::up_d).
// Smem rows are MLDS = 40 halves (80 bytes): the 8 row addresses of one ldmatrix phase land in
// 8 different 16-byte bank groups, and every row start stays 16-byte aligned for cp.async.
#define MBK 32
#define MLDS 40

__device__ __forceinline__ void cp_async16_ca(half* smem, const half* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    // .ca: keep the gathered rows in L1, the next taps (tx+1) read them again shifted by a voxel.
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
    *reinterpret_cast<uint4*>(smem) = bytes ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

// 4-byte variant for the 2-half gathers (even Cin that is not a multiple of 8).
__device__ __forceinline__ void cp_async4_ca(half* smem, const half* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
    *reinterpret_cast<unsigned*>(smem) = bytes ? *reinterpret_cast<const unsigned*>(gmem) : 0u;
#endif
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const half* p) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
    r[0] = r[1] = r[2] = r[3] = 0u;
    __trap();
#endif
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// Stores GEMM columns c, c+1 of one row (bias, activation): half2 when aligned, else one by one
// (with an odd Cout the scatter's next column can belong to the next tap). Out of line: the
// unrolled epilogue calls it MI x NI x 2 times; inlining it was measured slower on the H200
// (K1 113 -> 75 TF/s, W1 convs 30.5 -> 38.6 ms: register pressure in the main loop).
__device__ __noinline__ void conv_store(const ConvParams& p, half* __restrict__ y,
                                        const float* __restrict__ bias, const float* __restrict__ slope,
                                        i64 ob, int off, int co, int c, float v0, float v1, bool pair,
                                        bool scatter) {
    i64 o = ob + off;
    const i64 dst = o * p.ldc + p.coff + co;
    if (bias) v0 += bias[co];
    v0 = act_apply(v0, co, p.act, p.alpha, slope, p.slope_n);
    if (c + 1 >= p.cout) {
        out_store1(p, y, dst, v0);
        return;
    }
    int co1 = co + 1;
    i64 o1 = o;
    if (scatter && co1 == p.ocout) {
        int tap = (c + 1) / p.ocout;
        int qz = tap / (p.up_h * p.up_w), rem = tap - qz * p.up_h * p.up_w;
        int qy = rem / p.up_w, qx = rem - qy * p.up_w;
        o1 = ob + ((i64)qz * p.oh + qy) * p.ow + qx;
        co1 = 0;
    }
    if (bias) v1 += bias[co1];
    v1 = act_apply(v1, co1, p.act, p.alpha, slope, p.slope_n);
    if (pair) {
        out_store2(p, y, dst, v0, v1);
    } else {
        out_store1(p, y, o1 * p.ldc + p.coff + co1, v1);
        out_store1(p, y, dst, v0);
    }
}

// VW: halves per A gather: 8 (Cin % 8 == 0, 16-byte cp.async), 2 (even Cin, 4-byte cp.async),
// 1 (element gathers by one thread per row).
// VEC_EPI (upsampling GEMM only, Cout % 8 == 0): the epilogue stages the fp32 tile in shared
// memory and writes each 8-channel chunk of a (voxel, tap) with one 16-byte store.
template <int TBM, int TBN, int WM, int WN, int STAGES, int VW, bool VEC_EPI = false>
__device__ __forceinline__ void conv_mma(const ConvParams& p, const half* __restrict__ x,
                                         const half* __restrict__ w, const float* __restrict__ bias,
                                         half* __restrict__ y, const float* __restrict__ slope) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int TM = TBM / WM, TN = TBN / WN;  // warp tile
    constexpr int MI = TM / 16, NI = TN / 8;
    static_assert(NI % 2 == 0, "warp tile N must be a multiple of 16");
    constexpr int A_ST = TBM * MLDS, B_ST = TBN * MLDS;  // halves per stage
    extern __shared__ __align__(16) unsigned char dsm[];
    half* sA = reinterpret_cast<half*>(dsm);
    half* sB = sA + STAGES * A_ST;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int M = p.n * p.do_ * p.ho * p.wo;  // host keeps M < 2^31
    const int m0 = blockIdx.x * TBM;
    const int n0 = blockIdx.y * TBN;
    const int taps_hw = p.kh * p.kw;
    const int K = p.kd * taps_hw * p.cin;
    const int nk = (K + MBK - 1) / MBK;

    // A rows owned by this thread: VEC: chunk v = tid % TPR of rows tid/TPR + r * THREADS/TPR
    // (TPR = 32/VW threads per row); scalar: row tid (THREADS == TBM), all 32 k. Decode each
    // row's input origin once.
    constexpr bool VEC = VW > 1;
    constexpr int TPR = MBK / VW;
    constexpr int RSTEP = VEC ? THREADS / TPR : THREADS;
    constexpr int AROWS = TBM / RSTEP;
    static_assert(VEC || THREADS == TBM, "scalar gather wants one row per thread");
    i64 base[AROWS];
    int z0[AROWS], y0[AROWS], x0[AROWS];
#pragma unroll
    for (int r = 0; r < AROWS; r++) {
        int row = (VEC ? tid / TPR : tid) + r * RSTEP;
        int m = m0 + row;
        if (m < M) {
            int ox = m % p.wo, t = m / p.wo;
            int oy = t % p.ho; t /= p.ho;
            int oz = t % p.do_, n = t / p.do_;
            z0[r] = oz * p.sd - p.pd;
            y0[r] = oy * p.sh - p.ph;
            x0[r] = ox * p.sw - p.pw;
            base[r] = ((((i64)n * p.di + z0[r]) * p.hi + y0[r]) * p.wi + x0[r]) * p.cin;
        } else {
            z0[r] = -(1 << 28);  // fails every bounds check below
            y0[r] = x0[r] = 0;
            base[r] = 0;
        }
    }

    // VEC: this thread's position in K (k = kt * 32 + v * VW), advanced incrementally.
    const int v = tid % TPR;
    int ci = 0, tx = 0, ty = 0, tz = 0;
    if (VEC) {
        int k = v * VW;
        int tap = k / p.cin;
        ci = k - tap * p.cin;
        tz = tap / taps_hw;
        int rem = tap - tz * taps_hw;
        ty = rem / p.kw;
        tx = rem - ty * p.kw;
    }

    auto load_tile = [&](int stage, int kt) {
        half* as = sA + stage * A_ST;
        half* bs = sB + stage * B_ST;
        const int k0 = kt * MBK;
        if (VEC) {
            const bool kin = tz < p.kd;
            const int dz = tz * p.dd, dy = ty * p.dh, dx = tx * p.dw;
            const int off = ((dz * p.hi + dy) * p.wi + dx) * p.cin + ci;
#pragma unroll
            for (int r = 0; r < AROWS; r++) {
                int row = tid / TPR + r * RSTEP;
                int iz = z0[r] + dz, iy = y0[r] + dy, ix = x0[r] + dx;
                bool ok = kin && (unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi &&
                          (unsigned)ix < (unsigned)p.wi;
                if (VW == 8)
                    cp_async16_ca(as + row * MLDS + v * 8, ok ? x + base[r] + off : x, ok ? 16 : 0);
                else
                    cp_async4_ca(as + row * MLDS + v * VW, ok ? x + base[r] + off : x, ok ? 4 : 0);
            }
            // Advance this thread's K position by one tile.
            ci += MBK;
            while (ci >= p.cin) {
                ci -= p.cin;
                if (++tx == p.kw) {
                    tx = 0;
                    if (++ty == p.kh) {
                        ty = 0;
                        ++tz;
                    }
                }
            }
        } else {
            // Element gathers (Cin = 1, 3, ...): the 1-channel first conv has K = 27, one tile.
            __align__(16) half vals[MBK];
            // Decode k0 once, then step (c, qx, qy, qz) along K without divisions.
            int tap = k0 / p.cin, c = k0 - tap * p.cin;
            int qz = tap / taps_hw, rem = tap - qz * taps_hw;
            int qy = rem / p.kw, qx = rem - qy * p.kw;
#pragma unroll
            for (int j = 0; j < MBK; j++) {
                half val = __float2half(0.f);
                int iz = z0[0] + qz * p.dd, iy = y0[0] + qy * p.dh, ix = x0[0] + qx * p.dw;
                if (qz < p.kd && (unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi &&
                    (unsigned)ix < (unsigned)p.wi)
                    val = x[base[0] + ((qz * p.dd * p.hi + qy * p.dh) * p.wi + qx * p.dw) * p.cin + c];
                vals[j] = val;
                if (++c == p.cin) {
                    c = 0;
                    if (++qx == p.kw) {
                        qx = 0;
                        if (++qy == p.kh) {
                            qy = 0;
                            ++qz;
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < MBK; j += 8)
                *reinterpret_cast<uint4*>(as + tid * MLDS + j) = *reinterpret_cast<const uint4*>(vals + j);
        }
        // B: TBN weight rows x 4 chunks; rows are padded to the tile, so no bounds checks.
#pragma unroll
        for (int idx = tid; idx < TBN * 4; idx += THREADS) {
            int nrow = idx >> 2, vv = idx & 3;
            cp_async16_ca(bs + nrow * MLDS + vv * 8, w + (i64)(n0 + nrow) * p.kpad + k0 + vv * 8, 16);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load_tile(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt landed for all threads; everyone is done with tile kt-1
        {
            int nt = kt + STAGES - 1;
            if (nt < nk) load_tile(nt % STAGES, nt);
            cp_async_commit();
        }
        const half* as = sA + (kt % STAGES) * A_ST + (wm * TM) * MLDS;
        const half* bs = sB + (kt % STAGES) * B_ST + (wn * TN) * MLDS;
#pragma unroll
        for (int kk = 0; kk < MBK; kk += 16) {
            unsigned af[MI][4], bf[NI / 2][4];
#pragma unroll
            for (int i = 0; i < MI; i++)
                ldsm_x4(af[i], as + (i * 16 + (lane & 15)) * MLDS + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < NI / 2; j++)
                ldsm_x4(bf[j], bs + (j * 16 + (lane >> 4) * 8 + (lane & 7)) * MLDS + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++)
                    mma16816(acc[i][j], af[i], bf[j >> 1][(j & 1) * 2], bf[j >> 1][(j & 1) * 2 + 1]);
        }
    }
    cp_async_wait<0>();

    if (VEC_EPI) {
        // Stage the fp32 tile (row stride TBN + 8 floats: float4 aligned, the fragment's float2
        // writes conflict-free per half warp) over the A/B stages,
        // then one thread per (row, 8-column chunk): a chunk is 8 channels of one tap because
        // Cout % 8 == 0, so it lands contiguously at output voxel ob(row) + off(tap).
        constexpr int CLD = TBN + 8;
        static_assert(TBM * CLD * 4 <= STAGES * (A_ST + B_ST) * 2, "staged tile must fit");
        __syncthreads();  // every warp is done reading the operand stages
        float* cs = reinterpret_cast<float*>(dsm);
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    int row = wm * TM + i * 16 + (lane >> 2) + h * 8;
                    int col = wn * TN + j * 8 + (lane & 3) * 2;
                    *reinterpret_cast<float2*>(cs + row * CLD + col) =
                        make_float2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
                }
        __syncthreads();
        const bool vec = ((p.ldc | p.coff) & 7) == 0;
        constexpr int CH = TBN / 8;
        for (int idx = tid; idx < TBM * CH; idx += THREADS) {
            int row = idx / CH, ch = idx - row * CH;
            int m = m0 + row, c = n0 + ch * 8;
            if (m >= M || c >= p.cout) continue;
            int ix = m % p.wo, t = m / p.wo;
            int iy = t % p.ho;
            t /= p.ho;
            int iz = t % p.do_, n = t / p.do_;
            int tap = c / p.ocout, co = c - tap * p.ocout;
            int qz = tap / (p.up_h * p.up_w), rem = tap - qz * p.up_h * p.up_w;
            int qy = rem / p.up_w, qx = rem - qy * p.up_w;
            i64 o = (((i64)n * p.od + iz * p.up_d + qz) * p.oh + iy * p.up_h + qy) * p.ow + ix * p.up_w + qx;
            const float4 a = *reinterpret_cast<const float4*>(cs + row * CLD + ch * 8);
            const float4 b = *reinterpret_cast<const float4*>(cs + row * CLD + ch * 8 + 4);
            float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float u = v[q] + (bias ? bias[co + q] : 0.f);
                v[q] = act_apply(u, co + q, p.act, p.alpha, slope, p.slope_n);
            }
            const i64 dst = o * p.ldc + p.coff + co;
            if (vec) {
                out_store8(p, y, dst, v);
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) out_store1(p, y, dst + q, v[q]);
            }
        }
        return;
    }

    // Epilogue from registers: thread holds rows g, g+8 and column pairs (lane % 4) * 2.
    // Column-only work (channel, scatter offset) once per column pair; the store (bias,
    // activation) is out of line so the unrolled epilogue stays small.
    const bool scatter = p.up_d > 0;
    const int oc = scatter ? p.ocout : p.cout;
    const bool pair = ((p.ldc | p.coff) & 1) == 0 && (oc & 1) == 0;
    int coj[NI];
    int offj[NI];  // output voxel offset of the column's tap (scatter), else 0
#pragma unroll
    for (int j = 0; j < NI; j++) {
        int c = n0 + wn * TN + j * 8 + (lane & 3) * 2;
        coj[j] = c;
        offj[j] = 0;
        if (scatter) {
            int tap = c / p.ocout;
            coj[j] = c - tap * p.ocout;
            int qz = tap / (p.up_h * p.up_w), rem = tap - qz * p.up_h * p.up_w;
            int qy = rem / p.up_w, qx = rem - qy * p.up_w;
            offj[j] = (qz * p.oh + qy) * p.ow + qx;
        }
    }
#pragma unroll
    for (int i = 0; i < MI; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int m = m0 + wm * TM + i * 16 + (lane >> 2) + h * 8;
            if (m >= M) continue;
            i64 ob;  // output voxel index of tap 0
            if (scatter) {
                int ix = m % p.wo, t = m / p.wo;
                int iy = t % p.ho; t /= p.ho;
                int iz = t % p.do_, n = t / p.do_;
                ob = (((i64)n * p.od + iz * p.up_d) * p.oh + iy * p.up_h) * p.ow + ix * p.up_w;
            } else {
                ob = m;
            }
#pragma unroll
            for (int j = 0; j < NI; j++) {
                int c = n0 + wn * TN + j * 8 + (lane & 3) * 2;
                if (c >= p.cout) continue;
                conv_store(p, y, bias, slope, ob, offj[j], coj[j], c, acc[i][j][h * 2],
                           acc[i][j][h * 2 + 1], pair, scatter);
            }
        }
    }
}

// Name: conv_mma_m{TBM}n{TBN}_{v8 | v2 | v1}. Instantiated once per MMA_CONFIGS line by
// `entry_lines` in src/backend/cuda/host/catalogue.rs (appended to this file before NVRTC).
#define MMA_ENTRY(NAME, TBM, TBN, WM, WN, ST, VW)                                                   \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_mma<TBM, TBN, WM, WN, ST, VW>(p, x, w, bias, y, slope);                                \
    }

// convt_up_m{TBM}n{TBN}_v8: the kernel == stride transposed conv as the upsampling GEMM
// (conv_mma's scatter view, Cin % 8 == 0, Cout % 8 == 0) with the staged 16-byte epilogue.
// Same tiles and shared memory as conv_mma_m{TBM}n{TBN}_v8 (UPSAMPLE_VEC in the catalogue,
// which instantiates them).
#define UP_ENTRY(NAME, TBM, TBN, WM, WN, ST)                                                        \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_mma<TBM, TBN, WM, WN, ST, 8, true>(p, x, w, bias, y, slope);                           \
    }

// ---------------------------------------------------------------------------------------------
// conv_c1_k3: Conv3d with Cin = 1 (the first layer), 3x3x3 taps, stride 1 or 2 per axis,
// dilation 1, any begin pads, Cout <= 64. Memory bound (Cout halves written per input voxel),
// so no tensor cores: each block loads the input halo of a C1_TZ x C1_TY x C1_TX output tile and
// the 27 x Cout weights into shared memory as fp32; a thread computes 8 channels of the two
// voxels (z, y, x) and (z + 1, y, x) of the tile (fp32), then bias, activation and one 16-byte
// store per voxel (ldc / coff 8-aligned and the chunk inside Cout; else element stores).
// Weights: the mma layout [Cout_pad][kpad] fp16, K = tap (kd, kh, kw row major). One block per
// tile: grid = N * ceil(Do/TZ) * ceil(Ho/TY) * ceil(Wo/TX), 256 threads, static smem.
#define C1_TZ 2
#define C1_TY 8
#define C1_TX 32
#define C1_HALO (((C1_TZ - 1) * 2 + 3) * ((C1_TY - 1) * 2 + 3) * ((C1_TX - 1) * 2 + 3))
extern "C" __global__ void __launch_bounds__(256) conv_c1_k3(ConvParams p, const half* __restrict__ x,
                                                             const half* __restrict__ w,
                                                             const float* __restrict__ bias,
                                                             half* __restrict__ y,
                                                             const float* __restrict__ slope) {
    static_assert(C1_TY * C1_TX == 256, "a thread's two voxels are one tile plane apart");
    __shared__ float xs[C1_HALO];
    __shared__ __align__(16) float ws[27 * 64];  // [tap][co], co padded to cg_n * 8
    const int tid = threadIdx.x;
    const int cg_n = (p.cout + 7) >> 3, cpad = cg_n * 8;
    const int nbx = (p.wo + C1_TX - 1) / C1_TX, nby = (p.ho + C1_TY - 1) / C1_TY;
    const int nbz = (p.do_ + C1_TZ - 1) / C1_TZ;
    int b = blockIdx.x;
    const int bx = b % nbx;
    b /= nbx;
    const int by = b % nby;
    b /= nby;
    const int bz = b % nbz, n = b / nbz;
    const int oz0 = bz * C1_TZ, oy0 = by * C1_TY, ox0 = bx * C1_TX;
    const int hy = (C1_TY - 1) * p.sh + 3, hx = (C1_TX - 1) * p.sw + 3;
    const int hz = (C1_TZ - 1) * p.sd + 3;
    const int iz0 = oz0 * p.sd - p.pd, iy0 = oy0 * p.sh - p.ph, ix0 = ox0 * p.sw - p.pw;
    const half* xn = x + (i64)n * p.di * p.hi * p.wi;
    for (int i = tid; i < hz * hy * hx; i += 256) {
        int lx = i % hx, t = i / hx;
        int ly = t % hy, lz = t / hy;
        int iz = iz0 + lz, iy = iy0 + ly, ix = ix0 + lx;
        float v = 0.f;
        if ((unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi && (unsigned)ix < (unsigned)p.wi)
            v = __half2float(xn[((i64)iz * p.hi + iy) * p.wi + ix]);
        xs[i] = v;
    }
    for (int i = tid; i < 27 * cpad; i += 256) {
        int tap = i / cpad, co = i - tap * cpad;
        ws[i] = co < p.cout ? __half2float(w[(i64)co * p.kpad + tap]) : 0.f;
    }
    __syncthreads();
    const bool vec = ((p.ldc | p.coff) & 7) == 0;
    const int zstep = p.sd * hy * hx;  // halo offset of the second voxel (one output plane on)
    for (int it = tid; it < 256 * cg_n; it += 256) {
        const int cg = it % cg_n, pv = it / cg_n;
        const int ly = pv / C1_TX, lx = pv - ly * C1_TX;
        const int oy = oy0 + ly, ox = ox0 + lx;
        if (oy >= p.ho || ox >= p.wo) continue;
        float a0[8], a1[8];
#pragma unroll
        for (int q = 0; q < 8; q++) a0[q] = a1[q] = 0.f;
        const float* xb = xs + (ly * p.sh) * hx + lx * p.sw;
        const float4* wb = reinterpret_cast<const float4*>(ws + cg * 8);
#pragma unroll
        for (int kz = 0; kz < 3; kz++)
#pragma unroll
            for (int ky = 0; ky < 3; ky++)
#pragma unroll
                for (int kx = 0; kx < 3; kx++) {
                    const int tap = (kz * 3 + ky) * 3 + kx;
                    const float* xp = xb + (kz * hy + ky) * hx + kx;
                    const float u0 = xp[0], u1 = xp[zstep];
                    const float4 w0 = wb[tap * (cpad >> 2)], w1 = wb[tap * (cpad >> 2) + 1];
                    const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        a0[q] = fmaf(u0, wv[q], a0[q]);
                        a1[q] = fmaf(u1, wv[q], a1[q]);
                    }
                }
        const int co = cg * 8;
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int oz = oz0 + s;
            if (oz >= p.do_) continue;
            const i64 m = (((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox;
            const i64 dst = m * p.ldc + p.coff + co;
            float hv[8];
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float u = 0.f;  // padding channels: never stored, no bias / slope read
                if (co + q < p.cout)
                    u = act_apply((s ? a1[q] : a0[q]) + (bias ? bias[co + q] : 0.f), co + q, p.act,
                                  p.alpha, slope, p.slope_n);
                hv[q] = u;
            }
            if (vec && co + 8 <= p.cout) {
                out_store8(p, y, dst, hv);
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (co + q < p.cout) out_store1(p, y, dst + q, hv[q]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// conv1x1_n{16,32}: 1x1x1 conv with few output channels (the segmentation head): a memory-bound
// GEMV per voxel. One thread per voxel, Cin % 8 == 0 (16-byte loads), Cin <= 256, Cout <= NC;
// weights as fp32 [Cin][NC] in dynamic smem (Cin * NC floats, read as broadcast float4, then
// blockDim * NC halves of output staging), fp32
// accumulate, bias + activation, output with ldc/coff. The mma tile would spend its time in
// prologue/epilogue for K = 32.
template <int NC>
__device__ __forceinline__ void conv1x1(const ConvParams& p, const half* __restrict__ x, const half* __restrict__ w,
                                        const float* __restrict__ bias, half* __restrict__ y,
                                        const float* __restrict__ slope) {
    extern __shared__ __align__(16) float ws[];  // [cin][NC]
    const int cin = p.cin, cout = p.cout;
    for (int i = threadIdx.x; i < cin * NC; i += blockDim.x) {
        int ci = i / NC, co = i - ci * NC;
        ws[i] = co < cout ? __half2float(w[(i64)co * p.kpad + ci]) : 0.f;
    }
    __syncthreads();
    // Outputs of the block's voxels are staged in smem and stored as one contiguous run when
    // the output is dense (ldc == Cout): per-thread rows of 28 bytes would scatter the stores.
    half* so = reinterpret_cast<half*>(ws + cin * NC);
    const bool dense = p.ldc == cout && p.coff == 0;
    const i64 M = (i64)p.n * p.do_ * p.ho * p.wo;
    for (i64 m0 = (i64)blockIdx.x * blockDim.x; m0 < M; m0 += (i64)gridDim.x * blockDim.x) {
        const i64 m = m0 + threadIdx.x;
        if (m < M) {
            float acc[NC];
#pragma unroll
            for (int c = 0; c < NC; c++) acc[c] = 0.f;
            const uint4* xr = reinterpret_cast<const uint4*>(x + m * cin);
            for (int cv = 0; cv < (cin >> 3); cv++) {
                uint4 u = __ldg(xr + cv);
                const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float2 f2 = __half22float2(h[k >> 1]);
                    float f = (k & 1) ? f2.y : f2.x;
                    const float4* wr = reinterpret_cast<const float4*>(ws + (cv * 8 + k) * NC);
#pragma unroll
                    for (int q = 0; q < NC / 4; q++) {
                        float4 wq = wr[q];
                        acc[4 * q] += f * wq.x;
                        acc[4 * q + 1] += f * wq.y;
                        acc[4 * q + 2] += f * wq.z;
                        acc[4 * q + 3] += f * wq.w;
                    }
                }
            }
            half* yo = dense ? so + threadIdx.x * cout : y + m * p.ldc + p.coff;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (c < cout) {
                    float v = acc[c] + (bias ? bias[c] : 0.f);
                    yo[c] = __float2half(act_apply(v, c, p.act, p.alpha, slope, p.slope_n));
                }
            }
        }
        if (dense) {
            __syncthreads();
            const int cnt = (int)min((i64)blockDim.x, M - m0) * cout;
            half* yb = y + m0 * cout;
            for (int i = threadIdx.x; i < cnt; i += blockDim.x) yb[i] = so[i];
            __syncthreads();
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) conv1x1_n16(ConvParams p, const half* x, const half* w,
                                                              const float* bias, half* y, const float* slope) {
    conv1x1<16>(p, x, w, bias, y, slope);
}
extern "C" __global__ void __launch_bounds__(256) conv1x1_n32(ConvParams p, const half* x, const half* w,
                                                              const float* bias, half* y, const float* slope) {
    conv1x1<32>(p, x, w, bias, y, slope);
}

// ---------------------------------------------------------------------------------------------
// conv_halo_c{CIN}n{BN}: stride-1, dilation-1 3x3x3 conv (any pads) with Cin = k * CIN, any Cout
// (blockIdx.y picks the BN-wide output-channel tile), or an even real Cin p.cin < CIN (e.g. 14 on
// CIN 16), zero-padded to CIN channels in smem. Cin > CIN runs in chunks of CIN
// channels: each chunk's halo into the same smem buffer, then its 27 taps; the accumulators
// stay in registers across chunks.
// Each block computes a 4x8x8 output tile: its (4+2)x(8+2)x(8+2) input halo (600 voxels x CIN)
// is copied into shared memory ONCE and feeds all 27 taps (conv_mma re-gathers the input for
// every tap); ldmatrix row addresses are the output voxel's halo row plus the tap's offset.
// Halo rows are CIN + 8 halves (an odd number of 16-byte groups: the 8 rows of an ldmatrix
// phase hit 8 different bank groups). Weights [Cout_pad][kpad] (K = tap * CIN + ci) are
// staged one tap at a time, double buffered with cp.async. Epilogue: conv_store (bias,
// activation, ldc/coff channel slice), like conv_mma.
// Real Cin below the smem width (p.cin < CIN, p.cin even; the planner's `pad_cin` configs):
// the halo kernels copy 4-byte channel pairs (U = 2) instead of 16-byte groups (U = 8), and
// zero-fill channels p.cin..CIN-1 of every halo and weight row (source size 0), so the padded
// products are 0 x 0. Input rows are p.cin halves apart, weights keep the conv_mma layout
// [Cout_pad][kpad] with K = tap * p.cin + ci (kpad and p.cin even: 4-byte aligned).
//
// The input halo of a tile: rows (hz, hy, hx) of an HZ x HY x HX box at input (iz0, iy0, ix0)
// of sample xn, CIN channels per row of LD halves; zero outside the input.
template <int U, int CIN, int LD, int HZ, int HY, int HX, int THREADS>
__device__ __forceinline__ void halo_copy(half* buf, const half* xn, const half* x, const ConvParams& p,
                                          int iz0, int iy0, int ix0, int tid, int c0, int lo, int hi) {
    constexpr int UPV = CIN / U;  // copies per row
    hi = min(hi, HZ * HY * HX * UPV);
    for (int idx = lo + tid; idx < hi; idx += THREADS) {
        int v = idx / UPV, c = (idx - v * UPV) * U;
        int hz = v / (HY * HX), r = v - hz * (HY * HX);
        int hy = r / HX, hx = r - hy * HX;
        int iz = iz0 + hz, iy = iy0 + hy, ix = ix0 + hx;
        bool ok = (unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi && (unsigned)ix < (unsigned)p.wi;
        const half* src = xn + (((i64)iz * p.hi + iy) * p.wi + ix) * p.cin + c0 + c;
        if constexpr (U == 8) {
            cp_async16(buf + v * LD + c, ok ? src : x, ok ? 16 : 0);
        } else {
            ok = ok && c < p.cin;
            cp_async4_ca(buf + v * LD + c, ok ? src : x, ok ? 4 : 0);
        }
    }
}

// NT taps (from tap0) of the weight rows 0..BN-1 into smem rows of WLD halves, tap t of a row at
// column t * CIN.
template <int U, int CIN, int BN, int NT, int WLD, int THREADS>
__device__ __forceinline__ void halo_wcopy(half* ws, const half* w, const ConvParams& p, int tap0, int tid,
                                           int c0, int nb0) {
    constexpr int UPT = CIN / U;  // copies per tap of a row
    for (int idx = tid; idx < BN * NT * UPT; idx += THREADS) {
        int co = idx / (NT * UPT), r = idx - co * (NT * UPT);
        int t = NT == 1 ? 0 : r / UPT, c = (r - t * UPT) * U;
        const half* src = w + (i64)(nb0 + co) * p.kpad + (tap0 + t) * p.cin + c0 + c;
        if constexpr (U == 8) {
            cp_async16(ws + co * WLD + t * CIN + c, src, 16);
        } else {
            bool ok = c < p.cin;
            cp_async4_ca(ws + co * WLD + t * CIN + c, ok ? src : w, ok ? 4 : 0);
        }
    }
}

// One tap of the halo kernels: for the warp's rows (halo rows hrow + toff of `hin`, row length
// LD) times its weight rows (`ws`, already at this lane's ldmatrix row/column; row length WLD),
// the CIN-deep products accumulate into acc.
template <int MI, int NI, int CIN, int LD, int WLD>
__device__ __forceinline__ void halo_tap(float (&acc)[MI][NI][4], const half* hin, const int (&hrow)[MI],
                                         int toff, int a_col, const half* ws) {
#pragma unroll
    for (int kk = 0; kk < CIN; kk += 16) {
        unsigned af[MI][4], bf[NI / 2][4];
#pragma unroll
        for (int i = 0; i < MI; i++) ldsm_x4(af[i], hin + (hrow[i] + toff) * LD + kk + a_col);
#pragma unroll
        for (int j = 0; j < NI / 2; j++) ldsm_x4(bf[j], ws + j * 16 * WLD + kk);
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++)
                mma16816(acc[i][j], af[i], bf[j >> 1][(j & 1) * 2], bf[j >> 1][(j & 1) * 2 + 1]);
    }
}

// Epilogue of the halo kernels: the warp's (MI x 16) x (NI x 8) accumulators of the output tile
// at (oz0, oy0, ox0) (rows in z, y, x order over a TY x TX face) through conv_store.
template <int MI, int NI, int TM, int TN, int TY, int TX>
__device__ __forceinline__ void halo_store(const ConvParams& p, half* __restrict__ y,
                                           const float* __restrict__ bias, const float* __restrict__ slope,
                                           float (&acc)[MI][NI][4], int wm, int wn, int lane, int n,
                                           int oz0, int oy0, int ox0, int nb0) {
    const bool pair = ((p.ldc | p.coff) & 1) == 0 && (p.cout & 1) == 0;
#pragma unroll
    for (int i = 0; i < MI; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = wm * TM + i * 16 + (lane >> 2) + h * 8;
            int oz = oz0 + r / (TY * TX), oy = oy0 + (r / TX) % TY, ox = ox0 + r % TX;
            if (oz >= p.do_ || oy >= p.ho || ox >= p.wo) continue;
            i64 m = (((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                int c = nb0 + wn * TN + j * 8 + (lane & 3) * 2;
                if (c >= p.cout) continue;
                conv_store(p, y, bias, slope, m, 0, c, c, acc[i][j][h * 2], acc[i][j][h * 2 + 1], pair, false);
            }
        }
    }
}

// Vector epilogue of the halo kernels, used where Cout, ldc and coff are multiples of 8 (else
// halo_store): the fp32 accumulators are staged in `stage` (the block's shared memory, no longer
// needed by the taps: TZ*TY*TX rows of BN + 8 floats, conflict-free float2 writes per half-warp),
// then each thread adds bias, applies the activation and writes 8 channels of one voxel with one
// 16-byte store: a warp writes whole contiguous voxel rows instead of 4-byte pairs through the
// out-of-line conv_store (ncu on K1: the epilogue was ~40% of the kernel's instructions).
// Returns false (nothing written) when the layout does not allow it.
template <int MI, int NI, int TM, int TN, int TZ, int TY, int TX, int BN, int THREADS>
__device__ __forceinline__ bool halo_store_vec(const ConvParams& p, half* __restrict__ y,
                                               const float* __restrict__ bias,
                                               const float* __restrict__ slope, float (&acc)[MI][NI][4],
                                               int wm, int wn, int lane, int tid, int n, int oz0, int oy0,
                                               int ox0, int nb0, float* stage) {
    constexpr int TBM = TZ * TY * TX, LDF = BN + 8, CH = BN / 8;
    static_assert(THREADS % CH == 0, "a thread keeps one 8-channel chunk");
    if (((p.cout | p.ldc | p.coff) & 7) != 0) return false;
    __syncthreads();  // every warp is done reading the halo and the weights
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wm * TM + i * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int c = wn * TN + j * 8 + (lane & 3) * 2;
                *reinterpret_cast<float2*>(stage + r * LDF + c) = make_float2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
            }
        }
    __syncthreads();
    const int ch = tid % CH, c0 = nb0 + ch * 8;  // output channel of the thread's chunk
    if (c0 >= p.cout) return true;
    float b[8];
#pragma unroll
    for (int k = 0; k < 8; k++) b[k] = bias ? bias[c0 + k] : 0.f;
    for (int r = tid / CH; r < TBM; r += THREADS / CH) {
        const int oz = oz0 + r / (TY * TX), oy = oy0 + (r / TX) % TY, ox = ox0 + r % TX;
        if (oz >= p.do_ || oy >= p.ho || ox >= p.wo) continue;
        const float4 lo = *reinterpret_cast<const float4*>(stage + r * LDF + ch * 8);
        const float4 hi = *reinterpret_cast<const float4*>(stage + r * LDF + ch * 8 + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = act_apply(v[k] + b[k], c0 + k, p.act, p.alpha, slope, p.slope_n);
        const i64 m = (((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox;
        out_store8(p, y, m * p.ldc + p.coff + c0, v);
    }
    return true;
}

#define HT_Z 4
#define HT_Y 8
#define HT_X 8
#define HVOX ((HT_Z + 2) * (HT_Y + 2) * (HT_X + 2))

template <int CIN, int BN, int WM, int WN>
__device__ __forceinline__ void conv_halo(const ConvParams& p, const half* __restrict__ x,
                                          const half* __restrict__ w, const float* __restrict__ bias,
                                          half* __restrict__ y, const float* __restrict__ slope) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int TBM = HT_Z * HT_Y * HT_X;
    constexpr int TM = TBM / WM, TN = BN / WN;
    constexpr int MI = TM / 16, NI = TN / 8;
    constexpr int LD = CIN + 8;
    constexpr int CPV = CIN / 8;  // 16-byte chunks per voxel
    static_assert(NI % 2 == 0 && CIN % 16 == 0, "tile shape");
    extern __shared__ __align__(16) unsigned char dsm[];
    half* sIn = reinterpret_cast<half*>(dsm);
    half* sW = sIn + HVOX * LD;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int ntx = (p.wo + HT_X - 1) / HT_X, nty = (p.ho + HT_Y - 1) / HT_Y,
              ntz = (p.do_ + HT_Z - 1) / HT_Z;
    int b = blockIdx.x;
    const int bx = b % ntx;
    b /= ntx;
    const int by = b % nty;
    b /= nty;
    const int bz = b % ntz;
    const int n = b / ntz;
    const int oz0 = bz * HT_Z, oy0 = by * HT_Y, ox0 = bx * HT_X;
    const int iz0 = oz0 - p.pd, iy0 = oy0 - p.ph, ix0 = ox0 - p.pw;
    const int nb0 = blockIdx.y * BN;  // output-channel tile
    const half* xn = x + (i64)n * p.di * p.hi * p.wi * p.cin;
    const bool narrow = p.cin < CIN;  // real Cin zero-padded to CIN: 4-byte copies

    // Tap `tap`'s weights of channels c0..c0+CIN (K = tap * Cin + ci).
    auto load_w = [&](int stage, int tap, int c0) {
        half* ws = sW + stage * BN * LD;
        if (narrow)
            halo_wcopy<2, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
        else
            halo_wcopy<8, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
    };

    // Halo row of each A row this lane addresses for ldmatrix (tap 0).
    int hrow[MI];
#pragma unroll
    for (int i = 0; i < MI; i++) {
        int r = wm * TM + i * 16 + (lane & 15);
        int z = r / (HT_Y * HT_X), yy = (r / HT_X) % HT_Y, xx = r % HT_X;
        hrow[i] = (z * (HT_Y + 2) + yy) * (HT_X + 2) + xx;
    }
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;

    for (int c0 = 0; c0 < p.cin; c0 += CIN) {
        if (c0 > 0) __syncthreads();  // everyone is done with the previous chunk's halo and weights
        // The chunk's halo, zero outside the input (source size 0).
        if (narrow)
            halo_copy<2, CIN, LD, HT_Z + 2, HT_Y + 2, HT_X + 2, THREADS>(sIn, xn, x, p, iz0, iy0, ix0, tid, 0, 0,
                                                                        HVOX * (CIN / 2));
        else
            halo_copy<8, CIN, LD, HT_Z + 2, HT_Y + 2, HT_X + 2, THREADS>(sIn, xn, x, p, iz0, iy0, ix0, tid, c0, 0,
                                                                        HVOX * CPV);
        load_w(0, 0, c0);
        cp_async_commit();
        for (int tap = 0; tap < 27; tap++) {
            cp_async_wait<0>();
            __syncthreads();  // tap's weights (and the halo) landed; everyone is done with tap - 1
            if (tap + 1 < 27) load_w((tap + 1) & 1, tap + 1, c0);
            cp_async_commit();
            const int dz = tap / 9, dy = (tap / 3) % 3, dx = tap % 3;
            const int toff = (dz * (HT_Y + 2) + dy) * (HT_X + 2) + dx;
            const half* ws = sW + (tap & 1) * BN * LD + (wn * TN + (lane >> 4) * 8 + (lane & 7)) * LD +
                             ((lane >> 3) & 1) * 8;
            halo_tap<MI, NI, CIN, LD, LD>(acc, sIn, hrow, toff, (lane >> 4) * 8, ws);
        }
        cp_async_wait<0>();
    }

    // The vector epilogue stages the fp32 tile in the block's smem where it fits.
    constexpr bool VEC_FITS = TBM * (BN + 8) * 4 <= (HVOX * LD + 2 * BN * LD) * 2;
    if (VEC_FITS && halo_store_vec<MI, NI, TM, TN, HT_Z, HT_Y, HT_X, BN, THREADS>(
                        p, y, bias, slope, acc, wm, wn, lane, tid, n, oz0, oy0, ox0, nb0, reinterpret_cast<float*>(dsm)))
        return;
    halo_store<MI, NI, TM, TN, HT_Y, HT_X>(p, y, bias, slope, acc, wm, wn, lane, n, oz0, oy0, ox0, nb0);
}

// Name: conv_halo_c{CIN}n{BN}[_w4]; instantiated per HALO_CONFIGS line of the catalogue whose
// tile, staging and halo buffers are this kernel's (4x8x8, 2, 1: `HaloConfig::is_plain`).
// Min blocks per SM: 2 (8 warps) / 4 (4 warps) caps the registers at 128 (ptxas via NVRTC: no
// spills); without it the chunk loop, the padded-Cin copies and the vector epilogue took them to
// 151-206 and c64n32 / c64n64 down to 1 block per SM (measured 28% / 20% slower).
#define HALO_ENTRY(NAME, CIN, BN, WM, WN)                                                           \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, WM * WN == 8 ? 2 : 4) NAME(        \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_halo<CIN, BN, WM, WN>(p, x, w, bias, y, slope);                                        \
    }

// ---------------------------------------------------------------------------------------------
// conv_halo_t: the halo kernel with the output tile (TZ x TY x TX), the weight staging
// and the block scheduling as parameters, measured against conv_halo above.
//   WST >= 2: weights staged one tap at a time in a ring of WST stages (conv_halo is WST 2):
//             one __syncthreads per tap, WST - 1 taps in flight.
//   WST == 0: the whole [BN][27 * CIN] weight block resident in smem (rows of 27 * CIN + 8
//             halves: an odd number of 16-byte groups, so ldmatrix stays conflict-free), loaded
//             once per block with the first halo: the 27 taps run with no barrier between them.
//   Blocks loop over tiles t = blockIdx.x, + gridDim.x, ...: the host launches one block per
//   tile, or (persistent) a few blocks per SM that keep the resident weights for all their
//   tiles. HB == 2: two halo buffers, the next tile's halo is copied while the current one is
//   computed (resident); staged: the next (tile, Cin chunk)'s halo is copied into the
//   other buffer in THREADS-wide slabs, one slab with each tap's weights.
//   Cin = k * CIN (staged only; resident needs Cin == CIN): chunks of CIN channels, as conv_halo.
//   blockIdx.y: the BN-wide output-channel tile.
// Smem layout: weights first (BN * 27 * CIN + 8 resident, else WST * BN * (CIN + 8) halves),
// then HB halo buffers of (TZ+2)(TY+2)(TX+2) rows of CIN + 8 halves. Keep in sync with
// HaloConfig::smem_bytes (plan.rs) and its emulation in tests/cuda_kernels_compile.rs.
template <int CIN, int BN, int WM, int WN, int TZ, int TY, int TX, int WST, int HB>
__device__ __forceinline__ void conv_halo_t(const ConvParams& p, const half* __restrict__ x,
                                            const half* __restrict__ w, const float* __restrict__ bias,
                                            half* __restrict__ y, const float* __restrict__ slope) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int TBM = TZ * TY * TX;
    constexpr int TM = TBM / WM, TN = BN / WN;
    constexpr int MI = TM / 16, NI = TN / 8;
    constexpr int LD = CIN + 8;
    constexpr int CPV = CIN / 8;  // 16-byte chunks per voxel
    constexpr int HY = TY + 2, HX = TX + 2;
    constexpr int HV = (TZ + 2) * HY * HX;  // halo rows
    constexpr bool RES = WST == 0;
    constexpr int WLD = RES ? 27 * CIN + 8 : LD;      // smem weight row (halves)
    constexpr int WROWS = RES ? BN : WST * BN;        // smem weight rows
    constexpr int WS = RES ? 2 : WST;                 // ring stages (staged mode)
    static_assert(TM * WM == TBM && TM % 16 == 0 && NI % 2 == 0 && CIN % 16 == 0, "tile shape");
    static_assert(RES || WST >= 2, "staged weights: >= 2 stages");
    static_assert(HB == 1 || HB == 2, "one or two halo buffers");
    extern __shared__ __align__(16) unsigned char dsm[];
    half* sW = reinterpret_cast<half*>(dsm);
    half* sIn = sW + WROWS * WLD;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int ntx = (p.wo + TX - 1) / TX, nty = (p.ho + TY - 1) / TY, ntz = (p.do_ + TZ - 1) / TZ;
    const int ntiles = p.n * ntz * nty * ntx;
    const int nb0 = blockIdx.y * BN;  // output-channel tile

    // Tile t -> batch index and output origin (x fastest, then y, z, n).
    auto decode = [&](int t, int& n, int& oz0, int& oy0, int& ox0) {
        ox0 = (t % ntx) * TX;
        t /= ntx;
        oy0 = (t % nty) * TY;
        t /= nty;
        oz0 = (t % ntz) * TZ;
        n = t / ntz;
    };
    const bool narrow = p.cin < CIN;  // real Cin zero-padded to CIN: 4-byte copies
    // Tile t's input halo of channels c0..c0+CIN into `buf`, zero outside the input (source
    // size 0): 16-byte pieces lo..hi of the HV * CPV (narrow: the same rows in 4-byte copies).
    auto load_halo = [&](half* buf, int t, int c0, int lo, int hi) {
        int n, oz0, oy0, ox0;
        decode(t, n, oz0, oy0, ox0);
        const int iz0 = oz0 - p.pd, iy0 = oy0 - p.ph, ix0 = ox0 - p.pw;
        const half* xn = x + (i64)n * p.di * p.hi * p.wi * p.cin;
        if (narrow)
            halo_copy<2, CIN, LD, TZ + 2, HY, HX, THREADS>(buf, xn, x, p, iz0, iy0, ix0, tid, 0, lo * 4,
                                                           hi * 4);
        else
            halo_copy<8, CIN, LD, TZ + 2, HY, HX, THREADS>(buf, xn, x, p, iz0, iy0, ix0, tid, c0, lo, hi);
    };
    // Staged: tap `tap`'s BN x CIN weights of channels c0.. into stage `stage` (K = tap * Cin + ci).
    auto load_w = [&](int stage, int tap, int c0) {
        half* ws = sW + stage * BN * LD;  // staged mode only
        if (narrow)
            halo_wcopy<2, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
        else
            halo_wcopy<8, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
    };

    // Halo row of each A row this lane addresses for ldmatrix (tap 0).
    int hrow[MI];
#pragma unroll
    for (int i = 0; i < MI; i++) {
        int r = wm * TM + i * 16 + (lane & 15);
        int z = r / (TY * TX), yy = (r / TX) % TY, xx = r % TX;
        hrow[i] = (z * HY + yy) * HX + xx;
    }
    // ldmatrix offsets inside a 16-row x 16-col A block / two 8-col B blocks.
    const int a_col = (lane >> 4) * 8;
    const int b_row = (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;

    int t = blockIdx.x;
    if constexpr (RES) {
        if (narrow)
            halo_wcopy<2, CIN, BN, 27, WLD, THREADS>(sW, w, p, 0, tid, 0, nb0);
        else
            halo_wcopy<8, CIN, BN, 27, WLD, THREADS>(sW, w, p, 0, tid, 0, nb0);
    }
    if (t < ntiles) load_halo(sIn, t, 0, 0, HV * CPV);
    cp_async_commit();
    int buf = 0;
    for (; t < ntiles; t += gridDim.x) {
        float acc[MI][NI][4];
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;

      // Cin chunks (resident: p.cin == CIN, one pass).
      for (int c0 = 0; c0 < p.cin; c0 += CIN) {
        const half* hin = sIn + buf * HV * LD;
        if (HB == 1 && c0 > 0) {  // the chunk's halo once everyone is done with the previous one
            cp_async_wait<0>();
            __syncthreads();
            load_halo(sIn, t, c0, 0, HV * CPV);
            cp_async_commit();
        }
        if constexpr (RES) {
            cp_async_wait<0>();
            __syncthreads();  // halo t (and the weights) landed; everyone is done with tile t - grid
            if constexpr (HB == 2) {
                if (t + (int)gridDim.x < ntiles) load_halo(sIn + (buf ^ 1) * HV * LD, t + gridDim.x, 0, 0, HV * CPV);
                cp_async_commit();
            }
            const half* wsb = sW + (wn * TN + b_row) * WLD + b_col;
            for (int dz = 0; dz < 3; dz++) {
                for (int dy = 0; dy < 3; dy++) {
#pragma unroll
                    for (int dx = 0; dx < 3; dx++) {
                        const int toff = (dz * HY + dy) * HX + dx;
                        const half* ws = wsb + ((dz * 3 + dy) * 3 + dx) * CIN;
                        halo_tap<MI, NI, CIN, LD, WLD>(acc, hin, hrow, toff, a_col, ws);
                    }
                }
            }
        } else {
            // HB 2: the next (tile, chunk) whose halo goes into the other buffer, a slab per tap.
            int pt = t, pc = c0 + CIN;
            if (pc >= p.cin) pt += gridDim.x, pc = 0;
            const bool pre = HB == 2 && pt < ntiles;
            if constexpr (HB == 2) {
                cp_async_wait<0>();
                __syncthreads();  // this halo landed; everyone is done with the other buffer, the ring
            }
            // Ring of WST weight stages; group order: halo (committed above), taps 0..WST-2,
            // then one group per tap, so waiting for all but the newest WST-2 groups before tap
            // k means tap k's weights (and the halo) landed.
#pragma unroll
            for (int s = 0; s < WS - 1; s++) {
                load_w(s, s, c0);
                cp_async_commit();
            }
            for (int tap = 0; tap < 27; tap++) {
                cp_async_wait<WS - 2>();
                __syncthreads();  // tap's weights landed; everyone is done with tap - 1's stage
                if (tap + WS - 1 < 27) load_w((tap + WS - 1) % WS, tap + WS - 1, c0);
                if (pre)  // slab `tap` of the next halo (the last tap takes the rest)
                    load_halo(sIn + (buf ^ 1) * HV * LD, pt, pc, tap * THREADS,
                              tap == 26 ? HV * CPV : min(HV * CPV, (tap + 1) * THREADS));
                cp_async_commit();
                const int dz = tap / 9, dy = (tap / 3) % 3, dx = tap % 3;
                const int toff = (dz * HY + dy) * HX + dx;
                const half* ws = sW + (tap % WS) * BN * LD + (wn * TN + b_row) * LD + b_col;
                halo_tap<MI, NI, CIN, LD, LD>(acc, hin, hrow, toff, a_col, ws);
            }
            if constexpr (HB == 2) buf ^= 1;
        }
      }

        int n, oz0, oy0, ox0;
        decode(t, n, oz0, oy0, ox0);
        halo_store<MI, NI, TM, TN, TY, TX>(p, y, bias, slope, acc, wm, wn, lane, n, oz0, oy0, ox0, nb0);

        // The next tile's halo into this buffer once every warp is done reading it (one
        // buffer), or just flip buffers (two). Staged: drain the weight ring first.
        const int tn = t + gridDim.x;
        if (HB == 1 && tn < ntiles) {  // (uniform over the block)
            cp_async_wait<0>();
            __syncthreads();
            load_halo(sIn, tn, 0, 0, HV * CPV);
            cp_async_commit();
        }
        if constexpr (HB == 2 && RES) buf ^= 1;
    }
    cp_async_wait<0>();
}

// Name: conv_halo_c{CIN}n{BN}_{variant}; the arguments after the name are the template's,
// instantiated per other HALO_CONFIGS line by the catalogue's `entry_lines`.
#define HALO2_ENTRY(NAME, CIN, BN, WM, WN, TZ, TY, TX, WST, HB)                                     \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_halo_t<CIN, BN, WM, WN, TZ, TY, TX, WST, HB>(p, x, w, bias, y, slope);                 \
    }
