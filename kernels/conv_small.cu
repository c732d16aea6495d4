// The memory-bound convs (no tensor cores): the first layer (Cin 1) and the head (1x1x1, few
// output channels).
//
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

