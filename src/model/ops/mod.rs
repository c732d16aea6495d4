//! The operations of the IR, each with its parameters, validation and output shape defined once
//! (per-op files, as tract keeps shape inference with the op): the importer, the graph analyses
//! and every backend call these, so no backend re-derives a shape or re-checks a weight.
//!
//! [`Op::check`] validates an op against its inputs' channel counts (run by `Graph::validate`
//! at load), [`Op::output_shape`] gives the NCDHW output of concrete input shapes (check
//! included), [`Op::flops`] and [`Op::param_len`] are the cost facts the planner reads.

mod attention;
mod broadcast;
mod channel;
mod conv;
mod dims;
mod layernorm;
mod layout;
mod matmul;
mod pad;
mod pointwise;
mod pool;
mod resize;
mod tile;
pub mod window;

pub use attention::{Attention, AttnDims};
pub use broadcast::{broadcast_channels as binary_channels, broadcast_shape};
pub use conv::{Conv, ConvTranspose};
pub use dims::{norm_axis, Dims, MAX_RANK};
pub use layernorm::LayerNorm;
pub use layout::{check_perm, gather_dims, reshape_dims, transpose_dims, Slice, SliceAt};
pub use matmul::{broadcast_lead, matmul_dims, Linear};
pub use pad::{AxisMap, Pad, PadMode, PAD_LIMIT};
pub use pointwise::Pointwise;
pub use pool::Pool;
pub use resize::{CoordMode, NearestMode, Resize, ResizeMode};
pub use tile::Tile;
pub use window::Window;

use super::tensor::Tensor;
use channel::{broadcast_channels, broadcast_to, epsilon, per_channel};

/// An NCDHW activation shape.
pub type Shape = [usize; 5];

/// The operations of the IR. Elementwise binaries take two activations whose shapes broadcast
/// (numpy rules: per axis equal, or 1 in one of them), or an activation and a constant broadcast
/// to NCDHW (`*Const`, shape of 5 dims, each 1 or full size).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// 3D convolution.
    Conv(Conv),
    /// 3D transposed convolution (decoder upsampling).
    ConvTranspose(ConvTranspose),
    /// Per (n, c) normalisation over D,H,W, then `scale[c] * x + bias[c]`.
    InstanceNorm {
        /// Added to the variance.
        eps: f32,
        /// Per-channel scale `[C]`.
        scale: Tensor,
        /// Per-channel bias `[C]`.
        bias: Tensor,
    },
    /// Per (n, group) normalisation over (C/groups, D, H, W), then per-channel affine.
    GroupNorm {
        /// Channel groups normalised together (divides C).
        groups: usize,
        /// Added to the variance.
        eps: f32,
        /// Per-channel scale `[C]`.
        scale: Tensor,
        /// Per-channel bias `[C]`.
        bias: Tensor,
    },
    /// `scale[c] * x + shift[c]`: a BatchNorm that could not be folded into a conv.
    ChannelAffine {
        /// Per-channel scale `[C]`.
        scale: Tensor,
        /// Per-channel shift `[C]`.
        shift: Tensor,
    },
    /// `max(x, 0)`.
    Relu,
    /// `x if x >= 0 else alpha * x`.
    LeakyRelu {
        /// Slope of the negative part.
        alpha: f32,
    },
    /// `x if x >= 0 else slope * x`, slope of shape `[C]` (per channel) or `[1]`.
    PRelu {
        /// Slope of the negative part, per channel or one for all.
        slope: Tensor,
    },
    /// `x if x > 0 else alpha * (exp(x) - 1)`.
    Elu {
        /// Scale of the negative part.
        alpha: f32,
    },
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Softmax over one axis of NCDHW (the exporters use 1, the channels).
    Softmax {
        /// The NCDHW axis normalised over.
        axis: usize,
    },
    /// Elementwise sum of two activations.
    Add,
    /// Elementwise product of two activations.
    Mul,
    /// First activation minus the second.
    Sub,
    /// First activation divided by the second.
    Div,
    /// The activation plus a broadcast constant.
    AddConst(Tensor),
    /// The activation times a broadcast constant.
    MulConst(Tensor),
    /// Concatenation along an NCDHW axis (1 for skip connections).
    Concat {
        /// The NCDHW axis joined along.
        axis: usize,
    },
    /// Maximum over each window.
    MaxPool(Pool),
    /// Mean over each window.
    AveragePool(Pool),
    /// Spatial resize (upsampling in decoders).
    Resize(Resize),
    /// A no-op kept only when it carries a graph output's name.
    Identity,
    /// Elementwise maximum of two activations.
    Max,
    /// Elementwise minimum of two activations.
    Min,
    /// The first activation to the power of the second.
    Pow,
    /// A one-input elementwise function (GELU, Erf, Softplus, Clip...).
    Pointwise(Pointwise),
    /// Pad (or crop) along C, D, H, W.
    Pad(Pad),
    /// Channels repeated (`Tile` / `Expand` along C).
    Tile(Tile),
    /// The same elements under new dims (ONNX Reshape: 0 copies, -1 is inferred).
    Reshape {
        /// The ONNX target shape.
        target: Vec<i64>,
    },
    /// Axes permuted: output axis `i` is input axis `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// A strided range along one axis.
    Slice(Slice),
    /// One index along an axis, which is dropped.
    Gather {
        /// The axis (negative counts from the end).
        axis: i64,
        /// The index (negative counts from the end).
        index: i64,
    },
    /// Matrix product of two activations (batch dims broadcast).
    MatMul,
    /// The activation times a constant matrix, plus a bias, over its last axis.
    Linear(Linear),
    /// Normalisation over the trailing axes.
    LayerNorm(LayerNorm),
    /// Fused `softmax(scale · q @ kᵀ + bias) @ v` of three activations q, k, v.
    Attention(Attention),
}

