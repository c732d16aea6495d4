// Tensor ops on activations of any rank (transformer blocks): strided copies (Reshape,
// Transpose, Slice, Gather, Concat, layout changes), broadcast binaries, softmax and layer norm
// over any axis, and a tensor-core GEMM (MatMul, Linear). fp16 storage, fp32 math.
// Rank-5 values are NDHWC, every other rank row-major: the Rust side turns that into element
// strides, so the kernels only see dims and strides.
#include <mma.h>
using namespace nvcuda;

#define TGRID(e, total) \
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < (total); e += (i64)gridDim.x * blockDim.x)

// Mirrors `NdParams` in src/backend/cuda/abi.rs. An element index e is decomposed row-major
// over xd (rx dims, outermost first); x is read at xoff + sum(c * xs). y is written at
// yoff + sum(c * ys) over the same coordinates when ry == 0, else over e decomposed over yd
// (ry dims: a Reshape, where both sides share the row-major logical index). Binaries read b at
// sum(c * bs) over x's coordinates.
struct NdParams {
    i64 total;
    int rx, ry, op, pad_;
    i64 xd[8], xs[8], yd[8], ys[8], bs[8];
    i64 xoff, yoff;
};

template <typename T>
__device__ __forceinline__ void nd_copy_t(const T* __restrict__ x, T* __restrict__ y, const NdParams& p) {
    TGRID(e, p.total) {
        i64 t = e, xo = p.xoff, yo = p.yoff;
        for (int a = p.rx - 1; a >= 0; a--) {
            i64 c = t % p.xd[a];
            t /= p.xd[a];
            xo += c * p.xs[a];
            if (p.ry == 0) yo += c * p.ys[a];
        }
        if (p.ry > 0) {
            t = e;
            for (int a = p.ry - 1; a >= 0; a--) {
                i64 c = t % p.yd[a];
                t /= p.yd[a];
                yo += c * p.ys[a];
            }
        }
        y[yo] = x[xo];
    }
}

extern "C" __global__ void nd_copy(const half* __restrict__ x, half* __restrict__ y, NdParams p) {
    nd_copy_t(x, y, p);
}

// The same copy in 16-byte units (8 halves): every size, stride and offset of p counts units,
// which the host checked (`NdParams::vec8`): 8x fewer elements and index divisions.
extern "C" __global__ void nd_copy_v8(const uint4* __restrict__ x, uint4* __restrict__ y, NdParams p) {
    nd_copy_t(x, y, p);
}

// y = a (op) b with numpy broadcasting (strides 0 on broadcast axes); op: bin_any's codes.
extern "C" __global__ void nd_binary(const half* __restrict__ a, const half* __restrict__ b,
                                     half* __restrict__ y, NdParams p) {
    TGRID(e, p.total) {
        i64 t = e, ao = p.xoff, bo = 0, yo = p.yoff;
        for (int k = p.rx - 1; k >= 0; k--) {
            i64 c = t % p.xd[k];
            t /= p.xd[k];
            ao += c * p.xs[k];
            bo += c * p.bs[k];
            yo += c * p.ys[k];
        }
        y[yo] = __float2half(bin_any(__half2float(a[ao]), __half2float(b[bo]), p.op));
    }
}

