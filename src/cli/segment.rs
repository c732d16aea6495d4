//! `voxtile segment`: read, segment, write (temp + rename), report.

use crate::engine::{AxisOrder, Device, Engine, Normalize, Options};
use crate::gate::{Gate, Kind};
use crate::staged::Outputs;
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
    /// set on CPU); the batch is planned under it, the window never shrinks (too small a budget
    /// is an error). Default: 80% of free device memory, or half of the memory this process may
    /// still take (MemAvailable, RLIMIT_AS, cgroup limit)
    #[arg(long)]
    pub memory_budget: Option<String>,
}

impl SegmentArgs {
    fn options(&self) -> Result<Options> {
        let pad = if self.pad == "edge" {
            PadMode::Edge
        } else {
            // Finite in f32 too: "1e39" parses, as infinity.
            match self.pad.trim().parse::<f32>() {
                Ok(v) if v.is_finite() => PadMode::Constant(v),
                _ => {
                    return Err(Error::Invalid(format!(
                        "--pad takes a finite number or 'edge', not '{}'",
                        self.pad
                    )))
                }
            }
        };
        let overlap = tiling::parse_triple_f64(&self.overlap)?;
        if overlap.iter().any(|o| !(0.0..1.0).contains(o)) {
            return Err(Error::Invalid(format!(
                "--overlap must lie in [0, 1), got {}",
                self.overlap
            )));
        }
        let sigma_scale = tiling::parse_sigma_scale(&self.sigma_scale)?;
        let normalize = self.normalize.parse::<Normalize>()?;
        crate::pipeline::manifest::Intensity::from(normalize)
            .check()
            .map_err(|m| Error::Invalid(format!("--normalize {}: {m}", self.normalize)))?;
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
            normalize,
            memory_budget: self
                .memory_budget
                .as_deref()
                .map(crate::plan::parse_bytes)
                .transpose()?,
            ..Options::default()
        })
    }
}

/// Claim the plain run's outputs (labels, logits, report) before any work.
fn claim_outputs(args: &SegmentArgs, inputs: &[&Path]) -> Result<Gate> {
    let mut gate = Gate::new(inputs, args.force);
    gate.claim(&args.output, Kind::Volume, "-o")?;
    if let Some(l) = &args.logits {
        gate.claim(l, Kind::Volume, "--logits")?;
    }
    if let Some(r) = &args.report {
        gate.claim(r, Kind::Report, "--report")?;
    }
    Ok(gate)
}

/// Stage the report (`-`: kept to print on standard output once the outputs are committed).
fn stage_report(path: &Path, json: String, outs: &mut Outputs) -> Result<Option<String>> {
    if path == Path::new("-") {
        return Ok(Some(json));
    }
    outs.push(crate::staged::stage_bytes(path, json.as_bytes())?, true);
    Ok(None)
}

/// The input, read on its own thread while the engine is built: the volume with NaN/Inf
/// replaced and normalised in place (no second copy), the NaN/Inf count, read and normalise seconds.
type ReadResult = Result<(crate::volume::Volume, usize, f64, f64)>;

fn read_and_normalize(input: &Path, how: Normalize) -> ReadResult {
    let t = Instant::now();
    let mut volume = crate::volume::read(input)?;
    let t_read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (nan, inf) = crate::volume::sanitize_nonfinite(&mut volume.data);
    if nan + inf > 0 {
        tracing::info!("{nan} NaN voxels set to 0, {inf} infinite voxels clamped");
    }
    crate::pipeline::intensity::normalize_par(&mut volume.data, how);
    Ok((volume, nan + inf, t_read, t.elapsed().as_secs_f64()))
}

/// Name the input and the model in messages that only say what went wrong.
fn name_error(e: Error, input: &Path, model: &Path) -> Error {
    match e {
        Error::Invalid(m) | Error::Graph(m) => {
            Error::Invalid(format!("{} with {}: {m}", input.display(), model.display()))
        }
        e => e,
    }
}

