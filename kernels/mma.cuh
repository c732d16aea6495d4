// The building blocks shared by the conv tile families (kernels/conv_mma.cu, conv_halo.cu,
// conv_wgmma.cu, conv_small.cu; sm_80+) and the tensor-core attention (attention.cu): 4-byte cp.async gathers,
// the halo tile order, ldmatrix (plain and .trans), the m16n8k16 fp16 mma and the conv epilogue
// store. Prepended (after common.cuh) to those families only
// (`Family::source`).

// 4-byte variant for the 2-half gathers (even Cin that is not a multiple of 8).
__device__ __forceinline__ void cp_async4_ca(half* smem, const half* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
    *reinterpret_cast<unsigned*>(smem) = bytes ? *reinterpret_cast<const unsigned*>(gmem) : 0u;
#endif
}

// One U-half piece (U 8: a 16-byte group; U 2: a 4-byte channel pair) from src to smem, or zeros
// where !ok (source size 0; `fallback` is a valid address that is not read).
template <int U>
__device__ __forceinline__ void cp_async_piece(half* dst, const half* src, const half* fallback, bool ok) {
    static_assert(U == 8 || U == 2, "16-byte groups or 4-byte pairs");
    if constexpr (U == 8)
        cp_async16(dst, ok ? src : fallback, ok ? 16 : 0);
    else
        cp_async4_ca(dst, ok ? src : fallback, ok ? 4 : 0);
}

// Tile t of a grid of ntz x nty x ntx tiles per sample -> batch index and output origin of its
// TZ x TY x TX tile (x fastest, then y, z, n): the halo kernels' tile order.
template <int TZ, int TY, int TX>
__device__ __forceinline__ void tile_origin(int t, int ntx, int nty, int ntz, int& n, int& oz0, int& oy0,
                                            int& ox0) {
    ox0 = (t % ntx) * TX;
    t /= ntx;
    oy0 = (t % nty) * TY;
    t /= nty;
    oz0 = (t % ntz) * TZ;
    n = t / ntz;
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const half* p) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
    r[0] = r[1] = r[2] = r[3] = 0u;
    __trap();
#endif
}

// ldmatrix with .trans: each 8x8 matrix arrives transposed (the B operand of P @ V from a
// row-major [key][feature] tile).
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const half* p) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
    r[0] = r[1] = r[2] = r[3] = 0u;
    __trap();
#endif
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// The bias of the lane's accumulator columns j * 8 + (lane % 4) * 2 + e (0 past `ncol` or
// without a bias).
template <int NT>
__device__ __forceinline__ void mma_bias_cols(float (&bj)[NT][2], const float* __restrict__ bias, int ncol, int lane) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int n = j * 8 + (lane & 3) * 2 + e;
            bj[j][e] = bias && n < ncol ? bias[n] : 0.f;
        }
}

// mma16816's B fragments of a weight matrix held as rows of K (row row0 + n for GEMM column n,
// `kpad` halves apart; columns n >= ncol read as zero), for the launch: k-step s, n-tile j
// (column j * 8 + lane / 4), K rows s * 16 + h * 8 + (lane % 4) * 2 + {0, 1}.
template <int KS, int NT>
__device__ __forceinline__ void mma_b_rows(unsigned (&bf)[KS][NT][2], const half* __restrict__ w, i64 row0, int kpad,
                                           int ncol, int lane) {
    const half zero = __float2half(0.f);
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int n = j * 8 + (lane >> 2), k = s * 16 + h * 8 + (lane & 3) * 2;
                __half2 v = __halves2half2(zero, zero);
                if (n < ncol) {
                    const half* wr = w + (row0 + n) * kpad + k;
                    v = __halves2half2(wr[0], wr[1]);
                }
                bf[s][j][h] = *reinterpret_cast<unsigned*>(&v);
            }
}

// Stores GEMM columns c, c+1 of one row (bias, activation): half2 when aligned, else one by one
// (with an odd Cout the scatter's next column can belong to the next tap). Out of line: the
// unrolled epilogue calls it MI x NI x 2 times; inlining it was measured slower on the H200
// (K1 113 -> 75 TF/s, W1 convs 30.5 -> 38.6 ms: register pressure in the main loop).
__device__ __noinline__ void conv_store(const ConvParams& p, half* __restrict__ y,
                                        const float* __restrict__ bias, const float* __restrict__ slope,
                                        i64 ob, int off, int co, int c, float v0, float v1, bool pair,
                                        bool scatter) {
    i64 o = ob + off;
    const i64 dst = o * p.ldc + p.coff + co;
    if (bias) v0 += bias[co];
    v0 = act_apply(v0, co, p.act, p.alpha, slope, p.slope_n);
    if (c + 1 >= p.cout) {
        out_store1(p, y, dst, v0);
        return;
    }
    int co1 = co + 1;
    i64 o1 = o;
    if (scatter && co1 == p.ocout) {
        int tap = (c + 1) / p.ocout;
        int qz = tap / (p.up_h * p.up_w), rem = tap - qz * p.up_h * p.up_w;
        int qy = rem / p.up_w, qx = rem - qy * p.up_w;
        o1 = ob + ((i64)qz * p.oh + qy) * p.ow + qx;
        co1 = 0;
    }
    if (bias) v1 += bias[co1];
    v1 = act_apply(v1, co1, p.act, p.alpha, slope, p.slope_n);
    if (pair) {
        out_store2(p, y, dst, v0, v1);
    } else {
        out_store1(p, y, o1 * p.ldc + p.coff + co1, v1);
        out_store1(p, y, dst, v0);
    }
}

