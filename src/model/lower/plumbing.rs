//! Lowering of the shape-plumbing ops on constants and shape values (Constant, Shape, Cast,
//! Gather, Slice, Unsqueeze...).

use super::*;

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
        let dims: Vec<X> = match &v {
            Val::Act(x) if self.rank_fast(ctx, *x)? != 5 => {
                let r = self.rank_of(ctx, *x)?;
                (0..r).map(|a| self.ex.borrow_mut().dim(*x, a)).collect()
            }
            Val::Act(x) => (0..5)
                .map(|a| {
                    if a == 1 {
                        X::K(self.values[*x].channels as f64)
                    } else {
                        self.ex.borrow_mut().dim(*x, a)
                    }
                })
                .collect(),
            Val::Const(c) => c.shape.iter().map(|&d| X::K(d as f64)).collect(),
            Val::Sym(s) => s.shape.iter().map(|&d| X::K(d as f64)).collect(),
            _ => return Err(ctx.err("the shape of a grouped reshape is not supported")),
        };
        let r = dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let start = clamp(attr(n, "start").and_then(|a| a.i).unwrap_or(0));
        let end = clamp(attr(n, "end").and_then(|a| a.i).unwrap_or(r));
        let elems: Vec<X> = if start < end {
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
                                X::K(v) => X::K((*v != 0.0) as i32 as f64),
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
                        if let X::K(v) = e {
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
            "Gather" => self.gather(n, ctx, s)?,
            "Unsqueeze" | "Squeeze" => self.squeeze(n, ctx, s)?,
            "Flatten" => self.flatten(n, ctx, s)?,
            "Slice" => self.slice(n, ctx, s)?,
            "ConstantOfShape" => self.constant_of_shape(n, ctx, s)?,
            "Floor" | "Ceil" => self.round(n, s)?,
            "Neg" => self.neg(s)?,
            "Sqrt" | "Reciprocal" => self.sqrt_reciprocal(n, ctx, s)?,
            "Min" | "Max" => self.min_max(n, ctx, s)?,
            "Range" => self.range(n, ctx, s)?,
            "Expand" => self.expand(n, ctx, s)?,
            "Transpose" => self.transpose(n, ctx, s)?,
            _ => return Err(ctx.err(format!("operator {op} is not supported"))),
        };
        self.set(n, Val::Sym(out))?;
        Ok(())
    }

    /// Gather along one axis with known indices.
    fn gather(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let idx = self.small(ctx, &self.get(ctx, n, 1)?)?;
        let iv = self.values_of(ctx, &idx, "indices")?;
        let rank = s.shape.len();
        if rank == 0 {
            return Err(ctx.err("gathering from a scalar"));
        }
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), rank)?;
        let dim = s.shape[axis] as i64;
        let outer: usize = s.shape[..axis].iter().product();
        let inner: usize = s.shape[axis + 1..].iter().product();
        let total = outer
            .checked_mul(iv.len())
            .and_then(|v| v.checked_mul(inner))
            .filter(|&v| v <= SMALL)
            .ok_or_else(|| ctx.err("the gathered constant is too large to fold"))?;
        self.check_fold(ctx, total)?;
        let mut elems = vec![];
        for o in 0..outer {
            for &i in &iv {
                let i = to_i64(ctx, i, "index")?;
                let j = if i < 0 { i + dim } else { i };
                if j < 0 || j >= dim {
                    return Err(ctx.err(format!("index {i} out of range for dimension {dim}")));
                }
                let base = (o * s.shape[axis] + j as usize) * inner;
                elems.extend_from_slice(&s.elems[base..base + inner]);
            }
        }
        let mut shape = s.shape[..axis].to_vec();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&s.shape[axis + 1..]);
        Ok(Sym {
            shape,
            elems,
            int: s.int,
        })
    }

    /// Unsqueeze / Squeeze (axes from the input or the attribute).
    fn squeeze(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let op = n.op_type();
        let axes: Option<Vec<i64>> = match self.get_opt(ctx, n, 1)? {
            Some(a) => Some(
                self.small(ctx, &a)?
                    .all_known()
                    .ok_or_else(|| ctx.err("axes depend on the window size"))?
                    .iter()
                    .map(|&v| v as i64)
                    .collect(),
            ),
            None => self.ints(n, "axes"),
        };
        let shape = squeeze_shape(ctx, &s.shape, op == "Unsqueeze", axes.as_deref())?;
        Ok(Sym { shape, ..s })
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

    /// ConstantOfShape of a known shape, within the fold budget.
    fn constant_of_shape(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let dims = self.values_of(ctx, &s, "the shape of ConstantOfShape")?;
        let mut shape = vec![];
        let mut total: u64 = 1;
        for d in dims {
            let d = to_i64(ctx, d, "shape")?;
            if d < 0 {
                return Err(ctx.err(format!("negative dimension {d}")));
            }
            total = total.saturating_mul(d as u64);
            shape.push(d as usize);
        }
        if total > SMALL as u64 {
            return Err(ctx.err(format!("{total} elements is too large a constant")));
        }
        self.check_fold(ctx, total as usize)?;
        let (v, int) = match attr(n, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => {
                let c = decode_tensor(t, self.dir, self.path)?;
                (c.to_f64().first().copied().unwrap_or(0.0), c.is_int())
            }
            None => (0.0, false),
        };
        Ok(Sym {
            shape,
            elems: vec![X::K(v); total as usize],
            int,
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
                .map(|&e| self.ex.borrow_mut().bin(Bop::Mul, e, X::K(-1.0)))
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
            .map(|&x| X::K(if op == "Sqrt" { x.sqrt() } else { 1.0 / x }))
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

    /// Range with known bounds, within the fold budget.
    fn range(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let st = s.all_known().and_then(|v| v.first().copied());
        let lim = self
            .small(ctx, &self.get(ctx, n, 1)?)?
            .all_known()
            .and_then(|v| v.first().copied());
        let dl = self
            .small(ctx, &self.get(ctx, n, 2)?)?
            .all_known()
            .and_then(|v| v.first().copied());
        let (Some(st), Some(lim), Some(dl)) = (st, lim, dl) else {
            return Err(ctx.err("Range over window-dependent bounds is not supported"));
        };
        if dl == 0.0 {
            return Err(ctx.err("delta is zero"));
        }
        let cnt = ((lim - st) / dl).ceil().max(0.0);
        if cnt > SMALL as f64 {
            return Err(ctx.err("range too long"));
        }
        self.check_fold(ctx, cnt as usize)?;
        let elems: Vec<X> = (0..cnt as usize)
            .map(|i| X::K(st + i as f64 * dl))
            .collect();
        Ok(Sym {
            shape: vec![elems.len()],
            elems,
            int: s.int,
        })
    }

    /// Expand to a known shape.
    fn expand(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let t = self.small(ctx, &self.get(ctx, n, 1)?)?;
        let target = self.values_of(ctx, &t, "the target shape")?;
        let t: Vec<usize> = target
            .iter()
            .map(|&v| if v >= 0.0 { v as usize } else { usize::MAX })
            .collect();
        if t.contains(&usize::MAX) {
            return Err(ctx.err("negative target shape"));
        }
        let shape = broadcast_shape(&s.shape, &t)
            .ok_or_else(|| ctx.err(format!("cannot expand {:?} to {t:?}", s.shape)))?;
        let numel = small_numel(&shape).ok_or_else(|| ctx.err("expanded constant too large"))?;
        self.check_fold(ctx, numel)?;
        let mut elems = vec![];
        for_each_index(&shape, |idx| {
            elems.push(s.elems[broadcast_index(&s.shape, &shape, idx)])
        });
        Ok(Sym {
            shape,
            elems,
            int: s.int,
        })
    }

    /// Transpose by `perm` (reversed axes by default).
    fn transpose(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let r = s.shape.len();
        let perm = self.perm_of(n, ctx, r)?;
        let shape: Vec<usize> = perm.iter().map(|&p| s.shape[p]).collect();
        let mut strides = vec![1usize; r];
        for a in (0..r.saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * s.shape[a + 1];
        }
        let mut elems = Vec::with_capacity(s.elems.len());
        for_each_index(&shape, |idx| {
            let flat: usize = idx
                .iter()
                .enumerate()
                .map(|(i, &v)| v * strides[perm[i]])
                .sum();
            elems.push(s.elems[flat]);
        });
        Ok(Sym {
            shape,
            elems,
            int: s.int,
        })
    }

    pub(super) fn slice(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let known = |i: usize, name: &str| -> Result<Option<Vec<i64>>> {
            match self.get_opt(ctx, n, i)? {
                None => Ok(None),
                Some(v) => {
                    let Some(k) = self.small(ctx, &v)?.all_known() else {
                        // Sizes read from activations: the same on every probe (fixed inputs).
                        return self.probe_ints(ctx, n, i, self.input, name);
                    };
                    Ok(Some(
                        k.iter()
                            .map(|&x| x.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
                            .collect(),
                    ))
                }
            }
        };
        let (starts, ends, axes, steps) = if n.input.len() > 1 {
            (
                known(1, "starts")?.unwrap_or_default(),
                known(2, "ends")?.unwrap_or_default(),
                known(3, "axes")?,
                known(4, "steps")?,
            )
        } else {
            (
                self.ints(n, "starts").unwrap_or_default(),
                self.ints(n, "ends").unwrap_or_default(),
                self.ints(n, "axes"),
                None,
            )
        };
        let r = s.shape.len();
        if starts.len() != ends.len() {
            return Err(ctx.err("starts and ends differ in length"));
        }
        let axes: Vec<usize> = match axes {
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(ctx, v, r))
                .collect::<Result<_>>()?,
            None => (0..starts.len()).collect(),
        };
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(ctx.err("starts/ends/axes/steps differ in length"));
        }
        // Per axis: list of kept indices.
        let mut keep: Vec<Vec<usize>> = s.shape.iter().map(|&d| (0..d).collect()).collect();
        for i in 0..starts.len() {
            let a = axes[i];
            let d = s.shape[a] as i64;
            let st = steps[i];
            if st == 0 {
                return Err(ctx.err("slice step 0"));
            }
            let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
            let mut idx = vec![];
            if st > 0 {
                let (b, e) = (norm(starts[i]).clamp(0, d), norm(ends[i]).clamp(0, d));
                let mut j = b;
                while j < e {
                    idx.push(j as usize);
                    j = j.saturating_add(st);
                }
            } else {
                let (b, e) = (
                    norm(starts[i]).clamp(-1, d - 1),
                    norm(ends[i]).clamp(-1, d - 1),
                );
                let mut j = b;
                while j > e {
                    idx.push(j as usize);
                    j = j.saturating_add(st);
                }
            }
            keep[a] = idx;
        }
        let shape: Vec<usize> = keep.iter().map(|k| k.len()).collect();
        let mut strides = vec![1usize; r];
        for a in (0..r.saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * s.shape[a + 1];
        }
        let mut elems = vec![];
        for_each_index(&shape, |idx| {
            let flat: usize = idx
                .iter()
                .enumerate()
                .map(|(a, &v)| keep[a][v] * strides[a])
                .sum();
            elems.push(s.elems[flat]);
        });
        Ok(Sym {
            shape,
            elems,
            int: s.int,
        })
    }
}
