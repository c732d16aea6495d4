//! Fast folding of pure constants: when every operand of a node is a known constant, the node is
//! computed directly on the `Const` data (f32 / i64 vectors, numpy broadcasting) instead of going
//! through the symbolic [`Sym`] machinery (an `X` enum per element). Transformer exports compute
//! attention masks and relative-position indices in the graph this way (SwinUNETR: tens of millions
//! of elements); the symbolic path stays for what depends on activation sizes.
//!
//! Results are charged, in bytes actually allocated, to the import's constant budget (see
//! [`CONST_BASE_BYTES`]); a single folded value may hold at most [`MAX_CONST_ELEMS`] elements.
//! Booleans (Equal, Not, Cast to bool...) are kept as f32 0/1: exact, and half the bytes of i64.

use super::*;

/// Largest constant one fold may produce (elements).
pub(super) const MAX_CONST_ELEMS: usize = 1 << 26;

/// Bytes that constant folds may allocate over a whole import, on top of [`CONST_WEIGHT_FACTOR`] times the bytes of
/// the model's own initializers: a real export computes masks of the size of what its weights
/// compute with, while a small hostile file stays at a few hundred megabytes.
pub(super) const CONST_BASE_BYTES: usize = 1 << 28;

/// The multiple of the initializers' bytes added to [`CONST_BASE_BYTES`].
pub(super) const CONST_WEIGHT_FACTOR: usize = 8;

/// Operators with a constant-only fast path.
const FAST_OPS: [&str; 26] = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Min",
    "Max",
    "Equal",
    "Less",
    "Greater",
    "Mod",
    "Not",
    "Where",
    "Neg",
    "Cast",
    "Reshape",
    "Transpose",
    "Slice",
    "Gather",
    "Concat",
    "Expand",
    "Unsqueeze",
    "Squeeze",
    "ScatterND",
    "GatherND",
    "ConstantOfShape",
    "Range",
];

/// Operators whose inputs after the first are shapes, indices or axes.
const SHAPE_OPERANDS: [&str; 6] = [
    "Reshape",
    "Expand",
    "Slice",
    "Gather",
    "Unsqueeze",
    "Squeeze",
];

/// One elementwise operation, resolved from the operator name before the loop.
#[derive(Clone, Copy)]
enum Ew {
    Add,
    Sub,
    Mul,
    IDiv,
    Div,
    Min,
    Max,
    Equal,
    Less,
    Greater,
    Not,
    Neg,
    ToBool,
    Trunc,
    Copy,
    Where,
    Mod,
    Fmod,
}

/// Apply a generic element move to either kind of data.
macro_rules! map_data {
    ($d:expr, |$v:ident| $body:expr) => {
        match $d {
            Data::F($v) => Data::F($body),
            Data::I($v) => Data::I($body),
        }
    };
}

/// Element `i` as f64.
fn at(d: &Data, i: usize) -> f64 {
    match d {
        Data::F(v) => v[i] as f64,
        Data::I(v) => v[i] as f64,
    }
}

