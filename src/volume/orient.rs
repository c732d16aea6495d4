//! Reorientation without resampling: the axis permutation and flips that take a stored array to
//! the orientation a model expects (nibabel's `ornt_transform` / `as_closest_canonical`, MONAI's
//! `Orientationd`), the same applied to the outputs in reverse, and the affine of the turned grid.
//!
//! Axis codes are nibabel's: each letter says where the voxel axis points *to* ("RAS": i toward
//! Right, j toward Anterior, k toward Superior). ITK/SimpleITK name the same thing by where an
//! axis comes *from* (their "RAI" is nibabel's "LPS").

use super::geometry::{io_orientation, mat44_to_quatern, Mat4};
use super::Header;
use ndarray::{ArrayView3, ArrayView4, Axis};
use std::fmt;
use std::str::FromStr;

/// The orientation a model runs in: the file's own storage order, or three axis codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Orientation {
    /// The array as the file stores it (no reorientation).
    #[default]
    Stored,
    /// Upper-case axis codes, one of L/R, A/P, S/I each, e.g. `*b"RAS"`.
    Codes([u8; 3]),
}

/// The world axis (0 = x, 1 = y, 2 = z) of an upper-case code letter and whether it is the
/// positive direction (R, A, S).
fn letter_axis(c: u8) -> Option<(usize, bool)> {
    match c {
        b'R' => Some((0, true)),
        b'L' => Some((0, false)),
        b'A' => Some((1, true)),
        b'P' => Some((1, false)),
        b'S' => Some((2, true)),
        b'I' => Some((2, false)),
        _ => None,
    }
}

impl FromStr for Orientation {
    type Err = String;
    /// "stored", or three letters (any case), one of L/R, A/P, S/I each.
    fn from_str(s: &str) -> Result<Orientation, String> {
        if s.eq_ignore_ascii_case("stored") {
            return Ok(Orientation::Stored);
        }
        let bad = || {
            format!(
                "unknown orientation {s:?}: use \"stored\" or three axis codes with one of \
                 L/R, A/P and S/I each (e.g. RAS, LPS)"
            )
        };
        let b = s.as_bytes();
        if b.len() != 3 {
            return Err(bad());
        }
        let codes = [0, 1, 2].map(|i| b[i].to_ascii_uppercase());
        let mut seen = [false; 3];
        for &c in &codes {
            let (w, _) = letter_axis(c).ok_or_else(bad)?;
            if std::mem::replace(&mut seen[w], true) {
                return Err(bad());
            }
        }
        Ok(Orientation::Codes(codes))
    }
}

impl fmt::Display for Orientation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Orientation::Stored => f.write_str("stored"),
            Orientation::Codes(c) => f.write_str(std::str::from_utf8(c).unwrap_or("???")),
        }
    }
}

/// Every one of the 48 axis codes (6 permutations x 8 flips), "RAS" first.
pub fn all_axis_codes() -> Vec<[u8; 3]> {
    let pairs = [(b'R', b'L'), (b'A', b'P'), (b'S', b'I')];
    let perms = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let mut out = Vec::with_capacity(48);
    for p in perms {
        for f in 0..8 {
            out.push([0, 1, 2].map(|a| {
                let (pos, neg) = pairs[p[a]];
                if f >> a & 1 == 1 {
                    neg
                } else {
                    pos
                }
            }));
        }
    }
    out
}

/// An axis permutation with flips: turned axis `a` is stored axis `perm[a]`, reversed when
/// `flip[a]`. Exact (voxels are moved, never interpolated) and exactly invertible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reorientation {
    /// Stored axis of each turned axis.
    pub perm: [usize; 3],
    /// Whether each turned axis runs against its stored axis.
    pub flip: [bool; 3],
}

impl Default for Reorientation {
    fn default() -> Self {
        Reorientation::IDENTITY
    }
}

impl Reorientation {
    /// No change.
    pub const IDENTITY: Reorientation = Reorientation {
        perm: [0, 1, 2],
        flip: [false; 3],
    };

