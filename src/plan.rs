//! The memory planner: one model of what a run allocates, used to choose the batch under a budget
//! (the window is the model's or the user's, never shrunk to fit), to print `voxtile plan`, and to
//! put the prediction next to the measured peak in `--report`.
//!
//! Activations come from the graph IR by liveness over the node order, replaying exactly what each
//! backend does with its buffers:
//! - CPU (f32): the executor of `backend::cpu` — a value lives from its node to its last needed
//!   reader, elementwise ops overwrite their first input when it dies there (otherwise they copy
//!   it), dead branches are skipped. The prediction equals `CpuBackend::last_stats().peak_live_bytes`.
//! - CUDA (fp16): not a replay but the backend's own host-only buffer plan
//!   (`backend::cuda::plan::buffer_plan`), which `CudaBackend::prepare` allocates exactly:
//!   the fp16 activation arena (fusion, concat slices, buffers placed by liveness), every
//!   constant upload (re-laid fp16 weights with their padding, per parity class for strided
//!   transposed convs, biases, norm parameters) and the norm scratch, each with the 256-byte
//!   allocation floor (the single-window API's f32 staging is made only when that API is
//!   used). Device-dependent kernel choices take the target's `ArchCaps` (an H200, sm_90,
//!   unless given: [`estimate_on`]).
//!
//! The rest is counted from the same code paths: weights (f32 on the host, held twice on the CPU
//! path: the engine's graph and the backend's copy; the buffer plan's constants on the device),
//! workspace (CPU im2col/col2im chunk of each conv, ≤ 4 MiB unless one row is larger; CUDA: the
//! buffer plan's norm scratch), staging (the window
//! batch on the host; pinned double buffers and the device window buffers on CUDA) and
//! accumulators (CPU `SlabBlender`: roi_D padded planes, plus its transient copy while it shifts;
//! CUDA: the ring of fp32 sums over the planes `batch` consecutive windows span, at most
//! `min(D, 2·roi_D)`, and the finalised-plane staging).

use crate::backend::cpu::ops::is_inplace;
use crate::backend::cuda::pipeline::{
    pipeline_alloc, stage_planes, window_z0, GatherMode, OUT_SLOTS,
};
use crate::backend::cuda::plan as cplan;
use crate::model::graph::{Graph, Op};
use crate::tiling::{Grid, Placement};
use crate::{Error, Result};
use serde::Serialize;

/// Which backend's allocations are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Cpu,
    Cuda,
}

/// Bytes per category, as a memory summary prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub weights: u64,
    pub activations: u64,
    pub workspace: u64,
    pub staging: u64,
    pub accumulators: u64,
}

impl Breakdown {
    /// The sum (saturating: a part saturated for an absurd size stays "more than any budget").
    pub fn total(&self) -> u64 {
        [
            self.activations,
            self.workspace,
            self.staging,
            self.accumulators,
        ]
        .iter()
        .fold(self.weights, |a, &b| a.saturating_add(b))
    }
}

/// Where the activation peak happens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeakNode {
    /// Index in `Graph::nodes`.
    pub index: usize,
    pub name: String,
    pub op: String,
    /// Activation bytes alive right after this node wrote its output.
    pub live_bytes: u64,
    /// Activation buffers alive then.
    pub live_values: usize,
}

/// Everything a run needs besides the window and batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    /// Volume size in network axes (D, H, W).
    pub shape: [usize; 3],
    pub overlap: [f64; 3],
    pub placement: Placement,
    /// The blended outputs are kept (`--logits`): the whole fp32 output stays on the host.
    pub keep_logits: bool,
    /// The engine copies the input first (normalisation or non-finite voxels).
    pub copy_input: bool,
}

/// The predicted memory of one (roi, batch) on a target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub target: Target,
    pub roi: [usize; 3],
    pub batch: usize,
    pub windows: usize,
    /// What the budget is compared with: device memory on CUDA, the host working set on CPU.
    pub budgeted: Breakdown,
    /// Host memory of the run besides the volume and its outputs (equal to `budgeted` on CPU).
    pub host: Breakdown,
    /// Input volume (and its normalised copy) plus the output arrays on the host: fixed by the
    /// volume, not by the plan, so not counted against the budget.
    pub volume_bytes: u64,
    /// The activation liveness peak and its node.
    pub peak_node: PeakNode,
    /// CPU: the executor's liveness peak (= `RunStats::peak_live_bytes`); CUDA: the launch list's
    /// pool without alignment (= `CudaBackend::activation_bytes()`).
    pub backend_activation_bytes: u64,
}

