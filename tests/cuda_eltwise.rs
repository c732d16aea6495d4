//! GPU tests of the broadcasting binaries and the one-input math ops: the CUDA backend (fp16)
//! against the CPU backend in float64 (itself checked against independent references in
//! tests/ops_eltwise.rs), on random inputs with a fresh seed per run (VOXTILE_SEED replays).
//! Activation buffers are poisoned with NaN first, so an unwritten element fails. Skips without
//! a GPU unless VOXTILE_REQUIRE_GPU=1.

mod common;
use common::rng::Rng;
use ndarray::Array5;
use voxtile::internals::cpu::run_graph_f64;
use voxtile::internals::cuda::CudaBackend;
use voxtile::model::graph::*;

const TOL: f64 = 1e-2;

fn gpu() -> Option<CudaBackend> {
    let mut b = common::cuda_backend()?;
    let mut o = *b.options();
    o.poison = true;
    b.set_options(o);
    Some(b)
}

/// CUDA against the f64 CPU run of `g` on `x`.
fn compare(b: &mut CudaBackend, name: &str, g: &Graph, x: &Array5<f32>) {
    let s = x.shape();
    b.prepare(g, s[0], [s[2], s[3], s[4]])
        .unwrap_or_else(|e| panic!("{name}: prepare: {e}"));
    let got = b
        .run(x.view())
        .unwrap_or_else(|e| panic!("{name}: run: {e}"));
    let want = run_graph_f64(g, x.mapv(|v| v as f64).view()).unwrap();
    let want32 = want.mapv(|v| v as f32);
    assert_eq!(got.shape(), want32.shape(), "{name}");
    let e = common::rel_l2(got.iter(), want32.iter());
    println!(
        "RESULT {name:<40} rel_l2 {e:.2e} {}",
        if e <= TOL { "ok" } else { "FAIL" }
    );
    assert!(e <= TOL, "{name}: rel L2 {e:.3e} > {TOL}");
}

fn pool(roi: [usize; 3]) -> Op {
    Op::AveragePool(Pool {
        kernel: roi,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [0; 6],
        ceil_mode: false,
        count_include_pad: false,
    })
}

#[test]
fn broadcast_binaries() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("cuda broadcast");
    for c in [5usize, 16] {
        let roi = [6, 7, 8];
        let s = [2, c, roi[0], roi[1], roi[2]];
        let x = Array5::from_shape_vec(s, r.scaled(s.iter().product(), 2.0)).unwrap();
        let conv = Op::Conv(Conv {
            weight: Tensor::new(vec![1, c, 1, 1, 1], r.vec(c)),
            bias: None,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            groups: 1,
        });
        // v1 gate_raw, v2 chan_raw, v3 scalar_raw; v4..v7 their sigmoids (full, gate, chan,
        // scalar); v8 = op(a, b); v9 = concat(full, v8) (v8 written into its slice).
        let (full, gate, chan, scalar) = (4, 5, 6, 7);
        let pairs = [
            (full, gate),
            (gate, full),
            (full, chan),
            (chan, full),
            (scalar, full),
            (gate, chan),
        ];
        for op in [
            Op::Add,
            Op::Sub,
            Op::Mul,
            Op::Div,
            Op::Max,
            Op::Min,
            Op::Pow,
        ] {
            for (p, q) in pairs {
                let g = common::graph::chain(
                    "bcast",
                    c,
                    vec![
                        (conv.clone(), vec![0], 1),
                        (pool(roi), vec![0], c),
                        (pool(roi), vec![1], 1),
                        (Op::Sigmoid, vec![0], c),
                        (Op::Sigmoid, vec![1], 1),
                        (Op::Sigmoid, vec![2], c),
                        (Op::Sigmoid, vec![3], 1),
                        (op.clone(), vec![p, q], c),
                        (Op::Concat { axis: 1 }, vec![full, 8], 2 * c),
                    ],
                );
                compare(&mut b, &format!("{}(v{p}, v{q}) C={c}", op.name()), &g, &x);
            }
        }
    }
}

#[test]
fn pointwise_functions() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("cuda pointwise");
    let c = 6;
    let s = [2, c, 5, 6, 7];
    let x = Array5::from_shape_vec(s, r.scaled(s.iter().product(), 3.0)).unwrap();
    let any = [
        Pointwise::Erf,
        Pointwise::Gelu { tanh: false },
        Pointwise::Gelu { tanh: true },
        Pointwise::Softplus,
        Pointwise::Mish,
        Pointwise::HardSwish,
        Pointwise::HardSigmoid {
            alpha: 1.0 / 6.0,
            beta: 0.5,
        },
        Pointwise::Exp,
        Pointwise::Abs,
        Pointwise::Neg,
        Pointwise::Pow(3.0),
        Pointwise::Clip { min: 0.0, max: 1.5 },
        Pointwise::Clip {
            min: f32::NEG_INFINITY,
            max: 0.5,
        },
        // The roundings at an fp16/bf16 model's I/O (the f16 one a no-op on fp16 activations).
        Pointwise::RoundF16,
        Pointwise::RoundBf16,
    ];
    for f in any {
        let g = common::graph::chain("pw", c, vec![(Op::Pointwise(f), vec![0], c)]);
        compare(&mut b, &format!("{f:?}"), &g, &x);
    }
    // Positive domain: through a Sigmoid first.
    for f in [
        Pointwise::Log,
        Pointwise::Sqrt,
        Pointwise::Reciprocal,
        Pointwise::Pow(0.5),
    ] {
        let g = common::graph::chain(
            "pw+",
            c,
            vec![(Op::Sigmoid, vec![0], c), (Op::Pointwise(f), vec![1], c)],
        );
        compare(&mut b, &format!("{f:?} of sigmoid"), &g, &x);
    }
}
