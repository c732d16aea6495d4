//! ONNX Resize (nearest / trilinear) over D,H,W. Source coordinates are computed in f32 exactly
//! like onnxruntime (so both precisions pick the same source voxels); interpolation weights and
//! sums are in T. Linear clamps the source coordinate to [0, in-1], which equals ONNX's edge
//! padding of the neighbours.

use super::{dims, err, standard, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::{CoordMode, NearestMode, Resize, ResizeMode};
use crate::model::ops::spatial;
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

/// The f32 source coordinate of output index `o` (ONNX coordinate_transformation_mode).
pub fn source_coord(mode: CoordMode, o: usize, scale: f32, in_len: usize, out_len: usize) -> f32 {
    let x = o as f32;
    match mode {
        CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel => {
            if out_len > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        CoordMode::AlignCorners => {
            if out_len == 1 {
                0.0
            } else {
                x * (in_len - 1) as f32 / (out_len - 1) as f32
            }
        }
        CoordMode::Asymmetric => x / scale,
    }
}

/// The nearest source index (ONNX nearest_mode), clamped into the input.
pub fn nearest_index(mode: NearestMode, x: f32, in_len: usize) -> usize {
    let f = x.floor();
    let tie = x - f == 0.5;
    let r = match mode {
        NearestMode::RoundPreferFloor => {
            if tie {
                f
            } else {
                x.round()
            }
        }
        NearestMode::RoundPreferCeil => {
            if tie {
                f + 1.0
            } else {
                x.round()
            }
        }
        NearestMode::Floor => f,
        NearestMode::Ceil => x.ceil(),
    };
    if r <= 0.0 {
        0
    } else {
        (r as usize).min(in_len - 1)
    }
}

struct Lin<T> {
    i0: usize,
    i1: usize,
    w0: T,
    w1: T,
}

pub fn resize<T: Real>(x: ArrayView5<T>, p: &Resize) -> Result<Array5<T>> {
    let xs = dims(&x);
    let (out_sp, scales) = p.geometry(spatial(&xs)).map_err(err)?;
    let os = [xs[0], xs[1], out_sp[0], out_sp[1], out_sp[2]];
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err("Resize input is not contiguous".into()))?;
    let (h, w) = (xs[3], xs[4]);
    let pin = xs[2] * h * w;
    let pout = out_sp.iter().product::<usize>();
    let mut out = zeroed(os.iter().product(), "a Resize output")?;
    match p.mode {
        ResizeMode::Nearest => {
            let idx: Vec<Vec<usize>> = (0..3)
                .map(|a| {
                    (0..out_sp[a])
                        .map(|o| {
                            let c = source_coord(p.coord, o, scales[a], xs[2 + a], out_sp[a]);
                            nearest_index(p.nearest, c, xs[2 + a])
                        })
                        .collect()
                })
                .collect();
            out.par_chunks_mut(pout).enumerate().for_each(|(pi, dst)| {
                let src = &xd[pi * pin..][..pin];
                let mut o = 0;
                for &id in &idx[0] {
                    for &ih in &idx[1] {
                        let row = &src[(id * h + ih) * w..][..w];
                        for &iw in &idx[2] {
                            dst[o] = row[iw];
                            o += 1;
                        }
                    }
                }
            });
        }
        ResizeMode::Linear => {
            let lin: Vec<Vec<Lin<T>>> = (0..3)
                .map(|a| {
                    let n_in = xs[2 + a];
                    (0..out_sp[a])
                        .map(|o| {
                            let c = source_coord(p.coord, o, scales[a], n_in, out_sp[a]);
                            let c = c.max(0.0).min((n_in - 1) as f32);
                            let i0 = (c.floor() as usize).min(n_in - 1);
                            let i1 = (i0 + 1).min(n_in - 1);
                            let w1 = T::from_f32(c) - T::from_f64(i0 as f64);
                            Lin {
                                i0,
                                i1,
                                w0: T::ONE - w1,
                                w1,
                            }
                        })
                        .collect()
                })
                .collect();
            out.par_chunks_mut(pout).enumerate().for_each(|(pi, dst)| {
                let src = &xd[pi * pin..][..pin];
                let mut o = 0;
                for ld in &lin[0] {
                    for lh in &lin[1] {
                        let r00 = &src[(ld.i0 * h + lh.i0) * w..][..w];
                        let r01 = &src[(ld.i0 * h + lh.i1) * w..][..w];
                        let r10 = &src[(ld.i1 * h + lh.i0) * w..][..w];
                        let r11 = &src[(ld.i1 * h + lh.i1) * w..][..w];
                        let (a00, a01, a10, a11) =
                            (ld.w0 * lh.w0, ld.w0 * lh.w1, ld.w1 * lh.w0, ld.w1 * lh.w1);
                        for lw in &lin[2] {
                            let at = |r: &[T]| r[lw.i0] * lw.w0 + r[lw.i1] * lw.w1;
                            dst[o] = a00 * at(r00) + a01 * at(r01) + a10 * at(r10) + a11 * at(r11);
                            o += 1;
                        }
                    }
                }
            });
        }
    }
    Array5::from_shape_vec(os, out).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_modes_break_ties_as_onnx() {
        use NearestMode::*;
        assert_eq!(nearest_index(RoundPreferFloor, 1.5, 9), 1);
        assert_eq!(nearest_index(RoundPreferCeil, 1.5, 9), 2);
        assert_eq!(nearest_index(RoundPreferFloor, 1.6, 9), 2);
        assert_eq!(nearest_index(RoundPreferCeil, 1.4, 9), 1);
        assert_eq!(nearest_index(Floor, 1.9, 9), 1);
        assert_eq!(nearest_index(Ceil, 1.1, 9), 2);
        // Clamped into the input on both sides.
        assert_eq!(nearest_index(RoundPreferCeil, -0.5, 9), 0);
        assert_eq!(nearest_index(Ceil, 8.2, 9), 8);
    }

    #[test]
    fn half_pixel_coordinates() {
        // Upsampling by 2: output 0 maps to -0.25, output 1 to 0.25.
        assert_eq!(source_coord(CoordMode::HalfPixel, 0, 2.0, 4, 8), -0.25);
        assert_eq!(source_coord(CoordMode::HalfPixel, 1, 2.0, 4, 8), 0.25);
        assert_eq!(source_coord(CoordMode::PytorchHalfPixel, 0, 2.0, 4, 1), 0.0);
        assert_eq!(source_coord(CoordMode::AlignCorners, 7, 2.0, 4, 8), 3.0);
        assert_eq!(source_coord(CoordMode::Asymmetric, 3, 2.0, 4, 8), 1.5);
    }
}
