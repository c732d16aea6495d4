//! The pipeline's side of reorientation ([`crate::volume::Reorientation`]): the input turned
//! to the models' orientation before normalised data is resampled and windowed, every output
//! turned back onto the input's grid afterwards, and what the report says about it.
//!
//! Order of the stages: turn, then resample to the manifest's `spacing` (which is therefore in the
//! turned frame's network axes), run, resample back to the turned grid, then turn back. Turning is
//! a permutation, so the outputs land on the input's voxels exactly.

use super::Output;
use crate::volume::{Header, Orientation, Reorientation, Volume};
use crate::Result;
use ndarray::ArrayView4;
use serde::Serialize;

/// The orientation in effect, as the report gives it.
#[derive(Clone, Debug, Serialize)]
pub struct OrientationReport {
    /// The setting: "stored" or axis codes such as "RAS".
    pub setting: String,
    /// The input's axis codes (closest axes of its affine).
    pub input: String,
    /// The axis codes of the array the models ran on.
    pub model: String,
    /// Input axis (i, j, k = 0, 1, 2) of each axis the models ran on.
    pub permutation: [usize; 3],
    /// Whether each of those axes was reversed.
    pub flipped: [bool; 3],
}

impl Default for OrientationReport {
    fn default() -> Self {
        OrientationReport {
            setting: Orientation::Stored.to_string(),
            input: String::new(),
            model: String::new(),
            permutation: [0, 1, 2],
            flipped: [false; 3],
        }
    }
}

impl OrientationReport {
    /// The report of `setting` applied to an input of `header` as `reo`.
    pub fn new(setting: Orientation, header: &Header, reo: &Reorientation) -> Self {
        let input = header.orientation();
        let model = match setting {
            Orientation::Stored => input.clone(),
            o => o.to_string(),
        };
        OrientationReport {
            setting: setting.to_string(),
            input,
            model,
            permutation: reo.perm,
            flipped: reo.flip,
        }
    }
}

/// `data` of `header` turned by `reo`: copied in the new axis order, its header on the new grid.
pub fn turn(data: ArrayView4<f32>, header: &Header, reo: &Reorientation) -> Result<Volume> {
    Ok(Volume {
        data: crate::sys::alloc::try_to_owned(reo.apply(data), "the reoriented volume")?,
        header: reo.header(header),
    })
}

/// `out`, computed on the grid `reo` turned `input` to, put back on `input`'s grid: labels,
/// probabilities and raw outputs turned back, the input's header and grid in the report.
pub fn turn_back(mut out: Output, reo: &Reorientation, input: &Header) -> Result<Output> {
    let inv = reo.inverse();
    out.labels = crate::sys::alloc::try_to_owned(inv.apply3(out.labels.view()), "the labels")?;
    if let Some(p) = out.probabilities.take() {
        out.probabilities = Some(crate::sys::alloc::try_to_owned(
            inv.apply(p.view()),
            "the probabilities",
        )?);
    }
    if let Some(l) = out.logits.take() {
        out.logits = Some(crate::sys::alloc::try_to_owned(
            inv.apply(l.view()),
            "the raw outputs",
        )?);
    }
    out.header = input.clone();
    out.report.input_grid = input.shape();
    out.report.engine.spacing = input.spacing();
    Ok(out)
}
