//! Helpers shared by the integration tests: fixture paths and error norms.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared` next to the repo. CI sets VOXTILE_REQUIRE_FIXTURES=1 so a missing folder fails
/// there instead of skipping.
pub fn shared(rel: &str) -> Option<PathBuf> {
    // VOXTILE_SHARED_DIR: where the GPU machine finds the copy carried in .dev/ (no ../shared there).
    let root = std::env::var_os("VOXTILE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")));
    let p = root.join(rel);
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
    let root = std::env::var_os("VOXTILE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/data")));
    root.join(rel)
}

/// Optional fixtures (e.g. the MeshNet whose licence keeps it out of the repo): skip when absent.
pub fn optional_shared(rel: &str) -> Option<PathBuf> {
    let root = std::env::var_os("VOXTILE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")));
    let p = root.join(rel);
    p.exists().then_some(p)
}

/// Fraction of equal elements.
pub fn agreement<'a>(
    a: impl IntoIterator<Item = &'a u16>,
    b: impl IntoIterator<Item = &'a u16>,
) -> f64 {
    let (mut same, mut n) = (0usize, 0usize);
    for (x, y) in a.into_iter().zip(b) {
        same += (x == y) as usize;
        n += 1;
    }
    same as f64 / n.max(1) as f64
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
