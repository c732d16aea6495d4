//! The MONAI sliding_window_inference fixture cases (shared/fixtures/sliding_window).
#![allow(dead_code)]

use ndarray::{Array3, Array4, Array5, ArrayView4, Axis, Ix5};
use std::path::PathBuf;
use voxtile::engine::{Engine, Options, Report};

/// One case of index.json with its model path and arrays loaded.
pub struct SwCase {
    pub id: String,
    pub model: PathBuf,
    pub x: Array5<f32>,
    pub want: Array5<f32>,
    /// The case's raw entry (roi, overlap, mode, sigma_scale, cval).
    pub case: serde_json::Value,
}

impl SwCase {
    /// Runs the case's model on its input with `options` (`keep_logits` set): (labels, logits,
    /// report).
    pub fn run(&self, options: Options) -> (Array3<u16>, Array4<f32>, Report) {
        let mut engine = Engine::from_file(&self.model, options).unwrap();
        let seg = engine
            .segment_array(self.x.index_axis(Axis(0), 0), &mut |_, _| {})
            .unwrap();
        (seg.labels, seg.logits.expect("keep_logits set"), seg.report)
    }

    /// MONAI's output for the one batch item.
    pub fn want(&self) -> ArrayView4<'_, f32> {
        self.want.index_axis(Axis(0), 0)
    }
}

/// A JSON number or 3-array as three f64.
pub fn triple(v: &serde_json::Value) -> [f64; 3] {
    match v {
        serde_json::Value::Array(a) => [0, 1, 2].map(|i| a[i].as_f64().unwrap()),
        x => [x.as_f64().unwrap(); 3],
    }
}

/// Every case in index.json; None (skip) when the fixture folder is absent.
pub fn sw_cases() -> Option<Vec<SwCase>> {
    let dir = super::shared("fixtures/sliding_window")?;
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let npy = |key: &serde_json::Value| {
        voxtile::internals::npy::read_f32(&dir.join(key.as_str().unwrap()))
            .unwrap()
            .into_dimensionality::<Ix5>()
            .unwrap()
    };
    let cases = index.as_array().unwrap().iter().map(|case| SwCase {
        id: case["id"].as_str().unwrap().to_string(),
        model: super::shared(&format!(
            "fixtures/models/{}",
            case["model"].as_str().unwrap()
        ))
        .unwrap(),
        x: npy(&case["input"]),
        want: npy(&case["output"]),
        case: case.clone(),
    });
    Some(cases.collect())
}
