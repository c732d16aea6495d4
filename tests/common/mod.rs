//! Helpers shared by the integration tests: fixture paths and error norms.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared` next to the repo. CI sets VOXTILE_REQUIRE_FIXTURES=1 so a missing folder fails
/// there instead of skipping.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")).join(rel);
    if p.exists() {
        Some(p)
    } else if std::env::var_os("VOXTILE_REQUIRE_FIXTURES").is_some() {
        panic!(
            "fixture {} is missing and VOXTILE_REQUIRE_FIXTURES is set",
            p.display()
        );
    } else {
        eprintln!("skipping: fixture {} not found", p.display());
        None
    }
}

pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/data")).join(rel)
}

/// ‖a − b‖ / ‖b‖ in float64.
pub fn rel_l2<'a>(
    a: impl IntoIterator<Item = &'a f32>,
    b: impl IntoIterator<Item = &'a f32>,
) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    let mut n = 0usize;
    for (x, y) in a.into_iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        num += (x - y) * (x - y);
        den += y * y;
        n += 1;
    }
    assert!(n > 0, "rel_l2 of empty arrays");
    assert!(num.is_finite(), "non-finite values in the compared arrays");
    (num / den.max(1e-300)).sqrt()
}

/// A fresh temporary folder removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn voxtile_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_voxtile"))
}
