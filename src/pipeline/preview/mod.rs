//! `--preview`: a PNG of three orthogonal slices (axial, coronal, sagittal, side by side) with a
//! legend. The volume is turned to RAS from its affine and shown in radiological convention (the
//! patient's right on the left, letters at the panel edges say so), with square pixels in mm;
//! each slice cuts the segmentation's largest cross-section in its view. A thin slice (a slab of
//! 20 slices seen from the side) is enlarged to [`MIN_PANEL`] pixels on its short side, square
//! millimetres kept up to an aspect of 8:1 and its short side stretched beyond that, so every
//! panel is readable and carries its four letters. Grey: the first input
//! channel as read, in CT's W400/L40 window on HU values, else its 0.5–99.5th percentiles;
//! labels > 0 blended in colour at half opacity. A quick look, not a figure.

mod font;
mod legend;
mod orient;
mod panel;
mod window;

/// The overlay colour of a label: the label table's ([`crate::volume::label_colour`]).
pub use crate::volume::label_colour;
pub use orient::Orientation;
pub use panel::{busiest_slice, View};
pub use window::{Window, CT};

use crate::volume::Mat4;
use crate::{Error, Result};
use ndarray::ArrayView3;
use std::collections::BTreeSet;
use std::path::Path;

/// An RGB picture: width, height, rows top to bottom.
pub struct Picture {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// `width * height` RGB triples, row by row.
    pub rgb: Vec<u8>,
}

/// What the preview needs besides the voxels.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Voxel-to-world affine of the volume (RAS mm), for orientation and voxel sizes.
    pub affine: Mat4,
    /// The name of each label value, as the label map's table carries them (remap and the
    /// one-channel case already applied: see the CLI's `Config::label_names`).
    pub names: Option<&'a crate::volume::LabelNames>,
    /// The input is CT (the manifest normalises it as CT): use the CT window whatever the values.
    pub ct: bool,
}

impl Context<'_> {
    /// A context with no class names, not CT.
    pub fn plain(affine: Mat4) -> Context<'static> {
        Context {
            affine,
            names: None,
            ct: false,
        }
    }

    /// The legend's name of label value `l`: its name in the table, else the number.
    pub fn name(&self, l: u16) -> String {
        self.names
            .and_then(|n| n.names.get(l as usize))
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| format!("label {l}"))
    }
}

/// Longest panel side at most (pixels): big volumes are shown coarser.
const MAX_SIDE: f64 = 1024.0;
/// Longest panel side at least (pixels): small volumes are enlarged, with room for the letters.
const MIN_SIDE: f64 = 256.0;

/// Display pixel size (mm): the finest voxel size, made coarser or finer so that the longest
/// panel side is between `MIN_SIDE` and `MAX_SIDE` pixels.
fn pixel_size(dims: [usize; 3], spacing: [f64; 3]) -> f64 {
    let extent = (0..3)
        .map(|a| dims[a] as f64 * spacing[a])
        .fold(0.0, f64::max);
    let finest = spacing.iter().copied().fold(f64::INFINITY, f64::min);
    finest.max(extent / MAX_SIDE).min(extent / MIN_SIDE)
}

/// Shortest panel side (pixels): a readable slice with room for its four edge letters.
pub const MIN_PANEL: usize = 128;

/// A panel's size (pixels) for a slice `mm` wide and high at `pixel` mm per pixel: enlarged,
/// square millimetres kept, until its shorter side reaches `MIN_PANEL` or its longer side
/// `MAX_SIDE`; a slice still thinner is stretched along its short side to `MIN_PANEL`.
fn panel_size(mm: [f64; 2], pixel: f64) -> [usize; 2] {
    let natural = mm.map(|m| m / pixel);
    let short = natural[0].min(natural[1]);
    let long = natural[0].max(natural[1]);
    let grow = (MIN_PANEL as f64 / short).min(MAX_SIDE / long).max(1.0);
    natural.map(|n| ((n * grow).round() as usize).max(MIN_PANEL))
}

