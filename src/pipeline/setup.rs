//! A model's manifest merged with a caller's choices: the one merge behind both
//! [`Pipeline::from_model`] and `voxtile segment` (whose typed flags become [`Overrides`]), so the
//! library and the command line cannot read a manifest differently.

use super::manifest::{parse_blend, Activation, Intensity, Manifest};
use super::{Pipeline, Settings};
use crate::engine::{AxisOrder, Engine, Options};
use crate::tiling::{BlendMode, PadMode, Placement};
use crate::volume::Orientation;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Test-time mirroring: which network axes a run flips (every subset of them is one pass).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Mirror {
    /// One pass, no mirroring (`voxtile segment` without `--tta`).
    #[default]
    Off,
    /// The manifest's `tta` axes or `mirror_axes`, or all three axes when it has none (`--tta`).
    Manifest,
    /// These network axes (0, 1, 2), whatever the manifest says (`--tta 0,2`).
    Axes(Vec<usize>),
}

/// What a caller sets over a model's manifest. Each `Some` beats the manifest; each `None` takes
/// the manifest's value, else the default (`Options::default()`, no normalisation, the input
/// grid, `Activation::Auto`).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// The manifest to read instead of `NAME.toml` / `NAME.json` beside the first model.
    pub manifest: Option<PathBuf>,
    /// Window size, network axes.
    pub roi: Option<[usize; 3]>,
    /// Window overlap, per network axis.
    pub overlap: Option<[f64; 3]>,
    /// Blending weights of window outputs.
    pub blend: Option<BlendMode>,
    /// How the network's axes map onto the file's.
    pub axis_order: Option<AxisOrder>,
    /// Intensity normalisation.
    pub intensity: Option<Intensity>,
    /// Voxel size to resample to, network axes (mm); `Some(None)`: the input grid whatever the
    /// manifest says.
    pub spacing: Option<Option<[f64; 3]>>,
    /// Test-time mirroring; None: the manifest's `tta` (off when it has none).
    pub mirror: Option<Mirror>,
    /// What turns outputs into probabilities before averaging.
    pub activation: Option<Activation>,
    /// Keep the averaged probabilities (`Output::probabilities`).
    pub keep_probabilities: bool,
    /// Keep the averaged raw outputs (`Output::logits`).
    pub keep_logits: bool,
    /// Window placement.
    pub placement: Option<Placement>,
    /// Gaussian sigma as a fraction of the roi, per network axis.
    pub sigma_scale: Option<[f64; 3]>,
    /// Padding where the volume is smaller than the roi.
    pub pad: Option<PadMode>,
    /// The orientation the models run in (`--orientation`).
    pub orientation: Option<Orientation>,
}

/// Models, their manifest and the merged settings, as plain data: [`ModelSetup::build`] makes
/// the engines (a command line makes one pipeline per device from one setup).
#[derive(Clone, Debug)]
pub struct ModelSetup {
    /// The ONNX models (several: an ensemble averaged voxel by voxel).
    pub models: Vec<PathBuf>,
    /// The engines' options, the manifest's window settings merged in.
    pub options: Options,
    /// What the pipeline does around the engines (the label remapping is set at build, once the
    /// model's channels are known).
    pub settings: Settings,
    /// The manifest (empty when there is none).
    pub manifest: Manifest,
    /// Where it was read from.
    pub manifest_path: Option<PathBuf>,
}

impl ModelSetup {
    /// Read the manifest of `models` (the one `overrides.manifest` names, else the one beside
    /// the first model, else none) and merge it with `options` and `overrides`.
    pub fn new(
        models: &[impl AsRef<Path>],
        options: Options,
        overrides: &Overrides,
    ) -> Result<ModelSetup> {
        let models: Vec<PathBuf> = models.iter().map(|m| m.as_ref().to_path_buf()).collect();
        let first = models
            .first()
            .ok_or_else(|| Error::Invalid("a pipeline needs at least one model".into()))?;
        let manifest_path = overrides
            .manifest
            .clone()
            .or_else(|| Manifest::beside(first));
        let manifest = match &manifest_path {
            Some(m) => Manifest::load(m)?,
            None => Manifest::default(),
        };
        let (options, settings) = merge(&manifest, manifest_path.as_deref(), options, overrides)?;
        Ok(ModelSetup {
            models,
            options,
            settings,
            manifest,
            manifest_path,
        })
    }

