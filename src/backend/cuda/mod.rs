//! The CUDA backend: fp16 kernels of our own (kernels/*.cu) compiled with NVRTC.
//!
//! Activations live on the device as fp16 NDHWC (channels last, so a conv's GEMM K dimension is
//! contiguous); accumulation is fp32. `prepare` compiles the graph once per (roi, batch) into a
//! launch list over buffers placed by liveness in one preallocated arena; `run` only launches.
//! cudarc's per-buffer event tracking is switched off: this module orders its own streams.

mod backend;
pub mod buffers;

/// The unit tests' LCG (Knuth's MMIX constants): advances `state`, returns its top 31 bits.
#[cfg(test)]
pub(crate) fn lcg_next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}
pub mod kernels;
pub mod memory;
pub mod pipeline;
pub mod plan;

pub use pipeline::GpuTimes;

use crate::model::graph::{Graph, Op, Tensor};
use crate::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaFunction, CudaStream, PinnedHostSlice};
use ndarray::{Array5, ArrayView5};
use plan::{Act, ConvParams, PoolParams, Shape};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

fn drv(what: &str) -> impl Fn(cu::DriverError) -> Error + '_ {
    move |e| {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory(format!("CUDA {what}"))
        } else {
            Error::Backend(format!("CUDA {what} failed: {e:?}"))
        }
    }
}

/// `name` as one of the `names` of a kernel table (the static name, so a forced tile outlives
/// the caller's string); an unknown name is an error naming the `what` kind of kernel.
fn known_kernel(
    name: Option<&str>,
    mut names: impl Iterator<Item = &'static str>,
    what: &str,
) -> Result<Option<&'static str>> {
    match name {
        None => Ok(None),
        Some(n) => names
            .find(|k| *k == n)
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("no {what} kernel named {n}"))),
    }
}

/// Live and high-water device bytes per backend, keyed by the address of its context handle (each
/// backend owns one `Arc<CudaContext>`), so every `DevBuf` counts without a tracker argument.
fn mem_table() -> &'static std::sync::Mutex<HashMap<usize, (u64, u64)>> {
    static T: std::sync::OnceLock<std::sync::Mutex<HashMap<usize, (u64, u64)>>> =
        std::sync::OnceLock::new();
    T.get_or_init(Default::default)
}

fn mem_track(ctx: &Arc<CudaContext>, delta: i64) {
    let mut t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry(Arc::as_ptr(ctx) as usize).or_insert((0, 0));
    e.0 = (e.0 as i64 + delta).max(0) as u64;
    e.1 = e.1.max(e.0);
}

/// (live, peak) device bytes of the backend owning `ctx`.
fn mem_stats(ctx: &Arc<CudaContext>) -> (u64, u64) {
    let t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    t.get(&(Arc::as_ptr(ctx) as usize))
        .copied()
        .unwrap_or((0, 0))
}

/// Restarts the high-water mark at the bytes live now.
fn mem_reset_peak(ctx: &Arc<CudaContext>) {
    let mut t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry(Arc::as_ptr(ctx) as usize).or_insert((0, 0));
    e.1 = e.0;
}

/// Device memory owned by the backend (raw pointer: kernels get plain addresses).
struct DevBuf {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
}

impl DevBuf {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: plain device allocation; freed once in Drop.
        let ptr = unsafe { cu::malloc_sync(buffers::alloc_size(bytes) as usize) }
            .map_err(drv(&format!("allocation of {bytes} bytes")))?;
        mem_track(ctx, buffers::alloc_size(bytes) as i64);
        Ok(DevBuf {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }
    fn upload<T>(ctx: &Arc<CudaContext>, stream: &CudaStream, data: &[T]) -> Result<Self> {
        let b = DevBuf::new(ctx, std::mem::size_of_val(data))?;
        // SAFETY: `b` holds at least size_of_val(data) bytes; synchronised before `data` can go.
        unsafe { cu::memcpy_htod_async(b.ptr, data, stream.cu_stream()) }.map_err(drv("upload"))?;
        stream.synchronize().map_err(drv("synchronize"))?;
        Ok(b)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync, freed once; the context synchronises first.
        let _ = self.ctx.synchronize();
        let _ = unsafe { cu::free_sync(self.ptr) };
        mem_track(&self.ctx, -(buffers::alloc_size(self.bytes) as i64));
    }
}

/// One kernel argument, kept alive until the launch reads it.
enum Arg {
    I32(i32),
    I64(i64),
    F32(f32),
    Ptr(u64),
    Conv(ConvParams),
    Pool(PoolParams),
}

#[derive(Clone, Copy, Debug)]
enum Bin {
    Add = 0,
    Mul = 1,
    Sub = 2,
    Div = 3,
}

/// One entry of the launch list. Pointers are final; sizes are per sample (times n at run).
enum Step {
    Conv {
        func: &'static str,
        p: ConvParams,
        x: u64,
        w: u64,
        bias: u64,
        y: u64,
        slope: u64,
        /// GEMM tile rows / columns, threads and dynamic shared memory of the launch.
        bm: u32,
        bn: u32,
        threads: u32,
        smem: u32,
        direct: bool,
        /// 1x1x1 conv with few outputs on `conv1x1_n*` (one thread per voxel).
        pointwise: bool,
    },
    Norm {
        x: u64,
        y: u64,
        pix: usize,
        c: usize,
        groups: usize,
        eps: f32,
        gamma: u64,
        beta: u64,
        act: Act,
        slope: u64,
    },
    Affine {
        x: u64,
        y: u64,
        pix: usize,
        c: usize,
        ab: u64,
        act: Act,
        slope: u64,
    },
    Act {
        x: u64,
        y: u64,
        len: usize,
        c: usize,
        act: Act,
        slope: u64,
    },
    Binary {
        a: u64,
        b: u64,
        y: u64,
        len: usize,
        op: Bin,
        /// Channels of a and b; y's channel stride and offset (a concat slice, else c and 0).
        c: usize,
        ldc: usize,
        coff: usize,
    },
    BinaryConst {
        x: u64,
        k: u64,
        y: u64,
        shape: Shape,
        ks: [i64; 5],
        op: Bin,
    },
    Concat {
        x: u64,
        y: u64,
        pix: usize,
        cin: usize,
        ctot: usize,
        coff: usize,
    },
    Copy {
        x: u64,
        y: u64,
        len: usize,
    },
    Softmax {
        x: u64,
        y: u64,
        pix: usize,
        c: usize,
    },
    Pool {
        p: PoolParams,
        x: u64,
        y: u64,
    },
    Resize {
        x: u64,
        y: u64,
        c: usize,
        i: [usize; 3],
        o: [usize; 3],
        scales: [f32; 3],
        linear: bool,
        coord: i32,
        nmode: i32,
    },
}

struct Prepared {
    batch: usize,
    roi: [usize; 3],
    cin: usize,
    cout: usize,
    out_spatial: [usize; 3],
    steps: Vec<Step>,
    /// One label per step (op kind, shapes, kernel) for `profile_forward`.
    labels: Vec<String>,
    /// The activation arena (fp16; every buffer of the plan at its offset), then constants;
    /// all kept alive for the launch list.
    arena: DevBuf,
    #[allow(dead_code)]
    consts: Vec<DevBuf>,
    input: u64,
    output: u64,
    /// f32 staging of the single-window API (`Backend::run`), made on its first call: the
    /// streamed pipeline never needs it.
    single: Option<SingleWindow>,
    /// Its bytes (the buffer plan's `stage_in`, `stage_out`).
    stage_bytes: (usize, usize),
    /// fp64 [batch][Cmax][2] channel sums and f32 [batch][Cmax][2] norm scale/shift.
    norm_sums: DevBuf,
    norm_ab: DevBuf,
    /// Bytes of activation memory the plan allocated (after reuse).
    activation_bytes: usize,
}

/// Device and pinned f32 NCDHW staging of one window batch in and out (`Backend::run`).
struct SingleWindow {
    stage_in: DevBuf,
    stage_out: DevBuf,
    host_in: PinnedHostSlice<f32>,
    host_out: PinnedHostSlice<f32>,
}

/// Constants uploaded so far, checked against the buffer plan's list.
struct ConstSink<'a> {
    bufs: Vec<DevBuf>,
    plan: &'a [plan::ConstBuf],
}