impl Estimate {
    /// Predicted peak device bytes (CUDA only).
    pub fn predicted_device(&self) -> Option<u64> {
        (self.target == Target::Cuda).then(|| self.budgeted.total())
    }
    /// Predicted peak host bytes: working set plus the volume and outputs.
    pub fn predicted_host(&self) -> u64 {
        self.host.total() + self.volume_bytes
    }
}

/// What the planner was asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub target: Target,
    /// Bytes the budgeted breakdown may reach.
    pub budget: u64,
    /// The budget was given (`--memory-budget`); otherwise the default batch is kept when it
    /// fits, and a user's explicit roi + batch over budget only warns.
    pub budget_explicit: bool,
    pub user_roi: Option<[usize; 3]>,
    pub user_batch: Option<usize>,
    pub workload: Workload,
}

/// The chosen window and batch with their prediction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub roi: [usize; 3],
    pub batch: usize,
    pub windows: usize,
    pub budget: u64,
    /// How the batch was found: "default" (kept), "planned" (chosen under the budget), "user".
    pub how: String,
    pub estimate: Estimate,
    /// One line for the user, set when a user's explicit roi and batch exceed a default budget
    /// (run anyway) or an explicit roi is below the model's receptive field.
    pub warning: Option<String>,
}

/// Largest batch the planner considers.
pub const MAX_BATCH: usize = 16;
/// Largest default window side of a dynamic model (a user's `--roi` may be larger).
pub const MAX_ROI: usize = 128;
/// Launch size (voxels) below which the GPU is taken as under-used: a launch of fewer voxels is
/// costed as if it had this many (one 128³ window).
pub const CUDA_SATURATION_VOXELS: u64 = 1 << 21;

const F32: u64 = 4;
const F16: u64 = 2;

/// Product of sizes, saturating: an absurd shape models as "more than any budget", never wraps.
fn prod(s: &[usize]) -> u64 {
    s.iter().fold(1u64, |acc, &v| acc.saturating_mul(v as u64))
}

/// Nodes that contribute to the output and the last needed reader of each value, as the CPU
/// executor computes them.
fn cpu_liveness(graph: &Graph) -> (Vec<bool>, Vec<usize>) {
    let nv = graph.values.len();
    let mut needed_val = vec![false; nv];
    if graph.output < nv {
        needed_val[graph.output] = true;
    }
    let mut needed = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if node.output < nv && needed_val[node.output] {
            needed[i] = true;
            for &v in &node.inputs {
                if v < nv {
                    needed_val[v] = true;
                }
            }
        }
    }
    let mut last_use = vec![0usize; nv];
    for (i, node) in graph.nodes.iter().enumerate() {
        if needed[i] {
            for &v in &node.inputs {
                if v < nv {
                    last_use[v] = i;
                }
            }
        }
    }
    if graph.output < nv {
        last_use[graph.output] = usize::MAX;
    }
    (needed, last_use)
}

/// Workspace bytes of one CPU conv node (0 for other ops), as `backend::cpu::ops` allocates it.
fn cpu_col_bytes(op: &Op, x: [usize; 5], y: [usize; 5]) -> u64 {
    crate::backend::cpu::ops::conv_workspace_bytes(op, x, y)
}

/// CPU activations for (batch, roi): the executor's liveness peak, its node, and the largest
/// (live bytes + conv workspace) at any node.
pub fn cpu_activations(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
) -> Result<(u64, PeakNode, u64)> {
    let shapes = graph.infer_shapes(batch, roi)?;
    let (needed, last_use) = cpu_liveness(graph);
    let bytes = |v: usize| prod(&shapes[v]).saturating_mul(F32);
    let mut live: Vec<Option<u64>> = vec![None; graph.values.len()];
    live[graph.input] = Some(bytes(graph.input));
    let (mut n_live, mut b_live) = (1usize, bytes(graph.input));
    let mut peak = PeakNode {
        index: 0,
        name: "(input)".into(),
        op: "input".into(),
        live_bytes: b_live,
        live_values: 1,
    };
    let mut with_ws = b_live;
    for (i, node) in graph.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        if is_inplace(&node.op) {
            let v0 = node.inputs[0];
            let dies = last_use[v0] == i && !node.inputs[1..].contains(&v0);
            if dies {
                if let Some(b) = live[v0].take() {
                    n_live -= 1;
                    b_live = b_live.saturating_sub(b);
                }
            }
        }
        let ob = bytes(node.output);
        n_live += 1;
        b_live = b_live.saturating_add(ob);
        live[node.output] = Some(ob);
        if b_live > peak.live_bytes {
            peak = PeakNode {
                index: i,
                name: node.name.clone(),
                op: node.op.name().into(),
                live_bytes: b_live,
                live_values: n_live,
            };
        }
        let ws = cpu_col_bytes(&node.op, shapes[node.inputs[0]], shapes[node.output]);
        // The column buffer lives while the output is written, before inputs are freed.
        with_ws = with_ws.max(b_live.saturating_add(ws));
        for (j, &v) in node.inputs.iter().enumerate() {
            if last_use[v] == i && !node.inputs[..j].contains(&v) {
                if let Some(b) = live[v].take() {
                    n_live -= 1;
                    b_live = b_live.saturating_sub(b);
                }
            }
        }
    }
    Ok((peak.live_bytes, peak, with_ws))
}

