//! The importer lowers the constructs of transformer nets (MONAI UNETR; token layouts, attention
//! heads, MLPs) to the IR's tensor ops, and the shapes it infers for them are ONNX's.

use crate::common::onnx::*;
use prost::Message;
use std::path::{Path, PathBuf};
use voxtile::internals::proto;
use voxtile::model::graph::Op;
use voxtile::model::{load, load_bytes, Graph};

fn arch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/archs")
        .join(name)
}

fn lb(m: &proto::ModelProto) -> voxtile::Result<Graph> {
    load_bytes(&m.encode_to_vec(), None, Path::new("model.onnx"))
}

/// Dims of the value named `name`.
fn dims_of(g: &Graph, shapes: &[voxtile::model::ops::Dims], name: &str) -> Vec<usize> {
    let v = g
        .values
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no value {name}"));
    shapes[v].as_slice().to_vec()
}

/// Dims that onnx.shape_inference gives for values of the UNETR legacy export (batch 1, 32^3;
/// a Linear's value carries the name of the Add folded into it).
const UNETR_LEGACY: [(&str, &[usize]); 10] = [
    ("/vit/patch_embedding/Add_output_0", &[1, 8, 24]),
    (
        "/vit/blocks.0/attn/input_rearrange/Reshape_output_0",
        &[1, 8, 3, 2, 12],
    ),
    (
        "/vit/blocks.0/attn/input_rearrange/Transpose_output_0",
        &[3, 1, 2, 8, 12],
    ),
    ("/vit/blocks.0/attn/Gather_1_output_0", &[1, 2, 8, 12]),
    // The scores (Einsum_output_0, [1,2,8,8]) live inside the fused attention.
    ("/vit/blocks.0/attn/Einsum_1_output_0", &[1, 2, 8, 12]),
    (
        "/vit/blocks.0/attn/out_rearrange/Reshape_output_0",
        &[1, 8, 24],
    ),
    ("/vit/blocks.0/attn/out_proj/Add_output_0", &[1, 8, 24]),
    ("/vit/blocks.11/mlp/linear1/Add_output_0", &[1, 8, 48]),
    (
        "/encoder3/blocks.0/blocks.0.1/Add_output_0",
        &[1, 16, 8, 8, 8],
    ),
    ("output", &[1, 3, 32, 32, 32]),
];

#[test]
fn unetr_exports_lower_and_infer() {
    for ex in ["legacy", "dynamo"] {
        let g = load(arch(&format!("unetr_{ex}.onnx"))).unwrap_or_else(|e| panic!("{ex}: {e}"));
        assert!(g.has_tensor_ops());
        let count = |f: fn(&Op) -> bool| g.nodes.iter().filter(|n| f(&n.op)).count();
        assert_eq!(count(|o| matches!(o, Op::LayerNorm(_))), 25, "{ex}");
        // The two Einsums and the Softmax of each block are one fused attention.
        assert_eq!(count(|o| matches!(o, Op::MatMul)), 0, "{ex}");
        assert_eq!(
            count(|o| matches!(o, Op::Attention(_))),
            12,
            "{ex}: one per attention block"
        );
        // Every projection and MLP layer is a Linear, the bias folded in (qkv has none).
        assert_eq!(count(|o| matches!(o, Op::Linear(_))), 48, "{ex}");
        assert_eq!(
            count(|o| matches!(o, Op::Linear(l) if l.bias.is_some())),
            36,
            "{ex}"
        );
        assert_eq!(
            count(|o| matches!(o, Op::AddConst(_))),
            1,
            "{ex}: the position embedding"
        );
        let shapes = g.infer_shapes(1, [32, 32, 32]).unwrap();
        assert_eq!(shapes[g.output].as_slice(), &[1, 3, 32, 32, 32], "{ex}");
        assert_eq!(
            g.max_batch([32, 32, 32]),
            usize::MAX,
            "{ex}: the import frees the batch the export baked in"
        );
        if ex == "legacy" {
            for (name, want) in UNETR_LEGACY {
                assert_eq!(dims_of(&g, &shapes, name), want.to_vec(), "{name}");
            }
        }
    }
}

fn fixed_input(c: i64) -> Vec<proto::ValueInfoProto> {
    vec![vi("x", &[Some(1), Some(c), Some(2), Some(3), Some(4)])]
}

