//! Tiling (`src/tiling`): grids, weights and blending against MONAI and nnU-Net.

mod monai;
mod sliding_window;
