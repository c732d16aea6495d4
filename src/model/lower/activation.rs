//! Lowering of the one-input activations: Relu, Sigmoid, Tanh, LeakyRelu, Elu, PRelu, Softmax.

use super::{attr, norm_axis, proto, Ctx, Lowerer, Op, Result};

impl Lowerer<'_> {
    /// Relu, Sigmoid, Tanh, LeakyRelu, Elu (alpha defaults as ONNX) and PRelu (slope per channel
    /// or shared).
    pub(super) fn activation(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let alpha = |default: f32| attr(n, "alpha").and_then(|a| a.f).unwrap_or(default);
        let op = match n.op_type() {
            "Relu" => Op::Relu,
            "Sigmoid" => Op::Sigmoid,
            "Tanh" => Op::Tanh,
            "Elu" => Op::Elu { alpha: alpha(1.0) },
            "LeakyRelu" => Op::LeakyRelu { alpha: alpha(0.01) },
            _ => {
                let s = self.cst(ctx, n, 1, "slope")?;
                let slope = self.channel_vector(ctx, &s, c, "slope", true)?;
                Op::PRelu { slope }
            }
        };
        self.emit(ctx, n, op, vec![x], c);
        Ok(())
    }

    /// Softmax over one axis; before opset 13 only the last axis (ONNX then flattens from it).
    pub(super) fn softmax(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let default = if self.opset >= 13 { -1 } else { 1 };
        let r = self.rank_fast(ctx, x)?;
        let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(default), r)?;
        if self.opset < 13 && axis + 1 != r {
            return Err(ctx.err(format!("attribute axis={axis}: before opset 13 Softmax normalises over all axes from {axis} on, which voxtile does not support")));
        }
        self.emit(ctx, n, Op::Softmax { axis }, vec![x], c);
        Ok(())
    }
}
