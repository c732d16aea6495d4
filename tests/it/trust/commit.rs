//! The second trust round's commit defects: a run takes back only what it wrote itself, so two
//! batch runs on one output folder end with each run's reported outputs present (defect 2).

use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
use std::process::{Command, Stdio};

#[test]
fn a_batch_that_fails_its_commit_never_removes_another_runs_outputs() {
    let dir = tempdir();
    let d = dir.path();
    std::fs::create_dir(d.join("in")).unwrap();
    ball_volume(&d.join("in/a.nii"), [16, 16, 16]);
    ball_volume(&d.join("in/b.nii"), [16, 16, 16]);
    let model = conv_model(&d.join("m.onnx"), 2);
    let run = |pause_ms: &str| {
        Command::new(voxtile_bin())
            .current_dir(d)
            .args(["segment", "in", "-m", s(&model), "-o", "out"])
            .args([
                "--probabilities",
                "prob",
                "--labels-json",
                "--device",
                "cpu",
            ])
            .env("VOXTILE_TEST_PAUSE_BEFORE_RENAME", pause_ms)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The slow run decides to segment both cases (no labels yet), then holds each staged file
    // 1.2 s; the quick run segments and commits everything meanwhile. When the slow run commits,
    // its labels meet the quick run's and fail: whatever it committed before must be taken back
    // without removing the quick run's files.
    let slow = run("1200");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let quick = run("0").wait_with_output().unwrap();
    assert!(
        quick.status.success(),
        "{}",
        String::from_utf8_lossy(&quick.stderr)
    );
    let files = [
        "out/a.nii.gz",
        "out/a.labels.json",
        "prob/a.nii.gz",
        "out/b.nii.gz",
    ];
    let files: Vec<_> = files
        .iter()
        .chain(&["out/b.labels.json", "prob/b.nii.gz"])
        .map(|f| (f, std::fs::read(d.join(f)).unwrap()))
        .collect();
    let slow = slow.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&slow.stderr);
    assert!(
        !slow.status.success(),
        "the slow run cannot commit over the quick one: {err}"
    );
    for (f, bytes) in &files {
        let now = std::fs::read(d.join(f));
        assert!(
            now.as_ref().is_ok_and(|b| b == bytes),
            "{f} of the run that succeeded: {now:?}\n{err}"
        );
    }
    for sub in ["out", "prob"] {
        assert!(
            temp_files(&d.join(sub)).is_empty(),
            "{:?}",
            temp_files(&d.join(sub))
        );
    }
}
