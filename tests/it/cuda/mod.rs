//! The CUDA backend (`src/backend/cuda`): kernel compilation (no GPU), the buffer plan (host only),
//! and on a GPU the op families, tensor ops, fused attention and the real fixtures. The streamed
//! pass is the separate binary `cuda_stream`. Skipped without a GPU unless VOXTILE_REQUIRE_GPU=1.

mod abi_mirrors;
mod attention;
mod fixtures;
mod host_layers;
mod kernels_compile;
mod norm_emulation;
mod norm_f32_plan;
mod norm_runs_emulation;
mod ops;
mod tensor;
mod walk_emulation;
mod wg_emulation;
mod wz_emulation;
