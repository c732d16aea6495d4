//! Gathering windows out of the volume (with virtual padding), fp32 blending, and label extraction.

use super::grid::Grid;
use ndarray::{s, Array3, Array4, ArrayView3, ArrayView4, ArrayViewMut3, ArrayViewMut4, Axis, Zip};

/// How voxels of the padded volume outside the original are filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A fixed value (MONAI `padding_mode="constant"`, `cval`).
    Constant(f32),
    /// The nearest edge voxel (MONAI / torch `padding_mode="replicate"`).
    Edge,
}

/// For each of `len` window positions along one axis, the source index in the unpadded volume, or `None`
/// where constant padding applies.
fn source_indices(
    start: usize,
    len: usize,
    pad_before: usize,
    size: usize,
    pad: PadMode,
) -> Vec<Option<usize>> {
    (0..len)
        .map(|r| {
            let p = (start + r) as isize - pad_before as isize;
            if (0..size as isize).contains(&p) {
                Some(p as usize)
            } else {
                match pad {
                    PadMode::Constant(_) => None,
                    PadMode::Edge => Some(p.clamp(0, size as isize - 1) as usize),
                }
            }
        })
        .collect()
}

/// Copy one window `(C, roi)` whose origin is `start` (padded coordinates) out of the unpadded volume
/// `(C, D, H, W)` into `out`, filling the padding on the fly so no padded copy of the volume is made.
/// `vol` and `out` may have any strides (a permuted view, a slice of a batch buffer).
///
/// Panics if the shapes do not match the grid: that is a bug in the caller, not bad user input.
pub fn gather_window(
    vol: ArrayView4<f32>,
    grid: &Grid,
    start: [usize; 3],
    pad: PadMode,
    mut out: ArrayViewMut4<f32>,
) {
    let (c, d, h, w) = vol.dim();
    assert_eq!(
        [d, h, w],
        grid.shape,
        "gather_window: volume shape does not match the grid"
    );
    let r = grid.roi;
    assert_eq!(
        out.dim(),
        (c, r[0], r[1], r[2]),
        "gather_window: output must be (C, roi)"
    );
    for a in 0..3 {
        assert!(
            start[a] + r[a] <= grid.padded[a],
            "gather_window: window {start:?} leaves the padded volume"
        );
    }
    let fill = match pad {
        PadMode::Constant(v) => v,
        PadMode::Edge => 0.0, // never used: Edge always has a source index
    };
    let src: [Vec<Option<usize>>; 3] =
        [0, 1, 2].map(|a| source_indices(start[a], r[a], grid.pad_before[a], grid.shape[a], pad));
    // Without padding along W a row is one contiguous range of the source row: copy it straight.
    let w0 = start[2] as isize - grid.pad_before[2] as isize;
    let w_straight = w0 >= 0 && w0 as usize + r[2] <= w;
    for (ci, mut out_c) in out.axis_iter_mut(Axis(0)).enumerate() {
        let vol_c = vol.index_axis(Axis(0), ci);
        Zip::indexed(out_c.lanes_mut(Axis(2))).par_for_each(|(rd, rh), mut row| {
            let (Some(sd), Some(sh)) = (src[0][rd], src[1][rh]) else {
                row.fill(fill);
                return;
            };
            let src_row = vol_c.slice(s![sd, sh, ..]);
            if w_straight {
                row.assign(&src_row.slice(s![w0 as usize..w0 as usize + r[2]]));
                return;
            }
            for (o, si) in row.iter_mut().zip(&src[2]) {
                *o = match si {
                    Some(i) => src_row[*i],
                    None => fill,
                };
            }
        });
    }
}

/// Zeroed fp32 accumulators over `planes` (D, H, W): the weighted sums of `channels` channels
/// and the weight sum. Allocated fallibly: an out-of-memory error (the engine then retries at a
/// smaller batch) instead of an abort.
fn accumulators(channels: usize, planes: [usize; 3]) -> crate::Result<(Array4<f32>, Array3<f32>)> {
    let [d, h, w] = planes;
    let what = "the blend accumulators";
    Ok((
        crate::sys::alloc::try_zeros((channels, d, h, w), what)
            .map_err(crate::sys::alloc::retryable)?,
        crate::sys::alloc::try_zeros((d, h, w), what).map_err(crate::sys::alloc::retryable)?,
    ))
}

