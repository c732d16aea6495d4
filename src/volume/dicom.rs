//! DICOM series folders (CT/MR, one frame per file) read with dicom-rs, laid out as dcm2niix
//! writes them: i = column, j = row reversed (dcm2niix flips rows), k = slices in increasing
//! position along the normal (row cosine × column cosine); RescaleSlope/Intercept applied; the
//! affine from ImageOrientationPatient/ImagePositionPatient/PixelSpacing, LPS turned to RAS.
//!
//! A folder with several series is refused (listing them) unless one is chosen by its
//! SeriesInstanceUID; so are uneven spacing, several images at one position, multi-frame files
//! and transfer syntaxes dicom-pixeldata is not built for here (named in the error).

use super::dicom_meta::Slice;
use super::geometry::Mat4;
use super::header::Header;
use super::raw::{self, Format};
use super::summary::Accumulator;
use super::{Stats, Volume};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Most files a series folder may hold (a CT series has a few thousand).
const MAX_FILES: usize = 100_000;

/// Largest single DICOM file read (one frame; a 4096² float64 slice is 128 MiB).
pub(crate) const FILE_CAP: u64 = 1 << 30;

/// Whether `path` is a folder holding at least one DICOM file (a `DICM` file among its first
/// entries): where the CLI expects a folder of volumes, such a folder is one series instead.
pub fn is_dicom_series_dir(path: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(path) else {
        return false;
    };
    rd.flatten()
        .take(64)
        .any(|e| e.file_type().is_ok_and(|t| t.is_file()) && has_dicm(&e.path()))
}

/// The 128-byte preamble followed by `DICM`.
fn has_dicm(p: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok((f, len)) = crate::sys::fsio::open_regular(p, u64::MAX, true) else {
        return false;
    };
    let mut m = [0u8; 4];
    len >= 132 && f.read_exact_at(&mut m, 128).is_ok() && &m == b"DICM"
}

