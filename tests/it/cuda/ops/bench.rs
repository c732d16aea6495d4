//! Timings on CUDA (K1, the W1 layers, the halo variants, per-op profiles): RESULT lines for
//! tests/gpu/bench.py and PERF_NOTES.md, and the checks that keep them honest.

use super::*;

/// Throughput of the implicit-GEMM conv: 32->32 3^3 on 2x32x128^3 (fp16 NDHWC), and 64->64 on
/// 2x64x96^3 (the BN=64 tile).
#[test]
fn bench_conv_32_32() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("bench");
    for (c, s) in [(32usize, 128usize), (64, 96)] {
        let w = Tensor::new(vec![c, c, 3, 3, 3], r.scaled(c * c * 27, 0.03));
        let g = graph(
            c,
            vec![(
                Op::Conv(Conv {
                    weight: w,
                    bias: None,
                    stride: [1; 3],
                    dilation: [1; 3],
                    pads: [1; 6],
                    groups: 1,
                }),
                vec![0],
                c,
            )],
        );
        b.with(|o| o.poison = false);
        b.prepare(&g, 2, [s; 3]).unwrap();
        let x = Array5::from_shape_vec((2, c, s, s, s), r.scaled(2 * c * s * s * s, 1.0)).unwrap();
        b.run(x.view()).unwrap();
        let ms = b.time_forward(2, 20).unwrap();
        let flops = 2.0 * (2 * s * s * s) as f64 * c as f64 * (27 * c) as f64;
        println!(
            "RESULT bench conv {c}->{c} 3^3 2x{c}x{s}^3: {ms:.3} ms, {:.1} TFLOP/s",
            flops / ms / 1e9
        );
    }
}

