//! Folding of the comparison, selection and scatter ops that exports use to compute constants in
//! the graph (Swin's attention masks and relative-position indices): Equal, Less, Greater, Not,
//! Mod, Where, ScatterND, GatherND, on known values only and within the fold budget.

use super::*;

/// ONNX operators this file folds.
pub(super) const FOLD_OPS: [&str; 8] = [
    "Equal",
    "Less",
    "Greater",
    "Not",
    "Mod",
    "Where",
    "ScatterND",
    "GatherND",
];

impl Lowerer<'_> {
    /// Any [`FOLD_OPS`] node on constants / known shape values.
    pub(super) fn fold(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let ins: Vec<Val> = (0..n.input.len())
            .map(|i| self.get(ctx, n, i))
            .collect::<Result<_>>()?;
        if ins.iter().any(|v| matches!(v, Val::Act(_))) {
            return Err(ctx.err(format!(
                "{} on an activation tensor is not supported (only on constants)",
                n.op_type()
            )));
        }
        let syms: Vec<Sym> = ins
            .iter()
            .map(|v| self.small(ctx, v))
            .collect::<Result<_>>()?;
        let out = match n.op_type() {
            "ScatterND" => self.scatter_nd(n, ctx, &syms)?,
            "GatherND" => self.gather_nd(n, ctx, &syms)?,
            op => self.fold_elementwise(n, ctx, op, &syms)?,
        };
        self.set(n, Val::Sym(out))
    }

    /// The elementwise folds, numpy broadcasting over all inputs.
    fn fold_elementwise(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        op: &str,
        syms: &[Sym],
    ) -> Result<Sym> {
        let want = match op {
            "Not" => 1,
            "Where" => 3,
            _ => 2,
        };
        if syms.len() != want {
            return Err(ctx.err(format!("has {} inputs, expected {want}", syms.len())));
        }
        let mut shape = syms[0].shape.clone();
        for s in &syms[1..] {
            shape = broadcast_shape(&shape, &s.shape).ok_or_else(|| {
                ctx.err(format!(
                    "shapes {:?} and {:?} do not broadcast",
                    shape, s.shape
                ))
            })?;
        }
        let numel =
            small_numel(&shape).ok_or_else(|| ctx.err("the result is too large to fold"))?;
        self.check_fold(ctx, numel)?;
        // Where selects its values (kept symbolic); the others need known operands.
        let known: Vec<Option<Vec<f64>>> = syms
            .iter()
            .map(|s| self.values_of(ctx, s, "operand").ok())
            .collect();
        let need = |i: usize| {
            known[i]
                .as_ref()
                .ok_or_else(|| ctx.err(format!("input {i} depends on the window size")))
        };
        let fmod = attr(n, "fmod").and_then(|a| a.i).unwrap_or(0) != 0;
        let mut elems = Vec::with_capacity(numel);
        let at = |i: usize, idx: &[usize]| broadcast_index(&syms[i].shape, &shape, idx);
        let int = match op {
            "Where" => syms[1].int && syms[2].int,
            "Mod" => syms[0].int && syms[1].int,
            _ => true,
        };
        let mut fail = None;
        match op {
            "Where" => {
                let c = need(0)?;
                for_each_index(&shape, |idx| {
                    let k = if c[at(0, idx)] != 0.0 { 1 } else { 2 };
                    elems.push(syms[k].elems[at(k, idx)]);
                });
            }
            "Not" => {
                let a = need(0)?;
                for_each_index(&shape, |idx| {
                    elems.push(X::K((a[at(0, idx)] == 0.0) as i32 as f64))
                });
            }
            _ => {
                let (a, b) = (need(0)?, need(1)?);
                for_each_index(&shape, |idx| {
                    let (x, y) = (a[at(0, idx)], b[at(1, idx)]);
                    let v = match op {
                        "Equal" => (x == y) as i32 as f64,
                        "Less" => (x < y) as i32 as f64,
                        "Greater" => (x > y) as i32 as f64,
                        _ if y == 0.0 => {
                            fail = Some("modulo by zero");
                            0.0
                        }
                        _ if fmod => x % y,
                        _ => x - y * (x / y).floor(),
                    };
                    elems.push(X::K(v));
                });
            }
        }
        if let Some(f) = fail {
            return Err(ctx.err(f));
        }
        Ok(Sym { shape, elems, int })
    }

    /// ScatterND without reduction: `data` with the slices at `indices` replaced by `updates`.
    fn scatter_nd(&self, n: &proto::NodeProto, ctx: &Ctx, syms: &[Sym]) -> Result<Sym> {
        let [data, idx, upd] = syms else {
            return Err(ctx.err("needs data, indices and updates"));
        };
        if Self::sattr(n, "reduction", "none") != "none" {
            return Err(ctx.err("a reduction other than none is not supported"));
        }
        let iv = self.values_of(ctx, idx, "indices")?;
        let k = index_tuple_len(ctx, &idx.shape, data.shape.len())?;
        let slice: usize = data.shape[k..].iter().product();
        let tuples = iv.len() / k;
        if upd.elems.len() != tuples * slice {
            return Err(ctx.err("updates do not match the indexed slices"));
        }
        self.check_fold(ctx, data.elems.len())?;
        let strides: Vec<usize> = (0..k)
            .map(|a| data.shape[a + 1..].iter().product())
            .collect();
        let mut elems = data.elems.clone();
        for t in 0..tuples {
            let mut off = 0usize;
            for a in 0..k {
                let d = data.shape[a] as i64;
                let i = to_i64(ctx, iv[t * k + a], "index")?;
                let j = if i < 0 { i + d } else { i };
                if !(0..d).contains(&j) {
                    return Err(ctx.err(format!("index {i} out of range for dimension {d}")));
                }
                off += j as usize * strides[a];
            }
            elems[off..off + slice].copy_from_slice(&upd.elems[t * slice..(t + 1) * slice]);
        }
        Ok(Sym {
            shape: data.shape.clone(),
            elems,
            int: data.int,
        })
    }

    /// GatherND with batch_dims 0: the slices of `data` at each index tuple.
    fn gather_nd(&self, n: &proto::NodeProto, ctx: &Ctx, syms: &[Sym]) -> Result<Sym> {
        let [data, idx] = syms else {
            return Err(ctx.err("needs data and indices"));
        };
        if attr(n, "batch_dims").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("batch_dims other than 0 is not supported"));
        }
        let iv = self.values_of(ctx, idx, "indices")?;
        let k = index_tuple_len(ctx, &idx.shape, data.shape.len())?;
        let slice: usize = data.shape[k..].iter().product();
        let tuples = iv.len() / k;
        let total = tuples
            .checked_mul(slice)
            .filter(|&t| t <= SMALL)
            .ok_or_else(|| ctx.err("the gathered constant is too large to fold"))?;
        self.check_fold(ctx, total)?;
        let strides: Vec<usize> = (0..k)
            .map(|a| data.shape[a + 1..].iter().product())
            .collect();
        let mut elems = Vec::with_capacity(total);
        for t in 0..tuples {
            let mut off = 0usize;
            for a in 0..k {
                let d = data.shape[a] as i64;
                let i = to_i64(ctx, iv[t * k + a], "index")?;
                let j = if i < 0 { i + d } else { i };
                if !(0..d).contains(&j) {
                    return Err(ctx.err(format!("index {i} out of range for dimension {d}")));
                }
                off += j as usize * strides[a];
            }
            elems.extend_from_slice(&data.elems[off..off + slice]);
        }
        let mut shape = idx.shape[..idx.shape.len() - 1].to_vec();
        shape.extend_from_slice(&data.shape[k..]);
        Ok(Sym {
            shape,
            elems,
            int: data.int,
        })
    }
}
