//! The folds of shape values that are not moves: Cast, Flatten, Floor / Ceil and Neg kept
//! symbolic, Sqrt / Reciprocal of known values, Min / Max elementwise; and the dispatch of the
//! shape-plumbing ops on constants and shape values ([`Eval::plumbing`]).

use super::Eval;
use crate::model::decode::node::{attr, norm_axis, Ctx};
use crate::model::decode::values::Val;
use crate::model::decode::{proto, Float};
use crate::model::sym::{Bop, Elem, Round, Sym};
use crate::Result;

impl Eval<'_> {
    /// A shape-plumbing op (Gather, Slice, Unsqueeze...) on the constant / symbolic value `x`.
    pub(crate) fn plumbing(&self, n: &proto::NodeProto, ctx: &Ctx, x: &Val) -> Result<Sym> {
        let op = n.op_type();
        let s = self.small(ctx, x)?;
        Ok(match op {
            "Gather" => self.gather(n, ctx, &s)?,
            "Unsqueeze" | "Squeeze" => self.squeeze(n, ctx, &s)?,
            "Flatten" => self.flatten(n, ctx, s)?,
            "Slice" => self.slice(n, ctx, &s)?,
            "ConstantOfShape" => self.constant_of_shape(n, ctx)?,
            "Floor" | "Ceil" => self.round(n, s)?,
            "Neg" => self.neg(s)?,
            "Sqrt" | "Reciprocal" => self.sqrt_reciprocal(n, ctx, s)?,
            "Min" | "Max" => self.min_max(n, ctx, s)?,
            "Range" => self.range(n, ctx)?,
            "Expand" => self.expand(n, ctx, &s)?,
            "Transpose" => self.transpose(n, ctx, &s)?,
            _ => return Err(ctx.err(format!("operator {op} is not supported"))),
        })
    }

    /// Cast of a constant / symbolic value to ONNX element type `to`.
    pub(crate) fn cast(&self, ctx: &Ctx, v: &Val, to: i32) -> Result<Sym> {
        let is_float = matches!(to, 1 | 10 | 11 | 16);
        let mut s = self.small(ctx, v)?;
        if !is_float {
            if to == 9 {
                s.elems = s
                    .elems
                    .iter()
                    .map(|e| match e {
                        Elem::Known(v) => Elem::Known((*v != 0.0) as i32 as f64),
                        e => *e,
                    })
                    .collect();
            } else {
                let mut ex = self.st.ex.borrow_mut();
                s.elems = s.elems.iter().map(|&e| ex.un(Round::Trunc, e)).collect();
            }
        } else if let Some(f) = Float::of(to).and_then(Float::rounding) {
            // A constant cast to half holds half values, as the model computes with them.
            for e in &mut s.elems {
                if let Elem::Known(v) = e {
                    *v = f.eval(*v);
                }
            }
        }
        s.int = !is_float;
        Ok(s)
    }

    /// Flatten to 2 dims at `axis`.
    fn flatten(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let r = s.shape.len();
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(1), r + 1)?;
        let a: usize = s.shape[..axis].iter().product();
        let b: usize = s.shape[axis..].iter().product();
        Ok(Sym {
            shape: vec![a, b],
            ..s
        })
    }

    /// Floor / Ceil, kept symbolic.
    fn round(&self, n: &proto::NodeProto, s: Sym) -> Result<Sym> {
        let op = n.op_type();
        let k = if op == "Floor" {
            Round::Floor
        } else {
            Round::Ceil
        };
        let mut ex = self.st.ex.borrow_mut();
        Ok(Sym {
            elems: s.elems.iter().map(|&e| ex.un(k, e)).collect(),
            ..s
        })
    }

    /// Neg, kept symbolic.
    fn neg(&self, s: Sym) -> Result<Sym> {
        Ok(Sym {
            elems: s
                .elems
                .iter()
                .map(|&e| self.st.ex.borrow_mut().bin(Bop::Mul, e, Elem::Known(-1.0)))
                .collect(),
            ..s
        })
    }

    /// Sqrt / Reciprocal of known values.
    fn sqrt_reciprocal(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let op = n.op_type();
        let v = s
            .all_known()
            .ok_or_else(|| ctx.err("operand depends on the window size"))?;
        let elems = v
            .iter()
            .map(|&x| Elem::Known(if op == "Sqrt" { x.sqrt() } else { 1.0 / x }))
            .collect();
        Ok(Sym {
            elems,
            int: false,
            ..s
        })
    }

    /// Min / Max over all inputs, elementwise.
    fn min_max(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let op = n.op_type();
        let mut acc = Val::Sym(s);
        for i in 1..n.input.len() {
            let b = self.get(ctx, n, i)?;
            acc = self.elementwise(ctx, &acc, &b, op)?;
        }
        Ok(match acc {
            Val::Sym(s) => s,
            _ => return Err(ctx.err("unexpected")),
        })
    }
}
