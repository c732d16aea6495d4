//! MetaImage volumes (`.mha`, `.mhd` + data file): 3-D scalar `MET_*` types, raw or zlib
//! (`CompressedData = True`), geometry from `TransformMatrix` / `Offset` / `ElementSpacing` in
//! ITK's LPS space, handed out in RAS.

use super::geometry::Mat4;
use super::header::{self, Header};
use super::raw::{self, Encoding, Format};
use super::Volume;
use super::{payload, Stats};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What the header says about the payload.
struct Mha {
    header: Header,
    data_file: PathBuf,
    offset: Option<u64>,
    encoding: Encoding,
    big_endian: bool,
}

/// The NIfTI datatype of a MetaImage `ElementType`.
fn datatype(t: &str) -> Option<i16> {
    Some(match t {
        "MET_CHAR" => header::DT_INT8,
        "MET_UCHAR" => header::DT_UINT8,
        "MET_SHORT" => header::DT_INT16,
        "MET_USHORT" => header::DT_UINT16,
        "MET_INT" | "MET_LONG" => header::DT_INT32,
        "MET_UINT" | "MET_ULONG" => header::DT_UINT32,
        "MET_LONG_LONG" => header::DT_INT64,
        "MET_ULONG_LONG" => header::DT_UINT64,
        "MET_FLOAT" => header::DT_FLOAT32,
        "MET_DOUBLE" => header::DT_FLOAT64,
        _ => return None,
    })
}