/// The regular, non-hidden files of `dir`, sorted by name.
fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        if !hidden && e.file_type().is_ok_and(|t| t.is_file()) {
            files.push(e.path());
            if files.len() > MAX_FILES {
                return Err(Error::volume(
                    dir,
                    format!("more than {MAX_FILES} files: not one series folder"),
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The slices of the chosen series, sorted along the normal, checked for one even grid.
fn select(dir: &Path, series: Option<&str>) -> Result<Vec<Slice>> {
    let mut all = Vec::new();
    for p in list(dir)? {
        if has_dicm(&p) {
            if let Some(s) = Slice::scan(&p)? {
                all.push(s);
            }
        }
    }
    if all.is_empty() {
        return Err(Error::volume(
            dir,
            "no DICOM image files in this folder (files with the DICM signature)",
        ));
    }
    let mut uids: Vec<&str> = all.iter().map(|s| s.series.as_str()).collect();
    uids.sort();
    uids.dedup();
    let chosen = match series {
        Some(u) if uids.contains(&u) => u.to_string(),
        None if uids.len() == 1 => uids[0].to_string(),
        _ => {
            let listing: Vec<String> = uids
                .iter()
                .map(|u| {
                    let of: Vec<&Slice> = all.iter().filter(|s| s.series == *u).collect();
                    format!("{u} ({} files, {})", of.len(), of[0].describe())
                })
                .collect();
            let what = match series {
                Some(u) => format!("no series {u} here"),
                None => "several series in one folder".to_string(),
            };
            return Err(Error::volume(
                dir,
                format!(
                    "{what}; choose one with --series UID: {}",
                    listing.join("; ")
                ),
            ));
        }
    };
    let mut slices: Vec<Slice> = all.into_iter().filter(|s| s.series == chosen).collect();
    check_grid(dir, &mut slices)?;
    Ok(slices)
}

/// One grid: same size, orientation and pixel spacing; positions distinct and evenly spaced.
fn check_grid(dir: &Path, slices: &mut [Slice]) -> Result<()> {
    let first = slices[0].clone();
    for s in slices.iter() {
        let differs = |a: &[f64], b: &[f64]| a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-4);
        let what = if (s.rows, s.cols) != (first.rows, first.cols) {
            Some("image size")
        } else if differs(&s.iop, &first.iop) {
            Some("orientation (ImageOrientationPatient)")
        } else if differs(&s.spacing, &first.spacing) {
            Some("PixelSpacing")
        } else {
            None
        };
        if let Some(w) = what {
            return Err(Error::volume(
                dir,
                format!(
                    "{} and {} differ in {w}: a mixed series voxtile cannot stack",
                    first.path.display(),
                    s.path.display()
                ),
            ));
        }
    }
    let n = first.normal();
    slices.sort_by(|a, b| a.along(&n).total_cmp(&b.along(&n)));
    let pos: Vec<f64> = slices.iter().map(|s| s.along(&n)).collect();
    let gaps: Vec<f64> = pos.windows(2).map(|w| w[1] - w[0]).collect();
    if let Some(i) = gaps.iter().position(|&g| g < 1e-3) {
        return Err(Error::volume(
            dir,
            format!(
                "{} and {} lie at one position ({:.3} mm along the normal): several acquisitions or time points in one series; choose files of one volume",
                slices[i].path.display(),
                slices[i + 1].path.display(),
                pos[i]
            ),
        ));
    }
    if gaps.len() >= 2 {
        let mean = (pos[pos.len() - 1] - pos[0]) / gaps.len() as f64;
        let (mn, mx) = gaps
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &g| (a.min(g), b.max(g)));
        if mx - mn > 0.01 * mean + 1e-3 {
            return Err(Error::volume(
                dir,
                format!(
                    "uneven slice spacing ({mn:.4} to {mx:.4} mm between neighbours): missing slices or a variable-spacing series, which one voxel grid cannot hold"
                ),
            ));
        }
    }
    Ok(())
}

/// dcm2niix's affine (RAS): columns = row cosine × column spacing, −(column cosine) × row spacing
/// (rows flipped), the slice step; origin = the first slice's last row.
fn affine(slices: &[Slice]) -> Mat4 {
    let f = &slices[0];
    let (r, c) = (&f.iop[0..3], &f.iop[3..6]);
    let [dr, dc] = [f.spacing[0], f.spacing[1]];
    let nk = slices.len();
    let step: [f64; 3] = if nk > 1 {
        let l = &slices[nk - 1].ipp;
        [0, 1, 2].map(|i| (l[i] - f.ipp[i]) / (nk - 1) as f64)
    } else {
        f.normal().map(|v| v * f.thickness)
    };
    let last_row = (f.rows as f64 - 1.0) * dr;
    let mut a: Mat4 = [[0.0; 4]; 4];
    for i in 0..3 {
        a[i] = [r[i] * dc, -c[i] * dr, step[i], f.ipp[i] + last_row * c[i]];
    }
    a[3][3] = 1.0;
    raw::lps_to_ras(&mut a);
    a
}

fn header(dir: &Path, slices: &[Slice]) -> Result<Header> {
    let f = &slices[0];
    let a = affine(slices);
    raw::check_affine(dir, &a)?;
    let scale = (f.slope != 1.0 || f.intercept != 0.0).then_some((f.slope, f.intercept));
    let shape = [f.cols, f.rows, slices.len()];
    Ok(raw::header_for(
        Format::Dicom,
        shape,
        &a,
        f.nifti_datatype(),
        scale,
    ))
}

/// The NIfTI header that stands for a DICOM series (shape, geometry), from the files' headers.
pub fn read_dicom_header(dir: &Path, series: Option<&str>) -> Result<Header> {
    let slices = select(dir, series)?;
    header(dir, &slices)
}

/// Read one DICOM series from `dir` (the only one there, or the one whose SeriesInstanceUID is
/// `series`) as a volume in dcm2niix's layout and RAS affine, rescaling applied.
pub fn read_dicom_series(dir: &Path, series: Option<&str>) -> Result<Volume> {
    let slices = select(dir, series)?;
    let h = header(dir, &slices)?;
    warn_assumed(dir, &slices);
    let n = raw::check_voxels(dir, h.shape())?;
    let mut values: Vec<f32> = Vec::new();
    values
        .try_reserve_exact(n)
        .map_err(|_| Error::volume(dir, format!("not enough memory for {n} voxels")))?;
    for s in &slices {
        s.decode_into(&mut values)?;
    }
    raw::volume(dir, values, h)
}

/// The header and value statistics of a series, decoded one slice at a time (`voxtile info`).
pub(crate) fn summarize(dir: &Path, series: Option<&str>) -> Result<(Header, Stats)> {
    let slices = select(dir, series)?;
    let h = header(dir, &slices)?;
    warn_assumed(dir, &slices);
    super::read::check_hard_cap(dir, &h)?;
    let mut acc = Accumulator::new(h.datatype, false, None);
    let mut values = Vec::new();
    for s in &slices {
        values.clear();
        s.decode_into(&mut values)?;
        acc.add_values(&values);
    }
    Ok((h, acc.stats))
}

/// One warning per series read whose files have no PixelSpacing: 1 mm is assumed in-plane.
fn warn_assumed(dir: &Path, slices: &[Slice]) {
    if slices[0].spacing_missing {
        tracing::warn!(
            "{}: no PixelSpacing in the series' files; 1 mm x 1 mm is assumed in-plane",
            dir.display()
        );
    }
}
