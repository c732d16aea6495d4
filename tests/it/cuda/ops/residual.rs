//! Residual Adds fused into the conv epilogue (`ConvParams::res`, the `conv_wg_*` kernels of
//! kernels/conv_wgmma.cu) on CUDA against float64: conv(x) + x where the Add is fused (the conv's
//! profile label carries "+Add", no Add step runs) and on the kernels that leave it to its own
//! launch, and a fused residual whose only reader is an InstanceNorm (fp32 output).

use super::*;
use crate::common::graph as hand;
use voxtile::internals::cuda::host::catalogue::{CONV_WG_C16N16_P, CONV_WG_C32N32_R};

/// conv(x) + x for a `c` -> `c` "same" 3^3 conv (`groups`) on a batch of 2 `sp` volumes, after
/// `opts`; checks the Add was fused exactly when `fused`, and returns the conv kernels that ran.
fn residual_case(
    b: &mut CudaBackend,
    r: &mut Rng,
    name: &str,
    (c, sp, groups): (usize, [usize; 3], usize),
    fused: bool,
    opts: impl FnOnce(&mut CudaOptions),
) -> Vec<String> {
    b.with(|o| *o = CudaOptions::default());
    b.with(|o| o.poison = true);
    b.with(opts);
    let x = input2(r, c, sp);
    let w = weight3(r, c, c / groups);
    let bias = Tensor::new(vec![c], r.scaled(c, 0.5));
    let conv = Conv {
        weight: w.clone(),
        bias: Some(bias.clone()),
        stride: [1; 3],
        dilation: [1; 3],
        pads: [1; 6],
        groups,
    };
    let geo = Kernel { groups, ..PAD1 };
    let conv_out = conv_ref(&x, &w, Some(&bias), geo);
    let want = T {
        s: conv_out.s,
        d: conv_out.d.iter().zip(&x.d).map(|(a, b)| a + b).collect(),
    };
    let g = graph(
        c,
        vec![(Op::Conv(conv), vec![0], c), (Op::Add, vec![1, 0], c)],
    );
    let got = run(b, &g, &x, 2);
    report(name, rel_l2(&got, &want));
    let prof = b.profile_forward(2, 1).expect("profile");
    let labels: Vec<&String> = prof.iter().map(|(l, _, _)| l).collect();
    let add_step = labels.iter().any(|l| l.starts_with("Add"));
    let conv_add = labels.iter().any(|l| l.contains("+Add"));
    assert_eq!(
        (conv_add, add_step),
        (fused, !fused),
        "{name}: fused {fused}: {labels:?}"
    );
    kernels_used(b, 2)
}

#[test]
fn conv_residual_add_fused_and_not() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("residual");
    let wgmma = cat::has_wgmma(b.arch());
    // W2's 14 channels and 16 on their default kernels: `conv_wg_*` on compute capability 9.0.
    for (c, sp) in [(14usize, [9usize, 10, 11]), (16, [16, 11, 9])] {
        let name = format!("{c}->{c} +x default");
        let used = residual_case(&mut b, &mut r, &name, (c, sp, 1), wgmma, |_| {});
        assert!(
            !wgmma || used.iter().all(|k| k.starts_with("conv_wg_")),
            "{used:?}"
        );
    }
    if wgmma {
        // The persistent wgmma kernel and the 32-channel one, forced.
        for (k, c) in [(&CONV_WG_C16N16_P, 16usize), (&CONV_WG_C32N32_R, 32)] {
            let name = format!("{c}->{c} +x {}", k.name);
            let used = residual_case(&mut b, &mut r, &name, (c, [13, 9, 17], 1), true, |o| {
                o.halo_tile = Some(k)
            });
            assert_eq!(used, vec![k.name.to_string()]);
        }
    }
    // Kernels without the residual epilogue: the Add runs on its own, the sum is the same.
    let used = residual_case(
        &mut b,
        &mut r,
        "32->32 +x z-pair / halo",
        (32, [16, 11, 9], 1),
        false,
        |_| {},
    );
    assert!(used.iter().all(|k| !k.starts_with("conv_wg_")), "{used:?}");
    residual_case(
        &mut b,
        &mut r,
        "14->14 +x mma",
        (14, [9, 10, 11], 1),
        false,
        |o| o.halo_conv = false,
    );
    residual_case(
        &mut b,
        &mut r,
        "16->16 g=4 +x direct",
        (16, [7, 8, 9], 4),
        false,
        |_| {},
    );
    b.with(|o| *o = CudaOptions::default());
}

