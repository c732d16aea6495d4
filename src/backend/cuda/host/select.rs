//! Which tiled conv kernel runs a conv (host only): the mma tile for a GEMM shape, the halo
//! kernel for a stride-1 3^3 conv, and the upsampling test for a transposed conv.

use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::catalogue::{
    HaloConfig, MmaConfig, WgkConfig, CONV_MMA_M128N128_V8, CONV_MMA_M128N32_V1,
    CONV_MMA_M128N32_V2, CONV_MMA_M128N32_V8, CONV_MMA_M128N64_V1, CONV_MMA_M128N64_V2,
    CONV_MMA_M128N64_V8, CONV_MMA_M256N32_V8, HALO_CONFIGS, WGK_CONFIGS, WGMMA_CONFIGS,
    WGMMA_FORCED,
};
use crate::model::graph::Op;

/// Shape facts of one conv node the kernel choice needs.
#[derive(Clone, Copy, Debug)]
pub struct ConvGeom {
    pub xs: Shape,
    pub os: Shape,
    pub k: [usize; 3],
    pub stride: [usize; 3],
    pub dil: [usize; 3],
    /// Begin pads.
    pub pads: [usize; 3],
    pub groups: usize,
    pub transposed: bool,
    pub upsample: bool,
}

impl ConvGeom {
    /// The geometry of a conv / transposed conv `op` from input shape `xs` to output shape
    /// `os` (None for other ops).
    pub fn of(op: &Op, xs: Shape, os: Shape) -> Option<ConvGeom> {
        let (w, stride, dil, pads, groups, upsample) = match op {
            Op::Conv(c) => (
                &c.weight.shape,
                c.stride,
                c.dilation,
                &c.pads,
                c.groups,
                None,
            ),
            Op::ConvTranspose(c) => (
                &c.weight.shape,
                c.stride,
                c.dilation,
                &c.pads,
                c.groups,
                Some(c.output_padding),
            ),
            _ => return None,
        };
        let k = [w[2], w[3], w[4]];
        Some(ConvGeom {
            xs,
            os,
            k,
            stride,
            dil,
            pads: [pads[0], pads[1], pads[2]],
            groups,
            transposed: upsample.is_some(),
            upsample: upsample
                .is_some_and(|op| is_upsampling_convt(k, stride, dil, pads, op, groups)),
        })
    }
}

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
    let blocks = |bm: usize, bn: usize| m.div_ceil(bm) * n.div_ceil(bn);
    if vw == 2 {
        return if n <= 32 {
            &CONV_MMA_M128N32_V2
        } else {
            &CONV_MMA_M128N64_V2
        };
    }
    if vw != 8 {
        return if n <= 32 {
            &CONV_MMA_M128N32_V1
        } else {
            &CONV_MMA_M128N64_V1
        };
    }
    if n <= 32 {
        if blocks(256, 32) >= 4 * sms {
            &CONV_MMA_M256N32_V8
        } else {
            &CONV_MMA_M128N32_V8
        }
    } else if n <= 64 || blocks(128, 128) < sms {
        &CONV_MMA_M128N64_V8
    } else {
        &CONV_MMA_M128N128_V8
    }
}

/// K splits for an mma conv of `rows` GEMM rows (the batch's), `cout` columns and K = `k` on
/// tile `t` with `sm` SMs: 1 unless its output tiles fill under `per_sm` / 2 blocks an SM and K
/// runs 128 tiles of 32 or more (SwinUNETR's 768-channel 3^3 convs on 3^3 / 6^3 voxels, nnU-Net's
/// 320-channel 4^3 ones); then enough splits to reach about `per_sm` blocks an SM, each at least
/// 32 K tiles long, at most 16 (the reduce reads every partial). `per_sm` is 1 by default; 2
/// with `CudaOptions::split_k_fill` (W1's 8³ convs: 80 tiles on 132 SMs, unsplit at 1).
pub fn split_k(
    sm: usize,
    rows: usize,
    cout: usize,
    k: usize,
    t: &MmaConfig,
    per_sm: usize,
) -> usize {
    let tiles = rows.div_ceil(t.bm) * cout.div_ceil(t.bn);
    let nk = k.div_ceil(32);
    if tiles == 0 || tiles * 2 > sm * per_sm || nk < 128 {
        return 1;
    }
    (sm * per_sm / tiles).min(nk / 32).clamp(1, 16)
}

