//! The files an input volume reads: what the output gate must never let a run overwrite. A
//! header may read its voxels from another file (NRRD `data file:`, MetaImage `ElementDataFile`,
//! the `.img` of a `.hdr`/`.img` pair), and a DICOM folder reads every file in it.

use super::dispatch::{kind, Kind};
use super::{metaimage, nrrd, pair};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Every file reading `path` opens: the file itself and its detached data file; for a DICOM
/// folder, every regular file in it. Errors are the readers' (a header that cannot be parsed).
pub fn files_read(path: &Path) -> Result<Vec<PathBuf>> {
    let mut files = vec![path.to_path_buf()];
    match kind(path)? {
        Kind::Dicom => {
            files.clear();
            for e in std::fs::read_dir(path).map_err(|e| Error::io(path, e))? {
                let e = e.map_err(|e| Error::io(path, e))?;
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    files.push(e.path());
                }
            }
            files.sort();
        }
        Kind::Nrrd => files.extend(nrrd::data_file(path)?),
        Kind::MetaImage => files.extend(metaimage::data_file(path)?),
        Kind::Pair => {
            let (hdr, img) = pair::paths(path);
            files = vec![hdr, img];
        }
        Kind::Nifti => {}
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NHDR: &str =
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 2 2 2\nendian: little\nencoding: raw\n";

    #[test]
    fn headers_name_their_data_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let w = |n: &str, text: &str| {
            std::fs::write(d.join(n), text).unwrap();
            d.join(n)
        };
        w("scan.raw", "x");
        let nhdr = w("scan.nhdr", &format!("{NHDR}data file: scan.raw\n"));
        assert_eq!(
            files_read(&nhdr).unwrap(),
            [nhdr.clone(), d.join("scan.raw")]
        );
        let attached = w("a.nrrd", &format!("{NHDR}\n"));
        assert_eq!(
            files_read(&attached).unwrap(),
            std::slice::from_ref(&attached)
        );
        let mhd = w(
            "m.mhd",
            "NDims = 3\nDimSize = 2 2 2\nElementType = MET_FLOAT\nElementDataFile = scan.raw\n",
        );
        assert_eq!(files_read(&mhd).unwrap(), [mhd.clone(), d.join("scan.raw")]);
        for named in ["p.hdr", "p.img"] {
            assert_eq!(
                files_read(&d.join(named)).unwrap(),
                [d.join("p.hdr"), d.join("p.img")]
            );
        }
        let nii = d.join("v.nii.gz");
        assert_eq!(files_read(&nii).unwrap(), std::slice::from_ref(&nii));
        let series = d.join("ct");
        std::fs::create_dir(&series).unwrap();
        std::fs::write(series.join("b"), "").unwrap();
        std::fs::write(series.join("a"), "").unwrap();
        std::fs::create_dir(series.join("sub")).unwrap();
        assert_eq!(
            files_read(&series).unwrap(),
            [series.join("a"), series.join("b")]
        );
    }
}
