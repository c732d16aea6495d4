//! Which reader a path goes to: a folder is a DICOM series; otherwise the extension (`.nrrd`,
//! `.nhdr`, `.mha`, `.mhd`, `.hdr`, `.img`), else the NIfTI reader. Formats voxtile does not read
//! get one line naming a converter instead of a NIfTI parse error.

use super::header::Header;
use super::{dicom, metaimage, nrrd, pair, Volume};
use crate::{Error, Result};
use std::path::Path;

/// The reader of one input path.
#[derive(Clone, Copy)]
enum Kind {
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

/// One line for a format voxtile does not read, naming how to convert it.
fn hint(path: &Path, ext: &str, head: &[u8]) -> Option<String> {
    let stack = "a 2-D image: voxtile reads 3-D volumes; stack the slices into one NIfTI first, e.g. with SimpleITK: sitk.WriteImage(sitk.ReadImage(sorted_slice_files), 'volume.nii.gz')";
    let h = match ext {
        "mgz" | "mgh" => "a FreeSurfer MGH volume: convert it with `mri_convert in.mgz out.nii.gz`",
        "png" | "jpg" | "jpeg" | "tif" | "tiff" | "bmp" => stack,
        "dcm" | "ima" => "a single DICOM file: give voxtile the folder that holds the whole series",
        "npz" | "h5" | "hdf5" | "zarr" => {
            "an array container voxtile does not read: save the volume as NIfTI (nibabel: nib.save(nib.Nifti1Image(arr, affine), 'volume.nii.gz'))"
        }
        _ if head.starts_with(b"\x89PNG") || head.starts_with(&[0xFF, 0xD8, 0xFF]) => stack,
        _ if head.starts_with(b"II*\0") || head.starts_with(b"MM\0*") => stack,
        _ if head.len() >= 132 && &head[128..132] == b"DICM" => {
            "a single DICOM file: give voxtile the folder that holds the whole series"
        }
        _ => return None,
    };
    let _ = path;
    Some(h.to_string())
}

/// Choose the reader, or refuse with a hint.
fn kind(path: &Path) -> Result<Kind> {
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
            } else if let Some(h) = hint(path, &ext, &head) {
                return Err(Error::volume(path, h));
            } else {
                Kind::Nifti
            }
        }
    })
}

/// Up to 132 bytes of a regular file (empty when it cannot be read: the reader then says why).
fn first_bytes(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let Ok((f, len)) = crate::fsio::open_regular(path, u64::MAX, true) else {
        return Vec::new();
    };
    let mut b = vec![0u8; len.min(132) as usize];
    match f.read_exact_at(&mut b, 0) {
        Ok(()) => b,
        Err(_) => Vec::new(),
    }
}

/// Read a whole volume from any supported input: a NIfTI file, a NIfTI-1 pair, an NRRD or
/// MetaImage file, or a folder holding one DICOM series. Data as (channel, i, j, k) f32, scaling
/// applied; the header stands for the NIfTI file a converter would write.
pub fn read(path: impl AsRef<Path>) -> Result<Volume> {
    let path = path.as_ref();
    match kind(path)? {
        Kind::Dicom => dicom::read_dicom_series(path, None),
        Kind::Nrrd => nrrd::read(path),
        Kind::MetaImage => metaimage::read(path),
        Kind::Pair => pair::read(path),
        Kind::Nifti => super::read::read(path),
    }
}

/// Read only the header of any input [`read`] accepts (and, for plain NIfTI files, check the
/// data fits the file).
pub fn read_header(path: impl AsRef<Path>) -> Result<Header> {
    let path = path.as_ref();
    match kind(path)? {
        Kind::Dicom => dicom::read_dicom_header(path, None),
        Kind::Nrrd => nrrd::read_header(path),
        Kind::MetaImage => metaimage::read_header(path),
        Kind::Pair => pair::read_header(path),
        Kind::Nifti => super::read::read_header(path),
    }
}
