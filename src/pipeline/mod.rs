//! What a segmentation tool does around the sliding window: normalise, resample to the model's
//! spacing, mirror (TTA) and ensemble several models, average their probabilities, resample back
//! to the input grid, argmax, remap labels; plus the outputs (probabilities, one file per class,
//! preview picture).
//!
//! Built only on [`Engine::segment_array`]: every model run is one sliding-window pass over an
//! (optionally flipped) volume; the averaging happens here on the host.
//!
//! [`Pipeline::from_model`] reads a model's manifest (`NAME.toml` beside `NAME.onnx`) exactly as
//! `voxtile segment` does: both go through [`ModelSetup`].

pub mod manifest;
pub mod orient;
pub mod outputs;
pub mod preview;
pub mod resample;
mod setup;

use crate::engine::{AxisOrder, CancelToken, Engine, Options, Report};
use crate::model::graph::OutputActivation;
use crate::volume::{Header, Orientation, Reorientation, Volume};
use crate::{Error, Result};
pub use manifest::{Activation, Intensity, Manifest};
use ndarray::{Array3, Array4, ArrayView4, Axis, Zip};
use serde::Serialize;
pub use setup::{Mirror, ModelSetup, Overrides};
use std::path::Path;
use std::time::Instant;

/// Settings of the pipeline around the engines (the engines carry the window settings).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Normalisation of the whole volume before resampling.
    pub intensity: Intensity,
    /// Target voxel size in network axes (D,H,W); None: run on the input grid.
    pub spacing: Option<[f64; 3]>,
    /// Network axes to mirror: every subset of them is one pass (2^len passes); empty: no TTA.
    pub mirror_axes: Vec<usize>,
    /// What turns each model's blended output into probabilities before averaging.
    pub activation: Activation,
    /// Output channel → label value.
    pub remap: Option<Vec<u16>>,
    /// Keep the averaged probabilities on the input grid (for `--probabilities`).
    pub keep_probabilities: bool,
    /// Keep the averaged raw outputs on the input grid (for `--logits`).
    pub keep_logits: bool,
    /// The orientation the models run in (see [`orient`]); outputs come back on the input grid.
    pub orientation: Orientation,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            intensity: Intensity::None,
            spacing: None,
            mirror_axes: Vec::new(),
            activation: Activation::Auto,
            remap: None,
            keep_probabilities: false,
            keep_logits: false,
            orientation: Orientation::Stored,
        }
    }
}

/// Extra report fields of a pipeline run (the engine's report of the first pass is flattened in).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelineReport {
    /// The first pass's engine report.
    #[serde(flatten)]
    pub engine: Report,
    /// Models in the ensemble.
    pub models: usize,
    /// Passes run: models × mirror subsets.
    pub passes: usize,
    /// Network axes mirrored (test-time augmentation).
    pub mirror_axes: Vec<usize>,
    /// The normalisation, in words.
    pub normalize: String,
    /// The activation applied before averaging, in words.
    pub activation: String,
    /// Input grid (i,j,k) and the grid the models ran on, when resampled.
    pub input_grid: [usize; 3],
    /// The grid the models ran on (equal to `input_grid` without resampling).
    pub model_grid: [usize; 3],
    /// The voxel size resampled to, when the manifest gives one.
    pub target_spacing: Option<[f64; 3]>,
    /// Seconds per pipeline stage.
    pub pipeline_seconds: PipelineTimes,
    /// The orientation in effect.
    pub orientation: orient::OrientationReport,
}

/// Seconds per pipeline stage, around the engines' own.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelineTimes {
    /// Normalising the input.
    pub normalize: f64,
    /// Resampling the input to the model's spacing.
    pub resample_in: f64,
    /// Sum of the passes (each pass's own stages are in the engine fields of the first pass).
    pub passes: f64,
    /// Averaging, resampling back, labels and remapping.
    pub finalize: f64,
}

/// Labels, probabilities and raw outputs on the input grid, and the engine's report.
type Passed = (
    Array3<u16>,
    Option<Array4<f32>>,
    Option<Array4<f32>>,
    Report,
);

