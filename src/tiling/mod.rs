//! Window grids (MONAI and nnU-Net placement), padding, weight maps and fp32 blending.
//!
//! The semantics are those of MONAI 1.6.1 `sliding_window_inference` (non-buffered path): the volume is
//! padded up to the roi where it is smaller (`diff // 2` before, the rest after), windows start on
//! `dense_patch_slices`' grid and are visited D-slowest / W-fastest, each window's output is multiplied by
//! the importance map and summed into fp32 accumulators, and the sum is divided by the summed weights
//! before the padding is cropped away. Bit-level agreement with MONAI needs windows added in grid order,
//! which is what the engine's loop does:
//!
//! ```ignore
//! let grid = Grid::new(shape, roi, overlap, Placement::Monai)?;
//! let mut blender = Blender::new(classes, &grid, weight_map(roi, BlendMode::Gaussian, [0.125; 3]));
//! for &start in &grid.starts {
//!     gather_window(vol.view(), &grid, start, PadMode::Constant(0.0), window.view_mut());
//!     let logits = backend.run(..)?;
//!     blender.add(start, logits.view());
//! }
//! let labels = argmax(blender.finish()?.view())?;
//! ```

mod blend;
mod grid;
mod parse;
mod partition;
mod weights;

pub use blend::{
    argmax, argmax_into, gather_window, nan_voxels, threshold, threshold_into, Blender, PadMode,
    Slab, SlabBlender,
};
pub use grid::{window_count, Grid, Placement, MAX_WINDOWS};
pub use parse::{
    parse_pad, parse_placement, parse_sigma_scale, parse_spacing, parse_triple_f64,
    parse_triple_usize, sigma_scale_ok,
};
pub use partition::{bands, partition, sub_grid, windows_run, Part};
pub use weights::{pass_weights, weight_map, weight_map_nnunet, BlendMode, NNUNET_VALUE_SCALING};
