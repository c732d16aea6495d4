//! Writing NIfTI-1 outputs. Each `stage_*` function writes the whole file to a temp file beside
//! its destination ([`crate::staged`]) for the caller to commit with the run's other outputs;
//! each `write_*` function stages and commits at once (replacing an existing file), for library
//! callers with one output.

use super::header::{self, encode_nifti1, Header};
use super::labels::LabelOptions;
use crate::staged::Staged;
use crate::{Error, Result};
use flate2::{Compress, Compression, FlushCompress, Status};
use ndarray::{s, ArrayView3, ArrayView4, Axis};
use rayon::prelude::*;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// gzip level for float outputs: 1, nibabel's default, several times faster than level 6.
const GZ_LEVEL: u32 = 1;

/// gzip level for label maps: level 1 of zlib-rs (static Huffman codes only) leaves label maps
/// about 2x larger than level 3, and with the pieces compressed in parallel level 3 costs a few
/// milliseconds more.
const GZ_LEVEL_LABELS: u32 = 3;

/// Bytes per independently deflated piece of a gzip output.
const GZ_PIECE: usize = 1 << 20;

/// A gzip writer that deflates in parallel, pigz style: the data is cut into [`GZ_PIECE`]-byte
/// pieces, each deflated on its own (rayon) as raw deflate ended by a sync flush (the last one by
/// the final block). The pieces join into ONE deflate stream in ONE gzip member, readable by any
/// gzip reader; the pieces' CRC-32s are combined. A piece never refers back into the previous
/// one, which costs a few hundred bytes per MiB.
pub(crate) struct ParGzWriter<W: Write> {
    inner: W,
    level: Compression,
    /// Pending input: written out as pieces once it holds one piece per thread.
    buf: Vec<u8>,
    batch: usize,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> ParGzWriter<W> {
    pub(crate) fn new(mut inner: W, level: u32) -> io::Result<Self> {
        // The 10-byte gzip header: magic, deflate, no flags, no mtime, XFL 0, OS unknown.
        inner.write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255])?;
        let batch = GZ_PIECE * rayon::current_num_threads().clamp(1, 64);
        Ok(ParGzWriter {
            inner,
            level: Compression::new(level.min(9)),
            buf: Vec::with_capacity(batch),
            batch,
            crc: crc32fast::Hasher::new(),
            len: 0,
        })
    }

    /// Deflate and write `self.buf` as pieces; `last` ends the stream with the final block.
    fn flush_pieces(&mut self, last: bool) -> io::Result<()> {
        let buf = std::mem::take(&mut self.buf);
        self.deflate_out(&buf, last)?;
        self.buf = buf;
        self.buf.clear();
        Ok(())
    }

    /// Deflate `data` as pieces in parallel and write them in order.
    fn deflate_out(&mut self, data: &[u8], last: bool) -> io::Result<()> {
        let pieces: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(GZ_PIECE).collect()
        };
        let np = pieces.len();
        let level = self.level;
        let out: Vec<(Vec<u8>, crc32fast::Hasher)> = pieces
            .into_par_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut h = crc32fast::Hasher::new();
                h.update(p);
                Ok((deflate_piece(p, level, last && i + 1 == np)?, h))
            })
            .collect::<io::Result<_>>()?;
        for (z, h) in out {
            self.inner.write_all(&z)?;
            self.crc.combine(&h);
        }
        self.len += data.len() as u64;
        Ok(())
    }

    /// Write the last pieces and the gzip trailer (CRC-32, length mod 2^32); returns the inner writer.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.flush_pieces(true)?;
        let crc = self.crc.clone().finalize();
        self.inner.write_all(&crc.to_le_bytes())?;
        self.inner.write_all(&(self.len as u32).to_le_bytes())?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for ParGzWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.is_empty() && data.len() >= self.batch {
            // Whole batches straight from the caller's buffer, no copy.
            let n = data.len() / self.batch * self.batch;
            self.deflate_out(&data[..n], false)?;
            return Ok(n);
        }
        let n = data.len().min(self.batch - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.batch {
            self.flush_pieces(false)?;
        }
        Ok(n)
    }
    /// Pieces are only cut at full batches (a flush does not end the gzip stream).
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Raw deflate of one piece, ended by a sync flush (byte-aligned, not final) or, for the last
/// piece, by the final block.
fn deflate_piece(p: &[u8], level: Compression, last: bool) -> io::Result<Vec<u8>> {
    let mut c = Compress::new(level, false);
    let mut out = Vec::with_capacity(p.len() / 2 + 1024);
    let flush = if last {
        FlushCompress::Finish
    } else {
        FlushCompress::Sync
    };
    loop {
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.capacity().max(4096));
        }
        let consumed = c.total_in() as usize;
        let st = c
            .compress_vec(&p[consumed..], &mut out, flush)
            .map_err(io::Error::other)?;
        let done_in = c.total_in() as usize == p.len();
        match st {
            Status::StreamEnd => break,
            // Everything in and room left over: the sync flush is complete.
            Status::Ok | Status::BufError if !last && done_in && out.len() < out.capacity() => {
                break
            }
            _ => {}
        }
    }
    Ok(out)
}

