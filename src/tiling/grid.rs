//! Where the windows go: padding up to the roi and the window origins of MONAI or nnU-Net.

use crate::{Error, Result};

/// How window origins are spread along each axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// MONAI `dense_patch_slices`: a fixed stride `int(roi * (1 - overlap))`, the last window pulled back
    /// so that it ends at the border.
    Monai,
    /// nnU-Net v2 `compute_steps_for_sliding_window`: the fewest windows whose stride is at most
    /// `roi * (1 - overlap)`, spread evenly (`round(i * (size - roi) / (n - 1))`, ties to even).
    NnUnet,
}

/// The windows covering one volume, in padded coordinates.
#[derive(Clone, Debug)]
pub struct Grid {
    /// Original volume size (D, H, W).
    pub shape: [usize; 3],
    /// Size after padding up to the roi along axes where the volume is smaller.
    pub padded: [usize; 3],
    /// Offset of the original volume inside the padded one (`(roi - size) / 2`, rounded down).
    pub pad_before: [usize; 3],
    /// Window size.
    pub roi: [usize; 3],
    /// Window origins in padded coordinates, D slowest and W fastest (MONAI's `meshgrid(indexing="ij")`
    /// order and nnU-Net's nested loops): windows are therefore grouped in slabs of equal D origin.
    pub starts: Vec<[usize; 3]>,
}

impl Grid {
    /// Place windows of size `roi` over a volume of size `shape` with the given fractional overlap per
    /// axis (each in [0, 1)).
    pub fn new(
        shape: [usize; 3],
        roi: [usize; 3],
        overlap: [f64; 3],
        placement: Placement,
    ) -> Result<Grid> {
        if shape.contains(&0) {
            return Err(Error::Invalid(format!(
                "volume shape {shape:?} has an empty axis, so there is nothing to tile"
            )));
        }
        if roi.contains(&0) {
            return Err(Error::Invalid(format!(
                "window size (roi) {roi:?} must be positive along every axis"
            )));
        }
        if let Some(o) = overlap.iter().find(|o| !(0.0..1.0).contains(*o)) {
            return Err(Error::Invalid(format!(
                "overlap {o} is outside [0, 1) (overlap {overlap:?})"
            )));
        }
        let mut padded = [0; 3];
        let mut pad_before = [0; 3];
        let mut axis_starts: [Vec<usize>; 3] = Default::default();
        for a in 0..3 {
            // MONAI: `diff = max(roi - size, 0); half = diff // 2` goes before, `diff - half` after
            // (acvl_utils' pad_nd_image, used by nnU-Net, splits the same way).
            let diff = roi[a].saturating_sub(shape[a]);
            pad_before[a] = diff / 2;
            padded[a] = shape[a].max(roi[a]);
            axis_starts[a] = match placement {
                Placement::Monai => monai_starts(padded[a], roi[a], overlap[a]),
                Placement::NnUnet => nnunet_starts(padded[a], roi[a], 1.0 - overlap[a]),
            };
        }
        let mut starts = Vec::with_capacity(axis_starts.iter().map(Vec::len).product::<usize>());
        for &d in &axis_starts[0] {
            for &h in &axis_starts[1] {
                for &w in &axis_starts[2] {
                    starts.push([d, h, w]);
                }
            }
        }
        Ok(Grid {
            shape,
            padded,
            pad_before,
            roi,
            starts,
        })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when there are no windows (never, for a grid built by [`Grid::new`]).
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// MONAI `_get_scan_interval` + `dense_patch_slices` along one axis of the padded size `size >= roi`.
fn monai_starts(size: usize, roi: usize, overlap: f64) -> Vec<usize> {
    let interval = if roi == size {
        roi
    } else {
        // Python `int(roi * (1 - o))`: truncation of the f64 product, at least 1.
        ((roi as f64 * (1.0 - overlap)) as usize).max(1)
    };
    // `num = ceil(size / interval)`; the count is the first d with d * interval + roi >= size, plus one.
    let num = (size as f64 / interval as f64).ceil() as usize;
    let count = (0..num)
        .find(|d| d * interval + roi >= size)
        .map_or(1, |d| d + 1);
    (0..count)
        .map(|i| {
            let s = i * interval;
            s - (s + roi).saturating_sub(size)
        })
        .collect()
}

/// nnU-Net v2 `compute_steps_for_sliding_window` along one axis (`size >= roi`, `0 < step <= 1`).
fn nnunet_starts(size: usize, roi: usize, step: f64) -> Vec<usize> {
    let target = roi as f64 * step;
    let n = ((size - roi) as f64 / target).ceil() as usize + 1;
    if n == 1 {
        return vec![0];
    }
    let actual = (size - roi) as f64 / (n - 1) as f64;
    // `int(np.round(x))`: numpy rounds half to even.
    (0..n)
        .map(|i| (actual * i as f64).round_ties_even() as usize)
        .collect()
}
