//! A volume whose cross-section's accumulators do not fit the budget runs in bands along H, one
//! after another: labels and blended outputs must be bitwise those of the whole pass, and the
//! planner must choose the fewest bands that fit (never a smaller window).

use crate::common::*;
use ndarray::{Array3, Array4};
use std::path::{Path, PathBuf};
use voxtile::engine::{AxisOrder, Device, Engine, Options, Report};
use voxtile::tiling::{PadMode, Placement};
use voxtile::Error;

fn smooth(shape: [usize; 3]) -> Array4<f32> {
    Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        ((i as f32 * 0.31).sin() * (j as f32 * 0.23).cos() + (k as f32 * 0.27).sin()) * 0.8
            + 0.05 * ((i * 5 + j * 7 + k) % 13) as f32
    })
}

fn nnunet() -> Option<PathBuf> {
    shared("fixtures/models/nnunet_small.onnx")
}

type Run = (Array3<u16>, Array4<f32>, Report);

/// The run at `budget` (None: a budget that holds everything); its plan's band count too.
fn run(model: &Path, o: &Options, budget: Option<u64>, vol: &Array4<f32>) -> (Run, usize) {
    let o = Options {
        memory_budget: Some(budget.unwrap_or(1 << 40)),
        ..o.clone()
    };
    let mut e = Engine::from_file(model, o.clone()).unwrap();
    let net_shape = |s: &[usize]| match o.axis_order {
        AxisOrder::Xyz => [s[1], s[2], s[3]],
        AxisOrder::Zyx => [s[3], s[2], s[1]],
    };
    let plan = e.plan_for(net_shape(vol.shape())).unwrap();
    let mut calls = Vec::new();
    let r = e
        .segment_array(vol.view(), &mut |d, t| calls.push((d, t)))
        .map(parts)
        .unwrap();
    // Progress counts every window run (those near a cut twice), ends at the total, never
    // goes back.
    let last = *calls.last().unwrap();
    assert_eq!(last, (r.2.windows_run, r.2.windows_run));
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    // The plan counts the windows of one device (a split among devices runs more).
    if r.2.parts.is_empty() {
        assert_eq!(plan.windows_run, r.2.windows_run);
    }
    (r, plan.bands)
}

/// The budget the whole cross-section needs at the options' batch (its plan's prediction).
fn whole_need(model: &Path, o: &Options, shape: [usize; 3]) -> u64 {
    let o = Options {
        memory_budget: Some(1 << 40),
        ..o.clone()
    };
    let p = Engine::from_file(model, o)
        .unwrap()
        .plan_for(shape)
        .unwrap();
    assert_eq!(p.bands, 1);
    p.estimate.budgeted.total()
}

