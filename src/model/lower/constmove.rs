//! The moves only the constant fast path ([`super::constfold`]) makes: Reshape, Concat,
//! ScatterND and GatherND, each result charged to the constant budget before it is built (the
//! moves both kinds of folded value share are in [`super::moves`]).

use super::constfold::{at, ints_of};
use super::moves::{norm_index, strides};
use super::*;

/// Apply a generic element move to either kind of data.
macro_rules! map_data {
    ($d:expr, |$v:ident| $body:expr) => {
        match $d {
            Data::F($v) => Data::F($body),
            Data::I($v) => Data::I($body),
        }
    };
}

impl Lowerer<'_> {
    pub(super) fn c_reshape(
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
        self.charge_const(ctx, c.len(), if c.is_int() { 8 } else { 4 })?;
        Ok(Const {
            shape,
            data: c.data.clone(),
        })
    }

    pub(super) fn c_concat(
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
        self.charge_const(ctx, shape.iter().product(), if int { 8 } else { 4 })?;
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

    /// Index tuples of the last axis of `idx` resolved to flat offsets into `shape`.
    fn nd_offsets(&self, ctx: &Ctx, shape: &[usize], idx: &Const) -> Result<(Vec<usize>, usize)> {
        let k = index_tuple_len(ctx, &idx.shape, shape.len())?;
        let st = strides(shape);
        let iv = ints_of(ctx, idx, "index")?;
        let offs = iv
            .chunks(k)
            .map(|t| {
                t.iter().enumerate().try_fold(0usize, |acc, (a, &i)| {
                    norm_index(i, shape[a])
                        .map(|j| acc + j * st[a])
                        .ok_or_else(|| {
                            ctx.err(format!("index {i} out of range for dimension {}", shape[a]))
                        })
                })
            })
            .collect::<Result<_>>()?;
        Ok((offs, shape[k..].iter().product()))
    }

    pub(super) fn c_scatter_nd(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        data: &Const,
        idx: &Const,
        upd: &Const,
    ) -> Result<Const> {
        if Self::sattr(n, "reduction", "none") != "none" {
            return Err(ctx.err("a reduction other than none is not supported"));
        }
        let (offs, slice) = self.nd_offsets(ctx, &data.shape, idx)?;
        if upd.len() != offs.len() * slice {
            return Err(ctx.err("updates do not match the indexed slices"));
        }
        self.charge_const(ctx, data.len(), if data.is_int() { 8 } else { 4 })?;
        let mut out = data.data.clone();
        for (t, &o) in offs.iter().enumerate() {
            for s in 0..slice {
                let v = at(&upd.data, t * slice + s);
                match &mut out {
                    Data::F(d) => d[o + s] = v as f32,
                    Data::I(d) => d[o + s] = v as i64,
                }
            }
        }
        Ok(Const {
            shape: data.shape.clone(),
            data: out,
        })
    }

    pub(super) fn c_gather_nd(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        data: &Const,
        idx: &Const,
    ) -> Result<Const> {
        if attr(n, "batch_dims").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("batch_dims other than 0 is not supported"));
        }
        let (offs, slice) = self.nd_offsets(ctx, &data.shape, idx)?;
        let k = idx.shape[idx.shape.len() - 1];
        self.charge_const(
            ctx,
            offs.len().saturating_mul(slice),
            if data.is_int() { 8 } else { 4 },
        )?;
        let mut shape = idx.shape[..idx.shape.len() - 1].to_vec();
        shape.extend_from_slice(&data.shape[k..]);
        let d = map_data!(&data.data, |v| offs
            .iter()
            .flat_map(|&o| v[o..o + slice].iter().copied())
            .collect());
        Ok(Const { shape, data: d })
    }
}
