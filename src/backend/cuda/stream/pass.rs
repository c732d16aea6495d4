//! The device buffers and schedule of one streamed pass, and its launches and copies: plane
//! uploads, the device gather, blends, finalisation and downloads.

use super::gather::{gather_windows, HostOut};
use super::job::{Events, WindowJob};
use super::schedule::{plane_uploads, schedule, window_z0, Part, Step as Batch, Upload};
use super::{chunk_planes, gathers_on_device, stage_planes, OUT_SLOTS};
use crate::backend::cuda::host::catalogue::{
    BLEND_WINDOW_RING, FINALIZE_PLANES, FINALIZE_PLANES_V4, GATHER_WINDOW_RING,
};
use crate::backend::cuda::host::options::CudaOptions;
use crate::backend::cuda::launch_list::Prepared;
use crate::backend::cuda::runtime::device::{drv, DevBuf, DevPool};
use crate::backend::cuda::runtime::launch::{ev, i32a, Arg, Gpu};
use crate::backend::{DeviceVolume, VolumeRef};
use crate::{Error, Result};
use cudarc::driver::{result as cu, CudaEvent, CudaStream};
use ndarray::{ArrayView4, CowArray, Ix4};
use std::sync::Arc;
use std::time::Instant;

/// A finished slab handed to the store worker: (pinned slot, first plane, planes, its
/// staging, download done).
pub(super) type Stored<'a> = (usize, usize, usize, HostOut<'a>, CudaEvent);

/// The schedule and device buffers of one pass.
pub(super) struct Pass<'a, 'j> {
    pub(super) gpu: &'a Gpu,
    pub(super) prep: &'a Prepared,
    pub(super) job: &'a WindowJob<'j>,
    /// Labels (u16 argmax on the device) instead of blended outputs.
    pub(super) argmax: bool,
    /// Volume (C, D, H, W) and H * W.
    pub(super) dims: [usize; 4],
    pub(super) hw: usize,
    /// Windows in D order; blending is order-independent up to fp32 rounding, the schedule
    /// needs order.
    pub(super) order: Vec<[usize; 3]>,
    /// D-planes of the input ring (device gather) and of the accumulator ring.
    pub(super) ring_in: usize,
    pub(super) acc_ring: usize,
    pub(super) sched: Vec<Batch>,
    pub(super) batches: Vec<Batch>,
    pub(super) rvox: usize,
    pub(super) in_win: usize,
    pub(super) in_len: usize,
    pub(super) plane_in: usize,
    /// Volume planes streamed into the input ring and gathered there (the device gather).
    pub(super) on_device: bool,
    /// The volume when it is in this device's memory: windows gathered from it directly.
    pub(super) direct: Option<DeviceVolume>,
    /// The volume when it is in host memory.
    pub(super) host_vol: Option<ArrayView4<'j, f32>>,
    /// The standard-layout volume the host gather indexes (host mode only).
    pub(super) vol_std: Option<CowArray<'a, f32, Ix4>>,
    pub(super) stage: usize,
    pub(super) uploads: Vec<Upload>,
    /// Host mode: two window-batch buffers. Device mode: the input ring of volume planes
    /// (slot z % ring_in, [ring_in][C][H][W] f16).
    pub(super) dev_in: Vec<DevBuf>,
    /// The blend weights (kept between calls by the pinned cache).
    pub(super) dw: Arc<DevBuf>,
    pub(super) acc: DevBuf,
    pub(super) wsum: DevBuf,
    pub(super) chunk: usize,
    pub(super) dev_out: Vec<DevBuf>,
    /// The download stream.
    pub(super) dl: Arc<CudaStream>,
    pub(super) mem_during: u64,
}

