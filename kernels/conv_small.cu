// The memory-bound convs: the first layer (Cin 1, on mma.sync) and the head (1x1x1, few
// output channels).
//
// conv_c1_k3: Conv3d with Cin = 1 (the first layer), 3x3x3 taps, stride 1 or 2 per axis,
// dilation 1, any begin pads, Cout <= 64. An implicit GEMM on mma.sync.m16n8k16: M = 16
// output voxels along x, K = the 27 taps (padded to 32), N = 8 channels. Memory bound (Cout
// values written per input voxel), so the point is few instructions per output: each block
// loads the fp16 input halo of a C1_TZ x C1_TY x C1_TX output tile into shared memory once;
// a lane's A fragment is 8 halo values (its two rows' voxels at its four taps), read straight
// from the halo; its B fragments (the weights of 32 channels) stay in registers. Each warp
// walks 16-voxel row groups; channels above 32 take a second pass over the groups. A group's
// fp32 results are staged per warp and stored as 16-byte runs of 4 channels.
// Weights: the mma layout [Cout_pad][kpad] fp16 (K = tap, kd kh kw row major; zero-padded to
// kpad >= 32). One block per tile: grid = N * ceil(Do/TZ) * ceil(Ho/TY) * ceil(Wo/TX), 256
// threads, static shared memory.
#define C1_TZ 4
#define C1_TY 8
#define C1_TX 32
#define C1_HALO (((C1_TZ - 1) * 2 + 3) * ((C1_TY - 1) * 2 + 3) * ((C1_TX - 1) * 2 + 3))
#define C1_SP 40  // staged row: 32 channels + 8 (the fragment's float2 writes conflict-free)
// ST (`conv_c1_k3_st`, Cout 8, 16 or 32 with the 16-byte stores): the block also sums the values
// it stores for a following norm (kernels/tile_stats.cuh's layout, one tile per block: entry
// blockIdx.x, counted in voxels). The shift is the conv's value at the block's first voxel
// (always inside the output): group 0's row 0, which every warp computes with the same mma as
// warp 0's stores (the same bits in each, no barrier; group 0's 8 mma run once more a warp). A lane's 4 channels are fixed
// (32 lanes over Cout / 4 pieces), so a shuffle tree over the lanes of a piece adds a warp's
// sums, then one thread per channel adds the 8 warps' in order. With `p.out_f32 == OUT_SHIFTED`
// (`CudaOptions::norm_shifted`) the stores are fp16 less that shift (`affine_act_v8_shifted`
// adds it back): half the bytes of fp32, the rounding relative to a value's distance from its
// tile's first one. Capped at 3 blocks per SM as the default runs (ptxas: 80 registers, 64
// bytes of spills; uncapped 128 registers and 2 blocks).
// The norm recomputed (`conv_c1_k3_sto` then `conv_c1_k3_nrm`, `CudaOptions::norm_recompute`):
// the conv is a few MACs per output, its fp32 output 128 bytes a voxel at Cout 32, so rather than
// storing that for the norm's affine pass to read, the `_sto` launch only sums (ST without the
// stores) and, once the norm's pairs are final, `_nrm` computes the same fp32 values again and
// stores the norm's output: norm_load1 of each (the affine pass's expression), 4 channels of
// fp16 a lane. The same values in the same order both times, so the same bits as conv, norm, affine.
enum C1Mode { C1_PLAIN, C1_STATS, C1_STATS_ONLY, C1_NORMED };
template <int MODE>
__device__ __forceinline__ void conv_c1_k3_t(const ConvParams& p, const half* __restrict__ x,
                                             const half* __restrict__ w, const float* __restrict__ bias,
                                             half* __restrict__ y, const float* __restrict__ slope,
                                             const NormLoad& nl) {
    constexpr bool ST = MODE == C1_STATS || MODE == C1_STATS_ONLY;
    constexpr bool STORE = MODE != C1_STATS_ONLY, NORMED = MODE == C1_NORMED;
    constexpr int GX = C1_TX / 16, GROUPS = C1_TZ * C1_TY * GX;
    static_assert(C1_TX % 16 == 0 && GROUPS % 8 == 0, "whole 16-voxel groups, the same count per warp");
    static_assert((C1_TX - 1) * 2 + 3 <= 128, "two x values per thread cover a halo row");
    __shared__ half xs[C1_HALO];
    __shared__ __align__(16) float stage[8][16 * C1_SP];  // a warp's group, [voxel][channel]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
    // The halo, a row (lz, ly) of hx values per 64 threads (hx <= 65: x values tid & 63 and,
    // at stride 2, + 64). Eight of a thread's rows at a time: their loads are issued before any
    // store, so they are in flight together (one latency per eight rows, not one per row).
    constexpr int RB = 8;
    for (int r0 = tid >> 6; r0 < hz * hy; r0 += 4 * RB) {
        half v[RB][2];
#pragma unroll
        for (int k = 0; k < RB; k++) {
            const int r = r0 + 4 * k, lz = r / hy, ly = r - lz * hy;
            const int iz = iz0 + lz, iy = iy0 + ly;
            const bool row = r < hz * hy && (unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi;
            const half* src = xn + ((i64)(row ? iz : 0) * p.hi + (row ? iy : 0)) * p.wi;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                // (Past the row's hx values a thread loads nothing: at stride 1 over 3/4 of them.)
                const int lx = (tid & 63) + 64 * e, ix = ix0 + lx;
                v[k][e] = row && lx < hx && (unsigned)ix < (unsigned)p.wi ? src[ix] : __float2half(0.f);
            }
        }
#pragma unroll
        for (int k = 0; k < RB; k++) {
            const int r = r0 + 4 * k;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int lx = (tid & 63) + 64 * e;
                if (r < hz * hy && lx < hx) xs[r * hx + lx] = v[k][e];
            }
        }
    }
    // The lane's 8 taps: k-step s (taps s * 16 + ...), columns q * 2 + {0, 1} and + 8 + {0, 1};
    // tap >= 27 reads nothing (A zero; its weights are zero too).
    const int q = lane & 3, r0 = lane >> 2;
    int toff[8];
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int t = s * 16 + h * 8 + q * 2 + e;
                const int kz = t / 9, ky = (t / 3) % 3, kx = t % 3;
                toff[(s * 2 + h) * 2 + e] = t < 27 ? (kz * hy + ky) * hx + kx : -1;
            }
    __syncthreads();
    const bool pair = ((p.ldc | p.coff) & 1) == 0;
    // 16-byte runs of 4 channels (aligned as fp32 and as fp16 pairs of half2).
    const bool vec4_ok = ((p.ldc | p.coff | p.cout) & 3) == 0;
    float* sc = stage[warp];
    const half zero = __float2half(0.f);
    // The host asks for the sums only where they fit this: one 32-channel pass, fixed pieces.
    if ((ST || NORMED) && (!vec4_ok || p.cout > 32 || 32 % (p.cout >> 2) != 0)) __trap();
    // (Known at compile time where the sums are taken: the other stores' code is dead there.)
    const bool vec4 = ST || NORMED || vec4_ok;
    // NORMED: the sample's (a, b) pairs, one per output channel.
    const float2* abn = NORMED ? reinterpret_cast<const float2*>(nl.ab) + (i64)n * p.cout : nullptr;
    float shf[4] = {0.f, 0.f, 0.f, 0.f}, ss[4] = {0.f, 0.f, 0.f, 0.f}, sq[4] = {0.f, 0.f, 0.f, 0.f};
    const bool shifted = ST && p.out_f32 == OUT_SHIFTED;
    for (int c0 = 0; c0 < p.cout; c0 += 32) {
        // B fragments of channels c0 + j * 8 + r0: k rows q * 2 + {0, 1} (b0) and + 8 (b1).
        unsigned bf[4][2][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int co = c0 + j * 8 + r0;
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int k = s * 16 + h * 8 + q * 2;
                    __half2 v = __halves2half2(zero, zero);
                    if (co < p.cout && k < 27) {
                        const half* wr = w + (i64)co * p.kpad + k;
                        v = __halves2half2(wr[0], k + 1 < 27 ? wr[1] : zero);
                    }
                    bf[j][s][h] = *reinterpret_cast<unsigned*>(&v);
                }
        }
        float bj[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int co = c0 + j * 8 + q * 2 + e;
                bj[j][e] = bias && co < p.cout ? bias[co] : 0.f;
            }
        // One 16-voxel group's sums (the halo offsets of the lane's rows r0 and r0 + 8).
        auto group_mma = [&](int gz, int gy, int gx, float (&acc)[4][4]) {
            const int v0 = (gz * p.sd * hy + gy * p.sh) * hx + (gx * 16 + r0) * p.sw;
            const int v1 = v0 + 8 * p.sw;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[j][k] = 0.f;
#pragma unroll
            for (int s = 0; s < 2; s++) {
                unsigned a[4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int t0 = toff[(s * 2 + h) * 2], t1 = toff[(s * 2 + h) * 2 + 1];
                    __half2 lo = __halves2half2(t0 >= 0 ? xs[v0 + t0] : zero, t1 >= 0 ? xs[v0 + t1] : zero);
                    __half2 hi = __halves2half2(t0 >= 0 ? xs[v1 + t0] : zero, t1 >= 0 ? xs[v1 + t1] : zero);
                    a[h * 2] = *reinterpret_cast<unsigned*>(&lo);
                    a[h * 2 + 1] = *reinterpret_cast<unsigned*>(&hi);
                }
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816(acc[j], a, bf[j][s][0], bf[j][s][1]);
            }
        };
        if constexpr (ST) {
            // The block's shift of the lane's channels cs .. cs + 3 (one pass: Cout <= 32): the
            // conv at the block's first voxel, group 0's row 0, as warp 0 stores it (every warp
            // computes it alike). Row 0 is lanes 0-3's acc[j][0, 1] (channels j * 8 + q * 2 +
            // {0, 1}): channels cs, cs + 1 from lane (cs & 7) / 2, cs + 2, cs + 3 from the next.
            float acc[4][4];
            group_mma(0, 0, 0, acc);
            const int cs = (lane % (p.cout >> 2)) * 4, src = (cs & 7) >> 1, js = cs >> 3;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = __shfl_sync(0xffffffffu, acc[j][e & 1] + bj[j][e & 1], src + (e >> 1));
                    if (j == js) shf[e] = v;
                }
        }
        // The staged stores' pieces (vec4): c4n 4-channel pieces of this pass; where they
        // divide 32 (`whole`) each lane keeps one piece, co4 .. co4 + 3, for every voxel.
        const int c4n = min(32, p.cout - c0) >> 2;
        const bool whole = ST || NORMED || (vec4 && 32 % c4n == 0);
        const int co4 = whole ? c0 + (lane % c4n) * 4 : c0, v4 = whole ? lane / c4n : 0, vstep = whole ? 32 / c4n : 1;
        float b4[4];
