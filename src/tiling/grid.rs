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
        check(shape, roi, overlap)?;
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
                Placement::NnUnet => nnunet_starts(padded[a], roi[a], overlap[a]),
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

    /// Distinct origins along `axis`, ascending.
    pub fn origins(&self, axis: usize) -> Vec<usize> {
        let mut o: Vec<usize> = self.starts.iter().map(|s| s[axis]).collect();
        o.sort_unstable();
        o.dedup();
        o
    }

    /// True when there are no windows (never, for a grid built by [`Grid::new`]).
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// Most windows one volume may need (their origins alone take 24 bytes each).
pub const MAX_WINDOWS: u64 = 1 << 26;

/// The arguments every grid needs: no empty axis, a positive roi, overlaps in [0, 1).
fn check(shape: [usize; 3], roi: [usize; 3], overlap: [f64; 3]) -> Result<()> {
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
    Ok(())
}

/// The number of windows [`Grid::new`] lists, counted without listing them; an error past
/// [`MAX_WINDOWS`] (a huge count is refused before anything tries to list it).
pub fn window_count(
    shape: [usize; 3],
    roi: [usize; 3],
    overlap: [f64; 3],
    placement: Placement,
) -> Result<usize> {
    check(shape, roi, overlap)?;
    let counts = [0, 1, 2].map(|a| axis_count(shape[a].max(roi[a]), roi[a], overlap[a], placement));
    let n = counts
        .iter()
        .try_fold(1u64, |n, &c| n.checked_mul(c as u64));
    match n.filter(|&n| n <= MAX_WINDOWS) {
        Some(n) => Ok(n as usize),
        None => Err(Error::Invalid(format!(
            "volume {}x{}x{} needs about {:.3e} windows of {roi:?} at overlap {overlap:?}: more than the {MAX_WINDOWS} voxtile handles",
            shape[0],
            shape[1],
            shape[2],
            counts.iter().map(|&c| c as f64).product::<f64>()
        ))),
    }
}

/// MONAI `_get_scan_interval` along one axis of the padded size `size >= roi`.
fn monai_interval(size: usize, roi: usize, overlap: f64) -> usize {
    if roi == size {
        roi
    } else {
        // Python `int(roi * (1 - o))`: truncation of the f64 product, at least 1.
        ((roi as f64 * (1.0 - overlap)) as usize).max(1)
    }
}

/// Windows along one axis of the padded size `size >= roi`: the one formula the grid lists, the
/// planner counts and the multi-device split cuts. MONAI: the first `d` with
/// `d * interval + roi >= size`, plus one; nnU-Net: `ceil((size - roi) / (roi * step)) + 1`.
fn axis_count(size: usize, roi: usize, overlap: f64, placement: Placement) -> usize {
    match placement {
        Placement::Monai => (size - roi).div_ceil(monai_interval(size, roi, overlap)) + 1,
        Placement::NnUnet => {
            let target = roi as f64 * (1.0 - overlap);
            ((size - roi) as f64 / target).ceil() as usize + 1
        }
    }
}

/// MONAI `dense_patch_slices` along one axis of the padded size `size >= roi`: a fixed stride,
/// the last window pulled back so that it ends at the border.
fn monai_starts(size: usize, roi: usize, overlap: f64) -> Vec<usize> {
    let interval = monai_interval(size, roi, overlap);
    (0..axis_count(size, roi, overlap, Placement::Monai))
        .map(|i| {
            let s = i * interval;
            s - (s + roi).saturating_sub(size)
        })
        .collect()
}

/// nnU-Net v2 `compute_steps_for_sliding_window` along one axis (`size >= roi`, `0 <= overlap < 1`).
fn nnunet_starts(size: usize, roi: usize, overlap: f64) -> Vec<usize> {
    let n = axis_count(size, roi, overlap, Placement::NnUnet);
    if n == 1 {
        return vec![0];
    }
    let actual = (size - roi) as f64 / (n - 1) as f64;
    // `int(np.round(x))`: numpy rounds half to even.
    (0..n)
        .map(|i| (actual * i as f64).round_ties_even() as usize)
        .collect()
}
