//! The loop: plan windows, gather batches, run the backend, blend, finalise.
//!
//! The engine is the only place that knows both the tiler and a backend: the CPU path gathers a
//! batch of windows on the host, runs it and blends it; the CUDA path hands the whole window list
//! to the GPU pipeline (gather, run, blend on the device, streams overlapped).

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::Backend;
use crate::model::graph::OutputActivation;
use crate::model::Graph;
use crate::plan;
use crate::tiling::{self, BlendMode, Grid, PadMode, Placement};
use crate::volume::{Header, Volume};
use crate::{Error, Result};
use ndarray::{s, Array3, Array4, Array5, ArrayView4, Axis, Slice};
use serde::Serialize;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

pub mod split;

/// Which device runs the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// CUDA when a driver, a GPU and NVRTC are present, else CPU (said on stderr).
    Auto,
    Cpu,
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

/// How the network's D,H,W axes map onto the file's i,j,k axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisOrder {
    /// D,H,W = i,j,k: nibabel + MONAI.
    Xyz,
    /// D,H,W = k,j,i: SimpleITK + nnU-Net.
    Zyx,
}

impl std::str::FromStr for AxisOrder {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "xyz" | "ijk" => Ok(AxisOrder::Xyz),
            "zyx" | "kji" => Ok(AxisOrder::Zyx),
            _ => Err(Error::Invalid(format!(
                "unknown axis order '{s}': use xyz or zyx"
            ))),
        }
    }
}

/// Intensity normalisation applied to the whole volume before windowing (per channel).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Normalize {
    None,
    /// (x − mean) / (std + 1e-8) over the volume: MONAI's NormalizeIntensity, the W3 peer.
    ZScore,
    /// nnU-Net's CTNormalization: clip to [lo, hi], then (x − mean) / max(std, 1e-8).
    Ct {
        lo: f32,
        hi: f32,
        mean: f32,
        std: f32,
    },
}

impl std::str::FromStr for Normalize {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Normalize::None),
            "zscore" => Ok(Normalize::ZScore),
            _ => {
                let bad = || {
                    Error::Invalid(format!(
                        "unknown normalisation '{s}': use none, zscore or ct:LO,HI,MEAN,STD"
                    ))
                };
                let v: Vec<f32> = s
                    .strip_prefix("ct:")
                    .ok_or_else(bad)?
                    .split(',')
                    .map(|x| x.trim().parse::<f32>().map_err(|_| bad()))
                    .collect::<Result<_>>()?;
                match v.as_slice() {
                    &[lo, hi, mean, std] if lo <= hi && std > 0.0 => {
                        Ok(Normalize::Ct { lo, hi, mean, std })
                    }
                    _ => Err(bad()),
                }
            }
        }
    }
}

/// Normalise each channel in place (f64 sums: a 512²×128 volume overflows f32 precision).
pub fn normalize(data: &mut Array4<f32>, how: Normalize) {
    for mut ch in data.outer_iter_mut() {
        match how {
            Normalize::None => {}
            Normalize::ZScore => {
                let n = ch.len().max(1) as f64;
                let mean = ch.iter().map(|&v| v as f64).sum::<f64>() / n;
                let var = ch.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
                let (m, inv) = (mean as f32, 1.0 / (var.sqrt() as f32 + 1e-8));
                ch.mapv_inplace(|v| (v - m) * inv);
            }
            Normalize::Ct { lo, hi, mean, std } => {
                let inv = 1.0 / std.max(1e-8);
                ch.mapv_inplace(|v| (v.clamp(lo, hi) - mean) * inv);
            }
        }
    }
}

/// Everything that decides the result besides the model and the volume.
#[derive(Clone, Debug)]
pub struct Options {
    /// Window size in network axes; None: the model's fixed input size, else 128 clipped to the
    /// volume (rounded up to what the network's strides need).
    pub roi: Option<[usize; 3]>,
    pub overlap: [f64; 3],
    pub blend: BlendMode,
    pub sigma_scale: [f64; 3],
    pub placement: Placement,
    /// Windows per backend call; None: 1 on CPU, 2 on CUDA.
    pub batch: Option<usize>,
    pub pad: PadMode,
    pub device: Device,
    /// More devices for each volume: with `device` they share its windows by D planes (see
    /// [`split`]), and labels and outputs are bitwise those of `device` alone. All CPU (`cpu`
    /// may repeat: several CPU workers) or all CUDA. Set both with [`Options::set_devices`].
    pub extra_devices: Vec<Device>,
    pub axis_order: AxisOrder,
    /// Keep the blended raw outputs (what MONAI's sliding_window_inference returns).
    pub keep_logits: bool,
    pub normalize: Normalize,
    /// Bytes the run may use (device memory on CUDA, the host working set on CPU); None: 80% of
    /// the device's free memory, or half of the memory left to the process (RAM, RLIMIT_AS,
    /// cgroup). The planner picks the batch under it and never shrinks the window (see
    /// [`crate::plan::choose`]).
    pub memory_budget: Option<u64>,
    /// Blend into whole-volume accumulators instead of streaming slabs (the reference the slab
    /// path is tested against; needs C × volume fp32).
    #[doc(hidden)]
    pub blend_in_memory: bool,
    /// CPU test hook: the N-th backend call (1-based, counted over the whole run) fails once
    /// with `Error::OutOfMemory`. `VOXTILE_INJECT_OOM=N` sets it for the CPU backend (the CUDA
    /// pipeline reads the variable itself).
    #[doc(hidden)]
    pub inject_oom: Option<usize>,
}

