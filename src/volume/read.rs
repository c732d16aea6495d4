//! Reading `.nii` / `.nii.gz` (gzip found by magic bytes) into f32, with size checks before any
//! large allocation and a capped read of compressed streams.

use super::header::{self, datatype_info, Header};
use super::Volume;
use crate::{Error, Result};
use flate2::bufread::MultiGzDecoder;
use ndarray::{Array4, ShapeBuilder};
use rayon::prelude::*;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// No volume above this many bytes of f32 is loaded, whatever the machine has (2048³ voxels).
pub const HARD_CAP_BYTES: u64 = 32 << 30;

/// An opened NIfTI stream positioned at byte 0 of the (decompressed) file.
struct Source<'a> {
    reader: Box<dyn Read + 'a>,
    gz: bool,
    file_len: u64,
    /// The gzip trailer's ISIZE (uncompressed length mod 2^32) when the stream is gzip.
    gz_isize: Option<u32>,
}

/// A regular file only: a FIFO or a device would hang or stream forever. No cap on the file's
/// size here: what is read is bounded by the header's dims, which [`check_memory`] holds under
/// [`HARD_CAP_BYTES`] of float32 before anything large is allocated.
fn open(path: &Path) -> Result<Source<'static>> {
    let (file, len) = crate::sys::fsio::open_regular(path, u64::MAX, true)?;
    let isize = gz_trailer_isize(&file, len);
    source(path, BufReader::with_capacity(1 << 20, file), len, isize)
}

/// The last 4 bytes of a file (a gzip stream's ISIZE), read without moving `file`'s cursor.
fn gz_trailer_isize(file: &File, len: u64) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 4];
    let at = len.checked_sub(4).filter(|_| len >= 18)?;
    file.read_exact_at(&mut b, at).ok()?;
    Some(u32::from_le_bytes(b))
}

/// Wrap a buffered stream of `file_len` bytes, decompressing when it starts with the gzip magic.
fn source<'a, R: BufRead + 'a>(
    path: &Path,
    mut br: R,
    file_len: u64,
    isize: Option<u32>,
) -> Result<Source<'a>> {
    let head = br.fill_buf().map_err(|e| Error::io(path, e))?;
    let gz = head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
    let reader: Box<dyn Read + 'a> = if gz {
        Box::new(MultiGzDecoder::new(br))
    } else {
        Box::new(br)
    };
    Ok(Source {
        reader,
        gz,
        file_len,
        gz_isize: isize.filter(|_| gz),
    })
}

/// Read until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One sentence for a failed read: gzip decoder errors read as corrupt/truncated compressed data.
fn read_error(path: &Path, gz: bool, e: io::Error) -> Error {
    if gz {
        Error::volume(path, format!("corrupt or truncated gzip stream ({e})"))
    } else {
        Error::io(path, e)
    }
}

/// Parse the header and leave the stream at vox_offset.
fn read_header_from(path: &Path, src: &mut Source) -> Result<Header> {
    let mut buf = [0u8; header::NIFTI2_SIZE];
    let n = read_full(&mut src.reader, &mut buf[..4]).map_err(|e| read_error(path, src.gz, e))?;
    if n < 4 {
        return Err(Error::volume(
            path,
            format!("not a NIfTI file (only {n} bytes, a header needs 348)"),
        ));
    }
    let (_, _, size) =
        header::detect([buf[0], buf[1], buf[2], buf[3]]).map_err(|m| Error::volume(path, m))?;
    let n =
        read_full(&mut src.reader, &mut buf[4..size]).map_err(|e| read_error(path, src.gz, e))?;
    if n < size - 4 {
        return Err(Error::volume(
            path,
            format!("truncated NIfTI header ({} of {size} bytes)", n + 4),
        ));
    }
    let h = header::parse(&buf[..size], src.gz).map_err(|m| Error::volume(path, m))?;
    let data_bytes = h.data_bytes().map_err(|m| Error::volume(path, m))?;
    if !src.gz {
        // Plain files: the size tells at once whether the data is all there.
        if h.vox_offset >= src.file_len {
            return Err(Error::volume(
                path,
                format!(
                    "vox_offset {} is past the end of the file ({} bytes)",
                    h.vox_offset, src.file_len
                ),
            ));
        }
        let need = h.vox_offset.saturating_add(data_bytes);
        if need > src.file_len {
            return Err(Error::volume(
                path,
                format!(
                    "file is truncated: dims {} of {} need {data_bytes} bytes of voxel data from offset {}, but the file has only {} bytes",
                    dims_str(&h),
                    h.dtype_name(),
                    h.vox_offset,
                    src.file_len
                ),
            ));
        }
    }
    // Skip extensions up to the data.
    let skip = h.vox_offset - size as u64;
    let skipped = io::copy(&mut (&mut src.reader).take(skip), &mut io::sink())
        .map_err(|e| read_error(path, src.gz, e))?;
    if skipped < skip {
        return Err(Error::volume(
            path,
            format!(
                "vox_offset {} is past the end of the data ({} bytes)",
                h.vox_offset,
                size as u64 + skipped
            ),
        ));
    }
    Ok(h)
}

