//! The CUDA backend: fp16 kernels of our own (kernels/*.cu) compiled with NVRTC.
//!
//! Activations live on the device as fp16 NDHWC (channels last, so a conv's GEMM K dimension is
//! contiguous); accumulation is fp32. `prepare` compiles the graph once per (roi, batch) into a
//! launch list over buffers placed by liveness in one preallocated arena; `run` only launches.
//! cudarc's per-buffer event tracking is switched off: this module orders its own streams.
//!
//! Layers, lowest first; each uses only those above it (no circles):
//! - `abi`: the kernel parameter blocks, activation codes, per-sample shape and allocation sizes;
//! - `host/`: planning with no driver type, unit-tested without a GPU: `catalogue` (every kernel's
//!   family, entry point and tile configuration), `options`, `select` and `conv_kernel` (which
//!   conv kernel), `relayout` (weights), `tensor_layout`, `attention_table`, `windowed`,
//!   `fusion`, `concat_split`, `launch`, `tile_stats`, and `buffers` (the buffer plan the memory
//!   planner sums); the files of `host/` import one another without circles either (the test
//!   `cuda::host_layers`);
//! - `runtime/`: `compile` (NVRTC, the PTX and cubin cache), `device` (driver errors, the
//!   allocation tracker, `DevBuf`), `launch` (kernel arguments and launches on a `Gpu`);
//! - `ops/*`: one plan-and-launch unit per op family; `launch_list`: the prepared graph;
//! - `single` (one batch in and out), `stream/` (the streamed sliding window), `profile`,
//!   `layers` (the report's kernel per layer);
//! - this file and `backend`/`memory`: `CudaBackend`, which owns the device state and options.

pub mod abi;
mod backend;
pub mod host;
pub(crate) mod launch_list;
pub mod layers;
pub mod memory;
pub(crate) mod ops;
pub(crate) mod profile;
pub mod runtime;
pub(crate) mod single;
pub mod stream;

pub use host::attention_table::{offsets as attention_offsets, AttnTable};
pub use host::options::{CudaOptions, GatherMode};
pub use stream::GpuTimes;

use crate::model::graph::Graph;
use crate::model::ops::{Attention, Dims};
use crate::{Error, Result};
use cudarc::driver::{sys, CudaContext};
use launch_list::Prepared;
use ndarray::{Array3, Array4, Array5, ArrayView5};
use runtime::device::{drv, mem_reset_peak, mem_stats};
use runtime::launch::Gpu;
use stream::{PinnedCache, WindowJob};

/// An LCG (Knuth's MMIX constants) for the unit tests and the arena's seeded placement
/// shuffles: advances `state`, returns its top 31 bits.
pub(crate) fn lcg_next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// The CUDA fp16 backend on one device.
pub struct CudaBackend {
    gpu: Gpu,
    device_name: String,
    arch: String,
    /// The device's opt-in shared memory per block (bytes): which halo kernels fit.
    smem_optin: usize,
    opts: CudaOptions,
    prepared: Option<Prepared>,
    /// Pinned staging of the sliding-window pipeline, kept between calls.
    pinned: Option<PinnedCache>,
    /// How many kernel families came from the on-disk kernel cache at start.
    pub ptx_from_cache: usize,
}

impl CudaBackend {
    /// Runs one attention on host f32 q, k, v (fp16 on the device; bias and mask as fp32 when
    /// `bias_f32`, else fp16) and returns the f32 output: the attention kernel's test entry point.
    pub fn attention_f16(
        &self,
        op: &Attention,
        q: (&[f32], Dims),
        k: (&[f32], Dims),
        v: (&[f32], Dims),
        bias_f32: bool,
    ) -> Result<Vec<f32>> {
        ops::attention::attention_f16(&self.gpu, op, q, k, v, bias_f32)
    }

    /// Opens device `device` with the default options (see [`Self::with_options`]).
    pub fn new(device: usize) -> Result<Self> {
        CudaBackend::with_options(device, CudaOptions::default())
    }

