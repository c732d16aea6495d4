//! InstanceNorm / GroupNorm kernel paths on CUDA (vector widths, block counts, C > 256, fused
//! activations, determinism) and the fp32 norm inputs of every conv family.

use super::*;

/// The norm kernels' paths, each with a second run that must give the same bits. (The plain
/// InstanceNorm, GroupNorm and ChannelAffine cases are the shared table's, `ops/norm.rs`.)
#[test]
fn norm_kernel_paths() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("norm");
    for (name, c, groups, act) in [
        (
            "instancenorm C=16 +leaky",
            16usize,
            16usize,
            Some(Op::LeakyRelu { alpha: 0.01 }),
        ),
        ("instancenorm C=40", 40, 40, None),
        (
            "groupnorm C=32 g=8 +prelu",
            32,
            8,
            Some(Op::PRelu {
                slope: Tensor::new(vec![1], vec![0.25]),
            }),
        ),
        ("groupnorm C=300 g=3 (C>256)", 300, 3, Some(Op::Relu)),
        (
            "instancenorm C=32 (16-byte path, many blocks) +prelu per channel",
            32,
            32,
            Some(Op::PRelu {
                slope: Tensor::new(vec![32], (0..32).map(|i| 0.01 * i as f32).collect()),
            }),
        ),
        // C % 8 != 0 with P * C % 8 == 0: flat 16-byte vectors (periods 7, 3, 5, 75).
        (
            "instancenorm C=14 (flat vectors, many blocks) +prelu per channel",
            14,
            14,
            Some(Op::PRelu {
                slope: Tensor::new(vec![14], (0..14).map(|i| 0.02 * i as f32).collect()),
            }),
        ),
        ("groupnorm C=6 g=2 (flat vectors)", 6, 6 / 3, None),
        (
            "instancenorm C=5 (flat vectors) +leaky",
            5,
            5,
            Some(Op::LeakyRelu { alpha: 0.01 }),
        ),
        (
            "instancenorm C=14 (P * C % 8 != 0: element kernels)",
            14,
            14,
            None,
        ),
    ] {
        // P * C % 8 == 0 for the flat cases (the C = 14 one spans many blocks); 990 voxels
        // for the rest (C = 300: flat vectors of period 75, C = 14: the element kernels).
        let sp = match (c, name.contains("flat")) {
            (32, false) if groups == 32 => [40, 36, 33],
            (14, true) => [40, 36, 32],
            (_, true) => [8, 10, 12],
            _ => [9, 10, 11],
        };
        let n = sp.iter().product::<usize>();
        // Offset mean (3) so cancellation in the variance would show.
        let xv: Vec<f32> = r.scaled(2 * c * n, 1.0).iter().map(|v| v + 3.0).collect();
        let x = T::from([2, c, sp[0], sp[1], sp[2]], &xv);
        let scale = Tensor::new(vec![c], r.scaled(c, 1.0));
        let bias = Tensor::new(vec![c], r.scaled(c, 1.0));
        let op = if groups == c {
            Op::InstanceNorm {
                eps: 1e-5,
                scale: scale.clone(),
                bias: bias.clone(),
            }
        } else {
            Op::GroupNorm {
                groups,
                eps: 1e-5,
                scale: scale.clone(),
                bias: bias.clone(),
            }
        };
        let mut want = norm_ref(&x, groups, 1e-5, &scale, &bias);
        let mut nodes = vec![(op, vec![0], c)];
        if let Some(a) = act {
            want = want.map(|ch, v| act_ref(&a, ch, v));
            nodes.push((a, vec![1], c));
        }
        let g = graph(c, nodes);
        let got = run(&mut b, &g, &x, 2);
        report(name, rel_l2(&got, &want));
        // Fixed-order reductions: a second run gives the same bits.
        let again = run(&mut b, &g, &x, 2);
        assert!(same_bits(&got, &again), "{name}: two runs differ");
    }
}

