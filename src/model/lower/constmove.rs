//! The element moves of the constant-only fast path ([`super::constfold`]): Expand, Reshape,
//! Transpose, Slice, Gather, Concat, (Un)squeeze, ScatterND, GatherND, ConstantOfShape and Range,
//! generic over the element type, each result charged to the constant budget before it is built.

use super::constfold::{at, ints_of, MAX_CONST_ELEMS};
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

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// `out[k] = src[idx(k)]` for the multi-indices of `shape`, `idx` mapping an output index to a
/// flat source index.
fn gather_by<T: Copy>(
    src: &[T],
    shape: &[usize],
    mut idx: impl FnMut(&[usize]) -> usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(shape.iter().product());
    for_each_index(shape, |i| out.push(src[idx(i)]));
    out
}

/// Normalise a possibly negative index against `d`; None when out of range.
fn norm_index(i: i64, d: usize) -> Option<usize> {
    let j = if i < 0 { i + d as i64 } else { i };
    (0..d as i64).contains(&j).then_some(j as usize)
}

impl Lowerer<'_> {
    /// `c` broadcast to `shape` (Expand).
    pub(super) fn c_broadcast(&self, ctx: &Ctx, c: &Const, shape: Vec<usize>) -> Result<Const> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the result is too large to fold"))?;
        self.charge_const(ctx, numel, if c.is_int() { 8 } else { 4 })?;
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| broadcast_index(
            &c.shape, &shape, i
        )));
        Ok(Const { shape, data })
    }

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

    pub(super) fn c_transpose(&self, n: &proto::NodeProto, ctx: &Ctx, c: &Const) -> Result<Const> {
        let r = c.shape.len();
        let perm = self.perm_of(n, ctx, r)?;
        self.charge_const(ctx, c.len(), if c.is_int() { 8 } else { 4 })?;
        let shape: Vec<usize> = perm.iter().map(|&p| c.shape[p]).collect();
        let st = strides(&c.shape);
        let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| {
            i.iter().zip(&src).map(|(a, b)| a * b).sum()
        }));
        Ok(Const { shape, data })
    }

    pub(super) fn c_slice(&self, ctx: &Ctx, c: &Const, ins: &[Option<&Const>]) -> Result<Const> {
        let get = |i: usize, w: &str| -> Result<Option<Vec<i64>>> {
            ins.get(i)
                .copied()
                .flatten()
                .map(|k| ints_of(ctx, k, w))
                .transpose()
        };
        let starts = get(1, "starts")?.unwrap_or_default();
        let ends = get(2, "ends")?.unwrap_or_default();
        let r = c.shape.len();
        let axes: Vec<usize> = match get(3, "axes")? {
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(ctx, v, r))
                .collect::<Result<_>>()?,
            None => (0..starts.len()).collect(),
        };
        let steps = get(4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
        if starts.len() != ends.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(ctx.err("starts/ends/axes/steps differ in length"));
        }
        // Per axis: (first index, step, count).
        let mut keep: Vec<(i64, i64, usize)> = c.shape.iter().map(|&d| (0, 1, d)).collect();
        for i in 0..starts.len() {
            let d = c.shape[axes[i]] as i64;
            let st = steps[i];
            let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
            let (b, cnt) = if st > 0 {
                let (b, e) = (norm(starts[i]).clamp(0, d), norm(ends[i]).clamp(0, d));
                (b, if e > b { (e - b + st - 1) / st } else { 0 })
            } else if st < 0 {
                let (b, e) = (
                    norm(starts[i]).clamp(-1, d - 1),
                    norm(ends[i]).clamp(-1, d - 1),
                );
                (
                    b,
                    if b > e {
                        (b - e + (-st) - 1) / (-st)
                    } else {
                        0
                    },
                )
            } else {
                return Err(ctx.err("slice step 0"));
            };
            keep[axes[i]] = (b, st, cnt as usize);
        }
        let shape: Vec<usize> = keep.iter().map(|k| k.2).collect();
        self.charge_const(ctx, shape.iter().product(), if c.is_int() { 8 } else { 4 })?;
        let st = strides(&c.shape);
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| {
            i.iter()
                .enumerate()
                .map(|(a, &j)| (keep[a].0 + j as i64 * keep[a].1) as usize * st[a])
                .sum()
        }));
        Ok(Const { shape, data })
    }

    pub(super) fn c_gather(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        c: &Const,
        idx: &Const,
    ) -> Result<Const> {
        let r = c.shape.len();
        if r == 0 {
            return Err(ctx.err("gathering from a scalar"));
        }
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), r)?;
        let d = c.shape[axis];
        let iv: Vec<usize> = ints_of(ctx, idx, "index")?
            .iter()
            .map(|&i| {
                norm_index(i, d)
                    .ok_or_else(|| ctx.err(format!("index {i} out of range for dimension {d}")))
            })
            .collect::<Result<_>>()?;
        let mut shape = c.shape[..axis].to_vec();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&c.shape[axis + 1..]);
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the result is too large to fold"))?;
        self.charge_const(ctx, numel, if c.is_int() { 8 } else { 4 })?;
        let st = strides(&c.shape);
        let ist = strides(&idx.shape);
        let q = idx.shape.len();
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| {
            let pre: usize = (0..axis).map(|a| i[a] * st[a]).sum();
            let k: usize = (0..q).map(|a| i[axis + a] * ist[a]).sum();
            let post: usize = (axis + 1..r).map(|a| i[a + q - 1] * st[a]).sum();
            pre + iv[k] * st[axis] + post
        }));
        Ok(Const { shape, data })
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

    pub(super) fn c_squeeze(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        c: &Const,
        axes: Option<&Const>,
    ) -> Result<Const> {
        let axes = match axes {
            Some(a) => Some(ints_of(ctx, a, "axes")?),
            None => self.ints(n, "axes"),
        };
        let shape = squeeze_shape(ctx, &c.shape, n.op_type() == "Unsqueeze", axes.as_deref())?;
        self.charge_const(ctx, c.len(), if c.is_int() { 8 } else { 4 })?;
        Ok(Const {
            shape,
            data: c.data.clone(),
        })
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

    pub(super) fn c_constant_of_shape(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        s: &Const,
    ) -> Result<Const> {
        let dims = ints_of(ctx, s, "shape")?;
        if let Some(d) = dims.iter().find(|&&d| d < 0) {
            return Err(ctx.err(format!("negative dimension {d}")));
        }
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the constant is too large to fold"))?;
        let value = match attr(n, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => Some(decode_tensor(t, self.dir, self.path)?),
            None => None,
        };
        let int = value.as_ref().is_some_and(|c| c.is_int());
        self.charge_const(ctx, numel, if int { 8 } else { 4 })?;
        let v = value
            .map(|c| c.to_f64().first().copied().unwrap_or(0.0))
            .unwrap_or(0.0);
        let data = if int {
            Data::I(vec![v as i64; numel])
        } else {
            Data::F(vec![v as f32; numel])
        };
        Ok(Const { shape, data })
    }

    pub(super) fn c_range(&self, ctx: &Ctx, st: &Const, lim: &Const, dl: &Const) -> Result<Const> {
        let one = |c: &Const| {
            c.to_f64()
                .first()
                .copied()
                .ok_or_else(|| ctx.err("empty Range operand"))
        };
        let (s, l, d) = (one(st)?, one(lim)?, one(dl)?);
        if d == 0.0 {
            return Err(ctx.err("delta is zero"));
        }
        let cnt = ((l - s) / d).ceil().max(0.0);
        if cnt > MAX_CONST_ELEMS as f64 {
            return Err(ctx.err("range too long"));
        }
        let cnt = cnt as usize;
        let int = st.is_int();
        self.charge_const(ctx, cnt, if int { 8 } else { 4 })?;
        let data = if int {
            Data::I((0..cnt).map(|i| (s + i as f64 * d) as i64).collect())
        } else {
            Data::F((0..cnt).map(|i| (s + i as f64 * d) as f32).collect())
        };
        Ok(Const {
            shape: vec![cnt],
            data,
        })
    }
}
