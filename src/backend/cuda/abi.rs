//! The bottom of the CUDA backend: what host planning and device code must agree on, with no
//! other module of the backend below it. The kernel parameter blocks (mirrored field for field in
//! kernels/*.cu), the activation codes of kernels/common.cuh, the per-sample shape, and the
//! allocation and element sizes both the buffer plan and the allocation tracker count.

use crate::model::graph::Op;

/// Per-sample activation shape: [C, D, H, W].
pub type Shape = [usize; 4];

/// Activation codes of kernels/common.cuh.
#[derive(Clone, Debug, PartialEq)]
pub enum Act {
    None,
    Relu,
    Leaky(f32),
    PRelu(Vec<f32>),
    Elu(f32),
    Sigmoid,
    Tanh,
}

impl Act {
    /// The activation an op applies, if it is a pure elementwise activation.
    pub fn of(op: &Op) -> Option<Act> {
        Some(match op {
            Op::Relu => Act::Relu,
            Op::LeakyRelu { alpha } => Act::Leaky(*alpha),
            Op::PRelu { slope } => Act::PRelu(slope.data.clone()),
            Op::Elu { alpha } => Act::Elu(*alpha),
            Op::Sigmoid => Act::Sigmoid,
            Op::Tanh => Act::Tanh,
            _ => return None,
        })
    }
    pub fn code(&self) -> i32 {
        match self {
            Act::None => 0,
            Act::Relu => 1,
            Act::Leaky(_) => 2,
            Act::PRelu(_) => 3,
            Act::Elu(_) => 4,
            Act::Sigmoid => 5,
            Act::Tanh => 6,
        }
    }
    pub fn alpha(&self) -> f32 {
        match self {
            Act::Leaky(a) | Act::Elu(a) => *a,
            _ => 0.0,
        }
    }
}

/// Mirrors `struct ConvParams` in kernels/common.cuh (`cuda::abi_mirrors` checks the fields).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvParams {
    pub n: i32,
    pub di: i32,
    pub hi: i32,
    pub wi: i32,
    pub cin: i32,
    pub do_: i32,
    pub ho: i32,
    pub wo: i32,
    pub cout: i32,
    pub kd: i32,
    pub kh: i32,
    pub kw: i32,
    pub sd: i32,
    pub sh: i32,
    pub sw: i32,
    pub pd: i32,
    pub ph: i32,
    pub pw: i32,
    pub dd: i32,
    pub dh: i32,
    pub dw: i32,
    pub transposed: i32,
    pub kpad: i32,
    pub groups: i32,
    pub ldc: i32,
    pub coff: i32,
    pub act: i32,
    pub alpha: f32,
    pub slope_n: i32,
    /// Scatter epilogue (kernel == stride transposed conv as a GEMM): kernel dims, 0 = none.
    pub up_d: i32,
    pub up_h: i32,
    pub up_w: i32,
    /// Real output channels when scattering (`cout` is then taps x ocout GEMM columns).
    pub ocout: i32,
    pub od: i32,
    pub oh: i32,
    pub ow: i32,
    /// 1: the output is fp32 (a value only norms read, `host::buffers::BufferPlan::f32_values`);
    /// [`OUT_SHIFTED`]: fp16 less each output tile's shift (`CudaOptions::norm_shifted`).
    pub out_f32: i32,
    /// `conv_mma_*` only: the K tiles split over grid.z (> 1: fp32 partial sums to `ws`,
    /// `[ksplit][M][cout]`, summed by `conv_splitk_reduce`); 0 or 1: no split.
    pub ksplit: i32,
    /// 1: the conv adds its sums to the fp32 output already there (`conv_wz_*` only): a
    /// conv over a channel concat run as one launch per part (`host::concat_split`).
    pub accum: i32,
    /// `conv_wz_*`: the input's channel stride, of which the launch reads `cin` channels from
    /// its `x` on (a conv run in Cin chunks of one input, `host::concat_split`); else `cin`.
    pub ldi: i32,
    pub ws: u64,
    /// fp16 residual added to each stored value (0: none): an Add fused into the conv's
    /// epilogue (`host::fusion::fusable_residual`), indexed as the output (ldc == Cout, coff 0).
    pub res: u64,
    /// float4 per (output tile, channel): the output's InstanceNorm / GroupNorm statistics,
    /// written by the epilogue (kernels/tile_stats.cuh) for the norm right after; 0: none.
    pub stats: u64,
}

/// `ConvParams::out_f32` of a z-pair `_st` conv storing fp16 less each output tile's shift
/// (`OUT_SHIFTED` in kernels/common.cuh).
pub const OUT_SHIFTED: i32 = 2;

/// The voxels along x of one thread's run in `affine_act_v8_shifted_runs` (`NORM_RUN` in
/// kernels/norm.cu).
pub const NORM_RUN: usize = 4;

/// Mirrors `struct PoolParams` in kernels/pool_resize.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolParams {
    pub n: i32,
    pub di: i32,
    pub hi: i32,
    pub wi: i32,
    pub c: i32,
    pub do_: i32,
    pub ho: i32,
    pub wo: i32,
    pub kd: i32,
    pub kh: i32,
    pub kw: i32,
    pub sd: i32,
    pub sh: i32,
    pub sw: i32,
    pub dd: i32,
    pub dh: i32,
    pub dw: i32,
    pub pd: i32,
    pub ph: i32,
    pub pw: i32,
    pub ped: i32,
    pub peh: i32,
    pub pew: i32,
    pub is_max: i32,
    pub count_include_pad: i32,
}