impl Default for Options {
    /// nnU-Net's defaults (gaussian, overlap 0.5) with MONAI's sigma_scale and zero padding.
    fn default() -> Self {
        Options {
            roi: None,
            overlap: [0.5; 3],
            blend: BlendMode::Gaussian,
            sigma_scale: [0.125; 3],
            placement: Placement::Monai,
            batch: None,
            pad: PadMode::Constant(0.0),
            device: Device::Auto,
            extra_devices: Vec::new(),
            axis_order: AxisOrder::Xyz,
            keep_logits: false,
            normalize: Normalize::None,
            memory_budget: None,
            blend_in_memory: false,
            inject_oom: None,
        }
    }
}

impl Options {
    /// Every device of a run: `device`, then `extra_devices`.
    pub fn devices(&self) -> Vec<Device> {
        std::iter::once(self.device)
            .chain(self.extra_devices.iter().copied())
            .collect()
    }

    /// Run on `list` (the first becomes `device`); an empty list leaves the options as they are.
    pub fn set_devices(&mut self, list: &[Device]) {
        if let Some((first, rest)) = list.split_first() {
            self.device = *first;
            self.extra_devices = rest.to_vec();
        }
    }
}

/// Stage timings and sizes of one run, serialised into `--report`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub input_shape: [usize; 3],
    pub channels: usize,
    pub spacing: [f64; 3],
    pub roi: [usize; 3],
    pub overlap: [f64; 3],
    pub windows: usize,
    pub batch: usize,
    pub device: String,
    pub output_activation: String,
    pub labels: String,
    pub seconds: StageTimes,
    /// Extra per-stage GPU times (event-timed) when the CUDA path ran.
    pub gpu: Option<serde_json::Value>,
    pub nonfinite_voxels: usize,
    /// Voxels whose blended network output holds NaN (their labels are meaningless; warned on
    /// stderr). None where it is not counted: the CUDA path that makes labels on the device.
    pub nan_output_voxels: Option<usize>,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_host_bytes: u64,
    pub peak_device_bytes: Option<u64>,
    /// The planner's prediction for the roi and batch that ran: host (working set + volume and
    /// outputs) and device (CUDA).
    pub predicted_peak_bytes: PredictedPeak,
    /// Activation bytes the backend measured: CPU executor's liveness peak (max over batches),
    /// CUDA launch list's buffer pool.
    pub measured_activation_bytes: Option<u64>,
    pub memory_budget: u64,
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
    pub device: String,
    /// Network-axis D planes `[lo, hi)` of the output it wrote.
    pub planes: [usize; 2],
    /// The D planes `[lo, hi)` of the volume its windows read.
    pub crop: [usize; 2],
    pub windows: usize,
    pub batch: usize,
    /// Its network (and, on the CPU, blending) time.
    pub compute_seconds: f64,
    pub peak_device_bytes: Option<u64>,
    pub measured_activation_bytes: u64,
}

/// Predicted peak bytes, next to the measured ones in the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PredictedPeak {
    pub host: u64,
    pub device: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StageTimes {
    pub read: f64,
    pub prepare: f64,
    pub compute: f64,
    pub blend: f64,
    pub finalize: f64,
    pub write: f64,
    pub total: f64,
}

/// The result: labels on the input's (i,j,k) grid, optional blended outputs, the input geometry.
pub struct Segmentation {
    pub labels: Array3<u16>,
    /// (channel, i, j, k) blended network outputs, when `Options::keep_logits`.
    pub logits: Option<Array4<f32>>,
    pub header: Header,
    pub report: Report,
}

enum Exec {
    Cpu(Box<CpuBackend>),
    Cuda(Box<CudaBackend>),
}

/// One device: its backend and the (batch, roi) it is prepared for.
struct Worker {
    exec: Exec,
    prepared: Option<(usize, [usize; 3])>,
    name: String,
}

impl Worker {
    /// Open `device`; `Auto` falls back to the CPU with a message on stderr. Returns the device
    /// that opened (never `Auto`).
    fn open(device: Device) -> Result<(Worker, Device)> {
        let (exec, dev) = match device {
            Device::Cpu => (Exec::Cpu(Box::new(CpuBackend::new())), Device::Cpu),
            Device::Cuda(i) => (Exec::Cuda(Box::new(CudaBackend::new(i)?)), device),
            Device::Auto => match CudaBackend::new(0) {
                Ok(b) => (Exec::Cuda(Box::new(b)), Device::Cuda(0)),
                Err(e) => {
                    eprintln!("voxtile: CUDA unavailable ({e}); running on the CPU");
                    (Exec::Cpu(Box::new(CpuBackend::new())), Device::Cpu)
                }
            },
        };
        let name = match &exec {
            Exec::Cpu(b) => b.name(),
            Exec::Cuda(b) => b.name(),
        };
        Ok((
            Worker {
                exec,
                prepared: None,
                name,
            },
            dev,
        ))
    }
}

