//! The use-def facts every pass reads, computed once per pass over the graph: how often each
//! value is read, which node produces it, which node last reads it; and which nodes reach the
//! output. One walk each, so a pass stays linear in the node count.

use crate::model::graph::{Graph, ValueId};

/// Readers and producer of every value (the graph output counts as one more read).
pub(crate) struct Uses {
    /// Reads of each value.
    pub count: Vec<usize>,
    /// The node writing each value (`usize::MAX`: the input or a constant-free value).
    pub producer: Vec<usize>,
    /// The last node reading each value (`usize::MAX`: none).
    pub reader: Vec<usize>,
}

impl Uses {
    pub(crate) fn of(g: &Graph) -> Uses {
        let n = g.values.len();
        let (mut count, mut producer, mut reader) =
            (vec![0usize; n], vec![usize::MAX; n], vec![usize::MAX; n]);
        for (k, node) in g.nodes.iter().enumerate() {
            for &i in &node.inputs {
                if let (Some(c), Some(r)) = (count.get_mut(i), reader.get_mut(i)) {
                    *c += 1;
                    *r = k;
                }
            }
            if let Some(p) = producer.get_mut(node.output) {
                *p = k;
            }
        }
        if let Some(c) = count.get_mut(g.output) {
            *c += 1;
        }
        Uses {
            count,
            producer,
            reader,
        }
    }

    /// The node producing `v` when `v` is read once (and is not the graph output).
    pub(crate) fn only(&self, v: ValueId) -> Option<usize> {
        let p = *self.producer.get(v)?;
        (self.count[v] == 1 && p != usize::MAX).then_some(p)
    }

    /// The one node reading `v` when `v` is read once (and is not the graph output).
    pub(crate) fn sole_reader(&self, v: ValueId) -> Option<usize> {
        let r = *self.reader.get(v)?;
        (self.count[v] == 1 && r != usize::MAX).then_some(r)
    }
}

/// Which nodes and values reach the graph output (the input always counts as live): one
/// backward walk over the topologically ordered nodes.
/// Ids out of range are skipped (a graph the memory model sees may not be validated yet).
pub(crate) fn live(g: &Graph) -> (Vec<bool>, Vec<bool>) {
    let nv = g.values.len();
    let mut values = vec![false; nv];
    if let Some(v) = values.get_mut(g.output) {
        *v = true;
    }
    let mut nodes = vec![false; g.nodes.len()];
    for (k, n) in g.nodes.iter().enumerate().rev() {
        if values.get(n.output) == Some(&true) {
            nodes[k] = true;
            for &i in n.inputs.iter().filter(|&&i| i < nv) {
                values[i] = true;
            }
        }
    }
    if let Some(v) = values.get_mut(g.input) {
        *v = true;
    }
    (nodes, values)
}

/// The CPU schedule's liveness: the nodes that reach the output and, per value, the last of
/// them that reads it (`usize::MAX` for the output, kept to the end). The executor frees a
/// buffer after its last reader and the CPU memory model replays exactly that.
pub(crate) fn last_reads(g: &Graph) -> (Vec<bool>, Vec<usize>) {
    let nv = g.values.len();
    let (needed, _) = live(g);
    let mut last = vec![0usize; nv];
    for (k, n) in g.nodes.iter().enumerate().filter(|(k, _)| needed[*k]) {
        for &i in n.inputs.iter().filter(|&&i| i < nv) {
            last[i] = k;
        }
    }
    if let Some(l) = last.get_mut(g.output) {
        *l = usize::MAX;
    }
    (needed, last)
}

/// Drops the nodes marked in `removed`, keeping the others in order (a fusion folds a node into
/// its producer and removes it here, once, so a long chain costs its length).
pub(crate) fn remove_nodes(g: &mut Graph, removed: &[bool]) {
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}
