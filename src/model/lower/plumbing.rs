//! Lowering of Constant, Shape and Cast, and of the shape-plumbing ops (Gather, Slice,
//! Unsqueeze...): on activations the tensor ops (tensor.rs), on constants and shape values the
//! evaluator's folds ([`crate::model::eval`]).

use super::{
    attr, decode_tensor, proto, Const, Ctx, Data, Elem, Float, Lowerer, Rc, Result, Sym, Val,
};

impl Lowerer<'_> {
    pub(super) fn constant(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let a = n
            .attribute
            .first()
            .ok_or_else(|| ctx.err("has no value attribute"))?;
        let c = match a.name() {
            "value" => decode_tensor(
                a.t.as_ref()
                    .ok_or_else(|| ctx.err("attribute value holds no tensor"))?,
                self.dir,
                self.path,
            )?,
            "value_float" => Const {
                shape: vec![],
                data: Data::F(vec![a.f()]),
            },
            "value_floats" => Const {
                shape: vec![a.floats.len()],
                data: Data::F(a.floats.clone()),
            },
            "value_int" => Const {
                shape: vec![],
                data: Data::I(vec![a.i()]),
            },
            "value_ints" => Const {
                shape: vec![a.ints.len()],
                data: Data::I(a.ints.clone()),
            },
            other => return Err(ctx.err(format!("attribute {other} is not supported"))),
        };
        self.set(n, Val::Const(Rc::new(c)))?;
        Ok(())
    }

    pub(super) fn shape_op(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let v = self.get(ctx, n, 0)?;
        let dims: Vec<Elem> = match &v {
            Val::Act(x) if self.rank_fast(ctx, *x)? != 5 => {
                let r = self.rank_of(ctx, *x)?;
                (0..r).map(|a| self.folder.exprs().dim(*x, a)).collect()
            }
            Val::Act(x) => (0..5)
                .map(|a| {
                    if a == 1 {
                        Elem::Known(self.values[*x].channels as f64)
                    } else {
                        self.folder.exprs().dim(*x, a)
                    }
                })
                .collect(),
            Val::Const(c) => c.shape.iter().map(|&d| Elem::Known(d as f64)).collect(),
            Val::Sym(s) => s.shape.iter().map(|&d| Elem::Known(d as f64)).collect(),
            _ => return Err(ctx.err("the shape of a grouped reshape is not supported")),
        };
        let r = dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let start = clamp(attr(n, "start").and_then(|a| a.i).unwrap_or(0));
        let end = clamp(attr(n, "end").and_then(|a| a.i).unwrap_or(r));
        let elems: Vec<Elem> = if start < end {
            dims[start..end].to_vec()
        } else {
            vec![]
        };
        self.set(
            n,
            Val::Sym(Sym {
                shape: vec![elems.len()],
                elems,
                int: true,
            }),
        )?;
        Ok(())
    }

    pub(super) fn cast(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let to = attr(n, "to")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute to is missing"))? as i32;
        match self.get(ctx, n, 0)? {
            Val::Act(x) => {
                let Some(float) = Float::of(to) else {
                    return Err(ctx.err(format!("casting an activation to type {to} is not supported (voxtile computes in float: float32, float16, bfloat16 or double)")));
                };
                let y = self.cast_act(n, x, float);
                self.set(n, Val::Act(y))?;
            }
            other => {
                let s = self.ev().cast(ctx, &other, to)?;
                self.set(n, Val::Sym(s))?;
            }
        }
        Ok(())
    }

    /// Shape-plumbing ops on constant / symbolic values.
    pub(super) fn plumbing(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        let x = self.get(ctx, n, 0)?;
        if let Val::Act(a) = x {
            return match op {
                "Unsqueeze" | "Squeeze" | "Flatten" => self.squeeze_act(ctx, n, a),
                "Transpose" => self.transpose_act(ctx, n, a),
                "Slice" => self.slice_act(ctx, n, a),
                "Gather" => self.gather_act(ctx, n, a),
                "Split" => self.split_act(ctx, n, a),
                _ => Err(ctx.err(format!("{op} on an activation tensor is not supported (only on constants and shape values)"))),
            };
        }
        let out = self.ev().plumbing(n, ctx, &x)?;
        self.set(n, Val::Sym(out))?;
        Ok(())
    }
}
