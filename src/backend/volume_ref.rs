//! Where a pass's volume lives: host memory (an ndarray view) or a CUDA device's memory (a
//! strided view of a caller's float32 buffer, e.g. a PyTorch tensor handed over through DLPack).
//! The engine permutes and slices either without copying; only the CUDA backend reads a device
//! volume, and it reads it in place (the windows are gathered from it by a kernel).

use crate::{Error, Result};
use ndarray::{ArrayView4, Axis, Slice};
use std::ops::Range;

/// A `(C, D, H, W)` float32 volume in one CUDA device's memory, described as ndarray describes a
/// view: the address of element `[0, 0, 0, 0]`, the sizes, and the strides in elements (any
/// sign). voxtile never frees or writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceVolume {
    ptr: u64,
    dims: [usize; 4],
    strides: [isize; 4],
    device: usize,
}

impl DeviceVolume {
    /// A view of `dims` float32 values at `ptr` with `strides` (elements) on CUDA device
    /// `device`. Checked: no empty axis, a non-null 4-byte-aligned address.
    ///
    /// # Safety
    /// Every element the view reaches must be device memory of the current process on `device`,
    /// allocated in that device's primary context (PyTorch, CuPy and JAX allocate there), and
    /// stay allocated and unwritten until the run that reads it returns.
    pub unsafe fn new(
        ptr: u64,
        dims: [usize; 4],
        strides: [isize; 4],
        device: usize,
    ) -> Result<Self> {
        if dims.contains(&0) {
            return Err(Error::Invalid(format!(
                "the device volume is empty: shape {dims:?}"
            )));
        }
        if ptr == 0 || !ptr.is_multiple_of(4) {
            return Err(Error::Invalid(format!(
                "the device volume's address {ptr:#x} is not that of float32 data"
            )));
        }
        Ok(DeviceVolume {
            ptr,
            dims,
            strides,
            device,
        })
    }

    /// The address of element `[0, 0, 0, 0]`.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// `(C, D, H, W)`.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }
    /// Strides in elements.
    pub fn strides(&self) -> [isize; 4] {
        self.strides
    }
    /// The CUDA device ordinal it lives on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The axes in the order `p` (as ndarray's `permuted_axes`).
    pub fn permuted_axes(self, p: [usize; 4]) -> Self {
        DeviceVolume {
            dims: p.map(|a| self.dims[a]),
            strides: p.map(|a| self.strides[a]),
            ..self
        }
    }

    /// Indices `r` of `axis` (as ndarray's `slice_axis`; `r` lies within the axis).
    pub fn slice_axis(self, axis: usize, r: Range<usize>) -> Self {
        assert!(
            r.start < r.end && r.end <= self.dims[axis],
            "slice {r:?} of axis {axis}"
        );
        let mut v = self;
        let offset = r.start as i64 * self.strides[axis] as i64 * 4;
        v.ptr = (self.ptr as i64 + offset) as u64;
        v.dims[axis] = r.len();
        v
    }
}

/// A pass's volume, in host or device memory.
#[derive(Clone, Copy, Debug)]
pub enum VolumeRef<'a> {
    /// Host memory, any strides.
    Host(ArrayView4<'a, f32>),
    /// A CUDA device's memory.
    Device(DeviceVolume),
}

impl<'a> From<ArrayView4<'a, f32>> for VolumeRef<'a> {
    fn from(v: ArrayView4<'a, f32>) -> Self {
        VolumeRef::Host(v)
    }
}

impl<'a> VolumeRef<'a> {
    /// `(C, D, H, W)`.
    pub fn shape(&self) -> [usize; 4] {
        match self {
            VolumeRef::Host(v) => {
                let s = v.shape();
                [s[0], s[1], s[2], s[3]]
            }
            VolumeRef::Device(d) => d.dims,
        }
    }

