//! A conv handing the InstanceNorm / GroupNorm after it its statistics (`CudaOptions::norm_stats`:
//! the `_st` kernels write per-tile sums in their epilogue,
//! `norm_finalize_tiles` reads them): each twin against float64 and against the norm's own
//! partial sums, the same bits from run to run and at batch 1 as at batch 2; the convs on
//! kernels without a twin keep the partial-sum pass.

use super::*;
use voxtile::internals::cuda::host::buffers::buffer_plan;
use voxtile::internals::cuda::host::catalogue::CONV_WGK_UP_N128;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;

/// conv (bias 4: means far from 0, so the sums' shift matters) -> norm -> LeakyReLU on each
/// `_st` twin and on halo kernels without one, with outputs that end inside a tile on every axis. Each case runs with the
/// statistics from the epilogue and with the norm's partial-sum pass.
#[test]
fn conv_norm_tile_stats() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("normstats");
    let wz = cat::has_wgmma(b.arch());
    // (name, cin, cout, spatial, groups, the kernel expected with the statistics)
    type Case = (&'static str, usize, usize, [usize; 3], usize, &'static str);
    let cases: [Case; 10] = [
        (
            "Cin-1 1->32 instancenorm",
            1,
            32,
            [9, 17, 40],
            32,
            "conv_c1_k3_st",
        ),
        (
            "Cin-1 1->8 groupnorm g=2",
            1,
            8,
            [6, 9, 33],
            2,
            "conv_c1_k3_st",
        ),
        // Cout 24: a lane's 4-channel piece would change from one store to the next, so the
        // norm keeps its partial-sum pass.
        ("Cin-1 1->24 (no twin)", 1, 24, [5, 8, 20], 24, "conv_c1_k3"),
        (
            "z-pair 32->32 instancenorm",
            32,
            32,
            [21, 19, 17],
            32,
            "conv_wz_c32_y16_h2l_st",
        ),
        (
            "z-pair 32->20 groupnorm g=4 (partial piece)",
            32,
            20,
            [18, 17, 9],
            4,
            "conv_wz_c32_y16_h2l_st",
        ),
        (
            "halo 64->32 in 2 chunks instancenorm",
            64,
            32,
            [9, 17, 10],
            32,
            "conv_halo_c32n32_w4",
        ),
        (
            "halo 64->64 groupnorm g=8",
            64,
            64,
            [6, 13, 11],
            8,
            "conv_halo_c64n64",
        ),
        (
            "halo 64->48 (chunks past Cout)",
            64,
            48,
            [7, 9, 10],
            48,
            "conv_halo_c64n64",
        ),
        (
            "halo 64->96 (two channel tiles)",
            64,
            96,
            [5, 9, 9],
            96,
            "conv_halo_c64n64",
        ),
        (
            "halo 128->64 in 2 chunks",
            128,
            64,
            [5, 8, 12],
            64,
            "conv_halo_c64n64",
        ),
    ];
    for (name, cin, cout, sp, groups, want_kernel) in cases {
        // Without wgmma (not compute capability 9.0) Cin 32 -> Cout <= 32 runs the halo kernel,
        // which has no twin.
        let want_kernel = match want_kernel {
            "conv_wz_c32_y16_h2l_st" if !wz => "conv_halo_c32n32_w4",
            k => k,
        };
        tile_stats_case(&mut b, &mut r, (name, cin, cout, sp, groups, want_kernel));
    }
    // The z-pair cases on the early-release helper (`_h2e`, forced only): its `_st` twin.
    if wz {
        b.with(|o| o.halo_tile = Some(&cat::CONV_WZ_C32_Y16_H2E));
        for (name, cin, cout, sp, groups, _) in cases.iter().filter(|c| c.0.starts_with("z-pair")) {
            let name = format!("{name} (_h2e)");
            tile_stats_case(
                &mut b,
                &mut r,
                (&name, *cin, *cout, *sp, *groups, "conv_wz_c32_y16_h2e_st"),
            );
        }
        b.with(|o| o.halo_tile = None);
    }
    b.with(|o| o.norm_stats = false);
}

