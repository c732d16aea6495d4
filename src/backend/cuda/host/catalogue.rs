//! The kernel catalogue: every kernel the backend launches, stated once: its family (the
//! kernels/*.cu file that defines it), its entry point and, for the tiled conv kernels, the
//! configuration the launch needs (tile, threads, shared memory). Everything else (module
//! loading, kernel choice, launches, tests) names kernels through these entries. The plain
//! kernels keep their `extern "C"` lines in the .cu files; the conv tile tables generate their
//! `*_ENTRY(...)` lines ([`entry_lines`]). `tests::entries_match_the_sources` checks both sides
//! list the same entry points and tests/it/cuda/kernels_compile.rs the template numbers.
//!
//! The `kernel-experiments` cargo feature adds the halo variants that are not measured yet (the
//! `experiment` block of [`HALO_CONFIGS`]); without it they are neither listed nor compiled.

/// Prepended to every family: activation codes and helpers shared by the epilogues.
pub const COMMON: &str = include_str!("../../../../kernels/common.cuh");

/// Prepended (after [`COMMON`]) to the two mma.sync families, `conv_mma` and `conv_halo`.
pub const MMA: &str = include_str!("../../../../kernels/mma.cuh");

/// Prepended (after [`MMA`]) to the conv family whose epilogue takes a following norm's
/// statistics per output tile (`conv_wgmma`: the z-pair helper's stores).
pub const TILE_STATS: &str = include_str!("../../../../kernels/tile_stats.cuh");

/// One kernels/*.cu file, compiled by NVRTC as one module, or a large one as a few (its
/// generated instances shared out: [`super::units`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `conv_mma_*` and `convt_up_*`: the implicit GEMM on mma.sync (sm_80+).
    ConvMma,
    /// `conv_halo_*`: stride-1 3^3 convs from an smem halo.
    ConvHalo,
    /// `conv_wg_*` and `conv_wz_*`: the halo convs on wgmma, and `conv_wgk_*`: the implicit
    /// GEMM on wgmma (sm_90a only; kernels/wgmma.cuh, conv_wgmma.cu, conv_wgmma_z.cu and
    /// conv_wgmma_k.cu, one source).
    ConvWgmma,
    /// The memory-bound first layer (Cin 1) and head (1x1x1).
    ConvSmall,
    /// `conv_igemm_*`: the wmma implicit GEMM (transposed convs the mma path does not take).
    ConvWmmaLegacy,
    ConvTranspose,
    Norm,
    Eltwise,
    PoolResize,
    Blend,
    Pad,
    Tensor,
    Attention,
}

/// Every family, in load order.
pub const FAMILIES: [Family; 13] = [
    Family::ConvMma,
    Family::ConvHalo,
    Family::ConvWgmma,
    Family::ConvSmall,
    Family::ConvWmmaLegacy,
    Family::ConvTranspose,
    Family::Norm,
    Family::Eltwise,
    Family::PoolResize,
    Family::Blend,
    Family::Pad,
    Family::Tensor,
    Family::Attention,
];

impl Family {
    /// The file stem (`kernels/<name>.cu`), also the kernel cache file prefix.
    pub fn name(self) -> &'static str {
        match self {
            Family::ConvMma => "conv_mma",
            Family::ConvHalo => "conv_halo",
            Family::ConvWgmma => "conv_wgmma",
            Family::ConvSmall => "conv_small",
            Family::ConvWmmaLegacy => "conv_wmma_legacy",
            Family::ConvTranspose => "conv_transpose",
            Family::Norm => "norm",
            Family::Eltwise => "eltwise",
            Family::PoolResize => "pool_resize",
            Family::Blend => "blend",
            Family::Pad => "pad",
            Family::Tensor => "tensor",
            Family::Attention => "attention",
        }
    }

    /// The family's file as embedded: its kernels and entry macros, without the common prelude.
    pub fn file(self) -> &'static str {
        match self {
            Family::ConvMma => include_str!("../../../../kernels/conv_mma.cu"),
            Family::ConvHalo => include_str!("../../../../kernels/conv_halo.cu"),
            Family::ConvWgmma => concat!(
                include_str!("../../../../kernels/wgmma.cuh"),
                include_str!("../../../../kernels/conv_wgmma.cu"),
                include_str!("../../../../kernels/conv_wgmma_z.cu"),
                include_str!("../../../../kernels/conv_wgmma_k.cu")
            ),
            Family::ConvSmall => include_str!("../../../../kernels/conv_small.cu"),
            Family::ConvWmmaLegacy => include_str!("../../../../kernels/conv_wmma_legacy.cu"),
            Family::ConvTranspose => include_str!("../../../../kernels/conv_transpose.cu"),
            Family::Norm => include_str!("../../../../kernels/norm.cu"),
            Family::Eltwise => include_str!("../../../../kernels/eltwise.cu"),
            Family::PoolResize => include_str!("../../../../kernels/pool_resize.cu"),
            Family::Blend => include_str!("../../../../kernels/blend.cu"),
            Family::Pad => include_str!("../../../../kernels/pad.cu"),
            Family::Tensor => include_str!("../../../../kernels/tensor.cu"),
            Family::Attention => include_str!("../../../../kernels/attention.cu"),
        }
    }

    /// What NVRTC compiles for the family after the common prelude: [`MMA`] for the mma.sync
    /// families, [`TILE_STATS`] for the one whose epilogue takes norm statistics, its file,
    /// then the entry lines of its configuration tables ([`entry_lines`]), so a tile is listed
    /// once, here.
    pub fn source(self) -> String {
        format!("{}{}", self.head(), entry_lines(self))
    }

    /// The family's source before its generated entry lines (see [`Family::source`]).
    pub fn head(self) -> String {
        let mma = match self {
            Family::ConvMma
            | Family::ConvHalo
            | Family::ConvWgmma
            | Family::ConvSmall
            | Family::Attention => MMA,
            _ => "",
        };
        let stats = match self {
            Family::ConvWgmma => TILE_STATS,
            _ => "",
        };
        format!("{mma}{stats}{}\n", self.file())
    }

    /// The architecture NVRTC builds the family for on a device of architecture `arch`
    /// ("sm_90"), or None where the family does not run there: the wgmma family needs the
    /// arch-specific sm_90a and exists on compute capability 9.0 alone.
    pub fn target(self, arch: &str) -> Option<String> {
        match self {
            Family::ConvWgmma => has_wgmma(arch).then(|| "sm_90a".to_string()),
            _ => Some(arch.to_string()),
        }
    }

    /// Entry points the family defines: the plain kernels, then (conv) the config tables.
    pub fn entries(self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = KERNELS
            .iter()
            .filter(|k| k.family == self)
            .map(|k| k.name)
            .collect();
        match self {
            Family::ConvMma => {
                v.extend(MMA_CONFIGS.iter().map(|c| c.name));
                v.extend(UPSAMPLE_VEC.iter().map(|(_, u)| *u));
                v.extend(UPSAMPLE_VEC_ST.iter().map(|(_, u)| *u));
            }
            Family::ConvHalo => v.extend(HALO_CONFIGS.iter().map(|c| c.name)),
            Family::ConvWgmma => v.extend(
                wgmma_all()
                    .chain(STATS_TWINS)
                    .chain(NORM_LOAD_TWINS)
                    .map(|c| c.name)
                    .chain(WGK_CONFIGS.iter().map(|c| c.name)),
            ),
            _ => {}
        }
        v
    }
}

/// The family that defines kernel `name`, if one does.
pub fn family_of(name: &str) -> Option<Family> {
    FAMILIES.into_iter().find(|f| f.entries().contains(&name))
}

/// Whether the wgmma family (`conv_wg_*`) exists on a device of architecture `arch` ("sm_90"):
/// it is built for the arch-specific sm_90a, which runs on compute capability 9.0 alone.
pub fn has_wgmma(arch: &str) -> bool {
    arch == "sm_90"
}

/// A kernel launched with the shape the calling op computes (no tile table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub family: Family,
    pub name: &'static str,
}

const fn k(family: Family, name: &'static str) -> Kernel {
    Kernel { family, name }
}

