//! GPU tests of the CUDA tensor path (activations of any rank: Reshape, Transpose, Slice,
//! Gather, Concat, MatMul, Linear, LayerNorm, Softmax, broadcast binaries, a mini attention
//! block) against the CPU backend in float64, on hand-built graphs and random inputs with a
//! fresh seed per run (VOXTILE_SEED replays). Activation buffers are poisoned with NaN first,
//! so an unwritten element fails. Every graph ends in an NCDHW value (the graph output must be
//! one). Skips without a GPU unless VOXTILE_REQUIRE_GPU=1; the buffer-plan checks at the end run
//! anywhere.

use crate::common::graph::chain;
use crate::common::rng::Rng;
use ndarray::Array5;
use voxtile::internals::cpu::run_graph_f64;
use voxtile::internals::cuda::host::buffers::buffer_plan;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::internals::cuda::CudaBackend;
use voxtile::model::graph::*;
use voxtile::model::ops::Attention;

/// rel L2 bound, and max abs error bound relative to the reference's largest magnitude.
const TOL: f64 = 1e-2;
const ABS: f64 = 3e-2;

fn gpu() -> Option<CudaBackend> {
    let mut b = crate::common::cuda_backend()?;
    let mut o = *b.options();
    o.poison = true;
    b.set_options(o);
    Some(b)
}

fn input(r: &mut Rng, s: [usize; 5]) -> Array5<f32> {
    Array5::from_shape_vec(s, r.scaled(s.iter().product(), 1.0)).unwrap()
}

