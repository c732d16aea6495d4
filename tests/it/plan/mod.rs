//! The memory planner (`src/plan`) on the CPU and, host only, on the CUDA model; the planner on a
//! real GPU is the separate binary `plan_gpu`.

mod attention;
mod concat_split;
mod halo_s2;
mod norm_head;
mod planner;
mod residual;
mod tensor;
mod tile_stats;
mod w1;
mod windowed;
