//! fp16 and bf16 models (tests/fixtures/half, made by make.py there): the files PyTorch's
//! `model.half()` export, a bfloat16 export and onnxconverter-common's float16 conversion give,
//! against onnxruntime (CPU) on the same file and input. The CPU backend computes in f32 between
//! the points where the model stores half values (its half input and output) and rounds there,
//! as onnxruntime's CPU does; CUDA stores every activation in fp16. Skips the GPU part without a
//! GPU unless VOXTILE_REQUIRE_GPU=1.

use crate::common::*;
use ndarray::{Array5, Ix5};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/half")
        .join(name)
}

fn npy(name: &str) -> Array5<f32> {
    voxtile::internals::npy::read_f32(&fixture(name))
        .unwrap()
        .into_dimensionality::<Ix5>()
        .unwrap()
}

/// The spacing of representable values of the stored type at `v`: 2^-10 (float16, 11-bit
/// significand) or 2^-7 (bfloat16, 8 bits) of its binade, taken at |v| >= 2^-4. The outputs here
/// are O(1-10): below that a difference comes from cancelling sums, whose f32 noise (~1e-6) is
/// many units of a tiny value's spacing without meaning anything.
fn ulp(v: f32, bits: i32) -> f32 {
    2f32.powf(v.abs().max(0.0625).log2().floor() - bits as f32)
}

/// Fraction of elements equal to the reference, and the largest difference in units of the
/// stored type's spacing at the reference.
fn compare(got: &Array5<f32>, want: &Array5<f32>, bits: i32) -> (f64, f32) {
    assert_eq!(got.shape(), want.shape());
    let equal = got.iter().zip(want).filter(|(a, b)| a == b).count();
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / ulp(*b, bits))
        .fold(0f32, f32::max);
    (equal as f64 / want.len() as f64, worst)
}

/// (file, onnxruntime's output, significand bits of the stored output type).
const CASES: &[(&str, &str, i32)] = &[
    ("fp16.onnx", "fp16_ort.npy", 10),
    ("bf16.onnx", "bf16_ort.npy", 7),
];

/// CPU against onnxruntime: the same f32 arithmetic between the same rounding points, so the
/// outputs are the same half values; summation order (f32, ~1e-7) may move a value sitting on a
/// rounding boundary to its neighbour: at most one unit of the stored type, and rarely. Without the
/// rounding at the output almost no element would be equal (f32 values against half values); without
/// it at the input the input's rounding error (2^-11) would move many.
#[test]
fn half_models_on_the_cpu_match_onnxruntime() {
    let x = npy("input.npy");
    for &(file, reference, bits) in CASES {
        let g = voxtile::model::onnx::load(fixture(file)).expect("loads");
        let got = voxtile::internals::cpu::run_graph(&g, x.view()).expect("runs");
        let got = got.into_dimensionality::<Ix5>().unwrap();
        let (equal, worst) = compare(&got, &npy(reference), bits);
        println!("RESULT cpu {file}: {equal:.4} equal to onnxruntime, worst {worst} unit(s)");
        assert!(worst <= 1.0, "{file}: {worst} units of the stored type off");
        assert!(
            equal >= 0.99,
            "{file}: only {equal:.4} equal to onnxruntime"
        );
    }
}

/// onnxconverter-common's keep_io_types=True file (Casts at the input and the output, float32 I/O):
/// onnxruntime's CPU drops the Cast pairs it would make around its f32 kernels, so its result is the
/// f32 net on the half weights; the CPU reference follows it (a Cast is a precision hint).
#[test]
fn converted_model_with_f32_io_on_the_cpu_matches_onnxruntime() {
    let g = voxtile::model::onnx::load(fixture("fp16_io32.onnx")).expect("loads");
    let got = voxtile::internals::cpu::run_graph(&g, npy("input.npy").view()).expect("runs");
    let e = rel_l2(got.iter(), npy("fp16_io32_ort.npy").iter());
    println!("RESULT cpu fp16_io32.onnx: rel L2 {e:.2e} against onnxruntime");
    assert!(e <= 1e-6, "rel L2 {e:.3e}");
}

