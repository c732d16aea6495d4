//! Host-side planning for the CUDA backend, no GPU needed: per-sample shapes of every value,
//! activation fusion, kernel parameter blocks (mirrored in kernels/*.cu) and weight re-layout.

use crate::model::graph::{Conv, ConvTranspose, Graph, Op, Pool, Resize, ResizeMode};
use crate::{Error, Result};

pub use super::buffers::{
    alloc_size, buffer_plan, upsample_vec_name, ArchCaps, BufferPlan, ConstBuf, ConvGeom,
    ConvKernel, Launch, ALLOC_FLOOR, UPSAMPLE_VEC,
};

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

/// Mirrors `struct ConvParams` in kernels/conv.cu and kernels/conv_transpose.cu.
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
}

/// One `conv_mma_*` kernel of kernels/conv.cu: (name, BM, BN, threads, stages, vectorised A).
pub struct MmaConfig {
    pub name: &'static str,
    pub bm: usize,
    pub bn: usize,
    pub threads: u32,
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

/// Kept in sync with the MMA_ENTRY lines of kernels/conv.cu.
pub const MMA_CONFIGS: &[MmaConfig] = &[
    MmaConfig {
        name: "conv_mma_m256n32_v8",
        bm: 256,
        bn: 32,
        threads: 128,
        stages: 4,
        vw: 8,
    },
    MmaConfig {
        name: "conv_mma_m128n32_v8",
        bm: 128,
        bn: 32,
        threads: 128,
        stages: 4,
        vw: 8,
    },
    MmaConfig {
        name: "conv_mma_m128n64_v8",
        bm: 128,
        bn: 64,
        threads: 128,
        stages: 4,
        vw: 8,
    },
    MmaConfig {
        name: "conv_mma_m128n128_v8",
        bm: 128,
        bn: 128,
        threads: 256,
        stages: 4,
        vw: 8,
    },
    MmaConfig {
        name: "conv_mma_m128n32_v2",
        bm: 128,
        bn: 32,
        threads: 128,
        stages: 4,
        vw: 2,
    },
    MmaConfig {
        name: "conv_mma_m128n64_v2",
        bm: 128,
        bn: 64,
        threads: 128,
        stages: 4,
        vw: 2,
    },
    MmaConfig {
        name: "conv_mma_m128n32_v1",
        bm: 128,
        bn: 32,
        threads: 128,
        stages: 3,
        vw: 1,
    },
    MmaConfig {
        name: "conv_mma_m128n64_v1",
        bm: 128,
        bn: 64,
        threads: 128,
        stages: 3,
        vw: 1,
    },
];

/// Weight rows of every mma conv are padded to this many columns (the largest BN).
pub const MMA_N_PAD: usize = 128;

/// Gather width for `cin` input channels: 16-byte (8 halves), 4-byte (2) or element gathers.
pub fn gather_width(cin: usize) -> usize {
    if cin.is_multiple_of(8) {
        8
    } else if cin.is_multiple_of(2) {
        2
    } else {
        1
    }
}

/// Picks the mma tile for a GEMM of `m` rows and `n` columns (`vw`: `gather_width(Cin)`) on `sms`
/// multiprocessors: BN follows Cout (32 / 64 / 128) so no tensor-core work is padding, the
/// taller 256-row tile for Cout 32 (half the B traffic per FLOP), and smaller tiles when the
/// larger ones would leave SMs idle.
pub fn pick_mma(m: usize, n: usize, vw: usize, sms: usize) -> &'static MmaConfig {
    let by = |name: &str| {
        MMA_CONFIGS
            .iter()
            .find(|c| c.name == name)
            .expect("name in MMA_CONFIGS")
    };
    let blocks = |bm: usize, bn: usize| m.div_ceil(bm) * n.div_ceil(bn);
    if vw == 2 {
        return by(if n <= 32 {
            "conv_mma_m128n32_v2"
        } else {
            "conv_mma_m128n64_v2"
        });
    }
    if vw != 8 {
        return by(if n <= 32 {
            "conv_mma_m128n32_v1"
        } else {
            "conv_mma_m128n64_v1"
        });
    }
    if n <= 32 {
        if blocks(256, 32) >= 4 * sms {
            by("conv_mma_m256n32_v8")
        } else {
            by("conv_mma_m128n32_v8")
        }
    } else if n <= 64 || blocks(128, 128) < sms {
        by("conv_mma_m128n64_v8")
    } else {
        by("conv_mma_m128n128_v8")
    }
}

/// One `conv_halo_*` kernel of kernels/conv.cu: stride-1 3^3 conv whose blocks load an output
/// tile's input halo into shared memory once for all 27 taps.
#[derive(Clone, Copy, Debug)]
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
    /// Halo buffers (2: the next tile's halo is copied during the current one's math).
    pub hb: usize,
    /// Persistent blocks per SM (each loops over tiles); 0: one block per tile.
    pub persist: usize,
}

/// Output voxels of the original halo tile (z, y, x).
pub const HALO_TILE: [usize; 3] = [4, 8, 8];

impl HaloConfig {
    /// Whether the kernel computes a conv with `cin` input channels: its smem width; an even Cin
    /// below it on the zero-padding configs (phase 6); or (staged weights, width >= 32, phase 7)
    /// Cin = k * width in chunks of width channels. Resident weights hold the 27 taps of one
    /// chunk only, so those need Cin <= width.
    pub fn accepts_cin(&self, cin: usize) -> bool {
        cin == self.cin
            || (self.pad_cin && cin > 0 && cin.is_multiple_of(2) && cin < self.cin)
            || (self.wst != 0 && self.cin >= 32 && cin > 0 && cin.is_multiple_of(self.cin))
    }

    /// Rows of one halo buffer: the tile grown by the 3^3 kernel's reach.
    pub fn halo_rows(&self) -> usize {
        self.tile.iter().map(|t| t + 2).product()
    }

