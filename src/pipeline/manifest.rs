//! Model manifests: the facts about a model that its ONNX file does not carry (class names, axis
//! order, spacing, intensity normalisation, window settings, activation, label values), kept in
//! `net.toml` or `net.json` beside `net.onnx` so that a user does not have to repeat them as flags.

use crate::engine::{AxisOrder, Normalize};
use crate::tiling::BlendMode;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One number for every axis, or one per axis.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrThree<T> {
    /// The same value on every axis.
    One(T),
    /// One value per axis.
    Three([T; 3]),
}

impl<T: Copy> OneOrThree<T> {
    /// The three per-axis values.
    pub fn triple(self) -> [T; 3] {
        match self {
            OneOrThree::One(v) => [v; 3],
            OneOrThree::Three(v) => v,
        }
    }
}

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

impl From<Normalize> for Intensity {
    fn from(n: Normalize) -> Self {
        match n {
            Normalize::None => Intensity::None,
            Normalize::ZScore => Intensity::Zscore,
            Normalize::Ct { lo, hi, mean, std } => Intensity::Ct {
                clip: [lo, hi],
                mean,
                std,
            },
        }
    }
}

/// What the pipeline applies to each model's blended output before averaging and argmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Softmax for several raw channels, sigmoid for one, nothing when the graph already ends in
    /// Softmax or Sigmoid.
    Auto,
    /// Softmax over channels.
    Softmax,
    /// Sigmoid per channel.
    Sigmoid,
    /// The outputs as they are.
    None,
}

/// The manifest file as written. Every field is optional; flags given on the command line win.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The model's name, for messages and reports.
    pub name: Option<String>,
    /// One name per output channel (channel 0 is usually the background).
    pub classes: Option<Vec<String>>,
    /// "xyz" (nibabel/MONAI) or "zyx" (SimpleITK/nnU-Net).
    pub axis_order: Option<String>,
    /// Voxel size the model was trained at, in the network's axes (D,H,W), mm.
    pub spacing: Option<[f64; 3]>,
    /// Intensity normalisation the model was trained with.
    pub normalize: Option<Intensity>,
    /// Window size in network axes.
    pub roi: Option<OneOrThree<usize>>,
    /// Window overlap, per network axis or one for all.
    pub overlap: Option<OneOrThree<f64>>,
    /// "gaussian", "constant" or "hann".
    pub blend: Option<String>,
    /// What turns outputs into probabilities before averaging.
    pub activation: Option<Activation>,
    /// Network axes that test-time mirroring flips when `--tta` is given without a list.
    pub mirror_axes: Option<Vec<usize>>,
    /// Output channel → label value written to the file (channels not listed keep their index).
    pub remap: Option<BTreeMap<String, u16>>,
}

impl Manifest {
    /// Parse TOML or JSON by extension (`.json` is JSON, anything else TOML) and check the values.
    pub fn load(path: impl AsRef<Path>) -> Result<Manifest> {
        let path = path.as_ref();
        let text = crate::fsio::read_regular_text(path, crate::fsio::MANIFEST_CAP)?;
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let m: Manifest = if is_json {
            serde_json::from_str(&text).map_err(|e| Error::model(path, format!("manifest: {e}")))?
        } else {
            toml::from_str(&text).map_err(|e: toml::de::Error| {
                // One line: the message and the offending line, not toml's multi-line excerpt.
                let at = e
                    .span()
                    .map(|r| {
                        let start = r.start.min(text.len());
                        let n = text[..start].matches('\n').count();
                        let line = text.lines().nth(n).unwrap_or("").trim();
                        format!(" line {} `{line}`", n + 1)
                    })
                    .unwrap_or_default();
                let msg = e.message().replace('\n', " ");
                Error::model(path, format!("manifest{at}: {}", msg.trim()))
            })?
        };
        m.check().map_err(|msg| Error::model(path, msg))?;
        Ok(m)
    }

    /// `net.toml` or `net.json` beside `net.onnx`, whichever exists (TOML first).
    pub fn beside(model: impl AsRef<Path>) -> Option<PathBuf> {
        let model = model.as_ref();
        ["toml", "json"]
            .iter()
            .map(|ext| model.with_extension(ext))
            .find(|p| p.is_file())
    }

