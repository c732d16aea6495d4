// InstanceNorm / GroupNorm statistics taken in a conv's epilogue (`ConvParams::stats`), so the
// norm after it skips its partial-sum pass over the conv's output (`norm_finalize_tiles`).
// Prepended to the conv tile family that writes them (`conv_wgmma.cu`: the `conv_wz_*` helper's
// stores, `Family::source`); `conv_c1_k3_st` adds its warps' sums per block in the same layout.
//
// Per output tile and channel, one float4 in the plan's norm scratch at [tile][cout] (tiles as
// `tile_origin` orders them, samples slowest): (sum, sum of squares, shift, count) of the
// values as stored, each less the shift. The shift is the tile's first voxel's value, the same
// in every thread of the tile, so the threads' sums add as they are; it keeps
// E[x^2] - E[x]^2 from cancelling when the mean is far from 0. No atomics: fixed orders, the
// same bits every run and at every batch (a tile's sums do not depend on the grid).

// One thread's sums of 8 channels over the voxels it stores of one tile.
struct TileStats8 {
    float shf[8], s[8], q[8];

    // A new tile whose first voxel's 8 values are `first`.
    __device__ __forceinline__ void start(const float* first) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            shf[k] = first[k];
            s[k] = q[k] = 0.f;
        }
    }
    __device__ __forceinline__ void add(const float (&v)[8]) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float a = v[k] - shf[k];
            s[k] += a;
            q[k] += a * a;
        }
    }
};

// A barrier over the NT threads that hold a tile's sums: the block (BAR 0) or named barrier BAR.
template <int BAR, int NT>
__device__ __forceinline__ void stats_bar() {
    if constexpr (BAR == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(NT) : "memory");
}

// Adds the tile's sums of its NT threads into `part` (the tile's row at its first channel
// nb0: part[c] for c < ncout). Thread t holds 8-channel chunk t % CH (channels chunk * 8 ..
// + 8), thread chunk < CH the tile's shift; CH divides 32, so a warp's lanes of one chunk are
// lane % CH. Each warp first adds its lanes' sums with shuffles (a fixed tree: the same bits
// every run), then one thread per channel adds the NT / 32 warps' in warp order: the old
// per-channel loop over NT / CH threads' shared-memory sums was a chain of dependent loads that
// held every helper thread at the next barrier (~1.6K cycles a tile at NT 256). `sm`:
// `tile_stats_floats<NT, CH>()` floats of shared memory that no thread of the NT reads or
// writes until they all pass the next barrier after this. `count`: the tile's output voxels
// inside the output.
template <int NT, int CH>
__host__ __device__ constexpr int tile_stats_floats() {
    return NT / 32 * CH * 16 + CH * 8;  // each warp's chunks' (sum, sum of squares), the shifts
}
template <int BAR, int NT, int CH>
__device__ __forceinline__ void tile_stats_flush(const TileStats8& ts, int tid, float* sm, float4* __restrict__ part,
                                                 int ncout, float count) {
    static_assert(CH >= 1 && CH <= 32 && (32 % CH) == 0 && NT % 32 == 0, "a chunk's lanes: lane % CH");
    constexpr int NW = NT / 32;
    float s[8], q[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        s[k] = ts.s[k];
        q[k] = ts.q[k];
    }
#pragma unroll
    for (int o = CH; o < 32; o *= 2) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            s[k] += __shfl_xor_sync(0xffffffffu, s[k], o);
            q[k] += __shfl_xor_sync(0xffffffffu, q[k], o);
        }
    }
    stats_bar<BAR, NT>();  // every thread is done reading `sm`'s other use
    const int lane = tid & 31, warp = tid >> 5;
    if (lane < CH) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            sm[((warp * CH + lane) * 8 + k) * 2] = s[k];
            sm[((warp * CH + lane) * 8 + k) * 2 + 1] = q[k];
        }
    }
    if (tid < CH) {
#pragma unroll
        for (int k = 0; k < 8; k++) sm[NW * CH * 16 + tid * 8 + k] = ts.shf[k];
    }
    stats_bar<BAR, NT>();
    for (int c = tid; c < CH * 8 && c < ncout; c += NT) {
        float a = 0.f, b = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            a += sm[((w * CH) * 8 + c) * 2];
            b += sm[((w * CH) * 8 + c) * 2 + 1];
        }
        part[c] = make_float4(a, b, sm[NW * CH * 16 + c], count);
    }
}
