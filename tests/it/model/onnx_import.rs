//! ONNX import: the fixture models, hand-built models (prost-encoded), and hostile inputs.

use crate::common::onnx::*;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use voxtile::internals::proto;
use voxtile::model::graph::{CoordMode, NearestMode, Op, OutputActivation, ResizeMode};
use voxtile::model::{load, load_bytes, Graph};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/")).join(rel)
}

fn op_counts(g: &Graph) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for n in &g.nodes {
        *m.entry(n.op.name()).or_default() += 1;
    }
    m
}

/// Independent parameter count from the ONNX file: for every compute node, the element counts of
/// its float inputs that are initializers or Constant nodes (Identity chains resolved). A weight
/// shared by several nodes counts once per use, as the IR copies it into each op.
fn used_float_params(path: &Path) -> usize {
    let m = proto::ModelProto::decode(&std::fs::read(path).unwrap()[..]).unwrap();
    let g = m.graph.unwrap();
    let mut size: HashMap<String, usize> = HashMap::new();
    for t in &g.initializer {
        if t.data_type() == 1 {
            size.insert(
                t.name().to_string(),
                t.dims.iter().product::<i64>() as usize,
            );
        }
    }
    let mut alias: HashMap<String, String> = HashMap::new();
    for n in &g.node {
        if n.op_type() == "Constant" {
            if let Some(t) = n.attribute[0].t.as_ref().filter(|t| t.data_type() == 1) {
                size.insert(n.output[0].clone(), t.dims.iter().product::<i64>() as usize);
            }
        }
        if n.op_type() == "Identity" {
            alias.insert(n.output[0].clone(), n.input[0].clone());
        }
    }
    let mut total = 0;
    for n in &g.node {
        if matches!(n.op_type(), "Identity" | "Constant") {
            continue;
        }
        for i in &n.input {
            let mut r = i.clone();
            while let Some(a) = alias.get(&r) {
                r = a.clone();
            }
            total += size.get(&r).copied().unwrap_or(0);
        }
    }
    total
}

fn npy_shape(p: &Path) -> Vec<usize> {
    voxtile::internals::npy::read_f32(p)
        .unwrap()
        .shape()
        .to_vec()
}

fn check_fixture_shapes(g: &Graph, stem: &str) {
    let i = npy_shape(&fixture(&format!("models/{stem}_input.npy")));
    let o = npy_shape(&fixture(&format!("models/{stem}_output.npy")));
    assert_eq!(i[1], g.input_channels());
    let shapes = g.infer_shapes(i[0], [i[2], i[3], i[4]]).unwrap();
    assert_eq!(
        shapes[g.output].to_vec(),
        o,
        "{stem}: inferred output shape vs PyTorch's"
    );
    assert_eq!(shapes[g.input].to_vec(), i);
}

#[test]
fn nnunet_fixture() {
    let path = fixture("models/nnunet_small.onnx");
    let g = load(&path).unwrap();
    let c = op_counts(&g);
    // 5 stages x 2 convs encoder + 4 x 2 decoder + 1 seg head = 19 convs, one norm+nonlin per
    // conv but the head.
    assert_eq!(c["Conv"], 19);
    assert_eq!(c["ConvTranspose"], 4);
    assert_eq!(c["InstanceNormalization"], 18);
    assert_eq!(c["LeakyRelu"], 18);
    assert_eq!(c["Concat"], 4);
    assert_eq!(c.len(), 5);
    assert_eq!((g.input_channels(), g.output_channels()), (1, 4));
    assert_eq!(g.param_count(), used_float_params(&path));
    assert_eq!(g.output_activation(), OutputActivation::None);
    assert_eq!(g.spatial_divisor(), [16; 3]);
    assert_eq!(g.fixed_input_spatial, [None; 3]);
    // Per-stage features 8,16,32,64,80 show in the conv widths.
    let widths: Vec<usize> = g
        .nodes
        .iter()
        .filter_map(|n| {
            if let Op::Conv(c) = &n.op {
                Some(c.weight.shape[0])
            } else {
                None
            }
        })
        .collect();
    assert_eq!(&widths[..10], &[8, 8, 16, 16, 32, 32, 64, 64, 80, 80]);
    for n in &g.nodes {
        match &n.op {
            Op::InstanceNorm { eps, scale, .. } => {
                assert_eq!(*eps, 1e-5);
                assert!(
                    scale.data.iter().any(|&v| v != 1.0),
                    "norm weights were randomised"
                );
            }
            Op::LeakyRelu { alpha } => assert_eq!(*alpha, 0.01),
            _ => {}
        }
    }
    check_fixture_shapes(&g, "nnunet_small");
    g.validate().unwrap();
    // A window not divisible by 16 breaks a skip concat with a clear message.
    let e = g.infer_shapes(1, [40, 32, 32]).unwrap_err().to_string();
    assert!(e.contains("Concat") && e.contains("divisor"), "{e}");
    // flops: the first conv alone is 2 * 8*1*27 MACs per voxel.
    let f = g.flops(1, [32, 32, 32]).unwrap();
    assert!(f > 2 * 8 * 27 * 32 * 32 * 32, "{f}");
}

