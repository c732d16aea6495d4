//! The command line's side of the model contract (issue 33): what it says whatever `RUST_LOG`
//! says, a window below the receptive field refused, the manifest's placement, TTA, sigma_scale
//! and padding in effect, and `plan` reading the same model arguments as `segment`.

mod common;
use common::small::{ball_volume, conv_model};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `voxtile ARGS` with `RUST_LOG` (and `VOXTILE_LOG`) set to `log`.
fn voxtile_env(args: &[&str], log: &str) -> Output {
    std::process::Command::new(voxtile_bin())
        .args(args)
        .env("RUST_LOG", log)
        .env_remove("VOXTILE_LOG")
        .output()
        .unwrap()
}

/// A ball volume and a two-class conv model (receptive field 3).
fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let vol = ball_volume(&dir.join("ball.nii"), [12, 10, 8]);
    let model = conv_model(&dir.join("m.onnx"), 2);
    (vol, model)
}

/// An inherited `RUST_LOG` that filters out info (or everything) keeps the summary line; only
/// `-q` hides it.
#[test]
fn rust_log_does_not_hide_the_summary_line() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    for (i, log) in ["warn", "error", "off", "voxtile=error"].iter().enumerate() {
        let out = dir.path().join(format!("o{i}.nii.gz"));
        let a = [
            "segment",
            s(&vol),
            "-m",
            s(&model),
            "-o",
            s(&out),
            "--device",
            "cpu",
        ];
        let o = voxtile_env(&a, log);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        assert!(
            err.lines()
                .any(|l| l.starts_with("voxtile: ") && l.contains(&format!("-> {}", out.display()))),
            "RUST_LOG={log}: {err}"
        );
        let out = dir.path().join(format!("q{i}.nii.gz"));
        let mut q = a.to_vec();
        q[5] = s(&out);
        q.push("-q");
        let o = voxtile_env(&q, log);
        assert!(o.status.success());
        assert_eq!(stderr(&o), "", "-q: nothing on success");
    }
    // Errors too.
    let o = voxtile_env(
        &[
            "segment",
            "missing.nii",
            "-m",
            s(&model),
            "-o",
            "x.nii.gz",
            "-q",
        ],
        "off",
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("voxtile: error: "), "{}", stderr(&o));
}

/// A label map without a foreground voxel is a warning that `-q` does not hide.
#[test]
fn an_empty_label_map_warns_even_under_q() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let out = dir.path().join("seg.nii.gz");
    let o = segment_cpu(&vol, &model, &out, &["-q"]);
    assert!(o.status.success());
    assert!(!stderr(&o).contains("no foreground"), "{}", stderr(&o));
    // Channel 1 written as 0: every voxel background.
    std::fs::write(dir.path().join("m.toml"), "[remap]\n1 = 0\n").unwrap();
    let out = dir.path().join("empty.nii.gz");
    for extra in [&["-q"][..], &[]] {
        std::fs::remove_file(&out).ok();
        let o = segment_cpu(&vol, &model, &out, extra);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let warned: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("no foreground voxel"))
            .collect();
        assert_eq!(warned.len(), 1, "{extra:?}: {err}");
        assert!(warned[0].starts_with("voxtile: warning: ") && warned[0].contains("ball.nii"));
    }
}

/// A manifest's roi below the receptive field is refused like `--roi` (deepbrain: 64).
#[test]
fn a_manifest_roi_below_the_receptive_field_is_refused() {
    let dir = tempdir();
    let vol = ball_volume(&dir.path().join("ball.nii"), [40, 36, 44]);
    std::fs::write(dir.path().join("m.toml"), "roi = 32\n").unwrap();
    let out = dir.path().join("o.nii.gz");
    let man = dir.path().join("m.toml");
    let a = ["--manifest", s(&man)];
    let o = segment_cpu(&vol, &data("deepbrain.onnx"), &out, &a);
    assert_one_error(&o, "receptive field [64, 64, 64]");
    assert!(!out.exists());
    let o = segment_cpu(&vol, &data("deepbrain.onnx"), &out, &[&a[..], &["--allow-small-roi"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
}
