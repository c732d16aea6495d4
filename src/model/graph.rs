//! The graph IR that backends execute.
//!
//! Every activation is a 5D NCDHW float tensor: the importer folds the exporters' shape plumbing
//! (Shape/Gather/Reshape/Cast/Constant...) away at load time, folds BatchNorm into the preceding
//! conv, and rewrites PyTorch's GroupNorm pattern into [`Op::GroupNorm`]. Nodes are in topological
//! order. Weights are owned by the ops as f32 [`Tensor`]s in ONNX's layouts; backends re-lay them.

/// Index into [`Graph::values`].
pub type ValueId = usize;

/// A dense, row-major f32 constant (weights, biases, norm parameters, broadcast operands).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// 3D convolution (ONNX Conv). `pads` is ONNX order: [d_begin, h_begin, w_begin, d_end, h_end, w_end].
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// [Cout, Cin/groups, kd, kh, kw]
    pub weight: Tensor,
    /// [Cout]
    pub bias: Option<Tensor>,
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pads: [usize; 6],
    pub groups: usize,
}

/// 3D transposed convolution (ONNX ConvTranspose), pads may be asymmetric.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTranspose {
    /// [Cin, Cout/groups, kd, kh, kw]
    pub weight: Tensor,
    /// [Cout]
    pub bias: Option<Tensor>,
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pads: [usize; 6],
    pub output_padding: [usize; 3],
    pub groups: usize,
}

/// Max or average pooling over D,H,W.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pads: [usize; 6],
    pub ceil_mode: bool,
    /// AveragePool only: whether padded zeros count in the divisor.
    pub count_include_pad: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    Nearest,
    Linear,
}

/// ONNX Resize's `coordinate_transformation_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
}

/// ONNX Resize's `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Spatial resize; the output size is `sizes` if given, else floor(input · scales).
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    /// D,H,W scale factors (also used for coordinate mapping when sizes are given: ONNX uses
    /// output/input then).
    pub scales: [f32; 3],
    pub sizes: Option<[usize; 3]>,
}

/// The operations of the IR. Elementwise binaries take two activations of the same shape, or an
/// activation and a constant broadcast to NCDHW (`*Const`, shape of 5 dims, each 1 or full size).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Conv(Conv),
    ConvTranspose(ConvTranspose),
    /// Per (n, c) normalisation over D,H,W, then `scale[c] * x + bias[c]`.
    InstanceNorm {
        eps: f32,
        scale: Tensor,
        bias: Tensor,
    },
    /// Per (n, group) normalisation over (C/groups, D, H, W), then per-channel affine.
    GroupNorm {
        groups: usize,
        eps: f32,
        scale: Tensor,
        bias: Tensor,
    },
    /// `scale[c] * x + shift[c]`: a BatchNorm that could not be folded into a conv.
    ChannelAffine {
        scale: Tensor,
        shift: Tensor,
    },
    Relu,
    LeakyRelu {
        alpha: f32,
    },
    /// `x if x >= 0 else slope * x`, slope of shape [C] (per channel) or [1].
    PRelu {
        slope: Tensor,
    },
    Elu {
        alpha: f32,
    },
    Sigmoid,
    Tanh,
    /// Softmax over one axis of NCDHW (the exporters use 1, the channels).
    Softmax {
        axis: usize,
    },
    Add,
    Mul,
    Sub,
    Div,
    AddConst(Tensor),
    MulConst(Tensor),
    /// Concatenation along an NCDHW axis (1 for skip connections).
    Concat {
        axis: usize,
    },
    MaxPool(Pool),
    AveragePool(Pool),
    Resize(Resize),
    /// A no-op kept only when it carries a graph output's name.
    Identity,
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
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The ONNX node name (or `op_type#index` when the export left it empty).
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub output: ValueId,
}

/// A named activation; its shape depends on the window and is computed by [`Graph::infer_shapes`].
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    /// Channels are fixed by the weights; known at load.
    pub channels: usize,
}

/// What the model already applies to its output (decides how labels are made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputActivation {
    None,
    Softmax,
    Sigmoid,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    /// The single NCDHW input.
    pub input: ValueId,
    /// The single NCDHW output (the first graph output when the export has several).
    pub output: ValueId,
    /// Spatial sizes the ONNX input declared as fixed numbers (None = symbolic).
    pub fixed_input_spatial: [Option<usize>; 3],
}

impl Graph {
    pub fn input_channels(&self) -> usize {
        self.values[self.input].channels
    }
    pub fn output_channels(&self) -> usize {
        self.values[self.output].channels
    }
}
