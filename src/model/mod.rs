//! Models: ONNX import ([`onnx`]) into a small graph IR ([`graph`]) that every backend executes.
//!
//! [`lower`](self) folds the exporters' shape plumbing ([`sym`] holds the symbolic shape values),
//! [`shape`] implements the analyses on [`Graph`] (shapes per window, receptive field...) and
//! [`inspect`] the human summary.

pub mod graph;
pub mod inspect;
mod lower;
pub mod onnx;
pub mod shape;
mod sym;

pub use graph::{Graph, Node, Op, Tensor, ValueId};
pub use onnx::{load, load_bytes};
