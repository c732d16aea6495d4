//! Host only (no GPU): which 1x1x1 heads the CUDA buffer plan runs on their norm's input,
//! normalised on load (`host::fusion::fusable_norm_head`, `launch::NormHead`): the norm's and
//! its activation's outputs never get a buffer, and no plan writes over a value still to be read.

use super::planner::check_no_alias;
use crate::common::graph::{self, chain};
use crate::common::rng::Rng;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use voxtile::model::graph::{Graph, Op, Tensor};

fn conv(r: &mut Rng, cin: usize, cout: usize, k: usize) -> Op {
    let w = Tensor::new(
        vec![cout, cin, k, k, k],
        r.scaled(cout * cin * k * k * k, 0.1),
    );
    graph::conv(w, Some(Tensor::new(vec![cout], r.scaled(cout, 0.1))), k / 2)
}

fn norm(r: &mut Rng, c: usize) -> Op {
    graph::instance_norm(
        Tensor::new(vec![c], r.scaled(c, 1.0)),
        Tensor::new(vec![c], r.scaled(c, 1.0)),
    )
}

fn plan_with(g: &Graph, caps: &ArchCaps) -> BufferPlan {
    let bp = buffer_plan(g, 2, [8, 8, 8], caps).unwrap();
    check_no_alias(&g.name, g, &bp);
    bp
}

/// The plain heads (`head_mma` off: the mma head is a case of its own).
fn plan(g: &Graph) -> BufferPlan {
    plan_with(
        g,
        &ArchCaps {
            head_mma: false,
            ..ArchCaps::h200()
        },
    )
}

/// (node, head conv, head activation) of every launch that takes a head.
fn heads(bp: &BufferPlan) -> Vec<(usize, usize, Option<usize>)> {
    bp.launches
        .iter()
        .filter_map(|l| l.head.as_ref().map(|h| (l.node, h.conv, h.fuse)))
        .collect()
}

#[test]
fn pointwise_heads_read_their_norms_input() {
    let mut r = Rng::tagged("norm head plan");
    // conv -> norm -> leaky -> 1x1 head (nnU-Net's end): two launches; the norm's and the
    // activation's outputs never exist; the conv's output is kept in fp32 for the norm.
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    let g = chain(
        "nnunet end",
        16,
        vec![
            (conv(&mut r, 16, 32, 3), vec![0], 32),
            (norm(&mut r, 32), vec![1], 32),
            (leaky.clone(), vec![2], 32),
            (conv(&mut r, 32, 14, 1), vec![3], 14),
        ],
    );
    let bp = plan(&g);
    assert_eq!(bp.launches.len(), 2);
    assert_eq!(heads(&bp), vec![(1, 3, None)]);
    let l = &bp.launches[1];
    assert_eq!((l.fuse, l.out_v), (Some(2), 4));
    assert!(matches!(
        l.head.as_ref().unwrap().kernel,
        ConvKernel::Pointwise {
            nc: 16,
            staged: false,
            mma: false
        }
    ));
    assert_eq!((bp.value_buf[2], bp.value_buf[3]), (None, None));
    assert!(bp.f32_values[1]);
    assert_eq!(bp.value_buf[4], Some(bp.output_buf));
    // With `head_mma` (Cin 32, Cout 14): the mma head, the same launches and buffers.
    let mma_caps = ArchCaps {
        head_mma: true,
        head_staged: true,
        ..ArchCaps::h200()
    };
    let bm = plan_with(&g, &mma_caps);
    let k = &bm.launches[1].head.as_ref().unwrap().kernel;
    assert_eq!(
        (k, k.funcs()),
        (
            &ConvKernel::Pointwise {
                nc: 16,
                staged: false,
                mma: true
            },
            vec!["conv1x1_mma_n16"]
        )
    );
    assert_eq!((&bm.bufs, bm.arena), (&bp.bufs, bp.arena));

    // A head with an activation of its own, after a norm without one.
    let g = chain(
        "sigmoid head",
        16,
        vec![
            (norm(&mut r, 16), vec![0], 16),
            (conv(&mut r, 16, 20, 1), vec![1], 20),
            (Op::Sigmoid, vec![2], 20),
        ],
    );
    let bp = plan(&g);
    assert_eq!(heads(&bp), vec![(0, 1, Some(2))]);
    assert!(matches!(
        bp.launches[0].head.as_ref().unwrap().kernel,
        ConvKernel::Pointwise {
            nc: 32,
            staged: false,
            mma: false
        }
    ));
    assert_eq!(bp.launches.len(), 1);

    // Not taken: a head wider than the pointwise kernel (40 outputs: an mma tile); a 3^3
    // conv; the norm's output read twice; the switch off.
    for (name, nodes) in [
        (
            "wide head",
            vec![
                (norm(&mut r, 16), vec![0], 16),
                (conv(&mut r, 16, 40, 1), vec![1], 40),
            ],
        ),
        (
            "3^3 conv",
            vec![
                (norm(&mut r, 16), vec![0], 16),
                (conv(&mut r, 16, 8, 3), vec![1], 8),
            ],
        ),
        (
            "read twice",
            vec![
                (norm(&mut r, 16), vec![0], 16),
                (leaky.clone(), vec![1], 16),
                (conv(&mut r, 16, 8, 1), vec![2], 8),
                (Op::Concat { axis: 1 }, vec![3, 2], 24),
            ],
        ),
    ] {
        let bp = plan(&chain(name, 16, nodes));
        assert!(heads(&bp).is_empty(), "{name}");
    }
    let caps = ArchCaps {
        norm_head: false,
        ..ArchCaps::h200()
    };
    assert!(heads(&plan_with(&g, &caps)).is_empty());
}

