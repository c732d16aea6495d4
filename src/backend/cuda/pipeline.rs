//! Streamed sliding-window inference on the device.
//!
//! Device memory must not grow with the volume, and copies must hide behind compute, so:
//! - windows are visited sorted by their D start; a worker thread converts the volume's D-planes
//!   to f16 once each, as the batches first need them, into pinned staging; the copy stream uploads
//!   them into an input ring of planes (slot z % ring, like the accumulators), and a kernel gathers
//!   each batch's windows (NDHWC, virtual `cval` padding) from it straight into the network input
//!   (`GatherMode::Device`). `GatherMode::Host` instead gathers whole windows on the host and
//!   copies them in (the reference: same bits);
//! - the compute stream waits on the copy events (no device-wide syncs) and runs the prepared
//!   launch list;
//! - window logits are blended into a ring of fp32 accumulators holding only the D-planes in
//!   flight (`ring` planes, plane z in slot z % ring); once every window touching a plane has been
//!   blended, the plane is finalised on the device (normalised logits or u16 argmax) into one of
//!   two staging buffers and copied out on a third stream into pinned memory, overlapping the next
//!   batch; the host stores finished planes into the output array.
//!
//! A batch never spans more D-planes than the ring holds (it is cut short instead). The ring is
//! the most planes any `batch` consecutive windows span (so no batch is cut for it), at most
//! `min(D, 2 * roi_d)`: `roi_d` at batch 1, `roi_d + step` while a batch spans two window rows.

use super::{drv, mem_reset_peak, mem_stats, Arg, CudaBackend, DevBuf, Prepared};
use crate::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaEvent, CudaStream, PinnedHostSlice};
use ndarray::{s, Array3, Array4, ArrayView3, ArrayView4, Axis};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Per-stage times of one [`CudaBackend::segment_windows`] call (ms). GPU stages are summed
/// CUDA-event intervals on their own streams; host stages are host clocks. `overlap` = (sum of
/// stage times) / wall: above 1 means stages ran concurrently.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuTimes {
    /// Host side of the gather (worker thread): window batches into pinned f16 staging (host
    /// gather), or volume planes converted to f16 once each (device gather).
    pub host_gather_ms: f64,
    /// Host-to-device copies of window batches or volume planes (copy stream).
    pub h2d_ms: f64,
    /// Filling the network input (compute stream): the gather kernels (device gather) or the
    /// copy from the staging buffer (host gather).
    pub input_fill_ms: f64,
    /// The launch list, summed over batches (compute stream).
    pub compute_ms: f64,
    /// Weighted accumulation of window logits into the ring (compute stream).
    pub blend_ms: f64,
    /// Normalise / argmax of finished planes (compute stream).
    pub finalize_ms: f64,
    /// Device-to-host copies of finished planes (download stream).
    pub d2h_ms: f64,
    /// Host copies of finished planes into the output array.
    pub host_store_ms: f64,
    /// Host wall time of the whole call.
    pub wall_ms: f64,
    /// Host time before the first batch: checks, device allocations, weight map upload.
    pub setup_ms: f64,
    /// Host time from queuing the last batch to the return (its GPU work, the last planes'
    /// finalisation, downloads and stores).
    pub tail_ms: f64,
    /// Windows gathered on the device from streamed volume planes (else on the host).
    pub gather_on_device: bool,
    /// Volume plane uploads (device gather).
    pub plane_uploads: usize,
    /// Sum of the stage times over wall time.
    pub overlap: f64,
    pub windows: usize,
    pub batches: usize,
    /// Finalisations (slabs of planes streamed out).
    pub slabs: usize,
    /// D-planes the accumulator ring holds.
    pub ring_planes: usize,
    /// High-water mark of the backend's own device allocations during the call (plan included).
    pub peak_device_bytes: u64,
    /// Device memory in use (cuMemGetInfo, whole device) before the call's allocations and once
    /// they are all made.
    pub mem_info_used_before: u64,
    pub mem_info_used_during: u64,
}

/// One batch of the schedule: windows `[begin, end)` of the D-sorted list, then planes
/// `[final_lo, final_hi)` are complete and get finalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub begin: usize,
    pub end: usize,
    pub final_lo: usize,
    pub final_hi: usize,
}

/// The most D-planes the ring ever holds: `min(d, 2 * rd)` for a volume of depth `d` and window
/// depth `rd` (a bound on [`ring_planes`] whatever the windows).
pub(crate) fn ring_cap(d: usize, rd: usize) -> usize {
    d.min(2 * rd).max(1)
}

/// Volume D starts of windows at padded `starts` (volume offset `pad_before` in D), sorted: the
/// order the pipeline visits them in.
pub fn window_z0(starts: &[[usize; 3]], pad_before: usize) -> Vec<i64> {
    let mut z0: Vec<i64> = starts
        .iter()
        .map(|s| s[0] as i64 - pad_before as i64)
        .collect();
    z0.sort_unstable();
    z0
}

/// Ring depth in D-planes for windows with sorted volume D starts `z0`, window depth `rd`,
/// volume depth `d`, `batch` windows per launch: the most planes any `batch` consecutive
/// windows span (clipped to the volume), so [`schedule`] cuts no batch short for the ring,
/// capped at [`ring_cap`] (batches spanning more are cut). W1 (rows of 7 windows, step rd/2):
/// `rd` at batch 1, `rd + step` for batches 2..7.
pub fn ring_planes(z0: &[i64], rd: usize, d: usize, batch: usize) -> usize {
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let n = z0.len();
    let span = (0..n)
        .map(|i| {
            let j = (i + batch.max(1)).min(n) - 1;
            clamp(z0[j] + rd as i64) - clamp(z0[i])
        })
        .max()
        .unwrap_or(0);
    span.clamp(1, ring_cap(d, rd))
}

/// Batches over windows whose volume D starts `z0` (may be negative: padding) are sorted
/// ascending. A batch is cut short where a window would reach past `lo + ring` (lo = first plane
/// not yet finalised = the batch's first window's start), so every plane in flight has its own
/// ring slot; planes before the first window are finalised first (an empty step).
pub(crate) fn schedule(z0: &[i64], rd: usize, d: usize, batch: usize) -> (usize, Vec<Step>) {
    let ring = ring_planes(z0, rd, d, batch);
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let z1 = |i: usize| clamp(z0[i] + rd as i64);
    let mut steps = Vec::new();
    let (mut lo, mut i) = (0usize, 0usize);
    if let Some(&first) = z0.first() {
        if clamp(first) > 0 {
            steps.push(Step {
                begin: 0,
                end: 0,
                final_lo: 0,
                final_hi: clamp(first),
            });
            lo = clamp(first);
        }
    }
    while i < z0.len() {
        let mut j = i + 1;
        while j < z0.len() && j - i < batch && z1(j) <= lo + ring {
            j += 1;
        }
        let hi = if j < z0.len() { clamp(z0[j]) } else { d };
        let hi = hi.max(lo);
        steps.push(Step {
            begin: i,
            end: j,
            final_lo: lo,
            final_hi: hi,
        });
        lo = hi;
        i = j;
    }
    if z0.is_empty() && d > 0 {
        steps.push(Step {
            begin: 0,
            end: 0,
            final_lo: 0,
            final_hi: d,
        });
    }
    (ring, steps)
}

/// Gathers windows (starts in padded coordinates) from the (C, D, H, W) volume into `out` as f16
/// NDHWC bits, `cval` outside the volume. Parallel over (window, z) planes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_windows(
    vol: &[f32],
    dims: [usize; 4],
    pad_before: [usize; 3],
    roi: [usize; 3],
    starts: &[[usize; 3]],
    cval: f32,
    out: &mut [u16],
) {
    let [c, d, h, w] = dims;
    let plane = roi[1] * roi[2] * c;
    let cv = half::f16::from_f32(cval).to_bits();
    let inside =
        |s: usize, p: usize, n: usize| -> Option<usize> { (s >= p && s - p < n).then(|| s - p) };
    out[..starts.len() * roi[0] * plane]
        .par_chunks_mut(plane)
        .enumerate()
        .for_each(|(i, dst)| {
            let s = starts[i / roi[0]];
            let z = i % roi[0];
            let Some(vz) = inside(s[0] + z, pad_before[0], d) else {
                dst.fill(cv);
                return;
            };
            for (y, row) in dst.chunks_mut(roi[2] * c).enumerate() {
                let Some(vy) = inside(s[1] + y, pad_before[1], h) else {
                    row.fill(cv);
                    continue;
                };
                for (x, px) in row.chunks_mut(c).enumerate() {
                    match inside(s[2] + x, pad_before[2], w) {
                        Some(vx) => {
                            for (ch, o) in px.iter_mut().enumerate() {
                                *o = half::f16::from_f32(vol[((ch * d + vz) * h + vy) * w + vx])
                                    .to_bits();
                            }
                        }
                        None => px.fill(cv),
                    }
                }
            }
        });
}

