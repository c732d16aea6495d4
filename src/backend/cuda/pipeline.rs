//! Streamed sliding-window inference on the device.
//!
//! Device memory must not grow with the volume, and copies must hide behind compute, so:
//! - windows are visited sorted by their D start; the host gathers batch k+1 (f16 NDHWC, virtual
//!   `cval` padding) on a worker thread into one of two pinned buffers while the GPU runs batch k;
//! - the copy-in runs on the copy stream, the compute stream waits on its event (no device-wide
//!   syncs), copies it into the network input and runs the prepared launch list;
//! - window logits are blended into a ring of fp32 accumulators holding only the D-planes in
//!   flight (`ring` planes, plane z in slot z % ring); once every window touching a plane has been
//!   blended, the plane is finalised on the device (normalised logits or u16 argmax) into one of
//!   two staging buffers and copied out on a third stream into pinned memory, overlapping the next
//!   batch; the host stores finished planes into the output array.
//!
//! A batch never spans more D-planes than the ring holds (it is cut short instead), so the ring is
//! `min(D, 2 * roi_d)` planes whatever the grid order or batch size.

use super::{drv, mem_reset_peak, mem_stats, Arg, CudaBackend, DevBuf, Prepared};
use crate::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaEvent, CudaStream, PinnedHostSlice};
use ndarray::{Array3, Array4, ArrayView3, ArrayView4, Axis};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Per-stage times of one [`CudaBackend::segment_windows`] call (ms). GPU stages are summed
/// CUDA-event intervals on their own streams; host stages are host clocks. `overlap` = (sum of
/// stage times) / wall: above 1 means stages ran concurrently.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuTimes {
    /// Host gather of window batches into pinned f16 staging (worker thread).
    pub host_gather_ms: f64,
    /// Host-to-device copies of window batches (copy stream).
    pub h2d_ms: f64,
    /// Network input copy + launch list, summed over batches (compute stream).
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

/// Ring depth in D-planes for a volume of depth `d` and window depth `rd`.
pub(crate) fn ring_planes(d: usize, rd: usize) -> usize {
    d.min(2 * rd).max(1)
}

