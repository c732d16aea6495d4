//! Max and average pooling: parameters, validation and output size.

use super::window::{axis_name, Window};

/// Max or average pooling over D,H,W.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Window size, per D, H, W.
    pub kernel: [usize; 3],
    /// Step between windows, per D, H, W.
    pub stride: [usize; 3],
    /// Spacing between window taps, per D, H, W.
    pub dilation: [usize; 3],
    /// Padding, ONNX order (begins then ends).
    pub pads: [usize; 6],
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
    /// AveragePool only: whether padded zeros count in the divisor.
    pub count_include_pad: bool,
}

impl Pool {
    /// The sliding window this pool applies.
    pub fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride,
            dilation: self.dilation,
            pads: self.pads,
            ceil: self.ceil_mode,
        }
    }

    /// Refuses a zero kernel, stride or dilation.
    pub fn check(&self) -> Result<(), String> {
        if self.stride.contains(&0) || self.kernel.contains(&0) || self.dilation.contains(&0) {
            return Err(format!(
                "zero kernel {:?}, stride {:?} or dilation {:?}",
                self.kernel, self.stride, self.dilation
            ));
        }
        Ok(())
    }

    /// Output D,H,W for an input of `inp` voxels.
    pub fn out_spatial(&self, inp: [usize; 3]) -> Result<[usize; 3], String> {
        self.window().out_spatial(inp).map_err(|a| {
            format!(
                "window size {} along axis {} is smaller than the kernel {}",
                inp[a],
                axis_name(a),
                self.kernel[a]
            )
        })
    }

    /// Input taps per output voxel (the kernel volume).
    pub fn taps(&self) -> u64 {
        self.kernel.iter().map(|&k| k as u64).product()
    }
}
