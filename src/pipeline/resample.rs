//! Trilinear resampling between voxel grids that cover the same field of view.
//!
//! Voxel centres are samples of cells: output voxel `o` of an axis resized from `n` to `m` reads
//! the input at `(o + 0.5)·n/m − 0.5`, clamped to `[0, n−1]` (PyTorch's `align_corners=False`,
//! skimage's `resize`). Trilinear interpolation is separable, so it runs as three 1-D passes over
//! whole planes; same-size axes are copied untouched, so a round trip to the same grid is exact.

use ndarray::{Array4, ArrayView4, Axis, Zip};

/// The grid size that `shape` voxels of `spacing` take at `target` spacing (at least 1).
pub fn shape_for_spacing(shape: [usize; 3], spacing: [f64; 3], target: [f64; 3]) -> [usize; 3] {
    std::array::from_fn(|a| ((shape[a] as f64 * spacing[a] / target[a]).round() as usize).max(1))
}

/// Source index pairs and weights of each output position along one axis.
fn taps(n_in: usize, n_out: usize) -> Vec<(usize, usize, f32)> {
    let scale = n_in as f64 / n_out as f64;
    (0..n_out)
        .map(|o| {
            let x = ((o as f64 + 0.5) * scale - 0.5).clamp(0.0, (n_in - 1) as f64);
            let i0 = x.floor() as usize;
            let i1 = (i0 + 1).min(n_in - 1);
            (i0, i1, (x - i0 as f64) as f32)
        })
        .collect()
}

/// Resize axis `axis` (1, 2 or 3 of a (C, i, j, k) array) to `n_out` by linear interpolation.
fn resample_axis(src: ArrayView4<f32>, axis: usize, n_out: usize) -> Array4<f32> {
    let mut shape = [
        src.shape()[0],
        src.shape()[1],
        src.shape()[2],
        src.shape()[3],
    ];
    let n_in = shape[axis];
    shape[axis] = n_out;
    let mut out = Array4::<f32>::zeros(shape);
    for (o, (i0, i1, w)) in taps(n_in, n_out).into_iter().enumerate() {
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
    out
}

/// Resample (C, i, j, k) data to spatial size `to` (trilinear; channels independent).
pub fn resample(data: ArrayView4<f32>, to: [usize; 3]) -> Array4<f32> {
    let mut cur: Option<Array4<f32>> = None;
    for (a, &n_out) in to.iter().enumerate() {
        if data.shape()[a + 1] == n_out {
            continue;
        }
        let next = match &cur {
            Some(c) => resample_axis(c.view(), a + 1, n_out),
            None => resample_axis(data, a + 1, n_out),
        };
        cur = Some(next);
    }
    cur.unwrap_or_else(|| data.as_standard_layout().into_owned())
}
