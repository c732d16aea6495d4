//! Second trust round, manifests: the manifest beside a model is opened as model external data
//! is (resolved inside its folder, no-follow, regular, capped), no error shows a line of the file,
//! its strings hold no control character and at most 256 bytes (shown escaped and cut short), and
//! a `remap` key given twice is refused instead of "the last one wins".

use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
use std::path::{Path, PathBuf};

/// What an outside file holds: it must never show on stdout or stderr.
const MARK: &str = "TRUST2-SECRET-7f3a";

/// A folder `mm` holding a 3-channel model `m.onnx`, and a ball volume beside it.
fn model_dir(top: &Path) -> (PathBuf, PathBuf) {
    let d = top.join("mm");
    std::fs::create_dir(&d).unwrap();
    let model = conv_model(&d.join("m.onnx"), 3);
    let vol = ball_volume(&top.join("v.nii"), [8, 8, 8]);
    (model, vol)
}

/// `voxtile segment vol -m model -o top/o.nii.gz --device cpu` plus `extra`: (exit, stdout+stderr).
fn segment(top: &Path, model: &Path, vol: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = top.join("o.nii.gz");
    let mut args = vec!["segment", s(vol), "-m", s(model), "-o", s(&out)];
    args.extend(["--device", "cpu", "--force"]);
    args.extend(extra);
    let o = voxtile(&args);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code(), text)
}

/// Exit 1 with exactly one line, an error line.
fn assert_refused(r: &(Option<i32>, String), what: &str) {
    let lines: Vec<&str> = r.1.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(r.0, Some(1), "{what}: {}", r.1);
    assert_eq!(lines.len(), 1, "{what}: one line: {}", r.1);
    assert!(lines[0].contains("error"), "{what}: {}", r.1);
}

#[test]
fn manifest_symlinked_out_of_the_model_folder_is_refused_unread() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    let outside = top.path().join("keys.txt");
    std::fs::write(&outside, format!("{MARK} alice-password hunter2\n")).unwrap();
    std::os::unix::fs::symlink(&outside, model.with_extension("toml")).unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "m.toml -> ../keys.txt");
    assert!(!r.1.contains(MARK), "the outside file is echoed: {}", r.1);
    assert!(r.1.contains("outside the manifest's folder"), "{}", r.1);
    // `inspect` reads the same manifest the same way.
    let o = voxtile(&["inspect", s(&model)]);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !text.contains(MARK), "{text}");
    assert!(!top.path().join("o.nii.gz").exists());
}

#[test]
fn manifest_symlink_inside_the_folder_is_read() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    let d = model.parent().unwrap();
    std::fs::write(
        d.join("real.toml"),
        "classes = [\"bg\", \"liver\", \"spleen\"]\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("real.toml", model.with_extension("toml")).unwrap();
    let r = segment(top.path(), &model, &vol, &["--labels-json"]);
    assert_eq!(r.0, Some(0), "{}", r.1);
    let j = std::fs::read_to_string(top.path().join("o.labels.json")).unwrap();
    assert!(j.contains("spleen"), "{j}");
}

#[test]
fn parse_errors_never_show_a_line_of_the_file() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    let cases = [
        (
            "toml",
            format!("classes = [\"a\", \"b\", \"c\"]\n{MARK} alice hunter2\n"),
        ),
        ("toml", format!("activation = \"{MARK}\"\n")),
        ("toml", format!("spacing = \"{MARK}\"\n")),
        ("toml", format!("[{MARK}]\nx = 1\n")),
        ("json", format!("{{\"classes\": [\"a\"], \"{MARK}\": 1}}")),
        ("json", format!("{{\"name\": 5, \"blend\": \"{MARK}\"}}")),
        ("json", format!("{{\"activation\": \"{MARK}\"}}")),
    ];
    for (ext, text) in cases {
        let _ = std::fs::remove_file(model.with_extension("toml"));
        let _ = std::fs::remove_file(model.with_extension("json"));
        std::fs::write(model.with_extension(ext), &text).unwrap();
        let r = segment(top.path(), &model, &vol, &[]);
        assert_refused(&r, &text);
        assert!(!r.1.contains(MARK), "{text:?} echoed: {}", r.1);
        assert!(r.1.contains("manifest"), "{}", r.1);
    }
    // An unknown field with a plain name is named (the user must find it).
    std::fs::write(model.with_extension("json"), "{\"colour\": 1}").unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "colour");
    assert!(r.1.contains("`colour`"), "{}", r.1);
}

#[test]
fn class_names_with_control_characters_or_too_long_are_refused() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    let forged = "liver\\nvoxtile: error: forged line";
    std::fs::write(
        model.with_extension("toml"),
        format!("classes = [\"bg\", \"{forged}\", \"c\"]\n"),
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "newline in a class name");
    assert!(
        r.1.contains("class 1") && r.1.contains("control character"),
        "{}",
        r.1
    );
    let long = "x".repeat(900_000);
    std::fs::write(
        model.with_extension("toml"),
        format!("classes = [\"bg\", \"{long}\", \"c\"]\n"),
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "900 KB class name");
    assert!(
        r.1.len() < 1000 && r.1.contains("256"),
        "{}",
        &r.1[..r.1.len().min(400)]
    );
    // 256 bytes is allowed.
    let ok = "y".repeat(256);
    std::fs::write(
        model.with_extension("toml"),
        format!("classes = [\"bg\", \"{ok}\", \"c\"]\n"),
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_eq!(r.0, Some(0), "{}", r.1);
}

#[test]
fn strings_shown_in_messages_are_escaped_and_cut() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    let blend = format!("{}\\u001b[31m", "z".repeat(200));
    std::fs::write(
        model.with_extension("json"),
        format!("{{\"blend\": \"{blend}\"}}"),
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "escape in blend");
    assert!(
        !r.1.contains('\u{1b}') && !r.1.contains(&"z".repeat(60)),
        "{}",
        r.1
    );
    std::fs::write(
        model.with_extension("json"),
        format!("{{\"blend\": \"{}\"}}", "w".repeat(100)),
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_refused(&r, "long blend");
    assert!(
        r.1.contains("unknown blend") && !r.1.contains(&"w".repeat(60)),
        "{}",
        r.1
    );
}

#[test]
fn remap_keys_given_twice_are_refused() {
    let top = tempdir();
    let (model, vol) = model_dir(top.path());
    for (json, why) in [
        ("{\"remap\": {\"1\": 5, \"2\": 6, \"1\": 7}}", "given twice"),
        ("{\"remap\": {\"1\": 5, \"01\": 7}}", "channel 1 twice"),
    ] {
        std::fs::write(model.with_extension("json"), json).unwrap();
        let r = segment(top.path(), &model, &vol, &[]);
        assert_refused(&r, json);
        assert!(r.1.contains(why), "{json}: {}", r.1);
    }
    // Each key once: the labels are remapped.
    std::fs::write(
        model.with_extension("json"),
        "{\"remap\": {\"1\": 5, \"2\": 6}}",
    )
    .unwrap();
    let r = segment(top.path(), &model, &vol, &[]);
    assert_eq!(r.0, Some(0), "{}", r.1);
}