/// `VOXTILE_INJECT_OOM=N`: the N-th batch (1-based) of a call fails with `Error::OutOfMemory`
/// before it touches anything, once per process for each N (test hook for the retry path).
fn injected_oom(batch_index: usize) -> bool {
    static FIRED: AtomicUsize = AtomicUsize::new(0);
    let Some(n) = std::env::var("VOXTILE_INJECT_OOM")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    else {
        return false;
    };
    n != 0 && n == batch_index + 1 && FIRED.swap(n, Ordering::SeqCst) != n
}

/// Output of the pipeline, either form.
enum Out {
    Logits(Array4<f32>),
    Labels(Array3<u16>),
}

impl CudaBackend {
    /// High-water mark of this backend's device allocations (plan, constants, pipeline buffers)
    /// since the last `prepare` or `segment_windows*` call started.
    pub fn peak_device_bytes(&self) -> Option<u64> {
        Some(mem_stats(&self.ctx).1)
    }

    /// Predicted peak device bytes of `segment_windows` for window `roi`, `batch` windows per
    /// launch, `channels_out` classes and a padded volume `padded`: the prepared plan (weights +
    /// activations of the launch list, scaled to `batch`; counted only when prepared for `roi`)
    /// plus the pipeline's input staging, weight map, accumulator ring and output staging (logits
    /// form, the larger). Independent of the volume's D beyond `2 * roi[0]`.
    pub fn planned_device_bytes(
        &self,
        roi: [usize; 3],
        batch: usize,
        channels_out: usize,
        padded: [usize; 3],
    ) -> u64 {
        let al = |b: usize| b.max(256) as u64;
        let (plan, cin) = match &self.prepared {
            Some(p) if p.roi == roi => {
                let fixed: u64 = p.consts.iter().map(|b| al(b.bytes)).sum();
                let single = p
                    .single
                    .as_ref()
                    .map_or(0, |s| al(s.stage_in.bytes) + al(s.stage_out.bytes));
                let scaled: u64 = [&p.arena, &p.norm_sums, &p.norm_ab]
                    .into_iter()
                    .map(|b| al(b.bytes))
                    .sum::<u64>()
                    + single;
                (
                    fixed + (scaled * batch as u64).div_ceil(p.batch.max(1) as u64),
                    p.cin,
                )
            }
            _ => (0, 1),
        };
        plan + pipeline_bytes(roi, batch, cin, channels_out, padded, false)
    }

    /// Sliding-window inference, streamed: windows (`starts` in padded coordinates, padded size
    /// `padded`, `pad_before` voxels of `cval` before the volume `(C, D, H, W)`) are gathered on
    /// the host, run in batches of `batch` and blended with `weights` (roi) in fp32 as MONAI does
    /// (sum of w * logits / sum of w). Returns blended logits `(Cout, D, H, W)`.
    /// `prepare(graph, >= batch, roi)` first. Any window order is accepted (sorted by D here).
    #[allow(clippy::too_many_arguments)]
    pub fn segment_windows(
        &mut self,
        vol: ArrayView4<f32>,
        padded: [usize; 3],
        pad_before: [usize; 3],
        roi: [usize; 3],
        starts: &[[usize; 3]],
        weights: ArrayView3<f32>,
        batch: usize,
        cval: f32,
    ) -> Result<(Array4<f32>, GpuTimes)> {
        match self.windows_impl(
            vol, padded, pad_before, roi, starts, weights, batch, cval, false,
        )? {
            (Out::Logits(a), t) => Ok((a, t)),
            (Out::Labels(_), _) => Err(Error::Backend("pipeline returned labels".into())),
        }
    }

    /// As [`Self::segment_windows`], but the argmax over channels is taken on the device and only
    /// labels `(D, H, W)` come back (first maximum wins; up to 65536 classes).
    #[allow(clippy::too_many_arguments)]
    pub fn segment_windows_argmax(
        &mut self,
        vol: ArrayView4<f32>,
        padded: [usize; 3],
        pad_before: [usize; 3],
        roi: [usize; 3],
        starts: &[[usize; 3]],
        weights: ArrayView3<f32>,
        batch: usize,
        cval: f32,
    ) -> Result<(Array3<u16>, GpuTimes)> {
        match self.windows_impl(
            vol, padded, pad_before, roi, starts, weights, batch, cval, true,
        )? {
            (Out::Labels(a), t) => Ok((a, t)),
            (Out::Logits(_), _) => Err(Error::Backend("pipeline returned logits".into())),
        }
    }

    fn ensure_window_plan(&self, roi: [usize; 3], batch: usize) -> Result<&Prepared> {
        let prep = self.prepared()?;
        if prep.roi != roi || prep.batch < batch {
            return Err(Error::Invalid(format!(
                "the CUDA backend was prepared for window {:?} batch {}, not window {roi:?} batch {batch}",
                prep.roi, prep.batch
            )));
        }
        if prep.out_spatial != roi {
            return Err(Error::Invalid(format!(
                "the model maps window {roi:?} to {:?}; sliding-window blending needs equal sizes",
                prep.out_spatial
            )));
        }
        Ok(prep)
    }

