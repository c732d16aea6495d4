//! The memory planner: prediction vs the CPU executor's measured liveness, monotone in the budget,
//! never over it, the model's window kept whatever the budget, a clear error when too small, and
//! the `voxtile plan` command.

use crate::common::*;
use ndarray::{Array4, Array5};
use std::process::Command;
use voxtile::backend::Backend;
use voxtile::engine::{Device, Engine, Options};
use voxtile::internals::cpu::CpuBackend;
use voxtile::model::Graph;
use voxtile::plan::{self, Request, Target};

/// Every architecture fixture and then the models of [`models`]: what the plan tests check
/// their rules over.
pub(super) fn fixtures_and_models() -> Vec<(String, Graph)> {
    let mut nets: Vec<(String, Graph)> = crate::common::arch_fixtures()
        .into_iter()
        .map(|(name, g, _)| (name, g))
        .collect();
    nets.extend(models());
    nets
}

pub(super) fn models() -> Vec<(String, Graph)> {
    let mut v = Vec::new();
    for name in ["nnunet_small.onnx", "monai_unet_small.onnx"] {
        if let Some(p) = shared(&format!("fixtures/models/{name}")) {
            v.push((name.into(), voxtile::model::onnx::load(&p).unwrap()));
        }
    }
    v.push((
        "deepbrain.onnx".into(),
        voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap(),
    ));
    v
}

/// Smooth, non-constant input.
fn input(n: usize, c: usize, r: [usize; 3]) -> Array5<f32> {
    Array5::from_shape_fn((n, c, r[0], r[1], r[2]), |(b, ch, i, j, k)| {
        ((i as f32 * 0.31 + b as f32).sin()
            + (j as f32 * 0.17 + ch as f32).cos() * (k as f32 * 0.07).sin())
            * 0.8
    })
}

/// The planner's activation prediction equals what the CPU executor measures (it replays the same
/// liveness); the requirement is ≥ measured and within 15%.
#[test]
fn cpu_prediction_matches_measured_liveness() {
    for (name, g) in models() {
        let div = g.spatial_divisor();
        let rois = [div.map(|d| d * 2), [div[0] * 3, div[1] * 2, div[2] * 4]];
        for roi in rois {
            for batch in [1, 2] {
                let mut b = CpuBackend::new();
                b.prepare(&g, batch, roi).unwrap();
                b.run(input(batch, g.input_channels(), roi).view()).unwrap();
                let measured = b.last_stats().peak_live_bytes as u64;
                let (pred, node, with_ws) =
                    voxtile::internals::cpu::memory::cpu_activations(&g, batch, roi).unwrap();
                eprintln!(
                    "{name} roi {roi:?} batch {batch}: predicted {pred} measured {measured}, peak at {} ({}), with workspace {with_ws}",
                    node.name, node.op
                );
                assert!(pred >= measured, "{name}: prediction below measured");
                assert!(
                    pred as f64 <= measured as f64 * 1.15,
                    "{name}: prediction {pred} more than 15% over {measured}"
                );
                assert!(with_ws >= pred);
                let e =
                    estimate_on_target(&g, Target::Cpu, roi, batch, &workload([64; 3])).unwrap();
                assert_eq!(e.budgeted.activations, pred);
                assert_eq!(e.backend_activation_bytes, pred);
            }
        }
    }
}

