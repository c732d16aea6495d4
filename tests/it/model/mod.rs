//! The model (`src/model`): ONNX import and lowering, the attention fusion, the architecture and
//! fixture models, fp16/bf16 files, and what `inspect` names.

mod archs;
mod attention;
mod batch_rewrite;
mod eltwise;
mod fixtures;
mod half;
mod inspect_all;
mod lower_tensor;
mod onnx_import;
