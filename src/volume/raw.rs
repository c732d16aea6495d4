//! What the non-NIfTI readers share: the NIfTI header that stands for their geometry, capped text
//! headers, sibling data files, and voxel payloads (plain, gzip or zlib) read with the NIfTI
//! reader's memory rules.

use super::geometry::{mat44_to_quatern, Mat4};
use super::header::{self, Header};
use super::Volume;
use crate::{Error, Result};
use ndarray::{Array4, ShapeBuilder};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest text header (NRRD, MetaImage) read: real ones are a few hundred bytes.
pub(crate) const TEXT_HEADER_CAP: usize = 1 << 20;

/// File formats voxtile reads, as `voxtile info` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A single-file NIfTI-1 or NIfTI-2 (`.nii`, `.nii.gz`).
    #[default]
    Nifti,
    /// A NIfTI-1 `.hdr`/`.img` pair.
    NiftiPair,
    /// A folder holding one DICOM series.
    Dicom,
    /// NRRD (`.nrrd`, or `.nhdr` with a detached data file).
    Nrrd,
    /// MetaImage (`.mha`, or `.mhd` with a detached data file).
    MetaImage,
}

impl Format {
    /// The format's name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Nifti => "NIfTI",
            Format::NiftiPair => "NIfTI-1 pair",
            Format::Dicom => "DICOM series",
            Format::Nrrd => "NRRD",
            Format::MetaImage => "MetaImage",
        }
    }
}

/// How a voxel payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// The bytes as they are.
    Raw,
    /// A gzip stream (NRRD `gzip`).
    Gzip,
    /// A zlib stream (MetaImage `CompressedData = True`).
    Zlib,
}

/// The header of a volume read from a non-NIfTI format: its shape and RAS affine as a NIfTI-1
/// header (sform and qform both the affine), `datatype` the stored type, `scale` informative only
/// (the data handed out is already scaled).
pub(crate) fn header_for(
    format: Format,
    shape: [usize; 3],
    affine: &Mat4,
    datatype: i16,
    scale: Option<(f64, f64)>,
) -> Header {
    let mut h = Header::new(shape, 1, [1.0; 3]);
    let (q, off, zooms, qfac) = mat44_to_quatern(affine);
    h.format = format;
    h.datatype = datatype;
    h.bitpix = header::datatype_info(datatype).map_or(32, |(_, b)| 8 * b as i16);
    h.pixdim[0] = qfac;
    h.pixdim[1..4].copy_from_slice(&zooms);
    [h.quatern_b, h.quatern_c, h.quatern_d] = q;
    [h.qoffset_x, h.qoffset_y, h.qoffset_z] = off;
    h.srow_x = affine[0];
    h.srow_y = affine[1];
    h.srow_z = affine[2];
    if let Some((s, i)) = scale {
        (h.scl_slope, h.scl_inter) = (s, i);
    }
    h
}

/// Refuse an affine with a non-finite entry or a zero-length axis (a hostile or broken header).
pub(crate) fn check_affine(path: &Path, a: &Mat4) -> Result<()> {
    if a.iter().flatten().any(|v| !v.is_finite()) {
        return Err(Error::volume(path, "the geometry has a non-finite value"));
    }
    let zero = (0..3).find(|&j| a.iter().take(3).all(|row| row[j] == 0.0));
    match zero {
        Some(j) => Err(Error::volume(
            path,
            format!("axis {j} has a zero voxel size or direction"),
        )),
        None => Ok(()),
    }
}

/// The text header at the start of `path`: everything up to the first line `is_last` accepts
/// (inclusive) or the first empty line when `is_last` is None; returns (header text, byte offset of
/// what follows it).
pub(crate) fn text_header(
    path: &Path,
    is_last: Option<&dyn Fn(&str) -> bool>,
) -> Result<(String, u64)> {
    let (file, _) = crate::sys::fsio::open_regular(path, u64::MAX, true)?;
    let mut buf = Vec::new();
    file.take(TEXT_HEADER_CAP as u64)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    let mut at = 0usize;
    while at < buf.len() {
        let end = buf[at..].iter().position(|&c| c == b'\n');
        let Some(end) = end.map(|e| at + e) else {
            break;
        };
        let line = String::from_utf8_lossy(&buf[at..end]);
        let line = line.trim_end_matches('\r');
        let last = match is_last {
            Some(f) => f(line),
            None => line.is_empty(),
        };
        if last {
            let text = String::from_utf8_lossy(&buf[..end]).into_owned();
            return Ok((text, end as u64 + 1));
        }
        at = end + 1;
    }
    if buf.len() == TEXT_HEADER_CAP {
        return Err(Error::volume(
            path,
            format!("no end of the header in its first {TEXT_HEADER_CAP} bytes"),
        ));
    }
    if is_last.is_none() {
        // A detached NRRD header may simply end.
        return Ok((String::from_utf8_lossy(&buf).into_owned(), buf.len() as u64));
    }
    Err(Error::volume(path, "truncated header (no data file line)"))
}

