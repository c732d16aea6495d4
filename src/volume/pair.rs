//! NIfTI-1 `.hdr`/`.img` pairs: the header decoded by the `nifti` crate (through
//! `header::parse_as`), the voxels read from the `.img` (plain or gzip) at vox_offset.

use super::header::{self, Header};
use super::raw::{self, Encoding, Format};
use super::Volume;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The `.hdr` and `.img` of a pair named by either (`.gz` kept on both sides).
pub(crate) fn paths(path: &Path) -> (PathBuf, PathBuf) {
    let s = path.to_string_lossy();
    let swap = |from: &str, to: &str| -> Option<PathBuf> {
        let lower = s.to_ascii_lowercase();
        for gz in ["", ".gz"] {
            let tail = format!(".{from}{gz}");
            if lower.ends_with(&tail) {
                return Some(PathBuf::from(format!(
                    "{}.{to}{gz}",
                    &s[..s.len() - tail.len()]
                )));
            }
        }
        None
    };
    match swap("img", "hdr") {
        Some(h) => (h, path.to_path_buf()),
        None => (path.to_path_buf(), swap("hdr", "img").unwrap_or_default()),
    }
}

/// The pair's header, checked as a single file's would be (size of `.img` checked on read).
pub fn read_header(path: &Path) -> Result<Header> {
    let (hdr, _) = paths(path);
    let bytes = crate::fsio::read_regular(&hdr, 1 << 20)?;
    let mut plain = Vec::new();
    let gz = bytes.starts_with(&[0x1f, 0x8b]);
    if gz {
        use std::io::Read;
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .take(header::NIFTI2_SIZE as u64)
            .read_to_end(&mut plain)
            .map_err(|e| Error::volume(&hdr, format!("corrupt gzip stream ({e})")))?;
    } else {
        plain = bytes;
    }
    let mut h = header::parse_as(&plain, gz, true).map_err(|m| Error::volume(&hdr, m))?;
    h.format = Format::NiftiPair;
    Ok(h)
}

/// Read a pair: f32 voxels (channel, i, j, k), scaling applied, the header's geometry.
pub fn read(path: &Path) -> Result<Volume> {
    let h = read_header(path)?;
    let (hdr, img) = paths(path);
    for w in h.geometry_warnings() {
        tracing::warn!("{}: {w}", hdr.display());
    }
    let n = super::read::check_memory(&hdr, &h)?;
    let (_, bpv) = header::datatype_info(h.datatype).map_err(|m| Error::volume(&hdr, m))?;
    let gz = {
        use std::os::unix::fs::FileExt;
        let (f, _) = crate::fsio::open_regular(&img, u64::MAX, true)?;
        let mut m = [0u8; 2];
        f.read_exact_at(&mut m, 0).is_ok() && m == [0x1f, 0x8b]
    };
    let (enc, at, skip) = if gz {
        (Encoding::Gzip, 0, h.vox_offset)
    } else {
        (Encoding::Raw, h.vox_offset, 0)
    };
    let bytes = raw::payload(&img, Some(at), (n * bpv) as u64, enc, skip)?;
    let values = raw::to_f32(&bytes, h.datatype, h.big_endian, h.scaling())
        .map_err(|m| Error::volume(&img, m))?;
    drop(bytes);
    raw::volume(&img, values, h)
}
