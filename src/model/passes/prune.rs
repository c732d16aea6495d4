//! Dead-code removal: nodes that do not reach the output go, values are renumbered compactly.

use super::uses::{live, remove_nodes};
use crate::model::graph::Graph;

/// Drop nodes that do not contribute to the output and renumber values compactly.
pub(super) fn prune(g: &mut Graph) {
    let (keep, live) = live(g);
    let dead: Vec<bool> = keep.iter().map(|k| !k).collect();
    remove_nodes(g, &dead);
    let mut map = vec![usize::MAX; g.values.len()];
    let mut values = vec![];
    for (i, v) in g.values.iter().enumerate() {
        if live[i] {
            map[i] = values.len();
            values.push(v.clone());
        }
    }
    for n in &mut g.nodes {
        n.output = map[n.output];
        for i in &mut n.inputs {
            *i = map[*i];
        }
    }
    g.input = map[g.input];
    g.output = map[g.output];
    g.values = values;
}
