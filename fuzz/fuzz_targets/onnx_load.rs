//! Any bytes → ONNX decode + lowering to the graph IR; a model that loads is then validated,
//! shape-inferred for a small window (multiple of its spatial divisor) and summarised, as
//! `voxtile inspect` and `segment` do. Errors are fine; panics, hangs and OOM are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = voxtile::model::onnx::load_bytes(data, None, Path::new("fuzz.onnx")) else {
        return;
    };
    if g.validate().is_err() {
        return;
    }
    let div = g.spatial_divisor();
    // Smallest multiple of the divisor that is at least 8, but never a huge window.
    let w = div.map(|d| if d == 0 || d > 64 { 8 } else { d * 8_usize.div_ceil(d) });
    let _ = g.infer_shapes(1, w);
    let _ = g.receptive_field();
    let _ = g.param_count();
    let _ = g.flops(1, w);
    let _ = g.summary();
});
