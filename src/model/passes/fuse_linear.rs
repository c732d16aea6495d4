//! MatMul + Add of the exporters: a Linear's per-column constant add becomes its bias.

use super::uses::{remove_nodes, Uses};
use crate::model::graph::{Graph, Op, Tensor};

/// A Linear without bias whose sole reader adds a constant that is one value per output column
/// (`[1, .., 1, N]`): the constant becomes the Linear's bias (MatMul + Add of the exporters).
pub(super) fn fuse_linear_bias(g: &mut Graph) {
    let uses = Uses::of(g);
    let mut removed = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        let Op::Linear(l) = &g.nodes[i].op else {
            continue;
        };
        let nout = l.weight.shape.get(1).copied().unwrap_or(0);
        let out = g.nodes[i].output;
        let Some(j) = uses.sole_reader(out) else {
            continue;
        };
        if l.bias.is_some() || g.nodes[j].inputs != [out] {
            continue;
        }
        let Op::AddConst(t) = &g.nodes[j].op else {
            continue;
        };
        let per_col = t
            .shape
            .split_last()
            .is_some_and(|(&last, lead)| last == nout && lead.iter().all(|&d| d == 1));
        if !per_col || t.data.len() != nout {
            continue;
        }
        let bias = Tensor::new(vec![nout], t.data.clone());
        if let Op::Linear(l) = &mut g.nodes[i].op {
            l.bias = Some(bias);
        }
        g.nodes[i].output = g.nodes[j].output;
        removed[j] = true;
    }
    remove_nodes(g, &removed);
}
