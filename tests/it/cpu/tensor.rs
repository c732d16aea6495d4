//! The CPU backend's ops on activations of any rank (`ops::apply_tensor`) against naive float64
//! references written here with plain loops over multi-indices, on random data, ranks 1..8;
//! and a hand-built self-attention-like graph run through the backend against the same
//! computation written out in f64. f32: rel L2 <= 1e-6; f64: <= 1e-12.

use crate::common::attention;
use crate::common::rng::Rng;
use ndarray::Array5;
use voxtile::backend::Backend;
use voxtile::internals::cpu::{ops, run_graph, run_graph_f64, CpuBackend};
use voxtile::model::graph::*;

// ---------- helpers ----------

fn dims(s: &[usize]) -> Dims {
    Dims::new(s).unwrap()
}

/// An operand: f32 values and dims.
type In = (Vec<f32>, Dims);
/// A scalar binary and unary reference function.
type Bin = fn(f64, f64) -> f64;
type Un = fn(f64) -> f64;

fn rand_in(r: &mut Rng, s: &[usize]) -> In {
    (r.vec(s.iter().product()), dims(s))
}

/// Random dims of rank `rank`, each 1..=max.
fn rand_dims(r: &mut Rng, rank: usize, max: usize) -> Vec<usize> {
    (0..rank).map(|_| 1 + r.below(max)).collect()
}

fn unravel(mut i: usize, d: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; d.len()];
    for a in (0..d.len()).rev() {
        idx[a] = i % d[a];
        i /= d[a];
    }
    idx
}

fn ravel(idx: &[usize], d: &[usize]) -> usize {
    idx.iter().zip(d).fold(0, |acc, (&i, &n)| acc * n + i)
}

fn f64v(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let (mut num, mut den) = (0.0, 0.0);
    for (a, b) in got.iter().zip(want) {
        assert!(a.is_finite(), "non-finite output");
        num += (a - b) * (a - b);
        den += b * b;
    }
    (num / den.max(1e-300)).sqrt()
}

/// Runs `op` in f32 and f64 through `apply_tensor`; both outputs as f64 vectors, after checking
/// the arrays have `out`'s folded shape.
fn run(op: &Op, ins: &[In], out: Dims) -> (Vec<f64>, Vec<f64>) {
    let a32: Vec<Array5<f32>> = ins
        .iter()
        .map(|(v, d)| Array5::from_shape_vec(d.folded5(), v.clone()).unwrap())
        .collect();
    let a64: Vec<Array5<f64>> = a32.iter().map(|a| a.mapv(|v| v as f64)).collect();
    let v32: Vec<_> = a32.iter().zip(ins).map(|(a, i)| (a.view(), i.1)).collect();
    let v64: Vec<_> = a64.iter().zip(ins).map(|(a, i)| (a.view(), i.1)).collect();
    let y32 = ops::apply_tensor(op, &v32, out).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    let y64 = ops::apply_tensor(op, &v64, out).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    assert_eq!(y32.shape(), &out.folded5()[..]);
    assert_eq!(y64.shape(), &out.folded5()[..]);
    (
        y32.iter().map(|&v| v as f64).collect(),
        y64.iter().copied().collect(),
    )
}

/// Output dims from the IR, then both precisions against `want`.
fn check(name: &str, op: &Op, ins: &[In], want: &[f64]) {
    let ds: Vec<Dims> = ins.iter().map(|i| i.1).collect();
    let out = op
        .output_dims(&ds)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let (g32, g64) = run(op, ins, out);
    let (e32, e64) = (rel_l2(&g32, want), rel_l2(&g64, want));
    assert!(e32 <= 1e-6, "{name} {ds:?}: f32 rel L2 {e32:e}");
    assert!(e64 <= 1e-12, "{name} {ds:?}: f64 rel L2 {e64:e}");
}

// ---------- naive references ----------

