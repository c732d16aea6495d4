// conv_mma_*: the fast implicit GEMM (Ampere/Hopper): mma.sync.m16n8k16 fed by ldmatrix from
// padded shared memory, STAGES-deep cp.async pipeline, TBM x TBN block tile split over WM x WN warps,
// fp32 accumulators in registers, bias + activation epilogue stored straight from the
// accumulators as half2 (`conv_store`, kernels/mma.cuh). Non-transposed convs only (plus the kernel==stride transposed conv run
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


// VW: halves per A gather: 8 (Cin % 8 == 0, 16-byte cp.async), 2 (even Cin, 4-byte cp.async),
// 1 (element gathers by one thread per row).
// VEC_EPI (scatter epilogues: the upsampling GEMM and the fused parity classes): the epilogue
// stages the fp32 tile in shared memory, then writes each 8-channel chunk of a (voxel, tap) with
// one 16-byte store when Cout % 8 == 0, else each tap row's run of voxels x channels by a warp.
// ST (with VEC_EPI, the `convt_up_*_st` twins): the block also writes a following norm's
// statistics of its tile (tile_stats.cuh's entry layout, one entry per M tile: the host asks only
// where a sample's rows are whole tiles and every GEMM column is in this block, n0 == 0): one
// thread per column sums it over the tile's rows (less the channel's shift, the tile's first
// value: row 0, column block 0), then one thread per channel adds its column blocks in order.
template <int TBM, int TBN, int WM, int WN, int STAGES, int VW, bool VEC_EPI = false, bool ST = false>
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
    // Split-K (p.ksplit > 1, grid.z = the splits): this block's share [kt0, kt1) of the K tiles;
    // its fp32 partial sums go to p.ws and conv_splitk_reduce finishes the output.
    const int ks = p.ksplit > 1 ? p.ksplit : 1;
    const int kt0 = (int)((i64)nk * blockIdx.z / ks), kt1 = (int)((i64)nk * (blockIdx.z + 1) / ks);

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
        int k = kt0 * MBK + v * VW;
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
        if (kt0 + s < kt1) load_tile(s, kt0 + s);
        cp_async_commit();
    }
    for (int kt = kt0; kt < kt1; kt++) {
        const int st = kt - kt0;  // tiles are staged in the order this block loads them
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt landed for all threads; everyone is done with tile kt-1
        {
            int nt = kt + STAGES - 1;
            if (nt < kt1) load_tile((st + STAGES - 1) % STAGES, nt);
            cp_async_commit();
        }
        const half* as = sA + (st % STAGES) * A_ST + (wm * TM) * MLDS;
        const half* bs = sB + (st % STAGES) * B_ST + (wn * TN) * MLDS;
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

    if (ks > 1) {
        // Raw partial sums of split blockIdx.z into p.ws ([split][M][cout] fp32): no bias, no
        // activation, no scatter (the host splits plain convs only).
        float* ws = reinterpret_cast<float*>(p.ws) + (i64)blockIdx.z * M * p.cout;
        const bool two = (p.cout & 1) == 0;
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = m0 + wm * TM + i * 16 + (lane >> 2) + h * 8;
                if (m >= M) continue;
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    const int c = n0 + wn * TN + j * 8 + (lane & 3) * 2;
                    float* d = ws + (i64)m * p.cout + c;
                    if (two && c + 1 < p.cout) {
                        *reinterpret_cast<float2*>(d) = make_float2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
                    } else {
                        if (c < p.cout) d[0] = acc[i][j][h * 2];
                        if (c + 1 < p.cout) d[1] = acc[i][j][h * 2 + 1];
                    }
                }
            }
        return;
    }

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
        // The tile's rows share one output voxel base each (tap 0) and its columns one bias
        // each: both staged once, so the stores below divide by nothing of the grid.
        constexpr int CH = TBN / 8;
        static_assert(TBM * CLD * 4 + TBM * 8 + TBN * 4 + CH * 12 <= STAGES * (A_ST + B_ST) * 2,
                      "staged tile, row bases, biases and chunk offsets must fit");
        i64* rb = reinterpret_cast<i64*>(cs + TBM * CLD);
        float* bc = reinterpret_cast<float*>(rb + TBM);
        for (int r = tid; r < TBM; r += THREADS) {
            const int m = m0 + r;
            i64 o = -1;
            if (m < M) {
                int ix = m % p.wo, t = m / p.wo;
                int iy = t % p.ho;
                t /= p.ho;
                int iz = t % p.do_, n = t / p.do_;
                o = (((i64)n * p.od + iz * p.up_d) * p.oh + iy * p.up_h) * p.ow + ix * p.up_w;
            }
            rb[r] = o;
        }
        for (int c = tid; c < TBN; c += THREADS)
            bc[c] = bias && n0 + c < p.cout ? bias[(n0 + c) % p.ocout] : 0.f;
        if constexpr (ST)
            static_assert(TBM * CLD * 4 + TBM * 8 + TBN * 4 + TBN * 8 <= STAGES * (A_ST + B_ST) * 2,
                          "staged tile, row bases, biases and column sums must fit");
        const int rows = min(TBM, M - m0);
        up_store_staged<TBM, TBN, THREADS, ST, false>(p, cs, rb, bc, bc + TBN, tid, warp, lane, n0, rows, rows, y,
                                                      slope, [] { __syncthreads(); });
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

