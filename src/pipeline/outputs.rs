//! Extra outputs: probabilities as uint8 (a 4-D NIfTI the volume writer does not offer), one mask
//! file per class.

use crate::volume::Header;
use crate::{Error, Result};
use ndarray::{ArrayView3, ArrayView4, Axis};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write probabilities (C, i, j, k) in [0,1] as uint8 `round(255·p)` with scl_slope 1/255, so that
/// NIfTI readers (nibabel, voxtile) see probabilities again; 4-D (x, y, z, channel) like
/// `write_f32`, with `like`'s geometry. A quarter of the float32 file.
pub fn write_probabilities_u8(path: &Path, p: ArrayView4<f32>, like: &Header) -> Result<()> {
    let (nc, nx, ny, nz) = p.dim();
    if [nx, ny, nz] != like.shape() {
        return Err(Error::Invalid(format!(
            "{}: probabilities of shape {nx}x{ny}x{nz} do not match the input grid",
            path.display()
        )));
    }
    let hdr = nifti1_u8_header(like, [nx, ny, nz], nc).map_err(|m| Error::volume(path, m))?;
    write_atomic(path, |w| {
        w.write_all(&hdr)?;
        let mut buf = Vec::with_capacity(nx * ny);
        for c in 0..nc {
            let ch = p.index_axis(Axis(0), c);
            for k in 0..nz {
                buf.clear();
                for j in 0..ny {
                    for i in 0..nx {
                        buf.push(to_u8(ch[[i, j, k]]));
                    }
                }
                w.write_all(&buf)?;
            }
        }
        Ok(())
    })
}

/// round(255·p) with p clamped to [0, 1] (NaN reads as 0).
pub fn to_u8(p: f32) -> u8 {
    let v = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    (v * 255.0).round() as u8
}

/// A little-endian NIfTI-1 single-file header (352 bytes) for uint8 data with `like`'s geometry.
fn nifti1_u8_header(
    like: &Header,
    shape: [usize; 3],
    channels: usize,
) -> std::result::Result<Vec<u8>, String> {
    let mut h = vec![0u8; 352];
    let put_i16 =
        |h: &mut Vec<u8>, at: usize, v: i16| h[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put_f32 = |h: &mut Vec<u8>, at: usize, v: f64| {
        h[at..at + 4].copy_from_slice(&(v as f32).to_le_bytes())
    };
    h[0..4].copy_from_slice(&348i32.to_le_bytes());
    h[38] = b'r';
    let mut dim = [1i16; 8];
    dim[0] = if channels > 1 { 4 } else { 3 };
    for (a, &n) in shape.iter().chain(std::iter::once(&channels)).enumerate() {
        dim[a + 1] =
            i16::try_from(n).map_err(|_| format!("dimension {n} exceeds NIfTI-1's 32767"))?;
    }
    for (i, d) in dim.iter().enumerate() {
        put_i16(&mut h, 40 + 2 * i, *d);
    }
    put_i16(&mut h, 70, 2); // DT_UINT8
    put_i16(&mut h, 72, 8);
    let mut pixdim = like.pixdim;
    pixdim[4] = 1.0;
    if pixdim[0] != 1.0 && pixdim[0] != -1.0 {
        pixdim[0] = 1.0;
    }
    for (i, p) in pixdim.iter().enumerate() {
        put_f32(&mut h, 76 + 4 * i, *p);
    }
    put_f32(&mut h, 108, 352.0);
    put_f32(&mut h, 112, 1.0 / 255.0);
    put_f32(&mut h, 116, 0.0);
    h[123] = (like.xyzt_units & 0xff) as u8;
    put_f32(&mut h, 124, 1.0); // cal_max: probabilities
    let descrip = b"voxtile probabilities (uint8/255)";
    h[148..148 + descrip.len()].copy_from_slice(descrip);
    put_i16(&mut h, 252, like.qform_code as i16);
    put_i16(&mut h, 254, like.sform_code as i16);
    for (i, v) in [
        like.quatern_b,
        like.quatern_c,
        like.quatern_d,
        like.qoffset_x,
        like.qoffset_y,
        like.qoffset_z,
    ]
    .iter()
    .enumerate()
    {
        put_f32(&mut h, 256 + 4 * i, *v);
    }
    for (r, row) in [like.srow_x, like.srow_y, like.srow_z].iter().enumerate() {
        for (i, v) in row.iter().enumerate() {
            put_f32(&mut h, 280 + 16 * r + 4 * i, *v);
        }
    }
    h[344..348].copy_from_slice(b"n+1\0");
    Ok(h)
}

/// Temp file beside `path`, gzip when it ends in .gz, rename: no half-written file under the name.
fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::volume(path, "output path has no file name"))?;
    let tmp = path.with_file_name(format!(
        ".{}.voxtile-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let r = (|| -> std::io::Result<()> {
        let f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        if path.to_string_lossy().to_ascii_lowercase().ends_with(".gz") {
            let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::new(1));
            body(&mut e)?;
            e.finish()?
                .into_inner()
                .map_err(|e| e.into_error())?
                .sync_all()?;
        } else {
            let mut f = f;
            body(&mut f)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    r.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// The channels that get a file of their own: all but the background (0), or the single channel.
pub fn class_channels(channels: usize) -> Vec<usize> {
    if channels == 1 {
        vec![1]
    } else {
        (1..channels).collect()
    }
}

/// A file name for a class: the manifest's name made safe for file systems, else `class_N`.
pub fn class_file_name(channel: usize, classes: Option<&[String]>) -> String {
    let name = classes
        .and_then(|c| c.get(channel))
        .map(|n| {
            n.chars()
                .map(|ch| {
                    if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.' {
                        ch
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .filter(|n| !n.is_empty() && n.chars().any(|c| c != '.'));
    format!(
        "{}.nii.gz",
        name.unwrap_or_else(|| format!("class_{channel}"))
    )
}

/// Write `dir/<class>.nii.gz` = (labels == value of that class) as uint8 for each class channel;
/// `values[c]` is the label value channel c was written as (after remapping). Returns the paths.
pub fn write_split_classes(
    dir: &Path,
    labels: ArrayView3<u16>,
    values: &[u16],
    classes: Option<&[String]>,
    like: &Header,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    for c in class_channels(values.len().max(1)) {
        let value = values.get(c).copied().unwrap_or(c as u16);
        let path = dir.join(class_file_name(c, classes));
        let mask = labels.mapv(|l| (l == value) as u16);
        crate::volume::write_labels(&path, mask.view(), like)?;
        written.push(path);
    }
    Ok(written)
}