fn model17(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    c: i64,
) -> proto::ModelProto {
    model_with(
        "t",
        17,
        nodes,
        inits,
        fixed_input(c),
        vec![vi("out", &[None; 5])],
    )
}

#[test]
fn einsum_attention_lowers_to_matmuls() {
    // x [1,2,2,3,4] -> q [1,2,6,4]; s = q·qᵀ [1,2,6,6]; o = σ(s)·q [1,2,6,4] -> [1,2,2,3,4]
    // (a Sigmoid, not a Softmax, so the attention pass leaves the MatMuls to be seen).
    let m = model17(
        vec![
            node("Reshape", "r", &["x", "s1"], &["q"], vec![]),
            node(
                "Einsum",
                "e1",
                &["q", "q"],
                &["s"],
                vec![("equation", Attr::S("bhxd,bhyd->bhxy"))],
            ),
            node("Sigmoid", "sm", &["s"], &["p"], vec![]),
            node(
                "Einsum",
                "e2",
                &["p", "q"],
                &["o"],
                vec![("equation", Attr::S("bhxy,bhyd->bhxd"))],
            ),
            node("Reshape", "r2", &["o", "s2"], &["out"], vec![]),
        ],
        vec![
            itensor("s1", &[4], vec![1, 2, 6, 4]),
            itensor("s2", &[5], vec![1, 2, 2, 3, 4]),
        ],
        2,
    );
    let g = lb(&m).unwrap();
    let ops: Vec<&Op> = g.nodes.iter().map(|n| &n.op).collect();
    assert_eq!(ops.len(), 6, "{ops:?}");
    // The batch entry of each target is inferred: the import frees the batch the export fixed.
    assert!(matches!(ops[0], Op::Reshape { target } if target == &[-1, 2, 6, 4]));
    assert!(
        matches!(ops[1], Op::Transpose { perm } if perm == &[0, 1, 3, 2]),
        "{ops:?}"
    );
    assert_eq!(ops[2], &Op::MatMul);
    assert_eq!(ops[3], &Op::Sigmoid);
    assert_eq!(ops[4], &Op::MatMul);
    assert!(matches!(ops[5], Op::Reshape { target } if target == &[-1, 2, 2, 3, 4]));
    let shapes = g.infer_shapes(1, [2, 3, 4]).unwrap();
    assert_eq!(dims_of(&g, &shapes, "s"), vec![1, 2, 6, 6]);
    assert_eq!(dims_of(&g, &shapes, "o"), vec![1, 2, 6, 4]);
    assert_eq!(shapes[g.output].as_slice(), &[1, 2, 2, 3, 4]);
}

#[test]
fn einsum_outside_the_matmul_rule_is_reported() {
    let m = model17(
        vec![
            node("Reshape", "r", &["x", "s1"], &["q"], vec![]),
            node(
                "Einsum",
                "e1",
                &["q", "q"],
                &["s"],
                vec![("equation", Attr::S("bhxd,bhxd->bh"))],
            ),
            node("Reshape", "r2", &["s", "s2"], &["out"], vec![]),
        ],
        vec![
            itensor("s1", &[4], vec![1, 2, 6, 4]),
            itensor("s2", &[5], vec![1, 2, 1, 1, 1]),
        ],
        2,
    );
    let e = lb(&m).unwrap_err().to_string();
    assert!(
        e.contains("\"e1\" (Einsum)") && e.contains("not a batched matrix product"),
        "{e}"
    );
}