impl<'a, 'j> Pass<'a, 'j> {
    /// The schedule, then the device buffers (all counted by the tracker), zeroed rings and
    /// the weight map upload the first blend waits for.
    pub(super) fn new(
        gpu: &'a Gpu,
        prep: &'a Prepared,
        opts: &CudaOptions,
        job: &'a WindowJob<'j>,
        argmax: bool,
        (dw, pool): (Arc<DevBuf>, &mut DevPool),
    ) -> Result<Self> {
        let [c, d, h, w] = job.vol.shape();
        let (direct, host_vol) = match job.vol {
            VolumeRef::Device(v) => (Some(v), None),
            VolumeRef::Host(v) => (None, Some(v)),
        };
        let (roi, hw, cout) = (job.roi, h * w, prep.cout);
        let mut order: Vec<[usize; 3]> = job.starts.to_vec();
        order.sort_by_key(|s| s[0]);
        let z0 = window_z0(&order, job.pad_before[0]);
        let plan = schedule(&z0, roi[0], d, job.batch);
        let (ring_in, acc_ring, sched) = (plan.ring_in, plan.acc_ring, plan.steps);
        let batches: Vec<Batch> = sched
            .iter()
            .filter(|st| st.end > st.begin)
            .cloned()
            .collect();
        let rvox: usize = roi.iter().product();
        let in_win = prep.cin * rvox;
        let in_len = job.batch * in_win;
        let plane_in = c * hw;
        let on_device = direct.is_none()
            && gathers_on_device(opts.gather_mode, ring_in, plane_in, in_len, cout, hw);
        // The host gather indexes a standard-layout slice; the device path's plane conversion
        // reads any layout, so it never copies the whole volume.
        let vol_std = match &job.vol {
            VolumeRef::Host(v) if !on_device => Some(v.as_standard_layout()),
            _ => None,
        };
        if let Some(v) = &vol_std {
            v.as_slice()
                .ok_or_else(|| Error::Invalid("volume is not contiguous".into()))?;
        }
        if in_win > i32::MAX as usize {
            return Err(Error::Invalid(format!(
                "window {roi:?} with {} channels is too large for the gather kernel",
                prep.cin
            )));
        }
        let stage = stage_planes(in_len, plane_in, ring_in);
        let uploads = if on_device {
            let spans: Vec<(usize, usize)> = batches.iter().map(|st| (st.begin, st.end)).collect();
            plane_uploads(&z0, &spans, roi[0], d, stage)
        } else {
            Vec::new()
        };
        let ctx = &gpu.ctx;
        let n_in = match (direct.is_some(), on_device) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => 2,
        };
        let in_bytes = if on_device {
            ring_in * plane_in * 2
        } else {
            in_len * 2
        };
        let chunk = chunk_planes(acc_ring, hw, cout, argmax);
        let out_bytes = if argmax {
            chunk * hw * 2
        } else {
            chunk * cout * hw * 4
        };
        // [acc, wsum, dev_in.., dev_out..]
        let sizes: Vec<usize> = [acc_ring * cout * hw * 4, acc_ring * hw * 4]
            .into_iter()
            .chain(std::iter::repeat_n(in_bytes, n_in))
            .chain(std::iter::repeat_n(out_bytes, OUT_SLOTS))
            .collect();
        let mut bufs = pool.take(ctx, &sizes)?.into_iter();
        let (acc, wsum) = (bufs.next().expect("sized"), bufs.next().expect("sized"));
        let dev_in: Vec<DevBuf> = bufs.by_ref().take(n_in).collect();
        let dev_out: Vec<DevBuf> = bufs.collect();
        let dl = gpu.down.clone();
        let s = &*gpu.stream;
        // SAFETY: zeroing our own ring on the compute stream before any blend.
        unsafe {
            cu::memset_d8_async(acc.ptr, 0, acc_ring * cout * hw * 4, s.cu_stream())
                .map_err(drv("memset"))?;
            cu::memset_d8_async(wsum.ptr, 0, acc_ring * hw * 4, s.cu_stream())
                .map_err(drv("memset"))?;
        }
        if opts.poison {
            prep.poison(gpu)?;
        }
        let mem_during = cu::mem_get_info().map(|(f, t)| (t - f) as u64).unwrap_or(0);
        // The weight map upload must land before the first blend.
        let wready = ev(&gpu.copy)?;
        s.wait(&wready).map_err(drv("stream wait"))?;
        Ok(Pass {
            gpu,
            prep,
            job,
            argmax,
            dims: [c, d, h, w],
            hw,
            order,
            ring_in,
            acc_ring,
            sched,
            batches,
            rvox,
            in_win,
            in_len,
            plane_in,
            on_device,
            direct,
            host_vol,
            vol_std,
            stage,
            uploads,
            dev_in,
            dw,
            acc,
            wsum,
            chunk,
            dev_out,
            dl,
            mem_during,
        })
    }

    /// Host gather of batch `k` into `buf`; returns its ms.
    pub(super) fn gather(&self, k: usize, buf: &mut [u16]) -> f64 {
        let st = &self.batches[k];
        let t = Instant::now();
        let vols = self
            .vol_std
            .as_ref()
            .and_then(|v| v.as_slice())
            .unwrap_or(&[]);
        let j = self.job;
        let starts = &self.order[st.begin..st.end];
        gather_windows(vols, self.dims, j.pad_before, j.roi, starts, j.cval, buf);
        t.elapsed().as_secs_f64() * 1e3
    }

    /// Uploads volume planes `u` (converted in `buf`) into the input ring on the copy stream,
    /// after batch k-1 has gathered; returns (the slot's reuse event, the upload's done event).
    pub(super) fn upload_planes(
        &self,
        k: usize,
        u: Upload,
        buf: &[u16],
        evs: &mut Events,
    ) -> Result<(CudaEvent, CudaEvent)> {
        let cp = &*self.gpu.copy;
        let (ring, plane_in) = (self.ring_in, self.plane_in);
        if k > 0 {
            cp.wait(&evs.cmp[k - 1].1).map_err(drv("stream wait"))?;
        }
        let h0 = ev(cp)?;
        let np = u.zb - u.za;
        let s0 = u.za % ring;
        let n1 = np.min(ring - s0);
        // SAFETY: the ring holds `ring` planes; the pinned slot is not written again before the
        // event sent with it has completed.
        unsafe {
            cu::memcpy_htod_async(
                self.dev_in[0].ptr + (s0 * plane_in * 2) as u64,
                &buf[..n1 * plane_in],
                cp.cu_stream(),
            )
            .map_err(drv("plane upload"))?;
            if np > n1 {
                cu::memcpy_htod_async(
                    self.dev_in[0].ptr,
                    &buf[n1 * plane_in..np * plane_in],
                    cp.cu_stream(),
                )
                .map_err(drv("plane upload"))?;
            }
        }
        let h1 = ev(cp)?;
        let reuse = ev(cp)?;
        let done = ev(cp)?;
        evs.h2d.push((h0, h1));
        Ok((reuse, done))
    }

    /// The gather kernels of batch `st` from the input ring into the network input.
    pub(super) fn gather_on_device(&self, st: &Batch) -> Result<()> {
        let [c, d, h, w] = self.dims;
        for (b, start) in self.order[st.begin..st.end].iter().enumerate() {
            let mut args = vec![
                Arg::Ptr(self.dev_in[0].ptr),
                Arg::Ptr(self.prep.input + (b * self.in_win * 2) as u64),
                i32a(c),
                i32a(self.ring_in),
                i32a(d),
                i32a(h),
                i32a(w),
            ];
            args.extend(self.window_args(start));
            args.push(self.cval_arg());
            let s = &*self.gpu.stream;
            self.gpu
                .eltwise(s, GATHER_WINDOW_RING.name, self.in_win, &mut args)?;
        }
        Ok(())
    }

    /// Where a window lies, as the gather and blend kernels take it: its start (padded
    /// coordinates), the padding before the volume, the window's size.
    pub(super) fn window_args(&self, start: &[usize; 3]) -> [Arg; 9] {
        let j = self.job;
        [
            i32a(start[0]),
            i32a(start[1]),
            i32a(start[2]),
            i32a(j.pad_before[0]),
            i32a(j.pad_before[1]),
            i32a(j.pad_before[2]),
            i32a(j.roi[0]),
            i32a(j.roi[1]),
            i32a(j.roi[2]),
        ]
    }

    /// The padding value as the gather kernels take it (f16 bits).
    pub(super) fn cval_arg(&self) -> Arg {
        Arg::I32(half::f16::from_f32(self.job.cval).to_bits() as i32)
    }

    /// Blends the logits of part `p` of batch `st` into the accumulator ring, each window's
    /// after its back steps where the launch list ends in a window segment; returns those
    /// steps' (start, end) events.
    pub(super) fn blend(&self, st: &Batch, p: &Part) -> Result<Vec<(CudaEvent, CudaEvent)>> {
        let s = &*self.gpu.stream;
        let [_, d, h, w] = self.dims;
        let cout = self.prep.cout;
        let mut back = Vec::new();
        for (i, start) in self.order.iter().enumerate().take(p.to).skip(p.from) {
            if self.prep.back {
                let e0 = ev(s)?;
                self.prep.run_back(self.gpu, i - st.begin)?;
                back.push((e0, ev(s)?));
            }
            let src = self.prep.window_output(i - st.begin);
            let mut args = vec![
                Arg::Ptr(src),
                Arg::Ptr(self.dw.ptr),
                Arg::Ptr(self.acc.ptr),
                Arg::Ptr(self.wsum.ptr),
                i32a(cout),
                i32a(self.acc_ring),
                i32a(d),
                i32a(h),
                i32a(w),
            ];
            args.extend(self.window_args(start));
            self.gpu
                .eltwise(s, BLEND_WINDOW_RING.name, self.rvox, &mut args)?;
        }
        Ok(back)
    }

    /// Finalises planes [p0, p0 + np) of the ring into `dev_out[slot]` (`FINALIZE_PLANES`; its
    /// float4 twin, one block row per plane, where H * W is a multiple of 4): labels or
    /// outputs, ring slots zeroed.
    pub(super) fn finalize(&self, slot: usize, p0: usize, np: usize) -> Result<()> {
        let (s, hw, argmax) = (&*self.gpu.stream, self.hw, self.argmax);
        let [_, _, h, w] = self.dims;
        let out = self.dev_out[slot].ptr;
        let (o, l) = if argmax { (0, out) } else { (out, 0) };
        let mut args = [
            Arg::Ptr(self.acc.ptr),
            Arg::Ptr(self.wsum.ptr),
            Arg::Ptr(o),
            Arg::Ptr(l),
            i32a(self.prep.cout),
            i32a(self.acc_ring),
            i32a(h),
            i32a(w),
            i32a(p0),
            i32a(np),
            Arg::I32(argmax as i32),
        ];
        if hw % 4 == 0 {
            let sms = self.gpu.sm_count as usize;
            let gx = (hw / 4)
                .div_ceil(256)
                .clamp(1, (sms * 32).div_ceil(np).max(1));
            let grid = (gx as u32, np as u32, 1);
            self.gpu
                .launch(s, FINALIZE_PLANES_V4.name, grid, (256, 0), &mut args)
        } else {
            self.gpu
                .eltwise(s, FINALIZE_PLANES.name, np * hw, &mut args)
        }
    }

    /// Downloads finalised planes [p0, p0 + np) from `dev_out[slot]` into `buf` on the
    /// download stream; returns the copy's (start, end) events.
    pub(super) fn download(
        &self,
        slot: usize,
        np: usize,
        buf: &mut HostOut,
    ) -> Result<(CudaEvent, CudaEvent)> {
        let dl = &*self.dl;
        let hw = self.hw;
        let d0 = ev(dl)?;
        let src = self.dev_out[slot].ptr;
        // SAFETY: dev_out[slot] holds np planes; the worker reads the pinned slot only after
        // synchronising the event sent with it.
        unsafe {
            match buf {
                HostOut::L(hs) => cu::memcpy_dtoh_async(&mut hs[..np * hw], src, dl.cu_stream()),
                HostOut::F(hs) => {
                    cu::memcpy_dtoh_async(&mut hs[..np * hw * self.prep.cout], src, dl.cu_stream())
                }
            }
        }
        .map_err(drv("plane download"))?;
        Ok((d0, ev(dl)?))
    }
}
