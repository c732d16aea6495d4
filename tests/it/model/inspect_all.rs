//! `voxtile inspect` (and every load) names every unsupported construct of a model at once, so a
//! user knows the whole distance before exporting again.

use crate::common::onnx::*;
use prost::Message;
use std::path::Path;
use std::process::Command;

/// input -> Conv -> Hardmax -> Conv -> LpNormalization, with a TopK branch joined by Add: three
/// operators voxtile does not lower, one of them downstream of another.
fn three_unsupported() -> Vec<u8> {
    let w = |name: &str| ftensor(name, &[2, 2, 1, 1, 1], [1.0, 0.0, 0.0, 1.0]);
    let nodes = vec![
        node("Conv", "conv_a", &["x", "wa"], &["a"], vec![]),
        node("Hardmax", "hm", &["a"], &["b"], vec![("axis", Attr::I(1))]),
        node("Conv", "conv_b", &["b", "wb"], &["c"], vec![]),
        node("LpNormalization", "lpn", &["c"], &["d"], vec![]),
        node("Shrink", "shrink", &["a"], &["e"], vec![]),
        node("Add", "join", &["d", "e"], &["y"], vec![]),
    ];
    model_with(
        "three",
        17,
        nodes,
        vec![w("wa"), w("wb")],
        vec![vi_ncdhw("x", Some(2))],
        vec![vi_ncdhw("y", Some(2))],
    )
    .encode_to_vec()
}

#[test]
fn load_names_every_unsupported_operator() {
    let e = voxtile::model::load_bytes(&three_unsupported(), None, Path::new("three.onnx"))
        .unwrap_err()
        .to_string();
    for (node, op) in [
        ("hm", "Hardmax"),
        ("lpn", "LpNormalization"),
        ("shrink", "Shrink"),
    ] {
        assert!(
            e.contains(&format!("node \"{node}\" ({op})")),
            "{op} missing from: {e}"
        );
    }
    assert!(e.contains("3 constructs"), "{e}");
    // Supported nodes downstream of an unsupported one are not blamed.
    assert!(!e.contains("conv_b") && !e.contains("join"), "{e}");
}

#[test]
fn inspect_prints_all_three_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("three.onnx");
    std::fs::write(&p, three_unsupported()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_voxtile"))
        .args(["inspect", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for op in ["Hardmax", "LpNormalization", "Shrink"] {
        assert!(err.contains(op), "{op} missing from: {err}");
    }
    assert!(err.contains("three.onnx"), "{err}");
}