    /// Dynamic shared memory: the weights (resident: bn rows of 27 * Cin + 8 halves; staged:
    /// wst x bn rows of Cin + 8) and hb halo buffers of Cin + 8 halves per row.
    pub fn smem_bytes(&self) -> u32 {
        let w = if self.wst == 0 {
            self.bn * (27 * self.cin + 8)
        } else {
            self.wst * self.bn * (self.cin + 8)
        };
        ((w + self.hb * self.halo_rows() * (self.cin + 8)) * 2) as u32
    }

    /// Output tiles of an n x d x h x w output.
    pub fn tiles(&self, n: usize, out: [usize; 3]) -> usize {
        n * (0..3)
            .map(|i| out[i].div_ceil(self.tile[i]))
            .product::<usize>()
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

/// The `conv_halo_*` config named `name` (the launch needs its tile and grid).
pub fn halo_config(name: &str) -> Option<&'static HaloConfig> {
    HALO_CONFIGS.iter().find(|c| c.name == name)
}

/// The original 4x8x8 kernels: `conv_halo` (kernels/conv.cu), 2 weight stages, one block per tile.
const fn halo_v1(name: &'static str, cin: usize, bn: usize, wm: usize, wn: usize) -> HaloConfig {
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
    }
}

/// `c` also for an even Cin below its smem width (zero-padded; phase 6).
const fn padded(c: HaloConfig) -> HaloConfig {
    HaloConfig { pad_cin: true, ..c }
}

/// The phase-4 kernels: `conv_halo_t` (kernels/conv.cu, HALO2_ENTRY lines, same argument order
/// after the name, plus the blocks per SM).
#[allow(clippy::too_many_arguments)]
const fn halo_v2(
    name: &'static str,
    cin: usize,
    bn: usize,
    wm: usize,
    wn: usize,
    tile: [usize; 3],
    wst: usize,
    hb: usize,
    persist: usize,
) -> HaloConfig {
    HaloConfig {
        name,
        cin,
        pad_cin: false,
        bn,
        threads: (wm * wn * 32) as u32,
        wm,
        tile,
        wst,
        hb,
        persist,
    }
}

/// Kept in sync with the HALO_ENTRY / HALO2_ENTRY lines of kernels/conv.cu (a test in
/// tests/cuda_kernels_compile.rs parses them). ORDER = PREFERENCE: `pick_halo` takes the first
/// entry that accepts the conv's Cin at its tile width and whose smem fits the device, so the
/// default for a (Cin, width) is its first line here; the others run only when forced
/// (`CudaBackend::set_halo_tile`) or where the ones above do not fit. To make a variant the
/// default, move its line above the current default of its (Cin, width).
pub const HALO_CONFIGS: &[HaloConfig] = &[
    // Defaults (measured, PERF_NOTES.md phase 3): K1 on `_w4` 218.8 vs 209.8 TF/s.
    halo_v1("conv_halo_c32n32_w4", 32, 32, 4, 1),
    halo_v1("conv_halo_c64n32", 64, 32, 8, 1),
    halo_v1("conv_halo_c64n64", 64, 64, 4, 2),
    halo_v1("conv_halo_c32n64", 32, 64, 4, 2),
    // Measured alternatives (8 warps of 32x32 for Cin 32; 4 warps of 64x32 for Cin 64).
    halo_v1("conv_halo_c32n32", 32, 32, 8, 1),
    halo_v1("conv_halo_c64n32_w4", 64, 32, 4, 1),
    // Phase 4, not measured yet (forced only; all need more smem than the defaults above).
    halo_v2("conv_halo_c32n32_r", 32, 32, 4, 1, [4, 8, 8], 0, 1, 0),
    halo_v2("conv_halo_c32n32_rp", 32, 32, 4, 1, [4, 8, 8], 0, 1, 2),
    halo_v2("conv_halo_c32n32_rp2", 32, 32, 8, 1, [4, 8, 8], 0, 2, 1),
    halo_v2("conv_halo_c32n32_rb", 32, 32, 8, 1, [8, 8, 8], 0, 2, 1),
    halo_v2("conv_halo_c32n32_s4", 32, 32, 4, 1, [4, 8, 8], 4, 1, 0),
    halo_v2("conv_halo_c64n32_s4", 64, 32, 4, 1, [4, 8, 8], 4, 1, 0),
    halo_v2("conv_halo_c64n32_rp", 64, 32, 8, 1, [4, 8, 8], 0, 1, 1),
    halo_v2("conv_halo_c64n64_b", 64, 64, 4, 2, [8, 8, 8], 3, 1, 0),
    halo_v2("conv_halo_c32n32_x16", 32, 32, 8, 1, [4, 8, 16], 2, 1, 0),
    halo_v2("conv_halo_c32n32_y8", 32, 32, 8, 1, [8, 8, 8], 2, 1, 0),
    // Phase 6 (not measured yet): smem width 16 for Cin 16 and even Cin < 16 (W2's 14->14 at
    // 128^3), Cout <= 16 / <= 32. Default for Cout <= 16: resident weights (14 KB, 5 blocks/SM,
    // no per-tap barrier), predicted fastest (PERF_NOTES.md phase 6).
    padded(halo_v2(
        "conv_halo_c16n16_r",
        16,
        16,
        4,
        1,
        [4, 8, 8],
        0,
        1,
        0,
    )),
    padded(halo_v1("conv_halo_c16n16", 16, 16, 4, 1)),
    padded(halo_v1("conv_halo_c16n16_w8", 16, 16, 8, 1)),
    padded(halo_v2(
        "conv_halo_c16n16_rp2",
        16,
        16,
        4,
        1,
        [4, 8, 8],
        0,
        2,
        3,
    )),
    padded(halo_v1("conv_halo_c16n32", 16, 32, 4, 1)),
    // Phase 7: two halo buffers, the next Cin chunk's halo copied during this chunk's taps.
    halo_v2("conv_halo_c64n64_h2", 64, 64, 4, 2, [4, 8, 8], 2, 2, 0),
    halo_v2("conv_halo_c32n64_h2", 32, 64, 4, 2, [4, 8, 8], 2, 2, 0),
];

