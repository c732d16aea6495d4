//! Lowering of Conv and ConvTranspose.

use super::{attr, proto, Const, Conv, ConvTranspose, Ctx, Lowerer, Op, Result, Tensor, ValueId};
use crate::model::decode::node::{ints, resolve_pads, window_attrs};

impl Lowerer<'_> {
    /// The optional third input of Conv / ConvTranspose: a constant of `cout` elements.
    pub(super) fn conv_bias(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        cout: usize,
    ) -> Result<Option<Tensor>> {
        if self.get_opt(ctx, n, 2)?.is_none() {
            return Ok(None);
        }
        let b = self.take_cst(ctx, n, 2, "bias")?;
        if b.len() != cout {
            return Err(ctx.err(format!(
                "bias has {} elements for {cout} output channels",
                b.len()
            )));
        }
        Ok(Some(Tensor::new(vec![cout], b.into_f32())))
    }

    /// The input, its channels, the 5D weight (no empty dimension; a ConvTranspose's first one
    /// is checked against the input channels instead), its kernel and the group count.
    fn conv_operands(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        transpose: bool,
    ) -> Result<(ValueId, usize, Const, [usize; 3], usize)> {
        let kind = match transpose {
            true => "transposed convolutions",
            false => "convolutions",
        };
        let x = self.act(ctx, n, 0)?;
        let cin = self.values[x].channels;
        let w = self.take_cst(ctx, n, 1, "weight")?;
        if w.shape.len() != 5 {
            return Err(ctx.err(format!(
                "weight has shape {:?}; only 3D {kind} (5D weights) are supported",
                w.shape
            )));
        }
        let kernel = [w.shape[2], w.shape[3], w.shape[4]];
        let out_empty = !transpose && w.shape[0] == 0;
        if kernel.contains(&0) || out_empty || w.shape[1] == 0 {
            return Err(ctx.err(format!("weight has an empty dimension {:?}", w.shape)));
        }
        let groups = attr(n, "group").and_then(|a| a.i).unwrap_or(1);
        if groups <= 0 || cin as i64 % groups != 0 {
            return Err(ctx.err(format!(
                "attribute group={groups} does not divide input channels {cin}"
            )));
        }
        Ok((x, cin, w, kernel, groups as usize))
    }

    pub(super) fn conv(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let (x, cin, w, kernel, g) = self.conv_operands(ctx, n, false)?;
        if w.shape[1] * g != cin || w.shape[0] % g != 0 {
            return Err(ctx.err(format!(
                "weight shape {:?} does not fit {cin} input channels with group={g}",
                w.shape
            )));
        }
        let (stride, dilation, pads, auto_pad) = window_attrs(ctx, n, kernel)?;
        // SAME with stride s pads k_eff - s in total, which matches ONNX whenever the input
        // size is a multiple of s (guaranteed by the spatial divisor).
        let same = |a: usize, keff: usize| Ok(keff.saturating_sub(stride[a]));
        let pads = resolve_pads(ctx, &auto_pad, pads, kernel, dilation, same)?;
        let cout = w.shape[0];
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.into_f32());
        self.emit(
            ctx,
            n,
            Op::Conv(Conv {
                weight,
                bias,
                stride,
                dilation,
                pads,
                groups: g,
            }),
            vec![x],
            cout,
        );
        Ok(())
    }

    pub(super) fn conv_transpose(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let (x, cin, w, kernel, g) = self.conv_operands(ctx, n, true)?;
        if w.shape[0] != cin {
            return Err(ctx.err(format!(
                "weight shape {:?} does not fit {cin} input channels",
                w.shape
            )));
        }
        if let Some(os) = ints(n, "output_shape") {
            return Err(ctx.err(format!("attribute output_shape={os:?} is not supported; export with explicit pads/output_padding")));
        }
        let (stride, dilation, pads, auto_pad) = window_attrs(ctx, n, kernel)?;
        let output_padding = match ints(n, "output_padding") {
            None => [0; 3],
            Some(v) if v.len() == 3 => {
                let mut o = [0; 3];
                for a in 0..3 {
                    if v[a] < 0 || v[a] as usize >= stride[a].max(dilation[a]) {
                        return Err(ctx.err(format!("attribute output_padding={v:?} must be non-negative and smaller than the stride or dilation")));
                    }
                    o[a] = v[a] as usize;
                }
                o
            }
            Some(v) => {
                return Err(ctx.err(format!("attribute output_padding={v:?} must have 3 values")))
            }
        };
        // Output = input·stride: total padding is output_padding + k_eff - stride.
        let same = |a: usize, keff: usize| {
            (output_padding[a] + keff)
                .checked_sub(stride[a])
                .ok_or_else(|| {
                    ctx.err(format!(
                        "auto_pad={auto_pad} needs a kernel at least as large as the stride"
                    ))
                })
        };
        let p = resolve_pads(ctx, &auto_pad, pads, kernel, dilation, same)?;
        let cout = w.shape[1] * g;
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.into_f32());
        self.emit(
            ctx,
            n,
            Op::ConvTranspose(ConvTranspose {
                weight,
                bias,
                stride,
                dilation,
                pads: p,
                output_padding,
                groups: g,
            }),
            vec![x],
            cout,
        );
        Ok(())
    }
}