    /// The manifest's class names: one per output channel.
    pub fn classes(&self) -> Option<&[String]> {
        self.manifest.classes.as_deref()
    }

    /// The engines (on `options`' devices), the label remapping for their channels, the class
    /// names checked against them.
    pub fn build(&self) -> Result<Pipeline> {
        let engines = self
            .models
            .iter()
            .map(|m| Engine::from_file(m, self.options.clone()))
            .collect::<Result<Vec<_>>>()?;
        let channels = engines[0].graph().output_channels();
        let mpath = self.manifest_path.clone().unwrap_or_default();
        let mut settings = self.settings.clone();
        settings.remap = self
            .manifest
            .remap_table(channels)
            .map_err(|m| Error::model(&mpath, m))?;
        if let Some(c) = self
            .classes()
            .filter(|c| !crate::engine::classes_fit(c.len(), channels))
        {
            return Err(Error::model(
                &mpath,
                format!(
                    "lists {} class(es) but {} has {channels} output channel(s)",
                    c.len(),
                    self.models[0].display()
                ),
            ));
        }
        let mut pipeline = Pipeline::new(engines, settings)?;
        pipeline.set_classes(self.manifest.classes.clone())?;
        Ok(pipeline)
    }
}

/// The merge: an override, else the manifest, else the caller's options (or the default).
fn merge(
    manifest: &Manifest,
    path: Option<&Path>,
    mut options: Options,
    over: &Overrides,
) -> Result<(Options, Settings)> {
    let bad = |m: String| Error::model(path.unwrap_or(Path::new("")), m);
    options.roi = over
        .roi
        .or(manifest.roi.map(|r| r.triple()))
        .or(options.roi);
    options.overlap = over
        .overlap
        .or(manifest.overlap.map(|o| o.triple()))
        .unwrap_or(options.overlap);
    options.blend = match (over.blend, &manifest.blend) {
        (Some(b), _) => b,
        (None, Some(b)) => parse_blend(b).map_err(bad)?,
        (None, None) => options.blend,
    };
    options.axis_order = match (over.axis_order, &manifest.axis_order) {
        (Some(a), _) => a,
        (None, Some(a)) => a.parse::<AxisOrder>()?,
        (None, None) => options.axis_order,
    };
    let intensity = over
        .intensity
        .or(manifest.normalize)
        .unwrap_or(options.normalize);
    intensity.check().map_err(bad)?;
    // Normalised once, before the engines (see `volume::intensity::preprocess`).
    options.normalize = Intensity::None;
    options.placement = over
        .placement
        .or(manifest.placement_mode())
        .unwrap_or(options.placement);
    options.sigma_scale = over
        .sigma_scale
        .or(manifest.sigma_scale_triple())
        .unwrap_or(options.sigma_scale);
    options.pad = over.pad.or(manifest.pad_mode()).unwrap_or(options.pad);
    let mirror = match &over.mirror {
        Some(m) => m.clone(),
        None if manifest.tta_on() => Mirror::Manifest,
        None => Mirror::Off,
    };
    let mirror_axes = match mirror {
        Mirror::Off => Vec::new(),
        Mirror::Manifest => manifest.tta_axes(),
        Mirror::Axes(a) => a,
    };
    let settings = Settings {
        intensity,
        spacing: over.spacing.unwrap_or(manifest.spacing),
        mirror_axes,
        activation: over
            .activation
            .or(manifest.activation)
            .unwrap_or(Activation::Auto),
        remap: None,
        keep_probabilities: over.keep_probabilities,
        keep_logits: over.keep_logits,
        orientation: match over.orientation {
            Some(o) => o,
            None => manifest.orientation().map_err(bad)?.unwrap_or_default(),
        },
    };
    Ok((options, settings))
}