#[test]
fn monai_fixture() {
    let path = fixture("models/monai_unet_small.onnx");
    let g = load(&path).unwrap();
    let c = op_counts(&g);
    assert_eq!(c["Conv"], 15);
    assert_eq!(c["ConvTranspose"], 3);
    assert_eq!(c["InstanceNormalization"], 13);
    assert_eq!(c["PRelu"], 13);
    assert_eq!(c["Add"], 7);
    assert_eq!(c["Concat"], 3);
    assert!(
        !c.contains_key("Identity"),
        "Identity nodes are rewired away"
    );
    assert_eq!((g.input_channels(), g.output_channels()), (1, 3));
    assert_eq!(g.param_count(), used_float_params(&path));
    assert_eq!(g.spatial_divisor(), [8; 3]);
    for n in &g.nodes {
        if let Op::PRelu { slope } = &n.op {
            assert_eq!(
                slope.shape,
                vec![1],
                "the shared [1,1,1,1] slope becomes one scalar"
            );
        }
    }
    check_fixture_shapes(&g, "monai_unet_small");
    assert!(g.summary().contains("PRelu x13"));
}

#[test]
fn deepbrain_fixture() {
    let path = fixture("trained_deepbrain/deepbrain_trained.onnx");
    let g = load(&path).unwrap();
    let c = op_counts(&g);
    assert_eq!(
        (
            c["Conv"],
            c["ConvTranspose"],
            c["MaxPool"],
            c["Relu"],
            c["Concat"],
            c["Sigmoid"]
        ),
        (10, 3, 3, 9, 3, 1)
    );
    assert_eq!(g.output_activation(), OutputActivation::Sigmoid);
    assert_eq!(g.param_count(), used_float_params(&path));
    // README: D,H,W multiples of 8; TF SAME transposed convs with pads [0,0,0,1,1,1].
    assert_eq!(g.spatial_divisor(), [8; 3]);
    for n in &g.nodes {
        if let Op::ConvTranspose(ct) = &n.op {
            assert_eq!(ct.pads, [0, 0, 0, 1, 1, 1]);
            assert_eq!(ct.stride, [2; 3]);
        }
    }
    let s = g.infer_shapes(2, [128, 128, 128]).unwrap();
    assert_eq!(s[g.output], [2, 1, 128, 128, 128]);
    let s = g.infer_shapes(1, [64, 48, 80]).unwrap();
    assert_eq!(s[g.output], [1, 1, 64, 48, 80]);
    assert!(g.summary().contains("sigmoid"));
}

#[test]
fn meshnet_fixture_if_present() {
    let path = fixture("trained_meshnet/meshnet20_trained.onnx");
    if !path.exists() {
        eprintln!("skipping: {} absent", path.display());
        return;
    }
    let g = load(&path).unwrap();
    let c = op_counts(&g);
    assert_eq!((c["Conv"], c["Elu"]), (10, 9));
    let dil: Vec<usize> = g
        .nodes
        .iter()
        .filter_map(|n| {
            if let Op::Conv(c) = &n.op {
                Some(c.dilation[0])
            } else {
                None
            }
        })
        .collect();
    assert_eq!(dil, vec![1, 2, 4, 8, 16, 8, 4, 2, 1, 1]);
    // README: receptive-field radius 46 voxels → 2*46+1.
    assert_eq!(g.receptive_field(), [93; 3]);
    assert_eq!(g.spatial_divisor(), [1; 3]);
    assert_eq!(g.param_count(), used_float_params(&path));
    assert_eq!(
        g.infer_shapes(1, [37, 41, 50]).unwrap()[g.output],
        [1, 3, 37, 41, 50]
    );
}

// ---------------------------------------------------------------- hand-built models

fn model(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    cin: i64,
    outs: &[&str],
    opset: i64,
) -> proto::ModelProto {
    let input = vec![vi("x", &[None, Some(cin), None, None, None])];
    let output = outs.iter().map(|o| vi(o, &[None; 5])).collect();
    model_with("t", opset, nodes, inits, input, output)
}

fn lb(m: &proto::ModelProto) -> voxtile::Result<Graph> {
    load_bytes(&m.encode_to_vec(), None, Path::new("model.onnx"))
}

fn seq(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + 1.0) * k).sin()).collect()
}

fn conv_node(
    name: &str,
    x: &str,
    w: &str,
    b: Option<&str>,
    out: &str,
    attrs: Vec<(&str, Attr)>,
) -> proto::NodeProto {
    let mut ins = vec![x, w];
    if let Some(b) = b {
        ins.push(b);
    }
    node("Conv", name, &ins, &[out], attrs)
}

