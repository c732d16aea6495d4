//! `voxtile segment`: read, segment, write (temp + rename), report.

use crate::engine::{AxisOrder, Device, Engine, Normalize, Options};
use crate::tiling::{self, BlendMode, PadMode, Placement};
use crate::{Error, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod pipeline;

#[derive(Args, Debug)]
pub struct SegmentArgs {
    /// Input volume (.nii or .nii.gz; 4D = channels)
    pub input: PathBuf,
    /// ONNX model (exported from PyTorch); repeat for an ensemble
    #[arg(long, short = 'm', required = true)]
    pub model: Vec<PathBuf>,
    /// Output label map (.nii.gz or .nii)
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    #[command(flatten)]
    pub pipe: pipeline::PipelineArgs,
    /// Window size in network axes: one number or D,H,W (default: the model's fixed size, else 128)
    #[arg(long)]
    pub roi: Option<String>,
    /// Overlap between windows in [0,1): one number or one per axis
    #[arg(long, default_value = "0.5")]
    pub overlap: String,
    /// Window weights for blending
    #[arg(long, default_value = "gaussian", value_parser = ["gaussian", "constant", "hann"])]
    pub blend: String,
    /// Gaussian sigma as a fraction of the roi (MONAI's sigma_scale): one number or per axis
    #[arg(long, default_value = "0.125")]
    pub sigma_scale: String,
    /// Window placement: MONAI's (fixed step, last window pulled back) or nnU-Net's (even steps)
    #[arg(long, default_value = "monai", value_parser = ["monai", "nnunet"])]
    pub placement: String,
    /// Windows per network call
    #[arg(long)]
    pub batch: Option<usize>,
    /// Padding where the volume is smaller than the roi: a constant value or "edge"
    #[arg(long, default_value = "0")]
    pub pad: String,
    /// Also write the blended raw outputs (float32, x,y,z,channel)
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// auto (CUDA if present, else CPU), cpu, cuda, cuda:N; a list like cuda:0,1 splits one
    /// volume's windows across the GPUs, or hands several files out to them
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Write a JSON report (shapes, windows, stage times, peak memory)
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Network axes from the file's: xyz (nibabel/MONAI, default) or zyx (SimpleITK/nnU-Net)
    #[arg(long, default_value = "xyz", value_parser = ["xyz", "zyx"])]
    pub axis_order: String,
    /// Intensity normalisation before windowing: none, zscore (per volume), ct:LO,HI,MEAN,STD
    #[arg(long, default_value = "none")]
    pub normalize: String,
    /// Overwrite existing output files
    #[arg(long)]
    pub force: bool,
    /// Memory the run may use, e.g. 4GiB, 512MiB, 8GB (device memory on CUDA, the host working
    /// set on CPU); roi and batch are planned under it. Default: 80% of free device memory, or
    /// half of the available RAM
    #[arg(long)]
    pub memory_budget: Option<String>,
}

impl SegmentArgs {
    fn options(&self) -> Result<Options> {
        let pad = if self.pad == "edge" {
            PadMode::Edge
        } else {
            PadMode::Constant(self.pad.parse::<f32>().map_err(|_| {
                Error::Invalid(format!(
                    "--pad takes a number or 'edge', not '{}'",
                    self.pad
                ))
            })?)
        };
        let overlap = tiling::parse_triple_f64(&self.overlap)?;
        if overlap.iter().any(|o| !(0.0..1.0).contains(o)) {
            return Err(Error::Invalid(format!(
                "--overlap must lie in [0, 1), got {}",
                self.overlap
            )));
        }
        let sigma_scale = tiling::parse_triple_f64(&self.sigma_scale)?;
        if sigma_scale.iter().any(|s| !(*s > 0.0) || !s.is_finite()) {
            return Err(Error::Invalid(format!(
                "--sigma-scale must be positive, got {}",
                self.sigma_scale
            )));
        }
        if self.batch == Some(0) {
            return Err(Error::Invalid("--batch must be at least 1".into()));
        }
        Ok(Options {
            roi: self
                .roi
                .as_deref()
                .map(tiling::parse_triple_usize)
                .transpose()?,
            overlap,
            blend: match self.blend.as_str() {
                "constant" => BlendMode::Constant,
                "hann" => BlendMode::Hann,
                _ => BlendMode::Gaussian,
            },
            sigma_scale,
            placement: if self.placement == "nnunet" {
                Placement::NnUnet
            } else {
                Placement::Monai
            },
            batch: self.batch,
            pad,
            device: self.device.parse::<Device>()?,
            axis_order: self.axis_order.parse::<AxisOrder>()?,
            keep_logits: self.logits.is_some(),
            normalize: self.normalize.parse::<Normalize>()?,
            memory_budget: self
                .memory_budget
                .as_deref()
                .map(crate::plan::parse_bytes)
                .transpose()?,
            ..Options::default()
        })
    }
}

/// Refuse to clobber: inputs never, existing outputs only with --force.
fn check_output(out: &Path, inputs: &[&Path], force: bool) -> Result<()> {
    crate::volume::check_not_input(out, inputs)?;
    if out.exists() && !force {
        return Err(Error::Invalid(format!(
            "{}: output exists (use --force to overwrite)",
            out.display()
        )));
    }
    Ok(())
}

pub fn run(args: SegmentArgs) -> Result<()> {
    if pipeline::wanted(&args) {
        return pipeline::run(args);
    }
    let model = &args.model[0];
    let t_all = Instant::now();
    let options = args.options()?;
    let inputs = [args.input.as_path(), model.as_path()];
    check_output(&args.output, &inputs, args.force)?;
    if let Some(l) = &args.logits {
        check_output(l, &inputs, args.force)?;
        if l == &args.output {
            return Err(Error::Invalid("--logits and -o name the same file".into()));
        }
    }

    let t = Instant::now();
    let volume = crate::volume::read(&args.input)?;
    let t_read = t.elapsed().as_secs_f64();
    let mut engine = Engine::from_file(model, options)?;
    if volume.data.shape()[0] != engine.graph().input_channels() {
        return Err(Error::Invalid(format!(
            "{}: the volume has {} channel(s) but {} expects {}",
            args.input.display(),
            volume.data.shape()[0],
            model.display(),
            engine.graph().input_channels()
        )));
    }

    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} windows {pos}/{len} [{bar:30}] {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Some(b)
    } else {
        None
    };
    let mut seg = engine
        .segment_with_progress(&volume, &mut |done, total| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        })
        .map_err(|e| match e {
            Error::Invalid(m) | Error::Graph(m) => Error::Invalid(format!(
                "{} with {}: {m}",
                args.input.display(),
                model.display()
            )),
            e => e,
        })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if seg.report.nonfinite_voxels > 0 {
        eprintln!(
            "voxtile: warning: {}: {} NaN/Inf voxels (NaN read as 0, ±Inf clamped to the finite range)",
            args.input.display(),
            seg.report.nonfinite_voxels
        );
    }

    let t = Instant::now();
    // Once renamed, the logits stay registered for signal cleanup until the labels are in
    // place too: an interrupted run leaves neither file.
    let mut logits_guard = None;
    if let (Some(path), Some(logits)) = (&args.logits, &seg.logits) {
        crate::volume::write_f32(path, logits.view(), &seg.header)?;
        logits_guard = Some(crate::signals::registry().register(path));
    }
    if let Err(e) = crate::volume::write_labels(&args.output, seg.labels.view(), &seg.header) {
        // Nothing half-done: the logits belong to this run, drop them too.
        if let Some(path) = &args.logits {
            let _ = std::fs::remove_file(path);
        }
        return Err(e);
    }
    drop(logits_guard);
    seg.report.seconds.write = t.elapsed().as_secs_f64();
    seg.report.seconds.read = t_read;
    seg.report.seconds.total = t_all.elapsed().as_secs_f64();
    seg.report.peak_host_bytes = crate::engine::peak_rss_bytes();

    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&seg.report)
            .map_err(|e| Error::Invalid(format!("report: {e}")))?;
        std::fs::write(path, json + "\n").map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