pub fn run(args: SegmentArgs) -> Result<()> {
    if pipeline::wanted(&args) {
        return pipeline::run(args);
    }
    let model = &args.model[0];
    let t_all = Instant::now();
    let mut options = args.options()?;
    // Normalised here, in place, while the engine is built; the engine sees ready data.
    let normalize = std::mem::replace(&mut options.normalize, Normalize::None);
    let gate = claim_outputs(&args, &[args.input.as_path(), model.as_path()])?;

    // The header is cheap and gives the shape: the device side (CUDA context, kernels, weights,
    // buffers for the planned roi and batch) is made ready on this thread while another one
    // inflates, converts and normalises the data.
    let header = crate::volume::read_header(&args.input)?;
    crate::volume::check_output_shape(&args.input, &header, 1)?;
    let [x, y, z] = header.shape();
    let net_shape = match options.axis_order {
        AxisOrder::Xyz => [x, y, z],
        AxisOrder::Zyx => [z, y, x],
    };
    let input = args.input.clone();
    let reader = std::thread::Builder::new()
        .name("voxtile-read".into())
        .spawn(move || read_and_normalize(&input, normalize))
        .map_err(|e| Error::io(&args.input, e))?;
    let t = Instant::now();
    let mut t_engine_init = 0.0;
    let engine = (|| -> Result<Engine> {
        let mut engine = Engine::from_file(model, options)?;
        t_engine_init = t.elapsed().as_secs_f64();
        if header.channels() != engine.graph().input_channels() {
            return Err(Error::Invalid(format!(
                "{}: the volume has {} channel(s) but {} expects {}",
                args.input.display(),
                header.channels(),
                model.display(),
                engine.graph().input_channels()
            )));
        }
        engine
            .prepare_for(net_shape)
            .map_err(|e| name_error(e, &args.input, model))?;
        Ok(engine)
    })();
    let t_device = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // Errors of the input first, as when it was read before the model was loaded.
    let read = reader.join().unwrap_or_else(|_| {
        Err(Error::volume(
            &args.input,
            "reading stopped on an internal error",
        ))
    });
    let t_wait = t.elapsed().as_secs_f64();
    let (volume, nonfinite, t_read, t_normalize) = read?;
    let mut engine = engine?;
    let t_prepare_ahead = t_device - t_engine_init;

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
    let (labels, logits, mut report) = engine
        .segment_array(volume.data.view(), &mut |done, total| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        })
        .map_err(|e| name_error(e, &args.input, model))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    report.spacing = volume.header.spacing();
    report.nonfinite_voxels = nonfinite;
    let header = &volume.header;
    if nonfinite > 0 {
        crate::cli::say!(
            "voxtile: warning: {}: {nonfinite} NaN/Inf voxels (NaN read as 0, ±Inf clamped to the finite range)",
            args.input.display(),
        );
    }

    // Everything staged first, committed together (labels last): all outputs or none.
    let t = Instant::now();
    let mut outs = Outputs::new();
    if let Some(path) = &args.logits {
        outs.push(
            crate::volume::stage_f32(path, logits.view(), header)?,
            gate.force(),
        );
    }
    let labels = crate::volume::stage_labels(&args.output, labels.view(), header)?;
    report.seconds.write = t.elapsed().as_secs_f64();
    report.seconds.read = t_read;
    report.seconds.prepare += t_prepare_ahead;
    report.seconds.total = t_all.elapsed().as_secs_f64();
    report.peak_host_bytes = crate::engine::peak_rss_bytes();
    let mut stdout_report = None;
    if let Some(path) = &args.report {
        let mut v =
            serde_json::to_value(&report).map_err(|e| Error::Invalid(format!("report: {e}")))?;
        // Stages of this command beyond the engine's: read and normalise ran on their own
        // thread while the engine was created (engine_init: model load, device context) and
        // prepared; wait is how long the data then still took.
        if let Some(sec) = v.get_mut("seconds").and_then(|s| s.as_object_mut()) {
            sec.insert("normalize".into(), t_normalize.into());
            sec.insert("engine_init".into(), t_engine_init.into());
            sec.insert("wait_for_read".into(), t_wait.into());
        }
        let json =
            serde_json::to_string_pretty(&v).map_err(|e| Error::Invalid(format!("report: {e}")))?;
        stdout_report = stage_report(path, json + "\n", &mut outs)?;
    }
    outs.push(labels, gate.force());
    outs.commit()?;
    if let Some(json) = stdout_report {
        super::print_stdout(&json)?;
    }
    // The process ends right after this: the driver frees the device context with the process,
    // faster than tearing down every buffer and module one by one.
    std::mem::forget(engine);
    Ok(())
}