/// The W1 layer list (nnU-Net CT PlainConvUNet 32..320, roi 128, batch 4): every conv and
/// transposed conv timed alone with CUDA events, legacy wmma kernel vs the mma kernels, and the
/// K1 shape (32->32 3^3 on 2x32x128^3). Prints TFLOP/s per layer and the summed conv time.
#[test]
fn bench_w1_layers() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("w1");
    // (kind, cin, cout, input size, kernel, stride): c = conv pad k/2, t = transposed k = s.
    let feats = [32usize, 64, 128, 256, 320, 320];
    let mut layers: Vec<(char, usize, usize, usize, usize, usize)> = Vec::new();
    let mut s = 128;
    let mut cin = 1;
    for (i, &f) in feats.iter().enumerate() {
        let st = if i == 0 { 1 } else { 2 };
        layers.push(('c', cin, f, s, 3, st));
        s /= st;
        layers.push(('c', f, f, s, 3, 1));
        cin = f;
    }
    for i in (0..5).rev() {
        let f = feats[i];
        layers.push(('t', feats[i + 1], f, s, 2, 2));
        s *= 2;
        layers.push(('c', 2 * f, f, s, 3, 1));
        layers.push(('c', f, f, s, 3, 1));
    }
    layers.push(('c', 32, 14, 128, 1, 1));
    let n = 4;
    // Times by (kind, cin, cout, size, k, stride, variant).
    type LayerKey = (char, usize, usize, usize, usize, usize, usize);
    let mut cache: std::collections::HashMap<LayerKey, f64> = Default::default();
    let (mut tot_old, mut tot_mma, mut tot_new, mut tot_flop) = (0.0, 0.0, 0.0, 0.0);
    for &(kind, ci, co, s, k, st) in &layers {
        let os = if kind == 't' { s * st } else { s / st };
        let flop = if kind == 't' {
            2.0 * (n * s * s * s) as f64 * ci as f64 * (co * k * k * k) as f64
        } else {
            2.0 * (n * os * os * os) as f64 * co as f64 * (ci * k * k * k) as f64
        };
        let mut ms = [0.0; 3];
        // 0: legacy wmma, 1: conv_mma only (halo, Cin-1 and convt_up kernels off), 2: auto.
        let c1 = kind == 'c' && ci == 1 && k == 3 && co <= 64;
        let upv = kind == 't' && k == st && ci % 8 == 0 && co % 8 == 0;
        // The planner's halo rule (Cin k x 32 in chunks, Cout <= 128; PERF_NOTES phase 7).
        let halo = kind == 'c' && default_halo(ci, co, k, st).is_some();
        let mut auto_kernels = Vec::new();
        // (A layer seen before reuses its times: its kernels were checked then.)
        let mut auto_fresh = false;
        for (li, slot) in ms.iter_mut().enumerate() {
            let key = (kind, ci, co, s, k, st, li);
            if let Some(&t) = cache.get(&key) {
                *slot = t;
                continue;
            }
            if li == 1 && !(halo || c1 || upv) {
                // No special kernel: the auto run is the same kernel.
                continue;
            }
            b.with(|o| o.legacy_conv = li == 0);
            b.with(|o| o.halo_conv = li == 2);
            b.with(|o| o.c1_conv = li == 2);
            b.with(|o| (o.upsample_vec, o.convt_up2) = (li == 2, li == 2));
            let w = Tensor::new(
                if kind == 't' {
                    vec![ci, co, k, k, k]
                } else {
                    vec![co, ci, k, k, k]
                },
                r.scaled(ci * co * k * k * k, 1.0 / ((ci * k * k * k) as f32).sqrt()),
            );
            let bias = Some(Tensor::new(vec![co], r.scaled(co, 0.1)));
            let op = if kind == 't' {
                Op::ConvTranspose(ConvTranspose {
                    weight: w,
                    bias,
                    stride: [st; 3],
                    dilation: [1; 3],
                    pads: [0; 6],
                    output_padding: [0; 3],
                    groups: 1,
                })
            } else {
                Op::Conv(Conv {
                    weight: w,
                    bias,
                    stride: [st; 3],
                    dilation: [1; 3],
                    pads: [k / 2; 6],
                    groups: 1,
                })
            };
            let t = time_one(&mut b, &mut r, op, ci, co, n, s);
            if li == 2 && (c1 || upv || halo) {
                auto_kernels = kernels_used(&mut b, n);
                auto_fresh = true;
            }
            cache.insert(key, t);
            *slot = t;
        }
        // "auto" must be the new kernel where it applies ("mma" is then the old path).
        if c1 && auto_fresh {
            assert!(
                auto_kernels.iter().all(|k| k == cat::CONV_C1_K3.name),
                "{auto_kernels:?}"
            );
        }
        if upv && auto_fresh {
            assert!(
                auto_kernels.iter().all(|k| k.starts_with("convt_up")),
                "{auto_kernels:?}"
            );
        }
        // (A halo rule's conv runs on a `conv_halo_*` kernel, or a wgmma one on sm_90.)
        if halo && auto_fresh {
            assert!(
                !auto_kernels.is_empty()
                    && auto_kernels.iter().all(|k| {
                        ["conv_halo_", "conv_wg_", "conv_wz_", "conv_wgk_"]
                            .iter()
                            .any(|p| k.starts_with(p))
                    }),
                "{kind} {ci}->{co} at {s}^3: {auto_kernels:?}"
            );
        }
        if ms[1] == 0.0 {
            ms[1] = ms[2];
        }
        tot_old += ms[0];
        tot_mma += ms[1];
        tot_new += ms[2];
        tot_flop += flop;
        println!(
            "RESULT w1 {kind} {ci:>3}->{co:<3} k{k}s{st} in {s:>3}^3: legacy {:7.3} ms {:6.1} TF/s | mma {:7.3} ms {:6.1} TF/s | auto {:7.3} ms {:6.1} TF/s{}",
            ms[0],
            flop / ms[0] / 1e9,
            ms[1],
            flop / ms[1] / 1e9,
            ms[2],
            flop / ms[2] / 1e9,
            if auto_kernels.is_empty() {
                String::new()
            } else {
                format!(" [{}]", auto_kernels.join(", "))
            }
        );
    }
    b.with(|o| o.halo_conv = true);
    b.with(|o| o.c1_conv = true);
    b.with(|o| o.upsample_vec = true);
    println!(
        "RESULT w1 convs total (batch 4): {:.1} GFLOP, legacy {tot_old:.2} ms ({:.1} TF/s), mma {tot_mma:.2} ms ({:.1} TF/s), auto (halo) {tot_new:.2} ms ({:.1} TF/s)",
        tot_flop / 1e9,
        tot_flop / tot_old / 1e9,
        tot_flop / tot_mma / 1e9,
        tot_flop / tot_new / 1e9
    );
    // K1: conv 32->32 3^3 on 2x32x128^3 (cuDNN NDHWC: 166 TF/s), every vectorised tile.
    let flop = 2.0 * (2 * 128usize.pow(3)) as f64 * 32.0 * (27 * 32) as f64;
    let k1 = |r: &mut Rng| {
        Op::Conv(Conv {
            weight: Tensor::new(vec![32, 32, 3, 3, 3], r.scaled(32 * 32 * 27, 0.03)),
            bias: None,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [1; 6],
            groups: 1,
        })
    };
    b.with(|o| o.legacy_conv = true);
    let op = k1(&mut r);
    let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
    println!(
        "RESULT K1 legacy wmma: {t:.3} ms {:.1} TF/s",
        flop / t / 1e9
    );
    b.with(|o| o.legacy_conv = false);
    for tile in [
        None,
        Some(cat::CONV_MMA_M256N32_V8.name),
        Some(cat::CONV_MMA_M128N32_V8.name),
    ] {
        // auto = the halo kernel (CONV_HALO_C32N32); forced tiles turn it off.
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let op = k1(&mut r);
        let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
        println!(
            "RESULT K1 {}: {t:.3} ms {:.1} TF/s ({:.2}x cuDNN 166)",
            tile.unwrap_or("auto"),
            flop / t / 1e9,
            flop / t / 1e9 / 166.0
        );
    }
    b.with(|o| o.conv_tile = None);
    let op = k1(&mut r);
    b.with(|o| o.halo_tile = Some(&cat::CONV_HALO_C32N32_W4));
    let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
    println!(
        "RESULT K1 {}: {t:.3} ms {:.1} TF/s ({:.2}x cuDNN 166)",
        cat::CONV_HALO_C32N32_W4.name,
        flop / t / 1e9,
        flop / t / 1e9 / 166.0
    );
    // W1's 64->32 at 128^3 (batch 4) on the 4-warp variant (the layer table has the default).
    let op = Op::Conv(Conv {
        weight: Tensor::new(vec![32, 64, 3, 3, 3], r.scaled(32 * 64 * 27, 0.02)),
        bias: None,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [1; 6],
        groups: 1,
    });
    b.with(|o| o.halo_tile = Some(&cat::CONV_HALO_C64N32_W4));
    let t = time_one(&mut b, &mut r, op, 64, 32, 4, 128);
    println!(
        "RESULT w1 c 64->32 k3s1 in 128^3 on {}: {t:.3} ms {:.1} TF/s",
        cat::CONV_HALO_C64N32_W4.name,
        2.0 * (4 * 128usize.pow(3)) as f64 * 32.0 * (27 * 64) as f64 / t / 1e9
    );
    b.with(|o| o.halo_tile = None);
}

