//! The CUDA backend on the real fixtures: PyTorch outputs of the exported models, MONAI's sliding
//! window, the deepbrain sample against onnxruntime and (when present) the trained MeshNet.
//! fp16 bounds: rel L2 ≤ 1e-2, argmax agreement ≥ 99.9%. Skips without a GPU unless
//! VOXTILE_REQUIRE_GPU=1 (tests/gpu/run.sh sets it on the GPU machine).

use crate::common::sw::*;
use crate::common::*;
use ndarray::{Axis, Ix5};
use voxtile::engine::{Device, Engine, Options};
use voxtile::internals::cuda::{CudaBackend, CudaOptions};
use voxtile::tiling::{argmax, BlendMode, PadMode, Placement};

#[test]
fn fixture_models_match_pytorch_on_gpu() {
    if !gpu_present() {
        return;
    }
    let Some(dir) = shared("fixtures/models") else {
        return;
    };
    for model in ["nnunet_small", "monai_unet_small"] {
        let g = voxtile::model::onnx::load(dir.join(format!("{model}.onnx"))).unwrap();
        let x = voxtile::internals::npy::read_f32(&dir.join(format!("{model}_input.npy")))
            .unwrap()
            .into_dimensionality::<Ix5>()
            .unwrap();
        let want =
            voxtile::internals::npy::read_f32(&dir.join(format!("{model}_output.npy"))).unwrap();
        let mut b = CudaBackend::new(0).unwrap();
        b.set_options(CudaOptions {
            poison: true,
            ..*b.options()
        });
        let s = x.shape();
        b.prepare(&g, s[0], [s[2], s[3], s[4]]).unwrap();
        let got = b.run(x.view()).unwrap();
        assert_eq!(got.shape(), want.shape());
        let e = rel_l2(got.iter(), want.iter());
        let want5 = want.view().into_dimensionality::<Ix5>().unwrap();
        let mut agree = Vec::new();
        for n in 0..s[0] {
            let a = argmax(got.index_axis(Axis(0), n)).unwrap();
            let b = argmax(want5.index_axis(Axis(0), n)).unwrap();
            agree.push(agreement(a.iter(), b.iter()));
        }
        let agree = agree.iter().sum::<f64>() / agree.len() as f64;
        println!(
            "RESULT gpu model {model}: rel L2 vs PyTorch {e:.3e}, argmax agreement {agree:.5}"
        );
        assert!(e <= 1e-2, "{model}: rel L2 {e}");
        assert!(agree >= 0.999, "{model}: argmax agreement {agree}");
    }
}

#[test]
fn sliding_window_fixtures_on_gpu() {
    if !gpu_present() {
        return;
    }
    let Some(cases) = sw_cases() else {
        return;
    };
    for c in cases {
        let (id, case) = (&c.id, &c.case);
        let options = Options {
            roi: Some(triple(&case["roi"]).map(|v| v as usize)),
            overlap: triple(&case["overlap"]),
            blend: if case["mode"] == "gaussian" {
                BlendMode::Gaussian
            } else {
                BlendMode::Constant
            },
            sigma_scale: triple(&case["sigma_scale"]),
            placement: Placement::Monai,
            batch: Some(2),
            pad: PadMode::Constant(0.0),
            device: Device::Cuda(0),
            keep_logits: true,
            ..Options::default()
        };
        let (labels, logits, report) = c.run(options);
        let want = c.want();
        let e = rel_l2(logits.iter(), want.iter());
        let agree = agreement(labels.iter(), argmax(want).unwrap().iter());
        println!(
            "RESULT gpu sliding window {id}: {} windows, rel L2 vs MONAI {e:.3e}, argmax agreement {agree:.5}, gpu {}",
            report.windows,
            report.gpu.as_ref().map(|g| g.to_string()).unwrap_or_default()
        );
        // The report names each layer's kernel and its family: every conv has one.
        let layers = report
            .gpu
            .as_ref()
            .and_then(|g| g["layers"].as_array().cloned());
        let layers = layers.unwrap_or_else(|| panic!("{id}: no gpu.layers in the report"));
        let convs: Vec<_> = layers
            .iter()
            .filter(|l| l["layer"].as_str().is_some_and(|s| s.starts_with("Conv")))
            .collect();
        assert!(!convs.is_empty(), "{id}: no conv layer in {layers:?}");
        for l in convs {
            assert!(
                l["family"].is_string() && l["launches"].as_u64() >= Some(1),
                "{id}: {l}"
            );
        }
        assert!(e <= 1e-2, "{id}: rel L2 {e}");
        assert!(agree >= 0.999, "{id}: agreement {agree}");
    }
}

#[test]
fn deepbrain_sample_on_gpu() {
    if !gpu_present() {
        return;
    }
    let input = voxtile::volume::read(data("mni_t1_128.nii.gz")).unwrap();
    let ort = voxtile::volume::read(data("mni_t1_128_prob_ort.nii.gz")).unwrap();
    let options = Options {
        device: Device::Cuda(0),
        keep_logits: true,
        ..Options::default()
    };
    let mut engine = Engine::from_file(data("deepbrain.onnx"), options).unwrap();
    let seg = engine.segment(&input).unwrap();
    let prob = seg.logits.unwrap();
    let e = rel_l2(prob.iter(), ort.data.iter());
    let ort_mask = ort.data.mapv(|p| (p > 0.5) as u16);
    let agree = agreement(seg.labels.iter(), ort_mask.iter());
    println!("RESULT gpu deepbrain sample: prob rel L2 vs onnxruntime {e:.3e}, mask agreement {agree:.6}");
    assert!(e <= 1e-2);
    assert!(agree >= 0.999);
}

#[test]
fn meshnet_on_gpu_when_present() {
    if !gpu_present() {
        return;
    }
    // Licence unknown: only read from the shared folder, never shipped.
    let Some(dir) = optional_shared("fixtures/trained_meshnet") else {
        eprintln!("skipping: no MeshNet fixture");
        return;
    };
    let input = voxtile::volume::read(dir.join("t1_crop_meshnet_input.nii.gz")).unwrap();
    let want = voxtile::volume::read(dir.join("meshnet20_t1crop_ort_labels.nii.gz")).unwrap();
    let options = Options {
        device: Device::Cuda(0),
        roi: Some([256; 3]),
        ..Options::default()
    };
    let mut engine = Engine::from_file(dir.join("meshnet20_trained.onnx"), options).unwrap();
    let seg = engine.segment(&input).unwrap();
    let want = want.data.index_axis(Axis(0), 0).mapv(|v| v as u16);
    let agree = agreement(seg.labels.iter(), want.iter());
    let differ = seg
        .labels
        .iter()
        .zip(want.iter())
        .filter(|(a, b)| a != b)
        .count();
    println!("RESULT gpu meshnet 256^3: label agreement {agree:.6} ({differ} voxels differ)");
    assert!(agree >= 0.9999, "meshnet agreement {agree}");
}