/// v1 = conv(x), v2 = v1 + x, v3 = InstanceNorm(v2): the fused conv stores fp32 for the norm
/// and adds the fp16 residual (on compute capability 9.0, where `conv_wg_*` runs it).
#[test]
fn conv_residual_into_norm() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("residual norm");
    b.with(|o| o.poison = true);
    let (c, sp) = (16usize, [8usize, 9, 10]);
    let x = input2(&mut r, c, sp);
    let w = weight3(&mut r, c, c);
    let (gamma, beta) = (
        Tensor::new(vec![c], r.scaled(c, 1.0)),
        Tensor::new(vec![c], r.scaled(c, 1.0)),
    );
    let conv_out = conv_ref(&x, &w, None, PAD1);
    let sum = T {
        s: conv_out.s,
        d: conv_out.d.iter().zip(&x.d).map(|(a, b)| a + b).collect(),
    };
    let want = norm_ref(&sum, c, 1e-5, &gamma, &beta);
    let g = graph(
        c,
        vec![
            (hand::conv(w, None, 1), vec![0], c),
            (Op::Add, vec![1, 0], c),
            (hand::instance_norm(gamma, beta), vec![2], c),
        ],
    );
    let got = run(&mut b, &g, &x, 2);
    report("conv 16->16 +x -> InstanceNorm", rel_l2(&got, &want));
    if cat::has_wgmma(b.arch()) {
        let prof = b.profile_forward(2, 1).expect("profile");
        assert!(prof.iter().any(|(l, _, _)| l.contains("+Add")), "{prof:?}");
    }
    b.with(|o| o.poison = false);
}

/// conv(x) -> InstanceNorm -> PReLU -> + x (MONAI's residual unit end) with the Add fused into
/// the norm's affine pass (`norm_residual`) against float64, and bit for bit the plan that runs
/// the Add on its own: Cin 16 (the 8-channel vector pass), 14 (the flat vectors) and 5 on an
/// odd volume (the scalar pass); the conv's output fp32 (only the norm reads it) or fp16
/// (`norm_f32` off).
#[test]
fn norm_residual_add_fused_and_not() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("norm residual");
    for (c, sp, f32_in) in [
        (16usize, [8usize, 9, 10], true),
        (14, [9, 8, 10], true),
        (14, [9, 8, 10], false),
        (5, [7, 9, 5], true),
    ] {
        let x = input2(&mut r, c, sp);
        let w = weight3(&mut r, c, c);
        let bias = Tensor::new(vec![c], r.scaled(c, 2.0));
        let (gamma, beta) = (
            Tensor::new(vec![c], r.scaled(c, 1.0)),
            Tensor::new(vec![c], r.scaled(c, 1.0)),
        );
        let slope = Tensor::new(vec![c], r.scaled(c, 0.3));
        let prelu = Op::PRelu {
            slope: slope.clone(),
        };
        let conv_out = conv_ref(&x, &w, Some(&bias), PAD1);
        let normed = norm_ref(&conv_out, c, 1e-5, &gamma, &beta);
        let vox = normed.d.len() / (normed.s[0] * c);
        let want = T {
            s: normed.s,
            d: normed
                .d
                .iter()
                .enumerate()
                .map(|(i, &v)| act_ref(&prelu, (i / vox) % c, v))
                .zip(&x.d)
                .map(|(a, b)| a + b)
                .collect(),
        };
        let g = graph(
            c,
            vec![
                (hand::conv(w, Some(bias), 1), vec![0], c),
                (hand::instance_norm(gamma, beta), vec![1], c),
                (prelu, vec![2], c),
                (Op::Add, vec![3, 0], c),
            ],
        );
        let mut outs = Vec::new();
        for fused in [true, false] {
            b.with(|o| *o = CudaOptions::default());
            b.with(|o| {
                o.poison = true;
                o.norm_residual = fused;
                o.norm_f32 = f32_in;
            });
            let got = run(&mut b, &g, &x, 2);
            let name = format!(
                "{c}ch {sp:?} norm +PRelu +x {} {}",
                if f32_in { "f32 in" } else { "f16 in" },
                if fused { "fused" } else { "unfused" }
            );
            let e = rel_l2(&got, &want);
            report(&name, e);
            assert!(e <= TOL, "{name}: rel L2 {e:.2e}");
            let prof = b.profile_forward(2, 1).expect("profile");
            let norm_add = prof
                .iter()
                .any(|(l, _, _)| l.starts_with("InstanceNorm") && l.contains(" +PRelu +Add "));
            let add_step = prof.iter().any(|(l, _, _)| l.starts_with("Add"));
            assert_eq!((norm_add, add_step), (fused, !fused), "{name}: {prof:?}");
            outs.push(got);
        }
        assert!(
            same_bits(outs[0].iter(), outs[1].iter()),
            "{c}ch: the fused Add differs from the Add's own launch"
        );
    }
    b.with(|o| *o = CudaOptions::default());
}
