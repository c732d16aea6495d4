//! Lowering of Reshape: no-ops on NCDHW activations, GroupNorm's grouping, shape values, and
//! [`Op::Reshape`] of activations (tensor.rs).

use super::{attr, proto, small_numel, to_i64, Ctx, Lowerer, Op, Result, Sym, Tensor, Val};

impl Lowerer<'_> {
    pub(super) fn reshape(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let data = self.get(ctx, n, 0)?;
        let target = self.get(ctx, n, 1)?;
        let ts = self.ev().small(ctx, &target)?;
        // allowzero only changes what a 0 in the target means.
        let zero = ts.elems.iter().any(|e| e.known() == Some(0.0));
        if attr(n, "allowzero").and_then(|a| a.i).unwrap_or(0) != 0 && zero {
            return Err(ctx.err("attribute allowzero=1 with a 0 in the target is not supported"));
        }
        match data {
            Val::Act(x) => {
                let c = self.values[x].channels;
                let probes = self.ev().probe(ctx, x)?;
                let evs: Vec<Vec<f64>> = probes
                    .iter()
                    .map(|(shapes, _)| self.ev().eval(ctx, &ts.elems, shapes))
                    .collect::<Result<_>>()?;
                // [N|0, G, -1]: GroupNorm step 1 (of an NCDHW activation).
                let rank5 = probes.iter().all(|(sh, _)| sh[x].rank() == 5);
                let to_norm = n.output.first().is_some_and(|o| {
                    let r = self.vals.readers(o);
                    !r.is_empty() && r.iter().all(|op| op == "InstanceNormalization")
                });
                if ts.elems.len() == 3 && rank5 && to_norm {
                    if let Some(g) = ts.elems[1].known() {
                        let g = g as usize;
                        let ok = g > 0
                            && c.is_multiple_of(g)
                            && probes.iter().zip(&evs).all(|((sh, _), e)| {
                                let xs = sh[x];
                                (e[0] == 0.0 || e[0] == xs[0] as f64)
                                    && (e[2] == -1.0
                                        || e[2]
                                            == (xs.as_slice()[1..].iter().product::<usize>() / g)
                                                as f64)
                            });
                        if ok {
                            self.set(n, Val::Grouped { src: x, groups: g })?;
                            return Ok(());
                        }
                    }
                }
                // Reshape to its own shape: a no-op.
                let same = ts.elems.len() == 5
                    && rank5
                    && probes.iter().zip(&evs).all(|((sh, _), e)| {
                        (0..5).all(|a| {
                            e[a] == sh[x][a] as f64
                                || e[a] == 0.0
                                || (e[a] == -1.0 && e.iter().filter(|&&v| v == -1.0).count() == 1)
                        })
                    });
                if same {
                    self.set(n, Val::Act(x))?;
                    return Ok(());
                }
                self.reshape_act(ctx, n, x, &ts)
            }
            Val::GroupedNormed { src, groups, eps } => {
                let c = self.values[src].channels;
                let probes = self.ev().probe(ctx, src)?;
                let evs: Vec<Vec<f64>> = probes
                    .iter()
                    .map(|(shapes, _)| self.ev().eval(ctx, &ts.elems, shapes))
                    .collect::<Result<_>>()?;
                let ok = ts.elems.len() == 5
                    && probes.iter().zip(&evs).all(|((sh, _), e)| {
                        let xs = sh[src];
                        (0..5).all(|a| {
                            e[a] == xs[a] as f64
                                || (a == 0 && e[a] == 0.0)
                                || (e[a] == -1.0 && e.iter().filter(|&&v| v == -1.0).count() == 1)
                        })
                    });
                if !ok {
                    return Err(ctx.err("the grouped normalisation is reshaped to something other than its input's shape"));
                }
                let scale = Tensor::new(vec![c], vec![1.0; c]);
                let bias = Tensor::new(vec![c], vec![0.0; c]);
                self.emit(
                    ctx,
                    n,
                    Op::GroupNorm {
                        groups,
                        eps,
                        scale,
                        bias,
                    },
                    vec![src],
                    c,
                );
                Ok(())
            }
            Val::Grouped { .. } => {
                Err(ctx.err("reshaping a grouped activation again is not supported"))
            }
            other => {
                let s = self.ev().small(ctx, &other)?;
                let total = s.elems.len();
                let dims = self
                    .ev()
                    .values_of(ctx, &ts, "the target shape of a constant")?;
                let mut shape = vec![];
                let mut infer = None;
                for (i, &d) in dims.iter().enumerate() {
                    let d = to_i64(ctx, d, "shape")?;
                    match d {
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            shape.push(1);
                        }
                        0 => {
                            shape.push(*s.shape.get(i).ok_or_else(|| {
                                ctx.err("shape value 0 copies a missing dimension")
                            })?)
                        }
                        d if d > 0 => shape.push(d as usize),
                        _ => return Err(ctx.err(format!("invalid target shape {dims:?}"))),
                    }
                }
                let known = small_numel(&shape)
                    .ok_or_else(|| ctx.err(format!("target shape {dims:?} is too large")))?;
                if let Some(i) = infer {
                    if known == 0 || total % known != 0 {
                        return Err(
                            ctx.err(format!("cannot reshape {} elements to {dims:?}", total))
                        );
                    }
                    shape[i] = total / known;
                }
                if shape.iter().product::<usize>() != total {
                    return Err(ctx.err(format!("cannot reshape {} elements to {dims:?}", total)));
                }
                self.set(
                    n,
                    Val::Sym(Sym {
                        shape,
                        elems: s.elems,
                        int: s.int,
                    }),
                )?;
                Ok(())
            }
        }
    }
}
