// Shared by every kernel family: prepended to each .cu source before NVRTC compiles it
// (NVRTC has no file system view of kernels/, so the Rust side concatenates).
#include <cuda_fp16.h>

typedef long long i64;
#define NEG_INF (-__int_as_float(0x7f800000))

// Activation codes, kept in sync with `Act` in src/backend/cuda/abi.rs.
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY 2
#define ACT_PRELU 3
#define ACT_ELU 4
#define ACT_SIGMOID 5
#define ACT_TANH 6

// One activation applied in an epilogue; `slope` is PRelu's per-channel slope (slope_n 1 or C).
__device__ __forceinline__ float act_apply(float v, int c, int act, float alpha,
                                           const float* __restrict__ slope, int slope_n) {
    switch (act) {
    case ACT_RELU: return v > 0.f ? v : 0.f;
    case ACT_LEAKY: return v >= 0.f ? v : alpha * v;
    case ACT_PRELU: return v >= 0.f ? v : slope[slope_n == 1 ? 0 : c] * v;
    case ACT_ELU: return v > 0.f ? v : alpha * (__expf(v) - 1.f);
    case ACT_SIGMOID: return 1.f / (1.f + __expf(-v));
    case ACT_TANH: return tanhf(v);
    default: return v;
    }
}

// An activation code fixed at compile time (ACT >= 0: act_apply's switch folds away) or read at
// run time (ACT_ANY). A loop over values that takes the switch once (BY_ACT) rather than per
// value avoids an indirect branch between dependent loads; the same expression either way.
#define ACT_ANY (-1)
template <int ACT>
__device__ __forceinline__ float act_of(float v, int c, int act, float alpha, const float* __restrict__ slope,
                                        int slope_n) {
    return act_apply(v, c, ACT == ACT_ANY ? act : ACT, alpha, slope, slope_n);
}
// Runs the statement in which ACT_T names the activation `act` as a constant where it is one the
// networks use, ACT_ANY for the rest.
#define BY_ACT(act, ...)                                                                               \
    switch (act) {                                                                                      \
    case ACT_NONE: { constexpr int ACT_T = ACT_NONE; __VA_ARGS__; } break;                              \
    case ACT_RELU: { constexpr int ACT_T = ACT_RELU; __VA_ARGS__; } break;                              \
    case ACT_LEAKY: { constexpr int ACT_T = ACT_LEAKY; __VA_ARGS__; } break;                            \
    case ACT_PRELU: { constexpr int ACT_T = ACT_PRELU; __VA_ARGS__; } break;                            \
    default: { constexpr int ACT_T = ACT_ANY; __VA_ARGS__; }                                            \
    }

