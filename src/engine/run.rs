//! One volume through the engine: the plan, the pass on every device, the out-of-memory retry
//! (the one place a batch is made smaller), the report.

use super::bands::{run_bands, BandRun};
use super::parts::{NetOut, PartRun};
use super::report::{PartReport, PredictedPeak, Report, StageTimes};
use super::{AxisOrder, Engine};
use crate::backend::{LabelRule, Pass, VolumeRef};
use crate::sys::alloc::try_to_owned;
use crate::tiling::{self, Grid};
use crate::{Error, Result};
use ndarray::{Array3, Array4};
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// [`Engine::segment_array`] (or [`Engine::segment_device`]) once the channels are checked:
    /// labels (i,j,k), the blended outputs (channel, i, j, k) when `Options::keep_logits`, and
    /// the report.
    pub(super) fn run_input(
        &mut self,
        data: VolumeRef,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(Array3<u16>, Option<Array4<f32>>, Report)> {
        let cin = self.graph.input_channels();
        // Network axes: (C, D, H, W).
        let net = match self.options.axis_order {
            AxisOrder::Xyz => data,
            AxisOrder::Zyx => data.permuted_axes([0, 3, 2, 1]),
        };
        let shape = [net.shape()[1], net.shape()[2], net.shape()[3]];
        let planned = self.plan_for(shape)?;
        if planned.bands > 1 {
            tracing::info!(
                "the accumulators of the whole {}x{} cross-section do not fit the memory budget: {} bands along H, run one after another ({} windows run for {})",
                shape[1],
                shape[2],
                planned.bands,
                planned.windows_run,
                planned.windows
            );
        }
        if let Some(w) = &planned.warning {
            if self.warned.insert(w.clone()) {
                tracing::warn!("{w}");
            }
        }
        let mut report = Report {
            input_shape: shape,
            channels: cin,
            overlap: self.options.overlap,
            roi: planned.roi,
            device: self.device_name.clone(),
            output_activation: format!("{:?}", self.graph.output_activation()).to_lowercase(),
            memory_budget: self.budget.0,
            memory_budget_source: self.budget.1.clone(),
            plan: planned.how.clone(),
            ..Default::default()
        };
        let ((labels_net, logits_net), rule) =
            self.run_with_retry(net, planned.batch, planned.bands, &mut report, progress)?;
        if let Some(n) = report.nan_output_voxels.filter(|&n| n > 0) {
            tracing::warn!(
                "{n} voxels of the blended network output are NaN: their labels are meaningless (the model produced non-finite values)"
            );
        }
        // The prediction for what finally ran.
        let est = if report.batch == planned.batch {
            planned.estimate
        } else {
            crate::plan::estimate(
                &self.graph,
                self.memory(),
                &self.workload(shape),
                report.roi,
                report.batch,
                planned.bands,
            )?
        };
        report.predicted_peak_bytes = PredictedPeak {
            host: est.predicted_host(),
            device: est.predicted_device(),
        };
        report.predicted = Some(est);
        report.labels = rule.describe();
        let t = Instant::now();
        // Back to the file's (i,j,k) axes.
        let (labels, logits) = match self.options.axis_order {
            AxisOrder::Xyz => (labels_net, logits_net),
            // Volume-sized copies, allocated fallibly.
            AxisOrder::Zyx => (
                try_to_owned(labels_net.view().permuted_axes([2, 1, 0]), "the label map")?,
                logits_net
                    .map(|l| try_to_owned(l.view().permuted_axes([0, 3, 2, 1]), "the logits"))
                    .transpose()?,
            ),
        };
        report.seconds.finalize += t.elapsed().as_secs_f64();
        report.peak_host_bytes = super::peak_rss_bytes();
        Ok((labels, logits, report))
    }

    /// How labels are made at `roi`; an error when the model does not keep the window's size
    /// (the blender places each output over its window).
    fn label_rule(&self, roi: [usize; 3], batch: usize) -> Result<LabelRule> {
        let shapes = self.graph.infer_shapes(batch, roi)?;
        let out = shapes[self.graph.output];
        if [out[2], out[3], out[4]] != roi {
            return Err(Error::Graph(format!(
                "the model maps a {roi:?} window to {:?}: voxtile needs outputs the size of their input",
                &out.as_slice()[2..]
            )));
        }
        Ok(LabelRule {
            cout: out[1],
            act: self.graph.output_activation(),
            keep_logits: self.options.keep_logits,
        })
    }

    /// The pass over `net` at `report.roi` in `bands` bands along H, starting at `batch` and
    /// halved on each out-of-memory error (see [`oom_retry_batch`]); fills the report's run
    /// fields.
    fn run_with_retry(
        &mut self,
        net: VolumeRef,
        mut batch: usize,
        bands: usize,
        report: &mut Report,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(NetOut, LabelRule)> {
        let roi = report.roi;
        let o = &self.options;
        let shape = report.input_shape;
        let grid = Grid::new(shape, roi, o.overlap, o.placement)?;
        let weights = self.pass_weights(roi);
        let o = &self.options;
        let bands = tiling::bands(&grid, bands);
        let mut inject_oom = o.inject_oom.filter(|_| !self.is_cuda());
        let cancel = o.cancel.clone();
        // A retried pass starts over: progress holds at its high-water mark, never goes back.
        let mut high = 0;
        let mut progress = |done: usize, total: usize| {
            high = high.max(done);
            progress(high, total)
        };
        loop {
            cancel.check()?;
            batch = batch.min(grid.len()).max(1);
            let rule = self.label_rule(roi, batch)?;
            let t = Instant::now();
            // A prepare that runs out of device memory (a budget larger than the device allows)
            // goes through the same retry as a pass that does.
            let prepared = self.prepare(batch, roi);
            report.seconds.prepare += t.elapsed().as_secs_f64();
            let pass = Pass {
                volume: net.reborrow(),
                grid: &grid,
                weights: weights.view(),
                batch,
                pad: self.options.pad,
                labels: rule,
                own: [0..shape[0], 0..shape[1]],
                blend_in_memory: self.options.blend_in_memory,
                // The hook fires once per run: not again in the retried pass.
                inject_oom: inject_oom.take(),
                cancel: &cancel,
            };
            let (result, done) = match prepared {
                Ok(()) => run_bands(&mut self.workers, &pass, &bands, &mut progress),
                Err(e @ Error::OutOfMemory(_)) => (Err(e), Vec::new()),
                Err(e) => return Err(e),
            };
            // The bands run one after another, the parts of a band at once.
            for b in &done {
                merge_times(report, &b.runs);
            }
            let runs: Vec<&PartRun> = done.iter().flat_map(|b| &b.runs).collect();
            match result {
                Ok(out) => {
                    report.batch = batch;
                    report.windows = grid.len();
                    report.windows_run = done.iter().map(|b| b.split.windows_run()).sum();
                    report.bands = done.iter().map(|b| b.band.planes).collect();
                    report.nan_output_voxels = Some(runs.iter().map(|r| r.nan_voxels).sum());
                    report.measured_activation_bytes = runs.iter().map(|r| r.measured_act).max();
                    report.peak_device_bytes = runs.iter().filter_map(|r| r.peak_device).max();
                    report.gpu = details(&runs);
                    if done.iter().any(|b| b.split.parts.len() > 1) {
                        report.parts = self.part_reports(&done, batch);
                    }
                    return Ok((out, rule));
                }
                Err(Error::OutOfMemory(m)) => {
                    batch = oom_retry_batch(&m, roi, batch, &mut report.oom_retries)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The blend weights of a pass at `roi` (mirrored as the pass is), from the cache when the
    /// settings they depend on are those of the last pass.
    fn pass_weights(&mut self, roi: [usize; 3]) -> Arc<Array3<f32>> {
        let o = &self.options;
        let key = WeightsKey {
            roi,
            blend: o.blend,
            sigma_scale: o.sigma_scale,
            placement: o.placement,
            mirrored: o.mirrored,
            axis_order: o.axis_order,
        };
        if let Some((k, w)) = &self.pass_weights {
            if *k == key {
                return w.clone();
            }
        }
        let mut weights = tiling::pass_weights(roi, o.blend, o.sigma_scale, o.placement);
        for (a, &m) in o.mirrored.iter().enumerate() {
            let net_axis = match o.axis_order {
                AxisOrder::Xyz => a,
                AxisOrder::Zyx => 2 - a,
            };
            if m {
                weights.invert_axis(ndarray::Axis(net_axis));
            }
        }
        let w = Arc::new(weights.as_standard_layout().into_owned());
        self.pass_weights = Some((key, w.clone()));
        w
    }

    /// Each device's share of a split volume (in each band), for the report.
    fn part_reports(&self, done: &[BandRun], batch: usize) -> Vec<PartReport> {
        done.iter()
            .flat_map(|b| {
                b.split
                    .parts
                    .iter()
                    .zip(&b.runs)
                    .enumerate()
                    .map(move |(k, (p, r))| (b, k, p, r))
            })
            .map(|(b, k, p, r)| PartReport {
                device: self.workers[k].name.clone(),
                planes: p.planes,
                crop: p.crop,
                rows: b.band.planes,
                windows: b.split.windows(k),
                batch,
                compute_seconds: r.seconds.compute,
                peak_device_bytes: r.peak_device,
                measured_activation_bytes: r.measured_act,
            })
            .collect()
    }
}

/// What a pass's blend weights depend on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct WeightsKey {
    roi: [usize; 3],
    blend: tiling::BlendMode,
    sigma_scale: [f64; 3],
    placement: tiling::Placement,
    mirrored: [bool; 3],
    axis_order: AxisOrder,
}

/// Stage times of one attempt, added to the report's: the slowest device (the parts run at
/// once).
fn merge_times(report: &mut Report, runs: &[PartRun]) {
    let slowest =
        |f: fn(&StageTimes) -> f64| runs.iter().map(|r| f(&r.seconds)).fold(0.0, f64::max);
    report.seconds.compute += slowest(|t| t.compute);
    report.seconds.blend += slowest(|t| t.blend);
    report.seconds.finalize += slowest(|t| t.finalize);
}

/// The backends' own details (CUDA event timings): one run's, or a list of every device's (in
/// each band).
fn details(runs: &[&PartRun]) -> Option<serde_json::Value> {
    if runs.len() == 1 {
        runs[0].details.clone()
    } else {
        runs.iter()
            .map(|r| r.details.clone())
            .collect::<Option<Vec<_>>>()
            .map(serde_json::Value::Array)
    }
}

/// The batch to redo a volume at after an out-of-memory error `m` at `batch`: half of it (a
/// warning event, and in `retries`); at batch 1 the error itself, naming the window that is kept.
fn oom_retry_batch(
    m: &str,
    roi: [usize; 3],
    batch: usize,
    retries: &mut Vec<String>,
) -> Result<usize> {
    if batch <= 1 {
        return Err(Error::OutOfMemory(format!(
            "{m}; at batch 1 with the window {roi:?}, which is kept (a smaller window changes the result): free memory or pass a smaller --roi"
        )));
    }
    let nb = batch / 2;
    let msg = format!(
        "out of memory ({m}) with roi {roi:?}: batch {batch} -> {nb}, retrying the volume with batch {nb}"
    );
    tracing::warn!("{msg}");
    retries.push(msg);
    Ok(nb)
}
