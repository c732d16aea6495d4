//! Pad (constant / reflect / edge, negative pads, channel pads, zero pads) and Expand / Tile of
//! activations: ONNX graphs built here, loaded by voxtile and run on the CPU backend (f32 and
//! f64) against a float64 reference written here from numpy's definitions (crop first, then
//! `np.pad`); the shape plumbing the exporters wrap around them; the refusals. The `cuda_*`
//! test runs the same ops on the GPU (fp16) and skips without one.

use crate::common::onnx::*;
use crate::common::rng::Rng;
use ndarray::{Array5, Slice};
use prost::Message;
use std::path::Path;
use voxtile::backend::Backend;
use voxtile::internals::cpu::{memory::cpu_activations, run_graph, run_graph_f64, CpuBackend};
use voxtile::internals::proto;
use voxtile::model::graph::*;
use voxtile::model::load_bytes;

// ---------- float64 references ----------

/// numpy's pad of `x` along NCDHW: negative pads crop first, then `mode` fills the positive
/// ones from the cropped array ("constant" with `value`, "reflect", "edge").
fn ref_pad(x: &Array5<f64>, b: [i64; 5], e: [i64; 5], mode: &str, value: f64) -> Array5<f64> {
    let crop = x.slice_each_axis(|ax| {
        let (a, n) = (ax.axis.index(), ax.len as i64);
        Slice::from((-b[a]).max(0) as usize..(n - (-e[a]).max(0)) as usize)
    });
    let m: Vec<i64> = crop.shape().iter().map(|&d| d as i64).collect();
    let os: Vec<usize> = (0..5)
        .map(|a| (m[a] + b[a].max(0) + e[a].max(0)) as usize)
        .collect();
    let src = |a: usize, o: usize| -> Option<usize> {
        let mut j = o as i64 - b[a].max(0);
        let n = m[a];
        if (0..n).contains(&j) {
            return Some(j as usize);
        }
        match mode {
            "constant" => None,
            "edge" => Some(j.clamp(0, n - 1) as usize),
            _ => {
                // Reflect repeatedly about both edges (numpy's definition, edge not repeated).
                while !(0..n).contains(&j) {
                    j = if j < 0 { -j } else { 2 * (n - 1) - j };
                }
                Some(j as usize)
            }
        }
    };
    Array5::from_shape_fn(
        (os[0], os[1], os[2], os[3], os[4]),
        |(i0, i1, i2, i3, i4)| match (src(0, i0), src(1, i1), src(2, i2), src(3, i3), src(4, i4)) {
            (Some(a), Some(c), Some(d), Some(h), Some(w)) => crop[[a, c, d, h, w]],
            _ => value,
        },
    )
}

/// `x` with its channels repeated `r` times (numpy `np.tile(x, (1, r, 1, 1, 1))`).
fn ref_tile(x: &Array5<f64>, r: usize) -> Array5<f64> {
    let s = x.shape();
    Array5::from_shape_fn((s[0], s[1] * r, s[2], s[3], s[4]), |(n, c, d, h, w)| {
        x[[n, c % s[1], d, h, w]]
    })
}

fn rel_l2(got: &Array5<f64>, want: &Array5<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape(), "output shape");
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += (g - w) * (g - w);
        den += w * w;
    }
    assert!(
        den > 0.0,
        "the reference is all zeros: the test would prove nothing"
    );
    (num / den).sqrt()
}

fn random(rng: &mut Rng, s: [usize; 5]) -> Array5<f32> {
    Array5::from_shape_vec(s, rng.vec(s.iter().product())).unwrap()
}

// ---------- ONNX graphs ----------

fn load(m: &proto::ModelProto) -> voxtile::Result<Graph> {
    load_bytes(&m.encode_to_vec(), None, Path::new("pad.onnx"))
}

/// A model reading `x` [N, cin, D, H, W] and writing `y`.
fn model(
    opset: i64,
    cin: i64,
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
) -> proto::ModelProto {
    let input = vec![vi_c("x", Some(cin))];
    model_with("pad", opset, nodes, inits, input, vec![vi("y", &[None; 5])])
}

