//! The command line's side of the model contract (issue 33): what it says whatever `RUST_LOG`
//! says, a window below the receptive field refused, the manifest's placement, TTA, sigma_scale
//! and padding in effect, and `plan` reading the same model arguments as `segment`.

use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
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

/// A `--roi` below the receptive field is refused (deepbrain: 64), `--allow-small-roi` runs it; a
/// manifest's roi is the model's own window: it runs, with the one-line warning.
#[test]
fn a_typed_roi_below_the_receptive_field_is_refused_a_manifest_roi_warns() {
    let dir = tempdir();
    let vol = ball_volume(&dir.path().join("ball.nii"), [40, 36, 44]);
    let out = dir.path().join("o.nii.gz");
    let o = segment_cpu(&vol, &data("deepbrain.onnx"), &out, &["--roi", "32"]);
    assert_one_error(&o, "receptive field [64, 64, 64]");
    assert!(!out.exists());
    let o = segment_cpu(
        &vol,
        &data("deepbrain.onnx"),
        &out,
        &["--roi", "32", "--allow-small-roi"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(dir.path().join("m.toml"), "roi = 32\n").unwrap();
    let man = dir.path().join("m.toml");
    let out = dir.path().join("m.nii.gz");
    let o = segment_cpu(
        &vol,
        &data("deepbrain.onnx"),
        &out,
        &["--manifest", s(&man)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("receptive field"), "{}", stderr(&o));
}

/// An encoder-decoder's theoretical receptive field (MONAI's BasicUNet: 200) counts only up to
/// 64 voxels: its usual windows (96) plan, a 32-voxel one is refused.
#[test]
fn a_unet_window_of_64_or_more_is_not_below_its_receptive_field() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/archs/basicunet_legacy.onnx");
    let p = plan_json(&["-m", s(&model), "--volume", "160x160x160", "--roi", "96"]);
    assert_eq!(p["roi"], serde_json::json!([96, 96, 96]), "{p}");
    let o = voxtile(&[
        "plan",
        "-m",
        s(&model),
        "--volume",
        "160x160x160",
        "--roi",
        "32",
    ]);
    assert_one_error(&o, "receptive field [200, 200, 200]");
}

/// The options in effect of a `--report -` run of the conv model with a manifest `toml` beside
/// it and `extra` flags.
fn options_in_effect(dir: &Path, toml: &str, extra: &[&str]) -> serde_json::Value {
    let (vol, model) = inputs(dir);
    std::fs::write(dir.join("m.toml"), toml).unwrap();
    let out = dir.join("r.nii.gz");
    std::fs::remove_file(&out).ok();
    let o = segment_cpu(
        &vol,
        &model,
        &out,
        &[&["--report", "-"][..], extra].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    v["provenance"]["options"].clone()
}

/// The manifest's placement, tta, sigma_scale and pad are in effect without flags; flags typed
/// on the command line beat them; bad values are refused by the flags' rules.
#[test]
fn manifest_placement_tta_sigma_scale_and_pad_in_effect() {
    let dir = tempdir();
    let d = dir.path();
    let toml = "placement = \"nnunet\"\ntta = true\nmirror_axes = [0, 2]\nsigma_scale = 0.25\npad = \"edge\"\n";
    let o = options_in_effect(d, toml, &[]);
    assert_eq!(o["placement"], "nnunet", "{o}");
    assert_eq!(o["tta"], serde_json::json!([0, 2]), "{o}");
    assert_eq!(
        o["sigma_scale"],
        serde_json::json!([0.25, 0.25, 0.25]),
        "{o}"
    );
    assert_eq!(o["pad"], "edge", "{o}");
    let flags = [
        "--placement",
        "monai",
        "--sigma-scale",
        "0.5",
        "--pad=-1",
        "--tta",
        "off",
    ];
    let o = options_in_effect(d, toml, &flags);
    assert_eq!(o["placement"], "monai", "{o}");
    assert_eq!(o["tta"], serde_json::json!([]), "{o}");
    assert_eq!(o["sigma_scale"], serde_json::json!([0.5, 0.5, 0.5]), "{o}");
    assert_eq!(o["pad"], "-1", "{o}");
    let o = options_in_effect(
        d,
        "tta = [1]\npad = 3\nsigma_scale = [0.1, 0.2, 0.3]\n",
        &[],
    );
    assert_eq!(o["tta"], serde_json::json!([1]), "{o}");
    assert_eq!(o["pad"], "3", "{o}");
    assert_eq!(o["sigma_scale"], serde_json::json!([0.1, 0.2, 0.3]), "{o}");
    // Without the fields: the flags' defaults.
    let o = options_in_effect(d, "", &[]);
    assert_eq!(
        (o["placement"].as_str(), o["pad"].as_str()),
        (Some("monai"), Some("0"))
    );
    assert_eq!(o["tta"], serde_json::json!([]), "{o}");
    let (vol, model) = inputs(d);
    for (bad, names) in [
        ("placement = \"middle\"\n", "placement"),
        ("sigma_scale = -1\n", "sigma_scale"),
        ("pad = \"wrap\"\n", "pad"),
        ("tta = [5]\n", "tta"),
    ] {
        std::fs::write(d.join("m.toml"), bad).unwrap();
        let out = d.join("bad.nii.gz");
        assert_one_error(&segment_cpu(&vol, &model, &out, &[]), names);
        assert!(!out.exists());
    }
}

/// `segment_cpu` with `--report -`: it succeeds, and its report, parsed.
fn segment_report(vol: &Path, model: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let o = segment_cpu(vol, model, out, &[&["--report", "-"][..], extra].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("--report - prints JSON")
}

/// `voxtile plan ARGS --json`, parsed.
fn plan_json(args: &[&str]) -> serde_json::Value {
    let o = voxtile(&[&["plan"][..], args, &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("plan --json prints JSON")
}

/// `plan` reads the model arguments `segment` reads (the manifest beside the model or
/// `--manifest`, its spacing or `--spacing`, an input file) and plans the window and window count
/// `segment` runs; on a machine without a GPU it plans for the CPU.
#[test]
fn plan_reads_the_model_arguments_segment_reads() {
    let dir = tempdir();
    let d = dir.path();
    let vol = ball_volume(&d.join("ball.nii"), [40, 36, 44]);
    let model = conv_model(&d.join("m.onnx"), 2);
    let toml =
        "roi = [16, 16, 16]\noverlap = 0.25\nplacement = \"nnunet\"\nspacing = [2.0, 2.0, 2.0]\n";
    std::fs::write(d.join("m.toml"), toml).unwrap();
    let p = plan_json(&[s(&vol), "-m", s(&model)]);
    assert_eq!(p["roi"], serde_json::json!([16, 16, 16]), "{p}");
    assert_eq!(
        p["volume"],
        serde_json::json!([20, 18, 22]),
        "resampled to 2 mm: {p}"
    );
    let out = d.join("seg.nii.gz");
    let r = segment_report(&vol, &model, &out, &[]);
    assert_eq!(p["windows"], r["windows"], "plan {p}\nsegment {r}");
    assert_eq!(r["roi"], p["roi"]);
    // Flags beat the manifest, as in segment; --manifest names another one.
    let p = plan_json(&[s(&vol), "-m", s(&model), "--roi", "8", "--spacing", "none"]);
    assert_eq!(
        (p["roi"].clone(), p["volume"].clone()),
        (
            serde_json::json!([8, 8, 8]),
            serde_json::json!([40, 36, 44])
        )
    );
    std::fs::write(d.join("other.toml"), "roi = 12\n").unwrap();
    let other = d.join("other.toml");
    let p = plan_json(&[
        "-m",
        s(&model),
        "--manifest",
        s(&other),
        "--volume",
        "40x36x44",
    ]);
    assert_eq!(p["roi"], serde_json::json!([12, 12, 12]), "{p}");
    if !gpu_present() {
        assert_eq!(p["device"], "cpu", "--device auto without a GPU: {p}");
    }
}

/// `plan` turns the input to the model's orientation as `segment` does (manifest `orientation`,
/// or `--orientation` over it), so a permuting orientation plans the turned grid and the window
/// count `segment` runs.
#[test]
fn plan_turns_the_input_to_the_model_orientation() {
    let dir = tempdir();
    let d = dir.path();
    let vol = ball_volume(&d.join("ball.nii"), [40, 24, 56]);
    let model = conv_model(&d.join("m.onnx"), 2);
    std::fs::write(
        d.join("m.toml"),
        "roi = [16, 16, 16]\noverlap = 0.5\norientation = \"SAR\"\n",
    )
    .unwrap();
    let p = plan_json(&[s(&vol), "-m", s(&model)]);
    assert_eq!(
        p["volume"],
        serde_json::json!([56, 24, 40]),
        "turned to SAR: {p}"
    );
    let out = d.join("seg.nii.gz");
    let r = segment_report(&vol, &model, &out, &[]);
    assert_eq!(p["windows"], r["windows"], "plan {p}\nsegment {r}");
    // The flag beats the manifest, in plan as in segment.
    let p = plan_json(&[s(&vol), "-m", s(&model), "--orientation", "stored"]);
    assert_eq!(p["volume"], serde_json::json!([40, 24, 56]), "{p}");
    let r = segment_report(
        &vol,
        &model,
        &d.join("seg2.nii.gz"),
        &["--orientation", "stored"],
    );
    assert_eq!(p["windows"], r["windows"], "plan {p}\nsegment {r}");
    let bad = voxtile(&["plan", s(&vol), "-m", s(&model), "--orientation", "XYZ"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("--orientation"), "{}", stderr(&bad));
}

/// A roi below the receptive field that holds the whole volume runs without
/// `--allow-small-roi` (no image context is lost: a larger window would only add padding); one
/// that cuts the volume is refused.
#[test]
fn a_roi_holding_the_whole_volume_is_not_refused() {
    let dir = tempdir();
    let vol = ball_volume(&dir.path().join("ball.nii"), [32, 32, 32]);
    let out = dir.path().join("o.nii.gz");
    let o = segment_cpu(&vol, &data("deepbrain.onnx"), &out, &["--roi", "32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("receptive field"), "{}", stderr(&o));
    let o = segment_cpu(
        &vol,
        &data("deepbrain.onnx"),
        &dir.path().join("p.nii.gz"),
        &["--roi", "16"],
    );
    assert_one_error(&o, "receptive field [64, 64, 64]");
}
