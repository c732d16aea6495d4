//! `voxtile segment` beyond one model on one file: manifests, resampling, TTA, ensembles, extra
//! outputs, batches of files, shards and one worker per device. Plain runs (no manifest, none of
//! these flags) keep the original path in `segment.rs`.

use super::{check_output, SegmentArgs};
use crate::engine::{AxisOrder, Device, Engine, Normalize};
use crate::pipeline::batch::{self, list_inputs, parse_devices, parse_shard, stem};
use crate::pipeline::manifest::{parse_blend, Activation, Intensity, Manifest};
use crate::pipeline::{outputs, preview, Pipeline, Settings};
use crate::{Error, Result};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug, Default)]
pub struct PipelineArgs {
    /// More inputs (files or folders): batch mode, -o names a folder
    #[arg(value_name = "MORE")]
    pub more_inputs: Vec<PathBuf>,
    /// Model manifest (TOML or JSON); default: NAME.toml or NAME.json beside the first NAME.onnx
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Resample to this voxel size (network axes D,H,W, mm) before inference, or "none"
    #[arg(long)]
    pub spacing: Option<String>,
    /// Test-time mirroring: all flips of the manifest's mirror axes (default 0,1,2), or a list
    /// of network axes like 0,1 (put it after the input path)
    #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "AXES")]
    pub tta: Option<String>,
    /// Applied to each model's output before averaging: auto, softmax, sigmoid, none
    #[arg(long, value_parser = ["auto", "softmax", "sigmoid", "none"])]
    pub activation: Option<String>,
    /// Write the averaged probabilities (float32, x,y,z,class); a folder in batch mode
    #[arg(long)]
    pub probabilities: Option<PathBuf>,
    /// Write --probabilities as uint8 (round(255 p), scl_slope 1/255)
    #[arg(long)]
    pub probabilities_u8: bool,
    /// Write one uint8 mask per class (background excepted) into this folder
    #[arg(long)]
    pub split_classes: Option<PathBuf>,
    /// Write a PNG of three orthogonal mid-slices with the labels overlaid; a folder in batch mode
    #[arg(long)]
    pub preview: Option<PathBuf>,
    /// Batch mode: process only files i (sorted list) with i mod n == k
    #[arg(long, value_name = "k/n")]
    pub shard: Option<String>,
    /// Argument ids given on the command line (filled in by cli::run; flags beat the manifest).
    #[arg(skip)]
    pub explicit: Vec<String>,
}

/// Whether a run needs this path rather than the plain one.
pub fn wanted(args: &SegmentArgs) -> bool {
    let p = &args.pipe;
    p.manifest.is_some()
        || args.model.len() > 1
        || args
            .model
            .first()
            .and_then(|m| Manifest::beside(m))
            .is_some()
        || !p.more_inputs.is_empty()
        || args.input.is_dir()
        || p.spacing.is_some()
        || p.tta.is_some()
        || p.activation.is_some()
        || p.probabilities.is_some()
        || p.probabilities_u8
        || p.split_classes.is_some()
        || p.preview.is_some()
        || p.shard.is_some()
        || args.device.contains(',')
}

/// The outputs of one input file.
#[derive(Clone, Debug)]
struct Job {
    input: PathBuf,
    output: PathBuf,
    probabilities: Option<PathBuf>,
    logits: Option<PathBuf>,
    split: Option<PathBuf>,
    preview: Option<PathBuf>,
}

/// Everything a worker needs to build its pipeline (plain data: each worker owns its engines).
#[derive(Clone)]
struct Plan {
    models: Vec<PathBuf>,
    options: crate::engine::Options,
    settings: Settings,
    classes: Option<Vec<String>>,
    manifest: Manifest,
    manifest_path: Option<PathBuf>,
    u8: bool,
}

impl Plan {
    /// Engines on `devices` (several: each volume's windows are split across them).
    fn build(&self, devices: &[Device]) -> Result<Pipeline> {
        let mut options = self.options.clone();
        options.set_devices(devices);
        let engines = self
            .models
            .iter()
            .map(|m| Engine::from_file(m, options.clone()))
            .collect::<Result<Vec<_>>>()?;
        let channels = engines[0].graph().output_channels();
        let mpath = self.manifest_path.clone().unwrap_or_default();
        let mut settings = self.settings.clone();
        settings.remap = self
            .manifest
            .remap_table(channels)
            .map_err(|m| Error::model(&mpath, m))?;
        if let Some(c) = &self.classes {
            if c.len() != channels {
                return Err(Error::model(
                    &mpath,
                    format!(
                        "lists {} class(es) but {} has {channels} output channel(s)",
                        c.len(),
                        self.models[0].display()
                    ),
                ));
            }
        }
        Pipeline::new(engines, settings)
    }
}

