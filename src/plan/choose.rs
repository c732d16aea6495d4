//! Choosing the run's window and batch under a budget, through a backend's [`MemoryModel`].

use super::{format_bytes, Estimate, Plan, Request, Target, Workload, MAX_BATCH, MAX_ROI};
use crate::backend::MemoryModel;
use crate::model::graph::Graph;
use crate::tiling::{self, Grid};
use crate::{Error, Result};

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

/// The one-line warning for a window smaller than the model's receptive field along some axis
/// of the volume (network axes `shape`) it does not cover: its voxels see less context than the
/// model was built for, so the result may change.
pub fn receptive_field_warning(
    graph: &Graph,
    roi: [usize; 3],
    shape: [usize; 3],
) -> Option<String> {
    below_receptive_field(graph, roi, shape).map(|rf| {
        format!(
            "roi {roi:?} is smaller than the model's receptive field {rf:?}: voxels see less context than the model was built for, and the result may differ from a larger window"
        )
    })
}

/// The error for a window (the user's or a manifest's) smaller than the model's receptive field:
/// such a run gives a different, often empty, answer, so it runs only when the caller allows it
/// (`--allow-small-roi`, [`crate::engine::Options::refuse_small_roi`] off), with
/// [`receptive_field_warning`].
pub fn refuse_small_roi(graph: &Graph, roi: Option<[usize; 3]>, shape: [usize; 3]) -> Result<()> {
    match roi.and_then(|r| below_receptive_field(graph, r, shape).map(|rf| (r, rf))) {
        Some((r, rf)) => Err(Error::Invalid(format!(
            "roi {r:?} is smaller than the model's receptive field {rf:?}: use a roi of at least the receptive field, or --allow-small-roi to run it anyway"
        ))),
        None => Ok(()),
    }
}

/// Windows of at least this many voxels along an axis are never below the receptive field there.
/// An encoder-decoder's theoretical field (MONAI's BasicUNet: 200, nnU-Net's deep nets: more) is
/// far beyond the patches such nets are trained with (64 to 192): counting it whole would refuse
/// their own windows. Nets without downsampling (deepbrain: 64) are held to their whole field.
pub const RECEPTIVE_FIELD_CAP: usize = 64;

/// The receptive field when `roi` is smaller along some axis (the field counted up to
/// [`RECEPTIVE_FIELD_CAP`]) on which it does not cover the volume (network-axis `shape`). A window
/// that holds the whole extent of an axis loses no image context there (a larger one would only
/// add padding), so that axis never counts.
fn below_receptive_field(graph: &Graph, roi: [usize; 3], shape: [usize; 3]) -> Option<[usize; 3]> {
    let rf = graph.receptive_field();
    (0..3)
        .any(|a| roi[a] < rf[a].min(RECEPTIVE_FIELD_CAP) && roi[a] < shape[a])
        .then_some(rf)
}

/// The workload one of `n` bands along H sees (see [`crate::tiling::bands`]): the volume cut to
/// the tallest band, which sets the accumulators, with the band's input copy and outputs counted
/// as its own (no input copy of its own: the band is that copy). One band: `w` itself.
fn band_workload(w: &Workload, roi: [usize; 3], n: usize) -> Result<(Workload, usize, usize)> {
    let grid = Grid::new(w.shape, roi, w.overlap, w.placement)?;
    let parts = tiling::bands(&grid, n.min(band_positions(&grid)));
    if parts.len() == 1 {
        return Ok((*w, 1, grid.len()));
    }
    let rows = parts
        .iter()
        .map(|p| p.crop[1] - p.crop[0])
        .max()
        .unwrap_or(0);
    let band = Workload {
        shape: [w.shape[0], rows, w.shape[2]],
        copy_input: false,
        ..*w
    };
    Ok((band, parts.len(), tiling::windows_run(&grid, 1, &parts)))
}

/// The prediction for `batch` windows of `roi` run in `bands` bands along H: the backend's
/// estimate for the tallest band (what the budget is compared with), the whole volume's input
/// and outputs beside the band's copy and outputs, and the grid's windows.
pub fn estimate(
    graph: &Graph,
    model: &dyn MemoryModel,
    w: &Workload,
    roi: [usize; 3],
    batch: usize,
    bands: usize,
) -> Result<Estimate> {
    let (bw, n, _) = band_workload(w, roi, bands)?;
    let mut e = model.estimate(graph, roi, batch, &bw)?;
    if n > 1 {
        let whole = model.estimate(graph, roi, batch, w)?;
        e.volume_bytes = e.volume_bytes.saturating_add(whole.volume_bytes);
        e.windows = whole.windows;
    }
    Ok(e)
}

