//! What one streamed pass is given (the windows and their volume) and the events it records:
//! shared by the pass's setup (`pass`) and its loop (`run`), so neither imports the other.

use crate::backend::VolumeRef;
use cudarc::driver::CudaEvent;
use ndarray::ArrayView3;

/// One sliding-window pass: windows (`starts` in padded coordinates, padded size `padded`,
/// `pad_before` voxels of `cval` before the volume `(C, D, H, W)`), run `batch` at a time and
/// blended with `weights` (roi). Whether labels or blended outputs come back is the caller's
/// choice of method (`CudaBackend::segment_windows` or `segment_windows_argmax`).
#[derive(Clone, Copy, Debug)]
pub struct WindowJob<'a> {
    /// The volume `(C, D, H, W)`, network axes: host memory, or this device's (the direct
    /// input, read in place).
    pub vol: VolumeRef<'a>,
    /// Padded volume size the window starts live in.
    pub padded: [usize; 3],
    /// Padding before the volume on each axis.
    pub pad_before: [usize; 3],
    /// Window size.
    pub roi: [usize; 3],
    /// Window origins in padded coordinates, any order.
    pub starts: &'a [[usize; 3]],
    /// Blending weights of one window (`roi`).
    pub weights: ArrayView3<'a, f32>,
    /// Windows per network run.
    pub batch: usize,
    /// Value of the padding.
    pub cval: f32,
}

/// Events of the pass, per stage, for the times.
#[derive(Default)]
pub(super) struct Events {
    pub(super) h2d: Vec<(CudaEvent, CudaEvent)>,
    /// Per batch: input fill start, input filled, launch list done.
    pub(super) cmp: Vec<(CudaEvent, CudaEvent, CudaEvent)>,
    /// Per part of a batch: its blends' start and end (with the back steps run between them).
    pub(super) blend: Vec<(CudaEvent, CudaEvent)>,
    /// Per window of a launch list ending in a window segment: its back steps.
    pub(super) back: Vec<(CudaEvent, CudaEvent)>,
    pub(super) fin: Vec<(CudaEvent, CudaEvent)>,
    pub(super) d2h: Vec<(CudaEvent, CudaEvent)>,
}
