//! MaxPool and AveragePool over D,H,W with pads, dilation, ceil_mode and count_include_pad.
//! Per axis we precompute which taps of each window land inside the input; a 3D window is the
//! product of three such lists.

use super::{dims, err, standard, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::Pool;
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

struct AxisTaps {
    /// Input indices inside `0..in` for each output index.
    valid: Vec<Vec<usize>>,
    /// Taps inside the padded extent `-pad_begin..in + pad_end` (count_include_pad divisor).
    in_pad: Vec<usize>,
}

fn axis_taps(
    input: usize,
    out: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
) -> Result<AxisTaps> {
    let mut valid = Vec::with_capacity(out);
    let mut in_pad = Vec::with_capacity(out);
    for o in 0..out {
        let start = (o * s) as isize - pb as isize;
        let mut v = Vec::with_capacity(k);
        let mut p = 0;
        for t in 0..k {
            let i = start + (t * d) as isize;
            if i >= 0 && (i as usize) < input {
                v.push(i as usize);
            }
            if i >= -(pb as isize) && i < (input + pe) as isize {
                p += 1;
            }
        }
        if v.is_empty() {
            return Err(err(format!(
                "pooling window {o} (kernel {k}, stride {s}, pads {pb}/{pe}) lies entirely in the padding"
            )));
        }
        valid.push(v);
        in_pad.push(p);
    }
    Ok(AxisTaps { valid, in_pad })
}

fn pool3d<T: Real>(x: ArrayView5<T>, p: &Pool, max: bool) -> Result<Array5<T>> {
    let what = if max { "MaxPool" } else { "AveragePool" };
    let xs = dims(&x);
    let os = p.output_shape(&xs).map_err(err)?;
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err(format!("{what} input is not contiguous")))?;
    let mut taps = Vec::with_capacity(3);
    for a in 0..3 {
        taps.push(axis_taps(
            xs[2 + a],
            os[2 + a],
            p.kernel[a],
            p.stride[a],
            p.dilation[a],
            p.pads[a],
            p.pads[3 + a],
        )?);
    }
    let (h, w) = (xs[3], xs[4]);
    let pin = xs[2] * h * w;
    let pout = os[2] * os[3] * os[4];
    let mut out = zeroed(os.iter().product(), "a pooling output")?;
    out.par_chunks_mut(pout).enumerate().for_each(|(pi, dst)| {
        let src = &xd[pi * pin..][..pin];
        let mut o = 0;
        for (vd, &pd) in taps[0].valid.iter().zip(&taps[0].in_pad) {
            for (vh, &ph) in taps[1].valid.iter().zip(&taps[1].in_pad) {
                for (vw, &pw) in taps[2].valid.iter().zip(&taps[2].in_pad) {
                    dst[o] = if max {
                        let mut m = T::NEG_INFINITY;
                        for &id in vd {
                            for &ih in vh {
                                let row = &src[(id * h + ih) * w..][..w];
                                for &iw in vw {
                                    m = m.max(row[iw]);
                                }
                            }
                        }
                        m
                    } else {
                        let mut s = T::ZERO;
                        for &id in vd {
                            for &ih in vh {
                                let row = &src[(id * h + ih) * w..][..w];
                                for &iw in vw {
                                    s += row[iw];
                                }
                            }
                        }
                        let n = if p.count_include_pad {
                            pd * ph * pw
                        } else {
                            vd.len() * vh.len() * vw.len()
                        };
                        s / T::from_f64(n as f64)
                    };
                    o += 1;
                }
            }
        }
    });
    Array5::from_shape_vec(os, out).map_err(|e| err(e.to_string()))
}

/// ONNX MaxPool: the max over the window's taps inside the input (padding never wins).
pub fn max_pool3d<T: Real>(x: ArrayView5<T>, p: &Pool) -> Result<Array5<T>> {
    pool3d(x, p, true)
}

/// ONNX AveragePool: divisor = taps inside the padded extent (count_include_pad) or inside the
/// input; with ceil_mode the overhang past the end padding is never counted (PyTorch/ORT rule).
pub fn average_pool3d<T: Real>(x: ArrayView5<T>, p: &Pool) -> Result<Array5<T>> {
    pool3d(x, p, false)
}