/// Largest Cout that takes a halo kernel by default (grid.y over 64-wide tiles; a forced
/// variant runs any Cout). Cout 65..128 (W1: 128->128 and 256->128 at 32^3) load the halo once
/// per 64-wide output tile: 2 x 600/256 input reads per output voxel, vs 27 for conv_mma's
/// per-tap gather. Above 128 the W1 layers are 16^3 and smaller, where 256-voxel tiles give too
/// few blocks (256->256 at 16^3, batch 4: 64 tiles x 4 channel tiles, under one wave).
pub const HALO_MAX_COUT: usize = 128;

/// The halo kernel for a conv, when one applies: not transposed, one group, kernel 3^3,
/// stride 1 (or 2 on every axis, on the stride-2 configs), dilation 1 (any pads), Cin 16, 32, 64 or a multiple of 32 (Cin > 64 in chunks;
/// an even Cin in 10..14 on the zero-padding width-16 kernels), Cout <=
/// HALO_MAX_COUT (above the tile width: grid.y over bn-wide tiles), and its shared memory within
/// `smem_max` (the device's opt-in limit per block). The tile width is the narrowest that holds
/// Cout (64 above 64). Default: the first HALO_CONFIGS entry that runs it (the list is in
/// measured order of preference). `g` gives Cin (`xs[0]`), Cout (`os[0]`) and the geometry.
/// `force` names a HALO_CONFIGS entry to
/// use instead when it accepts the Cin, has the tile width and fits (any Cout); forced, a
/// padding kernel also runs Cin 2..8 (more than half of its channels padding: not a default).
pub fn pick_halo(
    g: &ConvGeom,
    smem_max: usize,
    force: Option<&str>,
) -> Option<&'static HaloConfig> {
    pick_halo_in(HALO_CONFIGS, g, smem_max, force)
}

/// The wgmma halo kernel (`conv_wg_*`) for a conv, by [`pick_halo`]'s rules over
/// [`WGMMA_CONFIGS`] (or the forced-only [`WGMMA_FORCED`] one `force` names); the caller asks
/// only on compute capability 9.0. By default a z-pair kernel (`conv_wz_*`) takes Cout <= 32
/// only: it was measured on those (wider Cout runs it in 32-channel tiles, forced).
pub fn pick_wgmma(
    g: &ConvGeom,
    smem_max: usize,
    force: Option<&str>,
) -> Option<&'static HaloConfig> {
    force
        .and_then(|f| pick_halo_in(WGMMA_FORCED, g, smem_max, Some(f)).filter(|c| c.name == f))
        .or_else(|| {
            pick_halo_in(WGMMA_CONFIGS, g, smem_max, force)
                .filter(|c| !c.zpair || g.os[0] <= c.bn || force == Some(c.name))
        })
}