    #[allow(clippy::too_many_arguments)]
    fn windows_impl(
        &mut self,
        vol: ArrayView4<f32>,
        padded: [usize; 3],
        pad_before: [usize; 3],
        roi: [usize; 3],
        starts: &[[usize; 3]],
        weights: ArrayView3<f32>,
        batch: usize,
        cval: f32,
        argmax: bool,
    ) -> Result<(Out, GpuTimes)> {
        let t0 = Instant::now();
        if batch == 0 {
            return Err(Error::Invalid("window batch must be at least 1".into()));
        }
        let prep = self.ensure_window_plan(roi, batch)?;
        let (c, d, h, w) = vol.dim();
        if c != prep.cin {
            return Err(Error::Invalid(format!(
                "the volume has {c} channels, the model takes {}",
                prep.cin
            )));
        }
        if d * h * w == 0 {
            return Err(Error::Invalid(format!(
                "the volume {:?} is empty",
                [d, h, w]
            )));
        }
        if weights.dim() != (roi[0], roi[1], roi[2]) {
            return Err(Error::Invalid(format!(
                "weight map {:?} differs from window {roi:?}",
                weights.dim()
            )));
        }
        for a in 0..3 {
            if padded[a] < [d, h, w][a] + pad_before[a] || padded[a] < roi[a] {
                return Err(Error::Invalid(format!("padded size {padded:?} does not hold the volume {:?} after padding {pad_before:?} or the window {roi:?}", [d, h, w])));
            }
        }
        if let Some(s) = starts
            .iter()
            .find(|s| (0..3).any(|a| s[a] + roi[a] > padded[a]))
        {
            return Err(Error::Invalid(format!(
                "window start {s:?} + {roi:?} exceeds the padded volume {padded:?}"
            )));
        }
        let cout = prep.cout;
        if argmax && cout > 65536 {
            return Err(Error::Invalid(format!(
                "argmax labels are u16: {cout} classes are too many"
            )));
        }
        mem_reset_peak(&self.ctx);
        let mem_before = cu::mem_get_info().map(|(f, t)| (t - f) as u64).unwrap_or(0);
        let mut cache = self.pinned.take().unwrap_or_default();
        let r = self.pipeline(
            vol, pad_before, roi, starts, weights, batch, cval, argmax, t0, mem_before, &mut cache,
        );
        if r.is_err() {
            // Nothing may still read or write buffers about to be freed.
            let _ = self.ctx.synchronize();
        }
        self.pinned = Some(cache);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn pipeline(
        &self,
        vol: ArrayView4<f32>,
        pad_before: [usize; 3],
        roi: [usize; 3],
        starts: &[[usize; 3]],
        weights: ArrayView3<f32>,
        batch: usize,
        cval: f32,
        argmax: bool,
        t0: Instant,
        mem_before: u64,
        cache: &mut PinnedCache,
    ) -> Result<(Out, GpuTimes)> {
        let prep = self.prepared()?;
        let (c, d, h, w) = vol.dim();
        let hw = h * w;
        let cout = prep.cout;
        // D order; blending is order-independent up to fp32 rounding, the schedule needs order.
        let mut order: Vec<[usize; 3]> = starts.to_vec();
        order.sort_by_key(|s| s[0]);
        let z0 = window_z0(&order, pad_before[0]);
        let (ring, sched) = schedule(&z0, roi[0], d, batch);
        let batches: Vec<&Step> = sched.iter().filter(|st| st.end > st.begin).collect();
        let rvox: usize = roi.iter().product();
        let in_win = prep.cin * rvox;
        let in_len = batch * in_win;
        let plane_in = c * hw;
        let on_device = gathers_on_device(cache.gather, ring, plane_in, in_len, cout, hw);
        // The host gather indexes a standard-layout slice; the device path's plane conversion
        // reads any layout, so it never copies the whole volume.
        let vol_std = if on_device {
            None
        } else {
            Some(vol.as_standard_layout())
        };
        let vols: &[f32] = match &vol_std {
            Some(v) => v
                .as_slice()
                .ok_or_else(|| Error::Invalid("volume is not contiguous".into()))?,
            None => &[],
        };
        let wmap: Vec<f32> = match weights.as_slice() {
            Some(s) => s.to_vec(),
            None => weights.iter().copied().collect(),
        };

        // Device buffers (all counted by the tracker) and pinned host staging.
        if in_win > i32::MAX as usize {
            return Err(Error::Invalid(format!(
                "window {roi:?} with {} channels is too large for the gather kernel",
                prep.cin
            )));
        }
        // Host mode: two window-batch staging buffers. Device mode: the input ring of volume
        // planes (slot z % ring, [ring][C][H][W] f16), in step with the accumulator ring.
        let stage = stage_planes(in_len, plane_in, ring);
        let uploads = if on_device {
            let spans: Vec<(usize, usize)> = batches.iter().map(|st| (st.begin, st.end)).collect();
            plane_uploads(&z0, &spans, roi[0], d, stage)
        } else {
            Vec::new()
        };
        let dev_in: Vec<DevBuf> = if on_device {
            vec![DevBuf::new(&self.ctx, ring * plane_in * 2)?]
        } else {
            vec![
                DevBuf::new(&self.ctx, in_len * 2)?,
                DevBuf::new(&self.ctx, in_len * 2)?,
            ]
        };
        let dw = DevBuf::upload(&self.ctx, &self.copy, &wmap)?;
        let acc = DevBuf::new(&self.ctx, ring * cout * hw * 4)?;
        let wsum = DevBuf::new(&self.ctx, ring * hw * 4)?;
        let chunk = chunk_planes(ring, hw, cout, argmax);
        let out_bytes = if argmax {
            chunk * hw * 2
        } else {
            chunk * cout * hw * 4
        };
        let dev_out = (0..OUT_SLOTS)
            .map(|_| DevBuf::new(&self.ctx, out_bytes))
            .collect::<Result<Vec<_>>>()?;
        let dl = self.ctx.new_stream().map_err(drv("stream creation"))?;
        let s = &*self.stream;
        let cp = &*self.copy;
        // SAFETY: zeroing our own ring on the compute stream before any blend.
        unsafe {
            cu::memset_d8_async(acc.ptr, 0, ring * cout * hw * 4, s.cu_stream())
                .map_err(drv("memset"))?;
            cu::memset_d8_async(wsum.ptr, 0, ring * hw * 4, s.cu_stream())
                .map_err(drv("memset"))?;
        }
        if self.poison {
            self.poison_buffers(prep)?;
        }
        let mem_during = cu::mem_get_info().map(|(f, t)| (t - f) as u64).unwrap_or(0);
        // The weight map upload must land before the first blend.
        let wready = ev(cp)?;
        s.wait(&wready).map_err(drv("stream wait"))?;

        let mut out = if argmax {
            Out::Labels(Array3::zeros((d, h, w)))
        } else {
            Out::Logits(Array4::zeros((cout, d, h, w)))
        };
        let mut times = GpuTimes {
            windows: starts.len(),
            batches: batches.len(),
            ring_planes: ring,
            gather_on_device: on_device,
            plane_uploads: uploads.len(),
            mem_info_used_before: mem_before,
            mem_info_used_during: mem_during,
            ..Default::default()
        };
        let mut ev_h2d: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        // Per batch: input fill start, input filled, launch list done, blends done.
        let mut ev_cmp: Vec<(CudaEvent, CudaEvent, CudaEvent, CudaEvent)> = Vec::new();
        let mut ev_fin: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let mut ev_d2h: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let i32s = |v: usize| Arg::I32(v as i32);

        let PinnedCache {
            inp, outf, outl, ..
        } = cache;
        let [ia, ib] = inp;
        let stage_len = if on_device { stage * plane_in } else { in_len };
        let mut slots: [Option<&mut [u16]>; 2] = [
            Some(pinned(&self.ctx, ia, stage_len)?),
            Some(pinned(&self.ctx, ib, stage_len)?),
        ];
        let mut free_out: Vec<Option<HostOut>> = if argmax {
            outl.iter_mut()
                .map(|p| Ok(Some(HostOut::L(pinned(&self.ctx, p, chunk * hw)?))))
                .collect::<Result<_>>()?
        } else {
            outf.iter_mut()
                .map(|p| Ok(Some(HostOut::F(pinned(&self.ctx, p, chunk * cout * hw)?))))
                .collect::<Result<_>>()?
        };
        let dims = [c, d, h, w];

        let gather = |k: usize, buf: &mut [u16]| -> f64 {
            let st = batches[k];
            let t = Instant::now();
            gather_windows(
                vols,
                dims,
                pad_before,
                roi,
                &order[st.begin..st.end],
                cval,
                buf,
            );
            t.elapsed().as_secs_f64() * 1e3
        };
        let gather = &gather;
        let uploads = &uploads;
        let out_ref = &mut out;
        times.setup_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut t_last = Instant::now();
        let result = std::thread::scope(|sc| -> Result<f64> {
            // Finished planes are stored by a worker: it waits for each download, copies it
            // into the output and hands the pinned slot back; while idle it touches the output's
            // next planes so their page faults are not paid in the store (nor in the tail).
            let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, usize, HostOut, CudaEvent)>();
            let (ack_tx, ack_rx) = std::sync::mpsc::channel::<(usize, HostOut)>();
            let storer = sc.spawn(move || -> Result<f64> {
                use std::sync::mpsc::TryRecvError;
                let mut ms = 0.0;
                let mut touched = 0usize;
                let step = prefault_planes(out_ref, hw);
                loop {
                    let msg = match rx.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) if touched < d => {
                            let np = step.min(d - touched);
                            prefault(out_ref, touched, np, hw);
                            touched += np;
                            continue;
                        }
                        Err(TryRecvError::Empty) => match rx.recv() {
                            Ok(m) => m,
                            Err(_) => break,
                        },
                        Err(TryRecvError::Disconnected) => break,
                    };
                    let (slot, p0, np, buf, done) = msg;
                    done.synchronize().map_err(drv("plane download"))?;
                    let t = Instant::now();
                    store_planes(out_ref, &buf, p0, np, hw)?;
                    ms += t.elapsed().as_secs_f64() * 1e3;
                    // Stores come in plane order: never touch a stored plane again.
                    touched = touched.max(p0 + np);
                    if ack_tx.send((slot, buf)).is_err() {
                        break;
                    }
                }
                Ok(ms)
            });
            // Device mode: a feeder converts the volume planes of each upload to f16 into a free
            // pinned slot (after the slot's previous upload is done) and hands it over.
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<(&mut [u16], f64)>();
            let (free_tx, free_rx) = std::sync::mpsc::channel::<(&mut [u16], Option<CudaEvent>)>();
            let mut feeder = None;
            if on_device {
                for sl in slots.iter_mut() {
                    let _ = free_tx.send((sl.take().expect("slot free"), None));
                }
                feeder = Some(sc.spawn(move || -> Result<()> {
                    for u in uploads.iter() {
                        let Ok((buf, used)) = free_rx.recv() else {
                            break;
                        };
                        if let Some(e) = used {
                            e.synchronize().map_err(drv("plane upload"))?;
                        }
                        let t = Instant::now();
                        convert_planes(vol, u.za, u.zb, &mut buf[..(u.zb - u.za) * plane_in]);
                        let ms = t.elapsed().as_secs_f64() * 1e3;
                        if ready_tx.send((buf, ms)).is_err() {
                            break;
                        }
                    }
                    Ok(())
                }));
            } else {
                drop((ready_tx, free_rx));
            }
            let feeder_failed = |feeder: &mut Option<
                std::thread::ScopedJoinHandle<'_, Result<()>>,
            >|
             -> Error {
                match feeder.take().map(|f| f.join()) {
                    Some(Ok(Err(e))) => e,
                    Some(Err(_)) => Error::Backend("the plane conversion thread panicked".into()),
                    _ => Error::Backend("the plane conversion thread stopped".into()),
                }
            };
            let mut pending = None;
            if !on_device && !batches.is_empty() {
                let buf = slots[0].take().expect("slot 0 free");
                pending = Some(sc.spawn(move || {
                    let ms = gather(0, buf);
                    (buf, ms)
                }));
            }
            // Events: consumption of dev_in[i] by the compute stream, H2D done per pinned slot.
            let mut in_used: [Option<CudaEvent>; 2] = [None, None];
            let mut h2d_done: [Option<CudaEvent>; 2] = [None, None];
            let mut out_used: Vec<Option<CudaEvent>> = (0..OUT_SLOTS).map(|_| None).collect();
            let mut nfin = 0usize;
            let mut bi = 0usize;
            let mut next_up = 0usize;
            for st in &sched {
                if st.end > st.begin {
                    let k = bi;
                    bi += 1;
                    let slot = k % 2;
                    if injected_oom(k) {
                        return Err(Error::OutOfMemory(format!(
                            "injected by VOXTILE_INJECT_OOM at batch {}",
                            k + 1
                        )));
                    }
                    let n = st.end - st.begin;
                    let c0;
                    if on_device {
                        // This batch's new volume planes into the input ring. They overwrite only
                        // planes below this batch's first unfinished plane, which no later batch
                        // reads: once batch k-1 has gathered, the slots are free.
                        let mut uploaded = None;
                        while next_up < uploads.len() && uploads[next_up].k == k {
                            let u = uploads[next_up];
                            next_up += 1;
                            let (buf, ms) = match ready_rx.recv() {
                                Ok(m) => m,
                                Err(_) => return Err(feeder_failed(&mut feeder)),
                            };
                            times.host_gather_ms += ms;
                            if k > 0 {
                                cp.wait(&ev_cmp[k - 1].1).map_err(drv("stream wait"))?;
                            }
                            let h0 = ev(cp)?;
                            let np = u.zb - u.za;
                            let s0 = u.za % ring;
                            let n1 = np.min(ring - s0);
                            // SAFETY: the ring holds `ring` planes; the pinned slot is not written
                            // again before the event sent with it has completed.
                            unsafe {
                                cu::memcpy_htod_async(
                                    dev_in[0].ptr + (s0 * plane_in * 2) as u64,
                                    &buf[..n1 * plane_in],
                                    cp.cu_stream(),
                                )
                                .map_err(drv("plane upload"))?;
                                if np > n1 {
                                    cu::memcpy_htod_async(
                                        dev_in[0].ptr,
                                        &buf[n1 * plane_in..np * plane_in],
                                        cp.cu_stream(),
                                    )
                                    .map_err(drv("plane upload"))?;
                                }
                            }
                            let h1 = ev(cp)?;
                            let _ = free_tx.send((buf, Some(ev(cp)?)));
                            uploaded = Some(ev(cp)?);
                            ev_h2d.push((h0, h1));
                        }
                        if let Some(e) = &uploaded {
                            s.wait(e).map_err(drv("stream wait"))?;
                        }
                        c0 = ev(s)?;
                        for (b, start) in order[st.begin..st.end].iter().enumerate() {
                            self.eltwise(
                                s,
                                "gather_window_ring",
                                in_win,
                                &mut [
                                    Arg::Ptr(dev_in[0].ptr),
                                    Arg::Ptr(prep.input + (b * in_win * 2) as u64),
                                    i32s(c),
                                    i32s(ring),
                                    i32s(d),
                                    i32s(h),
                                    i32s(w),
                                    i32s(start[0]),
                                    i32s(start[1]),
                                    i32s(start[2]),
                                    i32s(pad_before[0]),
                                    i32s(pad_before[1]),
                                    i32s(pad_before[2]),
                                    i32s(roi[0]),
                                    i32s(roi[1]),
                                    i32s(roi[2]),
                                    Arg::I32(half::f16::from_f32(cval).to_bits() as i32),
                                ],
                            )?;
                        }
                    } else {
                        let (buf, gms) =
                            pending
                                .take()
                                .expect("gather pending")
                                .join()
                                .map_err(|_| {
                                    Error::Backend("the window gather thread panicked".into())
                                })?;
                        times.host_gather_ms += gms;
                        // Copy-in once the compute stream has taken batch k-2 out of dev_in[slot].
                        if let Some(e) = &in_used[slot] {
                            cp.wait(e).map_err(drv("stream wait"))?;
                        }
                        let h0 = ev(cp)?;
                        // SAFETY: dev_in[slot] holds in_len halves >= n * in_win; the pinned
                        // buffer is not written again before h1 is synchronised (below).
                        unsafe {
                            cu::memcpy_htod_async(
                                dev_in[slot].ptr,
                                &buf[..n * in_win],
                                cp.cu_stream(),
                            )
                        }
                        .map_err(drv("window upload"))?;
                        let h1 = ev(cp)?;
                        slots[slot] = Some(buf);
                        h2d_done[slot] = Some(ev(cp)?);
                        // Host gather of batch k+1 overlaps this batch's GPU work.
                        if k + 1 < batches.len() {
                            let ns = (k + 1) % 2;
                            if let Some(e) = &h2d_done[ns] {
                                e.synchronize().map_err(drv("synchronize"))?;
                            }
                            let buf = slots[ns].take().expect("slot free");
                            pending = Some(sc.spawn(move || {
                                let ms = gather(k + 1, buf);
                                (buf, ms)
                            }));
                        }
                        ev_h2d.push((h0, h1));
                        s.wait(&ev_h2d.last().expect("pushed").1)
                            .map_err(drv("stream wait"))?;
                        c0 = ev(s)?;
                        // SAFETY: both hold >= n * in_win halves; stream ordered.
                        unsafe {
                            cu::memcpy_dtod_async(
                                prep.input,
                                dev_in[slot].ptr,
                                n * in_win * 2,
                                s.cu_stream(),
                            )
                        }
                        .map_err(drv("device copy"))?;
                        in_used[slot] = Some(ev(s)?);
                    }
                    let cg = ev(s)?;
                    self.run_steps(prep, n)?;
                    let c1 = ev(s)?;
                    let out_win = cout * rvox;
                    for (b, start) in order[st.begin..st.end].iter().enumerate() {
                        let src = prep.output + (b * out_win * 2) as u64;
                        self.eltwise(
                            s,
                            "blend_window_ring",
                            rvox,
                            &mut [
                                Arg::Ptr(src),
                                Arg::Ptr(dw.ptr),
                                Arg::Ptr(acc.ptr),
                                Arg::Ptr(wsum.ptr),
                                i32s(cout),
                                i32s(ring),
                                i32s(d),
                                i32s(h),
                                i32s(w),
                                i32s(start[0]),
                                i32s(start[1]),
                                i32s(start[2]),
                                i32s(pad_before[0]),
                                i32s(pad_before[1]),
                                i32s(pad_before[2]),
                                i32s(roi[0]),
                                i32s(roi[1]),
                                i32s(roi[2]),
                            ],
                        )?;
                    }
                    let c2 = ev(s)?;
                    ev_cmp.push((c0, cg, c1, c2));
                    if k + 1 == batches.len() {
                        t_last = Instant::now();
                    }
                }
                // Finalise complete planes in chunks of at most `chunk` (<= ring) planes.
                let mut p0 = st.final_lo;
                while p0 < st.final_hi {
                    let np = (st.final_hi - p0).min(chunk);
                    let slot = nfin % OUT_SLOTS;
                    nfin += 1;
                    // The download of finalisation m - OUT_SLOTS must have read dev_out[slot] ...
                    if let Some(e) = &out_used[slot] {
                        s.wait(e).map_err(drv("stream wait"))?;
                    }
                    let f0 = ev(s)?;
                    self.finalize(
                        s,
                        [acc.ptr, wsum.ptr, dev_out[slot].ptr],
                        argmax,
                        [cout, ring, h, w, p0, np],
                    )?;
                    let f1 = ev(s)?;
                    dl.wait(&f1).map_err(drv("stream wait"))?;
                    // ... and the store worker must have handed the pinned slot back.
                    while free_out[slot].is_none() {
                        match ack_rx.recv() {
                            Ok((k, buf)) => free_out[k] = Some(buf),
                            Err(_) => {
                                drop(tx);
                                storer.join().map_err(|_| {
                                    Error::Backend("the plane store thread panicked".into())
                                })??;
                                return Err(Error::Backend(
                                    "the plane store thread stopped".into(),
                                ));
                            }
                        }
                    }
                    let mut buf = free_out[slot].take().expect("slot returned");
                    let d0 = ev(&dl)?;
                    // SAFETY: dev_out[slot] holds np planes; the worker reads the pinned slot only
                    // after synchronising `done`.
                    unsafe {
                        match &mut buf {
                            HostOut::L(hs) => cu::memcpy_dtoh_async(
                                &mut hs[..np * hw],
                                dev_out[slot].ptr,
                                dl.cu_stream(),
                            ),
                            HostOut::F(hs) => cu::memcpy_dtoh_async(
                                &mut hs[..np * hw * cout],
                                dev_out[slot].ptr,
                                dl.cu_stream(),
                            ),
                        }
                    }
                    .map_err(drv("plane download"))?;
                    let d1 = ev(&dl)?;
                    out_used[slot] = Some(ev(&dl)?);
                    tx.send((slot, p0, np, buf, ev(&dl)?))
                        .map_err(|_| Error::Backend("the plane store thread stopped".into()))?;
                    ev_fin.push((f0, f1));
                    ev_d2h.push((d0, d1));
                    p0 += np;
                }
            }
            drop(tx);
            drop(free_tx);
            if let Some(f) = feeder.take() {
                f.join()
                    .map_err(|_| Error::Backend("the plane conversion thread panicked".into()))??;
            }
            times.slabs = nfin;
            storer
                .join()
                .map_err(|_| Error::Backend("the plane store thread panicked".into()))?
        });
        if result.is_err() {
            // Nothing may still read or write the buffers dropped on return.
            let _ = self.ctx.synchronize();
        }
        times.host_store_ms = result?;
        // Every download was waited for in `store`; the compute and copy streams too, for timing.
        s.synchronize().map_err(drv("synchronize"))?;
        cp.synchronize().map_err(drv("synchronize"))?;
        times.tail_ms = t_last.elapsed().as_secs_f64() * 1e3;
        let ms = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> {
            Ok(a.elapsed_ms(b).map_err(drv("event timing"))? as f64)
        };
        for (a, b) in &ev_h2d {
            times.h2d_ms += ms(a, b)?;
        }
        for (a, g, b, e) in &ev_cmp {
            times.input_fill_ms += ms(a, g)?;
            times.compute_ms += ms(g, b)?;
            times.blend_ms += ms(b, e)?;
        }
        for (a, b) in &ev_fin {
            times.finalize_ms += ms(a, b)?;
        }
        for (a, b) in &ev_d2h {
            times.d2h_ms += ms(a, b)?;
        }
        times.peak_device_bytes = mem_stats(&self.ctx).1;
        times.wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        let sum = times.host_gather_ms
            + times.h2d_ms
            + times.input_fill_ms
            + times.compute_ms
            + times.blend_ms
            + times.finalize_ms
            + times.d2h_ms
            + times.host_store_ms;
        times.overlap = sum / times.wall_ms.max(1e-9);
        Ok((out, times))
    }
}