#[test]
fn external_data_roundtrip_and_short_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = seq(4 * 2 * 27, 0.3);
    let b = vec![0.5f32, -1.0, 2.0, 0.25];
    let mut bytes: Vec<u8> = vec![0; 16]; // a leading gap so offsets matter
    let w_off = bytes.len();
    bytes.extend(w.iter().flat_map(|v| v.to_le_bytes()));
    let b_off = bytes.len();
    bytes.extend(b.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.path().join("m.onnx.data"), &bytes).unwrap();
    let ext = |name: &str, dims: &[i64], off: usize, len: usize| proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        data_location: Some(proto::tensor_proto::DataLocation::External as i32),
        external_data: [
            ("location", "m.onnx.data".to_string()),
            ("offset", off.to_string()),
            ("length", len.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| proto::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v),
        })
        .collect(),
        ..Default::default()
    };
    let m = model(
        vec![conv_node(
            "c",
            "x",
            "w",
            Some("b"),
            "y",
            vec![("pads", Attr::Is(vec![1; 6]))],
        )],
        vec![
            ext("w", &[4, 2, 3, 3, 3], w_off, w.len() * 4),
            ext("b", &[4], b_off, 16),
        ],
        2,
        &["y"],
        17,
    );
    let p = dir.path().join("m.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    let g = load(&p).unwrap();
    let Op::Conv(c) = &g.nodes[0].op else {
        panic!("not a conv")
    };
    assert_eq!(c.weight.data, w);
    assert_eq!(c.bias.as_ref().unwrap().data, b);
    assert_eq!(c.pads, [1; 6]);
    assert_eq!(g.param_count(), w.len() + 4);
    // From memory without a folder: clear error.
    let e = lb(&m).unwrap_err().to_string();
    assert!(e.contains("\"w\"") && e.contains("external"), "{e}");
    // Truncated data file.
    std::fs::write(dir.path().join("m.onnx.data"), &bytes[..bytes.len() - 8]).unwrap();
    let e = load(&p).unwrap_err().to_string();
    assert!(
        e.contains("tensor \"b\"") && e.contains("holds only"),
        "{e}"
    );
    // Length disagreeing with dims.
    let m2 = model(
        vec![conv_node("c", "x", "w", None, "y", vec![])],
        vec![ext("w", &[4, 2, 3, 3, 3], 0, 12)],
        2,
        &["y"],
        17,
    );
    std::fs::write(&p, m2.encode_to_vec()).unwrap();
    let e = load(&p).unwrap_err().to_string();
    assert!(e.contains("\"w\"") && e.contains("disagrees"), "{e}");
    // Escaping the folder.
    let mut m3 = m.clone();
    m3.graph.as_mut().unwrap().initializer[0].external_data[0].value = Some("../secret".into());
    std::fs::write(&p, m3.encode_to_vec()).unwrap();
    assert!(load(&p)
        .unwrap_err()
        .to_string()
        .contains("inside the model's folder"));
}

/// BatchNorm folded into the conv: compare with an independent f64 computation.
#[test]
fn batchnorm_folds_into_conv() {
    let (cout, cin) = (3usize, 2usize);
    let w = seq(cout * cin * 8, 0.7);
    let b = vec![0.1f32, -0.2, 0.3];
    let (gamma, beta, mean, var) = (
        vec![1.5f32, -0.5, 2.0],
        vec![0.25f32, 0.0, -1.0],
        vec![0.3f32, -0.1, 1.0],
        vec![0.5f32, 2.0, 0.01],
    );
    let eps = 1e-3f32;
    let inits = vec![
        ftensor("w", &[3, 2, 2, 2, 2], w.clone()),
        ftensor("b", &[3], b.clone()),
        ftensor("g", &[3], gamma.clone()),
        ftensor("be", &[3], beta.clone()),
        ftensor("m", &[3], mean.clone()),
        ftensor("v", &[3], var.clone()),
    ];
    let m = model(
        vec![
            conv_node(
                "c",
                "x",
                "w",
                Some("b"),
                "y",
                vec![("strides", Attr::Is(vec![2, 2, 2]))],
            ),
            node(
                "BatchNormalization",
                "bn",
                &["y", "g", "be", "m", "v"],
                &["z"],
                vec![("epsilon", Attr::F(eps))],
            ),
            node("Relu", "r", &["z"], &["out"], vec![]),
        ],
        inits.clone(),
        2,
        &["out"],
        17,
    );
    let g = lb(&m).unwrap();
    assert_eq!(g.nodes.len(), 2, "{:?}", op_counts(&g));
    let Op::Conv(c) = &g.nodes[0].op else {
        panic!()
    };
    let per = cin * 8;
    for o in 0..cout {
        let s = gamma[o] as f64 / (var[o] as f64 + eps as f64).sqrt();
        for k in 0..per {
            let want = w[o * per + k] as f64 * s;
            assert!((c.weight.data[o * per + k] as f64 - want).abs() <= 1e-6 * want.abs().max(1.0));
        }
        let want_b = (b[o] as f64 - mean[o] as f64) * s + beta[o] as f64;
        assert!(
            (c.bias.as_ref().unwrap().data[o] as f64 - want_b).abs() < 1e-6,
            "{o}"
        );
    }
    assert_eq!(g.spatial_divisor(), [2; 3]);

    // The conv output also feeds an Add: no fold, a ChannelAffine instead.
    let m = model(
        vec![
            conv_node("c", "x", "w", Some("b"), "y", vec![]),
            node(
                "BatchNormalization",
                "bn",
                &["y", "g", "be", "m", "v"],
                &["z"],
                vec![("epsilon", Attr::F(eps))],
            ),
            node("Add", "a", &["z", "y"], &["out"], vec![]),
        ],
        inits,
        2,
        &["out"],
        17,
    );
    let g = lb(&m).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["Conv", "ChannelAffine", "Add"]);
    let Op::ChannelAffine { scale, shift } = &g.nodes[1].op else {
        panic!()
    };
    for o in 0..cout {
        let s = gamma[o] as f64 / (var[o] as f64 + eps as f64).sqrt();
        assert!((scale.data[o] as f64 - s).abs() < 1e-6 * s.abs().max(1.0));
        assert!((shift.data[o] as f64 - (beta[o] as f64 - mean[o] as f64 * s)).abs() < 1e-6);
    }
    let Op::Conv(c) = &g.nodes[0].op else {
        panic!()
    };
    assert_eq!(c.weight.data, w, "the conv is untouched");
}

