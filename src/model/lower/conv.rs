//! Lowering of Conv and ConvTranspose.

use super::{attr, proto, Conv, ConvTranspose, Ctx, Lowerer, Op, Result, Tensor};
use crate::model::decode::node::{ints, resolve_pads, window_attrs};

impl Lowerer<'_> {
    /// The optional third input of Conv / ConvTranspose: a constant of `cout` elements.
    pub(super) fn conv_bias(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        cout: usize,
    ) -> Result<Option<Tensor>> {
        if self.get_opt(ctx, n, 2)?.is_none() {
            return Ok(None);
        }
        let b = self.cst(ctx, n, 2, "bias")?;
        if b.len() != cout {
            return Err(ctx.err(format!(
                "bias has {} elements for {cout} output channels",
                b.len()
            )));
        }
        Ok(Some(Tensor::new(vec![cout], b.to_f32())))
    }

    pub(super) fn conv(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let cin = self.values[x].channels;
        let w = self.cst(ctx, n, 1, "weight")?;
        if w.shape.len() != 5 {
            return Err(ctx.err(format!(
                "weight has shape {:?}; only 3D convolutions (5D weights) are supported",
                w.shape
            )));
        }
        let kernel = [w.shape[2], w.shape[3], w.shape[4]];
        if kernel.contains(&0) || w.shape[0] == 0 || w.shape[1] == 0 {
            return Err(ctx.err(format!("weight has an empty dimension {:?}", w.shape)));
        }
        let groups = attr(n, "group").and_then(|a| a.i).unwrap_or(1);
        if groups <= 0 || cin as i64 % groups != 0 {
            return Err(ctx.err(format!(
                "attribute group={groups} does not divide input channels {cin}"
            )));
        }
        let g = groups as usize;
        if w.shape[1] * g != cin || w.shape[0] % g != 0 {
            return Err(ctx.err(format!(
                "weight shape {:?} does not fit {cin} input channels with group={g}",
                w.shape
            )));
        }
        let (stride, dilation, pads, auto_pad) = window_attrs(ctx, n, kernel)?;
        let pads = resolve_pads(ctx, &auto_pad, pads, kernel, stride, dilation)?;
        let cout = w.shape[0];
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.to_f32());
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
        let x = self.act(ctx, n, 0)?;
        let cin = self.values[x].channels;
        let w = self.cst(ctx, n, 1, "weight")?;
        if w.shape.len() != 5 {
            return Err(ctx.err(format!(
                "weight has shape {:?}; only 3D transposed convolutions (5D weights) are supported",
                w.shape
            )));
        }
        let kernel = [w.shape[2], w.shape[3], w.shape[4]];
        if kernel.contains(&0) || w.shape[1] == 0 {
            return Err(ctx.err(format!("weight has an empty dimension {:?}", w.shape)));
        }
        let groups = attr(n, "group").and_then(|a| a.i).unwrap_or(1);
        if groups <= 0 || cin as i64 % groups != 0 {
            return Err(ctx.err(format!(
                "attribute group={groups} does not divide input channels {cin}"
            )));
        }
        let g = groups as usize;
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
        let mut p = [0usize; 6];
        match auto_pad.as_str() {
            "NOTSET" | "" => {
                for i in 0..6 {
                    p[i] = pads[i] as usize;
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                // Output = input·stride: total padding is output_padding + k_eff - stride.
                for a in 0..3 {
                    let keff = dilation[a] * (kernel[a] - 1) + 1;
                    let total = (output_padding[a] + keff).checked_sub(stride[a]).ok_or_else(|| ctx.err(format!("auto_pad={auto_pad} needs a kernel at least as large as the stride")))?;
                    let half = total / 2;
                    let (b, e) = if auto_pad == "SAME_UPPER" {
                        (half, total - half)
                    } else {
                        (total - half, half)
                    };
                    p[a] = b;
                    p[a + 3] = e;
                }
            }
            other => return Err(ctx.err(format!("attribute auto_pad={other} is not supported"))),
        }
        let cout = w.shape[1] * g;
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.to_f32());
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