/// The CUDA backend's buffer plan for (batch, roi) on a device with `caps`: exactly the buffers
/// `CudaBackend::prepare` allocates (see [`cplan::buffer_plan`]).
pub fn cuda_buffer_plan(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
    caps: &cplan::ArchCaps,
) -> Result<cplan::BufferPlan> {
    cplan::buffer_plan(graph, batch, roi, caps)
}

/// The launch with the most activation bytes live, as a [`PeakNode`] (the input alone when the
/// graph launches nothing).
fn cuda_peak_node(graph: &Graph, bp: &cplan::BufferPlan) -> PeakNode {
    match bp.peak_launch() {
        Some(l) => {
            let node = &graph.nodes[l.node];
            PeakNode {
                index: l.node,
                name: node.name.clone(),
                op: node.op.name().into(),
                live_bytes: l.live_bytes as u64,
                live_values: l.live_bufs,
            }
        }
        None => PeakNode {
            index: 0,
            name: "(input)".into(),
            op: "input".into(),
            live_bytes: bp.activation_bytes(),
            live_values: bp.bufs.len(),
        },
    }
}

/// CUDA activations for (batch, roi) on an H200-like device (sm_90), from the backend's own
/// buffer plan: (sum of buffers with the 256-byte allocation floor, sum without, liveness peak,
/// widest output channel count).
pub fn cuda_activations(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
) -> Result<(u64, u64, PeakNode, usize)> {
    let bp = cplan::buffer_plan(graph, batch, roi, &cplan::ArchCaps::h200())?;
    Ok((
        bp.activation_alloc(),
        bp.activation_bytes(),
        cuda_peak_node(graph, &bp),
        bp.cmax,
    ))
}

/// Largest volume (voxels, padded up to the window) the planner accepts: 2^40, a 10000³ volume.
/// Past it the byte arithmetic of the model would leave u64 and no machine holds the volume.
pub const MAX_VOXELS: u64 = 1 << 40;
/// Most windows one volume may need (their origins alone take 24 bytes each).
pub const MAX_WINDOWS: u64 = 1 << 26;

/// `a × b × …` of user-given sizes, None past `limit` (or u64).
fn checked_prod(s: &[usize], limit: u64) -> Option<u64> {
    s.iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v as u64))
        .filter(|&p| p <= limit)
}

/// Refuse a volume (padded up to `roi`) or a launch (`batch` windows of `roi`) too large to plan,
/// before any arithmetic or allocation depends on its size.
fn check_sizes(shape: [usize; 3], roi: [usize; 3], batch: usize) -> Result<()> {
    let padded: [usize; 3] = [0, 1, 2].map(|a| shape[a].max(roi[a]));
    if checked_prod(&padded, MAX_VOXELS).is_none() {
        return Err(Error::Invalid(format!(
            "volume {}x{}x{} (window {roi:?}) is too large to plan: more than {MAX_VOXELS} voxels",
            shape[0], shape[1], shape[2]
        )));
    }
    let launch = checked_prod(&roi, MAX_VOXELS).and_then(|r| r.checked_mul(batch as u64));
    if launch.is_none_or(|v| v > MAX_VOXELS) {
        return Err(Error::Invalid(format!(
            "batch {batch} of windows {roi:?} is too large to plan: more than {MAX_VOXELS} voxels per call"
        )));
    }
    Ok(())
}