/// The wmma implicit GEMM: BN 64 / 32, 16-byte or element gathers.
pub const CONV_IGEMM_N64_V8: Kernel = k(Family::ConvWmmaLegacy, "conv_igemm_n64_v8");
pub const CONV_IGEMM_N32_V8: Kernel = k(Family::ConvWmmaLegacy, "conv_igemm_n32_v8");
pub const CONV_IGEMM_N64_V1: Kernel = k(Family::ConvWmmaLegacy, "conv_igemm_n64_v1");
pub const CONV_IGEMM_N32_V1: Kernel = k(Family::ConvWmmaLegacy, "conv_igemm_n32_v1");
/// 1x1x1 conv with at most 16 / 32 outputs, one thread per voxel.
pub const CONV1X1_N16: Kernel = k(Family::ConvSmall, "conv1x1_n16");
pub const CONV1X1_N32: Kernel = k(Family::ConvSmall, "conv1x1_n32");
/// The same heads reading the norm before them, normalised and activated on load.
pub const CONV1X1_NORM_N16: Kernel = k(Family::ConvSmall, "conv1x1_norm_n16");
pub const CONV1X1_NORM_N32: Kernel = k(Family::ConvSmall, "conv1x1_norm_n32");
/// The four heads with the block's voxels loaded cooperatively through shared memory
/// (`CudaOptions::head_staged`; [`C1X1_STAGE_BYTES`] more shared memory).
pub const CONV1X1_N16_S: Kernel = k(Family::ConvSmall, "conv1x1_n16_s");
pub const CONV1X1_N32_S: Kernel = k(Family::ConvSmall, "conv1x1_n32_s");
pub const CONV1X1_NORM_N16_S: Kernel = k(Family::ConvSmall, "conv1x1_norm_n16_s");
pub const CONV1X1_NORM_N32_S: Kernel = k(Family::ConvSmall, "conv1x1_norm_n32_s");
/// The 16-wide heads on mma.sync, 16 voxels a warp (`CudaOptions::head_mma`: Cin 16 or 32,
/// Cout <= 16), and the twin reading the norm before them.
pub const CONV1X1_MMA_N16: Kernel = k(Family::ConvSmall, "conv1x1_mma_n16");
pub const CONV1X1_NORM_MMA_N16: Kernel = k(Family::ConvSmall, "conv1x1_norm_mma_n16");
/// Shared memory of a staged head's input rows: 256 threads x C1X1_SROW (36) floats
/// (kernels/conv_small.cu).
pub const C1X1_STAGE_BYTES: usize = 256 * 36 * 4;
/// Cin-1 3^3 conv on mma.sync, one block per 4x8x32 output tile.
pub const CONV_C1_K3: Kernel = k(Family::ConvSmall, "conv_c1_k3");
/// Output voxels (z, y, x) of one `conv_c1_k3` block: C1_TZ, C1_TY, C1_TX of kernels/conv_small.cu.
pub const C1_TILE: [usize; 3] = [4, 8, 32];
/// Its `_st` twin: the block also sums its stored values for a following norm
/// (`ConvParams::stats`, one entry per block, its tile `C1_TILE`).
pub const CONV_C1_K3_ST: Kernel = k(Family::ConvSmall, "conv_c1_k3_st");
/// The norm recomputed (`CudaOptions::norm_recompute`): `_sto` writes only the statistics,
/// `_nrm` runs the conv again and stores the norm's output (its pairs, as `conv1x1_norm_*`).
pub const CONV_C1_K3_STO: Kernel = k(Family::ConvSmall, "conv_c1_k3_sto");
pub const CONV_C1_K3_NRM: Kernel = k(Family::ConvSmall, "conv_c1_k3_nrm");
/// Direct (grouped / fallback transposed) conv, one thread per output.
pub const CONV_DIRECT: Kernel = k(Family::ConvTranspose, "conv_direct");
pub const NORM_PARTIAL_V8: Kernel = k(Family::Norm, "norm_partial_v8");
pub const NORM_PARTIAL: Kernel = k(Family::Norm, "norm_partial");
pub const NORM_FINALIZE: Kernel = k(Family::Norm, "norm_finalize");
/// `norm_finalize` from the per-tile statistics a conv's epilogue took (`ConvParams::stats`).
pub const NORM_FINALIZE_TILES: Kernel = k(Family::Norm, "norm_finalize_tiles");
pub const AFFINE_ACT: Kernel = k(Family::Norm, "affine_act");
pub const AFFINE_ACT_V8: Kernel = k(Family::Norm, "affine_act_v8");
pub const NORM_PARTIAL_FLAT8: Kernel = k(Family::Norm, "norm_partial_flat8");
pub const AFFINE_ACT_FLAT8: Kernel = k(Family::Norm, "affine_act_flat8");
/// The norm kernels on fp32 input (a conv output kept in fp32 for its norm).
pub const NORM_PARTIAL_F32: Kernel = k(Family::Norm, "norm_partial_f32");
pub const NORM_PARTIAL_V8_F32: Kernel = k(Family::Norm, "norm_partial_v8_f32");
pub const AFFINE_ACT_F32: Kernel = k(Family::Norm, "affine_act_f32");
pub const AFFINE_ACT_V8_F32: Kernel = k(Family::Norm, "affine_act_v8_f32");
/// The affine pass over a conv's output stored as fp16 less each tile's shift
/// (`CudaOptions::norm_shifted`).
pub const AFFINE_ACT_V8_SHIFTED: Kernel = k(Family::Norm, "affine_act_v8_shifted");
/// `affine_act_v8_shifted` by runs of voxels along x (`abi::NORM_RUN`), a run's shifts and pairs
/// loaded once (`CudaOptions::norm_runs`).
pub const AFFINE_ACT_V8_SHIFTED_RUNS: Kernel = k(Family::Norm, "affine_act_v8_shifted_runs");
pub const NORM_PARTIAL_FLAT8_F32: Kernel = k(Family::Norm, "norm_partial_flat8_f32");
pub const AFFINE_ACT_FLAT8_F32: Kernel = k(Family::Norm, "affine_act_flat8_f32");
pub const ACT_KERNEL: Kernel = k(Family::Eltwise, "act_kernel");
pub const BINARY_KERNEL: Kernel = k(Family::Eltwise, "binary_kernel");
pub const BINARY_CONST_KERNEL: Kernel = k(Family::Eltwise, "binary_const_kernel");
pub const CONCAT_COPY: Kernel = k(Family::Eltwise, "concat_copy");
pub const CONCAT_COPY_V8: Kernel = k(Family::Eltwise, "concat_copy_v8");
pub const BINARY_V8: Kernel = k(Family::Eltwise, "binary_v8");
pub const ACT_V8: Kernel = k(Family::Eltwise, "act_v8");
pub const COPY_HALF: Kernel = k(Family::Eltwise, "copy_half");
pub const FILL_HALF: Kernel = k(Family::Eltwise, "fill_half");
pub const SOFTMAX_CHANNELS: Kernel = k(Family::Eltwise, "softmax_channels");
pub const NCDHW_TO_NDHWC: Kernel = k(Family::Eltwise, "ncdhw_to_ndhwc");
pub const NDHWC_TO_NCDHW: Kernel = k(Family::Eltwise, "ndhwc_to_ncdhw");
/// One-input functions of `Pointwise` (GELU, Erf, Softplus, Clip...), one thread per element.
pub const POINTWISE_KERNEL: Kernel = k(Family::Eltwise, "pointwise_kernel");
/// Two-activation binaries with numpy broadcasting (gates, per-channel scales, Max/Min/Pow).
pub const BINARY_BCAST_KERNEL: Kernel = k(Family::Eltwise, "binary_bcast_kernel");
pub const POOL_KERNEL: Kernel = k(Family::PoolResize, "pool_kernel");
pub const RESIZE_KERNEL: Kernel = k(Family::PoolResize, "resize_kernel");
pub const BLEND_WINDOW_RING: Kernel = k(Family::Blend, "blend_window_ring");
pub const FINALIZE_PLANES: Kernel = k(Family::Blend, "finalize_planes");
pub const FINALIZE_PLANES_V4: Kernel = k(Family::Blend, "finalize_planes_v4");
pub const GATHER_WINDOW_RING: Kernel = k(Family::Blend, "gather_window_ring");
/// Windows gathered from a float32 volume already in device memory (the direct input).
pub const GATHER_WINDOW_F32: Kernel = k(Family::Blend, "gather_window_f32");
/// `convt_up_*`: the v8 mma tiles with a 16-byte staged scatter epilogue (see UPSAMPLE_VEC).
/// Pad / crop of an activation, one thread per output element.
pub const PAD_NDHWC: Kernel = k(Family::Pad, "pad_ndhwc");
/// Channel tiling (Tile / Expand along C).
pub const TILE_CHANNELS: Kernel = k(Family::Pad, "tile_channels");
/// Strided copy of up to 8 dims (Reshape, Transpose, Slice, Gather, Concat, layout changes).
pub const ND_COPY: Kernel = k(Family::Tensor, "nd_copy");
/// `nd_copy` in 16-byte units, where every run of the copy is whole 8-half groups.
pub const ND_COPY_V8: Kernel = k(Family::Tensor, "nd_copy_v8");
/// Binaries with numpy broadcasting at any rank; the `_const` one with an f32 constant.
pub const ND_BINARY: Kernel = k(Family::Tensor, "nd_binary");
pub const ND_BINARY_CONST: Kernel = k(Family::Tensor, "nd_binary_const");
/// Softmax over contiguous rows (a warp each) / over a strided axis (a thread per column).
pub const SOFTMAX_ROWS: Kernel = k(Family::Tensor, "softmax_rows");
pub const SOFTMAX_STRIDED: Kernel = k(Family::Tensor, "softmax_strided");
/// LayerNorm over contiguous rows (a warp each) / over a strided axis (a thread per column).
pub const LAYERNORM_ROWS: Kernel = k(Family::Tensor, "layernorm_rows");
pub const LAYERNORM_STRIDED: Kernel = k(Family::Tensor, "layernorm_strided");
/// Batched fp16 tensor-core GEMM (MatMul, Linear), 64x64 tiles of 128 threads.
pub const GEMM_WMMA: Kernel = k(Family::Tensor, "gemm_wmma");
/// Its fast path for vector-aligned operands (`GemmParams::vec8`): 128x64 tiles of 256
/// threads, 16-byte cp.async loads double-buffered.
pub const GEMM_WMMA_V8: Kernel = k(Family::Tensor, "gemm_wmma_v8");
/// Fused flash-style attention (kernels/attention.cu), one block per 64 query rows.
pub const ATTENTION_FWD: Kernel = k(Family::Attention, "attention_fwd");
/// The tensor-core attention (mma.sync, sm_80+) for q/k and v features up to 16, 32, 64: 64
/// query rows per block of 4 warps, one pass over the keys with the scores in registers.
pub const ATTENTION_MMA_D16: Kernel = k(Family::Attention, "attention_mma_d16");
pub const ATTENTION_MMA_D32: Kernel = k(Family::Attention, "attention_mma_d32");
pub const ATTENTION_MMA_D64: Kernel = k(Family::Attention, "attention_mma_d64");
/// The split-K conv's second launch (kernels/conv_mma.cu): the fp32 partials summed in split
/// order, bias, activation, the store.
pub const CONV_SPLITK_REDUCE: Kernel = k(Family::ConvMma, "conv_splitk_reduce");
/// The persistent kernel == stride == 2 transposed conv (kernels/conv_mma.cu, `ConvKernel::Up2`):
/// 256 threads, static shared memory, 64 input voxels a tile.
pub const CONVT_UP2_P: Kernel = k(Family::ConvMma, "convt_up2_p");
/// Its input voxels a tile (`UP2_TV` in the kernel), for sizing the grid only: the blocks walk
/// whatever tiles there are.
pub const UP2_TILE_VOXELS: usize = 64;
/// Its blocks an SM: two, though its launch bounds' 80 registers allow three (W1's 64 -> 32
/// under ncu: 112.8 us a window on two, 121.1 on three; L2-bound at ~80% either way, session 38).
pub const UP2_BLOCKS_PER_SM: usize = 2;
pub const CONVT_UP_M256N32_V8: Kernel = k(Family::ConvMma, "convt_up_m256n32_v8");
pub const CONVT_UP_M128N32_V8: Kernel = k(Family::ConvMma, "convt_up_m128n32_v8");
pub const CONVT_UP_M128N64_V8: Kernel = k(Family::ConvMma, "convt_up_m128n64_v8");
pub const CONVT_UP_M128N128_V8: Kernel = k(Family::ConvMma, "convt_up_m128n128_v8");
/// `_st` twins of the fused parity classes' tiles: they also write a following norm's statistics
/// per M tile (see UPSAMPLE_VEC_ST).
pub const CONVT_UP_M128N64_V8_ST: Kernel = k(Family::ConvMma, "convt_up_m128n64_v8_st");
pub const CONVT_UP_M128N128_V8_ST: Kernel = k(Family::ConvMma, "convt_up_m128n128_v8_st");

