//! The streamed pass itself (see the module doc of `stream`): device buffers of one pass, the
//! per-batch input fill (device or host gather), the launch list, blends and finalisations,
//! with worker threads for plane conversion and for storing finished planes.

use super::direct::check_and_sync;
use super::gather::{convert_planes, prefault, prefault_planes, store_planes, HostOut, Out};
use super::job::{Events, WindowJob};
use super::pass::{Pass, Stored};
use super::schedule::{Part, Step as Batch, Upload};
use super::{pipeline_bytes, GpuTimes, OUT_SLOTS};
use crate::backend::cuda::host::options::CudaOptions;
use crate::backend::cuda::launch_list::Prepared;
use crate::backend::cuda::runtime::device::{drv, mem_reset_peak, mem_stats, DevBuf, DevPool};
use crate::backend::cuda::runtime::launch::{ev, Gpu};
use crate::backend::VolumeRef;
use crate::{Error, Result};
use cudarc::driver::{result as cu, CudaEvent, PinnedHostSlice};
use ndarray::{Array3, Array4, ArrayView3, ArrayView4};
use rayon::prelude::*;
use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

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

/// Predicted peak device bytes of a pass (see `CudaBackend::planned_device_bytes`): `prep`'s
/// buffers (counted when prepared for `roi`; activations scaled to `batch`) plus the pipeline's.
pub(crate) fn planned_device_bytes(
    prep: Option<&Prepared>,
    roi: [usize; 3],
    batch: usize,
    channels_out: usize,
    padded: [usize; 3],
) -> u64 {
    let al = |b: usize| b.max(256) as u64;
    let (plan, cin) = match prep {
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

/// The job's inputs against the prepared plan: one clear error each.
fn check(prep: &Prepared, job: &WindowJob, argmax: bool) -> Result<()> {
    let (roi, padded, pad_before) = (job.roi, job.padded, job.pad_before);
    prep.check_window(roi, job.batch)?;
    let [c, d, h, w] = job.vol.shape();
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
    if job.weights.dim() != (roi[0], roi[1], roi[2]) {
        return Err(Error::Invalid(format!(
            "weight map {:?} differs from window {roi:?}",
            job.weights.dim()
        )));
    }
    for a in 0..3 {
        if padded[a] < [d, h, w][a] + pad_before[a] || padded[a] < roi[a] {
            return Err(Error::Invalid(format!("padded size {padded:?} does not hold the volume {:?} after padding {pad_before:?} or the window {roi:?}", [d, h, w])));
        }
    }
    if let Some(s) = job
        .starts
        .iter()
        .find(|s| (0..3).any(|a| s[a] + roi[a] > padded[a]))
    {
        return Err(Error::Invalid(format!(
            "window start {s:?} + {roi:?} exceeds the padded volume {padded:?}"
        )));
    }
    if argmax && prep.cout > 65536 {
        return Err(Error::Invalid(format!(
            "argmax labels are u16: {} classes are too many",
            prep.cout
        )));
    }
    Ok(())
}

/// Runs `job` on the prepared plan (`prepare(graph, >= batch, roi)` came first); pinned staging
/// comes from and stays in `cache`.
pub(crate) fn run_windows(
    gpu: &Gpu,
    prep: &Prepared,
    opts: &CudaOptions,
    cache: &mut PinnedCache,
    job: &WindowJob,
    argmax: bool,
) -> Result<(Out, GpuTimes)> {
    let t0 = Instant::now();
    check(prep, job, argmax)?;
    if let VolumeRef::Device(v) = &job.vol {
        check_and_sync(&gpu.ctx, v)?;
    }
    let mem_before = cu::mem_get_info().map(|(f, t)| (t - f) as u64).unwrap_or(0);
    // The high-water mark restarts once the pass holds its buffers, so that what the pool
    // freed for it (an earlier pass's other sizes) does not count as this pass's.
    let r = cache
        .weight_map(gpu, job.weights)
        .and_then(|dw| Pass::new(gpu, prep, opts, job, argmax, (dw, &mut cache.dev)))
        .and_then(|p| {
            mem_reset_peak(&gpu.ctx);
            p.run(cache, t0, mem_before)
        });
    if r.is_err() {
        // Nothing may still read or write buffers about to be freed.
        let _ = gpu.ctx.synchronize();
    }
    r
}

/// Pipeline state kept by the backend between calls (allocating pinned memory is slow): two
/// input staging buffers (f16 bits: window batches or volume planes), the finished-plane
/// slots of each output kind, the blend weights on the device with their host copy (a 128³
/// map is 8 MB to copy and upload per volume otherwise), and the pass's device buffers.
/// [`PinnedCache::release_device`] frees the device part before a new plan allocates.
#[derive(Default)]
pub struct PinnedCache {
    inp: [Option<PinnedHostSlice<u16>>; 2],
    outf: [Option<PinnedHostSlice<f32>>; OUT_SLOTS],
    outl: [Option<PinnedHostSlice<u16>>; OUT_SLOTS],
    wmap: Option<(Vec<f32>, Arc<DevBuf>)>,
    /// The last pass's accumulator ring, input and output buffers.
    dev: DevPool,
}

impl PinnedCache {
    /// Frees what the cache holds on the device.
    pub(crate) fn release_device(&mut self) {
        self.wmap = None;
        self.dev.clear();
    }

    /// The blend weights `w` on the device: the last call's buffer when they are the same
    /// bits, else a new upload (the old buffer freed first, so the pass's peak is unchanged).
    fn weight_map(&mut self, gpu: &Gpu, w: ArrayView3<f32>) -> Result<Arc<DevBuf>> {
        let h: Cow<[f32]> = match w.as_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(w.iter().copied().collect()),
        };
        if let Some((_, d)) = self.wmap.as_ref().filter(|(c, _)| same_bits(c, &h)) {
            return Ok(d.clone());
        }
        self.wmap = None;
        let h = h.into_owned();
        let d = Arc::new(DevBuf::upload(&gpu.ctx, &gpu.copy, &h)?);
        self.wmap = Some((h, d.clone()));
        Ok(d)
    }
}

/// Whether `a` and `b` hold the same f32 bits (in parallel chunks: a 128³ map is 8 MB).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    const CHUNK: usize = 1 << 16;
    a.len() == b.len()
        && a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)).all(|(x, y)| {
            x.iter()
                .zip(y)
                .fold(0u32, |d, (p, q)| d | (p.to_bits() ^ q.to_bits()))
                == 0
        })
}

