//! The order in which ONNX nodes are lowered: a topological sort that survives unsorted, cyclic
//! or dangling files, liveness from the output, and the signatures of the input and output.

use super::proto;
use super::values::Val;
use super::Float;
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// Per node: whether the graph output `out` depends on it (a walk back from `out`'s producer).
pub(crate) fn live_nodes(g: &proto::GraphProto, out: &str) -> Vec<bool> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|s| !s.is_empty()) {
            producer.entry(o).or_insert(i);
        }
    }
    let mut live = vec![false; g.node.len()];
    let mut stack: Vec<usize> = producer.get(out).copied().into_iter().collect();
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i], true) {
            continue;
        }
        for inp in &g.node[i].input {
            if let Some(&p) = producer.get(inp.as_str()) {
                if !live[p] {
                    stack.push(p);
                }
            }
        }
    }
    live
}

/// What the model input declares.
pub(crate) struct InputSignature {
    /// Channels (must be fixed).
    pub channels: usize,
    /// Spatial sizes given as numbers.
    pub fixed: [Option<usize>; 3],
    /// The batch size, when given as a number.
    pub batch: Option<usize>,
    /// The element type.
    pub float: Float,
}

/// The model input's [`InputSignature`].
pub(crate) fn input_signature(inp: &proto::ValueInfoProto, path: &Path) -> Result<InputSignature> {
    use proto::tensor_shape_proto::dimension::Value as DV;
    use proto::type_proto::Value as TV;
    let name = inp.name();
    let Some(TV::TensorType(t)) = inp.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(Error::model(
            path,
            format!("input \"{name}\" is not a tensor"),
        ));
    };
    let float = Float::of(t.elem_type()).ok_or_else(|| {
        Error::model(
            path,
            format!(
                "input \"{name}\" has element type {}; voxtile needs float32 (1), float16 (10), bfloat16 (16) or double (11)",
                t.elem_type()
            ),
        )
    })?;
    let dims = t.shape.as_ref().map(|s| s.dim.as_slice()).unwrap_or(&[]);
    if dims.len() != 5 {
        return Err(Error::model(
            path,
            format!(
                "input \"{name}\" has rank {}; voxtile runs 3D models with NCDHW inputs (rank 5)",
                dims.len()
            ),
        ));
    }
    let fixed = |i: usize| match dims[i].value {
        Some(DV::DimValue(v)) if v > 0 => Some(v as usize),
        _ => None,
    };
    let c = fixed(1).ok_or_else(|| {
        Error::model(
            path,
            format!("input \"{name}\" must declare a fixed channel count (dimension 1)"),
        )
    })?;
    Ok(InputSignature {
        channels: c,
        fixed: [fixed(2), fixed(3), fixed(4)],
        batch: fixed(0),
        float,
    })
}

/// Kahn's algorithm over value names; errors name a dangling input or the nodes of a cycle.
pub(crate) fn topo_order(
    g: &proto::GraphProto,
    known: &HashMap<String, Val>,
    path: &Path,
) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|s| !s.is_empty()) {
            if known.contains_key(o.as_str()) || producer.insert(o, i).is_some() {
                return Err(Error::model(
                    path,
                    format!(
                        "value \"{o}\" is produced more than once (node \"{}\")",
                        n.name()
                    ),
                ));
            }
        }
    }
    let mut indeg = vec![0usize; g.node.len()];
    let mut users: Vec<Vec<usize>> = vec![vec![]; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            if known.contains_key(inp.as_str()) {
                continue;
            }
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    indeg[i] += 1;
                    users[p].push(i);
                }
                None => {
                    return Err(Error::model(path, format!("node \"{}\" ({}): input \"{inp}\" is not produced by any node, initializer or graph input", n.name(), n.op_type())))
                }
            }
        }
    }
    // Stable: process ready nodes in file order.
    let mut ready: std::collections::BTreeSet<usize> =
        (0..g.node.len()).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != g.node.len() {
        let stuck: Vec<String> = (0..g.node.len())
            .filter(|&i| indeg[i] > 0)
            .take(5)
            .map(|i| format!("\"{}\"", g.node[i].name()))
            .collect();
        return Err(Error::model(
            path,
            format!("the graph has a cycle through nodes {}", stuck.join(", ")),
        ));
    }
    Ok(order)
}

/// The float type the first graph output declares (f32 when it declares none voxtile reads).
pub(crate) fn output_float(g: &proto::GraphProto) -> Float {
    use proto::type_proto::Value as TV;
    match g
        .output
        .first()
        .and_then(|o| o.r#type.as_ref()?.value.as_ref())
    {
        Some(TV::TensorType(t)) => Float::of(t.elem_type()).unwrap_or(Float::F32),
        _ => Float::F32,
    }
}
