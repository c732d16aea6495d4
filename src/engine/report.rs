//! The `--report` of one run: stage times, sizes, the planner's prediction next to what was
//! measured.

pub use crate::backend::StageTimes;
use crate::plan;
use serde::Serialize;

/// Stage timings and sizes of one run, serialised into `--report`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Volume size (i, j, k).
    pub input_shape: [usize; 3],
    /// Input channels.
    pub channels: usize,
    /// Voxel size (mm) from the header.
    pub spacing: [f64; 3],
    /// Window size that ran (network axes).
    pub roi: [usize; 3],
    /// Window overlap that ran.
    pub overlap: [f64; 3],
    /// Windows on the volume.
    pub windows: usize,
    /// Windows per backend call.
    pub batch: usize,
    /// The backend's name ("cpu (N threads)", "cuda:0 NVIDIA H200").
    pub device: String,
    /// What the graph applies to its output: "none", "softmax" or "sigmoid".
    pub output_activation: String,
    /// How labels were made, in words.
    pub labels: String,
    /// Seconds per stage.
    pub seconds: StageTimes,
    /// Extra per-stage GPU times (event-timed) when the CUDA path ran.
    pub gpu: Option<serde_json::Value>,
    /// Input voxels that were NaN (set to 0) or infinite (clamped) before the network.
    pub nonfinite_voxels: usize,
    /// Voxels whose blended network output holds NaN (their labels are meaningless; warned on
    /// stderr). None where it is not counted: the CUDA path that makes labels on the device.
    pub nan_output_voxels: Option<usize>,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_host_bytes: u64,
    /// High-water mark of the device allocations (CUDA).
    pub peak_device_bytes: Option<u64>,
    /// The planner's prediction for the roi and batch that ran: host (working set + volume and
    /// outputs) and device (CUDA).
    pub predicted_peak_bytes: PredictedPeak,
    /// Activation bytes the backend measured: CPU executor's liveness peak (max over batches),
    /// CUDA launch list's buffer pool.
    pub measured_activation_bytes: Option<u64>,
    /// The budget the planner used, bytes.
    pub memory_budget: u64,
    /// Where the budget came from, in words.
    pub memory_budget_source: String,
    /// "default", "planned" or "user".
    pub plan: String,
    /// The planner's breakdown (weights, activations, workspace, staging, accumulators).
    pub predicted: Option<plan::Estimate>,
    /// Out-of-memory retries, one line each.
    pub oom_retries: Vec<String>,
    /// Windows run, counting twice those two devices share when a volume is split (= `windows`
    /// on one device).
    pub windows_run: usize,
    /// Each device's share when the volume was split across several (empty on one device).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartReport>,
}

/// One device's share of a split volume.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartReport {
    /// Its backend's name.
    pub device: String,
    /// Network-axis D planes `[lo, hi)` of the output it wrote.
    pub planes: [usize; 2],
    /// The D planes `[lo, hi)` of the volume its windows read.
    pub crop: [usize; 2],
    /// Windows it ran.
    pub windows: usize,
    /// Its windows per backend call.
    pub batch: usize,
    /// Its network (and, on the CPU, blending) time.
    pub compute_seconds: f64,
    /// Its device allocations' high-water mark (CUDA).
    pub peak_device_bytes: Option<u64>,
    /// Activation bytes its backend measured.
    pub measured_activation_bytes: u64,
}

/// Predicted peak bytes, next to the measured ones in the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PredictedPeak {
    /// Host bytes: working set plus the volume and outputs.
    pub host: u64,
    /// Device bytes (CUDA only).
    pub device: Option<u64>,
}

/// The process's resident high-water mark (VmHWM) in bytes; 0 where /proc is missing.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