/// Every `conv_halo_*` variant (forced by name) on K1 (32->32 3^3, 2x32x128^3; cuDNN NDHWC
/// 166 TF/s), W1's 64->32 (2x64x128^3) and 64->64 (4x64x64^3), W2's 14->14 (4x14x128^3, the
/// last ResidualUnit conv) and 16->16 (4x16x64^3), and a Cin-4 conv (forced only): one RESULT
/// line per variant with ms and TF/s (real FLOPs, not the zero-padded ones), the default
/// marked, so the HALO_CONFIGS order can be chosen from one run. For Cin < 32 also the old
/// path (halo off: `conv_mma_*`) and a `RESULT w2 ... old ... new` summary line. On compute
/// capability 9.0 the `conv_wg_*` (wgmma) variants too. Then W1's stride-2 convs of Cin 32 and
/// 64 on the implicit GEMM and on the stride-2 halo kernel (`RESULT halo-s2`).
#[test]
fn bench_halo_variants() {
    use super::conv_wgmma::default_wgmma;
    use voxtile::internals::cuda::host::catalogue::{wgmma_all, HaloConfig, HALO_CONFIGS};
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("halo-bench");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_conv = true);
    for (cin, cout, n, s, label) in [
        (32usize, 32usize, 2usize, 128usize, "K1 32->32 2x128^3"),
        (64, 32, 2, 128, "64->32 2x128^3"),
        (64, 64, 4, 64, "64->64 4x64^3"),
        (14, 14, 4, 128, "W2 14->14 4x128^3"),
        (16, 16, 4, 64, "W2 16->16 4x64^3"),
        (4, 16, 4, 128, "Cin4 4->16 4x128^3"),
        (128, 64, 4, 64, "128->64 4x64^3"),
        (128, 128, 4, 32, "128->128 4x32^3"),
    ]
    .into_iter()
    // VOXTILE_BENCH_ONLY=K1,...: the layers whose label starts with one of these (ncu runs).
    .filter(|l| {
        std::env::var("VOXTILE_BENCH_ONLY")
            .map_or(true, |v| v.split(',').any(|p| l.4.starts_with(p)))
    }) {
        let flop = 2.0 * (n * s * s * s) as f64 * cout as f64 * (27 * cin) as f64;
        let conv = |r: &mut Rng| conv3(r, cin, cout, 1);
        // The old path: halo off, asserted not to run a halo kernel.
        let old = (!(32..=64).contains(&cin)).then(|| {
            b.with(|o| o.halo_conv = false);
            let op = conv(&mut r);
            let t = time_one(&mut b, &mut r, op, cin, cout, n, s);
            let used = kernels_used(&mut b, n);
            assert!(
                !used.is_empty() && used.iter().all(|k| !k.starts_with("conv_halo")),
                "{label}: halo off ran {used:?}"
            );
            b.with(|o| o.halo_conv = true);
            println!(
                "RESULT halo {label} {:<22} {t:.3} ms {:6.1} TF/s (old path, halo off)",
                used.join("+"),
                flop / t / 1e9
            );
            t
        });
        // The variants at the planner's tile width (the narrowest that holds Cout).
        // (Cout above every width: the widest, in grid.y channel tiles.)
        // (wgmma ones too where the device has them.)
        let wg = cat::has_wgmma(b.arch());
        let table = || HALO_CONFIGS.iter().chain(wgmma_all().filter(|_| wg));
        let runs = |v: &&HaloConfig| v.stride == 1 && v.accepts_cin(cin);
        let widths = || table().filter(runs).map(|v| v.bn);
        let bn = widths()
            .filter(|&w| cout <= w)
            .min()
            .or_else(|| widths().max())
            .unwrap();
        let default = wg
            .then(|| default_wgmma(cin, cout))
            .flatten()
            .or_else(|| default_halo(cin, cout, 3, 1))
            .map(|c| c.name);
        let mut times: Vec<(f64, &str)> = Vec::new();
        for v in table().filter(runs).filter(|v| v.bn == bn) {
            b.with(|o| o.halo_tile = Some(v));
            let op = conv(&mut r);
            let t = time_one(&mut b, &mut r, op, cin, cout, n, s);
            let used = kernels_used(&mut b, n);
            if !used.iter().any(|k| k == v.name) {
                println!(
                    "RESULT halo {label} {}: not run (smem), ran {used:?}",
                    v.name
                );
                continue;
            }
            println!(
                "RESULT halo {label} {:<22} {t:.3} ms {:6.1} TF/s{}{}",
                v.name,
                flop / t / 1e9,
                if cin == 32 && cout == 32 {
                    format!(" ({:.2}x cuDNN 166)", flop / t / 1e9 / 166.0)
                } else {
                    String::new()
                },
                if default == Some(v.name) {
                    " [default]"
                } else {
                    ""
                }
            );
            times.push((t, v.name));
        }
        // "new": the default, or (Cin 4, forced only) the fastest variant.
        let new = match default {
            Some(d) => times.iter().find(|x| x.1 == d).copied(),
            None => times.iter().copied().min_by(|a, b| a.0.total_cmp(&b.0)),
        };
        if let (Some(t0), Some((t1, name))) = (old, new) {
            println!(
                "RESULT halo-vs-old c {cin}->{cout} k3s1 {label}: old {t0:.3} ms {:.1} TF/s | new {t1:.3} ms {:.1} TF/s on {name}{} ({:.2}x)",
                flop / t0 / 1e9,
                flop / t1 / 1e9,
                if default == Some(name) { " [default]" } else { " [fastest variant, forced]" },
                t0 / t1
            );
        }
    }
    b.with(|o| o.halo_tile = None);
    // W1's stride-2 convs of Cin 32 and 64 (128³ -> 64³, 64³ -> 32³) on the implicit GEMM
    // (the default), on the stride-2 halo kernel (`halo_s2`) and on the stride-2 wgmma kernels
    // (`wg_s2`: its default, then each other one forced), each checked to be the one that ran.
    let wg_forced = wgmma_all().filter(|c| c.stride == 2 && c.name != cat::CONV_WG_C32N64_S2P.name);
    let runs: Vec<(&str, bool, bool, Option<&'static cat::HaloConfig>)> = [
        ("the implicit GEMM", false, false, None),
        (cat::CONV_HALO_C32N64_S2.name, true, false, None),
        (cat::CONV_WG_C32N64_S2P.name, false, true, None),
    ]
    .into_iter()
    .chain(wg_forced.map(|c| (c.name, false, true, Some(c))))
    .collect();
    for (cin, cout, n, s, label) in [
        (32usize, 64usize, 4usize, 128usize, "W1 32->64 s2 4x128^3"),
        (64, 128, 4, 64, "W1 64->128 s2 4x64^3"),
    ] {
        let os = s / 2;
        let flop = 2.0 * (n * os * os * os) as f64 * cout as f64 * (27 * cin) as f64;
        let mut t0 = None;
        for &(want, halo, wg, tile) in &runs {
            if tile.is_some_and(|t| !t.accepts_cin(cin)) {
                continue;
            }
            // (Against the mma GEMM: `bench_wgk` times the wgmma implicit GEMM at stride 2.)
            b.with(|o| (o.halo_s2, o.wg_s2, o.halo_tile, o.wgk_conv) = (halo, wg, tile, false));
            let op = conv3(&mut r, cin, cout, 2);
            let t = time_one(&mut b, &mut r, op, cin, cout, n, s);
            let used = kernels_used(&mut b, n);
            // (`wg_s2`'s kernel holds Cin 32 only: at Cin 64 the switch keeps the GEMM.)
            let want = if wg && tile.is_none() && cin != 32 {
                "conv_mma_"
            } else {
                want
            };
            let ok = if halo || wg {
                used.iter().any(|k| k.starts_with(want))
            } else {
                used.iter().all(|k| k.starts_with("conv_mma_"))
            };
            assert!(ok, "{label}: expected {want}, ran {used:?}");
            let base = *t0.get_or_insert(t);
            println!(
                "RESULT halo-s2 {label} {:<22} {t:.3} ms {:6.1} TF/s ({:.3}x the implicit GEMM)",
                used.join("+"),
                flop / t / 1e9,
                t / base
            );
        }
    }
    b.with(|o| (o.halo_s2, o.wg_s2, o.halo_tile, o.wgk_conv) = (false, false, None, true));
}

