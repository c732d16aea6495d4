// conv_wgk_*: convs of stride 1 or 2 (on every axis) with Cin a multiple of 64 (any kernel size,
// pads and dilation) as an implicit GEMM on wgmma whose operands the TMA unit brings in: W1's
// 16³ convs (Cin 256 / 512, Cout 256; 128 tiles of 128 voxels at batch 4, one wave), which
// conv_mma's m128n128 ran at ~220 TF/s and no halo kernel holds (a 256-channel halo is larger
// than shared memory), and its 32³ and stride-2 ones.
//
// A tile is 128 output voxels, a TZ x TY x TX box of one sample; its GEMM rows in box order (x
// fastest). A k-step is one tap and 64 input channels: the A stage is the box of input voxels
// that tap reads for the tile (one tensor load of [64 channels][TX][TY][TZ] at the tap's offset,
// the TMA unit writing zeros where the box leaves the input: the pads; at stride 2 the map's
// element strides take every other voxel of a box twice as long), the B stage the
// weights' BN rows of K = tap * Cin + c0 .. + 64 (weights [Cout_pad][kpad] as conv_mma's; rows
// past the padded Cout read as zeros). Both are 128-byte rows in the 128-byte swizzle (the
// tensor loads write it, the descriptors read it: no bank conflicts, no padding).
// Warpgroup 0 is the producer: one thread keeps a ring of STAGES stages filled, waiting on each
// stage's `empty` barrier (every consumer warp's arrival) before loading it again. Warpgroups 1
// and 2 take 64 rows each against all BN columns, each k-step on the stage's `full` barrier
// (its loads' bytes), a stage released once the next one's wgmmas are issued and its own done.
// The `_st` twins also write the norm statistics of their tile (`wgk_stats`).
// CK: input channels a k-step (64: 128-byte rows in the 128-byte swizzle; 32: 64-byte rows in
// the 64-byte swizzle, for Cin 32k). UP: the fused parity classes of a strided transposed conv
// (`conv_wgk_up_*`): the GEMM runs over the input grid (a tile is 128 input voxels, the taps
// the classes' union) and its columns are class x Cout; the tile goes through shared memory and
// each row's class blocks are scattered to their output voxels (`wgk_up_store`).
// Smem bytes: keep in sync with WgkConfig::smem_bytes (src/backend/cuda/host/catalogue.rs).

#define WGK_BM 128

// Bias, activation and the stores of one consumer thread's accumulators (rows `m[h]`'s first
// element, `ok[h]` inside the output; columns nb0 + j * 8 + (lane % 4) * 2 + {0, 1}). ST: each
// stored value back into its accumulator as stored (fp16-rounded unless the output is fp32),
// for the norm statistics.
template <int ACT, int BN, bool ST>
__device__ __forceinline__ void wgk_store(const ConvParams& p, float (&acc)[BN / 2], const i64 (&m)[2],
                                          const bool (&ok)[2], int nb0, int lane, half* __restrict__ y,
                                          const float* __restrict__ bias, const float* __restrict__ slope) {
    const bool pair = ((p.ldc | p.coff) & 1) == 0;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const int c = nb0 + j * 8 + (lane & 3) * 2;
        if (c >= p.cout) continue;
        const bool two = c + 1 < p.cout;
        const float b0 = bias ? bias[c] : 0.f, b1 = bias && two ? bias[c + 1] : 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float& v0 = acc[j * 4 + h * 2];
            float& v1 = acc[j * 4 + h * 2 + 1];
            v0 = act_of<ACT>(v0 + b0, c, p.act, p.alpha, slope, p.slope_n);
            v1 = act_of<ACT>(v1 + b1, c + 1, p.act, p.alpha, slope, p.slope_n);
            if (ST && !p.out_f32) {
                v0 = __half2float(__float2half(v0));
                v1 = __half2float(__float2half(v1));
            }
            if (!ok[h]) continue;
            const i64 dst = m[h] + c;
            if (two && pair) {
                out_store2(p, y, dst, v0, v1);
            } else {
                out_store1(p, y, dst, v0);
                if (two) out_store1(p, y, dst + 1, v1);
            }
        }
    }
}

// The `_st` twins: the tile's norm statistics from the stored values in the accumulators, one
// tile_stats.cuh entry per (tile, channel) at [blockIdx.x][cout] (the block's BN channels). The
// shift is the tile's first voxel's value (row 0: lanes 0-3 of the first MMA warp); each warp
// adds its 8 row groups with shuffles (a fixed tree), then one thread per channel the 8 warps'
// sums in order: the same bits every run. `sm`: the stages' shared memory, free once both MMA
// warpgroups pass the first barrier. `count`: the tile's voxels inside the output.
template <int BN>
__device__ __forceinline__ void wgk_stats(const ConvParams& p, const float (&acc)[BN / 2], const bool (&ok)[2],
                                          int nb0, int lane, int w8, float* sm, float count) {
    float* shf = sm;          // [BN]
    float* part = sm + BN;    // [8 warps][BN][2]
    stats_bar<1, 256>();      // both warpgroups' wgmmas are done with the stages
    if (w8 == 0 && lane < 4) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            shf[j * 8 + lane * 2] = acc[j * 4];
            shf[j * 8 + lane * 2 + 1] = acc[j * 4 + 1];
        }
    }
    stats_bar<1, 256>();
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int c = j * 8 + (lane & 3) * 2 + e;
            const float sh = shf[c];
            float s = 0.f, q = 0.f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float a = ok[h] ? acc[j * 4 + h * 2 + e] - sh : 0.f;
                s += a;
                q += a * a;
            }
