//! Lowering of Add/Sub/Mul/Div (two activations broadcast, broadcast constants, shape values)
//! and Concat.

use super::{
    attr, norm_axis, proto, sym_to_const, to5, Ctx, Lowerer, Op, Result, Sym, Tensor, Val, ValueId,
};
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
                    Val::Const(k) => (**k).clone(),
                    Val::Sym(s) => sym_to_const(s)
                        .ok_or_else(|| ctx.err("constant operand depends on the window size"))?,
                    _ => return Err(ctx.err("unsupported operand combination")),
                };
                let t5 = to5(&k.shape).filter(|t5| {
                    t5[0] == 1 && t5[2..].iter().all(|&d| d == 1) && (t5[1] == 1 || t5[1] == c)
                });
                let shape = match t5 {
                    Some(t5) if self.rank_fast(ctx, *x)? == 5 => t5.to_vec(),
                    _ if self.has_tensor_ops() => self.const_shape_for(ctx, *x, &k.shape)?,
                    _ => return Err(ctx.err(format!("constant of shape {:?} must broadcast per channel over NCDHW with {c} channels (sizes 1 except the channel axis)", k.shape))),
                };
                let data = k.to_f32();
                let t = |d: Vec<f32>| Tensor::new(shape.clone(), d);
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
                            Op::MulConst(Tensor::new(vec![1; shape.len()], vec![-1.0])),
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
                let r = self.ev().elementwise(ctx, &a, &b, op)?;
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
        if let Some(Val::Act(first)) = ins.iter().find(|v| matches!(v, Val::Act(_))) {
            let axis = norm_axis(ctx, axis, self.rank_fast(ctx, *first)?)?;
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
            .map(|v| self.ev().small(ctx, v))
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

    /// Whether a tensor op was lowered yet (before the first, every activation is NCDHW).
    pub(super) fn has_tensor_ops(&self) -> bool {
        self.nodes.iter().any(|n| n.op.is_tensor_op())
    }

    /// Rank of activation `x`: 5 without probing while no tensor op was lowered.
    pub(super) fn rank_fast(&self, ctx: &Ctx, x: ValueId) -> Result<usize> {
        if self.has_tensor_ops() {
            self.rank_of(ctx, x)
        } else {
            Ok(5)
        }
    }

    /// A constant of shape `k` broadcast onto activation `x` of any rank: right-aligned to its
    /// rank (leading 1s added or dropped), each size 1 or the activation's on every probe, and
    /// batch 1 (the graph runs at any batch the planner picks).
    fn const_shape_for(&self, ctx: &Ctx, x: ValueId, k: &[usize]) -> Result<Vec<usize>> {
        let dims = self.dims_of(ctx, x)?;
        let r = dims[0].rank();
        let lead = k.len().saturating_sub(r);
        if k[..lead].iter().any(|&d| d != 1) {
            return Err(ctx.err(format!(
                "constant of shape {k:?} has more dimensions than the activation ({r})"
            )));
        }
        let mut shape = vec![1; r - (k.len() - lead)];
        shape.extend_from_slice(&k[lead..]);
        let fits = dims.iter().all(|d| {
            d.rank() == r
                && shape
                    .iter()
                    .zip(d.as_slice())
                    .all(|(&c, &v)| c == 1 || c == v)
        });
        if !fits || (r > 1 && shape[0] != 1) {
            return Err(ctx.err(format!(
                "constant of shape {k:?} does not broadcast onto the activation of shape {:?} (batch 1, every size 1 or equal)",
                dims[0]
            )));
        }
        Ok(shape)
    }
}
