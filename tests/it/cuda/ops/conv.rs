//! Convolutions and transposed convolutions on CUDA: random geometries, every mma tile forced,
//! the upsampling GEMM and its vector epilogue.

use super::*;

#[test]
fn conv_variants() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("conv");
    // Even Cin that is not a multiple of 8: the 4-byte gather tiles (`_v2`); the 1x1x1 head
    // kernels with Cout 14..32, Cin 8..256 and a fused activation.
    for (name, ci, co, k, st, pads) in [
        (
            "3^3 14->14 (v2 gather)",
            14usize,
            14usize,
            3usize,
            1usize,
            1usize,
        ),
        ("3^3 s2 6->40 (v2 gather)", 6, 40, 3, 2, 1),
        ("1x1 head 40->20 (conv1x1_n32)", 40, 20, 1, 1, 0),
        // The widest Cin (its staging past the default 48 KB of shared memory) and the
        // narrowest (one k-step of 16, half of it padding).
        ("1x1 head 256->14 (conv1x1_n16)", 256, 14, 1, 1, 0),
        ("1x1 head 8->32 (conv1x1_n32)", 8, 32, 1, 1, 0),
    ] {
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(name, ci, co, [9, 7, 11], k)
                .st([st; 3])
                .pads([pads; 6])
                .act(Some(Op::LeakyRelu { alpha: 0.1 })),
        );
    }
    for c in [
        ConvCase::new("conv 3^3 16->32 pad1", 16, 32, [10, 9, 11], 3).pads([1; 6]),
        ConvCase::new("conv 3^3 32->32 pad1 +leaky", 32, 32, [8, 8, 8], 3)
            .pads([1; 6])
            .act(Some(Op::LeakyRelu { alpha: 0.01 })),
        ConvCase::new("conv 3^3 stride2 16->64", 16, 64, [12, 10, 9], 3)
            .st([2; 3])
            .pads([1; 6]),
        ConvCase::new(
            "conv 3^3 dilation 4 pad 4 (meshnet) +elu",
            8,
            20,
            [12, 12, 12],
            3,
        )
        .dl([4; 3])
        .pads([4; 6])
        .act(Some(Op::Elu { alpha: 1.0 })),
        ConvCase::new("conv Cin=1 3^3 -> 8 +relu", 1, 8, [11, 10, 9], 3)
            .pads([1; 6])
            .act(Some(Op::Relu)),
        ConvCase::new("conv Cin=3 asym pads 2x3x1 s(1,2,1)", 3, 40, [9, 10, 8], 1)
            .k([2, 3, 1])
            .st([1, 2, 1])
            .pads([0, 1, 0, 1, 2, 0]),
        ConvCase::new("conv 1x1x1 head 32->4 +sigmoid", 32, 4, [8, 9, 10], 1)
            .act(Some(Op::Sigmoid)),
        ConvCase::new("conv 1x1x1 head 20->3", 20, 3, [8, 9, 10], 1),
        ConvCase::new("conv 80->80 3^3 (Cout>64) +tanh", 80, 80, [6, 6, 6], 3)
            .pads([1; 6])
            .act(Some(Op::Tanh)),
        ConvCase::new("conv grouped g=4 16->16", 16, 16, [8, 8, 8], 3)
            .pads([1; 6])
            .groups(4),
    ] {
        conv_case(&mut b, &mut r, c);
    }
    let slope = Tensor::new(vec![8], r.scaled(8, 0.5));
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("conv depthwise g=8 8->8 +prelu", 8, 8, [7, 8, 9], 3)
            .pads([1; 6])
            .groups(8)
            .act(Some(Op::PRelu { slope })),
    );
}