#pragma unroll
        for (int e = 0; e < 4; e++) b4[e] = whole && bias ? bias[co4 + e] : 0.f;
        for (int g = warp; g < GROUPS; g += 8) {
            const int gx = g % GX, gy = (g / GX) % C1_TY, gz = g / (GX * C1_TY);
            const int oz = oz0 + gz, oy = oy0 + gy, oxg = ox0 + gx * 16;
            if (oz >= p.do_ || oy >= p.ho || oxg >= p.wo) continue;  // warp-uniform
            float acc[4][4];
            group_mma(gz, gy, gx, acc);
            // acc[j]: rows r0 (0, 1) and r0 + 8 (2, 3), channels c0 + j * 8 + q * 2 + {0, 1}.
            const i64 mrow = (((i64)n * p.do_ + oz) * p.ho + oy) * p.wo;
            if (vec4) {
                // Staged, then each lane stores 4 channels of a voxel: a warp writes the group's
                // 16 voxels x 32 channels as runs of whole 16-byte pieces (8-byte pieces from
                // the fragments scattered every store over 8 voxels, at ~1.2 TB/s).
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
                        *reinterpret_cast<float2*>(sc + (r0 + rr * 8) * C1_SP + j * 8 + q * 2) =
                            make_float2(acc[j][rr * 2], acc[j][rr * 2 + 1]);
                __syncwarp();
                // The lane's 4 channels co .. co + 3 of voxel v, bias b4 added, to dst.
                auto put4 = [&](int v, int co, const float (&b4)[4], i64 dst) {
                    if (oxg + v >= p.wo) return;
                    const float4 a = *reinterpret_cast<const float4*>(sc + v * C1_SP + (co - c0));
                    float u[4] = {a.x + b4[0], a.y + b4[1], a.z + b4[2], a.w + b4[3]};
                    if (p.act != ACT_NONE) {
#pragma unroll
                        for (int e = 0; e < 4; e++) u[e] = act_apply(u[e], co + e, p.act, p.alpha, slope, p.slope_n);
                    }
                    if (ST) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float d = u[e] - shf[e];
                            ss[e] += d;
                            sq[e] += d * d;
                        }
                    }
                    if (!STORE) return;
                    if (NORMED) {
                        __align__(8) half h[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) h[e] = norm_load1(u[e], abn[co + e], co + e, nl);
                        *reinterpret_cast<uint2*>(y + dst) = *reinterpret_cast<const uint2*>(h);
                    } else if (shifted) {
                        __align__(8) __half2 h[2] = {__floats2half2_rn(u[0] - shf[0], u[1] - shf[1]),
                                                     __floats2half2_rn(u[2] - shf[2], u[3] - shf[3])};
                        *reinterpret_cast<uint2*>(y + dst) = *reinterpret_cast<const uint2*>(h);
                    } else if (p.out_f32) {
                        *reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + dst) = make_float4(u[0], u[1], u[2], u[3]);
                    } else {
                        __align__(8) __half2 h[2] = {__floats2half2_rn(u[0], u[1]), __floats2half2_rn(u[2], u[3])};
                        *reinterpret_cast<uint2*>(y + dst) = *reinterpret_cast<const uint2*>(h);
                    }
                };
                const i64 row = (mrow + oxg) * p.ldc + p.coff;
                // `whole`: the lane's piece is fixed (32 lanes over c4n pieces), voxels lane /
                // c4n, then every 32 / c4n, its bias hoisted (the loop is issue-bound, ncu);
                // else piece idx of 16 x c4n, its voxel and channels divided out.
                for (int i = whole ? v4 : lane; i < (whole ? 16 : 16 * c4n); i += whole ? vstep : 32) {
                    if (whole) {
                        put4(i, co4, b4, row + (i64)i * p.ldc + co4);
                    } else {
                        const int v = i / c4n, co = c0 + (i - v * c4n) * 4;
                        float b[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) b[e] = bias ? bias[co + e] : 0.f;
                        put4(v, co, b, row + (i64)v * p.ldc + co);
                    }
                }
                __syncwarp();
            } else {
                // The fragments' own stores (no 16-byte pieces).
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int ox = oxg + r0 + rr * 8;
                    if (ox >= p.wo) continue;
                    const i64 m = mrow + ox;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int co = c0 + j * 8 + q * 2;
                        if (co >= p.cout) continue;
                        const float u0 = act_apply(acc[j][rr * 2] + bj[j][0], co, p.act, p.alpha, slope, p.slope_n);
                        const i64 dst = m * p.ldc + p.coff + co;
                        if (co + 1 >= p.cout) {
                            out_store1(p, y, dst, u0);
                            continue;
                        }
                        const float u1 = act_apply(acc[j][rr * 2 + 1] + bj[j][1], co + 1, p.act, p.alpha, slope, p.slope_n);
                        if (pair) {
                            out_store2(p, y, dst, u0, u1);
                        } else {
                            out_store1(p, y, dst, u0);
                            out_store1(p, y, dst + 1, u1);
                        }
                    }
                }
            }
        }
    }
    if constexpr (ST) {
        // The lanes of each 4-channel piece (lane % c4n) add up; lane < c4n writes the piece.
        const int c4n = p.cout >> 2;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            if (o < c4n) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                ss[e] += __shfl_xor_sync(0xffffffffu, ss[e], o);
                sq[e] += __shfl_xor_sync(0xffffffffu, sq[e], o);
            }
        }
        // Then the 8 warps' sums in warp order (the staging rows are free once all are here).
        __syncthreads();
        float* red = &stage[0][0];  // [warp][channel][2]
        if (lane < c4n) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                red[(warp * 32 + lane * 4 + e) * 2] = ss[e];
                red[(warp * 32 + lane * 4 + e) * 2 + 1] = sq[e];
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Channel `lane`'s shift: lane lane / 4's entry lane % 4 (the whole warp shuffles).
            float sh = 0.f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float v = __shfl_sync(0xffffffffu, shf[e], lane >> 2);
                if ((lane & 3) == e) sh = v;
            }
            if (lane < p.cout) {
                float s = 0.f, q = 0.f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    s += red[(k * 32 + lane) * 2];
                    q += red[(k * 32 + lane) * 2 + 1];
                }
                const int count = min(C1_TZ, p.do_ - oz0) * min(C1_TY, p.ho - oy0) * min(C1_TX, p.wo - ox0);
                reinterpret_cast<float4*>(p.stats)[(i64)blockIdx.x * p.cout + lane] = make_float4(s, q, sh, (float)count);
            }
        }
    }
}