/// The z-pair convs on bulk stores (`CudaOptions::zpair_bulk`: `_h2b`, `_h2b_st`) and on tensor
/// loads with them (`zpair_tma`: `_h2t`, `_h2t_st`; `zpair_st_staged`: `_h2l_st`, tensor loads
/// and the helper's stores) bit for bit the helper's own copies and
/// stores (`_h2`, `_h2_st`): conv -> norm -> LeakyReLU (an fp32 conv output, stored as staged),
/// with the statistics from the epilogue and from the norm's pass; Cout 32 and 20 (80-byte
/// copies); outputs that end inside a tile on every axis, same and valid padding; batch 2.
#[test]
fn zpair_twins_same_bits() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("zpair bulk");
    for (cout, sp, groups, pad) in [
        (32, [21, 19, 17], 32, 1),
        (20, [18, 17, 9], 4, 1),
        (32, [11, 20, 13], 8, 0),
    ] {
        let x = input2(&mut r, 32, sp);
        let w = weight3(&mut r, cout, 32);
        let bias = Tensor::new(vec![cout], vec![4.0; cout]);
        let tail = Tail::instance_or_group(&mut r, cout, groups);
        let g = tail.after(32, crate::common::graph::conv(w, Some(bias), pad), cout);
        for stats in [true, false] {
            b.with(|o| (o.norm_stats, o.zpair_bulk, o.zpair_tma) = (stats, false, false));
            let staged = run(&mut b, &g, &x, 2);
            for (twin, tma, st_staged) in [
                ("_h2b", false, false),
                ("_h2t", true, false),
                ("_h2l", true, true),
            ] {
                // (`zpair_st_staged` changes the `_st` twin only.)
                if st_staged && !stats {
                    continue;
                }
                b.with(|o| (o.zpair_bulk, o.zpair_tma) = (!tma, tma));
                b.with(|o| o.zpair_st_staged = st_staged);
                let got = run(&mut b, &g, &x, 2);
                let used = kernels_used(&mut b, 2);
                let want = format!("conv_wz_c32_y16{twin}{}", if stats { "_st" } else { "" });
                let name = format!("32->{cout} {sp:?} pad {pad} statistics {stats}");
                assert!(used.contains(&want), "{name}: ran {used:?}");
                assert!(same_bits(&got, &staged), "{name}: {want} differs from _h2");
                println!("RESULT zpair twins {name}: same bits on {want}");
            }
        }
    }
    b.with(|o| *o = CudaOptions::default());
}

/// The z-pair and Cin-1 convs storing fp16 less each tile's shift for their norm
/// (`CudaOptions::norm_shifted`: `affine_act_v8_shifted` adds it back) against float64: conv
/// (bias 4 plus a channel ramp, so means far from 0 and unlike per channel) -> norm -> LeakyReLU,
/// InstanceNorm and GroupNorm, outputs ending inside a tile on every axis, batch 2, the z-pair
/// one on `_h2t_st` and `_h2l_st`, the Cin-1 one on `conv_c1_k3_st`, a Cin-64 one in two
/// 32-channel chunks (`cin_chunks`: a tile for every SM at batch 1 too) whose last chunk
/// stores its values where it read the first one's fp32 sums (`ShiftedOut::wide`). Its error
/// within 2x the fp32 input's (the tile's shift keeps the rounding relative to the values'
/// spread) and below half the fp16 input's (`norm_f32` off: rounding relative to the values);
/// the same bits from run to run and at batch 1.
#[test]
fn shifted_norm_inputs() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("shifted");
    let cases = [
        (32, 32, [21, 19, 17], 32),
        (32, 16, [18, 35, 9], 4),
        (1, 32, [21, 19, 17], 32),
        (1, 16, [18, 35, 9], 4),
        (64, 16, [34, 33, 129], 4),
    ];
    for (cin, cout, sp, groups) in cases {
        let (x, g, want) = shifted_case(&mut r, cin, cout, sp, groups);
        b.with(|o| o.norm_shifted = false);
        let f32_in = run(&mut b, &g, &x, 2);
        b.with(|o| o.norm_f32 = false);
        let f16_in = run(&mut b, &g, &x, 2);
        b.with(|o| (o.norm_f32, o.norm_shifted) = (true, true));
        // (The `_st` staging switch is the z-pair twin's alone.)
        for st_staged in if cin == 1 {
            vec![false]
        } else {
            vec![false, true]
        } {
            b.with(|o| o.zpair_st_staged = st_staged);
            let name = format!("{cin}->{cout} {sp:?} groups {groups} _st staged {st_staged}");
            let got = run(&mut b, &g, &x, 2);
            let used = kernels_used(&mut b, 2);
            let twin = match (cin, st_staged) {
                (1, _) => "conv_c1_k3_st".to_string(),
                (_, true) => "conv_wz_c32_y16_h2l_st".into(),
                _ => "conv_wz_c32_y16_h2t_st".into(),
            };
            for k in [twin, "affine_act_v8_shifted".into()] {
                assert!(used.contains(&k), "{name}: ran {used:?}, not {k}");
            }
            let again = run(&mut b, &g, &x, 2);
            assert!(same_bits(&got, &again), "{name}: two runs differ");
            first_sample_alone(&mut b, &g, &x, &got, &name);
            let [e, e32, e16] = [&got, &f32_in, &f16_in].map(|y| rel_l2(y, &want));
            println!(
                "RESULT shifted norm input {name:<44} rel L2 {e:.2e} (fp32 input {e32:.2e}, fp16 input {e16:.2e})"
            );
            report(&name, e);
            assert!(
                e <= 2.0 * e32,
                "{name}: {e:.2e} against fp32 input's {e32:.2e}"
            );
            assert!(
                e <= 0.5 * e16,
                "{name}: {e:.2e} against fp16 input's {e16:.2e}"
            );
        }
        b.with(|o| *o = CudaOptions::default());
    }
}