/// Activations scale with the batch exactly (every value has N = batch).
#[test]
fn activations_scale_with_batch() {
    for (name, g) in models() {
        let roi = g.spatial_divisor().map(|d| d * 2);
        let (a1, _, _) = voxtile::internals::cpu::memory::cpu_activations(&g, 1, roi).unwrap();
        let (a3, _, _) = voxtile::internals::cpu::memory::cpu_activations(&g, 3, roi).unwrap();
        assert_eq!(a3, 3 * a1, "{name}");
        let (c1, r1, _, _) =
            voxtile::internals::cuda::memory::cuda_activations(&g, 1, roi).unwrap();
        let (c4, r4, _, _) =
            voxtile::internals::cuda::memory::cuda_activations(&g, 4, roi).unwrap();
        // Never more than the batch times one window's (less where segments run one window
        // at a time: `plan::windowed`).
        assert!(
            r4 <= 4 * r1 && r4 > r1,
            "{name}: fp16 pool scales with the batch"
        );
        assert!(c4 >= r4 && c1 >= r1);
        // fp16 pool vs f32 liveness: never more buffers than values, so at most the f32 total of
        // all values / 2 and at least the f32 peak / 2 minus in-place savings.
        let shapes = g.infer_shapes(1, roi).unwrap();
        let all: u64 = shapes
            .iter()
            .map(|s| s.iter().product::<usize>() as u64 * 2)
            .sum();
        assert!(r1 <= all, "{name}: pool {r1} > all values {all}");
    }
}

fn sweep(g: &Graph, target: Target, shape: [usize; 3]) -> Vec<(u64, plan::Plan)> {
    let mut out = Vec::new();
    let mut budget = 16u64 << 20;
    while budget <= 64 << 30 {
        let req = Request {
            budget,
            budget_explicit: true,
            user_roi: None,
            user_batch: None,
            workload: workload(shape),
        };
        if let Ok(p) = choose_on(g, target, &req) {
            out.push((budget, p));
        }
        budget = budget * 3 / 2;
    }
    out
}

/// Modelled run time of a plan, recomputed here from its definition: every launch costs its
/// voxels, on CUDA at least one 128³ window's worth.
fn modelled_cost(target: Target, p: &plan::Plan) -> u64 {
    let rv = p.roi.iter().product::<usize>() as u64;
    match target {
        Target::Cpu => p.windows as u64 * rv,
        Target::Cuda => (0..p.windows)
            .step_by(p.batch)
            .map(|s| ((p.windows - s).min(p.batch) as u64 * rv).max(1 << 21))
            .sum(),
    }
}

/// The window is the model's default at every budget (only the batch is planned); more budget
/// never makes the plan slower (modelled cost), never gives fewer voxels per batch on the CPU,
/// and on CUDA never fewer than one saturated launch (128³) or the previous launch; a plan never
/// predicts more than its budget.
#[test]
fn planner_is_monotone_and_within_budget() {
    for (name, g) in models() {
        let div = g.spatial_divisor();
        for target in [Target::Cpu, Target::Cuda] {
            for shape in [[200, 180, 96], [512, 512, 128], [64, 64, 64]] {
                let plans = sweep(&g, target, shape);
                assert!(plans.len() > 5, "{name}: too few feasible budgets");
                let mut prev: Option<(u64, u64)> = None;
                for (budget, p) in &plans {
                    let total = p.estimate.budgeted.total();
                    assert!(total <= *budget, "{name}: {total} over budget {budget}");
                    assert_eq!(
                        p.roi,
                        plan::default_roi(&g, shape),
                        "{name}: window changed"
                    );
                    for a in 0..3 {
                        assert_eq!(p.roi[a] % div[a], 0, "{name}: roi {:?}", p.roi);
                        assert!(p.roi[a] <= 128.max(div[a]));
                        assert!(
                            p.roi[a] < shape[a] + div[a],
                            "{name}: roi beyond the volume"
                        );
                    }
                    assert!((1..=16).contains(&p.batch) && p.batch <= p.windows);
                    let vpb = p.batch as u64 * p.roi.iter().product::<usize>() as u64;
                    let cost = modelled_cost(target, p);
                    if let Some((pv, pc)) = prev {
                        let at = format!(
                            "{name} {target:?} {shape:?} budget {budget}: roi {:?} batch {}",
                            p.roi, p.batch
                        );
                        assert!(cost <= pc, "{at}: modelled cost {cost} > {pc}");
                        match target {
                            Target::Cpu => assert!(vpb >= pv, "{at}: {vpb} < {pv} voxels/batch"),
                            Target::Cuda => assert!(
                                vpb >= pv.min(1 << 21),
                                "{at}: {vpb} voxels/batch < min({pv}, 128³)"
                            ),
                        }
                    }
                    prev = Some((vpb, cost));
                }
                let last = &plans.last().unwrap().1;
                eprintln!(
                    "{name} {target:?} {shape:?}: {} budgets, largest plans roi {:?} batch {}",
                    plans.len(),
                    last.roi,
                    last.batch
                );
            }
        }
    }
}