// The entries by mode, after it their launch bounds (the summing ones capped at 3 blocks per SM).
#define C1_ENTRY(NAME, MODE, ...)                                                                      \
    extern "C" __global__ void __launch_bounds__(__VA_ARGS__) NAME(                                   \
        ConvParams p, const half* __restrict__ x, const half* __restrict__ w,                        \
        const float* __restrict__ bias, half* __restrict__ y, const float* __restrict__ slope) {     \
        conv_c1_k3_t<MODE>(p, x, w, bias, y, slope, NormLoad{});                                     \
    }
C1_ENTRY(conv_c1_k3, C1_PLAIN, 256)
C1_ENTRY(conv_c1_k3_st, C1_STATS, 256, 3)
C1_ENTRY(conv_c1_k3_sto, C1_STATS_ONLY, 256, 3)
// The norm's arguments as `conv1x1_norm_*` takes them (x_f32 unused: the values are the conv's).
extern "C" __global__ void __launch_bounds__(256, 3) conv_c1_k3_nrm(
    ConvParams p, const half* __restrict__ x, const half* __restrict__ w, const float* __restrict__ bias,
    half* __restrict__ y, const float* __restrict__ slope, const float* nab, int x_f32, int nact, float nalpha,
    const float* nslope, int nslope_n) {
    conv_c1_k3_t<C1_NORMED>(p, x, w, bias, y, slope, NormLoad{nab, x_f32, nact, nalpha, nslope, nslope_n});
}

