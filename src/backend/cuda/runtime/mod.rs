//! The driver side of the CUDA backend: kernel compilation and loading, device buffers with the
//! allocation tracker, and launches on the backend's streams.

pub mod compile;
pub(crate) mod device;
pub(crate) mod launch;
pub mod tma;