// nd_binary with an f32 constant as b (AddConst / MulConst of any rank).
extern "C" __global__ void nd_binary_const(const half* __restrict__ a, const float* __restrict__ b,
                                           half* __restrict__ y, NdParams p) {
    TGRID(e, p.total) {
        i64 t = e, ao = p.xoff, bo = 0, yo = p.yoff;
        for (int k = p.rx - 1; k >= 0; k--) {
            i64 c = t % p.xd[k];
            t /= p.xd[k];
            ao += c * p.xs[k];
            bo += c * p.bs[k];
            yo += c * p.ys[k];
        }
        y[yo] = __float2half(bin_any(__half2float(a[ao]), b[bo], p.op));
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Softmax over contiguous rows of `len` (inner stride 1): one warp per row, lanes along the row.
extern "C" __global__ void softmax_rows(const half* __restrict__ x, half* __restrict__ y, i64 rows, int len) {
    const int lane = threadIdx.x & 31;
    const i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const half* xr = x + r * len;
        half* yr = y + r * len;
        float m = NEG_INF;
        for (int j = lane; j < len; j += 32) m = fmaxf(m, __half2float(xr[j]));
        m = warp_max(m);
        float s = 0.f;
        for (int j = lane; j < len; j += 32) s += __expf(__half2float(xr[j]) - m);
        const float inv = 1.f / warp_sum(s);
        for (int j = lane; j < len; j += 32) yr[j] = __float2half(__expf(__half2float(xr[j]) - m) * inv);
    }
}

// Softmax over an axis of `len` elements `inner` apart (outer x len x inner): one thread per
// (outer, inner) column, consecutive threads on consecutive addresses; online max / sum.
extern "C" __global__ void softmax_strided(const half* __restrict__ x, half* __restrict__ y, i64 outer, int len,
                                           i64 inner) {
    TGRID(e, outer * inner) {
        const i64 base = (e / inner) * len * inner + e % inner;
        float m = NEG_INF, s = 0.f;
        for (int j = 0; j < len; j++) {
            float v = __half2float(x[base + j * inner]);
            if (v > m) {
                s = s * __expf(m - v) + 1.f;
                m = v;
            } else {
                s += __expf(v - m);
            }
        }
        const float inv = 1.f / s;
        for (int j = 0; j < len; j++) y[base + j * inner] = __float2half(__expf(__half2float(x[base + j * inner]) - m) * inv);
    }
}

// The scale / bias index of physical element j of a row: j itself, or (remap > 0: a rank-5
// NDHWC row normalised over C, D, H, W) the NCDHW position of NDHWC element j with remap = C.
__device__ __forceinline__ int ln_index(int j, int len, int remap) {
    return remap > 0 ? (j % remap) * (len / remap) + j / remap : j;
}

// LayerNorm over contiguous rows of `len`: one warp per row, fp32 mean and variance (two passes).
extern "C" __global__ void layernorm_rows(const half* __restrict__ x, half* __restrict__ y,
                                          const float* __restrict__ scale, const float* __restrict__ bias,
                                          i64 rows, int len, int remap, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const half* xr = x + r * len;
        half* yr = y + r * len;
        float s = 0.f;
        for (int j = lane; j < len; j += 32) s += __half2float(xr[j]);
        const float mean = warp_sum(s) / len;
        float q = 0.f;
        for (int j = lane; j < len; j += 32) {
            float d = __half2float(xr[j]) - mean;
            q += d * d;
        }
        const float rstd = rsqrtf(warp_sum(q) / len + eps);
        for (int j = lane; j < len; j += 32) {
            int k = ln_index(j, len, remap);
            float v = (__half2float(xr[j]) - mean) * rstd * scale[k];
            yr[j] = __float2half(bias ? v + bias[k] : v);
        }
    }
}

// LayerNorm over `len` elements `inner` apart (outer x len x inner): one thread per column.
extern "C" __global__ void layernorm_strided(const half* __restrict__ x, half* __restrict__ y,
                                             const float* __restrict__ scale, const float* __restrict__ bias,
                                             i64 outer, int len, i64 inner, float eps) {
    TGRID(e, outer * inner) {
        const i64 base = (e / inner) * len * inner + e % inner;
        float s = 0.f;
        for (int j = 0; j < len; j++) s += __half2float(x[base + j * inner]);
        const float mean = s / len;
        float q = 0.f;
        for (int j = 0; j < len; j++) {
            float d = __half2float(x[base + j * inner]) - mean;
            q += d * d;
        }
        const float rstd = rsqrtf(q / len + eps);
        for (int j = 0; j < len; j++) {
            float v = (__half2float(x[base + j * inner]) - mean) * rstd * scale[j];
            y[base + j * inner] = __float2half(bias ? v + bias[j] : v);
        }
    }
}

// Mirrors `GemmParams` in src/backend/cuda/abi.rs: y[b] = a[b] (M x K) @ w[b] (K x N) + bias,
// every operand at element strides (row, column), batch b decomposed over bd (nb dims) with
// per-operand batch strides (0: broadcast).
struct GemmParams {
    i64 m, n, k;
    i64 a_sm, a_sk, b_sk, b_sn, y_sm, y_sn;
    i64 nbatch;
    int nb, pad_;
    i64 bd[6], abs_[6], bbs[6], ybs[6];
};

