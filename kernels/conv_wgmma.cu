// Stride-1 3x3x3 convs on Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a only: the catalogue
// compiles this family for sm_90a and loads it on compute capability 9.0 alone). The same
// problem and weight layout as kernels/conv_halo.cu (weights [Cout_pad][kpad], K = tap * Cin +
// ci; an even real Cin below the width zero-padded; Cin = k x CIN in chunks), but the tensor
// cores read both operands straight from shared memory, asynchronously, so the 27 taps need no
// ldmatrix and (resident weights) no barrier between them.
//
// Shared memory holds 16-byte "core matrix" rows without swizzle (wgmma's interleaved layout):
//   halo  [CIN/8][HV][8]: channel group g of halo voxel v at (g * HV + v) * 16 bytes, so the 8
//         output voxels of one x-row through any tap are 8 consecutive 16-byte rows;
//   weights [tap][CIN/8][BN][8]: channel group g of output channel n at ((tap * CIN/8 + g) *
//         BN + n) * 16 bytes.
// One wgmma m64nBNk16 takes one z-plane of the 8x8-voxel output face (64 rows: y-rows of 8
// voxels HX halo rows apart, so the A descriptor's M step is HX * 16 bytes and its K step
// HV * 16) against one tap's 16 input channels (B's N step 128 bytes, K step BN * 16).
// Stride 2 (S, `conv_wg_*_s2`): the tile's reach is (T - 1) * 2 + 3 voxels per axis, stored by
// parity class ("phase") of its (z, y, x): each phase a dense box [z / 2][y / 2][x / 2], the
// phases in (pz, py, px) order. Tap (dz, dy, dx) of the outputs (z, y, x) reads phase (dz & 1,
// dy & 1, dx & 1) at (z + dz / 2, y + dy / 2, x + dx / 2), so an x-row's 8 outputs are again 8
// consecutive rows and the M step one row of that phase (9 or 8 rows: the descriptor's M step
// is set per tap).
// A tile is TZ planes; one warpgroup (128 threads) owns all of them (TZ accumulators of
// BN / 2 floats per thread, independent chains in flight). Kernels: `conv_wg` (one tile per
// block, resident or staged weights) and `conv_wg_p` (persistent, two warpgroups).
// Smem bytes: keep in sync with HaloConfig::smem_bytes (src/backend/cuda/host/catalogue.rs).

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/conv_wgmma.cu needs sm_90a (wgmma)"
#endif

// The pieces every conv_wg kernel shares: one tile's geometry (output origin, batch index),
// its halo and weight copies into the layouts above, one tap's wgmmas, and the epilogue. NT
// threads (one or two warpgroups) share the copies; `tid` counts from 0 within them.
template <int CIN, int BN, int TZ, int PAD, int S = 1>
struct WgConv {
    static_assert(S == 1 || (S == 2 && !PAD), "stride 1, or 2 without the bank padding");
    static constexpr int TY = 8, TX = 8;
    static constexpr int HZ = (TZ - 1) * S + 3, HY = (TY - 1) * S + 3, HX = (TX - 1) * S + 3, HP = HY * HX;
    static constexpr int HV = HZ * HP;  // halo voxels
    // PAD: the K step of both operands made an odd multiple of 64 bytes (measured against none).
    static constexpr int HVS = PAD ? HV + ((4 - HV % 8) + 8) % 8 : HV;  // halo rows per channel group
    static constexpr int BNS = PAD ? BN + 4 : BN;                       // weight rows per channel group
    static constexpr int CPV = CIN / 8;  // 16-byte channel groups per voxel
    static constexpr int KS = CIN / 16;  // k16 steps per tap
    static constexpr int NA = BN / 2;    // accumulators per plane per thread
    static constexpr int HALO = CPV * HVS * 8, STAGE = CPV * BNS * 8;  // halves
    static_assert(CIN % 16 == 0 && (BN == 16 || BN == 32 || BN == 64), "tile shape");