/// Choose the batch (and, when the whole cross-section does not fit, the bands) for the model's
/// window under the budget.
///
/// The window is never shrunk (a smaller window changes the numerics): it is the user's roi (or
/// a manifest's), else the model's fixed input size, else [`default_roi`]. When batch 1 (or the
/// user's batch) does not fit, the volume is cut into the fewest bands along H whose tallest
/// fits: the bands run one after another and give the same result, at the price of the windows
/// near a cut running twice. Then the batch is planned. Heuristic (throughput): the batch with
/// the lowest modelled time ([`MemoryModel::cost`]) among those that fit (ties: the larger); on
/// CUDA a launch is costed as at least one 128³ window (small launches under-use the GPU), on
/// the CPU a batch's windows run one after another, so the batch stays 1 unless given. Without
/// an explicit budget the default batch (1 on CPU, 2 on CUDA) is kept when it fits.
///
/// When batch 1 at that window does not fit even in the thinnest bands, it is an error naming the
/// window and the budget it needs; a user's explicit roi + batch over the *default* budget only
/// warns (run anyway, whole). An explicit roi below the model's receptive field runs with a
/// warning (`Plan::warning`).
pub fn choose(graph: &Graph, model: &dyn MemoryModel, req: &Request) -> Result<Plan> {
    let w = &req.workload;
    let roi = run_window(graph, req)?;
    let windows = w.windows(roi)?;
    let mut warnings: Vec<String> = req
        .user_roi
        .and_then(|r| receptive_field_warning(graph, r, w.shape))
        .into_iter()
        .collect();
    let need = |b: usize, n: usize| -> Result<u64> {
        Ok(estimate(graph, model, w, roi, b, n)?.budgeted.total())
    };
    // An export whose Reshape targets fix the batch (and that the import could not free of
    // it), or a device whose kernels take one window, caps the batch.
    let cap = model.max_batch(graph, roi);
    let positions = band_positions(&Grid::new(w.shape, roi, w.overlap, w.placement)?);
    let (batch, bands, how) = match req.user_batch {
        Some(b) => {
            if b > cap {
                warnings.push(format!(
                    "the model runs at most {cap} window(s) per batch here (its export fixes the batch, or the device's kernels for its tensor ops take one window): batch {b} lowered to {cap}"
                ));
            }
            let b = b.min(windows).min(cap).max(1);
            match fewest_bands(positions, |n| Ok(need(b, n)? <= req.budget))? {
                Some(n) => (b, n, "user"),
                None if req.budget_explicit || req.user_roi.is_none() => {
                    return Err(too_small(model.target(), req, roi, b, need(b, positions)?));
                }
                None => {
                    warnings.push(format!(
                        "roi {roi:?} with batch {b} needs {} but the memory budget is {}",
                        format_bytes(need(b, 1)?),
                        format_bytes(req.budget)
                    ));
                    (b, 1, "user")
                }
            }
        }
        None => {
            let Some(n) = fewest_bands(positions, |n| Ok(need(1, n)? <= req.budget))? else {
                return Err(too_small(model.target(), req, roi, 1, need(1, positions)?));
            };
            let target = model.target();
            let default_batch = match target {
                Target::Cpu => 1,
                Target::Cuda => 2,
            };
            let bmax = match (req.budget_explicit, target) {
                (false, _) => default_batch,
                (true, Target::Cpu) => 1,
                (true, Target::Cuda) => MAX_BATCH,
            }
            .min(windows)
            .min(cap)
            .max(1);
            let run = band_workload(w, roi, n)?.2;
            let b = best_batch(model, run, roi, bmax, |b| Ok(need(b, n)? <= req.budget))?;
            let kept_default = !req.budget_explicit && b == default_batch.min(windows).max(1);
            (b, n, if kept_default { "default" } else { "planned" })
        }
    };
    let (_, bands, windows_run) = band_workload(w, roi, bands)?;
    let e = estimate(graph, model, w, roi, batch, bands)?;
    Ok(Plan {
        roi,
        batch,
        windows: e.windows,
        bands,
        windows_run,
        budget: req.budget,
        how: how.into(),
        estimate: e,
        warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
    })
}

/// Most bands the planner considers; past [`MAX_BAND_POSITIONS`] H positions it cuts none. The
/// exact cut is a dynamic programme of `bands × positions²` steps per call: these bounds keep a
/// hostile shape (a million rows of 16-row windows) from stalling the planner, and real volumes
/// (W4's 1024 rows at roi 128: 15 positions) far inside them.
pub const MAX_BANDS: usize = 64;
/// See [`MAX_BANDS`].
pub const MAX_BAND_POSITIONS: usize = 256;

/// The most bands worth trying on `grid`: one per H position, within [`MAX_BANDS`]; 1 (no cut)
/// past [`MAX_BAND_POSITIONS`].
fn band_positions(grid: &Grid) -> usize {
    let p = grid.origins(1).len();
    if p > MAX_BAND_POSITIONS {
        1
    } else {
        p.min(MAX_BANDS)
    }
}

/// The fewest bands in `1..=positions` ([`band_positions`]) that fit: one when it fits, else a
/// bisection (a band count that fits is checked; the tallest band shrinks as the count grows);
/// None when even the most bands do not.
fn fewest_bands(positions: usize, fits: impl Fn(usize) -> Result<bool>) -> Result<Option<usize>> {
    if fits(1)? {
        return Ok(Some(1));
    }
    if positions <= 1 || !fits(positions)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1, positions);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}

/// The batch in `1..=bmax` of lowest modelled cost among those that fit (memory grows with the
/// batch, so they are `1..=largest`); ties go to the larger. Batch 1 must fit.
fn best_batch(
    model: &dyn MemoryModel,
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
        let c = model.cost(windows, roi, b);
        if c <= pick.0 {
            pick = (c, b);
        }
    }
    Ok(pick.1)
}

/// The error for a budget below what `batch` windows of `roi` need.
fn too_small(target: Target, req: &Request, roi: [usize; 3], batch: usize, need: u64) -> Error {
    Error::BudgetTooSmall {
        needed: need,
        budget: req.budget,
        roi,
        batch,
        device: target == Target::Cuda,
        budget_source: None,
        model: None,
    }
}

/// A planner error about a default budget, with where that budget came from appended (under
/// Slurm or Kubernetes a small default is the job's limit, not the host's RAM).
pub fn with_budget_source(mut e: Error, source: &str) -> Error {
    if let Error::BudgetTooSmall { budget_source, .. } = &mut e {
        budget_source.get_or_insert_with(|| source.to_string());
    }
    e
}