    /// From a grid with `affine` to `target` (closest axes, as nibabel's `io_orientation`);
    /// identity for [`Orientation::Stored`]. An error says which voxel axis has no direction.
    pub fn to(affine: &Mat4, target: Orientation) -> Result<Reorientation, String> {
        let Orientation::Codes(codes) = target else {
            return Ok(Reorientation::IDENTITY);
        };
        let io = io_orientation(affine);
        if let Some(i) = io.iter().position(Option::is_none) {
            return Err(format!(
                "cannot reorient to {target}: the affine gives voxel axis {i} no direction"
            ));
        }
        let mut r = Reorientation::IDENTITY;
        for (a, &c) in codes.iter().enumerate() {
            let (w, pos) = letter_axis(c).ok_or("invalid axis code")?;
            let i = io
                .iter()
                .position(|o| o.is_some_and(|(wi, _)| wi == w))
                .ok_or_else(|| format!("cannot reorient to {target}: no voxel axis along it"))?;
            r.perm[a] = i;
            r.flip[a] = io[i].is_some_and(|(_, p)| p != pos);
        }
        Ok(r)
    }

    /// Whether this changes nothing.
    pub fn is_identity(&self) -> bool {
        *self == Reorientation::IDENTITY
    }

    /// The transform back: applied after `self`, it restores the stored array.
    pub fn inverse(&self) -> Reorientation {
        let mut inv = Reorientation::IDENTITY;
        for a in 0..3 {
            inv.perm[self.perm[a]] = a;
            inv.flip[self.perm[a]] = self.flip[a];
        }
        inv
    }

    /// The turned grid's shape for a stored `shape`.
    pub fn shape(&self, shape: [usize; 3]) -> [usize; 3] {
        self.perm.map(|p| shape[p])
    }

    /// A (channel, i, j, k) view turned (a strided view; copy it for standard layout).
    pub fn apply<'a, T>(&self, v: ArrayView4<'a, T>) -> ArrayView4<'a, T> {
        let [p0, p1, p2] = self.perm;
        let mut v = v.permuted_axes([0, p0 + 1, p1 + 1, p2 + 1]);
        for a in (0..3).filter(|&a| self.flip[a]) {
            v.invert_axis(Axis(a + 1));
        }
        v
    }

    /// An (i, j, k) view turned.
    pub fn apply3<'a, T>(&self, v: ArrayView3<'a, T>) -> ArrayView3<'a, T> {
        let mut v = v.permuted_axes(self.perm);
        for a in (0..3).filter(|&a| self.flip[a]) {
            v.invert_axis(Axis(a));
        }
        v
    }

    /// The affine of the turned grid, for a stored grid of `shape` with `affine`: every voxel
    /// keeps its world position.
    pub fn affine(&self, affine: &Mat4, shape: [usize; 3]) -> Mat4 {
        let mut m = *affine;
        for r in 0..3 {
            let mut t = affine[r][3];
            for a in 0..3 {
                let col = affine[r][self.perm[a]];
                if self.flip[a] {
                    m[r][a] = -col;
                    t += col * (shape[self.perm[a]].max(1) - 1) as f64;
                } else {
                    m[r][a] = col;
                }
            }
            m[r][3] = t;
        }
        m
    }

    /// The header of the turned grid: shape, voxel sizes and both forms follow the axes (the
    /// sform is the turned best affine; a header without coded forms gets codes 2, aligned).
    pub fn header(&self, h: &Header) -> Header {
        let shape = h.shape();
        let mut out = h.clone();
        let pixdim = [1, 2, 3].map(|i| h.pixdim[i]);
        out.set_affine(&self.affine(&h.affine(), shape));
        for a in 0..3 {
            out.dim[a + 1] = shape[self.perm[a]] as i64;
            out.pixdim[a + 1] = pixdim[self.perm[a]];
        }
        out
    }
}

