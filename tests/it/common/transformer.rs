//! Hand-built ONNX blocks in the shape of MONAI's transformer exports traced at batch 1: a
//! SwinUNETR shifted-window attention block and a UNETR token block (the batch-rewrite tests).
#![allow(dead_code)]

use super::onnx::*;
use super::rng::Rng;
use voxtile::internals::proto;

/// Side of the synthetic graphs' input; channels; window side (Swin).
pub const SIDE: i64 = 4;
pub const C: i64 = 4;
pub const WIN: i64 = 2;

pub fn model(nodes: Vec<proto::NodeProto>, inits: Vec<proto::TensorProto>) -> proto::ModelProto {
    let x = vi("x", &[Some(1), Some(C), Some(SIDE), Some(SIDE), Some(SIDE)]);
    model_with("t", 17, nodes, inits, vec![x], vec![vi("out", &[None; 5])])
}

pub fn scalar_i(name: &str, v: i64) -> proto::TensorProto {
    itensor(name, &[], vec![v])
}

/// A SwinUNETR block as MONAI's legacy export writes it at batch 1: tokens `[1, D, H, W, C]`
/// rolled along D (Slice + Concat), partitioned into 8 windows of 2³ (`[1·8, 8, C]`), LayerNorm,
/// qkv heads `[3, 1·8, 2, 8, 2]`, scores with a relative-position bias, then (`mask`) split to
/// `[1, 8, 2, 8, 8]` for the shifted-window mask and merged back, softmax, windows merged back,
/// a residual, and a 1x1x1 Conv to 3 classes.
pub fn swin_block(mask: bool, r: &mut Rng) -> proto::ModelProto {
    let nw = (SIDE / WIN).pow(3);
    let t = WIN.pow(3);
    let part = [1, 2, WIN, 2, WIN, 2, WIN, C];
    let mut nodes = vec![
        node(
            "Transpose",
            "tok",
            &["x"],
            &["t0"],
            vec![("perm", Attr::Is(vec![0, 2, 3, 4, 1]))],
        ),
        node(
            "Slice",
            "roll_a",
            &["t0", "one", "big", "ax1"],
            &["ra"],
            vec![],
        ),
        node(
            "Slice",
            "roll_b",
            &["t0", "zero", "one", "ax1"],
            &["rb"],
            vec![],
        ),
        node(
            "Concat",
            "roll",
            &["ra", "rb"],
            &["t1"],
            vec![("axis", Attr::I(1))],
        ),
        node("Reshape", "part", &["t1", "s_part"], &["p0"], vec![]),
        node(
            "Transpose",
            "part_t",
            &["p0"],
            &["p1"],
            vec![("perm", Attr::Is(vec![0, 1, 3, 5, 2, 4, 6, 7]))],
        ),
        node("Reshape", "win", &["p1", "s_win"], &["w0"], vec![]),
        node(
            "LayerNormalization",
            "ln",
            &["w0", "ln_s", "ln_b"],
            &["w1"],
            vec![("axis", Attr::I(-1))],
        ),
        node("MatMul", "qkv", &["w1", "w_qkv"], &["q0"], vec![]),
        node("Add", "qkv_b", &["q0", "b_qkv"], &["q1"], vec![]),
    ];
    nodes.extend(qkv_heads("q1"));
    nodes.extend(vec![
        node("Mul", "q_scale", &["q", "scale"], &["qs"], vec![]),
        node(
            "Transpose",
            "kt",
            &["k"],
            &["kt"],
            vec![("perm", Attr::Is(vec![0, 1, 3, 2]))],
        ),
        node("MatMul", "scores", &["qs", "kt"], &["s0"], vec![]),
        node("Add", "rel_bias", &["s0", "rel"], &["s1"], vec![]),
    ]);
    let last = if mask {
        nodes.extend([
            node("Reshape", "split", &["s1", "s_split"], &["s2"], vec![]),
            node("Add", "mask", &["s2", "mask"], &["s3"], vec![]),
            node("Reshape", "merge", &["s3", "s_merge"], &["s4"], vec![]),
        ]);
        "s4"
    } else {
        "s1"
    };
    nodes.extend(attend(last, "s_win"));
    nodes.extend([
        node("MatMul", "proj", &["o2", "w_p"], &["o3"], vec![]),
        node("Add", "proj_b", &["o3", "b_p"], &["o4"], vec![]),
        node("Reshape", "rev", &["o4", "s_part"], &["u0"], vec![]),
        node(
            "Transpose",
            "rev_t",
            &["u0"],
            &["u1"],
            vec![("perm", Attr::Is(vec![0, 1, 4, 2, 5, 3, 6, 7]))],
        ),
        node("Reshape", "untok", &["u1", "s_tok"], &["u2"], vec![]),
        node("Add", "residual", &["u2", "t1"], &["u3"], vec![]),
        node(
            "Transpose",
            "ncdhw",
            &["u3"],
            &["u4"],
            vec![("perm", Attr::Is(vec![0, 4, 1, 2, 3]))],
        ),
        node(
            "Conv",
            "head",
            &["u4", "w_c", "b_c"],
            &["out"],
            vec![("kernel_shape", Attr::Is(vec![1, 1, 1]))],
        ),
    ]);
    let (cu, tu, nwu) = (C as usize, t as usize, nw as usize);
    let mask_vals: Vec<f32> = (0..nwu * tu * tu)
        .map(|_| if r.below(3) == 0 { -100.0 } else { 0.0 })
        .collect();
    let inits = vec![
        itensor("one", &[1], vec![1]),
        itensor("zero", &[1], vec![0]),
        itensor("big", &[1], vec![i64::MAX]),
        itensor("ax1", &[1], vec![1]),
        itensor("s_part", &[8], part.to_vec()),
        itensor("s_win", &[3], vec![nw, t, C]),
        itensor("s_heads", &[5], vec![nw, t, 3, 2, C / 2]),
        itensor("s_split", &[5], vec![1, nw, 2, t, t]),
        itensor("s_merge", &[4], vec![nw, 2, t, t]),
        itensor("s_tok", &[5], vec![1, SIDE, SIDE, SIDE, C]),
        scalar_i("i0", 0),
        scalar_i("i1", 1),
        scalar_i("i2", 2),
        ftensor(
            "ln_s",
            &[C],
            r.scaled(cu, 0.5)
                .iter()
                .map(|v| v + 1.0)
                .collect::<Vec<_>>(),
        ),
        ftensor("ln_b", &[C], r.scaled(cu, 0.2)),
        ftensor("w_qkv", &[C, 3 * C], r.scaled(cu * 3 * cu, 0.5)),
        ftensor("b_qkv", &[3 * C], r.scaled(3 * cu, 0.1)),
        ftensor("scale", &[], [0.7f32]),
        ftensor("rel", &[1, 2, t, t], r.scaled(2 * tu * tu, 0.3)),
        ftensor("mask", &[1, nw, 1, t, t], mask_vals),
        ftensor("w_p", &[C, C], r.scaled(cu * cu, 0.5)),
        ftensor("b_p", &[C], r.scaled(cu, 0.1)),
        ftensor("w_c", &[3, C, 1, 1, 1], r.scaled(3 * cu, 0.5)),
        ftensor("b_c", &[3], r.scaled(3, 0.1)),
    ];
    model(nodes, inits)
}

