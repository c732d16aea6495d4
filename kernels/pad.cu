// Pad (constant / reflect / edge; negative pads crop) and channel tiling on NDHWC fp16.
#define GRID_LOOP(e, total) \
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < (total); e += (i64)gridDim.x * blockDim.x)

// Input index that output index o reads along one axis, or -1 for the fill value; mirrors
// `AxisMap::source` in src/model/ops/pad.rs (input [lo, lo + len) kept, shifted by `shift`).
// mode: 0 constant, 1 reflect, 2 edge.
__device__ __forceinline__ int pad_src(int o, int lo, int len, int shift, int mode) {
    int j = o - shift;
    if (j < 0 || j >= len) {
        if (mode == 0) return -1;
        if (mode == 2 || len == 1) {
            j = j < 0 ? 0 : len - 1;
        } else {
            int p = 2 * (len - 1);
            j = ((j % p) + p) % p;
            if (j >= len) j = p - j;
        }
    }
    return lo + j;
}

// One output element per step: o* = output sizes, i* = input sizes, then (lo, len, shift)
// per axis in C, D, H, W order.
extern "C" __global__ void pad_ndhwc(const half* __restrict__ x, half* __restrict__ y, i64 total,
                                     int mode, float value, int ic, int id, int ih, int iw, int oc,
                                     int od, int oh, int ow, int clo, int clen, int csh, int dlo,
                                     int dlen, int dsh, int hlo, int hlen, int hsh, int wlo, int wlen,
                                     int wsh) {
    const half fill = __float2half(value);
    GRID_LOOP(e, total) {
        int c = (int)(e % oc); i64 t = e / oc;
        int w = (int)(t % ow); t /= ow;
        int h = (int)(t % oh); t /= oh;
        int d = (int)(t % od); i64 n = t / od;
        int sc = pad_src(c, clo, clen, csh, mode);
        int sd = pad_src(d, dlo, dlen, dsh, mode);
        int sh = pad_src(h, hlo, hlen, hsh, mode);
        int sw = pad_src(w, wlo, wlen, wsh, mode);
        if (sc < 0 || sd < 0 || sh < 0 || sw < 0) {
            y[e] = fill;
        } else {
            y[e] = x[(((n * id + sd) * ih + sh) * (i64)iw + sw) * ic + sc];
        }
    }
}

// y (P pixels x Cout) = x (P x Cin) with channel c read from c % Cin.
extern "C" __global__ void tile_channels(const half* __restrict__ x, half* __restrict__ y, i64 P, int Cin,
                                         int Cout) {
    GRID_LOOP(e, P * Cout) {
        i64 p = e / Cout;
        int c = (int)(e % Cout);
        y[e] = x[p * Cin + c % Cin];
    }
}
