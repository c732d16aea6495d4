//! Voxel-to-world geometry: qform quaternions, sform rows, the "best" affine, axis codes.
//!
//! Formulas follow the NIfTI reference library (`nifti_quatern_to_mat44`, `nifti_mat44_to_quatern`)
//! and nibabel (`get_best_affine`, `io_orientation`/`aff2axcodes`), re-derived here in f64.

use super::header::Header;

/// A 4x4 affine, row-major (voxel index to world mm).
pub type Mat4 = [[f64; 4]; 4];
type Mat3 = [[f64; 3]; 3];

/// Which header field the best affine came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffineSource {
    /// The sform rows (sform_code > 0).
    Sform,
    /// The qform quaternion (qform_code > 0, no sform).
    Qform,
    /// Neither code set: NIfTI "method 1", diag(voxel size).
    Pixdim,
}

/// A qform voxel size as nibabel reads it: |pixdim| (a negative one is a sign slip, not a flip:
/// only qfac flips), and 0 or non-finite (unset) as 1.
pub(crate) fn qform_zoom(p: f64) -> f64 {
    let a = p.abs();
    if a > 0.0 && a.is_finite() {
        a
    } else {
        1.0
    }
}

/// Largest b²+c²+d² of a usable quaternion: 1 plus float32 rounding (nibabel allows 3 ulp).
const QUATERN_NORM_TOL: f64 = 1e-6;

/// Matrix of the qform: rotation from the quaternion, scaled by |pixdim| (qfac flips the 3rd
/// column), as nibabel's `get_qform`.
pub fn quatern_to_mat44(q: [f64; 3], offset: [f64; 3], zooms: [f64; 3], qfac: f64) -> Mat4 {
    let [mut b, mut c, mut d] = q;
    let mut a = 1.0 - (b * b + c * c + d * d);
    if a < 1e-7 {
        // 180 degree rotation: (b,c,d) must be normalised, a = 0.
        let n = 1.0 / (b * b + c * c + d * d).sqrt();
        b *= n;
        c *= n;
        d *= n;
        a = 0.0;
    } else {
        a = a.sqrt();
    }
    let xd = qform_zoom(zooms[0]);
    let yd = qform_zoom(zooms[1]);
    let mut zd = qform_zoom(zooms[2]);
    if qfac < 0.0 {
        zd = -zd;
    }
    [
        [
            (a * a + b * b - c * c - d * d) * xd,
            2.0 * (b * c - a * d) * yd,
            2.0 * (b * d + a * c) * zd,
            offset[0],
        ],
        [
            2.0 * (b * c + a * d) * xd,
            (a * a + c * c - b * b - d * d) * yd,
            2.0 * (c * d - a * b) * zd,
            offset[1],
        ],
        [
            2.0 * (b * d - a * c) * xd,
            2.0 * (c * d + a * b) * yd,
            (a * a + d * d - c * c - b * b) * zd,
            offset[2],
        ],
        [0.0, 0.0, 0.0, 1.0],
    ]
}

