//! The normalisation op cases, run on both backends: InstanceNorm, GroupNorm of 1, 2 and 3
//! groups and ChannelAffine, on inputs of non-zero mean and non-unit spread (cancellation in the
//! variance would show). The CUDA kernels' own paths (vector widths, block counts, C > 256,
//! fused activations) are in `cuda/ops/norm.rs`.

use super::reference::{channel, group_norm};
use super::{test_device, Device, TOL};
use crate::common::graph::chain;
use crate::common::rng::Rng;
use ndarray::Array5;
use voxtile::model::graph::*;

fn norms_and_affine(dev: &mut Device) {
    let mut r = Rng::tagged("norms");
    let s = [2, 6, 5, 4, 7];
    let x = Array5::from_shape_vec(s, r.scaled(s.iter().product(), 3.0)).unwrap() + 1.5;
    let xf = x.mapv(f64::from);
    let c = s[1];
    let scale = Tensor::new(vec![c], r.vec(c));
    let bias = Tensor::new(vec![c], r.vec(c));
    let mut cases = vec![(
        "InstanceNorm".to_string(),
        Op::InstanceNorm {
            eps: 1e-5,
            scale: scale.clone(),
            bias: bias.clone(),
        },
        group_norm(&xf, c, 1e-5f32 as f64, &scale.data, &bias.data),
    )];
    for g in [1, 2, 3] {
        cases.push((
            format!("GroupNorm groups {g}"),
            Op::GroupNorm {
                groups: g,
                eps: 1e-3,
                scale: scale.clone(),
                bias: bias.clone(),
            },
            group_norm(&xf, g, 1e-3f32 as f64, &scale.data, &bias.data),
        ));
    }
    cases.push((
        "ChannelAffine".to_string(),
        Op::ChannelAffine {
            scale: scale.clone(),
            shift: bias.clone(),
        },
        channel(&xf, |ch, v| {
            v * scale.data[ch] as f64 + bias.data[ch] as f64
        }),
    ));
    for (name, op, want) in cases {
        dev.check(
            &name,
            &chain("norm", c, vec![(op, vec![0], c)]),
            &x,
            &want,
            TOL,
        );
    }
}
test_device!(
    norms_and_affine,
    norms_and_affine_cpu_f32,
    norms_and_affine_cuda_f16
);
