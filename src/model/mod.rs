//! Models: ONNX import ([`onnx`]) into a small graph IR ([`graph`]) that every backend executes.
//!
//! [`ops`] defines each operation once (parameters, validation, output shape, cost), [`shape`]
//! walks a [`Graph`] with them (shapes per window, validation), [`analysis`] holds the static
//! analyses (receptive field, spatial divisor, FLOPs...), `decode` reads the ONNX graph, `lower`
//! turns it into IR ops and `eval` folds the exporters' constants and shape plumbing (`sym` holds
//! the symbolic shape values), [`inspect`] prints the summary and [`storage`] names the file's
//! float types.

pub mod analysis;
mod decode;
mod eval;
mod ew_fold;
pub mod graph;
pub mod inspect;
mod lower;
pub mod onnx;
pub mod ops;
pub(crate) mod passes;
pub mod shape;
pub mod storage;
mod sym;
pub mod tensor;

pub use graph::{Graph, Node, Op, Tensor, ValueId};
pub use onnx::{load, load_bytes};
pub use passes::{fuse_attention, MAX_BIAS_ELEMS};
