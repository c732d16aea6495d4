//! The W1 network (nnU-Net CT PlainConvUNet, 14 classes) on the 512x512x128 benchmark volume:
//! the device memory plan, built by hand (no torch) and checked against the exported fixture's
//! structure. `cargo test --test it plan::w1 -- --nocapture` prints the plan breakdown.

use crate::common::unet::*;
use crate::common::*;
use voxtile::internals::cuda::host::buffers::buffer_plan;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::internals::cuda::stream::{pipeline_alloc, window_z0, AllocQuery};
use voxtile::internals::cuda::GatherMode;
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

/// The planner's CUDA choice for `w` at an explicit `budget` (window and batch its own).
fn plan_at(g: &Graph, w: Workload, budget: u64) -> plan::Plan {
    choose_on(
        g,
        Target::Cuda,
        &plan::Request {
            budget,
            budget_explicit: true,
            user_roi: None,
            user_batch: None,
            workload: w,
        },
    )
    .unwrap()
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
    assert_eq!(
        s.iter().filter(|l| l.starts_with("ConvTranspose")).count(),
        5
    );
    assert_eq!(
        s.iter().filter(|l| l.starts_with("InstanceNorm")).count(),
        22
    );
}

/// Prints the W1 device plan at roi 128 for batch 1 to 4: the buffer plan (activation pool,
/// constants, scratch) and the pipeline's buffers, and checks the planner's total is their sum.
#[test]
fn w1_plan_breakdown() {
    let g = w1_graph();
    let caps = ArchCaps::h200();
    let w = w1_workload();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for batch in [1usize, 2, 3, 4] {
        let bp = buffer_plan(&g, batch, ROI, &caps).unwrap();
        let grid = voxtile::tiling::Grid::new(W1_SHAPE, ROI, [0.5; 3], Placement::Monai).unwrap();
        let z0 = window_z0(&grid.starts, grid.pad_before[0]);
        let pa = pipeline_alloc(&AllocQuery {
            roi: ROI,
            batch,
            cin: 1,
            cout: 14,
            shape: W1_SHAPE,
            argmax: true,
            mode: GatherMode::Auto,
            z0: &z0,
        });
        let e = estimate_on_target(&g, Target::Cuda, ROI, batch, &w).unwrap();
        let total = e.budgeted.total();
        let biggest = bp.bufs.iter().max().copied().unwrap_or(0);
        eprintln!(
            "RESULT w1 plan batch {batch}: total {total} ({:.3} GiB) = plan {:.3} (activation arena {:.3} for {} bufs, largest {:.3}; constants {:.3}; norm scratch {:.6}: norm_sums {} norm_ab {}) + pipeline {:.3} (input {:.3} gather_on_device {}, weight map {:.4}, accumulators {:.3} over a ring of {} planes, out slots {:.4}); single-window staging (not allocated by the pipeline) {:.3}",
            gib(total),
            gib(bp.device_bytes()),
            gib(bp.activation_alloc()),
            bp.bufs.len(),
            gib(biggest as u64),
            gib(bp.const_alloc()),
            gib(bp.scratch_alloc()),
            bp.norm_sums,
            bp.norm_ab,
            gib(pa.total()),
            gib(pa.input),
            pa.gather_on_device,
            gib(pa.weight_map),
            gib(pa.accumulators),
            pa.acc_ring,
            gib(pa.out_slots),
            gib(bp.single_window_alloc()),
        );
        assert_eq!(total, bp.device_bytes() + pa.total());
    }
}

/// Diagnostic: every launch of the W1 plan at batch 1 with its buffers and live bytes.
/// `cargo test --test it plan::w1::w1_launch_dump -- --ignored --nocapture`
#[test]
#[ignore]
fn w1_launch_dump() {
    let g = w1_graph();
    let bp = buffer_plan(&g, 1, ROI, &ArchCaps::h200()).unwrap();
    for l in &bp.launches {
        let n = &g.nodes[l.node];
        let ins: Vec<String> = n
            .inputs
            .iter()
            .map(|&v| format!("{:?}", bp.value_buf[v]))
            .collect();
        eprintln!(
            "{:3} {:22} fuse {:?} in {:?} -> buf {} ldc {} coff {} shape {:?} live {:.1} MiB/{} {:?}",
            l.node,
            n.op.name(),
            l.fuse.map(|j| g.nodes[j].op.name()),
            ins,
            l.out_buf,
            l.ldc,
            l.coff,
            bp.shapes[l.out_v],
            l.live_bytes as f64 / (1 << 20) as f64,
            l.live_bufs,
            l.conv
        );
    }
}