/// Largest Cout that takes a halo kernel by default (grid.y over 64-wide tiles; a forced
/// variant runs any Cout). Cout 65..128 (W1: 128->128 and 256->128 at 32^3) load the halo once
/// per 64-wide output tile: 2 x 600/256 input reads per output voxel, vs 27 for conv_mma's
/// per-tap gather. Above 128 the W1 layers are 16^3 and smaller, where 256-voxel tiles give too
/// few blocks (256->256 at 16^3, batch 4: 64 tiles x 4 channel tiles, under one wave).
pub const HALO_MAX_COUT: usize = 128;

/// The halo kernel for a conv, when one applies: not transposed, one group, kernel 3^3,
/// stride 1, dilation 1 (any pads), Cin 16, 32, 64 or a multiple of 32 (Cin > 64 in chunks:
/// phase 7; an even Cin in 10..14 on the zero-padding width-16 kernels: phase 6), Cout <=
/// HALO_MAX_COUT (above the tile width: grid.y over bn-wide tiles), and its shared memory within
/// `smem_max` (the device's opt-in limit per block). The tile width is the narrowest that holds
/// Cout (64 above 64). Default: the first HALO_CONFIGS entry that runs it (the list is in
/// measured order of preference). `force` names a HALO_CONFIGS entry to
/// use instead when it accepts the Cin, has the tile width and fits (any Cout); forced, a
/// padding kernel also runs Cin 2..8 (more than half of its channels padding: not a default).
#[allow(clippy::too_many_arguments)]
pub fn pick_halo(
    cin: usize,
    cout: usize,
    k: [usize; 3],
    stride: [usize; 3],
    dil: [usize; 3],
    groups: usize,
    transposed: bool,
    smem_max: usize,
    force: Option<&str>,
) -> Option<&'static HaloConfig> {
    if transposed || groups != 1 || k != [3; 3] || stride != [1; 3] || dil != [1; 3] || cout == 0 {
        return None;
    }
    let runs = |c: &&HaloConfig| c.accepts_cin(cin) && c.smem_bytes() as usize <= smem_max;
    let widths = || HALO_CONFIGS.iter().filter(runs).map(|c| c.bn);
    // Cout above every width: grid.y channel tiles, on the phase-7 (width >= 32) configs only.
    let tiled = || {
        HALO_CONFIGS
            .iter()
            .filter(runs)
            .filter(|c| c.cin >= 32)
            .map(|c| c.bn)
    };
    let bn = widths()
        .filter(|&b| cout <= b)
        .min()
        .or_else(|| tiled().max())?;
    let fits = |c: &&HaloConfig| runs(c) && c.bn == bn;
    if let Some(f) = force {
        if let Some(c) = HALO_CONFIGS.iter().filter(fits).find(|c| c.name == f) {
            return Some(c);
        }
    }
    if cout > HALO_MAX_COUT {
        return None;
    }
    // The first line that runs it (measured, PERF_NOTES phase 8: Cin 64 -> Cout 32 runs
    // faster as two 32-channel chunks on c32n32_w4 than on c64n32, 1.646 vs 1.728 ms).
    HALO_CONFIGS
        .iter()
        .filter(fits)
        .find(|c| cin == c.cin || 2 * cin > c.cin)
}

/// Whether a transposed conv is a pure "each input voxel paints one k^3 block" upsampling
/// (kernel == stride, no pads, no output padding, dilation 1, one group), which runs as a plain
/// GEMM [voxels x Cin] x [Cin x taps*Cout] with a scatter epilogue: no zero MACs.
pub fn is_upsampling_convt(
    k: [usize; 3],
    stride: [usize; 3],
    dil: [usize; 3],
    pads: &[usize],
    opad: [usize; 3],
    groups: usize,
) -> bool {
    k == stride && dil == [1; 3] && pads.iter().all(|&p| p == 0) && opad == [0; 3] && groups == 1
}

/// Weight of the upsampling transposed conv as the GEMM's B matrix: row j = tap * Cout + co,
/// column ci (weight shape [Cin][Cout][kd][kh][kw]); rows padded to `rows_pad`, K to 32.
/// Returns (data, kpad).
pub fn relayout_upsampling_weight(
    w: &[f32],
    shape: &[usize],
    rows_pad: usize,
) -> (Vec<half::f16>, usize) {
    let (cin, cout) = (shape[0], shape[1]);
    let taps = shape[2] * shape[3] * shape[4];
    let kpad = cin.div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; rows_pad * kpad];
    for ci in 0..cin {
        for co in 0..cout {
            for t in 0..taps {
                out[(t * cout + co) * kpad + ci] =
                    half::f16::from_f32(w[(ci * cout + co) * taps + t]);
            }
        }
    }
    (out, kpad)
}

/// One output parity class of a strided transposed conv: outputs o = j * stride + r (per axis)
/// form a dense forward conv over the input with the taps `taps` (original kernel indices, in
/// the order of the sub-conv's taps t = 0, 1, ...) and begin pad `pad`: input j - pad + t.
#[derive(Clone, Debug, PartialEq)]
pub struct ParityClass {
    pub r: [usize; 3],
    pub taps: [Vec<usize>; 3],
    pub pad: [i32; 3],
    /// Outputs of this class per axis: ceil((out - r) / stride).
    pub grid: [usize; 3],
}

