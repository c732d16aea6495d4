//! voxtile's integration tests, one binary (as ripgrep's `tests/tests.rs`): one folder per part of
//! `src/`, the shared helpers in `common/`, and in `ops/` the op-case table both backends run
//! (CPU f32, CUDA fp16). Tests that need a process of their own are the other folders of `tests/`
//! (ARCHITECTURE.md, "Tests", says which and why). Filter by path: `cargo test --test it cpu::`.

mod cli;
mod common;
mod cpu;
mod cuda;
mod deps_used;
mod engine;
mod model;
mod ops;
mod pipeline;
mod plan;
mod postprocess;
mod tiling;
mod trust;
mod volume;
