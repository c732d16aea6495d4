//! The planner against the CUDA backend (run by the lead on the GPU machine; skipped without a GPU
//! unless VOXTILE_REQUIRE_GPU=1).
//!
//! How the planner matches the device: `CudaBackend::prepare` allocates exactly the host-only
//! `backend::cuda::host::buffers::buffer_plan` (activation arena, constants, norm scratch) and the planner
//! sums that same plan, so after `prepare` the tracked device bytes equal
//! `BufferPlan::device_bytes()` exactly and the arena equals `CudaBackend::activation_bytes()`;
//! the single-window API (`Backend::run`) adds its f32 staging on its first call
//! (`single_window_alloc()`); the whole prediction (plan plus pipeline buffers and ring) must be
//! ≥ `peak_device_bytes()` and within 15% (equal for W1).
//!
//! The OOM retries are compared on labels (or logits to a tolerance): a smaller batch may pick
//! other kernels for the small layers.

#[path = "../it/common/mod.rs"]
mod common;
use common::*;
use ndarray::Array4;
use voxtile::engine::{Device, Engine, Options};
use voxtile::internals::cuda::CudaBackend;
use voxtile::plan::{self, Target};

fn volume(shape: [usize; 3]) -> Array4<f32> {
    Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        ((i as f32 * 0.05).sin() + (j as f32 * 0.07).cos() * (k as f32 * 0.03).sin()) * 0.7
    })
}

#[test]
fn predicted_device_memory_matches_measured() {
    if !gpu_present() {
        return;
    }
    let mut models = vec![data("deepbrain.onnx")];
    models.extend(shared("fixtures/models/nnunet_small.onnx"));
    models.extend(shared("fixtures/models/monai_unet_small.onnx"));
    for model in models {
        for (shape, budget) in [([160, 160, 96], 2u64 << 30), ([256, 256, 128], 4 << 30)] {
            for keep_logits in [false, true] {
                let mut e = Engine::from_file(
                    &model,
                    Options {
                        device: Device::Cuda(0),
                        memory_budget: Some(budget),
                        keep_logits,
                        ..Options::default()
                    },
                )
                .unwrap();
                let vol = volume(shape);
                let r = e.segment_array(vol.view(), &mut |_, _| {}).unwrap().report;
                let est = r.predicted.clone().unwrap();
                let measured_act = r.measured_activation_bytes.unwrap();
                let pred = r.predicted_peak_bytes.device.unwrap();
                let peak = r.peak_device_bytes.unwrap();
                eprintln!(
                    "RESULT plan_gpu {} {shape:?} logits={keep_logits}: roi {:?} batch {} activations predicted {} measured {measured_act}; device predicted {pred} measured {peak} ({:+.1}%), budget {budget}",
                    model.file_name().unwrap().to_string_lossy(),
                    r.roi,
                    r.batch,
                    est.backend_activation_bytes,
                    100.0 * (pred as f64 / peak as f64 - 1.0)
                );
                // The planner sums the buffer plan the backend allocates: the pool is exact.
                assert_eq!(
                    est.backend_activation_bytes, measured_act,
                    "activation pool predicted vs measured"
                );
                assert!(pred >= peak, "prediction {pred} below measured {peak}");
                assert!(
                    pred as f64 <= 1.15 * peak as f64,
                    "prediction {pred} > 115% of {peak}"
                );
                assert!(peak <= budget);
            }
        }
    }
}

