//! The CPU backend (`src/backend/cpu`): its kernels against float64 references (the convolution,
//! pools, resize, tensor ops of any rank), its executor (liveness, in place) and timings.

mod conv;
mod ops;
mod tensor;