/// The W1 plan against sizes computed from the tensors alone: the activation arena is the
/// largest set of values live at once (the last decoder level's first conv: its 64-channel
/// fp16 concat input at 128³ (the concat's two parts, which the conv run per part reads: the
/// same bytes) and its 32-channel output, fp32 because only an InstanceNorm
/// reads it; with fp16 norm inputs it was before the transposed conv: the concat, the
/// 32-channel skip at 128³ and the 64-channel input at 64³); the accumulator ring holds roi_D
/// planes at every batch, 15 fp32 values (14 sums + weight) per voxel of a 512x128 plane; the
/// device gather's input ring holds roi_D planes at batch 1 and roi_D + step (64) for batches up
/// to a row of windows (7); the single-window staging is not in the plan. Those are the batched
/// plan's figures; the default plan runs the full-resolution ends one window at a time, and
/// holds W1 at batch 4 in 1.59 GiB (1.71 with its first decoder conv run whole over the
/// concat), so at 2 GiB the planner picks batch 4 or more.
#[test]
fn w1_plan_fits_2gib_at_batch_4() {
    let g = w1_graph();
    let w = w1_workload();
    let mib = 1usize << 20;
    let vox = 128usize.pow(3);
    let grid = voxtile::tiling::Grid::new(W1_SHAPE, ROI, [0.5; 3], Placement::Monai).unwrap();
    let z0 = window_z0(&grid.starts, grid.pad_before[0]);
    let mut last = 0;
    let batched = ArchCaps {
        window_segments: false,
        ..ArchCaps::h200()
    };
    for batch in [1usize, 2, 3, 4, 7, 8, 15] {
        let bp = buffer_plan(&g, batch, ROI, &batched).unwrap();
        let live = batch * (64 * vox * 2 + 32 * vox * 4);
        assert_eq!(live, batch * 512 * mib);
        assert!(
            bp.arena >= live && bp.arena <= live + 64 * 256,
            "b{batch} {}",
            bp.arena
        );
        let fp16 = ArchCaps {
            norm_f32: false,
            ..batched
        };
        let bp16 = buffer_plan(&g, batch, ROI, &fp16).unwrap();
        let live16 = batch * (64 * vox + 32 * vox + 64 * vox / 8) * 2;
        assert_eq!(live16, batch * 416 * mib);
        assert!(
            bp16.arena >= live16 && bp16.arena <= live16 + 64 * 256,
            "fp16 norm inputs, b{batch} {}",
            bp16.arena
        );
        let pa = pipeline_alloc(&AllocQuery {
            roi: ROI,
            batch,
            cin: 1,
            cout: 14,
            shape: W1_SHAPE,
            argmax: true,
            mode: GatherMode::Auto,
            z0: &z0,
        });
        let ring_in = match batch {
            1 => 128,
            2..=8 => 192,
            _ => 256,
        };
        assert_eq!((pa.ring_in, pa.acc_ring), (ring_in, 128), "b{batch}");
        let plane = 512 * 128;
        assert_eq!(
            pa.accumulators,
            (128 * 14 * plane * 4 + 128 * plane * 4) as u64
        );
        assert_eq!(pa.input, (ring_in * plane * 2) as u64, "b{batch}");
        // The planner's estimate is the default plan's, whose window segments
        // (`plan::windowed`) hold less from batch 2.
        let bpw = buffer_plan(&g, batch, ROI, &ArchCaps::h200()).unwrap();
        assert!(bpw.arena < bp.arena || batch == 1);
        let e = estimate_on_target(&g, Target::Cuda, ROI, batch, &w).unwrap();
        assert_eq!(e.budgeted.total(), bpw.device_bytes() + pa.total());
        assert_eq!(e.budgeted.workspace, bpw.scratch_alloc());
        assert!(bp.single_window_alloc() >= (batch * 15 * vox * 4) as u64);
        assert!(e.budgeted.total() > last);
        last = e.budgeted.total();
        if batch == 4 {
            assert!(last < 2 << 30, "W1 at batch 4: {last}");
        }
    }
    let p = plan_at(&g, w, 2 << 30);
    eprintln!(
        "RESULT w1 --memory-budget 2GiB: roi {:?} batch {} windows {} predicted {} ({:.3} GiB)",
        p.roi,
        p.batch,
        p.windows,
        p.estimate.budgeted.total(),
        p.estimate.budgeted.total() as f64 / (1u64 << 30) as f64
    );
    assert!(p.estimate.budgeted.total() <= 2 << 30);
    assert_eq!(p.roi, ROI);
    assert!(p.batch >= 4, "{}", p.batch);
}