/// Splits a transposed conv (kernel `k`, `stride`, begin pads `pads`, dilation 1, output size
/// `out`) into its stride^3 parity classes: output o = j*s + r receives x[i] * w[kk] for every
/// kk with (r + pad - kk) divisible by s, at i = j + (r + pad - kk) / s. None when some class
/// with outputs has no tap on an axis (its outputs would be bias only: kept on the gather kernel).
pub fn parity_split(
    k: [usize; 3],
    stride: [usize; 3],
    pads: [usize; 3],
    out: [usize; 3],
) -> Option<Vec<ParityClass>> {
    // Per axis, per residue with outputs: (r, taps with the largest kk first, pad, grid).
    let mut axes: Vec<Vec<(usize, Vec<usize>, i32, usize)>> = Vec::new();
    for a in 0..3 {
        let s = stride[a];
        if s == 0 {
            return None;
        }
        let mut per_r = Vec::new();
        for r in 0..s {
            let grid = out[a].saturating_sub(r).div_ceil(s);
            let mut taps: Vec<usize> = (0..k[a])
                .filter(|&kk| (r as i64 + pads[a] as i64 - kk as i64).rem_euclid(s as i64) == 0)
                .collect();
            taps.reverse();
            if grid == 0 {
                continue;
            }
            let first = *taps.first()?;
            // Offset of the largest kk is the smallest: input j + off_min + t.
            let off_min = (r as i64 + pads[a] as i64 - first as i64).div_euclid(s as i64);
            per_r.push((r, taps, -off_min as i32, grid));
        }
        axes.push(per_r);
    }
    let mut classes = Vec::new();
    for z in &axes[0] {
        for y in &axes[1] {
            for x in &axes[2] {
                classes.push(ParityClass {
                    r: [z.0, y.0, x.0],
                    taps: [z.1.clone(), y.1.clone(), x.1.clone()],
                    pad: [z.2, y.2, x.2],
                    grid: [z.3, y.3, x.3],
                });
            }
        }
    }
    Some(classes)
}

/// Weight of one parity class as the GEMM's B matrix [cout_pad][kpad]: K = (tz, ty, tx, ci),
/// from the transposed weight [Cin][Cout][kd][kh][kw] (groups 1). Returns (data, kpad).
pub fn relayout_parity_weight(
    w: &[f32],
    shape: &[usize],
    taps: &[Vec<usize>; 3],
    cout_pad: usize,
) -> (Vec<half::f16>, usize) {
    let (cin, cout) = (shape[0], shape[1]);
    let (kh, kw) = (shape[3], shape[4]);
    let nt = taps[0].len() * taps[1].len() * taps[2].len();
    let kpad = (nt * cin).div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; cout_pad * kpad];
    for co in 0..cout {
        let mut t = 0;
        for &kz in &taps[0] {
            for &ky in &taps[1] {
                for &kx in &taps[2] {
                    for ci in 0..cin {
                        let src = (((ci * cout + co) * shape[2] + kz) * kh + ky) * kw + kx;
                        out[co * kpad + t * cin + ci] = half::f16::from_f32(w[src]);
                    }
                    t += 1;
                }
            }
        }
    }
    (out, kpad)
}

/// Where value `v` can be written in place: its only consumer is a channel concat (and `v` is
/// one of its inputs once, not the graph output). Returns (concat node, channel offset, total).
pub fn concat_slice(
    graph: &Graph,
    cons: &[Vec<usize>],
    shapes: &[Shape],
    v: usize,
) -> Option<(usize, usize, usize)> {
    if v == graph.output || cons[v].len() != 1 {
        return None;
    }
    let j = cons[v][0];
    let node = &graph.nodes[j];
    if !matches!(node.op, Op::Concat { axis: 1 })
        || node.inputs.iter().filter(|&&u| u == v).count() != 1
    {
        return None;
    }
    let pos = node.inputs.iter().position(|&u| u == v)?;
    let coff = node.inputs[..pos].iter().map(|&u| shapes[u][0]).sum();
    Some((j, coff, shapes[node.output][0]))
}

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

// SAFETY: plain #[repr(C)] structs of i32/f32, laid out as their CUDA twins.
unsafe impl cudarc::driver::DeviceRepr for ConvParams {}
unsafe impl cudarc::driver::DeviceRepr for PoolParams {}

fn conv_out(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize) -> Option<usize> {
    let span = d * (k - 1) + 1;
    let padded = i + pb + pe;
    if padded < span || s == 0 {
        return None;
    }
    Some((padded - span) / s + 1)
}

fn pool_out(
    i: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    ceil: bool,
) -> Option<usize> {
    let span = d * (k - 1) + 1;
    let padded = i + pb + pe;
    if padded < span || s == 0 {
        return None;
    }
    let mut o = if ceil {
        (padded - span).div_ceil(s) + 1
    } else {
        (padded - span) / s + 1
    };
    // As PyTorch/ONNX: the last window must start inside the input or the begin padding.
    if ceil && (o - 1) * s >= i + pb {
        o -= 1;
    }
    Some(o)
}

/// Resize output size and the scales used for coordinate mapping (output/input when sizes are given).
pub fn resize_geometry(r: &Resize, input: [usize; 3]) -> ([usize; 3], [f32; 3]) {
    match r.sizes {
        Some(s) => (s, [0, 1, 2].map(|a| s[a] as f32 / input[a].max(1) as f32)),
        None => (
            [0, 1, 2].map(|a| (input[a] as f32 * r.scales[a]).floor() as usize),
            r.scales,
        ),
    }
}

fn check_conv(name: &str, w: &[usize], cin: usize, groups: usize, transposed: bool) -> Result<()> {
    if w.len() != 5 || groups == 0 {
        return Err(Error::Graph(format!(
            "node {name}: conv weight must be 5D, got {w:?}"
        )));
    }
    let wcin = if transposed { w[0] } else { w[1] * groups };
    if wcin != cin || !cin.is_multiple_of(groups) {
        return Err(Error::Graph(format!(
            "node {name}: weight {w:?} with groups {groups} does not fit {cin} input channels"
        )));
    }
    Ok(())
}