/// A detached data file named in `header`'s text: a plain name in the header's own folder (no
/// folder part, no `..`), so a header cannot make voxtile read elsewhere.
pub(crate) fn sibling(header: &Path, name: &str) -> Result<PathBuf> {
    let name = name.trim();
    let plain = !name.is_empty()
        && !name.contains('/')
        && !name.contains('\\')
        && name != "."
        && name != "..";
    if !plain {
        return Err(Error::volume(
            header,
            format!("data file \"{name}\" must be a file name in the header's own folder"),
        ));
    }
    Ok(header.parent().unwrap_or(Path::new(".")).join(name))
}

/// The three axis sizes of a text header's `field` ("NRRD sizes", "MetaImage DimSize"): whole
/// numbers from 1 to 2^63 - 1 (a NIfTI dim), whose voxel count times `bpv` bytes fits 64 bits. A
/// size out of range is an error naming it, never wrapped or clamped (2^63 once read as 1).
pub(crate) fn sizes(path: &Path, field: &str, text: &str, bpv: usize) -> Result<[usize; 3]> {
    let bad = |why: String| Error::volume(path, format!("invalid {field}: {why}"));
    let toks: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .collect();
    if toks.len() != 3 {
        return Err(bad(format!(
            "{} values, 3 expected (a 3-D volume)",
            toks.len()
        )));
    }
    let mut out = [0usize; 3];
    for (o, t) in out.iter_mut().zip(&toks) {
        let shown = clip(t, 24);
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("\"{shown}\" is not a whole number")));
        }
        let v = t
            .parse::<u64>()
            .ok()
            .filter(|&v| v <= i64::MAX as u64 && v <= usize::MAX as u64)
            .ok_or_else(|| bad(format!("{shown} is more than an axis may have (2^63 - 1)")))?;
        if v == 0 {
            return Err(bad("an axis of size 0".into()));
        }
        *o = v as usize;
    }
    out.iter()
        .try_fold(bpv as u64, |a, &d| a.checked_mul(d as u64))
        .ok_or_else(|| {
            bad(format!(
                "{}x{}x{} voxels overflow a 64-bit byte count",
                out[0], out[1], out[2]
            ))
        })?;
    Ok(out)
}

/// At most `n` characters of `s` (a header value shown in a message), "..." marking a cut.
pub(crate) fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

/// The voxel count of `shape`, checked against the memory rules before anything is allocated.
pub(crate) fn check_voxels(path: &Path, shape: [usize; 3]) -> Result<usize> {
    let n = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .ok_or_else(|| Error::volume(path, "dimensions overflow the voxel count"))?;
    let what = format!("volume of {}x{}x{} voxels", shape[0], shape[1], shape[2]);
    super::read::check_f32_values(n, &what, false).map_err(|m| Error::volume(path, m))?;
    Ok(n as usize)
}

/// f32 values (i fastest) of `bytes` stored as NIfTI `datatype`, scaled by `scale` in f64.
pub(crate) fn to_f32(
    bytes: &[u8],
    datatype: i16,
    big_endian: bool,
    scale: Option<(f64, f64)>,
) -> Result<Vec<f32>, String> {
    let (_, bpv) = header::datatype_info(datatype)?;
    let mut out = Vec::new();
    out.try_reserve_exact(bytes.len() / bpv)
        .map_err(|_| "not enough memory for the volume".to_string())?;
    super::read::convert(bytes, datatype, big_endian, scale, &mut out);
    Ok(out)
}

/// A volume from f32 values in file order (i fastest, channel slowest), as the NIfTI reader
/// builds it.
pub(crate) fn volume(path: &Path, values: Vec<f32>, header: Header) -> Result<Volume> {
    let [x, y, z] = header.shape();
    let c = header.channels();
    let data = Array4::from_shape_vec((x, y, z, c).f(), values)
        .map_err(|e| Error::volume(path, format!("voxel count does not match the shape ({e})")))?
        .permuted_axes([3, 0, 1, 2]);
    Ok(Volume { data, header })
}

/// Parse `n` whitespace- or comma-separated numbers (a text header's value).
pub(crate) fn numbers<T: std::str::FromStr>(s: &str, n: usize) -> Option<Vec<T>> {
    let v: Vec<T> = s
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == n).then_some(v)
}

/// LPS to RAS: negate the first two rows of an affine.
pub(crate) fn lps_to_ras(a: &mut Mat4) {
    for row in a.iter_mut().take(2) {
        for v in row.iter_mut() {
            *v = -*v;
        }
    }
}
