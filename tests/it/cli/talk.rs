//! What the CLI says: the summary line per file, `-q`/`-v`, the CUDA notice only when asked,
//! one line per file in a batch logged to a file, `info`/`inspect --json`, shell completions.

use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
use std::path::{Path, PathBuf};

/// A ball volume and a two-class conv model with a manifest naming its classes.
fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let vol = ball_volume(&dir.join("ball.nii"), [12, 10, 8]);
    let model = conv_model(&dir.join("m.onnx"), 2);
    std::fs::write(dir.join("m.toml"), "classes = [\"background\", \"ball\"]\n").unwrap();
    (vol, model)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn summary_line_names_input_output_labels_size_and_device() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let out = dir.path().join("seg.nii.gz");
    let o = segment_cpu(&vol, &model, &out, &[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one summary line: {err}");
    let l = lines[0];
    assert!(l.starts_with("voxtile: "), "{l}");
    assert!(
        l.contains(&format!("{} -> {}", vol.display(), out.display())),
        "{l}"
    );
    let labels = voxtile::volume::read(&out).unwrap();
    let mut present: Vec<u16> = labels.data.iter().map(|&v| v as u16).collect();
    present.sort();
    present.dedup();
    let ids: Vec<String> = present.iter().map(u16::to_string).collect();
    assert!(l.contains(&format!("labels {} (", ids.join(","))), "{l}");
    assert!(
        l.contains("background") || l.contains("ball"),
        "class names: {l}"
    );
    assert!(l.contains("12x10x8") && l.ends_with(" s  cpu"), "{l}");
}

#[test]
fn no_cuda_notice_on_a_default_run_only_with_v() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut a = vec!["segment", s(&vol), "-m", s(&model), "-o", s(&out)];
        a.extend_from_slice(extra);
        voxtile(&a)
    };
    let o = run("auto.nii.gz", &[]); // --device auto
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("CUDA"), "{}", stderr(&o));
    if gpu_present() {
        return; // auto opened the GPU: there is no fallback to announce
    }
    let o = run("v.nii.gz", &["-v"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("voxtile: CUDA unavailable") && stderr(&o).contains("CPU"),
        "{}",
        stderr(&o)
    );
    // An explicit request for CUDA stays an error without a GPU.
    let o = run("cuda.nii.gz", &["--device", "cuda", "-q"]);
    assert_one_error(&o, "");
}

#[test]
fn quiet_prints_nothing_on_success_but_still_the_error() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let out = dir.path().join("q.nii.gz");
    let o = segment_cpu(&vol, &model, &out, &["-q"]);
    assert!(o.status.success() && out.exists());
    assert!(o.stderr.is_empty() && o.stdout.is_empty(), "{}", stderr(&o));
    // Before the subcommand too.
    let out2 = dir.path().join("q2.nii.gz");
    let o = voxtile(&[
        "-q",
        "segment",
        s(&vol),
        "-m",
        s(&model),
        "-o",
        s(&out2),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success() && out2.exists());
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    let missing = dir.path().join("missing.nii.gz");
    let o = segment_cpu(&missing, &model, &dir.path().join("x.nii.gz"), &["-q"]);
    assert_one_error(&o, "missing.nii.gz");
    let o = voxtile(&[
        "segment",
        s(&vol),
        "-m",
        s(&model),
        "-o",
        "y.nii.gz",
        "-q",
        "-v",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "-q and -v conflict: {}",
        stderr(&o)
    );
}

#[test]
fn batch_logged_to_a_file_says_one_line_per_file_skipped_ones_included() {
    let dir = tempdir();
    let (_, model) = inputs(dir.path());
    let ins = dir.path().join("in");
    std::fs::create_dir(&ins).unwrap();
    for n in ["a", "b", "c"] {
        ball_volume(&ins.join(format!("{n}.nii")), [10, 8, 6]);
    }
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // b was segmented by an earlier run: resumed, not redone.
    std::fs::copy(ins.join("b.nii"), out.join("b.nii.gz")).unwrap();
    let o = segment_cpu(&ins, &model, &out, &[]); // stderr is a pipe here, as in a Slurm log
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "one line per file: {err}");
    for n in ["a", "b", "c"] {
        let output = format!("{}", out.join(format!("{n}.nii.gz")).display());
        let mine: Vec<&&str> = lines.iter().filter(|l| l.contains(&output)).collect();
        assert_eq!(mine.len(), 1, "{n}: {err}");
        if n == "b" {
            assert!(mine[0].contains("skipped"), "{err}");
        } else {
            assert!(
                mine[0].contains("/2] ") && mine[0].contains("labels "),
                "{err}"
            );
        }
    }
    assert!(
        !err.contains('\r') && !err.contains("windows"),
        "no bar in a log: {err}"
    );
}

#[test]
fn info_and_inspect_json() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let o = voxtile(&["info", s(&vol), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
    assert_eq!(j["shape"], serde_json::json!([12, 10, 8]));
    assert_eq!(j["channels"], 1);
    assert_eq!(j["dtype"], "float32");
    assert_eq!(j["affine"].as_array().map(Vec::len), Some(4));
    for k in [
        "file",
        "format",
        "spacing",
        "orientation",
        "values",
        "nan",
        "inf",
    ] {
        assert!(j.get(k).is_some(), "info --json lacks {k}: {j}");
    }
    let o = voxtile(&["inspect", s(&model), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("inspect --json is JSON");
    assert_eq!(j["input"]["channels"], 1);
    assert_eq!(j["output"]["channels"], 2);
    assert_eq!(j["ops"]["Conv"], 1);
    assert_eq!(j["parameters"], 2 * 27 + 2);
    assert_eq!(j["receptive_field"], serde_json::json!([3, 3, 3]));
    assert_eq!(
        j["manifest"]["classes"],
        serde_json::json!(["background", "ball"])
    );
    // The text views stay as they were.
    let o = voxtile(&["inspect", s(&model)]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("parameters:"));
}

#[test]
fn completions_for_bash_zsh_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let o = voxtile(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("voxtile") && text.contains("segment"),
            "{shell}"
        );
        assert!(text.contains("device"), "{shell}: the flags of segment");
    }
    let o = voxtile(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A GPU opens on its own thread while the model loads (`engine/start.rs`): a broken model is still
/// its one error line whatever the device would do, and a device that cannot open is one line too.
#[test]
fn a_broken_model_or_a_missing_device_is_one_error_line() {
    let dir = tempdir();
    let (vol, model) = inputs(dir.path());
    let bad = dir.path().join("cut.onnx");
    std::fs::write(&bad, &std::fs::read(&model).unwrap()[..40]).unwrap();
    let run = |m: &Path, dev: &str| {
        let out = dir.path().join("o.nii.gz");
        voxtile(&[
            "segment",
            s(&vol),
            "-m",
            s(m),
            "-o",
            s(&out),
            "--device",
            dev,
        ])
    };
    for dev in ["cuda", "auto", "cuda:7", "cuda:0,cpu"] {
        assert_one_error(&run(&bad, dev), "cut.onnx: not a valid ONNX protobuf");
    }
    assert_one_error(&run(&model, "cuda:7"), "CUDA");
    assert_one_error(&run(&model, "cuda:0,cpu"), "mix the CPU and CUDA");
}
