//! The direct CPU convolution (`backend::cpu::ops::conv3d`) against a float64 loop reference on
//! random shapes (strides, dilations, groups, asymmetric pads, odd sizes, 1/3/8/32 channels), its
//! fused activation epilogue, and its determinism across runs and thread counts.

use ndarray::Array5;
use voxtile::internals::cpu::ops::{self, Unary};
use voxtile::model::graph::{Conv, Tensor};
use voxtile::model::Op;

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn u(&mut self, n: usize) -> usize {
        ((self.f() + 1.0) * 0.5 * n as f32) as usize % n
    }
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(shape.to_vec(), (0..n).map(|_| self.f()).collect())
    }
    fn arr(&mut self, s: [usize; 5]) -> Array5<f32> {
        Array5::from_shape_simple_fn(s, || self.f())
    }
}

/// Conv by its definition, in f64.
fn reference(x: &Array5<f32>, p: &Conv) -> Array5<f64> {
    let (n, cin, d, h, w) = x.dim();
    let ws = &p.weight.shape;
    let (cout, cin_g, k) = (ws[0], ws[1], [ws[2], ws[3], ws[4]]);
    let g = p.groups;
    let osz = |i: usize, a: usize| {
        (i + p.pads[a] + p.pads[a + 3] - p.dilation[a] * (k[a] - 1) - 1) / p.stride[a] + 1
    };
    let o = [osz(d, 0), osz(h, 1), osz(w, 2)];
    assert_eq!(cin, cin_g * g);
    Array5::from_shape_fn((n, cout, o[0], o[1], o[2]), |(b, co, od, oh, ow)| {
        let gi = co / (cout / g);
        let mut acc = p.bias.as_ref().map_or(0.0, |b| b.data[co] as f64);
        for ci in 0..cin_g {
            for kd in 0..k[0] {
                for kh in 0..k[1] {
                    for kw in 0..k[2] {
                        let at = |o: usize, kk: usize, a: usize| {
                            (o * p.stride[a] + kk * p.dilation[a]) as isize - p.pads[a] as isize
                        };
                        let (id, ih, iw) = (at(od, kd, 0), at(oh, kh, 1), at(ow, kw, 2));
                        if id < 0
                            || ih < 0
                            || iw < 0
                            || id >= d as isize
                            || ih >= h as isize
                            || iw >= w as isize
                        {
                            continue;
                        }
                        let wv = p.weight.data
                            [(((co * cin_g + ci) * k[0] + kd) * k[1] + kh) * k[2] + kw];
                        let xv = x[[b, gi * cin_g + ci, id as usize, ih as usize, iw as usize]];
                        acc += wv as f64 * xv as f64;
                    }
                }
            }
        }
        acc
    })
}

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
    let groups = [1, 1, 2, 4][rng.u(4)];
    let (cin_g, cout_g) = (chans[rng.u(4)], chans[rng.u(4)]);
    let k = [1 + rng.u(3), 1 + rng.u(3), 1 + rng.u(3)];
    let stride = [1 + rng.u(2), 1 + rng.u(2), 1 + rng.u(2)];
    let dilation = [1 + rng.u(3), 1 + rng.u(3), 1 + rng.u(3)];
    let mut pads = [0; 6];
    for v in &mut pads {
        *v = rng.u(3);
    }
    let mut size = |a: usize, extra: usize| dilation[a] * (k[a] - 1) + 1 + rng.u(extra);
    let sp = [size(0, 9), size(1, 9), size(2, 40)];
    let s = [1 + rng.u(2), cin_g * groups, sp[0], sp[1], sp[2]];
    let p = Conv {
        weight: rng.tensor(&[cout_g * groups, cin_g, k[0], k[1], k[2]]),
        bias: (rng.u(2) == 0).then(|| rng.tensor(&[cout_g * groups])),
        stride,
        dilation,
        pads,
        groups,
    };
    (rng.arr(s), p)
}

#[test]
fn direct_conv_matches_f64_reference_on_random_shapes() {
    let mut rng = Rng(7);
    for case in 0..60 {
        let (x, p) = random_case(&mut rng);
        let want = reference(&x, &p);
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
    let mut rng = Rng(3);
    let p = Conv {
        weight: rng.tensor(&[32, 32, 3, 3, 3]),
        bias: Some(rng.tensor(&[32])),
        stride: [1; 3],
        dilation: [4; 3],
        pads: [4; 6],
        groups: 1,
    };
    let x = rng.arr([1, 32, 5, 9, 700]);
    let e = rel_l2(&ops::conv3d(x.view(), &p).unwrap(), &reference(&x, &p));
    assert!(e <= 1e-6, "rel L2 {e:e}");
}

#[test]
fn fused_activation_equals_conv_then_activation_bitwise() {
    let mut rng = Rng(11);
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
    let mut rng = Rng(5);
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
    let mut rng = Rng(9);
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
