//! Lowering of elementwise math: the one-input functions of [`Pointwise`] (Erf, Gelu, Softplus,
//! Mish, HardSwish, HardSigmoid, Exp, Log, Sqrt, Abs, Neg, Reciprocal, Clip, Pow by a constant)
//! and Max / Min / Pow of activations. On an activation they become IR ops; on constants and
//! shape values they fold (Neg, Sqrt, Reciprocal, Min, Max through the shape plumbing, which
//! keeps window-dependent values symbolic).

use super::{attr, proto, Ctx, Elem, Lowerer, Op, Pointwise, Result, Sym, Val};
use crate::model::ops::binary_channels;

/// ONNX operators this file lowers.
pub(super) const MATH_OPS: [&str; 16] = [
    "Erf",
    "Gelu",
    "Softplus",
    "Mish",
    "HardSwish",
    "HardSigmoid",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Neg",
    "Reciprocal",
    "Clip",
    "Pow",
    "Max",
    "Min",
];

impl Lowerer<'_> {
    /// Any [`MATH_OPS`] node.
    pub(super) fn math(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        let ins: Vec<Val> = (0..n.input.len())
            .filter(|&i| !n.input[i].is_empty())
            .map(|i| self.get(ctx, n, i))
            .collect::<Result<_>>()?;
        let on_act = ins.iter().any(|v| matches!(v, Val::Act(_)));
        match op {
            "Neg" | "Sqrt" | "Reciprocal" | "Min" | "Max" if !on_act => self.plumbing(n, ctx),
            "Max" | "Min" => self.max_min(n, ctx, &ins),
            "Pow" => self.pow(n, ctx, &ins),
            _ => {
                let f = self.pointwise(n, ctx)?;
                match ins.first() {
                    Some(Val::Act(x)) => {
                        let c = self.values[*x].channels;
                        self.emit(ctx, n, Op::Pointwise(f), vec![*x], c);
                        Ok(())
                    }
                    Some(v) => self.fold_pointwise(n, ctx, v, f),
                    None => Err(ctx.err("input 0 is missing")),
                }
            }
        }
    }

    /// The function of a one-input node, its attributes and constant inputs read.
    fn pointwise(&self, n: &proto::NodeProto, ctx: &Ctx) -> Result<Pointwise> {
        let f = |name: &str, default: f32| attr(n, name).and_then(|a| a.f).unwrap_or(default);
        let p = match n.op_type() {
            "Erf" => Pointwise::Erf,
            "Gelu" => match attr(n, "approximate").and_then(|a| a.s.as_deref()) {
                None | Some(b"none") => Pointwise::Gelu { tanh: false },
                Some(b"tanh") => Pointwise::Gelu { tanh: true },
                Some(s) => {
                    return Err(ctx.err(format!(
                        "attribute approximate=\"{}\" is not none or tanh",
                        String::from_utf8_lossy(s)
                    )))
                }
            },
            "Softplus" => Pointwise::Softplus,
            "Mish" => Pointwise::Mish,
            "HardSwish" => Pointwise::HardSwish,
            "HardSigmoid" => Pointwise::HardSigmoid {
                alpha: f("alpha", 0.2),
                beta: f("beta", 0.5),
            },
            "Exp" => Pointwise::Exp,
            "Log" => Pointwise::Log,
            "Sqrt" => Pointwise::Sqrt,
            "Abs" => Pointwise::Abs,
            "Neg" => Pointwise::Neg,
            "Reciprocal" => Pointwise::Reciprocal,
            _ if self.opset < 11 => Pointwise::Clip {
                min: f("min", f32::MIN),
                max: f("max", f32::MAX),
            },
            _ => Pointwise::Clip {
                min: self.bound(n, ctx, 1, "min")?.unwrap_or(f32::NEG_INFINITY),
                max: self.bound(n, ctx, 2, "max")?.unwrap_or(f32::INFINITY),
            },
        };
        p.check().map_err(|e| ctx.err(e))?;
        Ok(p)
    }

    /// Clip's optional scalar bound at input `i`.
    fn bound(&self, n: &proto::NodeProto, ctx: &Ctx, i: usize, what: &str) -> Result<Option<f32>> {
        if n.input.get(i).is_none_or(|s| s.is_empty()) {
            return Ok(None);
        }
        self.scalar(ctx, n, i, what).map(Some)
    }

    /// The single value of constant input `i`.
    fn scalar(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize, what: &str) -> Result<f32> {
        let k = self.cst(ctx, n, i, what)?;
        match k.to_f64()[..] {
            [v] => Ok(v as f32),
            _ => Err(ctx.err(format!(
                "{what} (input {i}) has shape {:?}; only a single value is supported on an activation",
                k.shape
            ))),
        }
    }

    /// `f` of every element of a constant or known shape value.
    fn fold_pointwise(
        &mut self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        v: &Val,
        f: Pointwise,
    ) -> Result<()> {
        let s = self.ev().small(ctx, v)?;
        let vals = s
            .all_known()
            .ok_or_else(|| ctx.err("operand depends on the window size"))?;
        let elems = vals.iter().map(|&x| Elem::Known(f.eval(x))).collect();
        self.set(
            n,
            Val::Sym(Sym {
                shape: s.shape,
                elems,
                int: false,
            }),
        )
    }

    /// Max / Min over activations and scalar constants: activations pairwise (broadcast), the
    /// constants as one Clip bound.
    fn max_min(&mut self, n: &proto::NodeProto, ctx: &Ctx, ins: &[Val]) -> Result<()> {
        let is_max = n.op_type() == "Max";
        let mut acts = vec![];
        let mut bound: Option<f32> = None;
        for (i, v) in ins.iter().enumerate() {
            if let Val::Act(x) = v {
                acts.push(*x);
                continue;
            }
            let k = self.scalar(ctx, n, i, "operand")?;
            bound = Some(match bound {
                Some(b) if is_max => b.max(k),
                Some(b) => b.min(k),
                None => k,
            });
        }
        let mut steps: Vec<(Op, Vec<usize>)> = vec![];
        let mut acc = acts[0];
        for &y in &acts[1..] {
            let op = if is_max { Op::Max } else { Op::Min };
            steps.push((op, vec![usize::MAX, y]));
        }
        if let Some(b) = bound {
            let (min, max) = if is_max {
                (b, f32::INFINITY)
            } else {
                (f32::NEG_INFINITY, b)
            };
            steps.push((
                Op::Pointwise(Pointwise::Clip { min, max }),
                vec![usize::MAX],
            ));
        }
        if steps.is_empty() {
            self.set(n, Val::Act(acc))?;
            return Ok(());
        }
        let last = steps.len() - 1;
        for (k, (op, mut inputs)) in steps.into_iter().enumerate() {
            inputs[0] = acc;
            let chans: Vec<usize> = inputs.iter().map(|&v| self.values[v].channels).collect();
            let c = match chans[..] {
                [a, b] => binary_channels(a, b).map_err(|e| ctx.err(e))?,
                _ => chans[0],
            };
            acc = self.emit(ctx, n, op, inputs, c);
            if k < last {
                self.values[acc].name.push_str(&format!("_{k}"));
                if let Some(nd) = self.nodes.last_mut() {
                    nd.name.push_str(&format!("_{k}"));
                }
            }
        }
        Ok(())
    }

    /// Pow: activation base with a constant scalar exponent ([`Pointwise::Pow`]) or an
    /// activation exponent ([`Op::Pow`], broadcast); constants fold.
    fn pow(&mut self, n: &proto::NodeProto, ctx: &Ctx, ins: &[Val]) -> Result<()> {
        let [a, b] = ins else {
            return Err(ctx.err(format!("has {} inputs, expected 2", ins.len())));
        };
        match (a, b) {
            (Val::Act(x), Val::Act(y)) => {
                let (cx, cy) = (self.values[*x].channels, self.values[*y].channels);
                let c = binary_channels(cx, cy).map_err(|e| ctx.err(e))?;
                self.emit(ctx, n, Op::Pow, vec![*x, *y], c);
                Ok(())
            }
            (Val::Act(x), _) => {
                let e = self.scalar(ctx, n, 1, "exponent")?;
                let c = self.values[*x].channels;
                self.emit(ctx, n, Op::Pointwise(Pointwise::Pow(e)), vec![*x], c);
                Ok(())
            }
            (_, Val::Act(_)) => {
                Err(ctx.err("raising a constant to the power of an activation is not supported"))
            }
            (v, _) => {
                let e = self.scalar(ctx, n, 1, "exponent")?;
                self.fold_pointwise(n, ctx, v, Pointwise::Pow(e))
            }
        }
    }
}