fn is_gz(path: &Path) -> bool {
    path.to_string_lossy().to_ascii_lowercase().ends_with(".gz")
}

/// Stage `path`'s content written through `body`, gzip (at `level`) when `path` ends with .gz.
fn stage_level<F>(path: &Path, level: u32, body: F) -> Result<Staged>
where
    F: FnOnce(&mut dyn Write) -> io::Result<()>,
{
    crate::staged::stage(path, |file| {
        let mut bw = BufWriter::with_capacity(1 << 20, file);
        if is_gz(path) {
            let mut enc = ParGzWriter::new(&mut bw, level)?;
            body(&mut enc)?;
            enc.finish()?;
        } else {
            body(&mut bw)?;
        }
        bw.flush()
    })
}

/// Hand `f` the values of a (i, j, k) view in file order (i fastest, then j, then k), in runs.
///
/// Fortran-ordered views (what `read` returns) are one contiguous run. Any other layout is
/// transposed by blocks of 32 k-planes: each (i, j) k-run is read once and its values go to 32
/// plane buffers that are each filled sequentially.
fn file_order_runs<T: Copy + Default>(
    v: ArrayView3<T>,
    mut f: impl FnMut(&[T]) -> io::Result<()>,
) -> io::Result<()> {
    let (nx, ny, nz) = v.dim();
    let kji = v.permuted_axes([2, 1, 0]);
    if let Some(s) = kji.as_slice() {
        return f(s);
    }
    let plane = nx * ny;
    let b = 32.min(nz.max(1));
    // Planes sit `pitch` apart, padded so that with power-of-two plane sizes the 32 rows being
    // filled at once do not all map to the same cache sets.
    let pitch = plane + 64;
    let mut buf = vec![T::default(); pitch * b];
    let c_src = v.as_slice();
    for k0 in (0..nz).step_by(b) {
        let kb = b.min(nz - k0);
        if let Some(src) = c_src {
            transpose_c_block(src, [nx, ny, nz], k0, kb, &mut buf, pitch);
        } else {
            let block = v.slice(s![.., .., k0..k0 + kb]);
            for j in 0..ny {
                let slab = block.index_axis(Axis(1), j); // (i, k)
                for (i, run) in slab.outer_iter().enumerate() {
                    let base = j * nx + i;
                    for (kk, &x) in run.iter().enumerate() {
                        buf[kk * pitch + base] = x;
                    }
                }
            }
        }
        for kk in 0..kb {
            f(&buf[kk * pitch..kk * pitch + plane])?;
        }
    }
    Ok(())
}