/// Black columns between two panels, so that their edge letters stay apart.
pub const PANEL_GAP: usize = 12;

/// The picture: panels axial, coronal, sagittal left to right (top-aligned, [`PANEL_GAP`] apart,
/// black around), the legend strip under them.
pub fn render(image: ArrayView3<f32>, labels: ArrayView3<u16>, ctx: &Context) -> Picture {
    let o = Orientation::of(&ctx.affine);
    let (img, lab) = (o.apply(image), o.apply(labels));
    let spacing = o.spacing(&ctx.affine);
    let dims: [usize; 3] = img.shape().try_into().unwrap_or([0; 3]);
    if dims.contains(&0) || image.dim() != labels.dim() {
        return Picture {
            width: 1,
            height: 1,
            rgb: vec![0; 3],
        };
    }
    let window = Window::choose(image, ctx.ct);
    let pixel = pixel_size(dims, spacing);
    let views = [View::Axial, View::Coronal, View::Sagittal];
    let panels = views.map(|v| {
        let size = panel_size(panel::extent(dims, spacing, v), pixel);
        panel::render(img, lab, v, size, window)
    });
    let entries = legend_entries(labels, ctx);
    let width: usize = panels.iter().map(|p| p.width).sum::<usize>() + 2 * PANEL_GAP;
    let top = panels.iter().map(|p| p.height).max().unwrap_or(0);
    let height = top + legend::height(&entries, width);
    let mut pic = Picture {
        width,
        height,
        rgb: vec![0; width * height * 3],
    };
    let mut x0 = 0;
    for (p, v) in panels.iter().zip(views) {
        for y in 0..p.height {
            for x in 0..p.width {
                let g = p.grey[y * p.width + x] as f32;
                let px = match p.labels[y * p.width + x] {
                    0 => [g as u8; 3],
                    l => label_colour(l).map(|c| (0.5 * g + 0.5 * c as f32).round() as u8),
                };
                let at = (y * width + x0 + x) * 3;
                pic.rgb[at..at + 3].copy_from_slice(&px);
            }
        }
        pic.edge_letters(x0, p.width, p.height, v.edges());
        x0 += p.width + PANEL_GAP;
    }
    legend::draw(&mut pic, top, &entries);
    pic
}

/// One entry per label value present, in order; "no labels" when there is none.
fn legend_entries(labels: ArrayView3<u16>, ctx: &Context) -> Vec<legend::Entry> {
    let present: BTreeSet<u16> = labels.iter().copied().filter(|&l| l > 0).collect();
    if present.is_empty() {
        return vec![legend::Entry {
            colour: [0; 3],
            name: "no labels".into(),
        }];
    }
    present
        .into_iter()
        .map(|l| legend::Entry {
            colour: label_colour(l),
            name: ctx.name(l),
        })
        .collect()
}

/// Render and write an 8-bit RGB PNG (staged and committed at once, replacing `path`).
pub fn write_png(
    path: &Path,
    image: ArrayView3<f32>,
    labels: ArrayView3<u16>,
    ctx: &Context,
) -> Result<()> {
    stage_png(path, image, labels, ctx)?.commit(true)
}

/// Render an 8-bit RGB PNG and stage it for the caller to commit with its other outputs.
pub fn stage_png(
    path: &Path,
    image: ArrayView3<f32>,
    labels: ArrayView3<u16>,
    ctx: &Context,
) -> Result<crate::staged::Staged> {
    crate::staged::stage_bytes(path, &png_bytes(path, &render(image, labels, ctx))?)
}

/// The PNG file's bytes.
fn png_bytes(path: &Path, pic: &Picture) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut bytes, pic.width as u32, pic.height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let err = |e: png::EncodingError| Error::io(path, std::io::Error::other(e.to_string()));
    let mut w = enc.write_header().map_err(err)?;
    w.write_image_data(&pic.rgb).map_err(err)?;
    w.finish().map_err(err)?;
    Ok(bytes)
}