// Element offsets of a, w and y for batch bi (decomposed over p.bd).
__device__ __forceinline__ void gemm_batch(const GemmParams& p, i64 bi, i64& ao, i64& bo, i64& yo) {
    i64 t = bi;
    ao = bo = yo = 0;
    for (int d = p.nb - 1; d >= 0; d--) {
        i64 c = t % p.bd[d];
        t /= p.bd[d];
        ao += c * p.abs_[d];
        bo += c * p.bbs[d];
        yo += c * p.ybs[d];
    }
}

// The epilogue: the block's BM x BN fp32 tile (staged in Cs, row stride LDC) plus the bias, as fp16,
// inside M x N, by THREADS threads.
template <int BM, int BN, int LDC, int THREADS>
__device__ __forceinline__ void gemm_store(const float* Cs, const float* __restrict__ bias, half* __restrict__ y,
                                           i64 yo, i64 m0, i64 n0, const GemmParams& p, int tid) {
    for (int idx = tid; idx < BM * BN; idx += THREADS) {
        int r = idx / BN, c = idx % BN;
        i64 m = m0 + r, nn = n0 + c;
        if (m < p.m && nn < p.n) {
            float v = Cs[r * LDC + c];
            if (bias) v += bias[nn];
            y[yo + m * p.y_sm + nn * p.y_sn] = __float2half(v);
        }
    }
}

#define G_BM 64
#define G_BN 64
#define G_BK 32
#define G_LDA (G_BK + 8)
#define G_LDB (G_BN + 8)
#define G_LDC (G_BN + 4)

// Tensor-core GEMM: 64 x 64 output tile per block of 4 warps (2 x 2, 32 x 32 each as 2 x 2 wmma
// 16x16x16 fragments), K in steps of 32 through shared memory, fp32 accumulation. Loads are
// bounds-checked (zero outside M, N, K) and walk the fast index of each operand across
// consecutive threads, so row-major operands load coalesced. Grid: x M tiles, y N tiles,
// z batches (looped past 65535).
extern "C" __global__ void __launch_bounds__(128) gemm_wmma(const half* __restrict__ a, const half* __restrict__ w,
                                                            const float* __restrict__ bias, half* __restrict__ y,
                                                            GemmParams p) {
    __shared__ __align__(32) unsigned char smem[G_BM * G_LDC * 4];
    half* As = reinterpret_cast<half*>(smem);
    half* Bs = As + G_BM * G_LDA;
    float* Cs = reinterpret_cast<float*>(smem);
    const int tid = threadIdx.x, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const i64 m0 = (i64)blockIdx.x * G_BM, n0 = (i64)blockIdx.y * G_BN;
    for (i64 bi = blockIdx.z; bi < p.nbatch; bi += gridDim.z) {
        i64 ao, bo, yo;
        gemm_batch(p, bi, ao, bo, yo);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
        for (i64 k0 = 0; k0 < p.k; k0 += G_BK) {
            for (int idx = tid; idx < G_BM * G_BK; idx += 128) {
                int r = idx / G_BK, c = idx % G_BK;
                i64 m = m0 + r, kk = k0 + c;
                As[r * G_LDA + c] = (m < p.m && kk < p.k) ? a[ao + m * p.a_sm + kk * p.a_sk] : __float2half(0.f);
            }
            for (int idx = tid; idx < G_BK * G_BN; idx += 128) {
                int r = idx / G_BN, c = idx % G_BN;
                i64 kk = k0 + r, nn = n0 + c;
                Bs[r * G_LDB + c] = (kk < p.k && nn < p.n) ? w[bo + kk * p.b_sk + nn * p.b_sn] : __float2half(0.f);
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < G_BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb[2];
#pragma unroll
                for (int i = 0; i < 2; i++)
                    wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * G_LDA + kk, G_LDA);
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::load_matrix_sync(fb[j], Bs + kk * G_LDB + wn * 32 + j * 16, G_LDB);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * G_LDC + wn * 32 + j * 16, acc[i][j], G_LDC,
                                        wmma::mem_row_major);
        __syncthreads();
        gemm_store<G_BM, G_BN, G_LDC, 128>(Cs, bias, y, yo, m0, n0, p, tid);
        __syncthreads();
    }
}

