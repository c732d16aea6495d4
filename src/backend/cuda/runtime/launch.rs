//! Launch marshalling: the compiled kernels of one context, its two streams, and the kernel
//! argument list turned into the driver's pointer array.

use super::device::drv;
use crate::backend::cuda::abi::{ConvParams, GemmParams, NdParams, PoolParams};
use crate::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaEvent, CudaFunction, CudaStream};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// One kernel argument, kept alive until the launch reads it.
pub(crate) enum Arg {
    I32(i32),
    I64(i64),
    F32(f32),
    Ptr(u64),
    Conv(ConvParams),
    Pool(PoolParams),
    Nd(NdParams),
    Gemm(GemmParams),
    /// A tensor map (`runtime::tma`), passed by value.
    Tma(Box<sys::CUtensorMap>),
}

/// `v` as an i32 argument.
pub(crate) fn i32a(v: usize) -> Arg {
    Arg::I32(v as i32)
}

/// What every op and the pipeline launch on: the context, the compute stream, the copy
/// stream, the pipeline's download stream (made once: stream creation is a driver call per
/// volume otherwise), the loaded kernels, the SM count that sizes grid-stride grids and the compute
/// capability (major, minor) that picks kernels built for newer GPUs.
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub copy: Arc<CudaStream>,
    pub down: Arc<CudaStream>,
    pub funcs: HashMap<&'static str, CudaFunction>,
    pub sm_count: u32,
    pub cc: (i32, i32),
}

impl Gpu {
    /// Launches kernel `name` with a 1D block of `block` threads.
    pub fn launch(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        (block, smem): (u32, u32),
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
                Arg::Nd(v) => v as *mut NdParams as *mut c_void,
                Arg::Gemm(v) => v as *mut GemmParams as *mut c_void,
                Arg::Tma(v) => &mut **v as *mut sys::CUtensorMap as *mut c_void,
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
    pub fn grid_for(&self, total: usize) -> (u32, u32, u32) {
        let blocks = total.div_ceil(256).clamp(1, self.sm_count as usize * 32);
        (blocks as u32, 1, 1)
    }

    /// A grid-stride kernel over `total` items, 256 threads a block.
    pub fn eltwise(
        &self,
        stream: &CudaStream,
        name: &str,
        total: usize,
        args: &mut [Arg],
    ) -> Result<()> {
        self.launch(stream, name, self.grid_for(total), (256, 0), args)
    }
}

/// An event recorded on `s` now.
pub(crate) fn ev(s: &CudaStream) -> Result<CudaEvent> {
    s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("event"))
}