/// `prepare` allocates exactly the host-only buffer plan for this device: the tracked device
/// bytes after it equal `BufferPlan::device_bytes()`, the pool equals `activation_bytes()`, and
/// the planner's default (H200, sm_90) weights and workspace are not below this device's.
#[test]
fn prepare_allocates_exactly_the_buffer_plan() {
    use voxtile::internals::cuda::host::buffers::buffer_plan;
    use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
    if !gpu_present() {
        return;
    }
    let mut models = vec![data("deepbrain.onnx")];
    models.extend(shared("fixtures/models/nnunet_small.onnx"));
    models.extend(shared("fixtures/models/monai_unet_small.onnx"));
    let mut b = CudaBackend::new(0).unwrap();
    for model in models {
        let g = voxtile::model::onnx::load(&model).unwrap();
        let div = g.spatial_divisor();
        for (batch, roi) in [
            (1, div.map(|d| d * 2)),
            (3, div.map(|d| (96 / d).max(1) * d)),
        ] {
            b.prepare(&g, batch, roi).unwrap();
            let bp = buffer_plan(&g, batch, roi, &b.caps()).unwrap();
            let peak = b.peak_device_bytes().unwrap();
            eprintln!(
                "RESULT plan_gpu prepare {} b{batch} {roi:?}: plan {} tracked {peak} caps {:?}",
                model.file_name().unwrap().to_string_lossy(),
                bp.device_bytes(),
                b.caps()
            );
            assert_eq!(bp.device_bytes(), peak);
            assert_eq!(bp.activation_bytes(), b.activation_bytes() as u64);
            // The single-window API makes its staging once, on its first call, and its
            // outputs are finite (the arena's buffers do not clobber each other).
            let cin = g.input_channels();
            let x = ndarray::Array5::from_shape_fn(
                (batch, cin, roi[0], roi[1], roi[2]),
                |(n, c, i, j, k)| ((i * 7 + j * 3 + k + n + c) as f32 * 0.01).sin(),
            );
            for _ in 0..2 {
                let y = b.run(x.view()).unwrap();
                assert!(y.iter().all(|v| v.is_finite()));
                assert_eq!(
                    b.peak_device_bytes().unwrap(),
                    bp.device_bytes() + bp.single_window_alloc()
                );
            }
            let h = buffer_plan(&g, batch, roi, &ArchCaps::h200()).unwrap();
            assert!(h.const_alloc() >= bp.const_alloc());
            assert!(h.device_bytes() >= bp.device_bytes() || b.caps().sm_count > 132);
        }
    }
}