#[test]
fn matmul_add_becomes_linear_with_bias() {
    // tokens [1, 24, 4] -> Linear 4->3 (+ bias) -> [1, 3, 2, 3, 4], with a position embedding.
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
    let m = model17(
        vec![
            node("Reshape", "f", &["x", "sf"], &["t0"], vec![]),
            node(
                "Transpose",
                "t",
                &["t0"],
                &["t1"],
                vec![("perm", Attr::Is(vec![0, 2, 1]))],
            ),
            node("Add", "pos", &["t1", "pe"], &["t2"], vec![]),
            node("MatMul", "mm", &["t2", "w"], &["t3"], vec![]),
            node("Add", "bias", &["t3", "b"], &["t4"], vec![]),
            node("Sub", "sub", &["t4", "b"], &["t5"], vec![]),
            node(
                "Transpose",
                "t2",
                &["t5"],
                &["t6"],
                vec![("perm", Attr::Is(vec![0, 2, 1]))],
            ),
            node("Unsqueeze", "u", &["t6", "ax"], &["t7"], vec![]),
            node("Reshape", "r", &["t7", "s"], &["t8"], vec![]),
            node("Slice", "sl", &["t8", "st", "en", "axs"], &["out"], vec![]),
        ],
        vec![
            ftensor("w", &[4, 3], w.clone()),
            ftensor("b", &[3], vec![1.0, 2.0, 3.0]),
            ftensor("pe", &[1, 24, 4], vec![0.5; 96]),
            itensor("ax", &[1], vec![0]),
            itensor("sf", &[3], vec![1, 4, -1]),
            itensor("s", &[5], vec![1, 3, 2, 3, 4]),
            itensor("st", &[2], vec![0, 1]),
            itensor("en", &[2], vec![i64::MAX, 3]),
            itensor("axs", &[2], vec![1, 3]),
        ],
        4,
    );
    let g = lb(&m).unwrap();
    let lin: Vec<_> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Linear(l) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(lin.len(), 1);
    assert_eq!(lin[0].weight.shape, vec![4, 3]);
    assert_eq!(lin[0].weight.data, w);
    assert_eq!(
        lin[0].bias.as_ref().map(|b| b.data.clone()),
        Some(vec![1.0, 2.0, 3.0])
    );
    let consts: Vec<Vec<usize>> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::AddConst(t) => Some(t.shape.clone()),
            _ => None,
        })
        .collect();
    // The position embedding and the Sub (not foldable: its input has the bias already).
    assert_eq!(consts, vec![vec![1, 24, 4], vec![1, 1, 3]]);
    // Slice along H only (axis 1 kept whole); Unsqueeze + Reshape lower to Reshapes.
    let slices: Vec<_> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Slice(_)))
        .collect();
    assert_eq!(slices.len(), 1);
    let shapes = g.infer_shapes(1, [2, 3, 4]).unwrap();
    assert_eq!(dims_of(&g, &shapes, "t1"), vec![1, 24, 4]);
    assert_eq!(dims_of(&g, &shapes, "t7"), vec![1, 1, 3, 24]);
    assert_eq!(shapes[g.output].as_slice(), &[1, 3, 2, 2, 4]);
}

#[test]
fn gather_and_gemm_on_tokens() {
    // [1, 2, 2, 3, 4] -> Gather index 1 on axis 1 -> [1, 2, 3, 4] -> Gemm needs rank 2: flatten.
    let m = model17(
        vec![
            node(
                "Gather",
                "g",
                &["x", "i"],
                &["a"],
                vec![("axis", Attr::I(1))],
            ),
            node("Flatten", "f", &["a"], &["b"], vec![("axis", Attr::I(3))]),
            node(
                "Gemm",
                "gm",
                &["b", "w", "c"],
                &["d"],
                vec![("transB", Attr::I(1))],
            ),
            node("Reshape", "r", &["d", "s"], &["out"], vec![]),
        ],
        vec![
            itensor("i", &[], vec![1]),
            ftensor("w", &[2, 4], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
            ftensor("c", &[2], vec![0.5, -0.5]),
            itensor("s", &[5], vec![1, 2, 2, 3, 1]),
        ],
        2,
    );
    let g = lb(&m).unwrap();
    assert!(
        matches!(g.nodes[0].op, Op::Gather { axis: 1, index: 1 }),
        "{:?}",
        g.nodes[0].op
    );
    let l = g
        .nodes
        .iter()
        .find_map(|n| match &n.op {
            Op::Linear(l) => Some(l),
            _ => None,
        })
        .unwrap();
    // transB: the [N, K] constant is stored [K, N].
    assert_eq!(l.weight.shape, vec![4, 2]);
    assert_eq!(l.weight.data, vec![1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0]);
    let shapes = g.infer_shapes(1, [2, 3, 4]).unwrap();
    assert_eq!(dims_of(&g, &shapes, "b"), vec![6, 4]);
    assert_eq!(shapes[g.output].as_slice(), &[1, 2, 2, 3, 1]);
}
