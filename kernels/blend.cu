// The sliding-window path on the device: gather windows from the uploaded f32 volume (padding
// with cval outside it), blend weighted window logits into fp32 accumulators (one weight sum per
// voxel, never fp16: nnU-Net's fp16 accumulators overflow), normalise, argmax.
// Windows are blended one launch at a time on one stream, so overlapping windows never race.

// vol: (C, D, H, W) f32; out: one window (rd, rh, rw, C) NDHWC f16. start in padded coordinates.
extern "C" __global__ void gather_window(const float* __restrict__ vol, half* __restrict__ out, int C,
                                         int D, int H, int W, int sz, int sy, int sx, int pz, int py, int px,
                                         int rd, int rh, int rw, float cval) {
    i64 total = (i64)rd * rh * rw * C;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int c = (int)(e % C); i64 t = e / C;
        int x = (int)(t % rw); t /= rw;
        int y = (int)(t % rh); int z = (int)(t / rh);
        int vz = sz + z - pz, vy = sy + y - py, vx = sx + x - px;
        float v = cval;
        if (vz >= 0 && vz < D && vy >= 0 && vy < H && vx >= 0 && vx < W)
            v = vol[(((i64)c * D + vz) * H + vy) * W + vx];
        out[e] = __float2half(v);
    }
}

// acc: (C, D, H, W) f32, wsum: (D, H, W) f32; logits: one window (rd, rh, rw, C) NDHWC f16.
extern "C" __global__ void blend_window(const half* __restrict__ logits, const float* __restrict__ wmap,
                                        float* __restrict__ acc, float* __restrict__ wsum, int C, int D, int H,
                                        int W, int sz, int sy, int sx, int pz, int py, int px, int rd, int rh,
                                        int rw) {
    i64 total = (i64)rd * rh * rw;
    i64 S = (i64)D * H * W;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int x = (int)(e % rw); i64 t = e / rw;
        int y = (int)(t % rh); int z = (int)(t / rh);
        int vz = sz + z - pz, vy = sy + y - py, vx = sx + x - px;
        if (vz < 0 || vz >= D || vy < 0 || vy >= H || vx < 0 || vx >= W) continue;
        i64 v = ((i64)vz * H + vy) * W + vx;
        float w = wmap[e];
        const half* l = logits + e * C;
        for (int c = 0; c < C; c++) acc[c * S + v] += w * __half2float(l[c]);
        wsum[v] += w;
    }
}

extern "C" __global__ void blend_normalise(float* __restrict__ acc, const float* __restrict__ wsum, int C, i64 S) {
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < (i64)C * S; e += (i64)gridDim.x * blockDim.x) {
        float w = wsum[e % S];
        acc[e] = w > 0.f ? acc[e] / w : 0.f;
    }
}

// labels[v] = argmax_c acc[c][v] (first maximum wins, as numpy/torch argmax).
extern "C" __global__ void argmax_channels(const float* __restrict__ acc, unsigned char* __restrict__ labels,
                                           int C, i64 S) {
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < S; v += (i64)gridDim.x * blockDim.x) {
        float best = acc[v];
        int bi = 0;
        for (int c = 1; c < C; c++) {
            float a = acc[c * S + v];
            if (a > best) { best = a; bi = c; }
        }
        labels[v] = (unsigned char)bi;
    }
}
