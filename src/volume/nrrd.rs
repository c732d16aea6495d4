//! NRRD volumes (`.nrrd`, `.nhdr` + data file): 3-D scalar, `raw` or `gzip` encoding, geometry
//! from `space directions` / `space origin` (LPS, RAS or LAS spaces), handed out in RAS.

use super::geometry::Mat4;
use super::header::{self, Header};
use super::raw::{self, Encoding, Format};
use super::Volume;
use super::{payload, Stats};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What the header says about the payload.
struct Nrrd {
    header: Header,
    data_file: PathBuf,
    offset: Option<u64>,
    encoding: Encoding,
    /// Byte skip of a compressed payload (NRRD counts it after decompression).
    skip: u64,
    big_endian: bool,
}

/// The NIfTI datatype of an NRRD `type`.
fn datatype(t: &str) -> Option<i16> {
    Some(match t {
        "signed char" | "int8" | "int8_t" => header::DT_INT8,
        "uchar" | "unsigned char" | "uint8" | "uint8_t" => header::DT_UINT8,
        "short" | "short int" | "signed short" | "signed short int" | "int16" | "int16_t" => {
            header::DT_INT16
        }
        "ushort" | "unsigned short" | "unsigned short int" | "uint16" | "uint16_t" => {
            header::DT_UINT16
        }
        "int" | "signed int" | "int32" | "int32_t" => header::DT_INT32,
        "uint" | "unsigned int" | "uint32" | "uint32_t" => header::DT_UINT32,
        "longlong"
        | "long long"
        | "long long int"
        | "signed long long"
        | "signed long long int"
        | "int64"
        | "int64_t" => header::DT_INT64,
        "ulonglong" | "unsigned long long" | "unsigned long long int" | "uint64" | "uint64_t" => {
            header::DT_UINT64
        }
        "float" => header::DT_FLOAT32,
        "double" => header::DT_FLOAT64,
        _ => return None,
    })
}

/// `(a,b,c)` → [a, b, c].
fn vector(s: &str) -> Option<[f64; 3]> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    let v = raw::numbers::<f64>(inner, 3)?;
    Some([v[0], v[1], v[2]])
}

/// The RAS affine: columns are the space directions, then the origin; LPS/LAS flipped to RAS.
fn affine(path: &Path, f: &HashMap<String, String>) -> Result<Mat4> {
    let bad = |what: &str| Error::volume(path, format!("invalid NRRD {what}"));
    let mut a: Mat4 = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ];
    let flip: [f64; 3] = match f.get("space").map(|s| s.as_str()) {
        Some("left-posterior-superior" | "LPS" | "scanner-xyz") => [-1.0, -1.0, 1.0],
        Some("right-anterior-superior" | "RAS") => [1.0, 1.0, 1.0],
        Some("left-anterior-superior" | "LAS") => [-1.0, 1.0, 1.0],
        None => [1.0, 1.0, 1.0],
        Some(other) => {
            return Err(Error::volume(
                path,
                format!("NRRD space \"{other}\" is not supported (LPS, RAS or LAS)"),
            ))
        }
    };
    if let Some(d) = f.get("space directions") {
        let cols: Vec<&str> = d.split_whitespace().collect();
        if cols.len() != 3 {
            return Err(bad("space directions (3 vectors expected)"));
        }
        for (j, c) in cols.iter().enumerate() {
            let v = vector(c).ok_or_else(|| bad("space directions"))?;
            for i in 0..3 {
                a[i][j] = v[i];
            }
        }
        if let Some(o) = f.get("space origin") {
            let o = vector(o).ok_or_else(|| bad("space origin"))?;
            for i in 0..3 {
                a[i][3] = o[i];
            }
        }
    } else if let Some(s) = f.get("spacings") {
        let s = raw::numbers::<f64>(s, 3).ok_or_else(|| bad("spacings"))?;
        for i in 0..3 {
            a[i][i] = s[i];
        }
    }
    for i in 0..3 {
        for v in a[i].iter_mut() {
            *v *= flip[i];
        }
    }
    raw::check_affine(path, &a)?;
    Ok(a)
}

