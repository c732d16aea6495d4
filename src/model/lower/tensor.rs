//! Lowering of the layout ops on activations of any rank (the token, head and window layouts of
//! transformer nets): Reshape / Flatten / Squeeze / Unsqueeze become [`Op::Reshape`], Transpose
//! [`Op::Transpose`], Slice a chain of one-axis [`Op::Slice`], Gather of one index [`Op::Gather`],
//! Split a Slice per output. Every op's output dims are checked on the probes before it is added.

use super::{
    attr, norm_axis, proto, squeeze_shape, to_i64, Ctx, Lowerer, Op, Result, Sym, Val, ValueId,
};
use crate::model::decode::node::{ints, perm_of};
use crate::model::eval::moves::SliceBounds;
use crate::model::ops::{reshape_dims, Dims, Slice};

impl Lowerer<'_> {
    /// Dims of activation `x` on every probe.
    pub(super) fn dims_of(&self, ctx: &Ctx, x: ValueId) -> Result<Vec<Dims>> {
        let p = self.ev().probe(ctx, x)?;
        let d: Vec<Dims> = p.iter().filter_map(|(s, _)| s.get(x).copied()).collect();
        if d.is_empty() {
            return Err(ctx.err("no probe shape for its input"));
        }
        Ok(d)
    }

    /// Rank of activation `x` (the same on every probe).
    pub(super) fn rank_of(&self, ctx: &Ctx, x: ValueId) -> Result<usize> {
        Ok(self.dims_of(ctx, x)?[0].rank())
    }

    /// Append tensor op `op` once its output dims are valid on every probe; its value's channels
    /// are dim 1 of the output (1 for rank 1). `suffix` names an intermediate of a chain.
    pub(super) fn emit_tensor(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        op: Op,
        inputs: Vec<ValueId>,
        suffix: Option<String>,
    ) -> Result<ValueId> {
        let probes = self.ev().probe(ctx, inputs[0])?;
        let mut out = None;
        for (shapes, _) in probes.iter() {
            let ins: Vec<Dims> = inputs
                .iter()
                .map(|&i| {
                    shapes
                        .get(i)
                        .copied()
                        .ok_or_else(|| ctx.err("input has no shape"))
                })
                .collect::<Result<_>>()?;
            let d = op.output_dims(&ins).map_err(|e| ctx.err(e))?;
            out.get_or_insert(d);
        }
        let c = out.map_or(1, |d| d.as_slice().get(1).copied().unwrap_or(1));
        let v = self.emit(ctx, n, op, inputs, c);
        if let Some(s) = suffix {
            self.values[v].name.push_str(&s);
            if let Some(nd) = self.nodes.last_mut() {
                nd.name.push_str(&s);
            }
        }
        Ok(v)
    }

    /// Bind output `k` of `n` to activation `v` (named after it).
    fn bind_output(&mut self, n: &proto::NodeProto, k: usize, v: ValueId) {
        if let Some(o) = n.output.get(k).filter(|o| !o.is_empty()) {
            self.values[v].name = o.clone();
            self.vals.insert(o.clone(), Val::Act(v));
        }
    }

    /// Reshape activation `x` to `outs` (one shape per probe): a no-op when they are its own dims,
    /// else one [`Op::Reshape`] whose target holds the sizes that are the same on every probe,
    /// 0 where the size is the input's own at that position, and -1 for one that varies otherwise.
    pub(super) fn reshape_to(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        x: ValueId,
        outs: &[Vec<usize>],
    ) -> Result<()> {
        let ins = self.dims_of(ctx, x)?;
        if outs.len() != ins.len() || outs.is_empty() {
            return Err(ctx.err("probe count mismatch"));
        }
        if ins
            .iter()
            .zip(outs)
            .all(|(i, o)| i.as_slice() == o.as_slice())
        {
            return self.set(n, Val::Act(x));
        }
        let r = outs[0].len();
        if outs.iter().any(|o| o.len() != r) {
            return Err(ctx.err("the reshaped rank depends on the window size"));
        }
        let mut target = Vec::with_capacity(r);
        let mut inferred = false;
        for a in 0..r {
            let v0 = outs[0][a];
            if outs.iter().all(|o| o[a] == v0) {
                target.push(v0 as i64);
            } else if ins
                .iter()
                .zip(outs)
                .all(|(i, o)| i.as_slice().get(a) == Some(&o[a]))
            {
                target.push(0);
            } else if !inferred {
                inferred = true;
                target.push(-1);
            } else {
                return Err(ctx.err(
                    "the reshape target depends on the window size in more than one position",
                ));
            }
        }
        for (i, o) in ins.iter().zip(outs) {
            match reshape_dims(i, &target) {
                Ok(d) if d.as_slice() == o.as_slice() => {}
                _ => {
                    return Err(ctx.err(format!(
                        "cannot express the reshape of {i:?} to {o:?} for every window size"
                    )))
                }
            }
        }
        self.emit_tensor(ctx, n, Op::Reshape { target }, vec![x], None)?;
        Ok(())
    }

    /// Reshape of an activation by a target shape value (evaluated on every probe).
    pub(super) fn reshape_act(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        x: ValueId,
        ts: &Sym,
    ) -> Result<()> {
        let probes = self.ev().probe(ctx, x)?;
        let mut outs = vec![];
        for (shapes, _) in probes.iter() {
            let e = self.ev().eval(ctx, &ts.elems, shapes)?;
            let t: Vec<i64> = e
                .iter()
                .map(|&v| to_i64(ctx, v, "target shape"))
                .collect::<Result<_>>()?;
            let d = reshape_dims(&shapes[x], &t).map_err(|e| ctx.err(e))?;
            outs.push(d.as_slice().to_vec());
        }
        self.reshape_to(ctx, n, x, &outs)
    }

    /// Squeeze / Unsqueeze / Flatten of an activation, as a Reshape.
    pub(super) fn squeeze_act(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        x: ValueId,
    ) -> Result<()> {
        let op = n.op_type();
        let axes = match op {
            "Flatten" => None,
            _ => match self.ev().int_operand(ctx, n, 1, "axes")?.map(|(_, v)| v) {
                Some(a) => Some(a),
                None => ints(n, "axes"),
            },
        };
        let mut outs = vec![];
        for d in self.dims_of(ctx, x)? {
            let mut s = d.as_slice().to_vec();
            match op {
                "Flatten" => {
                    let r = s.len();
                    let a = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(1), r + 1)?;
                    s = vec![s[..a].iter().product(), s[a..].iter().product()];
                }
                _ => s = squeeze_shape(ctx, &s, op == "Unsqueeze", axes.as_deref())?,
            }
            if s.is_empty() || s.len() > crate::model::ops::MAX_RANK {
                return Err(ctx.err(format!(
                    "the result would have rank {} (voxtile holds activations of rank 1 to 8)",
                    s.len()
                )));
            }
            outs.push(s);
        }
        self.reshape_to(ctx, n, x, &outs)
    }

    /// Transpose of an activation (reversed axes by default); the identity is a no-op.
    pub(super) fn transpose_act(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        x: ValueId,
    ) -> Result<()> {
        let r = self.rank_of(ctx, x)?;
        let perm = perm_of(n, ctx, r)?;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return self.set(n, Val::Act(x));
        }
        self.emit_tensor(ctx, n, Op::Transpose { perm }, vec![x], None)?;
        Ok(())
    }

    /// Slice of an activation: one [`Op::Slice`] per axis that is not kept whole.
    pub(super) fn slice_act(&mut self, ctx: &Ctx, n: &proto::NodeProto, x: ValueId) -> Result<()> {
        let SliceBounds {
            starts,
            ends,
            axes,
            steps,
        } = self.ev().slice_bounds(n, ctx)?;
        let k = starts.len();
        let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; k]);
        if ends.len() != k || axes.len() != k || steps.len() != k {
            return Err(ctx.err("starts/ends/axes/steps differ in length"));
        }
        let dims = self.dims_of(ctx, x)?;
        let r = dims[0].rank();
        let mut cur = x;
        let mut pending = vec![];
        for i in 0..k {
            if steps[i] < 1 {
                return Err(ctx.err(format!(
                    "slice step {} on an activation (only positive steps are supported)",
                    steps[i]
                )));
            }
            let s = Slice {
                axis: norm_axis(ctx, axes[i], r)? as i64,
                start: starts[i],
                end: ends[i],
                step: steps[i],
            };
            let whole = dims.iter().all(|d| {
                s.resolve(d)
                    .is_ok_and(|a| a.start == 0 && a.step == 1 && a.len == d[a.axis])
            });
            if !whole {
                pending.push(s);
            }
        }
        let last = pending.len();
        if last == 0 {
            return self.set(n, Val::Act(x));
        }
        for (j, s) in pending.into_iter().enumerate() {
            let sfx = (j + 1 < last).then(|| format!("_{j}"));
            cur = self.emit_tensor(ctx, n, Op::Slice(s), vec![cur], sfx)?;
        }
        Ok(())
    }

    /// Gather of constant indices from an activation: a scalar index drops the axis
    /// ([`Op::Gather`]), a run of consecutive indices keeps it ([`Op::Slice`]).
    pub(super) fn gather_act(&mut self, ctx: &Ctx, n: &proto::NodeProto, x: ValueId) -> Result<()> {
        let idx = self.cst(ctx, n, 1, "indices")?;
        let iv: Vec<i64> = idx.to_f64().iter().map(|&v| v as i64).collect();
        let r = self.rank_of(ctx, x)?;
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), r)? as i64;
        if idx.shape.is_empty() && iv.len() == 1 {
            self.emit_tensor(ctx, n, Op::Gather { axis, index: iv[0] }, vec![x], None)?;
            return Ok(());
        }
        let run = idx.shape.len() == 1
            && !iv.is_empty()
            && iv.iter().all(|&v| v >= 0)
            && iv.windows(2).all(|w| w[1] == w[0] + 1);
        if !run {
            return Err(ctx.err(format!(
                "gathering indices of shape {:?} from an activation (only one index, or a run of consecutive ones)",
                idx.shape
            )));
        }
        let s = Slice {
            axis,
            start: iv[0],
            end: iv[iv.len() - 1] + 1,
            step: 1,
        };
        self.emit_tensor(ctx, n, Op::Slice(s), vec![x], None)?;
        Ok(())
    }

    /// Split of an activation: one Slice per output.
    pub(super) fn split_act(&mut self, ctx: &Ctx, n: &proto::NodeProto, x: ValueId) -> Result<()> {
        let dims = self.dims_of(ctx, x)?;
        let r = dims[0].rank();
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), r)?;
        let size = dims[0][axis];
        if dims.iter().any(|d| d[axis] != size) {
            return Err(ctx.err("the split axis depends on the window size"));
        }
        let parts = n.output.len();
        let sizes: Vec<i64> = match self.ev().int_operand(ctx, n, 1, "split")?.map(|(_, v)| v) {
            Some(s) => s,
            None => match ints(n, "split") {
                Some(s) => s,
                None => {
                    let k = attr(n, "num_outputs")
                        .and_then(|a| a.i)
                        .unwrap_or(parts as i64)
                        .max(1) as usize;
                    let each = size.div_ceil(k);
                    (0..k)
                        .map(|i| each.min(size.saturating_sub(i * each)) as i64)
                        .collect()
                }
            },
        };
        if sizes.len() != parts
            || sizes.iter().any(|&s| s < 1)
            || sizes.iter().sum::<i64>() != size as i64
        {
            return Err(ctx.err(format!(
                "split sizes {sizes:?} do not cover axis {axis} of size {size} in {parts} outputs"
            )));
        }
        let mut start = 0i64;
        let mut outs = vec![];
        for &len in &sizes {
            let s = Slice {
                axis: axis as i64,
                start,
                end: start + len,
                step: 1,
            };
            outs.push(self.emit_tensor(ctx, n, Op::Slice(s), vec![x], None)?);
            start += len;
        }
        for (k, v) in outs.into_iter().enumerate() {
            self.bind_output(n, k, v);
        }
        Ok(())
    }
}