/// Upper bound of the windows along one axis (the tiler's own formulas in f64, so that a huge
/// count is seen before the tiler tries to list it).
fn axis_window_bound(size: usize, roi: usize, overlap: f64, placement: Placement) -> f64 {
    let padded = size.max(roi);
    if padded == roi {
        return 1.0;
    }
    let step = match placement {
        Placement::Monai => ((roi as f64 * (1.0 - overlap)) as usize).max(1) as f64,
        Placement::NnUnet => roi as f64 * (1.0 - overlap),
    };
    ((padded - roi) as f64 / step).ceil() + 1.0
}

/// Number of windows of `roi` over the workload's volume; an error (not a hang or an abort) when
/// the volume is too large or needs more than [`MAX_WINDOWS`].
pub fn window_count(w: &Workload, roi: [usize; 3]) -> Result<usize> {
    check_sizes(w.shape, roi, 1)?;
    if let Some(o) = w.overlap.iter().find(|o| !(0.0..1.0).contains(*o)) {
        return Err(Error::Invalid(format!("overlap {o} is outside [0, 1)")));
    }
    let bound: f64 = (0..3)
        .map(|a| axis_window_bound(w.shape[a], roi[a], w.overlap[a], w.placement))
        .product();
    // NaN (never expected) counts as too many.
    if bound.is_nan() || bound > MAX_WINDOWS as f64 {
        return Err(Error::Invalid(format!(
            "volume {}x{}x{} needs about {bound:.3e} windows of {roi:?} at overlap {:?}: more than the {MAX_WINDOWS} voxtile handles",
            w.shape[0], w.shape[1], w.shape[2], w.overlap
        )));
    }
    (0..3).try_fold(1, |n, a| {
        let g = Grid::new(
            [w.shape[a], 1, 1],
            [roi[a], 1, 1],
            [w.overlap[a], 0.0, 0.0],
            w.placement,
        )?;
        Ok(n * g.len())
    })
}

/// Predicted memory of one (roi, batch); CUDA as on an H200-like device (sm_90, see
/// [`estimate_on`]).
pub fn estimate(
    graph: &Graph,
    target: Target,
    roi: [usize; 3],
    batch: usize,
    w: &Workload,
) -> Result<Estimate> {
    estimate_on(graph, target, roi, batch, w, &cplan::ArchCaps::h200())
}

