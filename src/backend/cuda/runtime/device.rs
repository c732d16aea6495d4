//! Device memory: driver errors as `crate::Error`, the per-backend live / high-water byte
//! tracker, and `DevBuf`, the one owner of a raw device allocation.

use crate::backend::cuda::abi::alloc_size;
use crate::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Maps a driver error of `what` to `Error::OutOfMemory` or `Error::Backend`.
pub(crate) fn drv(what: &str) -> impl Fn(cu::DriverError) -> Error + '_ {
    move |e| {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory(format!("CUDA {what}"))
        } else {
            Error::Backend(format!("CUDA {what} failed: {e:?}"))
        }
    }
}

/// Compute capability (major, minor) of device `ordinal`, asked of the driver without a
/// context (cuInit done), so that what depends on it can start before the context exists.
pub(crate) fn compute_capability(ordinal: usize) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute as A;
    let dev = cu::device::get(ordinal as i32).map_err(drv("device handle"))?;
    // SAFETY: `dev` is a valid device handle of an initialised driver.
    let get = |a| unsafe { cu::device::get_attribute(dev, a) }.map_err(drv("compute capability"));
    Ok((
        get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Live and high-water device bytes per backend, keyed by the address of its context handle (each
/// backend owns one `Arc<CudaContext>`), so every `DevBuf` counts without a tracker argument.
fn mem_table() -> &'static Mutex<HashMap<usize, (u64, u64)>> {
    static T: OnceLock<Mutex<HashMap<usize, (u64, u64)>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn mem_track(ctx: &Arc<CudaContext>, delta: i64) {
    let mut t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry(Arc::as_ptr(ctx) as usize).or_insert((0, 0));
    e.0 = (e.0 as i64 + delta).max(0) as u64;
    e.1 = e.1.max(e.0);
}

/// Starts the counts of a new context afresh (a new handle may reuse a dropped one's address).
pub(crate) fn mem_start(ctx: &Arc<CudaContext>) {
    mem_table()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(Arc::as_ptr(ctx) as usize, (0, 0));
}

/// (live, peak) device bytes of the backend owning `ctx`.
pub(crate) fn mem_stats(ctx: &Arc<CudaContext>) -> (u64, u64) {
    let t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    t.get(&(Arc::as_ptr(ctx) as usize))
        .copied()
        .unwrap_or((0, 0))
}

/// Restarts the high-water mark at the bytes live now.
pub(crate) fn mem_reset_peak(ctx: &Arc<CudaContext>) {
    let mut t = mem_table().lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry(Arc::as_ptr(ctx) as usize).or_insert((0, 0));
    e.1 = e.0;
}

/// Device memory owned by the backend (raw pointer: kernels get plain addresses).
pub(crate) struct DevBuf {
    ctx: Arc<CudaContext>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: plain device allocation; freed once in Drop.
        let ptr = unsafe { cu::malloc_sync(alloc_size(bytes) as usize) }
            .map_err(drv(&format!("allocation of {bytes} bytes")))?;
        mem_track(ctx, alloc_size(bytes) as i64);
        Ok(DevBuf {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }

    pub fn upload<T>(ctx: &Arc<CudaContext>, stream: &CudaStream, data: &[T]) -> Result<Self> {
        let b = DevBuf::new(ctx, std::mem::size_of_val(data))?;
        // SAFETY: `b` holds at least size_of_val(data) bytes; synchronised before `data` can go.
        unsafe { cu::memcpy_htod_async(b.ptr, data, stream.cu_stream()) }.map_err(drv("upload"))?;
        stream.synchronize().map_err(drv("synchronize"))?;
        Ok(b)
    }
}

/// Device buffers a pass hands back for the next one of the same shape (allocating and freeing
/// a few hundred MB per volume costs milliseconds of driver time).
#[derive(Default)]
pub(crate) struct DevPool(Vec<DevBuf>);

impl DevPool {
    /// Buffers of `sizes` bytes, in order: pooled ones of the same size first; the rest of the
    /// pool is freed before anything new is allocated, so a pass never holds more than its own.
    pub fn take(&mut self, ctx: &Arc<CudaContext>, sizes: &[usize]) -> Result<Vec<DevBuf>> {
        let mut got: Vec<Option<DevBuf>> = sizes
            .iter()
            .map(|&b| {
                let i = self.0.iter().position(|d| d.bytes == b)?;
                Some(self.0.swap_remove(i))
            })
            .collect();
        self.0.clear();
        for (slot, &b) in got.iter_mut().zip(sizes) {
            if slot.is_none() {
                *slot = Some(DevBuf::new(ctx, b)?);
            }
        }
        Ok(got.into_iter().flatten().collect())
    }

    /// Keeps `bufs` for the next pass.
    pub fn put(&mut self, bufs: impl IntoIterator<Item = DevBuf>) {
        self.0.extend(bufs);
    }

    /// Frees every pooled buffer (before a new plan allocates).
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync, freed once; the context synchronises first.
        let _ = self.ctx.synchronize();
        let _ = unsafe { cu::free_sync(self.ptr) };
        mem_track(&self.ctx, -(alloc_size(self.bytes) as i64));
    }
}