/// The least budget the planner asks for (the thinnest bands), from its refusal of 1 byte.
fn least_need(model: &Path, o: &Options, shape: [usize; 3]) -> u64 {
    let o = Options {
        memory_budget: Some(1),
        ..o.clone()
    };
    match Engine::from_file(model, o).unwrap().plan_for(shape) {
        Err(Error::BudgetTooSmall { needed, .. }) => needed,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Bitwise the same labels and outputs; the banded report's rows tile H exactly.
fn same(whole: &Run, banded: &Run, bands: usize) {
    assert_eq!(whole.0, banded.0, "labels differ");
    assert_eq!(whole.1.shape(), banded.1.shape());
    let bits = |a: &Array4<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(&whole.1) == bits(&banded.1), "blended outputs differ");
    // The outputs are not trivial (so equality means something).
    assert!(whole.1.is_empty() || whole.1.iter().any(|&v| v != whole.1[[0, 0, 0, 0]]));
    let r = &banded.2;
    // Network H is the file's j in either axis order.
    let h = r.input_shape[1];
    assert_eq!(whole.2.bands, vec![[0, h]]);
    assert_eq!(r.bands.len(), bands);
    assert_eq!(r.bands[0][0], 0);
    assert_eq!(r.bands.last().unwrap()[1], h);
    for w in r.bands.windows(2) {
        assert_eq!(w[0][1], w[1][0]);
    }
    assert_eq!(r.windows, whole.2.windows);
    assert!(r.windows_run > r.windows, "windows near a cut run twice");
    assert_eq!(r.roi, whole.2.roi, "the window is never shrunk");
}

fn opts() -> Options {
    Options {
        roi: Some([16, 16, 16]),
        batch: Some(1),
        keep_logits: true,
        ..Options::default()
    }
}

#[test]
fn fewest_bands_that_fit_are_bitwise_the_whole_pass() {
    let Some(m) = nnunet() else { return };
    // 72 rows of roi 16 at stride 8: 8 H positions.
    let shape = [24, 72, 20];
    let vol = smooth(shape);
    for keep_logits in [true, false] {
        let o = Options {
            keep_logits,
            ..opts()
        };
        let (whole, n) = run(&m, &o, None, &vol);
        assert_eq!(n, 1);
        assert!(
            whole.0.iter().any(|&l| l != whole.0[[0, 0, 0]]),
            "trivial labels"
        );
        let need = whole_need(&m, &o, shape);
        // One byte short of the whole cross-section: two bands.
        let (two, n) = run(&m, &o, Some(need - 1), &vol);
        assert_eq!(n, 2);
        same(&whole, &two, 2);
        // The least budget the planner names runs, in more bands.
        let least = least_need(&m, &o, shape);
        assert!(
            least < need - 1,
            "thinner bands need less: {least} vs {need}"
        );
        let (thin, n) = run(&m, &o, Some(least), &vol);
        assert!(n > 2, "{n} bands");
        same(&whole, &thin, n);
        // The prediction that ran is under the budget.
        let p = thin.2.predicted.as_ref().unwrap();
        assert!(p.budgeted.total() <= least);
        if !keep_logits {
            assert_eq!(thin.1.shape()[0], 0);
        }
    }
}

#[test]
fn bands_with_placement_axis_order_padding_batches_and_devices() {
    let Some(m) = nnunet() else { return };
    // nnU-Net placement, batch 3, zyx axes (network H is the file's j), edge padding along the
    // network D (10 < 16): one D position.
    let vol = smooth([61, 58, 10]);
    let o = Options {
        batch: Some(3),
        placement: Placement::NnUnet,
        axis_order: AxisOrder::Zyx,
        pad: PadMode::Edge,
        ..opts()
    };
    let net = [10, 58, 61];
    let (whole, _) = run(&m, &o, None, &vol);
    let (banded, n) = run(&m, &o, Some(whole_need(&m, &o, net) - 1), &vol);
    assert!(n >= 2);
    same(&whole, &banded, n);
    // Bands shared between two CPU workers along D (40 planes: several D positions).
    let vol = smooth([40, 58, 20]);
    let mut o2 = opts();
    o2.set_devices(&[Device::Cpu, Device::Cpu]);
    let (whole, _) = run(&m, &o2, None, &vol);
    let (banded, n) = run(&m, &o2, Some(whole_need(&m, &o2, [40, 58, 20]) - 1), &vol);
    assert!(n >= 2);
    same(&whole, &banded, n);
    assert_eq!(banded.2.parts.len(), 2 * n, "two devices in every band");
    for p in &banded.2.parts {
        assert!(banded.2.bands.contains(&p.rows));
    }
}

#[test]
fn one_channel_model_and_an_injected_oom() {
    let m = data("deepbrain.onnx");
    let vol = smooth([24, 64, 24]).mapv(|v| v * 0.5 + 0.5);
    let o = Options {
        batch: Some(2),
        ..opts()
    };
    let (whole, _) = run(&m, &o, None, &vol);
    let budget = whole_need(&m, &o, [24, 64, 24]) - 1;
    // The 2nd backend call fails once: the whole volume is redone at batch 1, still in bands.
    let injected = Options {
        inject_oom: Some(2),
        ..o.clone()
    };
    let (banded, n) = run(&m, &injected, Some(budget), &vol);
    assert!(n >= 2);
    same(&whole, &banded, n);
    assert_eq!(banded.2.oom_retries.len(), 1, "{:?}", banded.2.oom_retries);
    assert_eq!(banded.2.batch, 1);
}

#[test]
fn a_volume_with_one_h_position_is_refused_not_banded() {
    let m = data("deepbrain.onnx");
    // H 12 < roi 16: one H position, nothing to cut; under its need the planner refuses.
    let o = opts();
    let need = whole_need(&m, &o, [40, 12, 24]);
    assert_eq!(least_need(&m, &o, [40, 12, 24]), need);
}
