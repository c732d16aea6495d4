//! The one validated configuration of a `voxtile segment` run: every flag parsed once, the
//! model manifest merged in (flags typed on the command line beat it, defaults do not).

use super::args::SegmentArgs;
use crate::cli::flags;
use crate::engine::{Device, Options};
use crate::pipeline::manifest::{Activation, Intensity};
use crate::pipeline::{Mirror, ModelSetup, Overrides, Pipeline};
use crate::tiling::{self, BlendMode};
use crate::volume::LabelNames;
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// Everything a run reads from its flags, parsed and checked once: after [`Config::new`] nothing
/// reads [`SegmentArgs`]. Plain data: each worker owns its engines. The models, options, settings
/// and manifest are the library's [`ModelSetup`] (reached through `Deref`): the manifest is
/// merged there, the one place the library shares.
#[derive(Clone)]
pub struct Config {
    /// The models, the merged options and settings, the manifest.
    pub setup: ModelSetup,
    /// `--device`: one device, or a list (one volume split, or files handed out).
    pub devices: Vec<Device>,
    /// The manifest's class names.
    pub classes: Option<Vec<String>>,
    /// `--probabilities-u8`.
    pub u8: bool,
    /// What every report record says about the run; None without `--report` (the models are
    /// then not read through SHA-256).
    pub provenance: Option<Arc<super::record::Provenance>>,
    /// The post-processing of the label map (manifest and flags merged).
    pub post: crate::postprocess::Postprocess,
    /// The files the run reads and writes, as the flags name them.
    pub files: Files,
}

/// The files of a run as the flags name them; [`super::jobs`] turns them into each case's paths.
#[derive(Clone, Debug)]
pub struct Files {
    /// The input (a file, a DICOM folder, or a folder of cases).
    pub input: PathBuf,
    /// More inputs: a batch.
    pub more_inputs: Vec<PathBuf>,
    /// `--series`.
    pub series: Option<String>,
    /// `-o`: the label map, or a folder.
    pub output: PathBuf,
    /// `--probabilities`.
    pub probabilities: Option<PathBuf>,
    /// `--logits`.
    pub logits: Option<PathBuf>,
    /// `--split-classes`.
    pub split_classes: Option<PathBuf>,
    /// `--preview`.
    pub preview: Option<PathBuf>,
    /// `--statistics`.
    pub statistics: Option<PathBuf>,
    /// `--labels-json`.
    pub labels_json: bool,
    /// `--color-table`.
    pub color_table: bool,
    /// `--report` (`-`: standard output).
    pub report: Option<PathBuf>,
    /// `--shard`.
    pub shard: Option<String>,
    /// `--force`: existing outputs are replaced.
    pub force: bool,
}

impl Files {
    /// The files `args` name; a `--statistics` of `-` is refused here, with the other checks
    /// before any work.
    fn new(args: &SegmentArgs) -> Result<Files> {
        if args.statistics.as_deref() == Some(std::path::Path::new("-")) {
            return Err(Error::Invalid(
                "--statistics -: give a file name (standard output is --report's)".into(),
            ));
        }
        let p = &args.pipe;
        Ok(Files {
            input: args.input.clone(),
            more_inputs: p.more_inputs.clone(),
            series: args.series.clone(),
            output: args.output.clone(),
            probabilities: p.probabilities.clone(),
            logits: args.logits.clone(),
            split_classes: p.split_classes.clone(),
            preview: p.preview.clone(),
            statistics: args.statistics.clone(),
            labels_json: p.labels_json,
            color_table: p.color_table,
            report: args.report.clone(),
            shard: p.shard.clone(),
            force: args.force,
        })
    }
}

impl std::ops::Deref for Config {
    type Target = ModelSetup;
    fn deref(&self) -> &ModelSetup {
        &self.setup
    }
}