/// Panics unless `weights` has the roi's shape (a caller bug).
fn check_weights(who: &str, grid: &Grid, weights: &Array3<f32>) {
    let r = grid.roi;
    assert_eq!(
        weights.dim(),
        (r[0], r[1], r[2]),
        "{who}::new: weight map must have the roi's shape"
    );
}

/// Panics unless `logits` is `(channels, roi)` and the window at `start` fits the padded volume
/// (caller bugs).
fn check_window(
    who: &str,
    grid: &Grid,
    channels: usize,
    start: [usize; 3],
    logits: ArrayView4<f32>,
) {
    let r = grid.roi;
    assert_eq!(
        logits.dim(),
        (channels, r[0], r[1], r[2]),
        "{who}::add: logits must be (C, roi)"
    );
    for a in 0..3 {
        assert!(
            start[a] + r[a] <= grid.padded[a],
            "{who}::add: window {start:?} leaves the padded volume"
        );
    }
}

/// One window into the accumulators' region under it: `acc += logits * w` per channel, products
/// rounded to f32 before the sum like MONAI's `out += p * w` (no fused multiply-add), and
/// `wsum += w`.
fn accumulate(
    mut acc: ArrayViewMut4<f32>,
    mut wsum: ArrayViewMut3<f32>,
    logits: ArrayView4<f32>,
    weights: &Array3<f32>,
) {
    for (mut acc_c, log_c) in acc.axis_iter_mut(Axis(0)).zip(logits.axis_iter(Axis(0))) {
        Zip::from(&mut acc_c)
            .and(log_c)
            .and(weights)
            .par_for_each(|a, &l, &w| *a += l * w);
    }
    Zip::from(&mut wsum)
        .and(weights)
        .par_for_each(|s, &w| *s += w);
}

/// The blended outputs: each channel's weighted sums divided by the weight sum (a voxel no
/// window covered comes out NaN, 0 / 0).
fn divide(mut sums: ArrayViewMut4<f32>, wsum: ArrayView3<f32>) {
    for mut c in sums.axis_iter_mut(Axis(0)) {
        Zip::from(&mut c).and(&wsum).par_for_each(|o, &s| *o /= s);
    }
}

/// fp32 accumulators over the padded volume: `sum(weights * logits)` per channel and `sum(weights)`.
/// fp32 (never fp16) because fp16 sums overflow on large volumes (nnU-Net issues #2396, #1776).
pub struct Blender {
    acc: Array4<f32>,
    wsum: Array3<f32>,
    weights: Array3<f32>,
    grid: Grid,
    added: usize,
}

impl Blender {
    /// Zeroed accumulators for `channels` output channels over `grid`'s padded volume; `weights` is the
    /// importance map of one window (shape = roi).
    ///
    /// Panics if `weights` is not roi-shaped (a caller bug).
    pub fn new(channels: usize, grid: &Grid, weights: Array3<f32>) -> Self {
        Self::try_new(channels, grid, weights).expect("memory for the blend accumulators")
    }

    /// [`Blender::new`] whose accumulators are allocated fallibly: an out-of-memory error (the
    /// engine then retries at a smaller batch) instead of an abort.
    pub fn try_new(channels: usize, grid: &Grid, weights: Array3<f32>) -> crate::Result<Self> {
        check_weights("Blender", grid, &weights);
        let (acc, wsum) = accumulators(channels, grid.padded)?;
        Ok(Blender {
            acc,
            wsum,
            weights,
            grid: grid.clone(),
            added: 0,
        })
    }

    /// Add one window's output `(C, roi)` at origin `start` (padded coordinates). Products are rounded
    /// to f32 before the sum, like MONAI's `out += p * w` (no fused multiply-add).
    ///
    /// Panics if the shape or origin does not fit the grid (a caller bug).
    pub fn add(&mut self, start: [usize; 3], logits: ArrayView4<f32>) {
        let r = self.grid.roi;
        check_window("Blender", &self.grid, self.acc.dim().0, start, logits);
        let [d, h, w] = [0, 1, 2].map(|a| start[a]..start[a] + r[a]);
        accumulate(
            self.acc.slice_mut(s![.., d.clone(), h.clone(), w.clone()]),
            self.wsum.slice_mut(s![d, h, w]),
            logits,
            &self.weights,
        );
        self.added += 1;
    }