/// Per-sample shapes of every value for a window `roi` (values never computed stay [0;4]).
pub fn infer_shapes(graph: &Graph, roi: [usize; 3]) -> Result<Vec<Shape>> {
    let mut shapes: Vec<Shape> = vec![[0; 4]; graph.values.len()];
    shapes[graph.input] = [graph.input_channels(), roi[0], roi[1], roi[2]];
    for node in &graph.nodes {
        let ins: Vec<Shape> = node
            .inputs
            .iter()
            .map(|&i| shapes.get(i).copied().unwrap_or([0; 4]))
            .collect();
        if ins.is_empty() || ins.iter().any(|s| s[0] == 0) {
            return Err(Error::Graph(format!(
                "node {}: an input has no computed shape",
                node.name
            )));
        }
        let x = ins[0];
        let bad =
            |what: &str| Error::Graph(format!("node {} ({}): {what}", node.name, node.op.name()));
        let out: Shape = match &node.op {
            Op::Conv(Conv {
                weight,
                stride,
                dilation,
                pads,
                groups,
                ..
            }) => {
                let w = &weight.shape;
                check_conv(&node.name, w, x[0], *groups, false)?;
                let mut o = [w[0], 0, 0, 0];
                for a in 0..3 {
                    o[a + 1] = conv_out(
                        x[a + 1],
                        w[a + 2],
                        stride[a],
                        dilation[a],
                        pads[a],
                        pads[a + 3],
                    )
                    .ok_or_else(|| bad(&format!("window {roi:?} is too small for the kernel")))?;
                }
                o
            }
            Op::ConvTranspose(ConvTranspose {
                weight,
                stride,
                dilation,
                pads,
                output_padding,
                groups,
                ..
            }) => {
                let w = &weight.shape;
                check_conv(&node.name, w, x[0], *groups, true)?;
                let mut o = [w[1] * groups, 0, 0, 0];
                for a in 0..3 {
                    let full = (x[a + 1] - 1) * stride[a]
                        + dilation[a] * (w[a + 2] - 1)
                        + output_padding[a]
                        + 1;
                    o[a + 1] = full
                        .checked_sub(pads[a] + pads[a + 3])
                        .filter(|&v| v > 0)
                        .ok_or_else(|| bad("pads exceed the output"))?;
                }
                o
            }
            Op::MaxPool(p) | Op::AveragePool(p) => {
                let Pool {
                    kernel,
                    stride,
                    dilation,
                    pads,
                    ceil_mode,
                    ..
                } = p;
                let mut o = [x[0], 0, 0, 0];
                for a in 0..3 {
                    o[a + 1] = pool_out(
                        x[a + 1],
                        kernel[a],
                        stride[a],
                        dilation[a],
                        pads[a],
                        pads[a + 3],
                        *ceil_mode,
                    )
                    .ok_or_else(|| bad(&format!("window {roi:?} is too small for the pool")))?;
                }
                o
            }
            Op::Resize(r) => {
                let (s, _) = resize_geometry(r, [x[1], x[2], x[3]]);
                if s.contains(&0) {
                    return Err(bad("resize to an empty size"));
                }
                [x[0], s[0], s[1], s[2]]
            }
            Op::Concat { axis } => {
                if *axis != 1 {
                    return Err(bad(
                        "only channel concatenation (axis 1) is supported on CUDA",
                    ));
                }
                let mut c = 0;
                for s in &ins {
                    if s[1..] != x[1..] {
                        return Err(bad(&format!(
                            "inputs have different spatial sizes {:?} and {:?}",
                            x, s
                        )));
                    }
                    c += s[0];
                }
                [c, x[1], x[2], x[3]]
            }
            Op::Add | Op::Mul | Op::Sub | Op::Div => {
                if ins.len() != 2 || ins[0] != ins[1] {
                    return Err(bad(&format!("needs two inputs of one shape, got {ins:?}")));
                }
                x
            }
            Op::Softmax { axis } => {
                if *axis != 1 {
                    return Err(bad(
                        "only softmax over channels (axis 1) is supported on CUDA",
                    ));
                }
                x
            }
            Op::GroupNorm { groups, .. } => {
                if *groups == 0 || !x[0].is_multiple_of(*groups) {
                    return Err(bad(&format!(
                        "{} channels do not split into {groups} groups",
                        x[0]
                    )));
                }
                x
            }
            _ => x,
        };
        shapes[node.output] = out;
    }
    Ok(shapes)
}

/// Re-lays a conv / transposed-conv weight as [cout_pad][kpad] f16 bits, element [co][tap][ci] (ci
/// within the group), zero padded, as the GEMM's B matrix wants it. Returns (data, kpad).
pub fn relayout_weight(
    w: &[f32],
    shape: &[usize],
    groups: usize,
    transposed: bool,
    cout_pad: usize,
) -> (Vec<half::f16>, usize) {
    let taps = shape[2] * shape[3] * shape[4];
    let (cout, cin_g) = if transposed {
        (shape[1] * groups, shape[0] / groups)
    } else {
        (shape[0], shape[1])
    };
    let cout_g = cout / groups;
    let k = taps * cin_g;
    let kpad = k.div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; cout_pad * kpad];
    for co in 0..cout {
        let g = co / cout_g;
        for t in 0..taps {
            for ci in 0..cin_g {
                let src = if transposed {
                    ((g * cin_g + ci) * shape[1] + (co - g * cout_g)) * taps + t
                } else {
                    (co * cin_g + ci) * taps + t
                };
                out[co * kpad + t * cin_g + ci] = half::f16::from_f32(w[src]);
            }
        }
    }
    (out, kpad)
}