/// A UNETR block at batch 1: a 2³ patch Conv to 8 features, flattened to tokens `[1, 8, 8]`
/// plus a position embedding, LayerNorm, qkv heads `[3, 1, 2, 8, 4]`, attention, heads merged
/// `[1, 8, 8]`, the tokens back to `[1, 8, 2, 2, 2]` and a ConvTranspose to 3 classes.
pub fn unetr_block(r: &mut Rng) -> proto::ModelProto {
    let (hid, l) = (8i64, 8i64);
    let mut nodes = vec![
        node(
            "Conv",
            "patch",
            &["x", "w_pe", "b_pe"],
            &["e0"],
            vec![
                ("kernel_shape", Attr::Is(vec![2, 2, 2])),
                ("strides", Attr::Is(vec![2, 2, 2])),
            ],
        ),
        node("Reshape", "flat", &["e0", "s_flat"], &["e1"], vec![]),
        node(
            "Transpose",
            "tokens",
            &["e1"],
            &["e2"],
            vec![("perm", Attr::Is(vec![0, 2, 1]))],
        ),
        node("Add", "pos", &["e2", "pos"], &["e3"], vec![]),
        node(
            "LayerNormalization",
            "ln",
            &["e3", "ln_s", "ln_b"],
            &["e4"],
            vec![("axis", Attr::I(-1))],
        ),
        node("MatMul", "qkv", &["e4", "w_qkv"], &["q0"], vec![]),
    ];
    nodes.extend(qkv_heads("q0"));
    nodes.extend(vec![
        node(
            "Transpose",
            "kt",
            &["k"],
            &["kt"],
            vec![("perm", Attr::Is(vec![0, 1, 3, 2]))],
        ),
        node("MatMul", "scores", &["q", "kt"], &["s0"], vec![]),
        node("Mul", "scaled", &["s0", "scale"], &["s1"], vec![]),
    ]);
    nodes.extend(attend("s1", "s_tok"));
    nodes.extend(vec![
        node("Add", "residual", &["o2", "e3"], &["o3"], vec![]),
        node("Reshape", "grid", &["o3", "s_grid"], &["g0"], vec![]),
        node(
            "Transpose",
            "grid_t",
            &["g0"],
            &["g1"],
            vec![("perm", Attr::Is(vec![0, 4, 1, 2, 3]))],
        ),
        node(
            "ConvTranspose",
            "up",
            &["g1", "w_up", "b_up"],
            &["out"],
            vec![
                ("kernel_shape", Attr::Is(vec![2, 2, 2])),
                ("strides", Attr::Is(vec![2, 2, 2])),
            ],
        ),
    ]);
    let (cu, hu, lu) = (C as usize, hid as usize, l as usize);
    let inits = vec![
        itensor("s_flat", &[3], vec![1, hid, l]),
        itensor("s_heads", &[5], vec![1, l, 3, 2, hid / 2]),
        itensor("s_tok", &[3], vec![1, l, hid]),
        itensor("s_grid", &[5], vec![1, 2, 2, 2, hid]),
        scalar_i("i0", 0),
        scalar_i("i1", 1),
        scalar_i("i2", 2),
        ftensor("w_pe", &[hid, C, 2, 2, 2], r.scaled(hu * cu * 8, 0.3)),
        ftensor("b_pe", &[hid], r.scaled(hu, 0.1)),
        ftensor("pos", &[1, l, hid], r.scaled(lu * hu, 0.2)),
        ftensor(
            "ln_s",
            &[hid],
            r.scaled(hu, 0.5)
                .iter()
                .map(|v| v + 1.0)
                .collect::<Vec<_>>(),
        ),
        ftensor("ln_b", &[hid], r.scaled(hu, 0.2)),
        ftensor("w_qkv", &[hid, 3 * hid], r.scaled(hu * 3 * hu, 0.5)),
        ftensor("scale", &[], [0.5f32]),
        ftensor("w_up", &[hid, 3, 2, 2, 2], r.scaled(hu * 3 * 8, 0.3)),
        ftensor("b_up", &[3], r.scaled(3, 0.1)),
    ];
    model(nodes, inits)
}