#[test]
fn conv_transpose_variants() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("convt");
    for c in [
        ConvCase::new("convT k2 s2 32->16 (nnU-Net)", 32, 16, [5, 6, 7], 2).st([2; 3]),
        ConvCase::new(
            "convT k3 s2 pads[0,0,0,1,1,1] (deepbrain)",
            16,
            8,
            [5, 4, 6],
            3,
        )
        .st([2; 3])
        .pads([0, 0, 0, 1, 1, 1]),
        ConvCase::new("convT k3 s2 p1 opad1 (MONAI)", 16, 8, [5, 4, 6], 3)
            .st([2; 3])
            .pads([1; 6])
            .opad([1; 3]),
        ConvCase::new("convT Cin=3 k3 s2 p1 opad1", 3, 5, [4, 5, 3], 3)
            .st([2; 3])
            .pads([1; 6])
            .opad([1; 3]),
    ] {
        convt_case(&mut b, &mut r, c);
    }
    // Parity-class path: other kernels, strides 1 and 3, anisotropic strides, odd Cout; each
    // fused (one launch over the classes' union of taps when out % stride == 0) and per class.
    for (name, ci, co, sp, k, st, pads, opad) in [
        (
            "convT k4 s2 p1 24->12 (parity)",
            24,
            12,
            [4, 5, 3],
            [4; 3],
            [2; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k3 s1 p1 16->8 (parity, flipped conv)",
            16,
            8,
            [5, 4, 6],
            [3; 3],
            [1; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k3 s[1,2,3] opad[0,1,2] 16->14",
            16,
            14,
            [4, 5, 3],
            [3; 3],
            [1, 2, 3],
            [1; 6],
            [0, 1, 2],
        ),
        (
            "convT k3 s2 p1 opad1 32->14 16^3 (MONAI head)",
            32,
            14,
            [16; 3],
            [3; 3],
            [2; 3],
            [1; 6],
            [1; 3],
        ),
        (
            "convT k3 s2 p1 opad0 (odd output: per class)",
            16,
            14,
            [4, 5, 3],
            [3; 3],
            [2; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k1 s2 (no-tap classes: gather kernel)",
            8,
            8,
            [3, 4, 5],
            [1; 3],
            [2; 3],
            [0; 6],
            [1; 3],
        ),
    ] {
        for fused in [true, false] {
            b.with(|o| o.fused_parity = fused);
            let tag = if fused { "fused" } else { "classes" };
            convt_case(
                &mut b,
                &mut r,
                ConvCase::new(&format!("{name} {tag}"), ci, co, sp, 1)
                    .k(k)
                    .st(st)
                    .pads(pads)
                    .opad(opad),
            );
            // Launches: one when fused, one per parity class otherwise (k1 s2: gather kernel).
            let out: Vec<usize> = (0..3)
                .map(|a| (sp[a] - 1) * st[a] + k[a] + opad[a] - pads[a] - pads[a + 3])
                .collect();
            let fusable = (0..3).all(|a| out[a].is_multiple_of(st[a]));
            let want = if k == [1; 3] || (fused && fusable) {
                1
            } else {
                st.iter().product::<usize>()
            };
            let prof = b.profile_forward(2, 1).expect("profile");
            let launches: usize = prof
                .iter()
                .filter(|(l, _, _)| l.contains('['))
                .map(|(_, _, n)| n)
                .sum();
            assert_eq!(launches, want, "{name} {tag}: ran {prof:?}");
            // Fused classes with Cin % 8 == 0 run the staged epilogue (`convt_up_*`: 8-channel
            // chunks when Cout % 8 == 0, else a warp per tap row).
            if fused && fusable && k != [1; 3] && ci % 8 == 0 {
                let used = kernels_used(&mut b, 2);
                assert!(
                    used.iter().all(|k| k.starts_with("convt_up_")),
                    "{name}: {used:?}"
                );
            }
        }
    }
    // The fused classes on the scatter epilogue (`conv_store`), the staged twins switched off.
    b.with(|o| o.fused_parity = true);
    b.with(|o| o.upsample_vec = false);
    convt_case(
        &mut b,
        &mut r,
        ConvCase::new(
            "convT k3 s2 32->14 fused, scatter epilogue",
            32,
            14,
            [9, 8, 10],
            3,
        )
        .st([2; 3])
        .pads([1; 6])
        .opad([1; 3]),
    );
    let used = kernels_used(&mut b, 2);
    assert!(used.iter().all(|k| k.starts_with("conv_mma_")), "{used:?}");
    b.with(|o| o.upsample_vec = true);
    convt_case(
        &mut b,
        &mut r,
        ConvCase::new("convT grouped g=2 k2 s2", 8, 8, [4, 5, 3], 2)
            .st([2; 3])
            .groups(2),
    );
}

/// Every `conv_mma_*` tile (forced), the upsampling transposed conv (kernel == stride, run as a
/// GEMM with a scatter epilogue) and the legacy wmma path, on shapes that leave partial tiles.
#[test]
fn conv_mma_tiles() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("mma");
    let tiles: Vec<Option<&str>> = MMA_CONFIGS.iter().map(|c| Some(c.name)).collect();
    for tile in tiles.into_iter().chain([None]) {
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let t = tile.unwrap_or("auto");
        let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
        for c in [
            ConvCase::new(&format!("{t} 3^3 16->32"), 16, 32, [6, 7, 9], 3).pads([1; 6]),
            ConvCase::new(&format!("{t} 3^3 s2 24->72 +leaky"), 24, 72, [9, 8, 10], 3)
                .st([2; 3])
                .pads([1; 6])
                .act(leaky()),
            ConvCase::new(&format!("{t} 3^3 dil2 8->16"), 8, 16, [7, 8, 6], 3)
                .dl([2; 3])
                .pads([2; 6]),
            ConvCase::new(&format!("{t} 1x1 head 32->14"), 32, 14, [8, 9, 10], 1),
            ConvCase::new(&format!("{t} Cin=1 3^3 ->32 +leaky"), 1, 32, [9, 8, 7], 3)
                .pads([1; 6])
                .act(leaky()),
            ConvCase::new(&format!("{t} 3^3 64->136"), 64, 136, [5, 6, 4], 3).pads([1; 6]),
        ] {
            conv_case(&mut b, &mut r, c);
        }
        for c in [
            ConvCase::new(&format!("{t} convT k2s2 32->16"), 32, 16, [5, 6, 7], 2).st([2; 3]),
            ConvCase::new(
                &format!("{t} convT k2s2 3->5 (odd Cout)"),
                3,
                5,
                [4, 3, 5],
                2,
            )
            .st([2; 3]),
            ConvCase::new(&format!("{t} convT k2s2 16->40"), 16, 40, [4, 4, 3], 2).st([2; 3]),
            ConvCase::new(
                &format!("{t} convT k(2,1,2) s(2,1,2) 8->24"),
                8,
                24,
                [3, 5, 4],
                1,
            )
            .k([2, 1, 2])
            .st([2, 1, 2]),
        ] {
            convt_case(&mut b, &mut r, c);
        }
    }
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.legacy_conv = true);
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("legacy 3^3 16->32", 16, 32, [6, 7, 9], 3).pads([1; 6]),
    );
    convt_case(
        &mut b,
        &mut r,
        ConvCase::new("legacy convT k2s2 32->16", 32, 16, [5, 6, 7], 2).st([2; 3]),
    );
    b.with(|o| o.legacy_conv = false);
}