/// Pinned host slot of finished planes: f32 logits or u16 labels.
enum HostOut<'a> {
    F(&'a mut [f32]),
    L(&'a mut [u16]),
}

/// Copies `np` downloaded planes starting at plane `p0` into the output array, in parallel
/// pieces (the copy is bound by page faults and memory bandwidth, not one core).
fn store_planes(out: &mut Out, buf: &HostOut, p0: usize, np: usize, hw: usize) -> Result<()> {
    const PIECE: usize = 1 << 16;
    match (out, buf) {
        (Out::Labels(l), HostOut::L(src)) => {
            let dst = l
                .as_slice_mut()
                .ok_or_else(|| Error::Backend("label array is not contiguous".into()))?;
            dst[p0 * hw..(p0 + np) * hw]
                .par_chunks_mut(PIECE)
                .zip(src[..np * hw].par_chunks(PIECE))
                .for_each(|(d, s)| d.copy_from_slice(s));
        }
        (Out::Logits(a), HostOut::F(src)) => {
            let mut dsts = Vec::new();
            for plane in a.axis_iter_mut(Axis(0)) {
                let dst = plane
                    .into_slice()
                    .ok_or_else(|| Error::Backend("logit array is not contiguous".into()))?;
                dsts.push(&mut dst[p0 * hw..(p0 + np) * hw]);
            }
            dsts.into_par_iter().enumerate().for_each(|(ch, dst)| {
                dst.par_chunks_mut(PIECE)
                    .zip(src[ch * np * hw..(ch + 1) * np * hw].par_chunks(PIECE))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            });
        }
        _ => return Err(Error::Backend("output and staging kinds differ".into())),
    }
    Ok(())
}

/// Planes the store worker touches per idle step: about 2 MiB of output.
fn prefault_planes(out: &Out, hw: usize) -> usize {
    let plane = match out {
        Out::Labels(_) => hw * 2,
        Out::Logits(a) => a.shape()[0] * hw * 4,
    };
    (2usize << 20).div_ceil(plane.max(1)).max(1)
}

/// Writes zeros over planes `[p0, p0 + np)` of the (still all-zero) output, so the first-touch
/// page faults of a fresh allocation are paid while the worker waits for downloads.
fn prefault(out: &mut Out, p0: usize, np: usize, hw: usize) {
    match out {
        Out::Labels(l) => {
            if let Some(s) = l.as_slice_mut() {
                s[p0 * hw..(p0 + np) * hw].fill(0);
            }
        }
        Out::Logits(a) => {
            for mut plane in a.axis_iter_mut(Axis(0)) {
                if let Some(s) = plane.as_slice_mut() {
                    s[p0 * hw..(p0 + np) * hw].fill(0.0);
                }
            }
        }
    }
}

/// Where the windows of a batch are gathered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GatherMode {
    /// `Device` when its plane ring is small next to the accumulator ring or no larger than the
    /// host gather's staging ([`device_gather_fits`]), else `Host`.
    #[default]
    Auto,
    /// The volume's D-planes are converted to f16 on the host once each, streamed into a device
    /// ring in step with the accumulator ring, and a kernel gathers the windows from it: about
    /// 1/overlap^3 of the host work and copies of `Host`; device memory still independent of D.
    Device,
    /// Every window is gathered on the host into pinned staging and copied in (the reference).
    Host,
}

