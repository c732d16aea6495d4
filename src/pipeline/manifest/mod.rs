//! Model manifests: the facts about a model that its ONNX file does not carry (class names, axis
//! order, spacing, intensity normalisation, window settings, activation, label values), kept in
//! `net.toml` or `net.json` beside `net.onnx` so that a user does not have to repeat them as flags.

use crate::engine::AxisOrder;
use crate::tiling::BlendMode;
use crate::volume::Orientation;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod orientation;
mod postprocess;
mod remap;
mod text;
mod window;

pub use crate::volume::intensity::{describe_intensity, Intensity};

pub use postprocess::{ClassSet, MinComponent};
pub use text::MAX_STRING_BYTES;
pub use window::{describe_pad, Pad, Tta};

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
    /// One name per output channel (channel 0 is usually the background); a one-channel model
    /// takes one (its label 1) or two (labels 0 and 1).
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
    #[serde(default, deserialize_with = "remap::unique_keys")]
    pub remap: Option<BTreeMap<String, u16>>,
    /// Window placement: "monai" or "nnunet" (see `manifest/window.rs`).
    pub placement: Option<String>,
    /// Test-time mirroring: true (`mirror_axes`, else all three), false, or the network axes.
    pub tta: Option<Tta>,
    /// Gaussian sigma as a fraction of the roi, one or per network axis.
    pub sigma_scale: Option<OneOrThree<f64>>,
    /// Padding where the volume is smaller than the roi: "edge" or a number, as `--pad`.
    pub pad: Option<Pad>,
    /// Post-processing: keep the largest connected component of every foreground class (`true`)
    /// or of the listed classes.
    pub keep_largest: Option<ClassSet>,
    /// Post-processing: remove components under this many mL (or `{ ml, classes }`).
    pub min_component_ml: Option<MinComponent>,
    /// Post-processing: fill the enclosed holes of every foreground class or the listed ones.
    pub fill_holes: Option<ClassSet>,
    /// The orientation the model was trained in: axis codes such as "RAS" (the input is turned
    /// to it and the outputs back), or "stored" (the default: the array as the file stores it).
    pub orientation: Option<String>,
}

impl Manifest {
    /// Parse TOML or JSON by extension (`.json` is JSON, anything else TOML) and check the values.
    ///
    /// The file is opened as model external data is: resolved, inside its own folder (a link
    /// beside a model must not read a file elsewhere), no-follow, a regular file of capped size.
    /// No error shows a line of the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Manifest> {
        let path = path.as_ref();
        let text = read_contained(path)?;
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let m: Manifest = if is_json {
            serde_json::from_str(&text).map_err(|e| {
                let at = format!(" line {} column {}", e.line(), e.column());
                let msg = e.to_string();
                let msg = msg.strip_suffix(&format!(" at{at}")).unwrap_or(&msg);
                Error::model(path, format!("manifest{at}: {}", text::scrub(msg)))
            })?
        } else {
            toml::from_str(&text).map_err(|e: toml::de::Error| {
                let at = e
                    .span()
                    .map(|r| {
                        let before = &text.as_bytes()[..r.start.min(text.len())];
                        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                        let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
                        let field = text.lines().nth(line - 1).and_then(text::key_of);
                        let field = field.map(|k| format!(", field {k}")).unwrap_or_default();
                        format!(" line {line} column {col}{field}")
                    })
                    .unwrap_or_default();
                Error::model(path, format!("manifest{at}: {}", text::scrub(e.message())))
            })?
        };
        m.check().map_err(|msg| Error::model(path, msg))?;
        Ok(m)
    }

    /// `net.toml` or `net.json` beside `net.onnx`, whichever exists (TOML first). A link or
    /// anything else by that name counts: [`Manifest::load`] then says what is wrong with it.
    pub fn beside(model: impl AsRef<Path>) -> Option<PathBuf> {
        let model = model.as_ref();
        ["toml", "json"]
            .iter()
            .map(|ext| model.with_extension(ext))
            .find(|p| p.symlink_metadata().is_ok())
    }

    /// Values a file can get wrong that serde does not see.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.check_strings()?;
        if let Some(a) = &self.axis_order {
            a.parse::<AxisOrder>()
                .map_err(|_| format!("unknown axis order {}: use xyz or zyx", text::show(a)))?;
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
        self.check_window()?;
        self.orientation()?;
        Ok(())
    }

    /// The label value of each of `channels` output channels (identity where `remap` is silent).
    pub fn remap_table(&self, channels: usize) -> std::result::Result<Option<Vec<u16>>, String> {
        match &self.remap {
            Some(map) => remap::table(map, channels),
            None => Ok(None),
        }
    }

    /// Every string of the manifest: no control character, at most [`MAX_STRING_BYTES`].
    fn check_strings(&self) -> std::result::Result<(), String> {
        let one = |what: &str, s: &Option<String>| match s {
            Some(s) => text::check_string(what, s),
            None => Ok(()),
        };
        one("name", &self.name)?;
        one("axis_order", &self.axis_order)?;
        one("blend", &self.blend)?;
        for (i, c) in self.classes.iter().flatten().enumerate() {
            text::check_string(&format!("class {i}"), c)?;
        }
        for k in self.remap.iter().flat_map(|m| m.keys()) {
            text::check_string("a remap key", k)?;
        }
        Ok(())
    }

    /// The `orientation` asked for (None: not given), or why it is wrong.
    pub fn orientation(&self) -> std::result::Result<Option<Orientation>, String> {
        orientation::parse(&self.orientation)
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
        if let Some(o) = &self.orientation {
            line("orientation", o.clone());
        }
        if let Some(r) = &self.remap {
            let list: Vec<String> = r.iter().map(|(k, v)| format!("{k}->{v}")).collect();
            line("remap", list.join(", "));
        }
        for (k, v) in self.describe_window() {
            line(k, v);
        }
        s
    }
}

/// Parses a blend name: "gaussian", "constant" or "hann".
pub fn parse_blend(s: &str) -> std::result::Result<BlendMode, String> {
    match s {
        "gaussian" => Ok(BlendMode::Gaussian),
        "constant" => Ok(BlendMode::Constant),
        "hann" => Ok(BlendMode::Hann),
        _ => Err(format!(
            "unknown blend {}: use gaussian, constant or hann",
            text::show(s)
        )),
    }
}

/// The manifest's text, read through [`crate::sys::fsio::open_contained`] in its own folder.
fn read_contained(path: &Path) -> Result<String> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::model(path, "a manifest must name a file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    crate::sys::fsio::read_contained_text(
        dir,
        Path::new(name),
        "manifest's",
        crate::sys::fsio::MANIFEST_CAP,
    )
}
