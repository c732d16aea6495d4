//! One file through the pipeline: read and preprocess it on its own thread while the pipeline
//! is made ready (engines built, backends prepared for the planned window), segment, stage every
//! output (labels last: their presence marks the file done) and its report.

use super::config::Config;
use super::jobs::Job;
use super::record;
use crate::cli::summary::Summary;
use crate::pipeline::{outputs, preview, Intensity, Pipeline};
use crate::staged::{Outputs, Staged};
use crate::volume::intensity;
use crate::volume::{Header, LabelNames, LabelOptions, Source, Volume};
use crate::{Error, Result};
use ndarray::{Array3, Axis};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A job's input, read and preprocessed.
pub struct Input {
    volume: Volume,
    /// Channel 0 as read (before the cleanup and normalisation), for `--preview` and
    /// `--statistics`.
    raw: Option<Array3<f32>>,
    nonfinite: usize,
    /// Seconds reading, preprocessing.
    read: f64,
    normalize: f64,
}

/// What happened while the input was read: when the run started, seconds making the engines
/// (`engine_init`), then preparing them ahead of the data, and still waiting for it afterwards.
pub struct Ahead {
    start: Instant,
    engine_init: f64,
    prepare: f64,
    wait: f64,
}

/// Read and preprocess `input` (the one preprocessing: [`intensity::preprocess`]).
fn read_input(input: &Source, config: &Config, keep_raw: bool) -> Result<Input> {
    let t = Instant::now();
    let mut volume = input.read()?;
    let read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let raw = keep_raw.then(|| volume.data.index_axis(Axis(0), 0).to_owned());
    let nonfinite = intensity::preprocess(&mut volume.data, &config.settings.intensity)?;
    Ok(Input {
        volume,
        raw,
        nonfinite,
        read,
        normalize: t.elapsed().as_secs_f64(),
    })
}

/// Read `job`'s input on its own thread while `ready` makes the pipeline ready for its header
/// (the header is cheap and gives the shape). Errors of the input come first, as when it was
/// read before the model was loaded; `ready` returns its pipeline and the seconds it took to
/// build it (the rest is preparation ahead of the data).
pub fn read_ahead(
    job: &Job,
    config: &Config,
    ready: impl FnOnce(&Header) -> Result<(Pipeline, f64)>,
) -> Result<(Pipeline, Input, Ahead)> {
    let start = Instant::now();
    let header = job.source.read_header()?;
    crate::volume::check_output_shape(&job.input, &header, 1)?;
    let keep_raw = job.preview.is_some() || job.statistics.is_some();
    let input = job.source.clone();
    let cfg = config.clone();
    let reader = std::thread::Builder::new()
        .name("voxtile-read".into())
        .spawn(move || read_input(&input, &cfg, keep_raw))
        .map_err(|e| Error::io(&job.input, e))?;
    let t = Instant::now();
    let pipe = ready(&header);
    let device = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let read = reader.join().unwrap_or_else(|_| {
        Err(Error::volume(
            &job.input,
            "reading stopped on an internal error",
        ))
    });
    let wait = t.elapsed().as_secs_f64();
    let input = read?;
    let (pipe, engine_init) = pipe?;
    let ahead = Ahead {
        start,
        engine_init,
        prepare: device - engine_init,
        wait,
    };
    Ok((pipe, input, ahead))
}

/// Make `pipe` ready for an input of `header`: its channels checked, its engines prepared.
pub fn prepare(pipe: &mut Pipeline, header: &Header, job: &Job, models: &[PathBuf]) -> Result<()> {
    if header.channels() != pipe.input_channels() {
        return Err(Error::ChannelMismatch {
            expected: pipe.input_channels(),
            got: header.channels(),
            input: Some(job.input.clone()),
            model: Some(models[0].clone()),
        });
    }
    pipe.prepare_for(header)
        .map_err(|e| name_error(e, &job.input, models))
}