/// Every kernel outside the conv config tables, in load order within its family.
pub const KERNELS: &[Kernel] = &[
    CONV_IGEMM_N64_V8,
    CONV_IGEMM_N32_V8,
    CONV_IGEMM_N64_V1,
    CONV_IGEMM_N32_V1,
    CONV1X1_N16,
    CONV1X1_N32,
    CONV1X1_NORM_N16,
    CONV1X1_NORM_N32,
    CONV1X1_N16_S,
    CONV1X1_N32_S,
    CONV1X1_NORM_N16_S,
    CONV1X1_NORM_N32_S,
    CONV1X1_MMA_N16,
    CONV1X1_NORM_MMA_N16,
    CONV_C1_K3,
    CONV_C1_K3_ST,
    CONV_C1_K3_STO,
    CONV_C1_K3_NRM,
    CONV_DIRECT,
    CONV_SPLITK_REDUCE,
    CONVT_UP2_P,
    NORM_PARTIAL_V8,
    NORM_PARTIAL,
    NORM_FINALIZE,
    NORM_FINALIZE_TILES,
    AFFINE_ACT,
    AFFINE_ACT_V8,
    NORM_PARTIAL_FLAT8,
    AFFINE_ACT_FLAT8,
    NORM_PARTIAL_F32,
    NORM_PARTIAL_V8_F32,
    AFFINE_ACT_F32,
    AFFINE_ACT_V8_F32,
    AFFINE_ACT_V8_SHIFTED,
    AFFINE_ACT_V8_SHIFTED_RUNS,
    NORM_PARTIAL_FLAT8_F32,
    AFFINE_ACT_FLAT8_F32,
    ACT_KERNEL,
    BINARY_KERNEL,
    BINARY_CONST_KERNEL,
    CONCAT_COPY,
    CONCAT_COPY_V8,
    BINARY_V8,
    ACT_V8,
    COPY_HALF,
    FILL_HALF,
    SOFTMAX_CHANNELS,
    NCDHW_TO_NDHWC,
    NDHWC_TO_NCDHW,
    POINTWISE_KERNEL,
    BINARY_BCAST_KERNEL,
    POOL_KERNEL,
    RESIZE_KERNEL,
    BLEND_WINDOW_RING,
    FINALIZE_PLANES,
    FINALIZE_PLANES_V4,
    GATHER_WINDOW_RING,
    GATHER_WINDOW_F32,
    PAD_NDHWC,
    TILE_CHANNELS,
    ND_COPY,
    ND_COPY_V8,
    ND_BINARY,
    ND_BINARY_CONST,
    SOFTMAX_ROWS,
    SOFTMAX_STRIDED,
    LAYERNORM_ROWS,
    LAYERNORM_STRIDED,
    GEMM_WMMA,
    GEMM_WMMA_V8,
    ATTENTION_FWD,
    ATTENTION_MMA_D16,
    ATTENTION_MMA_D32,
    ATTENTION_MMA_D64,
];

/// One `conv_mma_*` kernel of kernels/conv_mma.cu (its MMA_ENTRY line).
#[derive(Debug, PartialEq, Eq)]
pub struct MmaConfig {
    pub name: &'static str,
    pub bm: usize,
    pub bn: usize,
    pub threads: u32,
    /// Warps along M (the others split N).
    pub wm: usize,
    pub stages: usize,
    /// Halves per A gather (8, 2 or 1): the kernel needs Cin % vw == 0.
    pub vw: usize,
}

impl MmaConfig {
    /// Dynamic shared memory: STAGES x (BM + BN) rows of 40 halves.
    pub fn smem_bytes(&self) -> u32 {
        (self.stages * (self.bm + self.bn) * 40 * 2) as u32
    }
}

/// An mma tile of `wm` x `wn` warps with 16-byte A gathers.
const fn mma(
    name: &'static str,
    bm: usize,
    bn: usize,
    wm: usize,
    wn: usize,
    stages: usize,
) -> MmaConfig {
    MmaConfig {
        name,
        bm,
        bn,
        threads: (wm * wn * 32) as u32,
        wm,
        stages,
        vw: 8,
    }
}

pub const CONV_MMA_M256N32_V8: MmaConfig = mma("conv_mma_m256n32_v8", 256, 32, 4, 1, 4);
pub const CONV_MMA_M128N32_V8: MmaConfig = mma("conv_mma_m128n32_v8", 128, 32, 4, 1, 4);
pub const CONV_MMA_M128N64_V8: MmaConfig = mma("conv_mma_m128n64_v8", 128, 64, 2, 2, 4);
pub const CONV_MMA_M128N128_V8: MmaConfig = mma("conv_mma_m128n128_v8", 128, 128, 2, 4, 4);
pub const CONV_MMA_M128N32_V2: MmaConfig = MmaConfig {
    vw: 2,
    ..mma("conv_mma_m128n32_v2", 128, 32, 4, 1, 4)
};
pub const CONV_MMA_M128N64_V2: MmaConfig = MmaConfig {
    vw: 2,
    ..mma("conv_mma_m128n64_v2", 128, 64, 2, 2, 4)
};
pub const CONV_MMA_M128N32_V1: MmaConfig = MmaConfig {
    vw: 1,
    ..mma("conv_mma_m128n32_v1", 128, 32, 4, 1, 3)
};
pub const CONV_MMA_M128N64_V1: MmaConfig = MmaConfig {
    vw: 1,
    ..mma("conv_mma_m128n64_v1", 128, 64, 2, 2, 3)
};

/// The mma tiles, in the order of their MMA_ENTRY lines.
pub const MMA_CONFIGS: &[MmaConfig] = &[
    CONV_MMA_M256N32_V8,
    CONV_MMA_M128N32_V8,
    CONV_MMA_M128N64_V8,
    CONV_MMA_M128N128_V8,
    CONV_MMA_M128N32_V2,
    CONV_MMA_M128N64_V2,
    CONV_MMA_M128N32_V1,
    CONV_MMA_M128N64_V1,
];

/// `conv_mma_*` tile -> its `convt_up_*` twin (same tile and shared memory, staged epilogue).
pub const UPSAMPLE_VEC: &[(&str, &str)] = &[
    (CONV_MMA_M256N32_V8.name, CONVT_UP_M256N32_V8.name),
    (CONV_MMA_M128N32_V8.name, CONVT_UP_M128N32_V8.name),
    (CONV_MMA_M128N64_V8.name, CONVT_UP_M128N64_V8.name),
    (CONV_MMA_M128N128_V8.name, CONVT_UP_M128N128_V8.name),
];

/// `convt_up_*` tile -> its `_st` twin (`ConvKernel::with_norm_stats` of the fused parity
/// classes: W2's 32 -> 14 at 128³ and the like, Cout x classes within one column tile).
pub const UPSAMPLE_VEC_ST: &[(&str, &str)] = &[
    (CONVT_UP_M128N64_V8.name, CONVT_UP_M128N64_V8_ST.name),
    (CONVT_UP_M128N128_V8.name, CONVT_UP_M128N128_V8_ST.name),
];

/// The `_st` twin of a `convt_up_*` kernel, if it has one (UPSAMPLE_VEC_ST).
pub fn upsample_vec_st_name(up: &str) -> Option<&'static str> {
    UPSAMPLE_VEC_ST
        .iter()
        .find(|(b, _)| *b == up)
        .map(|(_, t)| *t)
}

/// The `convt_up_*` twin of an mma tile, if it has one.
pub fn upsample_vec_name(mma: &str) -> Option<&'static str> {
    UPSAMPLE_VEC
        .iter()
        .find(|(m, _)| *m == mma)
        .map(|(_, u)| *u)
}

/// One halo conv kernel (`conv_halo_*` of kernels/conv_halo.cu, or with `wgmma` a `conv_wg_*` of
/// kernels/conv_wgmma.cu): stride-1 3^3 conv whose blocks load an output tile's input halo into
/// shared memory once for all 27 taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaloConfig {
    pub name: &'static str,
    /// Channels of a shared-memory halo / weight row (the conv's Cin, or see `pad_cin`).
    pub cin: usize,
    /// Also runs an even Cin below `cin` (4-byte copies, channels Cin..cin-1 zero in smem).
    pub pad_cin: bool,
    /// Output channels of the tile (Cout <= bn).
    pub bn: usize,
    pub threads: u32,
    /// Warps along the tile's voxels (the rest split the bn channels).
    pub wm: usize,
    /// Output voxels of one tile (z, y, x).
    pub tile: [usize; 3],
    /// Weight stages of one tap each (2: `conv_halo`'s double buffer); 0: all 27 taps resident.
    pub wst: usize,
    /// Halo buffers of the block (2: the next tile's halo is copied during the current one's
    /// math; a persistent `conv_wg_p` has two warpgroups, each with hb / 2 of them).
    pub hb: usize,
    /// Persistent blocks per SM (each loops over tiles); 0: one block per tile.
    pub persist: usize,
    /// A `conv_wg_*` kernel of kernels/conv_wgmma.cu (wgmma, sm_90a; one warpgroup, 8x8 faces,
    /// unpadded 16-byte rows), listed in [`WGMMA_CONFIGS`].
    pub wgmma: bool,
    /// wgmma: both operands' K step padded to an odd multiple of 64 bytes (bank experiment).
    pub wg_pad: bool,
    /// wgmma: the MMA loop run this many times (timing experiments only: > 1 gives wrong sums).
    pub wg_reps: usize,
    /// A `conv_wz_*` kernel of kernels/conv_wgmma_z.cu: the weights as wgmma's A operand (32
    /// output channels x 2 output planes), the halo as B; persistent, one warpgroup, `tile`
    /// [z, y, 8] walked a plane pair at a time (Cin = `cin` only, Cout tiles of 32).
    pub zpair: bool,
    /// How a z-pair kernel's helper stores the staged planes (`SM` in kernels/conv_wgmma_z.cu).
    pub stores: WzStores,
    /// A z-pair kernel whose helper loads the slots with tensor loads (TMA: `TL` in
    /// kernels/conv_wgmma_z.cu), from a tensor map of its input passed with each launch
    /// (`runtime::tma`).
    pub tma_loads: bool,
    /// Not measured yet: listed and compiled only with the `kernel-experiments` feature, never a
    /// default, run only when forced.
    pub experiment: bool,
    /// An `_st` twin ([`STATS_TWINS`]): the same kernel, whose epilogue also writes the
    /// statistics of a following InstanceNorm / GroupNorm per output tile
    /// (`ConvParams::stats`, kernels/tile_stats.cuh).
    pub stats: bool,
    /// An `_nl` twin ([`NORM_LOAD_TWINS`]): the same kernel, whose input is a norm's input,
    /// normalised and activated on load (`NormLoad` in kernels/common.cuh).
    pub norm_load: bool,
    /// The conv's stride on every axis: 1, or 2 for a `conv_halo_t` whose halo is the tile's
    /// reach at stride 2 (`CudaOptions::halo_s2`).
    pub stride: usize,
}

