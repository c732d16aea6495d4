//! Lowering of the shape-plumbing ops on constants and shape values (Constant, Shape, Cast,
//! Gather, Slice, Unsqueeze...).

use super::{
    attr, decode_tensor, norm_axis, proto, Bop, Const, Ctx, Data, Elem, Float, Lowerer, Rc, Result,
    Round, Sym, Val,
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
                (0..r).map(|a| self.ex.borrow_mut().dim(*x, a)).collect()
            }
            Val::Act(x) => (0..5)
                .map(|a| {
                    if a == 1 {
                        Elem::Known(self.values[*x].channels as f64)
                    } else {
                        self.ex.borrow_mut().dim(*x, a)
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
        let is_float = matches!(to, 1 | 10 | 11 | 16);
        match self.get(ctx, n, 0)? {
            Val::Act(x) => {
                let Some(float) = Float::of(to) else {
                    return Err(ctx.err(format!("casting an activation to type {to} is not supported (voxtile computes in float: float32, float16, bfloat16 or double)")));
                };
                let y = self.cast_act(n, x, float);
                self.set(n, Val::Act(y))?;
            }
            other => {
                let mut s = self.small(ctx, &other)?;
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
                        let mut ex = self.ex.borrow_mut();
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
        let s = self.small(ctx, &x)?;
        let out = match op {
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
        };
        self.set(n, Val::Sym(out))?;
        Ok(())
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
        let mut ex = self.ex.borrow_mut();
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
                .map(|&e| self.ex.borrow_mut().bin(Bop::Mul, e, Elem::Known(-1.0)))
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
