//! The fused attention kernel (kernels/attention.cu) against the CPU kernel on random q, k, v
//! and biases: UNETR-like heads (T = S = 216, not a multiple of the 64-row tile), Swin windows
//! (343 tokens, per-head bias with a -100 mask, fp16 bias), broadcast leading dims and biases
//! (fp32 bias), odd feature counts, 128 features, and T = S = 4096. Inputs are rounded to fp16
//! first so the comparison measures the kernel. Skips without a GPU unless VOXTILE_REQUIRE_GPU=1.

use crate::common::rng::Rng;
use half::f16;
use voxtile::internals::cpu::ops::attention;
use voxtile::internals::cuda::attention_offsets;
use voxtile::model::graph::{Dims, Tensor};
use voxtile::model::ops::Attention;

fn dims(s: &[usize]) -> Dims {
    Dims::new(s).unwrap()
}

/// `n` uniform values times `scale`, rounded to fp16.
fn halfs(r: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    r.scaled(n, scale)
        .into_iter()
        .map(|x| f16::from_f32(x).to_f32())
        .collect()
}

/// The offset table resolves broadcast leading dims (no GPU needed).
#[test]
fn offset_table_broadcasts() {
    let a = Attention {
        scale: 1.0,
        bias: Some(Tensor::new(vec![1, 3, 1, 7], vec![0.0; 21])),
        mask: Some(Tensor::new(vec![2, 1, 5, 7], vec![0.0; 70])),
    };
    let t = attention_offsets(
        &a,
        &dims(&[2, 3, 5, 6]),
        &dims(&[1, 3, 7, 6]),
        &dims(&[2, 1, 7, 4]),
    )
    .unwrap();
    assert_eq!(t.offs.len(), 6 * 6);
    // Leading index (1, 2) = row 5: q (1·3+2)·30, k 2·42, v 1·28, bias 2·8, mask 1·40,
    // out 5·20 (the bias and mask rows of 7 keys are uploaded 8 apart: even, for pair loads).
    assert_eq!(&t.offs[30..36], &[150, 84, 28, 16, 40, 100]);
    assert_eq!((t.bias_ts, t.mask_ts), ([0, 1], [8, 1]));
    let wide = Attention {
        scale: 1.0,
        bias: None,
        mask: None,
    };
    assert!(attention_offsets(
        &wide,
        &dims(&[1, 4, 130]),
        &dims(&[1, 4, 130]),
        &dims(&[1, 4, 8])
    )
    .is_err());
}

/// A mask with one entry per window `[2, 1, T, S]` against scores of 2 samples of 2 windows
/// (`[4, h, T, S]`, a graph freed of its batch) repeats per sample: leading index 3 reads
/// window 1's mask (no GPU needed).
#[test]
fn offset_table_repeats_a_window_mask() {
    let a = Attention {
        scale: 1.0,
        bias: None,
        mask: Some(Tensor::new(vec![2, 1, 5, 7], vec![0.0; 70])),
    };
    let q = dims(&[4, 3, 5, 6]);
    let k = dims(&[4, 3, 7, 6]);
    let t = attention_offsets(&a, &q, &k, &k).unwrap();
    let mask: Vec<i64> = t.offs.chunks(6).map(|o| o[4]).collect();
    // Leading (window row, head): rows 0..3 are window 0, 3..6 window 1 (5 rows of 7 keys,
    // uploaded 8 apart), then again.
    let per_row = [0, 0, 0, 40, 40, 40];
    let want: Vec<i64> = per_row.iter().chain(&per_row).copied().collect();
    assert_eq!(mask, want);
}

struct Case {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    bias: Option<Vec<usize>>,
    mask: bool,
    bias_f32: bool,
    /// A separate mask term (0 / -100) of this shape.
    mask_term: Option<Vec<usize>>,
}