/// Predicted memory of one (roi, batch), for a CUDA device with `caps` (ignored on the CPU).
pub fn estimate_on(
    graph: &Graph,
    target: Target,
    roi: [usize; 3],
    batch: usize,
    w: &Workload,
    caps: &cplan::ArchCaps,
) -> Result<Estimate> {
    if batch == 0 || roi.contains(&0) {
        return Err(Error::Invalid(format!(
            "batch {batch} and window {roi:?} must be positive"
        )));
    }
    check_sizes(w.shape, roi, batch)?;
    let windows = window_count(w, roi)?;
    let shapes = graph.infer_shapes(batch, roi)?;
    let out = shapes[graph.output];
    let (cin, cout) = (graph.input_channels(), out[1]);
    let rvox = prod(&roi);
    let vox = prod(&w.shape);
    let params = graph.param_count() as u64;
    let padded: [usize; 3] = [0, 1, 2].map(|a| w.shape[a].max(roi[a]));
    // Sizes are bounded by `check_sizes` (2^40 voxels); channels are not: saturate.
    let per_voxel = |c: usize, bytes: u64| (c as u64).saturating_mul(vox).saturating_mul(bytes);
    let cpu_output = (vox * 2).saturating_add(if w.keep_logits {
        per_voxel(cout, F32)
    } else {
        0
    });
    let input = per_voxel(cin, F32).saturating_mul(if w.copy_input { 2 } else { 1 });
    match target {
        Target::Cpu => {
            let (act, peak_node, with_ws) = cpu_activations(graph, batch, roi)?;
            let plane = (padded[1] * padded[2]) as u64;
            // SlabBlender: (C + 1) sums over roi_D padded planes; shifting copies the kept tail
            // while the finished slab is out, so up to the same again transiently.
            let acc = (cout as u64 + 1)
                .saturating_mul(roi[0] as u64 * plane)
                .saturating_mul(F32);
            let budgeted = Breakdown {
                weights: 2 * params * F32,
                activations: act,
                workspace: with_ws - act,
                // The gathered window batch; the backend's own contiguous copy of it is the
                // first live activation.
                staging: (cin as u64).saturating_mul(batch as u64 * rvox * F32),
                accumulators: acc.saturating_mul(2).saturating_add(rvox * F32),
            };
            Ok(Estimate {
                target,
                roi,
                batch,
                windows,
                budgeted,
                host: budgeted,
                volume_bytes: input + cpu_output,
                peak_node,
                backend_activation_bytes: act,
            })
        }
        Target::Cuda => {
            let bp = cplan::buffer_plan(graph, batch, roi, caps)?;
            let b = batch as u64;
            let argmax = !w.keep_logits && cout > 1;
            let win_in = (cin as u64).saturating_mul(b * rvox);
            // The streamed pipeline's own buffers, exactly as `pipeline` allocates them for the
            // engine's windows.
            let grid = Grid::new(w.shape, roi, w.overlap, w.placement)?;
            let z0 = window_z0(&grid.starts, grid.pad_before[0]);
            let pa = pipeline_alloc(
                roi,
                batch,
                cin,
                cout,
                w.shape,
                argmax,
                GatherMode::Auto,
                &z0,
            );
            let ring = pa.ring;
            let hw = w.shape[1] * w.shape[2];
            let out_slot = pa.out_slots / OUT_SLOTS as u64;
            // Pinned input: two window batches (host gather) or two plane slots (device gather).
            let host_in = if pa.gather_on_device {
                2 * (stage_planes(batch * cin * rvox as usize, cin * hw, ring) * cin * hw) as u64
                    * F16
            } else {
                2 * win_in * F16
            };
            // The prepared plan exactly as `CudaBackend::prepare` allocates it: constants
            // (re-laid fp16 weights, biases, norm parameters), the fp16 activation arena, and the
            // norm scratch (the single-window API's f32 staging is not made by the pipeline).
            let budgeted = Breakdown {
                weights: bp.const_alloc(),
                activations: bp.activation_alloc(),
                workspace: bp.scratch_alloc(),
                // Window input (batch buffers or plane ring) and the weight map.
                staging: pa.input + pa.weight_map,
                accumulators: pa.accumulators + pa.out_slots,
            };
            let host = Breakdown {
                weights: params * F32,
                activations: 0,
                workspace: 0,
                // Pinned fp16 input staging and downloaded planes (OUT_SLOTS slots).
                staging: host_in + OUT_SLOTS as u64 * out_slot,
                accumulators: 0,
            };
            let output = if argmax {
                vox * 2
            } else {
                // Blended outputs come back whole, labels are made on the host.
                per_voxel(cout, F32).saturating_add(vox * 2)
            };
            Ok(Estimate {
                target,
                roi,
                batch,
                windows,
                budgeted,
                host,
                volume_bytes: input + output,
                peak_node: cuda_peak_node(graph, &bp),
                backend_activation_bytes: bp.activation_bytes(),
            })
        }
    }
}

/// Modelled cost of a run: the voxels of every launch, a launch on CUDA costing at least
/// [`CUDA_SATURATION_VOXELS`]. On the CPU the windows of a batch run one after another, so the
/// cost is the voxels computed (windows × roi volume) whatever the batch.
fn cost(target: Target, windows: usize, roi: [usize; 3], batch: usize) -> u64 {
    let rv = prod(&roi);
    match target {
        Target::Cpu => (windows as u64).saturating_mul(rv),
        Target::Cuda => {
            let launch = |n: usize| (n as u64).saturating_mul(rv).max(CUDA_SATURATION_VOXELS);
            let (full, rem) = (windows / batch, windows % batch);
            (full as u64)
                .saturating_mul(launch(batch))
                .saturating_add(if rem > 0 { launch(rem) } else { 0 })
        }
    }
}

/// The roi used when nothing asks otherwise: the model's fixed size, else 128 clipped to the
/// volume, rounded up to the network's divisor.
pub fn default_roi(graph: &Graph, shape: [usize; 3]) -> [usize; 3] {
    let div = graph.spatial_divisor();
    [0, 1, 2].map(|a| match graph.fixed_input_spatial[a] {
        Some(f) => f,
        None => shape[a].clamp(1, MAX_ROI).div_ceil(div[a]) * div[a],
    })
}

/// Where the window of a run comes from: a user's (or a manifest's) roi, else the model's fixed
/// input size, else [`default_roi`]. Checked against the model's divisor and fixed sizes.
fn run_window(graph: &Graph, req: &Request) -> Result<[usize; 3]> {
    let Some(r) = req.user_roi else {
        return Ok(default_roi(graph, req.workload.shape));
    };
    let div = graph.spatial_divisor();
    for a in 0..3 {
        if r[a] == 0 || r[a] % div[a] != 0 {
            return Err(Error::Invalid(format!(
                "roi {r:?} does not fit the model: each axis must be a multiple of {div:?} (its downsampling)"
            )));
        }
        if let Some(f) = graph.fixed_input_spatial[a] {
            if f != r[a] {
                return Err(Error::Invalid(format!(
                    "the model's input is fixed to {f} along axis {a}, roi asks {}",
                    r[a]
                )));
            }
        }
    }
    Ok(r)
}

