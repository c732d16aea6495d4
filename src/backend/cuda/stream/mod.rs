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
//!   flight (`acc_ring` planes, plane z in slot z % acc_ring); once every window touching a plane
//!   has been blended, the plane is finalised on the device (normalised logits or u16 argmax) into
//!   one of the staging slots and copied out on a third stream into pinned memory, overlapping
//!   the next batch; the host stores finished planes into the output array.
//!
//! A batch never spans more D-planes than the input ring holds (it is cut short instead). The
//! input ring is the most planes any `batch` consecutive windows span (so no batch is cut for
//! it), at most `min(D, 2 * roi_d)`: `roi_d` at batch 1, `roi_d + step` while a batch spans two
//! window rows. The accumulator ring is one window's planes (`roi_d`) at any batch: a batch's
//! blends stop where its next window starts deeper, to finalise the planes above that start.

mod direct;
mod gather;
mod job;
mod pass;
mod run;
mod schedule;

pub(crate) use gather::Out;
pub use job::WindowJob;
pub(crate) use run::{planned_device_bytes, run_windows, PinnedCache};
pub use schedule::{acc_planes, ring_planes, window_z0};

use crate::backend::cuda::host::options::GatherMode;
use schedule::ring_cap;
use serde::Serialize;

/// Per-stage times of one [`super::CudaBackend::segment_windows`] call (ms). GPU stages are summed
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
    /// Host time from the call's start to the first batch queued (setup, then the wait for
    /// its volume planes).
    pub first_batch_ms: f64,
    /// Compute-stream time between its first and last event with none of its stages running
    /// (waiting for uploads or for the host).
    pub gpu_idle_ms: f64,
    /// Windows gathered on the device (from streamed volume planes, or from the direct input),
    /// else on the host.
    pub gather_on_device: bool,
    /// The volume was already in device memory: windows gathered from it in place (no staging,
    /// no upload).
    pub input_on_device: bool,
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

/// Whether the device gather's input ring (`ring_in` bytes) is cheap enough: no larger than the
/// host gather's two window batches (`host_in`) or a quarter of the fp32 sums and weights over
/// as many planes (`acc`). It is (Cin * 2) / ((Cout + 1) * 4) of the latter, so this holds
/// unless the inputs have several times more channels than the outputs. (The accumulator ring
/// itself is smaller at batch > 1; comparing over the input ring's planes keeps the choice, and
/// so the memory, monotone in the batch.)
pub fn device_gather_fits(ring_in: usize, host_in: usize, acc: usize) -> bool {
    ring_in <= host_in.max(acc / 4)
}

/// Planes of volume input per pinned staging slot (device gather): at least one window batch's
/// worth of halves or 8 MiB, at most the ring.
pub(crate) fn stage_planes(in_len: usize, plane_in: usize, ring: usize) -> usize {
    (in_len.max(4 << 20) / plane_in.max(1)).clamp(1, ring.max(1))
}

/// Finished-plane staging slots (device and pinned): finalisation m waits for the store of
/// m - OUT_SLOTS, so several slots keep the host from waiting on the batch just queued.
pub(crate) const OUT_SLOTS: usize = 4;

/// Output bytes per finalisation chunk: small, so the download and store of the planes left
/// after the last batch pipeline in several pieces instead of one serial slab.
const CHUNK_BYTES: usize = 4 << 20;

/// Planes finalised (and downloaded) per chunk: about `CHUNK_BYTES` of output.
pub(crate) fn chunk_planes(ring: usize, hw: usize, cout: usize, argmax: bool) -> usize {
    let plane = hw * if argmax { 2 } else { cout * 4 };
    CHUNK_BYTES.div_ceil(plane.max(1)).clamp(1, ring)
}

/// Whether the stream gathers on the device: the mode, and for `Auto` [`device_gather_fits`]
/// on the input ring (`ring` planes of `plane_in` values) vs the host staging (`in_len` values
/// twice) and the fp32 sums over `ring` planes.
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

