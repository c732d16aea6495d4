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
use crate::tiling::{self, BlendMode, Grid, PadMode, Placement};
use crate::volume::{Header, Volume};
use crate::{Error, Result};
use ndarray::{s, Array3, Array4, Array5, ArrayView4, Axis};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

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
    pub axis_order: AxisOrder,
    /// Keep the blended raw outputs (what MONAI's sliding_window_inference returns).
    pub keep_logits: bool,
    pub normalize: Normalize,
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
            axis_order: AxisOrder::Xyz,
            keep_logits: false,
            normalize: Normalize::None,
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
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_host_bytes: u64,
    pub peak_device_bytes: Option<u64>,
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
    Cpu(CpuBackend),
    Cuda(Box<CudaBackend>),
}

/// A model bound to a backend, ready to segment volumes.
pub struct Engine {
    graph: Graph,
    options: Options,
    exec: Exec,
    device_name: String,
    prepared: Option<(usize, [usize; 3])>,
}

impl Engine {
    /// Load an ONNX model and choose the backend.
    pub fn from_file(model: &Path, options: Options) -> Result<Engine> {
        let graph = crate::model::onnx::load(model)?;
        Engine::new(graph, options)
    }

    /// Bind a loaded graph; `Device::Auto` falls back to the CPU with a message on stderr.
    pub fn new(graph: Graph, options: Options) -> Result<Engine> {
        graph.validate()?;
        let exec = match options.device {
            Device::Cpu => Exec::Cpu(CpuBackend::new()),
            Device::Cuda(i) => Exec::Cuda(Box::new(CudaBackend::new(i)?)),
            Device::Auto => match CudaBackend::new(0) {
                Ok(b) => Exec::Cuda(Box::new(b)),
                Err(e) => {
                    eprintln!("voxtile: CUDA unavailable ({e}); running on the CPU");
                    Exec::Cpu(CpuBackend::new())
                }
            },
        };
        let device_name = match &exec {
            Exec::Cpu(b) => b.name(),
            Exec::Cuda(b) => b.name(),
        };
        Ok(Engine {
            graph,
            options,
            exec,
            device_name,
            prepared: None,
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    pub fn options(&self) -> &Options {
        &self.options
    }
    pub fn device_name(&self) -> &str {
        &self.device_name
    }
    pub fn is_cuda(&self) -> bool {
        matches!(self.exec, Exec::Cuda(_))
    }

    /// The window size used for a volume of network-axis shape `shape`.
    pub fn roi_for(&self, shape: [usize; 3]) -> Result<[usize; 3]> {
        let div = self.graph.spatial_divisor();
        let fixed = self.graph.fixed_input_spatial;
        let mut roi = [0; 3];
        for a in 0..3 {
            roi[a] = match (self.options.roi, fixed[a]) {
                (Some(r), _) => r[a],
                (None, Some(f)) => f,
                (None, None) => {
                    let want = shape[a].min(128).max(1);
                    want.div_ceil(div[a]) * div[a]
                }
            };
            if roi[a] == 0 {
                return Err(Error::Invalid(
                    "roi must be positive along every axis".into(),
                ));
            }
            if let Some(f) = fixed[a] {
                if roi[a] != f {
                    return Err(Error::Invalid(format!(
                        "the model's input is fixed to {f} along axis {a}, roi asks {}",
                        roi[a]
                    )));
                }
            }
            if roi[a] % div[a] != 0 {
                return Err(Error::Invalid(format!(
                    "roi {:?} does not fit the model: each axis must be a multiple of {:?} (its downsampling)",
                    roi, div
                )));
            }
        }
        Ok(roi)
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

    /// The core on ndarray: `data` is (channel, i, j, k); returns labels (i,j,k), blended outputs
    /// (channel, i, j, k) and the report. On CUDA without `keep_logits` the labels are made on
    /// the device and the outputs come back empty (0 channels).
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
        let roi = self.roi_for(shape)?;
        let grid = Grid::new(shape, roi, self.options.overlap, self.options.placement)?;
        let is_cuda = self.is_cuda();
        let batch = self
            .options
            .batch
            .unwrap_or(if is_cuda { 2 } else { 1 })
            .max(1);
        let batch = batch.min(grid.len().max(1));
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

        let mut report = Report {
            input_shape: shape,
            channels: cin,
            roi,
            overlap: self.options.overlap,
            windows: grid.len(),
            batch,
            device: self.device_name.clone(),
            output_activation: format!("{:?}", self.graph.output_activation()).to_lowercase(),
            ..Default::default()
        };

        let t = Instant::now();
        if self.prepared != Some((batch, roi)) {
            match &mut self.exec {
                Exec::Cpu(b) => b.prepare(&self.graph, batch, roi)?,
                Exec::Cuda(b) => b.prepare(&self.graph, batch, roi)?,
            }
            self.prepared = Some((batch, roi));
        }
        report.seconds.prepare = t.elapsed().as_secs_f64();

        let (blended, device_labels) = match &mut self.exec {
            Exec::Cpu(backend) => {
                let mut blender = tiling::Blender::new(cout, &grid, weights);
                let mut xb = Array5::<f32>::zeros((batch, cin, roi[0], roi[1], roi[2]));
                let (mut compute, mut blend) = (0.0, 0.0);
                let total = grid.len();
                for (ci, chunk) in grid.starts.chunks(batch).enumerate() {
                    let t = Instant::now();
                    for (i, &start) in chunk.iter().enumerate() {
                        tiling::gather_window(
                            net,
                            &grid,
                            start,
                            self.options.pad,
                            xb.index_axis_mut(Axis(0), i),
                        );
                    }
                    let y = backend.run(xb.slice(s![..chunk.len(), .., .., .., ..]))?;
                    compute += t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    for (i, &start) in chunk.iter().enumerate() {
                        blender.add(start, y.index_axis(Axis(0), i));
                    }
                    blend += t.elapsed().as_secs_f64();
                    progress((ci * batch + chunk.len()).min(total), total);
                }
                let t = Instant::now();
                let out = blender.finish();
                report.seconds.compute = compute;
                report.seconds.blend = blend + t.elapsed().as_secs_f64();
                (out, None)
            }
            Exec::Cuda(backend) => {
                let cval = match self.options.pad {
                    PadMode::Constant(c) => c,
                    PadMode::Edge => {
                        return Err(Error::Invalid(
                            "edge padding is implemented on the CPU path only: use --device cpu or constant padding".into(),
                        ))
                    }
                };
                let t = Instant::now();
                // Labels only: argmax on the device, so only u16 labels cross PCIe and the host
                // never holds C x volume floats (14 classes x 512²x128 would be 1.9 GB).
                let labels_only = !self.options.keep_logits && cout > 1;
                let (out, labels, times) = if labels_only {
                    let (labels, times) = backend.segment_windows_argmax(
                        net,
                        grid.padded,
                        grid.pad_before,
                        roi,
                        &grid.starts,
                        weights.view(),
                        batch,
                        cval,
                    )?;
                    (
                        Array4::zeros((0, shape[0], shape[1], shape[2])),
                        Some(labels),
                        times,
                    )
                } else {
                    let (out, times) = backend.segment_windows(
                        net,
                        grid.padded,
                        grid.pad_before,
                        roi,
                        &grid.starts,
                        weights.view(),
                        batch,
                        cval,
                    )?;
                    (out, None, times)
                };
                progress(grid.len(), grid.len());
                report.seconds.compute = t.elapsed().as_secs_f64();
                report.gpu = serde_json::to_value(&times).ok();
                report.peak_device_bytes = backend.peak_device_bytes();
                (out, labels)
            }
        };

        let t = Instant::now();
        let act = self.graph.output_activation();
        let labels_net = if let Some(l) = device_labels {
            report.labels = "argmax over channels (on the device)".into();
            l
        } else if cout == 1 {
            // One channel: a probability (sigmoid applied) or a logit (threshold at 0 = sigmoid 0.5).
            let thr = if act == OutputActivation::Sigmoid {
                0.5
            } else {
                0.0
            };
            report.labels = format!("threshold {thr} on the single output channel");
            tiling::threshold(blended.view(), thr)
        } else {
            report.labels = "argmax over channels".into();
            tiling::argmax(blended.view())
        };
        // Back to the file's (i,j,k) axes.
        let (labels, logits) = match self.options.axis_order {
            AxisOrder::Xyz => (labels_net, blended),
            AxisOrder::Zyx => (
                labels_net
                    .permuted_axes([2, 1, 0])
                    .as_standard_layout()
                    .to_owned(),
                blended
                    .permuted_axes([0, 3, 2, 1])
                    .as_standard_layout()
                    .to_owned(),
            ),
        };
        report.seconds.finalize = t.elapsed().as_secs_f64();
        report.peak_host_bytes = peak_rss_bytes();
        Ok((labels, logits, report))
    }
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
