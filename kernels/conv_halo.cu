// Stride-1 3x3x3 convs from an input halo in shared memory: `conv_halo` (4x8x8 tile, two weight
// stages, one halo buffer, one block per tile, vector epilogue) and the `conv_halo_t` template
// (tile, weight staging, halo buffers, persistence and the stride, 1 or 2, as parameters). conv_halo is not written as
// a conv_halo_t config: as conv_halo_t<CIN, BN, WM, WN, 4, 8, 8, 2, 1> under the same launch
// bounds ptxas (sm_90, NVRTC 13.0) spills 216 / 240 bytes instead of 92 / 100 on the c32n32_w4 /
// c64n64 defaults (0 -> 96 on c16n16), and the template has no vector epilogue.
//
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
// of sample xn, CIN channels per row of LD halves; zero outside the input. S == 2 (stride-2
// convs) stores each x-row's even voxels first, then its odd ones (`halo_x`), so the 8 A rows
// of an ldmatrix (8 outputs along x, 2 input voxels apart) are 8 consecutive rows, as at S 1.
template <int S, int HX>
__device__ __forceinline__ int halo_x(int hx) {
    return S == 1 ? hx : (hx & 1) ? (HX + 1) / 2 + (hx >> 1) : hx >> 1;
}
template <int U, int CIN, int LD, int HZ, int HY, int HX, int THREADS, int S = 1>
__device__ __forceinline__ void halo_copy(half* buf, const half* xn, const half* x, const ConvParams& p,
                                          int iz0, int iy0, int ix0, int tid, int c0, int lo, int hi) {
    constexpr int UPV = CIN / U;  // copies per row
    // A thread's piece of a row is fixed; its rows walk THREADS / UPV apart (`BoxWalk`), one
    // copy an iteration: unrolled, the walk's registers spilled under the 128-register caps.
    static_assert(THREADS % UPV == 0, "a thread's piece of a row is fixed");
    hi = min(hi, HZ * HY * HX * UPV);
    const int i0 = lo + tid, c = (i0 % UPV) * U;
    const i64 ex = p.cin, ey = (i64)p.wi * p.cin, ez = (i64)p.hi * ey;
    const i64 o0 = iz0 * ez + iy0 * ey + ix0 * ex + c0 + c;  // the box origin (never read outside)
    const bool cok = U == 8 || c < p.cin;
    BoxWalk<HY, HX, THREADS / UPV> b(i0 / UPV, ex, ey, ez);
#pragma unroll 1
    for (int idx = i0, v = i0 / UPV; idx < hi; idx += THREADS, v += THREADS / UPV, b.step())
        cp_async_piece<U>(buf + (v - b.x + halo_x<S, HX>(b.x)) * LD + c, xn + (o0 + b.off), x,
                          cok && b.inside(iz0, iy0, ix0, p.di, p.hi, p.wi));
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
        cp_async_piece<U>(ws + co * WLD + t * CIN + c, src, w, U == 8 || c < p.cin);
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
// Min blocks per SM: 2 (6 or 8 warps) / 4 (4 warps) caps the registers at 128+ (ptxas via NVRTC: no
// spills); without it the chunk loop, the padded-Cin copies and the vector epilogue took them to
// 151-206 and c64n32 / c64n64 down to 1 block per SM (measured 28% / 20% slower).
#define HALO_ENTRY(NAME, CIN, BN, WM, WN)                                                           \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, WM * WN >= 6 ? 2 : 4) NAME(         \
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
//   S == 2: stride 2 on every axis. The halo is the tile's reach, (T - 1) * 2 + 3 input voxels per
//           axis, each read from global memory once where the implicit GEMM (conv_mma) gathers
//           every input voxel for each of the ~3.4 outputs whose taps reach it; x-rows stored
//           even voxels first (`halo_x`).
// Smem layout: weights first (BN * 27 * CIN + 8 resident, else WST * BN * (CIN + 8) halves),
// then HB halo buffers of (TZ+2)(TY+2)(TX+2) rows of CIN + 8 halves. Keep in sync with
// HaloConfig::smem_bytes (src/backend/cuda/host/catalogue.rs) and its emulation in
// tests/it/cuda/kernels_compile.rs.
template <int CIN, int BN, int WM, int WN, int TZ, int TY, int TX, int WST, int HB, int S>
__device__ __forceinline__ void conv_halo_t(const ConvParams& p, const half* __restrict__ x,
                                            const half* __restrict__ w, const float* __restrict__ bias,
                                            half* __restrict__ y, const float* __restrict__ slope) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int TBM = TZ * TY * TX;
    constexpr int TM = TBM / WM, TN = BN / WN;
    constexpr int MI = TM / 16, NI = TN / 8;
    constexpr int LD = CIN + 8;
    constexpr int CPV = CIN / 8;  // 16-byte chunks per voxel
    // The tile's reach in the input: (T - 1) * S + 3 voxels per axis.
    constexpr int HZ = (TZ - 1) * S + 3, HY = (TY - 1) * S + 3, HX = (TX - 1) * S + 3;
    constexpr int HV = HZ * HY * HX;  // halo rows
    static_assert(S == 1 || S == 2, "stride 1 or 2");
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
        tile_origin<TZ, TY, TX>(t, ntx, nty, ntz, n, oz0, oy0, ox0);
    };
    const bool narrow = p.cin < CIN;  // real Cin zero-padded to CIN: 4-byte copies
    // Tile t's input halo of channels c0..c0+CIN into `buf`, zero outside the input (source
    // size 0): 16-byte pieces lo..hi of the HV * CPV (narrow: the same rows in 4-byte copies).
    auto load_halo = [&](half* buf, int t, int c0, int lo, int hi) {
        int n, oz0, oy0, ox0;
        decode(t, n, oz0, oy0, ox0);
        const int iz0 = oz0 * S - p.pd, iy0 = oy0 * S - p.ph, ix0 = ox0 * S - p.pw;
        const half* xn = x + (i64)n * p.di * p.hi * p.wi * p.cin;
        if (narrow)
            halo_copy<2, CIN, LD, HZ, HY, HX, THREADS, S>(buf, xn, x, p, iz0, iy0, ix0, tid, 0, lo * 4, hi * 4);
        else
            halo_copy<8, CIN, LD, HZ, HY, HX, THREADS, S>(buf, xn, x, p, iz0, iy0, ix0, tid, c0, lo, hi);
    };
    // Halo row offset of tap (dz, dy, dx) (S 2: dx 1 is in the odd half of the x-row).
    auto tap_off = [](int dz, int dy, int dx) {
        return (dz * HY + dy) * HX + (S == 1 ? dx : dx == 1 ? (HX + 1) / 2 : dx >> 1);
    };
    // Staged: tap `tap`'s BN x CIN weights of channels c0.. into stage `stage` (K = tap * Cin + ci).
    auto load_w = [&](int stage, int tap, int c0) {
        half* ws = sW + stage * BN * LD;  // staged mode only
        if (narrow)
            halo_wcopy<2, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
        else
            halo_wcopy<8, CIN, BN, 1, LD, THREADS>(ws, w, p, tap, tid, c0, nb0);
    };

    // Halo row of each A row this lane addresses for ldmatrix (tap 0; S 2: x in the even half).
    int hrow[MI];
#pragma unroll
    for (int i = 0; i < MI; i++) {
        int r = wm * TM + i * 16 + (lane & 15);
        int z = r / (TY * TX), yy = (r / TX) % TY, xx = r % TX;
        hrow[i] = (z * S * HY + yy * S) * HX + xx;
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
                        const int toff = tap_off(dz, dy, dx);
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
                const int toff = tap_off(tap / 9, (tap / 3) % 3, tap % 3);
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
// instantiated per other HALO_CONFIGS line by the catalogue's `entry_lines` (S: the stride).
#define HALO2_ENTRY(NAME, CIN, BN, WM, WN, TZ, TY, TX, WST, HB, S)                                  \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32) NAME(                               \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope) { \
        conv_halo_t<CIN, BN, WM, WN, TZ, TY, TX, WST, HB, S>(p, x, w, bias, y, slope);              \
    }
