//! Trilinear resampling between voxel grids that cover the same field of view.
//!
//! Voxel centres are samples of cells: output voxel `o` of an axis resized from `n` to `m` reads
//! the input at `(o + 0.5)·n/m − 0.5`, clamped to `[0, n−1]` (PyTorch's `align_corners=False`,
//! skimage's `resize`). Trilinear interpolation is separable, so it runs as three 1-D passes over
//! whole planes; same-size axes are copied untouched, so a round trip to the same grid is exact.

use crate::{Error, Result};
use ndarray::{Array4, ArrayView4, Axis, Zip};

/// Longest axis a resampled grid may have: far past any real scan (NIfTI-1 stops at 32767),
/// small enough that the voxel-count product below cannot lose precision.
const MAX_AXIS: f64 = (1u64 << 31) as f64;

/// The grid size that `shape` voxels of `spacing` take at `target` spacing (at least 1), or an
/// error when a voxel size is not a positive finite number or the grid would be absurdly long
/// (a header with 1e30 mm voxels).
pub fn shape_for_spacing(
    shape: [usize; 3],
    spacing: [f64; 3],
    target: [f64; 3],
) -> Result<[usize; 3]> {
    let mut out = [1usize; 3];
    for a in 0..3 {
        let (s, t) = (spacing[a], target[a]);
        let (fs, ft) = (short(s), short(t));
        if !(s > 0.0 && s.is_finite() && t > 0.0 && t.is_finite()) {
            return Err(Error::Invalid(format!(
                "cannot resample voxels of {fs} mm to {ft} mm on axis {a}: voxel sizes must be positive and finite"
            )));
        }
        // s and t are positive and finite: n is a positive number or +inf.
        let n = (shape[a] as f64 * s / t).round();
        if n > MAX_AXIS {
            return Err(Error::Invalid(format!(
                "resampling {} voxels of {fs} mm to {ft} mm gives a grid axis of {} voxels; check the header's voxel size (pixdim) and the target spacing",
                shape[a],
                short(n)
            )));
        }
        out[a] = (n as usize).max(1);
    }
    Ok(out)
}

/// The grid (i,j,k) a model runs on for an input of `header`: the input's, or resampled to
/// `spacing` (network axes, mm, mapped to the file's by `order`). `segment` and `plan` both ask
/// here.
pub fn model_grid(
    header: &crate::volume::Header,
    order: crate::engine::AxisOrder,
    spacing: Option<[f64; 3]>,
) -> Result<[usize; 3]> {
    match spacing {
        Some(s) => shape_for_spacing(header.shape(), header.spacing(), order.network(s)),
        None => Ok(header.shape()),
    }
}

/// A voxel size or count as people write it, to 6 significant digits: 1.5 (not the float32's
/// 1.5000000596), 1e30 (not 31 digits).
fn short(v: f64) -> String {
    let trim = |m: &str| m.trim_end_matches('0').trim_end_matches('.').to_string();
    if v != 0.0 && !(1e-4..1e7).contains(&v.abs()) {
        let s = format!("{v:.5e}");
        match s.split_once('e') {
            Some((m, e)) => format!("{}e{e}", trim(m)),
            None => s,
        }
    } else {
        let digits = 5usize.saturating_sub(v.abs().log10().floor().max(0.0) as usize);
        trim(&format!("{v:.digits$}"))
    }
}

/// Refuse a resampled grid of `channels` float32 values per voxel that cannot fit in memory,
/// before anything is allocated (same rule as reading a volume: the hard cap and the memory
/// available to the process).
pub fn check_grid(grid: [usize; 3], channels: usize) -> Result<()> {
    let n = grid
        .iter()
        .chain([&channels.max(1)])
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let dims = format!(
        "resampled grid {}x{}x{} ({} channel{})",
        grid[0],
        grid[1],
        grid[2],
        channels.max(1),
        if channels > 1 { "s" } else { "" }
    );
    match n {
        Some(n) => crate::volume::check_f32_values(n, &dims, true).map_err(Error::Invalid),
        None => Err(Error::Invalid(format!("{dims}: the voxel count overflows"))),
    }
}