/// Letter of NCDHW axis `a`, for messages.
fn ncdhw(a: usize) -> char {
    b"NCDHW".get(a).map_or('?', |&c| c as char)
}

/// Spatial part of a shape.
pub fn spatial(s: &Shape) -> [usize; 3] {
    [s[2], s[3], s[4]]
}

/// `x`'s batch with `c` channels and spatial size `sp`.
fn with(x: &Shape, c: usize, sp: [usize; 3]) -> Shape {
    [x[0], c, sp[0], sp[1], sp[2]]
}

impl Conv {
    /// Output shape on input `x`, parameters checked.
    pub fn output_shape(&self, x: &Shape) -> Result<Shape, String> {
        Ok(with(x, self.check(x[1])?, self.out_spatial(spatial(x))?))
    }
}

impl ConvTranspose {
    /// Output shape on input `x`, parameters checked.
    pub fn output_shape(&self, x: &Shape) -> Result<Shape, String> {
        Ok(with(x, self.check(x[1])?, self.out_spatial(spatial(x))?))
    }
}

impl Pool {
    /// Output shape on input `x`, parameters checked.
    pub fn output_shape(&self, x: &Shape) -> Result<Shape, String> {
        self.check()?;
        Ok(with(x, x[1], self.out_spatial(spatial(x))?))
    }
}

