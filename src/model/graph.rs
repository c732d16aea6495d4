//! The graph IR that backends execute.
//!
//! Every activation is a 5D NCDHW float tensor: the importer folds the exporters' shape plumbing
//! (Shape/Gather/Reshape/Cast/Constant...) away at load time, folds BatchNorm into the preceding
//! conv, and rewrites PyTorch's GroupNorm pattern into [`Op::GroupNorm`]. Nodes are in topological
//! order. Weights are owned by the ops as f32 [`Tensor`]s in ONNX's layouts; backends re-lay them.

/// Index into [`Graph::values`].
pub type ValueId = usize;

pub use super::ops::Pointwise;
pub use super::ops::{
    Conv, ConvTranspose, CoordMode, NearestMode, Op, Pool, Resize, ResizeMode, Shape,
};
pub use super::ops::{Dims, LayerNorm, Linear, Pad, PadMode, Slice, Tile};
pub use super::tensor::Tensor;

/// One operation: reads `inputs`, writes `output` (one value per node).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The ONNX node name (or `op_type#index` when the export left it empty).
    pub name: String,
    /// What it computes, with its parameters and weights.
    pub op: Op,
    /// Activations read, in the op's argument order.
    pub inputs: Vec<ValueId>,
    /// The activation written.
    pub output: ValueId,
}

/// A named activation; its shape depends on the window and is computed by [`Graph::infer_shapes`].
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The ONNX value name.
    pub name: String,
    /// Channels are fixed by the weights; known at load.
    pub channels: usize,
}

/// What the model already applies to its output (decides how labels are made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputActivation {
    /// Raw outputs (logits).
    None,
    /// The graph ends in a Softmax over channels: outputs are probabilities.
    Softmax,
    /// The graph ends in a Sigmoid: outputs are per-channel probabilities.
    Sigmoid,
}

/// A network lowered from ONNX: one NCDHW input, one NCDHW output, nodes in topological order.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// The ONNX graph name.
    pub name: String,
    /// Every activation, indexed by [`ValueId`].
    pub values: Vec<Value>,
    /// The operations, in topological order.
    pub nodes: Vec<Node>,
    /// The single NCDHW input.
    pub input: ValueId,
    /// The single NCDHW output (the first graph output when the export has several).
    pub output: ValueId,
    /// Spatial sizes the ONNX input declared as fixed numbers (None = symbolic).
    pub fixed_input_spatial: [Option<usize>; 3],
}

impl Graph {
    /// Channels of the network input.
    pub fn input_channels(&self) -> usize {
        self.values[self.input].channels
    }
    /// Channels of the network output (classes for argmax).
    pub fn output_channels(&self) -> usize {
        self.values[self.output].channels
    }
}