/// PyTorch GroupNorm export (opset < 18): Reshape [0,G,-1] → InstanceNorm(1,0) → Reshape(Shape(x))
/// → Mul gamma → Add beta becomes one GroupNorm with gamma/beta.
#[test]
fn groupnorm_pattern() {
    let c = 4usize;
    let gamma = vec![1.5f32, 0.5, -1.0, 2.0];
    let beta = vec![0.1f32, 0.2, 0.3, 0.4];
    let m = model(
        vec![
            conv_node(
                "c",
                "x",
                "w",
                None,
                "y",
                vec![("pads", Attr::Is(vec![1; 6]))],
            ),
            node(
                "Constant",
                "k",
                &[],
                &["tgt"],
                vec![(
                    "value",
                    Attr::T(Box::new(itensor("", &[3], vec![0, 2, -1]))),
                )],
            ),
            node("Reshape", "r1", &["y", "tgt"], &["yr"], vec![]),
            node(
                "InstanceNormalization",
                "in",
                &["yr", "ones", "zeros"],
                &["yn"],
                vec![("epsilon", Attr::F(1e-5))],
            ),
            node("Shape", "sh", &["y"], &["ys"], vec![]),
            node("Reshape", "r2", &["yn", "ys"], &["yb"], vec![]),
            node("Mul", "mul", &["yb", "gamma"], &["ym"], vec![]),
            node("Add", "add", &["ym", "beta"], &["out"], vec![]),
        ],
        vec![
            ftensor("w", &[4, 1, 3, 3, 3], seq(108, 0.2)),
            ftensor("ones", &[2], vec![1.0; 2]),
            ftensor("zeros", &[2], vec![0.0; 2]),
            ftensor("gamma", &[4, 1, 1, 1], gamma.clone()),
            ftensor("beta", &[4, 1, 1, 1], beta.clone()),
        ],
        1,
        &["out"],
        17,
    );
    let g = lb(&m).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["Conv", "GroupNormalization"]);
    let Op::GroupNorm {
        groups,
        eps,
        scale,
        bias,
    } = &g.nodes[1].op
    else {
        panic!()
    };
    assert_eq!((*groups, *eps), (2, 1e-5));
    assert_eq!(scale.data, gamma);
    assert_eq!(bias.data, beta);
    assert_eq!(g.nodes[1].output, g.output);
    assert_eq!(g.values[g.output].name, "out");
    assert_eq!(g.param_count(), 108 + 2 * c);

    // The opset-18 GroupNormalization op with per-group scale/bias expands them per channel.
    let m = model(
        vec![node(
            "GroupNormalization",
            "gn",
            &["x", "s", "b"],
            &["out"],
            vec![("num_groups", Attr::I(2)), ("epsilon", Attr::F(1e-6))],
        )],
        vec![
            ftensor("s", &[2], vec![2.0, 3.0]),
            ftensor("b", &[2], vec![-1.0, 1.0]),
        ],
        4,
        &["out"],
        18,
    );
    let g = lb(&m).unwrap();
    let Op::GroupNorm {
        groups,
        scale,
        bias,
        ..
    } = &g.nodes[0].op
    else {
        panic!()
    };
    assert_eq!(*groups, 2);
    assert_eq!(scale.data, vec![2.0, 2.0, 3.0, 3.0]);
    assert_eq!(bias.data, vec![-1.0, -1.0, 1.0, 1.0]);
    // num_groups not dividing channels.
    let mut bad = m.clone();
    bad.graph.as_mut().unwrap().node[0].attribute[0].i = Some(3);
    let e = lb(&bad).unwrap_err().to_string();
    assert!(e.contains("\"gn\"") && e.contains("num_groups=3"), "{e}");
}

