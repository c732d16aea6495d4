//! The CPU memory model stays exact on graphs with tensor ops: its activation prediction equals
//! the executor's measured peak on the attention-like graph (elementwise ops and Softmax on
//! token tensors write new buffers there, so the model must not count them in place).

use crate::common::attention;
use crate::common::rng::Rng;
use ndarray::Array5;
use voxtile::backend::Backend;
use voxtile::internals::cpu::memory::cpu_activations;
use voxtile::internals::cpu::CpuBackend;

#[test]
fn cpu_prediction_equals_measured_peak_with_tensor_ops() {
    use attention::{C, SIDE};
    let g = attention::graph(&attention::params(3));
    let roi = [SIDE; 3];
    let mut r = Rng::new(5);
    let x = Array5::from_shape_vec([1, C, SIDE, SIDE, SIDE], r.vec(C * SIDE.pow(3))).unwrap();
    let mut b = CpuBackend::new();
    b.prepare(&g, 1, roi).unwrap();
    b.run(x.view()).unwrap();
    let measured = b.last_stats().peak_live_bytes as u64;
    let (pred, node, with_ws) = cpu_activations(&g, 1, roi).unwrap();
    eprintln!(
        "predicted {pred} measured {measured}, peak at {} ({})",
        node.name, node.op
    );
    assert_eq!(pred, measured);
    assert!(with_ws >= pred);
    // The peak is the Softmax over the [1, L, L] scores: its input, its new output and the
    // Gelu output still read later.
    let l = attention::L;
    assert_eq!(measured, ((2 * l * l + l * attention::H) * 4) as u64);
    assert_eq!(node.op, "Softmax");
}