/// The header's fields (lower-case keys), after checking the magic line.
fn fields(path: &Path, text: &str) -> Result<HashMap<String, String>> {
    let mut lines = text.lines();
    let magic = lines.next().unwrap_or("");
    if !magic.starts_with("NRRD000") {
        return Err(Error::volume(
            path,
            "not an NRRD file (no NRRD000x magic line)",
        ));
    }
    let mut f = HashMap::new();
    for line in lines {
        if line.starts_with('#') || line.contains(":=") {
            continue; // comments and key/value pairs
        }
        if let Some((k, v)) = line.split_once(": ") {
            f.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok(f)
}

fn parse(path: &Path) -> Result<Nrrd> {
    let (text, data_at) = raw::text_header(path, None)?;
    let f = fields(path, &text)?;
    let get = |k: &str| {
        f.get(k)
            .ok_or_else(|| Error::volume(path, format!("NRRD header has no \"{k}\" field")))
    };
    let t = get("type")?;
    let dt = datatype(t).ok_or_else(|| {
        Error::volume(
            path,
            format!("NRRD type \"{t}\" is not supported (scalar integer or float)"),
        )
    })?;
    let dims = get("dimension")?;
    if dims != "3" {
        return Err(Error::volume(
            path,
            format!("NRRD of dimension {dims}: voxtile reads 3-D scalar volumes"),
        ));
    }
    let (_, bpv) = header::datatype_info(dt).map_err(|m| Error::volume(path, m))?;
    let shape = raw::sizes(path, "NRRD sizes", get("sizes")?, bpv)?;
    if let Some(k) = f.get("kinds") {
        check_kinds(path, k)?;
    }
    let enc = match get("encoding")?.as_str() {
        "raw" => Encoding::Raw,
        "gzip" | "gz" => Encoding::Gzip,
        other => {
            return Err(Error::volume(
                path,
                format!("NRRD encoding \"{other}\" is not supported (raw or gzip)"),
            ))
        }
    };
    let big_endian = match f.get("endian").map(|s| s.as_str()) {
        Some("big") => true,
        Some("little") | None => false,
        Some(e) => return Err(Error::volume(path, format!("invalid NRRD endian \"{e}\""))),
    };
    if f.get("line skip").is_some_and(|v| v != "0") {
        return Err(Error::volume(path, "NRRD \"line skip\" is not supported"));
    }
    let skip: i64 = f
        .get("byte skip")
        .map_or(Ok(0), |v| v.parse())
        .map_err(|_| Error::volume(path, "invalid NRRD byte skip"))?;
    let detached = f.get("data file").or_else(|| f.get("datafile"));
    let (data_file, base) = match detached {
        Some(name) if name.starts_with("LIST") || name.contains(' ') => {
            return Err(Error::volume(
                path,
                "NRRD data split over several files is not supported",
            ))
        }
        Some(name) => (raw::sibling(path, name)?, 0),
        None => (path.to_path_buf(), data_at),
    };
    let (offset, skip) = match skip {
        -1 if enc == Encoding::Raw => (None, 0),
        s if s >= 0 && enc == Encoding::Raw => (
            Some(
                base.checked_add(s as u64)
                    .ok_or_else(|| Error::volume(path, "invalid NRRD byte skip"))?,
            ),
            0,
        ),
        s if s >= 0 => (Some(base), s as u64),
        _ => return Err(Error::volume(path, "invalid NRRD byte skip")),
    };
    let a = affine(path, &f)?;
    Ok(Nrrd {
        header: raw::header_for(Format::Nrrd, shape, &a, dt, None),
        data_file,
        offset,
        encoding: enc,
        skip,
        big_endian,
    })
}

/// The NIfTI header that stands for an NRRD file (shape, stored type, RAS geometry).
pub fn read_header(path: &Path) -> Result<Header> {
    Ok(parse(path)?.header)
}

/// Read an NRRD volume: f32 voxels (i, j, k), RAS geometry.
pub fn read(path: &Path) -> Result<Volume> {
    let n = parse(path)?;
    let count = raw::check_voxels(path, n.header.shape())?;
    let l = layout(path, &n, count as u64)?;
    let bytes = payload::read_all(
        &n.data_file,
        payload::open_data(path, &n.data_file, payload::NO_CAP)?,
        l,
    )?;
    let values = raw::to_f32(&bytes, n.header.datatype, n.big_endian, None)
        .map_err(|m| Error::volume(path, m))?;
    drop(bytes);
    raw::volume(path, values, n.header)
}

/// The detached data file the header at `path` names (None: the voxels follow the header), so
/// that the output gate counts it as an input.
pub(super) fn data_file(path: &Path) -> Result<Option<PathBuf>> {
    let n = parse(path)?;
    Ok((n.data_file != path).then_some(n.data_file))
}

/// The header and the value statistics of an NRRD volume, its payload streamed in chunks.
pub(crate) fn summarize(path: &Path) -> Result<(Header, Stats)> {
    let n = parse(path)?;
    let count = super::read::check_hard_cap(path, &n.header)?;
    let l = layout(path, &n, count)?;
    let opened = payload::open_data(path, &n.data_file, payload::NO_CAP)?;
    let st = super::summary::stream(&n.data_file, opened, l, &n.header, n.big_endian, None)?;
    Ok((n.header, st))
}

fn layout(path: &Path, n: &Nrrd, count: u64) -> Result<payload::Layout> {
    let (_, bpv) = header::datatype_info(n.header.datatype).map_err(|m| Error::volume(path, m))?;
    let len = count
        .checked_mul(bpv as u64)
        .ok_or_else(|| Error::volume(path, "voxel data size overflows"))?;
    Ok(payload::Layout {
        offset: n.offset,
        len,
        enc: n.encoding,
        skip: n.skip,
    })
}

/// Axis kinds NRRD gives a spatial axis; any other (vector, RGB-color, complex, list, time...)
/// makes the volume not a 3-D scalar grid, which voxtile refuses rather than misread.
const SPATIAL_KINDS: [&str; 4] = ["domain", "space", "none", "???"];

/// Refuse a `kinds` field that names a non-spatial axis (one line naming the axis and its kind).
fn check_kinds(path: &Path, kinds: &str) -> Result<()> {
    let k: Vec<&str> = kinds.split_whitespace().collect();
    if k.len() != 3 {
        return Err(Error::volume(
            path,
            format!("invalid NRRD kinds: {} values for 3 axes", k.len()),
        ));
    }
    match k.iter().position(|k| !SPATIAL_KINDS.contains(&k.to_ascii_lowercase().as_str())) {
        Some(i) => Err(Error::volume(
            path,
            format!(
                "NRRD axis {i} is of kind \"{}\", not a spatial axis: voxtile reads 3-D scalar volumes (kinds domain, space, none)",
                raw::clip(k[i], 24)
            ),
        )),
        None => Ok(()),
    }
}
