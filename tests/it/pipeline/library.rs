//! The library door: `Pipeline::from_model` applies a model's manifest as `voxtile segment` does,
//! runs stop on a `CancelToken`, the errors a caller handles are typed, and `segment_array`
//! returns a `Segmentation`.

use crate::common::onnx::{model_with, node, vi_ncdhw};
use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
use ndarray::Array4;
use prost::Message;
use std::path::{Path, PathBuf};
use voxtile::engine::{Device, Engine, Options};
use voxtile::pipeline::{Pipeline, Settings};
use voxtile::{CancelToken, Error};

const CLASSES: [&str; 3] = ["background", "core", "rim"];

/// A 1 -> 3 channel conv model with a manifest beside it (window, z-score, classes, remap), and
/// a ball volume.
fn model_and_input(dir: &Path) -> (PathBuf, PathBuf) {
    let model = conv_model(&dir.join("net.onnx"), 3);
    std::fs::write(
        dir.join("net.toml"),
        r#"
name = "ball"
classes = ["background", "core", "rim"]
roi = [8, 8, 8]
overlap = 0.25
blend = "constant"

[normalize]
kind = "zscore"

[remap]
2 = 7
"#,
    )
    .unwrap();
    let input = ball_volume(&dir.join("in.nii"), [20, 18, 14]);
    (model, input)
}

fn cpu(o: Options) -> Options {
    Options {
        device: Device::Cpu,
        ..o
    }
}

#[test]
fn from_model_applies_the_manifest_like_the_cli() {
    let dir = tempdir();
    let (model, input) = model_and_input(dir.path());
    let volume = voxtile::volume::read(&input).unwrap();
    // Default options (device auto), as a plain `voxtile segment` runs.
    let mut pipeline = Pipeline::from_model(&model).unwrap();
    let out = pipeline.run(&volume, &mut |_, _| {}).unwrap();
    assert_eq!(out.report.engine.roi, [8, 8, 8], "the manifest's window");
    assert_eq!(out.report.engine.overlap, [0.25; 3]);
    assert!(
        out.report.normalize.starts_with("zscore"),
        "{}",
        out.report.normalize
    );
    let names: Vec<String> = CLASSES.iter().map(|s| s.to_string()).collect();
    assert_eq!(out.classes.as_ref(), Some(&names));
    assert_eq!(pipeline.classes(), Some(&names[..]));
    assert!(
        out.labels.iter().any(|&l| l == 7),
        "channel 2 remapped to 7"
    );
    assert!(out.labels.iter().all(|&l| l != 2));

    // The CLI on the same input and model: the same labels, voxel for voxel.
    let seg = dir.path().join("cli.nii.gz");
    let o = voxtile(&["segment", s(&input), "-m", s(&model), "-o", s(&seg)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cli = voxtile::volume::read(&seg).unwrap();
    let cli_labels = cli.data.index_axis(ndarray::Axis(0), 0).mapv(|v| v as u16);
    assert_eq!(cli_labels, out.labels);

    // Without the manifest the run differs: the merge is what made them equal.
    let plain = Engine::from_file(&model, cpu(Options::default())).unwrap();
    let mut bare = Pipeline::new(vec![plain], Settings::default()).unwrap();
    let b = bare.run(&volume, &mut |_, _| {}).unwrap();
    assert!(b.classes.is_none());
    assert_ne!(b.labels, out.labels);
}

#[test]
fn overrides_beat_the_manifest() {
    let dir = tempdir();
    let (model, input) = model_and_input(dir.path());
    let volume = voxtile::volume::read(&input).unwrap();
    let overrides = voxtile::pipeline::Overrides {
        roi: Some([12, 12, 12]),
        mirror: Some(voxtile::pipeline::Mirror::Manifest),
        ..Default::default()
    };
    let mut p = Pipeline::from_model_with(&model, cpu(Options::default()), &overrides).unwrap();
    assert_eq!(
        p.flip_sets().len(),
        8,
        "--tta without a list: all three axes"
    );
    let out = p.run(&volume, &mut |_, _| {}).unwrap();
    assert_eq!(out.report.engine.roi, [12, 12, 12]);
    assert_eq!(out.report.passes, 8);
}

#[test]
fn cancelled_on_the_first_progress_call_returns_cancelled_and_writes_nothing() {
    let dir = tempdir();
    let (model, input) = model_and_input(dir.path());
    let volume = voxtile::volume::read(&input).unwrap();
    let options = cpu(Options {
        batch: Some(1),
        ..Options::default()
    });
    let mut p =
        Pipeline::from_model_with(&model, options, &voxtile::pipeline::Overrides::default())
            .unwrap();
    let token = p.cancel_token();
    let mut calls = 0;
    let out = dir.path().join("seg.nii.gz");
    let r = p.run(&volume, &mut |_, _| {
        calls += 1;
        token.cancel();
    });
    let r = r.and_then(|o| voxtile::volume::write_labels(&out, o.labels.view(), &o.header));
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert_eq!(calls, 1, "no batch runs after the cancel");
    assert!(!out.exists());
    // A token stays cancelled: the next run stops before its first window.
    assert!(matches!(
        p.run(&volume, &mut |_, _| panic!("no window runs")),
        Err(Error::Cancelled)
    ));
}

#[test]
fn cancelled_from_another_thread() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("net.onnx"), 2);
    let token = CancelToken::new();
    let mut engine = Engine::from_file(
        &model,
        cpu(Options {
            roi: Some([8; 3]),
            batch: Some(1),
            cancel: token.clone(),
            ..Options::default()
        }),
    )
    .unwrap();
    let (started, wait) = std::sync::mpsc::channel();
    let (done, ack) = std::sync::mpsc::channel();
    let canceller = std::thread::spawn(move || {
        wait.recv().unwrap();
        token.cancel();
        done.send(()).unwrap();
    });
    let vol = Array4::<f32>::ones((1, 32, 32, 32));
    let mut calls = 0;
    let r = engine.segment_array(vol.view(), &mut |_, _| {
        calls += 1;
        if calls == 1 {
            started.send(()).unwrap();
            ack.recv().unwrap();
        }
    });
    canceller.join().unwrap();
    assert!(
        matches!(r, Err(Error::Cancelled)),
        "{:?}",
        r.map(|s| s.report)
    );
    assert_eq!(calls, 1);
    assert!(engine.cancel_token().is_cancelled());
}

