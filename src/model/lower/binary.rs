//! Lowering of Add/Sub/Mul/Div (two activations broadcast, broadcast constants, shape values)
//! and Concat.

use super::*;
use crate::model::ops::binary_channels;

impl Lowerer<'_> {
    pub(super) fn binary(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        let a = self.get(ctx, n, 0)?;
        let b = self.get(ctx, n, 1)?;
        match (&a, &b) {
            (Val::Act(x), Val::Act(y)) => {
                let (cx, cy) = (self.values[*x].channels, self.values[*y].channels);
                let c = binary_channels(cx, cy).map_err(|e| ctx.err(e))?;
                let o = match op {
                    "Add" => Op::Add,
                    "Sub" => Op::Sub,
                    "Mul" => Op::Mul,
                    _ => Op::Div,
                };
                self.emit(ctx, n, o, vec![*x, *y], c);
            }
            (Val::Act(x), other) | (other, Val::Act(x)) => {
                let act_first = matches!(a, Val::Act(_));
                let c = self.values[*x].channels;
                let k = match other {
                    Val::Const(k) => k.clone(),
                    Val::Sym(s) => sym_to_const(s)
                        .ok_or_else(|| ctx.err("constant operand depends on the window size"))?,
                    _ => return Err(ctx.err("unsupported operand combination")),
                };
                let t5 = to5(&k.shape).ok_or_else(|| {
                    ctx.err(format!(
                        "constant of shape {:?} has more than 5 dimensions",
                        k.shape
                    ))
                })?;
                if t5[0] != 1 || t5[2..].iter().any(|&d| d != 1) || (t5[1] != 1 && t5[1] != c) {
                    return Err(ctx.err(format!("constant of shape {:?} must broadcast per channel over NCDHW with {c} channels (sizes 1 except the channel axis)", k.shape)));
                }
                let data = k.to_f32();
                let t = |d: Vec<f32>| Tensor::new(t5.to_vec(), d);
                match (op, act_first) {
                    ("Add", _) => {
                        self.emit(ctx, n, Op::AddConst(t(data)), vec![*x], c);
                    }
                    ("Mul", _) => {
                        self.emit(ctx, n, Op::MulConst(t(data)), vec![*x], c);
                    }
                    ("Sub", true) => {
                        self.emit(
                            ctx,
                            n,
                            Op::AddConst(t(data.iter().map(|v| -v).collect())),
                            vec![*x],
                            c,
                        );
                    }
                    ("Sub", false) => {
                        // c - x = (-1)·x + c
                        let neg = self.emit(
                            ctx,
                            n,
                            Op::MulConst(Tensor::new(vec![1; 5], vec![-1.0])),
                            vec![*x],
                            c,
                        );
                        self.values[neg].name.push_str("_neg");
                        if let Some(nd) = self.nodes.last_mut() {
                            nd.name.push_str("_neg");
                        }
                        self.emit(ctx, n, Op::AddConst(t(data)), vec![neg], c);
                    }
                    ("Div", true) => {
                        if data.contains(&0.0) {
                            return Err(ctx.err("divides by a constant that contains zero"));
                        }
                        self.emit(
                            ctx,
                            n,
                            Op::MulConst(t(data.iter().map(|v| 1.0 / v).collect())),
                            vec![*x],
                            c,
                        );
                    }
                    _ => {
                        return Err(ctx.err("dividing a constant by an activation is not supported"))
                    }
                }
            }
            _ => {
                let r = self.elementwise(ctx, &a, &b, op)?;
                self.set(n, r)?;
            }
        }
        Ok(())
    }

    pub(super) fn concat(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let axis = attr(n, "axis")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute axis is missing"))?;
        let ins: Vec<Val> = (0..n.input.len())
            .map(|i| self.get(ctx, n, i))
            .collect::<Result<_>>()?;
        if ins.is_empty() {
            return Err(ctx.err("has no inputs"));
        }
        if ins.iter().any(|v| matches!(v, Val::Act(_))) {
            let axis = norm_axis(ctx, axis, 5)?;
            let mut ids = vec![];
            for (i, v) in ins.iter().enumerate() {
                match v {
                    Val::Act(x) => ids.push(*x),
                    _ => return Err(ctx.err(format!("input {i} is a constant; concatenating constants with activations is not supported"))),
                }
            }
            let chans: Vec<usize> = ids.iter().map(|&i| self.values[i].channels).collect();
            let c = if axis == 1 {
                chans.iter().sum()
            } else {
                if chans.iter().any(|&c| c != chans[0]) {
                    return Err(ctx.err(format!("inputs have channels {chans:?}, which must agree for concatenation along axis {axis}")));
                }
                chans[0]
            };
            if axis == 0 {
                return Err(ctx.err("concatenation along the batch axis is not supported"));
            }
            self.emit(ctx, n, Op::Concat { axis }, ids, c);
            return Ok(());
        }
        let parts: Vec<Sym> = ins
            .iter()
            .map(|v| self.small(ctx, v))
            .collect::<Result<_>>()?;
        let rank = parts[0].shape.len();
        let axis = norm_axis(ctx, axis, rank)?;
        let mut shape = parts[0].shape.clone();
        shape[axis] = 0;
        for p in &parts {
            if p.shape.len() != rank
                || (0..rank).any(|a| a != axis && p.shape[a] != parts[0].shape[a])
            {
                return Err(ctx.err("inputs have mismatched shapes"));
            }
            shape[axis] += p.shape[axis];
        }
        let outer: usize = shape[..axis].iter().product();
        let mut elems = vec![];
        for o in 0..outer {
            for p in &parts {
                let chunk: usize = p.shape[axis..].iter().product();
                elems.extend_from_slice(&p.elems[o * chunk..(o + 1) * chunk]);
            }
        }
        let int = parts.iter().all(|p| p.int);
        self.set(n, Val::Sym(Sym { shape, elems, int }))?;
        Ok(())
    }
}