#pragma unroll
            for (int o = 4; o < 32; o *= 2) {
                s += __shfl_xor_sync(0xffffffffu, s, o);
                q += __shfl_xor_sync(0xffffffffu, q, o);
            }
            if (lane < 4) {
                part[(w8 * BN + c) * 2] = s;
                part[(w8 * BN + c) * 2 + 1] = q;
            }
        }
    }
    stats_bar<1, 256>();
    const int t = w8 * 32 + lane;
    if (t < BN && nb0 + t < p.cout) {
        float a = 0.f, b = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            a += part[(w * BN + t) * 2];
            b += part[(w * BN + t) * 2 + 1];
        }
        reinterpret_cast<float4*>(p.stats)[(i64)blockIdx.x * p.cout + nb0 + t] = make_float4(a, b, shf[t], count);
    }
}

// Floats of shared memory `wgk_up_store` stages a tile in: the tile [128][BN + 8], the rows'
// output bases (i64), the columns' biases, then their sums (float2; later the chunks' offsets).
template <int BN>
__host__ __device__ constexpr int wgk_up_floats() {
    return WGK_BM * (BN + 8) + WGK_BM * 2 + BN + BN * 2;
}

// The fused parity classes' epilogue on the 256 MMA threads (`ct` the thread's index among
// them): the accumulators into shared memory, each row's output base (input voxel (iz, iy, ix)
// of the tile box -> output (iz * up_d, iy * up_h, ix * up_w); -1 outside the grid), each
// column's bias, then conv_mma's staged scatter (`up_store_staged`, the rows without a base
// left out of the statistics).
template <int BN, int TZ, int TY, int TX, bool ST>
__device__ __forceinline__ void wgk_up_store(const ConvParams& p, const float (&acc)[BN / 2], int cw, int warp,
                                             int lane, int ct, int n, int oz0, int oy0, int ox0, float* sm,
                                             half* __restrict__ y, const float* __restrict__ bias,
                                             const float* __restrict__ slope) {
    constexpr int CLD = BN + 8;
    float* cs = sm;
    i64* rb = reinterpret_cast<i64*>(cs + WGK_BM * CLD);
    float* bc = reinterpret_cast<float*>(rb + WGK_BM);
    const int nb0 = blockIdx.y * BN;
    stats_bar<1, 256>();  // both warpgroups' wgmmas are done with the stages
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = cw * 64 + warp * 16 + (lane >> 2) + h * 8, col = j * 8 + (lane & 3) * 2;
            *reinterpret_cast<float2*>(cs + row * CLD + col) = make_float2(acc[j * 4 + h * 2], acc[j * 4 + h * 2 + 1]);
        }
    for (int r = ct; r < WGK_BM; r += 256) {
        const int iz = oz0 + r / (TY * TX), iy = oy0 + (r / TX) % TY, ix = ox0 + r % TX;
        const bool in = iz < p.do_ && iy < p.ho && ix < p.wo;
        rb[r] = in ? (((i64)n * p.od + iz * p.up_d) * p.oh + iy * p.up_h) * p.ow + ix * p.up_w : -1;
    }
    for (int c = ct; c < BN; c += 256) bc[c] = bias && nb0 + c < p.cout ? bias[(nb0 + c) % p.ocout] : 0.f;
    // (The tile's voxels inside the grid: the rows with a base.)
    const int count = min(TZ, p.do_ - oz0) * min(TY, p.ho - oy0) * min(TX, p.wo - ox0);
    up_store_staged<WGK_BM, BN, 256, ST, true>(p, cs, rb, bc, bc + BN, ct, ct >> 5, lane, nb0, WGK_BM, count, y,
                                               slope, [] { stats_bar<1, 256>(); });
}