/// On the architecture fixtures, with and without `norm_load_conv`: every head taken is a
/// pointwise 1x1x1 conv (or with the switch an `_nl` z-pair conv) whose only input is its norm
/// launch's output after the activation, which never gets a buffer. DynUNet's and the
/// nnU-Net-style nets' output blocks (conv, norm, LeakyReLU, 1x1x1 head) take one.
#[test]
fn fixture_heads_read_their_norms_input() {
    let mut taken = [Vec::new(), Vec::new()];
    for (arch, g, w) in crate::common::arch_fixtures() {
        for (k, load) in [false, true].into_iter().enumerate() {
            let caps = ArchCaps {
                norm_load_conv: load,
                ..ArchCaps::h200()
            };
            let bp = buffer_plan(&g, 2, w, &caps).unwrap();
            check_no_alias(&arch, &g, &bp);
            for l in &bp.launches {
                let Some(h) = &l.head else { continue };
                let normed = g.nodes[l.fuse.unwrap_or(l.node)].output;
                assert!(matches!(
                    g.nodes[l.node].op,
                    Op::InstanceNorm { .. } | Op::GroupNorm { .. }
                ));
                let nl = matches!(h.kernel, ConvKernel::Halo(c) if c.norm_load);
                assert!(
                    matches!(h.kernel, ConvKernel::Pointwise { .. }) || (load && nl),
                    "{arch}: {:?}",
                    h.kernel
                );
                assert_eq!(g.nodes[h.conv].inputs, vec![normed], "{arch}");
                assert_eq!(bp.value_buf[normed], None, "{arch}");
                assert_eq!(l.out_v, g.nodes[h.fuse.unwrap_or(h.conv)].output, "{arch}");
                taken[k].push(format!("{arch}{}", if nl { " (nl)" } else { "" }));
            }
        }
    }
    eprintln!(
        "heads taken: {:?}; with norm_load_conv: {:?}",
        taken[0], taken[1]
    );
    assert!(
        !taken[0].is_empty(),
        "no fixture's head read its norm's input"
    );
}

/// With `norm_load_conv`: a 32 -> 32 3³ conv on the z-pair kernel that alone reads a norm
/// (after its activation) runs on its `_nl` twin on the norm's input, in the norm's launch; the
/// norm's and the activation's outputs never get a buffer; the conv's output stays fp32 for the
/// norm after it. W1 at batches 1 and 4: the second conv of the first encoder stage and of the
/// last decoder stage, and no other; the constants are the same bytes.
#[test]
fn zpair_convs_read_their_norms_input() {
    let mut r = Rng::tagged("norm load conv plan");
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    let g = chain(
        "z-pair after a norm",
        32,
        vec![
            (conv(&mut r, 32, 32, 3), vec![0], 32),
            (norm(&mut r, 32), vec![1], 32),
            (leaky.clone(), vec![2], 32),
            (conv(&mut r, 32, 32, 3), vec![3], 32),
            (norm(&mut r, 32), vec![4], 32),
            (leaky.clone(), vec![5], 32),
        ],
    );
    let on = ArchCaps {
        norm_load_conv: true,
        ..ArchCaps::h200()
    };
    let bp = plan_with(&g, &on);
    assert_eq!(heads(&bp), vec![(1, 3, None)]);
    assert_eq!(bp.launches.len(), 3);
    let h = bp.launches[1].head.as_ref().unwrap();
    assert_eq!(h.kernel.funcs(), ["conv_wz_c32_y16_h2_nl"]);
    assert_eq!((bp.value_buf[2], bp.value_buf[3]), (None, None));
    assert!(bp.f32_values[1] && bp.f32_values[4]);
    assert_eq!(bp.launches[1].out_v, 4);
    assert!(heads(&plan(&g)).is_empty(), "off by default");

    let w1 = crate::common::unet::w1_graph();
    for batch in [1, 4] {
        let off = buffer_plan(&w1, batch, [128; 3], &ArchCaps::h200()).unwrap();
        let bp = buffer_plan(&w1, batch, [128; 3], &on).unwrap();
        check_no_alias("w1", &w1, &bp);
        let nl: Vec<_> = bp
            .launches
            .iter()
            .filter_map(|l| l.head.as_ref())
            .filter(|h| matches!(h.kernel, ConvKernel::Halo(c) if c.norm_load))
            .map(|h| bp.shapes[w1.nodes[h.conv].output])
            .collect();
        assert_eq!(nl, [[32, 128, 128, 128]; 2], "w1 b{batch}");
        assert_eq!(bp.launches.len(), off.launches.len() - 2);
        let bytes = |p: &BufferPlan| p.consts.iter().map(|c| c.bytes).sum::<usize>();
        assert_eq!(bytes(&bp), bytes(&off));
        eprintln!(
            "RESULT w1 b{batch} norm-load convs: arena {} -> {} MiB",
            off.arena >> 20,
            bp.arena >> 20
        );
    }
}
