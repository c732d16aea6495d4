//! A conv run as one launch per part of its input channels (`CudaOptions::concat_split`): each
//! part on the z-pair kernel over its slice of the weights, the later parts adding to the fp32
//! output in their epilogue (`ConvParams::accum`). The parts are a concat's inputs, or with
//! `cin_chunks` 32-channel chunks of one input (`ConvParams::ldi`). Against float64 and against
//! the conv run whole, with and without the norm statistics from the last part's epilogue.

use super::*;

/// Channel concat of NCDHW tensors of the same batch and spatial size.
fn cat(parts: &[&T]) -> T {
    let [n, _, d, h, w] = parts[0].s;
    let sp = d * h * w;
    let c: usize = parts.iter().map(|p| p.s[1]).sum();
    let mut out = T::zeros([n, c, d, h, w]);
    for b in 0..n {
        let mut at = b * c * sp;
        for p in parts {
            let run = p.s[1] * sp;
            out.d[at..at + run].copy_from_slice(&p.d[b * run..(b + 1) * run]);
            at += run;
        }
    }
    out
}

/// x (32 channels) -> a = ReLU(conv a(x)), b = conv b(x); concat `parts` of [x, a, b] -> conv
/// (bias 4) -> norm -> LeakyReLU. The parts are 32 channels each, so on compute capability 9.0
/// each runs the z-pair kernel (the whole, Cin 64 or 96, does not); outputs end inside a tile
/// on every axis.
#[test]
fn conv_over_a_concat_per_part() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("concatsplit");
    let c = 32;
    // (name, concat inputs among [x = 0, a = 1, b = 2], Cout, groups, spatial)
    type Case = (&'static str, &'static [usize], usize, usize, [usize; 3]);
    let cases: [Case; 3] = [
        ("[a, b] 64->32 instancenorm", &[1, 2], 32, 32, [17, 18, 9]),
        (
            "[x, a, b] 96->32 instancenorm",
            &[0, 1, 2],
            32,
            32,
            [9, 17, 10],
        ),
        (
            "[b, a] 64->20 groupnorm g=4 (partial piece)",
            &[2, 1],
            20,
            4,
            [18, 17, 9],
        ),
    ];
    for (name, parts, cout, groups, sp) in cases {
        let x = input2(&mut r, c, sp);
        let (wa, wb) = (weight3(&mut r, c, c), weight3(&mut r, c, c));
        let ba = Tensor::new(vec![c], r.scaled(c, 0.5));
        let cin = parts.len() * c;
        let wc = weight3(&mut r, cout, cin);
        let bc = Tensor::new(vec![cout], vec![4.0; cout]);
        let tail = Tail::new(&mut r, cout, groups);
        let va = conv_ref(&x, &wa, Some(&ba), PAD1).map(|_, v| v.max(0.0));
        let vb = conv_ref(&x, &wb, None, PAD1);
        let vals = [&x, &va, &vb];
        let xc = cat(&parts.iter().map(|&p| vals[p]).collect::<Vec<_>>());
        let want = tail.reference(&conv_ref(&xc, &wc, Some(&bc), PAD1));
        let conv = |w: Tensor, bias| crate::common::graph::conv(w, bias, 1);
        // Values: 0 x, 1 conv a, 2 ReLU, 3 conv b, 4 concat, 5 conv, 6 norm, 7 LeakyReLU.
        let ids = [0, 2, 3];
        let g = graph(
            c,
            vec![
                (conv(wa, Some(ba)), vec![0], c),
                (Op::Relu, vec![1], c),
                (conv(wb, None), vec![0], c),
                (
                    Op::Concat { axis: 1 },
                    parts.iter().map(|&p| ids[p]).collect(),
                    cin,
                ),
                (conv(wc, Some(bc)), vec![4], cout),
                (tail.norm.clone(), vec![5], cout),
                (tail.leaky.clone(), vec![6], cout),
            ],
        );
        b.with(|o| o.concat_split = false);
        let whole = run(&mut b, &g, &x, 2);
        let on = |o: &mut CudaOptions| o.concat_split = true;
        let ran = |used: &[String], k: &str| used.iter().any(|u| u == k);
        split_runs(
            &mut b,
            "concat split",
            name,
            (&g, &x),
            (&want, &whole),
            on,
            ran,
        );
    }
    b.with(|o| {
        o.concat_split = false;
        o.norm_stats = false;
    });
}