/// The wgmma implicit GEMM (`conv_wgk_*`) for a conv of `batch` windows on `sms` SMs, when it
/// runs it: not transposed, one group, stride 1 or 2 on every axis (a config of that stride;
/// any kernel, pads, dilation), Cin a multiple of the config's `ck`, its shared memory within
/// `smem_max`. `force` takes every such conv of its stride. By default Cout 97..128 on the
/// 128-wide tile and 129..256 on the 256-wide one (at most a quarter of the tile padding,
/// where measured: W1's 16³ convs 3.1x `conv_mma_m128n128`, its 32³ ones 1.7x
/// `conv_halo_c64n64`), where the tiles fill half the SMs or more (fewer: the split-K GEMM).
/// The caller asks on compute capability 9.0 only.
pub fn pick_wgk(
    g: &ConvGeom,
    batch: usize,
    sms: usize,
    smem_max: usize,
    force: Option<&'static WgkConfig>,
) -> Option<&'static WgkConfig> {
    let (cin, cout) = (g.xs[0], g.os[0]);
    let runs = |c: &WgkConfig| {
        !c.stats
            && !c.up
            && !g.transposed
            && g.groups == 1
            && g.stride == [c.stride; 3]
            && cout > 0
            && c.fits(cin, smem_max)
    };
    if let Some(c) = force {
        return runs(c).then_some(c);
    }
    let bn = if cout <= 128 { 128 } else { 256 };
    let c = WGK_CONFIGS
        .iter()
        .find(|c| c.bn == bn && c.stride == g.stride[0] && !c.stats && !c.up)?;
    let tiles = c.tiles(batch, [g.os[1], g.os[2], g.os[3]]) * c.cout_tiles(cout);
    (runs(c) && (97..=256).contains(&cout) && 2 * tiles >= sms).then_some(c)
}

/// The fused parity classes of a strided transposed conv on `conv_wgk_up_*` (the caller asks
/// on compute capability 9.0, for `CudaOptions::wgk_convt`): Cin at least
/// [`WGK_UP_MIN_TAP_STEPS`] k-steps of its `ck` a tap (any multiple of `ck` where `force` names
/// it), any number of classes x Cout columns (tiles of its width over grid.y), its shared memory
/// within `smem_max`.
pub fn pick_wgk_up(
    cin: usize,
    columns: usize,
    smem_max: usize,
    force: Option<&'static WgkConfig>,
) -> Option<&'static WgkConfig> {
    let runs = |c: &WgkConfig| c.up && !c.stats && columns > 0 && c.fits(cin, smem_max);
    if let Some(c) = force {
        return runs(c).then_some(c);
    }
    WGK_CONFIGS
        .iter()
        .find(|c| runs(c) && cin / c.ck >= WGK_UP_MIN_TAP_STEPS)
}

/// With one k-step a tap (8 a tile) `conv_wgk_up_n128`'s epilogue, one block an SM, is not hidden
/// behind a mainloop: W2's 32 -> 14 at 128^3 took 0.640 ms on it against 0.595 on
/// `convt_up_m128n128_v8` (two blocks an SM), while its Cin 64, 128 and 384 layers took
/// 0.092 / 0.030 / 0.033 ms against 0.111 / 0.048 / 0.062 (H100, PERF_NOTES session 41).
pub const WGK_UP_MIN_TAP_STEPS: usize = 2;

/// The default z-pair kernel for Cin `cin` (the first of [`WGMMA_CONFIGS`]): what a Cin chunk
/// of a conv run split (`host::concat_split`) is forced to, at any Cout (32-channel tiles).
pub fn zpair_config(cin: usize) -> Option<&'static HaloConfig> {
    WGMMA_CONFIGS.iter().find(|c| c.zpair && c.accepts_cin(cin))
}

