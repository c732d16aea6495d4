//! One panel: the slice through the mask's largest cross-section, resampled to square pixels
//! (bilinear grey, nearest labels), laid out in radiological convention: the patient's right on
//! the left of the picture; anterior up (axial), superior up (coronal, sagittal), anterior on
//! the left (sagittal).

use super::window::Window;
use ndarray::{ArrayView2, ArrayView3, Axis};

/// The three views; each cuts one RAS axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Cuts S: columns R to L, rows A (top) to P.
    Axial,
    /// Cuts A: columns R to L, rows S (top) to I.
    Coronal,
    /// Cuts R: columns A to P, rows S (top) to I.
    Sagittal,
}

impl View {
    /// The RAS axis this view cuts.
    pub fn cut(self) -> usize {
        match self {
            View::Axial => 2,
            View::Coronal => 1,
            View::Sagittal => 0,
        }
    }

    /// The RAS axes along the panel's columns and rows (the two it does not cut, in order).
    pub fn axes(self) -> [usize; 2] {
        match self.cut() {
            0 => [1, 2],
            1 => [0, 2],
            _ => [0, 1],
        }
    }

    /// Letters at the left, right, top and bottom edges.
    pub fn edges(self) -> [char; 4] {
        match self {
            View::Axial => ['R', 'L', 'A', 'P'],
            View::Coronal => ['R', 'L', 'S', 'I'],
            View::Sagittal => ['A', 'P', 'S', 'I'],
        }
    }
}

/// A panel's pixels, row by row from the top: grey level and label.
pub struct Panel {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Grey level of each pixel.
    pub grey: Vec<u8>,
    /// Label of each pixel.
    pub labels: Vec<u16>,
}

/// The index along `axis` with the most labelled voxels (the first of equals); the middle
/// when nothing is labelled.
pub fn busiest_slice(labels: ArrayView3<u16>, axis: usize) -> usize {
    let counts = labels
        .axis_iter(Axis(axis))
        .map(|s| s.iter().filter(|&&l| l > 0).count());
    let (mut best, mut most) = (labels.len_of(Axis(axis)) / 2, 0);
    for (i, c) in counts.enumerate() {
        if c > most {
            (best, most) = (i, c);
        }
    }
    best
}

/// The slice of `view` through a RAS-ordered volume of `dims` voxels of `spacing` mm: its width
/// and height in mm.
pub fn extent(dims: [usize; 3], spacing: [f64; 3], view: View) -> [f64; 2] {
    let [a, b] = view.axes();
    [dims[a] as f64 * spacing[a], dims[b] as f64 * spacing[b]]
}

/// Render `view` of RAS-ordered `image` and `labels` as a panel of `size` = [width, height]
/// pixels (the slice stretched over them: [`extent`] gives its proportions in mm).
pub fn render(
    image: ArrayView3<f32>,
    labels: ArrayView3<u16>,
    view: View,
    size: [usize; 2],
    window: Window,
) -> Panel {
    let cut = view.cut();
    let at = busiest_slice(labels, cut);
    // The slice's axes keep RAS order (column axis first); both run from their R/A/S end.
    let img = flip(image.index_axis(Axis(cut), at));
    let lab = flip(labels.index_axis(Axis(cut), at));
    let (n0, n1) = img.dim();
    let [width, height] = size.map(|s| s.max(1));
    // Voxel coordinate of each pixel centre (voxel centres at integers), the slice's n voxels
    // spread over count pixels.
    let coords = |n: usize, count: usize| -> Vec<f64> {
        (0..count)
            .map(|p| ((p as f64 + 0.5) * n as f64 / count as f64 - 0.5).clamp(0.0, (n - 1) as f64))
            .collect()
    };
    let (xs, ys) = (coords(n0, width), coords(n1, height));
    let mut grey = Vec::with_capacity(width * height);
    let mut out = Vec::with_capacity(width * height);
    for &y in &ys {
        for &x in &xs {
            grey.push(window.grey(bilinear(img, x, y)));
            out.push(lab[[x.round() as usize, y.round() as usize]]);
        }
    }
    Panel {
        width,
        height,
        grey,
        labels: out,
    }
}

/// `v` with both axes reversed.
fn flip<T>(mut v: ArrayView2<'_, T>) -> ArrayView2<'_, T> {
    v.invert_axis(Axis(0));
    v.invert_axis(Axis(1));
    v
}

/// `v` at (x, y), both within the array's index range.
fn bilinear(v: ArrayView2<f32>, x: f64, y: f64) -> f32 {
    let (x0, y0) = (x.floor() as usize, y.floor() as usize);
    let (x1, y1) = ((x0 + 1).min(v.dim().0 - 1), (y0 + 1).min(v.dim().1 - 1));
    let (fx, fy) = ((x - x0 as f64) as f32, (y - y0 as f64) as f32);
    let top = v[[x0, y0]] * (1.0 - fx) + v[[x1, y0]] * fx;
    let bottom = v[[x0, y1]] * (1.0 - fx) + v[[x1, y1]] * fx;
    top * (1.0 - fy) + bottom * fy
}
