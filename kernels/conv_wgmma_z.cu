// Stride-1 3x3x3 convs on wgmma with the roles of kernels/conv_wgmma.cu swapped: the weights are
// the A operand and the input halo the B operand, so N is voxels (8 x NY of one output plane,
// up to 128 per wgmma) instead of Cout. M = 64 rows = 32 output channels x 2 output z-planes:
// rows s * 32 + co hold plane z + s. Input plane z + u (u = 0..3 around the pair) meets plane z
// through kernel tap u and plane z + 1 through tap u - 1, so one wgmma per (u, dy, dx, k16)
// serves both planes when the weight rows of tap u and tap u - 1 are consecutive in shared
// memory: the taps are stored as five blocks b = 3 - kz (kz = 3 and -1 being zero), and A's
// descriptor starts at block 3 - u. 4 / 3 of the MMA work is useful (the two outer planes
// meet one output plane each); in exchange each wgmma reads 2 KB of A and 4 KB of B per 262
// kFLOP, half the shared-memory bytes per FLOP of conv_wg's m64n32 (3 KB per 65.5 kFLOP).
//
// A persistent block (one per SM: one warpgroup, or the MMA warpgroup and a helper of one or two,
// `wz_run_h`) keeps the 27 taps resident and walks its tiles (ZT x NY x 8 output voxels) along z
// a plane pair at a time. Input planes come in pairs
// (slot k of a tile: input planes 2k, 2k + 1 of its halo) through a ring of R slots, copied two
// steps ahead with cp.async while the current step's wgmmas and epilogue run. The epilogue stages
// one output plane's fp32 values in shared memory ([voxel][co], 36-float rows: the fragment
// writes are conflict-free) and stores 8-channel pieces.
// Shared layouts (16-byte core rows, no swizzle, as conv_wgmma.cu):
//   weights [dy dx][Cin/8][block 5][co 32][8]   A: K step 5 * 512 bytes, M step 128
//   slot    [Cin/8][plane 2][HY * HX][8]        B: K step 2 * HP * 16, N step HX * 16
// then the staging rows and R + 1 mbarriers (the slots' and the weights': `wz_run_h`).
// Smem bytes: keep in sync with HaloConfig::smem_bytes (src/backend/cuda/host/catalogue.rs).

// Where the block's tile ti starts (`tile_origin`), kept while the tile lasts: the origin
// divides by runtime tile counts, which every step repeated before (a tile has H steps).
struct WzTile {
    int ti = -1, n = 0, oz0 = 0, oy0 = 0, ox0 = 0;
};

// `put`'s hand-back of the staging rows where the caller does it after `put` (no early release).
struct WzNoRelease {
    __device__ __forceinline__ void operator()() const {}
};

// The 8 fp32 values of output y at dst (channels c.. of the piece; those past Cout, and every
// value where dst < 0, read as 0): what earlier launches wrote where this one accumulates.
__device__ __forceinline__ void prev8(const ConvParams& p, const half* y, i64 dst, bool vec, int c, float (&u)[8]) {
#pragma unroll
    for (int q = 0; q < 8; q++) u[q] = 0.f;
    if (dst < 0) return;
    const float* prev = reinterpret_cast<const float*>(y) + dst;
    if (vec) {
        const float4 a = reinterpret_cast<const float4*>(prev)[0], b = reinterpret_cast<const float4*>(prev)[1];
        u[0] = a.x; u[1] = a.y; u[2] = a.z; u[3] = a.w;
        u[4] = b.x; u[5] = b.y; u[6] = b.z; u[7] = b.w;
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++)
            if (c + q < p.cout) u[q] = prev[q];
    }
}

template <int CIN, int NY, int ZT>
struct WzConv {
    static constexpr int CPV = CIN / 8, KS = CIN / 16;
    static constexpr int TX = 8, HX = TX + 2, HY = NY + 2, HP = HY * HX;
    static constexpr int N = TX * NY;  // output voxels of one plane = wgmma N
    static constexpr int NA = N / 2;   // accumulators per thread
    static constexpr int H = ZT / 2;   // steps (plane pairs) per tile
    static constexpr int R = 5;        // ring slots: steps s, s + 1, s + 2 with one tile change
    static constexpr int BLK = 32 * 8;                 // halves of one weight block
    static constexpr int WH = (9 * CPV * 4 + 1) * BLK; // halves of the weights
    static constexpr int SLOT = CPV * 2 * HP * 8;      // halves of one slot
    static constexpr int SP = 36;                      // staging row (floats)
    static constexpr int ST_BYTES = 2 * N * SP * 4;    // staging rows
    static constexpr unsigned SMEM = (WH + R * SLOT) * 2 + ST_BYTES + (R + 1) * 8;  // bytes
    // The early-release kernels' (`ER`) scratch for the statistics' flush after the mbarriers,
    // their staging rows being back with the MMA warpgroup by then: tile_stats_flush<3, NT, 4>
    // with NT <= 256.
    static constexpr int FLUSH_FLOATS = tile_stats_floats<256, 4>();
    // The descriptors' high words (SBO: A's M step, B's N step), constants of the layouts.
    static constexpr unsigned AHI = wg_desc_hi(128), BHI = wg_desc_hi(HX * 16);
    static_assert(CIN % 16 == 0 && (N == 64 || N == 128) && ZT % 2 == 0 && H >= 2, "tile shape");

    const ConvParams& p;
    const half* x;
    const half* w;
    NormLoad nl;  // the `_nl` kernels: x is a norm's input, normalised on load
    const TmaMap* tmap;  // the `_h2t` kernels: x's tensor map (`load_step`'s TL)
    int ntx, nty, ntz, ntiles, nb0;

