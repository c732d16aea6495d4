//! Post-processing and statistics from the command line, on a model whose answer is known: a
//! 1x1x1 Conv with weights (-1, 1) labels 1 exactly where the input is above 0, so the label
//! map before post-processing is the input's sign, and every step's effect can be counted.

use crate::common::nifti::{f32_data, nifti, Geo};
use crate::common::onnx::{ftensor, model_with, node_with, vi_ncdhw};
use crate::common::{assert_one_error, s, segment_cpu, tempdir};
use prost::Message;
use std::path::{Path, PathBuf};

/// Voxels along each axis, and their size in mm (one voxel: 0.008 mL).
const N: usize = 24;
const MM: f32 = 2.0;

/// The "sign" model: background score -x, class 1 score x.
fn sign_model(dir: &Path) -> PathBuf {
    let m = model_with(
        "sign",
        17,
        vec![node_with("Conv", "conv", &["x", "w", "b"], &["y"], vec![])],
        vec![
            ftensor("w", &[2, 1, 1, 1, 1], [-1.0, 1.0]),
            ftensor("b", &[2], [0.0, 0.0]),
        ],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", Some(2))],
    );
    let p = dir.join("sign.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

/// Where a voxel (x, y, z) lies: in the big cube (2..12, 1000 voxels, 8 mL) with its enclosed
/// 2x2x2 hole (6..8), in the small cube (16..18, 8 voxels, 0.064 mL), or outside.
fn value(x: usize, y: usize, z: usize) -> f32 {
    let inside = |lo: usize, hi: usize| [x, y, z].iter().all(|&c| (lo..hi).contains(&c));
    if inside(6, 8) {
        -1.0
    } else if inside(2, 12) {
        2.0 + (x % 2) as f32
    } else if inside(16, 18) {
        5.0
    } else {
        -1.0
    }
}

/// The test volume at `dir/blobs.nii` (float32, 2 mm voxels).
fn blobs(dir: &Path) -> PathBuf {
    let geo = Geo {
        pixdim: [MM; 3],
        srow: [
            [MM, 0.0, 0.0, 0.0],
            [0.0, MM, 0.0, 0.0],
            [0.0, 0.0, MM, 0.0],
        ],
        ..Geo::default()
    };
    let data = f32_data(N * N * N, |i| value(i % N, (i / N) % N, i / (N * N)));
    let p = dir.join("blobs.nii");
    std::fs::write(&p, nifti(&[N as i64; 3], 16, 32, &geo, &data)).unwrap();
    p
}

/// The label map at `path`, as values at (x, y, z).
fn labels(path: &Path) -> impl Fn(usize, usize, usize) -> u16 {
    let v = voxtile::volume::read(path).unwrap();
    move |x, y, z| v.data[[0, x, y, z]] as u16
}

/// Voxels of label 1.
fn count(path: &Path) -> usize {
    let v = voxtile::volume::read(path).unwrap();
    v.data.iter().filter(|&&l| l == 1.0).count()
}

/// Segment the blobs with `extra` flags into `dir/out.nii.gz`, asserting success.
fn run(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("out.nii.gz");
    let _ = std::fs::remove_file(&out);
    let o = segment_cpu(&blobs(dir), &sign_model(dir), &out, extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn without_post_processing_the_map_is_the_sign() {
    let d = tempdir();
    let out = run(d.path(), &[]);
    assert_eq!(count(&out), 1000 - 8 + 8);
    let l = labels(&out);
    assert_eq!((l(6, 6, 6), l(16, 16, 16), l(3, 3, 3)), (0, 1, 1));
}

#[test]
fn keep_largest_removes_the_small_cube() {
    let d = tempdir();
    let out = run(d.path(), &["--keep-largest"]);
    let l = labels(&out);
    assert_eq!((l(16, 16, 16), l(3, 3, 3), l(6, 6, 6)), (0, 1, 0));
    assert_eq!(count(&out), 1000 - 8);
}

#[test]
fn min_component_ml_uses_the_voxel_volume() {
    let d = tempdir();
    // The small cube is 0.064 mL: under 0.1 it goes, under 0.05 it stays.
    let out = run(d.path(), &["--min-component-ml", "0.1"]);
    assert_eq!(labels(&out)(16, 16, 16), 0);
    assert_eq!(count(&out), 1000 - 8);
    let out = run(d.path(), &["--min-component-ml", "0.05"]);
    assert_eq!(count(&out), 1000);
    // In voxels it would be 8 of 1: a threshold of 9 mL goes beyond the big cube (8 mL) too.
    let out = run(d.path(), &["--min-component-ml", "9"]);
    assert_eq!(count(&out), 0);
}

#[test]
fn fill_holes_fills_the_enclosed_hole_only() {
    let d = tempdir();
    let out = run(d.path(), &["--fill-holes"]);
    let l = labels(&out);
    assert_eq!(
        (l(6, 6, 6), l(7, 7, 7), l(0, 0, 0), l(20, 20, 20)),
        (1, 1, 0, 0)
    );
    assert_eq!(count(&out), 1000 + 8);
}

#[test]
fn steps_combine_and_classes_are_named_from_the_manifest() {
    let d = tempdir();
    std::fs::write(
        d.path().join("m.toml"),
        "classes = [\"background\", \"organ\"]\n",
    )
    .unwrap();
    let m = d.path().join("m.toml");
    let out = run(
        d.path(),
        &[
            "--manifest",
            s(&m),
            "--keep-largest=organ",
            "--fill-holes=1",
        ],
    );
    assert_eq!(count(&out), 1000);
    let e = segment_cpu(
        &blobs(d.path()),
        &sign_model(d.path()),
        &d.path().join("bad.nii.gz"),
        &["--manifest", s(&m), "--fill-holes=kidney"],
    );
    assert_one_error(&e, "kidney");
    assert!(!d.path().join("bad.nii.gz").exists());
}

#[test]
fn manifest_fields_apply_and_flags_beat_them() {
    let d = tempdir();
    let m = d.path().join("m.toml");
    std::fs::write(
        &m,
        "keep_largest = true\nfill_holes = true\nmin_component_ml = 100\n",
    )
    .unwrap();
    // The manifest's 100 mL removes everything; the flag's 0.01 keeps the big cube.
    let out = run(d.path(), &["--manifest", s(&m)]);
    assert_eq!(count(&out), 0);
    let out = run(
        d.path(),
        &["--manifest", s(&m), "--min-component-ml", "0.01"],
    );
    assert_eq!(count(&out), 1000);
    std::fs::write(&m, "min_component_ml = -1\n").unwrap();
    let e = segment_cpu(
        &blobs(d.path()),
        &sign_model(d.path()),
        &d.path().join("x.nii"),
        &["--manifest", s(&m)],
    );
    assert_one_error(&e, "min_component_ml");
}

/// The input's values in label 1 before post-processing.
fn class_values() -> Vec<f64> {
    let mut v = Vec::new();
    for z in 0..N {
        for y in 0..N {
            for x in 0..N {
                let a = value(x, y, z);
                if a > 0.0 {
                    v.push(a as f64);
                }
            }
        }
    }
    v
}

#[test]
fn statistics_give_volume_and_intensity_per_class() {
    let d = tempdir();
    let st = d.path().join("stats.json");
    run(d.path(), &["--statistics", s(&st)]);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    let classes = j["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 1, "background is not listed: {j}");
    let c = &classes[0];
    let v = class_values();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let std = (v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    assert_eq!(c["label"], 1);
    assert_eq!(c["voxels"].as_u64().unwrap(), v.len() as u64);
    assert!((c["volume_ml"].as_f64().unwrap() - v.len() as f64 * 0.008).abs() < 1e-9);
    assert!(
        (c["intensity_mean"].as_f64().unwrap() - mean).abs() < 1e-9,
        "{c}"
    );
    assert!(
        (c["intensity_std"].as_f64().unwrap() - std).abs() < 1e-6,
        "{c}"
    );
    // After post-processing: the statistics count the map as written.
    std::fs::remove_file(&st).unwrap();
    run(d.path(), &["--statistics", s(&st), "--keep-largest"]);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    assert_eq!(j["classes"][0]["voxels"], 1000 - 8);
}

#[test]
fn statistics_are_claimed_before_any_work() {
    let d = tempdir();
    let st = d.path().join("stats.json");
    std::fs::write(&st, "keep").unwrap();
    let out = d.path().join("seg.nii.gz");
    let e = segment_cpu(
        &blobs(d.path()),
        &sign_model(d.path()),
        &out,
        &["--statistics", s(&st)],
    );
    assert_one_error(&e, "--statistics");
    assert!(
        !out.exists(),
        "nothing is written when an output is refused"
    );
    assert_eq!(std::fs::read_to_string(&st).unwrap(), "keep");
    let wrong = d.path().join("stats.txt");
    let e = segment_cpu(
        &blobs(d.path()),
        &sign_model(d.path()),
        &out,
        &["--statistics", s(&wrong)],
    );
    assert_one_error(&e, "--statistics");
    let e = segment_cpu(
        &blobs(d.path()),
        &sign_model(d.path()),
        &out,
        &["--statistics", "-"],
    );
    assert_one_error(&e, "--statistics");
}

#[test]
fn statistics_in_a_batch_are_one_file_per_case() {
    let d = tempdir();
    let cases = d.path().join("cases");
    std::fs::create_dir(&cases).unwrap();
    let b = blobs(d.path());
    std::fs::copy(&b, cases.join("a.nii")).unwrap();
    std::fs::copy(&b, cases.join("b.nii")).unwrap();
    let (out, st) = (d.path().join("seg"), d.path().join("stats"));
    let o = segment_cpu(
        &cases,
        &sign_model(d.path()),
        &out,
        &["--statistics", s(&st)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for case in ["a", "b"] {
        let j: serde_json::Value =
            serde_json::from_slice(&std::fs::read(st.join(format!("{case}.json"))).unwrap())
                .unwrap();
        assert_eq!(j["classes"][0]["voxels"].as_u64().unwrap(), 1000);
    }
}
