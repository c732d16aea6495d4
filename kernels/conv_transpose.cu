// Direct (CUDA core, fp32 accumulate) convolution for what the implicit GEMMs (conv_mma.cu,
// conv_wmma_legacy.cu) do not take: grouped / depthwise convs and grouped transposed convs. One
// thread per output element.
// The weight layout is the GEMM's: [Cout][kd][kh][kw][Cin/groups] fp16, row length `kpad`.
// (Ungrouped transposed convs run as mma parity classes or through conv_wmma_legacy.cu's gather
// formulation.)

extern "C" __global__ void conv_direct(ConvParams p, const half* __restrict__ x,
                                       const half* __restrict__ w, const float* __restrict__ bias,
                                       half* __restrict__ y, const float* __restrict__ slope) {
    i64 total = (i64)p.n * p.do_ * p.ho * p.wo * p.cout;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        int co = (int)(e % p.cout);
        i64 m = e / p.cout;
        int ox = (int)(m % p.wo); i64 t = m / p.wo;
        int oy = (int)(t % p.ho); t /= p.ho;
        int oz = (int)(t % p.do_); int n = (int)(t / p.do_);
        int cin_g = p.cin / p.groups, cout_g = p.cout / p.groups;
        int g = co / cout_g;
        const half* wr = w + (i64)co * p.kpad;
        float acc = 0.f;
        for (int tz = 0; tz < p.kd; tz++) {
            int iz = in_coord(oz, tz, p.sd, p.pd, p.dd, p.di, p.transposed);
            if (iz < 0) continue;
            for (int ty = 0; ty < p.kh; ty++) {
                int iy = in_coord(oy, ty, p.sh, p.ph, p.dh, p.hi, p.transposed);
                if (iy < 0) continue;
                for (int tx = 0; tx < p.kw; tx++) {
                    int ix = in_coord(ox, tx, p.sw, p.pw, p.dw, p.wi, p.transposed);
                    if (ix < 0) continue;
                    const half* xr = x + ((((i64)n * p.di + iz) * p.hi + iy) * p.wi + ix) * p.cin + g * cin_g;
                    const half* wt = wr + ((tz * p.kh + ty) * p.kw + tx) * cin_g;
                    for (int ci = 0; ci < cin_g; ci++) acc += __half2float(xr[ci]) * __half2float(wt[ci]);
                }
            }
        }
        if (bias) acc += bias[co];
        acc = act_apply(acc, co, p.act, p.alpha, slope, p.slope_n);
        out_store1(p, y, m * p.ldc + p.coff + co, acc);
    }
}