/// Quaternion parameters of an affine: `(quatern [b,c,d], qoffset, zooms, qfac)`.
///
/// As `nifti_mat44_to_quatern` / nibabel `set_qform`: column norms are the zooms, the nearest
/// orthonormal matrix (polar decomposition) is the rotation, and a left-handed matrix gets qfac = -1
/// with its 3rd column negated before the quaternion is taken.
pub fn mat44_to_quatern(m: &Mat4) -> ([f64; 3], [f64; 3], [f64; 3], f64) {
    let offset = [m[0][3], m[1][3], m[2][3]];
    let mut r: Mat3 = [[0.0; 3]; 3];
    let mut zooms = [0.0; 3];
    for j in 0..3 {
        let n = (m[0][j] * m[0][j] + m[1][j] * m[1][j] + m[2][j] * m[2][j]).sqrt();
        if n > 0.0 && n.is_finite() {
            zooms[j] = n;
            for i in 0..3 {
                r[i][j] = m[i][j] / n;
            }
        } else {
            // A zero column carries no direction: use the unit axis, voxel size 1.
            zooms[j] = 1.0;
            r[j][j] = 1.0;
        }
    }
    let mut q = orthonormalize(&r);
    let qfac = if det3(&q) > 0.0 {
        1.0
    } else {
        for row in q.iter_mut() {
            row[2] = -row[2];
        }
        -1.0
    };
    let (r11, r12, r13) = (q[0][0], q[0][1], q[0][2]);
    let (r21, r22, r23) = (q[1][0], q[1][1], q[1][2]);
    let (r31, r32, r33) = (q[2][0], q[2][1], q[2][2]);
    let a = r11 + r22 + r33 + 1.0;
    let (a, b, c, d) = if a > 0.5 {
        let a = 0.5 * a.sqrt();
        (
            a,
            0.25 * (r32 - r23) / a,
            0.25 * (r13 - r31) / a,
            0.25 * (r21 - r12) / a,
        )
    } else {
        let xd = 1.0 + r11 - (r22 + r33);
        let yd = 1.0 + r22 - (r11 + r33);
        let zd = 1.0 + r33 - (r11 + r22);
        if xd > 1.0 {
            let b = 0.5 * xd.sqrt();
            (
                0.25 * (r32 - r23) / b,
                b,
                0.25 * (r12 + r21) / b,
                0.25 * (r13 + r31) / b,
            )
        } else if yd > 1.0 {
            let c = 0.5 * yd.sqrt();
            (
                0.25 * (r13 - r31) / c,
                0.25 * (r12 + r21) / c,
                c,
                0.25 * (r23 + r32) / c,
            )
        } else {
            let d = 0.5 * zd.sqrt();
            (
                0.25 * (r21 - r12) / d,
                0.25 * (r13 + r31) / d,
                0.25 * (r23 + r32) / d,
                d,
            )
        }
    };
    // The quaternion and its negative are the same rotation; the header stores the one with a >= 0.
    let s = if a < 0.0 { -1.0 } else { 1.0 };
    ([s * b, s * c, s * d], offset, zooms, qfac)
}

fn det3(m: &Mat3) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

fn inv_transpose3(m: &Mat3) -> Option<Mat3> {
    let det = det3(m);
    if det.abs() < 1e-12 || !det.is_finite() {
        return None;
    }
    // inverse transpose = cofactor matrix / det
    let mut c = [[0.0; 3]; 3];
    for (i, row) in c.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            let (i1, i2) = ((i + 1) % 3, (i + 2) % 3);
            let (j1, j2) = ((j + 1) % 3, (j + 2) % 3);
            *v = (m[i1][j1] * m[i2][j2] - m[i1][j2] * m[i2][j1]) / det;
        }
    }
    Some(c)
}

/// Nearest orthonormal matrix (the orthogonal factor of the polar decomposition), by Newton's
/// iteration X <- (X + X^-T)/2; singular input falls back to Gram-Schmidt.
fn orthonormalize(m: &Mat3) -> Mat3 {
    let mut x = *m;
    for _ in 0..100 {
        let Some(it) = inv_transpose3(&x) else {
            return gram_schmidt(m);
        };
        let mut diff = 0.0f64;
        for i in 0..3 {
            for j in 0..3 {
                let n = 0.5 * (x[i][j] + it[i][j]);
                diff = diff.max((n - x[i][j]).abs());
                x[i][j] = n;
            }
        }
        if diff < 1e-15 {
            break;
        }
    }
    x
}