// The split-K conv's second launch: each (voxel, channel) sums its p.ksplit partials in split
// order (deterministic), then bias, activation and the store of conv_store. Grid-stride; the
// conv's argument list, so one ConvParams drives both launches.
extern "C" __global__ void conv_splitk_reduce(ConvParams p, const half* x, const half* w, const float* bias,
                                              half* y, const float* slope) {
    const i64 total = (i64)p.n * p.do_ * p.ho * p.wo * p.cout;
    const float* ws = reinterpret_cast<const float*>(p.ws);
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const i64 m = i / p.cout;
        const int c = (int)(i - m * p.cout);
        float v = 0.f;
        for (int z = 0; z < p.ksplit; z++) v += ws[z * total + i];
        if (bias) v += bias[c];
        out_store1(p, y, m * p.ldc + p.coff + c, act_apply(v, c, p.act, p.alpha, slope, p.slope_n));
    }
}

// Name: conv_mma_m{TBM}n{TBN}_{v8 | v2 | v1}. Instantiated once per MMA_CONFIGS line by
// `entry_lines` in src/backend/cuda/host/catalogue.rs (appended to this file before NVRTC).
#define MMA_ENTRY(NAME, TBM, TBN, WM, WN, ST, VW)                                                   \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_mma<TBM, TBN, WM, WN, ST, VW>(p, x, w, bias, y, slope);                                \
    }

// convt_up_m{TBM}n{TBN}_v8: the scatter GEMMs (conv_mma's scatter view, Cin % 8 == 0) with the
// staged epilogue: the kernel == stride transposed conv as the upsampling GEMM (Cout % 8 == 0),
// and the strided transposed conv's fused parity classes (any Cout).
// Same tiles and shared memory as conv_mma_m{TBM}n{TBN}_v8 (UPSAMPLE_VEC in the catalogue,
// which instantiates them).
#define UP_ENTRY(NAME, TBM, TBN, WM, WN, ST)                                                        \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_mma<TBM, TBN, WM, WN, ST, 8, true>(p, x, w, bias, y, slope);                           \
    }
// Their `_st` twins (the norm's statistics too; UPSAMPLE_VEC_ST in the catalogue).
#define UP_ST_ENTRY(NAME, TBM, TBN, WM, WN, ST)                                                     \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_mma<TBM, TBN, WM, WN, ST, 8, true, true>(p, x, w, bias, y, slope);                     \
    }


