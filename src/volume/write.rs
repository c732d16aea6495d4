//! Writing NIfTI-1 outputs: temp file in the target folder, fsync, rename; nothing half-written
//! is ever left under the final name, and the temp file is removed on any error.

use super::header::{self, encode_nifti1, Header};
use crate::{Error, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use ndarray::{ArrayView3, ArrayView4};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// gzip level 1, nibabel's default: label maps compress well even so, and it is several times
/// faster than level 6 on large float outputs.
const GZ_LEVEL: u32 = 1;

/// Temp path next to the target: `.<name>.voxtile-tmp-<pid>`, so the rename stays in one filesystem.
pub(crate) fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::volume(path, "output path has no file name"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(dir.join(format!(
        ".{}.voxtile-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

fn is_gz(path: &Path) -> bool {
    path.to_string_lossy().to_ascii_lowercase().ends_with(".gz")
}

/// Write through `body` into a temp file, gzip when `path` ends with .gz, fsync, rename over `path`.
pub(crate) fn write_atomic<F>(path: &Path, body: F) -> Result<()>
where
    F: FnOnce(&mut dyn Write) -> io::Result<()>,
{
    let tmp = temp_path(path)?;
    let result = (|| -> io::Result<()> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let mut bw = BufWriter::with_capacity(1 << 20, file);
        let file: File = if is_gz(path) {
            let mut enc = GzEncoder::new(bw, Compression::new(GZ_LEVEL));
            body(&mut enc)?;
            enc.finish()?.into_inner().map_err(|e| e.into_error())?
        } else {
            body(&mut bw)?;
            bw.into_inner().map_err(|e| e.into_error())?
        };
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable (best effort: not every filesystem allows it).
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Stream values in file order through a 1 MiB byte buffer.
fn write_values<T: Copy>(
    w: &mut dyn Write,
    values: impl Iterator<Item = T>,
    bpv: usize,
    enc: impl Fn(T, &mut [u8]),
) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    for v in values {
        enc(v, &mut buf[n..n + bpv]);
        n += bpv;
        if n + bpv > buf.len() {
            w.write_all(&buf[..n])?;
            n = 0;
        }
    }
    w.write_all(&buf[..n])
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

/// Write a label map (axes i, j, k) with `like`'s geometry: uint8 when every label < 256, else uint16.
pub fn write_labels(path: &Path, labels: ArrayView3<u16>, like: &Header) -> Result<()> {
    let (nx, ny, nz) = labels.dim();
    check_shape(path, [nx, ny, nz], like)?;
    let max = labels.iter().copied().max().unwrap_or(0);
    let dt = if max < 256 {
        header::DT_UINT8
    } else {
        header::DT_UINT16
    };
    let hdr = encode_nifti1(like, [nx, ny, nz], 1, dt, "voxtile labels")
        .map_err(|m| Error::volume(path, m))?;
    // File order is i fastest, then j, then k: iterate the (k, j, i) view logically.
    let file_order = labels.permuted_axes([2, 1, 0]);
    write_atomic(path, |w| {
        w.write_all(&hdr)?;
        if dt == header::DT_UINT8 {
            write_values(w, file_order.iter().copied(), 1, |v, b| b[0] = v as u8)
        } else {
            write_values(w, file_order.iter().copied(), 2, |v, b| {
                b.copy_from_slice(&v.to_le_bytes())
            })
        }
    })
}

/// Write float32 data (channel, i, j, k) with `like`'s geometry: 3-D for one channel, else 4-D
/// (x, y, z, channel).
pub fn write_f32(path: &Path, data: ArrayView4<f32>, like: &Header) -> Result<()> {
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
    let file_order = data.permuted_axes([0, 3, 2, 1]);
    write_atomic(path, |w| {
        w.write_all(&hdr)?;
        write_values(w, file_order.iter().copied(), 4, |v, b| {
            b.copy_from_slice(&v.to_le_bytes())
        })
    })
}

/// Refuse an output path that is (or links to) one of the inputs: same inode, or same canonical path.
pub fn check_not_input(out: &Path, inputs: &[&Path]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(om) = std::fs::metadata(out) else {
        return Ok(()); // a file that does not exist yet cannot be an input
    };
    let oc = std::fs::canonicalize(out).ok();
    for inp in inputs {
        let Ok(im) = std::fs::metadata(inp) else {
            continue;
        };
        let same_inode = om.dev() == im.dev() && om.ino() == im.ino();
        let same_path = oc.is_some() && oc == std::fs::canonicalize(inp).ok();
        if same_inode || same_path {
            return Err(Error::Invalid(format!(
                "output {} is the same file as input {}; refusing to overwrite an input",
                out.display(),
                inp.display()
            )));
        }
    }
    Ok(())
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
            let err = write_atomic(&out, |w| {
                w.write_all(&[7u8; 3 << 20])?; // several buffer flushes reach the disk first
                Err(io::Error::other("simulated failure"))
            })
            .unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
            assert!(err.to_string().contains("simulated failure"), "{err}");
            assert_eq!(std::fs::read(&out).unwrap(), b"old contents");
            assert!(!temp_path(&out).unwrap().exists());
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn success_writes_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.nii");
        write_atomic(&out, |w| w.write_all(b"abc")).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"abc");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