impl Config {
    /// Parse and check every flag, merge the manifest (flags typed on the command line beat it,
    /// defaults do not).
    pub fn new(args: &SegmentArgs) -> Result<Config> {
        let p = &args.pipe;
        if p.probabilities_u8 && p.probabilities.is_none() {
            return Err(Error::Invalid(
                "--probabilities-u8 needs --probabilities OUT".into(),
            ));
        }
        let files = Files::new(args)?;
        let options = options(args)?;
        let overrides = overrides(args, &options)?;
        let w = &args.window;
        let devices = w.devices()?;
        let setup = ModelSetup::new(&w.model, options, &overrides)?;
        let post = super::post::merge(&args.post, &setup.manifest, setup.classes())?;
        let mut config = Config {
            post,
            classes: setup.classes().map(<[String]>::to_vec),
            setup,
            devices,
            u8: p.probabilities_u8,
            provenance: None,
            files,
        };
        if args.report.is_some() {
            let prov = super::record::Provenance::new(&config, &w.device, p.labels_json);
            config.provenance = Some(Arc::new(prov));
        }
        Ok(config)
    }

    /// The class name of each label value written, for the label map's table and the report:
    /// the manifest's `classes` ([`crate::engine::class_name`]: one per output channel; a
    /// one-channel model's one name is label 1's) moved to their remapped values; without them,
    /// 0 is "background" and value k "label_k".
    pub fn label_names(&self, channels: usize, remap: Option<&[u16]>) -> LabelNames {
        // (label value before remapping, its manifest name); a one-channel model writes 0 and 1.
        let raw: Vec<(u16, Option<&String>)> = (0..channels.max(2))
            .map(|v| {
                let name = self.classes.as_ref();
                (
                    v as u16,
                    name.and_then(|c| crate::engine::class_name(c, channels, v)),
                )
            })
            .collect();
        let mut names: Vec<String> = Vec::new();
        for (l, name) in raw {
            let v = remap.and_then(|t| t.get(l as usize).copied()).unwrap_or(l) as usize;
            if names.len() <= v {
                names.resize(v + 1, String::new());
            }
            if names[v].is_empty() {
                names[v] = match name {
                    Some(n) => n.clone(),
                    None if v == 0 => "background".into(),
                    None => format!("label_{v}"),
                };
            }
        }
        LabelNames { names }
    }

    /// Engines on `devices` (several: each volume's windows are split across them).
    pub fn build(&self, devices: &[Device]) -> Result<Pipeline> {
        let mut setup = self.setup.clone();
        setup.options.set_devices(devices);
        setup.build()
    }
}

/// The flags typed on the command line that beat the manifest (`options`: the flags parsed):
/// the shared window flags', then `segment`'s own.
fn overrides(args: &SegmentArgs, options: &Options) -> Result<Overrides> {
    let p = &args.pipe;
    let explicit = |id: &str| p.explicit.iter().any(|e| e == id);
    Ok(Overrides {
        blend: explicit("blend").then_some(options.blend),
        intensity: explicit("normalize").then_some(options.normalize),
        mirror: match p.tta.as_deref() {
            None => None,
            Some("all") => Some(Mirror::Manifest),
            Some("off") => Some(Mirror::Off),
            Some(s) => Some(Mirror::Axes(parse_axes(s)?)),
        },
        activation: p.activation.as_deref().map(|a| match a {
            "softmax" => Activation::Softmax,
            "sigmoid" => Activation::Sigmoid,
            "none" => Activation::None,
            _ => Activation::Auto,
        }),
        keep_probabilities: p.probabilities.is_some(),
        sigma_scale: explicit("sigma_scale").then_some(options.sigma_scale),
        pad: explicit("pad").then_some(options.pad),
        ..args.window.overrides(args.logits.is_some())?
    })
}

/// The engine options the flags give (the device list is parsed apart): the shared window
/// flags', then `segment`'s own.
fn options(args: &SegmentArgs) -> Result<Options> {
    let pad = flags::pad(&args.pad)?;
    let sigma_scale = tiling::parse_sigma_scale(&args.sigma_scale)?;
    let normalize = args.normalize.parse::<Intensity>()?;
    normalize
        .check()
        .map_err(|m| Error::Invalid(format!("--normalize {}: {m}", args.normalize)))?;
    Ok(Options {
        blend: match args.blend.as_str() {
            "constant" => BlendMode::Constant,
            "hann" => BlendMode::Hann,
            _ => BlendMode::Gaussian,
        },
        sigma_scale,
        pad,
        normalize,
        ..args.window.options(args.logits.is_some())?
    })
}

/// `--tta` axes: network axes 0..=2, sorted, once each.
fn parse_axes(s: &str) -> Result<Vec<usize>> {
    let bad = || {
        Error::Invalid(format!(
            "--tta takes network axes like 0,1,2 or off, not '{s}'"
        ))
    };
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