fn dims_str(h: &Header) -> String {
    let s = h.shape();
    let c = h.channels();
    if c > 1 {
        format!("{}x{}x{}x{c}", s[0], s[1], s[2])
    } else {
        format!("{}x{}x{}", s[0], s[1], s[2])
    }
}

/// Read only the header (and, for plain files, check the data fits the file).
pub fn read_header(path: &Path) -> Result<Header> {
    let mut src = open(path)?;
    read_header_from(path, &mut src)
}

/// Refuse a volume whose f32 copy would not fit in memory, before allocating it. Against
/// MemAvailable only: under an address-space limit the reader's fallible allocation answers, after
/// a truncated gzip stream has had the chance to fail as truncated.
pub(crate) fn check_memory(path: &Path, h: &Header) -> Result<usize> {
    let n = h.n_values().map_err(|m| Error::volume(path, m))?;
    check_f32_values(n, &format!("volume of {} voxels", dims_str(h)), false)
        .map_err(|m| Error::volume(path, m))?;
    Ok(n as usize)
}

/// The voxel count of `h` if voxtile would ever read it (the hard cap only, not this machine's
/// memory): `voxtile info` streams a volume, yet describes no volume a run could never load.
pub(crate) fn check_hard_cap(path: &Path, h: &Header) -> Result<u64> {
    let n = h.n_values().map_err(|m| Error::volume(path, m))?;
    memory_verdict(
        n,
        &format!("volume of {} voxels", dims_str(h)),
        None,
        HARD_CAP_BYTES,
    )
    .map_err(|m| Error::volume(path, m))?;
    Ok(n)
}

/// Whether `n` float32 values (of `what`, e.g. "volume of 512x512x400 voxels") may be held: the
/// rule of [`memory_verdict`] with this machine's numbers; `address_space` also counts what is
/// left under `ulimit -v` (for buffers about to be allocated in one go).
pub(crate) fn check_f32_values(n: u64, what: &str, address_space: bool) -> Result<(), String> {
    let left = address_space
        .then(crate::sys::alloc::address_space_left)
        .flatten();
    let avail = match (crate::sys::memory::mem_available(), left) {
        (Some(m), Some(l)) => Some(m.min(l)),
        (m, l) => m.or(l),
    };
    memory_verdict(n, what, avail, HARD_CAP_BYTES)
}

/// The memory rule on its own (testable with a made-up MemAvailable): n f32 values must fit under
/// the hard cap, isize::MAX and MemAvailable.
fn memory_verdict(n: u64, what: &str, avail: Option<u64>, cap: u64) -> Result<(), String> {
    let bytes = n.saturating_mul(4);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if bytes > cap || bytes > isize::MAX as u64 {
        return Err(format!(
            "{what} needs {:.1} GiB as float32, above voxtile's limit of {:.0} GiB",
            gib(bytes),
            gib(cap)
        ));
    }
    match avail {
        Some(avail) if bytes > avail => Err(format!(
            "{what} needs {:.1} GiB as float32 but only {:.1} GiB of memory is available",
            gib(bytes),
            gib(avail)
        )),
        _ => Ok(()),
    }
}

