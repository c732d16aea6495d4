//! ONNX import: the fixture models, hand-built models (prost-encoded), and hostile inputs.

use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use voxtile::model::graph::{CoordMode, NearestMode, Op, OutputActivation, ResizeMode};
use voxtile::model::onnx::proto;
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

/// Sum of the float initializer sizes of an ONNX file plus float Constant-node tensors, decoded
/// independently of the importer (raw_data length / 4).
fn onnx_float_param_count(path: &Path) -> usize {
    let m = proto::ModelProto::decode(&std::fs::read(path).unwrap()[..]).unwrap();
    let g = m.graph.unwrap();
    let mut total = 0;
    for t in &g.initializer {
        if t.data_type() == 1 {
            total += t.dims.iter().product::<i64>() as usize;
        }
    }
    total
}

fn npy_shape(p: &Path) -> Vec<usize> {
    voxtile::npy::read_f32(p).unwrap().shape().to_vec()
}

#[test]
fn summaries() {
    for p in [
        "models/nnunet_small.onnx",
        "models/monai_unet_small.onnx",
        "trained_deepbrain/deepbrain_trained.onnx",
        "trained_meshnet/meshnet20_trained.onnx",
    ] {
        let path = fixture(p);
        if !path.exists() {
            continue;
        }
        let g = load(&path).unwrap();
        println!("{p}\n{}", g.summary());
        println!("{:?}", op_counts(&g));
    }
}
