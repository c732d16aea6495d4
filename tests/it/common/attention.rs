//! A small self-attention-like graph built by hand: NCDHW -> tokens -> LayerNorm -> Linear ->
//! Gelu -> q @ k^T -> Softmax -> @ v (+ residual) -> NCDHW -> Conv. Shared by the CPU op tests
//! (which recompute it in f64) and the memory-model test.
#![allow(dead_code)]

use super::rng::Rng;
use voxtile::model::graph::*;

/// Input channels, window side (tokens = SIDE^3), hidden width and output channels.
pub const C: usize = 8;
/// Window side.
pub const SIDE: usize = 4;
/// Tokens.
pub const L: usize = SIDE * SIDE * SIDE;
/// Hidden width of the Linear.
pub const H: usize = 32;
/// Output channels of the final Conv.
pub const OUT: usize = 3;

/// The graph's parameters.
pub struct Params {
    pub ln_scale: Vec<f32>,
    pub ln_bias: Vec<f32>,
    /// [C, H] row-major.
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    /// [OUT, H, 3, 3, 3].
    pub conv_w: Vec<f32>,
    pub conv_b: Vec<f32>,
}

/// Random parameters from `seed` (scaled so Gelu and Softmax see moderate values).
pub fn params(seed: u64) -> Params {
    let mut r = Rng::new(seed);
    Params {
        ln_scale: (0..C).map(|_| 1.0 + 0.3 * r.uni()).collect(),
        ln_bias: r.scaled(C, 0.2),
        w: r.scaled(C * H, 0.5),
        b: r.scaled(H, 0.2),
        conv_w: r.scaled(OUT * H * 27, 0.2),
        conv_b: r.scaled(OUT, 0.1),
    }
}

/// The graph on batch 1, `C` channels, window `SIDE`^3 (its Reshape targets fix both).
pub fn graph(p: &Params) -> Graph {
    let t = |s: &[usize], d: &[f32]| Tensor::new(s.to_vec(), d.to_vec());
    // (op, inputs, channels = dim 1 of the output)
    let nodes: Vec<(Op, Vec<usize>, usize)> = vec![
        (
            Op::Reshape {
                target: vec![1, C as i64, -1],
            },
            vec![0],
            C,
        ), // 1: [1, C, L]
        (
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![1],
            L,
        ), // 2: [1, L, C]
        (
            Op::LayerNorm(LayerNorm {
                axis: -1,
                eps: 1e-5,
                scale: t(&[C], &p.ln_scale),
                bias: Some(t(&[C], &p.ln_bias)),
            }),
            vec![2],
            L,
        ), // 3
        (
            Op::Linear(Linear {
                weight: t(&[C, H], &p.w),
                bias: Some(t(&[H], &p.b)),
            }),
            vec![3],
            L,
        ), // 4: [1, L, H]
        (Op::Pointwise(Pointwise::Gelu { tanh: false }), vec![4], L), // 5
        (
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![5],
            H,
        ), // 6: [1, H, L]
        (Op::MatMul, vec![5, 6], L),                                  // 7: [1, L, L]
        (Op::Softmax { axis: 2 }, vec![7], L),                        // 8
        (Op::MatMul, vec![8, 5], L),                                  // 9: [1, L, H]
        (Op::Add, vec![9, 5], L),                                     // 10
        (
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![10],
            H,
        ), // 11: [1, H, L]
        (
            Op::Reshape {
                target: vec![1, H as i64, SIDE as i64, SIDE as i64, SIDE as i64],
            },
            vec![11],
            H,
        ), // 12
        (
            Op::Conv(Conv {
                weight: t(&[OUT, H, 3, 3, 3], &p.conv_w),
                bias: Some(t(&[OUT], &p.conv_b)),
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            }),
            vec![12],
            OUT,
        ), // 13
    ];
    super::graph::chain("attention", C, nodes)
}
