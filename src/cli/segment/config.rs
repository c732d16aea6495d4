//! The one validated configuration of a `voxtile segment` run: every flag parsed once, the
//! model manifest merged in (flags typed on the command line beat it, defaults do not).

use super::args::SegmentArgs;
use crate::cli::flags;
use crate::engine::{AxisOrder, Device, Engine, Normalize, Options};
use crate::pipeline::batch::parse_devices;
use crate::pipeline::manifest::{parse_blend, Activation, Intensity, Manifest};
use crate::pipeline::{Pipeline, Settings};
use crate::tiling::{self, BlendMode, PadMode};
use crate::volume::LabelNames;
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// Everything a worker needs to build its pipeline (plain data: each worker owns its engines).
#[derive(Clone)]
pub struct Config {
    /// The ONNX models (several: an ensemble).
    pub models: Vec<PathBuf>,
    /// The engines' options (the device is set per worker, from `devices`).
    pub options: Options,
    /// `--device`: one device, or a list (one volume split, or files handed out).
    pub devices: Vec<Device>,
    /// What the pipeline does around the engines.
    pub settings: Settings,
    /// The manifest's class names.
    pub classes: Option<Vec<String>>,
    /// The model manifest (empty when there is none).
    pub manifest: Manifest,
    /// Where it was read from.
    pub manifest_path: Option<PathBuf>,
    /// `--probabilities-u8`.
    pub u8: bool,
    /// What every report record says about the run; None without `--report` (the models are
    /// then not read through SHA-256).
    pub provenance: Option<Arc<super::record::Provenance>>,
}

impl Config {
    /// Parse and check every flag, merge the manifest.
    pub fn new(args: &SegmentArgs) -> Result<Config> {
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
        let mut options = options(args)?;
        let devices = parse_devices(&args.device)?;
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
        // Normalised once, before the engines (see `pipeline::intensity::preprocess`).
        options.normalize = Normalize::None;
        let spacing = match p.spacing.as_deref() {
            Some("none") => None,
            Some(s) => Some(tiling::parse_spacing(s)?),
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
        let mut config = Config {
            models: args.model.clone(),
            options,
            devices,
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
            provenance: None,
        };
        if args.report.is_some() {
            let prov = super::record::Provenance::new(&config, &args.device, p.labels_json)?;
            config.provenance = Some(Arc::new(prov));
        }
        Ok(config)
    }

    /// The class name of each label value written, for the label map's table and the report:
    /// the manifest's `classes` (one per output channel; a single-channel model's class is
    /// label 1) moved to their remapped values; without them, 0 is "background" and value k
    /// "label_k".
    pub fn label_names(&self, channels: usize, remap: Option<&[u16]>) -> LabelNames {
        // (label value before remapping, its channel's manifest name)
        let raw: Vec<(u16, Option<&String>)> = if channels == 1 {
            let first = self.classes.as_ref().and_then(|c| c.first());
            vec![(0, None), (1, first)]
        } else {
            (0..channels)
                .map(|c| (c as u16, self.classes.as_ref().and_then(|n| n.get(c))))
                .collect()
        };
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

/// The engine options the flags give (the device list is parsed apart).
fn options(args: &SegmentArgs) -> Result<Options> {
    let pad = if args.pad == "edge" {
        PadMode::Edge
    } else {
        // Finite in f32 too: "1e39" parses, as infinity.
        match args.pad.trim().parse::<f32>() {
            Ok(v) if v.is_finite() => PadMode::Constant(v),
            _ => {
                return Err(Error::Invalid(format!(
                    "--pad takes a finite number or 'edge', not '{}'",
                    args.pad
                )))
            }
        }
    };
    let overlap = flags::overlap(&args.overlap)?;
    let sigma_scale = tiling::parse_sigma_scale(&args.sigma_scale)?;
    let normalize = args.normalize.parse::<Normalize>()?;
    Intensity::from(normalize)
        .check()
        .map_err(|m| Error::Invalid(format!("--normalize {}: {m}", args.normalize)))?;
    let batch = flags::batch(args.batch)?;
    Ok(Options {
        roi: flags::roi(args.roi.as_deref())?,
        overlap,
        blend: match args.blend.as_str() {
            "constant" => BlendMode::Constant,
            "hann" => BlendMode::Hann,
            _ => BlendMode::Gaussian,
        },
        sigma_scale,
        placement: flags::placement(&args.placement),
        batch,
        pad,
        axis_order: args.axis_order.parse::<AxisOrder>()?,
        keep_logits: args.logits.is_some(),
        normalize,
        memory_budget: flags::memory_budget(args.memory_budget.as_deref())?,
        ..Options::default()
    })
}

/// `--tta` axes: network axes 0..=2, sorted, once each.
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
