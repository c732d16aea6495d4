//! Host only (no GPU): which residual Adds the CUDA buffer plan fuses into a conv's epilogue
//! (`host::fusion::fusable_residual`, on the H200's `conv_wg_*` kernels) or a norm's affine
//! pass, on hand-built graphs
//! and the architecture fixtures, and that no fused plan (residual or activation) frees or writes
//! over a value still to be read.

use super::planner::check_no_alias;
use crate::common::graph::{self, chain};
use crate::common::rng::Rng;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::model::graph::{Graph, Op, Tensor};

fn conv(r: &mut Rng, cin: usize, cout: usize) -> Op {
    let w = Tensor::new(vec![cout, cin, 3, 3, 3], r.scaled(cout * cin * 27, 0.1));
    graph::conv(w, None, 1)
}

fn plan(g: &Graph) -> BufferPlan {
    plan_on(g, &ArchCaps::h200())
}

fn plan_on(g: &Graph, caps: &ArchCaps) -> BufferPlan {
    let bp = buffer_plan(g, 2, [8, 8, 8], caps).unwrap();
    check_no_alias(&g.name, g, &bp);
    bp
}

/// The H200's defaults with the norms' residual Adds off (`CudaOptions::norm_residual`).
fn norm_residual_off() -> ArchCaps {
    ArchCaps {
        norm_residual: false,
        ..ArchCaps::h200()
    }
}

/// (node, residual) of every launch.
fn fused(bp: &BufferPlan) -> Vec<(usize, Option<(usize, usize)>)> {
    bp.launches.iter().map(|l| (l.node, l.residual)).collect()
}

#[test]
fn residual_adds_fuse_where_the_other_operand_is_ready() {
    let mut r = Rng::tagged("residual plan");
    // conv(x) + x: one launch, writing the Add's output; the conv's own output never exists.
    let g = chain(
        "identity skip",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Add, vec![1, 0], 16),
        ],
    );
    let bp = plan(&g);
    assert_eq!(fused(&bp), vec![(0, Some((1, 0)))]);
    assert_eq!(bp.launches[0].out_v, 2);
    assert_eq!(bp.value_buf[1], None);
    assert_eq!((bp.launches[0].ldc, bp.launches[0].coff), (16, 0));
    assert_ne!(bp.value_buf[0], bp.value_buf[2]);

    // v1 = conv(x), v2 = conv(x), v3 = v1 + v2: the first conv's partner is not computed yet,
    // the second's is.
    let g = chain(
        "two convs",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Add, vec![1, 2], 16),
        ],
    );
    assert_eq!(fused(&plan(&g)), vec![(0, None), (1, Some((2, 1)))]);

    // The skip x is read again after the fused launch (v2 = relu(x)): x must outlive it.
    let g = chain(
        "skip read later",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Relu, vec![0], 16),
            (Op::Add, vec![1, 0], 16),
            (Op::Add, vec![3, 2], 16),
        ],
    );
    let bp = plan(&g);
    assert_eq!(bp.launches[0].residual, Some((2, 0)));
    let xb = bp.value_buf[0].unwrap();
    let relu = bp.launches.iter().position(|l| l.node == 1).unwrap();
    assert!(bp.lifetimes[xb].1 >= relu, "{:?}", bp.lifetimes[xb]);

    // Not fused: the conv's output read twice; the Add's output written into a concat slice
    // (the residual is indexed as a dense output); a broadcast Add (other shape).
    let g = chain(
        "read twice",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Add, vec![1, 0], 16),
            (Op::Add, vec![2, 1], 16),
        ],
    );
    assert!(fused(&plan(&g)).iter().all(|(_, f)| f.is_none()));
    let g = chain(
        "into a concat",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Add, vec![1, 0], 16),
            (Op::Concat { axis: 1 }, vec![2, 0], 32),
        ],
    );
    assert!(fused(&plan(&g)).iter().all(|(_, f)| f.is_none()));
    let g = chain(
        "broadcast",
        16,
        vec![(conv(&mut r, 16, 1), vec![0], 1), (Op::Add, vec![1, 0], 16)],
    );
    assert!(fused(&plan(&g)).iter().all(|(_, f)| f.is_none()));
}

