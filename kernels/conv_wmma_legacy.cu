// conv_igemm_*: Conv3d and ConvTranspose3d as one implicit GEMM on tensor cores (wmma 16x16x16,
// fp16 in, fp32 accumulate), the path before conv_mma_* (kernels/conv_mma.cu). It still runs what
// the mma kernels do not: transposed convs outside `relayout::parity_split` (dilated ones), GEMMs
// of 2^31 rows or more, devices below sm_80; `CudaOptions::legacy_conv` forces it for tests.
// Activations are NDHWC fp16, so the GEMM's K (taps x Cin) is contiguous for
// each tap; weights are re-laid at prepare as [Cout_pad][K_pad] fp16 (zero padded), so the B
// tile loads need no bounds checks. M = output pixels (N*Do*Ho*Wo), N = Cout.
// The transposed conv uses the gather formulation: input i contributes to output o through tap k
// when o + pad - k*dil = i*stride (stride-divisible and in range, `in_coord` in common.cuh); the
// other entries are zeros.
#include <mma.h>
using namespace nvcuda;

#define BM 128
#define BK 32
#define LDS (BK + 8)   // +8 halves: rows start 16 bytes apart in different banks

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