// fp16 or fp32 activations as float (the norms' inputs, a head reading a norm's input).
__device__ __forceinline__ float to_f(half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(float v) { return v; }

// Eight consecutive input values from x + i (i % 8 == 0): one 16-byte load of halves, two of floats.
__device__ __forceinline__ void load8(const half* __restrict__ x, i64 i, float (&v)[8]) {
    uint4 u = __ldg(reinterpret_cast<const uint4*>(x + i));
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __half22float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
__device__ __forceinline__ void load8(const float* __restrict__ x, i64 i, float (&v)[8]) {
    float4 a = __ldg(reinterpret_cast<const float4*>(x + i));
    float4 b = __ldg(reinterpret_cast<const float4*>(x + i) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Parameters of every conv kernel (conv_*.cu); mirrors `ConvParams` in
// src/backend/cuda/abi.rs field by field.
struct ConvParams {
    int n, di, hi, wi, cin;
    int do_, ho, wo, cout;   // GEMM view: output dims and GEMM columns (= Cout, or taps*Cout when scattering)
    int kd, kh, kw;
    int sd, sh, sw;
    int pd, ph, pw;   // begin pads
    int dd, dh, dw;   // dilations
    int transposed;
    int kpad;         // padded K = row length of the weight matrix
    int groups;       // direct kernel only
    int ldc, coff;    // output channel stride and offset (writing into a concat slice)
    int act;
    float alpha;
    int slope_n;
    // Scatter epilogue of the kernel==stride transposed conv run as a GEMM: GEMM column
    // j = tap * ocout + co goes to output voxel (i * up + tap) of an od x oh x ow output.
    int up_d, up_h, up_w;  // 0: no scatter
    int ocout;
    int od, oh, ow;
    int out_f32;      // 1: y is fp32 (a value only a norm reads), indexed as the fp16 one would be; OUT_SHIFTED: fp16 less the tile's shift
    int ksplit;       // conv_mma: K split over grid.z (> 1: partials to ws, conv_splitk_reduce)
    int accum;        // conv_wz_*: 1: y (fp32) += this launch's sums (a conv over a concat, one launch per part)
    int ldi;          // conv_wz_*: the input's channel stride (x points at the launch's first channel: Cin chunks of a wider input)
    unsigned long long ws;  // fp32 [ksplit][M][cout] partial sums
    unsigned long long res; // fp16 residual indexed as y (a fused Add; conv_wg_* only), 0: none
    unsigned long long stats; // float4 [tile][cout]: the output's norm statistics (tile_stats.cuh), 0: none
};

// A conv reading the input of the InstanceNorm / GroupNorm before it, whose statistics are
// done, normalised and activated on load as the norm's own output would be (`conv1x1_norm_*`,
// `conv_wz_*_nl`): the norm's (a, b) pairs per (sample, channel), the norm input's type and the
// activation after the norm.
struct NormLoad {
    const float* ab;  // [n][C] (a, b) pairs
    int x_f32, act;
    float alpha;
    const float* slope;
    int slope_n;
};

// The norm's output value of input v in channel c (a, b its pair), rounded to fp16 as the
// norm's affine pass stores it.
__device__ __forceinline__ half norm_load1(float v, float2 ab, int c, const NormLoad& nl) {
    return __float2half(act_apply(v * ab.x + ab.y, c, nl.act, nl.alpha, nl.slope, nl.slope_n));
}

// norm_load1 over the 8 values of channels c..c+7 with their pairs `ab`, as floats, the
// activation's switch taken once per piece: a switch per value is an indirect branch between
// dependent loads. Each case is norm_load1's expression with the activation fixed, so the same
// values.
template <int ACT>
__device__ __forceinline__ void norm_load8_t(float (&v)[8], const float2 (&ab)[8], int c, const NormLoad& nl) {
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = __half2float(__float2half(act_apply(v[k] * ab[k].x + ab[k].y, c + k, ACT, nl.alpha, nl.slope, nl.slope_n)));
}
__device__ __forceinline__ void norm_load8(float (&v)[8], const float2 (&ab)[8], int c, const NormLoad& nl) {
    switch (nl.act) {
    case ACT_NONE: return norm_load8_t<ACT_NONE>(v, ab, c, nl);
    case ACT_RELU: return norm_load8_t<ACT_RELU>(v, ab, c, nl);
    case ACT_LEAKY: return norm_load8_t<ACT_LEAKY>(v, ab, c, nl);
    case ACT_PRELU: return norm_load8_t<ACT_PRELU>(v, ab, c, nl);
    default:
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __half2float(norm_load1(v[k], ab[k], c + k, nl));
    }
}

// One activation over 8 values of channels c..c+7 (the switch once per piece, not per value).
__device__ __forceinline__ void act8(float (&v)[8], int c, const ConvParams& p, const float* __restrict__ slope) {
    switch (p.act) {
    case ACT_NONE: return;
    case ACT_RELU:
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = fmaxf(v[k], 0.f);
        return;
    case ACT_LEAKY:
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = v[k] >= 0.f ? v[k] : p.alpha * v[k];
        return;
    default:
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = act_apply(v[k], c + k, p.act, p.alpha, slope, p.slope_n);
    }
}

// Input coordinate (conv_wmma_legacy.cu, conv_transpose.cu) of output coordinate `o` through tap `k` along one axis, or -1 when none.
__device__ __forceinline__ int in_coord(int o, int k, int s, int p, int d, int n, int transposed) {
    if (!transposed) {
        int i = o * s - p + k * d;
        return (i >= 0 && i < n) ? i : -1;
    }
    int num = o + p - k * d;
    if (num < 0) return -1;
    int i = num / s;
    return (i * s == num && i < n) ? i : -1;
}

// Output stores of the conv epilogues: element i of y, fp16 or fp32 by p.out_f32. A conv whose
// only reader is InstanceNorm/GroupNorm keeps its output in fp32: the norm divides by the
// channel's spread, so fp16 rounding relative to the raw value grows relative to the result.
__device__ __forceinline__ void out_store1(const ConvParams& p, half* y, i64 i, float v) {
    if (p.out_f32) reinterpret_cast<float*>(y)[i] = v;
    else y[i] = __float2half(v);
}
// Two adjacent elements (i even, y 4-byte aligned as fp16 / 8-byte as fp32).
__device__ __forceinline__ void out_store2(const ConvParams& p, half* y, i64 i, float v0, float v1) {
    if (p.out_f32) *reinterpret_cast<float2*>(reinterpret_cast<float*>(y) + i) = make_float2(v0, v1);
    else *reinterpret_cast<__half2*>(y + i) = __floats2half2_rn(v0, v1);
}
// Eight adjacent fp16 elements (i % 8 == 0): one 16-byte store.
__device__ __forceinline__ void store8_half(half* y, i64 i, const float (&v)[8]) {
    __align__(16) __half2 o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4*>(y + i) = *reinterpret_cast<const uint4*>(o);
}
// Eight adjacent elements (i % 8 == 0): one 16-byte store, or two as fp32.
__device__ __forceinline__ void out_store8(const ConvParams& p, half* y, i64 i, const float (&v)[8]) {
    if (p.out_f32) {
        float4* d = reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + i);
        d[0] = make_float4(v[0], v[1], v[2], v[3]);
        d[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        store8_half(y, i, v);
    }
}
// `ConvParams::out_f32` of a conv whose `_st` twin stores fp16 values less their tile's shift
// (`CudaOptions::norm_shifted`; the z-pair helper's stores and `conv_c1_k3_st`): the norm after it adds the
// shift back (`affine_act_v8_shifted` in norm.cu).
#define OUT_SHIFTED 2

// Binary ops shared by eltwise.cu and tensor.cu (codes of `Bin` and `math::code`).
// op: 0 add, 1 mul, 2 sub, 3 div
__device__ __forceinline__ float bin(float a, float b, int op) {
    switch (op) {
    case 0: return a + b;
    case 1: return a * b;
    case 2: return a - b;
    default: return a / b;
    }
}

// powf under --use_fast_math is exp2(b * log2(a)): NaN for a negative base even when the
// exponent is an integer, and 0^0 = NaN; C's pow (and PyTorch) give -8 for (-2)^3 and 1 for 0^0.
__device__ __forceinline__ float pow_real(float a, float b) {
    if (b == 0.f) return 1.f;
    if (a >= 0.f) return powf(a, b);
    if (truncf(b) != b) return __int_as_float(0x7fc00000);
    float m = powf(-a, b);
    return fmodf(b, 2.f) != 0.f ? -m : m;
}

// op: bin's codes, then 4 max, 5 min, 6 pow.
__device__ __forceinline__ float bin_any(float a, float b, int op) {
    switch (op) {
    case 4: return fmaxf(a, b);
    case 5: return fminf(a, b);
    case 6: return pow_real(a, b);
    default: return bin(a, b, op);
    }
}

// 16-byte global->shared copy; `bytes` 0 zero-fills (cp.async on sm_80+, plain copy before).
__device__ __forceinline__ void cp_async16(half* smem, const half* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
    *reinterpret_cast<uint4*>(smem) = bytes ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
