//! `voxtile segment` beyond one model on one file: manifests, resampling, TTA, ensembles, extra
//! outputs, batches of files, shards and one worker per device. Plain runs (no manifest, none of
//! these flags) keep the original path in `segment.rs`.

use super::{stage_report, SegmentArgs};
use crate::engine::{AxisOrder, Device, Engine, Normalize};
use crate::gate::{Gate, Kind};
use crate::pipeline::batch::{self, list_inputs, parse_devices, parse_shard, stem};
use crate::pipeline::manifest::{parse_blend, Activation, Intensity, Manifest};
use crate::pipeline::{outputs, preview, Pipeline, Settings};
use crate::staged::Outputs;
use crate::{Error, Result};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
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
    intensity.check().map_err(|m| Error::model(&mpath, m))?;
    options.normalize = Normalize::None; // the pipeline normalises
    let spacing = match p.spacing.as_deref() {
        Some("none") => None,
        Some(s) => Some(crate::tiling::parse_spacing(s)?),
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

/// The files to segment and where each one's outputs go, every output path claimed through the
/// gate before any work. Batch mode: `-o` and the extra outputs name folders (created here, after
/// every check), each file's outputs are `<folder>/<input name>.<ext>`.
fn jobs(args: &SegmentArgs, gate: &mut Gate) -> Result<(bool, Vec<Job>)> {
    let p = &args.pipe;
    let mut inputs = vec![args.input.clone()];
    inputs.extend(p.more_inputs.iter().cloned());
    let batch_mode = inputs.len() > 1 || args.input.is_dir();
    let extras = [
        (&p.probabilities, Kind::Volume, "--probabilities"),
        (&args.logits, Kind::Volume, "--logits"),
        (&p.split_classes, Kind::Folder, "--split-classes"),
        (&p.preview, Kind::Png, "--preview"),
    ];
    if !batch_mode {
        if let Some(s) = &p.shard {
            parse_shard(s)?;
        }
        gate.claim(&args.output, Kind::Volume, "-o")?;
        for (path, kind, what) in extras {
            if let Some(path) = path {
                gate.claim(path, kind, what)?;
            }
        }
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
    for f in &files {
        gate.add_input(f);
    }
    gate.claim(&args.output, Kind::Folder, "-o")?;
    for (path, _, what) in extras {
        if let Some(path) = path {
            gate.claim(path, Kind::Folder, what)?;
        }
    }
    // Two inputs with one output name (a.nii + a.nii.gz, x.nii.gz in two folders) would write
    // the same files: refused before anything runs.
    let mut by_stem: Vec<(String, &PathBuf)> = files.iter().map(|f| (stem(f), f)).collect();
    by_stem.sort();
    if let Some(w) = by_stem.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Invalid(format!(
            "{} and {} would both be written as {}.nii.gz; rename one or segment them apart",
            w[0].1.display(),
            w[1].1.display(),
            w[0].0
        )));
    }
    if let Some(s) = &p.shard {
        let (k, n) = parse_shard(s)?;
        files = batch::shard(&files, k, n);
    }
    let jobs: Vec<Job> = files
        .into_iter()
        .map(|f| {
            let s = stem(&f);
            let file = |d: &PathBuf, ext: &str| d.join(format!("{s}.{ext}"));
            Job {
                output: file(&args.output, "nii.gz"),
                probabilities: p.probabilities.as_ref().map(|d| file(d, "nii.gz")),
                logits: args.logits.as_ref().map(|d| file(d, "nii.gz")),
                split: p.split_classes.as_ref().map(|d| d.join(&s)),
                preview: p.preview.as_ref().map(|d| file(d, "png")),
                input: f,
            }
        })
        .collect();
    // An input may sit inside an output folder under an output's name.
    for job in &jobs {
        let outs = [
            Some(&job.output),
            job.probabilities.as_ref(),
            job.logits.as_ref(),
        ];
        for o in outs.into_iter().flatten().chain(job.preview.as_ref()) {
            if let Some(inp) = gate.input_of(o) {
                return Err(Error::Invalid(format!(
                    "{}: is the input {}; refusing to overwrite an input",
                    o.display(),
                    inp.display()
                )));
            }
        }
    }
    for d in [
        Some(&args.output),
        p.probabilities.as_ref(),
        args.logits.as_ref(),
    ]
    .into_iter()
    .flatten()
    .chain(p.split_classes.as_ref())
    .chain(p.preview.as_ref())
    {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    Ok((true, jobs))
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

/// Segment one file and stage its outputs (labels last: their presence marks the file done);
/// the caller commits them. `replace_extras`: the extra outputs may replace existing files.
fn process(
    pipe: &mut Pipeline,
    plan: &Plan,
    job: &Job,
    bar: bool,
    force: bool,
    replace_extras: bool,
) -> Result<(Outputs, serde_json::Value)> {
    let t_all = Instant::now();
    let t = Instant::now();
    let volume = crate::volume::read(&job.input)?;
    crate::volume::check_output_shape(&job.input, &volume.header, 1)?;
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
        crate::cli::say!(
            "voxtile: warning: {}: {} NaN/Inf voxels (NaN read as 0, ±Inf clamped to the finite range)",
            job.input.display(),
            out.nonfinite_voxels
        );
    }
    let t = Instant::now();
    let mut outs = Outputs::new();
    if let (Some(path), Some(p)) = (&job.probabilities, &out.probabilities) {
        let staged = if plan.u8 {
            outputs::stage_probabilities_u8(path, p.view(), &out.header)?
        } else {
            crate::volume::stage_f32(path, p.view(), &out.header)?
        };
        outs.push(staged, replace_extras);
    }
    if let (Some(path), Some(l)) = (&job.logits, &out.logits) {
        outs.push(
            crate::volume::stage_f32(path, l.view(), &out.header)?,
            replace_extras,
        );
    }
    if let Some(dir) = &job.split {
        let values = pipe
            .settings()
            .remap
            .clone()
            .unwrap_or_else(|| (0..pipe.output_channels() as u16).collect());
        outputs::stage_split_classes(
            dir,
            out.labels.view(),
            &values,
            plan.classes.as_deref(),
            &out.header,
            &mut outs,
            replace_extras,
        )?;
    }
    if let Some(path) = &job.preview {
        let image = volume.data.index_axis(ndarray::Axis(0), 0);
        outs.push(
            preview::stage_png(path, image, out.labels.view())?,
            replace_extras,
        );
    }
    outs.push(
        crate::volume::stage_labels(&job.output, out.labels.view(), &out.header)?,
        force,
    );
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
    Ok((outs, v))
}

/// The batch report: JSON lines appended as files finish (a resumed batch adds to it); opened
/// without following a symbolic link, and only as a regular file.
fn open_batch_report(path: &Path, force: bool) -> Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if force {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    let f = o.open(path).map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::Invalid(format!(
            "--report {}: is not a regular file",
            path.display()
        )));
    }
    Ok(f)
}

