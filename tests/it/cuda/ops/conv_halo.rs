//! The halo-tile conv kernels (`conv_halo_*`) on CUDA, every variant forced and checked to run.

use super::*;

/// The halo-tile kernels (`conv_halo_*`, stride-1 3^3, Cin 16/32/64, an even Cin < 16
/// zero-padded to 16, or Cin k x 32 in chunks; Cout <= 128) vs float64: spatial sizes that
/// leave partial 4x8x8 tiles, zero / asymmetric pads (borders), odd and even Cout, fused
/// activations, outputs written into concat slices at even and odd channel offsets (the
/// vector epilogue where Cout, ldc and the offset are multiples of 8), and (phase 7) Cin
/// 96..256 in chunks with Cout up to 128 (grid.y channel tiles). Each case runs every variant
/// that accepts its Cin at the tile width the planner picks (forced by name; Cin 6 and 2 only
/// run forced) and checks that it is the one that ran.
#[test]
fn conv_halo_cases() {
    use voxtile::internals::cuda::host::catalogue::{HaloConfig, HALO_CONFIGS};
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("halo");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_conv = true);
    // The mma.sync halo kernels (conv_wgmma.rs tests the wgmma ones). Split-K off: it takes the
    // few-voxel, long-K cases by default (256 -> 33 at 4x7x9: 504 rows, K 6912), which are here
    // for the halo kernels' Cin chunks.
    b.with(|o| o.wgmma_conv = false);
    b.with(|o| o.split_k = false);
    let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, usize, [usize; 3], [usize; 6], Option<Op>, &str)> = vec![
        (
            32,
            32,
            [9, 13, 17],
            [1; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            64,
            32,
            [6, 10, 7],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            32,
            64,
            [5, 9, 8],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C32N64.name,
        ),
        (
            64,
            64,
            [4, 8, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            32,
            20,
            [7, 9, 11],
            [0; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            64,
            33,
            [5, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            32,
            17,
            [3, 1, 12],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        // Phase 6, smem width 16: W2's 14->14 (4-byte copies, channels 14/15 zero), Cin 16
        // (16-byte copies), Cout 14 / 16 / 5 / 20 / 32, partial tiles, asymmetric pads.
        (
            14,
            14,
            [9, 13, 17],
            [1; 6],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            16,
            16,
            [6, 10, 7],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            5,
            [5, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            16,
            5,
            [3, 1, 12],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            16,
            [4, 8, 8],
            [0; 6],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            20,
            [5, 9, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C16N32.name,
        ),
        (
            16,
            32,
            [7, 9, 11],
            [0, 1, 2, 2, 1, 0],
            None,
            cat::CONV_HALO_C16N32.name,
        ),
        // Width 48 (SwinUNETR 48's stages): Cout 48 and 40, partial tiles.
        (
            48,
            48,
            [5, 9, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C48N48.name,
        ),
        (
            48,
            40,
            [4, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C48N48.name,
        ),
        (6, 14, [5, 9, 10], [1; 6], None, "forced only"),
        (2, 16, [3, 9, 8], [1, 1, 1, 0, 0, 0], None, "forced only"),
    ];
    // Every variant that accepts each case's Cin at the planner's width (the narrowest that
    // holds Cout): forced by name, so each case checks the kernel it names whatever the
    // defaults are; the default (where there is one) is the case's last field.
    let mut all = Vec::new();
    let stride1 = || HALO_CONFIGS.iter().filter(|v| v.stride == 1);
    for c in &cases {
        let ok = |v: &&HaloConfig| v.stride == 1 && v.accepts_cin(c.0) && c.1 <= v.bn;
        let bn = HALO_CONFIGS.iter().filter(ok).map(|v| v.bn).min().unwrap();
        let def = default_halo(c.0, c.1, 3, 1);
        assert_eq!(def.map_or("forced only", |d| d.name), c.5, "{c:?}");
        for v in HALO_CONFIGS.iter().filter(ok).filter(|v| v.bn == bn) {
            all.push((c.0, c.1, c.2, c.3, c.4.clone(), v.name));
        }
    }
    let names: Vec<&str> = all.iter().map(|c| c.5).collect();
    assert!(
        stride1().all(|v| names.contains(&v.name)),
        "every stride-1 halo kernel has a case: {names:?}"
    );
    for (cin, cout, sp, pads, act, kern) in all {
        b.with(|o| o.halo_tile = Some(halo_named(kern)));
        let name = format!(
            "{kern} {cin}->{cout} {sp:?} pads {pads:?}{}",
            if act.is_some() { " +act" } else { "" }
        );
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, cin, cout, sp, 3).pads(pads).act(act),
        );
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().any(|k| k == kern),
            "{name}: expected {kern}, ran {used:?}"
        );
    }
    // Chunked Cin (phase 7): the default kernel (asserted), then every variant that accepts
    // the Cin at the tile width, forced; Cout 33 / 17 / 100 / 128 (odd, two channel tiles).
    #[allow(clippy::type_complexity)]
    let chunked: Vec<(usize, usize, [usize; 3], [usize; 6], Option<Op>, &str)> = vec![
        (
            128,
            64,
            [5, 9, 10],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            256,
            33,
            [4, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            128,
            17,
            [3, 9, 12],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (192, 64, [4, 8, 8], [1; 6], None, cat::CONV_HALO_C64N64.name),
        (
            128,
            128,
            [5, 8, 9],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            256,
            100,
            [3, 5, 17],
            [0, 1, 1, 1, 0, 1],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            96,
            20,
            [5, 6, 7],
            [1; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
        // SwinUNETR 48's decoder conv 96 -> 48: two 48-channel chunks.
        (
            96,
            48,
            [4, 9, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C48N48.name,
        ),
    ];
    for (cin, cout, sp, pads, act, def) in chunked {
        // The planner's width: the narrowest that holds Cout, else 64-wide channel tiles.
        let bn = stride1()
            .filter(|v| v.accepts_cin(cin) && cout <= v.bn)
            .map(|v| v.bn)
            .min()
            .unwrap_or(64);
        let forced = stride1()
            .filter(|v| v.accepts_cin(cin) && v.bn == bn)
            .map(|v| Some(v.name));
        for tile in std::iter::once(None).chain(forced) {
            b.with(|o| o.halo_tile = tile.map(halo_named));
            let kern = tile.unwrap_or(def);
            let name = format!(
                "{kern} {cin}->{cout} {sp:?} pads {pads:?}{} (chunked Cin)",
                if act.is_some() { " +act" } else { "" }
            );
            let case = ConvCase::new(&name, cin, cout, sp, 3).pads(pads);
            conv_case_on(&mut b, &mut r, case.act(act.clone()), kern);
        }
    }
    b.with(|o| o.halo_tile = None);
    // Persistent kernels on more tiles than blocks (H200: 132 SMs x persist), so blocks loop
    // over tiles, with partial tiles on every axis; Cout 5 keeps the f64 reference cheap.
    // The zero-padding ones also with real Cin 14.
    for v in HALO_CONFIGS.iter().filter(|v| v.persist > 0) {
        b.with(|o| o.halo_tile = Some(v));
        let (sp, cout) = ([21usize, 23, 89], if v.bn == 64 { 37 } else { 5 });
        assert!(
            v.tiles(2, sp) > v.persist * 132,
            "{}: tiles per block",
            v.name
        );
        for cin in [v.cin, 14].into_iter().filter(|&c| v.accepts_cin(c)) {
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
    // Channel slices: concat [conv a (Cout ca), conv b (cb), x] written in place, with the
    // second conv at an even (32, 14, 8) and an odd (17, 5) channel offset; default kernels and
    // some variants (resident weights, persistent). Input channels c: 32, 14 / 16 on the
    // width-16 kernels, 128 in chunks. (32, 32, 32) and (16, 8, 16): both convs on the vector
    // epilogue (ldc 96 / 40, offsets 0 and 32 / 8).
    let mut cases = vec![
        (32usize, 32usize, 32usize, None),
        (32, 17, 32, None),
        (14, 14, 14, None),
        (14, 5, 14, None),
        (14, 5, 16, Some(cat::CONV_HALO_C16N16_RP2.name)),
        (16, 3, 14, Some(cat::CONV_HALO_C16N16.name)),
        (16, 8, 16, None),
        // Chunked Cin 128: the default (CONV_HALO_C32N32_W4, 4 chunks).
        (128, 17, 32, None),
        (128, 32, 64, None),
    ];
    cases.extend(experiment_slices());
    for (c, ca, cb, tile) in cases {
        slice_case(&mut b, &mut r, c, ca, cb, tile, "conv_halo");
    }
    b.with(|o| o.halo_tile = None);
}

/// Concat [conv a (Cout ca), conv b (cb), x] of a `c`-channel input written in place: both
/// convs on `tile` (None: the default) of the kernel family named by the prefix `family`.
pub(super) fn slice_case(
    b: &mut CudaBackend,
    r: &mut Rng,
    c: usize,
    ca: usize,
    cb: usize,
    tile: Option<&'static str>,
    family: &str,
) {
    b.with(|o| o.halo_tile = tile.map(halo_named));
    let sp = [5usize, 9, 10];
    let nvox = sp.iter().product::<usize>();
    let x = input2(r, c, sp);
    let wa = Tensor::new(vec![ca, c, 3, 3, 3], r.scaled(ca * c * 27, 0.03));
    let wb = Tensor::new(vec![cb, c, 3, 3, 3], r.scaled(cb * c * 27, 0.03));
    let ba = Tensor::new(vec![ca], r.scaled(ca, 0.5));
    let conv = |w: &Tensor, bias: Option<Tensor>| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [1; 6],
            groups: 1,
        })
    };
    let ct = ca + cb + c;
    let g = graph(
        c,
        vec![
            (conv(&wa, Some(ba.clone())), vec![0], ca),
            (conv(&wb, None), vec![0], cb),
            (Op::Concat { axis: 1 }, vec![1, 2, 0], ct),
        ],
    );
    let va = conv_ref(&x, &wa, Some(&ba), PAD1);
    let vb = conv_ref(&x, &wb, None, PAD1);
    let mut want = T::zeros([2, ct, sp[0], sp[1], sp[2]]);
    for n in 0..2 {
        for ch in 0..ct {
            for v in 0..nvox {
                want.d[(n * ct + ch) * nvox + v] = if ch < ca {
                    va.d[(n * ca + ch) * nvox + v]
                } else if ch < ca + cb {
                    vb.d[(n * cb + ch - ca) * nvox + v]
                } else {
                    x.d[(n * c + ch - ca - cb) * nvox + v]
                };
            }
        }
    }
    let got = run(b, &g, &x, 2);
    report(
        &format!(
            "{family} convs {c}->{ca},{cb} into concat slices (offset {ca}, {})",
            tile.unwrap_or("default")
        ),
        rel_l2(&got, &want),
    );
    let used = kernels_used(b, 2);
    // (Same-shape convs share a profile label: count kernels, not labels.)
    assert!(
        !used.is_empty()
            && used
                .iter()
                .all(|k| k.starts_with(family) && tile.is_none_or(|t| k == t)),
        "both convs on a {family} kernel {tile:?}: {used:?}"
    );
    b.with(|o| o.halo_tile = None);
}

/// The concat-slice cases of the resident, persistent and staged-ring variants: experiments,
/// which exist with the `kernel-experiments` feature only.
fn experiment_slices() -> Vec<(usize, usize, usize, Option<&'static str>)> {
    #[cfg(feature = "kernel-experiments")]
    return vec![
        (32, 17, 32, Some(cat::CONV_HALO_C32N32_RP.name)),
        (32, 32, 32, Some(cat::CONV_HALO_C32N32_RB.name)),
        (128, 32, 32, Some(cat::CONV_HALO_C64N32_S4.name)),
    ];
    #[cfg(not(feature = "kernel-experiments"))]
    vec![]
}

/// A stride-2 conv case: Cin, Cout, input dims, pads (begins, ends), activation.
pub(super) type Stride2Case = (usize, usize, [usize; 3], [usize; 6], Option<Op>);

/// The stride-2 kernels' shapes (`conv_halo_stride2_cases`, `conv_wgmma_stride2`): W1's
/// 32 -> 64 at small sizes, odd and even input edges, zero and asymmetric begin pads, Cout 20
/// and 128, Cin 64 and 96 in 32-channel chunks, activations.
pub(super) fn stride2_cases() -> Vec<Stride2Case> {
    let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
    vec![
        (32, 64, [16, 16, 16], [1; 6], None),
        (32, 64, [9, 13, 17], [1; 6], leaky()),
        (32, 20, [7, 10, 21], [0; 6], None),
        (32, 64, [8, 11, 18], [1, 0, 1, 0, 1, 1], Some(Op::Relu)),
        (64, 128, [10, 9, 16], [1; 6], leaky()),
        (96, 33, [5, 7, 19], [1; 6], None),
    ]
}

/// The stride-2 halo kernels (`halo_s2`; `conv_halo_c32n64_s2`: the 2x4x8 tile's 5x9x17 input
/// reach, x-rows stored even voxels first) vs float64: W1's 32 -> 64 shape at small sizes, odd
/// and even input edges (the last tile partial, the end pad used or not), zero and asymmetric
/// begin pads, Cout 20 (odd channel pairs, one channel tile) and 128 (two tiles), Cin 64 and 96
/// in 32-channel chunks; each checked to run the stride-2 kernel, and the default (switch off)
/// checked to keep the implicit GEMM.
#[test]
fn conv_halo_stride2_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("halo s2");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_tile = None);
    let kern = cat::CONV_HALO_C32N64_S2.name;
    for (cin, cout, sp, pads, act) in stride2_cases() {
        for on in [true, false] {
            b.with(|o| o.halo_s2 = on);
            let name = format!(
                "s2 {cin}->{cout} {sp:?} pads {pads:?}{}{}",
                if act.is_some() { " +act" } else { "" },
                if on { "" } else { " (switch off)" }
            );
            conv_case(
                &mut b,
                &mut r,
                ConvCase::new(&name, cin, cout, sp, 3)
                    .st([2; 3])
                    .pads(pads)
                    .act(act.clone()),
            );
            let used = kernels_used(&mut b, 2);
            assert_eq!(
                used.iter().any(|k| k == kern),
                on,
                "{name}: {kern} expected {on}, ran {used:?}"
            );
        }
    }
    b.with(|o| o.halo_s2 = false);
}
