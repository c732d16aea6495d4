//! Conformance: tiler + blender + CPU backend against MONAI 1.6.1 sliding_window_inference.

mod common;
use common::*;
use ndarray::{Axis, Ix5};
use voxtile::engine::{Device, Engine, Options};
use voxtile::tiling::{BlendMode, PadMode, Placement};

fn triple(v: &serde_json::Value) -> [f64; 3] {
    match v {
        serde_json::Value::Array(a) => [
            a[0].as_f64().unwrap(),
            a[1].as_f64().unwrap(),
            a[2].as_f64().unwrap(),
        ],
        x => [x.as_f64().unwrap(); 3],
    }
}

#[test]
fn monai_sliding_window_fixtures() {
    let Some(dir) = shared("fixtures/sliding_window") else {
        return;
    };
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let cases = index.as_array().unwrap();
    assert!(cases.len() >= 3);
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let model = shared(&format!(
            "fixtures/models/{}",
            case["model"].as_str().unwrap()
        ))
        .unwrap();
        let x = voxtile::npy::read_f32(&dir.join(case["input"].as_str().unwrap()))
            .unwrap()
            .into_dimensionality::<Ix5>()
            .unwrap();
        let want = voxtile::npy::read_f32(&dir.join(case["output"].as_str().unwrap()))
            .unwrap()
            .into_dimensionality::<Ix5>()
            .unwrap();
        let roi = triple(&case["roi"]).map(|v| v as usize);
        let options = Options {
            roi: Some(roi),
            overlap: triple(&case["overlap"]),
            blend: match case["mode"].as_str().unwrap() {
                "gaussian" => BlendMode::Gaussian,
                "constant" => BlendMode::Constant,
                m => panic!("unexpected mode {m}"),
            },
            sigma_scale: triple(&case["sigma_scale"]),
            placement: Placement::Monai,
            batch: Some(2),
            pad: PadMode::Constant(case["cval"].as_f64().unwrap() as f32),
            device: Device::Cpu,
            keep_logits: true,
            ..Options::default()
        };
        let mut engine = Engine::from_file(&model, options).unwrap();
        let (_, logits, report) = engine
            .segment_array(x.index_axis(Axis(0), 0), &mut |_, _| {})
            .unwrap();
        let want = want.index_axis(Axis(0), 0);
        assert_eq!(logits.shape(), want.shape(), "{id}: shape");
        let e = rel_l2(logits.iter(), want.iter());
        eprintln!(
            "{id}: {} windows, rel L2 vs MONAI = {e:.3e}",
            report.windows
        );
        assert!(e <= 1e-5, "{id}: rel L2 {e:.3e} > 1e-5");
    }
}