/// The result on the input's (i,j,k) grid.
#[derive(Clone, Debug)]
pub struct Output {
    /// Remapped labels.
    pub labels: Array3<u16>,
    /// (C, i, j, k) averaged probabilities (after the activation), when kept.
    pub probabilities: Option<Array4<f32>>,
    /// (C, i, j, k) averaged raw outputs, when kept.
    pub logits: Option<Array4<f32>>,
    /// One name per output channel (the manifest's `classes`; a one-channel model may list
    /// two, background first), when known.
    pub classes: Option<Vec<String>>,
    /// The input's header: write the outputs with it so they overlay the input.
    pub header: Header,
    /// Times, sizes and settings of the run.
    pub report: PipelineReport,
    /// Input voxels that were NaN (set to 0) or infinite (clamped) before the models.
    pub nonfinite_voxels: usize,
}

/// One or more models (an ensemble) with the settings around them.
///
/// # Examples
///
/// A model and its manifest (`liver.toml` beside `liver.onnx`: window, normalisation,
/// spacing, classes, label values), as `voxtile segment ct.nii.gz -m liver.onnx` runs it:
///
/// ```no_run
/// use voxtile::Pipeline;
///
/// fn main() -> voxtile::Result<()> {
///     let mut pipeline = Pipeline::from_model("liver.onnx")?;
///     let volume = voxtile::volume::read("ct.nii.gz")?;
///     let out = pipeline.run(&volume, &mut |done, total| eprint!("\r{done}/{total} windows"))?;
///     voxtile::volume::write_labels("seg.nii.gz", out.labels.view(), &out.header)?;
///     println!("classes: {:?}", out.classes);
///     Ok(())
/// }
/// ```
///
/// The same with choices that beat the manifest (`--device cpu --tta`):
///
/// ```no_run
/// use voxtile::engine::{Device, Options};
/// use voxtile::pipeline::{Mirror, Overrides, Pipeline};
///
/// let options = Options { device: Device::Cpu, ..Options::default() };
/// let overrides = Overrides { mirror: Some(Mirror::Manifest), ..Overrides::default() };
/// let pipeline = Pipeline::from_model_with("liver.onnx", options, &overrides)?;
/// assert_eq!(pipeline.flip_sets().len(), 8);
/// # Ok::<(), voxtile::Error>(())
/// ```
///
/// Two models averaged, each run on the volume and its mirrors along all three axes:
///
/// ```no_run
/// use voxtile::pipeline::{Pipeline, Settings};
/// use voxtile::{Engine, Options};
///
/// fn main() -> voxtile::Result<()> {
///     let engines = vec![
///         Engine::from_file("fold0.onnx", Options::default())?,
///         Engine::from_file("fold1.onnx", Options::default())?,
///     ];
///     let settings = Settings {
///         mirror_axes: vec![0, 1, 2],
///         ..Settings::default()
///     };
///     let mut pipeline = Pipeline::new(engines, settings)?;
///     let volume = voxtile::volume::read("ct.nii.gz")?;
///     let out = pipeline.run(&volume, &mut |_, _| {})?;
///     voxtile::volume::write_labels("seg.nii.gz", out.labels.view(), &out.header)?;
///     Ok(())
/// }
/// ```
pub struct Pipeline {
    engines: Vec<Engine>,
    settings: Settings,
    channels: usize,
}

impl Pipeline {
    /// [`Engine::release_devices`] for every engine: the threads to join.
    pub(crate) fn release_devices(&mut self) -> Vec<std::thread::JoinHandle<()>> {
        self.engines
            .iter_mut()
            .filter_map(Engine::release_devices)
            .collect()
    }

    /// A model with its manifest applied as `voxtile segment` applies it: `NAME.toml` or
    /// `NAME.json` beside `NAME.onnx` (window, overlap, blend, axis order, normalisation,
    /// spacing, activation, classes, label remapping); on `Device::Auto`, no mirroring.
    pub fn from_model(model: impl AsRef<Path>) -> Result<Pipeline> {
        Pipeline::from_model_with(model, Options::default(), &Overrides::default())
    }

    /// [`Pipeline::from_model`] on `options` (device, batch, memory budget...), with
    /// `overrides` beating the manifest (a command line's typed flags).
    pub fn from_model_with(
        model: impl AsRef<Path>,
        options: Options,
        overrides: &Overrides,
    ) -> Result<Pipeline> {
        ModelSetup::new(&[model.as_ref()], options, overrides)?.build()
    }

