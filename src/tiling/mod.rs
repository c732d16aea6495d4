//! Window grids (MONAI and nnU-Net placement), padding, weight maps and fp32 blending.
