//! A transformer export traced at batch 1 (the SwinUNETR fixture, freed of its batch at load)
//! runs several windows per backend call through the engine, and its blended logits and labels
//! are bit for bit those of one window per call.

use crate::common::rng::Rng;
use ndarray::Array4;
use std::path::Path;
use voxtile::engine::{Device, Engine, Options};

#[test]
fn swin_fixture_runs_batched_through_the_engine() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/archs/swinunetr_legacy.onnx");
    // 70 x 64 x 72 at roi 64, overlap 0.5: 2 x 1 x 2 windows, so batch 3 runs 3 + 1.
    let shape = [70, 64, 72];
    let mut r = Rng::tagged("engine_batched_swin");
    let vol = Array4::from_shape_vec(
        [1, shape[0], shape[1], shape[2]],
        r.vec(shape.iter().product()),
    )
    .unwrap();
    let run = |batch: usize| {
        let o = Options {
            roi: Some([64; 3]),
            batch: Some(batch),
            device: Device::Cpu,
            keep_logits: true,
            ..Options::default()
        };
        let seg = Engine::from_file(&model, o)
            .unwrap()
            .segment_array(vol.view(), &mut |_, _| {})
            .unwrap();
        assert_eq!(seg.report.windows, 4);
        assert_eq!(
            seg.report.batch, batch,
            "the planner keeps the batch asked for"
        );
        seg
    };
    let (one, three) = (run(1), run(3));
    let bits = |s: &voxtile::engine::Segmentation| {
        let l = s.logits.as_ref().expect("logits kept");
        l.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(bits(&one), bits(&three), "blended logits differ");
    assert_eq!(one.labels, three.labels);
}