/// The pipeline's own device buffers, as `stream` allocates them for a volume of network
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
    /// D-planes of the device gather's input ring (what a batch spans).
    pub ring_in: usize,
    /// D-planes of the accumulator ring (what a window spans).
    pub acc_ring: usize,
}

impl PipelineAlloc {
    pub fn total(&self) -> u64 {
        self.input + self.weight_map + self.accumulators + self.out_slots
    }
}

/// The pass whose pipeline buffers [`pipeline_alloc`] counts.
#[derive(Clone, Copy, Debug)]
pub struct AllocQuery<'a> {
    /// Window size.
    pub roi: [usize; 3],
    /// Windows per network run.
    pub batch: usize,
    /// Network input channels.
    pub cin: usize,
    /// Network output channels.
    pub cout: usize,
    /// Volume size in network axes (D, H, W).
    pub shape: [usize; 3],
    /// Labels (u16 argmax on the device) instead of blended outputs.
    pub argmax: bool,
    /// Where the windows are gathered.
    pub mode: GatherMode,
    /// The windows' volume D starts, sorted (as [`window_z0`] gives them).
    pub z0: &'a [i64],
}

/// What `stream` allocates for the pass `q`.
pub fn pipeline_alloc(q: &AllocQuery) -> PipelineAlloc {
    let AllocQuery {
        roi,
        batch,
        cin,
        cout,
        shape,
        argmax,
        mode,
        z0,
    } = *q;
    let al = |b: usize| b.max(256) as u64;
    let rvox: usize = roi.iter().product();
    let ring_in = ring_planes(z0, roi[0], shape[0], batch);
    let acc_ring = acc_planes(z0, roi[0], shape[0]);
    let hw = shape[1] * shape[2];
    let in_len = batch * cin * rvox;
    let plane_in = cin * hw;
    let on_device = gathers_on_device(mode, ring_in, plane_in, in_len, cout, hw);
    let chunk = chunk_planes(acc_ring, hw, cout, argmax);
    let slot = chunk * hw * if argmax { 2 } else { cout * 4 };
    PipelineAlloc {
        input: if on_device {
            al(ring_in * plane_in * 2)
        } else {
            2 * al(in_len * 2)
        },
        weight_map: al(rvox * 4),
        accumulators: al(acc_ring * cout * hw * 4) + al(acc_ring * hw * 4),
        out_slots: OUT_SLOTS as u64 * al(slot),
        gather_on_device: on_device,
        ring_in,
        acc_ring,
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
    let acc = padded[0].min(roi[0]).max(1);
    let hw = padded[1] * padded[2];
    let plane = if argmax { hw * 2 } else { cout * hw * 4 };
    // A chunk is under CHUNK_BYTES + one plane of the real volume, whose planes are no larger.
    let slot = (acc * plane).min(CHUNK_BYTES + plane);
    // The device ring where `GatherMode::Auto` may pick it for some volume within `padded`.
    let host_in = 2 * batch * cin * rvox * 2;
    let ring_in = (ring * cin * hw * 2).min(host_in.max(ring * (cout + 1) * hw * 4 / 4));
    let input = (2 * al(batch * cin * rvox * 2)).max(al(ring_in));
    input + al(rvox * 4) + al(acc * cout * hw * 4) + al(acc * hw * 4) + OUT_SLOTS as u64 * al(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                    // The largest rings any windows give.
                    let (ring, acc) = (ring_cap(d, roi[0]), d.min(roi[0]));
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
                    let chunk = chunk_planes(acc, hw, cout, argmax);
                    let slot = chunk * hw * if argmax { 2 } else { cout * 4 };
                    let used = input
                        + al(rvox * 4)
                        + al(acc * cout * hw * 4)
                        + al(acc * hw * 4)
                        + OUT_SLOTS as u64 * al(slot);
                    assert!(
                        used <= planned,
                        "{used} > {planned} for {roi:?} {padded:?} shrink {shrink}"
                    );
                }
            }
        }
    }
}