    /// Windows added so far.
    pub fn added(&self) -> usize {
        self.added
    }

    /// Divide the sums by the weight sum and crop the padding: `(C, D, H, W)` at the original size, in
    /// standard layout. Voxels no added window covered come out NaN (0 / 0).
    /// The cropped copy is allocated fallibly (an out-of-memory error, not an abort).
    pub fn finish(self) -> crate::Result<Array4<f32>> {
        let (b, n) = (self.grid.pad_before, self.grid.shape);
        let (d, h, w) = (b[0]..b[0] + n[0], b[1]..b[1] + n[1], b[2]..b[2] + n[2]);
        let wsum = self.wsum.slice(s![d.clone(), h.clone(), w.clone()]);
        let mut out = self.acc.slice_move(s![.., d, h, w]);
        divide(out.view_mut(), wsum);
        if out.is_standard_layout() {
            Ok(out)
        } else {
            crate::sys::alloc::try_to_owned(out.view(), "the blended outputs")
                .map_err(crate::sys::alloc::retryable)
        }
    }
}

/// Index of the largest channel per voxel of `(C, D, H, W)`; the first wins on ties, and a NaN counts as
/// the largest (first NaN wins), like `numpy.argmax` / `torch.argmax`. Channels past 65535 saturate.
///
/// The label map is allocated fallibly: an out-of-memory error, not an abort.
pub fn argmax(logits: ArrayView4<f32>) -> crate::Result<Array3<u16>> {
    let (_, d, h, w) = logits.dim();
    let mut out = crate::sys::alloc::try_zeros((d, h, w), "the label map")?;
    argmax_into(logits, out.view_mut());
    Ok(out)
}

/// [`argmax`] into `out` (`(D, H, W)` of `logits`), which the caller allocated.
///
/// Panics if `out` does not have the shape of one channel of `logits` (a caller bug).
pub fn argmax_into(logits: ArrayView4<f32>, mut out: ArrayViewMut3<u16>) {
    let (_, d, h, w) = logits.dim();
    assert_eq!(out.dim(), (d, h, w), "argmax_into: out must be (D, H, W)");
    Zip::from(&mut out)
        .and(logits.lanes(Axis(0)))
        .par_for_each(|o, lane| {
            let mut best = 0usize;
            let mut best_v = f32::NEG_INFINITY;
            for (i, &v) in lane.iter().enumerate() {
                if i == 0 || v > best_v || (v.is_nan() && !best_v.is_nan()) {
                    best = i;
                    best_v = v;
                }
            }
            *o = u16::try_from(best).unwrap_or(u16::MAX);
        });
}

/// Labels of a one-channel output `(1, D, H, W)`: 1 where the value is strictly above `t`, else 0.
///
/// The label map is allocated fallibly: an out-of-memory error, not an abort.
///
/// Panics if there is not exactly one channel: the engine checks the model's output first.
pub fn threshold(probs: ArrayView4<f32>, t: f32) -> crate::Result<Array3<u16>> {
    let (_, d, h, w) = probs.dim();
    let mut out = crate::sys::alloc::try_zeros((d, h, w), "the label map")?;
    threshold_into(probs, t, out.view_mut());
    Ok(out)
}

/// [`threshold`] into `out` (`(D, H, W)` of `probs`), which the caller allocated.
///
/// Panics unless `probs` has one channel and `out` its shape (caller bugs).
pub fn threshold_into(probs: ArrayView4<f32>, t: f32, mut out: ArrayViewMut3<u16>) {
    assert_eq!(probs.dim().0, 1, "threshold: needs a one-channel output");
    let ch = probs.index_axis(Axis(0), 0);
    assert_eq!(out.dim(), ch.dim(), "threshold_into: out must be (D, H, W)");
    Zip::from(&mut out)
        .and(&ch)
        .par_for_each(|o, &v| *o = u16::from(v > t));
}

/// Voxels of a blended output `(C, D, H, W)` where some channel is NaN: the labels there are
/// meaningless (a threshold reads NaN as "no", argmax skips it), so the engine warns with the count.
pub fn nan_voxels(blended: ArrayView4<f32>) -> usize {
    if !blended.iter().any(|v| v.is_nan()) {
        return 0;
    }
    // Voxel by voxel across the channels: no volume-sized mask to allocate.
    blended
        .lanes(Axis(0))
        .into_iter()
        .filter(|lane| lane.iter().any(|v| v.is_nan()))
        .count()
}

