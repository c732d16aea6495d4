//! NIfTI-1/2 volumes: reading (any dtype, either byte order, gz), geometry, writing (temp + rename).

/// Placeholder until the reader lands.
pub struct Volume;