// A thread's walk over the voxels v0, v0 + VS, v0 + 2 VS, ... of a box of HY x HX planes (x
// fastest; HY 1: rows of HX), for the halo and weight copies: the coordinates and a source offset are stepped, not
// divided out of each copy's index (the divisions cost a 4-byte copy ~55 SASS instructions
// where the copy itself takes ~10). `off` is the offset of (z, y, x) with steps ex, ey, ez along
// the axes. Checked on the CPU by `cuda::walk_emulation`.
template <int HY, int HX, int VS>
struct BoxWalk {
    static constexpr int HP = HY * HX, SZ = VS / HP, SY = VS % HP / HX, SX = VS % HX;
    int z, y, x;
    i64 off, d, wx, wy;  // offset, its step, and what a carry out of x / y adds
    __device__ __forceinline__ BoxWalk(int v0, i64 ex, i64 ey, i64 ez) {
        z = v0 / HP;
        const int r = v0 - z * HP;
        y = r / HX;
        x = r - y * HX;
        off = x * ex + y * ey + z * ez;
        d = SX * ex + SY * ey + SZ * ez;
        wx = (HY > 1 ? ey : ez) - HX * ex;  // HY 1: a row walk, x's carry goes to z
        wy = ez - HY * ey;
    }
    // Whether the walk's voxel, at (z0, y0, x0) + (z, y, x), is inside a d x h x w box.
    __device__ __forceinline__ bool inside(int z0, int y0, int x0, int d, int h, int w) const {
        return (unsigned)(z0 + z) < (unsigned)d && (unsigned)(y0 + y) < (unsigned)h && (unsigned)(x0 + x) < (unsigned)w;
    }
    __device__ __forceinline__ void step() {
        z += SZ;
        off += d;
        if (SX == 0 && SY == 0) return;  // whole planes (rows) a step: no carry
        x += SX;
        y += SY;
        if (x >= HX) {
            x -= HX;
            if (HY > 1) y++;
            else z++;
            off += wx;
        }
        if (HY > 1 && y >= HY) {
            y -= HY;
            z++;
            off += wy;
        }
    }
};

