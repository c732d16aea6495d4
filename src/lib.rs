//! voxtile: segment large 3D medical volumes with a 3D CNN, window by window, in planned memory.
//!
//! The data flows one way: [`volume`] (NIfTI) → [`model`] (ONNX → graph IR) → [`tiling`] (windows,
//! weights, blending) → [`backend`] (CPU reference, CUDA) → [`engine`] (the loop) → [`cli`].

pub mod alloc;
pub mod backend;
pub mod cli;
pub mod engine;
pub mod error;
pub mod fsio;
pub mod gate;
pub mod model;
pub mod npy;
pub mod pipeline;
pub mod plan;
pub mod signals;
pub mod staged;
pub mod tiling;
pub mod volume;

pub use engine::{Engine, Options, Segmentation};
pub use error::{Error, Result};
pub use volume::Volume;
