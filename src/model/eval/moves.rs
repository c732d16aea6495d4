//! The element moves of shape plumbing (Gather, Transpose, Slice, Expand, (Un)squeeze, Range,
//! ConstantOfShape), written once for both kinds of folded value: constants ([`Const`]: f32 or
//! i64 data, the fast path of [`super::constfold`]) and symbolic tensors ([`Sym`]: elements that
//! may read activation sizes). A move computes where each output element comes from; the kind
//! only says how its elements are copied and which budget pays for them ([`Folded`]).
//! Index operands (indices, axes, bounds, shapes) are read by [`Eval::int_operand`], the same
//! way for both kinds.

use super::budget::{Budget, Charge, MAX_CONST_ELEMS};
use super::constfold::{at, ints_of};
use super::{Eval, SMALL};
use crate::model::decode::node::{attr, ints, norm_axis, perm_of, sattr, to_i64, Ctx};
use crate::model::decode::values::Val;
use crate::model::decode::{decode_tensor, proto, Const, Data};
use crate::model::sym::{broadcast_index, broadcast_shape, for_each_index, Elem, Sym};
use crate::Result;

/// A folded value the moves work on.
pub(crate) trait Folded: Sized {
    /// The most elements one value of this kind may hold.
    const MAX_ELEMS: usize;
    fn shape(&self) -> &[usize];
    fn is_int(&self) -> bool;
    /// The value of `shape` whose element at each multi-index is this one's element at the flat
    /// index `src` returns.
    fn moved(&self, shape: Vec<usize>, src: impl FnMut(&[usize]) -> usize) -> Self;
    /// The same elements under another shape of as many elements.
    fn reshaped(&self, shape: Vec<usize>) -> Self;
    /// A value of known numbers (Range, ConstantOfShape).
    fn from_values(shape: Vec<usize>, values: Vec<f64>, int: bool) -> Self;
    /// This value with `upd`'s elements written, `slice` at a time, at each offset of `offs`.
    fn scattered(&self, upd: &Self, offs: &[usize], slice: usize) -> Self;
    /// Check, before anything is allocated, that `elems` elements fit this kind's budget.
    fn charge(budget: &Budget, ctx: &Ctx, elems: usize, int: bool) -> Result<()>;
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// `out[k] = src[idx(k)]` for the multi-indices of `shape`.
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
pub(crate) fn norm_index(i: i64, d: usize) -> Option<usize> {
    let j = if i < 0 { i + d as i64 } else { i };
    (0..d as i64).contains(&j).then_some(j as usize)
}

impl Folded for Const {
    const MAX_ELEMS: usize = MAX_CONST_ELEMS;
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn is_int(&self) -> bool {
        Const::is_int(self)
    }
    fn moved(&self, shape: Vec<usize>, src: impl FnMut(&[usize]) -> usize) -> Self {
        let data = match &self.data {
            Data::F(v) => Data::F(gather_by(v, &shape, src)),
            Data::I(v) => Data::I(gather_by(v, &shape, src)),
        };
        Const { shape, data }
    }
    fn reshaped(&self, shape: Vec<usize>) -> Self {
        Const {
            shape,
            data: self.data.clone(),
        }
    }
    fn from_values(shape: Vec<usize>, values: Vec<f64>, int: bool) -> Self {
        let data = if int {
            Data::I(values.into_iter().map(|v| v as i64).collect())
        } else {
            Data::F(values.into_iter().map(|v| v as f32).collect())
        };
        Const { shape, data }
    }
    fn scattered(&self, upd: &Self, offs: &[usize], slice: usize) -> Self {
        let mut data = self.data.clone();
        for (t, &o) in offs.iter().enumerate() {
            for s in 0..slice {
                let v = at(&upd.data, t * slice + s);
                match &mut data {
                    Data::F(d) => d[o + s] = v as f32,
                    Data::I(d) => d[o + s] = v as i64,
                }
            }
        }
        Const {
            shape: self.shape.clone(),
            data,
        }
    }
    fn charge(budget: &Budget, ctx: &Ctx, elems: usize, int: bool) -> Result<()> {
        budget.charge(ctx, Charge::constant(elems, int))
    }
}

impl Folded for Sym {
    const MAX_ELEMS: usize = SMALL;
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn is_int(&self) -> bool {
        self.int
    }
    fn moved(&self, shape: Vec<usize>, src: impl FnMut(&[usize]) -> usize) -> Self {
        let elems = gather_by(&self.elems, &shape, src);
        Sym {
            shape,
            elems,
            int: self.int,
        }
    }
    fn reshaped(&self, shape: Vec<usize>) -> Self {
        Sym {
            shape,
            ..self.clone()
        }
    }
    fn from_values(shape: Vec<usize>, values: Vec<f64>, int: bool) -> Self {
        Sym {
            shape,
            elems: values.into_iter().map(Elem::Known).collect(),
            int,
        }
    }
    fn scattered(&self, upd: &Self, offs: &[usize], slice: usize) -> Self {
        let mut out = self.clone();
        for (t, &o) in offs.iter().enumerate() {
            out.elems[o..o + slice].copy_from_slice(&upd.elems[t * slice..(t + 1) * slice]);
        }
        out
    }
    fn charge(budget: &Budget, ctx: &Ctx, elems: usize, _int: bool) -> Result<()> {
        if elems > SMALL {
            return Err(ctx.err(format!("{elems} elements is too large a value to fold")));
        }
        budget.check(ctx, Charge::Fold(elems))
    }
}

/// The shape after ONNX Unsqueeze (`unsqueeze`) or Squeeze of `axes` (Squeeze without axes drops
/// every 1): one rule for constants, shape values and activations.
pub(crate) fn squeeze_shape(
    ctx: &Ctx,
    shape: &[usize],
    unsqueeze: bool,
    axes: Option<&[i64]>,
) -> Result<Vec<usize>> {
    let mut s = shape.to_vec();
    if unsqueeze {
        let axes = axes.ok_or_else(|| ctx.err("axes are missing"))?;
        let r = s.len() + axes.len();
        let mut ax: Vec<usize> = axes
            .iter()
            .map(|&a| norm_axis(ctx, a, r))
            .collect::<Result<_>>()?;
        ax.sort_unstable();
        for a in ax {
            s.insert(a, 1);
        }
        return Ok(s);
    }
    let Some(axes) = axes else {
        s.retain(|&d| d != 1);
        return Ok(s);
    };
    let r = s.len();
    let mut ax: Vec<usize> = axes
        .iter()
        .map(|&a| norm_axis(ctx, a, r))
        .collect::<Result<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    for a in ax.into_iter().rev() {
        if s[a] != 1 {
            return Err(ctx.err(format!("cannot squeeze axis {a} of size {}", s[a])));
        }
        s.remove(a);
    }
    Ok(s)
}

/// Length of the index tuples of a ScatterND / GatherND `indices` of shape `idx` (its last axis)
/// into data of rank `rank`.
pub(crate) fn index_tuple_len(ctx: &Ctx, idx: &[usize], rank: usize) -> Result<usize> {
    let k = *idx.last().ok_or_else(|| ctx.err("indices are a scalar"))?;
    if k == 0 || k > rank {
        return Err(ctx.err(format!(
            "index tuples of length {k} for data of rank {rank}"
        )));
    }
    Ok(k)
}

/// Element count of `shape` within `T`'s limit, else an error.
fn numel_of<T: Folded>(ctx: &Ctx, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= T::MAX_ELEMS)
        .ok_or_else(|| ctx.err(format!("a result of shape {shape:?} is too large to fold")))
}

