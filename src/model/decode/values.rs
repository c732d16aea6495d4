//! The ONNX side of one import: what each ONNX value name is bound to ([`Val`]), which names an
//! Identity copies, and who reads each value (how many nodes, of which operator types), counted
//! once before the first node is lowered.

use super::alias::Aliases;
use super::{proto, Const};
use crate::model::graph::ValueId;
use crate::model::sym::Sym;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// What an ONNX value name is bound to.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    Act(ValueId),
    /// Shared: an Identity (or any read) copies the handle, not the data.
    Const(Rc<Const>),
    Sym(Sym),
    /// `Reshape(x, [N, G, -1])` of activation `src` (GroupNorm export, step 1).
    Grouped {
        src: ValueId,
        groups: usize,
    },
    /// InstanceNormalization (scale 1, bias 0) of a [`Val::Grouped`] (step 2).
    GroupedNormed {
        src: ValueId,
        groups: usize,
        eps: f32,
    },
}

#[derive(Default)]
pub(crate) struct OnnxValues {
    bound: HashMap<String, Val>,
    alias: Aliases,
    /// Readers left per value (Identity chains resolved; a graph output counts as one).
    uses: HashMap<String, usize>,
    /// Operator types reading each value (Identity chains resolved).
    readers: HashMap<String, Vec<String>>,
    outputs: HashSet<String>,
    /// Values computed by a node voxtile could not lower (or downstream of one).
    poisoned: HashSet<String>,
}

impl OnnxValues {
    pub fn get(&self, name: &str) -> Option<&Val> {
        self.bound.get(name)
    }

    pub fn insert(&mut self, name: String, v: Val) {
        self.bound.insert(name, v);
    }

    /// Every bound name (the order of the nodes needs to know what is given).
    pub fn bound(&self) -> &HashMap<String, Val> {
        &self.bound
    }

    /// Resolve the Identity chains and count the readers of each value, over the nodes in
    /// `order` (topological) and the graph's outputs.
    pub fn count_reads(&mut self, g: &proto::GraphProto, order: &[usize]) {
        self.alias = Aliases::of(g, order);
        for &i in order {
            let n = &g.node[i];
            if n.op_type() == "Identity" {
                continue;
            }
            for i in n.input.iter().filter(|s| !s.is_empty()) {
                let r = self.resolve(i);
                *self.uses.entry(r.clone()).or_default() += 1;
                self.readers
                    .entry(r)
                    .or_default()
                    .push(n.op_type().to_string());
            }
        }
        for o in &g.output {
            let r = self.resolve(o.name());
            self.outputs.insert(r.clone());
            *self.uses.entry(r).or_default() += 1;
        }
    }

    /// The value `name` copies through Identity nodes (itself when none).
    pub fn resolve(&self, name: &str) -> String {
        self.alias.resolve(name).to_string()
    }

    /// How many readers the value `name` copies has left.
    pub fn uses(&self, name: &str) -> usize {
        self.uses.get(&self.resolve(name)).copied().unwrap_or(0)
    }

    /// Whether `name` (resolved) is read by nothing but the graph: one reader, no graph output.
    pub fn read_once(&self, name: &str) -> bool {
        let r = self.resolve(name);
        self.uses.get(&r) == Some(&1) && !self.outputs.contains(&r)
    }

    /// Whether the one reader left of `name` is the node reading it now, under its own name:
    /// no other node, no graph output and no Identity copy will look it up again.
    pub fn last_read(&self, name: &str) -> bool {
        self.uses.get(name) == Some(&1)
            && !self.outputs.contains(name)
            && !self.alias.is_copied(name)
            && self.resolve(name) == name
    }

    /// Unbind `name`, returning what it was bound to (see [`Self::last_read`]).
    pub fn take(&mut self, name: &str) -> Option<Val> {
        self.bound.remove(name)
    }

    /// The operator types reading `name`.
    pub fn readers(&self, name: &str) -> &[String] {
        self.readers.get(name).map_or(&[], |r| r.as_slice())
    }

    pub fn poison(&mut self, names: impl IntoIterator<Item = String>) {
        self.poisoned.extend(names);
    }

    pub fn is_poisoned(&self, name: &str) -> bool {
        self.poisoned.contains(&self.resolve(name))
    }

    /// One reader of each of `n`'s inputs is done: a folded constant nothing reads any more is
    /// dropped, so that a chain of mask computations holds one or two large values at a time.
    /// Values that an Identity aliases are kept (the alias may be read later under its name).
    pub fn release_inputs(&mut self, n: &proto::NodeProto) {
        for name in n.input.iter().filter(|s| !s.is_empty()) {
            let Some(u) = self.uses.get_mut(name) else {
                continue;
            };
            *u = u.saturating_sub(1);
            if *u == 0 && !self.outputs.contains(name) && !self.alias.is_copied(name) {
                if let Some(Val::Const(_)) = self.bound.get(name) {
                    self.bound.remove(name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, ins: &[&str], out: &str) -> proto::NodeProto {
        proto::NodeProto {
            op_type: Some(op.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            ..Default::default()
        }
    }

    #[test]
    fn only_the_last_reader_under_its_own_name_may_take_a_constant() {
        let g = proto::GraphProto {
            node: vec![
                node("Identity", &["shared"], "alias"),
                node("Conv", &["x", "shared"], "y1"),
                node("Conv", &["y1", "alias"], "y2"),
                node("Conv", &["y2", "once"], "y3"),
                node("Add", &["folded", "zero"], "f2"),
                node("Conv", &["y3", "folded"], "y4"),
                node("Conv", &["y4", "kept"], "out"),
            ],
            output: vec![proto::ValueInfoProto {
                name: Some("kept".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut v = OnnxValues::default();
        v.count_reads(&g, &(0..g.node.len()).collect::<Vec<_>>());
        assert!(v.last_read("once"));
        assert!(
            !v.last_read("shared"),
            "read twice, once through an Identity"
        );
        assert!(
            !v.last_read("alias"),
            "an Identity's name is not the value's own"
        );
        assert!(!v.last_read("kept"), "a graph output");
        assert!(!v.last_read("folded"), "two readers left");
        v.release_inputs(&g.node[4]);
        assert!(v.last_read("folded"), "the folded reader is done");
        v.insert("once".into(), Val::Act(3));
        assert!(matches!(v.take("once"), Some(Val::Act(3))));
        assert!(v.get("once").is_none());
    }
}
