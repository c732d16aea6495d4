//! The wgmma implicit GEMM (`conv_wgk_*`, kernels/conv_wgmma_k.cu, compute capability 9.0 only)
//! on CUDA against float64: partial 1x8x16 tiles on every axis, asymmetric pads, a 1x1x1 and a
//! dilated kernel, odd Cout and Cout above the tile width (grid.y), Cin in several 64-channel
//! steps, a fused activation, fp32 output for an InstanceNorm or a GroupNorm (whose statistics
//! the `_st` twin writes, `wgk_stats`), concat slices at even and odd offsets; each forced on both widths;
//! stride 2 on both stride-2 twins; then W1's shapes on the default choice.

use super::conv_halo::slice_case;
use super::*;
use voxtile::internals::cuda::host::catalogue::{
    WgkConfig, CONV_WGK_N128, CONV_WGK_N128_S2, CONV_WGK_N256, CONV_WGK_N256_S2,
};

fn forced(b: &mut CudaBackend, c: Option<&'static WgkConfig>) {
    b.with(|o| o.wgk_tile = c);
}

/// Each case against float64 with `c` forced, asserted to have run on it.
fn on_each<const N: usize>(
    b: &mut CudaBackend,
    r: &mut Rng,
    c: &'static WgkConfig,
    cases: [ConvCase<'_>; N],
) {
    forced(b, Some(c));
    for case in cases {
        let name = format!("{} on {}", case.name, c.name);
        conv_case_on(
            b,
            r,
            ConvCase {
                name: &name,
                ..case
            },
            c.name,
        );
    }
}

#[test]
fn conv_wgk_cases() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgk");
    let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
    for c in [&CONV_WGK_N128, &CONV_WGK_N256] {
        let k = c.name;
        let cases = [
            ConvCase::new("wgk 64->64 k3 p1 [5,9,17]", 64, 64, [5, 9, 17], 3).pads([1; 6]),
            ConvCase::new("wgk 128->129 k3 p1 [3,16,16]", 128, 129, [3, 16, 16], 3).pads([1; 6]),
            ConvCase::new("wgk 64->300 k3 p1 [2,7,20]", 64, 300, [2, 7, 20], 3).pads([1; 6]),
            ConvCase::new("wgk 192->40 k3 pads 0,1,2/2,1,0", 192, 40, [4, 6, 9], 3)
                .pads([0, 1, 2, 2, 1, 0]),
            ConvCase::new("wgk 64->48 k1", 64, 48, [3, 9, 19], 1),
            ConvCase::new("wgk 64->64 k3 dil 2 p2", 64, 64, [6, 7, 9], 3)
                .dl([2; 3])
                .pads([2; 6]),
            ConvCase::new("wgk 128->96 k3 p1 + leaky", 128, 96, [4, 8, 16], 3)
                .pads([1; 6])
                .act(leaky()),
        ];
        on_each(&mut b, &mut r, c, cases);
        // fp32 output for an InstanceNorm, and a GroupNorm of 8 groups, the statistics from the
        // `_st` twin (`wgk_stats`).
        b.with(|o| o.wgk_stats = true);
        for groups in [64, 8] {
            let (cin, cout, sp) = (128usize, 64usize, [3usize, 10, 17]);
            let x = input2(&mut r, cin, sp);
            let (w, bias) = (
                weight3(&mut r, cout, cin),
                Tensor::new(vec![cout], r.scaled(cout, 0.5)),
            );
            let want = conv_ref(&x, &w, Some(&bias), PAD1);
            let t = Tail::instance_or_group(&mut r, cout, groups);
            let want = t.reference(&want);
            let conv = crate::common::graph::conv(w, Some(bias), 1);
            let got = run(&mut b, &t.after(cin, conv, cout), &x, 2);
            report(
                &format!("wgk {cin}->{cout} + norm ({groups} groups) on {k}"),
                rel_l2(&got, &want),
            );
            // (The norm's statistics come from the conv's `_st` twin.)
            let used = kernels_used(&mut b, 2);
            let st = format!("{k}_st");
            assert!(used.contains(&st), "norm tail: ran {used:?}");
        }
        b.with(|o| o.wgk_stats = false);
        // Concat slices: 64 -> [32, 32] (offset 32) and [17, 40] (offset 17: element stores).
        for (ca, cb) in [(32usize, 32usize), (17, 40)] {
            slice_case(&mut b, &mut r, 64, ca, cb, None, k);
        }
    }
    // Stride 2 on the stride-2 twins: odd and even sides, asymmetric pads, a 1x1x1 kernel,
    // dilation 2 with a fused activation, Cout above the tile width.
    for c in [&CONV_WGK_N128_S2, &CONV_WGK_N256_S2] {
        let cases = [
            ConvCase::new("wgk s2 64->64 k3 p1 [9,16,33]", 64, 64, [9, 16, 33], 3)
                .st([2; 3])
                .pads([1; 6]),
            ConvCase::new(
                "wgk s2 128->300 k3 pads 1,0,1/0,1,1",
                128,
                300,
                [6, 7, 18],
                3,
            )
            .st([2; 3])
            .pads([1, 0, 1, 0, 1, 1]),
            ConvCase::new("wgk s2 64->40 k1", 64, 40, [5, 8, 17], 1).st([2; 3]),
            ConvCase::new("wgk s2 64->64 k3 dil 2 p2", 64, 64, [7, 10, 12], 3)
                .st([2; 3])
                .dl([2; 3])
                .pads([2; 6])
                .act(leaky()),
        ];
        on_each(&mut b, &mut r, c, cases);
    }
    forced(&mut b, None);
}

/// W1's shapes at two samples of enough voxels for 128 tiles or more, on the default choice:
/// 256 -> 256 (its 16³ convs) on `conv_wgk_n256`, 128 -> 128 (32³) on `conv_wgk_n128`, the
/// stride-2 64 -> 128 on `conv_wgk_n128_s2`.
#[test]
fn conv_wgk_default() {
    let Some(mut b) = wgmma_gpu() else { return };
    let mut r = Rng::tagged("wgk default");
    let cases = [
        (
            ConvCase::new(
                "wgk 256->256 k3 p1 [32,16,16] default",
                256,
                256,
                [32, 16, 16],
                3,
            ),
            &CONV_WGK_N256,
        ),
        (
            ConvCase::new(
                "wgk 128->128 k3 p1 [16,32,32] default",
                128,
                128,
                [16, 32, 32],
                3,
            ),
            &CONV_WGK_N128,
        ),
        (
            ConvCase::new(
                "wgk s2 64->128 k3 p1 [64,32,32] default",
                64,
                128,
                [64, 32, 32],
                3,
            )
            .st([2; 3]),
            &CONV_WGK_N128_S2,
        ),
    ];
    for (case, c) in cases {
        conv_case_on(&mut b, &mut r, case.pads([1; 6]), c.name);
    }
}