/// A 3^3 conv `cin` -> `cout` of stride `st` (pads 1, no bias) with random weights of unit
/// output scale: the layers `bench_halo_variants` times.
fn conv3(r: &mut Rng, cin: usize, cout: usize, st: usize) -> Op {
    Op::Conv(Conv {
        weight: Tensor::new(
            vec![cout, cin, 3, 3, 3],
            r.scaled(cout * cin * 27, 1.0 / ((27 * cin) as f32).sqrt()),
        ),
        bias: None,
        stride: [st; 3],
        dilation: [1; 3],
        pads: [1; 6],
        groups: 1,
    })
}

/// Per-op profile (`profile_forward`) of the models in VOXTILE_PROFILE_ONNX
/// ("path[:roi[:batch]],...", e.g. W1/W2 exported by tests/gpu/bench.py), else of a small
/// conv/norm/concat chain. Prints the ops by time; checks that the per-step sum matches the
/// timed forward (events add only small gaps) and that the profile covers every launch. Then
/// times the forward again with fp16 norm inputs (`CudaOptions::norm_f32` off) in the same
/// run: the cost of the fp32 ones, and their activation bytes; and with the fusions on by
/// default (`CudaOptions::norm_stats`, `concat_split`, `cin_chunks` (`PROFCH`)) switched off,
/// with the per-op profile of the first two off (`PROFST`); and with `norm_load_conv`
/// (`PROFNL`), `halo_s2`, `norm_recompute` (`PROFRC`) on; `head_mma`, `convt_stats`,
/// `split_k_fill`, `zpair_tma` (`PROFTM`; `PROFBK` with `zpair_bulk`), `zpair_st_staged`,
/// `norm_shifted`, `wg_s2` (`PROFW2`) off; `conv_wgk`'s variants (`PROFWK`, `PROFWS`, and
/// `wgk_convt` off: `PROFWT`).
#[test]
fn profile_models() {
    let Some(mut b) = gpu() else { return };
    b.with(|o| o.poison = false);
    let mut r = Rng::tagged("profile");
    let spec = std::env::var("VOXTILE_PROFILE_ONNX").unwrap_or_default();
    let mut cases: Vec<(String, Graph, usize, usize)> = Vec::new();
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let mut f = item.split(':');
        let path = f.next().unwrap().to_string();
        let roi = f.next().and_then(|v| v.parse().ok()).unwrap_or(128);
        let batch = f.next().and_then(|v| v.parse().ok()).unwrap_or(4);
        let g = voxtile::model::onnx::load(&path).expect("model loads");
        cases.push((path, g, roi, batch));
    }
    if cases.is_empty() {
        let c = 16;
        let conv = |r: &mut Rng, ci: usize| {
            let w = Tensor::new(vec![c, ci, 3, 3, 3], r.scaled(c * ci * 27, 0.1));
            crate::common::graph::conv(w, None, 1)
        };
        let norm = crate::common::graph::instance_norm(
            Tensor::new(vec![c], r.scaled(c, 1.0)),
            Tensor::new(vec![c], r.scaled(c, 1.0)),
        );
        let g = graph(
            1,
            vec![
                (conv(&mut r, 1), vec![0], c),
                (norm, vec![1], c),
                (Op::LeakyRelu { alpha: 0.01 }, vec![2], c),
                (conv(&mut r, c), vec![3], c),
                (Op::Concat { axis: 1 }, vec![3, 4], 2 * c),
            ],
        );
        cases.push(("chain".into(), g, 32, 2));
    }
    for (name, g, roi, batch) in cases {
        b.prepare(&g, batch, [roi; 3]).expect("prepare");
        let cin = g.input_channels();
        let x = Array5::from_shape_vec(
            (batch, cin, roi, roi, roi),
            r.scaled(batch * cin * roi * roi * roi, 1.0),
        )
        .unwrap();
        let y = b.run(x.view()).expect("run").to_owned();
        let t = b.time_forward(batch, 5).expect("time");
        let prof = b.profile_forward(batch, 3).expect("profile");
        let sum: f64 = prof.iter().map(|p| p.1).sum();
        let launches: usize = prof.iter().map(|p| p.2).sum();
        println!("RESULT profile {name} roi {roi} batch {batch}: forward {t:.3} ms, per-op sum {sum:.3} ms, {launches} steps");
        let mut kinds: Vec<(String, f64)> = Vec::new();
        for (label, ms, _) in &prof {
            let k = label.split(' ').next().unwrap_or("").to_string();
            match kinds.iter_mut().find(|a| a.0 == k) {
                Some(a) => a.1 += ms,
                None => kinds.push((k, *ms)),
            }
        }
        kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (k, ms) in &kinds {
            println!(
                "RESULT profile {name} kind {k:<14} {ms:8.3} ms {:5.1}%",
                100.0 * ms / sum
            );
        }
        for (label, ms, cnt) in &prof {
            println!("PROF {name} {ms:8.3} ms x{cnt:<3} {label}");
        }
        assert!(launches > 0 && prof.iter().all(|p| p.1 >= 0.0 && !p.0.is_empty()));
        assert!(
            sum > 0.7 * t && sum < 2.0 * t + 0.5,
            "per-op sum {sum} ms vs forward {t} ms"
        );
        let arena = b.activation_bytes();
        b.with(|o| o.norm_f32 = false);
        b.prepare(&g, batch, [roi; 3]).expect("prepare");
        let y16 = b.run(x.view()).expect("run").to_owned();
        let t16 = b.time_forward(batch, 5).expect("time");
        let arena16 = b.activation_bytes();
        b.with(|o| o.norm_f32 = true);
        println!(
            "RESULT profile {name} roi {roi} batch {batch}: fp32 norm inputs {t:.3} ms, arena {:.1} MiB | fp16 {t16:.3} ms, arena {:.1} MiB ({:.3}x)",
            arena as f64 / 1048576.0,
            arena16 as f64 / 1048576.0,
            t / t16
        );
        assert!(y16.iter().all(|v| v.is_finite()));
        assert!(arena >= arena16);
        // The fusions the defaults run: the residual Adds in the norms' affine passes; the
        // norms' statistics from the convs' epilogues and the convs over a concat per part,
        // each switched off alone and both (the per-op profile of both off, `PROFST`), the convs
        // in Cin chunks off (`PROFCH`); and the fusions off by default: the z-pair convs reading
        // their norm's input (`PROFNL`); the stride-2 convs on the stride-2 halo kernel, and
        // without the stride-2 wgmma kernel (`PROFW2`); the norms rerunning their Cin-1 convs
        // (`PROFRC`); the heads on mma.sync; without the transposed convs' `_st` twins; split-K to two
        // blocks an SM only where tiles fill under half the SMs (off: the old rule); the z-pair
        // convs without tensor loads (`_h2`, `PROFTM`) and with bulk stores only (`_h2b`,
        // `PROFBK`); the `_st` twins without the helper's stores (`_h2t_st`) and without their
        // outputs as fp16 less each tile's shift (`norm_shifted`), their norms by runs of voxels
        // (`PROFRN`); the full-resolution launches
        // batched rather than one window at a time (more activation bytes); the k2 transposed
        // convs on the upsampling GEMM rather than `convt_up2_p`; the `conv_wgk` convs without
        // the implicit GEMM, all on its n128 tile (`PROFWK`), and with their `_st` twins (`PROFWS`, the default).
        type Switch = (&'static str, fn(&mut CudaOptions), Option<&'static str>);
        let variants: [Switch; 23] = [
            (
                "without residual Adds in the norms",
                |o| o.norm_residual = false,
                None,
            ),
            (
                "without norm statistics in the conv epilogues",
                |o| o.norm_stats = false,
                None,
            ),
            ("without concat split", |o| o.concat_split = false, None),
            (
                "without both",
                |o| {
                    o.norm_stats = false;
                    o.concat_split = false;
                },
                Some("PROFST"),
            ),
            (
                "without cin chunks",
                |o| o.cin_chunks = false,
                Some("PROFCH"),
            ),
            (
                "with norm-load convs",
                |o| o.norm_load_conv = true,
                Some("PROFNL"),
            ),
            ("with the stride-2 halo kernel", |o| o.halo_s2 = true, None),
            (
                "without the stride-2 wgmma kernel",
                |o| o.wg_s2 = false,
                Some("PROFW2"),
            ),
            (
                "with the norms recomputing their Cin-1 convs",
                |o| o.norm_recompute = true,
                Some("PROFRC"),
            ),
            ("without the mma heads", |o| o.head_mma = false, None),
            (
                "without the transposed convs' statistics",
                |o| o.convt_stats = false,
                None,
            ),
            (
                "without split-K to two blocks an SM",
                |o| o.split_k_fill = false,
                None,
            ),
            (
                "with the z-pair convs' bulk stores alone",
                |o| (o.zpair_tma, o.zpair_bulk) = (false, true),
                Some("PROFBK"),
            ),
            (
                "without the z-pair convs' tensor loads and bulk stores",
                |o| o.zpair_tma = false,
                Some("PROFTM"),
            ),
            (
                "without the z-pair convs' statistics on the helper's stores",
                |o| o.zpair_st_staged = false,
                None,
            ),
            (
                "without the z-pair convs' outputs shifted fp16 for their norms",
                |o| o.norm_shifted = false,
                None,
            ),
            (
                "without the shifted norms by runs of voxels",
                |o| o.norm_runs = false,
                Some("PROFRN"),
            ),
            (
                "without window segments",
                |o| o.window_segments = false,
                None,
            ),
            (
                "without the persistent k2 transposed conv",
                |o| o.convt_up2 = false,
                None,
            ),
            (
                "without the wgmma implicit GEMM",
                |o| o.wgk_conv = false,
                None,
            ),
            (
                "with every Cin-64k stride-1 conv on conv_wgk_n128",
                |o| o.wgk_tile = Some(&cat::CONV_WGK_N128),
                Some("PROFWK"),
            ),
            (
                "without the conv_wgk convs' norm statistics",
                |o| o.wgk_stats = false,
                Some("PROFWS"),
            ),
            (
                "without the fused transposed convs on conv_wgk_up",
                |o| o.wgk_convt = false,
                Some("PROFWT"),
            ),
        ];
        // `VOXTILE_PROFILE_ONLY`: the variants whose name holds one of its `|`-separated words
        // (a device call's time is short); unset, every variant.
        let only = std::env::var("VOXTILE_PROFILE_ONLY").ok();
        let wanted = |what: &str| {
            only.as_deref()
                .is_none_or(|o| o.split('|').any(|w| !w.is_empty() && what.contains(w)))
        };
        for (what, set, tag) in variants.into_iter().filter(|v| wanted(v.0)) {
            b.with(set);
            b.prepare(&g, batch, [roi; 3]).expect("prepare");
            let ys = b.run(x.view()).expect("run").to_owned();
            let ts = b.time_forward(batch, 5).expect("time");
            if let Some(tag) = tag {
                let profs = b.profile_forward(batch, 3).expect("profile");
                for (label, ms, cnt) in &profs {
                    println!("{tag} {name} {ms:8.3} ms x{cnt:<3} {label}");
                }
            }
            b.with(|o| {
                let d = CudaOptions::default();
                (o.norm_stats, o.concat_split) = (d.norm_stats, d.concat_split);
                (o.cin_chunks, o.norm_load_conv) = (d.cin_chunks, d.norm_load_conv);
                (o.halo_s2, o.norm_residual) = (d.halo_s2, d.norm_residual);
                o.wg_s2 = d.wg_s2;
                (o.norm_recompute, o.head_mma) = (d.norm_recompute, d.head_mma);
                (o.convt_stats, o.split_k_fill) = (d.convt_stats, d.split_k_fill);
                (o.zpair_bulk, o.zpair_tma) = (d.zpair_bulk, d.zpair_tma);
                (o.zpair_st_staged, o.window_segments) = (d.zpair_st_staged, d.window_segments);
                (o.norm_shifted, o.norm_runs) = (d.norm_shifted, d.norm_runs);
                (o.wgk_conv, o.wgk_tile) = (d.wgk_conv, d.wgk_tile);
                (o.wgk_stats, o.wgk_convt) = (d.wgk_stats, d.wgk_convt);
            });
            let dev = max_abs_diff(&ys, &y);
            println!(
                "RESULT profile {name} roi {roi} batch {batch}: {what} {ts:.3} ms against {t:.3} ({:.3}x), max |diff| {dev:.2e}",
                ts / t
            );
            assert!(ys.iter().all(|v| v.is_finite()), "{what}");
        }
    }
}