/// An injected OOM makes the engine retry the whole call at half the batch, never another window;
/// the labels equal an undisturbed run at that batch (logits compared to rel L2 ≤ 1e-6). At batch
/// 1 the OOM is an error naming the kept window.
#[test]
fn injected_oom_retry_on_gpu() {
    if !gpu_present() {
        return;
    }
    let Some(model) = shared("fixtures/models/nnunet_small.onnx") else {
        return;
    };
    let vol = volume([96, 96, 64]);
    let run = |batch: usize| {
        let mut e = Engine::from_file(
            &model,
            Options {
                device: Device::Cuda(0),
                roi: Some([32, 32, 32]),
                batch: Some(batch),
                keep_logits: true,
                ..Options::default()
            },
        )
        .unwrap();
        parts(e.segment_array(vol.view(), &mut |_, _| {}).unwrap())
    };
    let (l_ok, g_ok, _) = run(2);
    std::env::set_var("VOXTILE_INJECT_OOM", "2");
    let (l, g, r) = run(4);
    std::env::remove_var("VOXTILE_INJECT_OOM");
    assert_eq!(r.batch, 2, "{:?}", r.oom_retries);
    assert_eq!(r.roi, [32, 32, 32]);
    assert_eq!(r.oom_retries.len(), 1);
    let e = rel_l2(g.iter(), g_ok.iter());
    let agree = agreement(l.iter(), l_ok.iter());
    eprintln!("RESULT plan_gpu oom retry: rel L2 {e:.2e}, labels equal {agree}");
    assert!(e <= 1e-6 || agree == 1.0, "rel L2 {e} and labels {agree}");
    // Batch 1 (the injection fires once per process for each N: 1 is still unused here).
    let mut e1 = Engine::from_file(
        &model,
        Options {
            device: Device::Cuda(0),
            roi: Some([32, 32, 32]),
            batch: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    std::env::set_var("VOXTILE_INJECT_OOM", "1");
    let err = e1.segment_array(vol.view(), &mut |_, _| {}).unwrap_err();
    std::env::remove_var("VOXTILE_INJECT_OOM");
    assert!(
        matches!(err, voxtile::Error::OutOfMemory(_)),
        "expected OutOfMemory at batch 1, got {err}"
    );
    assert!(err.to_string().contains("[32, 32, 32]"), "{err}");
}

/// A real out-of-memory: the device is filled up to 800 MiB of free memory, then the engine runs
/// with an explicit 16 GiB budget (more than the device has left), so the planner picks a batch
/// (16: 1.43 GiB) whose buffers cannot be allocated; the engine halves the batch until it fits
/// and the labels equal an undisturbed run at the batch it ended with. A batch-1 run first
/// makes the driver's lazy per-context allocations (kernel stacks) before memory gets short.
#[test]
fn real_oom_with_a_budget_above_the_free_memory() {
    if !gpu_present() {
        return;
    }
    let Some(model) = shared("fixtures/models/nnunet_small.onnx") else {
        return;
    };
    let shape = [256, 256, 192];
    let vol = volume(shape);
    let engine = |batch: Option<usize>| {
        Engine::from_file(
            &model,
            Options {
                device: Device::Cuda(0),
                roi: Some([96, 96, 96]),
                batch,
                memory_budget: Some(16 << 30),
                ..Options::default()
            },
        )
        .unwrap()
    };
    engine(Some(1))
        .segment_array(volume([96, 96, 96]).view(), &mut |_, _| {})
        .unwrap();
    let mut e = engine(None);
    let planned = e.plan_for(shape).unwrap();
    use cudarc::driver::{result as cu, CudaContext};
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let (free, _) = cu::mem_get_info().unwrap();
    let keep = 800usize << 20;
    assert!(
        planned.estimate.budgeted.total() > keep as u64,
        "the plan ({} bytes) must not fit in the {keep} bytes left free",
        planned.estimate.budgeted.total()
    );
    // SAFETY: a plain allocation, freed below before the reference run.
    let hog = unsafe { cu::malloc_sync(free - keep) }.unwrap();
    let r = e.segment_array(vol.view(), &mut |_, _| {});
    // SAFETY: allocated above, not used by anything.
    unsafe { cu::free_sync(hog) }.unwrap();
    let (labels, _, report) = parts(r.unwrap());
    eprintln!(
        "RESULT plan_gpu real oom: planned batch {} -> ran at batch {} after {} retries ({:?})",
        planned.batch,
        report.batch,
        report.oom_retries.len(),
        report.oom_retries
    );
    assert!(!report.oom_retries.is_empty(), "no out-of-memory happened");
    assert!(report.batch < planned.batch);
    assert_eq!(report.roi, [96, 96, 96], "the window is never changed");
    let want = engine(Some(report.batch))
        .segment_array(vol.view(), &mut |_, _| {})
        .unwrap()
        .labels;
    let agree = agreement(labels.iter(), want.iter());
    eprintln!(
        "RESULT plan_gpu real oom: labels equal to an undisturbed run at that batch: {agree}"
    );
    assert_eq!(agree, 1.0);
}

/// The planner's CUDA activation replay needs no GPU; it is checked against the device above.
#[test]
fn cuda_plan_is_within_budget_for_the_demo_volume() {
    let Some(model) = shared("fixtures/models/nnunet_small.onnx") else {
        return;
    };
    let g = voxtile::model::onnx::load(&model).unwrap();
    let req = plan::Request {
        budget: 4 << 30,
        budget_explicit: true,
        user_roi: None,
        user_batch: None,
        workload: plan::Workload {
            shape: [1024, 1024, 512],
            overlap: [0.5; 3],
            placement: voxtile::tiling::Placement::Monai,
            keep_logits: false,
            copy_input: false,
        },
    };
    let p = choose_on(&g, Target::Cuda, &req).unwrap();
    assert!(p.estimate.budgeted.total() <= 4 << 30);
}

/// W1 (the nnU-Net CT net, built by `common::unet`) on the 512x512x128 benchmark volume with
/// `--memory-budget 2GiB`: the planner picks roi 128, batch 5 (its full-resolution ends one
/// window at a time, `plan::windowed`; 1.87 GiB), and the measured device peak equals the
/// prediction to the byte and stays under 2 GiB; the labels equal a batch-1 run's.
#[test]
fn w1_at_a_2gib_budget_is_exact_at_batch_5() {
    use prost::Message;
    if !gpu_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w1.onnx");
    let m = common::unet::plain_conv_unet(1, &common::unet::W1_FEATURES, 14);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let vol = volume([512, 512, 128]);
    let run = |budget: Option<u64>, batch: Option<usize>| {
        let mut e = Engine::from_file(
            &path,
            Options {
                device: Device::Cuda(0),
                memory_budget: budget,
                batch,
                roi: batch.map(|_| [128; 3]),
                ..Options::default()
            },
        )
        .unwrap();
        parts(e.segment_array(vol.view(), &mut |_, _| {}).unwrap())
    };
    let (labels, _, r) = run(Some(2 << 30), None);
    let pred = r.predicted_peak_bytes.device.unwrap();
    let peak = r.peak_device_bytes.unwrap();
    eprintln!(
        "RESULT plan_gpu w1 2GiB: roi {:?} batch {} predicted {pred} measured {peak}",
        r.roi, r.batch
    );
    assert_eq!((r.roi, r.batch), ([128; 3], 5));
    assert_eq!(pred, peak, "W1 prediction vs measured");
    assert!(peak <= 2 << 30);
    let (want, _, r1) = run(None, Some(1));
    assert_eq!(r1.batch, 1);
    let agree = agreement(labels.iter(), want.iter());
    eprintln!("RESULT plan_gpu w1 2GiB: labels equal to batch 1: {agree}");
    assert!(agree >= 0.999, "{agree}");
}

/// A budget one byte under the whole cross-section's need: the volume runs in bands along H, one
/// after another, on the model's window. The outputs are those of the whole pass (bitwise on
/// the CPU, `tests/it/engine/bands.rs`; here to the device's own repeatability: instance norms sum with
/// atomics), and the prediction (the tallest band's) bounds the measured peak as for one band.
#[test]
fn bands_under_a_tight_budget_match_the_whole_pass() {
    if !gpu_present() {
        return;
    }
    let mut models = vec![data("deepbrain.onnx")];
    models.extend(shared("fixtures/models/nnunet_small.onnx"));
    let shape = [64, 200, 48];
    let vol = volume(shape);
    for model in models {
        for keep_logits in [false, true] {
            let run = |budget: u64| {
                let o = Options {
                    device: Device::Cuda(0),
                    memory_budget: Some(budget),
                    roi: Some([32; 3]),
                    batch: Some(2),
                    keep_logits,
                    ..Options::default()
                };
                let mut e = Engine::from_file(&model, o).unwrap();
                let p = e.plan_for(shape).unwrap();
                let seg = e.segment_array(vol.view(), &mut |_, _| {}).unwrap();
                (p, parts(seg))
            };
            let (p1, (l1, g1, r1)) = run(8 << 30);
            assert_eq!(p1.bands, 1);
            let budget = p1.estimate.budgeted.total() - 1;
            let (p2, (l2, g2, r2)) = run(budget);
            let pred = r2.predicted_peak_bytes.device.unwrap();
            let peak = r2.peak_device_bytes.unwrap();
            let labels_differ = l1.iter().zip(&l2).filter(|(a, b)| a != b).count();
            let bits_differ = g1
                .iter()
                .zip(&g2)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let num: f64 = g1
                .iter()
                .zip(&g2)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let den: f64 = g1.iter().map(|a| (*a as f64).powi(2)).sum();
            let rel = (num / den.max(1e-30)).sqrt();
            eprintln!(
                "RESULT bands {} logits={keep_logits}: {} bands {:?}, {} windows run for {}; labels differ in {labels_differ} of {}, outputs bitwise different in {bits_differ} (rel L2 {rel:.2e}); device predicted {pred} measured {peak} (whole pass {}), budget {budget}",
                model.file_name().unwrap().to_string_lossy(),
                p2.bands,
                r2.bands,
                r2.windows_run,
                r2.windows,
                l1.len(),
                r1.peak_device_bytes.unwrap(),
            );
            assert!(p2.bands >= 2);
            assert_eq!(r2.bands.len(), p2.bands);
            assert_eq!(r2.roi, [32; 3]);
            assert!(r2.windows_run > r2.windows);
            assert!(
                pred <= budget && pred >= peak,
                "prediction {pred}, peak {peak}"
            );
            assert!(pred as f64 <= 1.15 * peak as f64);
            assert!(peak < r1.peak_device_bytes.unwrap());
            assert!(
                labels_differ * 10_000 <= l1.len(),
                "labels differ in {labels_differ}"
            );
            assert!(rel <= 1e-3, "outputs rel L2 {rel}");
        }
    }
}
