//! The elementwise op cases, one row per op, run on both backends: activations and the pointwise
//! math functions, the binaries on computed operands broadcast in both operand orders (per-voxel
//! gates `[N,1,D,H,W]`, per-channel vectors `[N,C,1,1,1]`, per-sample scalars), constants
//! broadcast from every shape, and Softmax along each spatial and channel axis.

use super::reference::{self as refr, erf, sigmoid};
use super::{test_device, Device, TOL};
use crate::common::graph::chain;
use crate::common::rng::Rng;
use ndarray::{Array5, Axis};
use voxtile::model::graph::*;

const C: usize = 5;
const S: [usize; 5] = [2, C, 6, 7, 8];

/// A one-input op: `op` on the input times `scale` (through a Sigmoid first where the op's
/// domain is positive), and its float64 reference per (channel, value).
struct Unary {
    name: &'static str,
    op: Op,
    positive: bool,
    scale: f32,
    f: Box<dyn Fn(usize, f64) -> f64>,
}

/// An activation, its reference [`refr::act`].
fn act(name: &'static str, op: Op) -> Unary {
    let o = op.clone();
    Unary {
        name,
        op,
        positive: false,
        scale: 3.0,
        f: Box::new(move |c, v| refr::act(&o, c, v)),
    }
}

/// A pointwise function on any input.
fn pw(name: &'static str, p: Pointwise, f: fn(f64) -> f64) -> Unary {
    Unary {
        name,
        op: Op::Pointwise(p),
        positive: false,
        scale: 3.0,
        f: Box::new(move |_, v| f(v)),
    }
}

/// A pointwise function whose domain is positive: applied to a Sigmoid of the input.
fn pos(name: &'static str, p: Pointwise, f: fn(f64) -> f64) -> Unary {
    Unary {
        positive: true,
        ..pw(name, p, f)
    }
}

fn softplus(v: f64) -> f64 {
    (1.0 + v.exp()).ln()
}

/// The table of one-input ops on `c` channels. A new elementwise op is one row here.
fn unary_rows(c: usize) -> Vec<Unary> {
    let slope = Tensor::new(vec![c], (0..c).map(|i| 0.05 + 0.1 * i as f32).collect());
    vec![
        act("Relu", Op::Relu),
        act("LeakyRelu 0.01", Op::LeakyRelu { alpha: 0.01 }),
        act("LeakyRelu 0.1", Op::LeakyRelu { alpha: 0.1 }),
        act("Elu 0.7", Op::Elu { alpha: 0.7 }),
        act("Sigmoid", Op::Sigmoid),
        // Extreme logits must not overflow.
        Unary {
            scale: 300.0,
            ..act("Sigmoid large", Op::Sigmoid)
        },
        act("Tanh", Op::Tanh),
        act("PRelu [C]", Op::PRelu { slope }),
        act(
            "PRelu [1]",
            Op::PRelu {
                slope: Tensor::new(vec![1], vec![0.25]),
            },
        ),
        act("Identity", Op::Identity),
        pw("Erf", Pointwise::Erf, erf),
        pw("Gelu", Pointwise::Gelu { tanh: false }, |v| {
            0.5 * v * (1.0 + erf(v / 2f64.sqrt()))
        }),
        pw("Gelu tanh", Pointwise::Gelu { tanh: true }, |v| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * v * (1.0 + (k * (v + 0.044715 * v.powi(3))).tanh())
        }),
        pw("Softplus", Pointwise::Softplus, softplus),
        pw("Mish", Pointwise::Mish, |v| v * softplus(v).tanh()),
        pw("HardSwish", Pointwise::HardSwish, |v| {
            v * (v + 3.0).clamp(0.0, 6.0) / 6.0
        }),
        pw(
            "HardSigmoid",
            Pointwise::HardSigmoid {
                alpha: 0.25,
                beta: 0.4,
            },
            |v| (0.25 * v + 0.4f32 as f64).clamp(0.0, 1.0),
        ),
        pw("Exp", Pointwise::Exp, f64::exp),
        pw("Abs", Pointwise::Abs, f64::abs),
        pw("Neg", Pointwise::Neg, |v| -v),
        pw("Pow 3", Pointwise::Pow(3.0), |v| v * v * v),
        pw("Clip 0..1.5", Pointwise::Clip { min: 0.0, max: 1.5 }, |v| {
            v.clamp(0.0, 1.5)
        }),
        pw(
            "Clip ..0.5",
            Pointwise::Clip {
                min: f32::NEG_INFINITY,
                max: 0.5,
            },
            |v| v.min(0.5),
        ),
        // The roundings at an fp16/bf16 model's I/O (the f16 one a no-op on fp16 activations).
        pw("RoundF16", Pointwise::RoundF16, |v| {
            half::f16::from_f64(v).to_f64()
        }),
        pw("RoundBf16", Pointwise::RoundBf16, |v| {
            round_significand(v, 8)
        }),
        pos("Log of sigmoid", Pointwise::Log, f64::ln),
        pos("Sqrt of sigmoid", Pointwise::Sqrt, f64::sqrt),
        pos("Reciprocal of sigmoid", Pointwise::Reciprocal, |v| 1.0 / v),
        pos("Pow 0.5 of sigmoid", Pointwise::Pow(0.5), f64::sqrt),
    ]
}