    // Extent of phase p (0 even, 1 odd) of a halo axis of h voxels (the axis itself at stride 1).
    static __device__ __forceinline__ constexpr int ext(int h, int ph) { return S == 1 ? h : (h + 1 - ph) / 2; }
    // First row of phase (pz, py, px): the phases before it, in (pz, py, px) order.
    static __device__ __forceinline__ constexpr int phase_off(int pz, int py, int px) {
        return pz * ext(HZ, 0) * HP + py * ext(HZ, pz) * ext(HY, 0) * HX + px * ext(HZ, pz) * ext(HY, py) * ext(HX, 0);
    }
    // The row of halo voxel (z, y, x) (relative to the tile's reach).
    static __device__ __forceinline__ int row_of(int z, int y, int x) {
        if constexpr (S == 1) return (z * HY + y) * HX + x;
        const int py = y & 1, px = x & 1;
        return phase_off(z & 1, py, px) + ((z >> 1) * ext(HY, py) + (y >> 1)) * ext(HX, px) + (x >> 1);
    }

    const ConvParams& p;
    const half* x;
    const half* w;
    int ntx, nty, ntz, ntiles, nb0;
    bool narrow;  // real Cin zero-padded to CIN: 4-byte copies

    __device__ __forceinline__ WgConv(const ConvParams& p_, const half* x_, const half* w_)
        : p(p_), x(x_), w(w_) {
        ntx = (p.wo + TX - 1) / TX, nty = (p.ho + TY - 1) / TY, ntz = (p.do_ + TZ - 1) / TZ;
        ntiles = p.n * ntz * nty * ntx;
        nb0 = blockIdx.y * BN;
        narrow = p.cin < CIN;
        // The stride is the kernel's (the host picks a stride-2 kernel for stride 2 on every axis).
        if constexpr (S != 1)
            if (p.sd != S || p.sh != S || p.sw != S) __trap();
    }

    __device__ __forceinline__ void decode(int t, int& n, int& oz0, int& oy0, int& ox0) const {
        tile_origin<TZ, TY, TX>(t, ntx, nty, ntz, n, oz0, oy0, ox0);
    }

    // Tile t's halo of channels c0..c0+CIN into `buf`, zero outside the input (source size 0):
    // 16-byte groups, or (narrow) 4-byte channel pairs, channels past p.cin zero.
    template <int NT>
    __device__ __forceinline__ void load_halo(half* buf, int t, int c0, int tid) const {
        if (narrow)
            halo_pieces<NT, 2>(buf, t, c0, tid);
        else
            halo_pieces<NT, 8>(buf, t, c0, tid);
    }
    // A voxel's CIN / U pieces are copied by consecutive threads, so a thread's piece is fixed
    // and its voxels walk NT / (CIN / U) apart (`BoxWalk`).
    template <int NT, int U>
    __device__ __forceinline__ void halo_pieces(half* buf, int t, int c0, int tid) const {
        constexpr int PV = CIN / U;
        static_assert(NT % PV == 0, "a thread's piece is fixed");
        int n, oz0, oy0, ox0;
        decode(t, n, oz0, oy0, ox0);
        const int iz0 = oz0 * S - p.pd, iy0 = oy0 * S - p.ph, ix0 = ox0 * S - p.pw;
        const int c = (tid % PV) * U;
        const i64 ex = p.cin, ey = (i64)p.wi * p.cin, ez = (i64)p.hi * ey;
        // The box origin's element offset (negative at a low border: never read there).
        const i64 o0 = (i64)n * p.di * ez + iz0 * ez + iy0 * ey + ix0 * ex + c0 + c;
        const bool cok = U == 8 || c < p.cin;
        half* dst = buf + (c >> 3) * HVS * 8 + (c & 7);
        BoxWalk<HY, HX, NT / PV> b(tid / PV, ex, ey, ez);
        for (int v = tid / PV; v < HV; v += NT / PV, b.step())
            cp_async_piece<U>(dst + (S == 1 ? v : row_of(b.z, b.y, b.x)) * 8, x + (o0 + b.off), x,
                              cok && b.inside(iz0, iy0, ix0, p.di, p.hi, p.wi));
    }

    // `nt` taps from tap0 of channels c0..c0+CIN into consecutive stages from `ws` (rows of
    // output channels past Cout zero), in pieces as the halo's.
    template <int NT>
    __device__ __forceinline__ void load_w(half* ws, int tap0, int nt, int c0, int tid) const {
        if (narrow)
            w_pieces<NT, 2>(ws, tap0, nt, c0, tid);
        else
            w_pieces<NT, 8>(ws, tap0, nt, c0, tid);
    }
    // The rows (tap, output channel) walk as the halo's voxels do.
    template <int NT, int U>
    __device__ __forceinline__ void w_pieces(half* ws, int tap0, int nt, int c0, int tid) const {
        constexpr int PV = CIN / U;
        static_assert(NT % PV == 0, "a thread's piece is fixed");
        const int c = (tid % PV) * U;
        const half* w0 = w + (i64)nb0 * p.kpad + tap0 * p.cin + c0 + c;
        const bool cok = U == 8 || c < p.cin;
        half* dst = ws + (c >> 3) * BNS * 8 + (c & 7);
        for (BoxWalk<1, BN, NT / PV> b(tid / PV, p.kpad, p.cin, p.cin); b.z < nt; b.step())
            cp_async_piece<U>(dst + (b.z * CPV * BNS + b.x) * 8, w0 + b.off, w, cok && nb0 + b.x < p.cout);
    }

