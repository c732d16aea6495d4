//! The loop: plan windows, gather batches, run the backend, blend, finalise.

pub struct Engine;
pub struct Options;
pub struct Segmentation;