/// Batches over windows whose volume D starts `z0` (may be negative: padding) are sorted
/// ascending. A batch is cut short where a window would reach past `lo + ring` (lo = first plane
/// not yet finalised), so every plane in flight has its own ring slot.
pub(crate) fn schedule(z0: &[i64], rd: usize, d: usize, batch: usize) -> (usize, Vec<Step>) {
    let ring = ring_planes(d, rd);
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let z1 = |i: usize| clamp(z0[i] + rd as i64);
    let mut steps = Vec::new();
    let (mut lo, mut i) = (0usize, 0usize);
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
                let scaled: u64 = p
                    .bufs
                    .iter()
                    .chain([&p.stage_in, &p.stage_out, &p.norm_sums, &p.norm_ab])
                    .map(|b| al(b.bytes))
                    .sum();
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
        let vol = vol.as_standard_layout();
        let vols = vol
            .as_slice()
            .ok_or_else(|| Error::Invalid("volume is not contiguous".into()))?;
        let wmap: Vec<f32> = weights.iter().copied().collect();

        // D order; blending is order-independent up to fp32 rounding, the schedule needs order.
        let mut order: Vec<[usize; 3]> = starts.to_vec();
        order.sort_by_key(|s| s[0]);
        let z0: Vec<i64> = order
            .iter()
            .map(|s| s[0] as i64 - pad_before[0] as i64)
            .collect();
        let (ring, sched) = schedule(&z0, roi[0], d, batch);

        // Device buffers (all counted by the tracker) and pinned host staging.
        let rvox: usize = roi.iter().product();
        let in_win = prep.cin * rvox;
        let in_len = batch * in_win;
        let dev_in = [
            DevBuf::new(&self.ctx, in_len * 2)?,
            DevBuf::new(&self.ctx, in_len * 2)?,
        ];
        let dw = DevBuf::upload(&self.ctx, &self.copy, &wmap)?;
        let acc = DevBuf::new(&self.ctx, ring * cout * hw * 4)?;
        let wsum = DevBuf::new(&self.ctx, ring * hw * 4)?;
        let chunk = chunk_planes(ring, hw, cout, argmax);
        let out_bytes = if argmax {
            chunk * hw * 2
        } else {
            chunk * cout * hw * 4
        };
        let dev_out = [
            DevBuf::new(&self.ctx, out_bytes)?,
            DevBuf::new(&self.ctx, out_bytes)?,
        ];
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
            batches: sched.iter().filter(|st| st.end > st.begin).count(),
            ring_planes: ring,
            mem_info_used_before: mem_before,
            mem_info_used_during: mem_during,
            ..Default::default()
        };
        let mut ev_h2d: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let mut ev_cmp: Vec<(CudaEvent, CudaEvent, CudaEvent)> = Vec::new();
        let mut ev_fin: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let mut ev_d2h: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let i32s = |v: usize| Arg::I32(v as i32);

        let PinnedCache { inp, outf, outl } = cache;
        let [ia, ib] = inp;
        let mut slots: [Option<&mut [u16]>; 2] = [
            Some(pinned(&self.ctx, ia, in_len)?),
            Some(pinned(&self.ctx, ib, in_len)?),
        ];
        let mut free_out: [Option<HostOut>; 2] = if argmax {
            let [a, b] = outl;
            [
                Some(HostOut::L(pinned(&self.ctx, a, chunk * hw)?)),
                Some(HostOut::L(pinned(&self.ctx, b, chunk * hw)?)),
            ]
        } else {
            let [a, b] = outf;
            [
                Some(HostOut::F(pinned(&self.ctx, a, chunk * cout * hw)?)),
                Some(HostOut::F(pinned(&self.ctx, b, chunk * cout * hw)?)),
            ]
        };
        let dims = [c, d, h, w];
        let batches: Vec<&Step> = sched.iter().filter(|st| st.end > st.begin).collect();

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
        let out_ref = &mut out;
        let result = std::thread::scope(|sc| -> Result<f64> {
            // Finished planes are stored by a worker: it waits for each download, copies it
            // into the output and hands the pinned slot back.
            let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, usize, HostOut, CudaEvent)>();
            let (ack_tx, ack_rx) = std::sync::mpsc::channel::<(usize, HostOut)>();
            let storer = sc.spawn(move || -> Result<f64> {
                let mut ms = 0.0;
                for (slot, p0, np, buf, done) in rx {
                    done.synchronize().map_err(drv("plane download"))?;
                    let t = Instant::now();
                    store_planes(out_ref, &buf, p0, np, hw)?;
                    ms += t.elapsed().as_secs_f64() * 1e3;
                    if ack_tx.send((slot, buf)).is_err() {
                        break;
                    }
                }
                Ok(ms)
            });
            let mut pending = None;
            if !batches.is_empty() {
                let buf = slots[0].take().expect("slot 0 free");
                pending = Some(sc.spawn(move || {
                    let ms = gather(0, buf);
                    (buf, ms)
                }));
            }
            // Events: consumption of dev_in[i] by the compute stream, H2D done per pinned slot.
            let mut in_used: [Option<CudaEvent>; 2] = [None, None];
            let mut h2d_done: [Option<CudaEvent>; 2] = [None, None];
            let mut out_used: [Option<CudaEvent>; 2] = [None, None];
            let mut nfin = 0usize;
            let mut bi = 0usize;
            for st in &sched {
                if st.end > st.begin {
                    let k = bi;
                    bi += 1;
                    let slot = k % 2;
                    let (buf, gms) = pending
                        .take()
                        .expect("gather pending")
                        .join()
                        .map_err(|_| Error::Backend("the window gather thread panicked".into()))?;
                    times.host_gather_ms += gms;
                    if injected_oom(k) {
                        slots[slot] = Some(buf);
                        return Err(Error::OutOfMemory(format!(
                            "injected by VOXTILE_INJECT_OOM at batch {}",
                            k + 1
                        )));
                    }
                    let n = st.end - st.begin;
                    // Copy-in once the compute stream has taken batch k-2 out of dev_in[slot].
                    if let Some(e) = &in_used[slot] {
                        cp.wait(e).map_err(drv("stream wait"))?;
                    }
                    let h0 = ev(cp)?;
                    // SAFETY: dev_in[slot] holds in_len halves >= n * in_win; the pinned buffer
                    // is not written again before h1 is synchronised (below, before reuse).
                    unsafe {
                        cu::memcpy_htod_async(dev_in[slot].ptr, &buf[..n * in_win], cp.cu_stream())
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
                    let c0 = ev(s)?;
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
                    ev_cmp.push((c0, c1, c2));
                }
                // Finalise complete planes in chunks of at most `chunk` (<= ring) planes.
                let mut p0 = st.final_lo;
                while p0 < st.final_hi {
                    let np = (st.final_hi - p0).min(chunk);
                    let slot = nfin % 2;
                    nfin += 1;
                    // The download of finalisation m-2 must have read dev_out[slot] ...
                    if let Some(e) = &out_used[slot] {
                        s.wait(e).map_err(drv("stream wait"))?;
                    }
                    let f0 = ev(s)?;
                    self.eltwise(
                        s,
                        "finalize_planes",
                        np * hw,
                        &mut [
                            Arg::Ptr(acc.ptr),
                            Arg::Ptr(wsum.ptr),
                            Arg::Ptr(if argmax { 0 } else { dev_out[slot].ptr }),
                            Arg::Ptr(if argmax { dev_out[slot].ptr } else { 0 }),
                            i32s(cout),
                            i32s(ring),
                            i32s(h),
                            i32s(w),
                            i32s(p0),
                            i32s(np),
                            Arg::I32(argmax as i32),
                        ],
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
        let ms = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> {
            Ok(a.elapsed_ms(b).map_err(drv("event timing"))? as f64)
        };
        for (a, b) in &ev_h2d {
            times.h2d_ms += ms(a, b)?;
        }
        for (a, b, e) in &ev_cmp {
            times.compute_ms += ms(a, b)?;
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

/// Copies `np` downloaded planes starting at plane `p0` into the output array.
fn store_planes(out: &mut Out, buf: &HostOut, p0: usize, np: usize, hw: usize) -> Result<()> {
    match (out, buf) {
        (Out::Labels(l), HostOut::L(src)) => {
            let dst = l
                .as_slice_mut()
                .ok_or_else(|| Error::Backend("label array is not contiguous".into()))?;
            dst[p0 * hw..(p0 + np) * hw].copy_from_slice(&src[..np * hw]);
        }
        (Out::Logits(a), HostOut::F(src)) => {
            for (ch, mut plane) in a.axis_iter_mut(Axis(0)).enumerate() {
                let dst = plane
                    .as_slice_mut()
                    .ok_or_else(|| Error::Backend("logit array is not contiguous".into()))?;
                dst[p0 * hw..(p0 + np) * hw]
                    .copy_from_slice(&src[ch * np * hw..(ch + 1) * np * hw]);
            }
        }
        _ => return Err(Error::Backend("output and staging kinds differ".into())),
    }
    Ok(())
}

/// Pinned host staging kept by the backend between calls (allocating pinned memory is slow):
/// two window-batch buffers (f16 bits) and two finished-plane buffers of each output kind.
#[derive(Default)]
pub struct PinnedCache {
    inp: [Option<PinnedHostSlice<u16>>; 2],
    outf: [Option<PinnedHostSlice<f32>>; 2],
    outl: [Option<PinnedHostSlice<u16>>; 2],
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

/// Planes finalised (and downloaded) per chunk: about 16 MiB of output per chunk, so staging
/// stays small and planes stream out in steady pieces.
pub(crate) fn chunk_planes(ring: usize, hw: usize, cout: usize, argmax: bool) -> usize {
    let plane = hw * if argmax { 2 } else { cout * 4 };
    (16usize << 20).div_ceil(plane.max(1)).clamp(1, ring)
}

fn ev(s: &CudaStream) -> Result<CudaEvent> {
    s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("event"))
}

/// Device bytes of the pipeline's own buffers (input staging x2, weight map, ring, output
/// staging x2) for a volume no larger than `padded`.
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
    let ring = ring_planes(padded[0], roi[0]);
    let hw = padded[1] * padded[2];
    let out = if argmax {
        ring * hw * 2
    } else {
        ring * cout * hw * 4
    };
    2 * al(batch * cin * rvox * 2)
        + al(rvox * 4)
        + al(ring * cout * hw * 4)
        + al(ring * hw * 4)
        + 2 * al(out)
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
}
