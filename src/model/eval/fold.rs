//! Folding of the comparison, selection and scatter ops that exports use to compute constants in
//! the graph (Swin's attention masks and relative-position indices) when an operand is a shape
//! value: Equal, Less, Greater, Not, Mod, Where, ScatterND, GatherND. The scatter moves keep
//! symbolic elements ([`super::moves`]); the elementwise ones evaluate their operands (on the probe
//! windows when they read fixed sizes) and fold as constants do ([`super::constfold`]), except a
//! Where whose selected values read activation sizes, which stays symbolic.

use super::moves::Folded;
use super::Eval;
use crate::model::decode::node::Ctx;
use crate::model::decode::values::Val;
use crate::model::decode::{proto, Const};
use crate::model::sym::{broadcast_index, broadcast_shape, for_each_index, Sym};
use crate::Result;
use std::rc::Rc;

/// ONNX operators this file folds.
pub(crate) const FOLD_OPS: [&str; 8] = [
    "Equal",
    "Less",
    "Greater",
    "Not",
    "Mod",
    "Where",
    "ScatterND",
    "GatherND",
];

impl Eval<'_> {
    /// Any [`FOLD_OPS`] node on constants / shape values, folded.
    pub(crate) fn fold(&self, n: &proto::NodeProto, ctx: &Ctx) -> Result<Val> {
        let ins: Vec<Val> = (0..n.input.len())
            .map(|i| self.get(ctx, n, i))
            .collect::<Result<_>>()?;
        if ins.iter().any(|v| matches!(v, Val::Act(_))) {
            return Err(ctx.err(format!(
                "{} on an activation tensor is not supported (only on constants)",
                n.op_type()
            )));
        }
        let syms: Vec<Sym> = ins
            .iter()
            .map(|v| self.small(ctx, v))
            .collect::<Result<_>>()?;
        let out = match (n.op_type(), syms.as_slice()) {
            ("ScatterND", [data, _, upd]) => self.scatter_nd(n, ctx, data, upd)?,
            ("GatherND", [data, _]) => self.gather_nd(n, ctx, data)?,
            ("ScatterND" | "GatherND", _) => return Err(ctx.err("has the wrong number of inputs")),
            ("Where", [c, a, b]) if a.all_known().is_none() || b.all_known().is_none() => {
                self.where_symbolic(ctx, c, a, b)?
            }
            _ => {
                let consts: Vec<Const> = syms
                    .iter()
                    .map(|s| self.evaluated(ctx, s))
                    .collect::<Result<_>>()?;
                let refs: Vec<Option<&Const>> = consts.iter().map(Some).collect();
                let c = self.const_op(n, ctx, &refs)?;
                return Ok(Val::Const(Rc::new(c)));
            }
        };
        Ok(Val::Sym(out))
    }

    /// `s` as a constant, its window-dependent elements evaluated on the probes (an error when
    /// they differ from one window to another).
    fn evaluated(&self, ctx: &Ctx, s: &Sym) -> Result<Const> {
        let v = self.values_of(ctx, s, "an operand")?;
        Ok(Const::from_values(s.shape.clone(), v, s.int))
    }

    /// Where with a known condition selecting between values that read activation sizes.
    fn where_symbolic(&self, ctx: &Ctx, c: &Sym, a: &Sym, b: &Sym) -> Result<Sym> {
        let mut shape = c.shape.clone();
        for s in [a, b] {
            shape = broadcast_shape(&shape, &s.shape).ok_or_else(|| {
                ctx.err(format!(
                    "shapes {shape:?} and {:?} do not broadcast",
                    s.shape
                ))
            })?;
        }
        let numel: usize = shape.iter().product();
        <Sym as Folded>::charge(&self.st.budget, ctx, numel, a.int && b.int)?;
        let cond = self.values_of(ctx, c, "the condition")?;
        let mut elems = Vec::with_capacity(numel);
        for_each_index(&shape, |idx| {
            let pick = if cond[broadcast_index(&c.shape, &shape, idx)] != 0.0 {
                a
            } else {
                b
            };
            elems.push(pick.elems[broadcast_index(&pick.shape, &shape, idx)]);
        });
        Ok(Sym {
            shape,
            elems,
            int: a.int && b.int,
        })
    }
}