/// The values as i64 (indices, shapes, axes).
fn ints_of(ctx: &Ctx, c: &Const, what: &str) -> Result<Vec<i64>> {
    match &c.data {
        Data::I(v) => Ok(v.clone()),
        Data::F(v) => v.iter().map(|&x| to_i64(ctx, x as f64, what)).collect(),
    }
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
    /// Fold `n` directly when all its inputs are known constants and its operator has a fast
    /// path; Ok(false) leaves it to the general lowering.
    pub(super) fn try_const_fold(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<bool> {
        let op = n.op_type();
        if !FAST_OPS.contains(&op) || n.input.is_empty() || n.output.len() != 1 {
            return Ok(false);
        }
        // Slice/Squeeze/Unsqueeze with attributes (old opsets) go the general way.
        if matches!(op, "Slice") && n.input.len() < 3 {
            return Ok(false);
        }
        // Known symbolic values (shape arithmetic) become constants; anything else leaves.
        // Shape operands (Reshape targets...) that read the sizes of a fixed input are evaluated.
        let mut owned: Vec<Option<Const>> = vec![];
        for (i, name) in n.input.iter().enumerate() {
            owned.push(match self.vals.get(name) {
                _ if name.is_empty() => None,
                Some(Val::Const(_)) => None,
                Some(Val::Sym(s)) => match sym_to_const(s) {
                    Some(c) => Some(c),
                    None if i > 0 && SHAPE_OPERANDS.contains(&op) => {
                        match self.values_of(ctx, s, "a shape operand") {
                            Ok(v) => Some(Const {
                                shape: s.shape.clone(),
                                data: Data::I(v.iter().map(|&x| x as i64).collect()),
                            }),
                            Err(_) => return Ok(false),
                        }
                    }
                    None => return Ok(false),
                },
                _ => return Ok(false),
            });
        }
        let vals = &self.vals;
        let refs: Vec<Option<&Const>> = n
            .input
            .iter()
            .zip(&owned)
            .map(|(name, o)| match (o, vals.get(name)) {
                (Some(c), _) => Some(c),
                (None, Some(Val::Const(c))) => Some(c),
                _ => None,
            })
            .collect();
        let out = self.const_op(n, ctx, &refs)?;
        self.release_inputs(n);
        self.set(n, Val::Const(out))?;
        Ok(true)
    }

    /// Drop folded constants this node was the last reader of, so that a chain of mask
    /// computations holds one or two large values at a time, not all of them. Values that an
    /// Identity aliases are kept (the alias may be read later under its own name).
    fn release_inputs(&mut self, n: &proto::NodeProto) {
        for name in n.input.iter().filter(|s| !s.is_empty()) {
            let Some(u) = self.uses.get_mut(name) else {
                continue;
            };
            *u = u.saturating_sub(1);
            let aliased = || self.alias.values().any(|a| a == name);
            if *u == 0 && !self.graph_outputs.contains(name) && !aliased() {
                if let Some(Val::Const(_)) = self.vals.get(name) {
                    self.vals.remove(name);
                }
            }
        }
    }

    /// Check (before allocating) and charge a folded constant of `elems` elements of `bytes` each.
    fn charge_const(&self, ctx: &Ctx, elems: usize, bytes: usize) -> Result<()> {
        if elems > MAX_CONST_ELEMS {
            return Err(ctx.err(format!(
                "folding its constant computation makes {elems} elements, more than the \
                 {MAX_CONST_ELEMS} voxtile allows for one value"
            )));
        }
        let need = elems * bytes;
        let left = self.const_left.get();
        if need > left {
            self.budget_hit.set(true);
            return Err(ctx.err(format!(
                "folding its constant computation needs {need} bytes; with the folds before it, \
                 that is more than the {} bytes voxtile allows for this model",
                self.const_budget
            )));
        }
        self.const_left.set(left - need);
        Ok(())
    }

    fn const_op(&self, n: &proto::NodeProto, ctx: &Ctx, ins: &[Option<&Const>]) -> Result<Const> {
        let input = |i: usize| -> Result<&Const> {
            ins.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| ctx.err(format!("input {i} is missing")))
        };
        let op = n.op_type();
        match op {
            "Reshape" => self.c_reshape(n, ctx, input(0)?, input(1)?),
            "Transpose" => self.c_transpose(n, ctx, input(0)?),
            "Slice" => self.c_slice(ctx, input(0)?, ins),
            "Gather" => self.c_gather(n, ctx, input(0)?, input(1)?),
            "Concat" => self.c_concat(n, ctx, ins),
            "Expand" => {
                let t = ints_of(ctx, input(1)?, "shape")?;
                let t: Vec<usize> = t.iter().map(|&v| v.max(0) as usize).collect();
                let c = input(0)?;
                let shape = broadcast_shape(&c.shape, &t)
                    .ok_or_else(|| ctx.err(format!("cannot expand {:?} to {t:?}", c.shape)))?;
                self.c_broadcast(ctx, c, shape)
            }
            "Unsqueeze" | "Squeeze" => {
                self.c_squeeze(n, ctx, input(0)?, ins.get(1).copied().flatten())
            }
            "ScatterND" => self.c_scatter_nd(n, ctx, input(0)?, input(1)?, input(2)?),
            "GatherND" => self.c_gather_nd(n, ctx, input(0)?, input(1)?),
            "ConstantOfShape" => self.c_constant_of_shape(n, ctx, input(0)?),
            "Range" => self.c_range(ctx, input(0)?, input(1)?, input(2)?),
            _ => self.c_elementwise(n, ctx, ins),
        }
    }

    /// Every elementwise op, numpy broadcasting over all inputs, computed in f64 per element.
    fn c_elementwise(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        ins: &[Option<&Const>],
    ) -> Result<Const> {
        let op = n.op_type();
        let want = match op {
            "Not" | "Neg" | "Cast" => 1,
            "Where" => 3,
            _ => 2,
        };
        let cs: Vec<&Const> = ins.iter().flatten().copied().collect();
        if cs.len() != want || ins.len() != want {
            return Err(ctx.err(format!("has {} inputs, expected {want}", ins.len())));
        }
        let mut shape = cs[0].shape.clone();
        for c in &cs[1..] {
            shape = broadcast_shape(&shape, &c.shape).ok_or_else(|| {
                ctx.err(format!(
                    "shapes {shape:?} and {:?} do not broadcast",
                    c.shape
                ))
            })?;
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the result is too large to fold"))?;
        let to = attr(n, "to").and_then(|a| a.i).unwrap_or(1);
        // Output kind: i64 for integer arithmetic, f32 for floats and booleans.
        let int = match op {
            "Equal" | "Less" | "Greater" | "Not" => false,
            "Cast" => !matches!(to, 1 | 9 | 10 | 11 | 16),
            "Where" => cs[1].is_int() && cs[2].is_int(),
            _ => cs.iter().all(|c| c.is_int()),
        };
        self.charge_const(ctx, numel, if int { 8 } else { 4 })?;
        let fmod = attr(n, "fmod").and_then(|a| a.i).unwrap_or(0) != 0;
        let same: Vec<bool> = cs.iter().map(|c| c.shape == shape).collect();
        let one: Vec<bool> = cs.iter().map(|c| c.len() == 1).collect();
        let mut fail = None;
        let mut vals: Vec<f64> = vec![0.0; want];
        // The operator resolved once, not per element.
        let kind = match op {
            "Add" => Ew::Add,
            "Sub" => Ew::Sub,
            "Mul" => Ew::Mul,
            "Div" if int => Ew::IDiv,
            "Div" => Ew::Div,
            "Min" => Ew::Min,
            "Max" => Ew::Max,
            "Equal" => Ew::Equal,
            "Less" => Ew::Less,
            "Greater" => Ew::Greater,
            "Not" => Ew::Not,
            "Neg" => Ew::Neg,
            "Cast" if to == 9 => Ew::ToBool,
            "Cast" if int => Ew::Trunc,
            "Cast" => Ew::Copy,
            "Where" => Ew::Where,
            _ if fmod => Ew::Fmod,
            _ => Ew::Mod,
        };
        let mut f = |idx: &[usize], k: usize| -> f64 {
            for (i, c) in cs.iter().enumerate() {
                let j = if same[i] {
                    k
                } else if one[i] {
                    0
                } else {
                    broadcast_index(&c.shape, &shape, idx)
                };
                vals[i] = at(&c.data, j);
            }
            let (x, y) = (vals[0], vals.get(1).copied().unwrap_or(0.0));
            let b = |t: bool| t as i32 as f64;
            match kind {
                Ew::Add => x + y,
                Ew::Sub => x - y,
                Ew::Mul => x * y,
                Ew::IDiv => {
                    if y == 0.0 {
                        fail = Some("integer division by zero");
                    }
                    (x / y).trunc()
                }
                Ew::Div => x / y,
                Ew::Min => x.min(y),
                Ew::Max => x.max(y),
                Ew::Equal => b(x == y),
                Ew::Less => b(x < y),
                Ew::Greater => b(x > y),
                Ew::Not => b(x == 0.0),
                Ew::Neg => -x,
                Ew::ToBool => b(x != 0.0),
                Ew::Trunc => x.trunc(),
                Ew::Copy => x,
                Ew::Where => {
                    if x != 0.0 {
                        y
                    } else {
                        vals[2]
                    }
                }
                Ew::Mod | Ew::Fmod if y == 0.0 => {
                    fail = Some("modulo by zero");
                    0.0
                }
                Ew::Fmod => x % y,
                Ew::Mod => x - y * (x / y).floor(),
            }
        };
        // Inputs of the output's shape or of one element need no index arithmetic.
        let simple = cs.iter().all(|c| c.shape == shape || c.len() == 1);
        let mut each = |push: &mut dyn FnMut(f64)| {
            if simple {
                (0..numel).for_each(|k| push(f(&[], k)));
            } else {
                let mut k = 0usize;
                for_each_index(&shape, |idx| {
                    push(f(idx, k));
                    k += 1;
                });
            }
        };
        let data = if int {
            let mut out = Vec::with_capacity(numel);
            each(&mut |v| out.push(v as i64));
            Data::I(out)
        } else {
            let mut out = Vec::with_capacity(numel);
            each(&mut |v| out.push(v as f32));
            Data::F(out)
        };
        if let Some(e) = fail {
            return Err(ctx.err(e));
        }
        Ok(Const { shape, data })
    }

    /// `c` broadcast to `shape` (Expand).
    fn c_broadcast(&self, ctx: &Ctx, c: &Const, shape: Vec<usize>) -> Result<Const> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the result is too large to fold"))?;
        self.charge_const(ctx, numel, if c.is_int() { 8 } else { 4 })?;
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| broadcast_index(
            &c.shape, &shape, i
        )));
        Ok(Const { shape, data })
    }

    fn c_reshape(&self, n: &proto::NodeProto, ctx: &Ctx, c: &Const, t: &Const) -> Result<Const> {
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

    fn c_transpose(&self, n: &proto::NodeProto, ctx: &Ctx, c: &Const) -> Result<Const> {
        let r = c.shape.len();
        let perm: Vec<usize> = match self.ints(n, "perm") {
            Some(p) => p
                .iter()
                .map(|&a| norm_axis(ctx, a, r))
                .collect::<Result<_>>()?,
            None => (0..r).rev().collect(),
        };
        let mut seen = perm.clone();
        seen.sort_unstable();
        if seen != (0..r).collect::<Vec<_>>() {
            return Err(ctx.err(format!("perm {perm:?} is not a permutation")));
        }
        self.charge_const(ctx, c.len(), if c.is_int() { 8 } else { 4 })?;
        let shape: Vec<usize> = perm.iter().map(|&p| c.shape[p]).collect();
        let st = strides(&c.shape);
        let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
        let data = map_data!(&c.data, |v| gather_by(v, &shape, |i| {
            i.iter().zip(&src).map(|(a, b)| a * b).sum()
        }));
        Ok(Const { shape, data })
    }

    fn c_slice(&self, ctx: &Ctx, c: &Const, ins: &[Option<&Const>]) -> Result<Const> {
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

    fn c_gather(&self, n: &proto::NodeProto, ctx: &Ctx, c: &Const, idx: &Const) -> Result<Const> {
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

    fn c_concat(&self, n: &proto::NodeProto, ctx: &Ctx, ins: &[Option<&Const>]) -> Result<Const> {
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

    fn c_squeeze(
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
        let mut shape = c.shape.clone();
        if n.op_type() == "Unsqueeze" {
            let axes = axes.ok_or_else(|| ctx.err("axes are missing"))?;
            let r = shape.len() + axes.len();
            let mut ax: Vec<usize> = axes
                .iter()
                .map(|&a| norm_axis(ctx, a, r))
                .collect::<Result<_>>()?;
            ax.sort_unstable();
            for a in ax {
                shape.insert(a, 1);
            }
        } else {
            match axes {
                None => shape.retain(|&d| d != 1),
                Some(axes) => {
                    let mut ax: Vec<usize> = axes
                        .iter()
                        .map(|&a| norm_axis(ctx, a, shape.len()))
                        .collect::<Result<_>>()?;
                    ax.sort_unstable();
                    ax.dedup();
                    for a in ax.into_iter().rev() {
                        if shape[a] != 1 {
                            return Err(
                                ctx.err(format!("cannot squeeze axis {a} of size {}", shape[a]))
                            );
                        }
                        shape.remove(a);
                    }
                }
            }
        }
        self.charge_const(ctx, c.len(), if c.is_int() { 8 } else { 4 })?;
        Ok(Const {
            shape,
            data: c.data.clone(),
        })
    }

    /// Index tuples of the last axis of `idx` resolved to flat offsets into `shape`.
    fn nd_offsets(&self, ctx: &Ctx, shape: &[usize], idx: &Const) -> Result<(Vec<usize>, usize)> {
        let k = *idx
            .shape
            .last()
            .ok_or_else(|| ctx.err("indices are a scalar"))?;
        if k == 0 || k > shape.len() {
            return Err(ctx.err(format!(
                "index tuples of length {k} for data of rank {}",
                shape.len()
            )));
        }
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

    fn c_scatter_nd(
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

    fn c_gather_nd(
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

    fn c_constant_of_shape(&self, n: &proto::NodeProto, ctx: &Ctx, s: &Const) -> Result<Const> {
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

    fn c_range(&self, ctx: &Ctx, st: &Const, lim: &Const, dl: &Const) -> Result<Const> {
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