    __device__ __forceinline__ WzConv(const ConvParams& p_, const half* x_, const half* w_, const NormLoad& nl_,
                                      const TmaMap* tmap_)
        : p(p_), x(x_), w(w_), nl(nl_), tmap(tmap_) {
        ntx = (p.wo + TX - 1) / TX, nty = (p.ho + NY - 1) / NY, ntz = (p.do_ + ZT - 1) / ZT;
        ntiles = p.n * ntz * nty * ntx;
        nb0 = blockIdx.y * 32;
    }

    // This block's steps (H per tile, tiles blockIdx.x + i * gridDim.x); 0 without a tile.
    // Traps when the launch's dynamic shared memory is short of this layout (a disagreement
    // with HaloConfig::smem_bytes).
    __device__ __forceinline__ int steps(unsigned need = SMEM) const {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < need) __trap();
        if ((int)blockIdx.x >= ntiles) return 0;
        return (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x * H + H;
    }

    // The origin of this block's tile ti, from `c` while it holds that tile.
    __device__ __forceinline__ const WzTile& tile(WzTile& c, int ti) const {
        if (c.ti != ti) {
            c.ti = ti;
            tile_origin<ZT, NY, TX>(blockIdx.x + ti * gridDim.x, ntx, nty, ntz, c.n, c.oz0, c.oy0, c.ox0);
        }
        return c;
    }

    // The slot fill (ti, k) in order of the block's fills: its ring slot is q % R, and the
    // slot's mbarrier completes phase q / R when it lands.
    static __device__ __forceinline__ int fill(int ti, int k) { return ti * (H + 1) + k; }

    // Block i of the weights: (dy dx, group) = i / 4, then kz = 3 - i % 4 (kz 3 zero: with the
    // next group's first block it is also the zero "kz = -1" after kz = 0); one zero block last.
    template <int NT = 128>
    __device__ __forceinline__ void load_w(half* sw, int tid) const {
        for (int idx = tid; idx < (9 * CPV * 4 + 1) * 32; idx += NT) {
            const int co = idx % 32, r = idx / 32, b = r % 4, r2 = r / 4, g = r2 % CPV, yx = r2 / CPV;
            half* dst = sw + idx * 8;
            const int kz = 3 - b;
            if (kz > 2 || yx >= 9) {
                *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
                continue;
            }
            const bool ok = nb0 + co < p.cout;
            const half* src = w + (i64)(nb0 + co) * p.kpad + (kz * 9 + yx) * p.cin + g * 8;
            cp_async16(dst, ok ? src : w, ok ? 16 : 0);
        }
    }

    // Piece idx of a slot (channel group g of one halo voxel of one plane): its offset in the
    // slot (halves), its input element (the group's first channel, in elements of x, from the
    // sample's start at xn voxels), and whether its voxel is inside the input.
    __device__ __forceinline__ bool piece(int idx, int iz0, int iy0, int ix0, int& dst, i64& src) const {
        const int g = idx % CPV, vv = idx / CPV, pl = vv / HP, v = vv - pl * HP;
        const int hy = v / HX, hx = v - hy * HX;
        const int iz = iz0 + pl, iy = iy0 + hy, ix = ix0 + hx;
        dst = ((g * 2 + pl) * HP + v) * 8;
        src = (((i64)iz * p.hi + iy) * p.wi + ix) * p.ldi + g * 8;
        return (unsigned)iz < (unsigned)p.di && (unsigned)iy < (unsigned)p.hi && (unsigned)ix < (unsigned)p.wi;
    }

    // Slot k of tile `o` (input planes oz0 - pd + 2k + {0, 1}), zero outside the input. The
    // input's voxels are p.ldi channels apart, of which the launch reads p.cin from x on. NL:
    // through `load_normed`. A thread's channel group is fixed (NT % CPV == 0) and its voxels
    // walked (`BoxWalk`: the slot's voxel vv = plane * HP + v is also its row in the group's
    // [plane][HP] block), so no piece divides or multiplies out its coordinates.
    template <int NT = 128, bool NL = false>
    __device__ __forceinline__ void load_slot(half* slot, const WzTile& o, int k, int tid) const {
        const int iz0 = o.oz0 - p.pd + 2 * k, iy0 = o.oy0 - p.ph, ix0 = o.ox0 - p.pw;
        if constexpr (NL) {
            load_normed<NT>(slot, o.n, iz0, iy0, ix0, tid);
            return;
        }
        static_assert(NT % CPV == 0, "a thread's channel group is the same in every piece");
        constexpr int VS = NT / CPV;  // voxels a step
        const int g = tid % CPV;
        const i64 ex = p.ldi, ey = (i64)p.wi * p.ldi, ez = (i64)p.hi * ey;
        const i64 base = (i64)o.n * p.di * ez + iz0 * ez + iy0 * ey + ix0 * ex + g * 8;
        BoxWalk<HY, HX, VS> wk(tid / CPV, ex, ey, ez);
        half* dst = slot + (g * 2 * HP + tid / CPV) * 8;
#pragma unroll 1
        for (int vv = tid / CPV; vv < 2 * HP; vv += VS) {
            const bool ok = wk.inside(iz0, iy0, ix0, p.di, p.hi, p.wi);
            cp_async16(dst, ok ? x + (base + wk.off) : x, ok ? 16 : 0);
            dst += VS * 8;
            wk.step();
        }
    }

