//! Lowering of BatchNormalization (folded into the conv when it can be), InstanceNormalization
//! and GroupNormalization, and their per-channel parameters.

use super::{attr, proto, Const, Conv, Ctx, Lowerer, Op, Result, Tensor, Val};

/// Right-align a shape against NCDHW (numpy broadcasting).
pub(super) fn to5(shape: &[usize]) -> Option<[usize; 5]> {
    if shape.len() > 5 {
        return None;
    }
    let mut o = [1usize; 5];
    o[5 - shape.len()..].copy_from_slice(shape);
    Some(o)
}

impl Lowerer<'_> {
    /// A per-channel parameter as an IR tensor of `c` elements ([1] allowed when `allow_scalar`),
    /// from any shape that broadcasts only over channels (e.g. PRelu's [C,1,1,1]).
    pub(super) fn channel_vector(
        &self,
        ctx: &Ctx,
        t: &Const,
        c: usize,
        what: &str,
        allow_scalar: bool,
    ) -> Result<Tensor> {
        let data = t.to_f32();
        let t5 = to5(&t.shape).ok_or_else(|| {
            ctx.err(format!(
                "{what} of shape {:?} has more than 5 dimensions",
                t.shape
            ))
        })?;
        let ok = t5[0] == 1
            && t5[2..].iter().all(|&d| d == 1)
            && (t5[1] == c || (allow_scalar && t5[1] == 1));
        if !ok {
            return Err(ctx.err(format!(
                "{what} of shape {:?} is not per-channel for {c} channels",
                t.shape
            )));
        }
        Ok(Tensor::new(vec![data.len()], data))
    }

    pub(super) fn batch_norm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        if attr(n, "training_mode").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err(
                "attribute training_mode=1 is not supported (export the model in eval mode)",
            ));
        }
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5) as f64;
        let mut p = vec![];
        for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
            let t = self.cst(ctx, n, i, what)?;
            if t.len() != c {
                return Err(ctx.err(format!("{what} has {} elements for {c} channels", t.len())));
            }
            p.push(t.to_f64());
        }
        let mut mul = vec![0f64; c];
        let mut add = vec![0f64; c];
        for ch in 0..c {
            if p[3][ch] + eps <= 0.0 {
                return Err(ctx.err(format!(
                    "var[{ch}] + epsilon = {} is not positive",
                    p[3][ch] + eps
                )));
            }
            mul[ch] = p[0][ch] / (p[3][ch] + eps).sqrt();
            add[ch] = p[1][ch] - p[2][ch] * mul[ch];
        }
        // Fold into the producing Conv when nothing else reads the conv's output.
        let sole = self.vals.read_once(&n.input[0]);
        let producer = self.producer.get(x).copied().flatten();
        if let Some(last) = producer.and_then(|p| self.nodes.get_mut(p)) {
            if let (true, Op::Conv(cv)) = (sole, &mut last.op) {
                fold_bn_into_conv(cv, &mul, &add);
                self.set(n, Val::Act(x))?;
                return Ok(());
            }
        }
        let scale = Tensor::new(vec![c], mul.iter().map(|&v| v as f32).collect());
        let shift = Tensor::new(vec![c], add.iter().map(|&v| v as f32).collect());
        self.emit(ctx, n, Op::ChannelAffine { scale, shift }, vec![x], c);
        Ok(())
    }

    pub(super) fn instance_norm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
        let scale = self.cst(ctx, n, 1, "scale")?;
        let bias = self.cst(ctx, n, 2, "bias")?;
        match self.get(ctx, n, 0)? {
            Val::Act(x) => {
                let c = self.values[x].channels;
                if scale.len() != c || bias.len() != c {
                    return Err(ctx.err(format!(
                        "scale/bias have {}/{} elements for {c} channels",
                        scale.len(),
                        bias.len()
                    )));
                }
                let op = Op::InstanceNorm {
                    eps,
                    scale: Tensor::new(vec![c], scale.to_f32()),
                    bias: Tensor::new(vec![c], bias.to_f32()),
                };
                self.emit(ctx, n, op, vec![x], c);
            }
            Val::Grouped { src, groups } => {
                // PyTorch's GroupNorm export normalises [N, G, -1] with unit scale and zero bias;
                // its real affine follows as Mul/Add after the reshape back.
                if scale.len() != groups
                    || bias.len() != groups
                    || scale.to_f32().iter().any(|&v| v != 1.0)
                    || bias.to_f32().iter().any(|&v| v != 0.0)
                {
                    return Err(ctx.err("normalises a grouped reshape with a non-trivial scale/bias, which is not the GroupNorm export pattern"));
                }
                self.set(n, Val::GroupedNormed { src, groups, eps })?;
            }
            _ => return Err(ctx.err("input 0 must be an activation")),
        }
        Ok(())
    }

    pub(super) fn group_norm_op(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
        let g = attr(n, "num_groups")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute num_groups is missing"))?;
        if g <= 0 || c as i64 % g != 0 {
            return Err(ctx.err(format!(
                "attribute num_groups={g} does not divide {c} channels"
            )));
        }
        let g = g as usize;
        let mut pv = vec![];
        for (i, what) in [(1, "scale"), (2, "bias")] {
            let t = self.cst(ctx, n, i, what)?.to_f32();
            // Opset 18 gives one value per group, opset 21 one per channel.
            let v = if t.len() == c {
                t
            } else if t.len() == g {
                (0..c).map(|ch| t[ch / (c / g)]).collect()
            } else {
                return Err(ctx.err(format!(
                    "{what} has {} elements; expected {c} (channels) or {g} (groups)",
                    t.len()
                )));
            };
            pv.push(Tensor::new(vec![c], v));
        }
        let bias = pv.pop().unwrap_or_else(|| Tensor::new(vec![], vec![]));
        let scale = pv.pop().unwrap_or_else(|| Tensor::new(vec![], vec![]));
        self.emit(
            ctx,
            n,
            Op::GroupNorm {
                groups: g,
                eps,
                scale,
                bias,
            },
            vec![x],
            c,
        );
        Ok(())
    }
}
/// w'[o] = w[o]·mul[o]; b'[o] = b[o]·mul[o] + add[o], computed in f64.
pub(crate) fn fold_bn_into_conv(cv: &mut Conv, mul: &[f64], add: &[f64]) {
    let cout = cv.weight.shape[0];
    let per = cv.weight.len() / cout.max(1);
    for (row, &m) in cv.weight.data.chunks_mut(per.max(1)).zip(mul).take(cout) {
        for w in row {
            *w = (*w as f64 * m) as f32;
        }
    }
    let b: Vec<f32> = (0..cout)
        .map(|o| {
            let b0 = cv.bias.as_ref().map_or(0.0, |b| b.data[o] as f64);
            (b0 * mul[o] + add[o]) as f32
        })
        .collect();
    cv.bias = Some(Tensor::new(vec![cout], b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bn_fold_matches_f64() {
        let w: Vec<f32> = (0..2 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut cv = Conv {
            weight: Tensor::new(vec![2, 3, 1, 1, 1], w.clone()),
            bias: Some(Tensor::new(vec![2], vec![0.5, -0.25])),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            groups: 1,
        };
        fold_bn_into_conv(&mut cv, &[2.0, -0.5], &[1.0, 3.0]);
        for o in 0..2 {
            let m = [2.0, -0.5][o];
            for k in 0..3 {
                assert_eq!(cv.weight.data[o * 3 + k], (w[o * 3 + k] as f64 * m) as f32);
            }
        }
        assert_eq!(cv.bias.as_ref().unwrap().data, vec![2.0, 3.125]);
    }

    #[test]
    fn to5_right_aligns() {
        assert_eq!(to5(&[4, 1, 1, 1]), Some([1, 4, 1, 1, 1]));
        assert_eq!(to5(&[]), Some([1; 5]));
        assert_eq!(to5(&[1; 6]), None);
    }
}
