//! Graph IR built by hand for the backend tests (no ONNX in between).
#![allow(dead_code)]

use voxtile::model::graph::{Graph, Node, Op, Value};

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