// conv1x1_n{16,32}: 1x1x1 conv with few output channels (the segmentation head): a memory-bound
// GEMV per voxel. One thread per voxel, Cin % 8 == 0 (16-byte loads), Cin <= 256, Cout <= NC;
// weights as fp32 [Cin][NC] in dynamic smem (Cin * NC floats, read as broadcast float4, then
// blockDim * NC halves of output staging), fp32 accumulate, bias + activation, output with
// ldc/coff. The mma tile would spend its time in prologue/epilogue for K = 32.
// conv1x1_norm_n{16,32}: the same head reading the InstanceNorm / GroupNorm before it, whose
// statistics are done: x is the norm's input (fp16, or fp32 as a conv kept it), normalised and
// activated on load from its (n, c) scale / shift pairs `nab`, then rounded to fp16 as the
// norm's own output would be: the same values as the two launches, without writing and reading
// the norm's output.
// (NormLoad: common.cuh.)

// STAGED (the `_s` entries, `CudaOptions::head_staged`): the block's voxels come in through
// shared memory, 32 channels at a time, loaded cooperatively: consecutive threads read
// consecutive 16-byte pieces of the block's contiguous voxels, where each thread's own 8-value
// loads touched 32 lines per warp instruction (session 22: ~1.3 TB/s on W1's fp32 head input).
// Then each thread reads its voxel's row (36-float rows: conflict-free) and computes as before,
// the same sums in the same order. Shared memory: + blockDim * 36 floats.
#define C1X1_SROW 36
// 8-value pieces of a voxel a head thread loads before it uses them.
#define C1X1_PIECES 4