fn triple_f64(s: &str, what: &str) -> Result<[f64; 3]> {
    let v = crate::tiling::parse_triple_f64(s)?;
    if v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err(Error::Invalid(format!("{what} must be positive, got {s}")));
    }
    Ok(v)
}

fn parse_axes(s: &str) -> Result<Vec<usize>> {
    let bad = || Error::Invalid(format!("--tta takes network axes like 0,1,2, not '{s}'"));
    let mut v = s
        .split(',')
        .map(|a| a.trim().parse::<usize>().map_err(|_| bad()))
        .collect::<Result<Vec<_>>>()?;
    if v.iter().any(|&a| a > 2) {
        return Err(bad());
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn plan(args: &mut SegmentArgs) -> Result<Plan> {
    let p = &args.pipe;
    let explicit = |id: &str| p.explicit.iter().any(|e| e == id);
    let manifest_path = p
        .manifest
        .clone()
        .or_else(|| Manifest::beside(&args.model[0]));
    let manifest = match &manifest_path {
        Some(m) => Manifest::load(m)?,
        None => Manifest::default(),
    };
    let mpath = manifest_path.clone().unwrap_or_default();
    // options() parses one device; the list is handled by the workers.
    let device = std::mem::replace(&mut args.device, "cpu".into());
    let mut options = args.options()?;
    args.device = device;
    options.keep_logits = false;
    if !explicit("roi") {
        if let Some(r) = manifest.roi {
            options.roi = Some(r.triple());
        }
    }
    if !explicit("overlap") {
        if let Some(o) = manifest.overlap {
            options.overlap = o.triple();
        }
    }
    if !explicit("blend") {
        if let Some(b) = &manifest.blend {
            options.blend = parse_blend(b).map_err(|m| Error::model(&mpath, m))?;
        }
    }
    if !explicit("axis_order") {
        if let Some(a) = &manifest.axis_order {
            options.axis_order = a.parse::<AxisOrder>()?;
        }
    }
    let intensity = if explicit("normalize") {
        Intensity::from(options.normalize)
    } else {
        manifest.normalize.unwrap_or(Intensity::None)
    };
    options.normalize = Normalize::None; // the pipeline normalises
    let spacing = match p.spacing.as_deref() {
        Some("none") => None,
        Some(s) => Some(triple_f64(s, "--spacing")?),
        None => manifest.spacing,
    };
    let mirror_axes = match p.tta.as_deref() {
        None => Vec::new(),
        Some("all") => manifest.mirror_axes.clone().unwrap_or(vec![0, 1, 2]),
        Some(s) => parse_axes(s)?,
    };
    let activation = match p.activation.as_deref() {
        Some("softmax") => Activation::Softmax,
        Some("sigmoid") => Activation::Sigmoid,
        Some("none") => Activation::None,
        Some(_) => Activation::Auto,
        None => manifest.activation.unwrap_or(Activation::Auto),
    };
    if p.probabilities_u8 && p.probabilities.is_none() {
        return Err(Error::Invalid(
            "--probabilities-u8 needs --probabilities OUT".into(),
        ));
    }
    Ok(Plan {
        models: args.model.clone(),
        options,
        settings: Settings {
            intensity,
            spacing,
            mirror_axes,
            activation,
            remap: None,
            keep_probabilities: p.probabilities.is_some(),
            keep_logits: args.logits.is_some(),
        },
        classes: manifest.classes.clone(),
        manifest,
        manifest_path,
        u8: p.probabilities_u8,
    })
}

fn jobs(args: &SegmentArgs) -> Result<(bool, Vec<Job>)> {
    let p = &args.pipe;
    let mut inputs = vec![args.input.clone()];
    inputs.extend(p.more_inputs.iter().cloned());
    let batch_mode = inputs.len() > 1 || args.input.is_dir();
    if !batch_mode {
        return Ok((
            false,
            vec![Job {
                input: args.input.clone(),
                output: args.output.clone(),
                probabilities: p.probabilities.clone(),
                logits: args.logits.clone(),
                split: p.split_classes.clone(),
                preview: p.preview.clone(),
            }],
        ));
    }
    if batch::is_nifti(&args.output) {
        return Err(Error::Invalid(format!(
            "{}: with several inputs -o names a folder, not a NIfTI file",
            args.output.display()
        )));
    }
    let mut files = list_inputs(&inputs)?;
    if files.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no .nii or .nii.gz files to segment",
            args.input.display()
        )));
    }
    if let Some(s) = &p.shard {
        let (k, n) = parse_shard(s)?;
        files = batch::shard(&files, k, n);
    }
    let mk = |d: &Option<PathBuf>| -> Result<()> {
        if let Some(d) = d {
            std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
        }
        Ok(())
    };
    for d in [
        &Some(args.output.clone()),
        &p.probabilities,
        &args.logits,
        &p.split_classes,
        &p.preview,
    ] {
        mk(d)?;
    }
    Ok((
        true,
        files
            .into_iter()
            .map(|f| {
                let s = stem(&f);
                Job {
                    output: args.output.join(format!("{s}.nii.gz")),
                    probabilities: p
                        .probabilities
                        .as_ref()
                        .map(|d| d.join(format!("{s}.nii.gz"))),
                    logits: args.logits.as_ref().map(|d| d.join(format!("{s}.nii.gz"))),
                    split: p.split_classes.as_ref().map(|d| d.join(&s)),
                    preview: p.preview.as_ref().map(|d| d.join(format!("{s}.png"))),
                    input: f,
                }
            })
            .collect(),
    ))
}

