//! The loop: plan windows, run the pass on every device, retry a smaller batch when memory runs
//! out, put the report together.
//!
//! An [`Engine`] runs one model on arrays or volumes as they are; [`crate::Pipeline`] adds the
//! model's manifest around it (normalisation, resampling, mirroring, label values).
//!
//! The engine sees backends only through [`crate::backend::Backend`] (opened by
//! [`crate::backend::open`]): each backend runs the sliding-window pass its own way (the CPU
//! gathers batches on the host and blends them; CUDA streams the whole window list through the
//! device), and plans through its own [`crate::backend::MemoryModel`].

mod bands;
mod classes;
mod options;
mod parts;
mod report;
mod run;
mod split;
mod start;

pub use crate::backend::Device;
pub use crate::sys::cancel::CancelToken;
use crate::volume::intensity::{self, Intensity};
pub use classes::{class_name, classes_fit};
pub use options::{AxisOrder, Options};
pub use report::{
    class_volumes, class_volumes_of, label_counts, peak_rss_bytes, voxel_ml, ClassVolume,
    FileDigest, PartReport, PredictedPeak, Report, StageTimes,
};

use crate::backend::{DeviceVolume, MemoryModel, VolumeRef};
use crate::model::Graph;
use crate::plan;
use crate::tiling::Grid;
use crate::volume::{Header, Volume};
use crate::{Error, Result};
use ndarray::{Array3, Array4, ArrayView4};
use parts::Worker;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What [`Engine::segment_array`] and [`Engine::segment`] return: labels on the input's (i,j,k)
/// grid, the blended outputs when asked for, the class names and the run's report.
#[derive(Clone, Debug)]
pub struct Segmentation {
    /// Labels `(i, j, k)`: 0 for background (or a NaN network output), else the class index.
    pub labels: Array3<u16>,
    /// (channel, i, j, k) blended network outputs (probabilities when the graph ends in Softmax
    /// or Sigmoid, else logits) when `Options::keep_logits`; None otherwise, and then they were
    /// never held whole.
    pub logits: Option<Array4<f32>>,
    /// One name per output channel ([`classes_fit`]: a one-channel model may list two), when
    /// the engine was given them ([`Engine::set_classes`], or the manifest through
    /// [`crate::Pipeline::from_model`]).
    pub classes: Option<Vec<String>>,
    /// The input volume's header ([`Engine::segment`]): write the outputs with it so they
    /// overlay the input. None for an array, which has no geometry.
    pub header: Option<Header>,
    /// Times, sizes and the planner's prediction for this run.
    pub report: Report,
}

