//! NIfTI-1 `.hdr`/`.img` pairs: the header decoded by the `nifti` crate (through
//! `header::parse_as`), the voxels read from the `.img` (plain or gzip) at vox_offset.

use super::header::{self, Header};
use super::payload::{self, Layout};
use super::raw::{self, Encoding, Format};
use super::Stats;
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
    use std::io::Read;
    let (f, _) = payload::open_data(path, &hdr, HDR_CAP)?;
    let mut bytes = Vec::new();
    f.take(HDR_CAP)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(&hdr, e))?;
    let mut plain = Vec::new();
    let gz = bytes.starts_with(&[0x1f, 0x8b]);
    if gz {
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

/// Most bytes of a `.hdr` read (a NIfTI-1 header is 348, extensions live in the `.img`).
const HDR_CAP: u64 = 1 << 20;

/// The `.img` opened (the file the user named as it is; the partner of a named `.hdr` held inside
/// its folder, as a detached data file is) and where its voxels start.
fn open_img(path: &Path, h: &Header, n: u64) -> Result<(PathBuf, (std::fs::File, u64), Layout)> {
    use std::os::unix::fs::FileExt;
    let (_, img) = paths(path);
    let opened = payload::open_data(path, &img, payload::NO_CAP)?;
    let mut m = [0u8; 2];
    let gz = opened.0.read_exact_at(&mut m, 0).is_ok() && m == [0x1f, 0x8b];
    let (enc, at, skip) = if gz {
        (Encoding::Gzip, 0, h.vox_offset)
    } else {
        (Encoding::Raw, h.vox_offset, 0)
    };
    let (_, bpv) = header::datatype_info(h.datatype).map_err(|m| Error::volume(&img, m))?;
    let len = n
        .checked_mul(bpv as u64)
        .ok_or_else(|| Error::volume(&img, "voxel data size overflows"))?;
    let l = Layout {
        offset: Some(at),
        len,
        enc,
        skip,
    };
    Ok((img, opened, l))
}

/// Read a pair: f32 voxels (channel, i, j, k), scaling applied, the header's geometry.
pub fn read(path: &Path) -> Result<Volume> {
    let h = read_header(path)?;
    let (hdr, _) = paths(path);
    warn_geometry(path, &h);
    let n = super::read::check_memory(&hdr, &h)?;
    let (img, opened, l) = open_img(path, &h, n as u64)?;
    let bytes = payload::read_all(&img, opened, l)?;
    let values = raw::to_f32(&bytes, h.datatype, h.big_endian, h.scaling())
        .map_err(|m| Error::volume(&img, m))?;
    drop(bytes);
    raw::volume(&img, values, h)
}

/// The header and the value statistics of a pair, the `.img` streamed in chunks.
pub(crate) fn summarize(path: &Path) -> Result<(Header, Stats)> {
    let h = read_header(path)?;
    warn_geometry(path, &h);
    let n = super::read::check_hard_cap(path, &h)?;
    let (img, opened, l) = open_img(path, &h, n)?;
    let st = super::summary::stream(&img, opened, l, &h, h.big_endian, h.scaling())?;
    Ok((h, st))
}

/// The header's geometry warnings, once per read, naming the `.hdr`.
fn warn_geometry(path: &Path, h: &Header) {
    let (hdr, _) = paths(path);
    for w in h.geometry_warnings() {
        tracing::warn!("{}: {w}", hdr.display());
    }
}
