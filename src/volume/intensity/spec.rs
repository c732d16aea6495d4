//! Intensity normalisation as a run applies it, as the manifest's `[normalize]` table writes it
//! (flat, so that a field of another kind is an error), and as `--normalize` spells it.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Intensity normalisation, applied per channel to the whole volume before resampling (as
/// nnU-Net's preprocessing does). In a manifest: a `[normalize]` table with `kind` and the
/// fields of that kind.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "IntensityFile", into = "IntensityFile")]
pub enum Intensity {
    /// The volume as it is.
    None,
    /// (x − mean) / (std + 1e-8) over the volume.
    Zscore,
    /// nnU-Net's CTNormalization: clip to [lo, hi], then (x − mean) / max(std, 1e-8).
    Ct {
        /// Lower and upper clip bounds.
        clip: [f32; 2],
        /// Mean subtracted after clipping.
        mean: f32,
        /// Divisor (floored at 1e-8).
        std: f32,
    },
    /// The volume's p_lo and p_hi percentiles (numpy's linear method) mapped to 0 and 1, clipped
    /// (MONAI's ScaleIntensityRangePercentiles with clip=True).
    Percentile {
        /// Percentile mapped to 0.
        p_lo: f64,
        /// Percentile mapped to 1.
        p_hi: f64,
    },
}

/// The `[normalize]` table as written: flat, so that a field of another kind is an error (serde's
/// internally tagged enums ignore unknown fields of unit variants).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct IntensityFile {
    kind: IntensityKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    clip: Option<[f32; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mean: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    std: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p_lo: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p_hi: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum IntensityKind {
    #[default]
    None,
    Zscore,
    Ct,
    Percentile,
}

impl TryFrom<IntensityFile> for Intensity {
    type Error = String;
    fn try_from(f: IntensityFile) -> std::result::Result<Self, String> {
        let has_ct = f.clip.is_some() || f.mean.is_some() || f.std.is_some();
        let has_pct = f.p_lo.is_some() || f.p_hi.is_some();
        let extra =
            |kind: &str| format!("normalize: kind {kind} takes no clip, mean, std, p_lo or p_hi");
        Ok(match f.kind {
            IntensityKind::None if has_ct || has_pct => return Err(extra("none")),
            IntensityKind::Zscore if has_ct || has_pct => return Err(extra("zscore")),
            IntensityKind::None => Intensity::None,
            IntensityKind::Zscore => Intensity::Zscore,
            IntensityKind::Ct => match (f.clip, f.mean, f.std, has_pct) {
                (Some(clip), Some(mean), Some(std), false) => Intensity::Ct { clip, mean, std },
                _ => return Err("normalize: kind ct takes clip = [lo, hi], mean and std".into()),
            },
            IntensityKind::Percentile => match (f.p_lo, f.p_hi, has_ct) {
                (Some(p_lo), Some(p_hi), false) => Intensity::Percentile { p_lo, p_hi },
                _ => return Err("normalize: kind percentile takes p_lo and p_hi".into()),
            },
        })
    }
}

impl From<Intensity> for IntensityFile {
    fn from(i: Intensity) -> Self {
        let mut f = IntensityFile::default();
        match i {
            Intensity::None => {}
            Intensity::Zscore => f.kind = IntensityKind::Zscore,
            Intensity::Ct { clip, mean, std } => {
                f.kind = IntensityKind::Ct;
                (f.clip, f.mean, f.std) = (Some(clip), Some(mean), Some(std));
            }
            Intensity::Percentile { p_lo, p_hi } => {
                f.kind = IntensityKind::Percentile;
                (f.p_lo, f.p_hi) = (Some(p_lo), Some(p_hi));
            }
        }
        f
    }
}

impl Intensity {
    /// Refuses parameters no run could use (non-finite, empty ranges), with the reason.
    pub fn check(&self) -> std::result::Result<(), String> {
        match *self {
            Intensity::Ct { clip, mean, std }
                if !(clip.iter().chain([&mean, &std]).all(|v| v.is_finite())
                    && clip[0] <= clip[1]
                    && std > 0.0) =>
            {
                Err("normalize: ct needs finite clip = [lo, hi] with lo <= hi, a finite mean and std > 0".into())
            }
            Intensity::Percentile { p_lo, p_hi }
                if !(0.0 <= p_lo && p_lo < p_hi && p_hi <= 100.0) =>
            {
                Err("normalize: percentile needs 0 <= p_lo < p_hi <= 100".into())
            }
            _ => Ok(()),
        }
    }
}

impl std::str::FromStr for Intensity {
    type Err = Error;
    /// `--normalize`: `none`, `zscore` or `ct:LO,HI,MEAN,STD` (the percentile rule is the
    /// manifest's alone).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Intensity::None),
            "zscore" => Ok(Intensity::Zscore),
            _ => {
                let bad = || {
                    Error::Invalid(format!(
                        "unknown normalisation '{s}': use none, zscore or ct:LO,HI,MEAN,STD"
                    ))
                };
                let v: Vec<f32> = s
                    .strip_prefix("ct:")
                    .ok_or_else(bad)?
                    .split(',')
                    .map(|x| x.trim().parse::<f32>().map_err(|_| bad()))
                    .collect::<Result<_>>()?;
                match v.as_slice() {
                    &[lo, hi, mean, std] if lo <= hi && std > 0.0 => Ok(Intensity::Ct {
                        clip: [lo, hi],
                        mean,
                        std,
                    }),
                    _ => Err(bad()),
                }
            }
        }
    }
}

/// A normalisation in words, for reports and `inspect`.
pub fn describe_intensity(n: &Intensity) -> String {
    match n {
        Intensity::None => "none".into(),
        Intensity::Zscore => "zscore (per volume)".into(),
        Intensity::Ct { clip, mean, std } => {
            format!("ct: clip [{}, {}], (x - {mean}) / {std}", clip[0], clip[1])
        }
        Intensity::Percentile { p_lo, p_hi } => {
            format!("percentile: p{p_lo}..p{p_hi} -> [0, 1]")
        }
    }
}
