//! The moves only the constant fast path ([`super::constfold`]) makes: Reshape and Concat, each result charged to the constant budget before it is built (the
//! moves both kinds of folded value share are in [`super::moves`]).

use super::budget::Charge;
use super::constfold::{at, ints_of};
use super::Eval;
use crate::model::decode::node::{attr, norm_axis, Ctx};
use crate::model::decode::{proto, Const, Data};
use crate::Result;

impl Eval<'_> {
    pub(crate) fn c_reshape(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        c: &Const,
        t: &Const,
    ) -> Result<Const> {
        let t = ints_of(ctx, t, "target shape")?;
        let allowzero = attr(n, "allowzero").and_then(|a| a.i).unwrap_or(0) != 0;
        let mut shape = vec![];
        let mut infer = None;
        for (a, &d) in t.iter().enumerate() {
            match d {
                0 if !allowzero => shape.push(
                    *c.shape
                        .get(a)
                        .ok_or_else(|| ctx.err("a 0 in the target has no input dimension"))?,
                ),
                -1 if infer.is_none() => {
                    infer = Some(a);
                    shape.push(1);
                }
                d if d >= 0 => shape.push(d as usize),
                d => return Err(ctx.err(format!("invalid target dimension {d}"))),
            }
        }
        let known: usize = shape.iter().product();
        if let Some(a) = infer {
            if known == 0 || !c.len().is_multiple_of(known) {
                return Err(ctx.err("cannot infer the -1 dimension"));
            }
            shape[a] = c.len() / known;
        }
        if shape.iter().product::<usize>() != c.len() {
            return Err(ctx.err(format!("cannot reshape {:?} to {t:?}", c.shape)));
        }
        self.st
            .budget
            .charge(ctx, Charge::constant(c.len(), c.is_int()))?;
        Ok(Const {
            shape,
            data: c.data.clone(),
        })
    }

    pub(crate) fn c_concat(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        ins: &[Option<&Const>],
    ) -> Result<Const> {
        let cs: Vec<&Const> = ins.iter().flatten().copied().collect();
        let first = cs.first().ok_or_else(|| ctx.err("has no inputs"))?;
        let r = first.shape.len();
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), r)?;
        let int = cs.iter().all(|c| c.is_int());
        let mut shape = first.shape.clone();
        shape[axis] = 0;
        for c in &cs {
            let mut s = c.shape.clone();
            if s.len() != r {
                return Err(ctx.err("inputs differ in rank"));
            }
            shape[axis] += s[axis];
            s[axis] = shape[axis];
            if s != shape {
                return Err(ctx.err(format!(
                    "shapes {:?} and {:?} do not concatenate",
                    first.shape, c.shape
                )));
            }
        }
        self.st
            .budget
            .charge(ctx, Charge::constant(shape.iter().product(), int))?;
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let data = if int {
            let mut out = Vec::with_capacity(outer * shape[axis] * inner);
            for o in 0..outer {
                for c in &cs {
                    let w = c.shape[axis] * inner;
                    if let Data::I(v) = &c.data {
                        out.extend_from_slice(&v[o * w..(o + 1) * w]);
                    }
                }
            }
            Data::I(out)
        } else {
            let mut out = Vec::with_capacity(outer * shape[axis] * inner);
            for o in 0..outer {
                for c in &cs {
                    let w = c.shape[axis] * inner;
                    out.extend((o * w..(o + 1) * w).map(|i| at(&c.data, i) as f32));
                }
            }
            Data::F(out)
        };
        Ok(Const { shape, data })
    }
}