template <int BN, int STAGES, int TZ, int TY, int TX, int S, int CK, bool UP, bool ST>
__device__ __forceinline__ void conv_wgk(const ConvParams& p, const float* __restrict__ bias, half* __restrict__ y,
                                         const float* __restrict__ slope, const TmaMap* xmap, const TmaMap* wmap) {
    static_assert(TZ * TY * TX == WGK_BM, "a tile is 128 voxels");
    static_assert(BN == 64 || BN == 128 || BN == 256, "tile width");
    static_assert(S == 1 || S == 2, "stride 1 or 2");
    static_assert(CK == 64 || CK == 32, "a k-step's channels: one swizzle row");
    static_assert(!UP || (S == 1 && wgk_up_floats<BN>() * 4 <= STAGES * (WGK_BM + BN) * CK * 2),
                  "the fused classes' GEMM is of stride 1, its staged tile within the stages");
    constexpr unsigned ROW = CK * 2, A_BYTES = WGK_BM * ROW, STAGE = A_BYTES + BN * ROW;
    extern __shared__ __align__(1024) unsigned char dsm[];
    // The swizzle is of address bits: the stages start 1024-byte aligned (the host asks 1 KB more).
    const unsigned raw = (unsigned)__cvta_generic_to_shared(dsm);
    const unsigned pad = (1024 - (raw & 1023)) & 1023;
    unsigned char* sm = dsm + pad;
    const unsigned sbase = raw + pad;
    // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s).
    const unsigned bars = sbase + STAGES * STAGE;
    const int tid = threadIdx.x, wg = tid >> 7;

    const int ntx = (p.wo + TX - 1) / TX, nty = (p.ho + TY - 1) / TY, ntz = (p.do_ + TZ - 1) / TZ;
    int n, oz0, oy0, ox0;
    tile_origin<TZ, TY, TX>(blockIdx.x, ntx, nty, ntz, n, oz0, oy0, ox0);
    const int nb0 = blockIdx.y * BN;
    // The stride is the kernel's (the host picks a stride-2 kernel for stride 2 on every axis).
    if (p.sd != S || p.sh != S || p.sw != S) __trap();
    const int nk = p.kd * p.kh * p.kw * (p.cin / CK);

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), 8);  // the eight consumer warps
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        if (tid != 0) return;
        int c0 = 0, tap = 0, dz = 0, dy = 0, dx = 0;
        for (int kt = 0; kt < nk; kt++) {
            const int s = kt % STAGES;
            // Its last use (kt - STAGES) released by every consumer warp.
            if (kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) & 1) ^ 1);
            const unsigned full = bars + 8 * s;
            mbar_arrive_expect_tx(full, STAGE);
            unsigned char* st = sm + s * STAGE;
            tma_load5(st, xmap, c0, ox0 * S + dx * p.dw - p.pw, oy0 * S + dy * p.dh - p.ph,
                      oz0 * S + dz * p.dd - p.pd, n, full);
            tma_load2(st + A_BYTES, wmap, tap * p.cin + c0, nb0, full);
            if ((c0 += CK) == p.cin) {
                c0 = 0;
                tap++;
                if (++dx == p.kw) {
                    dx = 0;
                    if (++dy == p.kh) {
                        dy = 0;
                        dz++;
                    }
                }
            }
        }
        return;
    }

    // Consumer warpgroup cw: rows cw * 64 .. + 63 of the tile.
    const int cw = wg - 1, lane = tid & 31, warp = (tid >> 5) & 3;
    float acc[BN / 2];
#pragma unroll
    for (int q = 0; q < BN / 2; q++) acc[q] = 0.f;
    const unsigned a0 = sbase + cw * 64 * ROW, b0 = sbase + A_BYTES;
    for (int kt = 0; kt < nk; kt++) {
        const int s = kt % STAGES;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        wg_fence();
        const unsigned long long da = wg_desc_sw<ROW>(a0 + s * STAGE), db = wg_desc_sw<ROW>(b0 + s * STAGE);
#pragma unroll
        for (int k = 0; k < CK / 16; k++) Wg<BN>::mma(acc, da + 2 * k, db + 2 * k);
        wg_commit();
        wg_wait<1>();  // k-step kt - 1's wgmmas are done: its stage is free
        if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    wg_wait<0>();

    if constexpr (UP) {
        wgk_up_store<BN, TZ, TY, TX, ST>(p, acc, cw, warp, lane, tid - 128, n, oz0, oy0, ox0,
                                         reinterpret_cast<float*>(sm), y, bias, slope);
    } else {
        // Thread rows warp * 16 + lane / 4 (+ 8) of the warpgroup's 64.
        i64 m[2];
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = cw * 64 + warp * 16 + (lane >> 2) + h * 8;
            const int oz = oz0 + r / (TY * TX), oy = oy0 + (r / TX) % TY, ox = ox0 + r % TX;
            ok[h] = oz < p.do_ && oy < p.ho && ox < p.wo;
            m[h] = ((((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox) * p.ldc + p.coff;
        }
        BY_ACT(p.act, (wgk_store<ACT_T, BN, ST>(p, acc, m, ok, nb0, lane, y, bias, slope)));
        if constexpr (ST) {
            const float count = (float)(min(TZ, p.do_ - oz0) * min(TY, p.ho - oy0) * min(TX, p.wo - ox0));
            wgk_stats<BN>(p, acc, ok, nb0, lane, cw * 4 + warp, reinterpret_cast<float*>(sm), count);
        }
    }
}

// Name: conv_wgk_n{BN}_{variant}; one line per WGK_CONFIGS entry (`entry_lines`). The input's and
// the weights' tensor maps (encoded by the host for the launch) are the last parameters.
#define WGK_ENTRY(NAME, BN, STAGES, TZ, TY, TX, S, CK, UP, ST)                                             \
    extern "C" __global__ void __launch_bounds__(384, 1) NAME(                                           \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope,       \
        const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap) {                     \
        conv_wgk<BN, STAGES, TZ, TY, TX, S, CK, UP, ST>(p, bias, y, slope, &xmap, &wmap);                \
    }