/// Name the input and the model in messages that only say what went wrong.
fn name_error(e: Error, input: &Path, models: &[PathBuf]) -> Error {
    match e {
        Error::Invalid(m) | Error::Graph(m) => Error::Invalid(format!(
            "{} with {}: {m}",
            input.display(),
            models
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(" + ")
        )),
        e => e,
    }
}

/// Segment one file and write its outputs (labels last: their presence marks the file done).
fn process(pipe: &mut Pipeline, plan: &Plan, job: &Job, bar: bool) -> Result<serde_json::Value> {
    let t_all = Instant::now();
    let t = Instant::now();
    let volume = crate::volume::read(&job.input)?;
    let t_read = t.elapsed().as_secs_f64();
    let pb = bar.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} windows {pos}/{len} [{bar:30}] {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    });
    let mut out = pipe
        .run(&volume, &mut |done, total| {
            if let Some(b) = &pb {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        })
        .map_err(|e| name_error(e, &job.input, &plan.models))?;
    if let Some(b) = pb {
        b.finish_and_clear();
    }
    if out.nonfinite_voxels > 0 {
        eprintln!(
            "voxtile: warning: {}: {} NaN/Inf voxels (NaN read as 0, ±Inf clamped to the finite range)",
            job.input.display(),
            out.nonfinite_voxels
        );
    }
    let t = Instant::now();
    let mut written: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<()> {
        if let (Some(path), Some(p)) = (&job.probabilities, &out.probabilities) {
            if plan.u8 {
                outputs::write_probabilities_u8(path, p.view(), &out.header)?;
            } else {
                crate::volume::write_f32(path, p.view(), &out.header)?;
            }
            written.push(path.clone());
        }
        if let (Some(path), Some(l)) = (&job.logits, &out.logits) {
            crate::volume::write_f32(path, l.view(), &out.header)?;
            written.push(path.clone());
        }
        if let Some(dir) = &job.split {
            let values = pipe
                .settings()
                .remap
                .clone()
                .unwrap_or_else(|| (0..pipe.output_channels() as u16).collect());
            written.extend(outputs::write_split_classes(
                dir,
                out.labels.view(),
                &values,
                plan.classes.as_deref(),
                &out.header,
            )?);
        }
        if let Some(path) = &job.preview {
            preview::write_png(
                path,
                volume.data.index_axis(ndarray::Axis(0), 0),
                out.labels.view(),
            )?;
            written.push(path.clone());
        }
        crate::volume::write_labels(&job.output, out.labels.view(), &out.header)
    })();
    if let Err(e) = result {
        // Nothing half-done: drop what this run wrote for the file.
        for p in written {
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        return Err(e);
    }
    out.report.engine.seconds.read = t_read;
    out.report.engine.seconds.write = t.elapsed().as_secs_f64();
    out.report.engine.seconds.total = t_all.elapsed().as_secs_f64();
    out.report.engine.peak_host_bytes = crate::engine::peak_rss_bytes();
    let mut v =
        serde_json::to_value(&out.report).map_err(|e| Error::Invalid(format!("report: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("input".into(), job.input.display().to_string().into());
        o.insert("output".into(), job.output.display().to_string().into());
        o.insert("status".into(), "done".into());
    }
    Ok(v)
}

pub fn run(mut args: SegmentArgs) -> Result<()> {
    let plan = plan(&mut args)?;
    let devices = parse_devices(&args.device)?;
    let (batch_mode, jobs) = jobs(&args)?;
    let mut reads: Vec<&Path> = vec![args.input.as_path()];
    reads.extend(args.model.iter().map(|m| m.as_path()));
    let mut todo = Vec::new();
    let mut lines: Vec<serde_json::Value> = Vec::new();
    for job in jobs {
        let mut ins = reads.clone();
        ins.push(job.input.as_path());
        crate::volume::check_not_input(&job.output, &ins)?;
        if batch_mode && job.output.exists() && !args.force {
            lines.push(serde_json::json!({
                "input": job.input.display().to_string(),
                "output": job.output.display().to_string(),
                "status": "skipped (output exists)",
            }));
            continue;
        }
        if !batch_mode {
            check_output(&job.output, &ins, args.force)?;
            for extra in [&job.probabilities, &job.logits, &job.preview]
                .into_iter()
                .flatten()
            {
                check_output(extra, &ins, args.force)?;
                if extra == &job.output {
                    return Err(Error::Invalid(format!(
                        "{}: named both as the labels output and as an extra output",
                        extra.display()
                    )));
                }
            }
        }
        todo.push(job);
    }

    let mut report = match &args.report {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| Error::io(p, e))?),
        None => None,
    };
    let report_path = args.report.clone().unwrap_or_default();
    let mut emit = |v: &serde_json::Value| -> Result<()> {
        if let Some(f) = &mut report {
            let s = if batch_mode {
                serde_json::to_string(v)
            } else {
                serde_json::to_string_pretty(v)
            }
            .map_err(|e| Error::Invalid(format!("report: {e}")))?;
            writeln!(f, "{s}").map_err(|e| Error::io(&report_path, e))?;
            f.flush().map_err(|e| Error::io(&report_path, e))?;
        }
        Ok(())
    };
    for l in &lines {
        emit(l)?;
    }

    if !batch_mode {
        let Some(job) = todo.first() else {
            return Ok(());
        };
        let mut pipe = plan.build(&devices)?;
        let v = process(&mut pipe, &plan, job, std::io::stderr().is_terminal())?;
        return emit(&v);
    }

    // Batch: one worker per device (fewer files than devices: per file, the devices shared out),
    // files round robin; a failed file is reported and skipped.
    let total = todo.len();
    let groups = batch::device_groups(&devices, total);
    let workers = groups.len();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let mut failed = 0usize;
    std::thread::scope(|s| -> Result<()> {
        for (w, group) in groups.iter().enumerate() {
            let tx = tx.clone();
            let mine = batch::worker_files(&todo, w, workers);
            let plan = plan.clone();
            s.spawn(move || {
                let fail = |job: &Job, e: &Error| {
                    serde_json::json!({
                        "input": job.input.display().to_string(),
                        "output": job.output.display().to_string(),
                        "status": "error",
                        "error": e.to_string(),
                    })
                };
                let mut pipe = match plan.build(group) {
                    Ok(p) => p,
                    Err(e) => {
                        for (_, job) in &mine {
                            let _ = tx.send(fail(job, &e));
                        }
                        return;
                    }
                };
                for (_, job) in &mine {
                    let v = process(&mut pipe, &plan, job, false).unwrap_or_else(|e| fail(job, &e));
                    let _ = tx.send(v);
                }
            });
        }
        drop(tx);
        for (i, v) in rx.iter().enumerate() {
            let status = v["status"].as_str().unwrap_or("");
            if status == "error" {
                failed += 1;
                eprintln!(
                    "voxtile: failed: {}",
                    v["error"].as_str().unwrap_or("unknown error")
                );
            } else if std::io::stderr().is_terminal() {
                eprintln!(
                    "voxtile: [{}/{total}] {}",
                    i + 1,
                    v["output"].as_str().unwrap_or("")
                );
            }
            emit(&v)?;
        }
        Ok(())
    })?;
    if failed > 0 {
        return Err(Error::Invalid(format!(
            "{failed} of {total} file(s) failed (see the lines above)"
        )));
    }
    Ok(())
}
