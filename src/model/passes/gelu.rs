//! GELU fusion: PyTorch's legacy exporter writes `nn.GELU()` as
//! `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)` (the dynamo exporter's decompositions put the
//! 0.5 on x first). When the IR holds that chain exactly (every intermediate read once), its
//! last node becomes one [`Pointwise::Gelu`] of `x` and the rest is pruned: one pass instead of
//! five, and PyTorch's own GELU numerics. Anything else keeps its Erf.

use super::uses::Uses;
use crate::model::graph::{Graph, Node, Op, ValueId};
use crate::model::ops::Pointwise;

/// Whether `op` is a Mul / Add by one scalar close to `want`.
fn scalar_const(op: &Op, mul: bool, want: f64) -> bool {
    let t = match (op, mul) {
        (Op::MulConst(t), true) | (Op::AddConst(t), false) => t,
        _ => return false,
    };
    t.data.len() == 1 && (t.data[0] as f64 - want).abs() <= 1e-6 * want.abs()
}

/// The graph and its use-def facts, for matching a chain.
struct Chain<'g> {
    g: &'g Graph,
    uses: Uses,
}

impl Chain<'_> {
    /// The node producing `v` when `v` is read once (and is not the graph output).
    fn only(&self, v: ValueId) -> Option<&Node> {
        self.uses.only(v).map(|p| &self.g.nodes[p])
    }

    /// `x` when `a` is `1 + erf(x / √2)` (Add by 1 of Erf of Mul by 1/√2 of x).
    fn erf_plus_one(&self, a: ValueId) -> Option<ValueId> {
        let add = self.only(a)?;
        if !scalar_const(&add.op, false, 1.0) {
            return None;
        }
        let erf = self.only(add.inputs[0])?;
        if erf.op != Op::Pointwise(Pointwise::Erf) {
            return None;
        }
        let div = self.only(erf.inputs[0])?;
        scalar_const(&div.op, true, std::f64::consts::FRAC_1_SQRT_2).then_some(div.inputs[0])
    }

    /// `x` when `mul` (a two-activation Mul) reads `1 + erf(x / √2)` and `other(x)`.
    fn product(&self, mul: &Node, other: impl Fn(ValueId) -> Option<ValueId>) -> Option<ValueId> {
        if mul.op != Op::Mul {
            return None;
        }
        let [p, q] = mul.inputs[..] else { return None };
        [(p, q), (q, p)].into_iter().find_map(|(a, b)| {
            let x = self.erf_plus_one(a)?;
            (other(b)? == x).then_some(x)
        })
    }

    /// `x` when node `k` computes GELU(x) by the exported chain.
    fn gelu_input(&self, k: usize) -> Option<ValueId> {
        let n = &self.g.nodes[k];
        if scalar_const(&n.op, true, 0.5) {
            // (x · (1 + erf)) · 0.5
            let mul = self.only(n.inputs[0])?;
            return self.product(mul, Some);
        }
        // (x · 0.5) · (1 + erf)
        self.product(n, |h| {
            let half = self.only(h)?;
            scalar_const(&half.op, true, 0.5).then_some(half.inputs[0])
        })
    }
}

/// Rewrites every exact exported GELU chain into one node (the dead rest goes with `prune`).
pub(super) fn fuse_gelu(g: &mut Graph) {
    let found: Vec<(usize, ValueId)> = {
        let u = Chain {
            g,
            uses: Uses::of(g),
        };
        (0..g.nodes.len())
            .filter_map(|k| u.gelu_input(k).map(|x| (k, x)))
            .collect()
    };
    for (k, x) in found {
        g.nodes[k].op = Op::Pointwise(Pointwise::Gelu { tanh: false });
        g.nodes[k].inputs = vec![x];
    }
}
