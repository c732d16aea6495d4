//! Conformance: the CPU backend against PyTorch's fp32 outputs of the exported fixture models.

use crate::common::*;
use voxtile::internals::cpu::run_graph;
use voxtile::model::onnx::load;

fn check(model: &str, tol: f64) {
    let Some(dir) = shared("fixtures/models") else {
        return;
    };
    let g = load(dir.join(format!("{model}.onnx"))).expect("model loads");
    let x = voxtile::internals::npy::read_f32(&dir.join(format!("{model}_input.npy"))).unwrap();
    let want = voxtile::internals::npy::read_f32(&dir.join(format!("{model}_output.npy"))).unwrap();
    let x = x.into_dimensionality::<ndarray::Ix5>().unwrap();
    let got = run_graph(&g, x.view()).expect("runs");
    assert_eq!(got.shape(), want.shape(), "{model}: output shape");
    let e = rel_l2(got.iter(), want.iter());
    eprintln!("{model}: rel L2 vs PyTorch = {e:.3e}");
    assert!(e <= tol, "{model}: rel L2 {e:.3e} > {tol:e}");
}

#[test]
fn nnunet_small_matches_pytorch() {
    check("nnunet_small", 1e-5);
}

#[test]
fn monai_unet_small_matches_pytorch() {
    check("monai_unet_small", 1e-5);
}