template <int NC, bool NORM, bool STAGED>
__device__ __forceinline__ void conv1x1(const ConvParams& p, const void* __restrict__ xv, const half* __restrict__ w,
                                        const float* __restrict__ bias, half* __restrict__ y,
                                        const float* __restrict__ slope, const NormLoad& nl) {
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
    float* sx = reinterpret_cast<float*>(so + blockDim.x * NC);  // STAGED: [blockDim][C1X1_SROW]
    const bool dense = p.ldc == cout && p.coff == 0;
    const bool xf32 = NORM && nl.x_f32;
    const i64 P = (i64)p.do_ * p.ho * p.wo;
    const i64 M = p.n * P;
    for (i64 m0 = (i64)blockIdx.x * blockDim.x; m0 < M; m0 += (i64)gridDim.x * blockDim.x) {
        const i64 m = m0 + threadIdx.x;
        const int nvox = (int)min((i64)blockDim.x, M - m0);
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) acc[c] = 0.f;
        const float2* abn = NORM ? reinterpret_cast<const float2*>(nl.ab) + (min(m, M - 1) / P) * cin : nullptr;
        for (int c32 = 0; c32 < cin; c32 += STAGED ? 32 : cin) {
            const int cw = STAGED ? min(32, cin - c32) : cin;  // channels of this pass
            if (STAGED) {
                __syncthreads();  // every thread is done with the previous pass's rows
                const int per = cw >> 2;  // 4-value pieces of a voxel's pass
                for (int i = threadIdx.x; i < nvox * per; i += blockDim.x) {
                    const int v = i / per, q = i - v * per;
                    const i64 src = (m0 + v) * cin + c32 + q * 4;
                    float4 a;
                    if (xf32) {
                        a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(xv) + src));
                    } else {
                        const uint2 u = __ldg(reinterpret_cast<const uint2*>(static_cast<const half*>(xv) + src));
                        const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
                        const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
                        a = make_float4(lo.x, lo.y, hi.x, hi.y);
                    }
                    *reinterpret_cast<float4*>(sx + v * C1X1_SROW + q * 4) = a;
                }
                __syncthreads();
            }
            if (m >= M) continue;
            // Up to C1X1_PIECES of the voxel's 8-value pieces loaded before any is used (one
            // thread per voxel is few bytes in flight otherwise); then normalised and summed
            // piece by piece in channel order, as one at a time would.
            for (int cv0 = c32 >> 3; cv0 < (c32 + cw) >> 3; cv0 += C1X1_PIECES) {
                const int np = min(C1X1_PIECES, ((c32 + cw) >> 3) - cv0);
                float f[C1X1_PIECES][8];
#pragma unroll
                for (int u = 0; u < C1X1_PIECES; u++) {
                    if (u >= np) break;
                    const int cv = cv0 + u;
                    if (STAGED) {
                        const float4* r = reinterpret_cast<const float4*>(sx + threadIdx.x * C1X1_SROW + cv * 8 - c32);
                        const float4 a = r[0], b = r[1];
                        f[u][0] = a.x, f[u][1] = a.y, f[u][2] = a.z, f[u][3] = a.w;
                        f[u][4] = b.x, f[u][5] = b.y, f[u][6] = b.z, f[u][7] = b.w;
                    } else if (xf32) {
                        load8(static_cast<const float*>(xv), m * cin + cv * 8, f[u]);
                    } else {
                        load8(static_cast<const half*>(xv), m * cin + cv * 8, f[u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < C1X1_PIECES; u++) {
                    if (u >= np) break;
                    const int cv = cv0 + u;
                    if (NORM) {
                        float2 ab[8];
#pragma unroll
                        for (int k = 0; k < 8; k++) ab[k] = __ldg(abn + cv * 8 + k);
                        norm_load8(f[u], ab, cv * 8, nl);
                    }
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const float4* wr = reinterpret_cast<const float4*>(ws + (cv * 8 + k) * NC);
#pragma unroll
                        for (int q = 0; q < NC / 4; q++) {
                            float4 wq = wr[q];
                            acc[4 * q] += f[u][k] * wq.x;
                            acc[4 * q + 1] += f[u][k] * wq.y;
                            acc[4 * q + 2] += f[u][k] * wq.z;
                            acc[4 * q + 3] += f[u][k] * wq.w;
                        }
                    }
                }
            }
        }
        if (m < M) {
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
            // 16-byte pieces where the run starts on one (blockDim * cout halves a block: always
            // for even Cout when y is aligned), then the halves past the last whole piece.
            int done = 0;
            if ((reinterpret_cast<size_t>(yb) & 15) == 0) {
                done = cnt & ~7;
                const uint4* s4 = reinterpret_cast<const uint4*>(so);
                uint4* y4 = reinterpret_cast<uint4*>(yb);
                for (int i = threadIdx.x; i < done >> 3; i += blockDim.x) y4[i] = s4[i];
            }
            for (int i = done + threadIdx.x; i < cnt; i += blockDim.x) yb[i] = so[i];
            __syncthreads();
        }
    }
}