/// How the helper of a z-pair kernel stores the staged output planes (the `SM` of its entry,
/// `WZ_STORES` ... in kernels/conv_wgmma_z.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WzStores {
    /// Its own 16-byte stores after loading the rows; the rows go back after the stores.
    Staged = 0,
    /// The rows go back once loaded into registers, before the stores (`_h2e`); the statistics'
    /// flush then works in scratch of its own.
    ReleaseEarly = 1,
    /// One bulk copy (the TMA unit) per staged voxel where the output is fp32 and stored as
    /// staged (`_h2b`); the rows go back once the copies have read them.
    Bulk = 2,
}

/// Output voxels of the original halo tile (z, y, x).
pub const HALO_TILE: [usize; 3] = [4, 8, 8];

impl HaloConfig {
    /// Whether the kernel computes a conv with `cin` input channels: its smem width; an even Cin
    /// below it on the zero-padding configs; or (staged weights, width >= 32)
    /// Cin = k * width in chunks of width channels. Resident weights hold the 27 taps of one
    /// chunk only, so those need Cin <= width.
    pub fn accepts_cin(&self, cin: usize) -> bool {
        cin == self.cin
            || (self.pad_cin && cin > 0 && cin.is_multiple_of(2) && cin < self.cin)
            || (self.wst != 0 && self.cin >= 32 && cin > 0 && cin.is_multiple_of(self.cin))
    }

    /// Rows of one halo buffer: the tile's reach through the 3^3 kernel at its stride.
    pub fn halo_rows(&self) -> usize {
        self.tile
            .iter()
            .map(|t| (t - 1) * self.stride + 3)
            .product()
    }

    /// Dynamic shared memory: the weights (resident: bn rows of 27 * Cin + 8 halves; staged:
    /// wst x bn rows of Cin + 8) and hb halo buffers of Cin + 8 halves per row.
    pub fn smem_bytes(&self) -> u32 {
        if self.zpair {
            // conv_wgmma_z.cu: 4 weight blocks of 32 rows per (dy dx, channel group) and one
            // zero block, 5 slots of two halo planes, two planes' fp32 staging (36-float rows),
            // 6 mbarriers (the slots' and the weights'); with early release, the flush's
            // scratch (`tile_stats_floats<256, 4>()` in kernels/tile_stats.cuh: 8 warps x 4
            // chunks x 16 floats + 32 shifts).
            let g = self.cin / 8;
            let plane = (self.tile[1] + 2) * 10;
            let n = 8 * self.tile[1];
            let flush = if self.stores == WzStores::ReleaseEarly {
                (8 * 4 * 16 + 32) * 4
            } else {
                0
            };
            return (((9 * g * 4 + 1) * 32 * 8 + 5 * g * 2 * plane * 8) * 2
                + 2 * n * 36 * 4
                + 6 * 8
                + flush) as u32;
        }
        if self.wgmma {
            // conv_wgmma.cu: 27 resident taps or `wst` one-tap stages, then the halo, all in
            // unpadded 16-byte rows.
            let taps = if self.wst == 0 { 27 } else { self.wst };
            let (bn, rows) = if self.wg_pad {
                (
                    self.bn + 4,
                    self.halo_rows() + (12 - self.halo_rows() % 8) % 8,
                )
            } else {
                (self.bn, self.halo_rows())
            };
            return ((taps * bn + self.hb * rows) * self.cin * 2) as u32;
        }
        let w = if self.wst == 0 {
            self.bn * (27 * self.cin + 8)
        } else {
            self.wst * self.bn * (self.cin + 8)
        };
        ((w + self.hb * self.halo_rows() * (self.cin + 8)) * 2) as u32
    }

    /// Output tiles of an n x d x h x w output.
    pub fn tiles(&self, n: usize, out: [usize; 3]) -> usize {
        box_tiles(n, out, self.tile)
    }

    /// grid.y: the bn-wide output-channel tiles of a Cout-channel conv (the weight rows are
    /// padded to MMA_N_PAD, a multiple of every bn, so the last tile reads padding).
    pub fn cout_tiles(&self, cout: usize) -> u32 {
        cout.div_ceil(self.bn).max(1) as u32
    }

    /// Grid size: one block per tile, or `persist` blocks per SM (never more than the tiles).
    pub fn grid(&self, n: usize, out: [usize; 3], sm_count: usize) -> u32 {
        let t = self.tiles(n, out);
        let g = if self.persist == 0 {
            t
        } else {
            t.min(self.persist * sm_count.max(1))
        };
        g.max(1) as u32
    }
}

/// Tiles of `tile` ([z, y, x]) over `n` samples of `out` voxels, partial tiles counted: the
/// halo, `conv_wgk_*` and Cin-1 kernels' blocks (`tile_origin` in kernels/mma.cuh).
pub fn box_tiles(n: usize, out: [usize; 3], tile: [usize; 3]) -> usize {
    n * (0..3).map(|i| out[i].div_ceil(tile[i])).product::<usize>()
}

/// A `conv_wgk_*` kernel (kernels/conv_wgmma_k.cu): a conv of stride `stride` on every axis
/// with Cin a multiple of `ck` as an implicit GEMM on wgmma fed by tensor loads. Tiles of
/// 128 output voxels (a `tile` box, [z, y, x]) by `bn` output channels (grid.y over them), a
/// ring of `stages` k-steps (one tap's `ck` input channels each: a row of the 128-byte swizzle
/// at 64, of the 64-byte one at 32), [`WGK_THREADS`] threads (a producer warpgroup and two of
/// the MMA), one block an SM. `up`: the fused parity classes of a strided transposed conv
/// (`conv_wgk_up_*`: rows are input voxels, columns class x Cout, a staged scatter epilogue).
/// `stats`: the `_st` twin, whose epilogue also writes a following norm's statistics per tile
/// (kernels/tile_stats.cuh's layout; `ConvKernel::with_norm_stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgkConfig {
    pub name: &'static str,
    pub bn: usize,
    pub stages: usize,
    pub tile: [usize; 3],
    pub stride: usize,
    pub ck: usize,
    pub up: bool,
    pub stats: bool,
}

/// Threads of a `conv_wgk_*` block.
pub const WGK_THREADS: u32 = 384;

impl WgkConfig {
    /// Dynamic shared memory: the stages (A's 128 rows and B's `bn`, `ck` halves each), 1 KB
    /// to align them to the swizzle, two mbarriers a stage. (An `up` kernel stages its tile in
    /// the stages' bytes: `wgk_up_floats` in the kernel checks that it fits.)
    pub const fn smem_bytes(&self) -> u32 {
        (self.stages * (128 + self.bn) * self.ck * 2 + 1024 + 16 * self.stages) as u32
    }

    /// Whether it runs Cin `cin` (whole k-steps of `ck` channels) within `smem_max` bytes of
    /// shared memory.
    pub fn fits(&self, cin: usize, smem_max: usize) -> bool {
        cin > 0 && cin.is_multiple_of(self.ck) && self.smem_bytes() as usize <= smem_max
    }

    /// Output tiles of `n` samples of `out` voxels (grid.x).
    pub fn tiles(&self, n: usize, out: [usize; 3]) -> usize {
        box_tiles(n, out, self.tile)
    }

    /// Output-channel tiles of `cout` (grid.y).
    pub fn cout_tiles(&self, cout: usize) -> usize {
        cout.div_ceil(self.bn)
    }
}

/// Cout 129..256 (W1's 16³ convs): 4 stages of 48 KB.
pub const CONV_WGK_N256: WgkConfig = wgk("conv_wgk_n256", 256, 4, 1);
/// Cout up to 128 (W1's 32³ convs): 6 stages of 32 KB.
pub const CONV_WGK_N128: WgkConfig = wgk("conv_wgk_n128", 128, 6, 1);
/// The two at stride 2 (W1's 128 -> 256 and 64 -> 128).
pub const CONV_WGK_N256_S2: WgkConfig = wgk("conv_wgk_n256_s2", 256, 4, 2);
pub const CONV_WGK_N128_S2: WgkConfig = wgk("conv_wgk_n128_s2", 128, 6, 2);
/// The fused parity classes of a k3 s2 transposed conv with Cin 32k and classes x Cout up to
/// 128 (W2's 32 -> 14 and 64 -> 16 at 128³ / 64³): 5 stages of 16 KB, the tile staged in them.
pub const CONV_WGK_UP_N128: WgkConfig = WgkConfig {
    ck: 32,
    up: true,
    ..wgk("conv_wgk_up_n128", 128, 5, 1)
};
/// The `conv_wgk_*` kernels, widest first, then their `_st` twins ([`wgk_stats_twin`]), then
/// the fused parity classes' kernel and its twin.
pub const WGK_CONFIGS: &[WgkConfig] = &[
    CONV_WGK_N256,
    CONV_WGK_N128,
    CONV_WGK_N256_S2,
    CONV_WGK_N128_S2,
    WgkConfig {
        name: "conv_wgk_n256_st",
        stats: true,
        ..CONV_WGK_N256
    },
    WgkConfig {
        name: "conv_wgk_n128_st",
        stats: true,
        ..CONV_WGK_N128
    },
    WgkConfig {
        name: "conv_wgk_n256_s2_st",
        stats: true,
        ..CONV_WGK_N256_S2
    },
    WgkConfig {
        name: "conv_wgk_n128_s2_st",
        stats: true,
        ..CONV_WGK_N128_S2
    },
    CONV_WGK_UP_N128,
    WgkConfig {
        name: "conv_wgk_up_n128_st",
        stats: true,
        ..CONV_WGK_UP_N128
    },
];

const fn wgk(name: &'static str, bn: usize, stages: usize, stride: usize) -> WgkConfig {
    WgkConfig {
        name,
        bn,
        stages,
        tile: [1, 8, 16],
        stride,
        ck: 64,
        up: false,
        stats: false,
    }
}

/// The `_st` twin of `conv_wgk_*` kernel `c`: the same kernel and launch, writing the norm
/// statistics too.
pub fn wgk_stats_twin(c: &WgkConfig) -> Option<&'static WgkConfig> {
    WGK_CONFIGS
        .iter()
        .find(|t| t.stats && t.name.strip_suffix("_st") == Some(c.name))
}