/// Whether the device gather's input ring (`ring_in` bytes) is cheap enough: no larger than the
/// host gather's two window batches (`host_in`) or a quarter of the accumulator ring with its
/// weight sums (`acc`). It is (Cin * 2) / ((Cout + 1) * 4) of the latter, so this holds unless
/// the inputs have several times more channels than the outputs.
pub fn device_gather_fits(ring_in: usize, host_in: usize, acc: usize) -> bool {
    ring_in <= host_in.max(acc / 4)
}

impl CudaBackend {
    /// Chooses the window gather of later `segment_windows*` calls (both give the same bits).
    pub fn set_gather_mode(&mut self, mode: GatherMode) {
        self.pinned.get_or_insert_with(Default::default).gather = mode;
    }
}

/// Planes of volume input per pinned staging slot (device gather): at least one window batch's
/// worth of halves or 8 MiB, at most the ring.
pub(crate) fn stage_planes(in_len: usize, plane_in: usize, ring: usize) -> usize {
    (in_len.max(4 << 20) / plane_in.max(1)).clamp(1, ring.max(1))
}

/// One host-to-device upload of volume planes `[za, zb)` into the input ring, before batch `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Upload {
    pub k: usize,
    pub za: usize,
    pub zb: usize,
}

/// The uploads of the device gather, in order: before batch k (windows `spans[k]` of the
/// D-sorted list with volume D starts `z0`), the planes it reads that are not in the ring yet,
/// in pieces of at most `stage` planes. Planes arrive once each, in increasing order.
pub(crate) fn plane_uploads(
    z0: &[i64],
    spans: &[(usize, usize)],
    rd: usize,
    d: usize,
    stage: usize,
) -> Vec<Upload> {
    let mut ups = Vec::new();
    let mut loaded = 0usize;
    for (k, &(b, e)) in spans.iter().enumerate() {
        // Sorted by D start: the batch's last window reaches deepest.
        let need = z0[b..e]
            .iter()
            .map(|&z| (z + rd as i64).clamp(0, d as i64) as usize)
            .max()
            .unwrap_or(0);
        while loaded < need {
            let zb = need.min(loaded + stage.max(1));
            ups.push(Upload { k, za: loaded, zb });
            loaded = zb;
        }
    }
    ups
}

/// Volume planes `[za, zb)` of the (C, D, H, W) volume (any strides) as f16 bits in the input
/// ring's slot layout `[z - za][c][h][w]`; the same bits as `half::f16::from_f32` per value.
/// Parallel over (plane, channel); contiguous rows use the vector conversion.
pub(crate) fn convert_planes(vol: ArrayView4<f32>, za: usize, zb: usize, out: &mut [u16]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let (c, _, h, w) = vol.dim();
    out[..(zb - za) * c * h * w]
        .par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(i, dst)| {
            let src = vol.slice(s![i % c, za + i / c, .., ..]);
            let dst: &mut [half::f16] = dst.reinterpret_cast_mut();
            if let Some(sl) = src.as_slice() {
                dst.convert_from_f32_slice(sl);
                return;
            }
            for (row, drow) in src.outer_iter().zip(dst.chunks_mut(w)) {
                match row.as_slice() {
                    Some(sl) => drow.convert_from_f32_slice(sl),
                    None => {
                        for (o, v) in drow.iter_mut().zip(row.iter()) {
                            *o = half::f16::from_f32(*v);
                        }
                    }
                }
            }
        });
}

/// Finished-plane staging slots (device and pinned): finalisation m waits for the store of
/// m - OUT_SLOTS, so several slots keep the host from waiting on the batch just queued.
pub(crate) const OUT_SLOTS: usize = 4;

/// Pipeline state kept by the backend between calls (allocating pinned memory is slow): two
/// input staging buffers (f16 bits: window batches or volume planes), the finished-plane slots of
/// each output kind, and the gather mode.
#[derive(Default)]
pub struct PinnedCache {
    inp: [Option<PinnedHostSlice<u16>>; 2],
    outf: [Option<PinnedHostSlice<f32>>; OUT_SLOTS],
    outl: [Option<PinnedHostSlice<u16>>; OUT_SLOTS],
    gather: GatherMode,
}

