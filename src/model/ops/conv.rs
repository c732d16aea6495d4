//! Conv and ConvTranspose: parameters, validation and output-size arithmetic, defined once for
//! the importer, the analyses and every backend.

use super::channel::per_channel;
use super::window::{axis_name, dilated_extent, Window};
use crate::model::tensor::Tensor;

/// 3D convolution (ONNX Conv). `pads` is ONNX order: [d_begin, h_begin, w_begin, d_end, h_end, w_end].
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// [Cout, Cin/groups, kd, kh, kw]
    pub weight: Tensor,
    /// `[Cout]`
    pub bias: Option<Tensor>,
    /// Step between windows, per D, H, W.
    pub stride: [usize; 3],
    /// Spacing between kernel taps, per D, H, W.
    pub dilation: [usize; 3],
    /// Zero padding, ONNX order (begins then ends).
    pub pads: [usize; 6],
    /// Channel groups (Cin and Cout both divisible by it; Cin for depthwise).
    pub groups: usize,
}

/// 3D transposed convolution (ONNX ConvTranspose), pads may be asymmetric.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTranspose {
    /// [Cin, Cout/groups, kd, kh, kw]
    pub weight: Tensor,
    /// `[Cout]`
    pub bias: Option<Tensor>,
    /// Upsampling factor, per D, H, W.
    pub stride: [usize; 3],
    /// Spacing between kernel taps, per D, H, W.
    pub dilation: [usize; 3],
    /// Output cropped at each side, ONNX order (begins then ends).
    pub pads: [usize; 6],
    /// Extra output planes at the end of each axis.
    pub output_padding: [usize; 3],
    /// Channel groups (Cin and Cout both divisible by it).
    pub groups: usize,
}

/// The kernel's D,H,W sizes; zeros (a window that never fits) for a weight that is not 5-dim,
/// which validation refuses first.
fn kernel_of(w: &Tensor) -> [usize; 3] {
    match w.shape[..] {
        [_, _, kd, kh, kw] => [kd, kh, kw],
        _ => [0; 3],
    }
}

/// The checks both convolutions share: non-zero stride and dilation, a consistent weight
/// without empty dimensions, and a bias of one value per output channel.
fn check_common(
    w: &Tensor,
    bias: &Option<Tensor>,
    stride: &[usize; 3],
    dilation: &[usize; 3],
    cout: usize,
) -> Result<(), String> {
    if stride.contains(&0) {
        return Err(format!("zero stride {stride:?}"));
    }
    if dilation.contains(&0) {
        return Err(format!("zero dilation {dilation:?}"));
    }
    if !w.is_consistent() || w.shape.contains(&0) {
        return Err(format!(
            "weight of shape {:?} is empty or holds {} values",
            w.shape,
            w.len()
        ));
    }
    if let Some(b) = bias {
        per_channel(b, "bias", cout)?;
    }
    Ok(())
}

fn misfit(w: &Tensor, groups: usize, cin: usize) -> String {
    format!(
        "weight {:?} with groups {groups} does not fit {cin} input channels",
        w.shape
    )
}

impl Conv {
    /// The sliding window this conv applies.
    pub fn window(&self) -> Window {
        Window {
            kernel: kernel_of(&self.weight),
            stride: self.stride,
            dilation: self.dilation,
            pads: self.pads,
            ceil: false,
        }
    }

    /// Validates the parameters against `cin` input channels; returns the output channels.
    pub fn check(&self, cin: usize) -> Result<usize, String> {
        let (w, g) = (&self.weight.shape, self.groups);
        let fits = w.len() == 5
            && g != 0
            && cin.is_multiple_of(g)
            && w[1].checked_mul(g) == Some(cin)
            && w[0].is_multiple_of(g);
        if !fits {
            return Err(misfit(&self.weight, g, cin));
        }
        check_common(&self.weight, &self.bias, &self.stride, &self.dilation, w[0])?;
        Ok(w[0])
    }