/// W2's k3 s2 transposed convs (parity classes fused into one GEMM) at batch 4 with each
/// `conv_mma` tile forced, each followed by an InstanceNorm as in W2 (so the conv stores fp32),
/// and W1's k2 s2 ones at 128³ and 64³ (fp16 output): the conv's own time per tile, against the
/// planner's pick (`RESULT convt`).
#[test]
fn bench_convt_tiles() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("convt-tiles");
    b.with(|o| o.poison = false);
    let n = 4;
    // (Cin, Cout, input side, kernel): W2's k3 s2 ones, then W1's k2 s2 ones at 128³ and 64³
    // (the upsampling GEMM; there without a norm after it, as W1's go into their concat).
    for (cin, cout, s, k) in [
        (32usize, 14usize, 64usize, 3usize),
        (64, 16, 32, 3),
        (128, 32, 16, 3),
        (64, 32, 64, 2),
        (128, 64, 32, 2),
    ] {
        let k3 = k == 3;
        let op = Op::ConvTranspose(ConvTranspose {
            weight: Tensor::new(
                vec![cin, cout, k, k, k],
                r.scaled(cin * cout * k * k * k, 1.0 / (cin as f32).sqrt()),
            ),
            bias: Some(Tensor::new(vec![cout], r.scaled(cout, 0.1))),
            stride: [2; 3],
            dilation: [1; 3],
            pads: [usize::from(k3); 6],
            output_padding: [usize::from(k3); 3],
            groups: 1,
        });
        let norm = unit_norm(cout);
        let mut nodes = vec![(op, vec![0], cout)];
        if k3 {
            nodes.push((norm, vec![1], cout));
        }
        let g = graph(cin, nodes);
        let x =
            Array5::from_shape_vec((n, cin, s, s, s), r.scaled(n * cin * s * s * s, 1.0)).unwrap();
        let flop = 2.0 * (n * s * s * s) as f64 * (cin * cout * k * k * k) as f64;
        let tiles = std::iter::once(None).chain(MMA_CONFIGS.iter().map(Some));
        let runs = tile_sweep(
            &mut b,
            &g,
            &x,
            (n, s),
            "ConvTranspose",
            tiles.map(|t| (t, 1)),
        );
        for (tile, _, ms, label) in runs {
            println!(
                "RESULT convt {cin}->{cout} k{k} {n}x{s}^3 -> {}^3 {:<22} {ms:.3} ms ({:.0} TF/s useful)  {label}",
                2 * s,
                tile.map_or("auto", |t| t.name),
                flop / ms / 1e9
            );
        }
    }
}