#[test]
fn too_small_budget_is_a_clear_error() {
    for (name, g) in models() {
        for target in [Target::Cpu, Target::Cuda] {
            let req = Request {
                budget: 1 << 20,
                budget_explicit: true,
                user_roi: None,
                user_batch: None,
                workload: workload([256, 256, 128]),
            };
            let e = choose_on(&g, target, &req).unwrap_err().to_string();
            let roi = plan::default_roi(&g, req.workload.shape);
            // The least any plan at that window needs: batch 1 in the thinnest bands along H.
            let model = model_of(target);
            let need = plan::estimate(&g, model.as_ref(), &req.workload, roi, 1, usize::MAX)
                .unwrap()
                .budgeted
                .total();
            let whole = estimate_on_target(&g, target, roi, 1, &req.workload)
                .unwrap()
                .budgeted
                .total();
            assert!(need < whole, "{name}: thinner bands need less");
            // It names the model's window and what batch 1 at that window needs.
            assert!(
                e.contains("too small")
                    && e.contains(&format!("{roi:?}"))
                    && e.contains(&format!("needs {}", plan::format_bytes(need))),
                "{name}: {e}"
            );
            // The minimum it names is really the smallest: a budget of that size works, at the
            // same window.
            let ok = choose_on(
                &g,
                target,
                &Request {
                    budget: need,
                    ..req.clone()
                },
            )
            .unwrap();
            assert!(ok.estimate.budgeted.total() <= need, "{name}");
            assert_eq!((ok.roi, ok.batch), (roi, 1), "{name}");
            assert!(ok.bands > 1, "{name}");
            // One byte less is refused.
            let less = Request {
                budget: need - 1,
                ..req.clone()
            };
            assert!(choose_on(&g, target, &less).is_err(), "{name}");
        }
    }
}

/// A user's roi is kept (only the batch is planned); a user's roi + batch over an explicit budget
/// is an error, over the default budget a warning.
#[test]
fn user_roi_only_sets_the_batch() {
    let g = voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap();
    let base = Request {
        budget: 2 << 30,
        budget_explicit: true,
        user_roi: Some([64, 64, 64]),
        user_batch: None,
        workload: workload([256, 256, 256]),
    };
    let p = choose_on(&g, Target::Cuda, &base).unwrap();
    assert_eq!(p.roi, [64, 64, 64]);
    assert!(p.batch > 1);
    let tight = Request {
        user_batch: Some(16),
        budget: p.estimate.budgeted.total() / 2,
        ..base.clone()
    };
    assert!(choose_on(&g, Target::Cuda, &tight).is_err());
    let p = choose_on(
        &g,
        Target::Cuda,
        &Request {
            budget_explicit: false,
            ..tight
        },
    )
    .unwrap();
    assert!(p.warning.is_some() && p.batch == 16);
    // A roi that is not a multiple of the divisor is refused.
    let bad = Request {
        user_roi: Some([60, 64, 64]),
        ..base
    };
    assert!(choose_on(&g, Target::Cuda, &bad).is_err());
}