fn case(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    bias: Option<&[usize]>,
    mask: bool,
    f32b: bool,
) -> Case {
    Case {
        q: q.to_vec(),
        k: k.to_vec(),
        v: v.to_vec(),
        bias: bias.map(|b| b.to_vec()),
        mask,
        bias_f32: f32b,
        mask_term: None,
    }
}

#[test]
fn gpu_attention_matches_cpu() {
    let Some(b) = crate::common::cuda_backend() else {
        return;
    };
    let mut r = Rng::tagged("cuda_attention");
    let cases = [
        case(
            &[1, 2, 216, 12],
            &[1, 2, 216, 12],
            &[1, 2, 216, 12],
            None,
            false,
            false,
        ),
        case(
            &[8, 3, 343, 32],
            &[8, 3, 343, 32],
            &[8, 3, 343, 32],
            Some(&[8, 3, 343, 343]),
            true,
            false,
        ),
        case(
            &[2, 3, 100, 64],
            &[1, 3, 77, 64],
            &[2, 1, 77, 40],
            Some(&[1, 3, 1, 77]),
            false,
            true,
        ),
        case(
            &[3, 70, 10],
            &[3, 129, 10],
            &[3, 129, 6],
            Some(&[1, 70, 1]),
            false,
            true,
        ),
        case(
            &[1, 2, 512, 128],
            &[1, 2, 512, 128],
            &[1, 2, 512, 128],
            Some(&[1, 1, 512, 512]),
            false,
            false,
        ),
        case(
            &[1, 1, 4096, 8],
            &[1, 1, 4096, 8],
            &[1, 1, 4096, 8],
            None,
            false,
            false,
        ),
        // Swin's shifted windows: a per-head bias and a per-window mask kept apart.
        Case {
            mask_term: Some(vec![8, 1, 343, 343]),
            ..case(
                &[8, 3, 343, 16],
                &[8, 3, 343, 16],
                &[8, 3, 343, 16],
                Some(&[1, 3, 343, 343]),
                false,
                true,
            )
        },
        Case {
            mask_term: Some(vec![2, 1, 1, 77]),
            ..case(
                &[2, 3, 100, 64],
                &[2, 3, 77, 64],
                &[2, 3, 77, 40],
                None,
                false,
                false,
            )
        },
    ];
    for c in cases {
        let n = |s: &[usize]| s.iter().product::<usize>();
        let (q, k, v) = (
            halfs(&mut r, n(&c.q), 1.5),
            halfs(&mut r, n(&c.k), 1.5),
            halfs(&mut r, n(&c.v), 1.0),
        );
        let bias = c.bias.as_ref().map(|s| {
            let mut x = halfs(&mut r, n(s), 2.0);
            if c.mask {
                for (i, y) in x.iter_mut().enumerate() {
                    if (i / 7) % 5 == 0 {
                        *y -= 100.0;
                    }
                }
            }
            Tensor::new(s.clone(), x)
        });
        let mask = c.mask_term.as_ref().map(|s| {
            let x = (0..n(s))
                .map(|i| if (i / 3) % 4 == 1 { -100.0 } else { 0.0 })
                .collect();
            Tensor::new(s.clone(), x)
        });
        let d = c.q[c.q.len() - 1];
        let a = Attention {
            scale: 1.0 / (d as f32).sqrt(),
            bias,
            mask,
        };
        let (want, od) =
            attention::<f32>(&a, (&q, dims(&c.q)), (&k, dims(&c.k)), (&v, dims(&c.v))).unwrap();
        let got = b
            .attention_f16(
                &a,
                (&q, dims(&c.q)),
                (&k, dims(&c.k)),
                (&v, dims(&c.v)),
                c.bias_f32,
            )
            .unwrap();
        assert_eq!(got.len(), od.numel());
        let e = crate::common::rel_l2(&got, &want);
        println!(
            "q {:?} k {:?} v {:?} bias {:?} mask {:?}: rel L2 {e:.2e}",
            c.q, c.k, c.v, c.bias, c.mask_term
        );
        assert!(e <= 1e-2, "q {:?}: rel L2 {e}", c.q);
    }
}
