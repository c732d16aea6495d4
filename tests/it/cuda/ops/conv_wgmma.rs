//! The wgmma halo conv kernels (`conv_wg_*`, kernels/conv_wgmma.cu, compute capability 9.0
//! only) on CUDA against float64: the halo kernels' shapes (partial 4x8x8 tiles on every axis,
//! zero / asymmetric pads, odd Cout, Cout above the tile width, zero-padded Cin 14, Cin in
//! chunks, activations, concat slices at even and odd offsets), each on its default kernel
//! (asserted to be a `conv_wg_*` one) and on every wgmma variant that takes it, forced; the
//! z-pair kernels (`conv_wz_*`, kernels/conv_wgmma_z.cu) among them. Four tests, so that each
//! fits a device call's time: the shapes, the persistent kernels looping over many tiles, the
//! concat slices, the stride-2 kernels.

use super::conv_halo::{slice_case, stride2_cases};
use super::*;
use voxtile::internals::cuda::host::catalogue::wgmma_all;
use voxtile::internals::cuda::host::conv_kernel::ConvKernel;
use voxtile::internals::cuda::host::select::pick_wgmma;

/// The wgmma kernel the H200 planner picks for a stride-1 3^3 conv of `cin` -> `cout`.
pub(super) fn default_wgmma(cin: usize, cout: usize) -> Option<&'static cat::HaloConfig> {
    pick_wgmma(&geom3(cin, cout, [8; 3], [8; 3], 3, 1), 227 * 1024, None)
}

fn leaky() -> Option<Op> {
    Some(Op::LeakyRelu { alpha: 0.01 })
}

#[test]
fn conv_wgmma_cases() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgmma");
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, usize, [usize; 3], [usize; 6], Option<Op>)> = vec![
        (32, 32, [9, 13, 17], [1; 6], None),
        // 16 planes: a z-pair block's one tile ends on a step with outputs (its last step's
        // staging against the previous step's stores).
        (32, 32, [16, 11, 9], [1; 6], leaky()),
        (32, 20, [7, 9, 11], [0; 6], None),
        (32, 17, [3, 1, 12], [1; 6], leaky()),
        (64, 32, [6, 10, 7], [1; 6], leaky()),
        (32, 64, [5, 9, 8], [1; 6], Some(Op::Relu)),
        (64, 64, [4, 8, 8], [1; 6], leaky()),
        (64, 33, [5, 7, 9], [2, 1, 0, 0, 1, 2], None),
        (14, 14, [9, 13, 17], [1; 6], None),
        (16, 16, [6, 10, 7], [1; 6], leaky()),
        (14, 5, [5, 7, 9], [2, 1, 0, 0, 1, 2], None),
        (14, 20, [5, 9, 8], [1; 6], leaky()),
        (16, 32, [7, 9, 11], [0, 1, 2, 2, 1, 0], None),
        // Cin in chunks; Cout 128 / 100: two 64-wide channel tiles.
        (128, 64, [5, 9, 10], [1; 6], leaky()),
        (256, 33, [4, 7, 9], [2, 1, 0, 0, 1, 2], None),
        (128, 17, [3, 9, 12], [1; 6], Some(Op::Relu)),
        (128, 128, [5, 8, 9], [1; 6], leaky()),
        (256, 100, [3, 5, 17], [0, 1, 1, 1, 0, 1], None),
        (96, 20, [5, 6, 7], [1; 6], None),
    ];
    let mut ran = Vec::new();
    for (cin, cout, sp, pads, act) in cases {
        // The default (where the planner takes a wgmma kernel), then every other wgmma kernel
        // that takes the Cin at the planner's width (the narrowest that holds Cout), forced.
        // (The stride-2 kernels: `conv_wgmma_stride2`.)
        let takes = |v: &&cat::HaloConfig| v.accepts_cin(cin) && v.wg_reps == 1 && v.stride == 1;
        let widths = || wgmma_all().filter(takes).map(|v| v.bn);
        let Some(bn) = widths()
            .filter(|&w| cout <= w)
            .min()
            .or_else(|| widths().max())
        else {
            continue;
        };
        let def = default_wgmma(cin, cout);
        assert!(
            def.is_none_or(|d| d.bn == bn),
            "{cin}->{cout}: default {def:?}"
        );
        let forced = wgmma_all()
            .filter(takes)
            .filter(|v| v.bn == bn && def.is_none_or(|d| d.name != v.name))
            .map(|v| (Some(v), v.name));
        let runs = def.map(|d| (None, d.name)).into_iter().chain(forced);
        for (tile, kern) in runs {
            b.with(|o| o.halo_tile = tile);
            let name = format!(
                "{kern}{} {cin}->{cout} {sp:?} pads {pads:?}{}",
                if tile.is_none() { " [default]" } else { "" },
                if act.is_some() { " +act" } else { "" }
            );
            let case = ConvCase::new(&name, cin, cout, sp, 3).pads(pads);
            conv_case_on(&mut b, &mut r, case.act(act.clone()), kern);
            ran.push(kern);
        }
    }
    assert!(
        wgmma_all().all(|v| v.wg_reps > 1 || v.stride != 1 || ran.contains(&v.name)),
        "every stride-1 wgmma kernel has a case: {ran:?}"
    );
}

