// Shared by every kernel family: prepended to each .cu source before NVRTC compiles it
// (NVRTC has no file system view of kernels/, so the Rust side concatenates).
#include <cuda_fp16.h>

typedef long long i64;
#define NEG_INF (-__int_as_float(0x7f800000))

// Activation codes, kept in sync with `Act` in src/backend/cuda/plan.rs.
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