/// A model bound to one backend per device, ready to segment volumes.
///
/// The engine runs the model on the data as given; a model's manifest (normalisation,
/// resampling, label values) is applied by [`crate::Pipeline`].
///
/// # Examples
///
/// An array in memory, `(channel, i, j, k)`, on the CPU with a fixed window:
///
/// ```no_run
/// use ndarray::Array4;
/// use voxtile::engine::{Device, Engine, Options};
///
/// fn main() -> voxtile::Result<()> {
///     let options = Options {
///         device: Device::Cpu,
///         roi: Some([96, 96, 96]),
///         ..Options::default()
///     };
///     let mut engine = Engine::from_file("net.onnx", options)?;
///     let image = Array4::<f32>::zeros((1, 160, 160, 96));
///     let seg = engine.segment_array(image.view(), &mut |_, _| {})?;
///     assert_eq!(seg.labels.shape(), &[160, 160, 96]);
///     assert!(seg.logits.is_none()); // not asked for: Options::keep_logits
///     println!("{} windows on {}", seg.report.windows, engine.device_name());
///     Ok(())
/// }
/// ```
///
/// A graph built in memory (no file), run on a hand-made input:
///
/// ```
/// use ndarray::Array4;
/// use voxtile::engine::{Device, Engine, Options};
/// use voxtile::model::graph::{Conv, Graph, Node, Op, Tensor, Value};
///
/// // One 1x1x1 convolution, 1 -> 2 channels: channel 1 wins where the input is positive.
/// let conv = Conv {
///     weight: Tensor::new(vec![2, 1, 1, 1, 1], vec![-1.0, 1.0]),
///     bias: None,
///     stride: [1; 3],
///     dilation: [1; 3],
///     pads: [0; 6],
///     groups: 1,
/// };
/// let value = |name: &str, channels| Value { name: name.into(), channels };
/// let graph = Graph {
///     name: "sign".into(),
///     values: vec![value("x", 1), value("y", 2)],
///     nodes: vec![Node { name: "conv".into(), op: Op::Conv(conv), inputs: vec![0], output: 1 }],
///     input: 0,
///     output: 1,
///     fixed_input_spatial: [None; 3],
/// };
/// let options = Options { device: Device::Cpu, roi: Some([4, 4, 4]), ..Options::default() };
/// let mut engine = Engine::new(graph, options)?;
/// let image = Array4::from_shape_fn((1, 6, 5, 4), |(_, i, _, _)| i as f32 - 2.5);
/// let seg = engine.segment_array(image.view(), &mut |_, _| {})?;
/// assert_eq!(seg.labels[[0, 0, 0]], 0);
/// assert_eq!(seg.labels[[5, 4, 3]], 1);
/// # Ok::<(), voxtile::Error>(())
/// ```
pub struct Engine {
    graph: Graph,
    options: Options,
    /// The ONNX file, named in errors.
    model_path: Option<PathBuf>,
    /// One name per output channel, copied into each result.
    classes: Option<Vec<String>>,
    /// One per device; several share each volume (see [`split`]).
    workers: Vec<Worker>,
    device_name: String,
    /// Budget bytes and where they came from.
    budget: (u64, String),
    /// Plan warnings already said: each once per engine, not once per volume or TTA pass.
    warned: std::collections::HashSet<String>,
    /// The last pass's blend weights and what they were made for (a 128³ map costs ~20 ms:
    /// not paid again per volume or TTA pass with the same settings).
    pass_weights: Option<(run::WeightsKey, std::sync::Arc<ndarray::Array3<f32>>)>,
    /// The last plan and what it answered (a few ms each: the arena layouts it tries): the
    /// CLI plans before reading, then again in the pass, and a benchmark or TTA pass plans the
    /// same request per volume.
    last_plan: std::sync::Mutex<Option<(plan::Request, plan::Plan)>>,
}

/// Refuse a device list that mixes the CPU and CUDA (one volume's parts must run the same
/// arithmetic) or names `auto`.
fn check_devices(list: &[Device]) -> Result<()> {
    if list.len() > 1 {
        if list.contains(&Device::Auto) {
            return Err(Error::Invalid(
                "a device list takes cpu or cuda:N entries, not auto".into(),
            ));
        }
        let cuda = list.iter().filter(|d| matches!(d, Device::Cuda(_))).count();
        if cuda != 0 && cuda != list.len() {
            return Err(Error::Invalid(format!(
                "devices {list:?} mix the CPU and CUDA: one volume's parts must run the same arithmetic"
            )));
        }
    }
    Ok(())
}

/// The default budget of several devices: the smallest of their own, a device listed twice
/// sharing its memory among its workers.
fn default_budget(workers: &[Worker], opened: &[Device]) -> (u64, String) {
    let budgets = workers.iter().zip(opened).map(|(w, &dev)| {
        let (b, src) = w.backend.memory().default_budget();
        let share = opened.iter().filter(|&&o| o == dev).count() as u64;
        if share > 1 {
            (b / share, format!("{src}, shared by {share} workers"))
        } else {
            (b, src)
        }
    });
    let (b, src) = budgets.min_by_key(|b| b.0).expect("one device at least");
    if opened.len() > 1 {
        (
            b,
            format!("{src} (the smallest of {} devices)", opened.len()),
        )
    } else {
        (b, src)
    }
}