// The staged scatter epilogue of the upsampling and fused-parity GEMMs (conv_mma's VEC_EPI
// `convt_up_*`, conv_wgmma_k.cu's `conv_wgk_up_*`): NT threads (`tid` among them, `warp` its
// warp among them) have staged the fp32 tile at `cs` (TBM rows of TBN + 8 floats), each row's
// output base at `rb` (-1: none) and each column's bias at `bc`, and call this before any
// barrier; `sums`: shared floats for the column sums (ST), then the chunk offsets. ST: the norm
// statistics of the tile per output channel co (over its first `nrows` rows, CHECK: those with
// a base, `count` of them; the classes' columns of co; about row 0's value of class 0), one
// tile_stats.cuh entry at [blockIdx.x][co]. Then the stores: a chunk is 8 channels of one tap when Cout % 8
// == 0, landing contiguously at output voxel ob(row) + off(tap); else runs of up_w x Cout
// values of a dense output, or one value a lane. `bar`: the NT threads' barrier.
template <int TBM, int TBN, int NT, bool ST, bool CHECK, class Bar>
__device__ __forceinline__ void up_store_staged(const ConvParams& p, float* cs, i64* rb, float* bc, float* sums,
                                                int tid, int warp, int lane, int n0, int nrows, int count,
                                                half* __restrict__ y, const float* __restrict__ slope, Bar bar) {
    constexpr int CLD = TBN + 8, CH = TBN / 8;
    if constexpr (ST) {
        // (The chunk offsets below reuse the column sums' space once they are added.)
        float2* colsum = reinterpret_cast<float2*>(sums);
        bar();  // the staged tile and biases
        for (int c = tid; c < p.cout; c += NT) {
            const int co = c % p.ocout;
            const float shift = cs[co] + bc[co], b = bc[c];
            float a = 0.f, q = 0.f;
            for (int r = 0; r < nrows; r++) {
                if (CHECK && rb[r] < 0) continue;
                const float v = cs[r * CLD + c] + b - shift;
                a += v;
                q += v * v;
            }
            colsum[c] = make_float2(a, q);
        }
        bar();
        float4* part = reinterpret_cast<float4*>(p.stats) + (i64)blockIdx.x * p.ocout;
        const int blocks = p.cout / p.ocout;
        for (int co = tid; co < p.ocout; co += NT) {
            float a = 0.f, q = 0.f;
            for (int k = 0; k < blocks; k++) {
                a += colsum[k * p.ocout + co].x;
                q += colsum[k * p.ocout + co].y;
            }
            part[co] = make_float4(a, q, cs[co] + bc[co], (float)(count * blocks));
        }
        bar();
    }
    if (p.ocout % 8 == 0) {
        // Chunk ch (8 channels of one tap, Cout % 8 == 0) lands at output voxel
        // rb[row] + off[ch], channel co[ch]: staged once per tile.
        i64* off = reinterpret_cast<i64*>(sums);
        int* cof = reinterpret_cast<int*>(off + CH);
        for (int ch = tid; ch < CH; ch += NT) {
            const int c = n0 + ch * 8;
            const int tap = c / p.ocout;
            const int qz = tap / (p.up_h * p.up_w), rem = tap - qz * p.up_h * p.up_w;
            const int qy = rem / p.up_w, qx = rem - qy * p.up_w;
            off[ch] = c < p.cout ? ((i64)qz * p.oh + qy) * p.ow + qx : -1;
            cof[ch] = c - tap * p.ocout;
        }
        bar();
        const bool vec = ((p.ldc | p.coff) & 7) == 0;
        for (int idx = tid; idx < TBM * CH; idx += NT) {
            const int row = idx / CH, ch = idx - row * CH;
            const i64 ob = rb[row], oo = off[ch];
            if (ob < 0 || oo < 0) continue;
            const int co = cof[ch];
            const float4* a = reinterpret_cast<const float4*>(cs + row * CLD + ch * 8);
            const float4* bb = reinterpret_cast<const float4*>(bc + ch * 8);
            const float4 a0 = a[0], a1 = a[1], b0 = bb[0], b1 = bb[1];
            float v[8] = {a0.x + b0.x, a0.y + b0.y, a0.z + b0.z, a0.w + b0.w,
                          a1.x + b1.x, a1.y + b1.y, a1.z + b1.z, a1.w + b1.w};
            act8(v, co, p, slope);
            const i64 dst = (ob + oo) * p.ldc + p.coff + co;
            if (vec) {
                out_store8(p, y, dst, v);
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) out_store1(p, y, dst + q, v[q]);
            }
        }
        return;
    }
    bar();
    // Any Cout (the fused parity classes of W2's 32 -> 14). Row r's taps (qz, qy,
    // 0..up_w-1) x Cout channels are up_w * Cout contiguous values of a dense output.
    const int per = p.up_w * p.ocout, G = p.up_d * p.up_h;
    if (p.ldc == p.ocout && p.coff == 0 && per % 4 == 0) {
        // Dense: one thread per 4 values of a run (16 or 8 bytes, aligned: every term of
        // the output index is a multiple of up_w * Cout or of Cout * ow).
        const int Q = per / 4;
        for (int idx = tid; idx < G * TBM * Q; idx += NT) {
            const int gr = idx / Q, q = idx - gr * Q;
            const int g = gr / TBM, row = gr - g * TBM;
            const int c = g * per + q * 4;
            const i64 ob = rb[row];
            if (ob < 0 || c < n0 || c >= n0 + TBN) continue;
            const int qz = g / p.up_h, qy = g - qz * p.up_h;
            const i64 dst = (ob + ((i64)qz * p.oh + qy) * p.ow) * p.ocout + q * 4;
            const float4 a = *reinterpret_cast<const float4*>(cs + row * CLD + (c - n0));
            const float4 b = *reinterpret_cast<const float4*>(bc + (c - n0));
            float u[4] = {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w};
            if (p.act != ACT_NONE) {
#pragma unroll
                for (int k = 0; k < 4; k++)
                    u[k] = act_apply(u[k], (c + k) % p.ocout, p.act, p.alpha, slope, p.slope_n);
            }
            if (p.out_f32) {
                *reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + dst) =
                    make_float4(u[0], u[1], u[2], u[3]);
            } else {
                __align__(8) __half2 h[2] = {__floats2half2_rn(u[0], u[1]), __floats2half2_rn(u[2], u[3])};
                *reinterpret_cast<uint2*>(y + dst) = *reinterpret_cast<const uint2*>(h);
            }
        }
        return;
    }
    // A concat slice or an odd run: a warp per (row, tap row), one value per lane.
    for (int u = warp; u < G * TBM; u += NT / 32) {
        const int g = u / TBM, row = u - g * TBM;
        const i64 ob = rb[row];
        if (ob < 0) continue;
        const int qz = g / p.up_h, qy = g - qz * p.up_h;
        const i64 o0 = ob + ((i64)qz * p.oh + qy) * p.ow;
        for (int e = lane; e < per; e += 32) {
            const int qx = e / p.ocout, co = e - qx * p.ocout;
            const int c = g * per + e;
            if (c < n0 || c >= n0 + TBN) continue;
            const float u0 = cs[row * CLD + (c - n0)] + bc[c - n0];
            out_store1(p, y, (o0 + qx) * p.ldc + p.coff + co,
                       act_apply(u0, co, p.act, p.alpha, slope, p.slope_n));
        }
    }
}
