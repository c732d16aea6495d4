//! voxtile: segment large 3D medical volumes with a 3D CNN, window by window, in planned memory.
//!
//! The data flows one way: [`volume`] (NIfTI, NRRD, MetaImage, DICOM) → [`model`] (ONNX → graph
//! IR) → [`tiling`] (windows, weights, blending) → [`backend`] (CPU reference, CUDA) →
//! [`engine`] (the loop). [`plan`] answers "which window and batch fit this memory" before
//! anything is allocated, and [`pipeline`] adds a model's manifest (resampling, intensity,
//! test-time mirroring, label values) around the engine.
//!
//! Two doors:
//! - [`Pipeline::from_model`]: a model with its manifest, run as `voxtile segment` runs it (the
//!   command line goes through the same [`pipeline::ModelSetup`]);
//! - [`Engine`]: one model on an array or a volume as it is, for callers that do their own
//!   preprocessing.
//!
//! Runs can be stopped from another thread ([`CancelToken`]); the errors a caller may handle
//! are typed variants of [`Error`] (channel mismatch, budget too small, unsupported operators,
//! cancelled).
//!
//! # Examples
//!
//! Segment a file and write the label map on the input's grid:
//!
//! ```no_run
//! use voxtile::Pipeline;
//!
//! fn main() -> voxtile::Result<()> {
//!     // net.toml beside net.onnx, when there is one, gives the window, normalisation, classes...
//!     let mut pipeline = Pipeline::from_model("net.onnx")?;
//!     let volume = voxtile::volume::read("ct.nii.gz")?;
//!     let out = pipeline.run(&volume, &mut |_, _| {})?;
//!     voxtile::volume::write_labels("seg.nii.gz", out.labels.view(), &out.header)?;
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

pub mod backend;
#[allow(missing_docs)] // reached only through `internals`
mod cli;
pub mod engine;
pub mod error;
mod gate;
pub mod model;
#[allow(missing_docs)] // reached only through `internals`
mod npy;
pub mod pipeline;
pub mod plan;
pub mod postprocess;
pub mod staged;
pub mod sys;
pub mod tiling;
pub mod volume;

pub use backend::DeviceVolume;
pub use engine::{Engine, Options, Segmentation};
pub use error::{Error, Result};
pub use pipeline::Pipeline;
pub use sys::cancel::CancelToken;
pub use volume::Volume;

/// The README's code blocks, compiled as doctests so that its library snippet stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Unstable internals for the crate's own binary, tests, benches and fuzz targets: the backends'
/// kernels and planners, the ONNX protobuf types, `.npy` I/O, the CLI and its process setup.
/// Not part of the API: no stability promise, and no documentation beyond the code's own.
#[doc(hidden)]
pub mod internals {
    /// The float32 CPU backend.
    pub mod cpu {
        pub use crate::backend::cpu::*;
    }
    /// The CUDA backend's layers.
    pub mod cuda {
        pub use crate::backend::cuda::*;
    }
    /// The generated ONNX protobuf types (test model builders, fuzz targets).
    pub mod proto {
        pub use crate::model::onnx::proto::*;
    }
    /// `.npy` float32 arrays (reference outputs, benches).
    pub mod npy {
        pub use crate::npy::*;
    }
    /// The command line (`src/main.rs`).
    pub mod cli {
        /// `segment` and `plan` for a caller in the same process (the Python package).
        pub use crate::cli::embed;
        pub use crate::cli::run;
        /// Batch planning: input lists, shards, case names, device lists.
        pub use crate::cli::segment::dataset;
    }
    /// Temp-file cleanup on SIGINT/SIGTERM/SIGHUP (`src/main.rs`).
    pub mod signals {
        pub use crate::sys::signals::install;
    }
    /// Process setup (`src/main.rs`).
    pub use crate::sys::alloc::init_thread_pool;
}