/// Mirrors `struct NdParams` in kernels/tensor.cu: an element index decomposed over `xd`
/// (outermost first) reads x at `xoff + sum(c * xs)`; y is written at `yoff + sum(c * ys)` over
/// the same coordinates (`ry` 0) or over the index decomposed over `yd` (a Reshape); binaries
/// read their second operand at `sum(c * bs)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NdParams {
    pub total: i64,
    pub rx: i32,
    pub ry: i32,
    pub op: i32,
    pub pad_: i32,
    pub xd: [i64; 8],
    pub xs: [i64; 8],
    pub yd: [i64; 8],
    pub ys: [i64; 8],
    pub bs: [i64; 8],
    pub xoff: i64,
    pub yoff: i64,
}

/// Mirrors `struct GemmParams` in kernels/tensor.cu: `y[b] = a[b] (m x k) @ w[b] (k x n)`, each
/// operand at element strides (row, column), batch b decomposed over `bd` (`nb` dims) with
/// per-operand batch strides (0: broadcast).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmParams {
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub a_sm: i64,
    pub a_sk: i64,
    pub b_sk: i64,
    pub b_sn: i64,
    pub y_sm: i64,
    pub y_sn: i64,
    pub nbatch: i64,
    pub nb: i32,
    pub pad_: i32,
    pub bd: [i64; 6],
    pub abs: [i64; 6],
    pub bbs: [i64; 6],
    pub ybs: [i64; 6],
}

impl GemmParams {
    /// Whether `gemm_wmma_v8` can run this GEMM on operands at device addresses `a` and `w`:
    /// both contiguous along K (a) and N (w), and every vector of 8 halves it loads inside one
    /// row and 16-byte aligned (K, N, row and batch strides multiples of 8, aligned bases).
    pub fn vec8(&self, a: u64, w: u64) -> bool {
        let nb = (self.nb.max(0) as usize).min(6);
        let eight = |x: i64| x % 8 == 0;
        self.a_sk == 1
            && self.b_sn == 1
            && [self.k, self.n, self.a_sm, self.b_sk]
                .into_iter()
                .all(eight)
            && self.abs[..nb]
                .iter()
                .chain(&self.bbs[..nb])
                .all(|&x| eight(x))
            && a.is_multiple_of(16)
            && w.is_multiple_of(16)
    }
}

impl NdParams {
    /// The copy in 16-byte units for `nd_copy_v8`, when its buffers at `x` and `y` allow it:
    /// on each side the innermost axis contiguous and a multiple of 8 long, every other stride
    /// and the offsets multiples of 8, both bases 16-byte aligned. Every run of 8 consecutive
    /// elements then stays one 16-byte vector on both sides.
    pub fn vec8(&self, x: u64, y: u64) -> Option<NdParams> {
        let (rx, ry) = (self.rx.clamp(0, 8) as usize, self.ry.clamp(0, 8) as usize);
        let eight = |v: i64| v % 8 == 0;
        let side = |d: &[i64], s: &[i64]| {
            d.last().is_some_and(|&n| eight(n))
                && s.last() == Some(&1)
                && s[..s.len() - 1].iter().all(|&v| eight(v))
        };
        let ok = rx > 0
            && self.total % 8 == 0
            && eight(self.xoff)
            && eight(self.yoff)
            && x.is_multiple_of(16)
            && y.is_multiple_of(16)
            && side(&self.xd[..rx], &self.xs[..rx])
            && if ry == 0 {
                side(&self.xd[..rx], &self.ys[..rx])
            } else {
                side(&self.yd[..ry], &self.ys[..ry])
            };
        if !ok {
            return None;
        }
        let mut v = *self;
        v.total /= 8;
        v.xoff /= 8;
        v.yoff /= 8;
        v.xd[rx - 1] /= 8;
        v.xs[..rx - 1].iter_mut().for_each(|s| *s /= 8);
        if ry == 0 {
            v.ys[..rx - 1].iter_mut().for_each(|s| *s /= 8);
        } else {
            v.yd[ry - 1] /= 8;
            v.ys[..ry - 1].iter_mut().for_each(|s| *s /= 8);
        }
        Some(v)
    }
}

// SAFETY: plain #[repr(C)] structs of i32/i64/f32, laid out as their CUDA twins.
unsafe impl cudarc::driver::DeviceRepr for ConvParams {}
unsafe impl cudarc::driver::DeviceRepr for PoolParams {}
unsafe impl cudarc::driver::DeviceRepr for NdParams {}
unsafe impl cudarc::driver::DeviceRepr for GemmParams {}

/// Every device allocation of the backend takes at least this many bytes (the tracker counts
/// `max(bytes, ALLOC_FLOOR)`, as `DevBuf` allocates).
pub const ALLOC_FLOOR: usize = 256;

/// Bytes one allocation of `bytes` takes.
pub fn alloc_size(bytes: usize) -> u64 {
    bytes.max(ALLOC_FLOOR) as u64
}

/// Blocks per sample of the norm statistics on `sm_count` SMs: >= 256 pixels each, at most 2
/// per SM (with batch 4 that fills 132 SMs 8 deep at 128^3), so the partials stay small.
pub fn norm_blocks(sm_count: usize, pix: usize) -> usize {
    pix.div_ceil(256).clamp(1, 2 * sm_count.max(1))
}

/// Bytes of one activation element: fp16, or fp32 for a value `host::fusion::keeps_f32` keeps.
pub fn elem_bytes(f32: bool) -> usize {
    if f32 {
        4
    } else {
        2
    }
}