/// A model bound to one backend per device, ready to segment volumes.
pub struct Engine {
    graph: Graph,
    options: Options,
    /// One per device; several share each volume (see [`split`]).
    workers: Vec<Worker>,
    device_name: String,
    /// Budget bytes and where they came from.
    budget: (u64, String),
    /// Plan warnings already said: each once per engine, not once per volume or TTA pass.
    warned: std::collections::HashSet<String>,
}

impl Engine {
    /// Load an ONNX model and choose the backend.
    pub fn from_file(model: &Path, options: Options) -> Result<Engine> {
        let graph = crate::model::onnx::load(model)?;
        Engine::new(graph, options)
    }

    /// Bind a loaded graph; `Device::Auto` falls back to the CPU with a message on stderr.
    /// Several devices (`Options::extra_devices`) each get a backend prepared with the same plan,
    /// made under the smallest of their budgets (a device listed twice shares its memory).
    pub fn new(graph: Graph, options: Options) -> Result<Engine> {
        graph.validate()?;
        let list = options.devices();
        if list.len() > 1 {
            if list.contains(&Device::Auto) {
                return Err(Error::Invalid(
                    "a device list takes cpu or cuda:N entries, not auto".into(),
                ));
            }
            let cuda = list.iter().filter(|d| matches!(d, Device::Cuda(_))).count();
            if cuda != 0 && cuda != list.len() {
                return Err(Error::Invalid(format!(
                    "devices {list:?} mix the CPU and CUDA: one volume's parts must run the same arithmetic"
                )));
            }
        }
        let mut workers = Vec::with_capacity(list.len());
        let mut opened = Vec::with_capacity(list.len());
        for &d in &list {
            let (w, dev) = Worker::open(d)?;
            workers.push(w);
            opened.push(dev);
        }
        let device_name = workers
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let mut options = options;
        let budget = match options.memory_budget {
            Some(b) => (b, "--memory-budget".to_string()),
            None => {
                let budgets = opened.iter().map(|&dev| {
                    let (target, i) = match dev {
                        Device::Cuda(i) => (plan::Target::Cuda, i),
                        _ => (plan::Target::Cpu, 0),
                    };
                    let (b, src) = plan::default_budget(target, i);
                    let share = opened.iter().filter(|&&o| o == dev).count() as u64;
                    if share > 1 {
                        (b / share, format!("{src}, shared by {share} workers"))
                    } else {
                        (b, src)
                    }
                });
                let (b, src) = budgets.min_by_key(|b| b.0).expect("one device at least");
                if opened.len() > 1 {
                    (
                        b,
                        format!("{src} (the smallest of {} devices)", opened.len()),
                    )
                } else {
                    (b, src)
                }
            }
        };
        let on_cpu = matches!(workers[0].exec, Exec::Cpu(_));
        if options.inject_oom.is_none() && on_cpu {
            options.inject_oom = std::env::var("VOXTILE_INJECT_OOM")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0);
        }
        Ok(Engine {
            graph,
            options,
            workers,
            device_name,
            budget,
            warned: Default::default(),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    pub fn options(&self) -> &Options {
        &self.options
    }
    /// Keep (or drop) the blended outputs of later runs: ensembles and TTA average them.
    pub fn set_keep_logits(&mut self, keep: bool) {
        self.options.keep_logits = keep;
    }
    pub fn device_name(&self) -> &str {
        &self.device_name
    }
    pub fn is_cuda(&self) -> bool {
        matches!(self.workers[0].exec, Exec::Cuda(_))
    }
    /// How many devices share each volume.
    pub fn device_count(&self) -> usize {
        self.workers.len()
    }

    /// The window size used for a volume of network-axis shape `shape` (the planner's choice).
    pub fn roi_for(&self, shape: [usize; 3]) -> Result<[usize; 3]> {
        Ok(self.plan_for(shape)?.roi)
    }

    /// Segment a volume read from NIfTI; the labels come back on the file's (i,j,k) grid.
    pub fn segment(&mut self, volume: &Volume) -> Result<Segmentation> {
        self.segment_with_progress(volume, &mut |_, _| {})
    }

    /// As [`Engine::segment`], calling `progress(done, total)` after each batch of windows.
    pub fn segment_with_progress(
        &mut self,
        volume: &Volume,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Segmentation> {
        let t0 = Instant::now();
        let mut nonfinite = 0;
        let owned;
        let has_nonfinite = volume.data.iter().any(|v| !v.is_finite());
        let data = if has_nonfinite || self.options.normalize != Normalize::None {
            let mut d = volume.data.clone();
            if has_nonfinite {
                let (nan, inf) = crate::volume::sanitize_nonfinite(&mut d);
                nonfinite = nan + inf;
                tracing::info!("{nan} NaN voxels set to 0, {inf} infinite voxels clamped");
            }
            normalize(&mut d, self.options.normalize);
            owned = d;
            owned.view()
        } else {
            volume.data.view()
        };
        let (labels, logits, mut report) = self.segment_array(data, progress)?;
        report.spacing = volume.header.spacing();
        report.nonfinite_voxels = nonfinite;
        report.seconds.total = t0.elapsed().as_secs_f64();
        Ok(Segmentation {
            labels,
            logits: if self.options.keep_logits {
                Some(logits)
            } else {
                None
            },
            header: volume.header.clone(),
            report,
        })
    }

    /// Prepare the backend for the planned roi and batch of a volume of network-axis shape
    /// `shape` before its data is there (the CLI does it while the file is read and
    /// normalised); [`Engine::segment_array`] then finds the backend ready.
    pub fn prepare_for(&mut self, shape: [usize; 3]) -> Result<()> {
        let p = self.plan_for(shape)?;
        let grid = Grid::new(shape, p.roi, self.options.overlap, self.options.placement)?;
        self.prepare(p.batch.min(grid.len()).max(1), p.roi)
    }

    /// The plan (roi, batch, predicted memory) for a volume of network-axis shape `shape`.
    pub fn plan_for(&self, shape: [usize; 3]) -> Result<plan::Plan> {
        let req = plan::Request {
            target: self.target(),
            budget: self.budget.0,
            budget_explicit: self.options.memory_budget.is_some(),
            user_roi: self.options.roi,
            user_batch: self.options.batch,
            workload: plan::Workload {
                shape,
                overlap: self.options.overlap,
                placement: self.options.placement,
                keep_logits: self.options.keep_logits,
                copy_input: self.options.normalize != Normalize::None,
            },
        };
        plan::choose(&self.graph, &req).map_err(|e| {
            if req.budget_explicit {
                e
            } else {
                plan::with_budget_source(e, &self.budget.1)
            }
        })
    }

    /// The memory budget in use and where it came from.
    pub fn memory_budget(&self) -> (u64, &str) {
        (self.budget.0, &self.budget.1)
    }

    fn target(&self) -> plan::Target {
        if self.is_cuda() {
            plan::Target::Cuda
        } else {
            plan::Target::Cpu
        }
    }

    /// The core on ndarray: `data` is (channel, i, j, k); returns labels (i,j,k), blended outputs
    /// (channel, i, j, k) and the report. Without `Options::keep_logits` the blended outputs are
    /// never held whole (finished slabs become labels at once) and the returned array has zero
    /// channels.
    ///
    /// The window and batch come from the memory planner (see [`crate::plan::choose`]). A batch
    /// that runs out of memory is redone at half the batch (said on stderr and in the report); at
    /// batch 1 the out-of-memory error goes up: the window is never changed behind the user's
    /// back (a smaller window changes the result).
    pub fn segment_array(
        &mut self,
        data: ArrayView4<f32>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(Array3<u16>, Array4<f32>, Report)> {
        let cin = self.graph.input_channels();
        if data.shape()[0] != cin {
            return Err(Error::Invalid(format!(
                "the volume has {} channel(s) but the model expects {cin}",
                data.shape()[0]
            )));
        }
        // Network axes: (C, D, H, W).
        let net = match self.options.axis_order {
            AxisOrder::Xyz => data,
            AxisOrder::Zyx => data.permuted_axes([0, 3, 2, 1]),
        };
        let shape = [net.shape()[1], net.shape()[2], net.shape()[3]];
        let planned = self.plan_for(shape)?;
        if let Some(w) = &planned.warning {
            if self.warned.insert(w.clone()) {
                tracing::warn!("{w}");
            }
        }
        let roi = planned.roi;
        let mut batch = planned.batch;
        let mut retries: Vec<String> = Vec::new();
        let mut measured_act = 0u64;
        let mut injected = self.options.inject_oom.filter(|_| !self.is_cuda());

        let mut report = Report {
            input_shape: shape,
            channels: cin,
            overlap: self.options.overlap,
            device: self.device_name.clone(),
            output_activation: format!("{:?}", self.graph.output_activation()).to_lowercase(),
            memory_budget: self.budget.0,
            memory_budget_source: self.budget.1.clone(),
            plan: planned.how.clone(),
            ..Default::default()
        };
        let mut prepare_s = 0.0;
        let (labels_net, logits_net, grid_len) = loop {
            let grid = Grid::new(shape, roi, self.options.overlap, self.options.placement)?;
            batch = batch.min(grid.len()).max(1);
            // Output must keep the window's spatial size (the blender places it over the window).
            let shapes = self.graph.infer_shapes(batch, roi)?;
            let out = shapes[self.graph.output];
            if [out[2], out[3], out[4]] != roi {
                return Err(Error::Graph(format!(
                    "the model maps a {roi:?} window to {:?}: voxtile needs outputs the size of their input",
                    &out[2..]
                )));
            }
            let cout = out[1];
            let weights = tiling::weight_map(roi, self.options.blend, self.options.sigma_scale);
            let t = Instant::now();
            // A prepare that runs out of device memory (a budget larger than the device allows)
            // goes through the same retry as a batch that does.
            let prepared = self.prepare(batch, roi);
            prepare_s += t.elapsed().as_secs_f64();
            let finish = Finish {
                cout,
                act: self.graph.output_activation(),
                keep_logits: self.options.keep_logits,
            };
            let split = split::split(&grid, self.workers.len());
            let cuda = self.is_cuda();
            let (result, runs) = match prepared {
                Ok(()) => run_parts(
                    &self.graph,
                    &mut self.workers,
                    &self.options,
                    net,
                    &grid,
                    &split,
                    &weights,
                    batch,
                    finish,
                    &mut injected,
                    progress,
                ),
                Err(e @ Error::OutOfMemory(_)) => (Err(e), Vec::new()),
                Err(e) => return Err(e),
            };
            // Stage times: the slowest device (the parts run at once).
            let slowest =
                |f: fn(&StageTimes) -> f64| runs.iter().map(|r| f(&r.seconds)).fold(0.0, f64::max);
            if cuda {
                report.seconds.compute = slowest(|t| t.compute);
            } else {
                report.seconds.compute += slowest(|t| t.compute);
            }
            report.seconds.blend += slowest(|t| t.blend);
            report.seconds.finalize += slowest(|t| t.finalize);
            report.peak_device_bytes = runs.iter().filter_map(|r| r.peak_device).max();
            for r in &runs {
                retries.extend(r.retries.iter().cloned());
                measured_act = measured_act.max(r.measured_act);
            }
            if let Some(b) = runs.iter().map(|r| r.batch).min() {
                batch = b;
            }
            report.gpu = if runs.len() == 1 {
                runs[0].gpu.clone()
            } else {
                runs.iter()
                    .map(|r| r.gpu.clone())
                    .collect::<Option<Vec<_>>>()
                    .map(serde_json::Value::Array)
            };
            if result.is_ok() {
                report.windows_run = split.windows_run();
                if split.parts.len() > 1 {
                    report.parts = split
                        .parts
                        .iter()
                        .zip(&runs)
                        .enumerate()
                        .map(|(k, (p, r))| PartReport {
                            device: self.workers[k].name.clone(),
                            planes: p.planes,
                            crop: p.crop,
                            windows: split.windows(k),
                            batch: r.batch,
                            compute_seconds: r.seconds.compute,
                            peak_device_bytes: r.peak_device,
                            measured_activation_bytes: r.measured_act,
                        })
                        .collect();
                }
            }
            match result {
                Ok((labels, logits)) => {
                    let counted: Option<Vec<usize>> = runs.iter().map(|r| r.nan_voxels).collect();
                    report.nan_output_voxels = counted.map(|c| c.iter().sum());
                    break (labels, logits, grid.len());
                }
                Err(Error::OutOfMemory(m)) => {
                    // The CUDA pipeline (and a CPU prepare) fail whole: the volume is redone at
                    // half the batch. The CPU loop halves its batch itself, so its OOM arrives at
                    // batch 1. The window never changes: at batch 1 the error goes up.
                    batch = oom_retry_batch(&m, roi, batch, &mut retries)?;
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(n) = report.nan_output_voxels.filter(|&n| n > 0) {
            tracing::warn!(
                "{n} voxels of the blended network output are NaN: their labels are meaningless (the model produced non-finite values)"
            );
        }
        report.seconds.prepare = prepare_s;
        report.roi = roi;
        report.batch = batch;
        report.windows = grid_len;
        report.oom_retries = retries;
        report.measured_activation_bytes = Some(measured_act);
        // The prediction for what finally ran.
        let est = if batch == planned.batch {
            planned.estimate
        } else {
            self.plan_for_fixed(shape, roi, batch)?
        };
        report.predicted_peak_bytes = PredictedPeak {
            host: est.predicted_host(),
            device: est.predicted_device(),
        };
        report.predicted = Some(est);

        let t = Instant::now();
        let cout = self.graph.output_channels();
        report.labels = if cout == 1 {
            let thr = if self.graph.output_activation() == OutputActivation::Sigmoid {
                0.5
            } else {
                0.0
            };
            format!("threshold {thr} on the single output channel")
        } else {
            "argmax over channels".into()
        };
        let logits_net =
            logits_net.unwrap_or_else(|| Array4::zeros((0, shape[0], shape[1], shape[2])));
        // Back to the file's (i,j,k) axes.
        let (labels, logits) = match self.options.axis_order {
            AxisOrder::Xyz => (labels_net, logits_net),
            AxisOrder::Zyx => (
                labels_net
                    .permuted_axes([2, 1, 0])
                    .as_standard_layout()
                    .to_owned(),
                logits_net
                    .permuted_axes([0, 3, 2, 1])
                    .as_standard_layout()
                    .to_owned(),
            ),
        };
        report.seconds.finalize += t.elapsed().as_secs_f64();
        report.peak_host_bytes = peak_rss_bytes();
        Ok((labels, logits, report))
    }

    /// The estimate for a given roi and batch (after an OOM retry changed the batch).
    fn plan_for_fixed(
        &self,
        shape: [usize; 3],
        roi: [usize; 3],
        batch: usize,
    ) -> Result<plan::Estimate> {
        let w = plan::Workload {
            shape,
            overlap: self.options.overlap,
            placement: self.options.placement,
            keep_logits: self.options.keep_logits,
            copy_input: self.options.normalize != Normalize::None,
        };
        plan::estimate(&self.graph, self.target(), roi, batch, &w)
    }

    /// Prepare every device's backend for (batch, roi) unless it already is.
    fn prepare(&mut self, batch: usize, roi: [usize; 3]) -> Result<()> {
        for w in &mut self.workers {
            if w.prepared != Some((batch, roi)) {
                w.prepared = None;
                match &mut w.exec {
                    Exec::Cpu(b) => b.prepare(&self.graph, batch, roi)?,
                    Exec::Cuda(b) => b.prepare(&self.graph, batch, roi)?,
                }
                w.prepared = Some((batch, roi));
            }
        }
        Ok(())
    }
}

/// The batch to redo a volume at after an out-of-memory error `m` at `batch`: half of it (said
/// on stderr and in `retries`); at batch 1 the error itself, naming the window that is kept.
fn oom_retry_batch(
    m: &str,
    roi: [usize; 3],
    batch: usize,
    retries: &mut Vec<String>,
) -> Result<usize> {
    if batch <= 1 {
        return Err(Error::OutOfMemory(format!(
            "{m}; at batch 1 with the window {roi:?}, which is kept (a smaller window changes the result): free memory or pass a smaller --roi"
        )));
    }
    let nb = batch / 2;
    let msg = format!(
        "out of memory ({m}) with roi {roi:?} batch {batch}: retrying the volume with batch {nb}"
    );
    eprintln!("voxtile: {msg}");
    retries.push(msg);
    Ok(nb)
}

/// How blended outputs become labels.
#[derive(Clone, Copy)]
struct Finish {
    cout: usize,
    act: OutputActivation,
    keep_logits: bool,
}

impl Finish {
    /// Labels of blended outputs `(C, n, H, W)`: argmax over channels, or a threshold on one
    /// channel (0.5 after a Sigmoid in the graph, 0 on raw logits).
    fn labels(&self, blended: ArrayView4<f32>) -> Array3<u16> {
        if self.cout == 1 {
            let thr = if self.act == OutputActivation::Sigmoid {
                0.5
            } else {
                0.0
            };
            tiling::threshold(blended, thr)
        } else {
            tiling::argmax(blended)
        }
    }
}

type NetOut = (Array3<u16>, Option<Array4<f32>>);

/// What one device did in one attempt (merged into the report).
#[derive(Default)]
struct PartRun {
    retries: Vec<String>,
    measured_act: u64,
    seconds: StageTimes,
    peak_device: Option<u64>,
    gpu: Option<serde_json::Value>,
    /// The batch it ended at (the CPU path halves it on OOM).
    batch: usize,
    /// NaN voxels of the blended output in its own planes; None where not counted.
    nan_voxels: Option<usize>,
}

/// Run `grid` on one device, the CPU or the CUDA loop; NaN outputs are counted in the D planes
/// `own` of the grid (the device's own share of a split volume).
#[allow(clippy::too_many_arguments)]
fn run_worker(
    graph: &Graph,
    worker: &mut Worker,
    opts: &Options,
    net: ArrayView4<f32>,
    grid: &Grid,
    own: Range<usize>,
    weights: Array3<f32>,
    finish: Finish,
    inject_oom: &mut Option<usize>,
    run: &mut PartRun,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<NetOut> {
    match &mut worker.exec {
        Exec::Cpu(backend) => run_cpu(
            graph,
            backend,
            &mut worker.prepared,
            net,
            grid,
            weights,
            &mut run.batch,
            finish,
            opts.pad,
            opts.blend_in_memory,
            inject_oom,
            &mut run.retries,
            &mut run.measured_act,
            &mut run.seconds,
            (own, &mut run.nan_voxels),
            progress,
        ),
        Exec::Cuda(backend) => {
            let cval = match opts.pad {
                PadMode::Constant(c) => c,
                PadMode::Edge => {
                    return Err(Error::Invalid(
                        "edge padding is implemented on the CPU path only: use --device cpu or constant padding".into(),
                    ))
                }
            };
            let t = Instant::now();
            let keep = finish.keep_logits;
            let r = run_cuda(backend, net, grid, weights, run.batch, finish, cval).map(
                |(mut l, out, times)| {
                    run.nan_voxels = Some(match &out {
                        Some(o) => tiling::nan_voxels(o.slice_axis(Axis(1), Slice::from(own))),
                        None => take_nan_labels(&mut l, own),
                    });
                    (l, out.filter(|_| keep), times)
                },
            );
            if r.is_ok() {
                progress(grid.len(), grid.len());
            }
            run.seconds.compute = t.elapsed().as_secs_f64();
            run.peak_device = backend.peak_device_bytes();
            run.measured_act = backend.activation_bytes() as u64;
            r.map(|(l, g, times)| {
                run.gpu = serde_json::to_value(&times).ok();
                (l, g)
            })
        }
    }
}

/// Run the parts of `split`, part k on worker k, each in its own thread over its D-crop of the
/// volume, and put each part's own planes together (one part: on this thread, the whole grid).
/// The injected OOM (a CPU test hook) goes to the first device. An error of any part fails the
/// call (OOM only when no part failed otherwise, so that the engine's retry sees it).
#[allow(clippy::too_many_arguments)]
fn run_parts(
    graph: &Graph,
    workers: &mut [Worker],
    opts: &Options,
    net: ArrayView4<f32>,
    grid: &Grid,
    split: &split::Split,
    weights: &Array3<f32>,
    batch: usize,
    finish: Finish,
    inject_oom: &mut Option<usize>,
    progress: &mut dyn FnMut(usize, usize),
) -> (Result<NetOut>, Vec<PartRun>) {
    if split.parts.len() == 1 {
        let mut run = PartRun {
            batch,
            ..Default::default()
        };
        let r = run_worker(
            graph,
            &mut workers[0],
            opts,
            net,
            grid,
            0..grid.shape[0],
            weights.clone(),
            finish,
            inject_oom,
            &mut run,
            progress,
        );
        return (r, vec![run]);
    }
    let total = split.windows_run();
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let outs: Vec<(Result<NetOut>, PartRun)> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(&split.parts)
            .enumerate()
            .map(|(k, (worker, part))| {
                let tx = tx.clone();
                let sub = split::sub_grid(grid, part);
                let view = net.slice_axis(Axis(1), Slice::from(part.crop[0]..part.crop[1]));
                let weights = weights.clone();
                let mut inject = if k == 0 { inject_oom.take() } else { None };
                let own = part.planes[0] - part.crop[0]..part.planes[1] - part.crop[0];
                s.spawn(move || {
                    let mut run = PartRun {
                        batch,
                        ..Default::default()
                    };
                    let mut last = 0;
                    let mut prog = |done: usize, _: usize| {
                        let _ = tx.send(done.saturating_sub(last));
                        last = last.max(done);
                    };
                    let r = run_worker(
                        graph,
                        worker,
                        opts,
                        view,
                        &sub,
                        own,
                        weights,
                        finish,
                        &mut inject,
                        &mut run,
                        &mut prog,
                    );
                    (r, run)
                })
            })
            .collect();
        drop(tx);
        let mut done = 0;
        for n in rx {
            done += n;
            progress(done, total);
        }
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let e = Error::Backend("a device worker panicked".into());
                    (Err(e), PartRun::default())
                })
            })
            .collect()
    });
    let shape = grid.shape;
    let buffers = crate::alloc::try_zeros((shape[0], shape[1], shape[2]), "the label map")
        .and_then(|l| {
            let logits = finish
                .keep_logits
                .then(|| {
                    crate::alloc::try_zeros(
                        (finish.cout, shape[0], shape[1], shape[2]),
                        "the logits",
                    )
                })
                .transpose()?;
            Ok((l, logits))
        });
    let (mut labels, mut logits) = match buffers {
        Ok(b) => b,
        Err(e) => return (Err(e), outs.into_iter().map(|(_, run)| run).collect()),
    };
    let (mut oom, mut failed) = (None, None);
    let mut runs = Vec::with_capacity(outs.len());
    for ((r, run), part) in outs.into_iter().zip(&split.parts) {
        runs.push(run);
        match r {
            Ok((l, g)) => {
                let t = Instant::now();
                let [lo, hi] = part.planes;
                let own = part.planes[0] - part.crop[0]..part.planes[1] - part.crop[0];
                labels
                    .slice_mut(s![lo..hi, .., ..])
                    .assign(&l.slice(s![own.clone(), .., ..]));
                if let (Some(out), Some(g)) = (&mut logits, g) {
                    out.slice_mut(s![.., lo..hi, .., ..])
                        .assign(&g.slice(s![.., own, .., ..]));
                }
                if let Some(r) = runs.last_mut() {
                    r.seconds.finalize += t.elapsed().as_secs_f64();
                }
            }
            Err(e @ Error::OutOfMemory(_)) => {
                oom.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed.or(oom) {
        Some(e) => (Err(e), runs),
        None => (Ok((labels, logits)), runs),
    }
}

/// The CPU loop: gather a batch, run it, blend it; finished slabs become labels (and logits when
/// kept) at once. A batch that fails with `OutOfMemory` is redone at half the batch (the
/// backend re-prepared), and the run goes on at that batch; at batch 1 the error goes up.
#[allow(clippy::too_many_arguments)]
fn run_cpu(
    graph: &Graph,
    backend: &mut CpuBackend,
    prepared: &mut Option<(usize, [usize; 3])>,
    net: ArrayView4<f32>,
    grid: &Grid,
    weights: Array3<f32>,
    batch: &mut usize,
    finish: Finish,
    pad: PadMode,
    in_memory: bool,
    inject_oom: &mut Option<usize>,
    retries: &mut Vec<String>,
    measured_act: &mut u64,
    seconds: &mut StageTimes,
    (own, nan): (Range<usize>, &mut Option<usize>),
    progress: &mut dyn FnMut(usize, usize),
) -> Result<NetOut> {
    let (cin, roi, shape) = (net.shape()[0], grid.roi, grid.shape);
    let mut nan_count = 0usize;
    let cout = finish.cout;
    let mut labels = crate::alloc::try_zeros((shape[0], shape[1], shape[2]), "the label map")?;
    let mut logits = finish
        .keep_logits
        .then(|| crate::alloc::try_zeros((cout, shape[0], shape[1], shape[2]), "the logits"))
        .transpose()?;
    let mut store = |slab: tiling::Slab, seconds: &mut StageTimes| {
        let t = Instant::now();
        let n = slab.data.shape()[1];
        // This device's own planes of the slab (the others belong to a neighbour's share).
        let (lo, hi) = (own.start.max(slab.d0), own.end.min(slab.d0 + n));
        if lo < hi {
            nan_count +=
                tiling::nan_voxels(slab.data.slice(s![.., lo - slab.d0..hi - slab.d0, .., ..]));
        }
        let l = finish.labels(slab.data.view());
        labels
            .slice_mut(s![slab.d0..slab.d0 + n, .., ..])
            .assign(&l);
        if let Some(lg) = &mut logits {
            lg.slice_mut(s![.., slab.d0..slab.d0 + n, .., ..])
                .assign(&slab.data);
        }
        seconds.finalize += t.elapsed().as_secs_f64();
    };
    enum Acc {
        Slab(tiling::SlabBlender),
        Whole(tiling::Blender),
    }
    let mut acc = if in_memory {
        Acc::Whole(tiling::Blender::try_new(cout, grid, weights)?)
    } else {
        Acc::Slab(tiling::SlabBlender::try_new(cout, grid, weights)?)
    };
    let mut xb =
        crate::alloc::try_zeros((*batch, cin, roi[0], roi[1], roi[2]), "a batch of windows")
            .map_err(crate::alloc::retryable)?;
    let total = grid.len();
    let mut calls = 0usize;
    let mut next = 0usize;
    while next < total {
        let n = (*batch).min(total - next);
        let chunk = &grid.starts[next..next + n];
        let t = Instant::now();
        for (i, &start) in chunk.iter().enumerate() {
            tiling::gather_window(net, grid, start, pad, xb.index_axis_mut(Axis(0), i));
        }
        calls += 1;
        let y = if *inject_oom == Some(calls) {
            *inject_oom = None;
            Err(Error::OutOfMemory(format!(
                "injected at backend call {calls}"
            )))
        } else {
            backend.run(xb.slice(s![..n, .., .., .., ..]))
        };
        let y = match y {
            Ok(y) => y,
            Err(Error::OutOfMemory(m)) if *batch > 1 => {
                let nb = *batch / 2;
                let msg = format!(
                    "out of memory ({m}) at windows {next}..{}: batch {} -> {nb}, redoing them",
                    next + n,
                    *batch
                );
                eprintln!("voxtile: {msg}");
                retries.push(msg);
                *batch = nb;
                *prepared = None;
                backend.prepare(graph, nb, roi)?;
                *prepared = Some((nb, roi));
                xb = Array5::<f32>::zeros((nb, cin, roi[0], roi[1], roi[2]));
                continue;
            }
            Err(e) => return Err(e),
        };
        *measured_act = (*measured_act).max(backend.last_stats().peak_live_bytes as u64);
        seconds.compute += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut done = Vec::new();
        for (i, &start) in chunk.iter().enumerate() {
            match &mut acc {
                Acc::Slab(b) => done.extend(b.add(start, y.index_axis(Axis(0), i))),
                Acc::Whole(b) => b.add(start, y.index_axis(Axis(0), i)),
            }
        }
        seconds.blend += t.elapsed().as_secs_f64();
        for slab in done {
            store(slab, seconds);
        }
        next += n;
        progress(next, total);
    }
    match acc {
        Acc::Slab(b) => {
            if let Some(slab) = b.finish() {
                store(slab, seconds);
            }
        }
        Acc::Whole(b) => {
            let t = Instant::now();
            let out = b.finish();
            seconds.blend += t.elapsed().as_secs_f64();
            store(tiling::Slab { d0: 0, data: out }, seconds);
        }
    }
    *nan = Some(nan_count);
    Ok((labels, logits))
}

/// The CUDA path: the whole window list in one streamed pipeline call; labels made on the
/// device unless the blended outputs are kept (or there is one channel, thresholded here).
/// Returns the labels and the blended outputs whenever they came back to the host (`None`:
/// device labels, NaN voxels marked as [`take_nan_labels`] says).
fn run_cuda(
    backend: &mut CudaBackend,
    net: ArrayView4<f32>,
    grid: &Grid,
    weights: Array3<f32>,
    batch: usize,
    finish: Finish,
    cval: f32,
) -> Result<(
    Array3<u16>,
    Option<Array4<f32>>,
    crate::backend::cuda::GpuTimes,
)> {
    if !finish.keep_logits && finish.cout > 1 {
        let (labels, times) = backend.segment_windows_argmax(
            net,
            grid.padded,
            grid.pad_before,
            grid.roi,
            &grid.starts,
            weights.view(),
            batch,
            cval,
        )?;
        return Ok((labels, None, times));
    }
    let (out, times) = backend.segment_windows(
        net,
        grid.padded,
        grid.pad_before,
        grid.roi,
        &grid.starts,
        weights.view(),
        batch,
        cval,
    )?;
    let labels = finish.labels(out.view());
    Ok((labels, Some(out), times))
}

/// The device argmax marks a voxel whose blended outputs hold a NaN with label 0xFFFF (no model
/// has that many channels): count those of planes `own` and write them all as 0, as the CPU's
/// argmax does.
fn take_nan_labels(labels: &mut Array3<u16>, own: std::ops::Range<usize>) -> usize {
    let n = labels
        .slice(s![own, .., ..])
        .iter()
        .filter(|&&l| l == u16::MAX)
        .count();
    if n > 0 {
        labels.mapv_inplace(|l| if l == u16::MAX { 0 } else { l });
    }
    n
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
