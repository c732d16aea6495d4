//! The manifest's sliding-window fields a converter knows from the model's origin: `placement`,
//! `tta`, `sigma_scale` and `pad`, checked with the rules of the flags they stand for (one rule
//! each, in [`crate::tiling`]), so that an exported model needs no extra flags to equal it.

use super::text::{check_string, show};
use super::{Manifest, OneOrThree};
use crate::tiling::{self, PadMode, Placement};
use serde::{Deserialize, Serialize};

/// `tta`: on (`true`: the manifest's `mirror_axes`, else all three network axes), off, or the
/// network axes to mirror.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Tta {
    /// On or off.
    On(bool),
    /// On, mirroring these network axes (0, 1, 2).
    Axes(Vec<usize>),
}

/// `pad`: what `--pad` takes, as text ("edge", "0") or as a number.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Pad {
    /// A constant value.
    Number(f64),
    /// "edge", or a number written as text.
    Text(String),
}

impl Manifest {
    /// The window placement asked for.
    pub fn placement_mode(&self) -> Option<Placement> {
        self.placement.as_deref().and_then(tiling::parse_placement)
    }

    /// The padding asked for.
    pub fn pad_mode(&self) -> Option<PadMode> {
        match self.pad.as_ref()? {
            Pad::Number(v) => tiling::parse_pad(&v.to_string()),
            Pad::Text(s) => tiling::parse_pad(s),
        }
    }

    /// The gaussian sigma scale asked for, per network axis.
    pub fn sigma_scale_triple(&self) -> Option<[f64; 3]> {
        self.sigma_scale.map(OneOrThree::triple)
    }

    /// The network axes `--tta` (without a list) mirrors: `tta`'s list, else `mirror_axes`, else
    /// all three.
    pub fn tta_axes(&self) -> Vec<usize> {
        match &self.tta {
            Some(Tta::Axes(a)) => a.clone(),
            _ => self.mirror_axes.clone().unwrap_or(vec![0, 1, 2]),
        }
    }

    /// Whether the manifest turns test-time mirroring on (`tta = true` or a list).
    pub fn tta_on(&self) -> bool {
        matches!(&self.tta, Some(Tta::On(true)) | Some(Tta::Axes(_)))
    }

    /// The four fields against the flags' rules.
    pub(super) fn check_window(&self) -> Result<(), String> {
        if let Some(p) = &self.placement {
            check_string("placement", p)?;
            if tiling::parse_placement(p).is_none() {
                return Err(format!(
                    "unknown placement {}: use monai or nnunet",
                    show(p)
                ));
            }
        }
        if let Some(s) = self.sigma_scale {
            if !s.triple().into_iter().all(tiling::sigma_scale_ok) {
                return Err(format!(
                    "sigma_scale must be positive and finite, got {:?}",
                    s.triple()
                ));
            }
        }
        if let Some(p) = &self.pad {
            if let Pad::Text(t) = p {
                check_string("pad", t)?;
            }
            if self.pad_mode().is_none() {
                let shown = match p {
                    Pad::Number(v) => v.to_string(),
                    Pad::Text(t) => show(t),
                };
                return Err(format!(
                    "pad takes a finite number or \"edge\", not {shown}"
                ));
            }
        }
        if let Some(Tta::Axes(axes)) = &self.tta {
            if axes.is_empty() || axes.iter().any(|&a| a > 2) {
                return Err(format!(
                    "tta takes true, false or network axes 0, 1, 2; got {axes:?}"
                ));
            }
            if let Some(m) = self.mirror_axes.as_ref().filter(|m| !same_axes(m, axes)) {
                return Err(format!("tta lists the axes {axes:?} but mirror_axes {m:?}"));
            }
        }
        Ok(())
    }

    /// `voxtile inspect`'s lines for the four fields.
    pub(super) fn describe_window(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(p) = &self.placement {
            v.push(("placement", p.clone()));
        }
        if self.tta.is_some() {
            let on = if self.tta_on() {
                format!("on, axes {:?}", self.tta_axes())
            } else {
                "off".into()
            };
            v.push(("tta", on));
        }
        if let Some(s) = self.sigma_scale_triple() {
            v.push(("sigma scale", format!("{s:?}")));
        }
        if let Some(p) = self.pad_mode() {
            v.push(("pad", describe_pad(p)));
        }
        v
    }
}

/// A padding mode as `--pad` takes it and the report shows it: "edge" or the constant.
pub fn describe_pad(p: PadMode) -> String {
    match p {
        PadMode::Edge => "edge".into(),
        PadMode::Constant(v) => v.to_string(),
    }
}

/// The same set of axes, whatever the order or repeats.
fn same_axes(a: &[usize], b: &[usize]) -> bool {
    let set = |v: &[usize]| (0..3).map(|i| v.contains(&i)).collect::<Vec<_>>();
    set(a) == set(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toml(s: &str) -> Result<Manifest, String> {
        let m: Manifest = ::toml::from_str(s).map_err(|e| e.to_string())?;
        m.check().map(|_| m)
    }

    #[test]
    fn the_four_fields_read_and_checked() {
        let m = toml("placement = \"nnunet\"\ntta = true\nmirror_axes = [1, 2]\nsigma_scale = 0.25\npad = \"edge\"\n").unwrap();
        assert_eq!(m.placement_mode(), Some(Placement::NnUnet));
        assert!(m.tta_on());
        assert_eq!(m.tta_axes(), vec![1, 2]);
        assert_eq!(m.sigma_scale_triple(), Some([0.25; 3]));
        assert_eq!(m.pad_mode(), Some(PadMode::Edge));
        let m = toml("tta = [0, 2]\nsigma_scale = [0.1, 0.2, 0.3]\npad = -1024\n").unwrap();
        assert_eq!(m.tta_axes(), vec![0, 2]);
        assert_eq!(m.sigma_scale_triple(), Some([0.1, 0.2, 0.3]));
        assert_eq!(m.pad_mode(), Some(PadMode::Constant(-1024.0)));
        assert!(!toml("tta = false\n").unwrap().tta_on());
        assert_eq!(
            toml("pad = \"0.5\"\n").unwrap().pad_mode(),
            Some(PadMode::Constant(0.5))
        );
        for bad in [
            "placement = \"middle\"",
            "sigma_scale = 0",
            "sigma_scale = [0.1, -1, 0.1]",
            "pad = \"wrap\"",
            "pad = 1e39",
            "tta = [3]",
            "tta = []",
            "tta = [0]\nmirror_axes = [1]",
        ] {
            assert!(toml(bad).is_err(), "{bad}");
        }
    }
}
