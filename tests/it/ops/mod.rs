//! One op-case table for both backends, as candle's `test_device!` does: a case (the op, its
//! inputs, a float64 reference from [`reference`], a tolerance per backend) is written once and
//! [`test_device!`] runs it on the CPU backend in f32 (and the same graph in f64) and on CUDA in
//! fp16. The CUDA instantiation (`*_cuda_f16`) skips without a GPU unless VOXTILE_REQUIRE_GPU=1.
//! Adding an elementwise op: one row in `eltwise.rs`. `pad.rs` (Pad, Tile, Expand from ONNX) checks
//! the CPU in f32 and f64 and CUDA against the same float64 reference.

pub mod eltwise;
pub mod norm;
pub mod pad;
pub mod reference;

use ndarray::Array5;
use voxtile::internals::cpu::{run_graph, run_graph_f64};
use voxtile::internals::cuda::CudaBackend;
use voxtile::model::graph::Graph;

/// The bound on ‖got − want‖ / ‖want‖ on each backend.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub cpu_f32: f64,
    pub cpu_f64: f64,
    pub cuda_f16: f64,
}

/// The bounds the cases meet unless a row says otherwise: f32 1e-5, f64 1e-12, fp16 1e-2.
pub const TOL: Tol = Tol {
    cpu_f32: 1e-5,
    cpu_f64: 1e-12,
    cuda_f16: 1e-2,
};

/// The backend a case runs on.
pub enum Device {
    Cpu,
    Cuda(Box<CudaBackend>),
}

impl Device {
    /// CUDA device 0 with its activation buffers poisoned (NaN first, so an unwritten element
    /// fails); None without a GPU, a failure instead under VOXTILE_REQUIRE_GPU=1.
    pub fn cuda() -> Option<Device> {
        let mut b = crate::common::cuda_backend()?;
        let mut o = *b.options();
        o.poison = true;
        b.set_options(o);
        Some(Device::Cuda(Box::new(b)))
    }

    /// Runs `g` on `x` (its batch and window as `g` is prepared for) and checks the output
    /// against `want` within this backend's bound of `tol`.
    pub fn check(&mut self, name: &str, g: &Graph, x: &Array5<f32>, want: &Array5<f64>, tol: Tol) {
        match self {
            Device::Cpu => {
                let got32 = run_graph(g, x.view()).unwrap_or_else(|e| panic!("{name}: {e}"));
                let got64 = run_graph_f64(g, x.mapv(f64::from).view())
                    .unwrap_or_else(|e| panic!("{name}: f64: {e}"));
                let e32 = rel_l2(&got32.mapv(f64::from), want);
                let e64 = rel_l2(&got64, want);
                println!("RESULT cpu {name:<44} f32 rel L2 {e32:.2e}  f64 rel L2 {e64:.2e}");
                assert!(e32 <= tol.cpu_f32, "{name}: f32 rel L2 {e32:e}");
                assert!(e64 <= tol.cpu_f64, "{name}: f64 rel L2 {e64:e}");
            }
            Device::Cuda(b) => {
                let s = x.shape();
                b.prepare(g, s[0], [s[2], s[3], s[4]])
                    .unwrap_or_else(|e| panic!("{name}: prepare: {e}"));
                let got = b
                    .run(x.view())
                    .unwrap_or_else(|e| panic!("{name}: run: {e}"));
                let e = rel_l2(&got.mapv(f64::from), want);
                let tol = tol.cuda_f16;
                println!(
                    "RESULT {name:<44} rel_l2 {e:.2e} {}",
                    if e <= tol { "ok" } else { "FAIL" }
                );
                assert!(e <= tol, "{name}: rel L2 {e:.3e} > {tol}");
            }
        }
    }
}

/// ‖got − want‖ / ‖want‖; every output finite and the reference not all zeros (a test against
/// zeros would prove nothing).
pub fn rel_l2(got: &Array5<f64>, want: &Array5<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape(), "output shape");
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        assert!(
            g.is_finite(),
            "non-finite output {g} (unwritten or overflow)"
        );
        num += (g - w) * (g - w);
        den += w * w;
    }
    assert!(den > 0.0, "the reference is all zeros");
    (num / den).sqrt()
}

/// `test_device!(case, case_cpu_f32, case_cuda_f16)`: the tests that run `fn case(&mut Device)`
/// on the CPU backend and on CUDA device 0 (skipped without a GPU unless VOXTILE_REQUIRE_GPU=1).
macro_rules! test_device {
    ($case:ident, $cpu:ident, $cuda:ident) => {
        #[test]
        fn $cpu() {
            $case(&mut $crate::ops::Device::Cpu);
        }

        #[test]
        fn $cuda() {
            if let Some(mut d) = $crate::ops::Device::cuda() {
                $case(&mut d);
            }
        }
    };
}
pub(crate) use test_device;