/// Decode `bytes` (whole voxels) of one datatype into f32, applying scl_slope/scl_inter in f64.
/// Appends in parallel (rayon writes straight into `out`'s spare capacity).
pub(crate) fn convert(
    bytes: &[u8],
    dt: i16,
    be: bool,
    scale: Option<(f64, f64)>,
    out: &mut Vec<f32>,
) {
    macro_rules! conv {
        ($t:ty, $n:expr) => {{
            out.par_extend(bytes.par_chunks_exact($n).with_min_len(1 << 14).map(|c| {
                let mut a = [0u8; $n];
                a.copy_from_slice(c);
                let v = if be {
                    <$t>::from_be_bytes(a)
                } else {
                    <$t>::from_le_bytes(a)
                };
                match scale {
                    Some((s, i)) => (v as f64 * s + i) as f32,
                    None => v as f32,
                }
            }))
        }};
    }
    match dt {
        header::DT_UINT8 => conv!(u8, 1),
        header::DT_INT8 => conv!(i8, 1),
        header::DT_INT16 => conv!(i16, 2),
        header::DT_UINT16 => conv!(u16, 2),
        header::DT_INT32 => conv!(i32, 4),
        header::DT_UINT32 => conv!(u32, 4),
        header::DT_FLOAT32 => conv!(f32, 4),
        header::DT_INT64 => conv!(i64, 8),
        header::DT_UINT64 => conv!(u64, 8),
        header::DT_FLOAT64 => conv!(f64, 8),
        _ => {} // parse() refused every other code
    }
}

/// Read a whole volume: data as (channel, i, j, k) f32, scaling applied, header kept.
pub fn read(path: &Path) -> Result<Volume> {
    let src = open(path)?;
    read_from(path, src)
}

/// [`read`](crate::volume::read) from an in-memory file (plain or gzip): the same checks, for fuzzing and for callers
/// that already hold the bytes. `path_for_errors` only prefixes messages.
pub fn read_bytes(bytes: &[u8], path_for_errors: &Path) -> Result<Volume> {
    let isize = (bytes.len() >= 18)
        .then(|| u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap_or([0; 4])));
    let src = source(path_for_errors, bytes, bytes.len() as u64, isize)?;
    read_from(path_for_errors, src)
}

fn read_from(path: &Path, mut src: Source<'_>) -> Result<Volume> {
    let h = read_header_from(path, &mut src)?;
    // Once per volume read (not in read_header, which runs before it on the same file).
    for w in h.geometry_warnings() {
        tracing::warn!("{}: {w}", path.display());
    }
    let n = check_memory(path, &h)?;
    let (_, bpv) = datatype_info(h.datatype).map_err(|m| Error::volume(path, m))?;
    let total = n * bpv; // <= 8 * n, n*4 was checked against isize::MAX
    let mut out: Vec<f32> = Vec::new();
    let no_memory = || {
        Error::volume(
            path,
            format!(
                "not enough memory for the volume ({})",
                crate::sys::memory::format_bytes(n as u64 * 4)
            ),
        )
    };
    // A plain file was checked to hold all its data, so reserve it at once; so is a gzip stream
    // whose trailer gives the length the header implies (one member, nothing after the data).
    // Otherwise a gzip stream's length is unknown until it ends: grow geometrically (capped at
    // n), so a tiny stream that claims gigabytes fails as truncated before anything large is
    // allocated.
    let whole_file = (h.vox_offset as usize).saturating_add(total);
    if !src.gz || src.gz_isize == Some(whole_file as u32) {
        out.try_reserve_exact(n).map_err(|_| no_memory())?;
    }
    let scale = h.scaling();
    for_each_chunk(path, &mut src, &h, total, |bytes| {
        let add = bytes.len() / bpv;
        if out.capacity() - out.len() < add {
            let grow = out.len().max(1 << 22).max(add).min(n - out.len());
            out.try_reserve_exact(grow).map_err(|_| no_memory())?;
        }
        convert(bytes, h.datatype, h.big_endian, scale, &mut out);
        Ok(())
    })?;
    let s = h.shape();
    let c = h.channels();
    // The file is Fortran-ordered (i fastest, channel slowest): view it as (i, j, k, c) with Fortran
    // strides, then move the channel axis first. No copy.
    let data = Array4::from_shape_vec((s[0], s[1], s[2], c).f(), out)
        .map_err(|e| Error::volume(path, format!("internal shape error: {e}")))?
        .permuted_axes([3, 0, 1, 2]);
    Ok(Volume { data, header: h })
}