/// W4: the W1 net on 1024x1024x512 at `--memory-budget 4GiB`. The whole 1024x512 cross-section's
/// accumulator ring needs more than 4 GiB at batch 1 on 128³ windows, so the planner cuts H into
/// the fewest bands whose tallest fits: two bands of 576 rows (8 of the 15 H positions each, one
/// position run twice), the model's window kept.
#[test]
fn w4_runs_in_two_bands_at_4gib_on_the_models_window() {
    let g = w1_graph();
    let w = Workload {
        shape: [1024, 1024, 512],
        ..w1_workload()
    };
    let whole = estimate_on_target(&g, Target::Cuda, ROI, 1, &w).unwrap();
    assert!(
        whole.budgeted.total() > 4 << 30,
        "{}",
        whole.budgeted.total()
    );
    let p = plan_at(&g, w, 4 << 30);
    eprintln!(
        "RESULT w4 --memory-budget 4GiB: roi {:?} batch {} bands {} windows {} run {} predicted {} ({:.3} GiB; whole cross-section at batch 1 {:.3} GiB)",
        p.roi,
        p.batch,
        p.bands,
        p.windows,
        p.windows_run,
        p.estimate.budgeted.total(),
        p.estimate.budgeted.total() as f64 / (1u64 << 30) as f64,
        whole.budgeted.total() as f64 / (1u64 << 30) as f64,
    );
    assert_eq!(p.roi, ROI);
    assert_eq!(p.bands, 2);
    assert_eq!(p.windows, 15 * 15 * 7);
    assert_eq!(p.windows_run, 15 * 16 * 7);
    assert!(p.estimate.budgeted.total() <= 4 << 30);
    // The prediction is the tallest band's: the same volume cut to 576 rows.
    let band = Workload {
        shape: [1024, 576, 512],
        ..w
    };
    let e = estimate_on_target(&g, Target::Cuda, ROI, p.batch, &band).unwrap();
    assert_eq!(p.estimate.budgeted, e.budgeted);
}

/// The plan's scratch holds the fp32 partial sums of every split-K conv (its K tiles split over
/// several blocks): W1's 4^3 layers split at every batch, and `norm_sums` is at least
/// splits x rows x Cout x 4 bytes for each.
#[test]
fn split_k_partials_fit_the_scratch() {
    use voxtile::internals::cuda::host::conv_kernel::ConvKernel;
    let g = w1_graph();
    for batch in [1usize, 2, 4] {
        let bp = buffer_plan(&g, batch, ROI, &ArchCaps::h200()).unwrap();
        let mut split = 0;
        for l in &bp.launches {
            if let Some(ConvKernel::SplitK(_, ks)) = &l.conv {
                let o = bp.shapes[g.nodes[l.node].output];
                let need = ks * batch * o[1] * o[2] * o[3] * o[0] * 4;
                assert!(*ks > 1, "batch {batch}: a split of 1");
                assert!(
                    need <= bp.norm_sums,
                    "batch {batch}: {need} B of partials, scratch {} B",
                    bp.norm_sums
                );
                split += 1;
            }
        }
        assert!(split >= 2, "batch {batch}: {split} split-K convs");
    }
}