    /// Every engine must take the same input channels, give the same output channels and use the
    /// same axis order (the averaging is voxel by voxel).
    pub fn new(engines: Vec<Engine>, settings: Settings) -> Result<Pipeline> {
        let first = engines
            .first()
            .ok_or_else(|| Error::Invalid("a pipeline needs at least one model".into()))?;
        let (cin, cout) = (
            first.graph().input_channels(),
            first.graph().output_channels(),
        );
        let order = first.options().axis_order;
        for (i, e) in engines.iter().enumerate().skip(1) {
            if e.graph().input_channels() != cin || e.graph().output_channels() != cout {
                return Err(Error::Invalid(format!(
                    "ensemble: model {} maps {} channel(s) to {}, model 1 maps {cin} to {cout}",
                    i + 1,
                    e.graph().input_channels(),
                    e.graph().output_channels()
                )));
            }
            if e.options().axis_order != order {
                return Err(Error::Invalid(
                    "ensemble: every model must use the same axis order".into(),
                ));
            }
        }
        if settings.mirror_axes.iter().any(|&a| a > 2) {
            return Err(Error::Invalid(format!(
                "mirror axes are network axes 0, 1, 2; got {:?}",
                settings.mirror_axes
            )));
        }
        if let Some(r) = &settings.remap {
            if r.len() != cout {
                return Err(Error::Invalid(format!(
                    "the label remapping lists {} channel(s) but the model has {cout}",
                    r.len()
                )));
            }
        }
        Ok(Pipeline {
            engines,
            settings,
            channels: cout,
        })
    }

