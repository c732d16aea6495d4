// The streamed sliding-window path (src/backend/cuda/stream/): window logits are blended into
// a ring of fp32 accumulators that covers only the D-planes in flight (never fp16: nnU-Net's fp16
// accumulators overflow), with one weight sum per voxel; finished planes are normalised (and
// argmaxed) into a staging buffer and their ring slots zeroed for reuse.
// Volume plane z lives in ring slot z % R; ring layout acc [R][C][H][W], wsum [R][H][W].
// Windows are blended one launch at a time on one stream, so overlapping windows never race and
// the result does not depend on the batch size.

// logits: one window (rd, rh, rw, C) NDHWC f16; wmap: (rd, rh, rw) f32. Start in padded
// coordinates, (pz, py, px) voxels of padding before the volume (D, H, W).
extern "C" __global__ void blend_window_ring(const half* __restrict__ logits, const float* __restrict__ wmap,
                                             float* __restrict__ acc, float* __restrict__ wsum, int C, int R,
                                             int D, int H, int W, int sz, int sy, int sx, int pz, int py, int px,
                                             int rd, int rh, int rw) {
    i64 total = (i64)rd * rh * rw;
    i64 HW = (i64)H * W;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int x = (int)(e % rw); i64 t = e / rw;
        int y = (int)(t % rh); int z = (int)(t / rh);
        int vz = sz + z - pz, vy = sy + y - py, vx = sx + x - px;
        if (vz < 0 || vz >= D || vy < 0 || vy >= H || vx < 0 || vx >= W) continue;
        int slot = vz % R;
        i64 p = (i64)vy * W + vx;
        float w = wmap[e];
        const half* l = logits + e * C;
        float* a = acc + (i64)slot * C * HW + p;
        for (int c = 0; c < C; c++) a[c * HW] += w * __half2float(l[c]);
        wsum[slot * HW + p] += w;
    }
}

// Finalises volume planes [p0, p0 + np): logits mode writes acc / wsum as (C, np, H, W) f32 into
// out; argmax mode writes the first maximal channel as u16 into labels (dividing by a positive
// weight sum keeps the order, so the raw sums are compared). Voxels no window reached give 0; a
// voxel with a NaN in any channel gives 0xFFFF (no label: at most 65535 channels, so at most
// label 65534), which the host counts for its NaN warning and then writes as 0.
// Then zeroes the planes' ring slots, so the ring is ready for planes p0 + R...
extern "C" __global__ void finalize_planes(float* __restrict__ acc, float* __restrict__ wsum,
                                           float* __restrict__ out, unsigned short* __restrict__ labels, int C,
                                           int R, int H, int W, int p0, int np, int argmax) {
    i64 HW = (i64)H * W;
    i64 total = (i64)np * HW;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int i = (int)(e / HW);
        i64 p = e % HW;
        int slot = (p0 + i) % R;
        float ws = wsum[slot * HW + p];
        float* a = acc + (i64)slot * C * HW + p;
        if (argmax) {
            float best = a[0];
            int bi = 0;
            bool nan = isnan(best);
            a[0] = 0.f;
            for (int c = 1; c < C; c++) {
                float v = a[c * HW];
                nan |= isnan(v);
                if (v > best) { best = v; bi = c; }
                a[c * HW] = 0.f;
            }
            labels[e] = nan ? (unsigned short)0xFFFF : ws > 0.f ? (unsigned short)bi : (unsigned short)0;
        } else {
            for (int c = 0; c < C; c++) {
                float v = a[c * HW];
                out[((i64)c * np + i) * HW + p] = ws > 0.f ? v / ws : 0.f;
                a[c * HW] = 0.f;
            }
        }
        wsum[slot * HW + p] = 0.f;
    }
}