/// CUDA against onnxruntime: every activation is stored in fp16 (each layer's output rounded,
/// where onnxruntime's CPU rounds only at the I/O), so the conv sums differ by a few fp16 units:
/// rel L2 ~4e-4 in a float64 simulation of that storage (make.py's net, numpy), bar 2e-3. In the
/// bf16 file the bfloat16 Cast between the convs turns those fp16 differences into whole bf16 units
/// (2^-8) where a value sits near a bf16 boundary, ~1 element in 8: rel L2 ~4e-3 simulated, bar
/// 1e-2 (the bar of every model's fp16 path, tests/it/model/archs.rs).
#[test]
fn half_models_on_the_gpu_match_onnxruntime() {
    let Some(mut b) = cuda_backend() else {
        return;
    };
    let x = npy("input.npy");
    let s = x.shape().to_vec();
    let mut bad = vec![];
    for (file, reference, bar) in [
        ("fp16.onnx", "fp16_ort.npy", 2e-3),
        ("fp16_io32.onnx", "fp16_io32_ort.npy", 2e-3),
        ("bf16.onnx", "bf16_ort.npy", 1e-2),
    ] {
        let g = voxtile::model::onnx::load(fixture(file)).expect("loads");
        b.prepare(&g, s[0], [s[2], s[3], s[4]]).unwrap();
        let got = b.run(x.view()).unwrap();
        let e = rel_l2(got.iter(), npy(reference).iter());
        println!("RESULT gpu {file}: rel L2 {e:.2e} against onnxruntime (bar {bar:.0e})");
        if e > bar {
            bad.push(format!(
                "{file}: rel L2 {e:.3e} against onnxruntime, over {bar:.0e}"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// deepbrain as onnxconverter-common's `convert_float_to_float16(keep_io_types=False)` gives it
/// (float16 initializers, input and output; deepbrain has no op it keeps in float32), made here
/// from the committed fp32 file.
fn deepbrain_fp16(out: &Path) {
    use prost::Message;
    use voxtile::internals::proto;
    let mut m = proto::ModelProto::decode(&bytes(&data("deepbrain.onnx"))[..]).unwrap();
    let g = m.graph.as_mut().unwrap();
    for t in g.initializer.iter_mut().filter(|t| t.data_type() == 1) {
        let f32s: Vec<f32> = match &t.raw_data {
            Some(raw) => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            None => t.float_data.clone(),
        };
        let raw: Vec<u8> = f32s
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        (t.data_type, t.raw_data, t.float_data) = (Some(10), Some(raw.into()), vec![]);
    }
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        if let Some(proto::type_proto::Value::TensorType(t)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.elem_type = Some(10);
        }
    }
    std::fs::write(out, m.encode_to_vec()).unwrap();
}

/// The CLI segments with an fp16 file (half I/O, half weights), says so in `inspect`, and its
/// answer is the fp32 model's within the contract's bars: probabilities rel L2 <= 1e-2 against
/// onnxruntime on the fp32 file (fp16 weights and I/O: ~1e-3), mask agreement >= 99.9%.
#[test]
fn fp16_deepbrain_segments_from_the_cli() {
    let dir = tempdir();
    let model = dir.path().join("deepbrain_fp16.onnx");
    deepbrain_fp16(&model);
    let o = voxtile(&["inspect", s(&model)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("storage:           float16 weights, float16 I/O"),
        "{text}"
    );
    let (mask, prob) = (dir.path().join("m.nii.gz"), dir.path().join("p.nii.gz"));
    let input = data("mni_t1_128.nii.gz");
    let o = segment_cpu(&input, &model, &mask, &["--logits", s(&prob)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ort = voxtile::volume::read(data("mni_t1_128_prob_ort.nii.gz")).unwrap();
    let (mask, prob) = (
        voxtile::volume::read(&mask).unwrap(),
        voxtile::volume::read(&prob).unwrap(),
    );
    let e = rel_l2(prob.data.iter(), ort.data.iter());
    let agree = mask
        .data
        .iter()
        .zip(ort.data.iter())
        .filter(|(m, p)| (**m > 0.5) == (**p > 0.5))
        .count() as f64
        / ort.data.len() as f64;
    println!("RESULT cli deepbrain fp16: rel L2 {e:.2e} against fp32 onnxruntime, mask agreement {agree:.5}");
    assert!(e <= 1e-2, "rel L2 {e:.3e}");
    assert!(agree >= 0.999, "mask agreement {agree:.5}");
    let brain = mask.data.iter().filter(|m| **m > 0.5).count();
    assert!(
        brain > mask.data.len() / 20,
        "a brain mask, not empty: {brain}"
    );
}
