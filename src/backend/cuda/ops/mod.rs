//! The ops of the launch list, one module per kernel family: each builds its launch(es) for
//! one node (uploading its constants through [`Build`]) and launches them for n samples.

pub mod attention;
pub mod conv;
pub mod eltwise;
pub mod math;
pub mod norm;
pub mod pad;
pub mod pool_resize;
pub mod tensor;

use crate::backend::cuda::abi::{Act, PoolParams, Shape};
use crate::backend::cuda::host::buffers::ConstBuf;
use crate::backend::cuda::host::concat_split::Part;
use crate::backend::cuda::host::conv_kernel::ConvKernel;
use crate::backend::cuda::host::launch::ShiftedOut;
use crate::backend::cuda::host::tensor_layout::Stored;
use crate::backend::cuda::runtime::device::DevBuf;
use crate::backend::cuda::runtime::launch::Gpu;
use crate::model::graph::Op;
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// One entry of the launch list. Pointers are final; sizes are per sample (times n at run),
/// except the tensor path's, which cover the plan's whole batch.
pub(crate) enum Step {
    Conv(conv::ConvStep),
    Norm(norm::Norm),
    /// A norm's statistics, then the pointwise head that reads its input normalised on load
    /// (`launch::NormHead`).
    NormHead {
        norm: norm::Norm,
        head: conv::ConvStep,
    },
    /// A norm that runs the Cin-1 conv before it (`launch::Launch::recompute`): the conv for
    /// the statistics alone (`stats`), their finalisation, then the conv again normalising on
    /// store (`conv`).
    NormRecompute {
        stats: Box<conv::ConvStep>,
        norm: norm::Norm,
        conv: Box<conv::ConvStep>,
    },
    Affine(norm::Affine),
    Elt(eltwise::Elt),
    Pool {
        p: PoolParams,
        x: u64,
        y: u64,
    },
    Resize(pool_resize::ResizeStep),
    Pad(pad::PadStep),
    Tile(pad::TileStep),
    Math(math::MathStep),
    Tensor(tensor::TensorStep),
}

impl Step {
    /// Launches the step for `n` samples on `s`; `norm_scratch`: the plan's norm partial sums
    /// (also a split-K conv's partial sums) and scale / shift pairs.
    pub fn launch(
        &self,
        gpu: &Gpu,
        s: &CudaStream,
        n: usize,
        norm_scratch: [u64; 2],
    ) -> Result<()> {
        match self {
            Step::Conv(c) => c.launch(gpu, s, n, norm_scratch[0]),
            Step::Norm(m) => m.launch(gpu, s, n, norm_scratch),
            Step::NormHead { norm, head } => {
                norm.stats(gpu, s, n, norm_scratch)?;
                head.launch_normed(gpu, s, n, norm_scratch[1], &norm.affine)
            }
            Step::NormRecompute { stats, norm, conv } => {
                stats.launch(gpu, s, n, norm_scratch[0])?;
                norm.stats(gpu, s, n, norm_scratch)?;
                conv.launch_normed(gpu, s, n, norm_scratch[1], &norm.affine)
            }
            Step::Affine(a) => a.launch(gpu, s, n),
            Step::Elt(e) => e.launch(gpu, s, n),
            Step::Pool { p, x, y } => pool_resize::launch_pool(gpu, s, p, [*x, *y], n),
            Step::Resize(r) => r.launch(gpu, s, n),
            Step::Pad(p) => p.launch(gpu, s, n),
            Step::Tile(t) => t.launch(gpu, s, n),
            Step::Math(m) => m.launch(gpu, s, n),
            Step::Tensor(t) => t.launch(gpu, s),
        }
    }
}

/// Constant uploads of a launch list being built, checked against the buffer plan's list.
pub(crate) struct Build<'a> {
    pub gpu: &'a Gpu,
    pub bufs: Vec<DevBuf>,
    pub plan: &'a [ConstBuf],
    /// Building another window's copy of a launch: the next constant is this one, already
    /// uploaded by the first copy (a node's constants come in the same order every build).
    pub replay: Option<usize>,
}