/// norm(v) -> activation -> + skip: the norm's affine pass adds the skip (`norm_residual`), the
/// Add never runs and the activation's output never exists; not with the switch off, nor where
/// the activation's output is read twice.
#[test]
fn residual_adds_fuse_into_norms() {
    let mut r = Rng::tagged("norm residual plan");
    // v1 = conv(x), v2 = norm(v1), then `tail`.
    let mut with_tail = |name: &str, tail: Vec<(Op, Vec<usize>, usize)>| {
        let norm = graph::instance_norm(
            Tensor::new(vec![16], r.scaled(16, 1.0)),
            Tensor::new(vec![16], r.scaled(16, 1.0)),
        );
        let mut nodes = vec![(conv(&mut r, 16, 16), vec![0], 16), (norm, vec![1], 16)];
        nodes.extend(tail);
        chain(name, 16, nodes)
    };
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    // v3 = leaky(v2), v4 = v3 + x.
    let g = with_tail(
        "norm act skip",
        vec![(leaky.clone(), vec![2], 16), (Op::Add, vec![3, 0], 16)],
    );
    let bp = plan(&g);
    let l = bp.launches.iter().find(|l| l.node == 1).unwrap();
    assert_eq!((l.fuse, l.residual, l.out_v), (Some(2), Some((3, 0)), 4));
    assert_eq!(bp.value_buf[3], None);
    assert!(bp.launches.iter().all(|l| l.node != 3));
    // Without the activation, and with the switch off.
    let g = with_tail("norm skip", vec![(Op::Add, vec![0, 2], 16)]);
    let l = plan(&g).launches.into_iter().find(|l| l.node == 1).unwrap();
    assert_eq!((l.fuse, l.residual), (None, Some((2, 0))));
    let bp = plan_on(&g, &norm_residual_off());
    assert!(bp.launches.iter().all(|l| l.residual.is_none()));
    assert!(bp.launches.iter().any(|l| l.node == 2));
    // The activation's output read twice: the Add runs.
    let g = with_tail(
        "norm act read twice",
        vec![
            (leaky, vec![2], 16),
            (Op::Add, vec![3, 0], 16),
            (Op::Add, vec![4, 3], 16),
        ],
    );
    assert!(plan(&g).launches.iter().all(|l| l.residual.is_none()));
}

/// On the architecture fixtures: every fused residual is a conv on a kernel that adds one, or a
/// norm (the Add reading its activation's output, if one is fused), whose only reader is an Add
/// of the same shape, with the other operand written by an earlier launch, and the plan never
/// aliases a live value. SegResNet's 16-channel blocks end in conv(x) + x on
/// `conv_wg_c16n16_r8`, and MONAI's residual units in norm, activation, + skip, so both must
/// fuse.
#[test]
fn fixture_residuals_fuse_into_convs_and_norms() {
    let (mut convs, mut norms) = (0, 0);
    for (arch, g, w) in crate::common::arch_fixtures() {
        let bp = buffer_plan(&g, 2, w, &ArchCaps::h200()).unwrap();
        check_no_alias(&arch, &g, &bp);
        for (k, l) in bp.launches.iter().enumerate() {
            let Some((j, r)) = l.residual else { continue };
            let out = g.nodes[l.fuse.unwrap_or(l.node)].output;
            if matches!(g.nodes[l.node].op, Op::Conv(_)) {
                convs += 1;
                assert!(l.conv.as_ref().is_some_and(|k| k.adds_residual()), "{arch}");
                assert_eq!(l.fuse, None, "{arch}");
            } else {
                norms += 1;
                assert!(
                    matches!(
                        g.nodes[l.node].op,
                        Op::InstanceNorm { .. } | Op::GroupNorm { .. }
                    ),
                    "{arch}"
                );
                assert!(l.head.is_none(), "{arch}");
            }
            assert!(matches!(g.nodes[j].op, Op::Add), "{arch}");
            assert!(g.nodes[j].inputs.contains(&out) && g.nodes[j].inputs.contains(&r));
            assert_eq!(l.out_v, g.nodes[j].output, "{arch}");
            assert_eq!(bp.shapes[r], bp.shapes[out], "{arch}");
            assert_eq!(bp.value_buf[out], None, "{arch}");
            let writer = bp.launches.iter().position(|m| m.out_v == r);
            assert!(r == g.input || writer.is_some_and(|m| m < k), "{arch}");
        }
    }
    assert!(
        convs > 0,
        "no residual Add fused into a conv on any fixture"
    );
    assert!(
        norms > 0,
        "no residual Add fused into a norm on any fixture"
    );
}

/// A node between a conv and its fused activation that reads the conv's input (a skip conv
/// exported between them: conv1(x), skip(x), relu(conv1)) must still find the input intact.
#[test]
fn inputs_outlive_nodes_between_a_conv_and_its_fused_activation() {
    let mut r = Rng::tagged("fused act order");
    let g = chain(
        "skip between",
        16,
        vec![
            (conv(&mut r, 16, 16), vec![0], 16),
            (conv(&mut r, 16, 16), vec![0], 16),
            (Op::Relu, vec![1], 16),
            (Op::Add, vec![3, 2], 16),
        ],
    );
    let bp = plan(&g);
    assert_eq!(bp.launches[0].fuse, Some(2));
    let xb = bp.value_buf[0].unwrap();
    let skip = bp.launches.iter().position(|l| l.node == 1).unwrap();
    assert!(bp.lifetimes[xb].1 >= skip, "{:?}", bp.lifetimes[xb]);
}