impl Engine {
    /// Load an ONNX model and choose the backend. The devices open on a thread of their own while
    /// the model loads (a CPU alone: after it); the errors are those of loading first and then
    /// opening (see `start`). The model's manifest is not read: see
    /// [`crate::Pipeline::from_model`].
    pub fn from_file(model: impl AsRef<Path>, options: Options) -> Result<Engine> {
        let concurrent = start::worth_a_thread(&options.devices());
        Engine::load_and_open(model.as_ref(), options, concurrent)
    }

    /// [`Engine::from_file`], the devices opening on a thread of their own (`concurrent`) or
    /// after the load.
    fn load_and_open(model: &Path, options: Options, concurrent: bool) -> Result<Engine> {
        let list = options.devices();
        let load = || {
            let t = Instant::now();
            let graph = crate::model::onnx::load(model)?;
            tracing::debug!(
                "model {} loaded in {:.0} ms",
                model.display(),
                t.elapsed().as_secs_f64() * 1e3
            );
            graph.validate().map_err(|e| e.with_model(model))?;
            Ok(graph)
        };
        let (graph, opened) =
            start::load_and_open(&list, concurrent, load).map_err(|e| e.with_model(model))?;
        let mut engine = Engine::with_devices(graph, options, opened);
        engine.model_path = Some(model.to_path_buf());
        Ok(engine)
    }

    /// Bind a loaded graph; `Device::Auto` falls back to the CPU with a message on stderr.
    /// Several devices (`Options::extra_devices`) each get a backend prepared with the same plan,
    /// made under the smallest of their budgets (a device listed twice shares its memory).
    pub fn new(graph: Graph, options: Options) -> Result<Engine> {
        graph.validate()?;
        let opened = start::open_all(&options.devices())?;
        Ok(Engine::with_devices(graph, options, opened))
    }