/// The CUDA fp16 backend on one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    device_name: String,
    arch: String,
    sm_count: u32,
    prepared: Option<Prepared>,
    /// Pinned staging of the sliding-window pipeline, kept between calls.
    pinned: Option<pipeline::PinnedCache>,
    poison: bool,
    /// Convs run on the mma.sync kernels (sm_80+) unless `set_legacy_conv(true)` (benchmarks).
    conv_mma: bool,
    /// Forces one `conv_mma_*` tile for every mma conv (tests and benchmarks); None: by shape.
    conv_tile: Option<&'static str>,
    /// Stride-1 3^3 convs with Cin a multiple of 32 run on `conv_halo_*` (plan::pick_halo),
    /// unless a tile is forced.
    conv_halo: bool,
    /// Cin-1 3^3 convs run on `conv_c1_k3`.
    conv_c1: bool,
    /// kernel == stride transposed convs (Cin, Cout % 8 == 0) run on `convt_up_*`.
    conv_up_vec: bool,
    /// Forces one `conv_halo_*` variant where its Cin and width fit (benchmarks); None: default.
    halo_tile: Option<&'static str>,
    /// The device's opt-in shared memory per block (bytes): which halo kernels fit.
    smem_optin: usize,
    /// How many kernel families came from the on-disk PTX cache at start.
    pub ptx_from_cache: usize,
}

