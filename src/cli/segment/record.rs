//! The `--report` record of one input file: one schema whatever ran (TTA, preview, manifest,
//! one device or several, done, skipped or failed), so a report is read the same way every time.
//!
//! A record is the engine's and the pipeline's report, flattened, plus: `schema`, `provenance`
//! (voxtile version, command line, effective options, model and manifest digests), `input`,
//! `output`, `status`, `error`, `classes` (voxels and mL per label value), `voxel_volume_ml` and
//! `compute_dtype`. A skipped or failed file gets the same keys, those of the run set to null.

use super::config::Config;
use super::jobs::Job;
use crate::engine::{ClassVolume, FileDigest};
use crate::pipeline::{manifest, PipelineReport};
use crate::{Error, Result};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

/// The report format's version: raised when a key changes meaning or goes away.
pub const SCHEMA: u32 = 1;

/// Who made the outputs and how: the same in every record of a run.
#[derive(Debug, Serialize)]
pub struct Provenance {
    /// "voxtile".
    pub tool: &'static str,
    /// The voxtile version.
    pub version: &'static str,
    /// The command line, one argument per entry.
    pub command_line: Vec<String>,
    /// The options in effect (flags merged with the manifest).
    pub options: EffectiveOptions,
    /// The models' and the manifest's digests.
    #[serde(flatten)]
    pub digests: Digests,
}

/// The files a run read its model from, by content.
#[derive(Debug, Serialize)]
pub struct ModelDigests {
    /// The ONNX models (several: an ensemble).
    pub models: Vec<FileDigest>,
    /// The model manifest, when one was read.
    pub manifest: Option<FileDigest>,
}

impl ModelDigests {
    fn read(models: &[PathBuf], manifest: Option<&Path>) -> Result<ModelDigests> {
        Ok(ModelDigests {
            models: models
                .iter()
                .map(|m| FileDigest::of(m))
                .collect::<Result<_>>()?,
            manifest: manifest.map(FileDigest::of).transpose()?,
        })
    }
}

/// [`ModelDigests`] read on a thread of their own from the start of the run: SHA-256 over W1's
/// 125 MB export took ~0.12 s in front of the model load and the device start. Joined when a
/// record first needs them; a file that cannot be read then fails the record (nothing was
/// committed yet: the report is staged with the outputs).
pub struct Digests {
    thread: Mutex<Option<JoinHandle<Result<ModelDigests>>>>,
    done: OnceLock<std::result::Result<ModelDigests, String>>,
}

impl Digests {
    /// Start reading `models` and `manifest` (here and now if no thread starts).
    pub fn start(models: &[PathBuf], manifest: Option<&Path>) -> Digests {
        let (m, f) = (models.to_vec(), manifest.map(Path::to_path_buf));
        let done = OnceLock::new();
        let spawned = std::thread::Builder::new()
            .name("voxtile-digest".into())
            .spawn(move || ModelDigests::read(&m, f.as_deref()));
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                let _ = done.set(ModelDigests::read(models, manifest).map_err(|e| e.to_string()));
                None
            }
        };
        Digests {
            thread: Mutex::new(thread),
            done,
        }
    }

    /// The digests, or the message of the file that could not be read.
    pub fn get(&self) -> std::result::Result<&ModelDigests, &str> {
        let done = self.done.get_or_init(|| {
            let thread = self.thread.lock().ok().and_then(|mut t| t.take());
            match thread.map(JoinHandle::join) {
                Some(Ok(r)) => r.map_err(|e| e.to_string()),
                _ => Err("model digest: internal error".into()),
            }
        });
        done.as_ref().map_err(String::as_str)
    }
}

impl std::fmt::Debug for Digests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digests").field("done", &self.done).finish()
    }
}

impl Serialize for Digests {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.get() {
            Ok(d) => d.serialize(s),
            Err(e) => Err(serde::ser::Error::custom(e)),
        }
    }
}

/// The options in effect, after the manifest was merged in. What the planner then chose (roi,
/// batch) and the device that ran are in the record's own `roi`, `batch` and `device`.
#[derive(Clone, Debug, Serialize)]
pub struct EffectiveOptions {
    /// Window asked for (network axes); null: the model's fixed size, else 128.
    pub roi: Option<[usize; 3]>,
    /// Window overlap per network axis.
    pub overlap: [f64; 3],
    /// Window weights: gaussian, constant or hann.
    pub blend: String,
    /// Gaussian sigma as a fraction of the roi.
    pub sigma_scale: [f64; 3],
    /// Window placement: monai or nnunet.
    pub placement: String,
    /// Windows per call asked for; null: planned under the memory budget.
    pub batch: Option<usize>,
    /// Padding: a constant or "edge".
    pub pad: String,
    /// Network axes from the file's: xyz or zyx.
    pub axis_order: String,
    /// Intensity normalisation, in words.
    pub normalize: String,
    /// Voxel size resampled to (mm); null: none.
    pub spacing: Option<[f64; 3]>,
    /// Network axes mirrored for test-time augmentation (empty: none).
    pub tta: Vec<usize>,
    /// Activation before averaging.
    pub activation: String,
    /// `--device` as given (the one used is the record's `device`).
    pub device: String,
    /// Memory budget asked for, bytes; null: the default (see `memory_budget_source`).
    pub memory_budget: Option<u64>,
    /// Probabilities written as uint8.
    pub probabilities_u8: bool,
    /// A `labels.json` sidecar written beside each label map.
    pub labels_json: bool,
    /// The orientation the models ran in: "stored" or axis codes (the per-file report's
    /// `orientation` says how each input was turned).
    pub orientation: String,
}