/// The cached pinned buffer when it holds `n` elements, else a new one.
fn pinned<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    slot: &'a mut Option<PinnedHostSlice<T>>,
    n: usize,
) -> Result<&'a mut [T]> {
    if slot.as_ref().is_none_or(|p| p.len() < n) {
        *slot = None;
        // SAFETY: written before read. Flags 0: cached, not write-combined, so host reads of
        // downloaded planes are fast.
        *slot = Some(
            unsafe { ctx.alloc_pinned_with_flags::<T>(n.max(1), 0) }
                .map_err(drv("pinned allocation"))?,
        );
    }
    slot.as_mut()
        .expect("just set")
        .as_mut_slice()
        .map_err(drv("pinned access"))
}

/// Output bytes per finalisation chunk: small, so the download and store of the planes left
/// after the last batch pipeline in several pieces instead of one serial slab.
const CHUNK_BYTES: usize = 4 << 20;

/// Planes finalised (and downloaded) per chunk: about `CHUNK_BYTES` of output.
pub(crate) fn chunk_planes(ring: usize, hw: usize, cout: usize, argmax: bool) -> usize {
    let plane = hw * if argmax { 2 } else { cout * 4 };
    CHUNK_BYTES.div_ceil(plane.max(1)).clamp(1, ring)
}

impl CudaBackend {
    /// Finalises planes [p0, p0 + np) of the ring (`finalize_planes`; its float4 twin, one block
    /// row per plane, where H * W is a multiple of 4): labels or outputs into `out`, ring
    /// slots zeroed. `dims` = [cout, ring, h, w, p0, np].
    fn finalize(
        &self,
        s: &CudaStream,
        [acc, wsum, out]: [u64; 3],
        argmax: bool,
        dims: [usize; 6],
    ) -> Result<()> {
        let [cout, ring, h, w, p0, np] = dims;
        let i32s = |v: usize| Arg::I32(v as i32);
        let (o, l) = if argmax { (0, out) } else { (out, 0) };
        let hw = h * w;
        let mut args = [
            Arg::Ptr(acc),
            Arg::Ptr(wsum),
            Arg::Ptr(o),
            Arg::Ptr(l),
            i32s(cout),
            i32s(ring),
            i32s(h),
            i32s(w),
            i32s(p0),
            i32s(np),
            Arg::I32(argmax as i32),
        ];
        if hw % 4 == 0 {
            let gx = (hw / 4)
                .div_ceil(256)
                .clamp(1, (self.sm_count as usize * 32).div_ceil(np).max(1));
            let grid = (gx as u32, np as u32, 1);
            self.launch(s, "finalize_planes_v4", grid, 256, 0, &mut args)
        } else {
            self.eltwise(s, "finalize_planes", np * hw, &mut args)
        }
    }
}

fn ev(s: &CudaStream) -> Result<CudaEvent> {
    s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("event"))
}

/// Whether `pipeline` gathers on the device: the mode, and for `Auto` [`device_gather_fits`]
/// on the input ring (`ring` planes of `plane_in` values) vs the host staging (`in_len` values
/// twice) and the accumulator ring.
pub(crate) fn gathers_on_device(
    mode: GatherMode,
    ring: usize,
    plane_in: usize,
    in_len: usize,
    cout: usize,
    hw: usize,
) -> bool {
    match mode {
        GatherMode::Host => false,
        GatherMode::Device => true,
        GatherMode::Auto => device_gather_fits(
            ring * plane_in * 2,
            2 * in_len * 2,
            ring * (cout + 1) * hw * 4,
        ),
    }
}

/// The pipeline's own device buffers, as `pipeline` allocates them for a volume of network
/// shape `shape` (D, H, W), each with the tracker's 256-byte floor: the planner's count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineAlloc {
    /// Window input: two fp16 batch buffers (host gather) or the fp16 plane ring (device gather).
    pub input: u64,
    /// The f32 weight map of one window.
    pub weight_map: u64,
    /// The f32 accumulator ring and its weight sums.
    pub accumulators: u64,
    /// The `OUT_SLOTS` finished-plane slots (u16 labels or f32 outputs).
    pub out_slots: u64,
    pub gather_on_device: bool,
    /// D-planes of the accumulator (and device input) ring.
    pub ring: usize,
}

impl PipelineAlloc {
    pub fn total(&self) -> u64 {
        self.input + self.weight_map + self.accumulators + self.out_slots
    }
}

/// What `pipeline` allocates for `roi`, `batch`, `cin` -> `cout` channels, volume `shape`, labels
/// (`argmax`) or outputs, with gather `mode`, for windows at volume D starts `z0` (sorted, as
/// [`window_z0`] gives them).
#[allow(clippy::too_many_arguments)]
pub fn pipeline_alloc(
    roi: [usize; 3],
    batch: usize,
    cin: usize,
    cout: usize,
    shape: [usize; 3],
    argmax: bool,
    mode: GatherMode,
    z0: &[i64],
) -> PipelineAlloc {
    let al = |b: usize| b.max(256) as u64;
    let rvox: usize = roi.iter().product();
    let ring = ring_planes(z0, roi[0], shape[0], batch);
    let hw = shape[1] * shape[2];
    let in_len = batch * cin * rvox;
    let plane_in = cin * hw;
    let on_device = gathers_on_device(mode, ring, plane_in, in_len, cout, hw);
    let chunk = chunk_planes(ring, hw, cout, argmax);
    let slot = chunk * hw * if argmax { 2 } else { cout * 4 };
    PipelineAlloc {
        input: if on_device {
            al(ring * plane_in * 2)
        } else {
            2 * al(in_len * 2)
        },
        weight_map: al(rvox * 4),
        accumulators: al(ring * cout * hw * 4) + al(ring * hw * 4),
        out_slots: OUT_SLOTS as u64 * al(slot),
        gather_on_device: on_device,
        ring,
    }
}

