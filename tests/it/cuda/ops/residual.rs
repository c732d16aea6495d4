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