impl CudaBackend {
    /// Opens device `device`, compiles (or loads from the cache) every kernel family.
    /// Returns `Err` (never panics) when there is no driver, no such device or no NVRTC.
    pub fn new(device: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Backend(
                "no CUDA driver found (libcuda.so): install the NVIDIA driver or use the CPU backend".into(),
            ));
        }
        if !kernels::nvrtc_present() {
            return Err(Error::Backend(
                "no NVRTC found (libnvrtc.so): add the CUDA toolkit's lib64 folder to LD_LIBRARY_PATH".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(drv("device count (cuInit)"))?;
        if device >= count.max(0) as usize {
            return Err(Error::Backend(format!(
                "CUDA device {device} does not exist ({count} found)"
            )));
        }
        let ctx = CudaContext::new(device).map_err(drv("context creation"))?;
        // A new handle may reuse a dropped one's address: start its counts afresh.
        mem_table()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(Arc::as_ptr(&ctx) as usize, (0, 0));
        // SAFETY: this backend orders its own streams with events; nothing else uses the context's slices.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let copy = ctx.new_stream().map_err(drv("stream creation"))?;
        let (ma, mi) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        if ma < 7 {
            return Err(Error::Backend(format!("CUDA device {device} has compute capability {ma}.{mi}; tensor-core kernels need 7.0 or newer")));
        }
        let arch = format!("sm_{ma}{mi}");
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("device attribute"))? as u32;
        let mut dv = 0i32;
        // SAFETY: the driver is loaded; valid out pointer.
        unsafe { sys::cuDriverGetVersion(&mut dv) };
        let mut funcs = HashMap::new();
        let mut ptx_from_cache = 0;
        for (name, src, entries) in kernels::FAMILIES {
            let (ptx, cached) = kernels::ptx_cached(name, src, &arch, dv)?;
            ptx_from_cache += cached as usize;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(drv(&format!("loading kernels/{name}.cu")))?;
            for e in entries.iter() {
                let f = module
                    .load_function(e)
                    .map_err(drv(&format!("loading kernel {e}")))?;
                funcs.insert(*e, f);
            }
        }
        let smem_optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("device attribute"))? as usize;
        if ma >= 8 {
            for c in plan::HALO_CONFIGS {
                if c.smem_bytes() as usize > smem_optin {
                    continue;
                }
                if let Some(f) = funcs.get(c.name) {
                    f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        c.smem_bytes() as i32,
                    )
                    .map_err(drv(&format!("shared memory limit of {}", c.name)))?;
                }
            }
            // The mma conv tiles use more than the default 48 KB of dynamic shared memory.
            for c in plan::MMA_CONFIGS {
                let twin = plan::upsample_vec_name(c.name);
                for name in std::iter::once(c.name).chain(twin) {
                    if let Some(f) = funcs.get(name) {
                        f.set_attribute(
                            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            c.smem_bytes() as i32,
                        )
                        .map_err(drv(&format!("shared memory limit of {name}")))?;
                    }
                }
            }
        }
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
        Ok(CudaBackend {
            ctx,
            stream,
            copy,
            funcs,
            device_name,
            arch,
            sm_count,
            prepared: None,
            pinned: None,
            poison: false,
            conv_mma: ma >= 8,
            conv_tile: None,
            conv_halo: true,
            conv_c1: true,
            conv_up_vec: true,
            halo_tile: None,
            smem_optin,
            ptx_from_cache,
        })
    }

    /// Fill every activation buffer with NaN before each run, so unwritten elements show (tests).
    pub fn set_poison(&mut self, on: bool) {
        self.poison = on;
    }

    /// Runs convs on the older wmma implicit GEMM instead of the mma.sync kernels (for
    /// before/after benchmarks); takes effect at the next `prepare`.
    pub fn set_legacy_conv(&mut self, legacy: bool) {
        let (ma, _) = self.ctx.compute_capability().unwrap_or((0, 0));
        self.conv_mma = !legacy && ma >= 8;
    }

    /// Runs eligible stride-1 3^3 convs (Cin k x 32, Cout <= 128: plan::pick_halo) on the
    /// halo-tile kernels (default on sm_80+) or on the `conv_mma_*` tiles (before/after
    /// benchmarks); takes effect at the next `prepare`. A forced tile (`set_conv_tile`) also
    /// turns them off.
    pub fn set_halo_conv(&mut self, on: bool) {
        self.conv_halo = on;
    }

    /// Runs Cin-1 3^3 convs (stride 1/2, Cout <= 64) on `conv_c1_k3` (default) or on the
    /// `conv_mma_*` tiles (before/after benchmarks); takes effect at the next `prepare`.
    pub fn set_c1_conv(&mut self, on: bool) {
        self.conv_c1 = on;
    }

    /// Runs kernel == stride transposed convs with Cin, Cout % 8 == 0 on `convt_up_*` (16-byte
    /// staged epilogue, default) or on the `conv_mma_*` scatter epilogue (before/after
    /// benchmarks); takes effect at the next `prepare`.
    pub fn set_upsample_vec(&mut self, on: bool) {
        self.conv_up_vec = on;
    }

    /// Forces the `conv_halo_*` kernel `name` (one of `plan::HALO_CONFIGS`) for the halo convs
    /// whose Cin it accepts (`HaloConfig::accepts_cin`) and tile width it matches (any Cout),
    /// from the next `prepare`; None: the default ones.
    pub fn set_halo_tile(&mut self, name: Option<&str>) -> Result<()> {
        self.halo_tile =
            known_kernel(name, plan::HALO_CONFIGS.iter().map(|c| c.name), "halo conv")?;
        Ok(())
    }

    /// Forces the `conv_mma_*` kernel `name` (one of `plan::MMA_CONFIGS`) for the mma convs of
    /// the next `prepare` (tests cover every tile on small shapes); None picks by shape. A `_v8`
    /// tile still falls back to `_v1` where Cin % 8 != 0.
    pub fn set_conv_tile(&mut self, name: Option<&str>) -> Result<()> {
        self.conv_tile = known_kernel(name, plan::MMA_CONFIGS.iter().map(|c| c.name), "conv")?;
        Ok(())
    }

    /// The device's architecture string, e.g. "sm_90".
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Bytes of the prepared plan's activation arena (buffers placed by liveness).
    pub fn activation_bytes(&self) -> usize {
        self.prepared.as_ref().map_or(0, |p| p.activation_bytes)
    }

    fn launch(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut [Arg],
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| Error::Backend(format!("kernel {name} is not loaded")))?;
        let mut ptrs: Vec<*mut c_void> = args
            .iter_mut()
            .map(|a| match a {
                Arg::I32(v) => v as *mut i32 as *mut c_void,
                Arg::I64(v) => v as *mut i64 as *mut c_void,
                Arg::F32(v) => v as *mut f32 as *mut c_void,
                Arg::Ptr(v) => v as *mut u64 as *mut c_void,
                Arg::Conv(v) => v as *mut ConvParams as *mut c_void,
                Arg::Pool(v) => v as *mut PoolParams as *mut c_void,
            })
            .collect();
        // SAFETY: every pointer points into `args`, alive for the call; the argument lists match
        // the kernels' signatures (kept in sync with kernels/*.cu by the GPU op tests).
        unsafe {
            cu::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                smem,
                stream.cu_stream(),
                &mut ptrs,
            )
        }
        .map_err(drv(&format!("launch of {name}")))
    }

    /// Grid size for grid-stride elementwise kernels.
    fn grid_for(&self, total: usize) -> (u32, u32, u32) {
        let blocks = total.div_ceil(256).clamp(1, self.sm_count as usize * 32);
        (blocks as u32, 1, 1)
    }

    fn eltwise(
        &self,
        stream: &CudaStream,
        name: &str,
        total: usize,
        args: &mut [Arg],
    ) -> Result<()> {
        self.launch(stream, name, self.grid_for(total), 256, 0, args)
    }

    /// Blocks per sample of the norm statistics: >= 256 pixels each, at most 2 per SM (with
    /// batch 4 that fills 132 SMs 8 deep at 128^3), so the partials stay small.
    fn norm_blocks(&self, pix: usize) -> usize {
        self.caps().norm_blocks(pix)
    }

    /// y = act(x * a + b) per (sample, channel) from `ab` (`nstride` 0: one pair per channel);
    /// 16-byte vectors when C % 8 == 0.
    #[allow(clippy::too_many_arguments)]
    fn affine(
        &self,
        s: &CudaStream,
        x: u64,
        y: u64,
        n: usize,
        pix: usize,
        c: usize,
        ab: u64,
        nstride: usize,
        act: &Act,
        slope: u64,
    ) -> Result<()> {
        let nv = pix * c / 8;
        if c.is_multiple_of(8) && nv < (1usize << 32) {
            let per = (self.sm_count as usize * 16).div_ceil(n).max(1);
            let grid = (nv.div_ceil(256).clamp(1, per) as u32, n as u32, 1);
            return self.launch(
                s,
                "affine_act_v8",
                grid,
                256,
                0,
                &mut [
                    Arg::Ptr(x),
                    Arg::Ptr(y),
                    Arg::I64(pix as i64),
                    Arg::I32(c as i32),
                    Arg::Ptr(ab),
                    Arg::I32(nstride as i32),
                    Arg::I32(act.code()),
                    Arg::F32(act.alpha()),
                    Arg::Ptr(slope),
                    Arg::I32(slope_n(act)),
                ],
            );
        }
        let total = n * pix * c;
        self.eltwise(
            s,
            "affine_act",
            total,
            &mut [
                Arg::Ptr(x),
                Arg::Ptr(y),
                Arg::I64(total as i64),
                Arg::I64(pix as i64),
                Arg::I32(c as i32),
                Arg::Ptr(ab),
                Arg::I32(nstride as i32),
                Arg::I32(act.code()),
                Arg::F32(act.alpha()),
                Arg::Ptr(slope),
                Arg::I32(slope_n(act)),
            ],
        )
    }

    /// Uploads the next constant of the buffer plan; its bytes must be the plan's.
    fn upload_const<T>(&self, consts: &mut ConstSink, data: &[T]) -> Result<u64> {
        let k = consts.bufs.len();
        let bytes = std::mem::size_of_val(data);
        match consts.plan.get(k) {
            Some(c) if c.bytes == bytes => {}
            c => {
                return Err(Error::Backend(format!(
                "CUDA launch list: constant {k} has {bytes} bytes but the buffer plan says {c:?}"
            )))
            }
        }
        let b = DevBuf::upload(&self.ctx, &self.stream, data)?;
        let p = b.ptr;
        consts.bufs.push(b);
        Ok(p)
    }

    fn act_slope(&self, consts: &mut ConstSink, act: &Act) -> Result<u64> {
        match act {
            Act::PRelu(s) => self.upload_const(consts, s),
            _ => Ok(0),
        }
    }

    /// The device properties and switches the launch list depends on (for
    /// [`plan::buffer_plan`] and the memory planner).
    pub fn caps(&self) -> plan::ArchCaps {
        let (ma, mi) = self.ctx.compute_capability().unwrap_or((0, 0));
        plan::ArchCaps {
            sm: (ma * 10 + mi).max(0) as u32,
            sm_count: self.sm_count as usize,
            smem_optin: self.smem_optin,
            conv_mma: self.conv_mma,
            conv_halo: self.conv_halo,
            conv_c1: self.conv_c1,
            conv_up_vec: self.conv_up_vec,
            conv_tile: self.conv_tile,
            halo_tile: self.halo_tile,
        }
    }

    /// Builds the launch list over exactly the buffers of [`plan::buffer_plan`]: the plan says
    /// which buffers exist, which launch writes which, each conv's kernel and every constant's
    /// bytes; this only allocates, uploads (checking each size against the plan) and fills in
    /// pointers.
    fn build(&self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<Prepared> {
        let bp = plan::buffer_plan(graph, batch, roi, &self.caps())?;
        let shapes = &bp.shapes;
        let numel = |s: &Shape| s.iter().product::<usize>();
        let arena = DevBuf::new(&self.ctx, bp.arena)?;
        let bufs: Vec<u64> = bp.offsets.iter().map(|&o| arena.ptr + o as u64).collect();
        let in_shape = shapes[graph.input];
        let mut consts = ConstSink {
            bufs: Vec::new(),
            plan: &bp.consts,
        };
        let mut steps: Vec<Step> = Vec::new();
        let mut labels: Vec<String> = Vec::new();
        for l in &bp.launches {
            let i = l.node;
            let node = &graph.nodes[i];
            let xs: Vec<u64> = node
                .inputs
                .iter()
                .map(|&v| {
                    bp.value_buf[v].map(|b| bufs[b]).ok_or_else(|| {
                        Error::Graph(format!(
                            "node {}: input value {v} was never computed",
                            node.name
                        ))
                    })
                })
                .collect::<Result<_>>()?;
            let x = xs[0];
            let xshape = shapes[node.inputs[0]];
            let act = match l.fuse {
                Some(j) => Act::of(&graph.nodes[j].op).expect("checked by fusable_activation"),
                None => Act::None,
            };
            let oshape = shapes[node.output];
            let (ldc, coff) = (l.ldc, l.coff);
            let y = bufs[l.out_buf];
            let in_place = &bp.in_place;
            let conv_kernel = l.conv.as_ref();
            let pix = oshape[1] * oshape[2] * oshape[3];
            let slope = self.act_slope(&mut consts, &act)?;
            let slope_n = match &act {
                Act::PRelu(s) => {
                    if s.len() != 1 && s.len() != oshape[0] {
                        return Err(Error::Graph(format!(
                            "node {}: PRelu slope has {} values for {} channels",
                            node.name,
                            s.len(),
                            oshape[0]
                        )));
                    }
                    s.len() as i32
                }
                _ => 1,
            };
            match &node.op {
                Op::Conv(c) => {
                    let w = &c.weight.shape;
                    steps.extend(self.conv_step(
                        &mut consts,
                        conv_kernel.ok_or_else(|| {
                            Error::Backend(format!("node {}: no conv kernel planned", node.name))
                        })?,
                        &c.weight,
                        c.bias.as_ref(),
                        c.groups,
                        false,
                        xshape,
                        oshape,
                        [w[2], w[3], w[4]],
                        c.stride,
                        c.dilation,
                        [c.pads[0], c.pads[1], c.pads[2]],
                        &act,
                        x,
                        y,
                        ldc,
                        coff,
                        slope,
                        slope_n,
                    )?);
                }
                Op::ConvTranspose(c) => {
                    let w = &c.weight.shape;
                    steps.extend(self.conv_step(
                        &mut consts,
                        conv_kernel.ok_or_else(|| {
                            Error::Backend(format!("node {}: no conv kernel planned", node.name))
                        })?,
                        &c.weight,
                        c.bias.as_ref(),
                        c.groups,
                        true,
                        xshape,
                        oshape,
                        [w[2], w[3], w[4]],
                        c.stride,
                        c.dilation,
                        [c.pads[0], c.pads[1], c.pads[2]],
                        &act,
                        x,
                        y,
                        ldc,
                        coff,
                        slope,
                        slope_n,
                    )?);
                }
                Op::InstanceNorm { eps, scale, bias }
                | Op::GroupNorm {
                    eps, scale, bias, ..
                } => {
                    let groups = match &node.op {
                        Op::GroupNorm { groups, .. } => *groups,
                        _ => xshape[0],
                    };
                    if scale.len() != xshape[0] || bias.len() != xshape[0] {
                        return Err(Error::Graph(format!(
                            "node {}: norm scale/bias length differs from {} channels",
                            node.name, xshape[0]
                        )));
                    }
                    let gamma = self.upload_const(&mut consts, &scale.data)?;
                    let beta = self.upload_const(&mut consts, &bias.data)?;
                    steps.push(Step::Norm {
                        x,
                        y,
                        pix,
                        c: xshape[0],
                        groups,
                        eps: *eps,
                        gamma,
                        beta,
                        act: act.clone(),
                        slope,
                    });
                }
                Op::ChannelAffine { scale, shift } => {
                    if scale.len() != xshape[0] || shift.len() != xshape[0] {
                        return Err(Error::Graph(format!(
                            "node {}: affine length differs from {} channels",
                            node.name, xshape[0]
                        )));
                    }
                    let ab: Vec<f32> = scale
                        .data
                        .iter()
                        .zip(&shift.data)
                        .flat_map(|(a, b)| [*a, *b])
                        .collect();
                    let ab = self.upload_const(&mut consts, &ab)?;
                    steps.push(Step::Affine {
                        x,
                        y,
                        pix,
                        c: xshape[0],
                        ab,
                        act: act.clone(),
                        slope,
                    });
                }
                op @ (Op::Relu
                | Op::LeakyRelu { .. }
                | Op::PRelu { .. }
                | Op::Elu { .. }
                | Op::Sigmoid
                | Op::Tanh) => {
                    let a = Act::of(op).expect("activation");
                    let slope = self.act_slope(&mut consts, &a)?;
                    if let Act::PRelu(s) = &a {
                        if s.len() != 1 && s.len() != xshape[0] {
                            return Err(Error::Graph(format!(
                                "node {}: PRelu slope has {} values for {} channels",
                                node.name,
                                s.len(),
                                xshape[0]
                            )));
                        }
                    }
                    steps.push(Step::Act {
                        x,
                        y,
                        len: numel(&xshape),
                        c: xshape[0],
                        act: a,
                        slope,
                    });
                }
                Op::Add | Op::Mul | Op::Sub | Op::Div => {
                    let op = match &node.op {
                        Op::Add => Bin::Add,
                        Op::Mul => Bin::Mul,
                        Op::Sub => Bin::Sub,
                        _ => Bin::Div,
                    };
                    steps.push(Step::Binary {
                        a: x,
                        b: xs[1],
                        y,
                        len: numel(&xshape),
                        op,
                        c: xshape[0],
                        ldc,
                        coff,
                    });
                }
                Op::AddConst(t) | Op::MulConst(t) => {
                    let op = if matches!(node.op, Op::AddConst(_)) {
                        Bin::Add
                    } else {
                        Bin::Mul
                    };
                    let ks = const_strides(t, batch, &xshape).ok_or_else(|| {
                        Error::Graph(format!(
                            "node {}: constant of shape {:?} does not broadcast to [N,{:?}]",
                            node.name, t.shape, xshape
                        ))
                    })?;
                    let k = self.upload_const(&mut consts, &t.data)?;
                    steps.push(Step::BinaryConst {
                        x,
                        k,
                        y,
                        shape: xshape,
                        ks,
                        op,
                    });
                }
                Op::Concat { .. } => {
                    let mut coff = 0;
                    for (&v, &xp) in node.inputs.iter().zip(&xs) {
                        let cin = shapes[v][0];
                        if in_place[v] {
                            coff += cin;
                            continue;
                        }
                        steps.push(Step::Concat {
                            x: xp,
                            y,
                            pix,
                            cin,
                            ctot: oshape[0],
                            coff,
                        });
                        coff += cin;
                    }
                }
                Op::Identity => steps.push(Step::Copy {
                    x,
                    y,
                    len: numel(&xshape),
                }),
                Op::Softmax { .. } => steps.push(Step::Softmax {
                    x,
                    y,
                    pix,
                    c: xshape[0],
                }),
                Op::MaxPool(p) | Op::AveragePool(p) => {
                    let pp = PoolParams {
                        n: batch as i32,
                        di: xshape[1] as i32,
                        hi: xshape[2] as i32,
                        wi: xshape[3] as i32,
                        c: xshape[0] as i32,
                        do_: oshape[1] as i32,
                        ho: oshape[2] as i32,
                        wo: oshape[3] as i32,
                        kd: p.kernel[0] as i32,
                        kh: p.kernel[1] as i32,
                        kw: p.kernel[2] as i32,
                        sd: p.stride[0] as i32,
                        sh: p.stride[1] as i32,
                        sw: p.stride[2] as i32,
                        dd: p.dilation[0] as i32,
                        dh: p.dilation[1] as i32,
                        dw: p.dilation[2] as i32,
                        pd: p.pads[0] as i32,
                        ph: p.pads[1] as i32,
                        pw: p.pads[2] as i32,
                        ped: p.pads[3] as i32,
                        peh: p.pads[4] as i32,
                        pew: p.pads[5] as i32,
                        is_max: matches!(node.op, Op::MaxPool(_)) as i32,
                        count_include_pad: p.count_include_pad as i32,
                    };
                    steps.push(Step::Pool { p: pp, x, y });
                }
                Op::Resize(r) => {
                    let i3 = [xshape[1], xshape[2], xshape[3]];
                    let (o3, scales) = plan::resize_geometry(r, i3);
                    use crate::model::graph::{CoordMode, NearestMode};
                    let coord = match r.coord {
                        CoordMode::HalfPixel => 0,
                        CoordMode::PytorchHalfPixel => 1,
                        CoordMode::AlignCorners => 2,
                        CoordMode::Asymmetric => 3,
                    };
                    let nmode = match r.nearest {
                        NearestMode::RoundPreferFloor => 0,
                        NearestMode::RoundPreferCeil => 1,
                        NearestMode::Floor => 2,
                        NearestMode::Ceil => 3,
                    };
                    steps.push(Step::Resize {
                        x,
                        y,
                        c: xshape[0],
                        i: i3,
                        o: o3,
                        scales,
                        linear: plan::is_linear(r),
                        coord,
                        nmode,
                    });
                }
            }
            while labels.len() < steps.len() {
                labels.push(step_label(
                    &steps[labels.len()],
                    &node.op,
                    &act,
                    xshape,
                    oshape,
                ));
            }
        }
        if consts.bufs.len() != bp.consts.len() {
            return Err(Error::Backend(format!(
                "CUDA launch list: {} constants uploaded, the buffer plan lists {}",
                consts.bufs.len(),
                bp.consts.len()
            )));
        }
        let out_shape = shapes[graph.output];
        let activation_bytes = arena.bytes;
        let (ib, ob) = (bp.input_buf, bp.output_buf);
        Ok(Prepared {
            batch,
            roi,
            cin: in_shape[0],
            cout: out_shape[0],
            out_spatial: [out_shape[1], out_shape[2], out_shape[3]],
            steps,
            labels,
            input: bufs[ib],
            output: bufs[ob],
            arena,
            consts: consts.bufs,
            single: None,
            stage_bytes: (bp.stage_in, bp.stage_out),
            norm_sums: DevBuf::new(&self.ctx, bp.norm_sums)?,
            norm_ab: DevBuf::new(&self.ctx, bp.norm_ab)?,
            activation_bytes,
        })
    }

    /// The launch(es) of one conv on the kernel the buffer plan chose, uploading its bias and
    /// re-laid weight(s).
    #[allow(clippy::too_many_arguments)]
    fn conv_step(
        &self,
        consts: &mut ConstSink,
        kernel: &plan::ConvKernel,
        weight: &Tensor,
        bias: Option<&Tensor>,
        groups: usize,
        transposed: bool,
        xs: Shape,
        os: Shape,
        k: [usize; 3],
        stride: [usize; 3],
        dil: [usize; 3],
        pads: [usize; 3],
        act: &Act,
        x: u64,
        y: u64,
        ldc: usize,
        coff: usize,
        slope: u64,
        slope_n: i32,
    ) -> Result<Vec<Step>> {
        use plan::ConvKernel as K;
        let cout = os[0];
        let direct = groups != 1;
        let taps = k[0] * k[1] * k[2];
        let bias = match bias {
            Some(b) if b.len() == cout => self.upload_const(consts, &b.data)?,
            Some(b) => {
                return Err(Error::Graph(format!(
                    "conv bias has {} values for {cout} channels",
                    b.len()
                )))
            }
            None => 0,
        };
        let mut p = ConvParams {
            n: 0,
            di: xs[1] as i32,
            hi: xs[2] as i32,
            wi: xs[3] as i32,
            cin: xs[0] as i32,
            do_: os[1] as i32,
            ho: os[2] as i32,
            wo: os[3] as i32,
            cout: cout as i32,
            kd: k[0] as i32,
            kh: k[1] as i32,
            kw: k[2] as i32,
            sd: stride[0] as i32,
            sh: stride[1] as i32,
            sw: stride[2] as i32,
            pd: pads[0] as i32,
            ph: pads[1] as i32,
            pw: pads[2] as i32,
            dd: dil[0] as i32,
            dh: dil[1] as i32,
            dw: dil[2] as i32,
            transposed: transposed as i32,
            kpad: 0,
            groups: groups as i32,
            ldc: ldc as i32,
            coff: coff as i32,
            act: act.code(),
            alpha: act.alpha(),
            slope_n,
            ..Default::default()
        };
        let rows_pad = kernel.weight_rows(&weight.shape, groups, transposed);
        let mut upload = |wh: &[half::f16]| -> Result<u64> { self.upload_const(consts, wh) };
        let step = |p: ConvParams, w: u64, y: u64, func, bm, bn, threads, smem| Step::Conv {
            func,
            p,
            x,
            w,
            bias,
            y,
            slope,
            bm,
            bn,
            threads,
            smem,
            direct,
            pointwise: false,
        };
        match kernel {
            // A strided transposed conv: one dense conv per output parity class on the mma
            // kernel, scattered with stride `stride` (no zero MACs).
            K::Parity(classes) => {
                let mut out = Vec::new();
                for (cl, c) in classes {
                    let (wh, kpad) = plan::relayout_parity_weight(
                        &weight.data,
                        &weight.shape,
                        &cl.taps,
                        rows_pad,
                    );
                    let mut q = p;
                    (q.do_, q.ho, q.wo) = (cl.grid[0] as i32, cl.grid[1] as i32, cl.grid[2] as i32);
                    (q.kd, q.kh, q.kw) = (
                        cl.taps[0].len() as i32,
                        cl.taps[1].len() as i32,
                        cl.taps[2].len() as i32,
                    );
                    (q.sd, q.sh, q.sw) = (1, 1, 1);
                    (q.dd, q.dh, q.dw) = (1, 1, 1);
                    (q.pd, q.ph, q.pw) = (cl.pad[0], cl.pad[1], cl.pad[2]);
                    q.transposed = 0;
                    (q.up_d, q.up_h, q.up_w) =
                        (stride[0] as i32, stride[1] as i32, stride[2] as i32);
                    q.ocout = cout as i32;
                    (q.od, q.oh, q.ow) = (os[1] as i32, os[2] as i32, os[3] as i32);
                    q.kpad = kpad as i32;
                    let w = upload(&wh)?;
                    // The class's first output voxel: the scatter adds (j * stride) to it.
                    let first = (cl.r[0] * os[2] + cl.r[1]) * os[3] + cl.r[2];
                    out.push(step(
                        q,
                        w,
                        y + (first * ldc * 2) as u64,
                        c.name,
                        c.bm as u32,
                        c.bn as u32,
                        c.threads,
                        c.smem_bytes(),
                    ));
                }
                Ok(out)
            }
            // 1x1x1 conv with few outputs (the head): memory bound, one thread per voxel.
            K::Pointwise { nc } => {
                let cin = xs[0];
                let (wh, kpad) =
                    plan::relayout_weight(&weight.data, &weight.shape, 1, false, rows_pad);
                p.kpad = kpad as i32;
                let w = upload(&wh)?;
                Ok(vec![Step::Conv {
                    func: if *nc == 16 {
                        "conv1x1_n16"
                    } else {
                        "conv1x1_n32"
                    },
                    p,
                    x,
                    w,
                    bias,
                    y,
                    slope,
                    bm: 256,
                    bn: *nc as u32,
                    threads: 256,
                    smem: (cin * nc * 4 + 256 * nc * 2) as u32,
                    direct: false,
                    pointwise: true,
                }])
            }
            // Plain GEMM [input voxels x Cin] x [Cin x taps*Cout], scattered to the k^3 blocks.
            K::Upsample(c) | K::UpsampleVec(c) => {
                let n = taps * cout;
                let (wh, kpad) =
                    plan::relayout_upsampling_weight(&weight.data, &weight.shape, rows_pad);
                p.do_ = xs[1] as i32;
                p.ho = xs[2] as i32;
                p.wo = xs[3] as i32;
                p.cout = n as i32;
                (p.kd, p.kh, p.kw) = (1, 1, 1);
                (p.sd, p.sh, p.sw) = (1, 1, 1);
                (p.dd, p.dh, p.dw) = (1, 1, 1);
                p.transposed = 0;
                (p.up_d, p.up_h, p.up_w) = (k[0] as i32, k[1] as i32, k[2] as i32);
                p.ocout = cout as i32;
                (p.od, p.oh, p.ow) = (os[1] as i32, os[2] as i32, os[3] as i32);
                p.kpad = kpad as i32;
                let w = upload(&wh)?;
                Ok(vec![step(
                    p,
                    w,
                    y,
                    kernel.funcs()[0],
                    c.bm as u32,
                    c.bn as u32,
                    c.threads,
                    c.smem_bytes(),
                )])
            }
            // Stride-1 3^3 with Cin k x 32: the input halo of a 4x8x8 output tile loaded once
            // for all 27 taps (`conv_halo_*`), the mma weight layout; or the mma / legacy tiles.
            K::Halo(_) | K::Mma(_) | K::Legacy { .. } | K::Cin1 => {
                let (wh, kpad) = plan::relayout_weight(
                    &weight.data,
                    &weight.shape,
                    groups,
                    transposed,
                    rows_pad,
                );
                p.kpad = kpad as i32;
                let w = upload(&wh)?;
                let (func, bm, bn, threads, smem) = match kernel {
                    K::Halo(c) => (c.name, 256, c.bn, c.threads, c.smem_bytes()),
                    K::Mma(c) => (c.name, c.bm, c.bn, c.threads, c.smem_bytes()),
                    K::Legacy { func, bn } => (*func, 128, *bn, 128, 0),
                    // One block per 2x8x32 output tile, static shared memory.
                    K::Cin1 => ("conv_c1_k3", 512, 64, 256, 0),
                    _ => unreachable!("matched above"),
                };
                Ok(vec![step(
                    p, w, y, func, bm as u32, bn as u32, threads, smem,
                )])
            }
        }
    }

    /// Launches the prepared list for `n` samples on the compute stream.
    fn run_steps(&self, prep: &Prepared, n: usize) -> Result<()> {
        for step in &prep.steps {
            self.run_step(prep, step, n)?;
        }
        Ok(())
    }

    /// Launches one step of the list for `n` samples on the compute stream.
    fn run_step(&self, prep: &Prepared, step: &Step, n: usize) -> Result<()> {
        let s = &*self.stream;
        {
            match step {
                Step::Conv {
                    func,
                    p,
                    x,
                    w,
                    bias,
                    y,
                    slope,
                    bm,
                    bn,
                    threads,
                    smem,
                    direct,
                    pointwise,
                } => {
                    let mut p = *p;
                    p.n = n as i32;
                    if *pointwise {
                        let m = n * (p.do_ * p.ho * p.wo) as usize;
                        let blocks = m.div_ceil(256).clamp(1, self.sm_count as usize * 16);
                        self.launch(
                            s,
                            func,
                            (blocks as u32, 1, 1),
                            *threads,
                            *smem,
                            &mut [
                                Arg::Conv(p),
                                Arg::Ptr(*x),
                                Arg::Ptr(*w),
                                Arg::Ptr(*bias),
                                Arg::Ptr(*y),
                                Arg::Ptr(*slope),
                            ],
                        )?;
                    } else if *direct {
                        let total = n * (p.do_ * p.ho * p.wo * p.cout) as usize;
                        self.eltwise(
                            s,
                            func,
                            total,
                            &mut [
                                Arg::Conv(p),
                                Arg::Ptr(*x),
                                Arg::Ptr(*w),
                                Arg::Ptr(*bias),
                                Arg::Ptr(*y),
                                Arg::Ptr(*slope),
                            ],
                        )?;
                    } else if *func == "conv_c1_k3" {
                        // One block per C1_TZ x C1_TY x C1_TX = 2 x 8 x 32 output tile.
                        let tiles = (p.do_ as usize).div_ceil(2)
                            * (p.ho as usize).div_ceil(8)
                            * (p.wo as usize).div_ceil(32);
                        self.launch(
                            s,
                            func,
                            ((n * tiles) as u32, 1, 1),
                            *threads,
                            0,
                            &mut [
                                Arg::Conv(p),
                                Arg::Ptr(*x),
                                Arg::Ptr(*w),
                                Arg::Ptr(*bias),
                                Arg::Ptr(*y),
                                Arg::Ptr(*slope),
                            ],
                        )?;
                    } else if let Some(c) = plan::halo_config(func) {
                        // One block per output tile, or persistent blocks that loop over the
                        // tiles; grid.y: the bn-wide output-channel tiles.
                        let out = [p.do_ as usize, p.ho as usize, p.wo as usize];
                        let blocks = c.grid(n, out, self.sm_count as usize);
                        self.launch(
                            s,
                            func,
                            (blocks, c.cout_tiles(p.cout as usize), 1),
                            *threads,
                            *smem,
                            &mut [
                                Arg::Conv(p),
                                Arg::Ptr(*x),
                                Arg::Ptr(*w),
                                Arg::Ptr(*bias),
                                Arg::Ptr(*y),
                                Arg::Ptr(*slope),
                            ],
                        )?;
                    } else {
                        let m = n * (p.do_ * p.ho * p.wo) as usize;
                        let grid = (
                            m.div_ceil(*bm as usize) as u32,
                            (p.cout as u32).div_ceil(*bn),
                            1,
                        );
                        self.launch(
                            s,
                            func,
                            grid,
                            *threads,
                            *smem,
                            &mut [
                                Arg::Conv(p),
                                Arg::Ptr(*x),
                                Arg::Ptr(*w),
                                Arg::Ptr(*bias),
                                Arg::Ptr(*y),
                                Arg::Ptr(*slope),
                            ],
                        )?;
                    }
                }
                Step::Norm {
                    x,
                    y,
                    pix,
                    c,
                    groups,
                    eps,
                    gamma,
                    beta,
                    act,
                    slope,
                } => {
                    let part = prep.norm_sums.ptr;
                    let nblk = self.norm_blocks(*pix);
                    let chunk = pix.div_ceil(nblk);
                    let v8 = *c % 8 == 0 && *c <= 2048;
                    let rows = if v8 {
                        256 / (*c / 8)
                    } else {
                        256 / (*c).min(256)
                    };
                    self.launch(
                        s,
                        if v8 {
                            "norm_partial_v8"
                        } else {
                            "norm_partial"
                        },
                        (nblk as u32, n as u32, 1),
                        256,
                        (rows * *c * 2 * 4) as u32,
                        &mut [
                            Arg::Ptr(*x),
                            Arg::I64(*pix as i64),
                            Arg::I32(*c as i32),
                            Arg::I32(*groups as i32),
                            Arg::I64(chunk as i64),
                            Arg::Ptr(part),
                        ],
                    )?;
                    self.launch(
                        s,
                        "norm_finalize",
                        ((n * c).div_ceil(4) as u32, 1, 1),
                        128,
                        0,
                        &mut [
                            Arg::Ptr(part),
                            Arg::I32(nblk as i32),
                            Arg::Ptr(*x),
                            Arg::I32(n as i32),
                            Arg::I64(*pix as i64),
                            Arg::I32(*c as i32),
                            Arg::I32(*groups as i32),
                            Arg::F32(*eps),
                            Arg::Ptr(*gamma),
                            Arg::Ptr(*beta),
                            Arg::Ptr(prep.norm_ab.ptr),
                        ],
                    )?;
                    self.affine(s, *x, *y, n, *pix, *c, prep.norm_ab.ptr, *c, act, *slope)?;
                }
                Step::Affine {
                    x,
                    y,
                    pix,
                    c,
                    ab,
                    act,
                    slope,
                } => self.affine(s, *x, *y, n, *pix, *c, *ab, 0, act, *slope)?,
                Step::Act {
                    x,
                    y,
                    len,
                    c,
                    act,
                    slope,
                } => {
                    let total = n * len;
                    self.eltwise(
                        s,
                        if c % 8 == 0 { "act_v8" } else { "act_kernel" },
                        if c % 8 == 0 { total / 8 } else { total },
                        &mut [
                            Arg::Ptr(*x),
                            Arg::Ptr(*y),
                            Arg::I64(total as i64),
                            Arg::I32(*c as i32),
                            Arg::I32(act.code()),
                            Arg::F32(act.alpha()),
                            Arg::Ptr(*slope),
                            Arg::I32(slope_n(act)),
                        ],
                    )?;
                }
                Step::Binary {
                    a,
                    b,
                    y,
                    len,
                    op,
                    c,
                    ldc,
                    coff,
                } => {
                    let total = n * len;
                    let v8 = (c | ldc | coff) % 8 == 0;
                    self.eltwise(
                        s,
                        if v8 { "binary_v8" } else { "binary_kernel" },
                        if v8 { total / 8 } else { total },
                        &mut [
                            Arg::Ptr(*a),
                            Arg::Ptr(*b),
                            Arg::Ptr(*y),
                            Arg::I64(total as i64),
                            Arg::I32(*op as i32),
                            Arg::I32(*c as i32),
                            Arg::I32(*ldc as i32),
                            Arg::I32(*coff as i32),
                        ],
                    )?;
                }
                Step::BinaryConst {
                    x,
                    k,
                    y,
                    shape,
                    ks,
                    op,
                } => {
                    let total = n * shape.iter().product::<usize>();
                    self.eltwise(
                        s,
                        "binary_const_kernel",
                        total,
                        &mut [
                            Arg::Ptr(*x),
                            Arg::Ptr(*k),
                            Arg::Ptr(*y),
                            Arg::I32(shape[1] as i32),
                            Arg::I32(shape[2] as i32),
                            Arg::I32(shape[3] as i32),
                            Arg::I32(shape[0] as i32),
                            Arg::I64(total as i64),
                            Arg::I64(ks[0]),
                            Arg::I64(ks[1]),
                            Arg::I64(ks[2]),
                            Arg::I64(ks[3]),
                            Arg::I64(ks[4]),
                            Arg::I32(*op as i32),
                        ],
                    )?;
                }
                Step::Concat {
                    x,
                    y,
                    pix,
                    cin,
                    ctot,
                    coff,
                } => {
                    let p = n * pix;
                    let v8 = (cin | ctot | coff) % 8 == 0;
                    self.eltwise(
                        s,
                        if v8 { "concat_copy_v8" } else { "concat_copy" },
                        if v8 { p * cin / 8 } else { p * cin },
                        &mut [
                            Arg::Ptr(*x),
                            Arg::Ptr(*y),
                            Arg::I64(p as i64),
                            Arg::I32(*cin as i32),
                            Arg::I32(*ctot as i32),
                            Arg::I32(*coff as i32),
                        ],
                    )?;
                }
                Step::Copy { x, y, len } => {
                    self.eltwise(
                        s,
                        "copy_half",
                        n * len,
                        &mut [Arg::Ptr(*x), Arg::Ptr(*y), Arg::I64((n * len) as i64)],
                    )?;
                }
                Step::Softmax { x, y, pix, c } => {
                    self.eltwise(
                        s,
                        "softmax_channels",
                        n * pix,
                        &mut [
                            Arg::Ptr(*x),
                            Arg::Ptr(*y),
                            Arg::I64((n * pix) as i64),
                            Arg::I32(*c as i32),
                        ],
                    )?;
                }
                Step::Pool { p, x, y } => {
                    let mut p = *p;
                    p.n = n as i32;
                    let total = n * (p.do_ * p.ho * p.wo * p.c) as usize;
                    self.eltwise(
                        s,
                        "pool_kernel",
                        total,
                        &mut [Arg::Pool(p), Arg::Ptr(*x), Arg::Ptr(*y)],
                    )?;
                }
                Step::Resize {
                    x,
                    y,
                    c,
                    i,
                    o,
                    scales,
                    linear,
                    coord,
                    nmode,
                } => {
                    let total = n * c * o.iter().product::<usize>();
                    self.eltwise(
                        s,
                        "resize_kernel",
                        total,
                        &mut [
                            Arg::Ptr(*x),
                            Arg::Ptr(*y),
                            Arg::I32(n as i32),
                            Arg::I32(*c as i32),
                            Arg::I32(i[0] as i32),
                            Arg::I32(i[1] as i32),
                            Arg::I32(i[2] as i32),
                            Arg::I32(o[0] as i32),
                            Arg::I32(o[1] as i32),
                            Arg::I32(o[2] as i32),
                            Arg::F32(scales[0]),
                            Arg::F32(scales[1]),
                            Arg::F32(scales[2]),
                            Arg::I32(*linear as i32),
                            Arg::I32(*coord),
                            Arg::I32(*nmode),
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }

    fn poison_buffers(&self, prep: &Prepared) -> Result<()> {
        let b = &prep.arena;
        let len = b.bytes / 2;
        self.eltwise(
            &self.stream,
            "fill_half",
            len,
            &mut [Arg::Ptr(b.ptr), Arg::I64(len as i64), Arg::F32(f32::NAN)],
        )?;
        Ok(())
    }

    fn prepared(&self) -> Result<&Prepared> {
        self.prepared
            .as_ref()
            .ok_or_else(|| Error::Invalid("the CUDA backend was not prepared for a graph".into()))
    }

    /// Runs the prepared graph on `n` windows already in the NDHWC fp16 input buffer.
    fn forward(&self, n: usize) -> Result<()> {
        let prep = self.prepared()?;
        self.run_steps(prep, n)
    }

    /// Times `reps` runs of the prepared graph on the device input as it is (events), in ms per run.
    pub fn time_forward(&mut self, n: usize, reps: usize) -> Result<f64> {
        let prep = self.prepared()?;
        if n == 0 || n > prep.batch {
            return Err(Error::Invalid(format!(
                "batch {n} outside 1..={}",
                prep.batch
            )));
        }
        self.forward(n)?;
        let e0 = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))?;
        for _ in 0..reps {
            self.forward(n)?;
        }
        let e1 = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))?;
        e1.synchronize().map_err(drv("synchronize"))?;
        Ok(e0.elapsed_ms(&e1).map_err(drv("event timing"))? as f64 / reps.max(1) as f64)
    }

    /// Per-op profile of the prepared graph on `n` windows: CUDA events around every step of
    /// the launch list, `reps` runs after one warm-up. Returns (label, ms per forward, launches
    /// per forward) summed over steps of one label, largest first; the labels name the op, its
    /// shapes and the conv kernel (`step_label`). Event gaps make the sum a little larger than
    /// `time_forward`.
    pub fn profile_forward(&mut self, n: usize, reps: usize) -> Result<Vec<(String, f64, usize)>> {
        let prep = self.prepared()?;
        if n == 0 || n > prep.batch || reps == 0 {
            return Err(Error::Invalid(format!(
                "batch {n} outside 1..={} or no repetitions",
                prep.batch
            )));
        }
        self.run_steps(prep, n)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut per_step = vec![0f64; prep.steps.len()];
        for _ in 0..reps {
            let mut evs = Vec::with_capacity(prep.steps.len() + 1);
            evs.push(self.stream.record_event(flags).map_err(drv("event"))?);
            for step in &prep.steps {
                self.run_step(prep, step, n)?;
                evs.push(self.stream.record_event(flags).map_err(drv("event"))?);
            }
            evs.last()
                .expect("one event at least")
                .synchronize()
                .map_err(drv("synchronize"))?;
            for (i, t) in per_step.iter_mut().enumerate() {
                *t += evs[i]
                    .elapsed_ms(&evs[i + 1])
                    .map_err(drv("event timing"))? as f64;
            }
        }
        let mut agg: Vec<(String, f64, usize)> = Vec::new();
        for (label, t) in prep.labels.iter().zip(&per_step) {
            match agg.iter_mut().find(|a| &a.0 == label) {
                Some(a) => {
                    a.1 += t / reps as f64;
                    a.2 += 1;
                }
                None => agg.push((label.clone(), t / reps as f64, 1)),
            }
        }
        agg.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(agg)
    }
}

/// Profile label of one step: op, input -> output shape (C x D x H x W per sample), fused
/// activation and, for convs, the kernel. Steps of one label are summed by `profile_forward`.
fn step_label(step: &Step, op: &Op, act: &Act, x: Shape, o: Shape) -> String {
    let sh = |s: Shape| format!("{}x{}x{}x{}", s[0], s[1], s[2], s[3]);
    let act = match act {
        Act::None => String::new(),
        a => format!(" +{}", format!("{a:?}").split('(').next().unwrap_or("")),
    };
    // Kernel and stride of the op itself (a transposed conv runs as several GEMM steps).
    let ks = |w: &Tensor, st: [usize; 3]| {
        let w = &w.shape;
        format!(
            "k{}{}{} s{}",
            w[2],
            w[3],
            w[4],
            st.iter().max().unwrap_or(&1)
        )
    };
    let what = match (step, op) {
        (Step::Conv { func, .. }, Op::Conv(c)) => {
            format!("{} {} [{func}]", op.name(), ks(&c.weight, c.stride))
        }
        (Step::Conv { func, .. }, Op::ConvTranspose(c)) => {
            format!("{} {} [{func}]", op.name(), ks(&c.weight, c.stride))
        }
        (Step::Concat { cin, coff, .. }, _) => format!("{} copy {cin}@{coff}", op.name()),
        _ => op.name().to_string(),
    };
    format!("{what}{act} {} -> {}", sh(x), sh(o))
}

fn slope_n(act: &Act) -> i32 {
    match act {
        Act::PRelu(s) => s.len() as i32,
        _ => 1,
    }
}

/// Element strides (N, C, D, H, W) of an NCDHW-broadcast constant, 0 on broadcast axes; None when
/// its shape does not broadcast to [batch, x].
fn const_strides(t: &Tensor, batch: usize, x: &Shape) -> Option<[i64; 5]> {
    let full = [batch, x[0], x[1], x[2], x[3]];
    let mut shape = t.shape.clone();
    if shape.len() > 5 {
        return None;
    }
    while shape.len() < 5 {
        shape.insert(0, 1);
    }
    let mut strides = [0i64; 5];
    let mut acc = 1i64;
    for a in (0..5).rev() {
        if shape[a] == full[a] && shape[a] != 1 {
            strides[a] = acc;
        } else if shape[a] != 1 || (a == 0 && shape[0] != 1) {
            return None;
        }
        acc *= shape[a] as i64;
    }
    // A constant over N that is not broadcast would depend on the batch size: reject.
    if shape[0] != 1 {
        return None;
    }
    Some(strides)
}

/// The [`crate::backend::Backend`] methods, also callable without the trait (see `backend.rs`).
impl CudaBackend {
    /// `cuda:N` and the device name.
    pub fn name(&self) -> String {
        format!("cuda:{} {}", self.ctx.ordinal(), self.device_name)
    }

    /// Builds the launch list for (batch, roi): see [`crate::backend::Backend::prepare`].
    pub fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()> {
        self.prepared = None;
        mem_reset_peak(&self.ctx);
        let p = self.build(graph, batch, roi)?;
        self.stream.synchronize().map_err(drv("synchronize"))?;
        self.prepared = Some(p);
        Ok(())
    }

    /// Runs one batch through the single-window API: see [`crate::backend::Backend::run`].
    pub fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>> {
        let prep = self.prepared.as_mut().ok_or_else(|| {
            Error::Invalid("the CUDA backend was not prepared for a graph".into())
        })?;
        let (n, c, d, h, w) = input.dim();
        if n == 0 || n > prep.batch || c != prep.cin || [d, h, w] != prep.roi {
            return Err(Error::Invalid(format!(
                "input {:?} does not fit the prepared [<= {}, {}, {:?}]",
                input.dim(),
                prep.batch,
                prep.cin,
                prep.roi
            )));
        }
        let in_len = n * c * d * h * w;
        if prep.single.is_none() {
            let (bi, bo) = prep.stage_bytes;
            // SAFETY: host buffers are written before they are read. Flags 0: cached (not
            // write-combined) memory, fast to read back on the host.
            let host_in = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(bi / 4, 0) }
                .map_err(drv("pinned allocation"))?;
            let host_out = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(bo / 4, 0) }
                .map_err(drv("pinned allocation"))?;
            prep.single = Some(SingleWindow {
                stage_in: DevBuf::new(&self.ctx, bi)?,
                stage_out: DevBuf::new(&self.ctx, bo)?,
                host_in,
                host_out,
            });
        }
        let single = prep.single.as_mut().expect("made above");
        {
            let hs = single
                .host_in
                .as_mut_slice()
                .map_err(drv("pinned access"))?;
            for (dst, src) in hs[..in_len].iter_mut().zip(input.iter()) {
                *dst = *src;
            }
        }
        let prep = self.prepared.as_ref().expect("checked above");
        let single = prep.single.as_ref().expect("made above");
        let s = &*self.stream;
        let hs = single.host_in.as_slice().map_err(drv("pinned access"))?;
        // SAFETY: stage_in holds batch*cin*roi floats >= in_len; synchronised before returning.
        unsafe { cu::memcpy_htod_async(single.stage_in.ptr, &hs[..in_len], s.cu_stream()) }
            .map_err(drv("upload"))?;
        if self.poison {
            self.poison_buffers(prep)?;
        }
        let sp = d * h * w;
        self.eltwise(
            s,
            "ncdhw_to_ndhwc",
            in_len,
            &mut [
                Arg::Ptr(single.stage_in.ptr),
                Arg::Ptr(prep.input),
                Arg::I32(n as i32),
                Arg::I32(c as i32),
                Arg::I64(sp as i64),
            ],
        )?;
        self.run_steps(prep, n)?;
        let [od, oh, ow] = prep.out_spatial;
        let osp = od * oh * ow;
        let out_len = n * prep.cout * osp;
        self.eltwise(
            s,
            "ndhwc_to_ncdhw",
            out_len,
            &mut [
                Arg::Ptr(prep.output),
                Arg::Ptr(single.stage_out.ptr),
                Arg::I32(n as i32),
                Arg::I32(prep.cout as i32),
                Arg::I64(osp as i64),
            ],
        )?;
        let cout = prep.cout;
        let stage_out = single.stage_out.ptr;
        let prep = self.prepared.as_mut().expect("checked above");
        let single = prep.single.as_mut().expect("made above");
        let ho = single
            .host_out
            .as_mut_slice()
            .map_err(drv("pinned access"))?;
        // SAFETY: host_out holds >= out_len floats; synchronised right after.
        unsafe { cu::memcpy_dtoh_async(&mut ho[..out_len], stage_out, s.cu_stream()) }
            .map_err(drv("download"))?;
        s.synchronize().map_err(drv("running the graph"))?;
        let v = ho[..out_len].to_vec();
        Array5::from_shape_vec((n, cout, od, oh, ow), v)
            .map_err(|e| Error::Backend(format!("output shape: {e}")))
    }
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

    #[test]
    fn const_strides_broadcast() {
        let t = Tensor::new(vec![1, 4, 1, 1, 1], vec![0.0; 4]);
        assert_eq!(const_strides(&t, 2, &[4, 3, 3, 3]), Some([0, 1, 0, 0, 0]));
        let t = Tensor::new(vec![1, 1, 1, 1, 1], vec![0.0]);
        assert_eq!(const_strides(&t, 2, &[4, 3, 3, 3]), Some([0; 5]));
        let t = Tensor::new(vec![1, 4, 3, 1, 1], vec![0.0; 12]);
        assert_eq!(const_strides(&t, 2, &[4, 3, 5, 5]), Some([0, 3, 1, 0, 0]));
        let t = Tensor::new(vec![1, 3, 1, 1, 1], vec![0.0; 3]);
        assert_eq!(const_strides(&t, 2, &[4, 3, 3, 3]), None);
    }
}
