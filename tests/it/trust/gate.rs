//! The output gate of the second trust round, one regression test per defect: every path a run
//! writes (split-class masks, batch extras, the batch report) is claimed before any work, and
//! the files an input reads (detached data files, DICOM folders) are never written.

use crate::common::nifti::f32_data;
use crate::common::small::{ball, ball_volume, conv_model};
use crate::common::*;
use std::path::{Path, PathBuf};

/// A 3-channel model whose manifest names its classes.
fn classes_model(d: &Path, classes: &[&str]) -> PathBuf {
    let m = conv_model(&d.join("m.onnx"), classes.len());
    let list: Vec<String> = classes.iter().map(|c| format!("\"{c}\"")).collect();
    std::fs::write(
        d.join("m.toml"),
        format!("classes = [{}]\n", list.join(", ")),
    )
    .unwrap();
    m
}

/// Defect 1: a class named like the input or like `-o` replaced it; an existing mask was
/// refused only after the whole inference, for a false reason.
#[test]
fn split_class_masks_are_claimed_before_any_work() {
    let t = tempdir();
    let d = t.path();
    let model = classes_model(d, &["bg", "liver", "spleen"]);
    let liver = d.join("liver.nii.gz");
    std::fs::write(
        &liver,
        gz(&bytes(&ball_volume(&d.join("v.nii"), [8, 8, 8]))),
    )
    .unwrap();
    let before = bytes(&liver);
    let seg = d.join("seg.nii.gz");
    let o = segment_cpu(&liver, &model, &seg, &["--split-classes", s(d), "--force"]);
    let e = assert_one_error(&o, "is the same file as the input");
    assert!(e.contains("liver.nii.gz"), "{e}");
    assert_eq!(bytes(&liver), before, "the input is untouched");
    assert!(!seg.exists(), "nothing written");

    // A class named like the label map.
    let model = classes_model(d, &["bg", "seg", "spleen"]);
    let v = d.join("v.nii");
    let o = segment_cpu(&v, &model, &seg, &["--split-classes", s(d), "--force"]);
    assert_one_error(&o, "another output");
    assert!(!seg.exists() && !d.join("spleen.nii.gz").exists());

    // An existing mask without --force: refused up front, saying so.
    let masks = d.join("masks");
    std::fs::create_dir(&masks).unwrap();
    std::fs::write(masks.join("spleen.nii.gz"), b"mine").unwrap();
    let o = segment_cpu(&v, &model, &seg, &["--split-classes", s(&masks)]);
    let e = assert_one_error(&o, "spleen.nii.gz: exists (use --force");
    assert!(!e.contains("appeared"), "{e}");
    assert_eq!(bytes(&masks.join("spleen.nii.gz")), b"mine");
    assert_eq!(listing(&masks), ["spleen.nii.gz"]);
    assert!(!seg.exists());
}