impl Provenance {
    /// The provenance of a run of `config`: the models and the manifest are read through
    /// SHA-256 on a thread of their own ([`Digests`]).
    pub fn new(config: &Config, device: &str, labels_json: bool) -> Provenance {
        let o = &config.options;
        let s = &config.settings;
        let options = EffectiveOptions {
            roi: o.roi,
            overlap: o.overlap,
            blend: format!("{:?}", o.blend).to_lowercase(),
            sigma_scale: o.sigma_scale,
            placement: format!("{:?}", o.placement).to_lowercase(),
            batch: o.batch,
            pad: manifest::describe_pad(o.pad),
            axis_order: format!("{:?}", o.axis_order).to_lowercase(),
            normalize: manifest::describe_intensity(&s.intensity),
            spacing: s.spacing,
            tta: s.mirror_axes.clone(),
            activation: format!("{:?}", s.activation).to_lowercase(),
            device: device.to_string(),
            memory_budget: o.memory_budget,
            probabilities_u8: config.u8,
            labels_json,
            orientation: s.orientation.to_string(),
        };
        Provenance {
            tool: "voxtile",
            version: env!("CARGO_PKG_VERSION"),
            command_line: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            options,
            digests: Digests::start(&config.models, config.manifest_path.as_deref()),
        }
    }
}

/// What a finished file adds to the pipeline's report.
pub struct Measured {
    /// Voxels and mL per label value.
    pub classes: Vec<ClassVolume>,
    /// One voxel's volume, mL.
    pub voxel_ml: f64,
}

fn to_value(v: impl Serialize) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::Invalid(format!("report: {e}")))
}

/// The record of a segmented file: `run` (the pipeline's report as a JSON object, stage times
/// added) completed with the keys every record has.
pub fn done(run: Value, config: &Config, job: &Job, m: Measured) -> Result<Value> {
    let dtype = match run.get("device").and_then(Value::as_str) {
        Some(d) if d.starts_with("cuda") => "float16",
        _ => "float32",
    };
    let rest = [
        ("status", Value::from("done")),
        ("error", Value::Null),
        ("classes", to_value(&m.classes)?),
        ("voxel_volume_ml", m.voxel_ml.into()),
        ("compute_dtype", dtype.into()),
    ];
    complete(run, config, &job.input, &job.output, rest)
}

/// The record of a file that did not run (`status` says why; `error` the message of a failure):
/// the keys of [`done`], those of the run null.
pub fn not_run(
    config: &Config,
    input: &Path,
    output: &Path,
    status: &str,
    error: Option<String>,
) -> Value {
    let mut run = to_value(PipelineReport::default()).unwrap_or_default();
    if let Some(o) = run.as_object_mut() {
        o.values_mut().for_each(|v| *v = Value::Null);
    }
    let rest = [
        ("status", Value::from(status)),
        ("error", error.map_or(Value::Null, Value::from)),
        ("classes", Value::Null),
        ("voxel_volume_ml", Value::Null),
        ("compute_dtype", Value::Null),
    ];
    complete(run, config, input, output, rest).unwrap_or(Value::Null)
}

/// `run` with the keys every record has.
fn complete<const N: usize>(
    run: Value,
    config: &Config,
    input: &Path,
    output: &Path,
    rest: [(&str, Value); N],
) -> Result<Value> {
    let Value::Object(mut o) = run else {
        return Err(Error::Invalid("report: not a JSON object".into()));
    };
    let mut head = Map::new();
    head.insert("schema".into(), SCHEMA.into());
    head.insert("provenance".into(), to_value(config.provenance.as_deref())?);
    head.insert("input".into(), input.display().to_string().into());
    head.insert("output".into(), output.display().to_string().into());
    for (k, v) in rest {
        head.insert(k.into(), v);
    }
    head.append(&mut o);
    Ok(Value::Object(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digests read on their thread are the file's (SHA-256 of "abc"); a model gone by then
    /// fails the record with its path, and no digest is made up.
    #[test]
    fn digests_are_read_beside_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.onnx");
        std::fs::write(&model, b"abc").unwrap();
        let d = Digests::start(std::slice::from_ref(&model), None);
        let got = d.get().expect("digest");
        assert_eq!(
            got.models[0].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!((got.models[0].bytes, got.manifest.is_none()), (3, true));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["models"][0]["bytes"], 3);
        let missing = dir.path().join("gone.onnx");
        let d = Digests::start(&[missing], None);
        let e = d.get().expect_err("a missing model");
        assert!(e.contains("gone.onnx"), "{e}");
        assert!(serde_json::to_value(&d).is_err());
    }
}
