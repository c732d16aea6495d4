//! Backends execute the graph IR on one batch of windows. The engine owns tiling and blending;
//! a backend only knows the graph and tensors.

pub mod cpu;
pub mod cuda;
pub mod memory;

use crate::model::Graph;
use crate::Result;
use ndarray::{Array5, ArrayView5};

/// A device that runs a prepared graph on NCDHW f32 batches.
pub trait Backend {
    /// Human-readable name for logs and reports ("cpu (2 threads)", "cuda:0 NVIDIA H200").
    fn name(&self) -> String;
    /// Compile the graph once for a window size and batch (weights re-laid, buffers planned).
    fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()>;
    /// Run one batch `[n <= batch, C_in, roi]` and return `[n, C_out, D', H', W']`.
    fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>>;
}
