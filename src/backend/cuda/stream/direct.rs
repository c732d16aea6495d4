//! The direct input: windows gathered by a kernel from a float32 volume already in this device's
//! memory (a caller's tensor), instead of from host staging or the plane ring: no pinned staging,
//! no upload, no host copy. Before anything reads it, the volume's whole extent is checked to lie
//! in one allocation of this device, and the context is synchronised so that the producer's
//! pending writes (on its own streams) have landed.

use super::pass::Pass;
use super::schedule::Step as Batch;
use crate::backend::cuda::host::catalogue::GATHER_WINDOW_F32;
use crate::backend::cuda::runtime::device::drv;
use crate::backend::cuda::runtime::launch::{i32a, Arg};
use crate::backend::DeviceVolume;
use crate::{Error, Result};
use cudarc::driver::sys::{self, CUpointer_attribute};
use cudarc::driver::CudaContext;

/// The lowest and one past the highest byte address the view reaches.
pub(crate) fn extent(v: &DeviceVolume) -> (i128, i128) {
    let (mut lo, mut hi) = (v.ptr() as i128, v.ptr() as i128);
    for (n, s) in v.dims().iter().zip(v.strides()) {
        let span = (*n as i128 - 1) * s as i128 * 4;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    (lo, hi + 4)
}

/// One attribute of the allocation holding `ptr`.
fn attribute<T: Default>(
    ptr: u64,
    attr: CUpointer_attribute,
) -> std::result::Result<T, sys::CUresult> {
    let mut out = T::default();
    // SAFETY: `out` has the attribute's size (u64 for addresses and sizes, i32 for the
    // ordinal); the driver only reads `ptr`'s metadata.
    let r = unsafe { sys::cuPointerGetAttribute((&mut out as *mut T).cast(), attr, ptr) };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(out),
        e => Err(e),
    }
}

/// The volume lies in one device allocation on `ctx`'s device; then every pending write to it
/// (the producer's streams share the primary context) is waited for.
pub(super) fn check_and_sync(ctx: &CudaContext, v: &DeviceVolume) -> Result<()> {
    let ordinal = ctx.ordinal();
    if v.device() != ordinal {
        return Err(Error::Invalid(format!(
            "the volume is on CUDA device {} but the model runs on cuda:{ordinal}",
            v.device()
        )));
    }
    ctx.bind_to_thread().map_err(drv("bind context"))?;
    let (lo, hi) = extent(v);
    let not_device = || {
        Error::Invalid(format!(
            "the volume's address {:#x} is not memory of CUDA device {ordinal} (a host pointer, or a buffer of another context)",
            v.ptr()
        ))
    };
    let lo = u64::try_from(lo).map_err(|_| not_device())?;
    let dev: i32 = attribute(lo, CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        .map_err(|_| not_device())?;
    let start: u64 = attribute(
        lo,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    )
    .map_err(|_| not_device())?;
    let size: u64 = attribute(lo, CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE)
        .map_err(|_| not_device())?;
    if dev as usize != ordinal {
        return Err(not_device());
    }
    if hi > start as i128 + size as i128 {
        return Err(Error::Invalid(format!(
            "the volume {:?} with strides {:?} reaches past its allocation ({size} bytes from {start:#x})",
            v.dims(),
            v.strides()
        )));
    }
    ctx.synchronize()
        .map_err(drv("synchronize with the volume's producer"))
}

impl Pass<'_, '_> {
    /// The gather kernels of batch `st` from the device volume `v` into the network input.
    pub(super) fn gather_direct(&self, st: &Batch, v: &DeviceVolume) -> Result<()> {
        let [c, d, h, w] = self.dims;
        let [sc, sd, sh, sw] = v.strides().map(|x| x as i64);
        for (b, start) in self.order[st.begin..st.end].iter().enumerate() {
            let mut args = vec![
                Arg::Ptr(v.ptr()),
                Arg::Ptr(self.prep.input + (b * self.in_win * 2) as u64),
                i32a(c),
                i32a(d),
                i32a(h),
                i32a(w),
                Arg::I64(sc),
                Arg::I64(sd),
                Arg::I64(sh),
                Arg::I64(sw),
            ];
            args.extend(self.window_args(start));
            args.push(self.cval_arg());
            let s = &*self.gpu.stream;
            self.gpu
                .eltwise(s, GATHER_WINDOW_F32.name, self.in_win, &mut args)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The extent of a view with a reversed and a permuted axis covers exactly its elements.
    #[test]
    fn extent_covers_negative_strides() {
        // SAFETY: never read; only the addresses are computed.
        let v = unsafe { DeviceVolume::new(0x10000, [2, 3, 4, 5], [60, 20, 5, 1], 0) }.unwrap();
        assert_eq!(extent(&v), (0x10000, 0x10000 + 120 * 4));
        let turned = v.permuted_axes([0, 3, 2, 1]).slice_axis(1, 1..4);
        assert_eq!(extent(&turned), (0x10000 + 4, 0x10000 + 119 * 4));
        // A reversed D: the first element is the last plane's.
        let rev = unsafe { DeviceVolume::new(0x10000 + 40 * 4, [2, 3, 4, 5], [60, -20, 5, 1], 0) }
            .unwrap();
        assert_eq!(extent(&rev), (0x10000, 0x10000 + 120 * 4));
    }
}