/// Conv outputs that only an InstanceNorm reads are stored in fp32 (`CudaOptions::norm_f32`):
/// every conv kernel family's fp32 epilogue (the wgmma kernels' pair stores and the z-pair
/// kernel's staged put on compute capability 9.0, halo vector and pair stores, mma, Cin-1, grouped
/// direct, the upsampling GEMM with and without its staged epilogue, strided transposed convs
/// per parity class and fused (staged epilogue), the wmma GEMM) through conv -> InstanceNorm -> LeakyReLU against
/// float64, with per-channel offsets (bias 4) large against the spread, where fp16 storage
/// loses most. Each case runs with fp32 and with fp16 norm inputs; over all cases the fp32
/// error must be the smaller one by a clear margin (fp16 storage rounds the raw value; the
/// norm then divides its error by the spread).
#[test]
fn conv_norm_fp32_inputs() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("normf32");
    // (name, cin, cout, input spatial, k, stride, pads, output padding, groups, transposed,
    //  legacy wmma convs, the kernel expected)
    type Case = (
        &'static str,
        usize,
        usize,
        [usize; 3],
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        bool,
        &'static str,
    );
    let cases: [Case; 13] = [
        (
            "wgmma 14->14 (pair store)",
            14,
            14,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_wg",
        ),
        (
            "z-pair 32->20 (staged put)",
            32,
            20,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_wz",
        ),
        (
            "halo 64->64 (vector store)",
            64,
            64,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_halo",
        ),
        (
            "halo 64->36 (pair store)",
            64,
            36,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_halo",
        ),
        (
            "mma 3^3 s2 16->64",
            16,
            64,
            [12, 10, 9],
            3,
            2,
            1,
            0,
            1,
            false,
            false,
            "conv_mma",
        ),
        (
            "Cin-1 3^3 -> 8",
            1,
            8,
            [11, 10, 9],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_c1_k3",
        ),
        (
            "grouped g=4 16->16 (direct)",
            16,
            16,
            [8, 8, 8],
            3,
            1,
            1,
            0,
            4,
            false,
            false,
            "conv_direct",
        ),
        (
            "convT k2 s2 32->16 (staged)",
            32,
            16,
            [5, 6, 7],
            2,
            2,
            0,
            0,
            1,
            true,
            false,
            "convt_up",
        ),
        (
            "convT k2 s2 12->6 (scatter)",
            12,
            6,
            [5, 6, 7],
            2,
            2,
            0,
            0,
            1,
            true,
            false,
            "conv_mma",
        ),
        (
            "convT k3 s2 40->20 (fused parity, staged)",
            40,
            20,
            [4, 4, 4],
            3,
            2,
            1,
            1,
            1,
            true,
            false,
            "convt_up",
        ),
        (
            "convT k3 s2 32->14 (fused parity, staged: W2)",
            32,
            14,
            [5, 6, 7],
            3,
            2,
            1,
            1,
            1,
            true,
            false,
            "convt_up",
        ),
        (
            "convT k3 s2 40->20 odd (parity)",
            40,
            20,
            [4, 5, 4],
            3,
            2,
            1,
            0,
            1,
            true,
            false,
            "conv_mma",
        ),
        (
            "wmma 3^3 16->24",
            16,
            24,
            [7, 8, 9],
            3,
            1,
            1,
            0,
            1,
            false,
            true,
            "conv_igemm",
        ),
    ];
    let (mut sum32, mut sum16, ncases) = (0.0, 0.0, cases.len() as f64);
    for (name, cin, cout, sp, k, st, pad, opad, groups, transposed, legacy, want_kernel) in cases {
        // (The wgmma kernels exist on compute capability 9.0 only.)
        let want_kernel =
            if matches!(want_kernel, "conv_wg" | "conv_wz") && !cat::has_wgmma(b.arch()) {
                "conv_halo"
            } else {
                want_kernel
            };
        let x = T::from(
            [2, cin, sp[0], sp[1], sp[2]],
            &r.scaled(2 * cin * sp.iter().product::<usize>(), 1.0),
        );
        let taps = k * k * k;
        let (wshape, fan) = if transposed {
            (vec![cin, cout / groups, k, k, k], cin / groups)
        } else {
            (vec![cout, cin / groups, k, k, k], cin / groups * taps)
        };
        let wlen: usize = wshape.iter().product();
        let w = Tensor::new(wshape, r.scaled(wlen, 1.0 / (fan as f32).sqrt()));
        let bias = Tensor::new(vec![cout], vec![4.0; cout]);
        let geo = Kernel {
            st: [st; 3],
            pads: [pad; 6],
            groups,
            transposed,
            opad: [opad; 3],
            ..PLAIN
        };
        let op = if transposed {
            Op::ConvTranspose(ConvTranspose {
                weight: w.clone(),
                bias: Some(bias.clone()),
                stride: [st; 3],
                dilation: [1; 3],
                pads: [pad; 6],
                output_padding: [opad; 3],
                groups,
            })
        } else {
            Op::Conv(Conv {
                weight: w.clone(),
                bias: Some(bias.clone()),
                stride: [st; 3],
                dilation: [1; 3],
                pads: [pad; 6],
                groups,
            })
        };
        let tail = Tail::instance_or_group(&mut r, cout, cout);
        let want = tail.reference(&conv_ref(&x, &w, Some(&bias), geo));
        let g = tail.after(cin, op, cout);
        b.with(|o| o.legacy_conv = legacy);
        let mut errs = [0.0; 2];
        for (i, f32_in) in [true, false].into_iter().enumerate() {
            b.with(|o| o.norm_f32 = f32_in);
            let got = run(&mut b, &g, &x, 2);
            let used = kernels_used(&mut b, 2);
            assert!(
                used.iter().any(|k| k.starts_with(want_kernel)),
                "{name}: ran {used:?}, expected {want_kernel}*"
            );
            errs[i] = rel_l2(&got, &want);
        }
        println!(
            "RESULT conv->norm {name:<36} fp32 norm input {:.2e} | fp16 {:.2e}",
            errs[0], errs[1]
        );
        assert!(errs[0] <= TOL, "{name}: rel L2 {:.3e}", errs[0]);
        sum32 += errs[0];
        sum16 += errs[1];
    }
    b.with(|o| {
        o.legacy_conv = false;
        o.norm_f32 = true;
    });
    println!(
        "RESULT conv->norm mean rel L2: fp32 inputs {:.2e}, fp16 {:.2e}",
        sum32 / ncases,
        sum16 / ncases
    );
    assert!(
        sum32 < 0.7 * sum16,
        "fp32 norm inputs {sum32:.3e} vs fp16 {sum16:.3e}"
    );
}