/// A conv (bias 4 plus a channel ramp: means far from 0 and unlike per channel) -> norm ->
/// LeakyReLU case of the shifted norm tests: its input, graph and float64 reference.
fn shifted_case(
    r: &mut Rng,
    cin: usize,
    cout: usize,
    sp: [usize; 3],
    groups: usize,
) -> (T, Graph, T) {
    let x = input2(r, cin, sp);
    let w = weight3(r, cout, cin);
    let bias = Tensor::new(
        vec![cout],
        (0..cout).map(|c| 4.0 + c as f32 / 4.0).collect(),
    );
    let tail = Tail::instance_or_group(r, cout, groups);
    let want = tail.reference(&conv_ref(&x, &w, Some(&bias), PAD1));
    let g = tail.after(cin, crate::common::graph::conv(w, Some(bias), 1), cout);
    (x, g, want)
}

/// The cases of [`shifted_norm_runs`] (cin, cout, spatial, groups): widths that are multiples
/// of the run with partial tiles in every axis (W 20, 36 and 132 against the z-pair tile's 8 and
/// the Cin-1 tile's 32), a split conv's wide store (Cin 64, wide enough for Cin chunks),
/// InstanceNorm and GroupNorm.
const RUNS_CASES: [(usize, usize, [usize; 3], usize); 5] = [
    (32, 32, [21, 19, 20], 32),
    (32, 16, [18, 35, 36], 4),
    (1, 32, [21, 19, 36], 32),
    (1, 16, [9, 35, 20], 4),
    (64, 16, [34, 33, 132], 4),
];

/// Every case of [`shifted_norm_runs`] plans (at batch 2, on an H200's caps) a shifted pair
/// read in runs where `norm_runs` is on, and by voxels where it is off: the GPU test's cases
/// test what they mean to (a Cin-64 conv too narrow for Cin chunks runs unsplit, unshifted).
#[test]
fn runs_cases_plan_runs() {
    let mut r = Rng::tagged("shifted runs");
    for (cin, cout, sp, groups) in RUNS_CASES {
        let (_, g, _) = shifted_case(&mut r, cin, cout, sp, groups);
        for runs in [false, true] {
            let caps = ArchCaps {
                norm_runs: runs,
                ..ArchCaps::h200()
            };
            let plan = buffer_plan(&g, 2, sp, &caps).expect("plan");
            let shifted: Vec<_> = plan.launches.iter().filter_map(|l| l.shifted).collect();
            assert_eq!(shifted.len(), 2, "{cin}->{cout} {sp:?}: {shifted:?}");
            assert!(
                shifted.iter().all(|s| s.runs == runs),
                "{cin}->{cout} {sp:?} runs {runs}: {shifted:?}"
            );
        }
    }
}