fn transpose_ref(x: &[f64], d: &[usize], perm: &[usize]) -> Vec<f64> {
    let od: Vec<usize> = perm.iter().map(|&p| d[p]).collect();
    (0..x.len())
        .map(|o| {
            let oi = unravel(o, &od);
            let mut ii = vec![0; d.len()];
            for (a, &p) in perm.iter().enumerate() {
                ii[p] = oi[a];
            }
            x[ravel(&ii, d)]
        })
        .collect()
}

/// Index `a` into an operand of dims `d` right-aligned under output index `oi` (size 1 -> 0).
fn bcast_index(oi: &[usize], d: &[usize]) -> usize {
    let off = oi.len() - d.len();
    let idx: Vec<usize> = (0..d.len())
        .map(|a| if d[a] == 1 { 0 } else { oi[off + a] })
        .collect();
    ravel(&idx, d)
}

fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let y = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            x.max(y)
        })
        .collect()
}

fn binary_ref(f: Bin, a: &[f64], ad: &[usize], b: &[f64], bd: &[usize]) -> Vec<f64> {
    let od = broadcast_dims(ad, bd);
    (0..od.iter().product())
        .map(|o| {
            let oi = unravel(o, &od);
            f(a[bcast_index(&oi, ad)], b[bcast_index(&oi, bd)])
        })
        .collect()
}

fn matmul_ref(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize]) -> Vec<f64> {
    let (ra, rb) = (ad.len(), bd.len());
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    let batch = broadcast_dims(&ad[..ra - 2], &bd[..rb - 2]);
    let mut od = batch.clone();
    od.extend([m, n]);
    (0..od.iter().product())
        .map(|o| {
            let oi = unravel(o, &od);
            let bi = &oi[..oi.len() - 2];
            let (i, j) = (oi[oi.len() - 2], oi[oi.len() - 1]);
            let abase = bcast_index(bi, &ad[..ra - 2]) * m * k;
            let bbase = bcast_index(bi, &bd[..rb - 2]) * k * n;
            (0..k)
                .map(|t| a[abase + i * k + t] * b[bbase + t * n + j])
                .sum()
        })
        .collect()
}

/// (outer, n, inner) around `axis`.
fn split(d: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    )
}

fn softmax_ref(x: &[f64], d: &[usize], axis: usize) -> Vec<f64> {
    let (outer, n, inner) = split(d, axis);
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let m = (0..n).map(|k| x[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..n).map(|k| (x[at(k)] - m).exp()).sum();
            for k in 0..n {
                y[at(k)] = (x[at(k)] - m).exp() / s;
            }
        }
    }
    y
}

fn layernorm_ref(
    x: &[f64],
    inner: usize,
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(inner).zip(y.chunks_mut(inner)) {
        let mean = row.iter().sum::<f64>() / inner as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / inner as f64;
        for j in 0..inner {
            let b = bias.map_or(0.0, |b| b[j] as f64);
            out[j] = (row[j] - mean) / (var + eps).sqrt() * scale[j] as f64 + b;
        }
    }
    y
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

// ---------- data movement ----------

/// Random ranks 1..8 and permutations, the tiled paths (few long rows, many short ones, mid
/// axes), and a round trip that must give the input back bit for bit.
#[test]
fn transpose_any_rank_and_round_trip() {
    let mut r = Rng::tagged("transpose");
    let mut cases: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for rank in 1..=8 {
        for _ in 0..4 {
            let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 5 });
            let mut p: Vec<usize> = (0..rank).collect();
            r.shuffle(&mut p);
            cases.push((d, p));
        }
    }
    cases.push((vec![48, 3001], vec![1, 0]));
    cases.push((vec![3001, 48], vec![1, 0]));
    cases.push((vec![2, 37, 5, 70], vec![0, 3, 2, 1]));
    cases.push((vec![3, 70, 40, 2], vec![2, 0, 1, 3]));
    cases.push((vec![1, 8, 3, 2, 12], vec![2, 0, 3, 1, 4]));
    cases.push((vec![2, 3, 2, 4, 2, 5, 3, 2], vec![0, 1, 3, 5, 2, 4, 6, 7]));
    for (d, p) in &cases {
        let x = rand_in(&mut r, d);
        let op = Op::Transpose { perm: p.clone() };
        check(
            "Transpose",
            &op,
            std::slice::from_ref(&x),
            &transpose_ref(&f64v(&x.0), d, p),
        );
        // Round trip through the inverse permutation.
        let out = op.output_dims(&[x.1]).unwrap();
        let y = ops::apply_tensor(
            &op,
            &[(
                Array5::from_shape_vec(x.1.folded5(), x.0.clone())
                    .unwrap()
                    .view(),
                x.1,
            )],
            out,
        )
        .unwrap();
        let mut inv = vec![0; p.len()];
        for (i, &a) in p.iter().enumerate() {
            inv[a] = i;
        }
        let back_op = Op::Transpose { perm: inv };
        let back = ops::apply_tensor(&back_op, &[(y.view(), out)], x.1).unwrap();
        assert_eq!(
            back.iter().copied().collect::<Vec<f32>>(),
            x.0,
            "round trip {d:?} {p:?}"
        );
    }
}