// convt_up2_p (`CudaOptions::convt_up2`): the kernel == stride == 2 transposed conv (the
// upsampling GEMM's weights and parameters: w row tap * ocout + co, K = Cin, kpad wide) for
// Cin = 16 KS (16, 32, 64) and Cout <= 32 (a multiple of 8), persistent. W1's 64 -> 32 at
// 64³ -> 128³ on `convt_up_m128n128_v8` moves ~1.25 TB/s (PERF_NOTES, session 38): each block
// loads its A tile, runs two k-steps, stages 64 KB of fp32 and stores, nothing overlapping. Here
// a block walks tiles of 64 consecutive input voxels with the next tile's copy in flight; warp
// w computes tap w's 64 x 32 outputs with the tap's weights in registers for the launch (loaded
// once), stages each 16-voxel row block as fp16 in its own rows and stores whole 16-byte
// pieces (a voxel's Cout halves are contiguous; element stores where the channel stride or
// offset is not a multiple of 8). Output voxel (2z + a, 2y + b, 2x + c) of input voxel (z, y, x)
// and tap (a, b, c); its offset less the tap's is computed once a tile per voxel. fp32 output
// (for a norm) goes out from the registers. No activation is a template case (no switch per
// value: a first version issued ~1,600 instructions a warp a tile at 9.4 cycles each, ncu).
// Now L2-bound (~80% of its throughput) at ~1.3 TB/s of DRAM traffic: 113 us a window against
// the GEMM's ~135 (PERF_NOTES, session 38).
#define UP2_TV 64   // input voxels a tile
#define UP2_SR 40   // staging row (halves): 8 rows x 4 lanes of half2 writes conflict-free
// The shared memory (the kernel's, sized for Cin 64): A rows of two tiles, each warp's staging
// rows, two tiles' voxel offsets.
struct Up2Smem {
    __align__(16) half a[2][UP2_TV * 72];
    __align__(16) half st[8][16 * UP2_SR];
    i64 ob[2][UP2_TV];
};
template <int KS, int ACT>
__device__ __forceinline__ void convt_up2(const ConvParams& p, const half* __restrict__ x, const half* __restrict__ w,
                                          const float* __restrict__ bias, half* __restrict__ y,
                                          const float* __restrict__ slope, Up2Smem& sm) {
    constexpr int CIN = KS * 16, AR = CIN + 8;  // A rows padded: ldmatrix's 8 rows in 8 bank groups
    static_assert(UP2_TV * AR <= UP2_TV * 72, "the A rows fit");
    auto& sa = sm.a;
    auto& ob = sm.ob;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, q = lane & 3, r0 = lane >> 2;
    const int cout = p.ocout, cpv = cout >> 3;  // output halves a voxel, 16-byte pieces
    const int a = warp >> 2, b = (warp >> 1) & 1, c = warp & 1;  // this warp's tap
    const bool vec = ((p.ldc | p.coff) & 7) == 0, f32 = p.out_f32 != 0;
    // B: tap w's weights (Cin x 32) for the launch.
    unsigned bf[KS][4][2];
    mma_b_rows(bf, w, (i64)warp * cout, p.kpad, cout, lane);
    float bj[4][2];  // the bias of the lane's output channels
    mma_bias_cols(bj, bias, cout, lane);
    const int M = p.n * p.do_ * p.ho * p.wo;  // input voxels (do_ .. wo: the input's, as the GEMM's)
    const int tiles = (M + UP2_TV - 1) / UP2_TV;
    const i64 tap = (((i64)a * p.oh + b) * p.ow + c) * p.ldc + p.coff;
    // Tile t's A rows into buffer k (zeros past M), and its voxels' output offsets (-1 past M).
    auto fetch = [&](int t, int k) {
        const int m0 = t * UP2_TV;
        for (int i = tid; i < UP2_TV * (CIN / 8); i += 256) {
            const int r = i / (CIN / 8), g = i % (CIN / 8);
            const bool ok = m0 + r < M;
            cp_async16(&sa[k][r * AR + g * 8], ok ? x + (i64)(m0 + r) * p.cin + g * 8 : x, ok ? 16 : 0);
        }
        if (tid < UP2_TV) {
            const int m = m0 + tid;
            i64 o = -1;
            if (m < M) {
                const int xx = m % p.wo, t1 = m / p.wo, yy = t1 % p.ho, t2 = t1 / p.ho, zz = t2 % p.do_, n = t2 / p.do_;
                o = ((((i64)n * p.od + 2 * zz) * p.oh + 2 * yy) * p.ow + 2 * xx) * p.ldc;
            }
            ob[k][tid] = o;
        }
    };
    int t = blockIdx.x;
    if (t < tiles) fetch(t, 0);
    cp_async_commit();
    half* sw = sm.st[warp];
    // The staged pieces this lane stores: voxel lane / 2 of the 16, pieces (lane & 1) * 2 + {0, 1}.
    const int sr = lane >> 1, g0 = (lane & 1) * 2;
    for (int i = 0; t < tiles; i++, t += gridDim.x) {
        const int k = i & 1;
        cp_async_wait<0>();
        __syncthreads();  // tile t landed (rows and offsets); every warp is done with buffer k ^ 1
        if (t + (int)gridDim.x < tiles) fetch(t + gridDim.x, k ^ 1);
        cp_async_commit();
#pragma unroll 1
        for (int mt = 0; mt < UP2_TV / 16; mt++) {
            float acc[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                unsigned af[4];
                ldsm_x4(af, &sa[k][(mt * 16 + (lane & 15)) * AR + s * 16 + (lane >> 4) * 8]);
#pragma unroll
                for (int j = 0; j < 4; j++) mma16816(acc[j], af, bf[s][j][0], bf[s][j][1]);
            }
            // acc[j]: rows r0 (0, 1) and r0 + 8 (2, 3), channels j * 8 + q * 2 + {0, 1}.
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[j][e] = act_of<ACT>(acc[j][e] + bj[j][e & 1], j * 8 + q * 2 + (e & 1), p.act, p.alpha, slope,
                                            p.slope_n);
            if (f32) {
                // fp32 (an output only norms read), straight from the registers.
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const i64 o = ob[k][mt * 16 + r0 + rr * 8];
                    if (o < 0) continue;
                    float* yo = reinterpret_cast<float*>(y) + o + tap;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int co = j * 8 + q * 2;
                        if (co >= cout) continue;
                        yo[co] = acc[j][rr * 2];
                        yo[co + 1] = acc[j][rr * 2 + 1];
                    }
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    *reinterpret_cast<__half2*>(&sw[(r0 + rr * 8) * UP2_SR + j * 8 + q * 2]) =
                        __floats2half2_rn(acc[j][rr * 2], acc[j][rr * 2 + 1]);
            __syncwarp();
            const i64 o = ob[k][mt * 16 + sr];
            if (o >= 0) {
                half* yo = y + o + tap;
#pragma unroll
                for (int gg = 0; gg < 2; gg++) {
                    const int g = g0 + gg;
                    if (g >= cpv) break;
                    const uint4 v = *reinterpret_cast<const uint4*>(&sw[sr * UP2_SR + g * 8]);
                    if (vec) {
                        *reinterpret_cast<uint4*>(yo + g * 8) = v;
                    } else {
                        const half* h = reinterpret_cast<const half*>(&v);
#pragma unroll
                        for (int e = 0; e < 8; e++) yo[g * 8 + e] = h[e];
                    }
                }
            }
            __syncwarp();
        }
    }
    cp_async_wait<0>();
}
template <int KS>
__device__ __forceinline__ void convt_up2_k(const ConvParams& p, const half* x, const half* w, const float* bias,
                                            half* y, const float* slope, Up2Smem& sm) {
    // (No activation: W1's; the others through act_apply's switch. Every case BY_ACT makes a
    // template of took registers the common one then spilled.)
    if (p.act == ACT_NONE) {
        convt_up2<KS, ACT_NONE>(p, x, w, bias, y, slope, sm);
    } else {
        convt_up2<KS, ACT_ANY>(p, x, w, bias, y, slope, sm);
    }
}
// (Three blocks an SM fit its 80 registers; the grid, `UP2_BLOCKS_PER_SM` in the catalogue,
// takes two: measured faster.)
extern "C" __global__ void __launch_bounds__(256, 3) convt_up2_p(ConvParams p, const half* x, const half* w,
                                                                const float* bias, half* y, const float* slope) {
    __shared__ Up2Smem sm;
    switch (p.cin) {
    case 16: return convt_up2_k<1>(p, x, w, bias, y, slope, sm);
    case 32: return convt_up2_k<2>(p, x, w, bias, y, slope, sm);
    case 64: return convt_up2_k<4>(p, x, w, bias, y, slope, sm);
    default: __trap();
    }
}