/// Resize whose sizes are computed from the skip's Shape (MONAI/nnU-Net style) becomes scales 2.
#[test]
fn resize_sizes_from_shape() {
    let nodes = vec![
        conv_node(
            "down",
            "x",
            "w",
            None,
            "d",
            vec![
                ("strides", Attr::Is(vec![2, 2, 2])),
                ("pads", Attr::Is(vec![1; 6])),
            ],
        ),
        node("Shape", "s1", &["d"], &["ds"], vec![]),
        node("Slice", "sl1", &["ds", "z0", "two"], &["nc"], vec![]),
        node("Shape", "s2", &["x"], &["xs"], vec![]),
        node(
            "Gather",
            "g",
            &["xs", "idx"],
            &["sp"],
            vec![("axis", Attr::I(0))],
        ),
        node(
            "Concat",
            "cat",
            &["nc", "sp"],
            &["sizes"],
            vec![("axis", Attr::I(0))],
        ),
        node(
            "Resize",
            "up",
            &["d", "", "", "sizes"],
            &["u"],
            vec![
                ("mode", Attr::S("linear")),
                ("coordinate_transformation_mode", Attr::S("align_corners")),
            ],
        ),
        node(
            "Concat",
            "skip",
            &["u", "x"],
            &["out"],
            vec![("axis", Attr::I(-4))],
        ),
    ];
    let inits = vec![
        ftensor("w", &[3, 3, 3, 3, 3], seq(243, 0.1)),
        itensor("z0", &[1], vec![0]),
        itensor("two", &[1], vec![2]),
        itensor("idx", &[3], vec![2, 3, 4]),
    ];
    let m = model(nodes.clone(), inits.clone(), 3, &["out"], 13);
    let g = lb(&m).unwrap();
    let Op::Resize(r) = &g.nodes[1].op else {
        panic!("{:?}", g.nodes[1].op)
    };
    assert_eq!(
        (r.mode, r.coord, r.nearest),
        (
            ResizeMode::Linear,
            CoordMode::AlignCorners,
            NearestMode::RoundPreferFloor
        )
    );
    assert_eq!((r.scales, r.sizes), ([2.0; 3], None));
    assert_eq!(g.output_channels(), 6);
    assert_eq!(
        g.infer_shapes(1, [8, 16, 24]).unwrap()[g.output],
        [1, 6, 8, 16, 24]
    );
    // Odd window: the upsampled map no longer matches the skip, and the error says why.
    let e = g.infer_shapes(1, [9, 16, 24]).unwrap_err().to_string();
    assert!(e.contains("\"skip\"") && e.contains("divisor"), "{e}");

    // Constant scales and Upsample of opset 9.
    let m = model(
        vec![node(
            "Resize",
            "r",
            &["x", "", "sc"],
            &["out"],
            vec![
                ("mode", Attr::S("nearest")),
                ("nearest_mode", Attr::S("floor")),
            ],
        )],
        vec![ftensor("sc", &[5], vec![1.0, 1.0, 2.0, 2.0, 1.0])],
        1,
        &["out"],
        13,
    );
    let g = lb(&m).unwrap();
    let Op::Resize(r) = &g.nodes[0].op else {
        panic!()
    };
    assert_eq!(
        (r.mode, r.coord, r.nearest, r.scales),
        (
            ResizeMode::Nearest,
            CoordMode::HalfPixel,
            NearestMode::Floor,
            [2.0, 2.0, 1.0]
        )
    );
    assert_eq!(
        g.infer_shapes(1, [3, 4, 5]).unwrap()[g.output],
        [1, 1, 6, 8, 5]
    );
    let m = model(
        vec![node("Upsample", "u", &["x", "sc"], &["out"], vec![])],
        vec![ftensor("sc", &[5], vec![1.0, 1.0, 2.0, 2.0, 2.0])],
        1,
        &["out"],
        9,
    );
    let Op::Resize(r) = &lb(&m).unwrap().nodes[0].op else {
        panic!()
    };
    assert_eq!(
        (r.coord, r.nearest, r.scales),
        (CoordMode::Asymmetric, NearestMode::Floor, [2.0; 3])
    );
    // Cubic is refused naming the node and the attribute.
    let m = model(
        vec![node(
            "Resize",
            "rc",
            &["x", "", "sc"],
            &["out"],
            vec![("mode", Attr::S("cubic"))],
        )],
        vec![ftensor("sc", &[5], vec![1.0, 1.0, 2.0, 2.0, 2.0])],
        1,
        &["out"],
        13,
    );
    let e = lb(&m).unwrap_err().to_string();
    assert!(
        e.contains("model.onnx: node \"rc\" (Resize): attribute mode=cubic"),
        "{e}"
    );
}

#[test]
fn constant_operands_and_identity() {
    let m = model(
        vec![
            node("Identity", "id", &["x"], &["xi"], vec![]),
            node("Sub", "s", &["xi", "c"], &["a"], vec![]),
            node("Div", "d", &["a", "two"], &["b"], vec![]),
            node("Sub", "rs", &["one", "b"], &["e"], vec![]),
            node(
                "Softmax",
                "sm",
                &["e"],
                &["out"],
                vec![("axis", Attr::I(-4))],
            ),
        ],
        vec![
            ftensor("c", &[3, 1, 1, 1], vec![1.0, 2.0, 3.0]),
            ftensor("two", &[], vec![2.0]),
            ftensor("one", &[1], vec![1.0]),
        ],
        3,
        &["out", "e"],
        13,
    );
    let g = lb(&m).unwrap();
    let ops: Vec<&Op> = g.nodes.iter().map(|n| &n.op).collect();
    assert_eq!(ops.len(), 5, "{ops:?}");
    match ops[0] {
        Op::AddConst(t) => assert_eq!(
            (t.shape.clone(), t.data.clone()),
            (vec![1, 3, 1, 1, 1], vec![-1.0, -2.0, -3.0])
        ),
        o => panic!("{o:?}"),
    }
    match ops[1] {
        Op::MulConst(t) => assert_eq!((t.shape.clone(), t.data.clone()), (vec![1; 5], vec![0.5])),
        o => panic!("{o:?}"),
    }
    assert!(matches!(ops[2], Op::MulConst(t) if t.data == vec![-1.0]));
    assert!(matches!(ops[3], Op::AddConst(t) if t.data == vec![1.0]));
    assert_eq!(ops[4], &Op::Softmax { axis: 1 });
    assert_eq!(g.output_activation(), OutputActivation::Softmax);
    assert_eq!(
        g.nodes[0].inputs,
        vec![g.input],
        "Identity rewired to the input"
    );
    assert_eq!(g.values[g.output].name, "out", "first of two outputs");
}