    /// Output D,H,W for an input of `inp` voxels.
    pub fn out_spatial(&self, inp: [usize; 3]) -> Result<[usize; 3], String> {
        self.window().out_spatial(inp).map_err(|a| {
            format!(
                "its input is {} voxels along {}, smaller than the (dilated) kernel: the window is too small for this model",
                inp[a],
                axis_name(a)
            )
        })
    }

    /// Multiply-adds per output voxel: Cin/groups · kd · kh · kw.
    pub fn macs_per_output(&self) -> u64 {
        self.weight.shape[1..].iter().map(|&d| d as u64).product()
    }
}

impl ConvTranspose {
    /// Validates the parameters against `cin` input channels; returns the output channels.
    pub fn check(&self, cin: usize) -> Result<usize, String> {
        let (w, g) = (&self.weight.shape, self.groups);
        let cout = match (w.len() == 5 && g != 0 && w[0] == cin && cin.is_multiple_of(g))
            .then(|| w[1].checked_mul(g))
            .flatten()
        {
            Some(c) => c,
            None => return Err(misfit(&self.weight, g, cin)),
        };
        check_common(&self.weight, &self.bias, &self.stride, &self.dilation, cout)?;
        Ok(cout)
    }

    /// Output D,H,W for an input of `inp` voxels: s·(in−1) + output_padding + d·(k−1) + 1 − pads.
    pub fn out_spatial(&self, inp: [usize; 3]) -> Result<[usize; 3], String> {
        let k = kernel_of(&self.weight);
        let mut o = [0; 3];
        for a in 0..3 {
            let full = self.stride[a]
                .checked_mul(inp[a].saturating_sub(1))
                .and_then(|v| v.checked_add(self.output_padding[a]))
                .and_then(|v| v.checked_add(dilated_extent(k[a], self.dilation[a])?))
                .ok_or_else(|| format!("its output size along {} overflows", axis_name(a)))?;
            o[a] = full
                .checked_sub(self.pads[a] + self.pads[a + 3])
                .filter(|&v| v > 0)
                .ok_or_else(|| {
                    format!(
                        "pads {:?} remove the whole output along {}",
                        self.pads,
                        axis_name(a)
                    )
                })?;
        }
        Ok(o)
    }

    /// Multiply-adds per input voxel: Cout/groups · kd · kh · kw.
    pub fn macs_per_input(&self) -> u64 {
        self.weight.shape[1..].iter().map(|&d| d as u64).product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_transpose_shape_with_asymmetric_pads() {
        let p = ConvTranspose {
            weight: Tensor::new(vec![4, 2, 3, 3, 3], vec![0.0; 216]),
            bias: None,
            stride: [2; 3],
            dilation: [1; 3],
            pads: [0, 0, 0, 1, 1, 1],
            output_padding: [0; 3],
            groups: 1,
        };
        // TF SAME upsampling doubles the size: 2*(8-1) + 3 - 1 = 16.
        assert_eq!(p.out_spatial([8, 8, 8]), Ok([16, 16, 16]));
        assert_eq!(p.check(4), Ok(2));
        assert!(p
            .check(3)
            .unwrap_err()
            .contains("does not fit 3 input channels"));
    }

    #[test]
    fn conv_checks_groups_and_bias() {
        let mut c = Conv {
            weight: Tensor::new(vec![4, 1, 1, 1, 1], vec![0.0; 4]),
            bias: Some(Tensor::new(vec![4], vec![0.0; 4])),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            groups: 2,
        };
        assert_eq!(c.check(2), Ok(4));
        assert!(c.check(4).is_err());
        c.bias = Some(Tensor::new(vec![3], vec![0.0; 3]));
        assert!(c.check(2).unwrap_err().contains("bias has 3"));
        c.bias = None;
        c.stride = [1, 0, 1];
        assert!(c.check(2).unwrap_err().contains("zero stride"));
        c.stride = [1; 3];
        assert_eq!(c.out_spatial([1, 2, 3]), Ok([1, 2, 3]));
    }
}
