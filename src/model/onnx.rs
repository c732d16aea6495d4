//! ONNX import: [`load`] reads a `.onnx` file (and its external-data files next to it),
//! [`load_bytes`] does the same from memory. The work is done in three stages, each its own
//! module: `decode` (protobuf, tensors, the graph's node order and value bindings), `lower`
//! (per-op lowering, with `eval` folding constants and shape plumbing, then the graph passes) and
//! the graph's own validation.

use super::graph::Graph;
pub use super::storage::Storage;
use crate::{Error, Result};
use prost::Message;
use std::path::Path;

pub(crate) use super::decode::proto;
pub use super::decode::MAX_ELEMENTS;
pub use crate::sys::fsio::MODEL_CAP;

/// Load an ONNX model file (external data is resolved relative to its folder) into the IR. The
/// file must be a regular file of at most [`MODEL_CAP`] bytes.
pub fn load(path: impl AsRef<Path>) -> Result<Graph> {
    load_with_storage(path).map(|(g, _)| g)
}

/// [`load`], with the float types the file stores its weights and I/O in (`voxtile inspect`).
pub fn load_with_storage(path: impl AsRef<Path>) -> Result<(Graph, Storage)> {
    let path = path.as_ref();
    let bytes = bytes::Bytes::from(crate::sys::fsio::read_regular(path, MODEL_CAP)?);
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    decode(bytes, dir, path)
}

/// Load a model from memory. `dir` is where external-data files live (None: external data is an
/// error); `path_for_errors` only prefixes messages.
pub fn load_bytes(bytes: &[u8], dir: Option<&Path>, path_for_errors: &Path) -> Result<Graph> {
    let bytes = bytes::Bytes::copy_from_slice(bytes);
    decode(bytes, dir, path_for_errors).map(|(g, _)| g)
}

/// Decodes the protobuf from `bytes` (tensor payloads stay views into it: see build.rs).
fn decode(
    bytes: bytes::Bytes,
    dir: Option<&Path>,
    path_for_errors: &Path,
) -> Result<(Graph, Storage)> {
    let model = proto::ModelProto::decode(bytes)
        .map_err(|e| Error::model(path_for_errors, format!("not a valid ONNX protobuf: {e}")))?;
    let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    if nodes > MAX_NODES {
        return Err(Error::model(
            path_for_errors,
            format!("{nodes} nodes is more than the {MAX_NODES} a segmentation network needs; refusing a graph this large"),
        ));
    }
    let storage = Storage::of(model.graph.as_ref().unwrap_or(&Default::default()));
    Ok((super::lower::lower(&model, dir, path_for_errors)?, storage))
}

/// Most nodes a model may have. Exported 3D segmentation networks have a few thousand (a
/// SwinUNETR some ten thousand); the bound keeps a hostile 10 MB file of tiny nodes within the
/// time and memory of any real model.
pub const MAX_NODES: usize = 100_000;