#[test]
fn reshape_keeps_row_major_data() {
    let mut r = Rng::tagged("reshape");
    let x = rand_in(&mut r, &[2, 3, 4, 5]);
    for target in [
        vec![6, -1],
        vec![0, 0, 20],
        vec![2, 3, 2, 2, 5, 1, 1, 1],
        vec![120],
    ] {
        let op = Op::Reshape { target };
        check("Reshape", &op, std::slice::from_ref(&x), &f64v(&x.0));
    }
}

#[test]
fn slice_and_gather_any_rank() {
    let mut r = Rng::tagged("slice");
    for rank in 1..=8 {
        for _ in 0..4 {
            let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 6 });
            let x = rand_in(&mut r, &d);
            let axis = r.below(rank);
            let n = d[axis] as i64;
            // Negative and clamped bounds, steps 1..3.
            let start = r.below(d[axis]) as i64 - if r.below(2) == 0 { n } else { 0 };
            let end = if r.below(3) == 0 { i64::MAX } else { n };
            let step = 1 + r.below(3) as i64;
            let s = Slice {
                axis: axis as i64 - if r.below(2) == 0 { rank as i64 } else { 0 },
                start,
                end,
                step,
            };
            let at = s.resolve(&x.1).unwrap();
            let mut od = d.clone();
            od[axis] = at.len;
            let xv = f64v(&x.0);
            let want: Vec<f64> = (0..od.iter().product())
                .map(|o| {
                    let mut ii = unravel(o, &od);
                    ii[axis] = at.start + ii[axis] * at.step;
                    xv[ravel(&ii, &d)]
                })
                .collect();
            check("Slice", &Op::Slice(s), std::slice::from_ref(&x), &want);

            let index = r.below(d[axis]) as i64 - if r.below(2) == 0 { n } else { 0 };
            let idx = if index < 0 {
                (index + n) as usize
            } else {
                index as usize
            };
            let mut gd = d.clone();
            gd.remove(axis);
            let want: Vec<f64> = (0..gd.iter().product::<usize>().max(1))
                .map(|o| {
                    let mut ii = unravel(o, &gd);
                    ii.insert(axis, idx);
                    xv[ravel(&ii, &d)]
                })
                .collect();
            check(
                "Gather",
                &Op::Gather {
                    axis: axis as i64,
                    index,
                },
                &[x],
                &want,
            );
        }
    }
}