impl Header {
    /// Make `m` this header's geometry: the sform rows, the qform (its quaternion, offset, qfac)
    /// and pixdim[1..4] (the affine's column norms); codes 0 become 2 (aligned).
    pub fn set_affine(&mut self, m: &Mat4) {
        let (q, off, zooms, qfac) = mat44_to_quatern(m);
        self.srow_x = m[0];
        self.srow_y = m[1];
        self.srow_z = m[2];
        [self.quatern_b, self.quatern_c, self.quatern_d] = q;
        [self.qoffset_x, self.qoffset_y, self.qoffset_z] = off;
        self.pixdim[0] = qfac;
        self.pixdim[1..4].copy_from_slice(&zooms);
        if self.sform_code <= 0 {
            self.sform_code = 2;
        }
        if self.qform_code <= 0 {
            self.qform_code = 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::axcodes;
    use ndarray::Array4;

    /// A stored grid of `shape` whose axes are `codes` (1.5, 2, 3 mm steps, some origin).
    fn affine_of(codes: [u8; 3], shape: [usize; 3]) -> Mat4 {
        let mut m = [[0.0; 4]; 4];
        m[3][3] = 1.0;
        let steps = [1.5, 2.0, 3.0];
        for (a, &c) in codes.iter().enumerate() {
            let (w, pos) = letter_axis(c).unwrap();
            m[w][a] = if pos { steps[a] } else { -steps[a] };
        }
        for (w, row) in m.iter_mut().take(3).enumerate() {
            row[3] = 10.0 * w as f64 - 7.0 + shape[w] as f64;
        }
        m
    }

    fn apply_m(m: &Mat4, v: [f64; 3]) -> [f64; 3] {
        [0, 1, 2].map(|r| m[r][0] * v[0] + m[r][1] * v[1] + m[r][2] * v[2] + m[r][3])
    }

    /// The stored voxel whose world position is `w` (brute force over the whole grid).
    fn find_voxel(m: &Mat4, shape: [usize; 3], w: [f64; 3]) -> [usize; 3] {
        for i in 0..shape[0] {
            for j in 0..shape[1] {
                for k in 0..shape[2] {
                    let p = apply_m(m, [i as f64, j as f64, k as f64]);
                    if (0..3).all(|r| (p[r] - w[r]).abs() < 1e-9) {
                        return [i, j, k];
                    }
                }
            }
        }
        panic!("no stored voxel at {w:?}");
    }

    const SHAPE: [usize; 3] = [2, 3, 4];

    fn stored(ch: usize) -> Array4<f32> {
        let [x, y, z] = SHAPE;
        Array4::from_shape_fn((ch, x, y, z), |(c, i, j, k)| {
            (c * 1000 + i * 100 + j * 10 + k) as f32
        })
    }

    #[test]
    fn parses_codes_and_stored() {
        assert_eq!("ras".parse(), Ok(Orientation::Codes(*b"RAS")));
        assert_eq!("Stored".parse(), Ok(Orientation::Stored));
        assert_eq!("LPS".parse::<Orientation>().unwrap().to_string(), "LPS");
        for bad in ["RRS", "RA", "RASX", "XYZ", "", "LRS", "SIA "] {
            assert!(bad.parse::<Orientation>().is_err(), "{bad}");
        }
        let all = all_axis_codes();
        assert_eq!(all.len(), 48);
        for c in &all {
            let s = std::str::from_utf8(c).unwrap();
            assert_eq!(s.parse(), Ok(Orientation::Codes(*c)));
        }
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), 48);
    }

