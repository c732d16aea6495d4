//! Tensor maps (TMA) of the kernels whose tiles come in by tensor loads: the z-pair kernels'
//! inputs (`HaloConfig::tma_loads`, `conv_wz_*_h2t`: the helper loads each ring slot, two input
//! planes of a tile's halo, as one tensor load per 8-channel group) and the `conv_wgk_*`
//! implicit GEMM's input and weights (each k-step's operands, in the 128-byte swizzle). The
//! TMA unit fills zeros where a box leaves the tensor. A map is encoded per launch (its address
//! is the launch's input) and passed by value as one of the kernel's last parameters.

use super::device::drv;
use crate::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// The shape of a map of fp16 elements: its first `rank` dimensions fastest first, the byte
/// strides of dimensions 1 to rank - 1, the box a load spans, the element strides it takes
/// within the box (a box side of b at stride e copies b / e elements), and the swizzle the box
/// lands in shared memory in: rows of `swizzle` bytes (128 or 64), as wgmma's swizzled
/// descriptors read them, or as it is (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap {
    pub rank: usize,
    pub dims: [u64; 5],
    pub strides: [u64; 4],
    pub boxes: [u32; 5],
    pub steps: [u32; 5],
    pub swizzle: u32,
}

/// An input's dimensions fastest first [channel, x, y, z, n] (the launch's `cin` channels of
/// an input `ldi` channels wide, NDHWC fp16, `n` samples of `[d, h, w]`) and their byte strides.
fn input_dims(n: usize, [d, h, w]: [usize; 3], cin: usize, ldi: usize) -> ([u64; 5], [u64; 4]) {
    let row = (ldi * 2) as u64;
    let [d, h, w] = [d as u64, h as u64, w as u64];
    (
        [cin as u64, w, h, d, n as u64],
        [row, w * row, h * w * row, d * h * w * row],
    )
}

/// The map of a z-pair launch over `n` samples of input dims `dhw`, `cin` channels of the `ldi`
/// at each voxel, for the tile rows `ny`: the box of one slot's channel group (8 channels, the
/// halo's x and y (8 + 2 by `ny` + 2), two planes, one sample), the group's `[plane][y][x][8]`
/// block of the slot as kernels/conv_wgmma_z.cu lays it out.
pub fn halo_map(n: usize, dhw: [usize; 3], cin: usize, ldi: usize, ny: usize) -> TensorMap {
    let (dims, strides) = input_dims(n, dhw, cin, ldi);
    TensorMap {
        rank: 5,
        dims,
        strides,
        boxes: [8, 10, (ny + 2) as u32, 2, 1],
        steps: [1; 5],
        swizzle: 0,
    }
}

/// The input map of a `conv_wgk_*` launch of stride `s` (dims as [`halo_map`]'s): the box of
/// one k-step's A stage, `ck` channels (64 or 32) over the input voxels of the output tile's
/// `[z, y, x]` box (every `s`-th along each axis; a tap's shift is the load's coordinates), one
/// sample, swizzled by its rows' `2 * ck` bytes.
pub fn tile_map(
    n: usize,
    dhw: [usize; 3],
    cin: usize,
    ldi: usize,
    tile: [usize; 3],
    s: usize,
    ck: usize,
) -> TensorMap {
    let (dims, strides) = input_dims(n, dhw, cin, ldi);
    let side = |t: usize| (t * s) as u32;
    let s = s as u32;
    TensorMap {
        rank: 5,
        dims,
        strides,
        boxes: [ck as u32, side(tile[2]), side(tile[1]), side(tile[0]), 1],
        steps: [1, s, s, s, 1],
        swizzle: 2 * ck as u32,
    }
}

/// The weight map of a `conv_wgk_*` launch: `rows` rows (output channels; the box's rows past
/// them read as zeros) of `kpad` halves; the box one k-step's B stage, `ck` halves of `bn`
/// rows, swizzled as the input's.
pub fn weight_map(rows: usize, kpad: usize, bn: usize, ck: usize) -> TensorMap {
    TensorMap {
        rank: 2,
        dims: [kpad as u64, rows as u64, 1, 1, 1],
        strides: [(kpad * 2) as u64, 0, 0, 0],
        boxes: [ck as u32, bn as u32, 1, 1, 1],
        steps: [1; 5],
        swizzle: 2 * ck as u32,
    }
}