/// Planes `k0..k0 + kb` of a C-ordered (i, j, k) array `src` into `buf` in file order (i fastest),
/// plane `kk` at `kk * pitch`.
///
/// Each (i, j) k-run is contiguous. Tiles of one cache line of i: per j, the tile's runs come
/// from `ti` sequential source streams and fill whole lines of the `kb` destination rows.
fn transpose_c_block<T: Copy>(
    src: &[T],
    [nx, ny, nz]: [usize; 3],
    k0: usize,
    kb: usize,
    buf: &mut [T],
    pitch: usize,
) {
    let ti = (64 / std::mem::size_of::<T>().max(1)).max(1);
    for i0 in (0..nx).step_by(ti) {
        let i1 = (i0 + ti).min(nx);
        for j in 0..ny {
            for i in i0..i1 {
                let at = (i * ny + j) * nz + k0;
                let base = j * nx + i;
                for (kk, &x) in src[at..at + kb].iter().enumerate() {
                    buf[kk * pitch + base] = x;
                }
            }
        }
    }
}

/// Encode runs of values little-endian into a ~512 KiB byte buffer, written out when full.
struct Encoder<'w> {
    w: &'w mut dyn Write,
    buf: Vec<u8>,
}

impl<'w> Encoder<'w> {
    fn new(w: &'w mut dyn Write) -> Self {
        Encoder {
            w,
            buf: Vec::with_capacity(1 << 20),
        }
    }
    fn push<T: Copy, const N: usize>(
        &mut self,
        run: &[T],
        enc: impl Fn(T) -> [u8; N],
    ) -> io::Result<()> {
        for chunk in run.chunks((1 << 19) / N) {
            let start = self.buf.len();
            self.buf.resize(start + chunk.len() * N, 0);
            for (dst, &v) in self.buf[start..].chunks_exact_mut(N).zip(chunk) {
                dst.copy_from_slice(&enc(v));
            }
            if self.buf.len() >= 1 << 19 {
                self.w.write_all(&self.buf)?;
                self.buf.clear();
            }
        }
        Ok(())
    }
    fn finish(self) -> io::Result<()> {
        self.w.write_all(&self.buf)
    }
}

fn check_shape(path: &Path, shape: [usize; 3], like: &Header) -> Result<()> {
    if shape != like.shape() {
        let l = like.shape();
        return Err(Error::Invalid(format!(
            "{}: output shape {}x{}x{} differs from the reference volume's {}x{}x{}",
            path.display(),
            shape[0],
            shape[1],
            shape[2],
            l[0],
            l[1],
            l[2]
        )));
    }
    Ok(())
}

/// The largest label, in parallel over contiguous memory (else a serial pass in memory order).
fn max_label(labels: ArrayView3<u16>) -> u16 {
    match labels.as_slice_memory_order() {
        Some(s) => s
            .par_chunks(1 << 16)
            .map(|c| c.iter().copied().max().unwrap_or(0))
            .max()
            .unwrap_or(0),
        None => labels.fold(0u16, |m, &x| m.max(x)),
    }
}

/// The labels' bytes in file order (i fastest), encoded by `enc`, built in parallel when the
/// array is C- or Fortran-contiguous (what the engine returns); None for other layouts.
///
/// C order (i slowest) is transposed by groups of `g` k-planes, one group per task: each
/// (i, j) k-run is read once per group and its values go to `g` output rows filled in sequence.
fn file_order_bytes<const N: usize>(
    labels: ArrayView3<u16>,
    enc: impl Fn(u16) -> [u8; N] + Sync,
) -> Option<Vec<u8>> {
    let (nx, ny, nz) = labels.dim();
    let plane = nx * ny * N;
    let mut out = vec![0u8; nx * ny * nz * N];
    if out.is_empty() {
        return Some(out);
    }
    if let Some(src) = labels.t().as_slice() {
        // Fortran order: already file order.
        out.par_chunks_mut(1 << 16)
            .zip(src.par_chunks((1 << 16) / N))
            .for_each(|(o, s)| {
                for (d, &v) in o.chunks_exact_mut(N).zip(s) {
                    d.copy_from_slice(&enc(v));
                }
            });
        return Some(out);
    }
    let src = labels.as_slice()?;
    // Enough groups to keep every thread busy, at most 32 planes (one 64-byte line of u16 k-run).
    let g = (nz / (2 * rayon::current_num_threads()).max(1)).clamp(1, 32);
    let vals = nx * ny;
    // Padded scratch planes (see file_order_runs): power-of-two planes written at once would
    // all map to the same cache sets.
    let pitch = vals + 64;
    out.par_chunks_mut(g * plane).enumerate().for_each_init(
        || vec![0u16; g * pitch],
        |buf, (gi, grp)| {
            let kb = grp.len() / plane;
            transpose_c_block(src, [nx, ny, nz], gi * g, kb, buf, pitch);
            for (kk, dst) in grp.chunks_exact_mut(plane).enumerate() {
                for (d, &v) in dst
                    .chunks_exact_mut(N)
                    .zip(&buf[kk * pitch..kk * pitch + vals])
                {
                    d.copy_from_slice(&enc(v));
                }
            }
        },
    );
    Some(out)
}