/// The qkv heads of both blocks: `src` reshaped by `s_heads` (its axis 2 is q / k / v), that axis
/// moved first, then q, k and v gathered from it (`i0`..`i2`).
fn qkv_heads(src: &str) -> Vec<proto::NodeProto> {
    let mut nodes = vec![
        node("Reshape", "heads", &[src, "s_heads"], &["h0"], vec![]),
        node(
            "Transpose",
            "heads_t",
            &["h0"],
            &["h1"],
            vec![("perm", Attr::Is(vec![2, 0, 3, 1, 4]))],
        ),
    ];
    for (i, out) in ["q", "k", "v"].into_iter().enumerate() {
        nodes.push(node(
            "Gather",
            &format!("g{out}"),
            &["h1", &format!("i{i}")],
            &[out],
            vec![("axis", Attr::I(0))],
        ));
    }
    nodes
}

/// Softmax over the last axis of `scores`, times v, heads merged back by `merge` into `o2`.
fn attend(scores: &str, merge: &str) -> Vec<proto::NodeProto> {
    vec![
        node(
            "Softmax",
            "softmax",
            &[scores],
            &["pr"],
            vec![("axis", Attr::I(-1))],
        ),
        node("MatMul", "av", &["pr", "v"], &["o0"], vec![]),
        node(
            "Transpose",
            "o_t",
            &["o0"],
            &["o1"],
            vec![("perm", Attr::Is(vec![0, 2, 1, 3]))],
        ),
        node("Reshape", "o_merge", &["o1", merge], &["o2"], vec![]),
    ]
}