fn gram_schmidt(m: &Mat3) -> Mat3 {
    let col = |j: usize| [m[0][j], m[1][j], m[2][j]];
    let dot = |a: [f64; 3], b: [f64; 3]| a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    let mut cols: Vec<[f64; 3]> = Vec::with_capacity(3);
    for j in 0..3 {
        let mut v = col(j);
        for u in &cols {
            let p = dot(v, *u);
            for k in 0..3 {
                v[k] -= p * u[k];
            }
        }
        let mut n = dot(v, v).sqrt();
        if n.is_nan() || n <= 1e-6 {
            // Degenerate column: pick the unit axis most orthogonal to what we have.
            v = (0..3)
                .map(|a| {
                    let mut e = [0.0; 3];
                    e[a] = 1.0;
                    for u in &cols {
                        let p = dot(e, *u);
                        for k in 0..3 {
                            e[k] -= p * u[k];
                        }
                    }
                    e
                })
                .fold(
                    [0.0; 3],
                    |best, e| if dot(e, e) > dot(best, best) { e } else { best },
                );
            n = dot(v, v).sqrt();
        }
        cols.push([v[0] / n, v[1] / n, v[2] / n]);
    }
    let mut out = [[0.0; 3]; 3];
    for (j, c) in cols.iter().enumerate() {
        for i in 0..3 {
            out[i][j] = c[i];
        }
    }
    out
}

impl Header {
    /// qfac from `pixdim[0]`: -1 when negative, else +1 (0 is the common "unset" value).
    pub fn qfac(&self) -> f64 {
        if self.pixdim[0] < 0.0 {
            -1.0
        } else {
            1.0
        }
    }

    /// The qform matrix (valid whatever qform_code says).
    pub fn qform_affine(&self) -> Mat4 {
        quatern_to_mat44(
            [self.quatern_b, self.quatern_c, self.quatern_d],
            [self.qoffset_x, self.qoffset_y, self.qoffset_z],
            [self.pixdim[1], self.pixdim[2], self.pixdim[3]],
            self.qfac(),
        )
    }

    /// The sform matrix (valid whatever sform_code says).
    pub fn sform_affine(&self) -> Mat4 {
        [self.srow_x, self.srow_y, self.srow_z, [0.0, 0.0, 0.0, 1.0]]
    }

    /// Why the qform fields cannot give an affine (a non-finite quaternion or offset, or a
    /// quaternion (b, c, d) longer than 1, which is no rotation), or None when they can.
    pub fn qform_problem(&self) -> Option<String> {
        let q = [self.quatern_b, self.quatern_c, self.quatern_d];
        let off = [self.qoffset_x, self.qoffset_y, self.qoffset_z];
        if q.iter().chain(&off).any(|v| !v.is_finite()) {
            return Some(format!(
                "its quaternion ({}, {}, {}) or offset ({}, {}, {}) is not finite",
                q[0], q[1], q[2], off[0], off[1], off[2]
            ));
        }
        let norm2: f64 = q.iter().map(|v| v * v).sum();
        if norm2 > 1.0 + QUATERN_NORM_TOL {
            return Some(format!(
                "its quaternion (b, c, d) = ({}, {}, {}) has length {:.6} > 1, which is no rotation",
                q[0],
                q[1],
                q[2],
                norm2.sqrt()
            ));
        }
        None
    }

    /// Why the sform rows cannot give an affine (a non-finite entry), or None when they can.
    pub fn sform_problem(&self) -> Option<String> {
        let rows = [self.srow_x, self.srow_y, self.srow_z];
        rows.iter()
            .flatten()
            .any(|v| !v.is_finite())
            .then(|| format!("its rows {rows:?} are not all finite"))
    }

    /// nibabel's `get_best_affine` order: sform if sform_code > 0, else qform if qform_code > 0, else
    /// diag(spacing) (NIfTI method 1; nibabel would use a centred, x-flipped ANALYZE affine there).
    /// A form whose fields are unusable ([`Header::qform_problem`], [`Header::sform_problem`]) is
    /// skipped; [`Header::geometry_warnings`] says so.
    pub fn affine_with_source(&self) -> (Mat4, AffineSource) {
        if self.sform_code > 0 && self.sform_problem().is_none() {
            (self.sform_affine(), AffineSource::Sform)
        } else if self.qform_code > 0 && self.qform_problem().is_none() {
            (self.qform_affine(), AffineSource::Qform)
        } else {
            let s = self.spacing();
            (
                [
                    [s[0], 0.0, 0.0, 0.0],
                    [0.0, s[1], 0.0, 0.0],
                    [0.0, 0.0, s[2], 0.0],
                    [0.0, 0.0, 0.0, 1.0],
                ],
                AffineSource::Pixdim,
            )
        }
    }
}

