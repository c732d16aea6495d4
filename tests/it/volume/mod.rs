//! Volumes (`src/volume`): NIfTI I/O, the other formats, orientation, and label maps that carry
//! their class names.

mod formats;
mod label_names;
mod nifti_io;
mod orientation;