// finalize_planes for H * W % 4 == 0 (the common case): a block row per plane (blockIdx.y), four
// voxels per thread as float4, so every load and store is a 16-byte vector and no thread divides
// a 64-bit index; the class loop is unrolled so its loads are in flight together. Same results
// (first maximal channel, raw sums compared) and the same zeroing as finalize_planes.
extern "C" __global__ void finalize_planes_v4(float* __restrict__ acc, float* __restrict__ wsum,
                                              float* __restrict__ out, unsigned short* __restrict__ labels,
                                              int C, int R, int H, int W, int p0, int np, int argmax) {
    const int HW4 = H * W / 4;
    const int i = blockIdx.y;
    const int slot = (p0 + i) % R;
    float4* a = reinterpret_cast<float4*>(acc) + (i64)slot * C * HW4;
    float4* ws4 = reinterpret_cast<float4*>(wsum) + (i64)slot * HW4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < HW4; q += gridDim.x * blockDim.x) {
        const float4 ws = ws4[q];
        if (argmax) {
            // Every load before any zeroing store: no store between them, so the unrolled loads
            // are all in flight at once (a store to `a` could alias the next load).
            float4 best = a[q];
            int bx = 0, by = 0, bz = 0, bw = 0;
            bool nx = isnan(best.x), ny = isnan(best.y), nz = isnan(best.z), nw = isnan(best.w);
#pragma unroll 4
            for (int c = 1; c < C; c++) {
                const float4 v = a[(i64)c * HW4 + q];
                nx |= isnan(v.x); ny |= isnan(v.y); nz |= isnan(v.z); nw |= isnan(v.w);
                if (v.x > best.x) { best.x = v.x; bx = c; }
                if (v.y > best.y) { best.y = v.y; by = c; }
                if (v.z > best.z) { best.z = v.z; bz = c; }
                if (v.w > best.w) { best.w = v.w; bw = c; }
            }
            ushort4 l;
            const unsigned short NAN_LABEL = 0xFFFF;
            l.x = nx ? NAN_LABEL : ws.x > 0.f ? (unsigned short)bx : (unsigned short)0;
            l.y = ny ? NAN_LABEL : ws.y > 0.f ? (unsigned short)by : (unsigned short)0;
            l.z = nz ? NAN_LABEL : ws.z > 0.f ? (unsigned short)bz : (unsigned short)0;
            l.w = nw ? NAN_LABEL : ws.w > 0.f ? (unsigned short)bw : (unsigned short)0;
            reinterpret_cast<ushort4*>(labels)[(i64)i * HW4 + q] = l;
#pragma unroll 4
            for (int c = 0; c < C; c++) a[(i64)c * HW4 + q] = zero;
        } else {
            float4* o = reinterpret_cast<float4*>(out);
#pragma unroll 4
            for (int c = 0; c < C; c++) {
                const float4 v = a[(i64)c * HW4 + q];
                a[(i64)c * HW4 + q] = zero;
                float4 r;
                r.x = ws.x > 0.f ? v.x / ws.x : 0.f;
                r.y = ws.y > 0.f ? v.y / ws.y : 0.f;
                r.z = ws.z > 0.f ? v.z / ws.z : 0.f;
                r.w = ws.w > 0.f ? v.w / ws.w : 0.f;
                o[((i64)c * np + i) * HW4 + q] = r;
            }
        }
        ws4[q] = zero;
    }
}

// One window into the network input `out` (rd, rh, rw, C) NDHWC f16: start (sz, sy, sx) in padded
// coordinates, (pz, py, px) voxels of padding before the volume (D, H, W), `cval` (f16 bits) outside
// it; `read(c, z, y, x)` gives a voxel's f16 bits. The host checks rd * rh * rw * C < 2^31.
template <class Read>
__device__ __forceinline__ void gather_window(unsigned short* __restrict__ out, int C, int D, int H, int W,
                                              int sz, int sy, int sx, int pz, int py, int px, int rd, int rh,
                                              int rw, int cval, Read read) {
    int total = rd * rh * rw * C;
    unsigned short cv = (unsigned short)cval;
    for (i64 e64 = blockIdx.x * (i64)blockDim.x + threadIdx.x; e64 < total; e64 += (i64)gridDim.x * blockDim.x) {
        int e = (int)e64;
        int c = e % C; int t = e / C;
        int x = t % rw; t /= rw;
        int y = t % rh; int z = t / rh;
        int vz = sz + z - pz, vy = sy + y - py, vx = sx + x - px;
        unsigned short v = cv;
        if (vz >= 0 && vz < D && vy >= 0 && vy < H && vx >= 0 && vx < W) v = read(c, vz, vy, vx);
        out[e] = v;
    }
}

// The direct input: a window from a float32 volume (C, D, H, W) already in device memory (a caller's
// tensor), element strides (sc, sd, sh, sw) of any sign, rounded to f16 as the host gather rounds
// (nearest even). The host checks that every element the strides reach lies in one allocation.
extern "C" __global__ void gather_window_f32(const float* __restrict__ vol, unsigned short* __restrict__ out,
                                             int C, int D, int H, int W, i64 sc, i64 sd, i64 sh, i64 sw,
                                             int sz, int sy, int sx, int pz, int py, int px, int rd, int rh,
                                             int rw, int cval) {
    gather_window(out, C, D, H, W, sz, sy, sx, pz, py, px, rd, rh, rw, cval, [&](int c, int z, int y, int x) {
        return __half_as_ushort(__float2half_rn(vol[c * sc + z * sd + y * sh + x * sw]));
    });
}

// A window from the input ring: volume plane z (all channels, f16 bits) in slot z % R, ring layout
// [R][C][H][W]. The bits equal the host gather's (stream/gather.rs gather_windows).
extern "C" __global__ void gather_window_ring(const unsigned short* __restrict__ ring,
                                              unsigned short* __restrict__ out, int C, int R, int D, int H,
                                              int W, int sz, int sy, int sx, int pz, int py, int px, int rd,
                                              int rh, int rw, int cval) {
    i64 HW = (i64)H * W;
    gather_window(out, C, D, H, W, sz, sy, sx, pz, py, px, rd, rh, rw, cval, [&](int c, int z, int y, int x) {
        return ring[((i64)(z % R) * C + c) * HW + (i64)y * W + x];
    });
}