/// With `cin_chunks`: x (Cin channels) -> conv -> norm -> LeakyReLU, the conv in 32-channel
/// chunks of x on the z-pair kernel (Cout in 32-channel tiles, the last one partial in the
/// GroupNorm case); and a concat of a 64-channel part (two chunks) and x (whole). Outputs end
/// inside a tile on every axis; at batch 2 each has 144 z-pair tiles (3 x 3 x 8 a sample), as
/// chunks need a tile for every SM (132 on an H100 / H200).
#[test]
fn conv_in_cin_chunks() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("cinchunks");
    // (name, Cin of x, concat [a = ReLU(conv 32 -> 64 of x), x] first, Cout, groups, spatial)
    type Case = (&'static str, usize, bool, usize, usize, [usize; 3]);
    let cases: [Case; 3] = [
        ("64->64 instancenorm", 64, false, 64, 64, [41, 35, 63]),
        (
            "128->36 groupnorm g=4 (partial piece)",
            128,
            false,
            36,
            4,
            [35, 41, 57],
        ),
        ("[a, x] 96->64 instancenorm", 32, true, 64, 64, [41, 33, 63]),
    ];
    for (name, c, concat, cout, groups, sp) in cases {
        let x = input2(&mut r, c, sp);
        let wa = weight3(&mut r, 64, c);
        let cin = if concat { 64 + c } else { c };
        let wc = weight3(&mut r, cout, cin);
        let bc = Tensor::new(vec![cout], r.scaled(cout, 2.0));
        let tail = Tail::new(&mut r, cout, groups);
        let conv = |w: Tensor, bias| crate::common::graph::conv(w, bias, 1);
        let (xc, g) = if concat {
            let va = conv_ref(&x, &wa, None, PAD1).map(|_, v| v.max(0.0));
            // Values: 0 x, 1 conv a, 2 ReLU, 3 concat, 4 conv, 5 norm, 6 LeakyReLU.
            let g = graph(
                c,
                vec![
                    (conv(wa, None), vec![0], 64),
                    (Op::Relu, vec![1], 64),
                    (Op::Concat { axis: 1 }, vec![2, 0], cin),
                    (conv(wc.clone(), Some(bc.clone())), vec![3], cout),
                    (tail.norm.clone(), vec![4], cout),
                    (tail.leaky.clone(), vec![5], cout),
                ],
            );
            (cat(&[&va, &x]), g)
        } else {
            let g = graph(
                c,
                vec![
                    (conv(wc.clone(), Some(bc.clone())), vec![0], cout),
                    (tail.norm.clone(), vec![1], cout),
                    (tail.leaky.clone(), vec![2], cout),
                ],
            );
            (x.clone(), g)
        };
        let want = tail.reference(&conv_ref(&xc, &wc, Some(&bc), PAD1));
        b.with(|o| (o.concat_split, o.cin_chunks) = (false, false));
        let whole = run(&mut b, &g, &x, 2);
        let on = |o: &mut CudaOptions| (o.concat_split, o.cin_chunks) = (true, true);
        // Every conv chunked but the concat's 32 -> 64 producer.
        let ran = |used: &[String], k: &str| {
            used.iter().any(|u| u == k)
                && (concat || !used.iter().any(|u| u.starts_with("conv_halo")))
        };
        split_runs(
            &mut b,
            "cin chunks",
            name,
            (&g, &x),
            (&want, &whole),
            on,
            ran,
        );
    }
    b.with(|o| (o.concat_split, o.cin_chunks, o.norm_stats) = (false, false, false));
}

/// Runs `g` on `x` split (`on`), without and with the norm statistics: on compute capability
/// 9.0 the parts ran the z-pair kernel (`ran(used, kernel)`), two runs bit for bit, within the
/// fp16 bar of float64 `want` and 2e-2 of the conv run `whole` (the same sums in another order,
/// rounded to fp16 at the output). Leaves the options at their defaults.
fn split_runs(
    b: &mut CudaBackend,
    what: &str,
    name: &str,
    (g, x): (&Graph, &T),
    (want, whole): (&T, &Array5<f32>),
    on: impl Fn(&mut CudaOptions),
    ran: impl Fn(&[String], &str) -> bool,
) {
    let wz = cat::has_wgmma(b.arch());
    for stats in [false, true] {
        b.with(|o| {
            on(o);
            o.norm_stats = stats;
        });
        let got = run(b, g, x, 2);
        let used = kernels_used(b, 2);
        // (The `_st` twin on the helper's stores: `zpair_st_staged`.)
        let want_k = if stats {
            "conv_wz_c32_y16_h2l_st"
        } else {
            "conv_wz_c32_y16_h2t"
        };
        if wz {
            assert!(
                ran(&used, want_k),
                "{name}: ran {used:?}, expected the parts on {want_k}"
            );
        }
        let again = run(b, g, x, 2);
        assert!(same_bits(&got, &again), "{name}: two runs differ");
        let (e, e_whole) = (rel_l2(&got, want), rel_l2(whole, want));
        let dev = max_abs_diff(&got, whole);
        let label = format!("{name}{}", if stats { " +stats" } else { "" });
        println!(
            "RESULT {what} {label:<52} rel L2 {e:.2e} (whole {e_whole:.2e}), max |diff| {dev:.2e}"
        );
        report(&label, e);
        assert!(dev < 2e-2, "{label}: {dev} from the conv run whole");
        // The parts without the tensor loads (`zpair_tma` off: `_h2`, and `_h2b` with
        // `zpair_bulk`; the input at a chunk's channel, an accumulating launch): the same bits.
        for (twin, bulk) in [("_h2", false), ("_h2b", true)] {
            b.with(|o| (o.zpair_bulk, o.zpair_tma) = (bulk, false));
            let t = run(b, g, x, 2);
            if wz {
                let k = format!("conv_wz_c32_y16{twin}{}", if stats { "_st" } else { "" });
                let used = kernels_used(b, 2);
                assert!(ran(&used, &k), "{label}: ran {used:?}, expected {k}");
            }
            assert!(same_bits(&t, &got), "{label}: the {twin} twin differs");
            b.with(|o| (o.zpair_bulk, o.zpair_tma) = (false, true));
        }
    }
    b.with(|o| *o = CudaOptions::default());
}
