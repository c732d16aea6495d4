//! Which reader a path goes to: a folder is a DICOM series; otherwise the extension (`.nrrd`,
//! `.nhdr`, `.mha`, `.mhd`, `.hdr`, `.img`), else the NIfTI reader. Formats voxtile does not read
//! get one line naming a converter instead of a NIfTI parse error.

use super::header::Header;
use super::{dicom, hints, metaimage, nrrd, pair, Volume};
use crate::{Error, Result};
use std::path::Path;

/// The reader of one input path.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Dicom,
    Nrrd,
    MetaImage,
    Pair,
    Nifti,
}

/// The path's lower-case name with a trailing `.gz` removed (`a.img.gz` → `a.img`).
fn stem_ext(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name).to_string();
    name.rsplit_once('.')
        .map(|(_, e)| e.to_string())
        .unwrap_or_default()
}

/// Name endings (lower case) of the files a folder of cases lists: one per volume, a pair by its
/// `.hdr`, detached NRRD or MetaImage data by its header file.
const CASE_SUFFIXES: [&str; 8] = [
    ".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd", ".hdr", ".hdr.gz",
];

/// The file name without the ending of a format voxtile reads (`a.nii.gz` → `a`, `b.mha` → `b`),
/// or None for any other name: what a folder of cases counts as a case, and its output name.
pub fn volume_stem(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_string_lossy().to_string();
    let lower = name.to_ascii_lowercase();
    CASE_SUFFIXES
        .iter()
        .find(|s| lower.ends_with(*s) && lower.len() > s.len())
        .map(|s| name[..name.len() - s.len()].to_string())
}

/// One line for a file of a format voxtile does not read, judged by its name alone (a batch
/// folder says which files it skipped and how to convert them); None for any other name.
pub fn foreign_hint(path: &Path) -> Option<String> {
    hints::hint(path, &stem_ext(path), &[])
}

/// Choose the reader, or refuse with a hint.
pub(super) fn kind(path: &Path) -> Result<Kind> {
    // NIfTI names first, without a probe (the common case stays one open).
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ends =
        |t: &str| name.len() >= t.len() && name[name.len() - t.len()..].eq_ignore_ascii_case(t);
    if ends(".nii") || ends(".nii.gz") {
        return Ok(Kind::Nifti);
    }
    if path.is_dir() {
        return Ok(Kind::Dicom);
    }
    let ext = stem_ext(path);
    Ok(match ext.as_str() {
        "nrrd" | "nhdr" => Kind::Nrrd,
        "mha" | "mhd" => Kind::MetaImage,
        "hdr" | "img" => Kind::Pair,
        _ => {
            let head = first_bytes(path);
            if head.starts_with(b"NRRD000") {
                Kind::Nrrd
            } else if let Some(h) = hints::hint(path, &ext, &head) {
                return Err(Error::volume(path, h));
            } else {
                Kind::Nifti
            }
        }
    })
}

/// Up to [`hints::HEAD_LEN`] bytes of a regular file (empty when it cannot be read: the reader
/// then says why).
fn first_bytes(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let Ok((f, len)) = crate::sys::fsio::open_regular(path, u64::MAX, true) else {
        return Vec::new();
    };
    let mut b = vec![0u8; len.min(hints::HEAD_LEN as u64) as usize];
    match f.read_exact_at(&mut b, 0) {
        Ok(()) => b,
        Err(_) => Vec::new(),
    }
}

/// The first bytes of the stream a NIfTI reader sees: decompressed when the file is gzip.
fn first_stream_bytes(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let head = first_bytes(path);
    if !head.starts_with(&[0x1f, 0x8b]) {
        return head;
    }
    let Ok((f, _)) = crate::sys::fsio::open_regular(path, u64::MAX, true) else {
        return head;
    };
    let mut out = Vec::new();
    let mut gz = flate2::read::GzDecoder::new(f).take(hints::HEAD_LEN as u64);
    match gz.read_to_end(&mut out) {
        Ok(_) => out,
        Err(_) => head,
    }
}

/// A NIfTI read that failed on a file that is really another format (a PNG or an MGZ renamed
/// `.nii`) says what the file is instead of the NIfTI parse error; the common case, a good
/// NIfTI, opens the file once.
pub(crate) fn nifti<T>(path: &Path, read: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    read(path).map_err(|e| match e {
        Error::Volume { .. } => match hints::hint_by_magic(path, &first_stream_bytes(path)) {
            Some(h) => Error::volume(path, h),
            None => e,
        },
        e => e,
    })
}

/// Read a whole volume from any supported input: a NIfTI file, a NIfTI-1 pair, an NRRD or
/// MetaImage file, or a folder holding one DICOM series. Data as (channel, i, j, k) f32, scaling
/// applied; the header stands for the NIfTI file a converter would write.
pub fn read(path: impl AsRef<Path>) -> Result<Volume> {
    read_series(path.as_ref(), None)
}

/// Read only the header of any input [`read`] accepts (and, for plain NIfTI files, check the
/// data fits the file).
pub fn read_header(path: impl AsRef<Path>) -> Result<Header> {
    read_series_header(path.as_ref(), None)
}

/// [`read`], taking the DICOM series whose SeriesInstanceUID is `series` where the folder holds
/// several (`--series`); a UID given for anything but a DICOM folder is refused.
pub fn read_series(path: &Path, series: Option<&str>) -> Result<Volume> {
    match series_kind(path, series)? {
        Kind::Dicom => dicom::read_dicom_series(path, series),
        Kind::Nrrd => nrrd::read(path),
        Kind::MetaImage => metaimage::read(path),
        Kind::Pair => pair::read(path),
        Kind::Nifti => nifti(path, super::read::read),
    }
}

/// [`read_header`] with the series choice of [`read_series`].
pub fn read_series_header(path: &Path, series: Option<&str>) -> Result<Header> {
    match series_kind(path, series)? {
        Kind::Dicom => dicom::read_dicom_header(path, series),
        Kind::Nrrd => nrrd::read_header(path),
        Kind::MetaImage => metaimage::read_header(path),
        Kind::Pair => pair::read_header(path),
        Kind::Nifti => nifti(path, super::read::read_header),
    }
}

/// The reader of `path`; a series UID only goes with a DICOM folder.
pub(crate) fn series_kind(path: &Path, series: Option<&str>) -> Result<Kind> {
    let k = kind(path)?;
    match (series, k) {
        (Some(uid), k) if !matches!(k, Kind::Dicom) => Err(Error::volume(
            path,
            format!("--series {uid} picks a series in a DICOM folder, and this is a file"),
        )),
        _ => Ok(k),
    }
}
