//! Backends execute the graph IR. Each owns its preparation, its memory model and the
//! sliding-window pass over one volume; the engine and the planner see only these traits and
//! [`open`] / [`memory_model`], the one place that names a concrete backend.

#[allow(missing_docs)] // reached only through `crate::internals`
pub(crate) mod cpu;
#[allow(missing_docs)] // reached only through `crate::internals`
pub(crate) mod cuda;
pub mod memory;
pub mod volume_ref;

use crate::model::graph::OutputActivation;
use crate::model::Graph;
use crate::tiling::{Grid, PadMode};
use crate::{Error, Result};
pub use memory::Target;
use memory::{Estimate, Workload};
use ndarray::{Array3, Array4, Array5, ArrayView3, ArrayView4, ArrayView5, ArrayViewMut3};
use serde::Serialize;
use std::ops::Range;
pub use volume_ref::{DeviceVolume, VolumeRef};

/// What a device will allocate for a (window, batch), answerable without opening it: `voxtile
/// plan` on a machine without the GPU uses the model of an H200; an opened backend answers with
/// its real capabilities (SM count, shared memory), so the plan is the one `prepare` allocates.
pub trait MemoryModel: Send {
    /// Which backend's allocations this models.
    fn target(&self) -> Target;
    /// Predicted memory of one (roi, batch) pass over `workload`.
    fn estimate(
        &self,
        graph: &Graph,
        roi: [usize; 3],
        batch: usize,
        workload: &Workload,
    ) -> Result<Estimate>;
    /// Modelled cost of running `windows` windows of `roi` in batches of `batch` (the planner
    /// picks the cheapest batch that fits; lower is faster).
    fn cost(&self, windows: usize, roi: [usize; 3], batch: usize) -> u64;
    /// The budget used when the user gives none, and where it came from (for messages).
    fn default_budget(&self) -> (u64, String);
    /// The largest batch this backend runs the graph at (exports that bake the batch into
    /// Reshape targets run one window at a time).
    fn max_batch(&self, graph: &Graph, roi: [usize; 3]) -> usize {
        graph.max_batch(roi)
    }
}

/// How blended outputs become labels: argmax over channels, or a threshold on one channel
/// (0.5 after a Sigmoid in the graph, 0 on raw logits).
#[derive(Clone, Copy, Debug)]
pub struct LabelRule {
    /// Output channels of the model.
    pub cout: usize,
    /// The graph's final activation.
    pub act: OutputActivation,
    /// The blended outputs are returned too (`--logits`, probabilities).
    pub keep_logits: bool,
}

impl LabelRule {
    /// The threshold of a one-channel output (None: argmax over channels).
    pub fn threshold(&self) -> Option<f32> {
        (self.cout == 1).then(|| {
            if self.act == OutputActivation::Sigmoid {
                0.5
            } else {
                0.0
            }
        })
    }

    /// Labels of blended outputs `(C, n, H, W)`, allocated fallibly (an error, not an abort).
    pub fn labels(&self, blended: ArrayView4<f32>) -> crate::Result<Array3<u16>> {
        let (_, d, h, w) = blended.dim();
        let mut out = crate::sys::alloc::try_zeros((d, h, w), "the label map")?;
        self.labels_into(blended, out.view_mut());
        Ok(out)
    }

    /// Labels of blended outputs `(C, n, H, W)` written into `out` (`(n, H, W)`).
    pub fn labels_into(&self, blended: ArrayView4<f32>, out: ArrayViewMut3<u16>) {
        match self.threshold() {
            Some(t) => crate::tiling::threshold_into(blended, t, out),
            None => crate::tiling::argmax_into(blended, out),
        }
    }

    /// How labels are made, in words (the report's `labels`).
    pub fn describe(&self) -> String {
        match self.threshold() {
            Some(t) => format!("threshold {t} on the single output channel"),
            None => "argmax over channels".into(),
        }
    }
}

/// One sliding-window pass: the windows of `grid` over `volume`, run `batch` at a time and
/// blended with `weights`.
pub struct Pass<'a> {
    /// The network input `(C, D, H, W)` in network axes, already normalised: in host memory,
    /// or in the CUDA device's (read there by the CUDA backend only).
    pub volume: VolumeRef<'a>,
    /// Window origins (padded coordinates) and padding.
    pub grid: &'a Grid,
    /// Blending weights of one window (`roi`).
    pub weights: ArrayView3<'a, f32>,
    /// Windows per backend call; `prepare(graph, >= batch, grid.roi)` came first.
    pub batch: usize,
    /// Values outside the volume.
    pub pad: PadMode,
    /// How labels are made.
    pub labels: LabelRule,
    /// D planes and H rows whose NaN outputs are counted: a device's own share of a split
    /// volume, a band's own rows.
    pub own: [Range<usize>; 2],
    /// Blend into one whole-volume accumulator instead of streaming slabs (CPU test hook for
    /// MONAI's accumulator; the CUDA backend streams always).
    pub blend_in_memory: bool,
    /// CPU test hook: the N-th backend call of this pass (1-based) fails with
    /// `Error::OutOfMemory` (the CUDA pipeline reads `VOXTILE_INJECT_OOM` itself).
    pub inject_oom: Option<usize>,
    /// Checked before each batch: once cancelled, the pass stops with `Error::Cancelled`.
    pub cancel: &'a crate::CancelToken,
}