#define GV_BM 128
#define GV_BN 64
#define GV_BK 32
#define GV_LDA (GV_BK + 8)
#define GV_LDB (GV_BN + 8)
#define GV_LDC (GV_BN + 4)
#define GV_SMEM (GV_BM * GV_LDC * 4)

// gemm_wmma for operands contiguous along K (a) and N (w) with K, N, every row and batch stride
// a multiple of 8 and 16-byte aligned bases (checked by the launch wrapper): 16-byte cp.async
// loads (zero-filled outside M, N, K) double-buffered against the tensor cores, a 128 x 64 tile
// per block of 8 warps (4 x 2, 32 x 32 each). The epilogue stages the fp32 tile in shared
// memory and adds the bias as gemm_wmma does.
extern "C" __global__ void __launch_bounds__(256) gemm_wmma_v8(const half* __restrict__ a, const half* __restrict__ w,
                                                               const float* __restrict__ bias, half* __restrict__ y,
                                                               GemmParams p) {
    __shared__ __align__(128) unsigned char smem[GV_SMEM];
    half* As = reinterpret_cast<half*>(smem);              // [2][GV_BM][GV_LDA]
    half* Bs = As + 2 * GV_BM * GV_LDA;                     // [2][GV_BK][GV_LDB]
    float* Cs = reinterpret_cast<float*>(smem);            // [GV_BM][GV_LDC], after the main loop
    const int tid = threadIdx.x, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const i64 m0 = (i64)blockIdx.x * GV_BM, n0 = (i64)blockIdx.y * GV_BN;
    const int nk = (int)((p.k + GV_BK - 1) / GV_BK);
    for (i64 bi = blockIdx.z; bi < p.nbatch; bi += gridDim.z) {
        i64 ao, bo, yo;
        gemm_batch(p, bi, ao, bo, yo);
        // Stage s of K step kt: A rows of 4 vectors (2 per thread), B rows of 8 vectors (1 each).
        auto load = [&](int s, int kt) {
            const i64 k0 = (i64)kt * GV_BK;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int v = tid + i * 256, r = v >> 2, c = (v & 3) * 8;
                const i64 m = m0 + r, kk = k0 + c;
                const bool in = m < p.m && kk < p.k;
                cp_async16(As + (s * GV_BM + r) * GV_LDA + c, in ? a + ao + m * p.a_sm + kk : a, in ? 16 : 0);
            }
            {
                const int r = tid >> 3, c = (tid & 7) * 8;
                const i64 kk = k0 + r, nn = n0 + c;
                const bool in = kk < p.k && nn < p.n;
                cp_async16(Bs + (s * GV_BK + r) * GV_LDB + c, in ? w + bo + kk * p.b_sk + nn : w, in ? 16 : 0);
            }
            cp_async_commit();
        };
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
        load(0, 0);
        for (int kt = 0; kt < nk; kt++) {
            const int s = kt & 1;
            if (kt + 1 < nk) {
                load(s ^ 1, kt + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const half* as = As + s * GV_BM * GV_LDA;
            const half* bs = Bs + s * GV_BK * GV_LDB;
#pragma unroll
            for (int kk = 0; kk < GV_BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb[2];
#pragma unroll
                for (int i = 0; i < 2; i++)
                    wmma::load_matrix_sync(fa[i], as + (wm * 32 + i * 16) * GV_LDA + kk, GV_LDA);
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::load_matrix_sync(fb[j], bs + kk * GV_LDB + wn * 32 + j * 16, GV_LDB);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
            __syncthreads();  // this stage is consumed before the next load overwrites it
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * GV_LDC + wn * 32 + j * 16, acc[i][j], GV_LDC,
                                        wmma::mem_row_major);
        __syncthreads();
        gemm_store<GV_BM, GV_BN, GV_LDC, 256>(Cs, bias, y, yo, m0, n0, p, tid);
        __syncthreads();
    }
}