/// The `total` voxel bytes after the header, handed to `each` in buffers of whole voxels
/// (converted in parallel by the caller); a short stream is "truncated", a gzip stream's CRC is
/// checked at its end.
fn for_each_chunk(
    path: &Path,
    src: &mut Source<'_>,
    h: &Header,
    total: usize,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let (_, bpv) = datatype_info(h.datatype).map_err(|m| Error::volume(path, m))?;
    let mut buf =
        crate::sys::alloc::try_vec((8usize << 20).min(total.max(8)), 0u8, "the read buffer")
            .map_err(|e| Error::volume(path, e.to_string()))?;
    let (mut got, mut filled) = (0usize, 0usize);
    while got < total {
        let want = (buf.len() - filled).min(total - got);
        let k = read_full(&mut src.reader, &mut buf[filled..filled + want])
            .map_err(|e| read_error(path, src.gz, e))?;
        got += k;
        filled += k;
        let whole = filled / bpv * bpv;
        each(&buf[..whole])?;
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        if k < want {
            return Err(Error::volume(
                path,
                format!(
                    "file is truncated: dims {} of {} need {total} bytes of voxel data after vox_offset {}, found only {got}",
                    dims_str(h),
                    h.dtype_name(),
                    h.vox_offset
                ),
            ));
        }
    }
    if src.gz {
        // One byte more (the cap): reaching the end of the stream makes the decoder check the CRC;
        // trailing data after the voxels is ignored, as other readers do.
        let mut one = [0u8; 1];
        read_full(&mut src.reader, &mut one).map_err(|e| read_error(path, true, e))?;
    }
    Ok(())
}

/// The header and value statistics of a NIfTI file, its voxels streamed (`voxtile info`: no f32
/// copy of the volume, whatever its size).
pub(crate) fn summarize(path: &Path) -> Result<(Header, super::Stats)> {
    let mut src = open(path)?;
    let h = read_header_from(path, &mut src)?;
    for w in h.geometry_warnings() {
        tracing::warn!("{}: {w}", path.display());
    }
    let n = check_hard_cap(path, &h)?;
    let (_, bpv) = datatype_info(h.datatype).map_err(|m| Error::volume(path, m))?;
    let total = n as usize * bpv; // n * 4 is under the hard cap
    let mut acc = super::summary::Accumulator::new(h.datatype, h.big_endian, h.scaling());
    for_each_chunk(path, &mut src, &h, total, |b| {
        acc.add_bytes(b);
        Ok(())
    })?;
    Ok((h, acc.stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_rule() {
        let gib = 1u64 << 30;
        // 1 Gi values = 4 GiB of f32.
        assert!(memory_verdict(gib, "d", Some(5 * gib), 32 * gib).is_ok());
        let e = memory_verdict(
            gib,
            "volume of 1024x1024x1024 voxels",
            Some(3 * gib),
            32 * gib,
        )
        .unwrap_err();
        assert!(
            e.contains("4.0 GiB") && e.contains("only 3.0 GiB of memory"),
            "{e}"
        );
        let e = memory_verdict(gib, "d", None, 2 * gib).unwrap_err();
        assert!(e.contains("limit of 2 GiB"), "{e}");
        assert!(memory_verdict(gib, "d", None, 32 * gib).is_ok());
        assert!(memory_verdict(u64::MAX / 2, "d", None, u64::MAX).is_err());
        // The real machine: MemAvailable is parsed.
        assert!(crate::sys::memory::mem_available().is_some_and(|b| b > 0));
    }
}
