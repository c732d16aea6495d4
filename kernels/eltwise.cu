// Elementwise ops, channel concat, channel softmax and layout conversion on NDHWC fp16.
#define GRID_LOOP(e, total) \
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < (total); e += (i64)gridDim.x * blockDim.x)

extern "C" __global__ void act_kernel(const half* __restrict__ x, half* __restrict__ y, i64 total, int C,
                                      int act, float alpha, const float* __restrict__ slope, int slope_n) {
    GRID_LOOP(e, total) {
        y[e] = __float2half(act_apply(__half2float(x[e]), (int)(e % C), act, alpha, slope, slope_n));
    }
}

// y may be a channel slice [coff, coff+C) of a buffer with ldc channels (a concat written in place).
extern "C" __global__ void binary_kernel(const half* __restrict__ a, const half* __restrict__ b,
                                         half* __restrict__ y, i64 total, int op, int C, int ldc, int coff) {
    GRID_LOOP(e, total) {
        i64 o = ldc == C ? e + coff : (e / C) * ldc + coff + e % C;
        y[o] = __float2half(bin(__half2float(a[e]), __half2float(b[e]), op));
    }
}

// binary_kernel on 16-byte vectors: C, ldc, coff multiples of 8 (total = pixels * C).
extern "C" __global__ void binary_v8(const half* __restrict__ a, const half* __restrict__ b,
                                     half* __restrict__ y, i64 total, int op, int C, int ldc, int coff) {
    const int vpp = C >> 3;
    GRID_LOOP(e, total >> 3) {
        uint4 ua = reinterpret_cast<const uint4*>(a)[e], ub = reinterpret_cast<const uint4*>(b)[e];
        const __half2* ha = reinterpret_cast<const __half2*>(&ua);
        const __half2* hb = reinterpret_cast<const __half2*>(&ub);
        uint4 uy;
        __half2* hy = reinterpret_cast<__half2*>(&uy);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 fa = __half22float2(ha[k]), fb = __half22float2(hb[k]);
            hy[k] = __floats2half2_rn(bin(fa.x, fb.x, op), bin(fa.y, fb.y, op));
        }
        i64 p = e / vpp;
        int cv = (int)(e - p * vpp);
        *reinterpret_cast<uint4*>(y + p * ldc + coff + cv * 8) = uy;
    }
}

// x (op) k where k is an f32 NCDHW constant broadcast to x: ks = its element strides in N,C,D,H,W
// order with 0 on broadcast axes; dims = x's N, D, H, W, C.
extern "C" __global__ void binary_const_kernel(const half* __restrict__ x, const float* __restrict__ k,
                                               half* __restrict__ y, int D, int H, int W, int C,
                                               i64 total, i64 ksn, i64 ksc, i64 ksd, i64 ksh, i64 ksw,
                                               int op) {
    GRID_LOOP(e, total) {
        int c = (int)(e % C); i64 t = e / C;
        int w = (int)(t % W); t /= W;
        int h = (int)(t % H); t /= H;
        int d = (int)(t % D); i64 n = t / D;
        float kv = k[n * ksn + c * ksc + d * ksd + h * ksh + w * ksw];
        y[e] = __float2half(bin(__half2float(x[e]), kv, op));
    }
}

// Writes x (P pixels x Cin) into channels [coff, coff+Cin) of y (P x Ctot).
extern "C" __global__ void concat_copy(const half* __restrict__ x, half* __restrict__ y, i64 P, int Cin,
                                       int Ctot, int coff) {
    GRID_LOOP(e, P * Cin) {
        i64 p = e / Cin;
        int c = (int)(e % Cin);
        y[p * Ctot + coff + c] = x[e];
    }
}

// concat_copy on 16-byte vectors: Cin, Ctot, coff multiples of 8.
extern "C" __global__ void concat_copy_v8(const half* __restrict__ x, half* __restrict__ y, i64 P, int Cin,
                                          int Ctot, int coff) {
    const int vpp = Cin >> 3;
    GRID_LOOP(e, P * vpp) {
        i64 p = e / vpp;
        int cv = (int)(e - p * vpp);
        *reinterpret_cast<uint4*>(y + p * Ctot + coff + cv * 8) = reinterpret_cast<const uint4*>(x)[e];
    }
}

// act_kernel on 16-byte vectors (C % 8 == 0).
extern "C" __global__ void act_v8(const half* __restrict__ x, half* __restrict__ y, i64 total, int C,
                                  int act, float alpha, const float* __restrict__ slope, int slope_n) {
    const int vpp = C >> 3;
    GRID_LOOP(e, total >> 3) {
        const int c0 = (int)(e % vpp) * 8;
        uint4 u = reinterpret_cast<const uint4*>(x)[e];
        __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 f = __half22float2(h[k]);
            h[k] = __floats2half2_rn(act_apply(f.x, c0 + 2 * k, act, alpha, slope, slope_n),
                                     act_apply(f.y, c0 + 2 * k + 1, act, alpha, slope, slope_n));
        }
        reinterpret_cast<uint4*>(y)[e] = u;
    }
}