/// Seconds spent per stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageTimes {
    /// Reading the input.
    pub read: f64,
    /// Preparing the backend.
    pub prepare: f64,
    /// Running the network (and, on CUDA, the whole streamed pass).
    pub compute: f64,
    /// Blending window outputs.
    pub blend: f64,
    /// Labels and outputs of finished planes.
    pub finalize: f64,
    /// Writing outputs.
    pub write: f64,
    /// The whole run.
    pub total: f64,
}

/// What a pass returns.
pub struct PassOutput {
    /// Labels `(D, H, W)` of the grid's volume.
    pub labels: Array3<u16>,
    /// Blended outputs `(C, D, H, W)` when `LabelRule::keep_logits`.
    pub logits: Option<Array4<f32>>,
    /// Voxels of the `own` planes whose blended output holds a NaN (their label is 0).
    pub nan_voxels: usize,
    /// Stage times of the pass (compute, blend, finalize).
    pub seconds: StageTimes,
    /// Activation bytes the backend measured (CPU: executor liveness peak; CUDA: launch-list pool).
    pub measured_activation_bytes: u64,
    /// High-water mark of the backend's device allocations during the pass (CUDA).
    pub peak_device_bytes: Option<u64>,
    /// Backend-specific stage details for the report (CUDA event timings).
    pub details: Option<serde_json::Value>,
}

/// A device that runs a prepared graph.
pub trait Backend: Send {
    /// Human-readable name for logs and reports ("cpu (2 threads)", "cuda:0 NVIDIA H200").
    fn name(&self) -> String;
    /// This device's memory model, with its real capabilities.
    fn memory(&self) -> &dyn MemoryModel;
    /// Compile the graph once for a window size and batch (weights re-laid, buffers planned).
    fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()>;
    /// Run one batch `[n <= batch, C_in, roi]` and return `[n, C_out, D', H', W']`.
    fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>>;
    /// The sliding-window pass over one volume. An allocation failure anywhere in it is
    /// `Error::OutOfMemory` (the engine, and only the engine, retries at a smaller batch).
    fn sliding_window(
        &mut self,
        pass: &Pass<'_>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<PassOutput>;
}

/// Which device runs the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// CUDA when a driver, a GPU and NVRTC are present, else CPU (said on stderr).
    Auto,
    /// The float32 CPU backend (the exact reference).
    Cpu,
    /// CUDA device `N` (fp16 kernels compiled with NVRTC).
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(Error::Invalid(format!(
                    "unknown device '{s}': use auto, cpu, cuda or cuda:N"
                ))),
            },
        }
    }
}

/// Open a device: the one function that names the concrete backends. `Auto` tries CUDA device 0
/// and falls back to the CPU with an info event saying why. Returns the device that opened (never
/// `Auto`).
pub fn open(device: Device) -> Result<(Box<dyn Backend>, Device)> {
    let cpu = || Box::new(cpu::CpuBackend::new()) as Box<dyn Backend>;
    Ok(match device {
        Device::Cpu => (cpu(), Device::Cpu),
        Device::Cuda(i) => (Box::new(cuda::CudaBackend::new(i)?), device),
        Device::Auto => match cuda::CudaBackend::new(0) {
            Ok(b) => (Box::new(b), Device::Cuda(0)),
            Err(e) => {
                // A notice (info), not a warning: on a machine without a GPU this is the
                // expected path of the default device. An explicit `cuda` is an error above.
                tracing::info!("CUDA unavailable ({e}); running on the CPU");
                (cpu(), Device::Cpu)
            }
        },
    })
}

/// A memory model without opening a device: the host for `Cpu`; for CUDA (`Auto` included) an
/// H200 (sm_90), its default budget asked of device `N`'s driver when one answers.
pub fn memory_model(device: Device) -> Box<dyn MemoryModel> {
    match device {
        Device::Cpu => Box::new(cpu::memory::CpuMemory),
        Device::Cuda(i) => Box::new(cuda::memory::CudaMemory::h200(i)),
        Device::Auto => Box::new(cuda::memory::CudaMemory::h200(0)),
    }
}