/// Finished D-planes of the blended output: `data` is `(C, n, H, W)`, normalised and cropped, and
/// holds original planes `d0 .. d0 + n`.
#[derive(Clone, Debug)]
pub struct Slab {
    /// Index of the slab's first D plane in the volume.
    pub d0: usize,
    /// `(C, n, H, W)` blended outputs of those planes.
    pub data: Array4<f32>,
}

/// [`Blender`] that keeps only `roi[0]` padded D-planes of accumulators and hands back finished planes
/// as soon as the windows move past them, so its memory is `C × roi_D × H × W` instead of the whole
/// volume (117 classes on 512×512×400 would need 49 GB). Windows must arrive with non-decreasing D
/// origin, as [`Grid::starts`] lists them; the sums, their order and so the results are bit-identical to
/// [`Blender`]'s.
pub struct SlabBlender {
    acc: Array4<f32>,
    wsum: Array3<f32>,
    weights: Array3<f32>,
    grid: Grid,
    /// Padded D coordinate of buffer plane 0.
    base: usize,
}

impl SlabBlender {
    /// Zeroed accumulators for `roi[0]` planes. Panics if `weights` is not roi-shaped (a caller bug).
    pub fn new(channels: usize, grid: &Grid, weights: Array3<f32>) -> Self {
        Self::try_new(channels, grid, weights).expect("memory for the blend accumulators")
    }

    /// [`SlabBlender::new`] whose accumulators are allocated fallibly (an out-of-memory error).
    pub fn try_new(channels: usize, grid: &Grid, weights: Array3<f32>) -> crate::Result<Self> {
        check_weights("SlabBlender", grid, &weights);
        let p = grid.padded;
        let (acc, wsum) = accumulators(channels, [grid.roi[0], p[1], p[2]])?;
        Ok(SlabBlender {
            acc,
            wsum,
            weights,
            grid: grid.clone(),
            base: 0,
        })
    }

    /// Add one window's output `(C, roi)`; when its D origin is past earlier windows', the planes no
    /// later window can touch are finalised first and returned (`None` if they are all padding).
    ///
    /// A slab that cannot be allocated is an out-of-memory error (not an abort).
    ///
    /// Panics on a D origin lower than an earlier one, or a window that does not fit (caller bugs).
    pub fn add(
        &mut self,
        start: [usize; 3],
        logits: ArrayView4<f32>,
    ) -> crate::Result<Option<Slab>> {
        let r = self.grid.roi;
        check_window("SlabBlender", &self.grid, self.acc.dim().0, start, logits);
        assert!(
            start[0] >= self.base,
            "SlabBlender::add: windows must come in non-decreasing D order (got D origin {} after {})",
            start[0],
            self.base
        );
        let slab = if start[0] > self.base {
            self.advance(start[0])?
        } else {
            None
        };
        let (h, w) = (start[1]..start[1] + r[1], start[2]..start[2] + r[2]);
        accumulate(
            self.acc.slice_mut(s![.., .., h.clone(), w.clone()]),
            self.wsum.slice_mut(s![.., h, w]),
            logits,
            &self.weights,
        );
        Ok(slab)
    }

    /// Finalise every remaining plane (`None` if they are all padding); an out-of-memory error
    /// when the slab cannot be allocated.
    pub fn finish(mut self) -> crate::Result<Option<Slab>> {
        let end = self.base + self.grid.roi[0];
        self.emit(end)
    }

    /// Normalise and crop padded planes `[base, upto)` into a slab.
    /// The slab's planes are allocated fallibly: they are as large as the accumulators.
    fn emit(&mut self, upto: usize) -> crate::Result<Option<Slab>> {
        let (b, n) = (self.grid.pad_before, self.grid.shape);
        // Padded planes [base, upto) ∩ original [b0, b0 + n0), in buffer coordinates.
        let lo = self.base.max(b[0]);
        let hi = upto.min(b[0] + n[0]);
        if lo >= hi {
            return Ok(None);
        }
        let (bl, bh) = (lo - self.base, hi - self.base);
        let (h, w) = (b[1]..b[1] + n[1], b[2]..b[2] + n[2]);
        let wsum = self.wsum.slice(s![bl..bh, h.clone(), w.clone()]);
        let sums = self.acc.slice(s![.., bl..bh, h, w]);
        let mut data = crate::sys::alloc::try_to_owned(sums, "a slab of blended outputs")
            .map_err(crate::sys::alloc::retryable)?;
        divide(data.view_mut(), wsum);
        Ok(Some(Slab {
            d0: lo - b[0],
            data,
        }))
    }