extern "C" __global__ void copy_half(const half* __restrict__ x, half* __restrict__ y, i64 total) {
    GRID_LOOP(e, total) { y[e] = x[e]; }
}

extern "C" __global__ void fill_half(half* __restrict__ y, i64 total, float v) {
    GRID_LOOP(e, total) { y[e] = __float2half(v); }
}

// Softmax over the channels of each pixel (fp32 math).
extern "C" __global__ void softmax_channels(const half* __restrict__ x, half* __restrict__ y, i64 P, int C) {
    GRID_LOOP(p, P) {
        const half* xp = x + p * C;
        half* yp = y + p * C;
        float mx = NEG_INF;
        for (int c = 0; c < C; c++) mx = fmaxf(mx, __half2float(xp[c]));
        float s = 0.f;
        for (int c = 0; c < C; c++) s += __expf(__half2float(xp[c]) - mx);
        float inv = 1.f / s;
        for (int c = 0; c < C; c++) yp[c] = __float2half(__expf(__half2float(xp[c]) - mx) * inv);
    }
}

// NCDHW f32 -> NDHWC f16 (S = D*H*W).
extern "C" __global__ void ncdhw_to_ndhwc(const float* __restrict__ x, half* __restrict__ y, int N, int C, i64 S) {
    GRID_LOOP(e, (i64)N * C * S) {
        int c = (int)(e % C); i64 t = e / C;
        i64 s = t % S; i64 n = t / S;
        y[e] = __float2half(x[(n * C + c) * S + s]);
    }
}

// NDHWC f16 -> NCDHW f32.
extern "C" __global__ void ndhwc_to_ncdhw(const half* __restrict__ x, float* __restrict__ y, int N, int C, i64 S) {
    GRID_LOOP(e, (i64)N * C * S) {
        i64 s = e % S; i64 t = e / S;
        int c = (int)(t % C); i64 n = t / C;
        y[e] = __half2float(x[(n * S + s) * C + c]);
    }
}

// One-input functions, codes of `Pointwise::code` in src/model/ops/pointwise.rs (fp32 math,
// full-precision erff/tanhf/expf/logf: the fp16 output is the only rounding that matters).

// v rounded to bfloat16 (to nearest even) and back; infinities and NaN pass (Pointwise::RoundBf16).
__device__ __forceinline__ float bf16_round(float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7f800000u) == 0x7f800000u) return v;
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

__device__ __forceinline__ float pointwise_apply(float v, int f, float p0, float p1) {
    switch (f) {
    case 0: return erff(v);
    case 1: return p0 != 0.f ? 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                             : 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    case 2: return fmaxf(v, 0.f) + log1pf(expf(-fabsf(v)));
    case 3: return v * tanhf(fmaxf(v, 0.f) + log1pf(expf(-fabsf(v))));
    case 4: return v * fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f);
    case 5: return fminf(fmaxf(p0 * v + p1, 0.f), 1.f);
    case 6: return expf(v);
    case 7: return logf(v);
    case 8: return sqrtf(v);
    case 9: return fabsf(v);
    case 10: return -v;
    case 11: return 1.f / v;
    case 12: return pow_real(v, p0);
    case 14: return __half2float(__float2half_rn(v));
    case 15: return bf16_round(v);
    default: return fminf(fmaxf(v, p0), p1);
    }
}

extern "C" __global__ void pointwise_kernel(const half* __restrict__ x, half* __restrict__ y, i64 total,
                                            int f, float p0, float p1) {
    GRID_LOOP(e, total) { y[e] = __float2half(pointwise_apply(__half2float(x[e]), f, p0, p1)); }
}


// y = a (op) b with numpy broadcasting: y is N x D x H x W x C (NDHWC, C innermost), each
// operand is read at element strides (sn, sd, sh, sw, sc), 0 along the axes it is broadcast
// over. y may be a channel slice [coff, coff+C) of a buffer with ldc channels.
extern "C" __global__ void binary_bcast_kernel(const half* __restrict__ a, const half* __restrict__ b,
                                               half* __restrict__ y, i64 total, int D, int H, int W,
                                               int C, i64 an, i64 ad, i64 ah, i64 aw, i64 ac, i64 bn,
                                               i64 bd, i64 bh, i64 bw, i64 bc, int op, int ldc, int coff) {
    GRID_LOOP(e, total) {
        int c = (int)(e % C); i64 t = e / C;
        int w = (int)(t % W); t /= W;
        int h = (int)(t % H); t /= H;
        int d = (int)(t % D); i64 n = t / D;
        float va = __half2float(a[n * an + d * ad + h * ah + w * aw + c * ac]);
        float vb = __half2float(b[n * bn + d * bd + h * bh + w * bw + c * bc]);
        y[(e / C) * ldc + coff + c] = __float2half(bin_any(va, vb, op));
    }
}