#[test]
fn concat_along_any_axis() {
    let mut r = Rng::tagged("concat");
    for rank in 1..=8 {
        for axis in 0..rank {
            let d = rand_dims(&mut r, rank, if rank > 5 { 2 } else { 4 });
            let ins: Vec<In> = (0..3)
                .map(|_| {
                    let mut di = d.clone();
                    di[axis] = 1 + r.below(3);
                    rand_in(&mut r, &di)
                })
                .collect();
            let mut od = d.clone();
            od[axis] = ins.iter().map(|i| i.1[axis]).sum();
            let want: Vec<f64> = (0..od.iter().product())
                .map(|o| {
                    let mut ii = unravel(o, &od);
                    let mut k = 0;
                    while ii[axis] >= ins[k].1[axis] {
                        ii[axis] -= ins[k].1[axis];
                        k += 1;
                    }
                    ins[k].0[ravel(&ii, ins[k].1.as_slice())] as f64
                })
                .collect();
            check("Concat", &Op::Concat { axis }, &ins, &want);
        }
    }
}

// ---------- products and normalisation ----------

#[test]
fn matmul_broadcasts_batches() {
    let mut r = Rng::tagged("matmul");
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![3, 5], vec![5, 4]),
        (vec![2, 3, 4, 5], vec![5, 6]),
        (vec![7, 5], vec![2, 3, 5, 4]),
        (vec![4, 1, 3, 5], vec![2, 5, 6]),
        (vec![1, 2, 3, 5], vec![3, 1, 5, 2]),
        (vec![2, 1, 2, 1, 2, 3, 4], vec![1, 2, 1, 2, 1, 4, 3]),
        (vec![2, 1, 1, 2, 1, 1, 3, 4], vec![2, 1, 2, 1, 3, 4, 2]),
        (vec![2, 70, 64], vec![2, 64, 70]),
        (vec![3, 64, 64], vec![64, 64]),
        (vec![1, 4, 20, 16], vec![1, 4, 16, 20]),
    ];
    for (ad, bd) in cases {
        let (a, b) = (rand_in(&mut r, &ad), rand_in(&mut r, &bd));
        let want = matmul_ref(&f64v(&a.0), &ad, &f64v(&b.0), &bd);
        check("MatMul", &Op::MatMul, &[a, b], &want);
    }
}

/// Linear equals MatMul by the same matrix held as an activation, and the reference with a bias.
#[test]
fn linear_is_matmul_with_a_constant() {
    let mut r = Rng::tagged("linear");
    for xd in [vec![5, 8], vec![2, 7, 8], vec![1, 2, 3, 2, 1, 2, 8]] {
        let (k, n) = (8, 6);
        let x = rand_in(&mut r, &xd);
        let w = rand_in(&mut r, &[k, n]);
        let bias = r.vec(n);
        let plain = Op::Linear(Linear {
            weight: Tensor::new(vec![k, n], w.0.clone()),
            bias: None,
        });
        let out = plain.output_dims(&[x.1]).unwrap();
        let (l32, l64) = run(&plain, std::slice::from_ref(&x), out);
        let (m32, m64) = run(&Op::MatMul, &[x.clone(), w.clone()], out);
        assert!(rel_l2(&l32, &m32) <= 1e-7, "Linear vs MatMul f32 {xd:?}");
        assert!(rel_l2(&l64, &m64) <= 1e-14, "Linear vs MatMul f64 {xd:?}");
        let mut want = matmul_ref(&f64v(&x.0), &xd, &f64v(&w.0), &[k, n]);
        for (i, v) in want.iter_mut().enumerate() {
            *v += bias[i % n] as f64;
        }
        let biased = Op::Linear(Linear {
            weight: Tensor::new(vec![k, n], w.0),
            bias: Some(Tensor::new(vec![n], bias)),
        });
        check("Linear", &biased, &[x], &want);
    }
}

