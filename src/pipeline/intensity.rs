//! Intensity normalisation per channel, and percentiles (also used to window the preview).

use super::manifest::Intensity;
use crate::engine::{normalize, Normalize};
use ndarray::{Array4, ArrayView3};

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
    let a = percentile(&mut buf, p_lo);
    let b = percentile(&mut buf, p_hi);
    (a, b)
}

/// Normalise each channel in place.
pub fn apply(data: &mut Array4<f32>, how: &Intensity) {
    match *how {
        Intensity::None => {}
        Intensity::Zscore => normalize(data, Normalize::ZScore),
        Intensity::Ct { clip, mean, std } => normalize(
            data,
            Normalize::Ct {
                lo: clip[0],
                hi: clip[1],
                mean,
                std,
            },
        ),
        Intensity::Percentile { p_lo, p_hi } => {
            for mut ch in data.outer_iter_mut() {
                let (lo, hi) = percentiles(ch.view(), p_lo, p_hi);
                let inv = if hi > lo { 1.0 / (hi - lo) } else { 0.0 };
                ch.mapv_inplace(|v| ((v - lo) * inv).clamp(0.0, 1.0));
            }
        }
    }
}
