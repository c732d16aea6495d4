//! Extra outputs: probabilities as uint8 (a 4-D NIfTI the volume writer does not offer), one mask
//! file per class.

use crate::staged::Outputs;
use crate::volume::Header;
use crate::{Error, Result};
use ndarray::{ArrayView3, ArrayView4};
use std::path::{Path, PathBuf};

/// Write probabilities (C, i, j, k) in \[0, 1\] as uint8 `round(255·p)` with scl_slope 1/255, so that
/// NIfTI readers (nibabel, voxtile) see probabilities again; 4-D (x, y, z, channel) like
/// `write_f32`, with `like`'s geometry. A quarter of the float32 file.
pub fn write_probabilities_u8(path: &Path, p: ArrayView4<f32>, like: &Header) -> Result<()> {
    crate::volume::write_unit_u8(path, p, like)
}

/// [`write_probabilities_u8`], staged for the caller to commit.
pub fn stage_probabilities_u8(
    path: &Path,
    p: ArrayView4<f32>,
    like: &Header,
) -> Result<crate::staged::Staged> {
    crate::volume::stage_unit_u8(path, p, like)
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

/// A class name made safe as a file name: letters, digits, `-`, `_`, `.` kept, the rest `_`;
/// None when nothing usable is left.
fn safe_name(name: &str) -> Option<String> {
    let n: String = name
        .chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.' {
                ch
            } else {
                '_'
            }
        })
        .collect();
    (!n.is_empty() && n.chars().any(|c| c != '.')).then_some(n)
}

/// The mask file name of each class channel: the manifest's name made safe for file systems,
/// else `class_N`. Names that collide (`liver` twice, `a/b` and `a_b`, an empty name and a real
/// `class_2`) are made unique with the channel number: `liver_1`, `liver_2`.
pub fn class_file_names(channels: &[usize], classes: Option<&[String]>) -> Result<Vec<String>> {
    let base: Vec<String> = channels
        .iter()
        .map(|&c| {
            classes
                .and_then(|n| n.get(c))
                .and_then(|n| safe_name(n))
                .unwrap_or_else(|| format!("class_{c}"))
        })
        .collect();
    let count = |n: &str| base.iter().filter(|b| b.eq_ignore_ascii_case(n)).count();
    let names: Vec<String> = base
        .iter()
        .zip(channels)
        .map(|(b, c)| {
            if count(b) > 1 {
                format!("{b}_{c}.nii.gz")
            } else {
                format!("{b}.nii.gz")
            }
        })
        .collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].iter().any(|m| m.eq_ignore_ascii_case(n)) {
            return Err(Error::Invalid(format!(
                "--split-classes: two classes would both be written to {n}; rename one in the manifest's classes"
            )));
        }
    }
    Ok(names)
}

/// The `--split-classes` mask files of a model of `channels` output channels: (channel, file
/// name) for each class channel ([`class_channels`], named by [`class_file_names`]). The one
/// naming rule, used by the writer and by the output gate that claims the masks before any work.
pub fn class_files(channels: usize, classes: Option<&[String]>) -> Result<Vec<(usize, String)>> {
    let channels = class_channels(channels.max(1));
    let names = class_file_names(&channels, classes)?;
    Ok(channels.into_iter().zip(names).collect())
}

/// Stage `dir/<class>.nii.gz` = (labels == value of that class) as uint8 for each class channel
/// into `outs` (`dir` created when missing); `values[c]` is the label value channel c was
/// written as (after remapping).
pub fn stage_split_classes(
    dir: &Path,
    labels: ArrayView3<u16>,
    values: &[u16],
    classes: Option<&[String]>,
    like: &Header,
    outs: &mut Outputs,
    replace: bool,
) -> Result<()> {
    let files = class_files(values.len(), classes)?;
    outs.make_dir(dir)?;
    for (c, name) in files {
        let value = values.get(c).copied().unwrap_or(c as u16);
        let mask = labels.mapv(|l| (l == value) as u16);
        outs.push(
            crate::volume::stage_labels(&dir.join(name), mask.view(), like)?,
            replace,
        );
    }
    Ok(())
}

/// [`stage_split_classes`] committed at once; returns the paths written.
pub fn write_split_classes(
    dir: &Path,
    labels: ArrayView3<u16>,
    values: &[u16],
    classes: Option<&[String]>,
    like: &Header,
) -> Result<Vec<PathBuf>> {
    let mut outs = Outputs::new();
    stage_split_classes(dir, labels, values, classes, like, &mut outs, true)?;
    outs.commit()
}
