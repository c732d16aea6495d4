//! Identity chains: each name an Identity produces mapped to the value it copies.
//!
//! Resolved once, in one pass over the nodes in topological order (an Identity's input is then
//! already resolved), so that looking a name up is one hash probe however long the chain: a
//! hostile file of 99 000 chained Identity nodes must not cost a walk per read.

use super::proto;
use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(super) struct Aliases {
    /// Name produced by an Identity -> the non-Identity value at the head of its chain.
    root: HashMap<String, String>,
    /// Names some Identity reads (their values must outlive their last non-Identity reader).
    copied: HashSet<String>,
}

impl Aliases {
    /// The aliases of the Identity nodes among `order` (indices into `g.node`, topologically sorted).
    pub(super) fn of(g: &proto::GraphProto, order: &[usize]) -> Self {
        let mut a = Aliases::default();
        for &i in order {
            let n = &g.node[i];
            if n.op_type() == "Identity" && n.input.len() == 1 && n.output.len() == 1 {
                let head = a.resolve(&n.input[0]).to_string();
                a.copied.insert(n.input[0].clone());
                a.root.insert(n.output[0].clone(), head);
            }
        }
        a
    }

    /// The value `name` is a copy of (itself when no Identity produces it).
    pub(super) fn resolve<'a>(&'a self, name: &'a str) -> &'a str {
        self.root.get(name).map_or(name, String::as_str)
    }

    /// Whether an Identity reads `name`.
    pub(super) fn is_copied(&self, name: &str) -> bool {
        self.copied.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(i: &str, o: &str) -> proto::NodeProto {
        proto::NodeProto {
            op_type: Some("Identity".into()),
            input: vec![i.into()],
            output: vec![o.into()],
            ..Default::default()
        }
    }

    /// A chain longer than the old walk's 10 000-hop cap resolves every link to its head, and
    /// only the names an Identity reads count as copied.
    #[test]
    fn long_chain_resolves_to_its_head() {
        let n = 30_000;
        let g = proto::GraphProto {
            node: (0..n)
                .map(|k| identity(&format!("i{k}"), &format!("i{}", k + 1)))
                .collect(),
            ..Default::default()
        };
        let order: Vec<usize> = (0..n).collect();
        let a = Aliases::of(&g, &order);
        for k in [1, 2, 10_001, n] {
            assert_eq!(a.resolve(&format!("i{k}")), "i0", "i{k}");
        }
        assert_eq!(a.resolve("other"), "other");
        assert!(a.is_copied("i0") && a.is_copied(&format!("i{}", n - 1)));
        assert!(!a.is_copied(&format!("i{n}")));
    }
}
