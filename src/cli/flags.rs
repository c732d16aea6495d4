//! The window and memory flags `segment` and `plan` share, parsed and checked in one place.

use crate::tiling::{self, Placement};
use crate::{Error, Result};

/// `--overlap`: one number or one per axis, each in [0, 1).
pub fn overlap(s: &str) -> Result<[f64; 3]> {
    let overlap = tiling::parse_triple_f64(s)?;
    if overlap.iter().any(|o| !(0.0..1.0).contains(o)) {
        return Err(Error::Invalid(format!(
            "--overlap must lie in [0, 1), got {s}"
        )));
    }
    Ok(overlap)
}

/// `--placement` (clap allows only `monai` and `nnunet`).
pub fn placement(s: &str) -> Placement {
    tiling::parse_placement(s).unwrap_or(Placement::Monai)
}

/// `--pad`: a finite number or "edge".
pub fn pad(s: &str) -> Result<tiling::PadMode> {
    tiling::parse_pad(s)
        .ok_or_else(|| Error::Invalid(format!("--pad takes a finite number or 'edge', not '{s}'")))
}

/// `--roi`: one number or D,H,W.
pub fn roi(s: Option<&str>) -> Result<Option<[usize; 3]>> {
    s.map(tiling::parse_triple_usize).transpose()
}

/// `--batch`: at least 1.
pub fn batch(b: Option<usize>) -> Result<Option<usize>> {
    if b == Some(0) {
        return Err(Error::Invalid("--batch must be at least 1".into()));
    }
    Ok(b)
}

/// `--memory-budget`: a byte size such as 4GiB.
pub fn memory_budget(s: Option<&str>) -> Result<Option<u64>> {
    s.map(crate::plan::parse_bytes).transpose()
}

/// `--spacing`: a voxel size (network axes D,H,W, mm), or "none" (the input grid whatever the
/// manifest says: `Some(None)`); not given: None (the manifest decides).
pub fn spacing(s: Option<&str>) -> Result<Option<Option<[f64; 3]>>> {
    Ok(match s {
        Some("none") => Some(None),
        Some(s) => Some(Some(tiling::parse_spacing(s)?)),
        None => None,
    })
}

/// `--orientation CODE` (`segment` and `plan`): nibabel's axis codes or `stored`.
pub fn orientation(s: Option<&str>) -> Result<Option<crate::volume::Orientation>> {
    s.map(|o| {
        o.parse()
            .map_err(|e| Error::Invalid(format!("--orientation: {e}")))
    })
    .transpose()
}
