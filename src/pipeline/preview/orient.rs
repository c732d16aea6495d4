//! The volume turned to RAS index order (i toward Right, j toward Anterior, k toward Superior) by
//! axis permutations and flips read from its affine, so that every file, whatever its voxel
//! order (LIA, LAS, LPS...), shows the same anatomy at the same place.

use crate::volume::{axcodes, Mat4};
use ndarray::{ArrayView3, Axis};

/// How to turn voxel axes into RAS axes: `axis[w]` is the voxel axis that runs along world axis
/// `w` (0 = x, 1 = y, 2 = z) and `flip[w]` says it runs toward L, P or I (so it is reversed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orientation {
    /// Voxel axis along each world axis.
    pub axis: [usize; 3],
    /// Reverse that voxel axis.
    pub flip: [bool; 3],
}

impl Orientation {
    /// From the affine's axis codes (nibabel `aff2axcodes`); an undetermined axis ('?', a
    /// degenerate affine) takes the voxel axes left over, in order, unflipped.
    pub fn of(affine: &Mat4) -> Orientation {
        let codes: Vec<char> = axcodes(affine).chars().collect();
        let mut axis = [usize::MAX; 3];
        let mut flip = [false; 3];
        for (v, c) in codes.iter().enumerate() {
            let (w, f) = match c {
                'R' => (0, false),
                'L' => (0, true),
                'A' => (1, false),
                'P' => (1, true),
                'S' => (2, false),
                'I' => (2, true),
                _ => continue,
            };
            if axis[w] == usize::MAX {
                axis[w] = v;
                flip[w] = f;
            }
        }
        let taken = axis;
        let mut free = (0..3).filter(|v| !taken.contains(v));
        for a in axis.iter_mut().filter(|a| **a == usize::MAX) {
            *a = free.next().unwrap_or(0);
        }
        Orientation { axis, flip }
    }

    /// `v` viewed in RAS index order (no copy).
    pub fn apply<'a, T>(&self, v: ArrayView3<'a, T>) -> ArrayView3<'a, T> {
        let mut r = v.permuted_axes(self.axis);
        for (w, &f) in self.flip.iter().enumerate() {
            if f {
                r.invert_axis(Axis(w));
            }
        }
        r
    }

    /// Voxel sizes (mm) along R, A, S: the affine's column norms (1 where a column is unusable).
    pub fn spacing(&self, affine: &Mat4) -> [f64; 3] {
        self.axis.map(|v| {
            let n = (0..3).map(|r| affine[r][v].powi(2)).sum::<f64>().sqrt();
            if n > 0.0 && n.is_finite() {
                n
            } else {
                1.0
            }
        })
    }
}
