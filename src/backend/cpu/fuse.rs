//! Which activations the executor folds into the Conv before them: a Conv whose output is read by
//! exactly one node, an activation, writes that activation's output directly (one pass over the
//! activation instead of two; the same single buffer is live either way, so the memory plan holds).

use super::ops::{self, Unary};
use super::Real;
use crate::model::graph::{Graph, Node, Op, ValueId};
use crate::Result;
use ndarray::{Array5, ArrayView5};

/// Per node: the activation fused into it and the node it absorbs, or whether it was absorbed.
pub(super) struct Fusion {
    /// `Some((act, j))` on a Conv that runs node j's activation in its epilogue.
    pub into: Vec<Option<(Unary, usize)>>,
    /// Nodes whose work a Conv before them already did.
    pub absorbed: Vec<bool>,
}

fn unary(op: &Op) -> Option<Unary> {
    match op {
        Op::Relu => Some(Unary::Relu),
        Op::LeakyRelu { alpha } => Some(Unary::LeakyRelu(*alpha)),
        Op::Elu { alpha } => Some(Unary::Elu(*alpha)),
        Op::Sigmoid => Some(Unary::Sigmoid),
        Op::Tanh => Some(Unary::Tanh),
        _ => None,
    }
}

/// Fusions among the `needed` nodes of `graph`.
pub(super) fn plan(graph: &Graph, needed: &[bool]) -> Fusion {
    let n = graph.nodes.len();
    let mut readers = vec![Vec::new(); graph.values.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if needed[i] {
            for &v in &node.inputs {
                readers[v].push(i);
            }
        }
    }
    let mut f = Fusion {
        into: vec![None; n],
        absorbed: vec![false; n],
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        if !needed[i] || !matches!(node.op, Op::Conv(_)) || node.output == graph.output {
            continue;
        }
        if let [j] = readers[node.output][..] {
            if let Some(act) = unary(&graph.nodes[j].op) {
                f.into[i] = Some((act, j));
                f.absorbed[j] = true;
            }
        }
    }
    f
}

impl Fusion {
    /// Runs out-of-place node `i` (`node`), with its fused activation if it has one.
    pub fn apply<T: Real>(
        &self,
        node: &Node,
        i: usize,
        ins: &[ArrayView5<T>],
    ) -> Result<Array5<T>> {
        match (&node.op, self.into[i]) {
            (Op::Conv(p), Some((act, _))) => ops::conv3d_fused(ins[0], p, Some(act)),
            _ => ops::apply(&node.op, ins),
        }
    }

    /// The value node `i` writes: its own output, or the absorbed activation's.
    pub fn output(&self, graph: &Graph, i: usize) -> ValueId {
        self.into[i].map_or(graph.nodes[i].output, |(_, j)| graph.nodes[j].output)
    }
}
