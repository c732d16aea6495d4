//! Minimal `.npy` (NumPy v1/v2/v3) reader and writer for float32 arrays: test fixtures and debug dumps.

use crate::{Error, Result};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// Read a little-endian float32 C-order `.npy` file into an n-dimensional array.
pub fn read_f32(path: &Path) -> Result<ArrayD<f32>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_f32(&bytes).map_err(|m| Error::volume(path, m))
}

fn parse_f32(bytes: &[u8]) -> std::result::Result<ArrayD<f32>, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let major = bytes[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated .npy header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "non-UTF-8 .npy header")?;
    if !header.contains("'descr': '<f4'") {
        return Err(format!(
            "only little-endian float32 .npy is supported, header: {header}"
        ));
    }
    if header.contains("'fortran_order': True") {
        return Err("Fortran-ordered .npy is not supported".into());
    }
    let shape_str = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or("no shape in .npy header")?;
    let shape: Vec<usize> = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad .npy shape {shape_str}"))
        })
        .collect::<std::result::Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let data = &bytes[hstart + hlen..];
    if data.len() != n * 4 {
        return Err(format!(
            "data holds {} bytes, shape {shape:?} needs {}",
            data.len(),
            n * 4
        ));
    }
    let v: Vec<f32> = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| e.to_string())
}

/// Write a float32 C-order `.npy` (v1) file.
pub fn write_f32(path: &Path, a: &ArrayD<f32>) -> Result<()> {
    let shape: Vec<String> = a.shape().iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("{},", shape[0])
    } else {
        shape.join(", ")
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + a.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in a.iter() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_shape() {
        let dir = std::env::temp_dir().join(format!("voxtile_npy_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        let a = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| {
            (i[0] * 100 + i[1] * 10 + i[2]) as f32
        });
        write_f32(&p, &a).unwrap();
        let b = read_f32(&p).unwrap();
        assert_eq!(a, b);
        assert!(parse_f32(b"garbage").is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