/// Name the input and the model(s) in messages that only say what went wrong.
pub fn name_error(e: Error, input: &Path, models: &[PathBuf]) -> Error {
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

/// What [`process`] leaves: the staged outputs (the caller commits them), the file's report
/// (one schema for every run) and, for `--report -`, its text to print once committed.
pub struct Processed {
    /// Staged outputs.
    pub outs: Outputs,
    /// The file's report.
    pub report: serde_json::Value,
    /// The report text for standard output (`--report -`).
    pub stdout: Option<String>,
    /// The file's summary line, to say once the outputs are committed.
    pub summary: Summary,
    /// The threads closing the devices (`last`), to join before the process ends.
    pub released: Vec<std::thread::JoinHandle<()>>,
}

/// Segment one prepared input and stage its outputs, its report at `report` when given (staged
/// before the labels, which come last); `force`: they may replace existing files (the gate
/// refused those already there without it); `last`: no file follows, so the devices close
/// while the outputs are written (W3: ~0.1 s of teardown that the process's end paid after).
pub fn process(
    pipe: &mut Pipeline,
    config: &Config,
    job: &Job,
    (input, ahead): (Input, Ahead),
    (bar, report): (bool, Option<&Path>),
    (force, last): (bool, bool),
) -> Result<Processed> {
    let pb = bar.then(crate::cli::progress::Bar::windows);
    let mut out = pipe
        .run_preprocessed(
            &input.volume,
            (input.nonfinite, input.normalize),
            &mut |done, total| {
                if let Some(b) = &pb {
                    b.set(done, total);
                }
            },
        )
        .map_err(|e| name_error(e, &job.input, &config.models))?;
    drop(pb);
    drop(input.volume);
    if out.nonfinite_voxels > 0 {
        tracing::warn!(
            "{}: {} NaN/Inf voxels (NaN read as 0, ±Inf clamped to the finite range)",
            job.input.display(),
            out.nonfinite_voxels
        );
    }
    let (names, voxel_ml) =
        post(pipe, config, &mut out).map_err(|e| name_error(e, &job.input, &config.models))?;
    let released = if last {
        pipe.release_devices()
    } else {
        Vec::new()
    };
    let remap = pipe.settings().remap.as_deref();
    let background = remap.and_then(|t| t.first().copied()).unwrap_or(0);
    let counts = crate::engine::label_counts(out.labels.view());
    super::empty::warn_if_empty(&job.input, &counts, background);
    let (i, j, k) = out.labels.dim();
    let summary = Summary::new(
        (&job.input, &job.output),
        ([i, j, k], &counts),
        config.classes.is_some().then_some(&names),
        &out.report.engine.device,
        ahead.start,
    );
    let t = Instant::now();
    let (mut outs, labels) = stage(pipe, config, job, &out, &names, input.raw.as_ref(), force)?;
    let r = &mut out.report.engine;
    r.seconds.read = input.read;
    r.seconds.prepare += ahead.prepare;
    r.seconds.write = t.elapsed().as_secs_f64();
    r.seconds.total = ahead.start.elapsed().as_secs_f64();
    r.peak_host_bytes = crate::engine::peak_rss_bytes();
    let mut v =
        serde_json::to_value(&out.report).map_err(|e| Error::Invalid(format!("report: {e}")))?;
    // Stages beyond the engine's: read and normalise ran on their own thread while the engines
    // were made (engine_init: the model load and the device start, which overlap) and prepared;
    // wait is how long the data then still took.
    if let Some(sec) = v.get_mut("seconds").and_then(|s| s.as_object_mut()) {
        sec.insert("normalize".into(), input.normalize.into());
        sec.insert("engine_init".into(), ahead.engine_init.into());
        sec.insert("wait_for_read".into(), ahead.wait.into());
    }
    let measured = record::Measured {
        classes: crate::engine::class_volumes_of(&counts, &names, voxel_ml),
        voxel_ml,
    };
    let v = record::done(v, config, job, measured)?;
    let mut stdout = None;
    if let Some(path) = report {
        // One line: a report is JSON Lines, one record per input file.
        let json = serde_json::to_string(&v).map_err(|e| Error::Invalid(format!("report: {e}")))?;
        stdout = super::stage_report(path, json + "\n", &mut outs, force)?;
    }
    outs.push(labels, force);
    Ok(Processed {
        outs,
        report: v,
        stdout,
        summary,
        released,
    })
}

/// The label map's post-processing (manifest and flags merged) applied to `out`: the class names
/// it carries and the voxel volume in mL.
pub fn post(
    pipe: &Pipeline,
    config: &Config,
    out: &mut crate::pipeline::Output,
) -> Result<(LabelNames, f64)> {
    let remap = pipe.settings().remap.as_deref();
    let names = config.label_names(pipe.output_channels(), remap);
    let voxel_ml = crate::engine::voxel_ml(out.header.spacing(), out.header.xyzt_units);
    config.post.apply(&mut out.labels, &names, voxel_ml)?;
    Ok((names, voxel_ml))
}

/// Every output of `job` staged, the labels apart (they are committed last); `names` are the
/// class names the label map carries.
fn stage(
    pipe: &Pipeline,
    config: &Config,
    job: &Job,
    out: &crate::pipeline::Output,
    names: &LabelNames,
    raw: Option<&Array3<f32>>,
    force: bool,
) -> Result<(Outputs, Staged)> {
    let mut outs = Outputs::new();
    if let (Some(path), Some(p)) = (&job.probabilities, &out.probabilities) {
        let staged = if config.u8 {
            outputs::stage_probabilities_u8(path, p.view(), &out.header)?
        } else {
            crate::volume::stage_f32(path, p.view(), &out.header)?
        };
        outs.push(staged, force);
    }
    if let (Some(path), Some(l)) = (&job.logits, &out.logits) {
        outs.push(
            crate::volume::stage_f32(path, l.view(), &out.header)?,
            force,
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
            config.classes.as_deref(),
            &out.header,
            &mut outs,
            force,
        )?;
    }
    if let (Some(path), Some(image)) = (&job.preview, raw) {
        let ctx = preview::Context {
            affine: out.header.affine(),
            names: Some(names),
            ct: matches!(config.settings.intensity, Intensity::Ct { .. }),
        };
        outs.push(
            preview::stage_png(path, image.view(), out.labels.view(), &ctx)?,
            force,
        );
    }
    if let Some(path) = &job.labels_json {
        outs.push(crate::volume::stage_labels_json(path, names)?, force);
    }
    if let Some(path) = &job.color_table {
        outs.push(crate::volume::stage_color_table(path, names)?, force);
    }
    if let (Some(path), Some(image)) = (&job.statistics, raw) {
        outs.push(stage_statistics(path, image, out, names)?, force);
    }
    let opts = LabelOptions {
        names: Some(names),
        nifti2: false,
    };
    let labels =
        crate::volume::stage_labels_with(&job.output, out.labels.view(), &out.header, &opts)?;
    Ok((outs, labels))
}

/// The `--statistics` file: per foreground class its voxels, volume and the input's intensity
/// (`image`: channel 0 as read, on the label map's grid).
fn stage_statistics(
    path: &Path,
    image: &Array3<f32>,
    out: &crate::pipeline::Output,
    names: &LabelNames,
) -> Result<Staged> {
    let voxel_ml = crate::engine::voxel_ml(out.header.spacing(), out.header.xyzt_units);
    let classes = crate::postprocess::statistics(out.labels.view(), image.view(), names, voxel_ml)?;
    #[derive(serde::Serialize)]
    struct File {
        voxel_ml: f64,
        classes: Vec<crate::postprocess::ClassStatistics>,
    }
    let text = serde_json::to_string_pretty(&File { voxel_ml, classes })
        .map_err(|e| Error::Invalid(format!("statistics: {e}")))?;
    crate::staged::stage_bytes(path, (text + "\n").as_bytes())
}