impl Op {
    /// The ONNX-style name, for messages and `voxtile inspect`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Conv(_) => "Conv",
            Op::ConvTranspose(_) => "ConvTranspose",
            Op::InstanceNorm { .. } => "InstanceNormalization",
            Op::GroupNorm { .. } => "GroupNormalization",
            Op::ChannelAffine { .. } => "ChannelAffine",
            Op::Relu => "Relu",
            Op::LeakyRelu { .. } => "LeakyRelu",
            Op::PRelu { .. } => "PRelu",
            Op::Elu { .. } => "Elu",
            Op::Sigmoid => "Sigmoid",
            Op::Tanh => "Tanh",
            Op::Softmax { .. } => "Softmax",
            Op::Add => "Add",
            Op::Mul => "Mul",
            Op::Sub => "Sub",
            Op::Div => "Div",
            Op::AddConst(_) => "Add(const)",
            Op::MulConst(_) => "Mul(const)",
            Op::Concat { .. } => "Concat",
            Op::MaxPool(_) => "MaxPool",
            Op::AveragePool(_) => "AveragePool",
            Op::Resize(_) => "Resize",
            Op::Identity => "Identity",
            Op::Max => "Max",
            Op::Min => "Min",
            Op::Pow => "Pow",
            Op::Pointwise(p) => p.name(),
            Op::Pad(_) => "Pad",
            Op::Tile(_) => "Tile",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Slice(_) => "Slice",
            Op::Gather { .. } => "Gather",
            Op::MatMul => "MatMul",
            Op::Linear(_) => "Linear",
            Op::LayerNorm(_) => "LayerNormalization",
            Op::Attention(_) => "Attention",
        }
    }

    /// How many activation inputs the op takes (`None`: one or more, for Concat).
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow | Op::MatMul => {
                Some(2)
            }
            Op::Concat { .. } => None,
            Op::Attention(_) => Some(3),
            _ => Some(1),
        }
    }

    /// Validates the op's parameters against its inputs' channel counts (arity, weight rank,
    /// groups, bias and norm lengths, zero strides...); returns its output channels.
    pub fn check(&self, ins: &[usize]) -> Result<usize, String> {
        let want = self.arity().unwrap_or(ins.len().max(1));
        if ins.len() != want {
            return Err(format!("has {} inputs, expected {want}", ins.len()));
        }
        let cin = ins[0];
        match self {
            Op::Conv(c) => c.check(cin),
            Op::ConvTranspose(c) => c.check(cin),
            Op::InstanceNorm { eps, scale, bias } => {
                per_channel(scale, "scale", cin)?;
                per_channel(bias, "bias", cin)?;
                epsilon(*eps).map(|_| cin)
            }
            Op::GroupNorm {
                groups,
                eps,
                scale,
                bias,
            } => {
                if *groups == 0 || !cin.is_multiple_of(*groups) {
                    return Err(format!("{groups} groups do not divide {cin} channels"));
                }
                per_channel(scale, "scale", cin)?;
                per_channel(bias, "bias", cin)?;
                epsilon(*eps).map(|_| cin)
            }
            Op::ChannelAffine { scale, shift } => {
                per_channel(scale, "scale", cin)?;
                per_channel(shift, "shift", cin).map(|_| cin)
            }
            Op::PRelu { slope } if slope.len() == 1 && slope.is_consistent() => Ok(cin),
            Op::PRelu { slope } => per_channel(slope, "slope", cin).map(|_| cin),
            Op::AddConst(t) | Op::MulConst(t) => broadcast_channels(t, cin, false).map(|_| cin),
            Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow => {
                broadcast::broadcast_channels(cin, ins[1])
            }
            Op::Pointwise(p) => p.check().map(|_| cin),
            Op::Concat { axis } | Op::Softmax { axis } if *axis >= 5 => {
                Err(format!("axis {axis} out of range"))
            }
            Op::Concat { axis: 1 } => ins
                .iter()
                .try_fold(0usize, |a, &c| a.checked_add(c))
                .ok_or_else(|| "its output channels overflow".to_string()),
            Op::MaxPool(p) | Op::AveragePool(p) => p.check().map(|_| cin),
            Op::Resize(r) => r.check().map(|_| cin),
            Op::Pad(p) => p.check(cin),
            Op::Tile(t) => t.check(cin),
            Op::Transpose { perm } => check_perm(perm).map(|_| cin),
            Op::Linear(l) => l.check().map(|_| cin),
            _ => Ok(cin),
        }
    }

    /// Whether the op's output is not an NCDHW activation with channels known at load (the
    /// tensor ops of transformer nets): its shape, channels included, comes from shape inference.
    pub fn is_tensor_op(&self) -> bool {
        matches!(
            self,
            Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice(_)
                | Op::Gather { .. }
                | Op::MatMul
                | Op::Linear(_)
                | Op::LayerNorm(_)
                | Op::Attention(_)
        )
    }

    /// Whether the op computes each output element from the input element at the same index
    /// only (any rank).
    pub fn is_elementwise_unary(&self) -> bool {
        matches!(
            self,
            Op::Relu
                | Op::LeakyRelu { .. }
                | Op::Elu { .. }
                | Op::Sigmoid
                | Op::Tanh
                | Op::Identity
                | Op::Pointwise(_)
        )
    }

    /// The output dims of the op on inputs of any rank: the tensor ops, elementwise ops,
    /// Softmax and Concat work on any rank, the rest need NCDHW (rank 5) and defer to
    /// [`Op::output_shape`].
    pub fn output_dims(&self, inputs: &[Dims]) -> Result<Dims, String> {
        let want = self.arity().unwrap_or(inputs.len().max(1));
        if inputs.len() != want {
            return Err(format!("has {} inputs, expected {want}", inputs.len()));
        }
        let x = inputs[0];
        if x.numel() == 0 {
            return Err(format!("got an empty input {x:?}"));
        }
        let all5 = inputs.iter().all(|d| d.rank() == 5);
        if all5 && !self.is_tensor_op() {
            let s: Vec<Shape> = inputs.iter().filter_map(|d| d.ncdhw()).collect();
            return self.output_shape(&s).map(Dims::from);
        }
        match self {
            Op::Reshape { target } => reshape_dims(&x, target),
            Op::Transpose { perm } => transpose_dims(&x, perm),
            Op::Slice(s) => s.output_dims(&x),
            Op::Gather { axis, index } => gather_dims(&x, *axis, *index).map(|g| g.2),
            Op::MatMul => matmul_dims(&x, &inputs[1]),
            Op::Linear(l) => l.output_dims(&x),
            Op::LayerNorm(l) => l.split(&x).map(|_| x),
            Op::Attention(a) => a.output_dims(&x, &inputs[1], &inputs[2]),
            Op::Softmax { axis } if *axis < x.rank() => Ok(x),
            Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow => {
                let b = inputs[1];
                broadcast_lead(x.as_slice(), b.as_slice())
                    .ok_or_else(|| {
                        format!("operands have shapes {x:?} and {b:?}, which do not broadcast")
                    })
                    .and_then(|o| Dims::new(&o))
            }
            Op::AddConst(t) | Op::MulConst(t) => {
                let ok = t.shape.len() == x.rank()
                    && t.is_consistent()
                    && t.shape
                        .iter()
                        .zip(x.as_slice())
                        .all(|(&c, &v)| c == 1 || c == v);
                if ok {
                    Ok(x)
                } else {
                    Err(format!(
                        "constant of shape {:?} does not broadcast to {x:?}",
                        t.shape
                    ))
                }
            }
            Op::Concat { axis } if *axis < x.rank() => {
                let mut o = x.as_slice().to_vec();
                o[*axis] = 0;
                for (i, s) in inputs.iter().enumerate() {
                    let same =
                        s.rank() == x.rank() && (0..x.rank()).all(|a| a == *axis || s[a] == x[a]);
                    if !same {
                        return Err(format!(
                            "Concat input {i} has shape {s:?} but input 0 has {x:?}"
                        ));
                    }
                    o[*axis] += s[*axis];
                }
                Dims::new(&o)
            }
            op if op.is_elementwise_unary() => Ok(x),
            _ => Err(format!(
                "needs NCDHW (5-dimensional) inputs, got {:?}",
                inputs
            )),
        }
    }

    /// [`Op::check`] plus what a graph needs to run at any batch size (which the planner picks):
    /// broadcast constants have batch 1. `Graph::validate` runs this.
    pub fn check_any_batch(&self, ins: &[usize]) -> Result<usize, String> {
        let cout = self.check(ins)?;
        if let Op::AddConst(t) | Op::MulConst(t) = self {
            broadcast_channels(t, ins[0], true)?;
        }
        Ok(cout)
    }

    /// The NCDHW output of the op on inputs of the given shapes (validation included), or why
    /// it cannot run on them.
    pub fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, String> {
        let chans: Vec<usize> = inputs.iter().map(|s| s[1]).collect();
        let cout = self.check(&chans)?;
        let x = inputs[0];
        if x.contains(&0) {
            return Err(format!("got an empty input {x:?}"));
        }
        let sp = spatial(&x);
        let out = match self {
            Op::Conv(c) => c.out_spatial(sp)?,
            Op::ConvTranspose(c) => c.out_spatial(sp)?,
            Op::MaxPool(p) | Op::AveragePool(p) => p.out_spatial(sp)?,
            Op::Resize(r) => r.out_size(sp)?,
            Op::Concat { axis } => return concat_shape(inputs, *axis),
            Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow => {
                return broadcast_shape(&x, &inputs[1]);
            }
            Op::AddConst(t) | Op::MulConst(t) => broadcast_to(t, &x).map(|_| sp)?,
            Op::Pad(p) => p.out_spatial(sp)?,
            _ => sp,
        };
        Ok(with(&x, cout, out))
    }

    /// Number of f32 parameters the op holds.
    pub fn param_len(&self) -> usize {
        match self {
            Op::Conv(c) => c.weight.len() + c.bias.as_ref().map_or(0, |b| b.len()),
            Op::ConvTranspose(c) => c.weight.len() + c.bias.as_ref().map_or(0, |b| b.len()),
            Op::InstanceNorm { scale, bias, .. } | Op::GroupNorm { scale, bias, .. } => {
                scale.len() + bias.len()
            }
            Op::ChannelAffine { scale, shift } => scale.len() + shift.len(),
            Op::PRelu { slope } => slope.len(),
            Op::AddConst(t) | Op::MulConst(t) => t.len(),
            Op::Linear(l) => l.weight.len() + l.bias.as_ref().map_or(0, |b| b.len()),
            Op::LayerNorm(l) => l.scale.len() + l.bias.as_ref().map_or(0, |b| b.len()),
            Op::Attention(a) => a.constants(),
            _ => 0,
        }
    }

    /// Floating point operations for input `inp` and output `out`: 2·MACs for (transposed)
    /// convolutions, rough per-element costs for the rest (norm 8, pooling kernel volume,
    /// linear resize 16, others 1-4).
    pub fn flops(&self, inp: &Dims, out: &Dims) -> u64 {
        let numel = |s: &Dims| s.as_slice().iter().map(|&d| d as u64).product::<u64>();
        match self {
            Op::Conv(c) => 2 * numel(out) * c.macs_per_output(),
            Op::ConvTranspose(c) => 2 * numel(inp) * c.macs_per_input(),
            Op::InstanceNorm { .. } | Op::GroupNorm { .. } => 8 * numel(out),
            Op::Softmax { .. } | Op::Elu { .. } | Op::Sigmoid | Op::Tanh => 4 * numel(out),
            Op::MaxPool(p) | Op::AveragePool(p) => numel(out) * p.taps(),
            Op::Resize(r) => numel(out) * r.cost_per_output(),
            Op::Concat { .. } | Op::Identity | Op::Pad(_) | Op::Tile(_) => 0,
            Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice(_) | Op::Gather { .. } => 0,
            Op::Linear(l) => 2 * numel(out) * l.kn().0 as u64,
            Op::MatMul => 2 * numel(out) * inp[inp.rank() - 1] as u64,
            Op::LayerNorm(_) => 8 * numel(out),
            Op::ChannelAffine { .. } => 2 * numel(out),
            Op::Pointwise(p) => p.flops_per_element() * numel(out),
            Op::Attention(a) => a.flops(inp, out),
            _ => numel(out),
        }
    }
}

