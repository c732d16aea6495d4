// MaxPool / AveragePool and Resize (nearest / trilinear) on NDHWC fp16, one thread per output.
struct PoolParams {
    int n, di, hi, wi, c;
    int do_, ho, wo;
    int kd, kh, kw;
    int sd, sh, sw;
    int dd, dh, dw;
    int pd, ph, pw;      // begin pads
    int ped, peh, pew;   // end pads
    int is_max, count_include_pad;
};

extern "C" __global__ void pool_kernel(PoolParams p, const half* __restrict__ x, half* __restrict__ y) {
    i64 total = (i64)p.n * p.do_ * p.ho * p.wo * p.c;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int c = (int)(e % p.c); i64 t = e / p.c;
        int ox = (int)(t % p.wo); t /= p.wo;
        int oy = (int)(t % p.ho); t /= p.ho;
        int oz = (int)(t % p.do_); i64 n = t / p.do_;
        float mx = NEG_INF, s = 0.f;
        int valid = 0, padded = 0;
        for (int a = 0; a < p.kd; a++) {
            int iz = oz * p.sd - p.pd + a * p.dd;
            bool inz = iz >= -p.pd && iz < p.di + p.ped;
            for (int b = 0; b < p.kh; b++) {
                int iy = oy * p.sh - p.ph + b * p.dh;
                bool iny = iy >= -p.ph && iy < p.hi + p.peh;
                for (int q = 0; q < p.kw; q++) {
                    int ix = ox * p.sw - p.pw + q * p.dw;
                    bool inx = ix >= -p.pw && ix < p.wi + p.pew;
                    if (inz && iny && inx) padded++;
                    if (iz < 0 || iz >= p.di || iy < 0 || iy >= p.hi || ix < 0 || ix >= p.wi) continue;
                    float v = __half2float(x[(((n * p.di + iz) * p.hi + iy) * p.wi + ix) * p.c + c]);
                    mx = fmaxf(mx, v);
                    s += v;
                    valid++;
                }
            }
        }
        float r;
        if (p.is_max) r = mx;
        else r = s / (float)(p.count_include_pad ? padded : valid);
        y[e] = __float2half(r);
    }
}

// coord: 0 half_pixel, 1 pytorch_half_pixel, 2 align_corners, 3 asymmetric
__device__ __forceinline__ float src_coord(int o, int in, int out, float scale, int coord) {
    switch (coord) {
    case 0: return (o + 0.5f) / scale - 0.5f;
    case 1: return out > 1 ? (o + 0.5f) / scale - 0.5f : 0.f;
    case 2: return out == 1 ? 0.f : (float)o * (float)(in - 1) / (float)(out - 1);
    default: return o / scale;
    }
}

// nearest: 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil
__device__ __forceinline__ int nearest_idx(float f, int in, int mode) {
    int i;
    switch (mode) {
    case 0: i = (int)ceilf(f - 0.5f); break;
    case 1: i = (int)floorf(f + 0.5f); break;
    case 2: i = (int)floorf(f); break;
    default: i = (int)ceilf(f); break;
    }
    return i < 0 ? 0 : (i >= in ? in - 1 : i);
}

extern "C" __global__ void resize_kernel(const half* __restrict__ x, half* __restrict__ y, int N, int C,
                                         int di, int hi, int wi, int do_, int ho, int wo,
                                         float sd, float sh, float sw, int linear, int coord, int nmode) {
    i64 total = (i64)N * do_ * ho * wo * C;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int c = (int)(e % C); i64 t = e / C;
        int ox = (int)(t % wo); t /= wo;
        int oy = (int)(t % ho); t /= ho;
        int oz = (int)(t % do_); i64 n = t / do_;
        float fz = src_coord(oz, di, do_, sd, coord);
        float fy = src_coord(oy, hi, ho, sh, coord);
        float fx = src_coord(ox, wi, wo, sw, coord);
        const half* xn = x + n * di * hi * wi * C;
        float r;
        if (!linear) {
            int iz = nearest_idx(fz, di, nmode), iy = nearest_idx(fy, hi, nmode), ix = nearest_idx(fx, wi, nmode);
            r = __half2float(xn[(((i64)iz * hi + iy) * wi + ix) * C + c]);
        } else {
            fz = fminf(fmaxf(fz, 0.f), (float)(di - 1));
            fy = fminf(fmaxf(fy, 0.f), (float)(hi - 1));
            fx = fminf(fmaxf(fx, 0.f), (float)(wi - 1));
            int z0 = (int)floorf(fz), y0 = (int)floorf(fy), x0 = (int)floorf(fx);
            int z1 = min(z0 + 1, di - 1), y1 = min(y0 + 1, hi - 1), x1 = min(x0 + 1, wi - 1);
            float az = fz - z0, ay = fy - y0, ax = fx - x0;
            r = 0.f;
            for (int a = 0; a < 2; a++) {
                int zz = a ? z1 : z0; float wz = a ? az : 1.f - az;
                for (int b = 0; b < 2; b++) {
                    int yy = b ? y1 : y0; float wy = b ? ay : 1.f - ay;
                    for (int q = 0; q < 2; q++) {
                        int xx = q ? x1 : x0; float wx = q ? ax : 1.f - ax;
                        r += wz * wy * wx * __half2float(xn[(((i64)zz * hi + yy) * wi + xx) * C + c]);
                    }
                }
            }
        }
        y[e] = __float2half(r);
    }
}