/// Through the engine on the CPU: the planned run stays within the budget as measured by the
/// executor, and the report carries prediction and measurement.
#[test]
fn engine_runs_within_the_budget() {
    let g = voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap();
    let shape = [40, 48, 56];
    let req = Request {
        budget: 64 << 20,
        budget_explicit: true,
        user_roi: None,
        user_batch: None,
        workload: workload(shape),
    };
    let p = choose_on(&g, Target::Cpu, &req).unwrap();
    let mut e = Engine::new(
        g,
        Options {
            device: Device::Cpu,
            memory_budget: Some(64 << 20),
            ..Options::default()
        },
    )
    .unwrap();
    let vol = Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        ((i * 7 + j * 3 + k) % 11) as f32 / 11.0
    });
    let seg = e.segment_array(vol.view(), &mut |_, _| {}).unwrap();
    let (labels, r) = (seg.labels, seg.report);
    assert_eq!(labels.shape(), &shape);
    assert!(seg.logits.is_none(), "logits are not kept");
    assert_eq!((r.roi, r.batch), (p.roi, p.batch));
    assert_eq!(r.plan, "planned");
    let pred = r.predicted.as_ref().unwrap();
    let measured = r.measured_activation_bytes.unwrap();
    assert!(measured > 0 && measured <= pred.budgeted.activations);
    assert!(pred.budgeted.total() <= 64 << 20);
    assert_eq!(r.predicted_peak_bytes.host, pred.predicted_host());
    assert!(r.predicted_peak_bytes.device.is_none());
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["predicted_peak_bytes"]["host"].as_u64().unwrap() > 0);
}