/// The `conv_wgk_*` config named `name`.
pub fn wgk_config(name: &str) -> Option<&'static WgkConfig> {
    WGK_CONFIGS.iter().find(|c| c.name == name)
}

/// The `conv_halo_*` config named `name` (the launch needs its tile and grid).
pub fn halo_config(name: &str) -> Option<&'static HaloConfig> {
    halo_all().find(|c| c.name == name)
}

/// Every halo-tile kernel: the `conv_halo_*` table, the wgmma ones, the `_st` and `_nl` twins.
pub fn halo_all() -> impl Iterator<Item = &'static HaloConfig> {
    HALO_CONFIGS
        .iter()
        .chain(wgmma_all())
        .chain(STATS_TWINS)
        .chain(NORM_LOAD_TWINS)
}

/// A HALO_ENTRY kernel (`conv_halo`): 4x8x8 tile, 2 weight stages, one block per tile, `wm` x
/// `wn` warps. The HALO2_ENTRY ones (`conv_halo_t`) override tile, stages, buffers, persistence.
const fn halo(name: &'static str, cin: usize, bn: usize, wm: usize, wn: usize) -> HaloConfig {
    HaloConfig {
        name,
        cin,
        pad_cin: false,
        bn,
        threads: (wm * wn * 32) as u32,
        wm,
        tile: HALO_TILE,
        wst: 2,
        hb: 1,
        persist: 0,
        wgmma: false,
        wg_pad: false,
        wg_reps: 1,
        zpair: false,
        stores: WzStores::Staged,
        tma_loads: false,
        experiment: false,
        stats: false,
        norm_load: false,
        stride: 1,
    }
}