/// `convt_up_*` (kernel == stride transposed conv, Cin and Cout % 8 == 0, 16-byte staged
/// epilogue) vs float64: k2s2 with Cin 32/64/128/320, Cout 32/64/16/24, odd spatial sizes
/// (partial M tiles), every v8 tile forced once, Cout 14 (falls back to the scatter epilogue),
/// outputs into concat slices (aligned: vector stores; offset 14: element stores).
/// (`convt_up2` off: the GEMM those shapes would otherwise leave for `convt_up2_p`.)
#[test]
fn convt_up_vec_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("upvec");
    b.with(|o| o.conv_tile = None);
    b.with(|o| (o.upsample_vec, o.convt_up2) = (true, false));
    let cases: Vec<(usize, usize, [usize; 3], Option<&str>)> = vec![
        (32, 32, [5, 6, 7], None),
        (64, 32, [3, 5, 9], None),
        (128, 64, [4, 3, 5], None),
        (320, 64, [3, 3, 2], None),
        (64, 16, [7, 5, 3], None),
        (128, 24, [5, 5, 5], None),
        (32, 14, [5, 4, 3], None),
        (64, 32, [9, 7, 5], Some(cat::CONV_MMA_M256N32_V8.name)),
        (64, 32, [9, 7, 5], Some(cat::CONV_MMA_M128N32_V8.name)),
        (64, 64, [5, 7, 3], Some(cat::CONV_MMA_M128N64_V8.name)),
        (32, 64, [3, 3, 7], Some(cat::CONV_MMA_M128N128_V8.name)),
    ];
    for (cin, cout, sp, tile) in cases {
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let name = format!(
            "convt_up k2s2 {cin}->{cout} {sp:?} {}",
            tile.unwrap_or("auto")
        );
        convt_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, cin, cout, sp, 2).st([2; 3]),
        );
        let used = kernels_used(&mut b, 2);
        let ok = if cout % 8 == 0 {
            used.iter().all(|k| {
                k.starts_with("convt_up_")
                    && tile.is_none_or(|t| k.as_str() == t.replace("conv_mma_", "convt_up_"))
            })
        } else {
            used.iter().all(|k| k.starts_with("conv_mma_"))
        };
        assert!(ok && !used.is_empty(), "{name}: ran {used:?}");
    }
    b.with(|o| o.conv_tile = None);
    // Concat slices of two k2s2 transposed convs of the same input: [32, 24] (stride 56,
    // offset 32: vector stores) and [14, 32] (stride 46, offset 14: element stores).
    for (ca, cb) in [(32usize, 24usize), (14, 32)] {
        let (cin, sp) = (64usize, [3usize, 5, 4]);
        let x = input2(&mut r, cin, sp);
        let mut parts = Vec::new();
        for c in [ca, cb] {
            let w = Tensor::new(vec![cin, c, 2, 2, 2], r.scaled(cin * c * 8, 0.125));
            let bias = Tensor::new(vec![c], r.scaled(c, 0.5));
            let want = conv_ref(&x, &w, Some(&bias), UP2);
            parts.push((convt2(w, bias), want));
        }
        let name = format!("convt_up into concat [{ca}, {cb}]");
        let used = concat_parts_case(&mut b, &name, &x, parts, false);
        assert!(
            used.iter().any(|k| k.starts_with("convt_up_")),
            "{name}: ran {used:?}"
        );
    }
    // A fused activation after the transposed conv (the epilogue's act_apply), then off.
    let (cin, cout, sp) = (32usize, 16usize, [3usize, 4, 5]);
    let x = input2(&mut r, cin, sp);
    let w = Tensor::new(vec![cin, cout, 2, 2, 2], r.scaled(cin * cout * 8, 0.18));
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let want = conv_ref(&x, &w, Some(&bias), UP2).map(|_, v| if v >= 0.0 { v } else { 0.1 * v });
    let g = graph(
        cin,
        vec![
            (convt2(w, bias), vec![0], cout),
            (Op::LeakyRelu { alpha: 0.1 }, vec![1], cout),
        ],
    );
    for on in [true, false] {
        b.with(|o| o.upsample_vec = on);
        let got = run(&mut b, &g, &x, 2);
        report(
            &format!("convt_up k2s2 + leaky (vec {on})"),
            rel_l2(&got, &want),
        );
        let used = kernels_used(&mut b, 2);
        let pre = if on { "convt_up_" } else { "conv_mma_" };
        assert!(
            !used.is_empty() && used.iter().all(|k| k.starts_with(pre)),
            "{used:?}"
        );
    }
    b.with(|o| *o = CudaOptions::default());
}