    // Descriptors of the halo at `in` and of the weight stage 0 at `ws`.
    static __device__ __forceinline__ unsigned long long desc_a(const half* in) {
        return wg_desc((unsigned)__cvta_generic_to_shared(in), HVS * 16, HX * 16);
    }
    static __device__ __forceinline__ unsigned long long desc_b(const half* ws) {
        return wg_desc((unsigned)__cvta_generic_to_shared(ws), BNS * 16, 128);
    }

    // One tap's wgmmas: the halo of descriptor da0 against weight stage `st` (from db0).
    static __device__ __forceinline__ void issue_tap(float (&acc)[TZ][NA], unsigned long long da0,
                                                     unsigned long long db0, int tap, int st) {
        const int dz = tap / 9, dy = (tap / 3) % 3, dx = tap % 3;
        // The halo row of output (0, 0, 0) through the tap, and the rows between output planes.
        int toff = (dz * HY + dy) * HX + dx, plane = HP;
        if constexpr (S == 2) {
            const int py = dy & 1, px = dx & 1, ny = ext(HY, py), nx = ext(HX, px);
            toff = phase_off(dz & 1, py, px) + ((dz >> 1) * ny + (dy >> 1)) * nx + (dx >> 1);
            plane = ny * nx;
            da0 = wg_desc_of((unsigned)da0, wg_desc_hi(nx * 16));  // M step: one row of the phase
        }
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const unsigned long long db = db0 + (unsigned long long)((st * CPV + 2 * ks) * BNS);
#pragma unroll
            for (int z = 0; z < TZ; z++) {
                const unsigned long long da = da0 + (unsigned long long)(2 * ks * HVS + z * plane + toff);
                Wg<BN>::mma(acc[z], da, db);
            }
        }
    }

    static __device__ __forceinline__ void zero(float (&acc)[TZ][NA]) {
#pragma unroll
        for (int z = 0; z < TZ; z++)
#pragma unroll
            for (int q = 0; q < NA; q++) acc[z][q] = 0.f;
    }

    // Bias and activation over the accumulators in place, the activation fixed (BY_ACT): a switch
    // per value is an indirect branch each. Columns past Cout are left as they are.
    template <int ACT>
    __device__ __forceinline__ void bias_act(float (&acc)[TZ][NA], const float (&b0)[BN / 8],
                                             const float (&b1)[BN / 8], int lane,
                                             const float* __restrict__ slope) const {
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int c = nb0 + j * 8 + (lane & 3) * 2;
            const bool ok0 = c < p.cout, ok1 = c + 1 < p.cout;
#pragma unroll
            for (int z = 0; z < TZ; z++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float& v0 = acc[z][j * 4 + h * 2];
                    float& v1 = acc[z][j * 4 + h * 2 + 1];
                    if (ok0) v0 = act_of<ACT>(v0 + b0[j], c, p.act, p.alpha, slope, p.slope_n);
                    if (ok1) v1 = act_of<ACT>(v1 + b1[j], c + 1, p.act, p.alpha, slope, p.slope_n);
                }
        }
    }

    // Bias, activation (or residual) and fp16 / fp32 pairs straight from the accumulators of tile t. The
    // warpgroup thread `wtid` holds rows (wtid / 32) * 16 + lane / 4 (+ 8) of each plane and
    // columns j * 8 + (lane % 4) * 2.
    __device__ __forceinline__ void store(float (&acc)[TZ][NA], int t, int wtid, half* __restrict__ y,
                                          const float* __restrict__ bias, const float* __restrict__ slope) const {
        const int lane = wtid & 31, warp = wtid >> 5;
        int n, oz0, oy0, ox0;
        decode(t, n, oz0, oy0, ox0);
        const bool pair = ((p.ldc | p.coff) & 1) == 0;
        // A fused residual Add (`ConvParams::res`: no activation, y dense, same index).
        const half* __restrict__ res = reinterpret_cast<const half*>(p.res);
        float b0[BN / 8], b1[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int c = nb0 + j * 8 + (lane & 3) * 2;
            b0[j] = bias && c < p.cout ? bias[c] : 0.f;
            b1[j] = bias && c + 1 < p.cout ? bias[c + 1] : 0.f;
        }
        BY_ACT(p.act, bias_act<ACT_T>(acc, b0, b1, lane, slope));
#pragma unroll
        for (int z = 0; z < TZ; z++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = warp * 16 + (lane >> 2) + h * 8;
                const int oz = oz0 + z, oy = oy0 + (r >> 3), ox = ox0 + (r & 7);
                if (oz >= p.do_ || oy >= p.ho || ox >= p.wo) continue;
                const i64 m = (((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    const int c = nb0 + j * 8 + (lane & 3) * 2;
                    if (c >= p.cout) continue;
                    const i64 dst = m * p.ldc + p.coff + c;
                    float v0 = acc[z][j * 4 + h * 2];
                    if (c + 1 >= p.cout) {
                        if (res) v0 += __half2float(res[dst]);
                        out_store1(p, y, dst, v0);
                        continue;
                    }
                    float v1 = acc[z][j * 4 + h * 2 + 1];
                    if (pair) {
                        if (res) {
                            const float2 r2 = __half22float2(*reinterpret_cast<const __half2*>(res + dst));
                            v0 += r2.x;
                            v1 += r2.y;
                        }
                        out_store2(p, y, dst, v0, v1);
                    } else {
                        if (res) {
                            v0 += __half2float(res[dst]);
                            v1 += __half2float(res[dst + 1]);
                        }
                        out_store1(p, y, dst, v0);
                        out_store1(p, y, dst + 1, v1);
                    }
                }
            }
        }
    }
};

