//! What a pass allocates, in the terms every backend's memory model answers in: the planner
//! compares [`Estimate`]s with the budget, `voxtile plan` prints them, `--report` puts them next to
//! the measured peak.

use crate::tiling::Placement;
use serde::Serialize;

/// Which backend's allocations are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Cpu,
    Cuda,
}

/// Bytes per category, as a memory summary prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub weights: u64,
    pub activations: u64,
    pub workspace: u64,
    pub staging: u64,
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
    pub name: String,
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
    pub overlap: [f64; 3],
    pub placement: Placement,
    /// The blended outputs are kept (`--logits`): the whole fp32 output stays on the host.
    pub keep_logits: bool,
    /// The engine copies the input first (normalisation or non-finite voxels).
    pub copy_input: bool,
}

/// The predicted memory of one (roi, batch) on a target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub target: Target,
    pub roi: [usize; 3],
    pub batch: usize,
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
