//! Extra outputs: probabilities as uint8 (a 4-D NIfTI the volume writer does not offer), one mask
//! file per class.

use crate::volume::Header;
use crate::{Error, Result};
use ndarray::{ArrayView3, ArrayView4};
use std::path::{Path, PathBuf};

/// Write probabilities (C, i, j, k) in [0,1] as uint8 `round(255·p)` with scl_slope 1/255, so that
/// NIfTI readers (nibabel, voxtile) see probabilities again; 4-D (x, y, z, channel) like
/// `write_f32`, with `like`'s geometry. A quarter of the float32 file.
pub fn write_probabilities_u8(path: &Path, p: ArrayView4<f32>, like: &Header) -> Result<()> {
    crate::volume::write_unit_u8(path, p, like)
}

/// round(255·p) with p clamped to [0, 1] (NaN reads as 0).
pub fn to_u8(p: f32) -> u8 {
    crate::volume::unit_to_u8(p)
}

/// The channels that get a file of their own: all but the background (0), or the single channel.
pub fn class_channels(channels: usize) -> Vec<usize> {
    if channels == 1 {
        vec![1]
    } else {
        (1..channels).collect()
    }
}

/// A file name for a class: the manifest's name made safe for file systems, else `class_N`.
pub fn class_file_name(channel: usize, classes: Option<&[String]>) -> String {
    let name = classes
        .and_then(|c| c.get(channel))
        .map(|n| {
            n.chars()
                .map(|ch| {
                    if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.' {
                        ch
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .filter(|n| !n.is_empty() && n.chars().any(|c| c != '.'));
    format!(
        "{}.nii.gz",
        name.unwrap_or_else(|| format!("class_{channel}"))
    )
}

/// Write `dir/<class>.nii.gz` = (labels == value of that class) as uint8 for each class channel;
/// `values[c]` is the label value channel c was written as (after remapping). Returns the paths.
pub fn write_split_classes(
    dir: &Path,
    labels: ArrayView3<u16>,
    values: &[u16],
    classes: Option<&[String]>,
    like: &Header,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    for c in class_channels(values.len().max(1)) {
        let value = values.get(c).copied().unwrap_or(c as u16);
        let path = dir.join(class_file_name(c, classes));
        let mask = labels.mapv(|l| (l == value) as u16);
        crate::volume::write_labels(&path, mask.view(), like)?;
        written.push(path);
    }
    Ok(written)
}