/// Concatenation: inputs equal but along `axis`, sizes summed along it.
fn concat_shape(inputs: &[Shape], axis: usize) -> Result<Shape, String> {
    let first = inputs[0];
    let mut out = first;
    out[axis] = 0;
    for (i, s) in inputs.iter().enumerate() {
        if let Some(a) = (0..5).find(|&a| a != axis && s[a] != first[a]) {
            let hint = if a >= 2 {
                " (the window is probably not divisible by the model's spatial divisor: each down/up-sampling stage halves/doubles it)"
            } else {
                ""
            };
            return Err(format!(
                "input {i} has shape {s:?} but input 0 has {first:?}: they differ along {}{hint}",
                ncdhw(a)
            ));
        }
        out[axis] = out[axis]
            .checked_add(s[axis])
            .ok_or_else(|| format!("its output size along {} overflows", ncdhw(axis)))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_plain_ops() {
        let x = [2, 3, 4, 5, 6];
        assert_eq!(Op::Relu.output_shape(&[x]), Ok(x));
        assert_eq!(
            Op::Concat { axis: 1 }.output_shape(&[x, [2, 1, 4, 5, 6]]),
            Ok([2, 4, 4, 5, 6])
        );
        let e = Op::Concat { axis: 1 }.output_shape(&[x, [2, 1, 4, 5, 7]]);
        assert!(e.unwrap_err().contains("differ along W"));
        assert!(Op::Add.output_shape(&[x, [2, 3, 4, 5, 7]]).is_err());
        assert_eq!(Op::Sub.output_shape(&[[2, 1, 4, 5, 6], x]), Ok(x));
        assert_eq!(Op::Div.output_shape(&[x, [2, 3, 1, 1, 1]]), Ok(x));
        assert!(Op::Mul
            .output_shape(&[x, [2, 2, 4, 5, 6]])
            .unwrap_err()
            .contains("channels"));
        assert!(Op::Add
            .output_shape(&[x])
            .unwrap_err()
            .contains("expected 2"));
        assert!(Op::Softmax { axis: 5 }.output_shape(&[x]).is_err());
        let t = Tensor::new(vec![1, 3, 1, 1, 6], vec![0.0; 18]);
        assert_eq!(Op::AddConst(t.clone()).output_shape(&[x]), Ok(x));
        assert!(Op::AddConst(t).output_shape(&[[2, 3, 4, 5, 7]]).is_err());
    }
}
