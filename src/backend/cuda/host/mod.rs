//! Host-side planning of the CUDA backend: no driver type below this folder, so everything here
//! runs and is unit-tested on a machine without a GPU. `runtime`, `ops` and `stream` build on it.

pub mod attention_table;
pub mod buffers;
pub mod catalogue;
pub mod concat_split;
pub mod conv_kernel;
pub mod fusion;
pub mod launch;
pub mod options;
pub mod relayout;
pub mod select;
pub mod tensor_layout;
pub mod tile_stats;
pub mod units;
pub mod windowed;
