//! The inputs users bring to `voxtile segment`: `--shard auto` under a Slurm job array or a
//! Kubernetes Indexed Job, nnU-Net channel files (`CASE_0000`, `CASE_0001`) as one case, DICOM
//! series folders in a batch and `--series`, and converter hints for formats voxtile does not read.

use crate::common::nifti::nifti_f32;
use crate::common::small::{ball, ball_volume, conv_model};
use crate::common::{assert_one_error, s, segment_cpu, tempdir, voxtile, voxtile_bin};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every variable `--shard auto` reads, removed from the child's environment before `vars` are set.
const SHARD_VARS: [&str; 7] = [
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "JOB_COMPLETION_INDEX",
    "VOXTILE_SHARD_COUNT",
];

/// `voxtile ARGS` with exactly `vars` of the shard variables set.
fn voxtile_env(args: &[&str], vars: &[(&str, String)]) -> std::process::Output {
    let mut c = std::process::Command::new(voxtile_bin());
    c.args(args);
    for v in SHARD_VARS {
        c.env_remove(v);
    }
    c.envs(vars.iter().map(|(k, v)| (k, v)));
    c.output().expect("voxtile runs")
}

/// The `.nii.gz` names in `dir` (empty when it does not exist).
fn outputs(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.ends_with(".nii.gz"))
                .collect()
        })
        .unwrap_or_default()
}