/// Source index pairs and weights of each output position along one axis (lazily: a long axis
/// costs no table).
fn taps(n_in: usize, n_out: usize) -> impl Iterator<Item = (usize, usize, f32)> {
    let scale = n_in as f64 / n_out as f64;
    (0..n_out).map(move |o| {
        let x = ((o as f64 + 0.5) * scale - 0.5).clamp(0.0, (n_in - 1) as f64);
        let i0 = x.floor() as usize;
        let i1 = (i0 + 1).min(n_in - 1);
        (i0, i1, (x - i0 as f64) as f32)
    })
}

/// Resize axis `axis` (1, 2 or 3 of a (C, i, j, k) array) to `n_out` by linear interpolation.
fn resample_axis(src: ArrayView4<f32>, axis: usize, n_out: usize) -> Result<Array4<f32>> {
    let mut shape = [
        src.shape()[0],
        src.shape()[1],
        src.shape()[2],
        src.shape()[3],
    ];
    let n_in = shape[axis];
    shape[axis] = n_out;
    let mut out = crate::sys::alloc::try_zeros(shape, "the resampled volume")?;
    for (o, (i0, i1, w)) in taps(n_in, n_out).enumerate() {
        let a = src.index_axis(Axis(axis), i0);
        let b = src.index_axis(Axis(axis), i1);
        let dst = out.index_axis_mut(Axis(axis), o);
        if w == 0.0 {
            Zip::from(dst).and(a).for_each(|d, &x| *d = x);
        } else {
            Zip::from(dst)
                .and(a)
                .and(b)
                .for_each(|d, &x, &y| *d = x + w * (y - x));
        }
    }
    Ok(out)
}

/// Resample (C, i, j, k) data to spatial size `to` (trilinear; channels independent). Every
/// buffer is allocated fallibly: running out of memory is an error, not an abort.
pub fn resample(data: ArrayView4<f32>, to: [usize; 3]) -> Result<Array4<f32>> {
    let mut cur: Option<Array4<f32>> = None;
    for (a, &n_out) in to.iter().enumerate() {
        if data.shape()[a + 1] == n_out {
            continue;
        }
        let next = match &cur {
            Some(c) => resample_axis(c.view(), a + 1, n_out)?,
            None => resample_axis(data, a + 1, n_out)?,
        };
        cur = Some(next);
    }
    match cur {
        Some(c) => Ok(c),
        None => crate::sys::alloc::try_to_owned(data, "the resampled volume"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_checked_not_saturated() {
        assert_eq!(
            shape_for_spacing([16, 16, 16], [2.0, 1.0, 0.5], [1.0; 3]).unwrap(),
            [32, 16, 8]
        );
        let e = shape_for_spacing([16; 3], [f64::from(1e30f32); 3], [1.0; 3]).unwrap_err();
        assert!(
            e.to_string().contains("1e30 mm") && e.to_string().contains("1.6e31"),
            "{e}"
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(shape_for_spacing([16; 3], [1.0; 3], [bad, 1.0, 1.0]).is_err());
            assert!(shape_for_spacing([16; 3], [1.0, bad, 1.0], [1.0; 3]).is_err());
        }
        assert_eq!(short(1.5f32 as f64), "1.5");
        assert_eq!(short(100.0), "100");
        let e = check_grid([1600; 3], 3).unwrap_err().to_string();
        assert!(
            e.contains("1600x1600x1600 (3 channels)") && e.contains("45.8 GiB"),
            "{e}"
        );
        assert!(check_grid([usize::MAX, 2, 1], 1).is_err());
        assert!(check_grid([64; 3], 2).is_ok());
    }
}