/// The one-line warning for a window smaller than the model's receptive field along some axis:
/// its voxels see less context than the model was built for, so the result may change.
pub fn receptive_field_warning(graph: &Graph, roi: [usize; 3]) -> Option<String> {
    let rf = graph.receptive_field();
    (0..3).any(|a| roi[a] < rf[a]).then(|| {
        format!(
            "roi {roi:?} is smaller than the model's receptive field {rf:?}: voxels see less context than the model was built for, and the result may differ from a larger window"
        )
    })
}

/// Choose the batch for the model's window under the budget.
///
/// The window is never shrunk (a smaller window changes the numerics): it is the user's roi (or
/// a manifest's), else the model's fixed input size, else [`default_roi`]. Only the batch is
/// planned. Heuristic (throughput): the batch with the lowest modelled time [`cost`] among those
/// that fit (ties: the larger); on CUDA a launch is costed as at least one 128³ window (small
/// launches under-use the GPU), on the CPU a batch's windows run one after another, so the batch
/// stays 1 unless given. Without an explicit budget the default batch (1 on CPU, 2 on CUDA) is
/// kept when it fits.
///
/// When batch 1 at that window does not fit, it is an error naming the window and the budget it
/// needs; a user's explicit roi + batch over the *default* budget only warns (run anyway). An
/// explicit roi below the model's receptive field runs with a warning (`Plan::warning`).
pub fn choose(graph: &Graph, req: &Request) -> Result<Plan> {
    let w = &req.workload;
    let roi = run_window(graph, req)?;
    let windows = window_count(w, roi)?;
    let mut warnings: Vec<String> = req
        .user_roi
        .and_then(|r| receptive_field_warning(graph, r))
        .into_iter()
        .collect();
    let need =
        |b: usize| -> Result<u64> { Ok(estimate(graph, req.target, roi, b, w)?.budgeted.total()) };
    let (batch, how) = match req.user_batch {
        Some(b) => {
            let b = b.min(windows).max(1);
            let need = need(b)?;
            if need > req.budget {
                let msg = format!(
                    "roi {roi:?} with batch {b} needs {} but the memory budget is {}",
                    format_bytes(need),
                    format_bytes(req.budget)
                );
                if req.budget_explicit || req.user_roi.is_none() {
                    return Err(Error::Invalid(format!(
                        "{msg}: lower --batch or --roi, or raise --memory-budget"
                    )));
                }
                warnings.push(msg);
            }
            (b, "user")
        }
        None => {
            let need1 = need(1)?;
            if need1 > req.budget {
                return Err(too_small(req, roi, need1));
            }
            let default_batch = match req.target {
                Target::Cpu => 1,
                Target::Cuda => 2,
            };
            let bmax = match (req.budget_explicit, req.target) {
                (false, _) => default_batch,
                (true, Target::Cpu) => 1,
                (true, Target::Cuda) => MAX_BATCH,
            }
            .min(windows)
            .max(1);
            let b = best_batch(req.target, windows, roi, bmax, |b| {
                Ok(need(b)? <= req.budget)
            })?;
            let kept_default = !req.budget_explicit && b == default_batch.min(windows).max(1);
            (b, if kept_default { "default" } else { "planned" })
        }
    };
    let e = estimate(graph, req.target, roi, batch, w)?;
    Ok(Plan {
        roi,
        batch,
        windows: e.windows,
        budget: req.budget,
        how: how.into(),
        estimate: e,
        warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
    })
}

/// The batch in `1..=bmax` of lowest modelled cost among those that fit (memory grows with the
/// batch, so they are `1..=largest`); ties go to the larger. Batch 1 must fit.
fn best_batch(
    target: Target,
    windows: usize,
    roi: [usize; 3],
    bmax: usize,
    fits: impl Fn(usize) -> Result<bool>,
) -> Result<usize> {
    let (mut lo, mut hi) = (1, bmax);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let mut pick = (u64::MAX, 1);
    for b in 1..=lo {
        let c = cost(target, windows, roi, b);
        if c <= pick.0 {
            pick = (c, b);
        }
    }
    Ok(pick.1)
}