/// Device bytes of the pipeline's own buffers for a volume no larger than `padded`: the input
/// (the larger of the host gather's two batch buffers and the device gather's plane ring where
/// `GatherMode::Auto` would choose it; a forced `Device` mode is not bounded by this), the
/// weight map, the accumulator ring and the `OUT_SLOTS` finished-plane slots.
pub(crate) fn pipeline_bytes(
    roi: [usize; 3],
    batch: usize,
    cin: usize,
    cout: usize,
    padded: [usize; 3],
    argmax: bool,
) -> u64 {
    let al = |b: usize| b.max(256) as u64;
    let rvox: usize = roi.iter().product();
    let ring = ring_cap(padded[0], roi[0]);
    let hw = padded[1] * padded[2];
    let plane = if argmax { hw * 2 } else { cout * hw * 4 };
    // A chunk is under CHUNK_BYTES + one plane of the real volume, whose planes are no larger.
    let slot = (ring * plane).min(CHUNK_BYTES + plane);
    // The device ring where `GatherMode::Auto` may pick it for some volume within `padded`.
    let host_in = 2 * batch * cin * rvox * 2;
    let ring_in = (ring * cin * hw * 2).min(host_in.max(ring * (cout + 1) * hw * 4 / 4));
    let input = (2 * al(batch * cin * rvox * 2)).max(al(ring_in));
    input
        + al(rvox * 4)
        + al(ring * cout * hw * 4)
        + al(ring * hw * 4)
        + OUT_SLOTS as u64 * al(slot)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    /// Every plane is finalised exactly once, after the last window touching it, and the planes
    /// in flight never exceed the ring.
    #[test]
    fn schedule_finalises_each_plane_once_after_its_last_window() {
        for (d, rd, batch, step, per_row, pb) in [
            (70usize, 32usize, 3usize, 16usize, 4usize, 0i64),
            (70, 32, 1, 32, 2, 0),
            (20, 32, 4, 32, 3, 6),
            (100, 16, 7, 4, 1, 0),
            (45, 32, 4, 24, 5, 3),
        ] {
            let mut z0 = Vec::new();
            let mut s = 0i64;
            loop {
                for _ in 0..per_row {
                    z0.push(s - pb);
                }
                if s as usize + rd >= d + 2 * pb as usize {
                    break;
                }
                s = (s + step as i64)
                    .min((d + 2 * pb as usize - rd.min(d + 2 * pb as usize)) as i64);
            }
            let (ring, steps) = schedule(&z0, rd, d, batch);
            let mut fin = vec![usize::MAX; d];
            let mut done_windows = 0;
            for (k, st) in steps.iter().enumerate() {
                assert_eq!(st.begin, done_windows);
                assert!(st.end - st.begin <= batch);
                done_windows = st.end;
                for p in st.final_lo..st.final_hi {
                    assert_eq!(fin[p], usize::MAX, "plane {p} finalised twice");
                    fin[p] = k;
                }
                // Every plane the batch's windows touch is in flight with its own ring slot.
                for i in st.begin..st.end {
                    let z1 = (z0[i] + rd as i64).clamp(0, d as i64) as usize;
                    assert!(z1 <= st.final_lo + ring, "ring overflow at window {i}");
                }
            }
            assert_eq!(done_windows, z0.len());
            for p in 0..d {
                assert_ne!(fin[p], usize::MAX, "plane {p} never finalised");
                // No window touching p comes after its finalisation.
                let k = fin[p];
                for i in steps[k].end..z0.len() {
                    let (a, b) = (z0[i], z0[i] + rd as i64);
                    assert!(
                        !(a <= p as i64 && (p as i64) < b),
                        "window {i} touches finalised plane {p}"
                    );
                }
            }
        }
    }

    /// The ring is what the batches need: with rows of windows `step` apart, batches that fit in
    /// `min(d, 2 rd)` planes are never cut (the steps are plain chunks of `batch` windows, as
    /// with an unbounded ring), the ring is `rd` at batch 1 and at most `rd + step` while a
    /// batch cannot span three rows; windows starting after plane 0 get their leading planes
    /// finalised first and the ring still holds every plane in flight.
    #[test]
    fn ring_fits_the_batches_and_never_cuts_them() {
        let mut rng = 12345u64;
        let mut next = |m: usize| crate::backend::cuda::lcg_next(&mut rng) as usize % m;
        for case in 0..400 {
            let rd = 1 + next(40);
            let step = 1 + next(rd);
            let per_row = 1 + next(8);
            let rows = 1 + next(6);
            let first = if case % 3 == 0 { next(20) as i64 } else { 0 };
            let d = (first as usize + (rows - 1) * step + rd).max(1) - next(3).min(rd - 1);
            let batch = 1 + next(12);
            let mut z0 = Vec::new();
            for r in 0..rows {
                for _ in 0..per_row {
                    z0.push(first + (r * step) as i64);
                }
            }
            let ring = ring_planes(&z0, rd, d, batch);
            let clamp = |z: i64| z.clamp(0, d as i64) as usize;
            assert!(ring <= ring_cap(d, rd) && ring >= 1);
            // Spans of the chunks an unbounded ring gives.
            let chunks: Vec<(usize, usize)> = (0..z0.len())
                .step_by(batch)
                .map(|i| (i, (i + batch).min(z0.len())))
                .collect();
            let widest = chunks
                .iter()
                .map(|&(i, j)| clamp(z0[j - 1] + rd as i64) - clamp(z0[i]))
                .max()
                .unwrap();
            assert!(ring >= widest.min(ring_cap(d, rd)), "case {case}");
            if batch == 1 {
                assert_eq!(ring, rd.min(d), "case {case}");
            }
            if batch <= per_row {
                assert!(ring <= (rd + step).min(d), "case {case}: {ring}");
            }
            let (r2, steps) = schedule(&z0, rd, d, batch);
            assert_eq!(r2, ring);
            let run: Vec<(usize, usize)> = steps
                .iter()
                .filter(|s| s.end > s.begin)
                .map(|s| (s.begin, s.end))
                .collect();
            if widest <= ring_cap(d, rd) {
                assert_eq!(run, chunks, "case {case}: a batch was cut");
            }
            let mut fin = vec![0usize; d];
            for st in &steps {
                for i in st.begin..st.end {
                    let z1 = clamp(z0[i] + rd as i64);
                    assert!(z1 <= st.final_lo + ring, "case {case}: ring overflow");
                    assert!(
                        clamp(z0[i]) >= st.final_lo,
                        "case {case}: plane finalised early"
                    );
                }
                for p in st.final_lo..st.final_hi {
                    fin[p] += 1;
                }
            }
            assert!(fin.iter().all(|&f| f == 1), "case {case}: {fin:?}");
        }
        // W1: 512 planes, rows of 7 windows 64 apart (the last pulled back to 384).
        let z0: Vec<i64> = (0..7).flat_map(|r| [r * 64; 7]).collect();
        for (batch, ring) in [(1, 128), (2, 192), (4, 192), (8, 192), (15, 256), (16, 256)] {
            assert_eq!(ring_planes(&z0, 128, 512, batch), ring, "batch {batch}");
        }
    }

    /// The host gather against direct indexing with padding.
    #[test]
    fn gather_matches_indexing() {
        let (c, d, h, w) = (2usize, 5usize, 4usize, 3usize);
        let vol: Vec<f32> = (0..c * d * h * w).map(|i| i as f32 * 0.5 - 3.0).collect();
        let roi = [3usize, 4, 4];
        let pb = [1usize, 2, 0];
        let starts = [[0usize, 0, 0], [3, 2, 1]];
        let mut out = vec![0u16; 2 * c * roi.iter().product::<usize>()];
        gather_windows(&vol, [c, d, h, w], pb, roi, &starts, 7.0, &mut out);
        let mut e = 0;
        for s in starts {
            for z in 0..roi[0] {
                for y in 0..roi[1] {
                    for x in 0..roi[2] {
                        for ch in 0..c {
                            let (vz, vy, vx) = (
                                (s[0] + z) as i64 - pb[0] as i64,
                                (s[1] + y) as i64 - pb[1] as i64,
                                (s[2] + x) as i64 - pb[2] as i64,
                            );
                            let want = if (0..d as i64).contains(&vz)
                                && (0..h as i64).contains(&vy)
                                && (0..w as i64).contains(&vx)
                            {
                                vol[((ch * d + vz as usize) * h + vy as usize) * w + vx as usize]
                            } else {
                                7.0
                            };
                            assert_eq!(half::f16::from_bits(out[e]).to_f32(), want);
                            e += 1;
                        }
                    }
                }
            }
        }
    }

    /// `gather_window_ring` (kernels/blend.cu) emulated: the same index math, one window.
    #[allow(clippy::too_many_arguments)]
    fn gather_ring_emulated(
        ring_buf: &[u16],
        dims: [usize; 4],
        ring: usize,
        pb: [usize; 3],
        roi: [usize; 3],
        start: [usize; 3],
        cval: u16,
        out: &mut [u16],
    ) {
        let [c, d, h, w] = dims.map(|v| v as i64);
        let hw = h * w;
        for e in 0..(roi.iter().product::<usize>() * c as usize) as i64 {
            let ch = e % c;
            let mut t = e / c;
            let x = t % roi[2] as i64;
            t /= roi[2] as i64;
            let y = t % roi[1] as i64;
            let z = t / roi[1] as i64;
            let (vz, vy, vx) = (
                start[0] as i64 + z - pb[0] as i64,
                start[1] as i64 + y - pb[1] as i64,
                start[2] as i64 + x - pb[2] as i64,
            );
            out[e as usize] =
                if (0..d).contains(&vz) && (0..h).contains(&vy) && (0..w).contains(&vx) {
                    ring_buf[(((vz % ring as i64) * c + ch) * hw + vy * w + vx) as usize]
                } else {
                    cval
                };
        }
    }

    /// The device gather on the CPU: the schedule's batches, the plane uploads (converted by
    /// `convert_planes` into a ring of `ring` planes, applied in order before each batch) and the
    /// kernel's index math give exactly the host gather's bits, window by window. Also checks
    /// that every plane is uploaded once, in order, in pieces of at most `stage` planes.
    #[test]
    fn device_gather_emulation_matches_host_gather() {
        let mut seed = 7u64;
        let mut rnd = move || crate::backend::cuda::lcg_next(&mut seed) as usize;
        // (c, d, h, w, roi, pad_before, step, batch, stage)
        for (c, d, h, w, roi, pb, stepz, batch, stage) in [
            (
                1usize,
                23usize,
                9usize,
                7usize,
                [8usize, 6, 5],
                [2usize, 1, 0],
                4usize,
                3usize,
                5usize,
            ),
            (2, 40, 6, 10, [16, 8, 8], [0, 1, 2], 8, 4, 100),
            (3, 12, 5, 5, [16, 4, 4], [2, 0, 1], 2, 2, 1),
            (1, 70, 4, 6, [32, 4, 6], [0, 0, 0], 16, 1, 7),
        ] {
            let vol: Vec<f32> = (0..c * d * h * w)
                .map(|_| (rnd() % 20000) as f32 * 0.013 - 130.0)
                .collect();
            let va = ndarray::ArrayView4::from_shape((c, d, h, w), &vol).unwrap();
            let padded = [
                (d + 2 * pb[0]).max(roi[0]),
                (h + 2 * pb[1]).max(roi[1]),
                (w + 2 * pb[2]).max(roi[2]),
            ];
            let mut starts = Vec::new();
            let mut sz = 0;
            loop {
                for sy in [0, padded[1] - roi[1]] {
                    for sx in [0, padded[2] - roi[2]] {
                        starts.push([sz, sy, sx]);
                    }
                }
                if sz + roi[0] >= padded[0] {
                    break;
                }
                sz = (sz + stepz).min(padded[0] - roi[0]);
            }
            starts.sort_by_key(|s| s[0]);
            let z0: Vec<i64> = starts.iter().map(|s| s[0] as i64 - pb[0] as i64).collect();
            let (ring, sched) = schedule(&z0, roi[0], d, batch);
            let spans: Vec<(usize, usize)> = sched
                .iter()
                .filter(|st| st.end > st.begin)
                .map(|st| (st.begin, st.end))
                .collect();
            let ups = plane_uploads(&z0, &spans, roi[0], d, stage);
            let mut next = 0;
            for u in &ups {
                assert_eq!(u.za, next, "planes uploaded out of order");
                assert!(u.zb > u.za && u.zb - u.za <= stage);
                next = u.zb;
            }
            assert_eq!(next, d, "every plane uploaded");
            let plane = c * h * w;
            let mut ringb = vec![0xFFFFu16; ring * plane];
            let cval = half::f16::from_f32(-0.75).to_bits();
            let rvox: usize = roi.iter().product();
            let mut ui = 0;
            for (k, &(b, e)) in spans.iter().enumerate() {
                while ui < ups.len() && ups[ui].k == k {
                    let u = ups[ui];
                    let mut st = vec![0u16; (u.zb - u.za) * plane];
                    convert_planes(va, u.za, u.zb, &mut st);
                    for z in u.za..u.zb {
                        let dst = (z % ring) * plane;
                        ringb[dst..dst + plane]
                            .copy_from_slice(&st[(z - u.za) * plane..(z - u.za + 1) * plane]);
                    }
                    ui += 1;
                }
                let mut want = vec![0u16; (e - b) * c * rvox];
                gather_windows(&vol, [c, d, h, w], pb, roi, &starts[b..e], -0.75, &mut want);
                let mut got = vec![0u16; (e - b) * c * rvox];
                for (i, st) in starts[b..e].iter().enumerate() {
                    gather_ring_emulated(
                        &ringb,
                        [c, d, h, w],
                        ring,
                        pb,
                        roi,
                        *st,
                        cval,
                        &mut got[i * c * rvox..(i + 1) * c * rvox],
                    );
                }
                assert!(got == want, "batch {k} differs (c {c} d {d} roi {roi:?})");
            }
            assert_eq!(ui, ups.len());
        }
    }

    /// Plane conversion: the bits of `f16::from_f32` for normal, tie, subnormal, overflowing,
    /// infinite and NaN values, from a standard and a permuted (strided) volume.
    #[test]
    fn convert_planes_matches_scalar_conversion() {
        let (c, d, h, w) = (2usize, 5usize, 3usize, 37usize);
        let special = [
            0.0f32,
            -0.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65520.0,
            1e6,
            -1e6,
            6e-8,
            3e-8,
            1e-5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
        ];
        let vol: Vec<f32> = (0..c * d * h * w)
            .map(|i| {
                if i % 3 == 0 {
                    special[i / 3 % special.len()]
                } else {
                    (i as f32 * 0.37).sin() * 1000.0
                }
            })
            .collect();
        let std = ndarray::Array4::from_shape_vec((c, d, h, w), vol).unwrap();
        // The same volume stored (C, W, H, D) and viewed back as (C, D, H, W).
        let perm = std
            .view()
            .permuted_axes([0, 3, 2, 1])
            .as_standard_layout()
            .to_owned();
        let strided = perm.view().permuted_axes([0, 3, 2, 1]);
        assert!(strided.as_slice().is_none());
        for v in [std.view(), strided] {
            let (za, zb) = (1, 4);
            let mut out = vec![0u16; (zb - za) * c * h * w];
            convert_planes(v, za, zb, &mut out);
            for z in za..zb {
                for ch in 0..c {
                    for y in 0..h {
                        for x in 0..w {
                            let want = half::f16::from_f32(v[[ch, z, y, x]]).to_bits();
                            let got = out[(((z - za) * c + ch) * h + y) * w + x];
                            assert_eq!(got, want, "at {:?}", (ch, z, y, x));
                        }
                    }
                }
            }
        }
    }

    /// The planner's count of the pipeline's buffers bounds what `pipeline` allocates for every
    /// volume within `padded`, in both gather modes `Auto` can pick.
    #[test]
    fn pipeline_bytes_bounds_the_buffers() {
        let al = |b: usize| b.max(256) as u64;
        for (roi, batch, cin, cout, padded) in [
            ([32usize, 32, 32], 4usize, 1usize, 3usize, [64usize, 96, 80]),
            ([128, 128, 128], 4, 1, 14, [512, 512, 128]),
            ([64, 64, 64], 1, 4, 1, [128, 700, 700]),
            ([16, 16, 16], 2, 8, 2, [40, 300, 20]),
        ] {
            for argmax in [false, true] {
                let planned = pipeline_bytes(roi, batch, cin, cout, padded, argmax);
                for shrink in [0usize, 3, 17] {
                    let (d, h, w) = (
                        padded[0] - shrink.min(padded[0] - 1),
                        padded[1] - shrink,
                        padded[2],
                    );
                    let hw = h * w;
                    let ring = ring_cap(d, roi[0]);
                    let rvox: usize = roi.iter().product();
                    let in_len = batch * cin * rvox;
                    let dev = device_gather_fits(
                        ring * cin * hw * 2,
                        2 * in_len * 2,
                        ring * (cout + 1) * hw * 4,
                    );
                    let input = if dev {
                        al(ring * cin * hw * 2)
                    } else {
                        2 * al(in_len * 2)
                    };
                    let chunk = chunk_planes(ring, hw, cout, argmax);
                    let slot = chunk * hw * if argmax { 2 } else { cout * 4 };
                    let used = input
                        + al(rvox * 4)
                        + al(ring * cout * hw * 4)
                        + al(ring * hw * 4)
                        + OUT_SLOTS as u64 * al(slot);
                    assert!(
                        used <= planned,
                        "{used} > {planned} for {roi:?} {padded:?} shrink {shrink}"
                    );
                }
            }
        }
    }

    /// Host costs of the pipeline on a W2-sized volume (512x512x128, roi 128, 49 windows, batch
    /// 4): host gather of all batches vs the device gather's plane conversion, and the store of
    /// all label planes into a fresh array serially vs in parallel after prefaulting.
    /// `cargo test --release --lib pipeline::tests::host_costs -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn host_costs_w2() {
        let (d, h, w) = (512usize, 512usize, 128usize);
        let roi = [128usize; 3];
        let vol: Vec<f32> = (0..d * h * w).map(|i| (i % 977) as f32 * 0.01).collect();
        let mut starts = Vec::new();
        for z in (0..=384).step_by(64) {
            for y in (0..=384).step_by(64) {
                starts.push([z, y, 0usize]);
            }
        }
        let rvox: usize = roi.iter().product();
        let mut buf = vec![0u16; 4 * rvox];
        let t = Instant::now();
        for b in starts.chunks(4) {
            gather_windows(&vol, [1, d, h, w], [0; 3], roi, b, 0.0, &mut buf);
        }
        let tg = t.elapsed().as_secs_f64() * 1e3;
        let va = ndarray::ArrayView4::from_shape((1, d, h, w), &vol).unwrap();
        let mut st = vec![0u16; 128 * h * w];
        let t = Instant::now();
        for za in (0..d).step_by(128) {
            convert_planes(va, za, za + 128, &mut st);
        }
        let tc = t.elapsed().as_secs_f64() * 1e3;
        let src = vec![3u16; 32 * h * w];
        let hw = h * w;
        let mut times = Vec::new();
        for mode in 0..3 {
            let mut out = Out::Labels(Array3::zeros((d, h, w)));
            let buf = HostOut::L(unsafe {
                std::slice::from_raw_parts_mut(src.as_ptr() as *mut u16, src.len())
            });
            let t = Instant::now();
            if mode == 2 {
                prefault(&mut out, 0, d, hw);
            }
            let tp = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            for p0 in (0..d).step_by(32) {
                if mode == 0 {
                    if let (Out::Labels(l), HostOut::L(s)) = (&mut out, &buf) {
                        l.as_slice_mut().unwrap()[p0 * hw..(p0 + 32) * hw]
                            .copy_from_slice(&s[..32 * hw]);
                    }
                } else {
                    store_planes(&mut out, &buf, p0, 32, hw).unwrap();
                }
            }
            times.push((tp, t.elapsed().as_secs_f64() * 1e3));
        }
        println!(
            "RESULT host costs W2 ({} threads): host gather of 13 batches {tg:.1} ms; plane conversion of the volume {tc:.1} ms; \
             store 64 MiB labels: serial {:.1} ms, parallel {:.1} ms, prefault {:.1} ms + parallel store {:.1} ms",
            rayon::current_num_threads(), times[0].1, times[1].1, times[2].0, times[2].1
        );
        let t = Instant::now();
        let wm = crate::tiling::weight_map(roi, crate::tiling::BlendMode::Gaussian, [0.125; 3]);
        println!(
            "RESULT weight map 128^3: {:.1} ms ({})",
            t.elapsed().as_secs_f64() * 1e3,
            wm.len()
        );
    }
}