fn ok(o: &std::process::Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A folder of `n` small volumes `c0.nii` … .
fn batch_folder(root: &Path, n: usize) -> PathBuf {
    let dir = root.join("cases");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..n {
        ball_volume(&dir.join(format!("c{i}.nii")), [6, 7, 5 + i]);
    }
    dir
}

#[test]
fn shard_auto_splits_a_batch_disjointly_and_completely() {
    let t = tempdir();
    let cases = batch_folder(t.path(), 5);
    let model = conv_model(&t.path().join("m.onnx"), 2);
    let all: BTreeSet<String> = (0..5).map(|i| format!("c{i}.nii.gz")).collect();
    type Env = Vec<(&'static str, String)>;
    type Scheme<'a> = (&'a str, usize, &'a dyn Fn(usize) -> Env);
    // Slurm with ID and COUNT (0-based), Slurm with MIN/MAX only (1-based, --array=1-3), an
    // Indexed Job with VOXTILE_SHARD_COUNT, and one with the count in `auto/N`.
    let schemes: [Scheme; 4] = [
        ("auto", 3, &|k| {
            vec![
                ("SLURM_ARRAY_TASK_ID", k.to_string()),
                ("SLURM_ARRAY_TASK_COUNT", "3".into()),
            ]
        }),
        ("auto", 3, &|k| {
            vec![
                ("SLURM_ARRAY_TASK_ID", (k + 1).to_string()),
                ("SLURM_ARRAY_TASK_MIN", "1".into()),
                ("SLURM_ARRAY_TASK_MAX", "3".into()),
            ]
        }),
        ("auto", 2, &|k| {
            vec![
                ("JOB_COMPLETION_INDEX", k.to_string()),
                ("VOXTILE_SHARD_COUNT", "2".into()),
            ]
        }),
        ("auto/4", 4, &|k| {
            vec![("JOB_COMPLETION_INDEX", k.to_string())]
        }),
    ];
    for (i, (spec, n, env)) in schemes.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for k in 0..*n {
            let out = t.path().join(format!("out{i}_{k}"));
            let o = voxtile_env(
                &[
                    "segment",
                    s(&cases),
                    "-m",
                    s(&model),
                    "-o",
                    s(&out),
                    "--device",
                    "cpu",
                    "--roi",
                    "8",
                    "--shard",
                    spec,
                ],
                &env(k),
            );
            ok(&o);
            let mine = outputs(&out);
            assert!(
                mine.is_disjoint(&seen),
                "scheme {i}: shard {k} repeats {mine:?}"
            );
            seen.extend(mine);
        }
        assert_eq!(seen, all, "scheme {i}: every case once");
    }
}

#[test]
fn invalid_shards_are_refused() {
    let t = tempdir();
    let cases = batch_folder(t.path(), 2);
    let vol = cases.join("c0.nii");
    let model = conv_model(&t.path().join("m.onnx"), 2);
    let out = t.path().join("out");
    let seg = |input: &Path, o: &Path, shard: &str, env: &[(&str, String)]| {
        let a = [
            "segment",
            s(input),
            "-m",
            s(&model),
            "-o",
            s(o),
            "--device",
            "cpu",
            "--shard",
            shard,
        ];
        voxtile_env(&a, env)
    };
    let one = t.path().join("one.nii.gz");
    // Single-file mode: an invalid shard is refused (it was accepted and ignored), and so is a
    // valid one (a shard of one volume means nothing).
    assert_one_error(&seg(&vol, &one, "3/2", &[]), "--shard takes k/n");
    assert_one_error(&seg(&vol, &one, "0/2", &[]), "--shard splits a batch");
    for bad in ["3/2", "2/2", "0/0", "x", "auto/0"] {
        assert_one_error(&seg(&cases, &out, bad, &[]), "--shard");
    }
    assert_one_error(&seg(&cases, &out, "auto", &[]), "SLURM_ARRAY_TASK_ID");
    let k8s = [("JOB_COMPLETION_INDEX", "1".to_string())];
    assert_one_error(&seg(&cases, &out, "auto", &k8s), "VOXTILE_SHARD_COUNT");
    let past = [
        ("SLURM_ARRAY_TASK_ID", "2".to_string()),
        ("SLURM_ARRAY_TASK_COUNT", "2".to_string()),
    ];
    assert_one_error(&seg(&cases, &out, "auto", &past), "not below");
    assert!(!one.exists() && outputs(&out).is_empty());
}

/// One 3x3x3 Conv (pads 1), 2 input channels -> 3 classes.
fn two_channel_model(path: &Path) -> PathBuf {
    crate::common::small::conv_model_in(path, 2, 3)
}

/// The voxels of a volume file voxtile wrote.
fn voxels(p: &Path) -> Vec<f32> {
    let v = voxtile::volume::read(p).unwrap_or_else(|e| panic!("{e}"));
    v.data.iter().copied().collect()
}

#[test]
fn nnunet_channel_files_are_one_case() {
    let t = tempdir();
    let dims = [7usize, 6, 5];
    let n = dims.iter().product::<usize>();
    let d = dims.map(|v| v as i64);
    let second = |i: usize| ((i * 13) % 11) as f32 * 0.1;
    let cases = t.path().join("imagesTs");
    std::fs::create_dir(&cases).unwrap();
    std::fs::write(cases.join("case_0000.nii"), nifti_f32(&d, ball(dims))).unwrap();
    std::fs::write(cases.join("case_0001.nii"), nifti_f32(&d, second)).unwrap();
    // The same two channels in one 4-D file.
    let stacked = t.path().join("stacked.nii");
    let both = |i: usize| if i < n { ball(dims)(i) } else { second(i - n) };
    std::fs::write(&stacked, nifti_f32(&[d[0], d[1], d[2], 2], both)).unwrap();
    let model = two_channel_model(&t.path().join("m2.onnx"));

    let (out, logits) = (t.path().join("out"), t.path().join("logits"));
    let o = segment_cpu(
        &cases,
        &model,
        &out,
        &["--roi", "8", "--logits", s(&logits)],
    );
    ok(&o);
    assert_eq!(outputs(&out), BTreeSet::from(["case.nii.gz".to_string()]));
    let (want, want_logits) = (t.path().join("ref.nii.gz"), t.path().join("ref_lg.nii.gz"));
    ok(&segment_cpu(
        &stacked,
        &model,
        &want,
        &["--roi", "8", "--logits", s(&want_logits)],
    ));
    assert_eq!(voxels(&out.join("case.nii.gz")), voxels(&want));
    assert_eq!(voxels(&logits.join("case.nii.gz")), voxels(&want_logits));

    // A lone CASE_0000 with a one-channel model is the case CASE.
    let lone = t.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    std::fs::copy(cases.join("case_0000.nii"), lone.join("solo_0000.nii")).unwrap();
    let m1 = conv_model(&t.path().join("m1.onnx"), 2);
    let out1 = t.path().join("out1");
    ok(&segment_cpu(&lone, &m1, &out1, &["--roi", "8"]));
    assert_eq!(outputs(&out1), BTreeSet::from(["solo.nii.gz".to_string()]));
    // ... and with the two-channel model, an error in the naming's terms.
    let out2 = t.path().join("out2");
    let o = segment_cpu(&lone, &model, &out2, &["--roi", "8"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("solo_0000.nii") && err.contains("nnU-Net") && err.contains("takes 2"),
        "{err}"
    );
    assert!(outputs(&out2).is_empty());
}

#[test]
fn channel_files_on_different_grids_are_refused() {
    let t = tempdir();
    let cases = t.path().join("in");
    std::fs::create_dir(&cases).unwrap();
    ball_volume(&cases.join("p_0000.nii"), [7, 6, 5]);
    ball_volume(&cases.join("p_0001.nii"), [7, 6, 4]);
    let model = two_channel_model(&t.path().join("m2.onnx"));
    let out = t.path().join("out");
    let o = segment_cpu(&cases, &model, &out, &["--roi", "8"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("failed:") && l.contains("p_0001.nii"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("one voxel grid") && line.contains("7x6x4"),
        "{line}"
    );
    assert!(!err.contains("panicked"));
    assert!(outputs(&out).is_empty());
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/volumes")
        .join(name)
}

/// Copy the files of fixture series folders into `dst`.
fn copy_series(dst: &Path, series: &[&str]) {
    std::fs::create_dir_all(dst).unwrap();
    for d in series {
        for e in std::fs::read_dir(fixture(d)).unwrap() {
            let e = e.unwrap();
            let to = dst.join(format!("{d}_{}", e.file_name().to_string_lossy()));
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

#[test]
fn a_dicom_sub_folder_is_one_case_of_a_batch() {
    let t = tempdir();
    let cases = t.path().join("cases");
    copy_series(&cases.join("ct"), &["dicom_ct"]);
    ball_volume(&cases.join("ball.nii"), [6, 6, 6]);
    let model = conv_model(&t.path().join("m.onnx"), 2);
    let out = t.path().join("out");
    ok(&segment_cpu(&cases, &model, &out, &["--roi", "8"]));
    assert_eq!(
        outputs(&out),
        BTreeSet::from(["ball.nii.gz".to_string(), "ct.nii.gz".to_string()])
    );
    // The same labels as the series folder segmented on its own (one input: not a batch).
    let alone = t.path().join("alone.nii.gz");
    ok(&segment_cpu(
        &cases.join("ct"),
        &model,
        &alone,
        &["--roi", "8"],
    ));
    let got = voxels(&out.join("ct.nii.gz"));
    assert_eq!(got.len(), 20 * 24 * 12);
    assert_eq!(got, voxels(&alone));
}

#[test]
fn series_picks_one_of_several() {
    let t = tempdir();
    let dir = t.path().join("mixed");
    copy_series(&dir, &["dicom_ct", "dicom_mr_rle"]);
    let model = conv_model(&t.path().join("m.onnx"), 2);
    let out = t.path().join("o.nii.gz");
    let o = segment_cpu(&dir, &model, &out, &["--roi", "8"]);
    let err = assert_one_error(&o, "several series");
    let line = err.lines().find(|l| l.contains("--series")).unwrap();
    // The MR series (9 files), its UID the last dotted number before "(9 files".
    let mr = line.split("; ").find(|p| p.contains("(9 files")).unwrap();
    let uid = mr
        .split_whitespace()
        .rfind(|w| w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.'))
        .unwrap()
        .to_string();
    ok(&segment_cpu(
        &dir,
        &model,
        &out,
        &["--roi", "8", "--series", &uid],
    ));
    let v = voxtile::volume::read(&out).unwrap();
    let want = voxtile::volume::read(fixture("dicom_mr_rle")).unwrap();
    assert_eq!(v.shape(), want.shape());
    ok(&voxtile(&["info", s(&dir), "--series", &uid]));
    assert_one_error(&voxtile(&["info", s(&dir)]), "several series");
    // A UID no series has, and a UID given with a file.
    let o = segment_cpu(
        &dir,
        &model,
        &t.path().join("x.nii.gz"),
        &["--series", "1.2.3"],
    );
    assert_one_error(&o, "no series 1.2.3");
    let vol = ball_volume(&t.path().join("b.nii"), [6, 6, 6]);
    let o = segment_cpu(
        &vol,
        &model,
        &t.path().join("y.nii.gz"),
        &["--series", "1.2.3"],
    );
    assert_one_error(&o, "picks a series in a DICOM folder");
}

#[test]
fn other_formats_get_one_line_naming_a_converter() {
    let t = tempdir();
    let model = conv_model(&t.path().join("m.onnx"), 2);
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x10\x08\0\0\0\0";
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "scan.mgz",
            b"\x1f\x8b\x08\0\0\0\0\0",
            "scan.mgz: FreeSurfer MGZ/MGH is not read; convert with 'mri_convert scan.mgz scan.nii.gz'",
        ),
        ("renamed.nii", png, "renamed.nii: a PNG image is not read"),
        ("arr.npy", b"\x93NUMPY\x01\0v\0", "arr.npy: a NumPy array"),
    ];
    for (name, bytes, want) in cases {
        let p = t.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = segment_cpu(&p, &model, &t.path().join("o.nii.gz"), &[]);
        let err = assert_one_error(&o, want);
        assert!(!err.contains("sizeof_hdr"), "{err}");
    }
    // A folder holding only files voxtile does not read says what they are.
    let dir = t.path().join("pngs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("s001.png"), png).unwrap();
    let o = segment_cpu(&dir, &model, &t.path().join("out"), &[]);
    assert_one_error(&o, "s001.png: a PNG image is not read");
}