impl Build<'_> {
    /// Uploads the next constant of the buffer plan (or, replaying, hands back the one the
    /// first copy uploaded); its bytes must be the plan's.
    pub fn upload_const<T>(&mut self, data: &[T]) -> Result<u64> {
        let bytes = std::mem::size_of_val(data);
        if let Some(k) = self.replay {
            return match (self.plan.get(k), self.bufs.get(k)) {
                (Some(c), Some(b)) if c.bytes == bytes => {
                    self.replay = Some(k + 1);
                    Ok(b.ptr)
                }
                (c, _) => Err(Error::Backend(format!(
                    "CUDA launch list: a window's copy asks constant {k} for {bytes} bytes, the buffer plan says {c:?}"
                ))),
            };
        }
        let k = self.bufs.len();
        match self.plan.get(k) {
            Some(c) if c.bytes == bytes => {}
            c => {
                return Err(Error::Backend(format!(
                "CUDA launch list: constant {k} has {bytes} bytes but the buffer plan says {c:?}"
            )))
            }
        }
        let b = DevBuf::upload(&self.gpu.ctx, &self.gpu.stream, data)?;
        let p = b.ptr;
        self.bufs.push(b);
        Ok(p)
    }

    /// The slope of a PRelu, uploaded (0 for other activations).
    pub fn act_slope(&mut self, act: &Act) -> Result<u64> {
        match act {
            Act::PRelu(s) => self.upload_const(s),
            _ => Ok(0),
        }
    }
}

/// Where one node reads and writes, with its fused activation.
#[derive(Clone)]
pub(crate) struct NodeIo<'a> {
    pub name: &'a str,
    /// Input buffers (x = xs[0]) and their channels.
    pub xs: Vec<u64>,
    pub cins: Vec<usize>,
    /// Per-sample shapes of the inputs.
    pub shapes: Vec<Shape>,
    pub x: u64,
    pub y: u64,
    /// x (input 0) and y are fp32 rather than fp16 (`BufferPlan::f32_values`).
    pub x_f32: bool,
    pub y_f32: bool,
    pub xshape: Shape,
    pub oshape: Shape,
    /// Output voxels per sample.
    pub pix: usize,
    /// y's channel stride and offset (a concat slice, else C and 0).
    pub ldc: usize,
    pub coff: usize,
    pub act: Act,
    pub slope: u64,
    pub slope_n: i32,
    /// The fp16 residual a conv's epilogue adds (a fused Add), 0: none.
    pub res: u64,
    /// A conv writing the norm after it its statistics, or that norm reading them
    /// (`launch::Launch::tile_stats`): the conv's output tiles per sample.
    pub stats_tiles: Option<usize>,
    /// ... whose values the conv stores as fp16 less each tile's shift (`Launch::shifted`).
    pub shifted: Option<ShiftedOut>,
    /// A split conv's launch (`launch::Launch::part`): the channels of `x` it reads, their
    /// slice of the weights, and whether it adds to the output.
    pub part: Option<Part>,
    /// Whether the node runs on the tensor path, its inputs and output as stored (dims at the
    /// plan's batch, layout).
    pub tensor: bool,
    pub st: Vec<Stored>,
    pub ost: Stored,
}

/// The launch(es) of node `op` (`conv`: its planned kernel; `in_place`: per input, whether it
/// already sits in this concat's slice) for up to `batch` samples.
pub(crate) fn build_node(
    b: &mut Build,
    op: &Op,
    io: &NodeIo,
    conv: Option<&ConvKernel>,
    in_place: &[bool],
    batch: usize,
) -> Result<Vec<Step>> {
    Ok(match op {
        _ if io.tensor => tensor::build(b, op, io)?,
        Op::Conv(_) | Op::ConvTranspose(_) => {
            let kernel = conv.ok_or_else(|| {
                Error::Backend(format!("node {}: no conv kernel planned", io.name))
            })?;
            conv::build(b, op, kernel, io)?
                .into_iter()
                .map(Step::Conv)
                .collect()
        }
        Op::InstanceNorm { .. } | Op::GroupNorm { .. } => {
            vec![Step::Norm(norm::build_norm(b, op, io)?)]
        }
        Op::ChannelAffine { .. } => vec![Step::Affine(norm::build_affine(b, op, io)?)],
        Op::MaxPool(p) | Op::AveragePool(p) => vec![Step::Pool {
            p: pool_resize::pool_params(op, p, io, batch),
            x: io.x,
            y: io.y,
        }],
        Op::Resize(r) => vec![Step::Resize(pool_resize::resize(r, io))],
        Op::Pad(p) => vec![Step::Pad(pad::pad(p, io)?)],
        Op::Tile(_) => vec![Step::Tile(pad::tile(io))],
        _ if math::handles(op, io) => vec![Step::Math(math::build(op, io)?)],
        _ => eltwise::build(b, op, io, in_place)?
            .into_iter()
            .map(Step::Elt)
            .collect(),
    })
}