    /// Values a file can get wrong that serde does not see.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(a) = &self.axis_order {
            a.parse::<AxisOrder>().map_err(|e| e.to_string())?;
        }
        if let Some(b) = &self.blend {
            parse_blend(b)?;
        }
        if let Some(s) = self.spacing {
            if s.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(format!("spacing must be positive, got {s:?}"));
            }
        }
        if let Some(r) = self.roi {
            if r.triple().contains(&0) {
                return Err("roi must be positive along every axis".into());
            }
        }
        if let Some(o) = self.overlap {
            if o.triple().iter().any(|o| !(0.0..1.0).contains(o)) {
                return Err("overlap must lie in [0, 1)".into());
            }
        }
        if let Some(n) = &self.normalize {
            n.check()?;
        }
        if let Some(axes) = &self.mirror_axes {
            if axes.iter().any(|&a| a > 2) {
                return Err(format!(
                    "mirror_axes are network axes 0, 1, 2; got {axes:?}"
                ));
            }
        }
        if let Some(c) = &self.classes {
            if c.is_empty() {
                return Err("classes is empty".into());
            }
        }
        self.remap_table(usize::MAX)?;
        Ok(())
    }

    /// The label value of each of `channels` output channels (identity where `remap` is silent).
    pub fn remap_table(&self, channels: usize) -> std::result::Result<Option<Vec<u16>>, String> {
        let Some(map) = &self.remap else {
            return Ok(None);
        };
        let mut pairs = Vec::new();
        for (k, v) in map {
            let c: usize = k
                .trim()
                .parse()
                .map_err(|_| format!("remap keys are output channel numbers, not '{k}'"))?;
            if channels != usize::MAX && c >= channels {
                return Err(format!(
                    "remap names channel {c} but the model has {channels} output channel(s)"
                ));
            }
            pairs.push((c, *v));
        }
        if channels == usize::MAX {
            return Ok(None);
        }
        let mut table: Vec<u16> = (0..channels as u16).collect();
        for (c, v) in pairs {
            table[c] = v;
        }
        Ok(Some(table))
    }

    /// Several lines for `voxtile inspect`.
    pub fn describe(&self, path: &Path) -> String {
        let mut s = format!("manifest {}:", path.display());
        let mut line = |k: &str, v: String| s.push_str(&format!("\n  {k}: {v}"));
        if let Some(n) = &self.name {
            line("name", n.clone());
        }
        if let Some(c) = &self.classes {
            let list: Vec<String> = c
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{i}={n}"))
                .collect();
            line("classes", list.join(", "));
        }
        if let Some(a) = &self.axis_order {
            line("axis order", a.clone());
        }
        if let Some(sp) = self.spacing {
            line("spacing (D,H,W)", format!("{sp:?} mm"));
        }
        if let Some(n) = &self.normalize {
            line("normalize", describe_intensity(n));
        }
        if let Some(r) = self.roi {
            line("roi", format!("{:?}", r.triple()));
        }
        if let Some(o) = self.overlap {
            line("overlap", format!("{:?}", o.triple()));
        }
        if let Some(b) = &self.blend {
            line("blend", b.clone());
        }
        if let Some(a) = self.activation {
            line("activation", format!("{a:?}").to_lowercase());
        }
        if let Some(m) = &self.mirror_axes {
            line("mirror axes", format!("{m:?}"));
        }
        if let Some(r) = &self.remap {
            let list: Vec<String> = r.iter().map(|(k, v)| format!("{k}->{v}")).collect();
            line("remap", list.join(", "));
        }
        s
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

/// Parses a blend name: "gaussian", "constant" or "hann".
pub fn parse_blend(s: &str) -> std::result::Result<BlendMode, String> {
    match s {
        "gaussian" => Ok(BlendMode::Gaussian),
        "constant" => Ok(BlendMode::Constant),
        "hann" => Ok(BlendMode::Hann),
        _ => Err(format!(
            "unknown blend '{s}': use gaussian, constant or hann"
        )),
    }
}