/// Refuse, before any work, outputs of `channels` channels on `like`'s grid that a NIfTI-1
/// header cannot hold (the encoder's own rule).
pub fn check_output_shape(input: &Path, like: &Header, channels: usize) -> Result<()> {
    let [x, y, z] = like.shape();
    header::check_nifti1_shape(&[x, y, z, channels.max(1)])
        .map_err(|e| Error::volume(input, e.to_string()))
}

/// Write a label map (axes i, j, k) with `like`'s geometry: uint8 when every label < 256, else uint16.
pub fn write_labels(path: impl AsRef<Path>, labels: ArrayView3<u16>, like: &Header) -> Result<()> {
    stage_labels(path.as_ref(), labels, like)?.commit(true)
}

/// [`write_labels`], staged for the caller to commit.
pub fn stage_labels(path: &Path, labels: ArrayView3<u16>, like: &Header) -> Result<Staged> {
    stage_labels_with(path, labels, like, &LabelOptions::default())
}

/// [`write_labels`] with class names (intent LABEL + Caret XML extension) and/or NIfTI-2.
pub fn write_labels_with(
    path: impl AsRef<Path>,
    labels: ArrayView3<u16>,
    like: &Header,
    opts: &LabelOptions,
) -> Result<()> {
    stage_labels_with(path.as_ref(), labels, like, opts)?.commit(true)
}

/// [`write_labels_with`], staged for the caller to commit.
pub fn stage_labels_with(
    path: &Path,
    labels: ArrayView3<u16>,
    like: &Header,
    opts: &LabelOptions,
) -> Result<Staged> {
    let (nx, ny, nz) = labels.dim();
    check_shape(path, [nx, ny, nz], like)?;
    let max = max_label(labels);
    let dt = if max < 256 {
        header::DT_UINT8
    } else {
        header::DT_UINT16
    };
    let hdr = super::labels::label_header(like, [nx, ny, nz], dt, opts)
        .map_err(|m| Error::volume(path, m))?;
    let bytes = if dt == header::DT_UINT8 {
        file_order_bytes(labels, |v| [v as u8])
    } else {
        file_order_bytes(labels, |v: u16| v.to_le_bytes())
    };
    stage_level(path, GZ_LEVEL_LABELS, |w| {
        w.write_all(&hdr)?;
        if let Some(b) = &bytes {
            return w.write_all(b);
        }
        let mut e = Encoder::new(w);
        file_order_runs(labels, |run| {
            if dt == header::DT_UINT8 {
                e.push(run, |v| [v as u8])
            } else {
                e.push(run, |v: u16| v.to_le_bytes())
            }
        })?;
        e.finish()
    })
}

/// Write float32 data (channel, i, j, k) with `like`'s geometry: 3-D for one channel, else 4-D
/// (x, y, z, channel).
pub fn write_f32(path: &Path, data: ArrayView4<f32>, like: &Header) -> Result<()> {
    stage_f32(path, data, like)?.commit(true)
}

