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