    /// The models' engines, in ensemble order.
    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }
    /// The class names results carry (the first model's, set on every engine).
    pub fn classes(&self) -> Option<&[String]> {
        self.engines[0].classes()
    }
    /// Name the output channels of every model (None: unnamed); one name per channel.
    pub fn set_classes(&mut self, classes: Option<Vec<String>>) -> Result<()> {
        for e in self.engines.iter_mut() {
            e.set_classes(classes.clone())?;
        }
        Ok(())
    }
    /// A token that cancels this pipeline's runs from any thread: [`Pipeline::run`] then
    /// returns `Error::Cancelled` at its next check (before each batch of windows, between
    /// passes). Engines built from one `Options` share it; otherwise it is the first model's.
    pub fn cancel_token(&self) -> CancelToken {
        self.engines[0].cancel_token()
    }
    /// Whether any engine's token was cancelled: `Error::Cancelled` if so.
    fn check_cancel(&self) -> Result<()> {
        self.engines
            .iter()
            .try_for_each(|e| e.options().cancel.check())
    }
    /// The settings around the engines.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    /// Channels every model outputs.
    pub fn output_channels(&self) -> usize {
        self.channels
    }
    /// Channels every model takes.
    pub fn input_channels(&self) -> usize {
        self.engines[0].graph().input_channels()
    }

    /// The activation actually applied to each model's output.
    pub fn effective_activation(&self) -> Activation {
        effective_activation(
            self.settings.activation,
            self.engines[0].graph().output_activation(),
            self.channels,
        )
    }

    /// The flip sets of the passes, in file axes (i,j,k = 0,1,2): every subset of the mirror axes.
    pub fn flip_sets(&self) -> Vec<Vec<usize>> {
        let order = self.engines[0].options().axis_order;
        let mut axes: Vec<usize> = self
            .settings
            .mirror_axes
            .iter()
            .map(|&a| match order {
                AxisOrder::Xyz => a,
                AxisOrder::Zyx => 2 - a,
            })
            .collect();
        axes.sort_unstable();
        axes.dedup();
        (0..1usize << axes.len())
            .map(|m| {
                (0..axes.len())
                    .filter(|b| m >> b & 1 == 1)
                    .map(|b| axes[b])
                    .collect()
            })
            .collect()
    }

    /// Segment a volume; `progress(done, total)` counts windows over all passes.
    pub fn run(
        &mut self,
        volume: &Volume,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        self.run_array(volume.data.view(), &volume.header, progress)
    }

    /// [`Pipeline::run`] on `(channel, i, j, k)` data held by the caller (a NumPy array, in any
    /// memory layout) and the header giving its geometry ([`Header::new`], [`Header::set_affine`]).
    /// The data is read in place unless something has to change it: normalisation, NaN or
    /// infinite voxels (then it is copied first, as [`Pipeline::run`] copies a volume).
    pub fn run_array(
        &mut self,
        data: ArrayView4<f32>,
        header: &Header,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        self.check_channels(data.shape()[0])?;
        let t = Instant::now();
        let untouched = self.settings.intensity == Intensity::None && all_finite(data);
        if untouched {
            return self.run_view(data, header, (0, t.elapsed().as_secs_f64()), progress);
        }
        let mut owned = crate::sys::alloc::try_to_owned(data, "the normalised volume")?;
        let nonfinite = crate::volume::intensity::preprocess(&mut owned, &self.settings.intensity)?;
        let normalize = t.elapsed().as_secs_f64();
        self.run_view(owned.view(), header, (nonfinite, normalize), progress)
    }

    /// Keep (or drop) the averaged probabilities and raw outputs of later runs
    /// ([`Output::probabilities`], [`Output::logits`]).
    pub fn set_keep_outputs(&mut self, probabilities: bool, logits: bool) {
        self.settings.keep_probabilities = probabilities;
        self.settings.keep_logits = logits;
    }

    /// The volume's channels against the models'.
    fn check_channels(&self, got: usize) -> Result<()> {
        let expected = self.input_channels();
        if got != expected {
            return Err(Error::ChannelMismatch {
                expected,
                got,
                input: None,
                model: self.engines[0].model_path().map(Path::to_path_buf),
            });
        }
        Ok(())
    }

    /// The grid (i,j,k) the models run on for an input of `header`: the input's, turned to the
    /// settings' orientation, resampled to their spacing.
    pub fn model_grid(&self, header: &Header) -> Result<[usize; 3]> {
        let turned = self.reorientation(header)?.header(header);
        self.grid_on(&turned)
    }

    /// How an input of `header` is turned to the settings' orientation (identity: stored).
    pub fn reorientation(&self, header: &Header) -> Result<Reorientation> {
        Reorientation::to(&header.affine(), self.settings.orientation).map_err(Error::Invalid)
    }

    /// The grid the models run on for an input of `header` already in the models' orientation.
    fn grid_on(&self, header: &Header) -> Result<[usize; 3]> {
        let order = self.engines[0].options().axis_order;
        resample::model_grid(header, order, self.settings.spacing)
    }

    /// One pass on the input grid: its labels are the engine's own, and only the outputs asked
    /// for are kept. Otherwise every pass keeps its blended outputs for the average.
    fn single_pass(&self, model_grid: [usize; 3], input_grid: [usize; 3]) -> bool {
        self.engines.len() * self.flip_sets().len() == 1 && model_grid == input_grid
    }

    /// Whether the engines keep their blended outputs for a run on `model_grid`.
    fn set_keep(&mut self, single: bool) {
        let keep = !single || self.settings.keep_logits || self.settings.keep_probabilities;
        for e in self.engines.iter_mut() {
            e.set_keep_logits(keep);
        }
    }

    /// Prepare every engine for a volume of `header` before its data is there (the CLI does it
    /// while the file is read and normalised). Nothing to do when the volume is resampled.
    pub fn prepare_for(&mut self, header: &Header) -> Result<()> {
        let header = &self.reorientation(header)?.header(header);
        let (input_grid, model_grid) = (header.shape(), self.grid_on(header)?);
        if model_grid != input_grid {
            return Ok(());
        }
        self.set_keep(self.single_pass(model_grid, input_grid));
        for e in self.engines.iter_mut() {
            let net = e.options().axis_order.network(input_grid);
            e.prepare_for(net)?;
        }
        Ok(())
    }

    /// [`Pipeline::run`] on a volume already through [`crate::volume::intensity::preprocess`]; `pre`: its
    /// non-finite voxel count and the seconds that took. The volume is turned to the settings'
    /// orientation first (a copy) and every output turned back onto its grid.
    pub fn run_preprocessed(
        &mut self,
        volume: &Volume,
        pre: (usize, f64),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        self.run_view(volume.data.view(), &volume.header, pre, progress)
    }

    /// [`Pipeline::run_preprocessed`] on data and its header apart.
    fn run_view(
        &mut self,
        data: ArrayView4<f32>,
        header: &Header,
        pre: (usize, f64),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        self.check_channels(data.shape()[0])?;
        let reo = self.reorientation(header)?;
        let mut out = if reo.is_identity() {
            self.run_on_grid(data, header, pre, progress)?
        } else {
            let turned = orient::turn(data, header, &reo)?;
            let out = self.run_on_grid(turned.data.view(), &turned.header, pre, progress)?;
            drop(turned);
            orient::turn_back(out, &reo, header)?
        };
        out.report.orientation =
            orient::OrientationReport::new(self.settings.orientation, header, &reo);
        Ok(out)
    }

    /// [`Pipeline::run_view`] on data already in the models' orientation.
    fn run_on_grid(
        &mut self,
        volume: ArrayView4<f32>,
        header: &Header,
        pre: (usize, f64),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        let (nonfinite, normalize) = pre;
        let mut times = PipelineTimes {
            normalize,
            ..Default::default()
        };
        let input_grid = [1, 2, 3].map(|a| volume.shape()[a]);
        let model_grid = self.grid_on(header)?;
        let single = self.single_pass(model_grid, input_grid);
        self.set_keep(single);
        let t = Instant::now();
        let resampled;
        let data = if model_grid != input_grid {
            // The input and the models' outputs both live on the model grid.
            resample::check_grid(model_grid, self.input_channels() + self.channels)?;
            resampled = resample::resample(volume, model_grid)?;
            resampled.view()
        } else {
            volume
        };
        times.resample_in = t.elapsed().as_secs_f64();
        let act = self.effective_activation();
        let (mut labels, probabilities, logits, mut report) = if single {
            self.one_pass(data, act, &mut times, progress)?
        } else {
            self.averaged(data, model_grid, input_grid, act, &mut times, progress)?
        };
        self.check_cancel()?;
        let t = Instant::now();
        if let Some(table) = &self.settings.remap {
            labels.mapv_inplace(|l| table.get(l as usize).copied().unwrap_or(l));
        }
        times.finalize += t.elapsed().as_secs_f64();

        report.spacing = header.spacing();
        report.nonfinite_voxels = nonfinite;
        report.seconds.total = times.normalize + times.resample_in + times.passes + times.finalize;
        report.peak_host_bytes = crate::engine::peak_rss_bytes();
        let report = PipelineReport {
            engine: report,
            models: self.engines.len(),
            passes: self.engines.len() * self.flip_sets().len(),
            mirror_axes: self.settings.mirror_axes.clone(),
            normalize: manifest::describe_intensity(&self.settings.intensity),
            activation: format!("{act:?}").to_lowercase(),
            input_grid,
            model_grid,
            target_spacing: self.settings.spacing,
            pipeline_seconds: times,
            orientation: Default::default(),
        };
        Ok(Output {
            labels,
            probabilities,
            logits,
            classes: self.classes().map(<[String]>::to_vec),
            header: header.clone(),
            report,
            nonfinite_voxels: nonfinite,
        })
    }

    /// One pass on the input grid: the engine's labels, its outputs only where asked for
    /// (probabilities: activated).
    fn one_pass(
        &mut self,
        data: ArrayView4<f32>,
        act: Activation,
        times: &mut PipelineTimes,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Passed> {
        let seg = self.engines[0].segment_array(data, progress)?;
        let (labels, report) = (seg.labels, seg.report);
        times.passes = report.seconds.total;
        let t = Instant::now();
        let (keep_p, keep_l) = (self.settings.keep_probabilities, self.settings.keep_logits);
        let activated = |mut p: Array4<f32>| {
            apply_activation(&mut p, act);
            p
        };
        let (probabilities, logits) = match (keep_p, keep_l, seg.logits) {
            (true, true, Some(out)) => (
                Some(activated(crate::sys::alloc::try_to_owned(
                    out.view(),
                    "the probabilities",
                )?)),
                Some(out),
            ),
            (true, false, Some(out)) => (Some(activated(out)), None),
            (false, true, Some(out)) => (None, Some(out)),
            (false, false, _) => (None, None),
            (_, _, None) => return Err(kept_nothing()),
        };
        times.finalize = t.elapsed().as_secs_f64();
        Ok((labels, probabilities, logits, report))
    }

    /// Every pass, averaged, resampled back to the input grid; labels of the average.
    fn averaged(
        &mut self,
        data: ArrayView4<f32>,
        model_grid: [usize; 3],
        input_grid: [usize; 3],
        act: Activation,
        times: &mut PipelineTimes,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Passed> {
        let (probs, logits, report) = self.passes(data, progress)?;
        times.passes = report.seconds.total;
        let t = Instant::now();
        let thr = if act == Activation::None
            && self.engines[0].graph().output_activation() == OutputActivation::None
        {
            0.0
        } else {
            0.5
        };
        let (labels, probabilities) =
            finalize(probs, input_grid, thr, self.settings.keep_probabilities)?;
        let logits = match logits {
            Some(l) if model_grid != input_grid => Some(resample::resample(l.view(), input_grid)?),
            l => l,
        };
        times.finalize = t.elapsed().as_secs_f64();
        Ok((labels, probabilities, logits, report))
    }

    /// Every model on every flip of `data` (C, i, j, k, already normalised and resampled):
    /// the average of the activated outputs, optionally of the raw outputs, and the report of
    /// the first pass with compute/blend summed over passes.
    pub fn passes(
        &mut self,
        data: ArrayView4<f32>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(Array4<f32>, Option<Array4<f32>>, Report)> {
        let flips = self.flip_sets();
        let act = self.effective_activation();
        let npass = self.engines.len() * flips.len();
        let keep_raw = self.settings.keep_logits;
        let mut acc: Option<Array4<f32>> = None;
        let mut acc_raw: Option<Array4<f32>> = None;
        let mut first: Option<Report> = None;
        let (mut compute, mut blend) = (0.0, 0.0);
        let t0 = Instant::now();
        let mut pass = 0usize;
        for engine in self.engines.iter_mut() {
            // The average needs every pass's blended outputs.
            engine.set_keep_logits(true);
            for flip in &flips {
                let flipped;
                let input = if flip.is_empty() {
                    data
                } else {
                    flipped = flip_owned(data, flip)?;
                    flipped.view()
                };
                let base = pass;
                engine.set_mirrored([0, 1, 2].map(|a| flip.contains(&a)));
                let seg =
                    engine.segment_array(input, &mut |d, t| progress(base * t + d, npass * t));
                engine.set_mirrored([false; 3]);
                let seg = seg?;
                let (out, rep) = (seg.logits.ok_or_else(kept_nothing)?, seg.report);
                compute += rep.seconds.compute;
                blend += rep.seconds.blend;
                let mut out = if flip.is_empty() {
                    out
                } else {
                    flip_owned(out.view(), flip)?
                };
                if keep_raw {
                    match &mut acc_raw {
                        Some(a) => *a += &out,
                        None => {
                            acc_raw = Some(crate::sys::alloc::try_to_owned(
                                out.view(),
                                "the averaged raw outputs",
                            )?)
                        }
                    }
                }
                apply_activation(&mut out, act);
                accumulate(&mut acc, out);
                first.get_or_insert(rep);
                pass += 1;
            }
        }
        let inv = 1.0 / npass as f32;
        let mut acc = acc.expect("at least one pass");
        if npass > 1 {
            acc.mapv_inplace(|v| v * inv);
            if let Some(r) = &mut acc_raw {
                r.mapv_inplace(|v| v * inv);
            }
        }
        let mut report = first.expect("at least one pass");
        report.seconds.compute = compute;
        report.seconds.blend = blend;
        report.seconds.total = t0.elapsed().as_secs_f64();
        Ok((acc, acc_raw, report))
    }
}

/// Whether every value is finite (in parallel: a 512²×128 volume is scanned in a few ms).
pub fn all_finite(data: ArrayView4<f32>) -> bool {
    Zip::from(&data).par_fold(|| true, |ok, v| ok && v.is_finite(), |a, b| a && b)
}

/// An engine asked to keep its blended outputs returned none (a backend bug, said as an error).
fn kept_nothing() -> Error {
    Error::Backend("the engine returned no blended outputs although asked to keep them".into())
}

/// Auto: softmax for raw multi-channel outputs, sigmoid for one raw channel, none when the graph
/// already applies one.
pub fn effective_activation(
    wanted: Activation,
    graph: OutputActivation,
    channels: usize,
) -> Activation {
    match wanted {
        Activation::Auto if graph != OutputActivation::None => Activation::None,
        Activation::Auto if channels == 1 => Activation::Sigmoid,
        Activation::Auto => Activation::Softmax,
        a => a,
    }
}

/// Add one pass's outputs to the running sum; the first pass becomes the sum.
fn accumulate(acc: &mut Option<Array4<f32>>, x: Array4<f32>) {
    match acc {
        Some(a) => *a += &x,
        None => *acc = Some(x),
    }
}

/// A standard-layout copy of (C, i, j, k) data mirrored along the given file axes (0..3).
pub fn flip_owned(data: ArrayView4<f32>, axes: &[usize]) -> Result<Array4<f32>> {
    let mut v = data;
    for &a in axes {
        v.invert_axis(Axis(a + 1));
    }
    crate::sys::alloc::try_to_owned(v, "a mirrored volume")
}

/// Softmax over channels or elementwise sigmoid, in place (channel-plane passes, vectorisable).
pub fn apply_activation(x: &mut Array4<f32>, act: Activation) {
    match act {
        Activation::None | Activation::Auto => {}
        Activation::Sigmoid => x.mapv_inplace(|v| 1.0 / (1.0 + (-v).exp())),
        Activation::Softmax => {
            let mut max = x.index_axis(Axis(0), 0).to_owned();
            for ch in x.outer_iter().skip(1) {
                Zip::from(&mut max).and(&ch).for_each(|m, &v| *m = m.max(v));
            }
            let mut sum = Array3::<f32>::zeros(max.raw_dim());
            for mut ch in x.outer_iter_mut() {
                Zip::from(&mut ch)
                    .and(&mut sum)
                    .and(&max)
                    .for_each(|v, s, &m| {
                        *v = (*v - m).exp();
                        *s += *v;
                    });
            }
            for mut ch in x.outer_iter_mut() {
                Zip::from(&mut ch).and(&sum).for_each(|v, &s| *v /= s);
            }
        }
    }
}

/// Resample the averaged outputs to the input grid channel by channel and take labels (argmax, or
/// `thr` on a single channel) without holding a second full (C, i, j, k) array unless `keep`.
pub fn finalize(
    probs: Array4<f32>,
    grid: [usize; 3],
    thr: f32,
    keep: bool,
) -> Result<(Array3<u16>, Option<Array4<f32>>)> {
    let c = probs.shape()[0];
    let same = [probs.shape()[1], probs.shape()[2], probs.shape()[3]] == grid;
    if same {
        let labels = if c == 1 {
            crate::tiling::threshold(probs.view(), thr)?
        } else {
            crate::tiling::argmax(probs.view())?
        };
        return Ok((labels, keep.then_some(probs)));
    }
    use crate::sys::alloc::{try_full, try_zeros};
    let mut labels = try_zeros::<u16, _>(grid, "the labels")?;
    let mut best = try_full(grid, f32::NEG_INFINITY, "the best class scores")?;
    let mut kept = match keep {
        true => Some(try_zeros::<f32, _>(
            (c, grid[0], grid[1], grid[2]),
            "the probabilities",
        )?),
        false => None,
    };
    for ci in 0..c {
        let one = probs.slice(ndarray::s![ci..ci + 1, .., .., ..]);
        let r = resample::resample(one, grid)?;
        let r = r.index_axis(Axis(0), 0);
        if c == 1 {
            Zip::from(&mut labels)
                .and(&r)
                .for_each(|l, &v| *l = (v > thr) as u16);
        } else {
            // Strictly greater: ties keep the lower channel, as tiling::argmax does.
            Zip::from(&mut labels)
                .and(&mut best)
                .and(&r)
                .for_each(|l, b, &v| {
                    if v > *b {
                        *b = v;
                        *l = ci as u16;
                    }
                });
        }
        if let Some(k) = &mut kept {
            k.index_axis_mut(Axis(0), ci).assign(&r);
        }
    }
    Ok((labels, kept))
}
