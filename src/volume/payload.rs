//! Voxel payloads of the non-NIfTI readers (NRRD, MetaImage, `.hdr`/`.img`): where the bytes
//! live (the header's own file, or a detached file held inside the header's folder), and reading
//! them plain, gzip or zlib, whole or in chunks, never more than the header's byte count.

use super::raw::Encoding;
use crate::{Error, Result};
use flate2::bufread::{MultiGzDecoder, ZlibDecoder};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// The cap of [`open_data`] for voxel data: none on the file, the header bounds what is read.
pub(crate) const NO_CAP: u64 = u64::MAX;

/// Chunk of payload bytes handed to a streaming consumer at a time.
const CHUNK: usize = 8 << 20;

/// Open the payload of `header`: the header file itself when `data_file` is it (the user named
/// it), else the detached `data_file` as model external data is opened ([`crate::sys::fsio::open_contained`]):
/// resolved, inside the header's folder, no-follow, a regular file. A link inside the folder to a
/// file inside it is read; one leading out is refused, and nothing of its content is echoed.
/// `cap`: the largest file accepted ([`NO_CAP`] for voxel data, whose reads are bounded by the
/// header's checked byte count instead: a payload may sit anywhere in a larger file).
pub(crate) fn open_data(header: &Path, data_file: &Path, cap: u64) -> Result<(File, u64)> {
    if data_file == header {
        return crate::sys::fsio::open_regular(header, cap, true);
    }
    let dir = match data_file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = data_file.file_name().ok_or_else(|| {
        Error::volume(
            header,
            format!("data file {} has no file name", data_file.display()),
        )
    })?;
    crate::sys::fsio::open_contained(dir, Path::new(name), "header's", cap)
}

/// Where the payload starts and how it is stored.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    /// Byte offset in the file; None: the last `len` bytes of a raw payload (MetaImage
    /// `HeaderSize = -1`).
    pub offset: Option<u64>,
    /// Bytes of voxel data the header needs (after decompression).
    pub len: u64,
    pub enc: Encoding,
    /// Decompressed bytes skipped before the voxels (NRRD `byte skip` of a compressed payload).
    pub skip: u64,
}

/// A reader positioned at the first voxel byte of `opened` (`file` names it in messages).
fn reader(file: &Path, opened: (File, u64), l: Layout) -> Result<Box<dyn Read>> {
    let (mut f, flen) = opened;
    let offset = match l.offset {
        Some(o) => o,
        None => flen
            .checked_sub(l.len)
            .ok_or_else(|| truncated(file, l.len, flen))?,
    };
    if l.enc == Encoding::Raw && offset.checked_add(l.len).is_none_or(|end| end > flen) {
        return Err(truncated(file, l.len, flen.saturating_sub(offset)));
    }
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(file, e))?;
    let br = BufReader::with_capacity(1 << 20, f);
    let mut r: Box<dyn Read> = match l.enc {
        Encoding::Raw => Box::new(br),
        Encoding::Gzip => Box::new(MultiGzDecoder::new(br)),
        Encoding::Zlib => Box::new(ZlibDecoder::new(br)),
    };
    if l.skip > 0 {
        let n = std::io::copy(&mut (&mut r).take(l.skip), &mut std::io::sink())
            .map_err(|e| zerr(file, e))?;
        if n < l.skip {
            return Err(truncated(file, l.len, 0));
        }
    }
    Ok(r)
}

fn zerr(file: &Path, e: std::io::Error) -> Error {
    Error::volume(file, format!("corrupt or truncated compressed data ({e})"))
}

/// The whole payload. A compressed stream is read through a cap, so a small stream cannot claim
/// more than `len`, and ending early is "truncated".
pub(crate) fn read_all(file: &Path, opened: (File, u64), l: Layout) -> Result<Vec<u8>> {
    let r = reader(file, opened, l)?;
    let mut out = Vec::new();
    if l.enc == Encoding::Raw {
        out.try_reserve_exact(l.len as usize).map_err(|_| {
            Error::volume(
                file,
                format!("not enough memory for {} bytes of voxel data", l.len),
            )
        })?;
    }
    // Compressed: read_to_end grows geometrically, so a bomb fails as truncated early.
    r.take(l.len)
        .read_to_end(&mut out)
        .map_err(|e| zerr(file, e))?;
    if (out.len() as u64) < l.len {
        return Err(truncated(file, l.len, out.len() as u64));
    }
    Ok(out)
}

/// The payload in chunks of whole voxels (`bpv` bytes each) handed to `each`, in file order: the
/// memory of one chunk, whatever the volume's size (`voxtile info`).
pub(crate) fn for_each_chunk(
    file: &Path,
    opened: (File, u64),
    l: Layout,
    bpv: usize,
    mut each: impl FnMut(&[u8]),
) -> Result<()> {
    let mut r = reader(file, opened, l)?.take(l.len);
    let mut buf =
        crate::sys::alloc::try_vec(CHUNK.min(l.len as usize).max(bpv), 0u8, "a read buffer")
            .map_err(|e| Error::volume(file, e.to_string()))?;
    let (mut got, mut filled) = (0u64, 0usize);
    loop {
        let k = r.read(&mut buf[filled..]).map_err(|e| zerr(file, e))?;
        got += k as u64;
        filled += k;
        let whole = filled / bpv * bpv;
        if k == 0 || whole == buf.len() {
            each(&buf[..whole]);
            buf.copy_within(whole..filled, 0);
            filled -= whole;
        }
        if k == 0 {
            break;
        }
    }
    if got < l.len {
        return Err(truncated(file, l.len, got));
    }
    Ok(())
}

fn truncated(file: &Path, need: u64, have: u64) -> Error {
    Error::volume(
        file,
        format!("file is truncated: the header needs {need} bytes of voxel data, found {have}"),
    )
}