#[test]
fn plan_command_prints_a_summary_and_json() {
    let model = data("deepbrain.onnx");
    let out = Command::new(voxtile_bin())
        .args(["plan", "--model"])
        .arg(&model)
        .args([
            "--volume",
            "512x512x128",
            "--memory-budget",
            "2GiB",
            "--device",
            "cuda",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "roi",
        "batch",
        "windows",
        "weights",
        "activations",
        "workspace",
        "staging",
        "accumulators",
        "total",
        "budget",
        "activation peak at node",
    ] {
        assert!(text.contains(word), "missing {word} in:\n{text}");
    }
    let out = Command::new(voxtile_bin())
        .args(["plan", "--model"])
        .arg(&model)
        .args([
            "--volume",
            "512x512x128",
            "--memory-budget",
            "2GiB",
            "--device",
            "cpu",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let roi: Vec<u64> = v["roi"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(roi.iter().all(|r| r % 8 == 0 && *r <= 128));
    let total: u64 = [
        "weights",
        "activations",
        "workspace",
        "staging",
        "accumulators",
    ]
    .iter()
    .map(|k| v["estimate"]["budgeted"][k].as_u64().unwrap())
    .sum();
    assert!(total <= 2 << 30);
    assert_eq!(v["budget"].as_u64().unwrap(), 2 << 30);
    // Too small: one error line naming the model and the minimum.
    let out = Command::new(voxtile_bin())
        .args(["plan", "--model"])
        .arg(&model)
        .args([
            "--volume",
            "512x512x128",
            "--memory-budget",
            "1MiB",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("deepbrain.onnx") && err.contains("too small") && err.contains("needs"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1);
    // Bad sizes are refused.
    let out = Command::new(voxtile_bin())
        .args(["plan", "--model"])
        .arg(&model)
        .args(["--volume", "512x512", "--memory-budget", "4XB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// The CUDA prediction is the backend's own buffer plan: weights, activations and plan
/// workspace equal the sums (256-byte floor each) of what `CudaBackend::prepare` allocates,
/// activations scale exactly with the batch, the rest is independent of it, and the plan
/// never aliases a buffer that is still needed.
#[test]
fn cuda_prediction_is_the_backend_buffer_plan() {
    use voxtile::internals::cuda::host::buffers::buffer_plan;
    use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
    let floor = |b: usize| b.max(256) as u64;
    let h200 = ArchCaps::h200();
    for (name, g) in models() {
        let div = g.spatial_divisor();
        let rois = [
            div.map(|d| d * 2),
            [div[0] * 3, div[1] * 2, div[2] * 4],
            div.map(|d| (64 / d).max(1) * d),
        ];
        for roi in rois {
            let mut last_total = 0;
            let one = buffer_plan(&g, 1, roi, &h200).unwrap();
            for batch in [1, 2, 3, 5] {
                let bp = buffer_plan(&g, batch, roi, &h200).unwrap();
                let e = estimate_on_target(&g, Target::Cuda, roi, batch, &workload([160, 160, 96]))
                    .unwrap();
                let consts: u64 = bp.consts.iter().map(|c| floor(c.bytes)).sum();
                // One arena holds every buffer at its offset: no smaller than the most bytes
                // live at one launch, no larger than all buffers side by side.
                let acts = floor(bp.arena);
                let peak_live = bp.launches.iter().map(|l| l.live_bytes).max().unwrap_or(0);
                assert!(bp.arena >= peak_live, "{name} {roi:?} b{batch}");
                assert!(bp.arena <= bp.bufs.iter().map(|&b| b.div_ceil(256) * 256).sum());
                // The single-window API's staging is not part of the prepared plan.
                let scratch: u64 = [bp.norm_sums, bp.norm_ab].iter().map(|&b| floor(b)).sum();
                assert_eq!(e.budgeted.weights, consts, "{name} {roi:?} b{batch}");
                assert_eq!(e.budgeted.activations, acts, "{name} {roi:?} b{batch}");
                assert_eq!(e.budgeted.workspace, scratch, "{name} {roi:?} b{batch}");
                assert_eq!(bp.device_bytes(), consts + acts + scratch);
                assert_eq!(e.backend_activation_bytes, bp.arena as u64);
                assert_eq!(
                    bp.single_window_alloc(),
                    floor(bp.stage_in) + floor(bp.stage_out)
                );
                // fp16 NCDHW per sample: the input buffer and stage_in follow the batch.
                let cin = g.input_channels();
                let rv: usize = roi.iter().product();
                assert_eq!(bp.bufs[bp.input_buf], batch * cin * rv * 2);
                assert_eq!(bp.stage_in, batch * cin * rv * 4);
                // Every buffer scales with the batch; constants do not depend on it.
                assert_eq!(bp.bufs.len(), one.bufs.len());
                // A buffer a window segment has to itself holds one window (`plan::windowed`).
                let segs = bp.windows.any(bp.launches.len());
                for (b, b1) in bp.bufs.iter().zip(&one.bufs) {
                    assert!(
                        *b == batch * b1 || (segs && b == b1),
                        "{name}: buffer sizes scale with the batch"
                    );
                }
                assert_eq!(
                    bp.consts, one.consts,
                    "{name}: constants independent of batch"
                );
                let total = e.budgeted.total();
                assert!(total > last_total, "{name}: prediction monotone in batch");
                last_total = total;
                assert!(e.peak_node.live_bytes <= e.backend_activation_bytes);
                check_no_alias(&name, &g, &bp);
            }
        }
        // Other devices: the H200 default is never below a smaller sm_80+ part or the legacy
        // (pre-sm_80) path, whose weights are padded to 64 columns instead of 128.
        let roi = div.map(|d| d * 2);
        let w = workload([160, 160, 96]);
        let d = estimate_on_target(&g, Target::Cuda, roi, 2, &w).unwrap();
        for caps in [
            ArchCaps::new(8, 6, 84, 99 * 1024),
            ArchCaps::new(7, 5, 40, 64 * 1024),
        ] {
            let m = voxtile::internals::cuda::memory::CudaMemory { caps, device: 0 };
            let o = voxtile::plan::MemoryModel::estimate(&m, &g, roi, 2, &w).unwrap();
            assert!(
                d.budgeted.total() >= o.budgeted.total(),
                "{name} vs {caps:?}"
            );
            assert_eq!(d.budgeted.activations, o.budgeted.activations);
        }
    }
}

/// Independent check of the arena: walking the launches in order with each value live from its
/// launch until every node reading it has run (itself or fused into a launch), no launch writes
/// memory (its buffer's byte range in the arena) that overlaps another live value's (except the
/// channel slices of one concat, which share its buffer by design, and a view that reuses its
/// input's buffer and writes nothing), and every buffer lies inside the arena.
pub(super) fn check_no_alias(
    name: &str,
    g: &Graph,
    bp: &voxtile::internals::cuda::host::buffers::BufferPlan,
) {
    let mut readers = vec![Vec::new(); g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &v in &n.inputs {
            readers[v].push(i);
        }
    }
    // Concat group of a value: the concat node it is written into, or its own node.
    let group = |v: usize| -> Option<usize> {
        if bp.in_place[v] {
            g.nodes.iter().position(|n| {
                n.inputs.contains(&v) && matches!(n.op, voxtile::model::graph::Op::Concat { .. })
            })
        } else {
            g.nodes
                .iter()
                .position(|n| n.output == v)
                .filter(|&j| matches!(g.nodes[j].op, voxtile::model::graph::Op::Concat { .. }))
        }
    };
    let stored: Vec<_> = (0..g.values.len()).map(|v| bp.stored(v)).collect();
    let mut ran = vec![false; g.nodes.len()];
    let mut live: Vec<usize> = vec![g.input];
    for l in &bp.launches {
        let view = voxtile::internals::cuda::host::tensor_layout::aliases(g, &stored, l.node);
        // (A fused node reads its producer's output, which is never materialised.)
        let ins = match l.part {
            Some(_) => l.reads(g),
            None => g.nodes[l.node].inputs.clone(),
        };
        for v in ins {
            assert!(bp.value_buf[v].is_some(), "{name}: input {v} has no buffer");
        }
        let range = |b: usize| (bp.offsets[b], bp.offsets[b] + bp.bufs[b]);
        let (o0, o1) = range(l.out_buf);
        assert!(
            o1 <= bp.arena,
            "{name}: buffer {} outside the arena",
            l.out_buf
        );
        for &v in &live {
            let vb = bp.value_buf[v].unwrap();
            let (v0, v1) = range(vb);
            if v != l.out_v && !view && v0 < o1 && o0 < v1 {
                let shared = vb == l.out_buf && group(v).is_some() && group(v) == group(l.out_v);
                assert!(
                    shared,
                    "{name}: node {} writes buffer {} over live value {v} (buffer {vb})",
                    g.nodes[l.node].name, l.out_buf
                );
            }
        }
        for j in l.nodes() {
            ran[j] = true;
        }
        // A split conv's concat runs with its parts (it is never written).
        if l.part.is_some() {
            let x = g.nodes[l.node].inputs[0];
            if let Some(j) = g.nodes.iter().position(|n| n.output == x) {
                ran[j] = true;
            }
        }
        live.push(l.out_v);
        live.retain(|&v| v == g.output || readers[v].iter().any(|&k| !ran[k]));
    }
    assert_eq!(bp.value_buf[g.output], Some(bp.output_buf));
}

/// A hostile shape cannot stall the planner in the band search: a million rows of 16-row windows
/// (125000 H positions) under a budget too small for the whole cross-section is refused at once
/// (no bands past `MAX_BAND_POSITIONS`), and a real wide volume is cut within `MAX_BANDS`.
#[test]
fn band_search_is_bounded() {
    let g = voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap();
    let req = |shape: [usize; 3], budget: u64| Request {
        budget,
        budget_explicit: true,
        user_roi: Some([16; 3]),
        user_batch: None,
        workload: workload(shape),
    };
    let t = std::time::Instant::now();
    let e = choose_on(&g, Target::Cpu, &req([16, 1_000_000, 16], 1 << 20)).unwrap_err();
    assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
    assert!(e.to_string().contains("too small"), "{e}");
    // 2000 rows of 16: 249 positions, a budget for about a tenth of the cross-section.
    let shape = [16, 2000, 64];
    let whole = estimate_on_target(&g, Target::Cpu, [16; 3], 1, &workload(shape))
        .unwrap()
        .budgeted
        .total();
    let p = choose_on(&g, Target::Cpu, &req(shape, whole / 4)).unwrap();
    assert!(p.bands > 1 && p.bands <= plan::MAX_BANDS, "{}", p.bands);
    assert!(p.estimate.budgeted.total() <= whole / 4);
}