    /// Opens device `device`, compiles (or loads from the cache) every kernel family.
    /// Returns `Err` (never panics) when there is no driver, no such device or no NVRTC.
    pub fn with_options(device: usize, opts: CudaOptions) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Backend(
                "no CUDA driver found (libcuda.so): install the NVIDIA driver or use the CPU backend".into(),
            ));
        }
        if !runtime::compile::nvrtc_present() {
            return Err(Error::Backend(
                "no NVRTC found (libnvrtc.so): add the CUDA toolkit's lib64 folder to LD_LIBRARY_PATH".into(),
            ));
        }
        let t = std::time::Instant::now();
        let count = CudaContext::device_count().map_err(drv("device count (cuInit)"))?;
        tracing::debug!(
            "cuInit and device count in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        if device >= count.max(0) as usize {
            return Err(Error::Backend(format!(
                "CUDA device {device} does not exist ({count} found)"
            )));
        }
        let (ma, mi) = runtime::device::compute_capability(device)?;
        if ma < 7 {
            return Err(Error::Backend(format!("CUDA device {device} has compute capability {ma}.{mi}; tensor-core kernels need 7.0 or newer")));
        }
        let arch = format!("sm_{ma}{mi}");
        let mut dv = 0i32;
        // SAFETY: the driver is loaded; valid out pointer.
        unsafe { sys::cuDriverGetVersion(&mut dv) };
        // The kernels' images (the disk cache, NVRTC on a cold start) need no context: they are
        // read on a thread of their own while the driver creates it (W3's start).
        let t = std::time::Instant::now();
        let (ctx, images) = std::thread::scope(|s| {
            let images = s.spawn(|| runtime::compile::FamilyImages::new(&arch, dv));
            let t = std::time::Instant::now();
            let ctx = CudaContext::new(device).map_err(drv("context creation"));
            tracing::debug!(
                "CUDA context on device {device} in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            (ctx, images.join())
        });
        let ctx = ctx?;
        let images = images.map_err(|_| Error::Backend("kernel images: internal error".into()))?;
        runtime::device::mem_start(&ctx);
        // SAFETY: this backend orders its own streams with events; nothing else uses the context's slices.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let copy = ctx.new_stream().map_err(drv("stream creation"))?;
        let down = ctx.new_stream().map_err(drv("stream creation"))?;
        let attr = |a| ctx.attribute(a).map_err(drv("device attribute"));
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let smem_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as usize;
        let (funcs, ptx_from_cache) = runtime::compile::load_all(&ctx, images, ma, smem_optin)?;
        tracing::debug!(
            "kernel families loaded {:.0} ms after the context was begun ({ptx_from_cache} from the cache)",
            t.elapsed().as_secs_f64() * 1e3
        );
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
        Ok(CudaBackend {
            gpu: Gpu {
                ctx,
                stream,
                copy,
                down,
                funcs,
                sm_count: sm_count as u32,
                cc: (ma, mi),
            },
            device_name,
            arch,
            smem_optin,
            opts,
            prepared: None,
            pinned: None,
            ptx_from_cache,
        })
    }

    /// The options in force.
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Replaces the options (kernel variants take effect at the next `prepare`; tests switch
    /// variants on one backend instead of recompiling per variant).
    pub fn set_options(&mut self, opts: CudaOptions) {
        self.opts = opts;
    }

    /// `cuda:N <device name>`.
    pub fn name(&self) -> String {
        format!("cuda:{} {}", self.gpu.ctx.ordinal(), self.device_name)
    }

    /// The device's architecture string, e.g. "sm_90".
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Bytes of the prepared plan's activation arena (buffers placed by liveness).
    pub fn activation_bytes(&self) -> usize {
        self.prepared.as_ref().map_or(0, |p| p.activation_bytes)
    }

    /// This device's memory model: its capabilities now (switches included) and its ordinal.
    pub(crate) fn memory_model(&self) -> memory::CudaMemory {
        memory::CudaMemory {
            caps: self.caps(),
            device: self.gpu.ctx.ordinal(),
        }
    }

    /// The device properties and switches the launch list depends on (for
    /// [`host::buffers::buffer_plan`] and the memory planner).
    pub fn caps(&self) -> host::conv_kernel::ArchCaps {
        let (ma, mi) = self.gpu.cc;
        host::conv_kernel::ArchCaps::with_options(
            ma.max(0) as u32,
            mi.max(0) as u32,
            self.gpu.sm_count as usize,
            self.smem_optin,
            &self.opts,
        )
    }

    /// How many batch sizes of the prepared launch list run as a captured CUDA graph
    /// (`CudaOptions::graphs`).
    pub fn graphs_captured(&self) -> usize {
        self.prepared.as_ref().map_or(0, |p| p.graphs_captured())
    }

    /// High-water mark of this backend's device allocations (plan, constants, pipeline buffers)
    /// since the last `prepare` or `segment_windows*` call started.
    pub fn peak_device_bytes(&self) -> Option<u64> {
        Some(mem_stats(&self.gpu.ctx).1)
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
        stream::planned_device_bytes(self.prepared.as_ref(), roi, batch, channels_out, padded)
    }

    /// Compiles the graph into a launch list for up to `batch` windows of `roi`.
    pub fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()> {
        self.prepared = None;
        // The last pass's buffers go before the new plan allocates (its budget assumes so).
        if let Some(c) = self.pinned.as_mut() {
            c.release_device();
        }
        mem_reset_peak(&self.gpu.ctx);
        let p = launch_list::build(&self.gpu, &self.caps(), graph, batch, roi, self.opts.graphs)?;
        self.gpu.stream.synchronize().map_err(drv("synchronize"))?;
        self.prepared = Some(p);
        Ok(())
    }

    /// Runs one batch `[n <= batch, C_in, roi]` and returns `[n, C_out, D', H', W']`.
    pub fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>> {
        let prep = self.prepared.as_mut().ok_or_else(not_prepared)?;
        single::run_single(&self.gpu, prep, input, self.opts.poison)
    }

    /// Sliding-window inference, streamed: the windows of `job` are gathered, run in batches of
    /// `job.batch` and blended with `job.weights` in fp32 as MONAI does (sum of w * logits / sum
    /// of w). Returns blended logits `(Cout, D, H, W)`. `prepare(graph, >= job.batch, job.roi)`
    /// first. Any window order is accepted (sorted by D here).
    pub fn segment_windows(&mut self, job: &WindowJob) -> Result<(Array4<f32>, GpuTimes)> {
        match self.windows(job, false)? {
            (stream::Out::Logits(a), t) => Ok((a, t)),
            (stream::Out::Labels(..), _) => Err(Error::Backend("pipeline returned labels".into())),
        }
    }

    /// As [`Self::segment_windows`], but the argmax over channels is taken on the device and only
    /// labels `(D, H, W)` come back (first maximum wins; up to 65535 classes), with per plane
    /// the voxels labelled `0xFFFF` because their blended outputs hold a NaN.
    pub fn segment_windows_argmax(
        &mut self,
        job: &WindowJob,
    ) -> Result<(Array3<u16>, Vec<usize>, GpuTimes)> {
        match self.windows(job, true)? {
            (stream::Out::Labels(a, nan), t) => Ok((a, nan, t)),
            (stream::Out::Logits(_), _) => Err(Error::Backend("pipeline returned logits".into())),
        }
    }

    /// Runs one pass with the pinned staging of earlier calls.
    fn windows(&mut self, job: &WindowJob, argmax: bool) -> Result<(stream::Out, GpuTimes)> {
        if job.batch == 0 {
            return Err(Error::Invalid("window batch must be at least 1".into()));
        }
        let prep = self.prepared.as_ref().ok_or_else(not_prepared)?;
        let mut cache = self.pinned.take().unwrap_or_default();
        let r = stream::run_windows(&self.gpu, prep, &self.opts, &mut cache, job, argmax);
        self.pinned = Some(cache);
        r
    }

    /// Times `reps` runs of the prepared graph on the device input as it is (events), in ms per run.
    pub fn time_forward(&mut self, n: usize, reps: usize) -> Result<f64> {
        let prep = self.prepared.as_ref().ok_or_else(not_prepared)?;
        profile::time_forward(&self.gpu, prep, n, reps)
    }

    /// Per-op profile of the prepared graph on `n` windows: CUDA events around every step of
    /// the launch list, `reps` runs after one warm-up. Returns (label, ms per forward, launches
    /// per forward) summed over steps of one label, largest first; the labels name the op, its
    /// shapes and the conv kernel. Event gaps make the sum a little larger than `time_forward`.
    pub fn profile_forward(&mut self, n: usize, reps: usize) -> Result<Vec<(String, f64, usize)>> {
        let prep = self.prepared.as_ref().ok_or_else(not_prepared)?;
        profile::per_step(&self.gpu, prep, n, reps)
    }
}

fn not_prepared() -> Error {
    Error::Invalid("the CUDA backend was not prepared for a graph".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_without_gpu_is_an_error_not_a_panic() {
        // On machines with a GPU this simply succeeds; without one it must be Err.
        match CudaBackend::new(0) {
            Ok(b) => assert!(b.name().starts_with("cuda:0")),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