/// [`pick_halo`] over `configs` (in preference order).
fn pick_halo_in<'a>(
    configs: &'a [HaloConfig],
    g: &ConvGeom,
    smem_max: usize,
    force: Option<&str>,
) -> Option<&'a HaloConfig> {
    let (cin, cout) = (g.xs[0], g.os[0]);
    // One stride on every axis, a config's (1, or 2 on the stride-2 configs).
    let s = g.stride[0];
    if g.transposed
        || g.groups != 1
        || g.k != [3; 3]
        || g.stride != [s; 3]
        || g.dil != [1; 3]
        || cout == 0
    {
        return None;
    }
    let runs = |c: &&HaloConfig| {
        c.stride == s && c.accepts_cin(cin) && c.smem_bytes() as usize <= smem_max
    };
    let widths = || configs.iter().filter(runs).map(|c| c.bn);
    // Cout above every width: grid.y channel tiles, on the width >= 32 configs only.
    let tiled = || {
        configs
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
        if let Some(c) = configs.iter().filter(fits).find(|c| c.name == f) {
            return Some(c);
        }
    }
    if cout > HALO_MAX_COUT {
        return None;
    }
    // The first line that runs it (measured, PERF_NOTES: Cin 64 -> Cout 32 runs
    // faster as two 32-channel chunks on c32n32_w4 than on c64n32, 1.646 vs 1.728 ms).
    configs
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::host::catalogue::*;

    /// A conv of Cin `ci` -> Cout `co` (8^3 in and out: the halo choice ignores the size).
    fn geom(
        ci: usize,
        co: usize,
        k: [usize; 3],
        stride: [usize; 3],
        dil: [usize; 3],
        groups: usize,
        transposed: bool,
    ) -> ConvGeom {
        ConvGeom {
            xs: [ci, 8, 8, 8],
            os: [co, 8, 8, 8],
            k,
            stride,
            dil,
            pads: [1; 3],
            groups,
            transposed,
            upsample: false,
        }
    }

    /// The wgmma implicit GEMM: W1's 16³ convs (Cin 256 / 512, Cout 256) at batch 4 (128
    /// tiles) on the 256-wide tile, not at batch 2 (64 tiles: under half the SMs); its 32³ ones
    /// (Cout 128) on the 128-wide one; its stride-2 64 -> 128 and 128 -> 256 on the stride-2
    /// twins. Cout 96 and 320, Cin 96, stride 3, mixed strides or a grouped conv not by
    /// default; forced, any Cout, tile count, kernel size or dilation, but never another
    /// stride, Cin 96, a transposed conv, or past shared memory.
    #[test]
    fn wgk_choice() {
        let at = |ci, co, sp: usize, k: usize| ConvGeom {
            xs: [ci, sp, sp, sp],
            os: [co, sp, sp, sp],
            ..geom(ci, co, [k; 3], [1; 3], [1; 3], 1, false)
        };
        let s2 = |ci, co, sp: usize| ConvGeom {
            xs: [ci, 2 * sp, 2 * sp, 2 * sp],
            stride: [2; 3],
            ..at(ci, co, sp, 3)
        };
        let big = 227 * 1024;
        let pick = |g: &ConvGeom, n, f| pick_wgk(g, n, 132, big, f).map(|c| c.name);
        for (g, n, want) in [
            (at(256, 256, 16, 3), 4, Some(&CONV_WGK_N256)),
            (at(512, 256, 16, 3), 4, Some(&CONV_WGK_N256)),
            (at(256, 256, 16, 3), 2, None),
            (at(128, 128, 32, 3), 4, Some(&CONV_WGK_N128)),
            (at(256, 128, 32, 3), 1, Some(&CONV_WGK_N128)),
            (s2(64, 128, 32), 4, Some(&CONV_WGK_N128_S2)),
            (s2(128, 256, 16), 4, Some(&CONV_WGK_N256_S2)),
            (at(256, 96, 32, 3), 4, None),
            (at(256, 320, 16, 3), 4, None),
            (at(96, 256, 16, 3), 4, None),
        ] {
            assert_eq!(pick(&g, n, None), want.map(|c| c.name), "{g:?} x{n}");
        }
        let odd = [
            ConvGeom {
                stride: [3; 3],
                ..at(256, 256, 16, 3)
            },
            ConvGeom {
                stride: [1, 2, 2],
                ..at(256, 256, 16, 3)
            },
            ConvGeom {
                groups: 2,
                ..at(256, 256, 16, 3)
            },
        ];
        for g in odd {
            assert_eq!(pick(&g, 4, None), None, "{g:?}");
        }
        let f = Some(&CONV_WGK_N128);
        for g in [at(64, 40, 4, 1), at(128, 320, 8, 3), at(64, 64, 5, 5)] {
            assert_eq!(pick(&g, 1, f), Some(CONV_WGK_N128.name), "{g:?}");
        }
        let t = ConvGeom {
            transposed: true,
            ..at(64, 64, 8, 3)
        };
        for g in [s2(64, 64, 8), at(96, 64, 8, 3), t] {
            assert_eq!(pick(&g, 4, f), None, "{g:?}");
        }
        assert_eq!(
            pick(&s2(64, 64, 8), 1, Some(&CONV_WGK_N128_S2)),
            Some(CONV_WGK_N128_S2.name)
        );
        let small = CONV_WGK_N256.smem_bytes() as usize - 1;
        assert_eq!(pick_wgk(&at(256, 256, 16, 3), 4, 132, small, None), None);
        assert!(WGK_CONFIGS.iter().all(|c| c.smem_bytes() as usize <= big));
    }

    #[test]
    fn mma_tile_choice_follows_cout_and_fills_the_gpu() {
        // K1: 2x128^3 voxels, Cout 32: the tall tile.
        assert_eq!(pick_mma(2 << 21, 32, 8, 132).name, CONV_MMA_M256N32_V8.name);
        assert_eq!(pick_mma(4 * 512, 32, 8, 132).name, CONV_MMA_M128N32_V8.name);
        assert_eq!(pick_mma(4 << 18, 64, 8, 132).name, CONV_MMA_M128N64_V8.name);
        assert_eq!(
            pick_mma(4 << 15, 128, 8, 132).name,
            CONV_MMA_M128N128_V8.name
        );
        // 8^3 x 4 voxels, Cout 320: 16 x 3 blocks of 128x128 would leave most SMs idle.
        assert_eq!(
            pick_mma(4 * 512, 320, 8, 132).name,
            CONV_MMA_M128N64_V8.name
        );
        assert_eq!(pick_mma(1000, 32, 1, 132).name, CONV_MMA_M128N32_V1.name);
        assert_eq!(
            pick_mma(1000, 14, gather_width(14), 132).name,
            CONV_MMA_M128N32_V2.name
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
        let h = |ci, co, k, s, d, g, t, m| {
            pick_halo(&geom(ci, co, k, s, d, g, t), m, None).map(|c| c.name)
        };
        let big = 227 * 1024;
        assert_eq!(
            h(32, 32, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C32N32_W4.name)
        );
        assert_eq!(
            h(64, 32, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C32N32_W4.name)
        );
        assert_eq!(
            h(32, 17, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C32N32_W4.name)
        );
        assert_eq!(
            h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C64N64.name)
        );
        assert_eq!(
            h(32, 48, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C32N64.name)
        );
        // sm_86's 99 KB: c64n64 (105 KB) does not fit, c32n64 runs Cin 64 as 2 chunks.
        assert_eq!(
            h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, 99 * 1024),
            Some(CONV_HALO_C32N64.name)
        );
        assert_eq!(h(64, 64, [3; 3], [1; 3], [1; 3], 1, false, 50 * 1024), None);
        // Chunked Cin : the largest chunk that divides Cin; Cout 65..128 in 2 tiles.
        for (ci, co, want) in [
            (128, 64, CONV_HALO_C64N64.name),
            (256, 64, CONV_HALO_C64N64.name),
            (192, 33, CONV_HALO_C48N48.name),
            (96, 48, CONV_HALO_C48N48.name),
            (128, 32, CONV_HALO_C32N32_W4.name),
            (96, 64, CONV_HALO_C32N64.name),
            (96, 20, CONV_HALO_C32N32_W4.name),
            (160, 32, CONV_HALO_C32N32_W4.name),
            (128, 128, CONV_HALO_C64N64.name),
            (256, 128, CONV_HALO_C64N64.name),
            (64, 100, CONV_HALO_C64N64.name),
        ] {
            assert_eq!(
                h(ci, co, [3; 3], [1; 3], [1; 3], 1, false, big),
                Some(want),
                "{ci}->{co}"
            );
        }
        assert_eq!(h(256, 256, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(
            h(48, 32, [3; 3], [1; 3], [1; 3], 1, false, big),
            Some(CONV_HALO_C48N48.name)
        );
        assert_eq!(h(40, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(0, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(24, 32, [3; 3], [1; 3], [1; 3], 1, false, big), None);
        // Stride 2 on every axis: the stride-2 config (Cin k x 32; the caller's `halo_s2`
        // decides whether it is asked), never a stride-1 one; mixed or larger strides: none.
        let s2 = Some(CONV_HALO_C32N64_S2.name);
        assert_eq!(h(32, 32, [3; 3], [2; 3], [1; 3], 1, false, big), s2);
        assert_eq!(h(64, 128, [3; 3], [2; 3], [1; 3], 1, false, big), s2);
        assert_eq!(h(16, 32, [3; 3], [2; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 64, [3; 3], [2, 1, 2], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 64, [3; 3], [3; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 256, [3; 3], [2; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [2; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [1; 3], [1; 3], [1; 3], 1, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [1; 3], 2, false, big), None);
        assert_eq!(h(32, 32, [3; 3], [1; 3], [1; 3], 1, true, big), None);
        let f = |ci, co, n| {
            pick_halo(&geom(ci, co, [3; 3], [1; 3], [1; 3], 1, false), big, n).map(|c| c.name)
        };
        assert_eq!(
            f(32, 32, Some(CONV_HALO_C32N32_W4.name)),
            Some(CONV_HALO_C32N32_W4.name)
        );
        assert_eq!(
            f(64, 30, Some(CONV_HALO_C64N32_W4.name)),
            Some(CONV_HALO_C64N32_W4.name)
        );
        // Forced: any Cout (grid.y), chunked Cin on a staged kernel; resident weights hold one
        // chunk only, so a forced resident kernel on Cin 128 falls back to the default.
        assert_eq!(
            f(256, 256, Some(CONV_HALO_C64N64_H2.name)),
            Some(CONV_HALO_C64N64_H2.name)
        );
        assert_eq!(
            f(128, 64, Some(CONV_HALO_C32N64.name)),
            Some(CONV_HALO_C32N64.name)
        );
        let hc = |n| halo_config(n).unwrap();
        assert!(hc(CONV_HALO_C64N64.name).accepts_cin(320));
        assert!(!hc(CONV_HALO_C64N64.name).accepts_cin(96));
        assert_eq!(hc(CONV_HALO_C64N64.name).cout_tiles(128), 2);
        assert_eq!(hc(CONV_HALO_C64N64.name).cout_tiles(129), 3);
        assert_eq!(hc(CONV_HALO_C32N32.name).cout_tiles(17), 1);
        // Two weight stages + two 600-row halos of 64 + 8 / 32 + 8 halves.
        assert_eq!(
            hc(CONV_HALO_C64N64_H2.name).smem_bytes(),
            (2 * 64 * 72 + 2 * 600 * 72) * 2
        );
        assert_eq!(
            hc(CONV_HALO_C32N64_H2.name).smem_bytes(),
            (2 * 64 * 40 + 2 * 600 * 40) * 2
        );
        // A forced Cin-32 staged tile runs Cin 64 in 2 chunks.
        assert_eq!(
            f(64, 32, Some(CONV_HALO_C32N32_W4.name)),
            Some(CONV_HALO_C32N32_W4.name)
        );
        for c in HALO_CONFIGS {
            let d = pick_halo(
                &geom(c.cin, c.bn, [3; 3], [1; 3], [1; 3], 1, false),
                big,
                None,
            )
            .unwrap();
            // Same width; the same Cin, or (Cin 64 -> 32, measured faster) two 32-chunks.
            assert_eq!(d.bn, c.bn, "{}", c.name);
            assert!(
                d.cin == c.cin || (c.cin, c.bn, d.name) == (64, 32, CONV_HALO_C32N32_W4.name),
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
        assert_eq!(
            f(32, 64, Some(CONV_HALO_C32N32_W4.name)),
            Some(CONV_HALO_C32N64.name)
        );
        // 600 halo rows of 40 halves + 2 x 32 weight rows.
        assert_eq!(hc(CONV_HALO_C32N32.name).smem_bytes(), (600 + 64) * 40 * 2);
        // Smem width 16: Cin 16 and even Cin 10..14 by default, the narrowest tile
        // width that holds Cout; Cin 2..8 only forced (more than half padding); odd Cin never.
        for cin in [10, 12, 14, 16] {
            assert_eq!(f(cin, 14, None), Some(CONV_HALO_C16N16_R.name), "Cin {cin}");
            assert_eq!(f(cin, 16, None), Some(CONV_HALO_C16N16_R.name), "Cin {cin}");
            assert_eq!(f(cin, 17, None), Some(CONV_HALO_C16N32.name), "Cin {cin}");
            assert_eq!(f(cin, 32, None), Some(CONV_HALO_C16N32.name), "Cin {cin}");
            assert_eq!(f(cin, 33, None), None, "Cin {cin}");
            assert_eq!(
                f(cin, 5, Some(CONV_HALO_C16N16.name)),
                Some(CONV_HALO_C16N16.name)
            );
        }
        for cin in [2, 4, 6, 8] {
            assert_eq!(f(cin, 14, None), None, "Cin {cin}");
            assert_eq!(
                f(cin, 14, Some(CONV_HALO_C16N16_W8.name)),
                Some(CONV_HALO_C16N16_W8.name)
            );
            // (A forced kernel of another width falls back to the default: none here.)
            assert_eq!(f(cin, 14, Some(CONV_HALO_C16N32.name)), None);
        }
        for cin in [0, 7, 13, 15, 18, 30] {
            assert_eq!(f(cin, 14, Some(CONV_HALO_C16N16.name)), None, "Cin {cin}");
        }
        assert!(
            hc(CONV_HALO_C16N16.name).accepts_cin(16) && !hc(CONV_HALO_C32N32.name).accepts_cin(16)
        );
        // Cin 16 with Cout <= 16 no longer needs the 32-wide tile, Cin 32 still does.
        assert_eq!(f(32, 14, None), Some(CONV_HALO_C32N32_W4.name));
        assert_eq!(
            f(16, 14, Some(CONV_HALO_C16N32.name)),
            Some(CONV_HALO_C16N16_R.name)
        );
        // Resident width-16 weights: 16 rows of 27 * 16 + 8 halves + one / two halos of 600
        // rows of 24; staged: 2 x 16 weight rows of 24.
        assert_eq!(
            hc(CONV_HALO_C16N16_R.name).smem_bytes(),
            (16 * 440 + 600 * 24) * 2
        );
        assert_eq!(
            hc(CONV_HALO_C16N16_RP2.name).smem_bytes(),
            (16 * 440 + 2 * 600 * 24) * 2
        );
        assert_eq!(hc(CONV_HALO_C16N16.name).smem_bytes(), (600 + 32) * 24 * 2);
        assert_eq!(
            hc(CONV_HALO_C16N16_RP2.name).grid(4, [128; 3], 132),
            3 * 132
        );
        // One block per tile where not persistent.
        assert_eq!(
            hc(CONV_HALO_C16N16_R.name).grid(2, [128; 3], 132),
            2 * 32 * 16 * 16
        );
        assert!(!is_upsampling_convt(
            [3; 3], [2; 3], [1; 3], &[1; 6], [1; 3], 1
        ));
    }

    /// The experiments (`kernel-experiments`): forced by name where they accept the Cin and fit,
    /// never a default; a resident kernel (one Cin chunk) or one over the device's smem falls
    /// back to the default.
    #[cfg(feature = "kernel-experiments")]
    #[test]
    fn forced_experiments() {
        let big = 227 * 1024;
        let f = |ci, co, n| {
            pick_halo(&geom(ci, co, [3; 3], [1; 3], [1; 3], 1, false), big, n).map(|c| c.name)
        };
        let hc = |n| halo_config(n).unwrap();
        assert_eq!(
            f(128, 32, Some(CONV_HALO_C64N32_RP.name)),
            Some(CONV_HALO_C32N32_W4.name)
        );
        assert_eq!(f(256, 256, Some(CONV_HALO_C64N32_RP.name)), None);
        assert!(hc(CONV_HALO_C32N32_S4.name).accepts_cin(96));
        assert!(!hc(CONV_HALO_C32N32_RP.name).accepts_cin(64));
        assert_eq!(
            f(64, 32, Some(CONV_HALO_C32N32_RP.name)),
            Some(CONV_HALO_C32N32_W4.name)
        );
        // Where they fit; the 216 KB 8x8x8 tile falls back to the default under sm_80's 163 KB.
        assert_eq!(
            f(32, 32, Some(CONV_HALO_C32N32_RP.name)),
            Some(CONV_HALO_C32N32_RP.name)
        );
        let g =
            |n, m| pick_halo(&geom(32, 32, [3; 3], [1; 3], [1; 3], 1, false), m, n).map(|c| c.name);
        assert_eq!(
            g(Some(CONV_HALO_C32N32_RB.name), 163 * 1024),
            Some(CONV_HALO_C32N32_W4.name)
        );
        // Resident weights: 32 rows of 27 * 32 + 8 halves + the 600-row halo; 8x8x8 tile:
        // 1000-row halos, two of them; persistent grids stop at persist x SMs.
        assert_eq!(
            hc(CONV_HALO_C32N32_R.name).smem_bytes(),
            (32 * 872 + 600 * 40) * 2
        );
        assert_eq!(
            hc(CONV_HALO_C32N32_RB.name).smem_bytes(),
            (32 * 872 + 2 * 1000 * 40) * 2
        );
        assert_eq!(
            hc(CONV_HALO_C32N32_R.name).grid(2, [128; 3], 132),
            2 * 32 * 16 * 16
        );
        assert_eq!(hc(CONV_HALO_C32N32_RP.name).grid(2, [128; 3], 132), 264);
        assert_eq!(hc(CONV_HALO_C32N32_RP.name).grid(1, [4, 8, 9], 132), 2);
        assert_eq!(hc(CONV_HALO_C32N32_RB.name).tiles(2, [9, 8, 17]), 2 * 2 * 3);
    }

    /// The experiments never change a default: for every stride-1 3^3 conv with Cin and Cout
    /// up to 320, at the smem limits of sm_86, sm_80 and sm_90 (and a small one), the choice
    /// over the whole list is the choice over the list without them (the default build's).
    #[cfg(feature = "kernel-experiments")]
    #[test]
    fn experiments_change_no_default() {
        let plain: Vec<HaloConfig> = HALO_CONFIGS
            .iter()
            .filter(|c| !c.experiment)
            .copied()
            .collect();
        assert!(plain.len() < HALO_CONFIGS.len());
        for smem in [48 * 1024, 99 * 1024, 163 * 1024, 227 * 1024] {
            for cin in 1..=320 {
                for cout in 1..=320 {
                    let g = geom(cin, cout, [3; 3], [1; 3], [1; 3], 1, false);
                    let all = pick_halo(&g, smem, None).map(|c| c.name);
                    let def = pick_halo_in(&plain, &g, smem, None).map(|c| c.name);
                    assert_eq!(all, def, "{cin}->{cout} at {smem} bytes");
                }
            }
        }
    }
}