/// W1's convs on the `conv_mma` tiles (its stride-2 3³ convs, and the 16³ / 8³ stride-1 ones):
/// each followed by an InstanceNorm as in W1 (the conv stores fp32), at batch 4, with every
/// tile forced (and at 16³ and below, on the planner's tile, split-K off, on, and to two blocks
/// an SM, `split_k_fill`): the conv's own time per tile against the planner's pick (`RESULT mma
/// tiles`; "split-K" 0 off, 1 the default rule, 2 the fill rule). The outputs agree to fp16
/// rounding across tiles.
#[test]
fn bench_mma_tiles() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("mma-tiles");
    b.with(|o| o.poison = false);
    let n = 4;
    // (Cin, Cout, input side, stride)
    for (cin, cout, s, st) in [
        (32usize, 64usize, 128usize, 2usize),
        (64, 128, 64, 2),
        (128, 256, 32, 2),
        (256, 320, 16, 2),
        (256, 256, 16, 1),
        (320, 320, 8, 1),
        (640, 320, 8, 1),
    ] {
        let os = s / st;
        let (g, x, flop) = conv_norm_case(&mut r, (cin, cout, st), (n, s));
        // (The 16-byte tiles: every Cin here is a multiple of 8.)
        let v8 = MMA_CONFIGS.iter().filter(|c| c.name.ends_with("_v8"));
        let tiles = std::iter::once(None).chain(v8.map(Some));
        // (Split-K only applies to the small outputs, on the planner's tile.)
        let variants = tiles.flat_map(|t| {
            let splits: &[usize] = if os <= 16 && t.is_none() {
                &[1, 0, 2]
            } else {
                &[1]
            };
            splits.iter().map(move |&sp| (t, sp))
        });
        for (tile, split, ms, label) in tile_sweep(&mut b, &g, &x, (n, s), "Conv", variants) {
            println!(
                "RESULT mma tiles {cin}->{cout} s{st} {n}x{s}^3 {:<22} split-K {} {ms:.3} ms ({:.0} TF/s)  {label}",
                tile.map_or("auto", |t| t.name),
                split,
                flop / ms / 1e9
            );
        }
    }
}