#[test]
fn channel_mismatch_is_typed_and_names_the_model() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("net.onnx"), 2);
    let mut engine = Engine::from_file(&model, cpu(Options::default())).unwrap();
    let two = Array4::<f32>::zeros((2, 8, 8, 8));
    let e = engine
        .segment_array(two.view(), &mut |_, _| {})
        .unwrap_err();
    match &e {
        Error::ChannelMismatch {
            expected: 1,
            got: 2,
            model: Some(m),
            ..
        } => assert_eq!(m, &model),
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("net.onnx") && !text.contains('\n'), "{text}");
    // Through the pipeline, with a volume.
    let mut p = Pipeline::new(vec![engine], Settings::default()).unwrap();
    let vol = voxtile::Volume {
        data: two,
        header: voxtile::volume::Header::new([8, 8, 8], 2, [1.0; 3]),
    };
    assert!(matches!(
        p.run(&vol, &mut |_, _| {}),
        Err(Error::ChannelMismatch {
            expected: 1,
            got: 2,
            ..
        })
    ));
}

#[test]
fn budget_too_small_is_typed() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("net.onnx"), 2);
    let options = cpu(Options {
        roi: Some([16; 3]),
        memory_budget: Some(4096),
        ..Options::default()
    });
    let mut engine = Engine::from_file(&model, options).unwrap();
    let vol = Array4::<f32>::zeros((1, 32, 32, 32));
    let e = engine
        .segment_array(vol.view(), &mut |_, _| {})
        .unwrap_err();
    match &e {
        Error::BudgetTooSmall {
            needed,
            budget: 4096,
            roi: [16, 16, 16],
            batch: 1,
            ..
        } => assert!(*needed > 4096, "{needed}"),
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("net.onnx") && text.contains("too small") && !text.contains('\n'),
        "{text}"
    );
}

#[test]
fn unsupported_ops_are_listed_together() {
    let dir = tempdir();
    let path = dir.path().join("odd.onnx");
    let m = model_with(
        "odd",
        17,
        vec![
            node("Einsum", "e1", &["x"], &["a"], vec![]),
            node("Relu", "r", &["a"], &["b"], vec![]),
            node("Hardmax", "h1", &["b"], &["y"], vec![]),
        ],
        vec![],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", Some(1))],
    );
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let e = Engine::from_file(&path, cpu(Options::default()))
        .err()
        .unwrap();
    match &e {
        Error::UnsupportedOps { path: p, ops } => {
            assert_eq!(p, &path);
            let got: Vec<(&str, &str)> = ops
                .iter()
                .map(|o| (o.op.as_str(), o.node.as_str()))
                .collect();
            assert_eq!(got, [("Einsum", "e1"), ("Hardmax", "h1")]);
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("odd.onnx") && text.contains("Einsum") && text.contains("Hardmax"),
        "{text}"
    );
    assert!(!text.contains('\n'));
}

#[test]
fn segmentation_keeps_logits_only_when_asked() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("net.onnx"), 3);
    let vol = Array4::from_shape_fn((1, 12, 10, 9), |(_, i, j, k)| (i + 2 * j + k) as f32 * 0.1);
    let run = |keep_logits| {
        let o = cpu(Options {
            roi: Some([8; 3]),
            keep_logits,
            ..Options::default()
        });
        let mut e = Engine::from_file(&model, o).unwrap();
        e.set_classes(Some(CLASSES.iter().map(|s| s.to_string()).collect()))
            .unwrap();
        e.segment_array(vol.view(), &mut |_, _| {}).unwrap()
    };
    let plain = run(false);
    assert!(plain.logits.is_none());
    assert!(plain.header.is_none(), "an array has no geometry");
    assert_eq!(plain.labels.shape(), &[12, 10, 9]);
    assert_eq!(plain.classes.as_ref().map(Vec::len), Some(3));
    assert!(plain.report.windows > 1);
    let kept = run(true);
    assert_eq!(kept.logits.as_ref().unwrap().shape(), &[3, 12, 10, 9]);
    assert_eq!(kept.labels, plain.labels);
    // Class names must match the channels.
    let mut e = Engine::from_file(&model, cpu(Options::default())).unwrap();
    assert!(e.set_classes(Some(vec!["one".into()])).is_err());
}