/// `Pad(x, pads[, value])` at opset 17, pads begins then ends over NCDHW.
fn pad_model(
    cin: i64,
    b: [i64; 5],
    e: [i64; 5],
    mode: &'static str,
    value: Option<f32>,
) -> proto::ModelProto {
    let mut inits = vec![itensor("pads", &[10], [b, e].concat())];
    let mut ins = vec!["x", "pads"];
    if let Some(v) = value {
        inits.push(ftensor("value", &[], [v]));
        ins.push("value");
    }
    let n = node("Pad", "pad", &ins, &["y"], vec![("mode", Attr::S(mode))]);
    model(17, cin, vec![n], inits)
}

fn ops_of(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

/// Runs `g` on `x` in f32 and f64 on the CPU and checks both against `want`; the CPU memory
/// model's activation peak must equal what the executor measured.
fn check(name: &str, g: &Graph, x: &Array5<f32>, want: &Array5<f64>) {
    let got32 = run_graph(g, x.view()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let got64 =
        run_graph_f64(g, x.mapv(f64::from).view()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (e32, e64) = (rel_l2(&got32.mapv(f64::from), want), rel_l2(&got64, want));
    eprintln!(
        "{name:<40} f32 relL2 {e32:.1e} f64 relL2 {e64:.1e} out {:?}",
        want.shape()
    );
    // Pads and tiles copy: exact in both precisions.
    assert!(
        e32 <= 1e-12 && e64 <= 1e-12,
        "{name}: rel L2 {e32:e} / {e64:e}"
    );
    let s = x.shape();
    let roi = [s[2], s[3], s[4]];
    let mut cpu = CpuBackend::new();
    cpu.prepare(g, s[0], roi).unwrap();
    cpu.run(x.view()).unwrap();
    let (predicted, _, _) = cpu_activations(g, s[0], roi).unwrap();
    assert_eq!(
        predicted,
        cpu.last_stats().peak_live_bytes as u64,
        "{name}: memory model"
    );
}

// ---------- Pad ----------

#[test]
fn pad_modes_match_the_reference() {
    let mut rng = Rng::tagged("pad_modes");
    let x = random(&mut rng, [2, 3, 6, 7, 8]);
    let x64 = x.mapv(f64::from);
    type Case = (&'static str, &'static str, [i64; 5], [i64; 5], Option<f32>);
    let cases: [Case; 10] = [
        (
            "constant 1.5",
            "constant",
            [0, 0, 1, 2, 0],
            [0, 0, 2, 0, 3],
            Some(1.5),
        ),
        (
            "constant, no value input",
            "constant",
            [0, 0, 0, 1, 1],
            [0, 0, 1, 0, 1],
            None,
        ),
        ("reflect", "reflect", [0, 0, 2, 1, 3], [0, 0, 1, 3, 2], None),
        (
            "reflect, pads size - 1",
            "reflect",
            [0, 0, 5, 0, 7],
            [0, 0, 0, 6, 0],
            None,
        ),
        (
            "edge (replicate)",
            "edge",
            [0, 0, 0, 2, 1],
            [0, 0, 3, 0, 2],
            None,
        ),
        (
            "negative pads, constant",
            "constant",
            [0, 0, -1, 2, 0],
            [0, 0, 1, -2, -3],
            Some(-2.0),
        ),
        (
            "negative pads, edge",
            "edge",
            [0, -1, -2, 1, 0],
            [0, 0, 3, -1, 2],
            None,
        ),
        (
            "negative pads, reflect",
            "reflect",
            [0, 0, -2, 2, 0],
            [0, 0, 2, -1, 1],
            None,
        ),
        (
            "channel pad (ChannelPad)",
            "constant",
            [0, 2, 0, 0, 0],
            [0, 3, 0, 0, 0],
            None,
        ),
        (
            "channel pad, reflect",
            "reflect",
            [0, 2, 0, 1, 0],
            [0, 1, 0, 0, 1],
            None,
        ),
    ];
    for (name, mode, b, e, value) in cases {
        let g = load(&pad_model(3, b, e, mode, value)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ops_of(&g), ["Pad"], "{name}");
        let want = ref_pad(&x64, b, e, mode, value.unwrap_or(0.0) as f64);
        check(name, &g, &x, &want);
    }
    // Edge pads of the channels too.
    let (b, e) = ([0, 1, 0, 0, 0], [0, 2, 0, 0, 0]);
    let g = load(&pad_model(3, b, e, "edge", None)).unwrap();
    check(
        "channel pad, edge",
        &g,
        &x,
        &ref_pad(&x64, b, e, "edge", 0.0),
    );
}

#[test]
fn zero_pads_lower_to_nothing() {
    let nodes = vec![
        node(
            "Pad",
            "pad",
            &["x", "pads"],
            &["p"],
            vec![("mode", Attr::S("edge"))],
        ),
        node("Relu", "relu", &["p"], &["y"], vec![]),
    ];
    let g = load(&model(
        17,
        2,
        nodes,
        vec![itensor("pads", &[10], vec![0; 10])],
    ))
    .unwrap();
    assert_eq!(ops_of(&g), ["Relu"]);
    let x = random(&mut Rng::tagged("zero_pads"), [1, 2, 3, 4, 5]);
    check(
        "zero pads + relu",
        &g,
        &x,
        &x.mapv(|v| f64::from(v.max(0.0))),
    );
}

#[test]
fn pad_inputs_of_every_opset() {
    let mut rng = Rng::tagged("pad_opsets");
    let x = random(&mut rng, [1, 2, 5, 6, 7]);
    let x64 = x.mapv(f64::from);
    // Opset 10: pads and value are attributes.
    let n = node(
        "Pad",
        "pad",
        &["x"],
        &["y"],
        vec![
            ("mode", Attr::S("constant")),
            ("pads", Attr::Is(vec![0, 1, 0, 2, 1, 0, 0, 1, 0, 2])),
            ("value", Attr::F(0.25)),
        ],
    );
    let g = load(&model(10, 2, vec![n], vec![])).unwrap();
    let (b, e) = ([0, 1, 0, 2, 1], [0, 0, 1, 0, 2]);
    check(
        "opset 10 attributes",
        &g,
        &x,
        &ref_pad(&x64, b, e, "constant", 0.25),
    );
    // Opset 18: axes (negative ones too), an empty constant_value name.
    let n = node(
        "Pad",
        "pad",
        &["x", "pads", "", "axes"],
        &["y"],
        vec![("mode", Attr::S("reflect"))],
    );
    let inits = vec![
        itensor("pads", &[4], vec![1, 2, 3, 0]),
        itensor("axes", &[2], vec![2, -1]),
    ];
    let g = load(&model(18, 2, vec![n], inits)).unwrap();
    let (b, e) = ([0, 0, 1, 0, 2], [0, 0, 3, 0, 0]);
    check(
        "opset 18 axes",
        &g,
        &x,
        &ref_pad(&x64, b, e, "reflect", 0.0),
    );
}

/// `D - D + k` over `Shape(x)`: a shape-derived value that is `k` on every window.
fn shape_const(k: i64, tag: &str) -> (Vec<proto::NodeProto>, Vec<proto::TensorProto>) {
    let t = |s: &str| format!("{tag}_{s}");
    let nodes = vec![
        node("Shape", &t("shape"), &["x"], &[&t("s")], vec![]),
        node(
            "Gather",
            &t("gather"),
            &[&t("s"), &t("i2")],
            &[&t("d")],
            vec![("axis", Attr::I(0))],
        ),
        node("Sub", &t("sub"), &[&t("d"), &t("d")], &[&t("z")], vec![]),
        node("Add", &t("add"), &[&t("z"), &t("k")], &[&t("v")], vec![]),
    ];
    let inits = vec![
        itensor(&t("i2"), &[1], vec![2]),
        itensor(&t("k"), &[1], vec![k]),
    ];
    (nodes, inits)
}

#[test]
fn pads_from_shape_plumbing() {
    let x = random(&mut Rng::tagged("pad_plumbing"), [1, 2, 4, 5, 6]);
    // pads = Concat(zeros(8), D - D + 2, D - D + 1): folded on the probe windows.
    let (mut nodes, mut inits) = shape_const(2, "a");
    let (n2, i2) = shape_const(1, "b");
    nodes.extend(n2);
    inits.extend(i2);
    inits.push(itensor("zeros", &[8], vec![0; 8]));
    nodes.push(node(
        "Concat",
        "cat",
        &["zeros", "a_v", "b_v"],
        &["pads"],
        vec![("axis", Attr::I(0))],
    ));
    nodes.push(node(
        "Pad",
        "pad",
        &["x", "pads"],
        &["y"],
        vec![("mode", Attr::S("edge"))],
    ));
    let g = load(&model(17, 2, nodes.clone(), inits.clone())).unwrap();
    let (b, e) = ([0, 0, 0, 0, 0], [0, 0, 0, 2, 1]);
    check(
        "shape-derived pads",
        &g,
        &x,
        &ref_pad(&x.mapv(f64::from), b, e, "edge", 0.0),
    );
    // End pad of W = D (the window's own size): refused, naming the problem.
    nodes[3] = node("Add", "a_add", &["a_d", "a_z"], &["a_v"], vec![]);
    let err = load(&model(17, 2, nodes, inits)).unwrap_err().to_string();
    assert!(err.contains("depend on the window size"), "{err}");
    assert!(err.contains("\"pad\""), "{err}");
}

#[test]
fn bad_pads_are_refused_clearly() {
    let refused = |m: proto::ModelProto, want: &str| {
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("pad.onnx"), "{want}: {e}");
    };
    refused(
        pad_model(2, [1, 0, 0, 0, 0], [0; 5], "constant", None),
        "batch axis",
    );
    refused(
        pad_model(2, [0; 5], [0, 0, 0, 0, 1], "wrap", None),
        "mode=wrap",
    );
    refused(
        pad_model(2, [0, 2, 0, 0, 0], [0; 5], "reflect", None),
        "smaller than its size",
    );
    refused(
        pad_model(2, [0, -1, 0, 0, 0], [0, -1, 0, 0, 0], "constant", None),
        "crop all",
    );
    let n = node("Pad", "pad", &["x", "pads"], &["y"], vec![]);
    refused(
        model(17, 2, vec![n], vec![itensor("pads", &[6], vec![0; 6])]),
        "expected 10",
    );
    // A reflect pad the window is too small for: the model loads, the run says why.
    let g = load(&pad_model(2, [0, 0, 0, 0, 4], [0; 5], "reflect", None)).unwrap();
    let x = Array5::<f32>::zeros([1, 2, 3, 3, 4]);
    let e = run_graph(&g, x.view()).unwrap_err().to_string();
    assert!(e.contains("smaller than its size"), "{e}");
    assert!(run_graph(&g, Array5::<f32>::zeros([1, 2, 3, 3, 5]).view()).is_ok());
}

// ---------- Expand / Tile ----------

#[test]
fn tile_and_expand_along_channels() {
    let mut rng = Rng::tagged("tile");
    let x2 = random(&mut rng, [2, 2, 3, 4, 5]);
    let x1 = random(&mut rng, [2, 1, 3, 4, 5]);
    // Tile by [1, 3, 1, 1, 1].
    let n = node("Tile", "tile", &["x", "r"], &["y"], vec![]);
    let g = load(&model(
        17,
        2,
        vec![n],
        vec![itensor("r", &[5], vec![1, 3, 1, 1, 1])],
    ))
    .unwrap();
    assert_eq!(ops_of(&g), ["Tile"]);
    check("tile C x3", &g, &x2, &ref_tile(&x2.mapv(f64::from), 3));
    // Expand a 1-channel tensor to 4 (target right-aligned: rank 4).
    let n = node("Expand", "expand", &["x", "t"], &["y"], vec![]);
    let g = load(&model(
        17,
        1,
        vec![n],
        vec![itensor("t", &[4], vec![4, 1, 1, 1])],
    ))
    .unwrap();
    assert_eq!(ops_of(&g), ["Tile"]);
    check(
        "expand C 1 -> 4",
        &g,
        &x1,
        &ref_tile(&x1.mapv(f64::from), 4),
    );
    // Expand to ones, and to the tensor's own shape: no-ops.
    for (target, extra) in [("ones", false), ("s", true)] {
        let mut nodes = vec![
            node("Expand", "expand", &["x", target], &["e"], vec![]),
            node("Relu", "relu", &["e"], &["y"], vec![]),
        ];
        if extra {
            nodes.insert(0, node("Shape", "shape", &["x"], &["s"], vec![]));
        }
        let inits = vec![itensor("ones", &[5], vec![1; 5])];
        let g = load(&model(17, 2, nodes, inits)).unwrap();
        assert_eq!(ops_of(&g), ["Relu"], "expand to {target}");
        check("no-op expand", &g, &x2, &x2.mapv(|v| f64::from(v.max(0.0))));
    }
}

/// The legacy exporter's `x.repeat(1, 16 // C, 1, 1, 1)` (MONAI VNet's InputTransition):
/// Expand to ConstantOfShape(Shape(repeats)) (all ones), then Tile with repeats computed from
/// Shape(x).
#[test]
fn legacy_repeat_pattern() {
    let i = |name: &str, v: Vec<i64>| itensor(name, &[v.len() as i64], v);
    let nodes = vec![
        node("Shape", "shape", &["x"], &["s"], vec![]),
        node(
            "Gather",
            "gather",
            &["s", "one"],
            &["c"],
            vec![("axis", Attr::I(0))],
        ),
        node("Div", "div", &["sixteen", "c"], &["q"], vec![]),
        node("Cast", "cast", &["q"], &["qi"], vec![("to", Attr::I(7))]),
        node("Unsqueeze", "unsq", &["qi", "zero"], &["qu"], vec![]),
        node(
            "Concat",
            "cat",
            &["one1", "qu", "one1", "one1", "one1"],
            &["reps"],
            vec![("axis", Attr::I(0))],
        ),
        node("Shape", "shape2", &["reps"], &["rs"], vec![]),
        node(
            "ConstantOfShape",
            "cos",
            &["rs"],
            &["ones"],
            vec![("value", Attr::T(Box::new(itensor("v", &[1], vec![1]))))],
        ),
        node("Expand", "expand", &["x", "ones"], &["e"], vec![]),
        node("Tile", "tile", &["e", "reps"], &["y"], vec![]),
    ];
    let inits = vec![
        itensor("one", &[], vec![1]),
        itensor("sixteen", &[], vec![16]),
        i("zero", vec![0]),
        i("one1", vec![1]),
    ];
    let g = load(&model(17, 2, nodes, inits)).unwrap();
    assert_eq!(ops_of(&g), ["Tile"]);
    let x = random(&mut Rng::tagged("repeat"), [1, 2, 4, 4, 4]);
    check(
        "x.repeat(1, 16 // 2, 1, 1, 1)",
        &g,
        &x,
        &ref_tile(&x.mapv(f64::from), 8),
    );
}

#[test]
fn unsupported_expand_and_tile_are_refused_clearly() {
    let refused = |n: proto::NodeProto, cin: i64, t: Vec<i64>, want: &str| {
        let m = model(17, cin, vec![n], vec![itensor("t", &[t.len() as i64], t)]);
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("pad.onnx"), "{want}: {e}");
    };
    let tile = || node("Tile", "tile", &["x", "t"], &["y"], vec![]);
    let expand = || node("Expand", "expand", &["x", "t"], &["y"], vec![]);
    refused(tile(), 2, vec![1, 1, 2, 1, 1], "along N, D, H or W");
    refused(tile(), 2, vec![2, 1, 1, 1, 1], "along N, D, H or W");
    refused(tile(), 2, vec![1, 0, 1, 1, 1], "positive");
    refused(
        expand(),
        2,
        vec![1, 4, 1, 1, 1],
        "cannot expand 2 channels to 4",
    );
    refused(
        expand(),
        1,
        vec![1, 1, 64, 1, 1],
        "only the channels of a 1-channel tensor expand",
    );
    refused(expand(), 1, vec![1, 1, 1, 1, 1, 1], "at most 5 sizes");
}

// ---------- CUDA ----------

/// Every Pad mode and the channel Tile on the GPU (fp16, NDHWC) against the float64
/// reference, batch 2 run as prepared and as 1 of 2. Skips without a GPU.
#[test]
fn cuda_pad_and_tile_match_the_reference() {
    let Some(mut b) = crate::common::cuda_backend() else {
        return;
    };
    let mut o = *b.options();
    o.poison = true;
    b.set_options(o);
    let mut rng = Rng::tagged("cuda_pad");
    let pad = |mode, bg: [i64; 5], e: [i64; 5], value| {
        Op::Pad(Pad {
            mode,
            begin: bg,
            end: e,
            value,
        })
    };
    type Case = (&'static str, usize, Op, &'static str);
    let cases: Vec<Case> = vec![
        (
            "constant",
            3,
            pad(PadMode::Constant, [0, 0, 1, 2, 0], [0, 0, 2, 0, 3], 1.5),
            "constant",
        ),
        (
            "reflect",
            3,
            pad(PadMode::Reflect, [0, 0, 2, 1, 3], [0, 0, 1, 3, 2], 0.0),
            "reflect",
        ),
        (
            "edge",
            8,
            pad(PadMode::Edge, [0, 0, 0, 2, 1], [0, 0, 3, 0, 2], 0.0),
            "edge",
        ),
        (
            "crop + edge",
            3,
            pad(PadMode::Edge, [0, -1, -2, 1, 0], [0, 0, 3, -1, 2], 0.0),
            "edge",
        ),
        (
            "crop + reflect",
            3,
            pad(PadMode::Reflect, [0, 0, -2, 2, 0], [0, 0, 2, -1, 1], 0.0),
            "reflect",
        ),
        (
            "channel pad",
            3,
            pad(PadMode::Constant, [0, 2, 0, 0, 0], [0, 3, 0, 0, 0], 0.0),
            "constant",
        ),
        ("tile x3", 2, Op::Tile(Tile { repeats: 3 }), "tile"),
        ("tile 1 -> 16", 1, Op::Tile(Tile { repeats: 16 }), "tile"),
    ];
    for (name, c, op, mode) in cases {
        let x = random(&mut rng, [2, c, 6, 7, 8]);
        let x64 = x.mapv(f64::from);
        let want = match &op {
            Op::Pad(p) => ref_pad(&x64, p.begin, p.end, mode, p.value as f64),
            Op::Tile(t) => ref_tile(&x64, t.repeats),
            _ => unreachable!(),
        };
        let cout = want.shape()[1];
        let g = crate::common::graph::chain("pad", c, vec![(op, vec![0], cout)]);
        b.prepare(&g, 2, [6, 7, 8]).expect("prepare");
        for n in [2, 1] {
            let xs = x.slice_axis(ndarray::Axis(0), Slice::from(0..n)).to_owned();
            let ws = want
                .slice_axis(ndarray::Axis(0), Slice::from(0..n))
                .to_owned();
            let got = b.run(xs.view()).expect("run").mapv(f64::from);
            let e = rel_l2(&got, &ws);
            println!("RESULT {name:<36} n={n} rel_l2 {e:.2e}");
            assert!(e <= 1e-2, "{name}: rel L2 {e:e}");
        }
    }
}