fn is_true(v: Option<&String>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The RAS affine. TransformMatrix lists one axis's direction per triple (ITK writes its direction
/// matrix transposed); columns are scaled by ElementSpacing; Offset is the first voxel's centre.
fn affine(path: &Path, f: &HashMap<String, String>) -> Result<Mat4> {
    let bad = |what: &str| Error::volume(path, format!("invalid MetaImage {what}"));
    let dirs = ["TransformMatrix", "Rotation", "Orientation"]
        .iter()
        .find_map(|k| f.get(*k));
    let dirs = match dirs {
        Some(s) => raw::numbers::<f64>(s, 9).ok_or_else(|| bad("TransformMatrix"))?,
        None => vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    };
    let spacing = match f.get("ElementSpacing").or_else(|| f.get("ElementSize")) {
        Some(s) => raw::numbers::<f64>(s, 3).ok_or_else(|| bad("ElementSpacing"))?,
        None => vec![1.0; 3],
    };
    let origin = match ["Offset", "Position", "Origin"]
        .iter()
        .find_map(|k| f.get(*k))
    {
        Some(s) => raw::numbers::<f64>(s, 3).ok_or_else(|| bad("Offset"))?,
        None => vec![0.0; 3],
    };
    let mut a: Mat4 = [[0.0; 4]; 4];
    a[3][3] = 1.0;
    for j in 0..3 {
        for i in 0..3 {
            a[i][j] = dirs[3 * j + i] * spacing[j];
        }
    }
    for i in 0..3 {
        a[i][3] = origin[i];
    }
    raw::lps_to_ras(&mut a);
    raw::check_affine(path, &a)?;
    Ok(a)
}

fn parse(path: &Path) -> Result<Mha> {
    let last = |l: &str| l.trim_start().starts_with("ElementDataFile");
    let (text, data_at) = raw::text_header(path, Some(&last))?;
    let mut f = HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            f.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    let get = |k: &str| {
        f.get(k)
            .ok_or_else(|| Error::volume(path, format!("MetaImage header has no \"{k}\"")))
    };
    let nd = get("NDims")?;
    if nd != "3" {
        return Err(Error::volume(
            path,
            format!("MetaImage with NDims = {nd}: voxtile reads 3-D scalar volumes"),
        ));
    }
    if f.get("ElementNumberOfChannels").is_some_and(|c| c != "1") {
        return Err(Error::volume(
            path,
            "MetaImage with several channels per voxel: voxtile reads scalar volumes",
        ));
    }
    let t = get("ElementType")?;
    let dt = datatype(t).ok_or_else(|| {
        Error::volume(path, format!("MetaImage ElementType {t} is not supported"))
    })?;
    let (_, bpv) = header::datatype_info(dt).map_err(|m| Error::volume(path, m))?;
    let sizes = raw::sizes(path, "MetaImage DimSize", get("DimSize")?, bpv)?;
    let big_endian =
        is_true(f.get("BinaryDataByteOrderMSB")) || is_true(f.get("ElementByteOrderMSB"));
    let encoding = if is_true(f.get("CompressedData")) {
        Encoding::Zlib
    } else {
        Encoding::Raw
    };
    let name = get("ElementDataFile")?;
    let (data_file, base) = if name == "LOCAL" {
        (path.to_path_buf(), data_at)
    } else if name.starts_with("LIST") || name.contains('%') || name.contains(' ') {
        return Err(Error::volume(
            path,
            "MetaImage data split over several files is not supported",
        ));
    } else {
        (raw::sibling(path, name)?, 0)
    };
    let offset = match f.get("HeaderSize").map(|s| s.parse::<i64>()) {
        None => Some(base),
        Some(Ok(-1)) if encoding == Encoding::Raw => None,
        Some(Ok(s)) if s >= 0 => Some(
            base.checked_add(s as u64)
                .ok_or_else(|| Error::volume(path, "invalid MetaImage HeaderSize"))?,
        ),
        Some(_) => return Err(Error::volume(path, "invalid MetaImage HeaderSize")),
    };
    let a = affine(path, &f)?;
    Ok(Mha {
        header: raw::header_for(Format::MetaImage, sizes, &a, dt, None),
        data_file,
        offset,
        encoding,
        big_endian,
    })
}

/// The NIfTI header that stands for a MetaImage file (shape, stored type, RAS geometry).
pub fn read_header(path: &Path) -> Result<Header> {
    Ok(parse(path)?.header)
}

/// Read a MetaImage volume: f32 voxels (i, j, k), RAS geometry.
pub fn read(path: &Path) -> Result<Volume> {
    let m = parse(path)?;
    let count = raw::check_voxels(path, m.header.shape())?;
    let l = layout(path, &m, count as u64)?;
    let bytes = payload::read_all(
        &m.data_file,
        payload::open_data(path, &m.data_file, payload::NO_CAP)?,
        l,
    )?;
    let values = raw::to_f32(&bytes, m.header.datatype, m.big_endian, None)
        .map_err(|e| Error::volume(path, e))?;
    drop(bytes);
    raw::volume(path, values, m.header)
}

/// The detached data file the header at `path` names (None: `LOCAL`, the voxels follow the
/// header), so that the output gate counts it as an input.
pub(super) fn data_file(path: &Path) -> Result<Option<PathBuf>> {
    let m = parse(path)?;
    Ok((m.data_file != path).then_some(m.data_file))
}

/// The header and the value statistics of a MetaImage volume, its payload streamed in chunks.
pub(crate) fn summarize(path: &Path) -> Result<(Header, Stats)> {
    let m = parse(path)?;
    let count = super::read::check_hard_cap(path, &m.header)?;
    let l = layout(path, &m, count)?;
    let opened = payload::open_data(path, &m.data_file, payload::NO_CAP)?;
    let st = super::summary::stream(&m.data_file, opened, l, &m.header, m.big_endian, None)?;
    Ok((m.header, st))
}

fn layout(path: &Path, m: &Mha, count: u64) -> Result<payload::Layout> {
    let (_, bpv) = header::datatype_info(m.header.datatype).map_err(|e| Error::volume(path, e))?;
    let len = count
        .checked_mul(bpv as u64)
        .ok_or_else(|| Error::volume(path, "voxel data size overflows"))?;
    Ok(payload::Layout {
        offset: m.offset,
        len,
        enc: m.encoding,
        skip: 0,
    })
}
