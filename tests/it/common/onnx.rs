//! Hand-built ONNX protos for the tests (independent of voxtile's loader).
#![allow(dead_code)]

use voxtile::internals::proto;

/// A float tensor's ValueInfo: `Some(n)` a fixed dim, `None` a symbolic one named `param(i)`.
pub fn vi_with(
    name: &str,
    dims: &[Option<i64>],
    param: impl Fn(usize) -> String,
) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{dimension::Value as DV, Dimension};
    let dim = dims
        .iter()
        .enumerate()
        .map(|(i, d)| Dimension {
            value: Some(d.map_or_else(|| DV::DimParam(param(i)), DV::DimValue)),
            denotation: None,
        })
        .collect();
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(proto::TensorShapeProto { dim }),
                },
            )),
            denotation: None,
        }),
        doc_string: None,
    }
}

/// ValueInfo with symbolic dims named `s0`, `s1`, ...
pub fn vi(name: &str, dims: &[Option<i64>]) -> proto::ValueInfoProto {
    vi_with(name, dims, |i| format!("s{i}"))
}

/// 5D ValueInfo, symbolic `s{i}` but for the channel dim `cin` when given.
pub fn vi_c(name: &str, cin: Option<i64>) -> proto::ValueInfoProto {
    vi(name, &[None, cin, None, None, None])
}

/// 5D ValueInfo with symbolic dims named N, C, D, H, W (the channel dim `cin` when given).
pub fn vi_ncdhw(name: &str, cin: Option<i64>) -> proto::ValueInfoProto {
    vi_with(name, &[None, cin, None, None, None], |i| {
        ["N", "C", "D", "H", "W"][i].to_string()
    })
}

/// A float32 initializer stored as raw little-endian bytes.
pub fn ftensor(name: &str, dims: &[i64], data: impl AsRef<[f32]>) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(
            data.as_ref()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
        ..Default::default()
    }
}

/// An int64 initializer stored in `int64_data`.
pub fn itensor(name: &str, dims: &[i64], data: Vec<i64>) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(7),
        int64_data: data,
        ..Default::default()
    }
}

/// An INT attribute with its type set (2).
pub fn int_attr(name: &str, i: i64) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        i: Some(i),
        r#type: Some(2),
        ..Default::default()
    }
}

/// An INTS attribute with its type set (7).
pub fn ints_attr(name: &str, ints: Vec<i64>) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        ints,
        r#type: Some(7),
        ..Default::default()
    }
}

/// A node in the default domain.
pub fn node_with(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attribute: Vec<proto::AttributeProto>,
) -> proto::NodeProto {
    proto::NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: Some(name.into()),
        op_type: Some(op.into()),
        attribute,
        ..Default::default()
    }
}

/// An attribute value for [`node`]; written without its type field, as some exporters do.
pub enum Attr {
    I(i64),
    F(f32),
    Is(Vec<i64>),
    S(&'static str),
    T(Box<proto::TensorProto>),
}

/// A node in the default domain with untyped attributes.
pub fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attrs: Vec<(&str, Attr)>,
) -> proto::NodeProto {
    let attribute = attrs
        .into_iter()
        .map(|(k, v)| {
            let mut a = proto::AttributeProto {
                name: Some(k.into()),
                ..Default::default()
            };
            match v {
                Attr::I(i) => a.i = Some(i),
                Attr::F(f) => a.f = Some(f),
                Attr::Is(v) => a.ints = v,
                Attr::S(s) => a.s = Some(s.as_bytes().to_vec()),
                Attr::T(t) => a.t = Some(*t),
            }
            a
        })
        .collect();
    node_with(op, name, ins, outs, attribute)
}

/// An IR 8 model importing the default domain at `opset`, with one graph named `graph_name`.
pub fn model_with(
    graph_name: &str,
    opset: i64,
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    inputs: Vec<proto::ValueInfoProto>,
    outputs: Vec<proto::ValueInfoProto>,
) -> proto::ModelProto {
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(proto::GraphProto {
            node: nodes,
            name: Some(graph_name.into()),
            initializer: inits,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
}
