//! Lowering of MaxPool and AveragePool.

use super::{attr, proto, Ctx, Lowerer, Op, Pool, Result, ATTR_LIMIT};
use crate::model::decode::node::{ints, resolve_pads, window_attrs};

impl Lowerer<'_> {
    pub(super) fn pool(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let k =
            ints(n, "kernel_shape").ok_or_else(|| ctx.err("attribute kernel_shape is missing"))?;
        if k.len() != 3 || k.iter().any(|&v| v <= 0 || v > ATTR_LIMIT) {
            return Err(ctx.err(format!(
                "attribute kernel_shape={k:?} must be 3 positive values (3D pooling)"
            )));
        }
        let kernel = [k[0] as usize, k[1] as usize, k[2] as usize];
        let (stride, dilation, pads, auto_pad) = window_attrs(ctx, n, kernel)?;
        // SAME with stride s pads k_eff - s in total, which matches ONNX whenever the input
        // size is a multiple of s (guaranteed by the spatial divisor).
        let same = |a: usize, keff: usize| Ok(keff.saturating_sub(stride[a]));
        let pads = resolve_pads(ctx, &auto_pad, pads, kernel, dilation, same)?;
        let ceil_mode = attr(n, "ceil_mode").and_then(|a| a.i).unwrap_or(0) != 0;
        let count_include_pad = attr(n, "count_include_pad").and_then(|a| a.i).unwrap_or(0) != 0;
        if let Some(so) = attr(n, "storage_order").and_then(|a| a.i) {
            if so != 0 {
                return Err(ctx.err(format!("attribute storage_order={so} is not supported")));
            }
        }
        let p = Pool {
            kernel,
            stride,
            dilation,
            pads,
            ceil_mode,
            count_include_pad,
        };
        let op = if n.op_type() == "MaxPool" {
            Op::MaxPool(p)
        } else {
            Op::AveragePool(p)
        };
        self.emit(ctx, n, op, vec![x], c);
        Ok(())
    }
}
