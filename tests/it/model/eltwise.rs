//! Broadcasting binaries and the one-input math ops, imported from hand-built ONNX and run on the
//! CPU backend (f32 and f64) against float64 references computed here on random data: per-voxel
//! gates `[N,1,D,H,W]`, per-channel vectors `[N,C,1,1,1]` and per-sample scalars in both operand
//! orders, every unary, and the fusion of PyTorch's exported GELU chain into one op.

use crate::common::onnx::*;
use crate::common::rng::Rng;
use crate::ops::reference::{erf, sigmoid};
use ndarray::{Array5, Axis};
use std::path::Path;
use voxtile::internals::cpu::{run_graph, run_graph_f64};
use voxtile::internals::proto;
use voxtile::model::graph::{Op, Pointwise};
use voxtile::model::{load_bytes, Graph};

const C: usize = 3;
const S: [usize; 5] = [2, C, 4, 5, 6];

/// A model over input "x" `[N, C, 4, 5, 6]` (fixed spatial size, so pools can reduce it all)
/// writing "y".
fn model(opset: i64, nodes: Vec<proto::NodeProto>, inits: Vec<proto::TensorProto>) -> Graph {
    let dims = [None, Some(C as i64), Some(4), Some(5), Some(6)];
    let m = model_with(
        "eltwise",
        opset,
        nodes,
        inits,
        vec![vi("x", &dims)],
        vec![vi("y", &[None; 5])],
    );
    use prost::Message;
    load_bytes(&m.encode_to_vec(), None, Path::new("eltwise.onnx")).expect("the model loads")
}

