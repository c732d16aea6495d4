//! The one-input-channel conv kernel (`CONV_C1_K3`) on CUDA.

use super::*;

/// `CONV_C1_K3` (Cin 1, 3^3, stride 1/2, Cout <= 64) vs float64: Cout 16/32/20/64/24, stride
/// 1, 2 and mixed, zero / asymmetric pads, odd sizes (partial 2x8x32 tiles on every axis),
/// fused activations, outputs into concat slices (8-aligned stride and offset: 16-byte stores;
/// odd: element stores). Each case checks that `CONV_C1_K3` ran; the switch turns it off.
#[test]
fn conv_c1_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("c1");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.c1_conv = true);
    let leaky = || Some(Op::LeakyRelu { alpha: 0.1 });
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, [usize; 3], [usize; 3], [usize; 6], Option<Op>)> = vec![
        (32, [9, 13, 37], [1; 3], [1; 6], None),
        (16, [7, 10, 33], [1; 3], [0; 6], Some(Op::Relu)),
        (20, [5, 17, 40], [2; 3], [1; 6], leaky()),
        (64, [4, 9, 70], [2; 3], [2, 1, 0, 0, 1, 2], None),
        (24, [3, 5, 7], [2, 1, 2], [1, 0, 1, 1, 0, 1], leaky()),
        (8, [11, 8, 31], [1; 3], [1; 6], Some(Op::Sigmoid)),
        (5, [6, 9, 12], [1, 2, 1], [1; 6], None),
    ];
    for (cout, sp, st, pads, act) in cases {
        let name = format!(
            "c1 1->{cout} {sp:?} s{st:?} pads {pads:?}{}",
            if act.is_some() { " +act" } else { "" }
        );
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, 1, cout, sp, 3)
                .st(st)
                .pads(pads)
                .act(act),
        );
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().all(|k| k == cat::CONV_C1_K3.name) && !used.is_empty(),
            "{name}: ran {used:?}"
        );
    }
    // Concat slices: [c1 conv a, c1 conv b, (x)]: stride 64 offset 32 (vector stores); stride
    // 37 = 16 + 20 + 1 with offset 16 (element stores).
    for (ca, cb, with_x) in [(32usize, 32usize, false), (16, 20, true), (24, 8, false)] {
        let sp = [5usize, 9, 35];
        let x = T::from(
            [2, 1, sp[0], sp[1], sp[2]],
            &r.scaled(2 * sp.iter().product::<usize>(), 1.0),
        );
        let mut parts = Vec::new();
        for c in [ca, cb] {
            let w = Tensor::new(vec![c, 1, 3, 3, 3], r.scaled(c * 27, 0.3));
            let bias = Tensor::new(vec![c], r.scaled(c, 0.5));
            let want = conv_ref(&x, &w, Some(&bias), PAD1);
            let op = Op::Conv(Conv {
                weight: w,
                bias: Some(bias),
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            });
            parts.push((op, want));
        }
        let name = format!(
            "c1 convs into concat [{ca}, {cb}{}]",
            if with_x { ", x" } else { "" }
        );
        let used = concat_parts_case(&mut b, &name, &x, parts, with_x);
        assert!(
            !used.is_empty() && used.iter().all(|k| k == cat::CONV_C1_K3.name),
            "{name}: ran {used:?}"
        );
    }
    // Switched off: the mma tile runs the same conv.
    b.with(|o| o.c1_conv = false);
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("c1 off 1->32", 1, 32, [6, 7, 9], 3).pads([1; 6]),
    );
    let used = kernels_used(&mut b, 2);
    assert!(used.iter().all(|k| k.starts_with("conv_mma_")), "{used:?}");
    b.with(|o| o.c1_conv = true);
}