impl TensorMap {
    /// Why the TMA unit cannot take it at device address `x`, if it cannot: the address and
    /// the strides must be multiples of 16 bytes, a box side at most 256 and inside its
    /// dimension's channels (a channel group whole), a swizzled box's rows as wide as the
    /// swizzle (64 or 128 bytes).
    pub fn unfit(&self, x: u64) -> Option<String> {
        let strides = &self.strides[..self.rank - 1];
        if !x.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
            return Some(format!(
                "input at {x:#x} with strides {strides:?}: not 16-byte aligned"
            ));
        }
        let boxes = &self.boxes[..self.rank];
        let steps = &self.steps[..self.rank];
        if !self.dims[0].is_multiple_of(8)
            || boxes.iter().any(|&b| b == 0 || b > 256)
            || steps.iter().any(|&e| !(1..=8).contains(&e))
            || steps[0] != 1
            || !matches!(self.swizzle, 0 | 64 | 128)
            || (self.swizzle > 0 && boxes[0] * 2 != self.swizzle)
        {
            return Some(format!("box {boxes:?} over dims {:?}", self.dims));
        }
        None
    }

    /// The encoded map for the input at device address `x` (a driver call, no context needed).
    pub(crate) fn encode(&self, x: u64) -> Result<Box<sys::CUtensorMap>> {
        if let Some(why) = self.unfit(x) {
            return Err(crate::Error::Backend(format!("tensor map: {why}")));
        }
        let mut map = Box::new(sys::CUtensorMap { opaque: [0; 16] });
        // SAFETY: `map` is a 128-byte aligned CUtensorMap; the arrays hold at least rank and rank - 1
        // entries, as the call reads them.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut *map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                self.rank as u32,
                x as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                self.steps.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                match self.swizzle {
                    128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                    64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
                    _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
                },
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

    /// W1's 16³ conv of Cin 256: the input box of a k-step (64 channels over a 1 x 8 x 16 tile,
    /// x fastest after the channels) and the weights' box (64 halves of 256 rows), both in the
    /// 128-byte swizzle; W2's fused 32 -> 14 transposed conv at 64³ in 32-channel k-steps, in
    /// the 64-byte one; a swizzled box of rows other than the swizzle's width, or an odd row
    /// stride, is refused.
    #[test]
    fn gemm_maps() {
        let s2 = tile_map(4, [32, 32, 32], 128, 128, [1, 8, 16], 2, 64);
        assert_eq!((s2.boxes, s2.steps), ([64, 32, 16, 2, 1], [1, 2, 2, 2, 1]));
        assert!(s2.unfit(0).is_none());
        let m = tile_map(4, [16, 16, 16], 256, 256, [1, 8, 16], 1, 64);
        assert_eq!(m.dims, [256, 16, 16, 16, 4]);
        assert_eq!(m.boxes, [64, 16, 8, 1, 1]);
        assert_eq!(m.strides[0], 512);
        assert!(m.swizzle == 128 && m.unfit(0x7f00_0000_0000).is_none());
        let w = weight_map(256, 27 * 256, 256, 64);
        assert_eq!((w.rank, w.dims[..2].to_vec()), (2, vec![6912, 256]));
        assert_eq!(
            (w.strides[0], w.boxes[..2].to_vec()),
            (13824, vec![64, 256])
        );
        assert!(w.unfit(0x7f00_0000_0000).is_none());
        assert!(TensorMap {
            boxes: [32, 256, 1, 1, 1],
            ..w
        }
        .unfit(0)
        .is_some());
        let up = tile_map(1, [64, 64, 64], 32, 32, [1, 8, 16], 1, 32);
        assert_eq!((up.boxes, up.swizzle), ([32, 16, 8, 1, 1], 64));
        assert!(up.unfit(0).is_none());
        let uw = weight_map(112, 256, 128, 32);
        assert_eq!((uw.boxes[..2].to_vec(), uw.swizzle), (vec![32, 128], 64));
        assert!(uw.unfit(0).is_none());
        assert!(TensorMap { swizzle: 128, ..uw }.unfit(0).is_some());
        assert!(weight_map(256, 27 * 36, 128, 64).unfit(0).is_some());
    }
}
