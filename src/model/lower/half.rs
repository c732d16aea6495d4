//! fp16 and bf16 models: where the IR rounds values to a 16-bit float type.
//!
//! Weights of any float type are decoded to f32 (`decode`). The values that cross the model's
//! boundary in a 16-bit type are rounded to it: a half graph input (the engine's f32 window) and a
//! half graph output (a [`Pointwise::RoundF16`] / [`Pointwise::RoundBf16`] node). Between them
//! every backend computes in its own precision; a `Cast` of an activation to float16 or float32
//! is a precision hint, a `Cast` to bfloat16 rounds. This is what onnxruntime's CPU does with such
//! files: it runs f32 kernels inside the casts it inserts at the float16 boundary and drops the
//! float16 cast pairs that meet there, while it runs bfloat16 Casts as they are. So the CPU
//! reference tracks onnxruntime on the same file (the converted deepbrain to within one fp16
//! unit, 97% of outputs equal; tests/it/model/half.rs).

use super::{proto, Lowerer, Node, Op, Pointwise, Value, ValueId};
use crate::model::decode::Float;

impl Float {
    /// The rounding that stores a value in this type (None for f32).
    pub(crate) fn rounding(self) -> Option<Pointwise> {
        match self {
            Float::F32 => None,
            Float::F16 => Some(Pointwise::RoundF16),
            Float::Bf16 => Some(Pointwise::RoundBf16),
        }
    }
}

impl Lowerer<'_> {
    /// `Cast` of activation `x` to float type `to` (see the module's rules).
    pub(super) fn cast_act(&mut self, n: &proto::NodeProto, x: ValueId, to: Float) -> ValueId {
        match to {
            Float::Bf16 => self.store_as(x, to, n.output.first().map_or("", |o| o.as_str())),
            Float::F32 | Float::F16 => x,
        }
    }

    /// `x` stored as `to`: a rounding node, unless `x` is already rounded so (or `to` is f32).
    pub(super) fn store_as(&mut self, x: ValueId, to: Float, name: &str) -> ValueId {
        let Some(round) = to.rounding() else {
            return x;
        };
        let op = Op::Pointwise(round);
        if self.producer[x].is_some_and(|p| self.nodes[p].op == op) {
            return x;
        }
        let out = self.values.len();
        self.values.push(Value {
            name: name.to_string(),
            channels: self.values[x].channels,
        });
        self.producer.push(Some(self.nodes.len()));
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs: vec![x],
            output: out,
        });
        out
    }
}