/// W1's convs from 64³ down to 16³ with Cin a multiple of 64, each followed by an
/// InstanceNorm (the conv stores fp32), at batch 4: the conv's own time on the planner's
/// choice, with the wgmma implicit GEMM off (`conv_mma` or a halo kernel), and on each
/// `conv_wgk_*` forced (`RESULT wgk`); the outputs agree to fp16 rounding.
#[test]
fn bench_wgk() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgk-bench");
    b.with(|o| o.poison = false);
    let n = 4;
    // (Cin, Cout, input side, stride)
    for (cin, cout, s, st) in [
        (256usize, 256usize, 16usize, 1usize),
        (512, 256, 16, 1),
        (128, 128, 32, 1),
        (256, 128, 32, 1),
        (64, 64, 64, 1),
        (64, 128, 64, 2),
        (128, 256, 32, 2),
    ] {
        let (g, x, flop) = conv_norm_case(&mut r, (cin, cout, st), (n, s));
        let of = |bn: usize| {
            cat::WGK_CONFIGS
                .iter()
                .find(|c| c.bn == bn && c.stride == st && !c.stats)
        };
        let variants: [(&str, bool, Option<&'static cat::WgkConfig>); 4] = [
            ("auto", true, None),
            ("wgk off", false, None),
            ("n256", true, of(256)),
            ("n128", true, of(128)),
        ];
        let mut want: Option<Array5<f32>> = None;
        for (what, on, tile) in variants {
            b.with(|o| (o.wgk_conv, o.wgk_tile) = (on, tile));
            b.prepare(&g, n, [s; 3]).expect("prepare");
            let got = b.run(x.view()).expect("run").to_owned();
            if let Some(w) = &want {
                let e = max_abs_diff(&got, w);
                let top = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(e <= top / 256.0, "{cin}->{cout} {what}: {e:e} from auto");
            } else {
                want = Some(got);
            }
            let (label, ms) = step_ms(&mut b, n, "Conv");
            println!(
                "RESULT wgk {cin}->{cout} s{st} {n}x{s}^3 {what:<8} {ms:.3} ms ({:.0} TF/s)  {label}",
                flop / ms / 1e9
            );
        }
    }
    b.with(|o| (o.wgk_conv, o.wgk_tile) = (true, None));
}