/// Trailing-axes normalisation from every axis, with and without bias, on data whose mean is
/// large against its spread (the f64 statistics keep f32 exact).
#[test]
fn layernorm_over_trailing_axes() {
    let mut r = Rng::tagged("layernorm");
    for rank in 1..=8 {
        let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 6 });
        for axis in 0..rank {
            let inner: usize = d[axis..].iter().product();
            let x: In = (
                r.vec(d.iter().product()).iter().map(|v| 50.0 + v).collect(),
                dims(&d),
            );
            let scale = r.vec(inner);
            let bias = (axis % 2 == 0).then(|| r.vec(inner));
            let op = Op::LayerNorm(LayerNorm {
                axis: axis as i64 - if axis % 3 == 0 { rank as i64 } else { 0 },
                eps: 1e-5,
                scale: Tensor::new(vec![inner], scale.clone()),
                bias: bias.clone().map(|b| Tensor::new(vec![inner], b)),
            });
            let want = layernorm_ref(&f64v(&x.0), inner, &scale, bias.as_deref(), 1e-5_f32 as f64);
            if inner > 1 {
                check("LayerNorm", &op, &[x], &want);
            }
        }
    }
}

#[test]
fn softmax_over_any_axis_is_stable() {
    let mut r = Rng::tagged("softmax");
    for rank in 1..=8 {
        let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 5 });
        for axis in 0..rank {
            let x = rand_in(&mut r, &d);
            check(
                "Softmax",
                &Op::Softmax { axis },
                std::slice::from_ref(&x),
                &softmax_ref(&f64v(&x.0), &d, axis),
            );
        }
    }
    // A middle axis with logits far beyond exp's range.
    let d = [2, 5, 3, 4];
    let x: In = (r.scaled(120, 1000.0), dims(&d));
    check(
        "Softmax middle, large",
        &Op::Softmax { axis: 1 },
        std::slice::from_ref(&x),
        &softmax_ref(&f64v(&x.0), &d, 1),
    );
}

// ---------- elementwise ----------

/// Every binary, both operands broadcasting into each other, ranks 1..8 (also unequal ranks).
#[test]
fn binaries_broadcast_both_ways() {
    let mut r = Rng::tagged("binary");
    let fs = crate::ops::reference::binaries();
    for rank in 1..=8 {
        for _ in 0..3 {
            let full = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 5 });
            // Each axis: full in both, or 1 in one of them.
            let (mut ad, mut bd) = (full.clone(), full.clone());
            for a in 0..rank {
                match r.below(3) {
                    0 => ad[a] = 1,
                    1 => bd[a] = 1,
                    _ => {}
                }
            }
            // Sometimes drop leading axes of one operand (numpy right alignment).
            let drop = r.below(rank);
            if r.below(2) == 0 {
                bd.drain(..drop);
            } else {
                ad.drain(..drop);
            }
            for (op, f) in &fs {
                // Positive, away from zero: Div and Pow stay finite.
                let pos = |r: &mut Rng, d: &[usize]| -> In {
                    (
                        r.vec(d.iter().product())
                            .iter()
                            .map(|v| 1.0 + 0.5 * v)
                            .collect(),
                        dims(d),
                    )
                };
                let (a, b) = (pos(&mut r, &ad), pos(&mut r, &bd));
                let want = binary_ref(*f, &f64v(&a.0), &ad, &f64v(&b.0), &bd);
                check(op.name(), op, &[a, b], &want);
            }
        }
    }
}

#[test]
fn constants_of_the_inputs_rank() {
    let mut r = Rng::tagged("const");
    for rank in 1..=8 {
        let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 5 });
        let cd: Vec<usize> = d
            .iter()
            .map(|&n| if r.below(2) == 0 { 1 } else { n })
            .collect();
        let x = rand_in(&mut r, &d);
        let c = r.vec(cd.iter().product());
        let cv = f64v(&c);
        for (op, f) in [
            (
                Op::AddConst(Tensor::new(cd.clone(), c.clone())),
                (|a, b| a + b) as Bin,
            ),
            (Op::MulConst(Tensor::new(cd.clone(), c.clone())), |a, b| {
                a * b
            }),
        ] {
            let want = binary_ref(f, &f64v(&x.0), &d, &cv, &cd);
            check(op.name(), &op, std::slice::from_ref(&x), &want);
        }
    }
}

