//! Concat on CUDA (computed inputs, in place into slices, the 1x1x1 head) and a partial batch.

use super::*;

/// Concat of computed values on CUDA, and a run of fewer samples than prepared. (Activations,
/// binaries, constants, Softmax and Identity are rows of the shared table, `ops/eltwise.rs`.)
#[test]
fn concat_and_partial_batch() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("eltwise");
    let c = 5;
    let s = [2, c, 6, 7, 8];
    let x = T::from(s, &r.scaled(2 * c * 336, 2.0));
    // Concat of the input and two derived values along channels (3 inputs, odd widths).
    let sg = x.map(|_, v| 1.0 / (1.0 + (-v).exp()));
    let th = x.map(|_, v| v.tanh());
    let mut want = T::zeros([2, 3 * c, 6, 7, 8]);
    for n in 0..2 {
        for (j, src) in [&x, &sg, &th].iter().enumerate() {
            for ch in 0..c {
                for z in 0..6 {
                    for y in 0..7 {
                        for xx in 0..8 {
                            let i = want.idx(n, j * c + ch, z, y, xx);
                            want.d[i] = src.at(n, ch, z, y, xx);
                        }
                    }
                }
            }
        }
    }
    let g = graph(
        c,
        vec![
            (Op::Sigmoid, vec![0], c),
            (Op::Tanh, vec![0], c),
            (Op::Concat { axis: 1 }, vec![0, 1, 2], 3 * c),
        ],
    );
    report("concat 3 inputs", rel_l2(&run(&mut b, &g, &x, 2), &want));
    // A smaller batch than prepared: run 1 of 2.
    b.prepare(&graph(c, vec![(Op::Tanh, vec![0], c)]), 2, [6, 7, 8])
        .unwrap();
    let one = T {
        s: [1, c, 6, 7, 8],
        d: x.d[..c * 336].to_vec(),
    };
    let got = b
        .run(
            Array5::from_shape_vec(one.s, one.d.iter().map(|&v| v as f32).collect())
                .unwrap()
                .view(),
        )
        .unwrap();
    report(
        "partial batch 1 of 2",
        rel_l2(&got, &one.map(|_, v| v.tanh())),
    );
}

/// A conv and a residual Add written straight into their concat's channel slices, a plain copy
/// for the third input, then the 1x1x1 head kernel (24 -> 5) against float64.
#[test]
fn concat_in_place_and_head() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("inplace");
    let (c, sp) = (8usize, [6usize, 7, 5]);
    let nvox = sp.iter().product::<usize>();
    let x = input2(&mut r, c, sp);
    let wa = Tensor::new(vec![16, c, 3, 3, 3], r.scaled(16 * c * 27, 0.1));
    let wb = Tensor::new(vec![c, c, 3, 3, 3], r.scaled(c * c * 27, 0.1));
    let wh = Tensor::new(vec![5, 32, 1, 1, 1], r.scaled(5 * 32, 0.3));
    let bh = Tensor::new(vec![5], r.scaled(5, 0.1));
    let conv = |w: &Tensor, bias: Option<Tensor>, p: usize| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [p; 6],
            groups: 1,
        })
    };
    let g = graph(
        c,
        vec![
            (conv(&wa, None, 1), vec![0], 16), // v1 -> concat slice 0..16
            (conv(&wb, None, 1), vec![0], c),  // v2
            (Op::Add, vec![2, 0], c),          // v3 -> concat slice 16..24
            (Op::Concat { axis: 1 }, vec![1, 3, 0], 32), // v4 (x copied at 24..32)
            (conv(&wh, Some(bh.clone()), 0), vec![4], 5), // v5 head
        ],
    );
    let v1 = conv_ref(&x, &wa, None, PAD1);
    let v2 = conv_ref(&x, &wb, None, PAD1);
    let mut cat = T::zeros([2, 32, sp[0], sp[1], sp[2]]);
    for n in 0..2 {
        for ch in 0..32 {
            for v in 0..nvox {
                let (src, sc) = match ch {
                    0..=15 => (v1.d[(n * 16 + ch) * nvox + v], 0.0),
                    16..=23 => (
                        v2.d[(n * c + ch - 16) * nvox + v],
                        x.d[(n * c + ch - 16) * nvox + v],
                    ),
                    _ => (x.d[(n * c + ch - 24) * nvox + v], 0.0),
                };
                cat.d[(n * 32 + ch) * nvox + v] = src + sc;
            }
        }
    }
    let want = conv_ref(&cat, &wh, Some(&bh), PLAIN);
    let got = run(&mut b, &g, &x, 2);
    report(
        "concat in place (conv, add, copy) + 1x1x1 head",
        rel_l2(&got, &want),
    );
}