/// The stride-2 wgmma kernels (the reach stored by parity class; `wg_s2` runs the persistent
/// `conv_wg_c32n64_s2p` at Cin 32) vs float64: W1's 32 -> 64 shape at small sizes, odd and even
/// input edges (the last tile partial, the end pad used or not), zero and asymmetric begin pads,
/// Cout 20 (odd channel pairs, one channel tile) and 128 (two tiles), Cin 64 and 96 in
/// 32-channel chunks, activations: each on the planner's pick with the switch (the implicit
/// GEMM: too few tiles for the persistent kernel, or Cin above its 32), on every stride-2 wgmma
/// kernel that takes the Cin forced, and without the switch (checked to keep the implicit
/// GEMM). Then one of more tiles than two per warpgroup (each persistent warpgroup refills its
/// halo buffer) on the planner's pick alone, checked to be `conv_wg_c32n64_s2p` (its float64
/// reference is the test's longest part). Split-K off throughout.
#[test]
fn conv_wgmma_stride2() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgmma s2");
    let def = cat::CONV_WG_C32N64_S2P.name;
    // These small convs leave SMs idle: split-K off, so that the kernel under test takes them.
    b.with(|o| o.split_k = false);
    let mut cases = stride2_cases();
    // 2 x 20 x 4 x 4 = 640 tiles of 1x8x8 outputs: more than two a warpgroup on 132 SMs (the
    // default takes the persistent kernel only there).
    cases.push((32, 64, [40, 64, 64], [1; 6], leaky()));
    let forced = wgmma_all().filter(|v| v.stride == 2);
    let runs: Vec<(Option<&'static cat::HaloConfig>, bool)> = [(None, true)]
        .into_iter()
        .chain(forced.map(|v| (Some(v), true)))
        .chain([(None, false)])
        .collect();
    let mut default_ran = false;
    let last = cases.len() - 1;
    for (i, (cin, cout, sp, pads, act)) in cases.into_iter().enumerate() {
        for &(tile, on) in if i == last { &runs[..1] } else { &runs[..] } {
            // (A forced kernel of resident weights holds one Cin chunk only.)
            if tile.is_some_and(|t| !t.accepts_cin(cin)) {
                continue;
            }
            b.with(|o| (o.wg_s2, o.halo_tile) = (on, tile));
            // The planner's pick with the switch: the persistent kernel at Cin 32 where its
            // warpgroups get two tiles or more (batch 2, `ConvKernel::choose`), else the GEMM.
            let o = [0, 1, 2].map(|i| (sp[i] + pads[i] + pads[i + 3] - 3) / 2 + 1);
            let geo = geom3(cin, cout, sp, o, 3, 2);
            let picked = matches!(ConvKernel::choose(&b.caps(), 2, &geo), ConvKernel::Halo(c) if c.name == def);
            let runs_wg = tile.is_some() || (on && picked);
            default_ran |= on && tile.is_none() && picked;
            let kern = tile.map_or(def, |t| t.name);
            let name = format!(
                "s2 {cin}->{cout} {sp:?} pads {pads:?}{} on {}",
                if act.is_some() { " +act" } else { "" },
                match (on, runs_wg) {
                    (true, true) => kern,
                    (true, false) => "the GEMM (not the switch's kernel's)",
                    _ => "the GEMM (switch off)",
                }
            );
            let case = ConvCase::new(&name, cin, cout, sp, 3)
                .st([2; 3])
                .pads(pads)
                .act(act.clone());
            if runs_wg {
                conv_case_on(&mut b, &mut r, case, kern);
            } else {
                conv_case(&mut b, &mut r, case);
                let used = kernels_used(&mut b, 2);
                assert!(
                    used.iter().all(|k| k.starts_with("conv_mma_")),
                    "{name}: ran {used:?}"
                );
            }
        }
    }
    let d = voxtile::internals::cuda::CudaOptions::default();
    b.with(|o| (o.wg_s2, o.halo_tile, o.split_k) = (d.wg_s2, None, d.split_k));
    assert!(default_ran, "a case ran {def} as the planner's pick");
}

