//! What a pass allocates, in the terms every backend's memory model answers in: the planner
//! compares [`Estimate`]s with the budget, `voxtile plan` prints them, `--report` puts them next to
//! the measured peak.

use crate::tiling::{self, Placement};
use crate::{Error, Result};
use serde::Serialize;

/// Which backend's allocations are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The host: the working set of the f32 CPU backend.
    Cpu,
    /// A CUDA device: fp16 arena, kernels' scratch, streamed accumulators.
    Cuda,
}

/// Bytes per category, as a memory summary prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Model parameters as the backend holds them.
    pub weights: u64,
    /// Activations alive at the liveness peak.
    pub activations: u64,
    /// Scratch of the ops themselves (im2col columns, norm statistics).
    pub workspace: u64,
    /// Window batches gathered for the network, and transfer buffers.
    pub staging: u64,
    /// Blending sums and finished output slots.
    pub accumulators: u64,
}

impl Breakdown {
    /// The sum (saturating: a part saturated for an absurd size stays "more than any budget").
    pub fn total(&self) -> u64 {
        [
            self.activations,
            self.workspace,
            self.staging,
            self.accumulators,
        ]
        .iter()
        .fold(self.weights, |a, &b| a.saturating_add(b))
    }
}

/// Where the activation peak happens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeakNode {
    /// Index in `Graph::nodes`.
    pub index: usize,
    /// The ONNX node name.
    pub name: String,
    /// Its op's ONNX-style name ("input" for the network input).
    pub op: String,
    /// Activation bytes alive right after this node wrote its output.
    pub live_bytes: u64,
    /// Activation buffers alive then.
    pub live_values: usize,
}

/// Everything a run needs besides the window and batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    /// Volume size in network axes (D, H, W).
    pub shape: [usize; 3],
    /// Fraction of the window shared by neighbours, per network axis.
    pub overlap: [f64; 3],
    /// Where windows start.
    pub placement: Placement,
    /// The blended outputs are kept (`--logits`): the whole fp32 output stays on the host.
    pub keep_logits: bool,
    /// The engine copies the input first (normalisation or non-finite voxels).
    pub copy_input: bool,
}

/// The predicted memory of one (roi, batch) on a target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Which backend was modelled.
    pub target: Target,
    /// Window size in network axes (D, H, W).
    pub roi: [usize; 3],
    /// Windows per backend call.
    pub batch: usize,
    /// Windows the grid of this roi puts on the volume.
    pub windows: usize,
    /// What the budget is compared with: device memory on CUDA, the host working set on CPU.
    pub budgeted: Breakdown,
    /// Host memory of the run besides the volume and its outputs (equal to `budgeted` on CPU).
    pub host: Breakdown,
    /// Input volume (and its normalised copy) plus the output arrays on the host: fixed by the
    /// volume, not by the plan, so not counted against the budget.
    pub volume_bytes: u64,
    /// The activation liveness peak and its node.
    pub peak_node: PeakNode,
    /// CPU: the executor's liveness peak (= `RunStats::peak_live_bytes`); CUDA: the launch list's
    /// pool without alignment (= `CudaBackend::activation_bytes()`).
    pub backend_activation_bytes: u64,
}

impl Estimate {
    /// Predicted peak device bytes (CUDA only).
    pub fn predicted_device(&self) -> Option<u64> {
        (self.target == Target::Cuda).then(|| self.budgeted.total())
    }
    /// Predicted peak host bytes: working set plus the volume and outputs.
    pub fn predicted_host(&self) -> u64 {
        self.host.total() + self.volume_bytes
    }
}

/// Bytes of one f32.
pub const F32: u64 = 4;
/// Bytes of one f16.
pub const F16: u64 = 2;

/// Largest volume (voxels, padded up to the window) the planner accepts: 2^40, a 10000³ volume.
/// Past it the byte arithmetic of the models would leave u64 and no machine holds the volume.
pub const MAX_VOXELS: u64 = 1 << 40;

/// Product of sizes, saturating: an absurd shape models as "more than any budget", never wraps.
pub fn prod(s: &[usize]) -> u64 {
    s.iter().fold(1u64, |acc, &v| acc.saturating_mul(v as u64))
}

/// `a × b × …` of user-given sizes, None past `limit` (or u64).
fn checked_prod(s: &[usize], limit: u64) -> Option<u64> {
    s.iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v as u64))
        .filter(|&p| p <= limit)
}

/// Refuse a volume (padded up to `roi`) or a launch (`batch` windows of `roi`) too large to plan,
/// before any arithmetic or allocation depends on its size.
pub fn check_sizes(shape: [usize; 3], roi: [usize; 3], batch: usize) -> Result<()> {
    let padded: [usize; 3] = [0, 1, 2].map(|a| shape[a].max(roi[a]));
    if checked_prod(&padded, MAX_VOXELS).is_none() {
        return Err(Error::Invalid(format!(
            "volume {}x{}x{} (window {roi:?}) is too large to plan: more than {MAX_VOXELS} voxels",
            shape[0], shape[1], shape[2]
        )));
    }
    let launch = checked_prod(&roi, MAX_VOXELS).and_then(|r| r.checked_mul(batch as u64));
    if launch.is_none_or(|v| v > MAX_VOXELS) {
        return Err(Error::Invalid(format!(
            "batch {batch} of windows {roi:?} is too large to plan: more than {MAX_VOXELS} voxels per call"
        )));
    }
    Ok(())
}

impl Workload {
    /// Number of windows of `roi` over the volume; an error (not a hang or an abort) when the
    /// volume is too large or needs more windows than the tiler lists.
    pub fn windows(&self, roi: [usize; 3]) -> Result<usize> {
        check_sizes(self.shape, roi, 1)?;
        tiling::window_count(self.shape, roi, self.overlap, self.placement)
    }

    /// Checks common to every model's estimate: positive sizes, plannable sizes; returns the
    /// window count.
    pub fn check(&self, roi: [usize; 3], batch: usize) -> Result<usize> {
        if batch == 0 || roi.contains(&0) {
            return Err(Error::Invalid(format!(
                "batch {batch} and window {roi:?} must be positive"
            )));
        }
        check_sizes(self.shape, roi, batch)?;
        self.windows(roi)
    }

    /// Host bytes of `c` channels over the volume, `bytes` each (saturating: channels are not
    /// bounded by [`check_sizes`]).
    pub fn per_voxel(&self, c: usize, bytes: u64) -> u64 {
        (c as u64)
            .saturating_mul(prod(&self.shape))
            .saturating_mul(bytes)
    }

    /// The input volume on the host (twice when the engine copies it).
    pub fn input_bytes(&self, cin: usize) -> u64 {
        self.per_voxel(cin, F32)
            .saturating_mul(if self.copy_input { 2 } else { 1 })
    }
}
