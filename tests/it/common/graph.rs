//! Graph IR built by hand for the backend tests (no ONNX in between).
#![allow(dead_code)]

use voxtile::model::graph::{Conv, Graph, Node, Op, Tensor, Value};

/// A graph named `name` of `nodes` applied in order from an input of `cin` channels: node `i`
/// reads the value ids it lists (0 = the input, `i` = the previous node's output) and writes
/// `channels` channels; the last node's output is the graph's.
pub fn chain(name: &str, cin: usize, nodes: Vec<(Op, Vec<usize>, usize)>) -> Graph {
    let mut values = vec![Value {
        name: "input".into(),
        channels: cin,
    }];
    let mut ns = Vec::new();
    for (i, (op, inputs, channels)) in nodes.into_iter().enumerate() {
        values.push(Value {
            name: format!("v{}", i + 1),
            channels,
        });
        ns.push(Node {
            name: format!("n{i}"),
            op,
            inputs,
            output: i + 1,
        });
    }
    Graph {
        name: name.into(),
        output: values.len() - 1,
        values,
        nodes: ns,
        input: 0,
        fixed_input_spatial: [None; 3],
    }
}

/// A stride-1, undilated, one-group conv with `pads` on every side (`pads` = k / 2: "same").
pub fn conv(weight: Tensor, bias: Option<Tensor>, pads: usize) -> Op {
    Op::Conv(Conv {
        weight,
        bias,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [pads; 6],
        groups: 1,
    })
}

/// An InstanceNorm with eps 1e-5.
pub fn instance_norm(scale: Tensor, bias: Tensor) -> Op {
    Op::InstanceNorm {
        eps: 1e-5,
        scale,
        bias,
    }
}