#[test]
fn conv_wgmma_persistent() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgmma persistent");
    // The persistent kernels on more tiles than one per tile-owning warpgroup (H200: 132
    // blocks), so each loops and double-buffers its halos; partial tiles on every axis, Cin 14
    // too. (The z-pair kernels: one warpgroup owns a block's tiles, 16 planes deep.)
    // (The stride-2 `_s2p`: `conv_wgmma_stride2`.)
    for v in wgmma_all().filter(|v| v.persist > 0 && v.stride == 1) {
        b.with(|o| o.halo_tile = Some(v));
        let (sp, owners) = if v.zpair {
            ([37, 35, 72], 1)
        } else {
            ([21usize, 23, 89], 2)
        };
        assert!(v.tiles(2, sp) > owners * 132, "{}: tiles per block", v.name);
        for cin in [v.cin, 14].into_iter().filter(|&c| v.accepts_cin(c)) {
            // Cout within the kernel's width and above the next narrower one (a forced kernel
            // takes the convs of its width only): 20 on the 32-wide tiles, 5 on the 16-wide.
            let cout = if v.bn > 16 { 20 } else { 5 };
            let name = format!("{} {cin}->{cout} {sp:?} persistent", v.name);
            conv_case(
                &mut b,
                &mut r,
                ConvCase::new(&name, cin, cout, sp, 3)
                    .pads([1; 6])
                    .act(leaky()),
            );
            let used = kernels_used(&mut b, 2);
            assert!(used.iter().any(|k| k == v.name), "{name}: ran {used:?}");
        }
    }
}

#[test]
fn conv_wgmma_slices() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgmma slices");
    // Concat slices: even (32, 8) and odd (17, 5) channel offsets, Cin 32 / 14 / 16 on the
    // defaults (the family the planner picks: Cin 32 on the z-pair kernels); Cin 128 on the
    // staged kernels (forced).
    for (c, ca, cb, tile) in [
        (32usize, 32usize, 32usize, None),
        (32, 17, 32, None),
        (14, 5, 14, None),
        (16, 8, 16, None),
        (128, 17, 32, Some(cat::CONV_WG_C32N32_S4.name)),
        (128, 32, 32, Some(cat::CONV_WG_C64N32_S4.name)),
    ] {
        let name = tile.or(default_wgmma(c, cb).map(|d| d.name));
        let family = match name {
            Some(n) if n.starts_with("conv_wz") => "conv_wz",
            _ => "conv_wg",
        };
        slice_case(&mut b, &mut r, c, ca, cb, tile, family);
    }
    // The z-pair kernels' 8-channel stores (offsets 32, 64) and single ones (17, 49), forced.
    for tile in [cat::CONV_WZ_C32_Y16_H2.name, cat::CONV_WZ_C32_Y16.name] {
        for ca in [32usize, 17] {
            slice_case(&mut b, &mut r, 32, ca, 32, Some(tile), "conv_wz");
        }
    }
}
