//! ONNX protobuf decoding (prost + the vendored schema subset) and of tensors. Initializers
//! are decoded by [`decode_tensor`], which validates every size before it allocates, so a hostile
//! file gets an error naming the tensor instead of an OOM. The graph as the import reads it, apart
//! from any lowering: the order of its nodes and the input's signature ([`order`]), what each
//! value name is bound to and who reads it ([`values`]), a node's attributes and error context
//! ([`node`]).

use crate::{Error, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

mod alias;
pub(crate) mod node;
pub(crate) mod order;
pub(crate) mod values;

#[allow(clippy::all, dead_code, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// Element-count ceiling for one tensor: nothing voxtile runs is near it, and it keeps byte sizes
/// far from usize overflow on every platform.
pub const MAX_ELEMENTS: u64 = 1 << 31;

/// A decoded constant: float types become f32, integer/bool types i64.
/// A float element type voxtile takes for activations (it computes in f32 whatever the file says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Float {
    F32,
    F16,
    Bf16,
}

impl Float {
    /// The type of ONNX element type `t` (1, 10, 16; double counts as f32: voxtile computes in
    /// f32), None for the others.
    pub(crate) fn of(t: i32) -> Option<Float> {
        match t {
            1 | 11 => Some(Float::F32),
            10 => Some(Float::F16),
            16 => Some(Float::Bf16),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    F(Vec<f32>),
    I(Vec<i64>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Const {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Const {
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            Data::F(v) => v.clone(),
            Data::I(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
    /// [`Self::to_f32`] without a copy of float data.
    pub fn into_f32(self) -> Vec<f32> {
        match self.data {
            Data::F(v) => v,
            Data::I(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    pub fn is_int(&self) -> bool {
        matches!(self.data, Data::I(_))
    }
}

/// The graph's activation inputs: its inputs that are no initializer (inputs that are also
/// initializers are old-style defaults). voxtile takes models with exactly one.
pub(crate) fn activation_inputs(g: &proto::GraphProto) -> Vec<&proto::ValueInfoProto> {
    let inits: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name()).collect();
    g.input
        .iter()
        .filter(|i| !inits.contains(i.name()))
        .collect()
}

/// Bytes per element of an ONNX data type we can decode, and whether it is a float type.
fn elem_info(dt: i32) -> Option<(usize, bool)> {
    use proto::tensor_proto::DataType as T;
    Some(match T::try_from(dt).ok()? {
        T::Float => (4, true),
        T::Double => (8, true),
        T::Float16 | T::Bfloat16 => (2, true),
        T::Int64 | T::Uint64 => (8, false),
        T::Int32 | T::Uint32 => (4, false),
        T::Int16 | T::Uint16 => (2, false),
        T::Int8 | T::Uint8 | T::Bool => (1, false),
        _ => return None,
    })
}

/// Decode an initializer / Constant tensor, validating sizes before allocating.
pub(crate) fn decode_tensor(
    t: &proto::TensorProto,
    dir: Option<&Path>,
    path: &Path,
) -> Result<Const> {
    let name = t.name();
    let bad = |m: String| Error::model(path, format!("tensor \"{name}\": {m}"));
    let mut shape = Vec::with_capacity(t.dims.len());
    let mut count: u64 = 1;
    for &d in &t.dims {
        if d < 0 {
            return Err(bad(format!("negative dimension {d} in dims {:?}", t.dims)));
        }
        count = count.saturating_mul(d as u64);
        shape.push(d as usize);
    }
    if count > MAX_ELEMENTS {
        return Err(bad(format!(
            "dims {:?} give {count} elements, more than the limit 2^31",
            t.dims
        )));
    }
    let n = count as usize;
    let dt = t.data_type();
    let (esize, _) = elem_info(dt).ok_or_else(|| bad(format!("unsupported data type {dt}")))?;
    use proto::tensor_proto::DataType as T;
    let ty = T::try_from(dt).map_err(|_| bad(format!("unsupported data type {dt}")))?;

    let external;
    let raw: Option<&[u8]> = if t.data_location() == proto::tensor_proto::DataLocation::External {
        external = read_external(t, dir, path, n * esize)?;
        Some(&external)
    } else {
        t.raw_data.as_deref()
    };
    let data = if let Some(raw) = raw {
        if raw.len() != n * esize {
            return Err(bad(format!(
                "dims {:?} need {} bytes of {ty:?} data but the tensor holds {}",
                t.dims,
                n * esize,
                raw.len()
            )));
        }
        from_raw(ty, raw)
    } else {
        let held = match ty {
            T::Float => t.float_data.len(),
            T::Double => t.double_data.len(),
            T::Int64 => t.int64_data.len(),
            T::Uint32 | T::Uint64 => t.uint64_data.len(),
            _ => t.int32_data.len(),
        };
        if held != n {
            return Err(bad(format!(
                "dims {:?} need {n} elements but the tensor holds {held}",
                t.dims
            )));
        }
        match ty {
            T::Float => Data::F(t.float_data.clone()),
            T::Double => Data::F(t.double_data.iter().map(|&x| x as f32).collect()),
            T::Float16 => Data::F(
                t.int32_data
                    .iter()
                    .map(|&x| half::f16::from_bits(x as u16).to_f32())
                    .collect(),
            ),
            T::Bfloat16 => Data::F(
                t.int32_data
                    .iter()
                    .map(|&x| half::bf16::from_bits(x as u16).to_f32())
                    .collect(),
            ),
            T::Int64 => Data::I(t.int64_data.clone()),
            T::Uint32 | T::Uint64 => Data::I(t.uint64_data.iter().map(|&x| x as i64).collect()),
            _ => Data::I(t.int32_data.iter().map(|&x| x as i64).collect()),
        }
    };
    Ok(Const { shape, data })
}

fn from_raw(ty: proto::tensor_proto::DataType, raw: &[u8]) -> Data {
    use proto::tensor_proto::DataType as T;
    match ty {
        T::Float => Data::F(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        T::Double => Data::F(
            raw.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                .collect(),
        ),
        T::Float16 => Data::F(
            raw.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        T::Bfloat16 => Data::F(
            raw.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        T::Int64 | T::Uint64 => Data::I(
            raw.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        ),
        T::Int32 => Data::I(
            raw.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
        ),
        T::Uint32 => Data::I(
            raw.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
        ),
        T::Int16 => Data::I(
            raw.chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
        ),
        T::Uint16 => Data::I(
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
        ),
        T::Int8 => Data::I(raw.iter().map(|&b| b as i8 as i64).collect()),
        _ => Data::I(raw.iter().map(|&b| b as i64).collect()),
    }
}

/// Read `need` bytes of external data (location/offset/length relative to the model's folder).
fn read_external(
    t: &proto::TensorProto,
    dir: Option<&Path>,
    path: &Path,
    need: usize,
) -> Result<Vec<u8>> {
    let name = t.name();
    let bad = |m: String| Error::model(path, format!("tensor \"{name}\": {m}"));
    let (mut location, mut offset, mut length) = (None, 0u64, None);
    for kv in &t.external_data {
        let v = kv.value();
        match kv.key() {
            "location" => location = Some(v.to_string()),
            "offset" => {
                offset = v
                    .parse()
                    .map_err(|_| bad(format!("external data offset \"{v}\" is not a number")))?
            }
            "length" => {
                length =
                    Some(v.parse::<u64>().map_err(|_| {
                        bad(format!("external data length \"{v}\" is not a number"))
                    })?)
            }
            _ => {}
        }
    }
    let location =
        location.ok_or_else(|| bad("external data without a \"location\" entry".into()))?;
    let rel = Path::new(&location);
    // Like onnx.checker: external files must stay inside the model's folder.
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(bad(format!("external data location \"{location}\" must be a relative path inside the model's folder")));
    }
    let dir = dir.ok_or_else(|| bad(format!("stored as external data in \"{location}\" but the model was loaded from memory without a folder")))?;
    let file_path = crate::sys::fsio::contained(dir, rel, "model's")
        .map_err(|m| bad(format!("external data \"{location}\": {m}")))?;
    // No-follow on the resolved path: a link swapped in after the check is refused, and a FIFO
    // or device is refused instead of read. The size cap is the file's own; only `need` bytes
    // are read from it.
    let (mut f, flen) = crate::sys::fsio::open_regular(&file_path, u64::MAX, false)?;
    let len = length.unwrap_or(flen.saturating_sub(offset));
    if len != need as u64 {
        return Err(bad(format!(
            "external data length {len} bytes disagrees with its dims {:?}, which need {need}",
            t.dims
        )));
    }
    if offset.checked_add(len).is_none_or(|end| end > flen) {
        return Err(bad(format!(
            "external data needs bytes {offset}..{} of \"{location}\" but the file holds only {flen} bytes",
            offset.saturating_add(len)
        )));
    }
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(&file_path, e))?;
    let mut buf = vec![0u8; need];
    f.read_exact(&mut buf)
        .map_err(|e| Error::io(&file_path, e))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::proto::TensorProto;
    use super::*;

    fn t(dims: Vec<i64>, dt: i32) -> TensorProto {
        TensorProto {
            dims,
            data_type: Some(dt),
            name: Some("w".into()),
            ..Default::default()
        }
    }

    #[test]
    fn decodes_every_storage() {
        let p = Path::new("m.onnx");
        let mut a = t(vec![2], 1);
        a.float_data = vec![1.5, -2.0];
        assert_eq!(
            decode_tensor(&a, None, p).unwrap().data,
            Data::F(vec![1.5, -2.0])
        );
        let mut b = t(vec![2], 1);
        b.raw_data = Some(
            [1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()]
                .concat()
                .into(),
        );
        assert_eq!(
            decode_tensor(&b, None, p).unwrap().data,
            Data::F(vec![1.5, -2.0])
        );
        let mut c = t(vec![3], 10); // float16 in int32_data as bit patterns
        c.int32_data = [1.0f32, 0.5, -3.0]
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits() as i32)
            .collect();
        assert_eq!(
            decode_tensor(&c, None, p).unwrap().data,
            Data::F(vec![1.0, 0.5, -3.0])
        );
        let mut d = t(vec![1, 2], 11);
        d.double_data = vec![0.25, 8.0];
        assert_eq!(
            decode_tensor(&d, None, p).unwrap().data,
            Data::F(vec![0.25, 8.0])
        );
        let mut e = t(vec![2], 16); // bfloat16 raw
        e.raw_data = Some(
            [
                half::bf16::from_f32(2.0).to_le_bytes(),
                half::bf16::from_f32(-0.5).to_le_bytes(),
            ]
            .concat()
            .into(),
        );
        assert_eq!(
            decode_tensor(&e, None, p).unwrap().data,
            Data::F(vec![2.0, -0.5])
        );
        let mut f = t(vec![2], 7);
        f.int64_data = vec![-1, 5];
        assert_eq!(
            decode_tensor(&f, None, p).unwrap().data,
            Data::I(vec![-1, 5])
        );
        let mut g = t(vec![2], 6);
        g.int32_data = vec![3, -4];
        assert_eq!(
            decode_tensor(&g, None, p).unwrap().data,
            Data::I(vec![3, -4])
        );
    }

    #[test]
    fn rejects_bad_sizes() {
        let p = Path::new("m.onnx");
        let mut a = t(vec![3], 1);
        a.float_data = vec![1.0, 2.0];
        let e = decode_tensor(&a, None, p).unwrap_err().to_string();
        assert!(e.contains("\"w\"") && e.contains("need 3"), "{e}");
        let mut b = t(vec![1 << 20, 1 << 20], 1);
        b.raw_data = Some(vec![0; 8].into());
        let e = decode_tensor(&b, None, p).unwrap_err().to_string();
        assert!(e.contains("2^31"), "{e}");
        let c = t(vec![-1], 1);
        assert!(decode_tensor(&c, None, p)
            .unwrap_err()
            .to_string()
            .contains("negative"));
        let mut d = t(vec![1], 8); // string
        d.raw_data = Some(vec![0].into());
        assert!(decode_tensor(&d, None, p)
            .unwrap_err()
            .to_string()
            .contains("unsupported data type"));
    }
}
