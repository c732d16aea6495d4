//! Formats voxtile does not read, recognised by extension or by magic bytes, each answered with
//! one line naming a converter: a user holding a `.mgz` or a PNG stack learns what to run
//! instead of reading a NIfTI parse error ("sizeof_hdr is 1146245710").

use std::path::Path;

/// Bytes of a file's start that [`by_magic`] looks at (DICOM's `DICM` ends at 132).
pub(crate) const HEAD_LEN: usize = 132;

/// A format voxtile does not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Foreign {
    Mgh,
    Image(&'static str),
    DicomFile,
    Npy,
    Npz,
    Hdf5,
    Zarr,
}

/// By the lower-case extension (a trailing `.gz` removed, see `dispatch::stem_ext`).
fn by_extension(ext: &str) -> Option<Foreign> {
    Some(match ext {
        "mgz" | "mgh" => Foreign::Mgh,
        "png" => Foreign::Image("PNG"),
        "jpg" | "jpeg" => Foreign::Image("JPEG"),
        "tif" | "tiff" => Foreign::Image("TIFF"),
        "bmp" => Foreign::Image("BMP"),
        "dcm" | "ima" => Foreign::DicomFile,
        "npy" => Foreign::Npy,
        "npz" => Foreign::Npz,
        "h5" | "hdf5" | "hdf" => Foreign::Hdf5,
        "zarr" => Foreign::Zarr,
        _ => return None,
    })
}

/// By the first bytes of the file (decompressed when it was gzip): what a renamed file really is.
fn by_magic(head: &[u8]) -> Option<Foreign> {
    let starts = |m: &[u8]| head.starts_with(m);
    if starts(b"\x89PNG\r\n\x1a\n") {
        Some(Foreign::Image("PNG"))
    } else if starts(&[0xFF, 0xD8, 0xFF]) {
        Some(Foreign::Image("JPEG"))
    } else if starts(b"II*\0") || starts(b"MM\0*") {
        Some(Foreign::Image("TIFF"))
    } else if starts(b"\x93NUMPY") {
        Some(Foreign::Npy)
    } else if starts(b"\x89HDF\r\n\x1a\n") {
        Some(Foreign::Hdf5)
    } else if starts(b"PK\x03\x04") {
        Some(Foreign::Npz)
    } else if head.len() >= 132 && &head[128..132] == b"DICM" {
        Some(Foreign::DicomFile)
    } else if head.len() >= 24
        && starts(&[0, 0, 0, 1])
        && matches!(be_i32(&head[20..24]), 0 | 1 | 3 | 4)
    {
        // FreeSurfer MGH: version 1, then width, height, depth, frames and the type, big-endian.
        Some(Foreign::Mgh)
    } else {
        None
    }
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The file name without its extension(s), for the example command (`scan.mgz` → `scan`).
fn base(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "volume".into());
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    match name.rsplit_once('.') {
        Some((b, _)) if !b.is_empty() => b.to_string(),
        _ => name.to_string(),
    }
}

/// The sentence for `f` found at `path` (the path itself is printed before it by the error).
fn sentence(f: Foreign, path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let b = base(path);
    // Never suggest writing over the file itself (a renamed `x.nii.gz`).
    let out = match format!("{b}.nii.gz") {
        o if o == name => format!("{b}_converted.nii.gz"),
        o => o,
    };
    match f {
        Foreign::Mgh => format!(
            "FreeSurfer MGZ/MGH is not read; convert with 'mri_convert {name} {out}'"
        ),
        Foreign::Image(kind) => format!(
            "a {kind} image is not read (voxtile reads 3-D volumes); stack the slices into one NIfTI first, e.g. with SimpleITK: sitk.WriteImage(sitk.ReadImage(sorted(slice_files)), '{out}')"
        ),
        Foreign::DicomFile => {
            let folder = crate::staged::parent_dir(path);
            format!(
                "a single DICOM file is not read; give the folder that holds the whole series ({}), or convert with 'dcm2niix -z y {}'",
                folder.display(),
                folder.display()
            )
        }
        Foreign::Npy => format!(
            "a NumPy array is not read (it has no voxel geometry); save it as NIfTI with nibabel: nib.save(nib.Nifti1Image(np.load('{name}'), affine), '{out}')"
        ),
        Foreign::Npz => format!(
            "a NumPy .npz archive is not read; save the volume as NIfTI with nibabel: nib.save(nib.Nifti1Image(arr, affine), '{out}')"
        ),
        Foreign::Hdf5 => format!(
            "HDF5 is not read; save the volume as NIfTI with h5py and nibabel: nib.save(nib.Nifti1Image(h5py.File('{name}')[KEY][()], affine), '{out}')"
        ),
        Foreign::Zarr => format!(
            "Zarr is not read; save the volume as NIfTI with zarr and nibabel: nib.save(nib.Nifti1Image(zarr.open('{name}')[:], affine), '{out}')"
        ),
    }
}

/// One line for a file voxtile does not read, by its extension `ext` or its first bytes `head`;
/// None for anything else (the readers then say what is wrong).
pub(crate) fn hint(path: &Path, ext: &str, head: &[u8]) -> Option<String> {
    by_extension(ext)
        .or_else(|| by_magic(head))
        .map(|f| sentence(f, path))
}

/// The same, by the first bytes only (a file whose name claims a format voxtile reads).
pub(crate) fn hint_by_magic(path: &Path, head: &[u8]) -> Option<String> {
    by_magic(head).map(|f| sentence(f, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_file_and_the_converter() {
        let h = hint(Path::new("/d/scan.mgz"), "mgz", b"").unwrap();
        assert_eq!(
            h,
            "FreeSurfer MGZ/MGH is not read; convert with 'mri_convert scan.mgz scan.nii.gz'"
        );
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert!(hint(Path::new("x.nii"), "nii", png)
            .unwrap()
            .contains("PNG"));
        let mut mgh = vec![
            0u8, 0, 0, 1, 0, 0, 0, 64, 0, 0, 0, 64, 0, 0, 0, 64, 0, 0, 0, 1,
        ];
        mgh.extend([0, 0, 0, 3]);
        assert!(hint_by_magic(Path::new("b.nii.gz"), &mgh)
            .unwrap()
            .contains("mri_convert b.nii.gz b_converted.nii.gz"));
        assert!(hint(Path::new("a.nii"), "nii", &[92, 1, 0, 0]).is_none());
    }
}