impl Header {
    /// One sentence per coded form that [`Header::affine_with_source`] had to skip, naming what
    /// it used instead; empty for a sound header.
    pub fn geometry_warnings(&self) -> Vec<String> {
        let (_, src) = self.affine_with_source();
        let used = match src {
            AffineSource::Sform => "the sform",
            AffineSource::Qform => "the qform",
            AffineSource::Pixdim => "diag(pixdim)",
        };
        let mut out = Vec::new();
        if self.sform_code > 0 {
            if let Some(p) = self.sform_problem() {
                out.push(format!("sform ignored: {p}; using {used}"));
            }
        }
        if self.qform_code > 0 {
            if let Some(p) = self.qform_problem() {
                out.push(format!("qform ignored: {p}; using {used}"));
            }
        }
        out
    }
}

/// Axis codes ("RAS", "LPI"...) of an affine, as nibabel `aff2axcodes(io_orientation(aff))`:
/// for each voxel axis, the world axis it moves along most, picked greedily; '?' when undetermined.
pub fn axcodes(m: &Mat4) -> String {
    let labels = [('L', 'R'), ('P', 'A'), ('I', 'S')];
    io_orientation(m)
        .iter()
        .map(|o| match o {
            Some((w, true)) => labels[*w].1,
            Some((w, false)) => labels[*w].0,
            None => '?',
        })
        .collect()
}

/// nibabel's `io_orientation`: per voxel axis (i, j, k), the world axis (0 = x, 1 = y, 2 = z) it
/// moves along most and whether it moves toward +x/+y/+z (R, A, S); None when undetermined.
/// Greedy in voxel-axis order on the orthogonal polar factor, so no world axis is picked twice.
pub fn io_orientation(m: &Mat4) -> [Option<(usize, bool)>; 3] {
    let mut rs: Mat3 = [[0.0; 3]; 3];
    for j in 0..3 {
        let mut n = (m[0][j] * m[0][j] + m[1][j] * m[1][j] + m[2][j] * m[2][j]).sqrt();
        if n == 0.0 || !n.is_finite() {
            n = 1.0;
        }
        for i in 0..3 {
            rs[i][j] = m[i][j] / n;
        }
    }
    if rs.iter().flatten().any(|v| !v.is_finite()) {
        return [None; 3];
    }
    // Orthogonal polar factor (nibabel: P @ Qs from the SVD); a singular matrix is used as it is.
    let mut r = if inv_transpose3(&rs).is_some() {
        orthonormalize(&rs)
    } else {
        rs
    };
    let mut out = [None; 3];
    for (in_ax, o) in out.iter_mut().enumerate() {
        let col = [r[0][in_ax], r[1][in_ax], r[2][in_ax]];
        if col.iter().all(|v| v.abs() <= 1e-8) {
            continue;
        }
        let mut out_ax = 0;
        for k in 1..3 {
            if col[k].abs() > col[out_ax].abs() {
                out_ax = k;
            }
        }
        *o = Some((out_ax, col[out_ax] >= 0.0));
        r[out_ax] = [0.0; 3];
    }
    out
}

/// The geometry written to every output: sform and qform both equal to the input's best affine.
pub(crate) struct OutGeometry {
    pub qform_code: i32,
    pub sform_code: i32,
    pub quatern: [f64; 3],
    pub qoffset: [f64; 3],
    pub zooms: [f64; 3],
    pub qfac: f64,
    pub sform: [[f64; 4]; 3],
}

