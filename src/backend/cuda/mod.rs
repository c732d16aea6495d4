//! The CUDA backend: fp16 kernels of our own (kernels/*.cu) compiled with NVRTC.

pub mod kernels;