#define CONV1X1_ENTRY(NAME, NC, STAGED)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) NAME(ConvParams p, const half* x, const half* w,  \
                                                           const float* bias, half* y, const float* slope) { \
        conv1x1<NC, false, STAGED>(p, x, w, bias, y, slope, NormLoad{});                              \
    }
CONV1X1_ENTRY(conv1x1_n16, 16, false)
CONV1X1_ENTRY(conv1x1_n32, 32, false)
CONV1X1_ENTRY(conv1x1_n16_s, 16, true)
CONV1X1_ENTRY(conv1x1_n32_s, 32, true)

#define CONV1X1_NORM_ENTRY(NAME, NC, STAGED)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                            \
        ConvParams p, const void* x, const half* w, const float* bias, half* y, const float* slope,     \
        const float* nab, int x_f32, int nact, float nalpha, const float* nslope, int nslope_n) {       \
        conv1x1<NC, true, STAGED>(p, x, w, bias, y, slope, NormLoad{nab, x_f32, nact, nalpha, nslope, nslope_n}); \
    }
CONV1X1_NORM_ENTRY(conv1x1_norm_n16, 16, false)
CONV1X1_NORM_ENTRY(conv1x1_norm_n32, 32, false)
CONV1X1_NORM_ENTRY(conv1x1_norm_n16_s, 16, true)
CONV1X1_NORM_ENTRY(conv1x1_norm_n32_s, 32, true)