/// A Slice's bounds as the node gives them (axes and steps optional).
pub(crate) struct SliceBounds {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    pub axes: Option<Vec<i64>>,
    pub steps: Option<Vec<i64>>,
}

impl Eval<'_> {
    /// Charge a result of kind `T` and `shape` (within the kind's limit) before it is built.
    fn charge_shape<T: Folded>(&self, ctx: &Ctx, shape: &[usize], int: bool) -> Result<()> {
        T::charge(&self.st.budget, ctx, numel_of::<T>(ctx, shape)?, int)
    }

    /// A Slice's bounds: operands 1-4, or attributes before opset 10.
    pub(crate) fn slice_bounds(&self, n: &proto::NodeProto, ctx: &Ctx) -> Result<SliceBounds> {
        let operand = |i: usize, w: &str| -> Result<Option<Vec<i64>>> {
            Ok(self.int_operand(ctx, n, i, w)?.map(|(_, v)| v))
        };
        Ok(if n.input.len() > 1 {
            SliceBounds {
                starts: operand(1, "starts")?.unwrap_or_default(),
                ends: operand(2, "ends")?.unwrap_or_default(),
                axes: operand(3, "axes")?,
                steps: operand(4, "steps")?,
            }
        } else {
            SliceBounds {
                starts: ints(n, "starts").unwrap_or_default(),
                ends: ints(n, "ends").unwrap_or_default(),
                axes: ints(n, "axes"),
                steps: None,
            }
        })
    }

    /// Operand `i` of `n` as integers with its shape (indices, axes, bounds, shapes); None when
    /// absent. Values that read activation sizes are evaluated on the probe windows when they are
    /// the same on every one (sizes a fixed input declares); values beyond i64 saturate (Slice
    /// bounds are often ±2^63).
    pub(crate) fn int_operand(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        i: usize,
        what: &str,
    ) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        match self.get_opt(ctx, n, i)? {
            None => Ok(None),
            Some(Val::Const(c)) => Ok(Some((c.shape.clone(), ints_of(ctx, &c, what)?))),
            Some(v) => {
                let s = self.small(ctx, &v)?;
                let ints = self
                    .values_of(ctx, &s, what)?
                    .into_iter()
                    .map(|x| match x.is_finite() {
                        true => to_i64(ctx, x.trunc(), what),
                        false if x.is_nan() => Err(ctx.err(format!("{what} is not a number"))),
                        false => Ok(if x > 0.0 { i64::MAX } else { i64::MIN }),
                    })
                    .collect::<Result<_>>()?;
                Ok(Some((s.shape, ints)))
            }
        }
    }

    /// Operand `i`'s integers, required.
    fn ints_required(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        i: usize,
        what: &str,
    ) -> Result<(Vec<usize>, Vec<i64>)> {
        self.int_operand(ctx, n, i, what)?
            .ok_or_else(|| ctx.err(format!("{what} (input {i}) is missing")))
    }

    /// Gather along one axis (indices: operand 1).
    pub(crate) fn gather<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx, x: &T) -> Result<T> {
        let (idx_shape, idx) = self.ints_required(ctx, n, 1, "indices")?;
        let xs = x.shape();
        let r = xs.len();
        if r == 0 {
            return Err(ctx.err("gathering from a scalar"));
        }
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), r)?;
        let d = xs[axis];
        let iv: Vec<usize> = idx
            .iter()
            .map(|&i| {
                norm_index(i, d)
                    .ok_or_else(|| ctx.err(format!("index {i} out of range for dimension {d}")))
            })
            .collect::<Result<_>>()?;
        let mut shape = xs[..axis].to_vec();
        shape.extend_from_slice(&idx_shape);
        shape.extend_from_slice(&xs[axis + 1..]);
        self.charge_shape::<T>(ctx, &shape, x.is_int())?;
        let st = strides(xs);
        let ist = strides(&idx_shape);
        let q = idx_shape.len();
        Ok(x.moved(shape, |i| {
            let pre: usize = (0..axis).map(|a| i[a] * st[a]).sum();
            let k: usize = (0..q).map(|a| i[axis + a] * ist[a]).sum();
            let post: usize = (axis + 1..r).map(|a| i[a + q - 1] * st[a]).sum();
            pre + iv[k] * st[axis] + post
        }))
    }

    /// Transpose by `perm` (reversed axes by default).
    pub(crate) fn transpose<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx, x: &T) -> Result<T> {
        let xs = x.shape();
        let perm = perm_of(n, ctx, xs.len())?;
        let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
        self.charge_shape::<T>(ctx, &shape, x.is_int())?;
        let st = strides(xs);
        let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
        Ok(x.moved(shape, |i| i.iter().zip(&src).map(|(a, b)| a * b).sum()))
    }

    /// Slice: bounds from operands 1-4, or from attributes before opset 10.
    pub(crate) fn slice<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx, x: &T) -> Result<T> {
        let SliceBounds {
            starts,
            ends,
            axes,
            steps,
        } = self.slice_bounds(n, ctx)?;
        let xs = x.shape();
        let r = xs.len();
        let axes: Vec<usize> = match axes {
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(ctx, v, r))
                .collect::<Result<_>>()?,
            None => (0..starts.len()).collect(),
        };
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(ctx.err("starts/ends/axes/steps differ in length"));
        }
        // Per axis: (first index, step, count).
        let mut keep: Vec<(i64, i64, usize)> = xs.iter().map(|&d| (0, 1, d)).collect();
        for i in 0..starts.len() {
            let d = xs[axes[i]] as i64;
            let st = steps[i];
            let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
            // Elements of a span of `w` indices taken every `|st|` (i128: steps reach ±2^63).
            let count = |w: i64| {
                if w > 0 {
                    ((w as i128 - 1) / (st as i128).abs() + 1) as usize
                } else {
                    0
                }
            };
            let (b, cnt) = if st > 0 {
                let (b, e) = (norm(starts[i]).clamp(0, d), norm(ends[i]).clamp(0, d));
                (b, count(e - b))
            } else if st < 0 {
                let (b, e) = (
                    norm(starts[i]).clamp(-1, d - 1),
                    norm(ends[i]).clamp(-1, d - 1),
                );
                (b, count(b - e))
            } else {
                return Err(ctx.err("slice step 0"));
            };
            keep[axes[i]] = (b, st, cnt);
        }
        let shape: Vec<usize> = keep.iter().map(|k| k.2).collect();
        self.charge_shape::<T>(ctx, &shape, x.is_int())?;
        let st = strides(xs);
        Ok(x.moved(shape, |i| {
            i.iter()
                .enumerate()
                .map(|(a, &j)| (keep[a].0 + j as i64 * keep[a].1) as usize * st[a])
                .sum()
        }))
    }

    /// Expand to the shape of operand 1 (numpy broadcasting).
    pub(crate) fn expand<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx, x: &T) -> Result<T> {
        let (_, t) = self.ints_required(ctx, n, 1, "the target shape")?;
        if t.iter().any(|&d| d < 0) {
            return Err(ctx.err(format!("negative target shape {t:?}")));
        }
        let t: Vec<usize> = t.iter().map(|&d| d as usize).collect();
        let xs = x.shape();
        let shape = broadcast_shape(xs, &t)
            .ok_or_else(|| ctx.err(format!("cannot expand {xs:?} to {t:?}")))?;
        self.charge_shape::<T>(ctx, &shape, x.is_int())?;
        Ok(x.moved(shape.clone(), |i| broadcast_index(xs, &shape, i)))
    }

    /// Unsqueeze / Squeeze (axes from operand 1, or the attribute before opset 13).
    pub(crate) fn squeeze<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx, x: &T) -> Result<T> {
        let axes = match self.int_operand(ctx, n, 1, "axes")? {
            Some((_, a)) => Some(a),
            None => ints(n, "axes"),
        };
        let unsqueeze = n.op_type() == "Unsqueeze";
        let shape = squeeze_shape(ctx, x.shape(), unsqueeze, axes.as_deref())?;
        self.charge_shape::<T>(ctx, &shape, x.is_int())?;
        Ok(x.reshaped(shape))
    }

    /// Range of known bounds (operands 0-2); integer when the start is.
    pub(crate) fn range<T: Folded>(&self, n: &proto::NodeProto, ctx: &Ctx) -> Result<T> {
        let one = |i: usize| -> Result<(f64, bool)> {
            let v = self.get(ctx, n, i)?;
            let s = self.small(ctx, &v)?;
            let k = s.all_known().and_then(|k| k.first().copied());
            let k = k.ok_or_else(|| ctx.err("Range over window-dependent or empty bounds"))?;
            Ok((k, s.int))
        };
        let ((s, int), (l, _), (d, _)) = (one(0)?, one(1)?, one(2)?);
        if d == 0.0 {
            return Err(ctx.err("delta is zero"));
        }
        let cnt = ((l - s) / d).ceil().max(0.0);
        if cnt > T::MAX_ELEMS as f64 {
            return Err(ctx.err("range too long"));
        }
        let cnt = cnt as usize;
        T::charge(&self.st.budget, ctx, cnt, int)?;
        let values = (0..cnt).map(|i| s + i as f64 * d).collect();
        Ok(T::from_values(vec![cnt], values, int))
    }

    /// ConstantOfShape: operand 0 the shape, the attribute the value (float 0 by default).
    pub(crate) fn constant_of_shape<T: Folded>(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
    ) -> Result<T> {
        let (_, dims) = self.ints_required(ctx, n, 0, "the shape of ConstantOfShape")?;
        if let Some(d) = dims.iter().find(|&&d| d < 0) {
            return Err(ctx.err(format!("negative dimension {d}")));
        }
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let numel = numel_of::<T>(ctx, &shape)?;
        let value = match attr(n, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => Some(decode_tensor(t, self.st.dir, self.st.path)?),
            None => None,
        };
        let int = value.as_ref().is_some_and(|c| c.is_int());
        T::charge(&self.st.budget, ctx, numel, int)?;
        let v = value.map_or(0.0, |c| c.to_f64().first().copied().unwrap_or(0.0));
        Ok(T::from_values(shape, vec![v; numel], int))
    }

    /// Index tuples (operand 1, along its last axis) resolved to flat offsets into `shape`, and
    /// the elements of the slice each one addresses.
    fn nd_offsets(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        shape: &[usize],
    ) -> Result<(Vec<usize>, Vec<usize>, usize)> {
        let (idx_shape, iv) = self.ints_required(ctx, n, 1, "indices")?;
        let k = index_tuple_len(ctx, &idx_shape, shape.len())?;
        let st = strides(shape);
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
        Ok((offs, idx_shape, shape[k..].iter().product()))
    }

    /// ScatterND without reduction: `data` with the slices at the indices replaced by `upd`.
    pub(crate) fn scatter_nd<T: Folded>(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        data: &T,
        upd: &T,
    ) -> Result<T> {
        if sattr(n, "reduction", "none") != "none" {
            return Err(ctx.err("a reduction other than none is not supported"));
        }
        let (offs, _, slice) = self.nd_offsets(n, ctx, data.shape())?;
        let upd_len: usize = upd.shape().iter().product();
        if upd_len != offs.len() * slice {
            return Err(ctx.err("updates do not match the indexed slices"));
        }
        self.charge_shape::<T>(ctx, data.shape(), data.is_int())?;
        Ok(data.scattered(upd, &offs, slice))
    }

    /// GatherND with batch_dims 0: the slices of `data` at each index tuple.
    pub(crate) fn gather_nd<T: Folded>(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        data: &T,
    ) -> Result<T> {
        if attr(n, "batch_dims").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("batch_dims other than 0 is not supported"));
        }
        let ds = data.shape();
        let (offs, idx_shape, _) = self.nd_offsets(n, ctx, ds)?;
        let q = idx_shape.len() - 1;
        let k = idx_shape[q];
        let mut shape = idx_shape[..q].to_vec();
        shape.extend_from_slice(&ds[k..]);
        self.charge_shape::<T>(ctx, &shape, data.is_int())?;
        let tuple = strides(&idx_shape[..q]);
        let inner = strides(&ds[k..]);
        Ok(data.moved(shape, |i| {
            let t: usize = (0..q).map(|a| i[a] * tuple[a]).sum();
            let e: usize = (q..i.len()).map(|a| i[a] * inner[a - q]).sum();
            offs[t] + e
        }))
    }
}