/// `convt_up2_p` (`CudaOptions::convt_up2`: kernel == stride == 2, Cin 16 / 32 / 64, Cout <= 32
/// a multiple of 8) against float64 and against the upsampling GEMM it replaces (`convt_up_*`,
/// the same weights and fp32 sums: within one fp16 rounding): partial 64-voxel tiles, tiles
/// across rows and samples (batch 2), more tiles than its persistent grid (each block walks
/// several, the next one's copy in flight), a volume smaller than one tile; into concat slices
/// (channel stride and offset; 16-byte and element stores); a fused LeakyReLU; fp32 output for
/// an InstanceNorm.
#[test]
fn convt_up2_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("up2");
    let weights = |r: &mut Rng, cin: usize, cout: usize| {
        (
            Tensor::new(
                vec![cin, cout, 2, 2, 2],
                r.scaled(cin * cout * 8, 1.0 / (cin as f32).sqrt()),
            ),
            Tensor::new(vec![cout], r.scaled(cout, 0.5)),
        )
    };
    // (cin, cout, spatial, with the tail: InstanceNorm + LeakyReLU, the conv's output fp32)
    let cases: [(usize, usize, [usize; 3], bool); 8] = [
        (64, 32, [5, 6, 7], false),
        (32, 16, [3, 5, 9], false),
        (16, 8, [4, 3, 5], false),
        (64, 24, [7, 5, 3], false),
        (64, 32, [16, 16, 40], false),
        (32, 32, [1, 2, 3], false),
        (64, 32, [5, 4, 9], true),
        (16, 16, [6, 3, 5], true),
    ];
    for (cin, cout, sp, tail) in cases {
        let x = input2(&mut r, cin, sp);
        let (w, bias) = weights(&mut r, cin, cout);
        let y = conv_ref(&x, &w, Some(&bias), UP2);
        let (g, want) = if tail {
            let t = Tail::instance_or_group(&mut r, cout, cout);
            let want = t.reference(&y);
            (t.after(cin, convt2(w, bias), cout), want)
        } else {
            (graph(cin, vec![(convt2(w, bias), vec![0], cout)]), y)
        };
        let name = format!("convt_up2 {cin}->{cout} {sp:?} tail {tail}");
        let mut outs = Vec::new();
        for on in [true, false] {
            b.with(|o| o.convt_up2 = on);
            outs.push(run(&mut b, &g, &x, 2));
            let used = kernels_used(&mut b, 2);
            let k = if on { "convt_up2_p" } else { "convt_up_" };
            assert!(
                used.iter().any(|u| u.starts_with(k)),
                "{name} (up2 {on}): ran {used:?}"
            );
        }
        let e = rel_l2(&outs[0], &want);
        let dev = max_abs_diff(&outs[0], &outs[1]);
        println!("RESULT {name:<44} rel L2 {e:.2e}, max |diff| from the GEMM {dev:.2e}");
        report(&name, e);
        let top = outs[1].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            dev <= top / 512.0,
            "{name}: {dev:.3e} from the GEMM (values up to {top:.3e})"
        );
    }
    b.with(|o| o.convt_up2 = true);
    // Into concat slices of two k2s2 transposed convs: [32, 24] (stride 56, offset 32: 16-byte
    // stores) and [14, 32] (stride 46, the second at offset 14: element stores).
    for cs in [[32usize, 24], [14, 32]] {
        let (cin, sp) = (64usize, [3usize, 5, 4]);
        let x = input2(&mut r, cin, sp);
        let parts = cs
            .into_iter()
            .map(|c| {
                let (w, bias) = weights(&mut r, cin, c);
                let want = conv_ref(&x, &w, Some(&bias), UP2);
                (convt2(w, bias), want)
            })
            .collect();
        let name = format!("convt_up2 into concat {cs:?}");
        let used = concat_parts_case(&mut b, &name, &x, parts, false);
        assert!(
            used.iter().any(|k| k == "convt_up2_p"),
            "{name}: ran {used:?}"
        );
    }
    // A fused LeakyReLU (the epilogue's act_apply).
    let (cin, cout, sp) = (32usize, 16usize, [3usize, 4, 5]);
    let x = input2(&mut r, cin, sp);
    let (w, bias) = weights(&mut r, cin, cout);
    let want = conv_ref(&x, &w, Some(&bias), UP2).map(|_, v| if v >= 0.0 { v } else { 0.1 * v });
    let g = graph(
        cin,
        vec![
            (convt2(w, bias), vec![0], cout),
            (Op::LeakyRelu { alpha: 0.1 }, vec![1], cout),
        ],
    );
    let got = run(&mut b, &g, &x, 2);
    report("convt_up2 k2s2 + leaky", rel_l2(&got, &want));
    let used = kernels_used(&mut b, 2);
    assert_eq!(used, ["convt_up2_p"], "leaky: ran {used:?}");
    b.with(|o| *o = CudaOptions::default());
}