    // A slot from the input of the norm before the conv (x: fp16, or fp32 as a conv kept it),
    // each value normalised and activated with its sample's (a, b) pair and rounded to fp16 as
    // the norm's output would be (`norm_load1`), stored with st.shared (the fence before the
    // barrier that hands the slot to the wgmmas orders these for the async proxy, as it does
    // the cp.async copies). Outside the input: zeros, the conv's padding of the norm's output.
    // A thread's pieces are all loaded before any is stored, so their loads are in flight
    // together on the helper's path.
    template <int NT>
    __device__ __forceinline__ void load_normed(half* slot, int n, int iz0, int iy0, int ix0, int tid) const {
        constexpr int TOT = 2 * HP * CPV, IT = (TOT + NT - 1) / NT, G = 3;  // G pieces in flight
        static_assert(NT % CPV == 0, "a thread's channel group is the same in every piece");
        const i64 xn = (i64)n * p.di * p.hi * p.wi * p.ldi;
        float2 ab[8];  // the pairs of the thread's channels (group tid % CPV)
#pragma unroll
        for (int q = 0; q < 8; q++)
            ab[q] = __ldg(reinterpret_cast<const float2*>(nl.ab) + (i64)n * p.ldi + (tid % CPV) * 8 + q);
#pragma unroll
        for (int i0 = 0; i0 < IT; i0 += G) {
            float v[G][8];
            bool in[G];
#pragma unroll
            for (int k = 0; k < G; k++) {
                const int idx = tid + (i0 + k) * NT;
                int dst;
                i64 src;
                in[k] = piece(idx, iz0, iy0, ix0, dst, src) && i0 + k < IT && idx < TOT;
                if (in[k]) {
                    if (nl.x_f32) load8(reinterpret_cast<const float*>(x), xn + src, v[k]);
                    else load8(x, xn + src, v[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < G; k++) {
                const int idx = tid + (i0 + k) * NT, c0 = (tid % CPV) * 8;
                int dst;
                i64 src;
                piece(idx, iz0, iy0, ix0, dst, src);
                if (i0 + k >= IT || idx >= TOT) break;
                __align__(16) half o[8];
#pragma unroll
                for (int q = 0; q < 8; q++)
                    o[q] = in[k] ? norm_load1(v[k][q], ab[q], c0 + q, nl) : __float2half(0.f);
                *reinterpret_cast<uint4*>(slot + dst) = *reinterpret_cast<const uint4*>(o);
            }
        }
    }

    // The slots step s of this block brings in: both of a tile's first step, else its next one.
    // With `bars` (the helper's loads, `wz_run_h`): each slot's mbarrier is arrived on as its
    // copies land (cp.async), or after its stores and the proxy fence (NL). TL (the `_h2t`
    // kernels): the helper's thread 0 alone loads a slot, with one tensor load per channel
    // group (`tmap`: the launch's input as dimensions [channel][x][y][z][n], dimension 0
    // fastest; the box 8 x HX x HY x 2 x 1 at channel 8g is the group's [plane][HP][8] block of
    // the slot), zeros outside the input from the TMA unit, SLOT * 2 bytes on the slot's
    // mbarrier (whose count is then 1).
    template <int NT = 128, bool NL = false, bool TL = false>
    __device__ __forceinline__ void load_step(half* ring, int s, int tid, WzTile& tc, unsigned bars = 0) const {
        const int ti = s / H, j = s - ti * H;
        const WzTile& o = tile(tc, ti);
        for (int k = j == 0 ? 0 : j + 1; k <= j + 1; k++) {
            const int q = fill(ti, k) % R;
            if constexpr (TL) {
                static_assert(!NL, "tensor loads copy the input as it is");
                if (tid == 0) {
                    const unsigned bar = bars + q * 8;
                    const int iz0 = o.oz0 - p.pd + 2 * k, iy0 = o.oy0 - p.ph, ix0 = o.ox0 - p.pw;
                    mbar_arrive_expect_tx(bar, SLOT * 2);
#pragma unroll
                    for (int g = 0; g < CPV; g++)
                        tma_load5(ring + q * SLOT + g * 2 * HP * 8, tmap, g * 8, ix0, iy0, iz0, o.n, bar);
                }
                continue;
            }
            load_slot<NT, NL>(ring + q * SLOT, o, k, tid);
            if (bars == 0) continue;
            if constexpr (NL) {
                fence_async_smem();
                mbar_arrive(bars + q * 8);
            } else {
                mbar_arrive_cp_async(bars + q * 8);
            }
        }
    }

    // Until step s's two slots have landed (`load_step` with `bars`), then the proxy fence
    // before the wgmmas read them.
    __device__ __forceinline__ void wait_step(unsigned bars, int s) const {
        const int ti = s / H, q = fill(ti, s - ti * H);
        mbar_wait(bars + q % R * 8, q / R & 1);
        mbar_wait(bars + (q + 1) % R * 8, (q + 1) / R & 1);
        fence_async_smem();
    }

    // Issues step s's wgmmas (4 input planes x 9 (dy, dx) x KS k16 steps; the first overwrites
    // acc) as one commit group; the caller waits.
    // da0 / db0: the descriptors' low words (`wg_desc_lo`) of the weights and the ring.
    __device__ __forceinline__ void mma_step(float (&acc)[NA], unsigned da0, unsigned db0, int s) const {
        const int ti = s / H, q0 = fill(ti, s - ti * H);
        // Opaque copies: the 72 descriptors are derived here, per step, not hoisted out of the
        // step loop into 144 live registers (which spilled).
        asm volatile("mov.b32 %0, %0;" : "+r"(da0));
        asm volatile("mov.b32 %0, %0;" : "+r"(db0));
        wg_fence();
#pragma unroll
        for (int u = 0; u < 4; u++) {
            // Slot q0 + u / 2, plane u % 2 (in 16-byte units from the ring's start).
            const unsigned db = db0 + ((q0 + u / 2) % R) * (SLOT / 8) + (u % 2) * HP;
#pragma unroll
            for (int yx = 0; yx < 9; yx++) {
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const unsigned da = da0 + ((yx * CPV + 2 * ks) * 4 + 3 - u) * (BLK / 8);
                    const unsigned dbt = db + 4 * ks * HP + (yx / 3) * HX + yx % 3;
                    Wg<N>::mma(acc, wg_desc_of(da, AHI), wg_desc_of(dbt, BHI), (u | yx | ks) != 0);
                }
            }
        }
        wg_commit();
    }

    // Step s's two planes in two halves. `stage`: the warpgroup that holds the accumulators
    // writes them + bias to the fp32 staging rows ([plane][voxel][co], 36-float rows:
    // conflict-free). Warp w holds rows w * 16 + lane / 4 (+ 8): plane w / 2, channel (w % 2) *
    // 16 + lane / 4 (+ 8); columns i * 8 + (lane % 4) * 2 (+ 1): y row i, x (lane % 4) * 2 (+ 1).
    __device__ __forceinline__ void stage(const float (&acc)[NA], int wtid, float* st,
                                          const float* __restrict__ bias) const {
        const int lane = wtid & 31, warp = wtid >> 5, co0 = (warp & 1) * 16 + (lane >> 2);
        // The thread's first value's place; the others at constant offsets from it (one store
        // each, where the index form cost two more instructions a store).
        float* sp = st + (warp >> 1) * N * SP + (lane & 3) * 2 * SP + co0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = nb0 + co0 + h * 8;
            const float b = bias && c < p.cout ? bias[c] : 0.f;
#pragma unroll
            for (int i = 0; i < NY; i++)
#pragma unroll
                for (int e = 0; e < 2; e++) sp[(i * 8 + e) * SP + h * 8] = acc[i * 4 + h * 2 + e] + b;
        }
    }

    // `put` (after a barrier): NT threads store the staged planes in pieces of 8 channels
    // with the activation, thread t's x and channel piece fixed, row (plane, y) = warp + NT / 32 * k.
    // ST (the helper's stores in the `_st` twins): `ts` sums the thread's values of the tile, and
    // the tile's last step adds the NT threads' sums into its statistics (tile_stats.cuh,
    // barrier 3 over the NT threads, the staging rows reused once every thread has stored).
    // ACC false (the `_nl` kernels, which the host never asks to accumulate): no registers
    // set aside for the earlier sums. ER (early release, the `_h2e` kernels): the thread takes
    // its rows into registers, then `release` hands the staging rows back before any store, and
    // the flush works in `scratch`. BS (bulk stores, the `_h2b` kernels): where the output is
    // fp32 and stored as staged (no activation, no earlier parts to add), each staged voxel's
    // channels of the Cout tile go out in one bulk copy (`bulk_store`: the TMA unit, not the
    // helper's load-store path), the threads reading the rows only for the statistics; the
    // copies have read the rows before `put` returns (the staging rows are handed back after).
    template <int NT = 128, bool ST = false, bool ACC = true, bool ER = false, bool BS = false,
              class Release = WzNoRelease>
    __device__ __forceinline__ void put(int s, int htid, float* st, half* __restrict__ y,
                                        const float* __restrict__ slope, WzTile& tc, TileStats8* ts = nullptr,
                                        float* scratch = nullptr, Release release = {}) const {
        static_assert((2 * NY) % (NT / 32) == 0, "whole rows per warp");
        static_assert(2 * N * SP >= tile_stats_floats<NT, 4>(), "the statistics fit the staging rows");
        static_assert(!ER || tile_stats_floats<NT, 4>() <= FLUSH_FLOATS, "the flush fits its scratch");
        static_assert(!(ER && BS), "one way to hand the staging rows back");
        const int warp = htid >> 5;
        const int ti = s / H, j = s - ti * H, t = blockIdx.x + ti * gridDim.x;
        const WzTile& o = tile(tc, ti);
        const int n = o.n, oz0 = o.oz0, oy0 = o.oy0, ox0 = o.ox0;
        const int xq = (htid >> 2) & 7, c0 = (htid & 3) * 8, c = nb0 + c0;
        const int ox = ox0 + xq;
        constexpr bool stats = ST;
        // OUT_SHIFTED (common.cuh): fp16 less the tile's shift, the statistics' (`_st` twins
        // only). (No test outside ST: a branch here in the one-warpgroup kernels, whose `put`
        // runs beside wgmmas in flight, makes ptxas wait on them, C7517.) `wide`: a split
        // conv's last part (it accumulates) stores them where it reads the earlier parts'
        // fp32 sums, each voxel's fp16 values at the start of its fp32 slot (a voxel stride of
        // 2 ldc halves): each voxel's sums are read before any of its halves is written, and no
        // other voxel's slot is touched, so no tile's stores can overwrite a sum another tile
        // has yet to read.
        const bool shifted = ST && p.out_f32 == OUT_SHIFTED;
        const bool wide = shifted && p.accum;
        if (stats && j == 0) {
            // The tile's first voxel (plane 0, row 0, x 0: always inside the output), as stored
            // (this launch's part of it where the launch accumulates into fp32: the shift need
            // only be the same in every thread of the tile). `wide`: the whole value, the
            // earlier parts' sums added, as the stored values are taken less it; then the
            // helper's barrier 3, so no thread stores over the voxel's sums before every thread
            // has read them.
            const float4 a = *reinterpret_cast<const float4*>(st + c0), b = *reinterpret_cast<const float4*>(st + c0 + 4);
            float first[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            if (wide) {
                float u[8];
                prev8(p, y, ((((i64)n * p.do_ + oz0) * p.ho + oy0) * p.wo + ox0) * p.ldc + p.coff + c,
                      ((p.ldc | p.coff) & 7) == 0 && c + 8 <= p.cout, c, u);
#pragma unroll
                for (int q = 0; q < 8; q++) first[q] += u[q];
            }
            act8(first, c, p, slope);
            ts->start(first);
            if (wide) stats_bar<3, NT>();
        }
        constexpr int RW = 2 * NY / (NT / 32);  // rows a thread stores
        // BS: the Cout tile's channels of a voxel (cw x 4 bytes, 16-byte aligned at both ends).
        const int cw = min(32, p.cout - nb0);
        const bool bulk = BS && p.out_f32 == 1 && !p.accum && p.act == ACT_NONE && ((p.ldc | p.coff | cw) & 3) == 0 &&
                          (reinterpret_cast<unsigned long long>(y) & 15) == 0;
        if (bulk) {
            for (int v = htid; v < 2 * N; v += NT) {
                const int pl = v / N, yy = (v - pl * N) / TX, xx = v % TX;
                const int oz = oz0 + 2 * j + pl, oy = oy0 + yy, vx = ox0 + xx;
                if (oz < p.do_ && oy < p.ho && vx < p.wo)
                    bulk_store(reinterpret_cast<float*>(y) +
                                   ((((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + vx) * p.ldc + p.coff + nb0,
                               st + v * SP, cw * 4);
            }
            bulk_commit();
        }
        const bool active = ox < p.wo && c < p.cout && (!bulk || stats);
        const unsigned amask = wide ? __ballot_sync(0xffffffffu, active) : 0u;  // `wide`'s lanes
        float rows[ER ? RW : 1][8];  // ER: the thread's staged rows
        if constexpr (ER) {
            if (active) {
#pragma unroll
                for (int k = 0; k < RW; k++) {
                    const int r = warp + NT / 32 * k, pl = r / NY, yy = r - pl * NY;
                    const float4* src = reinterpret_cast<const float4*>(st + (pl * N + yy * 8 + xq) * SP + c0);
                    const float4 a = src[0], b = src[1];
                    rows[k][0] = a.x, rows[k][1] = a.y, rows[k][2] = a.z, rows[k][3] = a.w;
                    rows[k][4] = b.x, rows[k][5] = b.y, rows[k][6] = b.z, rows[k][7] = b.w;
                }
            }
            release();
        }
        if (active) {
            const bool vec = ((p.ldc | p.coff) & 7) == 0 && c + 8 <= p.cout;
            // Row k's output index, or -1 outside the output.
            auto dst_of = [&](int k) -> i64 {
                const int r = warp + NT / 32 * k, pl = r / NY, yy = r - pl * NY;
                const int oz = oz0 + 2 * j + pl, oy = oy0 + yy;
                if (oz >= p.do_ || oy >= p.ho) return -1;
                return ((((i64)n * p.do_ + oz) * p.ho + oy) * p.wo + ox) * p.ldc + p.coff + c;
            };
            // Where the launch accumulates, the earlier parts' sums (fp32, as the host asks only
            // then; this thread's alone) of every row are loaded before any row is stored: y is
            // read and written here, so a load after a store waits for it, and row by row each
            // load's latency would sit on the helper's path. Up to 4 rows (32 registers) a thread.
            constexpr bool PRE = ACC && RW <= 4;
            static_assert(!ST || PRE, "`wide` stores follow every row's sums");
            float pv[PRE ? RW : 1][8];
            if (PRE && p.accum) {
#pragma unroll
                for (int k = 0; k < (PRE ? RW : 1); k++) {
                    prev8(p, y, dst_of(k), vec, c, pv[k]);
                }
                // `wide`: the voxel's other pieces are this warp's lanes (htid & 3), whose sums
                // must be in before any of them stores.
                if (wide) __syncwarp(amask);
            }
#pragma unroll
            for (int k = 0; k < RW; k++) {
                const int r = warp + NT / 32 * k, pl = r / NY, yy = r - pl * NY;
                const i64 dst = dst_of(k);
                if (dst < 0) continue;
                float v[8];
                if constexpr (ER) {
#pragma unroll
                    for (int q = 0; q < 8; q++) v[q] = rows[k][q];
                } else {
                    const float4* src = reinterpret_cast<const float4*>(st + (pl * N + yy * 8 + xq) * SP + c0);
                    const float4 a = src[0], b = src[1];
                    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                }
                if (p.accum) {
                    float u[8];
                    if (PRE) {
#pragma unroll
                        for (int q = 0; q < 8; q++) u[q] = pv[PRE ? k : 0][q];
                    } else {
                        prev8(p, y, dst, vec, c, u);
                    }
#pragma unroll
                    for (int q = 0; q < 8; q++) v[q] += u[q];
                }
                act8(v, c, p, slope);
                if (bulk) {
                    // (stored by the bulk copies)
                } else if (shifted) {
                    // fp16 less the tile's shift: the rounding is relative to the value's
                    // distance from its tile's first one, not to the value.
                    float d[8];
#pragma unroll
                    for (int q = 0; q < 8; q++) d[q] = v[q] - ts->shf[q];
                    // `wide`: the voxel's fp32 slot (coff 0: the host asks so) as halves.
                    const i64 d16 = wide ? 2 * (dst - c) + c : dst;
                    if (vec) {
                        store8_half(y, d16, d);
                    } else {
#pragma unroll
                        for (int q = 0; q < 8; q++)
                            if (c + q < p.cout) y[d16 + q] = __float2half(d[q]);
                    }
                } else if (vec) {
                    out_store8(p, y, dst, v);
                } else {
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        if (c + q < p.cout) out_store1(p, y, dst + q, v[q]);
                }
                if (stats) {
                    // Channels past Cout (a partial piece) are never flushed.
                    ts->add(v);
                }
            }
        }
        if (bulk) bulk_wait_read();
        if (stats && j == H - 1) {
            const float count = (float)(min(ZT, p.do_ - oz0) * min(NY, p.ho - oy0) * min(TX, p.wo - ox0));
            tile_stats_flush<3, NT, 4>(*ts, htid, ER ? scratch : st,
                                       reinterpret_cast<float4*>(p.stats) + (i64)t * p.cout + nb0, p.cout - nb0, count);
        }
    }
};

// One block per SM (grid <= tiles), one warpgroup: the weights once, then the block's steps (H
// per tile, tiles blockIdx.x + i * gridDim.x). Step s + 1's wgmmas run while step s's epilogue
// does (two accumulator sets, `cur` and `nxt`; every wgmma is waited for within the step, so
// none is in flight across a branch or the loop's back edge, which ptxas would serialise), and
// the slots of step s + 2 are copied meanwhile (one cp.async group per step). Ring: while the
// wgmmas of s + 1 read their slots, those of s + 2 land in the ones step s - 1 read (R = 5
// holds one tile change).
template <int CIN, int NY, int ZT>
__device__ __forceinline__ void wz_step(const WzConv<CIN, NY, ZT>& c, int s, int steps, float (&cur)[WzConv<CIN, NY, ZT>::NA],
                                        float (&nxt)[WzConv<CIN, NY, ZT>::NA], half* ring, float* st, unsigned da0,
                                        unsigned db0, int tid, WzTile (&tc)[2], half* __restrict__ y,
                                        const float* __restrict__ bias, const float* __restrict__ slope) {
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();  // step s + 1's slots landed; every warp is past step s - 1's epilogue
    if (s + 2 < steps) c.load_step(ring, s + 2, tid, tc[0]);
    cp_async_commit();
    c.mma_step(nxt, da0, db0, s + 1);
    c.stage(cur, tid, st, bias);
    __syncthreads();
    c.put(s, tid, st, y, slope, tc[1]);
    wg_wait<0>();
}

// The last step's planes (no wgmmas left to overlap). The barrier first: another warp may still
// be storing step s - 1 from the staging rows.
template <int CIN, int NY, int ZT>
__device__ __forceinline__ void wz_last(const WzConv<CIN, NY, ZT>& c, const float (&cur)[WzConv<CIN, NY, ZT>::NA], int s,
                                        int tid, WzTile& tc, float* st, half* __restrict__ y, const float* __restrict__ bias,
                                        const float* __restrict__ slope) {
    __syncthreads();
    c.stage(cur, tid, st, bias);
    __syncthreads();
    c.put(s, tid, st, y, slope, tc);
}

template <int CIN, int NY, int ZT>
__device__ __forceinline__ void wz_run(const WzConv<CIN, NY, ZT>& c, int steps, half* sW, half* ring, float* st,
                                      int tid, half* __restrict__ y, const float* __restrict__ bias,
                                      const float* __restrict__ slope) {
    using C = WzConv<CIN, NY, ZT>;
    WzTile tc[2];  // the loads' tile, the stores'
    c.load_w(sW, tid);
    c.load_step(ring, 0, tid, tc[0]);
    cp_async_commit();
    c.load_step(ring, 1, tid, tc[0]);  // steps >= H >= 2
    cp_async_commit();
    const unsigned da0 = wg_desc_lo((unsigned)__cvta_generic_to_shared(sW), 4 * C::BLK * 2);
    const unsigned db0 = wg_desc_lo((unsigned)__cvta_generic_to_shared(ring), 2 * C::HP * 16);
    float acc0[C::NA], acc1[C::NA];
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();  // the weights and step 0's slots landed
    c.mma_step(acc0, da0, db0, 0);
    wg_wait<0>();
    for (int s = 0;; s += 2) {
        if (s + 1 >= steps) {
            wz_last(c, acc0, s, tid, tc[1], st, y, bias, slope);
            break;
        }
        wz_step(c, s, steps, acc0, acc1, ring, st, da0, db0, tid, tc, y, bias, slope);
        if (s + 2 >= steps) {
            wz_last(c, acc1, s + 1, tid, tc[1], st, y, bias, slope);
            break;
        }
        wz_step(c, s + 1, steps, acc1, acc0, ring, st, da0, db0, tid, tc, y, bias, slope);
    }
    cp_async_wait<0>();
}

// A helper beside the MMA warpgroup (`wz_run_h`): the first warpgroup only issues the wgmmas and
// stages the accumulators; HT more threads (one or two warpgroups) copy (weights, slots) and store
// the staged planes. The copies' and stores' index math then runs on warps of their own beside the
// MMA chain (one warp per scheduler cannot hide its own latencies).
// The slots land on mbarriers (`load_step` with `bars`; `wait_step`), so the MMA warpgroup issues
// step s + 1's wgmmas as soon as its slots are in, whatever the helper is doing; the staging
// rows are handed back and forth on two named barriers over all 128 + HT threads, each synced by
// one side and arrived on by the other: 1 = the rows are free (the helper stored the step before),
// 2 = step s staged. So the helper's stores of step s - 1 overlap the wgmmas of step s + 1, where
// one barrier for both (slots and rows) held those wgmmas until the stores were done (session 31's
// ncu: the tensor pipe idle while the helper stored).
// Ring: the helper copies step s + 2's slots once it has taken step s - 1's staged planes (the
// MMA warpgroup waited for step s - 1's wgmmas before staging them), while step s's and s + 1's
// wgmmas may still read theirs: five consecutive fills, which R = 5 holds across a tile change.
template <int HT>
__device__ __forceinline__ void wz_bar(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(128 + HT) : "memory");
}
template <int HT>
__device__ __forceinline__ void wz_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(128 + HT) : "memory");
}

// How the helper stores the staged planes (`WZH_ENTRY`'s SM): its own 16-byte stores after the
// rows (0), early release (1, `_h2e`) or bulk copies (2, `_h2b`).
enum WzStores { WZ_STORES = 0, WZ_RELEASE_EARLY = 1, WZ_BULK = 2 };

// The MMA warpgroup's hand-over of staged planes: once the rows are free (barrier 1), stage
// `acc`, then barrier 2. Bulk copies read the rows through the async proxy, so the stagers fence
// their writes for it first.
template <int HT, int SM, int CIN, int NY, int ZT>
__device__ __forceinline__ void wzh_stage(const WzConv<CIN, NY, ZT>& c, const float (&acc)[WzConv<CIN, NY, ZT>::NA],
                                          float* st, int tid, const float* __restrict__ bias) {
    wz_bar<HT>(1);
    c.stage(acc, tid, st, bias);
    if constexpr (SM == WZ_BULK) fence_async_smem();
    wz_arrive<HT>(2);
}

template <int HT, int SM, int CIN, int NY, int ZT>
__device__ __forceinline__ void wzh_step(const WzConv<CIN, NY, ZT>& c, int s, float (&cur)[WzConv<CIN, NY, ZT>::NA],
                                         float (&nxt)[WzConv<CIN, NY, ZT>::NA], float* st, unsigned bars, unsigned da0,
                                         unsigned db0, int tid, const float* __restrict__ bias) {
    c.wait_step(bars, s + 1);
    c.mma_step(nxt, da0, db0, s + 1);
    wzh_stage<HT, SM>(c, cur, st, tid, bias);
    wg_wait<0>();
}

// WZ_RELEASE_EARLY (the `_h2e` kernels): the helper hands the staging rows back as soon as it
// has taken its rows into registers (`put`'s early release), before its stores, so the MMA
// warpgroup's next staging waits for those loads only (session 31's ncu: ~23% of its samples at
// barrier 1). WZ_BULK (`_h2b`): the TMA unit stores the rows (`put`'s BS), the helper's
// load-store path keeps the slot copies alone (session 31's ncu: its warps at `lg_throttle`).
template <int HT, bool ST, bool NL, int SM, bool TL, int CIN, int NY, int ZT>
__device__ __forceinline__ void wz_run_h(const WzConv<CIN, NY, ZT>& c, int steps, half* sW, half* ring, float* st,
                                        unsigned bars, float* scratch, int tid, half* __restrict__ y,
                                        const float* __restrict__ bias, const float* __restrict__ slope) {
    using C = WzConv<CIN, NY, ZT>;
    // The slots' mbarriers, then the weights': one arrival per helper thread a phase (TL: the
    // slots' one thread's, with the tensor loads' bytes).
    if (tid == 0)
        for (int i = 0; i <= C::R; i++) mbar_init(bars + i * 8, TL && i < C::R ? 1 : HT);
    __syncthreads();
    if (tid >= 128) {  // the helper
        const int h = tid - 128;
        WzTile lt, pt;  // the loads' tile, the stores'
        c.template load_w<HT>(sW, h);
        mbar_arrive_cp_async(bars + C::R * 8);
        c.template load_step<HT, NL, TL>(ring, 0, h, lt, bars);
        c.template load_step<HT, NL, TL>(ring, 1, h, lt, bars);  // steps >= H >= 2
        wz_arrive<HT>(1);  // the staging rows are free
        TileStats8 ts;     // ST: the tile's norm statistics, over its H steps
        for (int s = 0; s < steps; s++) {
            if (s + 2 < steps) c.template load_step<HT, NL, TL>(ring, s + 2, h, lt, bars);
            wz_bar<HT>(2);
            // An `_nl` conv never accumulates.
            if constexpr (SM == WZ_RELEASE_EARLY) {
                c.template put<HT, ST, !NL, true>(s, h, st, y, slope, pt, &ts, scratch, [&] {
                    if (s + 1 < steps) wz_arrive<HT>(1);
                });
            } else {
                c.template put<HT, ST, !NL, false, SM == WZ_BULK>(s, h, st, y, slope, pt, &ts);
                if (s + 1 < steps) wz_arrive<HT>(1);
            }
        }
        if constexpr (SM == WZ_BULK) bulk_wait();  // the copies' writes done before the block ends
        return;
    }
    const unsigned da0 = wg_desc_lo((unsigned)__cvta_generic_to_shared(sW), 4 * C::BLK * 2);
    const unsigned db0 = wg_desc_lo((unsigned)__cvta_generic_to_shared(ring), 2 * C::HP * 16);
    float acc0[C::NA], acc1[C::NA];
    mbar_wait(bars + C::R * 8, 0);  // the weights
    c.wait_step(bars, 0);
    c.mma_step(acc0, da0, db0, 0);
    wg_wait<0>();
    for (int s = 0;; s += 2) {
        if (s + 1 >= steps) {
            wzh_stage<HT, SM>(c, acc0, st, tid, bias);
            break;
        }
        wzh_step<HT, SM>(c, s, acc0, acc1, st, bars, da0, db0, tid, bias);
        if (s + 2 >= steps) {
            wzh_stage<HT, SM>(c, acc1, st, tid, bias);
            break;
        }
        wzh_step<HT, SM>(c, s + 1, acc1, acc0, st, bars, da0, db0, tid, bias);
    }
}

// The kernel: shared memory carved as the layouts above, then one warpgroup's loop (`wz_run`,
// HT 0) or the MMA warpgroup's and its helper's of HT threads (`wz_run_h`).
template <int CIN, int NY, int ZT, int HT, bool ST, bool NL = false, int SM = WZ_STORES, bool TL = false>
__device__ __forceinline__ void conv_wz(const ConvParams& p, const half* __restrict__ x, const half* __restrict__ w,
                                       const float* __restrict__ bias, half* __restrict__ y,
                                       const float* __restrict__ slope, const NormLoad& nl = NormLoad{},
                                       const TmaMap* tmap = nullptr) {
    using C = WzConv<CIN, NY, ZT>;
    extern __shared__ __align__(128) unsigned char dsm[];
    half* sW = reinterpret_cast<half*>(dsm);
    half* ring = sW + C::WH;
    float* st = reinterpret_cast<float*>(ring + C::R * C::SLOT);
    const unsigned bars = (unsigned)__cvta_generic_to_shared(st) + C::ST_BYTES;
    float* scratch = reinterpret_cast<float*>(dsm + C::SMEM);  // WZ_RELEASE_EARLY only
    const C c(p, x, w, nl, tmap);
    const int steps = c.steps(C::SMEM + (SM == WZ_RELEASE_EARLY ? C::FLUSH_FLOATS * 4 : 0));
    if (steps == 0) return;
    if constexpr (HT > 0) {
        wz_run_h<HT, ST, NL, SM, TL>(c, steps, sW, ring, st, bars, scratch, (int)threadIdx.x, y, bias, slope);
    } else {
        static_assert(!ST && !NL && SM == WZ_STORES && !TL,
                      "norm statistics, norm loads, the other stores and tensor loads are the helper's only");
        wz_run(c, steps, sW, ring, st, (int)threadIdx.x, y, bias, slope);
    }
}

// Name: conv_wz_c{CIN}_y{NY}[_h | _h2 | _h2e | _h2b]; one line per WGMMA table entry with
// `zpair` (`entry_lines`): WZ_ENTRY one warpgroup, WZH_ENTRY a helper of HT threads (128: `_h`,
// 256: `_h2`), the block 128 + HT threads; SM the helper's stores (`WZ_STORES`, 1: early
// release `_h2e`, 2: bulk copies `_h2b`).
#define WZ_ENTRY(NAME, CIN, NY, ZT)                                                                  \
    extern "C" __global__ void __launch_bounds__(128, 1) NAME(ConvParams p, const half* x, const half* w, \
                                                            const float* bias, half* y, const float* slope) { \
        conv_wz<CIN, NY, ZT, 0, false>(p, x, w, bias, y, slope);                                                \
    }
#define WZH_ENTRY(NAME, CIN, NY, ZT, HT, SM)                                                         \
    extern "C" __global__ void __launch_bounds__(128 + HT, 1) NAME(ConvParams p, const half* x, const half* w, \
                                                                 const float* bias, half* y, const float* slope) { \
        conv_wz<CIN, NY, ZT, HT, false, false, SM>(p, x, w, bias, y, slope);                                         \
    }
// The `_st` twin of a WZH entry (`HaloConfig::stats`): the helper's stores also write the norm
// statistics of each tile to `p.stats` (tile_stats.cuh).
#define WZH_ST_ENTRY(NAME, CIN, NY, ZT, HT, SM)                                                      \
    extern "C" __global__ void __launch_bounds__(128 + HT, 1) NAME(ConvParams p, const half* x, const half* w, \
                                                                 const float* bias, half* y, const float* slope) { \
        conv_wz<CIN, NY, ZT, HT, true, false, SM>(p, x, w, bias, y, slope);                                     \
    }
// A WZH entry whose helper loads the slots with tensor loads (`HaloConfig::tma_loads`, `_h2t`):
// the input's tensor map (`TmaMap`, encoded by the host for this launch) as a last parameter;
// ST 1: the `_st` twin.
#define WZH_TMA_ENTRY(NAME, CIN, NY, ZT, HT, SM, ST)                                                 \
    extern "C" __global__ void __launch_bounds__(128 + HT, 1) NAME(                                  \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope,   \
        const __grid_constant__ TmaMap tmap) {                                                       \
        conv_wz<CIN, NY, ZT, HT, ST, false, SM, true>(p, x, w, bias, y, slope, NormLoad{}, &tmap);   \
    }
// The `_nl` twin of a WZH entry (`HaloConfig::norm_load`): x is the input of the InstanceNorm /
// GroupNorm before the conv, normalised and activated on load (`NormLoad`, as `conv1x1_norm_*`
// takes it): the norm's output is never written.
#define WZH_NL_ENTRY(NAME, CIN, NY, ZT, HT)                                                          \
    extern "C" __global__ void __launch_bounds__(128 + HT, 1) NAME(                                  \
        ConvParams p, const half* x, const half* w, const float* bias, half* y, const float* slope,   \
        const float* nab, int x_f32, int nact, float nalpha, const float* nslope, int nslope_n) {     \
        conv_wz<CIN, NY, ZT, HT, false, true>(p, x, w, bias, y, slope,                               \
                                              NormLoad{nab, x_f32, nact, nalpha, nslope, nslope_n}); \
    }
