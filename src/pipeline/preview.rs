//! `--preview`: a PNG of three orthogonal mid-slices (planes k, j, i through the centre, side by
//! side), the first input channel windowed to its 1–99th percentiles in grey, labels > 0 blended
//! in colour at half opacity. One pixel per voxel (spacing is not corrected): a quick look, not a
//! figure.

use super::intensity::percentiles;
use crate::{Error, Result};
use ndarray::{ArrayView3, Axis};
use std::path::Path;

/// Distinct colours for labels 1, 2, ... (cycled).
const PALETTE: [[u8; 3]; 12] = [
    [230, 25, 75],
    [60, 180, 75],
    [255, 225, 25],
    [0, 130, 200],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
    [210, 245, 60],
    [250, 190, 212],
    [0, 128, 128],
    [170, 110, 40],
];

/// The overlay colour of label `l` (1 and up; the palette repeats).
pub fn label_colour(l: u16) -> [u8; 3] {
    PALETTE[(l as usize - 1) % PALETTE.len()]
}

/// An RGB picture: width, height, rows top to bottom.
pub struct Picture {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// `width * height` RGB triples, row by row.
    pub rgb: Vec<u8>,
}

/// Panels of (i,j) at k = nz/2, (i,k) at j = ny/2, (j,k) at i = nx/2; a panel's first axis runs
/// left to right and its second bottom to top (superior up for RAS files).
pub fn render(image: ArrayView3<f32>, labels: ArrayView3<u16>) -> Picture {
    let (nx, ny, nz) = image.dim();
    let (lo, hi) = percentiles(image, 1.0, 99.0);
    let scale = if hi > lo { 255.0 / (hi - lo) } else { 0.0 };
    let panels = [
        (
            image.index_axis(Axis(2), nz / 2),
            labels.index_axis(Axis(2), nz / 2),
        ),
        (
            image.index_axis(Axis(1), ny / 2),
            labels.index_axis(Axis(1), ny / 2),
        ),
        (
            image.index_axis(Axis(0), nx / 2),
            labels.index_axis(Axis(0), nx / 2),
        ),
    ];
    let width: usize = panels.iter().map(|p| p.0.dim().0).sum();
    let height = panels.iter().map(|p| p.0.dim().1).max().unwrap_or(0);
    let mut rgb = vec![0u8; width * height * 3];
    let mut x0 = 0;
    for (img, lab) in panels {
        let (w, h) = img.dim();
        for u in 0..w {
            for v in 0..h {
                let g = ((img[[u, v]] - lo) * scale).clamp(0.0, 255.0);
                let px = match lab[[u, v]] {
                    0 => [g as u8; 3],
                    l => label_colour(l).map(|c| (0.5 * g + 0.5 * c as f32).round() as u8),
                };
                let (x, y) = (x0 + u, h - 1 - v);
                let at = (y * width + x) * 3;
                rgb[at..at + 3].copy_from_slice(&px);
            }
        }
        x0 += w;
    }
    Picture { width, height, rgb }
}

/// Render and write an 8-bit RGB PNG (staged and committed at once, replacing `path`).
pub fn write_png(path: &Path, image: ArrayView3<f32>, labels: ArrayView3<u16>) -> Result<()> {
    stage_png(path, image, labels)?.commit(true)
}

/// Render an 8-bit RGB PNG and stage it for the caller to commit with its other outputs.
pub fn stage_png(
    path: &Path,
    image: ArrayView3<f32>,
    labels: ArrayView3<u16>,
) -> Result<crate::staged::Staged> {
    crate::staged::stage_bytes(path, &png_bytes(path, image, labels)?)
}

/// The PNG file's bytes.
fn png_bytes(path: &Path, image: ArrayView3<f32>, labels: ArrayView3<u16>) -> Result<Vec<u8>> {
    let pic = render(image, labels);
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