/// `v` rounded to `bits` significant bits, ties to even: bfloat16 is 8 (exact for normal numbers;
/// written out because `half::bf16::from_f64` does not round every f32 value as `from_f32` does,
/// which is what a Cast to bfloat16 of a float32 does).
fn round_significand(v: f64, bits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let exp = ((v.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let q = 2f64.powi(exp - (bits - 1));
    (v / q).round_ties_even() * q
}

fn input(r: &mut Rng, scale: f32) -> Array5<f32> {
    Array5::from_shape_vec(S, r.scaled(S.iter().product(), scale)).unwrap()
}

/// Every row on 5 channels (the element paths) and on 16 (the vector paths).
fn unary_ops(dev: &mut Device) {
    let mut r = Rng::tagged("unary ops");
    for c in [C, 16] {
        let s = [2, c, 5, 6, 7];
        for row in unary_rows(c) {
            let x = Array5::from_shape_vec(s, r.scaled(s.iter().product(), row.scale)).unwrap();
            let xf = x.mapv(f64::from);
            let (nodes, xin) = if row.positive {
                (
                    vec![(Op::Sigmoid, vec![0], c), (row.op.clone(), vec![1], c)],
                    xf.mapv(sigmoid),
                )
            } else {
                (vec![(row.op.clone(), vec![0], c)], xf)
            };
            let want = refr::channel(&xin, &row.f);
            let name = format!("{} C={c}", row.name);
            dev.check(&name, &chain("unary", c, nodes), &x, &want, TOL);
        }
    }
}
test_device!(unary_ops, unary_ops_cpu_f32, unary_ops_cuda_f16);

/// Every binary on every pair of operands: the input itself (v0), and v4..v7, the sigmoids of
/// the input (full), of a 1x1 conv to one channel (gate), of the mean over D, H, W (chan) and
/// of the gate's mean (scalar), so Div and Pow see values in (0, 1). The result is written
/// into a slice of a Concat (v9 = concat(full, v8)).
fn broadcast_binaries(dev: &mut Device) {
    let mut r = Rng::tagged("broadcast binaries");
    let x = input(&mut r, 2.0);
    let w = r.vec(C);
    let roi = [S[2], S[3], S[4]];
    let mean_pool = || {
        Op::AveragePool(Pool {
            kernel: roi,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            ceil_mode: false,
            count_include_pad: false,
        })
    };
    let conv = Op::Conv(Conv {
        weight: Tensor::new(vec![1, C, 1, 1, 1], w.clone()),
        bias: None,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [0; 6],
        groups: 1,
    });
    // The operands in f64.
    let xf = x.mapv(f64::from);
    let mut gate_raw = Array5::<f64>::zeros([S[0], 1, S[2], S[3], S[4]]);
    for ((n, c, d, h, ww), v) in xf.indexed_iter() {
        gate_raw[[n, 0, d, h, ww]] += w[c] as f64 * v;
    }
    let mean = |a: &Array5<f64>| {
        let m = a.mean_axis(Axis(4)).unwrap();
        let m = m.mean_axis(Axis(3)).unwrap().mean_axis(Axis(2)).unwrap();
        m.into_shape_with_order([a.shape()[0], a.shape()[1], 1, 1, 1])
            .unwrap()
    };
    let values = [
        (0, xf.clone()),
        (4, xf.mapv(sigmoid)),
        (5, gate_raw.mapv(sigmoid)),
        (6, mean(&xf).mapv(sigmoid)),
        (7, mean(&gate_raw).mapv(sigmoid)),
    ];
    let (full, gate, chan, scalar) = (4, 5, 6, 7);
    let pairs = [
        (0, full),
        (full, gate),
        (gate, full),
        (full, chan),
        (chan, full),
        (full, scalar),
        (scalar, full),
        (gate, chan),
        (chan, gate),
    ];
    let value = |i: usize| &values.iter().find(|v| v.0 == i).unwrap().1;
    for (op, f) in refr::binaries() {
        for (p, q) in pairs {
            // A negative base has no real power.
            if op == Op::Pow && p == 0 {
                continue;
            }
            let g = chain(
                "bcast",
                C,
                vec![
                    (conv.clone(), vec![0], 1),
                    (mean_pool(), vec![0], C),
                    (mean_pool(), vec![1], 1),
                    (Op::Sigmoid, vec![0], C),
                    (Op::Sigmoid, vec![1], 1),
                    (Op::Sigmoid, vec![2], C),
                    (Op::Sigmoid, vec![3], 1),
                    (op.clone(), vec![p, q], C),
                    (Op::Concat { axis: 1 }, vec![full, 8], 2 * C),
                ],
            );
            let (a, b) = (
                value(p).broadcast(S).unwrap(),
                value(q).broadcast(S).unwrap(),
            );
            let mut y = Array5::zeros(S);
            ndarray::Zip::from(&mut y)
                .and(&a)
                .and(&b)
                .for_each(|o, &u, &v| *o = f(u, v));
            let want = ndarray::concatenate(Axis(1), &[value(full).view(), y.view()]).unwrap();
            let name = format!("{}(v{p}, v{q})", op.name());
            dev.check(&name, &g, &x, &want, TOL);
        }
    }
}
test_device!(
    broadcast_binaries,
    broadcast_binaries_cpu_f32,
    broadcast_binaries_cuda_f16
);

/// Same-shape binaries written to a whole output of 14 channels (a residual unit's Add at the
/// width of a 14-class head): one flat run of vectors on CUDA when the element count is a
/// multiple of 8 ([2, 14, 4, 4, 4]), the element kernel when it is not ([2, 14, 3, 3, 3]).
fn same_shape_binaries(dev: &mut Device) {
    let mut r = Rng::tagged("same-shape binaries");
    let c = 14;
    for s in [[2, c, 4, 4, 4], [2, c, 3, 3, 3]] {
        let x = Array5::from_shape_vec(s, r.scaled(s.iter().product(), 2.0)).unwrap();
        let xf = x.mapv(f64::from);
        let sig = xf.mapv(sigmoid);
        for (op, f) in refr::binaries() {
            // Pow on a negative base and Div near zero are the broadcast test's.
            if matches!(op, Op::Pow | Op::Div) {
                continue;
            }
            let g = chain(
                "same",
                c,
                vec![(Op::Sigmoid, vec![0], c), (op.clone(), vec![1, 0], c)],
            );
            let mut want = Array5::zeros(s);
            ndarray::Zip::from(&mut want)
                .and(&sig)
                .and(&xf)
                .for_each(|o, &u, &v| *o = f(u, v));
            let name = format!("{}(sigmoid(x), x) {s:?}", op.name());
            dev.check(&name, &g, &x, &want, TOL);
        }
    }
}
test_device!(
    same_shape_binaries,
    same_shape_binaries_cpu_f32,
    same_shape_binaries_cuda_f16
);

/// AddConst and MulConst of a constant of every broadcast shape.
fn broadcast_constants(dev: &mut Device) {
    let mut r = Rng::tagged("broadcast constants");
    let x = input(&mut r, 2.0);
    let xf = x.mapv(f64::from);
    let [_, c, d, h, w] = S;
    // A graph's constants hold one sample (batch 1).
    for cs in [
        [1, c, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [1, c, d, 1, 1],
        [1, 1, d, h, w],
        [1, c, 1, h, 1],
        [1, c, d, h, w],
    ] {
        let k = Tensor::new(cs.to_vec(), r.scaled(cs.iter().product(), 2.0));
        let kv = Array5::from_shape_vec(cs, k.data.iter().map(|&v| v as f64).collect()).unwrap();
        let kb = kv.broadcast(S).unwrap();
        for (name, op, want) in [
            ("AddConst", Op::AddConst(k.clone()), &xf + &kb),
            ("MulConst", Op::MulConst(k.clone()), &xf * &kb),
        ] {
            let g = chain("const", C, vec![(op, vec![0], C)]);
            dev.check(&format!("{name} {cs:?}"), &g, &x, &want, TOL);
        }
    }
}
test_device!(
    broadcast_constants,
    broadcast_constants_cpu_f32,
    broadcast_constants_cuda_f16
);

/// Softmax along each axis of large logits (the max must be subtracted first).
fn softmax_axes(dev: &mut Device) {
    let mut r = Rng::tagged("softmax");
    // Logits on the fp16 grid: CUDA stores its input in fp16, and at ±30 that rounding alone
    // would move the probabilities by about 1e-2.
    let x2 = input(&mut r, 30.0).mapv(|v| half::f16::from_f32(v).to_f32());
    for axis in 0..5 {
        // Off the channel axis Softmax is a tensor op, whose CUDA steps cover the planned batch
        // whatever a call's count: there the case runs at batch 1 (over axis 0 it would
        // normalise across windows).
        let x = match dev {
            Device::Cuda(_) if axis != 1 => x2.slice_axis(Axis(0), (0..1).into()).to_owned(),
            _ => x2.clone(),
        };
        let want = refr::softmax(&x.mapv(f64::from), axis);
        let g = chain("softmax", C, vec![(Op::Softmax { axis }, vec![0], C)]);
        dev.check(&format!("Softmax axis {axis}"), &g, &x, &want, TOL);
    }
}
test_device!(softmax_axes, softmax_axes_cpu_f32, softmax_axes_cuda_f16);