#[test]
fn conv_attributes() {
    let w = ftensor("w", &[4, 2, 3, 3, 3], seq(216, 0.1));
    let mk = |attrs: Vec<(&str, Attr)>, cin: i64| {
        model(
            vec![conv_node("Conv_12", "x", "w", None, "out", attrs)],
            vec![w.clone()],
            cin,
            &["out"],
            17,
        )
    };
    // SAME_UPPER with stride 2 and dilation 2: k_eff 5, total pad 3 → (1, 2).
    let g = lb(&mk(
        vec![
            ("auto_pad", Attr::S("SAME_UPPER")),
            ("strides", Attr::Is(vec![2, 1, 1])),
            ("dilations", Attr::Is(vec![2, 2, 2])),
            ("group", Attr::I(2)),
        ],
        4,
    ))
    .unwrap();
    let Op::Conv(c) = &g.nodes[0].op else {
        panic!()
    };
    assert_eq!(
        (c.pads, c.groups, c.dilation, c.stride),
        ([1, 2, 2, 2, 2, 2], 2, [2; 3], [2, 1, 1])
    );
    // ONNX SAME: output = ceil(in / stride).
    assert_eq!(
        g.infer_shapes(1, [10, 7, 7]).unwrap()[g.output],
        [1, 4, 5, 7, 7]
    );
    let g = lb(&mk(vec![("auto_pad", Attr::S("SAME_LOWER"))], 2)).unwrap();
    let Op::Conv(c) = &g.nodes[0].op else {
        panic!()
    };
    assert_eq!(c.pads, [1; 6]);
    // Errors naming node, op and attribute.
    let e = lb(&mk(vec![("group", Attr::I(3))], 8))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "model.onnx: node \"Conv_12\" (Conv): attribute group=3 does not divide input channels 8"
    );
    let e = lb(&mk(vec![("pads", Attr::Is(vec![1, 1, -1, 1, 1, 1]))], 2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"Conv_12\" (Conv): attribute pads=") && e.contains("negative"),
        "{e}"
    );
    let e = lb(&mk(vec![("strides", Attr::Is(vec![1, 0, 1]))], 2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("strides=[1, 0, 1] must be positive"), "{e}");
    let e = lb(&mk(vec![], 3)).unwrap_err().to_string();
    assert!(e.contains("does not fit 3 input channels"), "{e}");
    let e = lb(&mk(vec![("auto_pad", Attr::S("WEIRD"))], 2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto_pad=WEIRD"), "{e}");
    // 2D conv.
    let m = model(
        vec![conv_node("c2", "x", "w2", None, "out", vec![])],
        vec![ftensor("w2", &[4, 2, 3, 3], seq(72, 0.1))],
        2,
        &["out"],
        17,
    );
    assert!(lb(&m)
        .unwrap_err()
        .to_string()
        .contains("only 3D convolutions"));
    // Too small a window for an unpadded 3x3x3 conv.
    let g = lb(&mk(vec![], 2)).unwrap();
    let e = g.infer_shapes(1, [2, 8, 8]).unwrap_err().to_string();
    assert!(e.contains("too small"), "{e}");
}

#[test]
fn conv_transpose_and_pools() {
    let m = model(
        vec![
            node(
                "MaxPool",
                "mp",
                &["x"],
                &["p"],
                vec![
                    ("kernel_shape", Attr::Is(vec![3, 3, 3])),
                    ("strides", Attr::Is(vec![2, 2, 2])),
                    ("ceil_mode", Attr::I(1)),
                ],
            ),
            node(
                "ConvTranspose",
                "ct",
                &["p", "w", "b"],
                &["t"],
                vec![
                    ("strides", Attr::Is(vec![2, 2, 2])),
                    ("pads", Attr::Is(vec![0, 0, 0, 1, 1, 1])),
                    ("output_padding", Attr::Is(vec![1, 0, 0])),
                    ("group", Attr::I(2)),
                ],
            ),
            node(
                "AveragePool",
                "ap",
                &["t"],
                &["out"],
                vec![
                    ("kernel_shape", Attr::Is(vec![2, 2, 2])),
                    ("strides", Attr::Is(vec![1, 1, 1])),
                    ("pads", Attr::Is(vec![1, 1, 1, 0, 0, 0])),
                    ("count_include_pad", Attr::I(1)),
                ],
            ),
        ],
        vec![
            ftensor("w", &[4, 3, 3, 3, 3], seq(324, 0.05)),
            ftensor("b", &[6], vec![0.0; 6]),
        ],
        4,
        &["out"],
        17,
    );
    let g = lb(&m).unwrap();
    assert_eq!(g.output_channels(), 6);
    let s = g.infer_shapes(1, [10, 9, 8]).unwrap();
    // MaxPool ceil: D (10-3)/2 → ceil 3.5 = 4 +1 = 5; H (9-3)/2 = 3 +1 = 4; W (8-3)/2 → 3 +1 = 4 (ceil 2.5=3).
    let p = g.nodes[0].output;
    assert_eq!(s[p], [1, 4, 5, 4, 4]);
    // ConvTranspose: 2*(in-1) + op + 3 - 1.
    let t = g.nodes[1].output;
    assert_eq!(
        s[t],
        [1, 6, 2 * 4 + 1 + 3 - 1, 2 * 3 + 3 - 1, 2 * 3 + 3 - 1]
    );
    assert_eq!(s[g.output], s[t]);
    let Op::AveragePool(ap) = &g.nodes[2].op else {
        panic!()
    };
    assert!(ap.count_include_pad && !ap.ceil_mode);
    // output_shape is refused.
    let mut bad = m.clone();
    bad.graph.as_mut().unwrap().node[1]
        .attribute
        .push(proto::AttributeProto {
            name: Some("output_shape".into()),
            ints: vec![8, 8, 8],
            ..Default::default()
        });
    let e = lb(&bad).unwrap_err().to_string();
    assert!(
        e.contains("\"ct\" (ConvTranspose): attribute output_shape="),
        "{e}"
    );
    // Receptive field: pool k3 (rf 3, jump 2), transposed k3 s2 → ceil(3/2)=2 taps: +1*2 = 5,
    // jump 1; avg pool k2: +1 = 6.
    assert_eq!(g.receptive_field(), [6; 3]);
    assert_eq!(g.spatial_divisor(), [2; 3]);
}

#[test]
fn hostile_graphs() {
    let w = ftensor("w", &[2, 1, 1, 1, 1], vec![1.0, 2.0]);
    // Unsupported op.
    let m = model(
        vec![node("NonZero", "e1", &["x"], &["out"], vec![])],
        vec![],
        1,
        &["out"],
        17,
    );
    assert_eq!(
        lb(&m).unwrap_err().to_string(),
        "model.onnx: node \"e1\" (NonZero): operator NonZero is not supported by voxtile"
    );
    // Cycle.
    let m = model(
        vec![
            node("Add", "a", &["x", "b_out"], &["a_out"], vec![]),
            node("Relu", "b", &["a_out"], &["b_out"], vec![]),
            node("Relu", "o", &["a_out"], &["out"], vec![]),
        ],
        vec![],
        1,
        &["out"],
        17,
    );
    let e = lb(&m).unwrap_err().to_string();
    assert!(e.contains("cycle") && e.contains("\"a\""), "{e}");
    // Dangling input.
    let m = model(
        vec![node("Add", "a", &["x", "ghost"], &["out"], vec![])],
        vec![],
        1,
        &["out"],
        17,
    );
    let e = lb(&m).unwrap_err().to_string();
    assert!(
        e.contains("\"a\" (Add): input \"ghost\" is not produced"),
        "{e}"
    );
    // Initializer whose data disagrees with dims.
    let mut bad_w = w.clone();
    bad_w.dims = vec![3, 1, 1, 1, 1];
    let m = model(
        vec![conv_node("c", "x", "w", None, "out", vec![])],
        vec![bad_w],
        1,
        &["out"],
        17,
    );
    let e = lb(&m).unwrap_err().to_string();
    assert!(
        e.contains("tensor \"w\"") && e.contains("need 12 bytes"),
        "{e}"
    );
    // Absurd element count.
    let mut huge = w.clone();
    huge.dims = vec![1 << 16, 1 << 16, 1, 1, 1];
    let m = model(
        vec![conv_node("c", "x", "w", None, "out", vec![])],
        vec![huge],
        1,
        &["out"],
        17,
    );
    assert!(lb(&m).unwrap_err().to_string().contains("2^31"));
    // Channel mismatch between two activations (2 and 3: neither broadcasts).
    let m = model(
        vec![
            conv_node("c", "x", "w", None, "y", vec![]),
            conv_node("c3", "x", "w3", None, "z", vec![]),
            node("Add", "a", &["y", "z"], &["out"], vec![]),
        ],
        vec![w.clone(), ftensor("w3", &[3, 1, 1, 1, 1], vec![1.0; 3])],
        1,
        &["out"],
        17,
    );
    assert!(lb(&m)
        .unwrap_err()
        .to_string()
        .contains("operands have 2 and 3 channels"));
    // Non-float input, rank 4 input.
    let mut m = model(
        vec![node("Relu", "r", &["x"], &["out"], vec![])],
        vec![],
        1,
        &["out"],
        17,
    );
    let inp = &mut m.graph.as_mut().unwrap().input[0];
    if let Some(proto::type_proto::Value::TensorType(t)) =
        inp.r#type.as_mut().unwrap().value.as_mut()
    {
        t.elem_type = Some(7);
    }
    assert!(lb(&m).unwrap_err().to_string().contains("float32"));
    let mut m = model(
        vec![node("Relu", "r", &["x"], &["out"], vec![])],
        vec![],
        1,
        &["out"],
        17,
    );
    m.graph.as_mut().unwrap().input[0] = vi("x", &[None, Some(1), None, None]);
    assert!(lb(&m).unwrap_err().to_string().contains("rank 4"));
    // Output that is never computed; garbage bytes.
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![],
        1,
        &["nope"],
        17,
    );
    assert!(lb(&m)
        .unwrap_err()
        .to_string()
        .contains("\"nope\" is not computed"));
    assert!(
        load_bytes(b"\xff\xff\xff garbage", None, Path::new("m.onnx"))
            .unwrap_err()
            .to_string()
            .contains("not a valid ONNX")
    );
}

/// Random corruption of a real model must give errors or graphs, never panics.
#[test]
fn corrupted_bytes_do_not_panic() {
    let bytes = std::fs::read(fixture("trained_deepbrain/deepbrain_trained.onnx")).unwrap();
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for round in 0..150 {
        let mut b = bytes.clone();
        if round % 3 == 0 {
            b.truncate((next() % b.len() as u64) as usize);
        } else {
            for _ in 0..1 + round % 5 {
                let i = (next() % b.len() as u64) as usize;
                b[i] ^= 1 << (next() % 8);
            }
        }
        match load_bytes(&b, None, Path::new("fuzz.onnx")) {
            Ok(g) => {
                g.validate().unwrap();
                let _ = g.infer_shapes(1, [16, 16, 16]);
                let _ = (g.summary(), g.receptive_field());
            }
            Err(_) => errors += 1,
        }
    }
    assert!(errors > 0);
}

/// Semantic mutations of a real model (attributes, inputs, op types, dims): errors or valid
/// graphs, never panics; a graph that loads passes validate() and shape inference does not panic.
#[test]
fn mutated_graphs_do_not_panic() {
    let bytes = std::fs::read(fixture("models/monai_unet_small.onnx")).unwrap();
    let base = proto::ModelProto::decode(&bytes[..]).unwrap();
    let mut state = 0x9E3779B97F4A7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let values = [-3i64, -1, 0, 1, 2, 3, 7, 1 << 40, i64::MAX, i64::MIN];
    let ops = [
        "Conv",
        "ConvTranspose",
        "Concat",
        "Add",
        "Reshape",
        "Resize",
        "MaxPool",
        "Softmax",
        "Gather",
        "Slice",
        "Shape",
        "InstanceNormalization",
        "PRelu",
        "Identity",
    ];
    let (mut ok, mut err) = (0, 0);
    for _ in 0..300 {
        let mut m = base.clone();
        let g = m.graph.as_mut().unwrap();
        for _ in 0..1 + next() % 3 {
            let ni = (next() % g.node.len() as u64) as usize;
            let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).collect();
            let n = &mut g.node[ni];
            match next() % 5 {
                0 if !n.attribute.is_empty() => {
                    let ai = (next() % n.attribute.len() as u64) as usize;
                    let a = &mut n.attribute[ai];
                    for v in a.ints.iter_mut() {
                        *v = values[(next() % values.len() as u64) as usize];
                    }
                    if a.i.is_some() {
                        a.i = Some(values[(next() % values.len() as u64) as usize]);
                    }
                }
                1 if !n.input.is_empty() => {
                    let ii = (next() % n.input.len() as u64) as usize;
                    n.input[ii] = names[(next() % names.len() as u64) as usize].clone();
                }
                2 => n.op_type = Some(ops[(next() % ops.len() as u64) as usize].into()),
                3 if !n.input.is_empty() => {
                    n.input.pop();
                }
                _ => {
                    let ti = (next() % g.initializer.len() as u64) as usize;
                    let t = &mut g.initializer[ti];
                    if let Some(d) = t.dims.first_mut() {
                        *d = values[(next() % values.len() as u64) as usize];
                    }
                }
            }
        }
        match load_bytes(&m.encode_to_vec(), None, Path::new("mut.onnx")) {
            Ok(g) => {
                g.validate().unwrap();
                let _ = g.infer_shapes(1, [16, 16, 16]);
                let _ = g.flops(1, [16, 16, 16]);
                let _ = (g.summary(), g.receptive_field(), g.spatial_divisor());
                ok += 1;
            }
            Err(e) => {
                let s = e.to_string();
                assert!(s.starts_with("mut.onnx: "), "{s}");
                err += 1;
            }
        }
    }
    eprintln!("mutations: {ok} loaded, {err} rejected");
    assert!(err > 0);
}