/// Runs `g` on `x` in f32 and f64 and checks both against `want`.
fn check(name: &str, g: &Graph, x: &Array5<f32>, want: &Array5<f64>) {
    let got32 = run_graph(g, x.view()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let got64 = run_graph_f64(g, x.mapv(|v| v as f64).view()).unwrap();
    assert_eq!(got32.shape(), want.shape(), "{name}: shape");
    let e32 = crate::common::rel_l2(&got32.mapv(|v| v), &want.mapv(|v| v as f32));
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in got64.iter().zip(want) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    let e64 = (num / den.max(1e-300)).sqrt();
    println!("{name:<36} f32 rel L2 {e32:.2e}  f64 rel L2 {e64:.2e}");
    assert!(e32 <= 1e-5, "{name}: f32 rel L2 {e32:e}");
    assert!(e64 <= 1e-12, "{name}: f64 rel L2 {e64:e}");
}

fn input(r: &mut Rng, scale: f32) -> Array5<f32> {
    Array5::from_shape_vec(S, r.scaled(S.iter().product(), scale)).unwrap()
}

/// The operands the broadcast tests combine, as (ONNX nodes producing value `name`, f64 value).
/// Every operand goes through a Sigmoid, so Div and Pow see values in (0, 1).
struct Operands {
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    full: Array5<f64>,
    gate: Array5<f64>,
    chan: Array5<f64>,
    scalar: Array5<f64>,
}

fn operands(x: &Array5<f32>, w: &[f32]) -> Operands {
    let xf = x.mapv(|v| v as f64);
    // gate_raw = 1x1 conv C -> 1; chan_raw = mean over D,H,W; scalar_raw = mean of gate_raw.
    let mut gate_raw = Array5::<f64>::zeros([S[0], 1, S[2], S[3], S[4]]);
    for ((n, c, d, h, ww), v) in xf.indexed_iter() {
        gate_raw[[n, 0, d, h, ww]] += w[c] as f64 * v;
    }
    let mean = |a: &Array5<f64>| {
        let mut m = a.sum_axis(Axis(4)).sum_axis(Axis(3)).sum_axis(Axis(2));
        m /= (S[2] * S[3] * S[4]) as f64;
        m.into_shape_with_order([a.shape()[0], a.shape()[1], 1, 1, 1])
            .unwrap()
    };
    let pool = |name: &str, i: &str, o: &str| {
        node(
            "AveragePool",
            name,
            &[i],
            &[o],
            vec![("kernel_shape", Attr::Is(vec![4, 5, 6]))],
        )
    };
    let sig = |i: &str, o: &str| node("Sigmoid", &format!("sig_{o}"), &[i], &[o], vec![]);
    Operands {
        nodes: vec![
            node("Conv", "gate_conv", &["x", "wg"], &["gate_raw"], vec![]),
            pool("chan_pool", "x", "chan_raw"),
            pool("scalar_pool", "gate_raw", "scalar_raw"),
            sig("x", "full"),
            sig("gate_raw", "gate"),
            sig("chan_raw", "chan"),
            sig("scalar_raw", "scalar"),
        ],
        inits: vec![ftensor("wg", &[1, C as i64, 1, 1, 1], w)],
        full: xf.mapv(sigmoid),
        scalar: mean(&gate_raw).mapv(sigmoid),
        gate: gate_raw.mapv(sigmoid),
        chan: mean(&xf).mapv(sigmoid),
    }
}

/// `f` of `a` and `b` broadcast (numpy rules) to `S`.
fn broadcast(a: &Array5<f64>, b: &Array5<f64>, f: fn(f64, f64) -> f64) -> Array5<f64> {
    let (a, b) = (a.broadcast(S).unwrap(), b.broadcast(S).unwrap());
    let mut out = Array5::zeros(S);
    ndarray::Zip::from(&mut out)
        .and(&a)
        .and(&b)
        .for_each(|o, &p, &q| *o = f(p, q));
    out
}

#[test]
fn binaries_broadcast_in_both_orders() {
    let mut r = Rng::tagged("broadcast");
    let x = input(&mut r, 2.0);
    let w = r.vec(C);
    let ops = operands(&x, &w);
    type F2 = fn(f64, f64) -> f64;
    let binaries: [(&str, F2); 7] = [
        ("Add", |a, b| a + b),
        ("Sub", |a, b| a - b),
        ("Mul", |a, b| a * b),
        ("Div", |a, b| a / b),
        ("Max", f64::max),
        ("Min", f64::min),
        ("Pow", f64::powf),
    ];
    let pairs = [
        ("full", "gate", &ops.full, &ops.gate),
        ("gate", "full", &ops.gate, &ops.full),
        ("full", "chan", &ops.full, &ops.chan),
        ("chan", "full", &ops.chan, &ops.full),
        ("full", "scalar", &ops.full, &ops.scalar),
        ("scalar", "full", &ops.scalar, &ops.full),
        ("gate", "chan", &ops.gate, &ops.chan),
        ("chan", "gate", &ops.chan, &ops.gate),
    ];
    for (op, f) in binaries {
        for (an, bn, a, b) in pairs {
            let mut nodes = ops.nodes.clone();
            nodes.push(node(op, "bin", &[an, bn], &["y"], vec![]));
            let g = model(17, nodes, ops.inits.clone());
            let last = &g.nodes.last().unwrap().op;
            assert_eq!(last.name(), op, "{op}({an}, {bn}) lowers to one {op}");
            assert_eq!(g.output_channels(), C);
            check(&format!("{op}({an}, {bn})"), &g, &x, &broadcast(a, b, f));
        }
    }
}

#[test]
fn incompatible_shapes_are_refused_with_the_shapes() {
    // [N,3,...] * [N,2,...] (a 1x1 conv to 2 channels): no broadcast.
    let nodes = vec![
        node("Conv", "c2", &["x", "w2"], &["two"], vec![]),
        node("Mul", "bad", &["x", "two"], &["y"], vec![]),
    ];
    let dims = [None, Some(C as i64), Some(4), Some(5), Some(6)];
    let m = model_with(
        "bad",
        17,
        nodes,
        vec![ftensor("w2", &[2, C as i64, 1, 1, 1], vec![0.5; 2 * C])],
        vec![vi("x", &dims)],
        vec![vi("y", &[None; 5])],
    );
    use prost::Message;
    let e = load_bytes(&m.encode_to_vec(), None, Path::new("bad.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad.onnx") && e.contains("3 and 2 channels"),
        "{e}"
    );
    assert!(Op::Add
        .output_shape(&[[1, 3, 4, 4, 4], [1, 3, 4, 4, 2]])
        .unwrap_err()
        .contains("along W"));
}

fn softplus_ref(v: f64) -> f64 {
    (1.0 + v.exp()).ln()
}

#[test]
fn unary_functions() {
    let mut r = Rng::tagged("unary");
    let x = input(&mut r, 3.0);
    let xf = x.mapv(|v| v as f64);
    let attr_f = |k: &'static str, v: f32| (k, Attr::F(v));
    type Case = (
        &'static str,
        i64,
        Vec<proto::NodeProto>,
        Vec<proto::TensorProto>,
        fn(f64) -> f64,
    );
    let one = |op: &str, attrs: Vec<(&str, Attr)>| vec![node(op, "u", &["x"], &["y"], attrs)];
    // Through a Sigmoid first: ops whose domain is positive.
    let pos = |op: &str, extra: &[&str]| {
        let mut ins = vec!["s"];
        ins.extend_from_slice(extra);
        vec![
            node("Sigmoid", "s", &["x"], &["s"], vec![]),
            node(op, "u", &ins, &["y"], vec![]),
        ]
    };
    let cases: Vec<Case> = vec![
        ("Erf", 17, one("Erf", vec![]), vec![], erf),
        ("Gelu", 20, one("Gelu", vec![]), vec![], |v| {
            0.5 * v * (1.0 + erf(v / 2f64.sqrt()))
        }),
        (
            "Gelu tanh",
            20,
            one("Gelu", vec![("approximate", Attr::S("tanh"))]),
            vec![],
            |v| {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * v * (1.0 + (k * (v + 0.044715 * v.powi(3))).tanh())
            },
        ),
        (
            "Softplus",
            17,
            one("Softplus", vec![]),
            vec![],
            softplus_ref,
        ),
        ("Mish", 18, one("Mish", vec![]), vec![], |v| {
            v * softplus_ref(v).tanh()
        }),
        ("HardSwish", 17, one("HardSwish", vec![]), vec![], |v| {
            v * (v + 3.0).clamp(0.0, 6.0) / 6.0
        }),
        (
            "HardSigmoid",
            17,
            one(
                "HardSigmoid",
                vec![attr_f("alpha", 0.25), attr_f("beta", 0.4)],
            ),
            vec![],
            |v| (0.25 * v + 0.4f32 as f64).clamp(0.0, 1.0),
        ),
        ("Exp", 17, one("Exp", vec![]), vec![], f64::exp),
        ("Abs", 17, one("Abs", vec![]), vec![], f64::abs),
        ("Neg", 17, one("Neg", vec![]), vec![], |v| -v),
        ("Log", 17, pos("Log", &[]), vec![], |v| {
            -(1.0 + (-v).exp()).ln()
        }),
        ("Sqrt", 17, pos("Sqrt", &[]), vec![], |v| sigmoid(v).sqrt()),
        ("Reciprocal", 17, pos("Reciprocal", &[]), vec![], |v| {
            1.0 + (-v).exp()
        }),
        (
            "Pow 3",
            17,
            one("Pow", vec![])
                .into_iter()
                .map(|mut n| {
                    n.input.push("e".into());
                    n
                })
                .collect(),
            vec![ftensor("e", &[], [3.0])],
            |v| v * v * v,
        ),
        (
            "Pow 0.5",
            17,
            pos("Pow", &["h"]),
            vec![ftensor("h", &[1], [0.5])],
            |v| sigmoid(v).sqrt(),
        ),
        (
            "Clip (ReLU6)",
            17,
            vec![node("Clip", "u", &["x", "lo", "hi"], &["y"], vec![])],
            vec![ftensor("lo", &[], [0.0]), ftensor("hi", &[], [1.5])],
            |v| v.clamp(0.0, 1.5),
        ),
        (
            "Clip min only",
            17,
            vec![node("Clip", "u", &["x", "lo"], &["y"], vec![])],
            vec![ftensor("lo", &[], [-0.5])],
            |v| v.max(-0.5),
        ),
        (
            "Clip opset 6",
            6,
            one("Clip", vec![attr_f("min", -1.0), attr_f("max", 0.5)]),
            vec![],
            |v| v.clamp(-1.0, 0.5),
        ),
        (
            "Max with a scalar",
            17,
            vec![node("Max", "u", &["x", "z"], &["y"], vec![])],
            vec![ftensor("z", &[], [0.25])],
            |v| v.max(0.25),
        ),
        (
            "Min with a scalar",
            17,
            vec![node("Min", "u", &["z", "x"], &["y"], vec![])],
            vec![ftensor("z", &[1], [0.25])],
            |v| v.min(0.25),
        ),
    ];
    for (name, opset, nodes, inits, f) in cases {
        let g = model(opset, nodes, inits);
        let last = &g.nodes.last().unwrap().op;
        assert!(
            matches!(last, Op::Pointwise(_)),
            "{name}: lowered to {}",
            last.name()
        );
        check(name, &g, &x, &xf.mapv(f));
    }
}

/// PyTorch's GELU as the legacy exporter writes it, `(x * (1 + erf(x / √2))) * 0.5`, and the
/// other orders of the same products; `half_first` puts the 0.5 on x first.
fn gelu_chain(swap_mul: bool, swap_add: bool, half_first: bool) -> Vec<proto::NodeProto> {
    let bin = |op: &str, name: &str, a: &str, b: &str, swap: bool, o: &str| {
        let ins = if swap { [b, a] } else { [a, b] };
        node(op, name, &ins, &[o], vec![])
    };
    let mut v = vec![
        node("Div", "div", &["x", "sqrt2"], &["d"], vec![]),
        node("Erf", "erf", &["d"], &["e"], vec![]),
        bin("Add", "add", "e", "one", swap_add, "a"),
    ];
    if half_first {
        v.push(bin("Mul", "half", "x", "half", false, "h"));
        v.push(bin("Mul", "mul", "h", "a", swap_mul, "y"));
    } else {
        v.push(bin("Mul", "mul", "x", "a", swap_mul, "m"));
        v.push(bin("Mul", "half", "m", "half", false, "y"));
    }
    v
}

fn gelu_consts(one: f32) -> Vec<proto::TensorProto> {
    vec![
        ftensor("sqrt2", &[], [std::f32::consts::SQRT_2]),
        ftensor("one", &[], [one]),
        ftensor("half", &[], [0.5]),
    ]
}

#[test]
fn exported_gelu_chain_fuses_into_one_op() {
    let mut r = Rng::tagged("gelu");
    let x = input(&mut r, 3.0);
    let want = x.mapv(|v| {
        let v = v as f64;
        0.5 * v * (1.0 + erf(v / 2f64.sqrt()))
    });
    for bits in 0..8 {
        let (sm, sa, hf) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
        let g = model(17, gelu_chain(sm, sa, hf), gelu_consts(1.0));
        let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(names, ["Gelu"], "order {bits}: {names:?}");
        assert_eq!(
            g.nodes[0].op,
            Op::Pointwise(Pointwise::Gelu { tanh: false })
        );
        check(&format!("fused GELU, order {bits}"), &g, &x, &want);
    }
    // Not GELU (1 + erf replaced by 2 + erf): the Erf stays, computed alone.
    let g = model(17, gelu_chain(false, false, false), gelu_consts(2.0));
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert!(
        names.contains(&"Erf") && !names.contains(&"Gelu"),
        "{names:?}"
    );
    let want2 = x.mapv(|v| {
        let v = v as f64;
        // Div by the f32 √2 runs as a Mul by its f32 reciprocal.
        let inv = (1.0 / std::f32::consts::SQRT_2) as f64;
        0.5 * v * (2.0 + erf(v * inv))
    });
    check("unfused erf chain", &g, &x, &want2);
}

#[test]
fn silu_is_mul_of_sigmoid() {
    let mut r = Rng::tagged("silu");
    let x = input(&mut r, 3.0);
    let nodes = vec![
        node("Sigmoid", "s", &["x"], &["s"], vec![]),
        node("Mul", "m", &["x", "s"], &["y"], vec![]),
    ];
    let g = model(17, nodes, vec![]);
    check("SiLU", &g, &x, &x.mapv(|v| v as f64 * sigmoid(v as f64)));
}

/// The CPU memory model predicts the executor's peak for broadcast binaries in place (the
/// larger operand first, dying there) and out of place (the gate first).
#[test]
fn broadcast_memory_is_predicted() {
    use voxtile::backend::Backend;
    use voxtile::internals::cpu::{memory::cpu_activations, CpuBackend};
    let mut r = Rng::new(7);
    let x = input(&mut r, 2.0);
    let ops = operands(&x, &r.vec(C));
    let mut peaks = vec![];
    for (a, b) in [("full", "gate"), ("gate", "full")] {
        let mut nodes = ops.nodes.clone();
        nodes.push(node("Mul", "bin", &[a, b], &["y"], vec![]));
        let g = model(17, nodes, ops.inits.clone());
        let mut be = CpuBackend::new();
        be.prepare(&g, S[0], [S[2], S[3], S[4]]).unwrap();
        be.run(x.view()).unwrap();
        let measured = be.last_stats().peak_live_bytes as u64;
        let (predicted, _, _) = cpu_activations(&g, S[0], [S[2], S[3], S[4]]).unwrap();
        assert_eq!(measured, predicted, "Mul({a}, {b})");
        peaks.push(measured);
    }
    assert!(peaks[0] < peaks[1], "in place saves a buffer: {peaks:?}");
}