/// Runs graph `g` (`n` windows of side `s`) once per `(tile, split-K)` of `variants` (None: the
/// planner's tile; split-K 0 off, 1 the default rule, 2 with `split_k_fill`), skipping any the
/// plan refuses; asserts every output agrees with the first to
/// fp16 rounding; returns each variant's time of its first step whose label starts with
/// `step` (ms per forward), with that label.
#[allow(clippy::type_complexity)]
fn tile_sweep(
    b: &mut CudaBackend,
    g: &Graph,
    x: &Array5<f32>,
    (n, s): (usize, usize),
    step: &str,
    variants: impl Iterator<Item = (Option<&'static MmaConfig>, usize)>,
) -> Vec<(Option<&'static MmaConfig>, usize, f64, String)> {
    let mut want: Option<Array5<f32>> = None;
    let mut out = Vec::new();
    for (tile, split) in variants {
        b.with(|o| (o.conv_tile, o.split_k, o.split_k_fill) = (tile, split > 0, split == 2));
        if b.prepare(g, n, [s; 3]).is_err() {
            continue;
        }
        let got = b.run(x.view()).expect("run").to_owned();
        // Every tile computes the same conv: the outputs agree to fp16 rounding.
        match &want {
            None => want = Some(got),
            Some(w) => {
                let (num, den) = w.iter().zip(got.iter()).fold((0.0, 0.0), |(a, d), (p, q)| {
                    (a + ((p - q) as f64).powi(2), d + (*p as f64).powi(2))
                });
                let e = (num / den.max(1e-30)).sqrt();
                assert!(e < 1e-2, "{}: tile {tile:?} rel L2 {e:e}", g.name);
            }
        }
        let (label, ms) = step_ms(b, n, step);
        out.push((tile, split, ms, label));
    }
    b.with(|o| (o.conv_tile, o.split_k, o.split_k_fill) = (None, true, false));
    out
}

/// The first profiled step of the forward at batch `n` whose label starts with `step`: its
/// label and time (ms, a median of 5).
fn step_ms(b: &mut CudaBackend, n: usize, step: &str) -> (String, f64) {
    let prof = b.profile_forward(n, 5).expect("profile");
    prof.iter()
        .find(|p| p.0.starts_with(step))
        .map(|p| (p.0.clone(), p.1))
        .expect("the step in the profile")
}

/// A 3^3 conv `cin` -> `cout` of stride `st` then a unit InstanceNorm (the conv stores fp32,
/// as in the nets), on `n` random windows of side `s`: the graph, its input and the conv's
/// flops.
fn conv_norm_case(
    r: &mut Rng,
    (cin, cout, st): (usize, usize, usize),
    (n, s): (usize, usize),
) -> (Graph, Array5<f32>, f64) {
    let g = graph(
        cin,
        vec![
            (conv3(r, cin, cout, st), vec![0], cout),
            (unit_norm(cout), vec![1], cout),
        ],
    );
    let x = Array5::from_shape_vec((n, cin, s, s, s), r.scaled(n * cin * s * s * s, 1.0)).unwrap();
    let os = s / st;
    (
        g,
        x,
        2.0 * (n * os * os * os) as f64 * (cout * cin * 27) as f64,
    )
}

/// An InstanceNorm of unit scale and no shift over `c` channels (after a conv whose own time a
/// bench takes: the conv then stores fp32, as in the nets).
fn unit_norm(c: usize) -> Op {
    Op::InstanceNorm {
        eps: 1e-5,
        scale: Tensor::new(vec![c], vec![1.0; c]),
        bias: Tensor::new(vec![c], vec![0.0; c]),
    }
}