/// [`write_f32`], staged for the caller to commit.
pub fn stage_f32(path: &Path, data: ArrayView4<f32>, like: &Header) -> Result<Staged> {
    let (nc, nx, ny, nz) = data.dim();
    check_shape(path, [nx, ny, nz], like)?;
    if nc == 0 {
        return Err(Error::Invalid(format!(
            "{}: cannot write a volume with 0 channels",
            path.display()
        )));
    }
    let hdr = encode_nifti1(
        like,
        [nx, ny, nz],
        nc,
        header::DT_FLOAT32,
        "voxtile float32",
    )
    .map_err(|m| Error::volume(path, m))?;
    stage_level(path, GZ_LEVEL, |w| {
        w.write_all(&hdr)?;
        let mut e = Encoder::new(w);
        // Channel is the slowest axis on disk.
        for c in 0..nc {
            file_order_runs(data.index_axis(Axis(0), c), |run| {
                e.push(run, |v: f32| v.to_le_bytes())
            })?;
        }
        e.finish()
    })
}

/// Write values in [0, 1] (channel, i, j, k) as uint8 `round(255·v)` with scl_slope 1/255, so that
/// readers see the [0, 1] values again at a quarter of float32's size (probability maps).
pub fn write_unit_u8(path: &Path, data: ArrayView4<f32>, like: &Header) -> Result<()> {
    stage_unit_u8(path, data, like)?.commit(true)
}

/// [`write_unit_u8`], staged for the caller to commit.
pub fn stage_unit_u8(path: &Path, data: ArrayView4<f32>, like: &Header) -> Result<Staged> {
    let (nc, nx, ny, nz) = data.dim();
    check_shape(path, [nx, ny, nz], like)?;
    if nc == 0 {
        return Err(Error::Invalid(format!(
            "{}: cannot write a volume with 0 channels",
            path.display()
        )));
    }
    let mut hdr = encode_nifti1(
        like,
        [nx, ny, nz],
        nc,
        header::DT_UINT8,
        "voxtile uint8/255",
    )
    .map_err(|m| Error::volume(path, m))?;
    hdr[112..116].copy_from_slice(&(1.0f32 / 255.0).to_le_bytes()); // scl_slope
    hdr[124..128].copy_from_slice(&1f32.to_le_bytes()); // cal_max
    stage_level(path, GZ_LEVEL, |w| {
        w.write_all(&hdr)?;
        let mut e = Encoder::new(w);
        for c in 0..nc {
            file_order_runs(data.index_axis(Axis(0), c), |run| {
                e.push(run, |v: f32| [unit_to_u8(v)])
            })?;
        }
        e.finish()
    })
}