// Defaults (measured, PERF_NOTES.md): K1 on `_w4` 218.8 vs 209.8 TF/s.
pub const CONV_HALO_C32N32_W4: HaloConfig = halo("conv_halo_c32n32_w4", 32, 32, 4, 1);
pub const CONV_HALO_C64N32: HaloConfig = halo("conv_halo_c64n32", 64, 32, 8, 1);
pub const CONV_HALO_C64N64: HaloConfig = halo("conv_halo_c64n64", 64, 64, 4, 2);
pub const CONV_HALO_C32N64: HaloConfig = halo("conv_halo_c32n64", 32, 64, 4, 2);
// Measured alternatives (8 warps of 32x32 for Cin 32; 4 warps of 64x32 for Cin 64: less smem
// read per mma, fewer warps per block).
pub const CONV_HALO_C32N32: HaloConfig = halo("conv_halo_c32n32", 32, 32, 8, 1);
// Cin = k x 48, Cout <= 48 (the 48-feature stages of SwinUNETR 48, whose 48->48 convs at 96^3
// otherwise take the implicit GEMM at ~125 TF/s): 2 x 3 warps, so the vector epilogue's six
// 8-channel chunks divide the 192 threads.
pub const CONV_HALO_C48N48: HaloConfig = halo("conv_halo_c48n48", 48, 48, 2, 3);
pub const CONV_HALO_C64N32_W4: HaloConfig = halo("conv_halo_c64n32_w4", 64, 32, 4, 1);
// Experiments (`kernel-experiments` only): `conv_halo_t` variants not measured yet, run only when
// forced (each needs more smem than the default of its Cin and width). Resident weights, 4x8x8
// tile, 4 warps of 64x32: one block per tile / persistent (2 per SM).
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_R: HaloConfig = HaloConfig {
    experiment: true,
    wst: 0,
    ..halo("conv_halo_c32n32_r", 32, 32, 4, 1)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_RP: HaloConfig = HaloConfig {
    experiment: true,
    wst: 0,
    persist: 2,
    ..halo("conv_halo_c32n32_rp", 32, 32, 4, 1)
};
// Resident weights, persistent (1 per SM), double-buffered halo: 4x8x8 x 8 warps of 32x32, and
// the bigger 8x8x8 tile (halo 1000 rows per 512 outputs) x 8 warps of 64x32.
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_RP2: HaloConfig = HaloConfig {
    experiment: true,
    wst: 0,
    hb: 2,
    persist: 1,
    ..halo("conv_halo_c32n32_rp2", 32, 32, 8, 1)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_RB: HaloConfig = HaloConfig {
    experiment: true,
    tile: [8, 8, 8],
    wst: 0,
    hb: 2,
    persist: 1,
    ..halo("conv_halo_c32n32_rb", 32, 32, 8, 1)
};
// Staged weights with 4 stages (3 taps in flight): the deeper pipeline without residency.
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_S4: HaloConfig = HaloConfig {
    experiment: true,
    wst: 4,
    ..halo("conv_halo_c32n32_s4", 32, 32, 4, 1)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C64N32_S4: HaloConfig = HaloConfig {
    experiment: true,
    wst: 4,
    ..halo("conv_halo_c64n32_s4", 64, 32, 4, 1)
};
// Cin 64, Cout 32: resident weights (111 KB), persistent (1 per SM), 8 warps of 32x32.
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C64N32_RP: HaloConfig = HaloConfig {
    experiment: true,
    wst: 0,
    persist: 1,
    ..halo("conv_halo_c64n32_rp", 64, 32, 8, 1)
};
// Cin 64, Cout 64: 8x8x8 tile, 3 weight stages, 8 warps of 128x32 (4 taps' work per barrier).
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C64N64_B: HaloConfig = HaloConfig {
    experiment: true,
    tile: [8, 8, 8],
    wst: 3,
    ..halo("conv_halo_c64n64_b", 64, 64, 4, 2)
};
// More outputs per per-tap barrier at the same 16 warps per SM as `_w4` (2 blocks of 8 warps
// of 64x32, ~91 / ~85 KB): 4x8x16 (halo 1080 rows per 512) and 8x8x8 (1000 per 512).
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_X16: HaloConfig = HaloConfig {
    experiment: true,
    tile: [4, 8, 16],
    ..halo("conv_halo_c32n32_x16", 32, 32, 8, 1)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_HALO_C32N32_Y8: HaloConfig = HaloConfig {
    experiment: true,
    tile: [8, 8, 8],
    ..halo("conv_halo_c32n32_y8", 32, 32, 8, 1)
};
// Smem width 16 for Cin 16 and even Cin < 16 zero-padded (`pad_cin`; W2's 14->14 at 128^3),
// Cout <= 16 / <= 32. Default for Cout <= 16: resident weights (14 KB, 43 KB per block, 5
// blocks/SM, no per-tap barrier), predicted fastest (PERF_NOTES.md); `_rp2` persistent (3 per
// SM) with the next tile's halo copied during the current one's math.
pub const CONV_HALO_C16N16_R: HaloConfig = HaloConfig {
    pad_cin: true,
    wst: 0,
    ..halo("conv_halo_c16n16_r", 16, 16, 4, 1)
};
pub const CONV_HALO_C16N16: HaloConfig = HaloConfig {
    pad_cin: true,
    ..halo("conv_halo_c16n16", 16, 16, 4, 1)
};
pub const CONV_HALO_C16N16_W8: HaloConfig = HaloConfig {
    pad_cin: true,
    ..halo("conv_halo_c16n16_w8", 16, 16, 8, 1)
};
pub const CONV_HALO_C16N16_RP2: HaloConfig = HaloConfig {
    pad_cin: true,
    wst: 0,
    hb: 2,
    persist: 3,
    ..halo("conv_halo_c16n16_rp2", 16, 16, 4, 1)
};
pub const CONV_HALO_C16N32: HaloConfig = HaloConfig {
    pad_cin: true,
    ..halo("conv_halo_c16n32", 16, 32, 4, 1)
};
// Cin = k x width: two halo buffers, the next Cin chunk's halo copied during this chunk's taps:
// Cin-64 chunks at 1 block per SM (191 KB, sm_90 only), Cin-32 chunks at 2.
pub const CONV_HALO_C64N64_H2: HaloConfig = HaloConfig {
    hb: 2,
    ..halo("conv_halo_c64n64_h2", 64, 64, 4, 2)
};
pub const CONV_HALO_C32N64_H2: HaloConfig = HaloConfig {
    hb: 2,
    ..halo("conv_halo_c32n64_h2", 32, 64, 4, 2)
};

/// The halo kernels. ORDER = PREFERENCE: `select::pick_halo` takes the first entry that
/// accepts the conv's Cin at its tile width and whose smem fits the device, so the default for
/// a (Cin, width) is its first line here; the others run only when forced
/// (`CudaOptions::halo_tile`) or where the ones above do not fit. To make a variant the default,
/// move its line above the current default of its (Cin, width), and an experiment out of its
/// `cfg` once measured (PERF_NOTES.md).
pub const HALO_CONFIGS: &[HaloConfig] = &[
    CONV_HALO_C32N32_W4,
    CONV_HALO_C64N32,
    CONV_HALO_C64N64,
    CONV_HALO_C32N64,
    CONV_HALO_C32N32,
    CONV_HALO_C64N32_W4,
    CONV_HALO_C48N48,
    // Experiments: forced only (`kernel-experiments`).
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_R,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_RP,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_RP2,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_RB,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_S4,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C64N32_S4,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C64N32_RP,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C64N64_B,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_X16,
    #[cfg(feature = "kernel-experiments")]
    CONV_HALO_C32N32_Y8,
    CONV_HALO_C16N16_R,
    CONV_HALO_C16N16,
    CONV_HALO_C16N16_W8,
    CONV_HALO_C16N16_RP2,
    CONV_HALO_C16N32,
    CONV_HALO_C64N64_H2,
    CONV_HALO_C32N64_H2,
    CONV_HALO_C32N64_S2,
];

/// Stride-2 3^3 convs with Cin = k x 32 (`CudaOptions::halo_s2`; not measured yet): a 2x4x8
/// output tile whose 5x9x17 input halo (61 KB) is copied once, 4 warps of 32x32, two weight
/// stages (71 KB in all: 3 blocks per SM). W1's 32 -> 64 at 128³ -> 64³ runs on the implicit
/// GEMM at ~130 TF/s, which gathers each input voxel for every output whose taps reach it.
pub const CONV_HALO_C32N64_S2: HaloConfig = HaloConfig {
    tile: [2, 4, 8],
    stride: 2,
    ..halo("conv_halo_c32n64_s2", 32, 64, 2, 2)
};

/// A `conv_wg_*` kernel: one warpgroup, a tile of `tz` 8x8 output faces, resident weights
/// (`wst` 0) or a ring of `wst` one-tap stages.
const fn wg(name: &'static str, cin: usize, bn: usize, tz: usize, wst: usize) -> HaloConfig {
    HaloConfig {
        name,
        cin,
        pad_cin: false,
        bn,
        threads: 128,
        wm: 4,
        tile: [tz, 8, 8],
        wst,
        hb: 1,
        persist: 0,
        wgmma: true,
        wg_pad: false,
        wg_reps: 1,
        zpair: false,
        stores: WzStores::Staged,
        tma_loads: false,
        experiment: false,
        stats: false,
        norm_load: false,
        stride: 1,
    }
}

/// The persistent `conv_wg_p` kernel: two warpgroups per block, one block per SM, resident
/// weights, two halo buffers per warpgroup (`hb` 4).
const fn wgp(name: &'static str, cin: usize, bn: usize) -> HaloConfig {
    HaloConfig {
        threads: 256,
        hb: 4,
        persist: 1,
        ..wg(name, cin, bn, 4, 0)
    }
}

/// A `conv_wz_*` kernel (kernels/conv_wgmma_z.cu): Cin `cin`, persistent blocks of one
/// warpgroup walking tiles of `zt` x `ny` x 8 output voxels, five ring slots of two halo planes.
const fn wz(name: &'static str, cin: usize, ny: usize, zt: usize) -> HaloConfig {
    HaloConfig {
        tile: [zt, ny, 8],
        hb: 5,
        persist: 1,
        zpair: true,
        ..wg(name, cin, 32, zt, 0)
    }
}

pub const CONV_WZ_C32_Y16: HaloConfig = wz("conv_wz_c32_y16", 32, 16, 16);
pub const CONV_WZ_C32_Y8: HaloConfig = wz("conv_wz_c32_y8", 32, 8, 16);
pub const CONV_WZ_C16_Y16: HaloConfig = wz("conv_wz_c16_y16", 16, 16, 16);
/// The MMA warpgroup and a helper (`wz_run_h`) that copies the slots and stores the staged planes
/// beside the MMA chain: one helper warpgroup (`threads` 256) or two (384; 168 registers, the
/// cap, no spills). K1 (session 18): `_h2` 0.604 ms, `_h` 0.688, one warpgroup 0.779.
pub const CONV_WZ_C32_Y16_H: HaloConfig = HaloConfig {
    threads: 256,
    ..wz("conv_wz_c32_y16_h", 32, 16, 16)
};
pub const CONV_WZ_C32_Y16_H2: HaloConfig = HaloConfig {
    threads: 384,
    ..wz("conv_wz_c32_y16_h2", 32, 16, 16)
};
/// `_h2` whose helper takes its staged rows into registers and hands the rows back before
/// storing them, so the MMA warpgroup's next staging waits only for those loads (session 31's
/// ncu of `_h2_st`: ~23% of the MMA warps' samples at the staging rows' barrier). Forced only
/// until measured against `_h2`.
pub const CONV_WZ_C32_Y16_H2E: HaloConfig = HaloConfig {
    name: "conv_wz_c32_y16_h2e",
    stores: WzStores::ReleaseEarly,
    ..CONV_WZ_C32_Y16_H2
};
/// `_h2` whose staged planes the TMA unit stores (one bulk copy per voxel) where the output
/// is fp32 and stored as staged, the helper only reading them for the statistics (session 31's
/// ncu of `_h2_st`: the helper's warps at `lg_throttle`, the MMA warps waiting on its stores).
/// Run with `zpair_tma` off and `zpair_bulk` on ([`zpair_variant`]): W1's forward 1.017x of
/// `_h2`'s (session 34; its `_st` twin 9% slower, the plain one 5% faster).
pub const CONV_WZ_C32_Y16_H2B: HaloConfig = HaloConfig {
    name: "conv_wz_c32_y16_h2b",
    stores: WzStores::Bulk,
    ..CONV_WZ_C32_Y16_H2
};
/// `_h2b` whose helper loads each slot with four tensor loads (TMA: one thread, zeros outside
/// the input from the TMA unit) rather than ~6 16-byte `cp.async` copies a thread (session 31's
/// ncu: ~60% of the helper's instructions; the MMA warps ~12% waiting on the slots). The
/// default z-pair kernel (`WGMMA_CONFIGS`; W1's forward 0.986x of `_h2`'s, session 34).
pub const CONV_WZ_C32_Y16_H2T: HaloConfig = HaloConfig {
    name: "conv_wz_c32_y16_h2t",
    tma_loads: true,
    ..CONV_WZ_C32_Y16_H2B
};
/// `_h2t` whose helper stores the staged planes itself (tensor loads only), for the `_st`
/// twin (`CudaOptions::zpair_st_staged`): that helper reads every row for the statistics
/// anyway, and with bulk stores also waits for the TMA unit to have read them (session 34 on
/// W1's 128³ `_st` launches: `_h2t_st` 3.672 ms, `_h2_st` 3.580). Forced only until measured.
pub const CONV_WZ_C32_Y16_H2L: HaloConfig = HaloConfig {
    name: "conv_wz_c32_y16_h2l",
    tma_loads: true,
    ..CONV_WZ_C32_Y16_H2
};
pub const CONV_WZ_C32_Y8_H: HaloConfig = HaloConfig {
    threads: 256,
    ..wz("conv_wz_c32_y8_h", 32, 8, 16)
};

pub const CONV_WG_C32N32_P: HaloConfig = wgp("conv_wg_c32n32_p", 32, 32);
pub const CONV_WG_C16N16_P: HaloConfig = HaloConfig {
    pad_cin: true,
    ..wgp("conv_wg_c16n16_p", 16, 16)
};
pub const CONV_WG_C16N32_P: HaloConfig = HaloConfig {
    pad_cin: true,
    ..wgp("conv_wg_c16n32_p", 16, 32)
};
pub const CONV_WG_C32N32_R: HaloConfig = wg("conv_wg_c32n32_r", 32, 32, 4, 0);
pub const CONV_WG_C16N16_R: HaloConfig = HaloConfig {
    pad_cin: true,
    ..wg("conv_wg_c16n16_r", 16, 16, 4, 0)
};
/// `conv_wg_c16n16_r` with 8 planes a tile (46 KB of smem, 4 blocks per SM): half the weight
/// copies and 10/8 rather than 6/4 halo planes per output plane, against 64 accumulators a
/// thread and fewer blocks in flight. Measured against `_r` on W2's layers (H100, session 29):
/// 14 -> 14 at 4x128³ 0.611 against 0.673 ms, 16 -> 16 at 4x64³ 0.103 against 0.123.
pub const CONV_WG_C16N16_R8: HaloConfig = HaloConfig {
    pad_cin: true,
    ..wg("conv_wg_c16n16_r8", 16, 16, 8, 0)
};
pub const CONV_WG_C16N32_R: HaloConfig = HaloConfig {
    pad_cin: true,
    ..wg("conv_wg_c16n32_r", 16, 32, 4, 0)
};
pub const CONV_WG_C64N32_S4: HaloConfig = wg("conv_wg_c64n32_s4", 64, 32, 4, 4);
pub const CONV_WG_C32N32_S4: HaloConfig = wg("conv_wg_c32n32_s4", 32, 32, 4, 4);
pub const CONV_WG_C64N64_S4: HaloConfig = wg("conv_wg_c64n64_s4", 64, 64, 4, 4);
pub const CONV_WG_C32N64_S4: HaloConfig = wg("conv_wg_c32n64_s4", 32, 64, 4, 4);
/// Stride-2 3^3 convs with Cin k x 32 on wgmma: a 2x8x8 output tile, its 5x17x17 reach stored
/// by parity class (kernels/conv_wgmma.cu), four one-tap weight stages; 106 KB, two blocks per
/// SM. Forced only: slower than the implicit GEMM (session 36, H100: W1's 32 -> 64 at 128³
/// 1.079 against 0.865 ms, 64 -> 128 at 64³ 0.492 against 0.314): every tile streams all 27
/// taps' weights.
pub const CONV_WG_C32N64_S2: HaloConfig = HaloConfig {
    stride: 2,
    ..wg("conv_wg_c32n64_s2", 32, 64, 2, 4)
};
/// `conv_wg_c32n64_s2` with one output plane a tile (3x17x17 reach, 70 KB, three blocks per
/// SM): forced only, for the comparison.
pub const CONV_WG_C32N64_S2Z1: HaloConfig = HaloConfig {
    stride: 2,
    ..wg("conv_wg_c32n64_s2z1", 32, 64, 1, 4)
};
/// Stride-2 3^3 convs with Cin 32 on wgmma (`CudaOptions::wg_s2`): persistent, the 27 taps'
/// weights resident (108 KB, loaded once a block), two warpgroups with one 3x17x17 halo buffer
/// each (one output plane a tile, its reach stored by parity class), 216 KB, one block per SM.
/// W1's 32 -> 64 conv at 128³ -> 64³: 0.595 ms against the implicit GEMM's 0.865 (H100, session
/// 36; the GEMM gathers each input voxel for each of the ~3.4 outputs that reach it, and every
/// 128-row tile streams all the weights). Cin 64 does not fit (its weights alone 216 KB).
pub const CONV_WG_C32N64_S2P: HaloConfig = HaloConfig {
    stride: 2,
    hb: 2,
    tile: [1, 8, 8],
    ..wgp("conv_wg_c32n64_s2p", 32, 64)
};

/// The wgmma halo kernels (kernels/conv_wgmma.cu, conv_wgmma_z.cu) the planner takes before
/// [`HALO_CONFIGS`] on compute capability 9.0 (`ArchCaps::conv_wgmma`). ORDER = PREFERENCE, as
/// there. Measured (PERF_NOTES.md): the z-pair kernel with its two-warpgroup helper on K1 (Cin
/// 32 -> 32) 0.60 ms against `conv_halo_c32n32_w4`'s 0.94 (session 18); the width-16 resident
/// kernel beats `conv_halo_c16n16_r` on W2's 14->14 at 128^3 (0.95 vs 1.24 ms) and ties it at
/// 64^3 (session 13); with 8 planes a tile (`_r8`) it beats the 4-plane `_r` (session 29).
/// The z-pair kernel is `_h2t` (tensor loads, bulk stores: W1's forward 0.986x of `_h2`'s on an
/// H200, session 34); `CudaOptions::zpair_tma` off runs `_h2` or `_h2b` ([`zpair_variant`]).
/// Stride-2 convs take `conv_wg_c32n64_s2p` only with `CudaOptions::wg_s2` (`ConvKernel::choose`).
pub const WGMMA_CONFIGS: &[HaloConfig] =
    &[CONV_WZ_C32_Y16_H2T, CONV_WG_C16N16_R8, CONV_WG_C32N64_S2P];

/// wgmma kernels that run only when forced (`CudaOptions::halo_tile`): those measured slower than
/// `conv_halo_*` on the same layers (PERF_NOTES.md, session 13: K1 on `_p` 1.11, `_s4` 1.09,
/// `_r` 1.43 ms against 0.94; the width-16 persistent one 1.28 against 0.95; session 18: the
/// z-pair `_y16_h` 0.69, `_y16` 0.78, `_y8_h` 0.75, `_y8` 0.85 against `_y16_h2`'s 0.60), the
/// ones not measured against a twin (`c16n32_r`, `conv_wz_c16_y16`), `c16n16_r` (slower than its
/// 8-plane `_r8`, session 29), and the experiments.
pub const WGMMA_FORCED: &[HaloConfig] = &[
    CONV_WZ_C32_Y16_H2,
    CONV_WZ_C32_Y16_H2E,
    CONV_WZ_C32_Y16_H2B,
    CONV_WZ_C32_Y16_H2L,
    CONV_WZ_C32_Y16_H,
    CONV_WZ_C32_Y16,
    CONV_WZ_C32_Y8_H,
    CONV_WZ_C32_Y8,
    CONV_WZ_C16_Y16,
    CONV_WG_C32N32_P,
    CONV_WG_C16N16_P,
    CONV_WG_C16N32_P,
    CONV_WG_C16N16_R,
    CONV_WG_C32N32_R,
    CONV_WG_C16N32_R,
    CONV_WG_C64N32_S4,
    CONV_WG_C64N64_S4,
    CONV_WG_C32N64_S4,
    CONV_WG_C32N32_S4,
    CONV_WG_C32N64_S2,
    CONV_WG_C32N64_S2Z1,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C32N32_RP,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C32N32_S4P,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C32N32_R8,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C32N32_RX2,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C32N32_S4X2,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C64N64_S4P,
    #[cfg(feature = "kernel-experiments")]
    CONV_WG_C16N16_RP,
];

/// Every wgmma kernel: the defaults, then the forced-only ones.
pub fn wgmma_all() -> impl Iterator<Item = &'static HaloConfig> {
    WGMMA_CONFIGS.iter().chain(WGMMA_FORCED)
}

/// The `_st` twin of `base`: its kernel with the epilogue that also writes a following norm's
/// statistics per output tile (kernels/tile_stats.cuh).
const fn stats_twin_of(name: &'static str, base: HaloConfig) -> HaloConfig {
    HaloConfig {
        name,
        stats: true,
        ..base
    }
}

pub const CONV_WZ_C32_Y16_H2_ST: HaloConfig =
    stats_twin_of("conv_wz_c32_y16_h2_st", CONV_WZ_C32_Y16_H2);
pub const CONV_WZ_C32_Y16_H2E_ST: HaloConfig =
    stats_twin_of("conv_wz_c32_y16_h2e_st", CONV_WZ_C32_Y16_H2E);
pub const CONV_WZ_C32_Y16_H2B_ST: HaloConfig =
    stats_twin_of("conv_wz_c32_y16_h2b_st", CONV_WZ_C32_Y16_H2B);
pub const CONV_WZ_C32_Y16_H2T_ST: HaloConfig =
    stats_twin_of("conv_wz_c32_y16_h2t_st", CONV_WZ_C32_Y16_H2T);
pub const CONV_WZ_C32_Y16_H2L_ST: HaloConfig =
    stats_twin_of("conv_wz_c32_y16_h2l_st", CONV_WZ_C32_Y16_H2L);

/// The halo-tile kernels that hand a following InstanceNorm / GroupNorm its statistics
/// (`CudaOptions::norm_stats`; with `CONV_C1_K3_ST`): the `_st` twin of the z-pair kernel with
/// its two-warpgroup helper. The planner takes the twin in place of its base. Twins of the
/// `conv_halo` kernels (a pass over the staged tile after the vector epilogue) were measured
/// 13-34% slower than their bases on W1's layers, more than the norm pass they save
/// (PERF_NOTES, session 24), and were removed. `_h2e_st`, `_h2b_st`, `_h2t_st`, `_h2l_st`:
/// their bases'.
pub const STATS_TWINS: &[HaloConfig] = &[
    CONV_WZ_C32_Y16_H2_ST,
    CONV_WZ_C32_Y16_H2E_ST,
    CONV_WZ_C32_Y16_H2B_ST,
    CONV_WZ_C32_Y16_H2T_ST,
    CONV_WZ_C32_Y16_H2L_ST,
];

/// The `_st` twin `twin` runs as: `_h2t_st` as `_h2l_st` (the helper's own stores) where
/// `staged` (`CudaOptions::zpair_st_staged`). Other twins: themselves.
pub fn zpair_st_variant(twin: &'static HaloConfig, staged: bool) -> &'static HaloConfig {
    if staged && twin.name == CONV_WZ_C32_Y16_H2T_ST.name {
        &CONV_WZ_C32_Y16_H2L_ST
    } else {
        twin
    }
}

/// What the default z-pair kernel `c` (`_h2t`) runs as: itself with tensor loads (`tma`,
/// `CudaOptions::zpair_tma`), else `_h2b` with bulk stores (`bulk`, `zpair_bulk`), else `_h2`
/// (the helper's copies and stores). Other kernels: themselves.
pub fn zpair_variant(c: &'static HaloConfig, tma: bool, bulk: bool) -> &'static HaloConfig {
    match (c.name == CONV_WZ_C32_Y16_H2T.name, tma, bulk) {
        (true, false, true) => &CONV_WZ_C32_Y16_H2B,
        (true, false, false) => &CONV_WZ_C32_Y16_H2,
        _ => c,
    }
}

/// The `_st` twin of halo / wgmma kernel `c`, if it has one.
pub fn stats_twin(c: &HaloConfig) -> Option<&'static HaloConfig> {
    STATS_TWINS
        .iter()
        .find(|t| t.name.strip_suffix("_st") == Some(c.name))
}

pub const CONV_WZ_C32_Y16_H2_NL: HaloConfig = HaloConfig {
    name: "conv_wz_c32_y16_h2_nl",
    norm_load: true,
    ..CONV_WZ_C32_Y16_H2
};

/// The halo-tile kernels that read the input of the InstanceNorm / GroupNorm before them,
/// normalised and activated on load (`CudaOptions::norm_load_conv`): the `_nl` twin of the
/// z-pair kernel, whose helper's loads do it. The norm then writes no output (as before a
/// pointwise head: `launch::NormHead`).
pub const NORM_LOAD_TWINS: &[HaloConfig] = &[CONV_WZ_C32_Y16_H2_NL];

/// The `_nl` twin of halo / wgmma kernel `c`, if it has one: that of the kernel `c` is but for
/// the helper's ways of loading and storing (`_h2` for `_h2t` and `_h2b`), whose loads the
/// norm's replace.
pub fn norm_load_twin(c: &HaloConfig) -> Option<&'static HaloConfig> {
    let plain = |b: &&HaloConfig| {
        let same = HaloConfig {
            name: b.name,
            stores: WzStores::Staged,
            tma_loads: false,
            ..*c
        };
        same == **b
    };
    let base = wgmma_all().find(plain).map_or(c.name, |b| b.name);
    NORM_LOAD_TWINS
        .iter()
        .find(|t| t.name.strip_suffix("_nl") == Some(base))
}

// Experiments (`kernel-experiments`): padded K steps, 8-face tiles, the MMA loop twice (its cost
// is the difference; the sums are wrong, so never a default). Measured in session 13: padding
// changes nothing; 8 faces per tile (1 block per SM) is 1.8x slower.
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C32N32_RP: HaloConfig = HaloConfig {
    wg_pad: true,
    experiment: true,
    ..wg("conv_wg_c32n32_rp", 32, 32, 4, 0)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C32N32_S4P: HaloConfig = HaloConfig {
    wg_pad: true,
    experiment: true,
    ..wg("conv_wg_c32n32_s4p", 32, 32, 4, 4)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C32N32_R8: HaloConfig = HaloConfig {
    experiment: true,
    ..wg("conv_wg_c32n32_r8", 32, 32, 8, 0)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C32N32_RX2: HaloConfig = HaloConfig {
    wg_reps: 2,
    experiment: true,
    ..wg("conv_wg_c32n32_rx2", 32, 32, 4, 0)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C32N32_S4X2: HaloConfig = HaloConfig {
    wg_reps: 2,
    experiment: true,
    ..wg("conv_wg_c32n32_s4x2", 32, 32, 4, 4)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C64N64_S4P: HaloConfig = HaloConfig {
    wg_pad: true,
    experiment: true,
    ..wg("conv_wg_c64n64_s4p", 64, 64, 4, 4)
};
#[cfg(feature = "kernel-experiments")]
pub const CONV_WG_C16N16_RP: HaloConfig = HaloConfig {
    pad_cin: true,
    wg_pad: true,
    experiment: true,
    ..wg("conv_wg_c16n16_rp", 16, 16, 4, 0)
};

/// Warps along N of a tile with `threads` threads and `wm` warps along M.
const fn warps_n(threads: u32, wm: usize) -> usize {
    threads as usize / 32 / wm
}

impl HaloConfig {
    /// Whether it is `conv_halo`'s one configuration (4x8x8 tile, 2 weight stages, one halo
    /// buffer); every other runs the `conv_halo_t` template.
    pub fn is_plain(&self) -> bool {
        self.tile == HALO_TILE && self.wst == 2 && self.hb == 1 && self.stride == 1
    }
}

/// The `*_ENTRY(...)` lines of `fam`'s configuration tables, appended to its file before NVRTC
/// (see [`instances`]); empty for a family without tables.
pub fn entry_lines(fam: Family) -> String {
    let lines = instances(fam);
    if lines.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("// Generated from src/backend/cuda/host/catalogue.rs (entry_lines).\n");
    for (_, l) in lines {
        out.push_str(&l);
    }
    out
}

/// Each generated instance of `fam`: its entry point and its `*_ENTRY(...)` line. `MMA_ENTRY`
/// per mma tile, `UP_ENTRY` per `convt_up_*` twin, `HALO_ENTRY` / `HALO2_ENTRY` per halo
/// config, the `W*_ENTRY` lines of the wgmma tables (the macros in kernels/conv_mma.cu,
/// conv_halo.cu, conv_wgmma*.cu).
pub fn instances(fam: Family) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if fam == Family::ConvMma {
        for c in MMA_CONFIGS {
            let wn = warps_n(c.threads, c.wm);
            out.push((
                c.name,
                format!(
                    "MMA_ENTRY({}, {}, {}, {}, {wn}, {}, {})\n",
                    c.name, c.bm, c.bn, c.wm, c.stages, c.vw
                ),
            ));
        }
        for (m, u) in UPSAMPLE_VEC {
            if let Some(c) = MMA_CONFIGS.iter().find(|c| c.name == *m) {
                let wn = warps_n(c.threads, c.wm);
                out.push((
                    *u,
                    format!(
                        "UP_ENTRY({u}, {}, {}, {}, {wn}, {})\n",
                        c.bm, c.bn, c.wm, c.stages
                    ),
                ));
                if let Some(t) = upsample_vec_st_name(u) {
                    out.push((
                        t,
                        format!(
                            "UP_ST_ENTRY({t}, {}, {}, {}, {wn}, {})\n",
                            c.bm, c.bn, c.wm, c.stages
                        ),
                    ));
                }
            }
        }
    } else if fam == Family::ConvWgmma {
        for c in wgmma_all() {
            let (name, cin, bn, tz, pad) = (c.name, c.cin, c.bn, c.tile[0], c.wg_pad as u8);
            let line = if c.zpair {
                // One warpgroup, or the MMA warpgroup and a helper of the other threads.
                let ny = c.tile[1];
                match c.threads {
                    128 => format!("WZ_ENTRY({name}, {cin}, {ny}, {tz})\n"),
                    t if c.tma_loads => format!(
                        "WZH_TMA_ENTRY({name}, {cin}, {ny}, {tz}, {}, {}, 0)\n",
                        t - 128,
                        c.stores as u8
                    ),
                    t => format!(
                        "WZH_ENTRY({name}, {cin}, {ny}, {tz}, {}, {})\n",
                        t - 128,
                        c.stores as u8
                    ),
                }
            } else if c.persist > 0 {
                // hb: the block's halo buffers, two warpgroups' worth.
                format!(
                    "WGP_ENTRY({name}, {cin}, {bn}, {tz}, {pad}, {}, {})\n",
                    c.stride,
                    c.hb / 2
                )
            } else {
                format!(
                    "WG_ENTRY({name}, {cin}, {bn}, {tz}, {}, {pad}, {}, {})\n",
                    c.wst, c.wg_reps, c.stride
                )
            };
            out.push((name, line));
        }
        // The `_st` twins: the helper's stores also take the norm statistics.
        for c in STATS_TWINS.iter().filter(|c| c.zpair && c.threads > 128) {
            let (name, cin, ny, tz) = (c.name, c.cin, c.tile[1], c.tile[0]);
            let (ht, sm) = (c.threads - 128, c.stores as u8);
            out.push((
                name,
                if c.tma_loads {
                    format!("WZH_TMA_ENTRY({name}, {cin}, {ny}, {tz}, {ht}, {sm}, 1)\n")
                } else {
                    format!("WZH_ST_ENTRY({name}, {cin}, {ny}, {tz}, {ht}, {sm})\n")
                },
            ));
        }
        for c in WGK_CONFIGS {
            let [z, y, x] = c.tile;
            out.push((
                c.name,
                format!(
                    "WGK_ENTRY({}, {}, {}, {z}, {y}, {x}, {}, {}, {}, {})\n",
                    c.name, c.bn, c.stages, c.stride, c.ck, c.up, c.stats
                ),
            ));
        }
        // The `_nl` twins: the helper's loads normalise a norm's input.
        for c in NORM_LOAD_TWINS
            .iter()
            .filter(|c| c.zpair && c.threads > 128)
        {
            let (name, cin, ny, tz) = (c.name, c.cin, c.tile[1], c.tile[0]);
            let ht = c.threads - 128;
            out.push((
                name,
                format!("WZH_NL_ENTRY({name}, {cin}, {ny}, {tz}, {ht})\n"),
            ));
        }
    } else if fam == Family::ConvHalo {
        for c in HALO_CONFIGS {
            let wn = warps_n(c.threads, c.wm);
            let (name, cin, bn, wm) = (c.name, c.cin, c.bn, c.wm);
            out.push((
                name,
                if c.is_plain() {
                    format!("HALO_ENTRY({name}, {cin}, {bn}, {wm}, {wn})\n")
                } else {
                    let [z, y, x] = c.tile;
                    format!(
                        "HALO2_ENTRY({name}, {cin}, {bn}, {wm}, {wn}, {z}, {y}, {x}, {}, {}, {})\n",
                        c.wst, c.hb, c.stride
                    )
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `_st` twin is its base kernel with the statistics: the same tile, threads and shared
    /// memory (so the same launch and weights), a base among the kernels.
    #[test]
    fn stats_twins_are_their_bases() {
        for t in STATS_TWINS {
            let base = HALO_CONFIGS
                .iter()
                .chain(wgmma_all())
                .find(|c| Some(c.name) == t.name.strip_suffix("_st"))
                .unwrap_or_else(|| panic!("{}: no default base", t.name));
            assert!(t.stats && !base.stats, "{}", t.name);
            assert_eq!(
                HaloConfig {
                    name: base.name,
                    stats: false,
                    ..*t
                },
                *base
            );
            assert_eq!(stats_twin(base).map(|c| c.name), Some(t.name));
            assert!(
                t.zpair && t.threads > 128,
                "{}: not the helper's stores",
                t.name
            );
        }
    }

    /// Each `conv_wgk_*` kernel has an `_st` twin of its tile, stages and stride.
    #[test]
    fn wgk_stats_twins_are_their_bases() {
        for c in WGK_CONFIGS.iter().filter(|c| !c.stats) {
            let t = wgk_stats_twin(c).unwrap_or_else(|| panic!("{}: no twin", c.name));
            assert_eq!(
                WgkConfig {
                    name: c.name,
                    stats: false,
                    ..*t
                },
                *c
            );
        }
        assert_eq!(WGK_CONFIGS.iter().filter(|c| c.stats).count(), 5);
    }

    /// An `_nl` twin is its base kernel loading a norm's input: the same tile, threads and
    /// shared memory (so the same launch and weights), a z-pair base with the helper (`_h2`,
    /// also the twin of the default `_h2t`).
    #[test]
    fn norm_load_twins_are_their_bases() {
        assert_eq!(
            norm_load_twin(&CONV_WZ_C32_Y16_H2T).map(|c| c.name),
            Some(CONV_WZ_C32_Y16_H2_NL.name)
        );
        for t in NORM_LOAD_TWINS {
            let base = wgmma_all()
                .find(|c| Some(c.name) == t.name.strip_suffix("_nl"))
                .unwrap_or_else(|| panic!("{}: no default base", t.name));
            assert!(t.norm_load && !base.norm_load && !t.stats, "{}", t.name);
            assert_eq!(
                HaloConfig {
                    name: base.name,
                    norm_load: false,
                    ..*t
                },
                *base
            );
            assert_eq!(norm_load_twin(base).map(|c| c.name), Some(t.name));
            assert!(
                t.zpair && t.threads > 128,
                "{}: not the helper's loads",
                t.name
            );
        }
    }

    /// Entry points a family's source defines: `extern "C" __global__ void [bounds] NAME(` lines
    /// and the first argument of each `*_ENTRY(` macro use (the `#define`s excluded).
    fn source_entries(src: &str) -> Vec<String> {
        let mut out = Vec::new();
        for l in src.lines().map(str::trim) {
            if let Some(rest) = l.strip_prefix("extern \"C\" __global__ void ") {
                let head = rest.split('(').next().unwrap_or("");
                if head.starts_with("__launch_bounds__") {
                    let after = rest.split(')').nth(1).unwrap_or("");
                    let name = after.trim().split('(').next().unwrap_or("").trim();
                    if name != "NAME" {
                        out.push(name.to_string());
                    }
                } else if head.trim() != "NAME" {
                    out.push(head.trim().to_string());
                }
            } else if !l.starts_with("#define") {
                if let Some((mac, rest)) = l.split_once("_ENTRY(") {
                    if mac
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                    {
                        out.push(rest.split(',').next().unwrap_or("").trim().to_string());
                    }
                }
            }
        }
        out
    }

    /// The catalogue and the .cu files list the same entry points, family by family, and every
    /// name is unique across the catalogue.
    #[test]
    fn entries_match_the_sources() {
        let mut all = Vec::new();
        for f in FAMILIES {
            let mut want = source_entries(&f.source());
            let mut got: Vec<String> = f.entries().iter().map(|s| s.to_string()).collect();
            assert!(!got.is_empty(), "{}", f.name());
            want.sort();
            got.sort();
            assert_eq!(got, want, "kernels/{}.cu", f.name());
            all.extend(got);
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a kernel name is listed twice");
        assert_eq!(upsample_vec_name(CONV_MMA_M128N32_V2.name), None);
        assert_eq!(
            halo_config(CONV_HALO_C16N32.name).map(|c| c.bn),
            Some(CONV_HALO_C16N32.bn)
        );
    }

    /// The experiments are listed exactly with the `kernel-experiments` feature (their
    /// `experiment` flag and their `cfg` agree), and the generated source instantiates every
    /// listed halo config.
    #[test]
    fn experiments_only_with_the_feature() {
        let on = cfg!(feature = "kernel-experiments");
        assert_eq!(HALO_CONFIGS.iter().any(|c| c.experiment), on);
        let src = Family::ConvHalo.source();
        for c in HALO_CONFIGS {
            assert!(src.contains(&format!("({}, ", c.name)), "{}", c.name);
        }
    }

    /// kernels/README.md names every plain kernel and every configuration table, so the page
    /// cannot fall behind the catalogue.
    #[test]
    fn the_kernels_readme_names_every_kernel() {
        let readme = include_str!("../../../../kernels/README.md");
        for k in KERNELS {
            let listed = UPSAMPLE_VEC.iter().any(|(_, u)| *u == k.name);
            assert!(
                listed || readme.contains(&format!("`{}`", k.name)),
                "kernels/README.md does not name {}",
                k.name
            );
        }
        for table in [
            "MMA_CONFIGS",
            "UPSAMPLE_VEC",
            "HALO_CONFIGS",
            "WGMMA_CONFIGS",
            "WGMMA_FORCED",
            "WGK_CONFIGS",
        ] {
            assert!(
                readme.contains(table),
                "kernels/README.md does not name {table}"
            );
        }
        for f in FAMILIES {
            assert!(
                readme.contains(&format!("| `{}.cu` |", f.name())),
                "kernels/README.md has no row for {}.cu",
                f.name()
            );
        }
    }
}
