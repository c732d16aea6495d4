//! The W1 network (nnU-Net CT PlainConvUNet, 14 classes) on the 512x512x128 benchmark volume:
//! the device memory plan, built by hand (no torch) and checked against the exported fixture's
//! structure. `cargo test --test plan_w1 -- --nocapture` prints the plan breakdown.

mod common;
use common::unet::*;
use common::*;
use voxtile::backend::cuda::pipeline::{pipeline_alloc, GatherMode};
use voxtile::backend::cuda::plan::{buffer_plan, ArchCaps};
use voxtile::model::graph::{Graph, Op};
use voxtile::plan::{self, Target, Workload};
use voxtile::tiling::Placement;

/// W1's volume in network axes (D, H, W) as MONAI/nibabel order the 512x512x128 CT.
const W1_SHAPE: [usize; 3] = [512, 512, 128];
const ROI: [usize; 3] = [128; 3];

fn w1_workload() -> Workload {
    Workload {
        shape: W1_SHAPE,
        overlap: [0.5; 3],
        placement: Placement::Monai,
        keep_logits: false,
        copy_input: false,
    }
}

/// One line per node: op, weight shape / stride / pads of convs, and for a concat the ops that
/// produce its inputs in order.
fn structure(g: &Graph) -> Vec<String> {
    let producer = |v: usize| {
        g.nodes
            .iter()
            .find(|n| n.output == v)
            .map_or("input", |n| n.op.name())
    };
    g.nodes
        .iter()
        .map(|n| match &n.op {
            Op::Conv(c) => format!(
                "Conv {:?} s{:?} p{:?} bias {}",
                c.weight.shape,
                c.stride,
                c.pads,
                c.bias.is_some()
            ),
            Op::ConvTranspose(c) => format!(
                "ConvTranspose {:?} s{:?} p{:?} bias {}",
                c.weight.shape,
                c.stride,
                c.pads,
                c.bias.is_some()
            ),
            Op::Concat { axis } => format!(
                "Concat {axis} {:?}",
                n.inputs.iter().map(|&v| producer(v)).collect::<Vec<_>>()
            ),
            Op::InstanceNorm { eps, scale, .. } => format!("InstanceNorm {eps} {}", scale.len()),
            Op::LeakyRelu { alpha } => format!("LeakyRelu {alpha}"),
            o => o.name().to_string(),
        })
        .collect()
}

/// The hand-built PlainConvUNet has the structure of the real export: built with the fixture's
/// widths (8,16,32,64,80, 4 classes), node for node the same ops, weight shapes, strides, pads
/// and concat order as `nnunet_small.onnx` (torch.onnx.export of dynamic_network_architectures).
#[test]
fn builder_matches_the_exported_plain_conv_unet() {
    let Some(p) = shared("fixtures/models/nnunet_small.onnx") else {
        return;
    };
    let fixture = voxtile::model::onnx::load(&p).unwrap();
    use prost::Message;
    let m = plain_conv_unet(1, &[8, 16, 32, 64, 80], 4);
    let built =
        voxtile::model::onnx::load_bytes(&m.encode_to_vec(), None, std::path::Path::new("u.onnx"))
            .unwrap();
    let (a, b) = (structure(&built), structure(&fixture));
    assert_eq!(a.len(), b.len(), "{a:#?}\n{b:#?}");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "node {i}");
    }
    assert_eq!(built.param_count(), fixture.param_count());
    assert_eq!(built.spatial_divisor(), fixture.spatial_divisor());
    // W1 itself: 6 stages (divisor 32), 14 classes, 12 + 10 + 1 convs, 5 transposed.
    let g = w1_graph();
    let s = structure(&g);
    assert_eq!(g.spatial_divisor(), [32; 3]);
    assert_eq!((g.input_channels(), g.output_channels()), (1, 14));
    assert_eq!(s.iter().filter(|l| l.starts_with("Conv ")).count(), 23);
    assert_eq!(s.iter().filter(|l| l.starts_with("ConvTranspose")).count(), 5);
    assert_eq!(s.iter().filter(|l| l.starts_with("InstanceNorm")).count(), 22);
}

/// Prints the W1 device plan at roi 128 for batch 1, 2, 4: the buffer plan (activation pool,
/// constants, scratch) and the pipeline's buffers, and checks the planner's total is their sum.
#[test]
fn w1_plan_breakdown() {
    let g = w1_graph();
    let caps = ArchCaps::h200();
    let w = w1_workload();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for batch in [1usize, 2, 4] {
        let bp = buffer_plan(&g, batch, ROI, &caps).unwrap();
        let pa = pipeline_alloc(ROI, batch, 1, 14, W1_SHAPE, true, GatherMode::Auto);
        let e = plan::estimate(&g, Target::Cuda, ROI, batch, &w).unwrap();
        let total = e.budgeted.total();
        let biggest = bp.bufs.iter().max().copied().unwrap_or(0);
        eprintln!(
            "RESULT w1 plan batch {batch}: total {total} ({:.3} GiB) = plan {:.3} (activations {:.3} in {} bufs, largest {:.3}; constants {:.3}; scratch {:.3}: stage_in {:.3} stage_out {:.3} norm_sums {} norm_ab {}) + pipeline {:.3} (input {:.3} gather_on_device {}, weight map {:.4}, accumulators {:.3}, out slots {:.4})",
            gib(total),
            gib(bp.device_bytes()),
            gib(bp.activation_alloc()),
            bp.bufs.len(),
            gib(biggest as u64),
            gib(bp.const_alloc()),
            gib(bp.scratch_alloc()),
            gib(bp.stage_in as u64),
            gib(bp.stage_out as u64),
            bp.norm_sums,
            bp.norm_ab,
            gib(pa.total()),
            gib(pa.input),
            pa.gather_on_device,
            gib(pa.weight_map),
            gib(pa.accumulators),
            gib(pa.out_slots),
        );
        for (i, b) in bp.bufs.iter().enumerate() {
            eprintln!("  buf {i}: {b} bytes ({:.1} MiB)", *b as f64 / (1 << 20) as f64);
        }
        assert_eq!(total, bp.device_bytes() + pa.total());
    }
}