/// round(255·v) with v clamped to [0, 1] (NaN reads as 0).
pub fn unit_to_u8(v: f32) -> u8 {
    let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
    (v * 255.0).round() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_mid_write_removes_temp_and_keeps_old_target() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["out.nii", "out.nii.gz"] {
            let out = dir.path().join(name);
            std::fs::write(&out, b"old contents").unwrap();
            let err = stage_level(&out, GZ_LEVEL, |w| {
                w.write_all(&[7u8; 3 << 20])?; // several buffer flushes reach the disk first
                Err(io::Error::other("simulated failure"))
            })
            .unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
            assert!(err.to_string().contains("simulated failure"), "{err}");
            assert_eq!(std::fs::read(&out).unwrap(), b"old contents");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn file_order_runs_any_layout() {
        use ndarray::{Array3, ShapeBuilder};
        // 3 x 4 x 70: more than one 32-plane block, last block partial.
        let (nx, ny, nz) = (3, 4, 70);
        let want: Vec<u32> = (0..(nx * ny * nz) as u32).collect(); // value = file index
        let f = |(i, j, k): (usize, usize, usize)| (i + nx * (j + ny * k)) as u32;
        let c = Array3::from_shape_fn((nx, ny, nz), f);
        let fo = Array3::from_shape_fn((nx, ny, nz).f(), f);
        let mut odd = Array3::from_shape_fn((nz, nx, ny), |(k, i, j)| f((i, j, k)));
        odd.invert_axis(ndarray::Axis(1));
        let odd = odd.permuted_axes([1, 2, 0]);
        let mut odd_owned = odd.to_owned();
        odd_owned.invert_axis(ndarray::Axis(0));
        for v in [c.view(), fo.view(), odd_owned.view()] {
            let mut got = Vec::new();
            file_order_runs(v, |r| {
                got.extend_from_slice(r);
                Ok(())
            })
            .unwrap();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn file_order_bytes_matches_runs_and_max() {
        use ndarray::{Array3, ShapeBuilder};
        // 5 x 3 x 70 (groups of planes, the last one partial), labels up to 300.
        let (nx, ny, nz) = (5, 3, 70);
        let f = |(i, j, k): (usize, usize, usize)| ((i * 31 + j * 7 + k * 3) % 301) as u16;
        let c = Array3::from_shape_fn((nx, ny, nz), f);
        let fo = Array3::from_shape_fn((nx, ny, nz).f(), f);
        // File order by hand: i fastest.
        let mut want8 = Vec::new();
        let mut want16 = Vec::new();
        for k in 0..nz {
            for j in 0..ny {
                for i in 0..nx {
                    want8.push(f((i, j, k)) as u8);
                    want16.extend_from_slice(&f((i, j, k)).to_le_bytes());
                }
            }
        }
        for v in [c.view(), fo.view()] {
            assert_eq!(file_order_bytes(v, |x| [x as u8]).unwrap(), want8);
            assert_eq!(
                file_order_bytes(v, |x: u16| x.to_le_bytes()).unwrap(),
                want16
            );
            assert_eq!(max_label(v), 300);
        }
        // Other layouts: no fast path, and the max still right.
        let odd = c.view().permuted_axes([1, 0, 2]);
        assert!(file_order_bytes(odd, |x| [x as u8]).is_none());
        let part = odd.slice(s![.., .., ..2]);
        assert_eq!(max_label(part), part.iter().copied().max().unwrap());
    }

    #[test]
    fn success_writes_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.nii");
        stage_level(&out, GZ_LEVEL, |w| w.write_all(b"abc"))
            .unwrap()
            .commit(false)
            .unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"abc");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

#[cfg(test)]
mod gz_tests {
    use super::*;
    use std::io::Read;

    /// Bytes that compress somewhat, not trivially: runs and a cheap LCG.
    fn data(n: usize) -> Vec<u8> {
        let mut x = 12345u32;
        (0..n)
            .map(|i| {
                x = x.wrapping_mul(1103515245).wrapping_add(12345);
                if (i / 4096) % 3 == 0 {
                    (x >> 24) as u8
                } else {
                    (i / 1000) as u8 % 7
                }
            })
            .collect()
    }

    fn par_gz(d: &[u8], level: u32, write_size: usize) -> Vec<u8> {
        let mut w = ParGzWriter::new(Vec::new(), level).unwrap();
        for c in d.chunks(write_size.max(1)) {
            w.write_all(c).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn parallel_gzip_is_one_member_any_decoder_reads() {
        let batch = GZ_PIECE * rayon::current_num_threads();
        for n in [
            0,
            1,
            GZ_PIECE - 1,
            GZ_PIECE,
            GZ_PIECE + 1,
            batch,
            2 * batch + 3 * GZ_PIECE + 17,
        ] {
            let d = data(n);
            // Small writes go through the buffer, one big write deflates in place.
            for (level, write_size) in [(1, 300_000), (3, usize::MAX), (6, 300_000)] {
                let z = par_gz(&d, level, write_size);
                // Single-member decoder: it stops after the first member, so equal output
                // means one member holding everything.
                let mut got = Vec::new();
                flate2::read::GzDecoder::new(&z[..])
                    .read_to_end(&mut got)
                    .unwrap();
                assert!(
                    got == d,
                    "n {n} level {level}: {} vs {} bytes",
                    got.len(),
                    n
                );
                let mut got2 = Vec::new();
                flate2::read::MultiGzDecoder::new(&z[..])
                    .read_to_end(&mut got2)
                    .unwrap();
                assert!(got2 == d);
                // The trailer: CRC-32 and length as a serial encoder writes them.
                let t = &z[z.len() - 8..];
                let mut h = crc32fast::Hasher::new();
                h.update(&d);
                assert_eq!(u32::from_le_bytes(t[..4].try_into().unwrap()), h.finalize());
                assert_eq!(u32::from_le_bytes(t[4..].try_into().unwrap()), n as u32);
            }
        }
    }

    #[test]
    fn parallel_gzip_compresses_like_a_serial_encoder() {
        // Labels-like data: long runs of small values.
        let d: Vec<u8> = (0..(6 << 20)).map(|i| ((i / 5000) % 4) as u8).collect();
        let z = par_gz(&d, 3, 1 << 16);
        let mut e = flate2::write::GzEncoder::new(Vec::new(), Compression::new(3));
        e.write_all(&d).unwrap();
        let serial = e.finish().unwrap();
        // Independent pieces cost a little; never more than 1.5x + 1 KiB per piece.
        assert!(
            z.len() <= serial.len() * 3 / 2 + 1024 * 6,
            "{} vs {}",
            z.len(),
            serial.len()
        );
        assert!(z.len() < d.len() / 50, "{}", z.len());
    }
}

/// Timing of the label writer, old (serial gzip level 1, streamed transposition) against new
/// (parallel): `cargo test --release --lib write_timing -- --ignored --nocapture`.
#[cfg(test)]
mod timing {
    use super::*;
    use std::time::Instant;

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    #[test]
    #[ignore]
    fn write_timing() {
        let (nx, ny, nz) = (512, 512, 128);
        // Labels like a CT segmentation: a few blobs of classes 0..13, C order as the engine returns.
        let labels = ndarray::Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| {
            let r = ((i as f64 - 256.0).powi(2) + (j as f64 - 256.0).powi(2)).sqrt();
            if r > 200.0 {
                0
            } else {
                ((r / 16.0) as u16 + (k as u16 / 32)) % 14
            }
        });
        let like = Header::new([nx, ny, nz], 1, [1.0; 3]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.nii.gz");
        let mut t_new = Vec::new();
        let mut t_old = Vec::new();
        let (mut t_max, mut t_bytes, mut t_gz) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = Instant::now();
            write_labels(&p, labels.view(), &like).unwrap();
            t_new.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let m = max_label(labels.view());
            t_max.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let b = file_order_bytes(labels.view(), |v| [v as u8]).unwrap();
            t_bytes.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let mut g = ParGzWriter::new(io::sink(), GZ_LEVEL_LABELS).unwrap();
            g.write_all(&b).unwrap();
            g.finish().unwrap();
            t_gz.push(t.elapsed().as_secs_f64());
            assert!(m < 14);
            // The old writer: fold, streamed transposition, serial gzip level 1.
            let t = Instant::now();
            let _ = labels.fold(0u16, |m, &x| m.max(x));
            let f = std::fs::File::create(dir.path().join("old.nii.gz")).unwrap();
            let mut enc = flate2::write::GzEncoder::new(
                io::BufWriter::with_capacity(1 << 20, f),
                Compression::new(1),
            );
            {
                let mut e = Encoder::new(&mut enc);
                file_order_runs(labels.view(), |run| e.push(run, |v| [v as u8])).unwrap();
                e.finish().unwrap();
            }
            enc.finish()
                .unwrap()
                .into_inner()
                .unwrap()
                .sync_all()
                .unwrap();
            t_old.push(t.elapsed().as_secs_f64());
        }
        println!(
            "TIMING write_labels 512x512x128 ({} threads): new {:.3} s (max {:.3}, file-order bytes {:.3}, gzip {:.3}; {} bytes), old {:.3} s ({} bytes)",
            rayon::current_num_threads(),
            median(t_new),
            median(t_max),
            median(t_bytes),
            median(t_gz),
            std::fs::metadata(&p).unwrap().len(),
            median(t_old),
            std::fs::metadata(dir.path().join("old.nii.gz")).unwrap().len(),
        );
    }
}