/// Runs `g` on `x` on CUDA and on the CPU (f64); returns a failure line, if any.
fn compare(b: &mut CudaBackend, name: &str, g: &Graph, x: &Array5<f32>) -> Option<String> {
    let s = x.shape();
    let roi = [s[2], s[3], s[4]];
    if let Err(e) = b.prepare(g, s[0], roi) {
        return Some(format!("{name}: prepare: {e}"));
    }
    let got = match b.run(x.view()) {
        Ok(y) => y,
        Err(e) => return Some(format!("{name}: run: {e}")),
    };
    let want = match run_graph_f64(g, x.mapv(|v| v as f64).view()) {
        Ok(y) => y.mapv(|v| v as f32),
        Err(e) => return Some(format!("{name}: CPU reference: {e}")),
    };
    if got.shape() != want.shape() {
        return Some(format!(
            "{name}: CUDA shape {:?}, CPU {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if let Some((i, v)) = got.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Some(format!("{name}: non-finite {v} at {i:?} (unwritten?)"));
    }
    let e = crate::common::rel_l2(got.iter(), want.iter());
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max(v.abs() as f64))
        .max(1e-6);
    let (mut worst, mut at) = (0f64, None);
    for ((i, &g), &w) in got.indexed_iter().zip(want.iter()) {
        let d = (g as f64 - w as f64).abs();
        if d > worst {
            worst = d;
            at = Some((i, g, w));
        }
    }
    let ok = e <= TOL && worst <= ABS * scale;
    println!(
        "RESULT {name:<36} rel_l2 {e:.2e} max_abs {worst:.2e} (ref max {scale:.2e}) {}",
        if ok { "ok" } else { "FAIL" }
    );
    (!ok).then(|| {
        format!("{name}: rel L2 {e:.3e} (<= {TOL}), max abs {worst:.3e} (<= {ABS} x {scale:.3e}) worst at {at:?} (index, cuda, cpu)")
    })
}

/// Runs every case, then fails listing all failures.
fn run_cases(cases: Vec<(&str, Graph, [usize; 5])>) {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("cuda tensor");
    let mut fails = Vec::new();
    for (name, g, s) in &cases {
        let x = input(&mut r, *s);
        fails.extend(compare(&mut b, name, g, &x));
    }
    assert!(
        fails.is_empty(),
        "{} of {} cases failed:\n{}",
        fails.len(),
        cases.len(),
        fails.join("\n")
    );
}

fn reshape(t: &[i64]) -> Op {
    Op::Reshape { target: t.to_vec() }
}
/// Back to an NCDHW output: all elements along W.
fn flat() -> Op {
    reshape(&[1, 1, 1, 1, -1])
}
fn tr(p: &[usize]) -> Op {
    Op::Transpose { perm: p.to_vec() }
}
fn slice(axis: i64, start: i64, end: i64, step: i64) -> Op {
    Op::Slice(Slice {
        axis,
        start,
        end,
        step,
    })
}
fn linear(r: &mut Rng, k: usize, n: usize, bias: bool) -> Op {
    Op::Linear(Linear {
        weight: Tensor::new(vec![k, n], r.scaled(k * n, (1.0 / k as f32).sqrt())),
        bias: bias.then(|| Tensor::new(vec![n], r.scaled(n, 0.5))),
    })
}
fn layer_norm(r: &mut Rng, axis: i64, n: usize, bias: bool) -> Op {
    Op::LayerNorm(LayerNorm {
        axis,
        eps: 1e-5,
        scale: Tensor::new(vec![n], r.vec(n).iter().map(|v| 1.0 + 0.5 * v).collect()),
        bias: bias.then(|| Tensor::new(vec![n], r.scaled(n, 0.5))),
    })
}
fn konst(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::new(shape.to_vec(), data)
}

/// Node list helper: (op, inputs); channels 1 (tensor ops' outputs are not checked) unless the
/// op is an NCDHW op, where the caller gives them.
fn n(op: Op, ins: &[usize]) -> (Op, Vec<usize>, usize) {
    (op, ins.to_vec(), 1)
}

#[test]
fn reshape_and_transpose() {
    let cases = vec![
        // NCDHW -> tokens [1, L, C] (a layout change, then a transpose), back flat.
        (
            "reshape ncdhw->tokens",
            chain(
                "t",
                4,
                vec![
                    n(reshape(&[1, 4, -1]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 4, 3, 4, 5],
        ),
        // A row-major -> row-major Reshape aliases its input's buffer; a unary op on rank 2.
        (
            "reshape alias + relu rank 2",
            chain(
                "t",
                4,
                vec![
                    n(reshape(&[1, 4, -1]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(reshape(&[60, 4]), &[2]),
                    n(Op::Relu, &[3]),
                    n(Op::Pointwise(Pointwise::Gelu { tanh: false }), &[4]),
                    n(flat(), &[5]),
                ],
            ),
            [1, 4, 3, 4, 5],
        ),
        // Tokens back to NCDHW (row-major -> NDHWC).
        (
            "reshape tokens->ncdhw",
            chain(
                "t",
                3,
                vec![
                    n(reshape(&[1, 3, -1]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(Op::Sigmoid, &[2]),
                    n(tr(&[0, 2, 1]), &[3]),
                    (reshape(&[1, 3, 4, 5, 6]), vec![4], 3),
                ],
            ),
            [1, 3, 4, 5, 6],
        ),
        // Heads of 8 features: the Transpose copies 16-byte vectors (`nd_copy_v8`).
        (
            "transpose heads, 16-byte copies",
            chain(
                "t",
                16,
                vec![
                    n(reshape(&[1, 16, 96]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(reshape(&[96, 2, 8]), &[2]),
                    n(tr(&[1, 0, 2]), &[3]),
                    (reshape(&[1, 16, 4, 4, 6]), vec![4], 16),
                ],
            ),
            [1, 16, 4, 4, 6],
        ),
        (
            "transpose rank 4",
            chain(
                "t",
                2,
                vec![
                    n(reshape(&[2, 6, 4, 10]), &[0]),
                    n(tr(&[2, 0, 3, 1]), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 2, 6, 4, 10],
        ),
        // NDHWC -> NDHWC: the output is rank 5 with N = 1, an NCDHW graph output.
        (
            "transpose rank 5",
            chain("t", 2, vec![(tr(&[0, 3, 1, 4, 2]), vec![0], 4)]),
            [1, 2, 6, 4, 10],
        ),
        (
            "transpose rank 8",
            chain(
                "t",
                2,
                vec![
                    n(reshape(&[2, 3, 2, 2, 2, 1, 2, 5]), &[0]),
                    n(tr(&[7, 1, 4, 0, 6, 2, 5, 3]), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 2, 6, 4, 10],
        ),
    ];
    run_cases(cases);
}

/// A Swin block's token path: conv -> `[1, D, H, W, C]` tokens (a Transpose that moves
/// nothing) -> LayerNorm -> Pad of D, H, W (and C) -> MLP -> Slices -> residual Add -> back to
/// NCDHW -> conv. The tokens are stored row-major (the Pad runs its rank-5 kernel with the axes
/// taken as C = 4, D, H, W = 1, 2, 3), checked on the host; the GPU result against the CPU's.
/// The pads differ per axis and side, so a swapped axis fails.
fn token_block(r: &mut Rng, mode: PadMode, begin: [i64; 5], end: [i64; 5]) -> Graph {
    let conv = |r: &mut Rng, co: usize, ci: usize, k: usize| {
        Op::Conv(Conv {
            weight: Tensor::new(vec![co, ci, k, k, k], r.scaled(co * ci * k * k * k, 0.3)),
            bias: Some(Tensor::new(vec![co], r.vec(co))),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [k / 2; 6],
            groups: 1,
        })
    };
    let (d, h, w) = (3i64, 4, 5);
    let cp = 4 + (begin[4] + end[4]) as usize;
    // Every value declares its axis 1 as its channels (D for the tokens, dp once padded).
    let (du, dp) = (d as usize, (d + begin[1] + end[1]) as usize);
    let pad = Op::Pad(Pad {
        mode,
        begin,
        end,
        value: 0.5,
    });
    let gelu = Op::Pointwise(Pointwise::Gelu { tanh: false });
    let nodes = vec![
        (conv(r, 4, 2, 1), vec![0], 4),                     // 1 NCDHW
        (tr(&[0, 2, 3, 4, 1]), vec![1], du),                // 2 tokens [1, 3, 4, 5, 4]
        (layer_norm(r, -1, 4, true), vec![2], du),          // 3
        (pad, vec![3], dp),                                 // 4
        (linear(r, cp, 8, true), vec![4], dp),              // 5
        (gelu, vec![5], dp),                                // 6
        (linear(r, 8, 4, false), vec![6], dp),              // 7
        (slice(1, begin[1], begin[1] + d, 1), vec![7], du), // 8
        (slice(2, begin[2], begin[2] + h, 1), vec![8], du), // 9
        (slice(3, begin[3], begin[3] + w, 1), vec![9], du), // 10
        (Op::Add, vec![10, 3], du),                         // 11 residual
        (tr(&[0, 4, 1, 2, 3]), vec![11], 4),                // 12 NCDHW
        (conv(r, 2, 4, 3), vec![12], 2),                    // 13
    ];
    let g = chain("token block", 2, nodes);
    let bp = buffer_plan(&g, 1, [3, 4, 5], &ArchCaps::h200()).unwrap();
    let row_major: Vec<usize> = (0..bp.dims.len())
        .filter(|&v| bp.dims[v].rank() == 5 && !bp.ndhwc[v])
        .collect();
    assert_eq!(row_major, (2..=11).collect::<Vec<_>>(), "row-major values");
    assert!(!bp.tensor[3], "the Pad runs its rank-5 kernel");
    assert!(bp.tensor[10], "the residual Add joins the tensor path");
    for t in [1, 11] {
        let l = bp.launches.iter().find(|l| l.node == t).unwrap();
        assert_eq!(
            Some(l.out_buf),
            bp.value_buf[g.nodes[t].inputs[0]],
            "Transpose {t} moves nothing"
        );
    }
    // The GPU test's reference runs here too.
    let x = input(r, [2, 2, 3, 4, 5]).mapv(f64::from);
    let y = run_graph_f64(&g, x.view()).expect("CPU reference");
    assert!(y.shape() == [2, 2, 3, 4, 5] && y.iter().all(|v| v.is_finite()));
    g
}

#[test]
fn token_tensors_row_major() {
    let mut r = Rng::tagged("cuda tensor tokens");
    let cases = vec![
        (
            "tokens, constant pad",
            token_block(&mut r, PadMode::Constant, [0, 1, 0, 2, 0], [0, 0, 1, 0, 0]),
            [1, 2, 3, 4, 5],
        ),
        (
            "tokens, edge pad with C",
            token_block(&mut r, PadMode::Edge, [0, 0, 1, 0, 1], [0, 1, 0, 0, 0]),
            [1, 2, 3, 4, 5],
        ),
    ];
    run_cases(cases);
}

#[test]
fn slice_gather_concat() {
    let cases = vec![
        (
            "slice step 2 rank 3",
            chain(
                "t",
                3,
                vec![
                    n(reshape(&[1, 3, -1]), &[0]),
                    n(slice(2, 1, i64::MAX, 2), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 3, 4, 5, 6],
        ),
        (
            "slice step 2 rank 5 (H)",
            chain("t", 3, vec![(slice(3, 0, 5, 2), vec![0], 3)]),
            [1, 3, 4, 5, 6],
        ),
        (
            "slice negative rank 3",
            chain(
                "t",
                3,
                vec![
                    n(reshape(&[1, 3, -1]), &[0]),
                    n(slice(-1, -40, -1, 1), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 3, 4, 5, 6],
        ),
        (
            "gather axis 0 after transpose",
            chain(
                "t",
                6,
                vec![
                    n(reshape(&[1, 3, 2, 64]), &[0]),
                    n(tr(&[1, 0, 2, 3]), &[1]),
                    n(Op::Gather { axis: 0, index: 2 }, &[2]),
                    n(flat(), &[3]),
                ],
            ),
            [1, 6, 4, 4, 4],
        ),
        (
            "gather last axis negative",
            chain(
                "t",
                6,
                vec![
                    n(reshape(&[1, 6, 64]), &[0]),
                    n(
                        Op::Gather {
                            axis: -1,
                            index: -3,
                        },
                        &[1],
                    ),
                    n(reshape(&[1, 1, 1, 1, 6]), &[2]),
                ],
            ),
            [1, 6, 4, 4, 4],
        ),
        (
            "concat axis 0 and last",
            chain(
                "t",
                2,
                // Declared channels are dim 1 of each value, as the importer sets them.
                vec![
                    (reshape(&[2, 64]), vec![0], 64),
                    (Op::Sigmoid, vec![1], 64),
                    (Op::Concat { axis: 0 }, vec![1, 2], 64),
                    (Op::Concat { axis: 1 }, vec![3, 3], 128),
                    n(flat(), &[4]),
                ],
            ),
            [1, 2, 4, 4, 4],
        ),
        // Concat along W of NCDHW values (positional rank 5: strided in NDHWC).
        (
            "concat rank 5 axis 4",
            chain("t", 2, vec![(Op::Concat { axis: 4 }, vec![0, 0], 2)]),
            [1, 2, 4, 4, 4],
        ),
    ];
    run_cases(cases);
}

#[test]
fn matmul_and_linear() {
    let mut r = Rng::tagged("cuda tensor weights");
    let cases = vec![
        // [2, 3, 8, 8] @ [1, 3, 8, 8] (batch dim 0 broadcast) and @ [8, 8] (a rank-2 alias).
        (
            "matmul broadcast batch",
            chain(
                "t",
                2,
                vec![
                    n(reshape(&[2, 3, 8, 8]), &[0]),
                    n(slice(0, 0, 1, 1), &[1]),
                    n(Op::MatMul, &[1, 2]),
                    n(slice(1, 1, 2, 1), &[2]),
                    n(reshape(&[8, 8]), &[4]),
                    n(Op::MatMul, &[3, 5]),
                    n(flat(), &[6]),
                ],
            ),
            [1, 2, 4, 6, 8],
        ),
        // Scores of 72 tokens (M, N cross the 64 tile; K = 48), and K = 25 (not a multiple of 16).
        (
            "matmul a @ a^T 72x48",
            chain(
                "t",
                2,
                vec![
                    n(reshape(&[1, 72, 48]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(Op::MatMul, &[1, 2]),
                    n(flat(), &[3]),
                ],
            ),
            [1, 2, 12, 12, 12],
        ),
        (
            "matmul 40x25 @ 25x40",
            chain(
                "t",
                1,
                vec![
                    n(reshape(&[1, 40, 25]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(Op::MatMul, &[1, 2]),
                    n(flat(), &[3]),
                ],
            ),
            [1, 1, 10, 10, 10],
        ),
        (
            "linear with bias 80x8 -> 70",
            chain(
                "t",
                8,
                vec![
                    n(reshape(&[1, 8, 80]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(linear(&mut r, 8, 70, true), &[2]),
                    n(flat(), &[3]),
                ],
            ),
            [1, 8, 4, 4, 5],
        ),
        // The vector-aligned path (gemm_wmma_v8) across partial tiles: M = 300 (128-row tiles),
        // K = 40 (a partial 32-deep step), N = 136 (64-column tiles).
        (
            "linear with bias 300x40 -> 136 (aligned)",
            chain(
                "t",
                40,
                vec![
                    n(reshape(&[1, 40, 300]), &[0]),
                    n(tr(&[0, 2, 1]), &[1]),
                    n(linear(&mut r, 40, 136, true), &[2]),
                    n(flat(), &[3]),
                ],
            ),
            [1, 40, 5, 6, 10],
        ),
        // Linear over W of an NCDHW value: strided rows (a_sk = C), batch dims kept.
        (
            "linear rank 5 over W",
            chain("t", 8, vec![(linear(&mut r, 5, 3, false), vec![0], 8)]),
            [1, 8, 4, 4, 5],
        ),
        (
            "linear rank 1 input",
            chain(
                "t",
                1,
                vec![
                    n(reshape(&[-1]), &[0]),
                    n(linear(&mut r, 100, 130, true), &[1]),
                    n(flat(), &[2]),
                ],
            ),
            [1, 1, 4, 5, 5],
        ),
    ];
    run_cases(cases);
}

#[test]
fn norms_softmax_binaries() {
    let mut r = Rng::tagged("cuda tensor params");
    let tokens = |tail: Vec<(Op, Vec<usize>, usize)>| {
        let mut v = vec![n(reshape(&[1, 8, 80]), &[0]), n(tr(&[0, 2, 1]), &[1])];
        v.extend(tail);
        chain("t", 8, v)
    };
    let x5 = [1, 8, 4, 4, 5];
    let cases = vec![
        (
            "layernorm last axis",
            tokens(vec![
                n(layer_norm(&mut r, -1, 8, true), &[2]),
                n(flat(), &[3]),
            ]),
            x5,
        ),
        (
            "layernorm axis 1 (rows of 640)",
            tokens(vec![
                n(layer_norm(&mut r, 1, 640, false), &[2]),
                n(flat(), &[3]),
            ]),
            x5,
        ),
        (
            "layernorm rank 5 last axis",
            chain("t", 8, vec![(layer_norm(&mut r, -1, 5, true), vec![0], 8)]),
            x5,
        ),
        (
            "layernorm rank 5 from C",
            chain("t", 8, vec![(layer_norm(&mut r, 1, 640, true), vec![0], 8)]),
            x5,
        ),
        (
            "layernorm rank 5 from D",
            chain("t", 8, vec![(layer_norm(&mut r, 2, 80, true), vec![0], 8)]),
            x5,
        ),
        (
            "softmax last axis",
            tokens(vec![n(Op::Softmax { axis: 2 }, &[2]), n(flat(), &[3])]),
            x5,
        ),
        (
            "softmax middle axis",
            tokens(vec![n(Op::Softmax { axis: 1 }, &[2]), n(flat(), &[3])]),
            x5,
        ),
        (
            "softmax rank 5 axis W",
            chain("t", 8, vec![(Op::Softmax { axis: 4 }, vec![0], 8)]),
            x5,
        ),
        (
            "softmax rank 5 axis D",
            chain("t", 8, vec![(Op::Softmax { axis: 2 }, vec![0], 8)]),
            x5,
        ),
        (
            "add broadcast rank 3",
            tokens(vec![
                n(slice(1, 3, 4, 1), &[2]),
                n(Op::Add, &[2, 3]),
                n(flat(), &[4]),
            ]),
            x5,
        ),
        (
            "max/mul broadcast rank 4",
            chain(
                "t",
                8,
                vec![
                    n(reshape(&[2, 5, 8, 8]), &[0]),
                    n(slice(0, 1, 2, 1), &[1]),
                    n(slice(2, 0, 1, 1), &[2]),
                    n(Op::Max, &[1, 3]),
                    n(Op::Mul, &[3, 4]),
                    n(flat(), &[5]),
                ],
            ),
            [1, 8, 4, 4, 5],
        ),
        // An NCDHW value plus a rank-3 value (different ranks and layouts).
        (
            "add rank 5 + rank 3",
            chain(
                "t",
                8,
                vec![
                    n(slice(1, 0, 1, 1), &[0]),
                    n(reshape(&[4, 4, 5]), &[1]),
                    n(slice(1, 2, 3, 1), &[2]),
                    (Op::Sub, vec![0, 3], 8),
                ],
            ),
            x5,
        ),
        (
            "add/mul const rank 3",
            tokens(vec![
                n(Op::AddConst(konst(&[1, 1, 8], r.vec(8))), &[2]),
                n(Op::MulConst(konst(&[1, 80, 1], r.vec(80))), &[3]),
                n(flat(), &[4]),
            ]),
            x5,
        ),
    ];
    run_cases(cases);
}

/// A transformer block on 64 tokens of 8 channels (2 heads of 4): LayerNorm, qkv Linear, heads
/// split through a rank-5 [3, 1, 2, 64, 4] value (N = 3), scaled scores, softmax, attention,
/// projection, residual, GELU MLP, residual, back to NCDHW and a 3^3 conv. `b` is the batch
/// of the Reshape targets: 1 as a batch-1 trace bakes it, 0 (copy the input's) to run at any
/// batch.
fn attention_graph(r: &mut Rng, b: i64) -> Graph {
    let conv = Op::Conv(Conv {
        weight: Tensor::new(vec![2, 8, 3, 3, 3], r.scaled(2 * 8 * 27, 0.2)),
        bias: Some(Tensor::new(vec![2], r.vec(2))),
        stride: [1; 3],
        dilation: [1; 3],
        pads: [1; 6],
        groups: 1,
    });
    chain(
        "attention",
        8,
        vec![
            n(reshape(&[b, 8, 64]), &[0]),                            // 1
            n(tr(&[0, 2, 1]), &[1]),                                  // 2 tokens [1, 64, 8]
            n(layer_norm(r, -1, 8, true), &[2]),                      // 3
            n(linear(r, 8, 24, true), &[3]),                          // 4 qkv
            n(reshape(&[b, 64, 3, 2, 4]), &[4]),                      // 5
            n(tr(&[2, 0, 3, 1, 4]), &[5]),                            // 6 [3, 1, 2, 64, 4]
            n(Op::Gather { axis: 0, index: 0 }, &[6]),                // 7 q
            n(Op::Gather { axis: 0, index: 1 }, &[6]),                // 8 k
            n(Op::Gather { axis: 0, index: 2 }, &[6]),                // 9 v
            n(Op::MulConst(konst(&[1, 1, 1, 1], vec![0.5])), &[7]),   // 10
            n(tr(&[0, 1, 3, 2]), &[8]),                               // 11 k^T
            n(Op::MatMul, &[10, 11]),                                 // 12 scores [1, 2, 64, 64]
            n(Op::Softmax { axis: 3 }, &[12]),                        // 13
            n(Op::MatMul, &[13, 9]),                                  // 14 [1, 2, 64, 4]
            n(tr(&[0, 2, 1, 3]), &[14]),                              // 15
            n(reshape(&[b, 64, 8]), &[15]),                           // 16
            n(linear(r, 8, 8, true), &[16]),                          // 17
            n(Op::Add, &[2, 17]),                                     // 18
            n(linear(r, 8, 16, true), &[18]),                         // 19
            n(Op::Pointwise(Pointwise::Gelu { tanh: false }), &[19]), // 20
            n(linear(r, 16, 8, false), &[20]),                        // 21
            n(Op::Add, &[18, 21]),                                    // 22
            n(tr(&[0, 2, 1]), &[22]),                                 // 23
            (reshape(&[b, 8, 4, 4, 4]), vec![23], 8),                 // 24 NCDHW
            (conv, vec![24], 2),                                      // 25
        ],
    )
}

#[test]
fn mini_attention_block() {
    let mut r = Rng::tagged("cuda tensor attention");
    let g = attention_graph(&mut r, 1);
    run_cases(vec![("attention block + conv", g, [1, 8, 4, 4, 4])]);
}

/// Tensor graphs at batch 3, three different windows against the CPU: the attention block
/// with batch-free Reshape targets (its heads through a rank-5 value whose axis 1 is the
/// batch) and the Swin token block (row-major tokens, a Pad on its rank-5 kernel).
#[test]
fn tensor_graphs_batched() {
    let mut r = Rng::tagged("cuda tensor batched");
    let cases = vec![
        (
            "attention block, batch 3",
            attention_graph(&mut r, 0),
            [3, 8, 4, 4, 4],
        ),
        (
            "tokens, batch 3",
            token_block(&mut r, PadMode::Reflect, [0, 1, 1, 0, 0], [0, 0, 1, 2, 0]),
            [3, 2, 3, 4, 5],
        ),
    ];
    run_cases(cases);
}

/// The planner's prediction is what `prepare` allocates for a tensor graph (device bytes and
/// arena), and the single-window staging is all `run` adds.
#[test]
fn tensor_graph_memory_matches_the_plan() {
    let mut r = Rng::tagged("cuda tensor memory");
    let g = attention_graph(&mut r, 1);
    let roi = [4, 4, 4];
    let Some(mut b) = gpu() else { return };
    b.prepare(&g, 1, roi).unwrap();
    let bp = buffer_plan(&g, 1, roi, &b.caps()).unwrap();
    let peak = b.peak_device_bytes().unwrap();
    println!(
        "RESULT cuda_tensor memory: plan {} (arena {}, {} consts) tracked {peak}",
        bp.device_bytes(),
        bp.activation_bytes(),
        bp.consts.len()
    );
    assert_eq!(bp.device_bytes(), peak, "prepare allocates the buffer plan");
    assert_eq!(bp.activation_bytes(), b.activation_bytes() as u64);
    let x = input(&mut r, [1, 8, 4, 4, 4]);
    let y = b.run(x.view()).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    assert_eq!(
        b.peak_device_bytes().unwrap(),
        bp.device_bytes() + bp.single_window_alloc()
    );
}

/// Host only: a tensor graph plans at batch 1 (one Linear weight per Linear, fp16; aliased
/// Reshapes cost no buffer); with its batch baked into the Reshapes it refuses batch 2 with a
/// message that says why, without it the tensor buffers scale with the batch.
#[test]
fn tensor_graph_plan_on_the_host() {
    let mut r = Rng::tagged("cuda tensor plan");
    let g = attention_graph(&mut r, 1);
    let bp = buffer_plan(&g, 1, [4, 4, 4], &ArchCaps::h200()).unwrap();
    let linear_weights: Vec<usize> = bp
        .consts
        .iter()
        .filter(|c| c.what.starts_with("linear weight"))
        .map(|c| c.bytes)
        .collect();
    assert_eq!(
        linear_weights,
        vec![8 * 24 * 2, 8 * 8 * 2, 8 * 16 * 2, 16 * 8 * 2]
    );
    assert!(
        bp.tensor[0] && !bp.tensor[24],
        "reshapes on the tensor path, the conv not"
    );
    // Node 15 (Reshape [1, 64, 8] of a row-major value) shares its input's buffer.
    assert_eq!(bp.value_buf[16], bp.value_buf[15]);
    assert_ne!(bp.value_buf[1], bp.value_buf[0]);
    let e = buffer_plan(&g, 2, [4, 4, 4], &ArchCaps::h200())
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not run 2 windows per call"), "{e}");
    let g = attention_graph(&mut r, 0);
    let b1 = buffer_plan(&g, 1, [4, 4, 4], &ArchCaps::h200()).unwrap();
    let b2 = buffer_plan(&g, 2, [4, 4, 4], &ArchCaps::h200()).unwrap();
    assert_eq!(
        b2.dims[6].as_slice(),
        &[3, 2, 2, 64, 4],
        "heads: batch on axis 1"
    );
    assert_eq!(b2.bufs.len(), b1.bufs.len());
    for (x2, x1) in b2.bufs.iter().zip(&b1.bufs) {
        assert_eq!(*x2, 2 * x1);
    }
}

/// The fused attention case: keys shared by the heads (`kh` 1) or per head (2), the bias's
/// and the mask's shapes (scores `[1, h, T, S]`, each dim 1 or equal; masked entries -100),
/// q/k/v rank 5 `[1, 1, h, T, d]` (C = 1: NDHWC equals row-major) or rank 4.
struct AttnCase {
    kh: usize,
    bias: Option<[usize; 4]>,
    mask: Option<[usize; 4]>,
    rank5: bool,
}

/// NCDHW [1, 8, roi] -> tokens -> q (2 heads of 4), k (`kh` heads of 4), v (2 heads of 8)
/// Linears -> Attention -> tokens [1, L, 16] -> NCDHW [1, 16, roi].
fn attention_op_graph(r: &mut Rng, roi: [usize; 3], c: &AttnCase) -> Graph {
    let l = roi.iter().product::<usize>();
    let li = l as i64;
    let mut nodes: Vec<(Op, Vec<usize>, usize)> = Vec::new();
    let mut add = |op: Op, ins: &[usize]| {
        nodes.push(n(op, ins));
        nodes.len()
    };
    let x = add(reshape(&[1, 8, li]), &[0]);
    let x = add(tr(&[0, 2, 1]), &[x]);
    let mut heads = |r: &mut Rng, h: usize, f: usize| {
        let y = add(linear(r, 8, h * f, true), &[x]);
        let y = add(reshape(&[1, li, h as i64, f as i64]), &[y]);
        let y = add(tr(&[0, 2, 1, 3]), &[y]);
        if c.rank5 {
            add(reshape(&[1, 1, h as i64, li, f as i64]), &[y])
        } else {
            y
        }
    };
    let (q, k, v) = (heads(r, 2, 4), heads(r, c.kh, 4), heads(r, 2, 8));
    let mut term = |s: [usize; 4], every: usize| {
        let mut data = r.scaled(s.iter().product(), 0.5);
        for (i, b) in data.iter_mut().enumerate() {
            if i % every == 3 {
                *b = -100.0;
            }
        }
        let shape = if c.rank5 {
            vec![1, s[0], s[1], s[2], s[3]]
        } else {
            s.to_vec()
        };
        konst(&shape, data)
    };
    let bias = c.bias.map(|s| term(s, 7));
    let mask = c.mask.map(|s| term(s, 5));
    let scale = 0.5;
    let mut a = add(Op::Attention(Attention { scale, bias, mask }), &[q, k, v]);
    if c.rank5 {
        a = add(reshape(&[1, 2, li, 8]), &[a]);
    }
    let a = add(tr(&[0, 2, 1, 3]), &[a]);
    let a = add(reshape(&[1, li, 16]), &[a]);
    let a = add(tr(&[0, 2, 1]), &[a]);
    let d = roi.map(|x| x as i64);
    nodes.push((reshape(&[1, 16, d[0], d[1], d[2]]), vec![a], 16));
    chain("attention op", 8, nodes)
}

fn attention_cases() -> Vec<(&'static str, AttnCase)> {
    let c = |kh, bias, rank5| AttnCase {
        kh,
        bias,
        mask: None,
        rank5,
    };
    vec![
        ("attention, no bias", c(2, None, false)),
        (
            "attention, bias per head + mask",
            c(2, Some([1, 2, 96, 96]), false),
        ),
        (
            "attention, shared k, bias over heads",
            c(1, Some([1, 1, 96, 96]), false),
        ),
        (
            "attention, shared k, key bias",
            c(1, Some([1, 1, 1, 96]), false),
        ),
        (
            "attention, rank 5 (C = 1), bias",
            c(1, Some([1, 2, 96, 96]), true),
        ),
        (
            "attention, bias per head + mask over heads",
            AttnCase {
                mask: Some([1, 1, 96, 96]),
                ..c(2, Some([1, 2, 96, 96]), false)
            },
        ),
        (
            "attention, rank 5 (C = 1), key mask only",
            AttnCase {
                mask: Some([1, 1, 1, 96]),
                ..c(2, None, true)
            },
        ),
    ]
}

/// `Op::Attention` on the CUDA tensor path against the CPU, with and without bias, with
/// broadcast leading dims, 96 tokens (one full and one partial tile of 64 query rows).
#[test]
fn fused_attention_op() {
    let mut r = Rng::tagged("cuda tensor fused attention");
    let roi = [4, 4, 6];
    let cases = attention_cases()
        .into_iter()
        .map(|(name, c)| (name, attention_op_graph(&mut r, roi, &c), [1, 8, 4, 4, 6]))
        .collect();
    run_cases(cases);
}

/// Host only: an attention node costs its offset table (i64, 6 per leading index) and its
/// fp32 bias and mask as planned constants; rank-5 q/k/v between tensor ops are stored
/// row-major; a conv's output (NDHWC, C > 1: features not contiguous) is refused with a message
/// that says why.
#[test]
fn fused_attention_plan_on_the_host() {
    let mut r = Rng::tagged("cuda tensor fused attention plan");
    let roi = [4, 4, 6];
    for (name, c) in attention_cases() {
        let g = attention_op_graph(&mut r, roi, &c);
        let bp = buffer_plan(&g, 1, roi, &ArchCaps::h200()).unwrap();
        let att: Vec<(&str, usize)> = bp
            .consts
            .iter()
            .filter(|k| k.what.starts_with("attention"))
            .map(|k| (k.what, k.bytes))
            .collect();
        let mut want = vec![("attention offset table (i64)", 2 * 6 * 8)];
        if let Some(s) = c.bias {
            want.push(("attention bias (fp32)", s.iter().product::<usize>() * 4));
        }
        if let Some(s) = c.mask {
            want.push(("attention mask (fp32)", s.iter().product::<usize>() * 4));
        }
        assert_eq!(att, want, "{name}");
        let i = g
            .nodes
            .iter()
            .position(|n| matches!(n.op, Op::Attention(_)))
            .unwrap();
        assert!(
            bp.tensor[i] && bp.launches.iter().any(|l| l.node == i),
            "{name}"
        );
        // The GPU test's reference runs (and is not the -100 of a fully masked row).
        let x = input(&mut r, [1, 8, 4, 4, 6]);
        let y = run_graph_f64(&g, x.mapv(f64::from).view()).unwrap();
        assert_eq!(y.shape(), &[1, 16, 4, 4, 6], "{name}");
        assert!(y.iter().all(|v| v.is_finite() && v.abs() < 50.0), "{name}");
    }
    // q, k, v [1, 2, 1, 96, 4] are rank-5 values only tensor ops touch: stored row-major,
    // features contiguous, planned.
    let l = 96i64;
    let plain = || {
        Op::Attention(Attention {
            scale: 1.0,
            bias: None,
            mask: None,
        })
    };
    let nodes = vec![
        n(reshape(&[1, 8, l]), &[0]),
        n(tr(&[0, 2, 1]), &[1]),
        n(linear(&mut r, 8, 8, false), &[2]),
        n(reshape(&[1, 2, 1, l, 4]), &[3]),
        n(plain(), &[4, 4, 4]),
        (reshape(&[1, 8, 4, 4, 6]), vec![5], 8),
    ];
    let g = chain("row-major attention", 8, nodes);
    let bp = buffer_plan(&g, 1, roi, &ArchCaps::h200()).unwrap();
    assert!(
        !bp.ndhwc[4] && !bp.ndhwc[5],
        "q/k/v and the output row-major"
    );
    // A conv's output [1, 2, 4, 4, 6] is stored NDHWC (C = 2): its features (W) are 2 apart,
    // which the attention kernels do not read: refused, saying why.
    let conv = Op::Conv(Conv {
        weight: Tensor::new(vec![2, 8, 1, 1, 1], r.scaled(16, 0.2)),
        bias: None,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [0; 6],
        groups: 1,
    });
    let g = chain(
        "ndhwc attention",
        8,
        vec![(conv, vec![0], 2), (plain(), vec![1, 1, 1], 2)],
    );
    let e = buffer_plan(&g, 1, roi, &ArchCaps::h200())
        .unwrap_err()
        .to_string();
    assert!(e.contains("features contiguous"), "{e}");
}

/// `prepare` allocates exactly the buffer plan of a graph with a fused attention (its offset
/// table and fp32 bias and mask counted as constants).
#[test]
fn fused_attention_memory_matches_the_plan() {
    let mut r = Rng::tagged("cuda tensor fused attention memory");
    let roi = [4, 4, 6];
    let c = AttnCase {
        kh: 1,
        bias: Some([1, 2, 96, 96]),
        mask: Some([1, 1, 96, 96]),
        rank5: false,
    };
    let g = attention_op_graph(&mut r, roi, &c);
    let Some(mut b) = gpu() else { return };
    b.prepare(&g, 1, roi).unwrap();
    let bp = buffer_plan(&g, 1, roi, &b.caps()).unwrap();
    let peak = b.peak_device_bytes().unwrap();
    println!(
        "RESULT cuda_tensor fused attention memory: plan {} tracked {peak}",
        bp.device_bytes()
    );
    assert_eq!(bp.device_bytes(), peak, "prepare allocates the buffer plan");
    assert_eq!(bp.activation_bytes(), b.activation_bytes() as u64);
}