#[test]
fn unary_ops_any_rank() {
    let mut r = Rng::tagged("unary");
    let fs: Vec<(Op, Un)> = vec![
        (Op::Relu, |x| x.max(0.0)),
        (Op::LeakyRelu { alpha: 0.1 }, |x| {
            if x >= 0.0 {
                x
            } else {
                0.1f32 as f64 * x
            }
        }),
        (
            Op::Elu { alpha: 1.0 },
            |x| if x > 0.0 { x } else { x.exp_m1() },
        ),
        (Op::Sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        (Op::Tanh, f64::tanh),
        (Op::Identity, |x| x),
        (Op::Pointwise(Pointwise::Gelu { tanh: false }), gelu),
        (Op::Pointwise(Pointwise::Softplus), |x| (1.0 + x.exp()).ln()),
    ];
    for rank in [1, 2, 3, 4, 6, 7, 8] {
        let d = rand_dims(&mut r, rank, if rank > 5 { 3 } else { 6 });
        let x: In = (r.scaled(d.iter().product(), 3.0), dims(&d));
        for (op, f) in &fs {
            let want: Vec<f64> = f64v(&x.0).into_iter().map(f).collect();
            check(op.name(), op, std::slice::from_ref(&x), &want);
        }
    }
}

// ---------- bad input ----------

/// Wrong sizes, indices and expected dims are errors, never panics.
#[test]
fn bad_input_is_an_error() {
    let a = Array5::<f32>::zeros(dims(&[2, 3, 4]).folded5());
    let d = dims(&[2, 3, 4]);
    let run = |op: &Op, ins: &[(ndarray::ArrayView5<f32>, Dims)], out: Dims| {
        ops::apply_tensor(op, ins, out).expect_err(&format!("{op:?} should fail"))
    };
    // Output dims that the op does not give.
    run(&Op::Relu, &[(a.view(), d)], dims(&[2, 3, 5]));
    // An array that does not hold the dims' values.
    run(&Op::Relu, &[(a.view(), dims(&[2, 3, 5]))], dims(&[2, 3, 5]));
    // Index and axis out of range.
    run(
        &Op::Gather { axis: 1, index: 3 },
        &[(a.view(), d)],
        dims(&[2, 4]),
    );
    run(
        &Op::Gather { axis: 3, index: 0 },
        &[(a.view(), d)],
        dims(&[2, 3]),
    );
    run(&Op::Softmax { axis: 3 }, &[(a.view(), d)], d);
    run(
        &Op::Transpose {
            perm: vec![0, 0, 1],
        },
        &[(a.view(), d)],
        d,
    );
    let empty = Slice {
        axis: 2,
        start: 3,
        end: 1,
        step: 1,
    };
    run(&Op::Slice(empty), &[(a.view(), d)], d);
    // An empty operand.
    let e = Array5::<f32>::zeros([1, 1, 1, 4, 0]);
    run(
        &Op::MatMul,
        &[(a.view(), d), (e.view(), dims(&[4, 0]))],
        dims(&[2, 3, 0]),
    );
    // Inner sizes that differ, and a NCDHW-only op on rank 3.
    run(&Op::MatMul, &[(a.view(), d), (a.view(), d)], d);
    run(
        &Op::Reshape {
            target: vec![5, -1],
        },
        &[(a.view(), d)],
        d,
    );
    run(
        &Op::AddConst(Tensor::new(vec![2, 3], vec![0.0; 6])),
        &[(a.view(), d)],
        d,
    );
    let pool = Pool {
        kernel: [1; 3],
        stride: [1; 3],
        dilation: [1; 3],
        pads: [0; 6],
        count_include_pad: false,
        ceil_mode: false,
    };
    run(&Op::MaxPool(pool), &[(a.view(), d)], d);
}

// ---------- a graph through the backend ----------

/// The attention-like graph of `crate::common::attention`, computed here in f64 straight from its
/// definition (tokens[l][c] = x[c][l]), with plain index loops.
#[allow(clippy::needless_range_loop)]
fn attention_ref(p: &attention::Params, x: &[f64]) -> Vec<f64> {
    use attention::{C, H, L, OUT, SIDE};
    let tok: Vec<Vec<f64>> = (0..L)
        .map(|l| (0..C).map(|c| x[c * L + l]).collect())
        .collect();
    let h: Vec<Vec<f64>> = tok
        .iter()
        .map(|t| {
            let ln = layernorm_ref(t, C, &p.ln_scale, Some(&p.ln_bias), 1e-5_f32 as f64);
            (0..H)
                .map(|j| {
                    let s: f64 = (0..C).map(|c| ln[c] * p.w[c * H + j] as f64).sum();
                    gelu(s + p.b[j] as f64)
                })
                .collect()
        })
        .collect();
    let mut o = vec![vec![0.0; H]; L];
    for i in 0..L {
        let scores: Vec<f64> = (0..L)
            .map(|j| (0..H).map(|d| h[i][d] * h[j][d]).sum())
            .collect();
        let p = softmax_ref(&scores, &[L], 0);
        for d in 0..H {
            o[i][d] = (0..L).map(|j| p[j] * h[j][d]).sum::<f64>() + h[i][d];
        }
    }
    // Back to [H, SIDE^3] channels-first, then the 3x3x3 conv with zero padding 1.
    let s = SIDE as i64;
    let mut y = vec![0.0; OUT * L];
    for co in 0..OUT {
        for v in 0..L {
            let (z, yy, xx) = (
                (v / (SIDE * SIDE)) as i64,
                ((v / SIDE) % SIDE) as i64,
                (v % SIDE) as i64,
            );
            let mut acc = p.conv_b[co] as f64;
            for ci in 0..H {
                for t in 0..27 {
                    let (a, b, c) = (t as i64 / 9 - 1, (t as i64 / 3) % 3 - 1, t as i64 % 3 - 1);
                    let (iz, iy, ix) = (z + a, yy + b, xx + c);
                    if (0..s).contains(&iz) && (0..s).contains(&iy) && (0..s).contains(&ix) {
                        let src = ((iz * s + iy) * s + ix) as usize;
                        acc += o[src][ci] * p.conv_w[(co * H + ci) * 27 + t] as f64;
                    }
                }
            }
            y[co * L + v] = acc;
        }
    }
    y
}

#[test]
fn attention_graph_runs_through_the_backend() {
    use attention::{C, OUT, SIDE};
    let p = attention::params(7);
    let g = attention::graph(&p);
    let mut r = Rng::tagged("attention");
    let x =
        Array5::from_shape_vec([1, C, SIDE, SIDE, SIDE], r.vec(C * SIDE * SIDE * SIDE)).unwrap();
    let want = attention_ref(&p, &f64v(x.as_slice().unwrap()));

    let y64 = run_graph_f64(&g, x.mapv(|v| v as f64).view()).unwrap();
    assert_eq!(y64.shape(), &[1, OUT, SIDE, SIDE, SIDE]);
    let e64 = rel_l2(&y64.iter().copied().collect::<Vec<_>>(), &want);
    let y32 = run_graph(&g, x.view()).unwrap();
    let e32 = rel_l2(&f64v(y32.as_slice().unwrap()), &want);
    let mut b = CpuBackend::new();
    b.prepare(&g, 1, [SIDE; 3]).unwrap();
    let yb = b.run(x.view()).unwrap();
    assert_eq!(yb, y32, "the backend and run_graph differ");
    eprintln!("attention graph: f32 rel L2 {e32:.2e}, f64 rel L2 {e64:.2e}");
    assert!(e64 <= 1e-12, "f64 rel L2 {e64:e}");
    assert!(e32 <= 1e-6, "f32 rel L2 {e32:e}");
    // The batch is fixed by the Reshape targets.
    assert_eq!(g.max_batch([SIDE; 3]), 1);
}

/// Throughput of a 100M-element transpose against a plain copy of the same data (release:
/// `cargo test --release --test it cpu::tensor -- --ignored --nocapture`).
#[test]
#[ignore]
fn large_transpose_is_memory_bound() {
    let (c, l) = (48usize, 1usize << 21);
    let x: Vec<f32> = (0..c * l).map(|i| i as f32).collect();
    for (d, perm) in [
        (vec![1, c, l], vec![0, 2, 1]),
        (vec![1, l, c], vec![0, 2, 1]),
    ] {
        let xd = dims(&d);
        let a = Array5::from_shape_vec(xd.folded5(), x.clone()).unwrap();
        let op = Op::Transpose { perm };
        let out = op.output_dims(&[xd]).unwrap();
        let t = std::time::Instant::now();
        let y = ops::apply_tensor(&op, &[(a.view(), xd)], out).unwrap();
        let tt = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let z = a.to_owned();
        let tc = t.elapsed().as_secs_f64();
        eprintln!("transpose {d:?}: {tt:.3} s, copy {tc:.3} s");
        assert_eq!(y.len(), z.len());
        assert!(tt < 4.0 * tc + 0.05, "transpose {tt} s vs copy {tc} s");
    }
}

/// The conv epilogue fusion stays on NCDHW values: Conv -> Relu (fused) -> Reshape -> Sigmoid on
/// tokens, and Conv -> Reshape -> Relu (not fused: the Reshape reads the conv) give what the ops
/// give one by one.
const FUSION_SEED: u64 = 1;

#[test]
fn conv_fusion_does_not_cross_tensor_ops() {
    // A fixed seed whose second conv has outputs of both signs (the last Relu matters).
    let mut r = Rng::new(FUSION_SEED);
    let conv = |r: &mut Rng, cin: usize| {
        Op::Conv(Conv {
            weight: Tensor::new(vec![4, cin, 1, 1, 1], r.vec(4 * cin)),
            bias: Some(Tensor::new(vec![4], r.vec(4))),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            groups: 1,
        })
    };
    let (c1, c2) = (conv(&mut r, 2), conv(&mut r, 4));
    let tokens = Op::Reshape {
        target: vec![1, 4, 27],
    };
    let back = Op::Reshape {
        target: vec![1, 4, 3, 3, 3],
    };
    let g = crate::common::graph::chain(
        "fusion",
        2,
        vec![
            (c1.clone(), vec![0], 4),
            (Op::Relu, vec![1], 4),
            (tokens.clone(), vec![2], 4),
            (Op::Sigmoid, vec![3], 4),
            (back.clone(), vec![4], 4),
            (c2.clone(), vec![5], 4),
            (tokens.clone(), vec![6], 4),
            (Op::Relu, vec![7], 4),
            (back, vec![8], 4),
        ],
    );
    let x = Array5::from_shape_vec([1, 2, 3, 3, 3], r.vec(54))
        .unwrap()
        .mapv(|v| v as f64);
    let y = run_graph_f64(&g, x.view()).unwrap();
    // Step by step: conv, relu, sigmoid, conv, relu (reshapes keep the data).
    let a = ops::apply(&c1, &[x.view()]).unwrap();
    let a = a.mapv(|v| 1.0 / (1.0 + (-v.max(0.0)).exp()));
    let b = ops::apply(&c2, &[a.view()]).unwrap().mapv(|v| v.max(0.0));
    assert!(
        b.iter().any(|&v| v > 0.0) && b.iter().any(|&v| v == 0.0),
        "a trivial output"
    );
    let e = rel_l2(
        &y.iter().copied().collect::<Vec<_>>(),
        &b.iter().copied().collect::<Vec<_>>(),
    );
    assert!(e <= 1e-14, "rel L2 {e:e}");
}