/// `norm_runs`: the affine pass over shifted inputs by runs of voxels
/// (`affine_act_v8_shifted_runs`) gives the same bits as the pass by voxels on [`RUNS_CASES`].
#[test]
fn shifted_norm_runs() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("shifted runs");
    for (cin, cout, sp, groups) in RUNS_CASES {
        let name = format!("{cin}->{cout} {sp:?} groups {groups}");
        let (x, g, want) = shifted_case(&mut r, cin, cout, sp, groups);
        let mut outs = Vec::new();
        for (runs, kernel) in [
            (false, "affine_act_v8_shifted"),
            (true, "affine_act_v8_shifted_runs"),
        ] {
            b.with(|o| o.norm_runs = runs);
            outs.push(run(&mut b, &g, &x, 2));
            let used = kernels_used(&mut b, 2);
            assert!(
                used.iter().any(|k| k == kernel),
                "{name}: ran {used:?}, not {kernel}"
            );
        }
        let diff = max_abs_diff(&outs[0], &outs[1]);
        let e = rel_l2(&outs[1], &want);
        println!("RESULT shifted norm runs {name:<36} max |diff| {diff:.2e}, rel L2 {e:.2e}");
        assert!(
            same_bits(&outs[0], &outs[1]),
            "{name}: runs differ ({diff:.2e})"
        );
        assert!(e < 1e-2, "{name}: rel L2 {e:.2e} against float64");
        b.with(|o| *o = CudaOptions::default());
    }
}

/// One case of [`conv_norm_tile_stats`]: (name, cin, cout, spatial, groups, the kernel expected
/// with the statistics).
fn tile_stats_case(
    b: &mut CudaBackend,
    r: &mut Rng,
    (name, cin, cout, sp, groups, want_kernel): (&str, usize, usize, [usize; 3], usize, &str),
) {
    let x = input2(r, cin, sp);
    let w = weight3(r, cout, cin);
    let bias = Tensor::new(vec![cout], vec![4.0; cout]);
    let tail = Tail::instance_or_group(r, cout, groups);
    let want = tail.reference(&conv_ref(&x, &w, Some(&bias), PAD1));
    let conv = crate::common::graph::conv(w, Some(bias), 1);
    let g = tail.after(cin, conv, cout);
    b.with(|o| o.norm_stats = false);
    let pass = run(b, &g, &x, 2);
    b.with(|o| o.norm_stats = true);
    let got = run(b, &g, &x, 2);
    let used = kernels_used(b, 2);
    assert!(
        used.iter().any(|k| k == want_kernel),
        "{name}: ran {used:?}, expected {want_kernel}"
    );
    let again = run(b, &g, &x, 2);
    assert!(same_bits(&got, &again), "{name}: two runs differ");
    // One sample at batch 1: a tile's sums do not depend on the grid.
    first_sample_alone(b, &g, &x, &got, name);
    let (e, e_pass) = (rel_l2(&got, &want), rel_l2(&pass, &want));
    let dev = max_abs_diff(&got, &pass);
    println!(
            "RESULT tile stats {name:<44} rel L2 {e:.2e} (partial-sum pass {e_pass:.2e}), max |diff| {dev:.2e}"
        );
    report(name, e);
    // The same statistics summed in another order: far below the fp16 output's rounding.
    assert!(dev < 2e-2, "{name}: {dev} from the partial-sum pass");
}