// conv1x1_mma_n16 / conv1x1_norm_mma_n16 (`CudaOptions::head_mma`): the head on mma.sync
// m16n8k16. A warp takes 16 voxels at a time: A is their Cin values as fp16 (the input, or for
// the `_norm` twin the norm's output rounded as its affine pass stores it: norm_load1), B the
// weights (Cin x 16 fp16, in registers for the launch), fp32 accumulators; then bias and
// activation, staged per warp as the dense output rows and stored in 16-byte pieces. The
// one-thread-per-voxel loop above issues ~420 instructions a lane per 16 voxels (its fp32 FMA
// chain and the weights' shared loads, at 121 registers and 2 blocks per SM for
// `conv1x1_norm_n16`: W1's head at ~1.3 TB/s); this ~150. Cin = 16 x KS (16 or 32), Cout <= 16,
// N x D x H x W < 2^31 (32-bit voxel indices: the host asks so). The products are exact in fp32
// either way; the sums run in another order than the FMA chain's.
template <int KS, bool NORM, bool XF32>
__device__ __forceinline__ void conv1x1_mma_t(const ConvParams& p, const void* __restrict__ xv,
                                              const half* __restrict__ w, const float* __restrict__ bias,
                                              half* __restrict__ y, const float* __restrict__ slope,
                                              const NormLoad& nl, half (*stage)[16 * 16]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = lane & 3, r0 = lane >> 2;
    const int cin = KS * 16, cout = p.cout;
    // B: the weights (Cin x 16) for the launch.
    unsigned bf[KS][2][2];
    mma_b_rows(bf, w, 0, p.kpad, cout, lane);
    float bj[2][2];  // the bias of the lane's output channels
    mma_bias_cols(bj, bias, cout, lane);
    const unsigned P = (unsigned)p.do_ * p.ho * p.wo, M = (unsigned)p.n * P;
    const unsigned groups = (M + 15) / 16;
    const bool dense = p.ldc == cout && p.coff == 0;
    // NORM: the (a, b) pairs of the lane's input channels s * 16 + h * 8 + q * 2 + e for
    // sample `cur` (reloaded when a row's sample changes).
    float2 ab[KS][2][2];
    int cur = -1;
    half* sw = stage[warp];
    for (unsigned g = blockIdx.x * 8 + warp; g < groups; g += gridDim.x * 8) {
        const unsigned m0 = g * 16;
        unsigned a[KS][4];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const unsigned m = min(m0 + r0 + rr * 8, M - 1);
            float v[KS][2][2];
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const i64 at = (i64)m * cin + s * 16 + h * 8 + q * 2;
                    float2 t;
                    if (XF32) {
                        t = __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(xv) + at));
                    } else {
                        t = __half22float2(__ldg(reinterpret_cast<const __half2*>(static_cast<const half*>(xv) + at)));
                    }
                    v[s][h][0] = t.x, v[s][h][1] = t.y;
                }
            if (NORM) {
                const int n = (int)(m / P);
                if (n != cur) {
                    const float2* abn = reinterpret_cast<const float2*>(nl.ab) + (i64)n * cin;
#pragma unroll
                    for (int s = 0; s < KS; s++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int e = 0; e < 2; e++) ab[s][h][e] = __ldg(abn + s * 16 + h * 8 + q * 2 + e);
                    cur = n;
                }
            }
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    __half2 hv;
                    if (NORM) {
                        const int c = s * 16 + h * 8 + q * 2;
                        hv = __halves2half2(norm_load1(v[s][h][0], ab[s][h][0], c, nl),
                                            norm_load1(v[s][h][1], ab[s][h][1], c + 1, nl));
                    } else {
                        hv = __floats2half2_rn(v[s][h][0], v[s][h][1]);
                    }
                    a[s][h * 2 + rr] = *reinterpret_cast<unsigned*>(&hv);
                }
        }
        float acc[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[j][k] = 0.f;
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int j = 0; j < 2; j++) mma16816(acc[j], a[s], bf[s][j][0], bf[s][j][1]);
        // acc[j]: rows r0 (0, 1) and r0 + 8 (2, 3), channels j * 8 + q * 2 + {0, 1}.
        const int rows = (int)min(16u, M - m0);
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = r0 + rr * 8, co = j * 8 + q * 2 + e;
                    if (co >= cout || r >= rows) continue;
                    const half o = __float2half(act_apply(acc[j][rr * 2 + e] + bj[j][e], co, p.act, p.alpha, slope, p.slope_n));
                    if (dense) {
                        sw[r * cout + co] = o;
                    } else {
                        y[(i64)(m0 + r) * p.ldc + p.coff + co] = o;
                    }
                }
        if (dense) {
            __syncwarp();
            // The group's rows are one run of rows * cout halves; whole 16-byte pieces where
            // it starts on one (m0 * cout halves: 16 voxels x even Cout), then the rest.
            const int cnt = rows * cout;
            half* yo = y + (i64)m0 * cout;
            int done = 0;
            if ((reinterpret_cast<size_t>(yo) & 15) == 0) {
                done = cnt & ~7;
                for (int i = lane; i < done >> 3; i += 32)
                    reinterpret_cast<uint4*>(yo)[i] = reinterpret_cast<const uint4*>(sw)[i];
            }
            for (int i = done + lane; i < cnt; i += 32) yo[i] = sw[i];
            __syncwarp();
        }
    }
}

