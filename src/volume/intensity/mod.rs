//! Intensity normalisation per channel, and percentiles (also used to window the preview): the
//! one preprocessing every run does before the engine, whoever calls it (CLI, library, TTA).

mod spec;

pub use spec::{describe_intensity, Intensity};

use crate::Result;
use ndarray::{Array4, ArrayView3};
use rayon::prelude::*;

/// Values per parallel piece: fixed, so sums come out the same on every run and machine.
const PIECE: usize = 1 << 16;

/// Sum of `f` over `s` in f64, pieces in parallel, added in a fixed order (deterministic).
fn par_sum(s: &[f32], f: impl Fn(f32) -> f64 + Sync) -> f64 {
    let parts: Vec<f64> = s
        .par_chunks(PIECE)
        .map(|c| c.iter().map(|&v| f(v)).sum::<f64>())
        .collect();
    parts.iter().sum()
}

/// The one preprocessing of every run, in place: NaN voxels set to 0 and ±Inf clamped to the
/// finite range, then the intensity normalisation. Returns how many voxels were not finite.
pub fn preprocess(data: &mut Array4<f32>, how: &Intensity) -> Result<usize> {
    let (nan, inf) = crate::volume::sanitize_nonfinite(data);
    if nan + inf > 0 {
        tracing::info!("{nan} NaN voxels set to 0, {inf} infinite voxels clamped");
    }
    apply(data, how)?;
    Ok(nan + inf)
}

/// Normalise each channel in place, in parallel (rayon): f64 sums over fixed pieces added in a
/// fixed order (the same result on every run and machine; a 512²×128 volume overflows f32
/// precision), MONAI's (x − mean) / (std + 1e-8) for z-score; nnU-Net's clip then (x − mean) /
/// max(std, 1e-8) for ct. A channel that is not contiguous in memory is normalised through a
/// contiguous copy. The percentile rule is [`apply`]'s.
fn normalize(data: &mut Array4<f32>, how: Intensity) {
    if matches!(how, Intensity::None | Intensity::Percentile { .. }) {
        return;
    }
    for mut ch in data.outer_iter_mut() {
        match ch.as_slice_memory_order_mut() {
            Some(s) => normalize_slice(s, how),
            None => {
                let mut c = ch.as_standard_layout().into_owned();
                if let Some(s) = c.as_slice_memory_order_mut() {
                    normalize_slice(s, how);
                }
                ch.assign(&c);
            }
        }
    }
}

/// [`normalize`] of one channel's voxels.
fn normalize_slice(s: &mut [f32], how: Intensity) {
    match how {
        Intensity::None | Intensity::Percentile { .. } => {}
        Intensity::Zscore => {
            let n = s.len().max(1) as f64;
            let mean = par_sum(s, |v| v as f64) / n;
            let var = par_sum(s, |v| (v as f64 - mean).powi(2)) / n;
            let (m, inv) = (mean as f32, 1.0 / (var.sqrt() as f32 + 1e-8));
            s.par_chunks_mut(PIECE)
                .for_each(|c| c.iter_mut().for_each(|v| *v = (*v - m) * inv));
        }
        Intensity::Ct { clip, mean, std } => {
            let [lo, hi] = clip;
            let inv = 1.0 / std.max(1e-8);
            s.par_chunks_mut(PIECE).for_each(|c| {
                c.iter_mut()
                    .for_each(|v| *v = (v.clamp(lo, hi) - mean) * inv)
            });
        }
    }
}

/// numpy's `percentile(values, p)` with the default linear method; NaN-free input assumed.
/// O(n) by selection rather than a sort: volumes have tens of millions of voxels.
pub fn percentile(values: &mut [f32], p: f64) -> f32 {
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    let idx = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = idx.floor() as usize;
    let frac = idx - lo as f64;
    let (_, &mut v_lo, rest) = values.select_nth_unstable_by(lo, f32::total_cmp);
    if frac == 0.0 || rest.is_empty() {
        return v_lo;
    }
    let v_hi = rest.iter().copied().fold(f32::INFINITY, f32::min);
    (v_lo as f64 + (v_hi as f64 - v_lo as f64) * frac) as f32
}