    /// Every stored orientation to every target, against a brute-force reference: each turned
    /// voxel holds the stored voxel at the same world position, the turned affine has the
    /// target's codes, and the inverse restores the stored array.
    #[test]
    fn every_code_to_every_code_matches_brute_force() {
        let data = stored(2);
        for from in all_axis_codes() {
            let (m, shape) = (affine_of(from, SHAPE), SHAPE);
            assert_eq!(axcodes(&m).as_bytes(), from);
            for to in all_axis_codes() {
                let r = Reorientation::to(&m, Orientation::Codes(to)).unwrap();
                let turned = r.apply(data.view()).to_owned();
                let nm = r.affine(&m, shape);
                assert_eq!(axcodes(&nm).as_bytes(), to);
                let ns = r.shape(shape);
                assert_eq!(&turned.shape()[1..], &ns[..]);
                for ((c, i, j, k), &v) in turned.indexed_iter() {
                    let w = apply_m(&nm, [i as f64, j as f64, k as f64]);
                    let [si, sj, sk] = find_voxel(&m, shape, w);
                    assert_eq!(v, data[[c, si, sj, sk]], "{from:?} -> {to:?}");
                }
                let back = r.inverse().apply(turned.view()).to_owned();
                assert_eq!(back, data);
                let labels = data.index_axis(Axis(0), 1);
                let l2 = r.apply3(labels);
                assert_eq!(r.inverse().apply3(l2), labels);
                assert_eq!(l2, turned.index_axis(Axis(0), 1));
            }
        }
    }

    #[test]
    fn same_codes_is_identity_and_stored_too() {
        let m = affine_of(*b"LPS", SHAPE);
        assert!(Reorientation::to(&m, Orientation::Codes(*b"LPS"))
            .unwrap()
            .is_identity());
        assert!(Reorientation::to(&m, Orientation::Stored)
            .unwrap()
            .is_identity());
        let r = Reorientation::to(&m, Orientation::Codes(*b"RAS")).unwrap();
        assert_eq!(r.perm, [0, 1, 2]);
        assert_eq!(r.flip, [true, true, false]);
    }

    /// An oblique affine turns to its closest axes; a degenerate one is refused by name.
    #[test]
    fn oblique_and_degenerate_affines() {
        let (c, s) = (0.3f64.cos(), 0.3f64.sin());
        // i mostly toward -z, j mostly toward +x, k mostly toward -y, rotated 0.3 rad.
        let m: Mat4 = [
            [0.0, 2.0 * c, 3.0 * s, 5.0],
            [0.0, 2.0 * s, -3.0 * c, 6.0],
            [-1.5, 0.0, 0.0, 7.0],
            [0.0, 0.0, 0.0, 1.0],
        ];
        assert_eq!(axcodes(&m), "IRP");
        let r = Reorientation::to(&m, Orientation::Codes(*b"RAS")).unwrap();
        assert_eq!(r.perm, [1, 2, 0]);
        assert_eq!(r.flip, [false, true, true]);
        assert_eq!(axcodes(&r.affine(&m, SHAPE)), "RAS");
        let mut flat = m;
        for row in flat.iter_mut().take(3) {
            row[2] = 0.0;
        }
        let e = Reorientation::to(&flat, Orientation::Codes(*b"RAS")).unwrap_err();
        assert!(e.contains("voxel axis 2"), "{e}");
    }

    /// The turned header carries the turned affine, shape and voxel sizes.
    #[test]
    fn turned_header_geometry() {
        let mut h = Header::new(SHAPE, 1, [1.0; 3]);
        let m = affine_of(*b"PIL", SHAPE);
        h.set_affine(&m);
        assert_eq!(h.orientation(), "PIL");
        let r = Reorientation::to(&m, Orientation::Codes(*b"RAS")).unwrap();
        let t = r.header(&h);
        assert_eq!(t.orientation(), "RAS");
        assert_eq!(t.shape(), r.shape(SHAPE));
        assert_eq!(t.spacing(), r.perm.map(|p| h.spacing()[p]));
        let want = r.affine(&m, SHAPE);
        let got = t.affine();
        let q = t.qform_affine();
        for i in 0..4 {
            for j in 0..4 {
                assert!((got[i][j] - want[i][j]).abs() < 1e-9);
                assert!((q[i][j] - want[i][j]).abs() < 1e-6, "qform {q:?}");
            }
        }
    }
}