// The entries by Cin (16 or 32) and input type; the `_norm` one reads a norm's input. One
// staging array for every path (a warp's 16 output rows, dense).
#define C1X1_MMA_STAGE __shared__ __align__(16) half stage[8][16 * 16]
template <bool NORM, bool XF32>
__device__ __forceinline__ void conv1x1_mma_cin(const ConvParams& p, const void* xv, const half* w,
                                                const float* bias, half* y, const float* slope,
                                                const NormLoad& nl, half (*stage)[16 * 16]) {
    switch (p.cin) {
    case 16: return conv1x1_mma_t<1, NORM, XF32>(p, xv, w, bias, y, slope, nl, stage);
    case 32: return conv1x1_mma_t<2, NORM, XF32>(p, xv, w, bias, y, slope, nl, stage);
    default: __trap();
    }
}
extern "C" __global__ void __launch_bounds__(256) conv1x1_mma_n16(ConvParams p, const half* x, const half* w,
                                                                   const float* bias, half* y, const float* slope) {
    C1X1_MMA_STAGE;
    conv1x1_mma_cin<false, false>(p, x, w, bias, y, slope, NormLoad{}, stage);
}
extern "C" __global__ void __launch_bounds__(256) conv1x1_norm_mma_n16(
    ConvParams p, const void* x, const half* w, const float* bias, half* y, const float* slope, const float* nab,
    int x_f32, int nact, float nalpha, const float* nslope, int nslope_n) {
    C1X1_MMA_STAGE;
    const NormLoad nl{nab, x_f32, nact, nalpha, nslope, nslope_n};
    if (x_f32) {
        conv1x1_mma_cin<true, true>(p, x, w, bias, y, slope, nl, stage);
    } else {
        conv1x1_mma_cin<true, false>(p, x, w, bias, y, slope, nl, stage);
    }
}