/// The error for a budget below batch 1 at the run's window.
fn too_small(req: &Request, roi: [usize; 3], need: u64) -> Error {
    let whose = if req.user_roi.is_some() {
        "the window"
    } else {
        "the model's window"
    };
    let what = match req.target {
        Target::Cpu => "host working set",
        Target::Cuda => "device memory",
    };
    Error::Invalid(format!(
        "the memory budget {} is too small for {whose} {roi:?}: batch 1 needs {} ({what}); raise --memory-budget or pass a smaller --roi",
        format_bytes(req.budget),
        format_bytes(need)
    ))
}

/// A planner error about a default budget, with where that budget came from appended (under
/// Slurm or Kubernetes a small default is the job's limit, not the host's RAM).
pub fn with_budget_source(e: Error, source: &str) -> Error {
    match e {
        Error::Invalid(m) if m.contains("memory budget") => {
            Error::Invalid(format!("{m} (default budget: {source})"))
        }
        e => e,
    }
}

/// Parse a byte size: `4GiB`, `512MiB`, `64KiB`, `2GB`, `500MB`, `10KB`, `123` or `123B`
/// (binary units for *iB, decimal for *B; fractions allowed: `1.5GiB`).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let bad = || {
        Error::Invalid(format!(
            "memory size '{s}' is not a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB), e.g. 4GiB"
        ))
    };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    let v = x * mult;
    if !v.is_finite() || v < 1.0 || v > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

