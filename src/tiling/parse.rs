//! Parsing of the CLI's per-axis triples ("96,96,64" or "128" for all three axes).

use super::{PadMode, Placement};
use crate::{Error, Result};

/// Split "a,b,c" or "a" into three trimmed fields; `None` for any other count.
fn fields(s: &str) -> Option<[&str; 3]> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    match parts.as_slice() {
        [a] => Some([a, a, a]),
        [a, b, c] => Some([a, b, c]),
        _ => None,
    }
}

/// A window size: one positive integer for all axes or three separated by commas (D,H,W).
pub fn parse_triple_usize(s: &str) -> Result<[usize; 3]> {
    let bad = || {
        Error::Invalid(format!(
            "window size \"{s}\" is not one positive integer or three separated by commas (e.g. 96,96,64)"
        ))
    };
    let f = fields(s).ok_or_else(bad)?;
    let mut out = [0; 3];
    for (o, t) in out.iter_mut().zip(f) {
        *o = t.parse::<usize>().map_err(|_| bad())?;
        if *o == 0 {
            return Err(bad());
        }
    }
    Ok(out)
}

/// Three numbers (or one for all axes), each passing `ok`; `rule` says what `ok` asks, for the
/// message.
fn parse_f64s(s: &str, what: &str, rule: &str, ok: impl Fn(f64) -> bool) -> Result<[f64; 3]> {
    let bad = || {
        Error::Invalid(format!(
            "{what} \"{s}\" is not one number or three separated by commas, each {rule}"
        ))
    };
    let f = fields(s).ok_or_else(bad)?;
    let mut out = [0.0; 3];
    for (o, t) in out.iter_mut().zip(f) {
        *o = t.parse::<f64>().map_err(|_| bad())?;
        if !ok(*o) {
            return Err(bad());
        }
    }
    Ok(out)
}

/// An overlap: one fraction for all axes or three separated by commas, each in [0, 1).
pub fn parse_triple_f64(s: &str) -> Result<[f64; 3]> {
    parse_f64s(
        s,
        "overlap",
        "at least 0 and below 1 (e.g. 0.5 or 0.5,0.5,0.25)",
        |v| (0.0..1.0).contains(&v),
    )
}

/// A gaussian sigma scale: one number for all axes or three separated by commas, each positive and finite.
pub fn parse_sigma_scale(s: &str) -> Result<[f64; 3]> {
    parse_f64s(
        s,
        "sigma scale",
        "positive and finite (e.g. 0.125)",
        sigma_scale_ok,
    )
}

/// The rule of a sigma scale value, `--sigma-scale`'s and the manifest's: positive and finite.
pub fn sigma_scale_ok(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// A window placement by name, `--placement`'s and the manifest's: "monai" or "nnunet".
pub fn parse_placement(s: &str) -> Option<Placement> {
    match s {
        "monai" => Some(Placement::Monai),
        "nnunet" => Some(Placement::NnUnet),
        _ => None,
    }
}

/// A padding mode, `--pad`'s and the manifest's: "edge" or a number finite in f32 ("1e39"
/// parses, as infinity, and is refused).
pub fn parse_pad(s: &str) -> Option<PadMode> {
    if s == "edge" {
        return Some(PadMode::Edge);
    }
    s.trim()
        .parse::<f32>()
        .ok()
        .filter(|v| v.is_finite())
        .map(PadMode::Constant)
}

/// A voxel spacing in mm: one number for all axes or three separated by commas, each positive
/// and finite.
pub fn parse_spacing(s: &str) -> Result<[f64; 3]> {
    parse_f64s(
        s,
        "spacing",
        "positive and finite in mm (e.g. 1.5 or 3,0.8,0.8)",
        |v| v.is_finite() && v > 0.0,
    )
}