    /// Emit planes `[base, new_base)` and shift the buffer so plane 0 is `new_base`.
    fn advance(&mut self, new_base: usize) -> crate::Result<Option<Slab>> {
        let slab = self.emit(new_base.min(self.base + self.grid.roi[0]))?;
        let shift = new_base - self.base;
        let len = self.grid.roi[0];
        if shift >= len {
            self.acc.fill(0.0);
            self.wsum.fill(0.0);
        } else {
            for mut c in self.acc.outer_iter_mut() {
                shift_planes(c.view_mut(), shift);
            }
            shift_planes(self.wsum.view_mut(), shift);
        }
        self.base = new_base;
        Ok(slab)
    }
}

/// Move planes `[shift, D)` of `a` to `[0, D - shift)` in place (plane by plane, lowest first, so
/// a source is read before it is overwritten) and zero the last `shift`: no copy of the tail.
fn shift_planes(mut a: ArrayViewMut3<f32>, shift: usize) {
    let len = a.dim().0;
    for k in 0..len - shift {
        let (mut lo, hi) = a.view_mut().split_at(Axis(0), k + 1);
        lo.index_axis_mut(Axis(0), k)
            .assign(&hi.index_axis(Axis(0), shift - 1));
    }
    a.slice_mut(s![len - shift.., .., ..]).fill(0.0);
}

#[cfg(test)]
mod tests {
    use super::super::{weight_map, BlendMode, Placement};
    use super::*;

    /// Under an allocation limit that the accumulators fit but a slab does not, the slab blender
    /// reports out-of-memory (the engine then retries or stops with one line) instead of aborting
    /// the process as `to_owned` did.
    #[test]
    fn slab_emit_reports_a_failed_allocation() {
        let g = Grid::new([40, 32, 32], [16, 32, 32], [0.5; 3], Placement::Monai).unwrap();
        let mut sb =
            SlabBlender::try_new(2, &g, weight_map(g.roi, BlendMode::Constant, [0.125; 3]))
                .unwrap();
        let y = Array4::<f32>::from_elem((2, 16, 32, 32), 1.0);
        assert!(sb.add([0, 0, 0], y.view()).unwrap().is_none());
        // Moving on by 8 planes emits 8 planes of 2 channels: 64 KiB. Allow less.
        crate::sys::alloc::fail_above(32 << 10);
        let e = sb.add([8, 0, 0], y.view()).unwrap_err();
        crate::sys::alloc::fail_above(usize::MAX);
        assert!(matches!(e, crate::Error::OutOfMemory(_)), "{e}");
        assert!(e.to_string().contains("a slab of blended outputs"), "{e}");
        // Within the limit the same step emits the slab, and the shifted planes blend on.
        let mut sb =
            SlabBlender::try_new(2, &g, weight_map(g.roi, BlendMode::Constant, [0.125; 3]))
                .unwrap();
        sb.add([0, 0, 0], y.view()).unwrap();
        let slab = sb.add([8, 0, 0], y.view()).unwrap().unwrap();
        assert_eq!((slab.d0, slab.data.dim()), (0, (2, 8, 32, 32)));
        assert!(slab.data.iter().all(|&v| (v - 1.0).abs() < 1e-6));
        crate::sys::alloc::fail_above(1);
        assert!(sb.finish().is_err());
        crate::sys::alloc::fail_above(usize::MAX);
    }

    /// Shifting planes in place keeps the tail and zeroes the rest.
    #[test]
    fn shift_planes_moves_the_tail_down() {
        let mut a = Array3::from_shape_fn((5, 2, 1), |(d, h, _)| (d * 10 + h) as f32);
        shift_planes(a.view_mut(), 2);
        let want = [2., 3., 4.].iter().flat_map(|&d| [d * 10., d * 10. + 1.]);
        let got: Vec<f32> = a.iter().copied().collect();
        assert_eq!(&got[..6], &want.collect::<Vec<_>>()[..]);
        assert!(got[6..].iter().all(|&v| v == 0.0));
    }
}