/// The cached pinned buffer when it holds `n` elements, else a new one.
fn pinned<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<cudarc::driver::CudaContext>,
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

/// The store worker: waits for each download, copies it into the output and hands the pinned
/// slot back; while idle it touches the output's next planes so their page faults are not paid
/// in the store (nor in the tail). Returns its store time (ms).
fn store_worker<'b>(
    rx: Receiver<Stored<'b>>,
    ack: Sender<(usize, HostOut<'b>)>,
    out: &mut Out,
    hw: usize,
    d: usize,
) -> Result<f64> {
    let mut ms = 0.0;
    let mut touched = 0usize;
    let step = prefault_planes(out, hw);
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) if touched < d => {
                let np = step.min(d - touched);
                prefault(out, touched, np, hw);
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
        store_planes(out, &buf, p0, np, hw)?;
        ms += t.elapsed().as_secs_f64() * 1e3;
        // Stores come in plane order: never touch a stored plane again.
        touched = touched.max(p0 + np);
        if ack.send((slot, buf)).is_err() {
            break;
        }
    }
    Ok(ms)
}

/// The plane feeder (device gather): converts the volume planes of each upload to f16 into a
/// free pinned slot (after the slot's previous upload is done) and hands it over with its ms.
fn feed_planes<'b>(
    vol: ArrayView4<f32>,
    uploads: &[Upload],
    plane_in: usize,
    free: Receiver<(&'b mut [u16], Option<CudaEvent>)>,
    ready: Sender<(&'b mut [u16], f64)>,
) -> Result<()> {
    for u in uploads {
        let Ok((buf, used)) = free.recv() else {
            break;
        };
        if let Some(e) = used {
            e.synchronize().map_err(drv("plane upload"))?;
        }
        let t = Instant::now();
        convert_planes(vol, u.za, u.zb, &mut buf[..(u.zb - u.za) * plane_in]);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if ready.send((buf, ms)).is_err() {
            break;
        }
    }
    Ok(())
}

/// The error of a feeder that stopped early.
fn feeder_failed(feeder: &mut Option<ScopedJoinHandle<'_, Result<()>>>) -> Error {
    match feeder.take().map(|f| f.join()) {
        Some(Ok(Err(e))) => e,
        Some(Err(_)) => Error::Backend("the plane conversion thread panicked".into()),
        _ => Error::Backend("the plane conversion thread stopped".into()),
    }
}

/// Summed event intervals and the overlap of the stages.
fn fill_times(times: &mut GpuTimes, evs: &Events) -> Result<()> {
    let ms = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> {
        Ok(a.elapsed_ms(b).map_err(drv("event timing"))? as f64)
    };
    for (a, b) in &evs.h2d {
        times.h2d_ms += ms(a, b)?;
    }
    for (a, g, b) in &evs.cmp {
        times.input_fill_ms += ms(a, g)?;
        times.compute_ms += ms(g, b)?;
    }
    for (a, b) in &evs.blend {
        times.blend_ms += ms(a, b)?;
    }
    // The back steps run inside the parts' blend intervals: they are compute.
    for (a, b) in &evs.back {
        let t = ms(a, b)?;
        times.compute_ms += t;
        times.blend_ms -= t;
    }
    for (a, b) in &evs.fin {
        times.finalize_ms += ms(a, b)?;
    }
    for (a, b) in &evs.d2h {
        times.d2h_ms += ms(a, b)?;
    }
    if let Some(first) = evs.cmp.first() {
        let mut span = 0.0f64;
        for last in evs
            .blend
            .last()
            .map(|c| &c.1)
            .into_iter()
            .chain(evs.fin.last().map(|f| &f.1))
        {
            span = span.max(ms(&first.0, last)?);
        }
        let busy = times.input_fill_ms + times.compute_ms + times.blend_ms + times.finalize_ms;
        times.gpu_idle_ms = (span - busy).max(0.0);
    }
    let sum = times.host_gather_ms
        + times.h2d_ms
        + times.input_fill_ms
        + times.compute_ms
        + times.blend_ms
        + times.finalize_ms
        + times.d2h_ms
        + times.host_store_ms;
    times.overlap = sum / times.wall_ms.max(1e-9);
    Ok(())
}

/// Mutable state of the batch loop.
struct LoopState<'b> {
    /// Pinned input staging slots (free when Some).
    slots: [Option<&'b mut [u16]>; 2],
    /// Pinned finished-plane slots (free when Some).
    free_out: Vec<Option<HostOut<'b>>>,
    /// Consumption of dev_in[i] by the compute stream, H2D done per pinned slot.
    in_used: [Option<CudaEvent>; 2],
    h2d_done: [Option<CudaEvent>; 2],
    out_used: Vec<Option<CudaEvent>>,
    nfin: usize,
    next_up: usize,
    evs: Events,
    times: GpuTimes,
    /// The call's start and when its last batch was queued.
    t0: Instant,
    t_last: Instant,
}

/// The device gather's plane feeder: converted slots come in, used ones go back.
struct Feed<'s, 'b> {
    ready: Receiver<(&'b mut [u16], f64)>,
    free: Sender<(&'b mut [u16], Option<CudaEvent>)>,
    feeder: Option<ScopedJoinHandle<'s, Result<()>>>,
}

/// The host gather of the next batch, running.
type Pending<'s, 'b> = Option<ScopedJoinHandle<'s, (&'b mut [u16], f64)>>;

impl Pass<'_, '_> {
    /// Runs every batch and finalisation, then gathers the times.
    fn run(self, cache: &mut PinnedCache, t0: Instant, mem_before: u64) -> Result<(Out, GpuTimes)> {
        let [_, d, h, w] = self.dims;
        let (cout, hw, argmax, ctx) = (self.prep.cout, self.hw, self.argmax, &self.gpu.ctx);
        let mut out = if argmax {
            Out::Labels(Array3::zeros((d, h, w)), vec![0; d])
        } else {
            Out::Logits(Array4::zeros((cout, d, h, w)))
        };
        let PinnedCache {
            inp,
            outf,
            outl,
            dev,
            ..
        } = cache;
        let [ia, ib] = inp;
        let stage_len = if self.on_device {
            self.stage * self.plane_in
        } else {
            self.in_len
        };
        let chunk = self.chunk;
        // The direct input needs no host staging.
        let slots = if self.direct.is_some() {
            [None, None]
        } else {
            [
                Some(pinned(ctx, ia, stage_len)?),
                Some(pinned(ctx, ib, stage_len)?),
            ]
        };
        let free_out: Vec<Option<HostOut>> = if argmax {
            outl.iter_mut()
                .map(|p| Ok(Some(HostOut::L(pinned(ctx, p, chunk * hw)?))))
                .collect::<Result<_>>()?
        } else {
            outf.iter_mut()
                .map(|p| Ok(Some(HostOut::F(pinned(ctx, p, chunk * cout * hw)?))))
                .collect::<Result<_>>()?
        };
        let times = GpuTimes {
            windows: self.job.starts.len(),
            batches: self.batches.len(),
            ring_planes: self.acc_ring,
            gather_on_device: self.on_device || self.direct.is_some(),
            input_on_device: self.direct.is_some(),
            plane_uploads: self.uploads.len(),
            mem_info_used_before: mem_before,
            mem_info_used_during: self.mem_during,
            setup_ms: t0.elapsed().as_secs_f64() * 1e3,
            ..Default::default()
        };
        let mut ls = LoopState {
            slots,
            free_out,
            in_used: [None, None],
            h2d_done: [None, None],
            out_used: (0..OUT_SLOTS).map(|_| None).collect(),
            nfin: 0,
            next_up: 0,
            evs: Events::default(),
            times,
            t0,
            t_last: Instant::now(),
        };
        let result = std::thread::scope(|sc| self.stream(sc, &mut ls, &mut out));
        if result.is_err() {
            // Nothing may still read or write the buffers dropped on return.
            let _ = ctx.synchronize();
        }
        let mut times = std::mem::take(&mut ls.times);
        times.host_store_ms = result?;
        // Every download was waited for in `store`; the compute and copy streams too, for timing.
        self.gpu.stream.synchronize().map_err(drv("synchronize"))?;
        self.gpu.copy.synchronize().map_err(drv("synchronize"))?;
        times.tail_ms = ls.t_last.elapsed().as_secs_f64() * 1e3;
        times.peak_device_bytes = mem_stats(ctx).1;
        times.wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        fill_times(&mut times, &ls.evs)?;
        // Everything on the device is done (streams synchronised, downloads waited for).
        let Pass {
            acc,
            wsum,
            dev_in,
            dev_out,
            ..
        } = self;
        dev.put([acc, wsum].into_iter().chain(dev_in).chain(dev_out));
        Ok((out, times))
    }

    /// The batch loop with its worker threads; returns the store worker's time.
    fn stream<'s, 'b>(
        &'b self,
        sc: &'s Scope<'s, 'b>,
        ls: &mut LoopState<'b>,
        out: &'b mut Out,
    ) -> Result<f64> {
        let (hw, d) = (self.hw, self.dims[1]);
        let (tx, rx) = channel::<Stored<'b>>();
        let (ack_tx, ack_rx) = channel::<(usize, HostOut<'b>)>();
        let storer = sc.spawn(move || store_worker(rx, ack_tx, out, hw, d));
        let (ready_tx, ready_rx) = channel();
        let (free_tx, free_rx) = channel();
        let mut feed = Feed {
            ready: ready_rx,
            free: free_tx,
            feeder: None,
        };
        if let (true, Some(vol)) = (self.on_device, self.host_vol) {
            for sl in ls.slots.iter_mut() {
                let _ = feed.free.send((sl.take().expect("slot free"), None));
            }
            let (ups, plane_in) = (&self.uploads, self.plane_in);
            feed.feeder =
                Some(sc.spawn(move || feed_planes(vol, ups, plane_in, free_rx, ready_tx)));
        } else {
            drop((ready_tx, free_rx));
        }
        let mut pending: Pending<'s, 'b> = None;
        if self.vol_std.is_some() && !self.batches.is_empty() {
            let buf = ls.slots[0].take().expect("slot 0 free");
            pending = Some(sc.spawn(move || {
                let ms = self.gather(0, buf);
                (buf, ms)
            }));
        }
        let mut k = 0usize;
        for st in &self.sched {
            if st.end > st.begin {
                self.batch(sc, k, st, ls, &mut feed, &mut pending)?;
                k += 1;
            }
            for p in &st.parts {
                if p.to > p.from {
                    let b0 = ev(&self.gpu.stream)?;
                    let back = self.blend(st, p)?;
                    ls.evs.blend.push((b0, ev(&self.gpu.stream)?));
                    ls.evs.back.extend(back);
                }
                if !self.finalize_part(p, ls, &tx, &ack_rx)? {
                    drop(tx);
                    storer
                        .join()
                        .map_err(|_| Error::Backend("the plane store thread panicked".into()))??;
                    return Err(Error::Backend("the plane store thread stopped".into()));
                }
            }
        }
        drop(tx);
        drop(feed.free);
        if let Some(f) = feed.feeder.take() {
            f.join()
                .map_err(|_| Error::Backend("the plane conversion thread panicked".into()))??;
        }
        ls.times.slabs = ls.nfin;
        storer
            .join()
            .map_err(|_| Error::Backend("the plane store thread panicked".into()))?
    }

    /// Batch `k` (`st`): its input filled, the launch list (its blends are its parts').
    fn batch<'s, 'b>(
        &'b self,
        sc: &'s Scope<'s, 'b>,
        k: usize,
        st: &Batch,
        ls: &mut LoopState<'b>,
        feed: &mut Feed<'s, 'b>,
        pending: &mut Pending<'s, 'b>,
    ) -> Result<()> {
        let s = &*self.gpu.stream;
        if injected_oom(k) {
            return Err(Error::OutOfMemory(format!(
                "injected by VOXTILE_INJECT_OOM at batch {}",
                k + 1
            )));
        }
        let n = st.end - st.begin;
        let c0 = if let Some(v) = &self.direct {
            let c0 = ev(s)?;
            self.gather_direct(st, v)?;
            c0
        } else if self.on_device {
            self.fill_device(k, st, ls, feed)?
        } else {
            self.fill_host(sc, k, n, ls, pending)?
        };
        let cg = ev(s)?;
        self.prep.run_batch(self.gpu, n)?;
        ls.evs.cmp.push((c0, cg, ev(s)?));
        if k == 0 {
            ls.times.first_batch_ms = ls.t0.elapsed().as_secs_f64() * 1e3;
        }
        if k + 1 == self.batches.len() {
            ls.t_last = Instant::now();
        }
        Ok(())
    }

    /// Device gather: this batch's new volume planes into the input ring, then the gather
    /// kernels. The planes overwrite only planes below this batch's first unfinished plane,
    /// which no later batch reads: once batch k-1 has gathered, the slots are free. Returns the
    /// fill's start event.
    fn fill_device(
        &self,
        k: usize,
        st: &Batch,
        ls: &mut LoopState<'_>,
        feed: &mut Feed<'_, '_>,
    ) -> Result<CudaEvent> {
        let s = &*self.gpu.stream;
        let mut uploaded = None;
        while ls.next_up < self.uploads.len() && self.uploads[ls.next_up].k == k {
            let u = self.uploads[ls.next_up];
            ls.next_up += 1;
            let (buf, ms) = match feed.ready.recv() {
                Ok(m) => m,
                Err(_) => return Err(feeder_failed(&mut feed.feeder)),
            };
            ls.times.host_gather_ms += ms;
            let (reuse, done) = self.upload_planes(k, u, buf, &mut ls.evs)?;
            let _ = feed.free.send((buf, Some(reuse)));
            uploaded = Some(done);
        }
        if let Some(e) = &uploaded {
            s.wait(e).map_err(drv("stream wait"))?;
        }
        let c0 = ev(s)?;
        self.gather_on_device(st)?;
        Ok(c0)
    }

    /// Host gather: batch k's gathered windows copied in (double-buffered; the gather of
    /// batch k+1 starts here), then into the network input. Returns the fill's start event.
    fn fill_host<'s, 'b>(
        &'b self,
        sc: &'s Scope<'s, 'b>,
        k: usize,
        n: usize,
        ls: &mut LoopState<'b>,
        pending: &mut Pending<'s, 'b>,
    ) -> Result<CudaEvent> {
        let (s, cp) = (&*self.gpu.stream, &*self.gpu.copy);
        let (slot, in_win) = (k % 2, self.in_win);
        let (buf, gms) = pending
            .take()
            .expect("gather pending")
            .join()
            .map_err(|_| Error::Backend("the window gather thread panicked".into()))?;
        ls.times.host_gather_ms += gms;
        // Copy-in once the compute stream has taken batch k-2 out of dev_in[slot].
        if let Some(e) = &ls.in_used[slot] {
            cp.wait(e).map_err(drv("stream wait"))?;
        }
        let h0 = ev(cp)?;
        // SAFETY: dev_in[slot] holds in_len halves >= n * in_win; the pinned buffer is not
        // written again before h2d_done[slot] is synchronised (below).
        unsafe { cu::memcpy_htod_async(self.dev_in[slot].ptr, &buf[..n * in_win], cp.cu_stream()) }
            .map_err(drv("window upload"))?;
        let h1 = ev(cp)?;
        ls.slots[slot] = Some(buf);
        ls.h2d_done[slot] = Some(ev(cp)?);
        // Host gather of batch k+1 overlaps this batch's GPU work.
        if k + 1 < self.batches.len() {
            let ns = (k + 1) % 2;
            if let Some(e) = &ls.h2d_done[ns] {
                e.synchronize().map_err(drv("synchronize"))?;
            }
            let buf = ls.slots[ns].take().expect("slot free");
            *pending = Some(sc.spawn(move || {
                let ms = self.gather(k + 1, buf);
                (buf, ms)
            }));
        }
        ls.evs.h2d.push((h0, h1));
        s.wait(&ls.evs.h2d.last().expect("pushed").1)
            .map_err(drv("stream wait"))?;
        let c0 = ev(s)?;
        // SAFETY: both hold >= n * in_win halves; stream ordered.
        unsafe {
            cu::memcpy_dtod_async(
                self.prep.input,
                self.dev_in[slot].ptr,
                n * in_win * 2,
                s.cu_stream(),
            )
        }
        .map_err(drv("device copy"))?;
        ls.in_used[slot] = Some(ev(s)?);
        Ok(c0)
    }

    /// Finalises the planes part `p` completes in chunks of at most `chunk` (<= the accumulator
    /// ring) planes, each downloaded and handed to the store worker. Ok(false): the store worker
    /// is gone.
    fn finalize_part<'b>(
        &self,
        p: &Part,
        ls: &mut LoopState<'b>,
        tx: &Sender<Stored<'b>>,
        ack: &Receiver<(usize, HostOut<'b>)>,
    ) -> Result<bool> {
        let s = &*self.gpu.stream;
        let mut p0 = p.final_lo;
        while p0 < p.final_hi {
            let np = (p.final_hi - p0).min(self.chunk);
            let slot = ls.nfin % OUT_SLOTS;
            ls.nfin += 1;
            // The download of finalisation m - OUT_SLOTS must have read dev_out[slot] ...
            if let Some(e) = &ls.out_used[slot] {
                s.wait(e).map_err(drv("stream wait"))?;
            }
            let f0 = ev(s)?;
            self.finalize(slot, p0, np)?;
            let f1 = ev(s)?;
            self.dl.wait(&f1).map_err(drv("stream wait"))?;
            // ... and the store worker must have handed the pinned slot back.
            while ls.free_out[slot].is_none() {
                match ack.recv() {
                    Ok((k, buf)) => ls.free_out[k] = Some(buf),
                    Err(_) => return Ok(false),
                }
            }
            let mut buf = ls.free_out[slot].take().expect("slot returned");
            let (d0, d1) = self.download(slot, np, &mut buf)?;
            ls.out_used[slot] = Some(ev(&self.dl)?);
            tx.send((slot, p0, np, buf, ev(&self.dl)?))
                .map_err(|_| Error::Backend("the plane store thread stopped".into()))?;
            ls.evs.fin.push((f0, f1));
            ls.evs.d2h.push((d0, d1));
            p0 += np;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::same_bits;

    /// The weight map is reused only for the same bits: a signed zero, one changed value in a
    /// later chunk or another length is a new map; a NaN equals itself.
    #[test]
    fn weight_maps_compare_by_bits() {
        let a: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.001).sin()).collect();
        assert!(same_bits(&a, &a.clone()));
        let mut b = a.clone();
        b[150_000] = f32::from_bits(b[150_000].to_bits() ^ 1);
        assert!(!same_bits(&a, &b));
        assert!(!same_bits(&a, &a[1..]));
        let (z, nz) = (vec![0.0f32; 4], vec![-0.0f32; 4]);
        assert!(!same_bits(&z, &nz));
        let n = vec![f32::NAN; 4];
        assert!(same_bits(&n, &n.clone()));
    }
}