/// A Cin-1 conv its norm recomputes (`CudaOptions::norm_recompute`: `conv_c1_k3_sto` for the
/// statistics, `conv_c1_k3_nrm` normalising on store) against float64, and bit for bit the plan
/// that stores the conv's fp32 output for the norm's affine pass; batch 1 = batch 2. Cout 32 /
/// 8 / 16, InstanceNorm and GroupNorm, stride 1 and 2, LeakyReLU and PRelu after the norm, and
/// Cout 24 (no statistics twin: nothing recomputed).
#[test]
fn cin1_norm_recomputed() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("norm recompute");
    // (cout, spatial, groups, stride, PRelu, recomputed)
    for (cout, sp, groups, st, prelu, recomputed) in [
        (32usize, [9usize, 17, 40], 32usize, 1usize, false, true),
        (8, [6, 9, 33], 2, 1, true, true),
        (16, [11, 18, 37], 16, 2, false, true),
        (24, [5, 8, 20], 24, 1, false, false),
    ] {
        let x = input2(&mut r, 1, sp);
        let w = weight3(&mut r, cout, 1);
        let bias = Tensor::new(vec![cout], r.scaled(cout, 4.0));
        let mut tail = Tail::instance_or_group(&mut r, cout, groups);
        if prelu {
            tail.leaky = Op::PRelu {
                slope: Tensor::new(vec![cout], r.scaled(cout, 0.3)),
            };
        }
        let geo = Kernel {
            st: [st; 3],
            ..PAD1
        };
        let want = tail.reference(&conv_ref(&x, &w, Some(&bias), geo));
        let conv = Op::Conv(Conv {
            weight: w,
            bias: Some(bias),
            stride: [st; 3],
            dilation: [1; 3],
            pads: [1; 6],
            groups: 1,
        });
        let g = tail.after(1, conv, cout);
        let name = format!("Cin-1 1->{cout} {sp:?} s{st} g={groups}");
        let mut outs = Vec::new();
        for on in [true, false] {
            b.with(|o| *o = CudaOptions::default());
            // (`norm_shifted` off: the recompute reproduces the conv's fp32 stores bit for bit,
            // not the shifted fp16 ones.)
            b.with(|o| {
                o.poison = true;
                o.norm_recompute = on;
                o.norm_shifted = false;
            });
            let got = run(&mut b, &g, &x, 2);
            let used = kernels_used(&mut b, 2);
            let nrm = used.iter().any(|k| k == "conv_c1_k3_nrm");
            assert_eq!(nrm, on && recomputed, "{name} (on: {on}): ran {used:?}");
            let e = rel_l2(&got, &want);
            report(&format!("{name} recompute {on}"), e);
            assert!(e <= TOL, "{name} (on: {on}): rel L2 {e:.2e}");
            if on {
                first_sample_alone(&mut b, &g, &x, &got, &name);
            }
            outs.push(got);
        }
        assert!(
            same_bits(&outs[0], &outs[1]),
            "{name}: the recomputed conv differs from the stored one"
        );
    }
    b.with(|o| *o = CudaOptions::default());
}

/// A k3 s2 transposed conv (pads 1, output padding 1: the fused parity classes) `cin` ->
/// `cout` over a batch of two `sp` inputs, then an InstanceNorm / GroupNorm of `groups`:
/// (name, input, graph, float64 reference).
fn convt_norm_case(
    r: &mut Rng,
    cin: usize,
    cout: usize,
    sp: [usize; 3],
    groups: usize,
) -> (String, T, Graph, T) {
    let name = format!("convT k3 s2 {cin}->{cout} {sp:?} g={groups}");
    let x = input2(r, cin, sp);
    let w = Tensor::new(
        vec![cin, cout, 3, 3, 3],
        r.scaled(cin * cout * 27, 1.0 / (cin as f32).sqrt()),
    );
    let bias = Tensor::new(vec![cout], vec![4.0; cout]);
    let geo = Kernel {
        st: [2; 3],
        pads: [1; 6],
        transposed: true,
        opad: [1; 3],
        ..PLAIN
    };
    let tail = Tail::instance_or_group(r, cout, groups);
    let want = tail.reference(&conv_ref(&x, &w, Some(&bias), geo));
    let convt = Op::ConvTranspose(ConvTranspose {
        weight: w,
        bias: Some(bias),
        stride: [2; 3],
        dilation: [1; 3],
        pads: [1; 6],
        output_padding: [1; 3],
        groups: 1,
    });
    let g = tail.after(cin, convt, cout);
    (name, x, g, want)
}

/// A strided transposed conv (k3 s2, pads 1, output padding 1: the fused parity classes on
/// their staged epilogue) handing the norm after it its statistics (`convt_stats`: the
/// `convt_up_*_st` twin, one entry per M tile) against float64 and the norm's own partial-sum
/// pass, the same bits from run to run and at batch 1 as at batch 2: W2's 32 -> 14 (one column
/// tile of 8 x 14, the any-Cout epilogue) and a 16 -> 8 GroupNorm (Cout % 8 == 0: the chunk
/// epilogue), on inputs whose rows are whole 128-row tiles. The first has enough rows a sample
/// (>= 132 tiles of 128) for `pick_mma`'s m128n128 tile at batch 1 and 2, W2's tile: 8 x 14
/// columns pass the m128n64 tile, which has no room for the statistics.
#[test]
fn convt_norm_tile_stats() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("convt stats");
    for (cin, cout, sp, groups) in [
        (32usize, 14usize, [16usize, 32, 36], 14usize),
        (16, 8, [8, 4, 12], 2),
    ] {
        let (name, x, g, want) = convt_norm_case(&mut r, cin, cout, sp, groups);
        b.with(|o| *o = CudaOptions::default());
        b.with(|o| (o.poison, o.convt_stats) = (true, false));
        let pass = run(&mut b, &g, &x, 2);
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().all(|k| !k.ends_with("_st")),
            "{name}: without the switch ran {used:?}"
        );
        b.with(|o| o.convt_stats = true);
        let got = run(&mut b, &g, &x, 2);
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter()
                .any(|k| k.starts_with("convt_up_") && k.ends_with("_st")),
            "{name}: ran {used:?}"
        );
        let again = run(&mut b, &g, &x, 2);
        assert!(same_bits(&got, &again), "{name}: two runs differ");
        first_sample_alone(&mut b, &g, &x, &got, &name);
        let (e, e_pass) = (rel_l2(&got, &want), rel_l2(&pass, &want));
        let dev = max_abs_diff(&got, &pass);
        println!(
            "RESULT tile stats {name:<44} rel L2 {e:.2e} (partial-sum pass {e_pass:.2e}), max |diff| {dev:.2e}"
        );
        report(&name, e);
        assert!(dev < 2e-2, "{name}: {dev} from the partial-sum pass");
    }
    b.with(|o| *o = CudaOptions::default());
}