/// Defect 4: batch `--probabilities DIR` and `--preview DIR` replaced existing files without
/// `--force`. The whole batch is refused before its first case.
#[test]
fn batch_extras_never_replace_existing_files_without_force() {
    let t = tempdir();
    let d = t.path();
    let model = conv_model(&d.join("m.onnx"), 2);
    let inp = d.join("in");
    std::fs::create_dir(&inp).unwrap();
    for c in ["a", "b"] {
        ball_volume(&inp.join(format!("{c}.nii")), [8, 8, 8]);
    }
    let (prob, prev, out) = (d.join("prob"), d.join("prev"), d.join("out"));
    std::fs::create_dir(&prob).unwrap();
    std::fs::create_dir(&prev).unwrap();
    let mine = [
        (prob.join("a.nii.gz"), "PROBS"),
        (prev.join("b.png"), "PICTURE"),
    ];
    for (p, text) in &mine {
        std::fs::write(p, text).unwrap();
    }
    for (flag, dir, name) in [
        ("--probabilities", &prob, "a.nii.gz"),
        ("--preview", &prev, "b.png"),
    ] {
        let o = segment_cpu(&inp, &model, &out, &[flag, s(dir)]);
        let e = assert_one_error(&o, "exists (use --force");
        assert!(e.contains(name), "{e}");
        assert!(
            !out.join("a.nii.gz").exists(),
            "refused before the first case"
        );
    }
    for (p, text) in &mine {
        assert_eq!(bytes(p), text.as_bytes(), "{}", p.display());
    }
    assert_eq!(listing(&prob), ["a.nii.gz"]);
    // With --force they are replaced, as the label maps are.
    let o = segment_cpu(
        &inp,
        &model,
        &out,
        &[
            "--probabilities",
            s(&prob),
            "--preview",
            s(&prev),
            "--force",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_ne!(bytes(&prob.join("a.nii.gz")), b"PROBS");
}

/// Defect 10: `-o` naming the file a header reads its voxels from (NRRD `data file:`,
/// MetaImage `ElementDataFile`, the `.img` of a pair) replaced the input's data.
#[test]
fn detached_data_files_are_inputs() {
    let t = tempdir();
    let d = t.path();
    let model = conv_model(&d.join("m.onnx"), 2);
    let voxels = f32_data(512, ball([8, 8, 8]));
    let nhdr = "NRRD0004\ntype: float\ndimension: 3\nsizes: 8 8 8\nendian: little\nencoding: raw\ndata file: scan.nii\n";
    let mhd = "ObjectType = Image\nNDims = 3\nDimSize = 8 8 8\nElementType = MET_FLOAT\nElementDataFile = meta.nii\n";
    for (header, text, data) in [
        ("scan.nhdr", nhdr, "scan.nii"),
        ("meta.mhd", mhd, "meta.nii"),
    ] {
        std::fs::write(d.join(header), text).unwrap();
        std::fs::write(d.join(data), &voxels).unwrap();
        let o = segment_cpu(&d.join(header), &model, &d.join(data), &["--force"]);
        let e = assert_one_error(&o, "read for the input");
        assert!(e.contains(header) && e.contains(data), "{e}");
        assert_eq!(bytes(&d.join(data)), voxels, "{data} untouched");
    }
    // A pair's .img, under another name (a hard link): the same file.
    std::fs::write(d.join("pair.hdr"), [0u8; 348]).unwrap();
    std::fs::write(d.join("pair.img"), &voxels).unwrap();
    std::fs::hard_link(d.join("pair.img"), d.join("img.nii")).unwrap();
    let o = segment_cpu(
        &d.join("pair.hdr"),
        &model,
        &d.join("img.nii"),
        &["--force"],
    );
    let e = assert_one_error(&o, "read for the input");
    assert!(e.contains("pair.img") && e.contains("pair.hdr"), "{e}");
    assert_eq!(bytes(&d.join("pair.img")), voxels);
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/volumes")
        .join(name)
}

/// Defect 11: batch `--split-classes .` wrote each series' masks into its input DICOM folder.
#[test]
fn batch_masks_never_go_into_an_input_dicom_folder() {
    let t = tempdir();
    let d = t.path();
    let model = conv_model(&d.join("m.onnx"), 3);
    let series = [d.join("ct1"), d.join("ct2")];
    for dir in &series {
        std::fs::create_dir(dir).unwrap();
        for e in std::fs::read_dir(fixture("dicom_ct")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let before: Vec<Vec<String>> = series.iter().map(|s| listing(s)).collect();
    let out = d.join("out");
    for masks in [d.to_path_buf(), series[0].clone()] {
        let o = voxtile(&[
            "segment",
            s(&series[0]),
            s(&series[1]),
            "-m",
            s(&model),
            "-o",
            s(&out),
            "--device",
            "cpu",
            "--split-classes",
            s(&masks),
        ]);
        assert_one_error(&o, "input folder");
        let after: Vec<Vec<String>> = series.iter().map(|s| listing(s)).collect();
        assert_eq!(after, before, "--split-classes {}", masks.display());
        assert!(!out.join("ct1.nii.gz").exists());
    }
}

/// Defect 12: a batch `--report` named like a case's `--labels-json` sidecar was replaced by
/// the sidecar. Both are claimed through one gate: refused before the first case.
#[test]
fn a_batch_report_named_like_a_sidecar_is_refused_up_front() {
    let t = tempdir();
    let d = t.path();
    let model = conv_model(&d.join("m.onnx"), 2);
    let inp = d.join("in");
    std::fs::create_dir(&inp).unwrap();
    for c in ["a", "b", "c"] {
        ball_volume(&inp.join(format!("{c}.nii")), [8, 8, 8]);
    }
    let out = d.join("out");
    let report = out.join("b.labels.json");
    let o = segment_cpu(
        &inp,
        &model,
        &out,
        &["--labels-json", "--report", s(&report)],
    );
    let e = assert_one_error(&o, "another output");
    assert!(e.contains("b.labels.json"), "{e}");
    assert!(
        !out.join("a.nii.gz").exists(),
        "refused before the first case"
    );
    assert!(!report.exists());
}