    /// The engine of a validated graph on opened devices.
    fn with_devices(graph: Graph, options: Options, opened: start::Opened) -> Engine {
        let start::Opened { workers, devices } = opened;
        let device_name = workers
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let mut options = options;
        let budget = match options.memory_budget {
            Some(b) => (b, "--memory-budget".to_string()),
            None => default_budget(&workers, &devices),
        };
        let on_cpu = workers[0].backend.memory().target() == plan::Target::Cpu;
        if options.inject_oom.is_none() && on_cpu {
            options.inject_oom = std::env::var("VOXTILE_INJECT_OOM")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0);
        }
        Engine {
            graph,
            options,
            model_path: None,
            classes: None,
            workers,
            device_name,
            budget,
            warned: Default::default(),
            pass_weights: None,
            last_plan: Default::default(),
        }
    }

    /// The loaded model.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The options it runs with.
    pub fn options(&self) -> &Options {
        &self.options
    }
    /// Keep (or drop) the blended outputs of later runs: ensembles and TTA average them.
    pub fn set_keep_logits(&mut self, keep: bool) {
        self.options.keep_logits = keep;
    }
    /// Later runs get the volume mirrored along these file axes (see [`Options::mirrored`]).
    pub fn set_mirrored(&mut self, axes: [bool; 3]) {
        self.options.mirrored = axes;
    }
    /// The file the model was loaded from ([`Engine::from_file`]).
    pub fn model_path(&self) -> Option<&Path> {
        self.model_path.as_deref()
    }
    /// The class names results carry: one per output channel (a one-channel model: one, or
    /// two with the background first; see [`class_name`]).
    pub fn classes(&self) -> Option<&[String]> {
        self.classes.as_deref()
    }
    /// Name the output channels (None: unnamed); refused unless they fit ([`classes_fit`]).
    pub fn set_classes(&mut self, classes: Option<Vec<String>>) -> Result<()> {
        let cout = self.graph.output_channels();
        if let Some(c) = classes.as_ref().filter(|c| !classes_fit(c.len(), cout)) {
            return Err(Error::Invalid(format!(
                "{} class name(s) for a model of {cout} output channel(s)",
                c.len()
            )));
        }
        self.classes = classes;
        Ok(())
    }
    /// A token that cancels this engine's runs from any thread (a clone of `Options::cancel`).
    pub fn cancel_token(&self) -> CancelToken {
        self.options.cancel.clone()
    }
    /// The devices' names, joined by " + ".
    pub fn device_name(&self) -> &str {
        &self.device_name
    }
    /// Whether the (first) device is a CUDA one.
    pub fn is_cuda(&self) -> bool {
        self.memory().target() == plan::Target::Cuda
    }
    /// How many devices share each volume.
    pub fn device_count(&self) -> usize {
        self.workers.len()
    }

    /// The memory model the planner asks: the first device's (all devices run the same
    /// arithmetic and share one plan).
    fn memory(&self) -> &dyn MemoryModel {
        self.workers[0].backend.memory()
    }

    /// The window size used for a volume of network-axis shape `shape` (the planner's choice).
    pub fn roi_for(&self, shape: [usize; 3]) -> Result<[usize; 3]> {
        Ok(self.plan_for(shape)?.roi)
    }

    /// Segment a volume (`Options::normalize` applied, non-finite voxels cleaned); the labels
    /// come back on the file's (i,j,k) grid with the volume's header.
    pub fn segment(&mut self, volume: &Volume) -> Result<Segmentation> {
        self.segment_with_progress(volume, &mut |_, _| {})
    }

    /// As [`Engine::segment`], calling `progress(done, total)` after each batch of windows.
    pub fn segment_with_progress(
        &mut self,
        volume: &Volume,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Segmentation> {
        self.check_channels(volume.data.shape()[0])?;
        let t0 = Instant::now();
        let mut nonfinite = 0;
        let owned;
        let has_nonfinite = volume.data.iter().any(|v| !v.is_finite());
        let data = if has_nonfinite || self.options.normalize != Intensity::None {
            let mut d = volume.data.clone();
            nonfinite = intensity::preprocess(&mut d, &self.options.normalize)?;
            owned = d;
            owned.view()
        } else {
            volume.data.view()
        };
        let mut seg = self.segment_array(data, progress)?;
        seg.report.spacing = volume.header.spacing();
        seg.report.nonfinite_voxels = nonfinite;
        seg.report.seconds.total = t0.elapsed().as_secs_f64();
        seg.header = Some(volume.header.clone());
        Ok(seg)
    }

    /// The core on ndarray: `data` is (channel, i, j, k), already normalised; the labels come
    /// back on the same grid. Without `Options::keep_logits` the blended outputs are never held
    /// whole (finished slabs become labels at once) and `logits` is None.
    ///
    /// The window and batch come from the memory planner (see [`crate::plan::choose`]). A pass
    /// that runs out of memory is redone over the whole volume at half the batch (said in the
    /// report); at batch 1 the out-of-memory error goes up: the window is never changed behind
    /// the user's back (a smaller window changes the result). `progress(done, total)` is called
    /// after each batch of windows; `Options::cancel` is checked before each.
    pub fn segment_array(
        &mut self,
        data: ArrayView4<f32>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Segmentation> {
        self.segment_input(data.into(), progress)
    }

    /// [`Engine::segment_array`] on a volume in CUDA device memory (a PyTorch tensor's, through
    /// DLPack): the windows are gathered from it on the device, never copied to the host. The
    /// engine must run on that device alone; the labels and kept outputs come back to the host.
    /// Its values are read as they are: no check for NaN or infinite voxels (a NaN output is
    /// counted in the report, as for any input).
    pub fn segment_device(
        &mut self,
        volume: DeviceVolume,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Segmentation> {
        if !self.is_cuda() {
            return Err(Error::Invalid(format!(
                "the volume is in CUDA device {}'s memory but the model runs on {}: use device=\"cuda:{}\" or pass host data",
                volume.device(),
                self.device_name,
                volume.device()
            )));
        }
        self.segment_input(VolumeRef::Device(volume), progress)
    }

    /// [`Engine::segment_array`] on a volume wherever it lives.
    fn segment_input(
        &mut self,
        data: VolumeRef,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Segmentation> {
        self.check_channels(data.shape()[0])?;
        self.options.cancel.check()?;
        let (labels, logits, report) = self
            .run_input(data, progress)
            .map_err(|e| self.name_error(e))?;
        // A cancel that lands after the last batch still wins: the caller asked for nothing.
        self.options.cancel.check()?;
        Ok(Segmentation {
            labels,
            logits,
            classes: self.classes.clone(),
            header: None,
            report,
        })
    }

    /// The volume's channels against the model's.
    fn check_channels(&self, got: usize) -> Result<()> {
        let expected = self.graph.input_channels();
        if got != expected {
            return Err(Error::ChannelMismatch {
                expected,
                got,
                input: None,
                model: self.model_path.clone(),
            });
        }
        Ok(())
    }

    /// The model file named in the typed errors that lack it.
    fn name_error(&self, e: Error) -> Error {
        match &self.model_path {
            Some(p) => e.with_model(p),
            None => e,
        }
    }

    /// Prepare the backend for the planned roi and batch of a volume of network-axis shape
    /// `shape` before its data is there (the CLI does it while the file is read and
    /// normalised); [`Engine::segment_array`] then finds the backend ready.
    pub fn prepare_for(&mut self, shape: [usize; 3]) -> Result<()> {
        let t = std::time::Instant::now();
        let p = self.plan_for(shape)?;
        tracing::debug!(
            "planned {:?} x {} in {:.0} ms",
            p.roi,
            p.batch,
            t.elapsed().as_secs_f64() * 1e3
        );
        let grid = Grid::new(shape, p.roi, self.options.overlap, self.options.placement)?;
        self.prepare(p.batch.min(grid.len()).max(1), p.roi)
    }

    /// What the planner is given for a volume of network-axis shape `shape`.
    fn workload(&self, shape: [usize; 3]) -> plan::Workload {
        plan::Workload {
            shape,
            overlap: self.options.overlap,
            placement: self.options.placement,
            keep_logits: self.options.keep_logits,
            copy_input: self.options.normalize != Intensity::None,
        }
    }

    /// The plan (roi, batch, predicted memory) for a volume of network-axis shape `shape`.
    pub fn plan_for(&self, shape: [usize; 3]) -> Result<plan::Plan> {
        let req = plan::Request {
            budget: self.budget.0,
            budget_explicit: self.options.memory_budget.is_some(),
            user_roi: self.options.roi,
            user_batch: self.options.batch,
            workload: self.workload(shape),
        };
        if self.options.refuse_small_roi {
            plan::refuse_small_roi(&self.graph, req.user_roi, shape)
                .map_err(|e| self.name_error(e))?;
        }
        let mut last = self.last_plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = last.as_ref().filter(|(r, _)| *r == req) {
            return Ok(p.clone());
        }
        let p = plan::choose(&self.graph, self.memory(), &req).map_err(|e| {
            let e = if req.budget_explicit {
                e
            } else {
                plan::with_budget_source(e, &self.budget.1)
            };
            self.name_error(e)
        })?;
        *last = Some((req, p.clone()));
        Ok(p)
    }

    /// The memory budget in use and where it came from.
    pub fn memory_budget(&self) -> (u64, &str) {
        (self.budget.0, &self.budget.1)
    }

    /// Close the devices on a thread of their own (their memory freed, their contexts gone)
    /// while the caller writes what it has: the CLI's last file. The engine cannot run after.
    pub(crate) fn release_devices(&mut self) -> Option<std::thread::JoinHandle<()>> {
        let workers = std::mem::take(&mut self.workers);
        std::thread::Builder::new()
            .name("voxtile-release".into())
            .spawn(move || drop(workers))
            .ok()
    }

    /// Prepare every device's backend for (batch, roi) unless it already is.
    fn prepare(&mut self, batch: usize, roi: [usize; 3]) -> Result<()> {
        for w in &mut self.workers {
            if w.prepared != Some((batch, roi)) {
                w.prepared = None;
                w.backend.prepare(&self.graph, batch, roi)?;
                w.prepared = Some((batch, roi));
            }
        }
        Ok(())
    }
}
