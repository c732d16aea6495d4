//! Tensor maps (TMA) of the z-pair kernels' inputs (`HaloConfig::tma_loads`, `conv_wz_*_h2t`):
//! the helper loads each ring slot (two input planes of a tile's halo) as one tensor load per
//! 8-channel group, the TMA unit filling zeros where the box leaves the input, instead of its
//! threads' 16-byte copies. The map is encoded per launch (its address is the launch's input)
//! and passed by value as the kernel's last parameter.

use super::device::drv;
use crate::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// The shape of a z-pair launch's input map: dimensions fastest first [channel, x, y, z, n]
/// (the launch's `cin` channels of an input `ldi` channels wide, NDHWC fp16), the byte strides
/// of dimensions 1 to 4, and the box of one slot's channel group (8 channels, the halo's x
/// and y, two planes, one sample): the group's `[plane][y][x][8]` block of the slot, as
/// kernels/conv_wgmma_z.cu lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaloMap {
    pub dims: [u64; 5],
    pub strides: [u64; 4],
    pub boxes: [u32; 5],
}

/// The map of a launch over `n` samples of input dims `[d, h, w]`, `cin` channels of the
/// `ldi` at each voxel, for the z-pair tile rows `ny` (the halo: 8 + 2 by `ny` + 2).
pub fn halo_map(n: usize, [d, h, w]: [usize; 3], cin: usize, ldi: usize, ny: usize) -> HaloMap {
    let row = (ldi * 2) as u64;
    let [d, h, w] = [d as u64, h as u64, w as u64];
    HaloMap {
        dims: [cin as u64, w, h, d, n as u64],
        strides: [row, w * row, h * w * row, d * h * w * row],
        boxes: [8, 10, (ny + 2) as u32, 2, 1],
    }
}

impl HaloMap {
    /// Why the TMA unit cannot take it at device address `x`, if it cannot: the address and
    /// the strides must be multiples of 16 bytes, a box side at most 256 and inside its
    /// dimension's channels (a channel group whole).
    pub fn unfit(&self, x: u64) -> Option<String> {
        if !x.is_multiple_of(16) || self.strides.iter().any(|s| !s.is_multiple_of(16)) {
            return Some(format!(
                "input at {x:#x} with strides {:?}: not 16-byte aligned",
                self.strides
            ));
        }
        if !self.dims[0].is_multiple_of(8) || self.boxes.iter().any(|&b| b == 0 || b > 256) {
            return Some(format!("box {:?} over dims {:?}", self.boxes, self.dims));
        }
        None
    }

    /// The encoded map for the input at device address `x` (a driver call, no context needed).
    pub(crate) fn encode(&self, x: u64) -> Result<Box<sys::CUtensorMap>> {
        if let Some(why) = self.unfit(x) {
            return Err(crate::Error::Backend(format!("tensor map: {why}")));
        }
        let mut map = Box::new(sys::CUtensorMap { opaque: [0; 16] });
        let ones = [1u32; 5];
        // SAFETY: `map` is a 128-byte aligned CUtensorMap; the arrays hold rank (5) and rank - 1
        // entries, as the call reads them.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut *map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                5,
                x as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                ones.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(drv("tensor map encoding"))?;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// W1's 128³ input of 32 channels, and a Cin chunk of a 64-channel input: dims, byte
    /// strides (ldi halves a voxel), the box of one group's two planes; misaligned inputs are
    /// refused before the driver sees them.
    #[test]
    fn halo_maps() {
        let m = halo_map(4, [128, 128, 128], 32, 32, 16);
        assert_eq!(m.dims, [32, 128, 128, 128, 4]);
        assert_eq!(
            m.strides,
            [64, 64 * 128, 64 * 128 * 128, 64 * 128 * 128 * 128]
        );
        assert_eq!(m.boxes, [8, 10, 18, 2, 1]);
        assert_eq!(m.unfit(0x7f00_0000_0040), None);
        let c = halo_map(2, [9, 17, 10], 32, 64, 16);
        assert_eq!(c.strides, [128, 1280, 1280 * 17, 1280 * 17 * 9]);
        assert!(c.unfit(0x7f00_0000_0048).is_some());
        assert!(halo_map(1, [4, 4, 4], 32, 36, 16).unfit(0).is_some());
    }
}
