//! The direct CPU convolution (`backend::cpu::ops::conv3d`) against the float64 conv reference
//! (`ops::reference::conv`) on random shapes (strides, dilations, groups, asymmetric pads, odd
//! sizes, 1/3/8/32 channels), its fused activation epilogue, and its determinism across runs and
//! thread counts.

use crate::common::rng::Rng;
use crate::ops::reference;
use ndarray::Array5;
use voxtile::internals::cpu::ops::{self, Unary};
use voxtile::model::graph::Conv;
use voxtile::model::Op;

fn rel_l2(got: &Array5<f32>, want: &Array5<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let (mut e, mut r) = (0.0, 0.0);
    for (a, b) in got.iter().zip(want) {
        e += (*a as f64 - b).powi(2);
        r += b * b;
    }
    (e / r.max(1e-300)).sqrt()
}

/// A random conv: channels from {1, 3, 8, 32} (times groups), kernel 1..3 per axis, stride 1..2,
/// dilation 1..3, pads 0..2 per side (asymmetric), odd spatial sizes.
fn random_case(rng: &mut Rng) -> (Array5<f32>, Conv) {
    let chans = [1, 3, 8, 32];
    let groups = [1, 1, 2, 4][rng.below(4)];
    let (cin_g, cout_g) = (chans[rng.below(4)], chans[rng.below(4)]);
    let k = [1 + rng.below(3), 1 + rng.below(3), 1 + rng.below(3)];
    let stride = [1 + rng.below(2), 1 + rng.below(2), 1 + rng.below(2)];
    let dilation = [1 + rng.below(3), 1 + rng.below(3), 1 + rng.below(3)];
    let mut pads = [0; 6];
    for v in &mut pads {
        *v = rng.below(3);
    }
    let mut size = |a: usize, extra: usize| dilation[a] * (k[a] - 1) + 1 + rng.below(extra);
    let sp = [size(0, 9), size(1, 9), size(2, 40)];
    let s = [1 + rng.below(2), cin_g * groups, sp[0], sp[1], sp[2]];
    let p = Conv {
        weight: rng.tensor(&[cout_g * groups, cin_g, k[0], k[1], k[2]]),
        bias: (rng.below(2) == 0).then(|| rng.tensor(&[cout_g * groups])),
        stride,
        dilation,
        pads,
        groups,
    };
    (rng.arr(s), p)
}

#[test]
fn direct_conv_matches_f64_reference_on_random_shapes() {
    let mut rng = Rng::new(7);
    for case in 0..60 {
        let (x, p) = random_case(&mut rng);
        let want = reference::conv(&x.mapv(f64::from), &p);
        let got = ops::conv3d(x.view(), &p).unwrap();
        let e = rel_l2(&got, &want);
        let x64 = x.mapv(|v| v as f64);
        let got64 = ops::conv3d(x64.view(), &p).unwrap();
        let e64 = got64
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            e <= 1e-6 && e64 <= 1e-12,
            "case {case}: x {:?} k {:?} s {:?} d {:?} pads {:?} g {}: f32 rel L2 {e:e}, f64 max err {e64:e}",
            x.shape(),
            &p.weight.shape,
            p.stride,
            p.dilation,
            p.pads,
            p.groups
        );
    }
}

#[test]
fn wide_rows_and_many_channels_match_reference() {
    // Rows wider than one row stack's budget, 32 -> 32 channels with MeshNet's dilation 4.
    let mut rng = Rng::new(3);
    let p = Conv {
        weight: rng.tensor(&[32, 32, 3, 3, 3]),
        bias: Some(rng.tensor(&[32])),
        stride: [1; 3],
        dilation: [4; 3],
        pads: [4; 6],
        groups: 1,
    };
    let x = rng.arr([1, 32, 5, 9, 700]);
    let e = rel_l2(
        &ops::conv3d(x.view(), &p).unwrap(),
        &reference::conv(&x.mapv(f64::from), &p),
    );
    assert!(e <= 1e-6, "rel L2 {e:e}");
}

#[test]
fn fused_activation_equals_conv_then_activation_bitwise() {
    let mut rng = Rng::new(11);
    for act in [
        Unary::Relu,
        Unary::LeakyRelu(0.01),
        Unary::Elu(1.0),
        Unary::Sigmoid,
        Unary::Tanh,
    ] {
        let (x, p) = random_case(&mut rng);
        let fused = ops::conv3d_fused(x.view(), &p, Some(act)).unwrap();
        let mut two = ops::conv3d(x.view(), &p).unwrap();
        ops::unary_inplace(&mut two, act).unwrap();
        assert!(
            fused == two,
            "{act:?}: fused epilogue differs from conv + activation"
        );
    }
}

#[test]
fn bitwise_deterministic_across_runs_and_thread_counts() {
    let mut rng = Rng::new(5);
    let p = Conv {
        weight: rng.tensor(&[20, 20, 3, 3, 3]),
        bias: Some(rng.tensor(&[20])),
        stride: [1; 3],
        dilation: [2; 3],
        pads: [2; 6],
        groups: 1,
    };
    let x = rng.arr([1, 20, 12, 17, 33]);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| ops::conv3d(x.view(), &p).unwrap())
    };
    let one = run(1);
    assert!(run(1) == one, "two runs on 1 thread differ");
    assert!(run(2) == run(2), "two runs on 2 threads differ");
    // Each output is summed by one worker in a fixed order, so the count does not matter either.
    assert!(run(3) == one, "3 threads differ from 1");
}

#[test]
fn workspace_is_predicted_for_convs_only() {
    let mut rng = Rng::new(9);
    let (x, p) = random_case(&mut rng);
    let xs = [
        x.shape()[0],
        x.shape()[1],
        x.shape()[2],
        x.shape()[3],
        x.shape()[4],
    ];
    let y = ops::conv3d(x.view(), &p).unwrap();
    let ys = [
        y.shape()[0],
        y.shape()[1],
        y.shape()[2],
        y.shape()[3],
        y.shape()[4],
    ];
    let ws = ops::conv_workspace_bytes(&Op::Conv(p.clone()), xs, ys);
    let weights = (p.weight.data.len() * 4) as u64;
    assert!(
        ws > weights,
        "workspace {ws} must hold the packed weights {weights} and row stacks"
    );
    assert_eq!(ops::conv_workspace_bytes(&Op::Relu, xs, xs), 0);
}
