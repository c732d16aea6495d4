//! ONNX protobuf decoding (prost + the vendored schema subset) and lowering to the graph IR.

#[allow(clippy::all, dead_code)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
