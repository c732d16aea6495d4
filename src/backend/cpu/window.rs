//! The CPU sliding-window pass: gather a batch of windows on the host, run it, blend it;
//! finished slabs become labels (and outputs, when kept) at once, so the blended outputs are
//! never held whole unless asked for.

use super::CpuBackend;
use crate::backend::{Backend, Pass, PassOutput, StageTimes};
use crate::tiling::{self, Slab};
use crate::{Error, Result};
use ndarray::{s, Array3, Array4, Axis};
use std::time::Instant;

/// Where blended windows go: streamed slabs, or one whole-volume accumulator (the reference).
enum Acc {
    Slab(tiling::SlabBlender),
    Whole(tiling::Blender),
}

/// Labels and outputs of the finished planes, and the NaN count of the pass's own planes.
struct Store<'a, 'p> {
    pass: &'a Pass<'p>,
    labels: Array3<u16>,
    logits: Option<Array4<f32>>,
    nan_voxels: usize,
}

impl Store<'_, '_> {
    fn put(&mut self, slab: Slab, seconds: &mut StageTimes) {
        let t = Instant::now();
        let n = slab.data.shape()[1];
        let [own, rows] = &self.pass.own;
        // This device's own planes and rows of the slab (the others belong to a neighbour).
        let (lo, hi) = (own.start.max(slab.d0), own.end.min(slab.d0 + n));
        if lo < hi {
            self.nan_voxels += tiling::nan_voxels(slab.data.slice(s![
                ..,
                lo - slab.d0..hi - slab.d0,
                rows.clone(),
                ..
            ]));
        }
        // Straight into the label map: no slab-sized label buffer.
        self.pass.labels.labels_into(
            slab.data.view(),
            self.labels.slice_mut(s![slab.d0..slab.d0 + n, .., ..]),
        );
        if let Some(lg) = &mut self.logits {
            lg.slice_mut(s![.., slab.d0..slab.d0 + n, .., ..])
                .assign(&slab.data);
        }
        seconds.finalize += t.elapsed().as_secs_f64();
    }
}

/// The pass: windows in grid order, `pass.batch` per backend call. An allocation failure is
/// `Error::OutOfMemory` and ends the pass (the engine redoes the volume at a smaller batch).
pub(super) fn sliding_window(
    backend: &mut CpuBackend,
    pass: &Pass<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PassOutput> {
    let grid = pass.grid;
    let volume = pass.volume.host("the CPU backend")?;
    let (cin, roi, shape) = (volume.shape()[0], grid.roi, grid.shape);
    let cout = pass.labels.cout;
    let mut store = Store {
        pass,
        labels: crate::sys::alloc::try_zeros((shape[0], shape[1], shape[2]), "the label map")?,
        logits: pass
            .labels
            .keep_logits
            .then(|| {
                crate::sys::alloc::try_zeros((cout, shape[0], shape[1], shape[2]), "the logits")
            })
            .transpose()?,
        nan_voxels: 0,
    };
    let weights = pass.weights.to_owned();
    let mut acc = if pass.blend_in_memory {
        Acc::Whole(tiling::Blender::try_new(cout, grid, weights)?)
    } else {
        Acc::Slab(tiling::SlabBlender::try_new(cout, grid, weights)?)
    };
    let batch = pass.batch.max(1);
    let mut xb =
        crate::sys::alloc::try_zeros((batch, cin, roi[0], roi[1], roi[2]), "a batch of windows")
            .map_err(crate::sys::alloc::retryable)?;
    let mut seconds = StageTimes::default();
    let mut measured = 0u64;
    let total = grid.len();
    for (call, chunk) in grid.starts.chunks(batch).enumerate() {
        pass.cancel.check()?;
        let n = chunk.len();
        let t = Instant::now();
        for (i, &start) in chunk.iter().enumerate() {
            tiling::gather_window(volume, grid, start, pass.pad, xb.index_axis_mut(Axis(0), i));
        }
        if pass.inject_oom == Some(call + 1) {
            return Err(Error::OutOfMemory(format!(
                "injected at backend call {}",
                call + 1
            )));
        }
        let y = backend.run(xb.slice(s![..n, .., .., .., ..]))?;
        measured = measured.max(backend.last_stats().peak_live_bytes as u64);
        seconds.compute += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut done = Vec::new();
        for (i, &start) in chunk.iter().enumerate() {
            match &mut acc {
                Acc::Slab(b) => done.extend(b.add(start, y.index_axis(Axis(0), i))?),
                Acc::Whole(b) => b.add(start, y.index_axis(Axis(0), i)),
            }
        }
        seconds.blend += t.elapsed().as_secs_f64();
        for slab in done {
            store.put(slab, &mut seconds);
        }
        progress((call * batch + n).min(total), total);
    }
    match acc {
        Acc::Slab(b) => {
            if let Some(slab) = b.finish()? {
                store.put(slab, &mut seconds);
            }
        }
        Acc::Whole(b) => {
            let t = Instant::now();
            let out = b.finish()?;
            seconds.blend += t.elapsed().as_secs_f64();
            store.put(Slab { d0: 0, data: out }, &mut seconds);
        }
    }
    Ok(PassOutput {
        labels: store.labels,
        logits: store.logits,
        nan_voxels: store.nan_voxels,
        seconds,
        measured_activation_bytes: measured,
        peak_device_bytes: None,
        details: None,
    })
}
