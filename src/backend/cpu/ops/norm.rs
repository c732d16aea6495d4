//! InstanceNorm, GroupNorm and ChannelAffine. Statistics are two-pass (mean, then biased
//! variance around it) accumulated in f64, so the f32 path is not limited by summation error on
//! large windows; eps goes inside the square root like ONNX/PyTorch.

use super::{dims, err, make_standard, owned};
use crate::backend::cpu::Real;
use crate::model::graph::{Op, Tensor};
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

/// Mean and 1/sqrt(biased variance + eps) of a block.
pub(super) fn stats<T: Real>(block: &[T], eps: f32) -> (f64, f64) {
    let n = block.len() as f64;
    let mean = block.iter().map(|v| v.to_f64()).sum::<f64>() / n;
    let var = block
        .iter()
        .map(|v| {
            let d = v.to_f64() - mean;
            d * d
        })
        .sum::<f64>()
        / n;
    (mean, 1.0 / (var + eps as f64).sqrt())
}

/// `y = (x - mean) * (scale * inv_std) + bias`; subtracting the mean first keeps f32 exact
/// when the mean is large against the spread.
fn normalise<T: Real>(plane: &mut [T], mean: f64, inv_std: f64, scale: T, bias: T) {
    let a = T::from_f64(scale.to_f64() * inv_std);
    let m = T::from_f64(mean);
    for v in plane {
        *v = (*v - m) * a + bias;
    }
}

pub fn instance_norm_inplace<T: Real>(
    x: &mut Array5<T>,
    eps: f32,
    scale: &Tensor,
    bias: &Tensor,
) -> Result<()> {
    let xs = dims(&x.view());
    let op = Op::InstanceNorm {
        eps,
        scale: scale.clone(),
        bias: bias.clone(),
    };
    op.output_shape(&[xs]).map_err(err)?;
    make_standard(x)?;
    let (s, b) = (T::cast_slice(&scale.data), T::cast_slice(&bias.data));
    let c = xs[1];
    let plane = xs[2] * xs[3] * xs[4];
    let data = x
        .as_slice_mut()
        .ok_or_else(|| err("InstanceNormalization input is not contiguous".into()))?;
    data.par_chunks_mut(plane).enumerate().for_each(|(i, p)| {
        let (mean, inv) = stats(p, eps);
        normalise(p, mean, inv, s[i % c], b[i % c]);
    });
    Ok(())
}

pub fn instance_norm<T: Real>(
    x: ArrayView5<T>,
    eps: f32,
    scale: &Tensor,
    bias: &Tensor,
) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    instance_norm_inplace(&mut y, eps, scale, bias)?;
    Ok(y)
}

pub fn group_norm_inplace<T: Real>(
    x: &mut Array5<T>,
    groups: usize,
    eps: f32,
    scale: &Tensor,
    bias: &Tensor,
) -> Result<()> {
    let xs = dims(&x.view());
    let op = Op::GroupNorm {
        groups,
        eps,
        scale: scale.clone(),
        bias: bias.clone(),
    };
    op.output_shape(&[xs]).map_err(err)?;
    make_standard(x)?;
    let (s, b) = (T::cast_slice(&scale.data), T::cast_slice(&bias.data));
    let c = xs[1];
    let cg = c / groups;
    let plane = xs[2] * xs[3] * xs[4];
    let data = x
        .as_slice_mut()
        .ok_or_else(|| err("GroupNormalization input is not contiguous".into()))?;
    data.par_chunks_mut(cg * plane)
        .enumerate()
        .for_each(|(i, blk)| {
            let (mean, inv) = stats(blk, eps);
            let c0 = (i % groups) * cg;
            for (j, p) in blk.chunks_mut(plane).enumerate() {
                normalise(p, mean, inv, s[c0 + j], b[c0 + j]);
            }
        });
    Ok(())
}

pub fn group_norm<T: Real>(
    x: ArrayView5<T>,
    groups: usize,
    eps: f32,
    scale: &Tensor,
    bias: &Tensor,
) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    group_norm_inplace(&mut y, groups, eps, scale, bias)?;
    Ok(y)
}

pub fn channel_affine_inplace<T: Real>(
    x: &mut Array5<T>,
    scale: &Tensor,
    shift: &Tensor,
) -> Result<()> {
    let xs = dims(&x.view());
    let op = Op::ChannelAffine {
        scale: scale.clone(),
        shift: shift.clone(),
    };
    op.output_shape(&[xs]).map_err(err)?;
    make_standard(x)?;
    let (s, b) = (T::cast_slice(&scale.data), T::cast_slice(&shift.data));
    let c = xs[1];
    let plane = xs[2] * xs[3] * xs[4];
    let data = x
        .as_slice_mut()
        .ok_or_else(|| err("ChannelAffine input is not contiguous".into()))?;
    data.par_chunks_mut(plane).enumerate().for_each(|(i, p)| {
        let (a, sh) = (s[i % c], b[i % c]);
        for v in p {
            *v = *v * a + sh;
        }
    });
    Ok(())
}

pub fn channel_affine<T: Real>(
    x: ArrayView5<T>,
    scale: &Tensor,
    shift: &Tensor,
) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    channel_affine_inplace(&mut y, scale, shift)?;
    Ok(y)
}