/// Codes: each keeps the input's value if > 0, else takes the other's; when both are 0 both stay 0
/// (every reader then applies its own fallback to input and output alike, so they still overlay).
pub(crate) fn output_geometry(like: &Header) -> OutGeometry {
    let (a, src) = like.affine_with_source();
    let qform_code = if like.qform_code > 0 {
        like.qform_code
    } else {
        like.sform_code.max(0)
    };
    let sform_code = if like.sform_code > 0 {
        like.sform_code
    } else {
        like.qform_code.max(0)
    };
    let clamp16 = |c: i32| c.min(i16::MAX as i32);
    let (quatern, qoffset, zooms, qfac) = if src == AffineSource::Qform {
        // Copy the quaternion itself, with the voxel sizes the affine was built from (|pixdim|):
        // the output qform is then the input's matrix, and the sform below is the same one.
        (
            [like.quatern_b, like.quatern_c, like.quatern_d],
            [like.qoffset_x, like.qoffset_y, like.qoffset_z],
            [1, 2, 3].map(|i| qform_zoom(like.pixdim[i])),
            like.qfac(),
        )
    } else {
        let (q, off, z, qfac) = mat44_to_quatern(&a);
        // Keep the input's pixdim when it agrees with the affine's column norms (it almost always
        // does) so pixdim round-trips bit-exactly; otherwise the affine wins, as in nibabel.
        let mut zooms = z;
        for i in 0..3 {
            let p = like.pixdim[i + 1].abs();
            if (p - z[i]).abs() <= 1e-5 * z[i].abs() {
                zooms[i] = p;
            }
        }
        (q, off, zooms, qfac)
    };
    OutGeometry {
        qform_code: clamp16(qform_code),
        sform_code: clamp16(sform_code),
        quatern,
        qoffset,
        zooms,
        qfac,
        sform: [a[0], a[1], a[2]],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent rotation: product of axis rotations (not via quaternions).
    fn rot(ax: f64, ay: f64, az: f64) -> Mat3 {
        let (sx, cx) = ax.sin_cos();
        let (sy, cy) = ay.sin_cos();
        let (sz, cz) = az.sin_cos();
        let rx = [[1.0, 0.0, 0.0], [0.0, cx, -sx], [0.0, sx, cx]];
        let ry = [[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]];
        let rz = [[cz, -sz, 0.0], [sz, cz, 0.0], [0.0, 0.0, 1.0]];
        mul3(&rz, &mul3(&ry, &rx))
    }
    fn mul3(a: &Mat3, b: &Mat3) -> Mat3 {
        let mut c = [[0.0; 3]; 3];
        for i in 0..3 {
            for j in 0..3 {
                c[i][j] = (0..3).map(|k| a[i][k] * b[k][j]).sum();
            }
        }
        c
    }
    fn affine(r: Mat3, zooms: [f64; 3], t: [f64; 3]) -> Mat4 {
        let mut m = [[0.0; 4]; 4];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] = r[i][j] * zooms[j];
            }
            m[i][3] = t[i];
        }
        m[3][3] = 1.0;
        m
    }

    #[test]
    fn quaternion_roundtrip_right_and_left_handed() {
        let angles = [
            (0.0, 0.0, 0.0),
            (0.3, -0.2, 1.1),
            (std::f64::consts::PI, 0.0, 0.0),
            (0.0, std::f64::consts::PI, 0.0),
            (0.0, 0.0, std::f64::consts::PI),
            (2.9, 1.2, -2.5),
        ];
        for &(ax, ay, az) in &angles {
            for flip in [false, true] {
                let mut zooms = [0.7, 1.3, 2.5];
                if flip {
                    zooms[2] = -zooms[2]; // left-handed
                }
                let m = affine(rot(ax, ay, az), zooms, [10.0, -20.0, 5.5]);
                let (q, off, z, qfac) = mat44_to_quatern(&m);
                assert_eq!(qfac, if flip { -1.0 } else { 1.0 });
                for i in 0..3 {
                    assert!((z[i] - zooms[i].abs()).abs() < 1e-12);
                }
                let back = quatern_to_mat44(q, off, z, qfac);
                for i in 0..4 {
                    for j in 0..4 {
                        assert!(
                            (back[i][j] - m[i][j]).abs() < 1e-9,
                            "angles {ax},{ay},{az} flip {flip}: {back:?} vs {m:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn axcodes_match_nibabel_examples() {
        let eye = affine(rot(0.0, 0.0, 0.0), [1.0, 1.0, 1.0], [0.0; 3]);
        assert_eq!(axcodes(&eye), "RAS");
        let las = affine(rot(0.0, 0.0, 0.0), [-2.0, 2.0, 2.0], [0.0; 3]);
        assert_eq!(axcodes(&las), "LAS");
        // Axis permutation: voxel i moves along world z, j along -x, k along y.
        let mut p = [[0.0; 4]; 4];
        p[2][0] = 1.0;
        p[0][1] = -1.0;
        p[1][2] = 1.0;
        p[3][3] = 1.0;
        assert_eq!(axcodes(&p), "SLA");
        // Small oblique rotation keeps the dominant codes.
        let obl = affine(rot(0.1, -0.1, 0.05), [1.0, 1.0, 1.0], [0.0; 3]);
        assert_eq!(axcodes(&obl), "RAS");
    }

    #[test]
    fn singular_affines_do_not_panic() {
        let zero = [[0.0; 4]; 4];
        let (q, off, z, qfac) = mat44_to_quatern(&zero);
        let back = quatern_to_mat44(q, off, z, qfac);
        assert!(back.iter().flatten().all(|v| v.is_finite()));
        assert_eq!(z, [1.0, 1.0, 1.0]);
        let mut twin = [[0.0; 4]; 4];
        twin[0][0] = 1.0;
        twin[0][1] = 1.0;
        twin[2][2] = 1.0;
        let (q, off, z, qfac) = mat44_to_quatern(&twin);
        let back = quatern_to_mat44(q, off, z, qfac);
        assert!(back.iter().flatten().all(|v| v.is_finite()));
        let _ = axcodes(&twin);
        let nan = [[f64::NAN; 4]; 4];
        assert_eq!(axcodes(&nan), "???");
        let _ = mat44_to_quatern(&nan);
    }

    #[test]
    fn negative_pixdim_reads_as_its_magnitude() {
        let mut h = Header::new([4, 4, 4], 1, [1.0; 3]);
        (h.sform_code, h.qform_code) = (0, 1);
        h.pixdim = [-1.0, -2.0, 3.0, -0.5, 1.0, 1.0, 1.0, 1.0];
        let (a, src) = h.affine_with_source();
        assert_eq!(src, AffineSource::Qform);
        // Identity rotation, qfac -1: diag(2, 3, -0.5), as nibabel's get_qform.
        assert_eq!([a[0][0], a[1][1], a[2][2]], [2.0, 3.0, -0.5]);
        let g = output_geometry(&h);
        assert_eq!(g.zooms, [2.0, 3.0, 0.5]);
        let q = quatern_to_mat44(g.quatern, g.qoffset, g.zooms, g.qfac);
        assert_eq!([q[0], q[1], q[2]], g.sform);
    }

    #[test]
    fn unusable_qform_falls_back_with_a_warning() {
        let mut h = Header::new([4, 4, 4], 1, [2.0; 3]);
        h.srow_x = [-2.0, 0.0, 0.0, 5.0];
        h.quatern_b = f64::NAN;
        assert_eq!(h.affine_with_source().1, AffineSource::Sform);
        let w = h.geometry_warnings();
        assert!(
            w.len() == 1 && w[0].contains("qform ignored") && w[0].contains("the sform"),
            "{w:?}"
        );
        h.sform_code = 0;
        h.quatern_b = 0.9;
        h.quatern_c = 0.9;
        assert!(h.qform_problem().is_some_and(|p| p.contains("> 1")));
        assert_eq!(h.affine_with_source().1, AffineSource::Pixdim);
        assert!(h.geometry_warnings()[0].contains("diag(pixdim)"));
        // A 180 degree rotation stored in float32 is still a rotation.
        h.quatern_b = 1.0f32 as f64;
        h.quatern_c = 0.0;
        assert!(h.qform_problem().is_none());
        assert_eq!(h.affine_with_source().1, AffineSource::Qform);
        assert!(h.geometry_warnings().is_empty());
    }
}
