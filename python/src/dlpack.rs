//! A CUDA tensor in through DLPack, read in place: the capsule's `DLTensor` becomes the library's
//! [`DeviceVolume`] (address, sizes, strides in elements, device ordinal). The capsule is only
//! borrowed: it is not renamed, so its producer's destructor still frees it, and the Python
//! caller keeps it alive for the whole run.

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::ffi::c_void;
use voxtile::{DeviceVolume, Error};

/// DLPack's device type of CUDA memory.
const KDL_CUDA: i32 = 2;
/// DLPack's type code of IEEE floats.
const KDL_FLOAT: u8 = 2;

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// The head of DLPack's (unversioned) `DLManagedTensor`: its `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// The (C, D, H, W) float32 CUDA volume a `__dlpack__()` capsule describes; anything else is an
/// error that says what the tensor is.
pub fn device_volume(capsule: &Bound<'_, PyAny>) -> PyResult<DeviceVolume> {
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| crate::errors::invalid("expected a DLPack capsule (tensor.__dlpack__())"))?;
    // The name check: an unversioned DLManagedTensor not yet consumed.
    let ptr = capsule
        .pointer_checked(Some(c"dltensor"))
        .map_err(|_| {
            crate::errors::invalid(
                "the DLPack capsule is used or of another version (expected \"dltensor\")",
            )
        })?
        .as_ptr() as *const DlTensor;
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor, whose first member is the DLTensor;
    // it lives as long as the capsule, which the caller holds.
    let t = unsafe { &*ptr };
    if t.device.device_type != KDL_CUDA {
        return Err(crate::errors::invalid(format!(
            "the tensor is not in CUDA memory (DLPack device type {})",
            t.device.device_type
        )));
    }
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (KDL_FLOAT, 32, 1) {
        return Err(crate::errors::invalid(format!(
            "a CUDA tensor must be float32 (DLPack type code {}, {} bits): tensor.float() converts it on the device",
            t.dtype.code, t.dtype.bits
        )));
    }
    if t.ndim != 4 {
        return Err(crate::errors::invalid(format!(
            "expected a 4-D (C, D, H, W) CUDA tensor, got {} dimensions",
            t.ndim
        )));
    }
    // SAFETY: `shape` (and `strides` when not null) hold `ndim` = 4 values.
    let shape = unsafe { std::slice::from_raw_parts(t.shape, 4) };
    let dims = [0, 1, 2, 3].map(|a| shape[a].max(0) as usize);
    let strides: [isize; 4] = if t.strides.is_null() {
        // Compact row-major (DLPack's meaning of no strides).
        [
            (dims[1] * dims[2] * dims[3]) as isize,
            (dims[2] * dims[3]) as isize,
            dims[3] as isize,
            1,
        ]
    } else {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(t.strides, 4) };
        [0, 1, 2, 3].map(|a| s[a] as isize)
    };
    let addr = (t.data as u64).wrapping_add(t.byte_offset);
    // SAFETY: the producer describes CUDA memory of this process; the Python side synchronises
    // nothing itself: the engine checks the extent against the allocation and synchronises the
    // context before reading, and the caller keeps the tensor alive and unwritten during the run.
    unsafe { DeviceVolume::new(addr, dims, strides, t.device.device_id.max(0) as usize) }
        .map_err(|e: Error| crate::errors::to_py(e))
}
