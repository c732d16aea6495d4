//! Engine-level behaviour on the CPU: axis order, placement, padding, roi rules.

use crate::common::*;
use ndarray::{Array4, Axis};
use voxtile::engine::{AxisOrder, Device, Engine, Options};
use voxtile::tiling::{PadMode, Placement};

fn smooth(shape: [usize; 3]) -> Array4<f32> {
    Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        ((i as f32 * 0.31).sin() * (j as f32 * 0.17).cos() + (k as f32 * 0.23).sin()) * 0.5 + 0.5
    })
}

fn engine(o: Options) -> Engine {
    Engine::from_file(
        data("deepbrain.onnx"),
        Options {
            device: Device::Cpu,
            keep_logits: true,
            ..o
        },
    )
    .unwrap()
}

#[test]
fn zyx_axis_order_is_the_transposed_problem() {
    let vol = smooth([24, 16, 40]);
    let opts = Options {
        roi: Some([16, 16, 16]),
        ..Options::default()
    };
    // zyx on the file == xyz on the volume with its spatial axes reversed, then reversed back.
    let (lz, pz, rz) = engine(Options {
        axis_order: AxisOrder::Zyx,
        ..opts.clone()
    })
    .segment_array(vol.view(), &mut |_, _| {})
    .map(parts)
    .unwrap();
    let rev = vol.view().permuted_axes([0, 3, 2, 1]).to_owned();
    let (lx, px, _) = engine(opts)
        .segment_array(rev.view(), &mut |_, _| {})
        .map(parts)
        .unwrap();
    assert_eq!(rz.input_shape, [40, 16, 24], "network axes are k,j,i");
    assert_eq!(
        lz.shape(),
        &[24, 16, 40],
        "labels come back on the file's grid"
    );
    assert_eq!(lz, lx.permuted_axes([2, 1, 0]));
    assert_eq!(pz, px.permuted_axes([0, 3, 2, 1]));
    // And it differs from xyz on this anisotropic-window problem (the test can fail).
    let (_, p_xyz, _) = engine(Options {
        roi: Some([16, 16, 16]),
        ..Options::default()
    })
    .segment_array(vol.view(), &mut |_, _| {})
    .map(parts)
    .unwrap();
    assert!(rel_l2(p_xyz.iter(), pz.iter()) > 1e-6);
}

#[test]
fn nnunet_placement_and_edge_padding_cover_every_voxel() {
    // Volume smaller than the roi along one axis (padding) and uneven along others.
    let vol = smooth([20, 40, 9]);
    for placement in [Placement::Monai, Placement::NnUnet] {
        for pad in [PadMode::Constant(0.0), PadMode::Edge] {
            let o = Options {
                roi: Some([16, 16, 16]),
                placement,
                pad,
                ..Options::default()
            };
            let (labels, probs, report) =
                parts(engine(o).segment_array(vol.view(), &mut |_, _| {}).unwrap());
            assert_eq!(labels.shape(), &[20, 40, 9]);
            assert_eq!(probs.shape(), &[1, 20, 40, 9]);
            assert!(
                probs
                    .iter()
                    .all(|p| p.is_finite() && (0.0..=1.0).contains(p)),
                "{placement:?} {pad:?}"
            );
            assert!(report.windows >= 2 * 3);
        }
    }
}

#[test]
fn single_window_equals_plain_network_run() {
    // With one window covering the volume, blending must return the network's output itself.
    let vol = smooth([16, 24, 32]);
    let (_, probs, report) = engine(Options {
        roi: Some([16, 24, 32]),
        ..Options::default()
    })
    .segment_array(vol.view(), &mut |_, _| {})
    .map(parts)
    .unwrap();
    assert_eq!(report.windows, 1);
    let g = voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap();
    let direct = voxtile::internals::cpu::run_graph(&g, vol.view().insert_axis(Axis(0))).unwrap();
    let e = rel_l2(probs.iter(), direct.index_axis(Axis(0), 0).iter());
    assert!(e < 1e-6, "single window vs direct run: {e}");
}

#[test]
fn roi_rules() {
    let e = engine(Options::default());
    assert_eq!(e.roi_for([128, 128, 128]).unwrap(), [128, 128, 128]);
    assert_eq!(
        e.roi_for([300, 20, 3]).unwrap(),
        [128, 24, 8],
        "clipped to the volume, rounded up to 8"
    );
    let bad = engine(Options {
        roi: Some([12, 16, 16]),
        ..Options::default()
    });
    let msg = bad.roi_for([64, 64, 64]).unwrap_err().to_string();
    assert!(msg.contains("multiple of"), "{msg}");
}
