//! ConvTranspose as a GEMM + col2im scatter-add over NCDHW (chunked over input rows so the column
//! buffer stays under [`COL_BUDGET_BYTES`]); Conv runs the direct kernel of `direct.rs`. The ONNX
//! ConvTranspose weight layout is already the GEMM operand, so nothing is re-laid.

use super::gemm::{gemm, Mat};
use super::{dims, err, standard, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::Shape;
use crate::model::graph::{Conv, ConvTranspose, Op};
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

/// Upper bound of one col2im buffer. Small on purpose: the buffer is written and then
/// re-read by the GEMM's packing, so keeping it cache-resident matters more than few GEMM calls.
pub const COL_BUDGET_BYTES: usize = 4 << 20;

/// The half-open range of `o` in `0..count` for which `o * s + off` lies in `0..limit`.
#[inline]
fn valid_range(count: usize, s: usize, off: isize, limit: usize) -> (usize, usize) {
    let s = s as isize;
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let hi = if limit as isize - off <= 0 {
        0
    } else {
        (limit as isize - off + s - 1) / s
    };
    let hi = (hi.max(0) as usize).min(count);
    let lo = (lo as usize).min(hi);
    (lo, hi)
}

fn fill_bias<T: Real>(out: &mut [T], bias: Option<&[T]>, channels: usize, plane: usize) {
    if let Some(b) = bias {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(i, p)| p.fill(b[i % channels]));
    }
}

/// Rows per chunk so that `k_rows * rows * row_len` elements fit the budget (at least one row).
fn chunk_rows<T>(k_rows: usize, row_len: usize, total_rows: usize) -> usize {
    let per_row = (k_rows * row_len * std::mem::size_of::<T>()).max(1);
    (COL_BUDGET_BYTES / per_row).clamp(1, total_rows.max(1))
}

/// ONNX Conv (3D, NCDHW) with groups, stride, dilation and asymmetric pads (see `direct.rs`).
pub fn conv3d<T: Real>(x: ArrayView5<T>, p: &Conv) -> Result<Array5<T>> {
    super::direct::conv3d_fused(x, p, None)
}

/// Workspace bytes (f32) one conv node allocates besides its output: the direct Conv's packed
/// weights and per-thread row stacks, or the ConvTranspose column buffer; 0 for other ops.
pub fn conv_workspace_bytes(op: &Op, x: Shape, y: Shape) -> u64 {
    match op {
        Op::Conv(c) => super::direct::conv_workspace(c, x, y),
        Op::ConvTranspose(c) => {
            let ws = &c.weight.shape;
            let mrows = (y[1] / c.groups.max(1)) * ws[2] * ws[3] * ws[4];
            let rows = chunk_rows::<f32>(mrows, x[4], x[2] * x[3]);
            (mrows * rows * x[4] * std::mem::size_of::<f32>()) as u64
        }
        _ => 0,
    }
}

