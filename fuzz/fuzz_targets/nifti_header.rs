//! Any bytes → the NIfTI reader (header parse, size checks, data read). Every input must return
//! Ok or Err: a panic, an abort, a hang or a large allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = voxtile::volume::read_bytes(data, Path::new("fuzz.nii")) {
        // What the CLI does next with a volume: describe it and look at its geometry.
        let _ = voxtile::volume::describe(Path::new("fuzz.nii"), &v);
        let _ = v.header.affine();
        assert_eq!(v.data.len(), v.channels() * v.shape().iter().product::<usize>());
    }
});
