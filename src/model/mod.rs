//! Models: ONNX import ([`onnx`]) into a small graph IR ([`graph`]) that every backend executes.

pub mod graph;
pub mod onnx;

pub use graph::{Graph, Node, Op, Tensor, ValueId};