/// ONNX ConvTranspose (3D, NCDHW) with groups, stride, dilation, asymmetric pads and
/// output_padding; weight `[Cin, Cout/groups, kd, kh, kw]`.
pub fn conv_transpose3d<T: Real>(x: ArrayView5<T>, p: &ConvTranspose) -> Result<Array5<T>> {
    let xs = dims(&x);
    let os = p.output_shape(&xs).map_err(err)?;
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err("ConvTranspose input is not contiguous".into()))?;
    let w = T::cast_slice(&p.weight.data);
    let bias = p.bias.as_ref().map(|b| T::cast_slice(&b.data));
    let [n, cin, d, h, wd] = xs;
    let [_, cout, od, oh, ow] = os;
    let ws = &p.weight.shape;
    let (kd, kh, kw) = (ws[2], ws[3], ws[4]);
    let g = p.groups;
    let (cin_g, cout_g) = (cin / g, cout / g);
    let ksz = kd * kh * kw;
    let mrows = cout_g * ksz;
    let (pin, pout) = (d * h * wd, od * oh * ow);
    let [sd, sh, sw] = p.stride;
    let [dd, dh, dw] = p.dilation;
    let (pd, ph, pw) = (p.pads[0] as isize, p.pads[1] as isize, p.pads[2] as isize);

    let mut out = zeroed(n * cout * pout, "a ConvTranspose output")?;
    fill_bias(&mut out, bias.as_deref(), cout, pout);
    let total_rows = d * h;
    let rows = chunk_rows::<T>(mrows, wd, total_rows);
    let mut col = zeroed(mrows * rows * wd, "the ConvTranspose column buffer")?;
    for b in 0..n {
        for gi in 0..g {
            let mut r0 = 0;
            while r0 < total_rows {
                let r1 = (r0 + rows).min(total_rows);
                let ncols = (r1 - r0) * wd;
                // col[co * ksz + tap, pixel] = Σ_ci W[ci, co, tap] · x[ci, pixel]
                gemm(
                    mrows,
                    cin_g,
                    ncols,
                    &w,
                    Mat {
                        off: gi * cin_g * mrows,
                        rs: 1,
                        cs: mrows,
                    },
                    xd,
                    Mat {
                        off: (b * cin + gi * cin_g) * pin + r0 * wd,
                        rs: pin,
                        cs: 1,
                    },
                    T::ZERO,
                    &mut col,
                    Mat {
                        off: 0,
                        rs: ncols,
                        cs: 1,
                    },
                );
                let col = &col[..mrows * ncols];
                let dst = &mut out[(b * cout + gi * cout_g) * pout..][..cout_g * pout];
                // Each output channel only receives its own rows: scatter in parallel over them.
                dst.par_chunks_mut(pout)
                    .enumerate()
                    .for_each(|(co, plane)| {
                        for t in 0..ksz {
                            let (tkd, tkh, tkw) = (t / (kh * kw), (t / kw) % kh, t % kw);
                            let src_rows = &col[(co * ksz + t) * ncols..][..ncols];
                            let off_w = (tkw * dw) as isize - pw;
                            let (lo, hi) = valid_range(wd, sw, off_w, ow);
                            if lo >= hi {
                                continue;
                            }
                            for (r, src) in (r0..r1).zip(src_rows.chunks_exact(wd)) {
                                let (i_d, i_h) = (r / h, r % h);
                                let o_d = (i_d * sd + tkd * dd) as isize - pd;
                                let o_h = (i_h * sh + tkh * dh) as isize - ph;
                                if o_d < 0 || o_d >= od as isize || o_h < 0 || o_h >= oh as isize {
                                    continue;
                                }
                                let drow =
                                    &mut plane[(o_d as usize * oh + o_h as usize) * ow..][..ow];
                                if sw == 1 {
                                    let o0 = (lo as isize + off_w) as usize;
                                    for (dv, &sv) in
                                        drow[o0..o0 + (hi - lo)].iter_mut().zip(&src[lo..hi])
                                    {
                                        *dv += sv;
                                    }
                                } else {
                                    for (iw, &sv) in src.iter().enumerate().take(hi).skip(lo) {
                                        drow[((iw * sw) as isize + off_w) as usize] += sv;
                                    }
                                }
                            }
                        }
                    });
                r0 = r1;
            }
        }
    }
    Array5::from_shape_vec(os, out).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::valid_range;

    #[test]
    fn valid_range_matches_brute_force() {
        for count in 1..8usize {
            for s in 1..4usize {
                for off in -6isize..6 {
                    for limit in 1..9usize {
                        let ok: Vec<usize> = (0..count)
                            .filter(|&o| (0..limit as isize).contains(&((o * s) as isize + off)))
                            .collect();
                        let (lo, hi) = valid_range(count, s, off, limit);
                        assert_eq!(
                            (lo..hi).collect::<Vec<_>>(),
                            ok,
                            "count {count} s {s} off {off} limit {limit}"
                        );
                    }
                }
            }
        }
    }
}