/// Split-K convs (`ConvKernel::SplitK`: K tiles over grid.z, fp32 partials in the plan's
/// scratch, `conv_splitk_reduce`) vs float64: long-K convs on few voxels (W1's 320-channel 4^3,
/// a 16-byte and a 4-byte gather, odd Cout, a fused activation), then one feeding an
/// InstanceNorm (fp32 output) beside one written into its concat slice (channel stride and
/// offset). Each must run split; one more only with `split_k_fill`.
#[test]
fn conv_split_k() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("split-k");
    for c in [
        ConvCase::new("split 256->64 3^3 4x5x4 +leaky", 256, 64, [4, 5, 4], 3)
            .pads([1; 6])
            .act(Some(Op::LeakyRelu { alpha: 0.01 })),
        ConvCase::new("split 320->320 3^3 4^3 (W1)", 320, 320, [4, 4, 4], 3).pads([1; 6]),
        ConvCase::new("split 152->72 3^3 s2 5x6x5", 152, 72, [5, 6, 5], 3)
            .st([2; 3])
            .pads([1; 6]),
        ConvCase::new(
            "split 154->33 3^3 3^3 (v2 gather, odd Cout)",
            154,
            33,
            [3, 3, 3],
            3,
        )
        .pads([1; 6]),
    ] {
        let name = c.name.to_string();
        conv_case(&mut b, &mut r, c);
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().any(|k| k.contains("split-K")),
            "{name}: ran {used:?}"
        );
    }
    // `split_k_fill`: 68 m128n64 tiles at batch 2 (the default rule splits under 66 on 132
    // SMs) split to about two blocks an SM.
    b.with(|o| o.split_k_fill = true);
    let name = "split (fill) 152->64 3^3 8x16x34";
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new(name, 152, 64, [8, 16, 34], 3).pads([1; 6]),
    );
    let used = kernels_used(&mut b, 2);
    b.with(|o| o.split_k_fill = false);
    assert!(
        used.iter().any(|k| k.contains("split-K")),
        "{name}: ran {used:?}"
    );
    // v1 = conv 256->64 (split, fp32 for the norm), v3 = leaky(norm(v1)), v4 = conv 256->40
    // (split, into the concat's slice at channel 64 of 104), v5 = concat(v3, v4).
    let (ci, sp) = (256usize, [4usize, 4, 4]);
    let n_sp = sp.iter().product::<usize>();
    let x = input2(&mut r, ci, sp);
    let (w1, w4) = (weight3(&mut r, 64, ci), weight3(&mut r, 40, ci));
    let b4 = Tensor::new(vec![40], r.scaled(40, 0.5));
    let (g1, be1) = (
        Tensor::new(vec![64], r.scaled(64, 1.0)),
        Tensor::new(vec![64], r.scaled(64, 1.0)),
    );
    let conv = |w: &Tensor, bias: Option<&Tensor>| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias: bias.cloned(),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [1; 6],
            groups: 1,
        })
    };
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    let nodes = vec![
        (conv(&w1, None), vec![0], 64),
        (
            Op::InstanceNorm {
                eps: 1e-5,
                scale: g1.clone(),
                bias: be1.clone(),
            },
            vec![1],
            64,
        ),
        (leaky.clone(), vec![2], 64),
        (conv(&w4, Some(&b4)), vec![0], 40),
        (Op::Concat { axis: 1 }, vec![3, 4], 104),
    ];
    let v3 = norm_ref(&conv_ref(&x, &w1, None, PAD1), 64, 1e-5, &g1, &be1)
        .map(|c, v| act_ref(&leaky, c, v));
    let v4 = conv_ref(&x, &w4, Some(&b4), PAD1);
    let mut want = T::zeros([2, 104, sp[0], sp[1], sp[2]]);
    for n in 0..2 {
        want.d[n * 104 * n_sp..(n * 104 + 64) * n_sp]
            .copy_from_slice(&v3.d[n * 64 * n_sp..(n + 1) * 64 * n_sp]);
        want.d[(n * 104 + 64) * n_sp..(n + 1) * 104 * n_sp]
            .copy_from_slice(&v4.d[n * 40 * n_sp..(n + 1) * 40 * n_sp]);
    }
    let got = run(&mut b, &graph(ci, nodes), &x, 2);
    report(
        "split-K conv -> norm, conv -> concat slice",
        rel_l2(&got, &want),
    );
    let used = kernels_used(&mut b, 2);
    assert_eq!(
        used.iter().filter(|k| k.contains("split-K")).count(),
        2,
        "{used:?}"
    );
}