/// `1.50 GiB`-style size.
pub fn format_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// MemAvailable of /proc/meminfo in bytes.
pub fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// MemAvailable (bytes) of /proc/meminfo's text.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// A cgroup limit file's value: None for `max` (v2) or the page-rounded i64::MAX that v1 writes
/// for "no limit".
pub fn parse_cgroup_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// The cgroup paths of a process from /proc/self/cgroup's text: (v2 unified path, v1 memory
/// controller path).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// The least memory left under any limited cgroup from `path` up to `root` (the hierarchy's
/// mount): `limit − usage` read from the files `limit` and `usage` in each folder. Leaf folders
/// missing from this mount (a container without a cgroup namespace) are skipped; a parent's limit
/// also binds the child, hence the walk up. Returns the bytes and the folder that set them.
pub fn cgroup_headroom(
    root: &std::path::Path,
    path: &str,
    limit: &str,
    usage: &str,
) -> Option<(u64, std::path::PathBuf)> {
    let rel: std::path::PathBuf = std::path::Path::new(path)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    let mut dir = root.join(rel);
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    loop {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let Some(max) = read(limit).as_deref().and_then(parse_cgroup_limit) {
            let used = read(usage)
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let left = max.saturating_sub(used);
            if best.as_ref().is_none_or(|(b, _)| left < *b) {
                best = Some((left, dir.clone()));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return best;
        }
    }
}

/// Memory left to this process's cgroup (v2 `memory.max − memory.current`, v1
/// `memory.limit_in_bytes − memory.usage_in_bytes`), with a description; None when unlimited.
pub fn cgroup_available() -> Option<(u64, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = parse_proc_cgroup(&text);
    let base = std::path::Path::new("/sys/fs/cgroup");
    let found = [
        v2.and_then(|p| cgroup_headroom(base, &p, "memory.max", "memory.current")),
        v1.and_then(|p| {
            cgroup_headroom(
                &base.join("memory"),
                &p,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        }),
    ];
    found
        .into_iter()
        .flatten()
        .min_by_key(|(b, _)| *b)
        .map(|(b, dir)| (b, format!("cgroup memory left ({})", dir.display())))
}

/// The tightest of the host's memory limits: (bytes, what it is).
pub fn tightest(limits: impl IntoIterator<Item = Option<(u64, String)>>) -> Option<(u64, String)> {
    limits.into_iter().flatten().min_by_key(|(b, _)| *b)
}

/// Memory this process may still use on the host: the least of MemAvailable (the host's, not
/// ours under Slurm or Kubernetes), the address space left under RLIMIT_AS and the memory left
/// to its cgroup.
pub fn host_available() -> Option<(u64, String)> {
    tightest([
        mem_available().map(|m| (m, "available RAM".to_string())),
        crate::alloc::address_space_left()
            .map(|m| (m, "address space left under RLIMIT_AS".to_string())),
        cgroup_available(),
    ])
}

/// Free memory of CUDA device `device`, through the driver (its primary context); None without
/// a driver or device.
pub fn cuda_free_bytes(device: usize) -> Option<u64> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    let ctx = cudarc::driver::CudaContext::new(device).ok()?;
    ctx.bind_to_thread().ok()?;
    cudarc::driver::result::mem_get_info()
        .ok()
        .map(|(free, _)| free as u64)
}

/// Fixed CUDA budget when the device cannot be asked.
pub const CUDA_FALLBACK_BUDGET: u64 = 4 << 30;

/// The default budget and where it came from: CUDA free memory × 0.8 (20% reserve for the
/// driver, other processes and fragmentation), or 4 GiB when no device answers; on the CPU half of
/// the memory left to the process ([`host_available`]: MemAvailable, RLIMIT_AS, cgroup limit,
/// whichever is least; 4 GiB when none is known). The source string names the limit.
pub fn default_budget(target: Target, device: usize) -> (u64, String) {
    match target {
        Target::Cuda => match cuda_free_bytes(device) {
            Some(f) => (
                (f as f64 * 0.8) as u64,
                format!("80% of the {} free on cuda:{device}", format_bytes(f)),
            ),
            None => (
                CUDA_FALLBACK_BUDGET,
                "no CUDA device answered: fixed default".into(),
            ),
        },
        Target::Cpu => match host_available() {
            Some((m, what)) => (m / 2, format!("50% of the {} {what}", format_bytes(m))),
            None => (4 << 30, "MemAvailable unknown: fixed default".into()),
        },
    }
}

impl Plan {
    /// The memory summary `voxtile plan` prints.
    pub fn summary(&self, graph: &Graph, budget_source: &str) -> String {
        let e = &self.estimate;
        let mut s = String::new();
        let pct = |b: u64| 100.0 * b as f64 / self.budget.max(1) as f64;
        s += &format!(
            "roi {:?}  batch {}  windows {}  ({} plan)\n",
            self.roi, self.batch, self.windows, self.how
        );
        let what = match e.target {
            Target::Cuda => "device",
            Target::Cpu => "host",
        };
        s += &format!(
            "{:<14}{:>14}{:>10}\n",
            format!("{what} memory"),
            "bytes",
            "budget"
        );
        let b = &e.budgeted;
        for (name, v) in [
            ("weights", b.weights),
            ("activations", b.activations),
            ("workspace", b.workspace),
            ("staging", b.staging),
            ("accumulators", b.accumulators),
        ] {
            s += &format!("{name:<14}{:>14}{:>9.1}%\n", format_bytes(v), pct(v));
        }
        s += &format!("{:-<38}\n", "");
        s += &format!(
            "{:<14}{:>14}{:>9.1}%\n",
            "total",
            format_bytes(b.total()),
            pct(b.total())
        );
        s += &format!(
            "{:<14}{:>14}  ({budget_source})\n",
            "budget",
            format_bytes(self.budget)
        );
        if e.target == Target::Cuda {
            s += &format!(
                "host: {} pinned/working + {} volume and outputs\n",
                format_bytes(e.host.total()),
                format_bytes(e.volume_bytes)
            );
        } else {
            s += &format!(
                "host besides: {} volume and outputs (not budgeted)\n",
                format_bytes(e.volume_bytes)
            );
        }
        let p = &e.peak_node;
        s += &format!(
            "activation peak at node {} '{}' ({}): {} in {} buffers ({} nodes)\n",
            p.index,
            p.name,
            p.op,
            format_bytes(p.live_bytes),
            p.live_values,
            graph.nodes.len()
        );
        if let Some(w) = &self.warning {
            s += &format!("warning: {w}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_units() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("500 MB").unwrap(), 500_000_000);
        assert_eq!(parse_bytes("10KB").unwrap(), 10_000);
        assert_eq!(parse_bytes("123").unwrap(), 123);
        assert_eq!(parse_bytes("123bytes").unwrap(), 123);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        for bad in ["", "GiB", "4XB", "-1GiB", "0", "1.2.3MB"] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn format_bytes_reads_back() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(
            parse_bytes(&format_bytes(5 << 20).replace(' ', "")).unwrap(),
            5 << 20
        );
    }

    #[test]
    fn cost_prefers_fewer_voxels_and_saturated_launches() {
        assert!(cost(Target::Cpu, 10, [64; 3], 1) < cost(Target::Cpu, 100, [64; 3], 1));
        assert_eq!(
            cost(Target::Cpu, 10, [64; 3], 1),
            cost(Target::Cpu, 10, [64; 3], 4)
        );
        // 8 windows of 32³ in one launch cost one saturated launch; one at a time cost 8.
        assert!(cost(Target::Cuda, 8, [32; 3], 8) < cost(Target::Cuda, 8, [32; 3], 1));
    }
}