/// For each value, the node indices that consume it.
pub fn consumers(graph: &Graph) -> Vec<Vec<usize>> {
    let mut c = vec![Vec::new(); graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for &v in &n.inputs {
            if let Some(list) = c.get_mut(v) {
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }
    }
    c
}

/// Whether node `i`'s output feeds exactly one activation node that can run in its epilogue;
/// returns that node's index.
pub fn fusable_activation(graph: &Graph, cons: &[Vec<usize>], i: usize) -> Option<usize> {
    let out = graph.nodes[i].output;
    if out == graph.output || cons[out].len() != 1 {
        return None;
    }
    let j = cons[out][0];
    let nj = &graph.nodes[j];
    if nj.inputs.len() != 1 || Act::of(&nj.op).is_none() {
        return None;
    }
    Some(j)
}

/// Whether the resize mode is linear (trilinear in 3D).
pub fn is_linear(r: &Resize) -> bool {
    r.mode == ResizeMode::Linear
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_match_pytorch_formulas() {
        assert_eq!(conv_out(64, 3, 2, 1, 1, 1), Some(32));
        assert_eq!(conv_out(64, 3, 1, 4, 4, 4), Some(64));
        assert_eq!(conv_out(2, 5, 1, 1, 0, 0), None);
        // ceil mode: 5 with k2 s2 gives 3, floor gives 2.
        assert_eq!(pool_out(5, 2, 2, 1, 0, 0, true), Some(3));
        assert_eq!(pool_out(5, 2, 2, 1, 0, 0, false), Some(2));
    }

    #[test]
    fn weight_relayout_puts_cin_innermost() {
        // Conv weight [Cout=2][Cin=3][1][1][2]: element (co, ci, t) = 100co + 10ci + t.
        let shape = [2, 3, 1, 1, 2];
        let mut w = vec![0.0; 12];
        for co in 0..2 {
            for ci in 0..3 {
                for t in 0..2 {
                    w[(co * 3 + ci) * 2 + t] = (100 * co + 10 * ci + t) as f32;
                }
            }
        }
        let (r, kpad) = relayout_weight(&w, &shape, 1, false, 64);
        assert_eq!(kpad, 32);
        assert_eq!(r[1 * kpad + 1 * 3 + 2].to_f32(), 121.0); // co 1, tap 1, ci 2
        assert_eq!(r[6].to_f32(), 0.0); // K padding
                                        // Transposed [Cin=3][Cout=2][1][1][2]: element (ci, co, t) = 100ci + 10co + t.
        let mut wt = vec![0.0; 12];
        for ci in 0..3 {
            for co in 0..2 {
                for t in 0..2 {
                    wt[(ci * 2 + co) * 2 + t] = (100 * ci + 10 * co + t) as f32;
                }
            }
        }
        let (r, kpad) = relayout_weight(&wt, &[3, 2, 1, 1, 2], 1, true, 64);
        assert_eq!(r[1 * kpad + 1 * 3 + 2].to_f32(), 211.0); // co 1, tap 1, ci 2
                                                             // As the upsampling GEMM: row tap * Cout + co, column ci.
        let (u, kpad) = relayout_upsampling_weight(&wt, &[3, 2, 1, 1, 2], 128);
        assert_eq!(kpad, 32);
        assert_eq!(u[(1 * 2 + 0) * kpad + 2].to_f32(), 201.0); // tap 1, co 0, ci 2
        assert_eq!(u[kpad + 1].to_f32(), 110.0); // tap 0, co 1, ci 1
        assert_eq!(u[4 * kpad].to_f32(), 0.0); // row padding
    }

    /// 1D transposed conv computed directly (scatter form) vs through the parity classes.
    #[test]
    fn parity_classes_reproduce_transposed_conv() {
        let mut seed = 7u64;
        let mut rnd = || (crate::backend::cuda::lcg_next(&mut seed) % 1000) as f64 / 500.0 - 1.0;
        for (k, s, pb, opad, n) in [
            (3, 2, 1, 1, 5),
            (3, 2, 0, 0, 4),
            (4, 2, 1, 0, 6),
            (5, 3, 2, 2, 4),
            (3, 1, 1, 0, 5),
            (2, 2, 0, 0, 3),
            (3, 3, 0, 0, 3),
        ] {
            let x: Vec<f64> = (0..n).map(|_| rnd()).collect();
            let w: Vec<f64> = (0..k).map(|_| rnd()).collect();
            let out = (n - 1) * s + k + opad - 2 * pb;
            let mut want = vec![0.0; out];
            for i in 0..n {
                for kk in 0..k {
                    let o = (i * s + kk) as i64 - pb as i64;
                    if o >= 0 && (o as usize) < out {
                        want[o as usize] += x[i] * w[kk];
                    }
                }
            }
            let cls = parity_split([k, 1, 1], [s, 1, 1], [pb, 0, 0], [out, 1, 1]).unwrap();
            assert_eq!(cls.len(), s.min(out));
            let mut got = vec![f64::NAN; out];
            for c in &cls {
                assert_eq!((c.taps[1].clone(), c.pad[1], c.grid[1]), (vec![0], 0, 1));
                for j in 0..c.grid[0] {
                    let mut v = 0.0;
                    for (t, &kk) in c.taps[0].iter().enumerate() {
                        let i = j as i64 - c.pad[0] as i64 + t as i64;
                        if i >= 0 && (i as usize) < n {
                            v += x[i as usize] * w[kk];
                        }
                    }
                    let o = j * s + c.r[0];
                    assert!(got[o].is_nan(), "output {o} written twice");
                    got[o] = v;
                }
            }
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-12,
                    "k{k} s{s} p{pb}: {got:?} vs {want:?}"
                );
            }
        }
        // A class without taps (kernel smaller than the stride) stays on the gather kernel.
        assert!(parity_split([1, 1, 1], [2, 1, 1], [0; 3], [4, 1, 1]).is_none());
        // Weight of a class: K = (tz, ty, tx, ci); transposed weight [Cin=2][Cout=1][3][1][1].
        let w: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let (r, kpad) =
            relayout_parity_weight(&w, &[2, 1, 3, 1, 1], &[vec![2, 0], vec![0], vec![0]], 64);
        assert_eq!(kpad, 32);
        // t0 = k2: ci0 -> 2, ci1 -> 5; t1 = k0: ci0 -> 0, ci1 -> 3.
        assert_eq!(
            r[..4].iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            vec![2.0, 5.0, 0.0, 3.0]
        );
    }

    #[test]
    fn mma_tile_choice_follows_cout_and_fills_the_gpu() {
        // K1: 2x128^3 voxels, Cout 32: the tall tile.
        assert_eq!(pick_mma(2 << 21, 32, 8, 132).name, "conv_mma_m256n32_v8");
        assert_eq!(pick_mma(4 * 512, 32, 8, 132).name, "conv_mma_m128n32_v8");
        assert_eq!(pick_mma(4 << 18, 64, 8, 132).name, "conv_mma_m128n64_v8");
        assert_eq!(pick_mma(4 << 15, 128, 8, 132).name, "conv_mma_m128n128_v8");
        // 8^3 x 4 voxels, Cout 320: 16 x 3 blocks of 128x128 would leave most SMs idle.
        assert_eq!(pick_mma(4 * 512, 320, 8, 132).name, "conv_mma_m128n64_v8");
        assert_eq!(pick_mma(1000, 32, 1, 132).name, "conv_mma_m128n32_v1");
        assert_eq!(
            pick_mma(1000, 14, gather_width(14), 132).name,
            "conv_mma_m128n32_v2"
        );
        assert_eq!(gather_width(24), 8);
        assert_eq!(gather_width(3), 1);
        for c in MMA_CONFIGS {
            assert!(c.smem_bytes() <= 99 * 1024, "{} fits sm_86's limit", c.name);
        }
        assert!(is_upsampling_convt(
            [2; 3], [2; 3], [1; 3], &[0; 6], [0; 3], 1
        ));
        // Halo kernel: stride-1 3^3 with Cin k x 32, Cout <= 128, where its smem fits.
        let h =
            |ci, co, k, s, d, g, t, m| pick_halo(ci, co, k, s, d, g, t, m, None).map(|c| c.name);
        let big = 227 * 1024;
        assert_eq!(
            h(32, 32, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(
            h(64, 32, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(
            h(32, 17, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(
            h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some("conv_halo_c64n64")
        );
        assert_eq!(
            h(32, 48, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some("conv_halo_c32n64")
        );
        // sm_86's 99 KB: c64n64 (105 KB) does not fit, c32n64 runs Cin 64 as 2 chunks.
        assert_eq!(
            h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, 99 * 1024),
            Some("conv_halo_c32n64")
        );
        assert_eq!(h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, 50 * 1024), None);
        // Chunked Cin (phase 7): the largest chunk that divides Cin; Cout 65..128 in 2 tiles.
        for (ci, co, want) in [
            (128, 64, "conv_halo_c64n64"),
            (256, 64, "conv_halo_c64n64"),
            (192, 33, "conv_halo_c64n64"),
            (128, 32, "conv_halo_c32n32_w4"),
            (96, 64, "conv_halo_c32n64"),
            (96, 20, "conv_halo_c32n32_w4"),
            (160, 32, "conv_halo_c32n32_w4"),
            (128, 128, "conv_halo_c64n64"),
            (256, 128, "conv_halo_c64n64"),
            (64, 100, "conv_halo_c64n64"),
        ] {
            assert_eq!(
                h(ci, co, [3; 3], [1; 3], [1; 3], 1, false, big),
                Some(want),
                "{ci}->{co}"
            );
        }
        assert_eq!(h(256, 256, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(48, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(0, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(24, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [2; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [2; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [1; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [1; 3], 2, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [1; 3], 1, true, big), None);
        let f =
            |ci, co, n| pick_halo(ci, co, [3; 3], [1; 3], [1; 3], 1, false, big, n).map(|c| c.name);
        assert_eq!(
            f(32, 32, Some("conv_halo_c32n32_w4")),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(
            f(64, 30, Some("conv_halo_c64n32_w4")),
            Some("conv_halo_c64n32_w4")
        );
        // Forced: any Cout (grid.y), chunked Cin on a staged kernel; resident weights hold one
        // chunk only, so a forced resident kernel on Cin 128 falls back to the default.
        assert_eq!(
            f(256, 256, Some("conv_halo_c64n64_h2")),
            Some("conv_halo_c64n64_h2")
        );
        assert_eq!(
            f(128, 64, Some("conv_halo_c32n64")),
            Some("conv_halo_c32n64")
        );
        assert_eq!(
            f(128, 32, Some("conv_halo_c64n32_rp")),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(f(256, 256, Some("conv_halo_c64n32_rp")), None);
        let hc = |n| halo_config(n).unwrap();
        assert!(hc("conv_halo_c64n64").accepts_cin(320));
        assert!(!hc("conv_halo_c64n64").accepts_cin(96));
        assert!(hc("conv_halo_c32n32_s4").accepts_cin(96));
        assert!(!hc("conv_halo_c32n32_rp").accepts_cin(64));
        assert_eq!(hc("conv_halo_c64n64").cout_tiles(128), 2);
        assert_eq!(hc("conv_halo_c64n64").cout_tiles(129), 3);
        assert_eq!(hc("conv_halo_c32n32").cout_tiles(17), 1);
        // Two weight stages + two 600-row halos of 64 + 8 / 32 + 8 halves.
        assert_eq!(
            hc("conv_halo_c64n64_h2").smem_bytes(),
            (2 * 64 * 72 + 2 * 600 * 72) * 2
        );
        assert_eq!(
            hc("conv_halo_c32n64_h2").smem_bytes(),
            (2 * 64 * 40 + 2 * 600 * 40) * 2
        );
        // A forced Cin-32 staged tile runs Cin 64 in 2 chunks; a resident one (one chunk
        // only) falls back to the default.
        assert_eq!(
            f(64, 32, Some("conv_halo_c32n32_w4")),
            Some("conv_halo_c32n32_w4")
        );
        assert_eq!(
            f(64, 32, Some("conv_halo_c32n32_rp")),
            Some("conv_halo_c32n32_w4")
        );
        // Phase-4 variants: forced by name where they fit, never the default; the 216 KB
        // 8x8x8 tile falls back to the default under sm_80's 163 KB.
        assert_eq!(
            f(32, 32, Some("conv_halo_c32n32_rp")),
            Some("conv_halo_c32n32_rp")
        );
        let g = |n, m| pick_halo(32, 32, [3; 3], [1; 3], [1; 3], 1, false, m, n).map(|c| c.name);
        assert_eq!(
            g(Some("conv_halo_c32n32_rb"), 163 * 1024),
            Some("conv_halo_c32n32_w4")
        );
        for c in HALO_CONFIGS {
            let d = pick_halo(c.cin, c.bn, [3; 3], [1; 3], [1; 3], 1, false, big, None).unwrap();
            // Same width; the same Cin, or (Cin 64 -> 32, measured faster) two 32-chunks.
            assert_eq!(d.bn, c.bn, "{}", c.name);
            assert!(
                d.cin == c.cin || (c.cin, c.bn, d.name) == (64, 32, "conv_halo_c32n32_w4"),
                "{}: default {}",
                c.name,
                d.name
            );
            // The default is the smallest of its (Cin, width), or small anyway (c16n16_r:
            // 43 KB, over the staged c16n16's 30 KB).
            assert!(
                d.smem_bytes() <= c.smem_bytes() || d.smem_bytes() <= 48 * 1024,
                "{}: default {} is small",
                c.name,
                d.name
            );
        }
        // Resident weights: 32 rows of 27 * 32 + 8 halves + the 600-row halo; 8x8x8 tile:
        // 1000-row halos, two of them; persistent grids stop at persist x SMs.
        assert_eq!(
            hc("conv_halo_c32n32_r").smem_bytes(),
            (32 * 872 + 600 * 40) * 2
        );
        assert_eq!(
            hc("conv_halo_c32n32_rb").smem_bytes(),
            (32 * 872 + 2 * 1000 * 40) * 2
        );
        assert_eq!(
            hc("conv_halo_c32n32_r").grid(2, [128; 3], 132),
            2 * 32 * 16 * 16
        );
        assert_eq!(hc("conv_halo_c32n32_rp").grid(2, [128; 3], 132), 264);
        assert_eq!(hc("conv_halo_c32n32_rp").grid(1, [4, 8, 9], 132), 2);
        assert_eq!(hc("conv_halo_c32n32_rb").tiles(2, [9, 8, 17]), 2 * 2 * 3);
        assert_eq!(
            f(32, 64, Some("conv_halo_c32n32_w4")),
            Some("conv_halo_c32n64")
        );
        // 600 halo rows of 40 halves + 2 x 32 weight rows.
        assert_eq!(hc("conv_halo_c32n32").smem_bytes(), (600 + 64) * 40 * 2);
        // Smem width 16 (phase 6): Cin 16 and even Cin 10..14 by default, the narrowest tile
        // width that holds Cout; Cin 2..8 only forced (more than half padding); odd Cin never.
        for cin in [10, 12, 14, 16] {
            assert_eq!(f(cin, 14, None), Some("conv_halo_c16n16_r"), "Cin {cin}");
            assert_eq!(f(cin, 16, None), Some("conv_halo_c16n16_r"), "Cin {cin}");
            assert_eq!(f(cin, 17, None), Some("conv_halo_c16n32"), "Cin {cin}");
            assert_eq!(f(cin, 32, None), Some("conv_halo_c16n32"), "Cin {cin}");
            assert_eq!(f(cin, 33, None), None, "Cin {cin}");
            assert_eq!(
                f(cin, 5, Some("conv_halo_c16n16")),
                Some("conv_halo_c16n16")
            );
        }
        for cin in [2, 4, 6, 8] {
            assert_eq!(f(cin, 14, None), None, "Cin {cin}");
            assert_eq!(
                f(cin, 14, Some("conv_halo_c16n16_w8")),
                Some("conv_halo_c16n16_w8")
            );
            // (A forced kernel of another width falls back to the default: none here.)
            assert_eq!(f(cin, 14, Some("conv_halo_c16n32")), None);
        }
        for cin in [0, 7, 13, 15, 18, 30] {
            assert_eq!(f(cin, 14, Some("conv_halo_c16n16")), None, "Cin {cin}");
        }
        assert!(hc("conv_halo_c16n16").accepts_cin(16) && !hc("conv_halo_c32n32").accepts_cin(16));
        // Cin 16 with Cout <= 16 no longer needs the 32-wide tile, Cin 32 still does.
        assert_eq!(f(32, 14, None), Some("conv_halo_c32n32_w4"));
        assert_eq!(
            f(16, 14, Some("conv_halo_c16n32")),
            Some("conv_halo_c16n16_r")
        );
        // Resident width-16 weights: 16 rows of 27 * 16 + 8 halves + one / two halos of 600
        // rows of 24; staged: 2 x 16 weight rows of 24.
        assert_eq!(
            hc("conv_halo_c16n16_r").smem_bytes(),
            (16 * 440 + 600 * 24) * 2
        );
        assert_eq!(
            hc("conv_halo_c16n16_rp2").smem_bytes(),
            (16 * 440 + 2 * 600 * 24) * 2
        );
        assert_eq!(hc("conv_halo_c16n16").smem_bytes(), (600 + 32) * 24 * 2);
        assert_eq!(hc("conv_halo_c16n16_rp2").grid(4, [128; 3], 132), 3 * 132);
        assert!(!is_upsampling_convt(
            [3; 3], [2; 3], [1; 3], &[1; 6], [1; 3], 1
        ));
    }
}