/// The fused parity classes on the wgmma implicit GEMM (compute capability 9.0; forced, as the
/// defaults keep Cin 32 on mma.sync): `conv_wgk_up_n128` with the norm's own partial-sum pass and its `_st` twin handing the norm
/// the statistics, each against float64 and the mma path (`convt_up_*`), the twin the same bits
/// from run to run and at batch 1 as at batch 2: W2's 32 -> 14 (the any-Cout epilogue; x of 36:
/// tiles of the input grid partly outside it), a 64 -> 8 GroupNorm (two k-steps a tap, the
/// chunk epilogue) and 32 -> 20 (8 x 20 columns: two column tiles, no statistics twin).
#[test]
fn convt_on_wgk() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("convt wgk");
    for (cin, cout, sp, groups) in [
        (32usize, 14usize, [16usize, 32, 36], 14usize),
        (64, 8, [8, 4, 12], 2),
        (32, 20, [6, 10, 17], 20),
    ] {
        let (name, x, g, want) = convt_norm_case(&mut r, cin, cout, sp, groups);
        b.with(|o| *o = CudaOptions::default());
        b.with(|o| (o.poison, o.wgk_convt) = (true, false));
        let mma = run(&mut b, &g, &x, 2);
        for stats in [false, true] {
            b.with(|o| (o.wgk_tile, o.convt_stats) = (Some(&CONV_WGK_UP_N128), stats));
            let got = run(&mut b, &g, &x, 2);
            let used = kernels_used(&mut b, 2);
            let twin = stats && 8 * cout <= 128;
            let want_k = if twin {
                "conv_wgk_up_n128_st"
            } else {
                "conv_wgk_up_n128"
            };
            assert!(used.iter().any(|k| k == want_k), "{name}: ran {used:?}");
            if twin {
                let again = run(&mut b, &g, &x, 2);
                assert!(same_bits(&got, &again), "{name}: two runs differ");
                first_sample_alone(&mut b, &g, &x, &got, &name);
            }
            let e = rel_l2(&got, &want);
            let dev = max_abs_diff(&got, &mma);
            println!(
                "RESULT convt wgk {name:<40} stats {stats}: rel L2 {e:.2e} (mma {:.2e}), max |diff| {dev:.2e}",
                rel_l2(&mma, &want)
            );
            report(&name, e);
            assert!(dev < 2e-2, "{name}: {dev} from the mma path");
        }
    }
    b.with(|o| *o = CudaOptions::default());
}

/// Runs the first sample of the batch-2 input `x` alone (batch 1) and asserts it gives the bits
/// `got` (the batch-2 output) has for it: per-tile sums and per-sample pairs do not depend on
/// the grid.
fn first_sample_alone(b: &mut CudaBackend, g: &Graph, x: &T, got: &Array5<f32>, name: &str) {
    let mut s = x.s;
    s[0] = 1;
    let x0 = T {
        s,
        d: x.d[..x.d.len() / 2].to_vec(),
    };
    let one = run(b, g, &x0, 1);
    assert!(
        same_bits(
            one.index_axis(ndarray::Axis(0), 0),
            got.index_axis(ndarray::Axis(0), 0)
        ),
        "{name}: batch 1 and batch 2 differ"
    );
}
