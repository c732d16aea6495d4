//! Conformance: tiler + blender + CPU backend against MONAI 1.6.1 sliding_window_inference.

use crate::common::sw::*;
use crate::common::*;
use voxtile::engine::{Device, Options};
use voxtile::tiling::{BlendMode, PadMode, Placement};

#[test]
fn monai_sliding_window_fixtures() {
    let Some(cases) = sw_cases() else {
        return;
    };
    assert!(cases.len() >= 3);
    for c in cases {
        let (id, case) = (&c.id, &c.case);
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
        let (_, logits, report) = c.run(options);
        let want = c.want();
        assert_eq!(logits.shape(), want.shape(), "{id}: shape");
        let e = rel_l2(logits.iter(), want.iter());
        eprintln!(
            "{id}: {} windows, rel L2 vs MONAI = {e:.3e}",
            report.windows
        );
        assert!(e <= 1e-5, "{id}: rel L2 {e:.3e} > 1e-5");
    }
}