// One tile per block (blockIdx.x), one warpgroup.
//   WST == 0: all 27 taps' weights resident (Cin <= CIN: one chunk), loaded with the halo;
//             the 27 x CIN/16 x TZ wgmmas issue back to back.
//   WST >= 3: a ring of WST one-tap weight stages, WST - 2 taps loaded ahead; per tap one
//             barrier, with the previous tap's wgmmas still running across it.
template <int CIN, int BN, int TZ, int WST, int PAD, int REPS, int S>
__device__ __forceinline__ void conv_wg(const ConvParams& p, const half* __restrict__ x, const half* __restrict__ w,
                                       const float* __restrict__ bias, half* __restrict__ y,
                                       const float* __restrict__ slope) {
    using C = WgConv<CIN, BN, TZ, PAD, S>;
    constexpr bool RES = WST == 0;
    static_assert(RES || WST >= 3, "staged weights: >= 3 stages");
    extern __shared__ __align__(128) unsigned char dsm[];
    half* sW = reinterpret_cast<half*>(dsm);
    half* sIn = sW + (RES ? 27 : WST) * C::STAGE;
    const C c(p, x, w);
    const int tid = threadIdx.x, t = blockIdx.x;
    float acc[TZ][C::NA];
    C::zero(acc);
    const unsigned long long da0 = C::desc_a(sIn), db0 = C::desc_b(sW);
    if constexpr (RES) {
        c.template load_halo<128>(sIn, t, 0, tid);
        c.template load_w<128>(sW, 0, 27, 0, tid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
        wg_fence();
        for (int rep = 0; rep < REPS; rep++)  // REPS > 1: timing experiments only (wrong sums)
            for (int tap = 0; tap < 27; tap++) C::issue_tap(acc, da0, db0, tap, tap);
        wg_commit();
        wg_wait<0>();
    } else {
        for (int c0 = 0; c0 < p.cin; c0 += CIN) {
            if (c0 > 0) __syncthreads();  // every warp is done with the previous chunk (below)
            c.template load_halo<128>(sIn, t, c0, tid);
#pragma unroll
            for (int s = 0; s < WST - 2; s++) {  // taps 0..WST-3 (the halo rides in the first group)
                c.template load_w<128>(sW + s * C::STAGE, s, 1, c0, tid);
                cp_async_commit();
            }
            for (int tap = 0; tap < 27; tap++) {
                cp_async_wait<WST - 3>();
                fence_async_smem();
                // Tap's weights landed everywhere; every warp passed tap - 1's wait, so tap - 2's
                // wgmmas are done and its stage takes tap + WST - 2.
                __syncthreads();
                if (tap + WST - 2 < 27)
                    c.template load_w<128>(sW + ((tap + WST - 2) % WST) * C::STAGE, tap + WST - 2, 1, c0, tid);
                cp_async_commit();
                wg_fence();
#pragma unroll
                for (int rep = 0; rep < REPS; rep++) C::issue_tap(acc, da0, db0, tap, tap % WST);
                wg_commit();
                wg_wait<1>();
            }
            wg_wait<0>();  // the chunk's wgmmas are done with its halo and stages
        }
    }
    c.store(acc, t, tid, y, bias, slope);
}

// Persistent, resident weights (Cin <= CIN), two warpgroups per block that each loop over their
// own tiles (t = blockIdx.x + wg * gridDim.x, step 2 * gridDim.x) with HB halo buffers of their
// own. HB 2: the next tile's halo is copied while the current one's wgmmas and epilogue run;
// HB 1 (where two buffers do not fit beside the weights, `conv_wg_c32n64_s2p`): it is copied
// during the current one's epilogue. Either way one warpgroup's copies and epilogue overlap the
// other's wgmmas. The weights are loaded once per block.
template <int CIN, int BN, int TZ, int PAD, int S, int HB>
__device__ __forceinline__ void conv_wg_p(const ConvParams& p, const half* __restrict__ x,
                                         const half* __restrict__ w, const float* __restrict__ bias,
                                         half* __restrict__ y, const float* __restrict__ slope) {
    static_assert(HB == 1 || HB == 2, "one or two halo buffers a warpgroup");
    using C = WgConv<CIN, BN, TZ, PAD, S>;
    extern __shared__ __align__(128) unsigned char dsm[];
    half* sW = reinterpret_cast<half*>(dsm);
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
    half* sIn = sW + 27 * C::STAGE + wg * HB * C::HALO;  // this warpgroup's halo buffers
    const C c(p, x, w);
    const int step = 2 * gridDim.x;
    int t = blockIdx.x + wg * gridDim.x;
    c.template load_w<256>(sW, 0, 27, 0, tid);
    if (t < c.ntiles) c.template load_halo<128>(sIn, t, 0, wtid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();  // the weights (copied by both warpgroups) and the first halos landed
    const unsigned long long db0 = C::desc_b(sW);
    float acc[TZ][C::NA];
    for (int buf = 0; t < c.ntiles; t += step, buf ^= HB - 1) {
        if constexpr (HB == 2) {
            // The next tile's halo into the other buffer (its last reader, tile t - step, is done).
            if (t + step < c.ntiles) c.template load_halo<128>(sIn + (buf ^ 1) * C::HALO, t + step, 0, wtid);
            cp_async_commit();
            cp_async_wait<1>();
            fence_async_smem();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");  // tile t's halo landed (warpgroup)
        }
        C::zero(acc);
        wg_fence();
        const unsigned long long da0 = C::desc_a(sIn + buf * C::HALO);
        for (int tap = 0; tap < 27; tap++) C::issue_tap(acc, da0, db0, tap, tap);
        wg_commit();
        wg_wait<0>();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");  // every warp is done with buf
        if constexpr (HB == 1) {
            if (t + step < c.ntiles) c.template load_halo<128>(sIn, t + step, 0, wtid);
            cp_async_commit();
        }
        c.store(acc, t, wtid, y, bias, slope);
        if constexpr (HB == 1) {
            cp_async_wait<0>();
            fence_async_smem();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");  // tile t + step's halo landed
        }
    }
    cp_async_wait<0>();
}

// Name: conv_wg_c{CIN}n{BN}_{variant}; one line per WGMMA_CONFIGS entry (`entry_lines`).
#define WG_ENTRY(NAME, CIN, BN, TZ, WST, PAD, REPS, S)                                              \
    extern "C" __global__ void __launch_bounds__(128) NAME(ConvParams p, const half* x, const half* w, \
                                                         const float* bias, half* y, const float* slope) { \
        conv_wg<CIN, BN, TZ, WST, PAD, REPS, S>(p, x, w, bias, y, slope);                          \
    }
#define WGP_ENTRY(NAME, CIN, BN, TZ, PAD, S, HB)                                                    \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(ConvParams p, const half* x, const half* w, \
                                                            const float* bias, half* y, const float* slope) { \
        conv_wg_p<CIN, BN, TZ, PAD, S, HB>(p, x, w, bias, y, slope);                               \
    }