/// Two percentiles of a view in one copy.
pub fn percentiles(v: ArrayView3<f32>, p_lo: f64, p_hi: f64) -> (f32, f32) {
    let mut buf: Vec<f32> = v.iter().copied().collect();
    percentiles_in(&mut buf, p_lo, p_hi)
}

/// [`percentiles`] with the copy allocated fallibly (a whole channel of the volume).
fn try_percentiles(v: ArrayView3<f32>, p_lo: f64, p_hi: f64) -> Result<(f32, f32)> {
    let mut buf = crate::sys::alloc::try_with_capacity(v.len(), "the percentile copy")?;
    buf.extend(v.iter().copied());
    Ok(percentiles_in(&mut buf, p_lo, p_hi))
}

fn percentiles_in(buf: &mut [f32], p_lo: f64, p_hi: f64) -> (f32, f32) {
    let a = percentile(buf, p_lo);
    let b = percentile(buf, p_hi);
    (a, b)
}

/// Normalise each channel in place; only the percentile rule allocates (a copy of one channel).
pub fn apply(data: &mut Array4<f32>, how: &Intensity) -> Result<()> {
    match *how {
        Intensity::None => {}
        Intensity::Zscore | Intensity::Ct { .. } => normalize(data, *how),
        Intensity::Percentile { p_lo, p_hi } => {
            for mut ch in data.outer_iter_mut() {
                let (lo, hi) = try_percentiles(ch.view(), p_lo, p_hi)?;
                let inv = if hi > lo { 1.0 / (hi - lo) } else { 0.0 };
                ch.mapv_inplace(|v| ((v - lo) * inv).clamp(0.0, 1.0));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ShapeBuilder;

    /// Every memory layout gives the same values, and they are those of f64 by hand.
    #[test]
    fn normalize_matches_f64_in_every_layout() {
        let (c, x, y, z) = (2, 70, 50, 40); // several pieces per channel, last one partial
        let f = |(ch, i, j, k): (usize, usize, usize, usize)| {
            ((i * 7 + j * 13 + k * 29 + ch * 5) % 97) as f32 * 3.5 - 100.0
        };
        for how in [
            Intensity::Zscore,
            Intensity::Ct {
                clip: [-50.0, 120.0],
                mean: 10.0,
                std: 30.0,
            },
        ] {
            // Fortran order (what read() returns, channels contiguous), C order, and a
            // non-contiguous layout (the serial fallback).
            let fo = Array4::from_shape_fn((z, y, x, c).f(), |(k, j, i, ch)| f((ch, i, j, k)))
                .permuted_axes([3, 2, 1, 0]);
            let co = Array4::from_shape_fn((c, x, y, z), f);
            let odd = Array4::from_shape_fn((x, c, y, z), |(i, ch, j, k)| f((ch, i, j, k)))
                .permuted_axes([1, 0, 2, 3]);
            let mut want = co.clone();
            normalize(&mut want, how);
            for a in [fo, co, odd] {
                let mut got = a.clone();
                normalize(&mut got, how);
                let d = (&got - &want).mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
                assert!(d <= 1e-6, "{how:?}: max diff {d}");
                // f64 by hand for channel 1.
                let v: Vec<f64> = a
                    .index_axis(ndarray::Axis(0), 1)
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let n = v.len() as f64;
                let mean = v.iter().sum::<f64>() / n;
                let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
                let (i, j, k) = (3, 4, 5);
                let raw = a[[1, i, j, k]] as f64;
                let expect = match how {
                    Intensity::Ct {
                        clip: [lo, hi],
                        mean,
                        std,
                    } => (raw.clamp(lo as f64, hi as f64) - mean as f64) / std as f64,
                    _ => (raw - mean) / (sd + 1e-8),
                };
                assert!((got[[1, i, j, k]] as f64 - expect).abs() < 1e-5, "{how:?}");
            }
        }
        // None leaves the data alone.
        let mut a = Array4::from_elem((1, 2, 2, 2), 5.0f32);
        normalize(&mut a, Intensity::None);
        assert!(a.iter().all(|&v| v == 5.0));
    }
}