pub fn run(mut args: SegmentArgs) -> Result<()> {
    let plan = plan(&mut args)?;
    let devices = parse_devices(&args.device)?;
    let mut reads: Vec<&Path> = vec![args.input.as_path()];
    reads.extend(args.pipe.more_inputs.iter().map(|m| m.as_path()));
    reads.extend(args.model.iter().map(|m| m.as_path()));
    reads.extend(plan.manifest_path.as_deref());
    let mut gate = Gate::new(&reads, args.force);
    let (batch_mode, jobs) = jobs(&args, &mut gate)?;
    if let Some(r) = &args.report {
        if batch_mode {
            // A log of the batch: appended to, so only its identity is checked.
            let mut g = Gate::new(&reads, true);
            jobs.iter().for_each(|j| g.add_input(&j.input));
            g.claim(r, Kind::Report, "--report")?;
        } else {
            gate.claim(r, Kind::Report, "--report")?;
        }
    }

    if !batch_mode {
        let Some(job) = jobs.first() else {
            return Ok(());
        };
        let mut pipe = plan.build(&devices)?;
        let (mut outs, v) = process(
            &mut pipe,
            &plan,
            job,
            std::io::stderr().is_terminal(),
            args.force,
            args.force,
        )?;
        let mut stdout_report = None;
        if let Some(r) = &args.report {
            let json = serde_json::to_string_pretty(&v)
                .map_err(|e| Error::Invalid(format!("report: {e}")))?;
            stdout_report = stage_report(r, json + "\n", &mut outs)?;
        }
        outs.commit()?;
        if let Some(json) = stdout_report {
            crate::cli::print_stdout(&json)?;
        }
        return Ok(());
    }

    let mut todo = Vec::new();
    let mut lines: Vec<serde_json::Value> = Vec::new();
    for job in jobs {
        if job.output.exists() && !args.force {
            lines.push(serde_json::json!({
                "input": job.input.display().to_string(),
                "output": job.output.display().to_string(),
                "status": "skipped (output exists)",
            }));
            continue;
        }
        todo.push(job);
    }
    let mut report = match &args.report {
        Some(p) if p != Path::new("-") => Some((open_batch_report(p, args.force)?, p.clone())),
        _ => None,
    };
    let to_stdout = args.report.as_deref() == Some(Path::new("-"));
    let mut emit = |v: &serde_json::Value| -> Result<()> {
        let s = serde_json::to_string(v).map_err(|e| Error::Invalid(format!("report: {e}")))?;
        if let Some((f, path)) = &mut report {
            // One write per line: appended whole even beside another writer.
            f.write_all(format!("{s}\n").as_bytes())
                .map_err(|e| Error::io(&*path, e))?;
        } else if to_stdout {
            crate::cli::print_stdout(&format!("{s}\n"))?;
        }
        Ok(())
    };
    for l in &lines {
        emit(l)?;
    }

    // Batch: one worker per device (fewer files than devices: per file, the devices shared out),
    // files round robin; a failed file is reported and skipped.
    let total = todo.len();
    let groups = batch::device_groups(&devices, total);
    let workers = groups.len();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let mut failed = 0usize;
    let force = args.force;
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
                        "error": format!("{}: {e}", job.input.display()),
                    })
                };
                let mut pipe = None;
                for (_, job) in &mine {
                    // A bug (panic) while processing one file is that file's error; the
                    // pipeline it may have left half-way is built anew for the next file.
                    let r = crate::cli::catch_bug(|| {
                        let p = match pipe.take() {
                            Some(p) => p,
                            None => plan.build(group)?,
                        };
                        let p = pipe.insert(p);
                        let (outs, v) = process(p, &plan, job, false, force, true)?;
                        outs.commit()?;
                        Ok(v)
                    });
                    let _ = tx.send(r.unwrap_or_else(|e| fail(job, &e)));
                }
            });
        }
        drop(tx);
        for (i, v) in rx.iter().enumerate() {
            let status = v["status"].as_str().unwrap_or("");
            if status == "error" {
                failed += 1;
                crate::cli::say!(
                    "voxtile: failed: {}",
                    v["error"].as_str().unwrap_or("unknown error")
                );
            } else if std::io::stderr().is_terminal() {
                crate::cli::say!(
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