    /// The axes in the order `p`.
    pub fn permuted_axes(self, p: [usize; 4]) -> Self {
        match self {
            VolumeRef::Host(v) => VolumeRef::Host(v.permuted_axes(p)),
            VolumeRef::Device(d) => VolumeRef::Device(d.permuted_axes(p)),
        }
    }

    /// Indices `r` of `axis`, without a copy.
    pub fn slice_axis(self, axis: usize, r: Range<usize>) -> Self {
        match self {
            VolumeRef::Host(v) => VolumeRef::Host(v.slice_axis_move(Axis(axis), Slice::from(r))),
            VolumeRef::Device(d) => VolumeRef::Device(d.slice_axis(axis, r)),
        }
    }

    /// The same volume for a shorter lifetime. The enum is invariant in `'a` (ndarray's view
    /// type is covariant only as a bare type), so a pass that borrows shorter-lived parts next
    /// to it takes the volume through here.
    pub fn reborrow<'b>(self) -> VolumeRef<'b>
    where
        'a: 'b,
    {
        match self {
            VolumeRef::Host(v) => VolumeRef::Host(v),
            VolumeRef::Device(d) => VolumeRef::Device(d),
        }
    }

    /// The host view; a device volume is an error naming who asked (`reader`).
    pub fn host(self, reader: &str) -> Result<ArrayView4<'a, f32>> {
        match self {
            VolumeRef::Host(v) => Ok(v),
            VolumeRef::Device(d) => Err(Error::Invalid(format!(
                "{reader} reads volumes in host memory; this one is on CUDA device {}: run the model on cuda:{} or pass host data",
                d.device, d.device
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array4;

    /// Permuting and slicing a device view reaches the same elements as the same moves on the
    /// host view of the same buffer (addresses computed from the strides).
    #[test]
    fn device_view_moves_match_ndarray() {
        let host = Array4::from_shape_fn((2, 5, 6, 7), |(c, d, h, w)| {
            (((c * 5 + d) * 6 + h) * 7 + w) as f32
        });
        let base = 0x1000u64;
        // SAFETY: the view is never read; only its addresses are compared.
        let dev = unsafe { DeviceVolume::new(base, [2, 5, 6, 7], [210, 42, 7, 1], 0) }.unwrap();
        let hv = host.view().permuted_axes([0, 3, 2, 1]);
        let hv = hv.slice_axis(Axis(2), Slice::from(1..4));
        let hv = hv.slice_axis(Axis(1), Slice::from(2..7));
        let dv = dev
            .permuted_axes([0, 3, 2, 1])
            .slice_axis(2, 1..4)
            .slice_axis(1, 2..7);
        assert_eq!(dv.dims().to_vec(), hv.shape().to_vec());
        for ((c, d, h, w), v) in hv.indexed_iter() {
            let s = dv.strides();
            let off = c as isize * s[0] + d as isize * s[1] + h as isize * s[2] + w as isize * s[3];
            let addr = dv.ptr() as i64 + off as i64 * 4;
            assert_eq!((addr - base as i64) / 4, *v as i64, "at {:?}", (c, d, h, w));
        }
    }

    #[test]
    fn bad_device_views_are_refused() {
        // SAFETY: refused before any use.
        unsafe {
            assert!(DeviceVolume::new(0, [1, 2, 2, 2], [8, 4, 2, 1], 0).is_err());
            assert!(DeviceVolume::new(0x1002, [1, 2, 2, 2], [8, 4, 2, 1], 0).is_err());
            assert!(DeviceVolume::new(0x1000, [1, 0, 2, 2], [8, 4, 2, 1], 0).is_err());
        }
        let d = unsafe { DeviceVolume::new(0x1000, [1, 2, 2, 2], [8, 4, 2, 1], 3) }.unwrap();
        let e = VolumeRef::Device(d).host("the CPU backend").unwrap_err();
        assert!(e.to_string().contains("CUDA device 3"), "{e}");
    }
}
