//! The devices of a run and how one volume's pass is shared among them (see [`super::split`]).

use super::split::Split;
use crate::backend::{self, Backend, Device, Pass, PassOutput, StageTimes};
use crate::tiling::Part;
use crate::{Error, Result};
use ndarray::{Array3, Array4, Axis, Slice};
use std::time::Instant;

/// One device: its backend and the (batch, roi) it is prepared for.
pub(super) struct Worker {
    /// The opened device.
    pub backend: Box<dyn Backend>,
    /// The (batch, roi) it is prepared for.
    pub prepared: Option<(usize, [usize; 3])>,
    /// Its name, for reports.
    pub name: String,
}

impl Worker {
    /// Open `device` (see [`backend::open`]); returns the device that opened (never `Auto`).
    pub fn open(device: Device) -> Result<(Worker, Device)> {
        let (backend, dev) = backend::open(device)?;
        let name = backend.name();
        Ok((
            Worker {
                backend,
                prepared: None,
                name,
            },
            dev,
        ))
    }
}

/// What one device did in one attempt (merged into the report).
#[derive(Default)]
pub(super) struct PartRun {
    /// Its stage times.
    pub seconds: StageTimes,
    /// Activation bytes the backend measured.
    pub measured_act: u64,
    /// Its device high-water mark (CUDA).
    pub peak_device: Option<u64>,
    /// The backend's own details (CUDA event timings).
    pub details: Option<serde_json::Value>,
    /// NaN voxels of the blended output in its own planes.
    pub nan_voxels: usize,
}

/// Labels and, when kept, the blended outputs of the whole grid.
pub(super) type NetOut = (Array3<u16>, Option<Array4<f32>>);

/// Split a pass's output into what the volume keeps and what the report gets.
fn unpack(out: PassOutput) -> (NetOut, PartRun) {
    let run = PartRun {
        seconds: out.seconds,
        measured_act: out.measured_activation_bytes,
        peak_device: out.peak_device_bytes,
        details: out.details,
        nan_voxels: out.nan_voxels,
    };
    ((out.labels, out.logits), run)
}

/// Run the parts of `split`, part k on worker k, each in its own thread over its D-crop of the
/// volume, and put each part's own planes together (one part: on this thread, the whole pass).
/// The injected OOM (a CPU test hook) goes to the first device. An error of any part fails the
/// call (OOM only when no part failed otherwise, so that the engine's retry sees it).
pub(super) fn run_parts(
    workers: &mut [Worker],
    pass: &Pass<'_>,
    split: &Split,
    progress: &mut dyn FnMut(usize, usize),
) -> (Result<NetOut>, Vec<PartRun>) {
    if split.parts.len() == 1 {
        return match workers[0].backend.sliding_window(pass, progress) {
            Ok(out) => {
                let (net, run) = unpack(out);
                (Ok(net), vec![run])
            }
            Err(e) => (Err(e), vec![PartRun::default()]),
        };
    }
    let outs = run_threads(workers, pass, split, progress);
    let (outs, mut runs): (Vec<_>, Vec<_>) = outs
        .into_iter()
        .map(|r| match r {
            Ok(out) => {
                let (net, run) = unpack(out);
                (Ok(net), run)
            }
            Err(e) => (Err(e), PartRun::default()),
        })
        .unzip();
    let r = assemble(pass, split, outs, &mut runs);
    (r, runs)
}

/// Each part's pass on its own thread; progress is the sum of the parts' windows done.
fn run_threads(
    workers: &mut [Worker],
    pass: &Pass<'_>,
    split: &Split,
    progress: &mut dyn FnMut(usize, usize),
) -> Vec<Result<PassOutput>> {
    let total = split.windows_run();
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(&split.parts)
            .enumerate()
            .map(|(k, (worker, part))| {
                let tx = tx.clone();
                let sub = crate::tiling::sub_grid(pass.grid, 0, part);
                let volume = pass.volume.slice_axis(1, part.crop[0]..part.crop[1]);
                let own = [
                    part.planes[0] - part.crop[0]..part.planes[1] - part.crop[0],
                    pass.own[1].clone(),
                ];
                let inject_oom = if k == 0 { pass.inject_oom } else { None };
                let (weights, batch, pad, labels, blend_in_memory, cancel) = (
                    pass.weights,
                    pass.batch,
                    pass.pad,
                    pass.labels,
                    pass.blend_in_memory,
                    pass.cancel,
                );
                s.spawn(move || {
                    let part_pass = Pass {
                        volume: volume.reborrow(),
                        grid: &sub,
                        weights,
                        batch,
                        pad,
                        labels,
                        own,
                        blend_in_memory,
                        inject_oom,
                        cancel,
                    };
                    let mut last = 0;
                    let mut prog = |done: usize, _: usize| {
                        let _ = tx.send(done.saturating_sub(last));
                        last = last.max(done);
                    };
                    worker.backend.sliding_window(&part_pass, &mut prog)
                })
            })
            .collect();
        drop(tx);
        let mut done = 0;
        for n in rx {
            done += n;
            progress(done, total);
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Backend("a device worker panicked".into())))
            })
            .collect()
    })
}

/// The whole volume from each part's own planes; the first error, an OOM only when nothing else
/// failed.
fn assemble(
    pass: &Pass<'_>,
    split: &Split,
    outs: Vec<Result<NetOut>>,
    runs: &mut [PartRun],
) -> Result<NetOut> {
    let mut whole = whole_outputs(pass)?;
    let (mut oom, mut failed) = (None, None);
    for ((r, run), part) in outs.into_iter().zip(runs.iter_mut()).zip(&split.parts) {
        match r {
            Ok(out) => {
                let t = Instant::now();
                put_own(&mut whole, out, 0, part);
                run.seconds.finalize += t.elapsed().as_secs_f64();
            }
            Err(e @ Error::OutOfMemory(_)) => {
                oom.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed.or(oom) {
        Some(e) => Err(e),
        None => Ok(whole),
    }
}

/// The whole volume's labels (and blended outputs when kept), zero, for parts to fill.
pub(super) fn whole_outputs(pass: &Pass<'_>) -> Result<NetOut> {
    let [d, h, w] = pass.grid.shape;
    let labels = crate::sys::alloc::try_zeros((d, h, w), "the label map")?;
    let logits = pass
        .labels
        .keep_logits
        .then(|| crate::sys::alloc::try_zeros((pass.labels.cout, d, h, w), "the logits"))
        .transpose()?;
    Ok((labels, logits))
}

/// Copy `part`'s own planes along network `axis` (0: D, 1: H) from its outputs, which cover its
/// crop, into the whole volume's.
pub(super) fn put_own(whole: &mut NetOut, part_out: NetOut, axis: usize, part: &Part) {
    let (lo, hi) = (part.planes[0], part.planes[1]);
    let own = lo - part.crop[0]..hi - part.crop[0];
    whole
        .0
        .slice_axis_mut(Axis(axis), Slice::from(lo..hi))
        .assign(&part_out.0.slice_axis(Axis(axis), Slice::from(own.clone())));
    if let (Some(out), Some(g)) = (&mut whole.1, part_out.1) {
        out.slice_axis_mut(Axis(axis + 1), Slice::from(lo..hi))
            .assign(&g.slice_axis(Axis(axis + 1), Slice::from(own)));
    }
}