/// Weights move into the IR when their last reader takes them (`take_cst`): a weight shared by
/// several convs, one of them through an Identity, and one a folded node read first, must still
/// reach every conv whole.
#[test]
fn shared_aliased_and_folded_weights_reach_every_conv() {
    let w = |name: &str, k: f32| ftensor(name, &[2, 2, 1, 1, 1], seq(4, k));
    let m = model(
        vec![
            node("Add", "fold", &["wf", "zero"], &["wf2"], vec![]),
            node("Identity", "id", &["ws"], &["ws_alias"], vec![]),
            conv_node("c1", "x", "ws", Some("b"), "y1", vec![]),
            conv_node("c2", "y1", "ws_alias", None, "y2", vec![]),
            conv_node("c3", "y2", "ws", None, "y3", vec![]),
            conv_node("c4", "y3", "wonce", Some("bonce"), "y4", vec![]),
            conv_node("c5", "y4", "wf", None, "y5", vec![]),
            conv_node("c6", "y5", "wf2", None, "out", vec![]),
        ],
        vec![
            w("ws", 0.3),
            w("wonce", 0.7),
            w("wf", 1.1),
            ftensor("zero", &[], vec![0.0]),
            ftensor("b", &[2], vec![0.5, -1.0]),
            ftensor("bonce", &[2], vec![2.0, 0.25]),
        ],
        2,
        &["out"],
        13,
    );
    let g = lb(&m).unwrap();
    let convs: Vec<(&[f32], Option<&[f32]>)> = g
        .nodes
        .iter()
        .map(|n| match &n.op {
            Op::Conv(c) => (&c.weight.data[..], c.bias.as_ref().map(|b| &b.data[..])),
            o => panic!("{o:?}"),
        })
        .collect();
    let (ws, wonce, wf) = (seq(4, 0.3), seq(4, 0.7), seq(4, 1.1));
    let (b, bonce) = ([0.5, -1.0], [2.0, 0.25]);
    let want: Vec<(&[f32], Option<&[f32]>)> = vec![
        (&ws, Some(&b)),
        (&ws, None),
        (&ws, None),
        (&wonce, Some(&bonce)),
        (&wf, None),
        (&wf, None),
    ];
    assert_eq!(convs, want);
}
