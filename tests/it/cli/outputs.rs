//! What `voxtile segment` leaves for a user to read: the `--report` (one schema whatever ran,
//! with provenance and per-class volumes; JSON Lines appended by a resumed batch), label maps
//! that carry their class names (intent LABEL, Caret extension, `--labels-json`), and `-o FOLDER/`
//! for one input.

use crate::common::nifti::{f32_data, nifti, Geo};
use crate::common::small::{ball, conv_model};
use crate::common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

const DIMS: [usize; 3] = [16, 12, 10];
const SPACING: [f32; 3] = [0.8, 0.9, 2.5];

/// A ball volume of [`DIMS`] with voxels of [`SPACING`] mm.
fn volume(path: &Path) -> PathBuf {
    let geo = Geo {
        pixdim: SPACING,
        srow: [
            [SPACING[0], 0.0, 0.0, 0.0],
            [0.0, SPACING[1], 0.0, 0.0],
            [0.0, 0.0, SPACING[2], 0.0],
        ],
        ..Geo::default()
    };
    let n = DIMS.iter().product();
    let dims = DIMS.map(|d| d as i64);
    std::fs::write(path, nifti(&dims, 16, 32, &geo, &f32_data(n, ball(DIMS)))).unwrap();
    path.to_path_buf()
}

fn ok(o: &std::process::Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "voxtile failed: {err}");
}

/// Every record of a report file (JSON Lines).
fn records(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// Whether `a` and `b` have one schema: the same keys at every level, arrays' elements alike;
/// a null stands for a value of any shape (a nullable field: `gpu`, `provenance.manifest`).
fn same_shape(a: &Value, b: &Value, at: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Null, _) | (_, Value::Null) => Ok(()),
        (Value::Object(x), Value::Object(y)) => {
            let (kx, ky): (BTreeSet<_>, BTreeSet<_>) = (x.keys().collect(), y.keys().collect());
            if kx != ky {
                let diff: Vec<_> = kx.symmetric_difference(&ky).collect();
                return Err(format!("{at}: keys differ: {diff:?}"));
            }
            x.iter()
                .try_for_each(|(k, v)| same_shape(v, &y[k], &format!("{at}/{k}")))
        }
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .chain(y)
            .zip(x.iter().chain(y).skip(1))
            .try_for_each(|(p, q)| same_shape(p, q, &format!("{at}[]"))),
        (x, y) if std::mem::discriminant(x) == std::mem::discriminant(y) => Ok(()),
        _ => Err(format!("{at}: {a} vs {b}")),
    }
}

fn sha256_hex(p: &Path) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(std::fs::read(p).unwrap());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The label values of a label map and how often each occurs.
fn counts(p: &Path) -> std::collections::BTreeMap<u64, u64> {
    let v = voxtile::volume::read(p).unwrap();
    let mut m = std::collections::BTreeMap::new();
    for &x in v.data.iter() {
        *m.entry(x as u64).or_insert(0) += 1;
    }
    m
}

/// Per class: mL = voxels × voxel volume, voxels = what the label map holds.
fn assert_volumes(r: &Value, labels: &Path) {
    let voxel_ml = SPACING.iter().map(|&s| s as f64).product::<f64>() / 1000.0;
    let got = r["voxel_volume_ml"].as_f64().unwrap();
    assert!(
        (got - voxel_ml).abs() < 1e-9,
        "voxel volume {got} vs {voxel_ml}"
    );
    let want = counts(labels);
    let classes = r["classes"].as_array().unwrap();
    for c in classes {
        let (l, n) = (c["label"].as_u64().unwrap(), c["voxels"].as_u64().unwrap());
        assert_eq!(want.get(&l).copied().unwrap_or(0), n, "voxels of label {l}");
        let ml = c["volume_ml"].as_f64().unwrap();
        assert!((ml - n as f64 * voxel_ml).abs() < 1e-9 * (1.0 + ml), "{c}");
    }
    let total: u64 = classes.iter().map(|c| c["voxels"].as_u64().unwrap()).sum();
    assert_eq!(
        total,
        DIMS.iter().product::<usize>() as u64,
        "every voxel counted"
    );
}

#[test]
fn report_has_one_schema_with_provenance_and_volumes() {
    let dir = tempdir();
    let d = dir.path();
    let input = volume(&d.join("case.nii"));
    let model = conv_model(&d.join("m.onnx"), 3);
    let man_model = conv_model(&d.join("named.onnx"), 3);
    std::fs::write(
        d.join("named.toml"),
        "classes = [\"background\", \"liver\", \"spleen\"]\nroi = 8\n",
    )
    .unwrap();
    let run = |name: &str, model: &Path, extra: &[&str]| -> Value {
        let report = d.join(format!("{name}.json"));
        let mut a = vec!["--roi", "8", "--report", s(&report)];
        a.extend_from_slice(extra);
        ok(&segment_cpu(
            &input,
            model,
            &d.join(format!("{name}.nii.gz")),
            &a,
        ));
        let r = records(&report);
        assert_eq!(r.len(), 1, "one record for one input");
        r.into_iter().next().unwrap()
    };
    let png = d.join("p.png");
    let plain = run("plain", &model, &[]);
    let variants = [
        ("tta", run("tta", &model, &["--tta", "0,1"])),
        ("preview", run("preview", &model, &["--preview", s(&png)])),
        ("manifest", run("manifest", &man_model, &[])),
    ];
    for (what, r) in &variants {
        if let Err(e) = same_shape(&plain, r, "") {
            panic!("the report with {what} has another schema: {e}");
        }
    }
    assert_eq!(
        variants[0].1["passes"], 4,
        "the TTA run did run its mirrors"
    );

    let p = &plain["provenance"];
    assert_eq!(plain["schema"], 1);
    assert_eq!(p["tool"], "voxtile");
    assert_eq!(p["version"], env!("CARGO_PKG_VERSION"));
    assert!(p["command_line"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--roi"));
    assert_eq!(p["models"][0]["path"], s(&model));
    assert_eq!(p["models"][0]["sha256"], sha256_hex(&model));
    assert_eq!(p["manifest"], Value::Null);
    for k in [
        "roi",
        "overlap",
        "blend",
        "batch",
        "memory_budget",
        "device",
        "tta",
    ] {
        assert!(p["options"].get(k).is_some(), "options lack {k}: {p}");
    }
    assert_eq!(p["options"]["device"], "cpu");
    assert_eq!(p["options"]["roi"], serde_json::json!([8, 8, 8]));
    assert_eq!(
        variants[0].1["provenance"]["options"]["tta"],
        serde_json::json!([0, 1])
    );
    assert!(
        plain["device"].as_str().unwrap().starts_with("cpu"),
        "the device used"
    );
    assert_eq!(plain["compute_dtype"], "float32");
    assert_eq!(plain["status"], "done");
    assert_eq!(plain["error"], Value::Null);
    assert_volumes(&plain, &d.join("plain.nii.gz"));

    let m = &variants[2].1;
    let mp = &m["provenance"]["manifest"];
    assert_eq!(mp["sha256"], sha256_hex(&d.join("named.toml")));
    let names: Vec<&str> = m["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["background", "liver", "spleen"]);
    assert_volumes(m, &d.join("manifest.nii.gz"));
}

#[test]
fn report_to_stdout_is_one_json_record() {
    let dir = tempdir();
    let d = dir.path();
    let input = volume(&d.join("case.nii"));
    let model = conv_model(&d.join("m.onnx"), 2);
    let o = segment_cpu(&input, &model, &d.join("o.nii.gz"), &["--report", "-"]);
    ok(&o);
    let out = String::from_utf8(o.stdout).unwrap();
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    let r: Value = serde_json::from_str(&out).expect("stdout is JSON");
    assert_eq!(r["provenance"]["models"][0]["sha256"], sha256_hex(&model));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("sha256"));
}

#[test]
fn resumed_batch_appends_records_of_one_schema() {
    let dir = tempdir();
    let d = dir.path();
    let inputs = d.join("in");
    std::fs::create_dir(&inputs).unwrap();
    volume(&inputs.join("a.nii"));
    volume(&inputs.join("b.nii"));
    let model = conv_model(&d.join("m.onnx"), 2);
    let (out, report) = (d.join("out"), d.join("r.jsonl"));
    let seg = || {
        let a = ["--report", s(&report), "--labels-json"];
        ok(&segment_cpu(&inputs, &model, &out, &a));
    };
    seg();
    assert_eq!(records(&report).len(), 2);
    assert!(out.join("a.labels.json").exists() && out.join("b.labels.json").exists());
    seg();
    let r = records(&report);
    assert_eq!(r.len(), 4, "the resumed batch appended");
    for l in &r {
        same_shape(l, &r[0], "").unwrap_or_else(|e| panic!("not one schema: {e}"));
        assert_eq!(l["provenance"]["models"][0]["sha256"], sha256_hex(&model));
    }
    assert!(r[..2].iter().all(|l| l["status"] == "done"));
    assert!(r[2..]
        .iter()
        .all(|l| l["status"].as_str().unwrap().starts_with("skipped")));
    assert_eq!(r[2]["classes"], Value::Null);
}

/// intent_code, intent_name and the Caret XML of a NIfTI-1 label map, parsed here by hand.
fn label_header(p: &Path) -> (i16, String, String) {
    let mut b = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap())
        .read_to_end(&mut b)
        .unwrap();
    let intent = i16::from_le_bytes([b[68], b[69]]);
    let name = String::from_utf8_lossy(&b[328..344])
        .trim_end_matches('\0')
        .to_string();
    let vox = f32::from_le_bytes(b[108..112].try_into().unwrap()) as usize;
    assert_eq!(b[348], 1, "the extension flag");
    let mut xml = String::new();
    let mut at = 352;
    while at + 8 <= vox {
        let size = i32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let code = i32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap());
        assert!(
            size >= 16 && size.is_multiple_of(16) && at + size <= vox,
            "extension size {size}"
        );
        if code == voxtile::volume::NIFTI_ECODE_IGNORE {
            xml = String::from_utf8_lossy(&b[at + 8..at + size]).to_string();
        }
        at += size;
    }
    (intent, name, xml)
}

/// A Python with nibabel: /tmp/fmtvenv's, else python3's; None (skip) unless
/// VOXTILE_REQUIRE_NIBABEL is set.
fn nibabel_python() -> Option<&'static str> {
    for py in ["/tmp/fmtvenv/bin/python", "python3"] {
        let probe = Command::new(py).args(["-c", "import nibabel"]).output();
        if matches!(&probe, Ok(o) if o.status.success()) {
            return Some(py);
        }
    }
    let required = std::env::var_os("VOXTILE_REQUIRE_NIBABEL").is_some();
    assert!(!required, "nibabel is required");
    eprintln!("skipping the nibabel part: no python with nibabel");
    None
}

#[test]
fn label_maps_carry_class_names() {
    let dir = tempdir();
    let d = dir.path();
    let input = volume(&d.join("case.nii"));
    let model = conv_model(&d.join("organs.onnx"), 3);
    std::fs::write(
        d.join("organs.toml"),
        "classes = [\"background\", \"liver\", \"spleen & <kidney>\"]\n[remap]\n1 = 7\n",
    )
    .unwrap();
    let out = d.join("seg.nii.gz");
    ok(&segment_cpu(
        &input,
        &model,
        &out,
        &["--labels-json", "--color-table"],
    ));
    let (intent, name, xml) = label_header(&out);
    assert_eq!(intent, 1002, "NIFTI_INTENT_LABEL");
    assert_eq!(name, "labels");
    assert!(
        xml.contains("<CaretExtension") && xml.contains("Key=\"7\""),
        "{xml}"
    );
    let names = voxtile::volume::read_label_names(&out).unwrap().unwrap();
    assert_eq!(names.names[0], "background");
    assert_eq!(names.names[7], "liver");
    assert_eq!(names.names[2], "spleen & <kidney>");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("seg.labels.json")).unwrap()).unwrap();
    assert_eq!(json["7"], "liver");
    assert_eq!(json["2"], "spleen & <kidney>");
    // The 3D Slicer colour table: "value name R G B A", spaces as `_`, the preview's colours.
    let ctbl = std::fs::read_to_string(d.join("seg.ctbl")).unwrap();
    let rows: Vec<&str> = ctbl.lines().filter(|l| !l.starts_with('#')).collect();
    let [r, g, b] = voxtile::volume::label_colour(7);
    assert_eq!(
        rows,
        [
            "0 background 0 0 0 0".to_string(),
            "2 spleen_&_<kidney> 60 180 75 255".to_string(),
            format!("7 liver {r} {g} {b} 255"),
        ],
        "{ctbl}"
    );

    // No manifest: still a label map, its values named background and label_<k>.
    let plain_model = conv_model(&d.join("plain.onnx"), 3);
    let plain = d.join("plain.nii.gz");
    ok(&segment_cpu(&input, &plain_model, &plain, &[]));
    assert_eq!(label_header(&plain).0, 1002);
    let names = voxtile::volume::read_label_names(&plain).unwrap().unwrap();
    assert_eq!(names.names, ["background", "label_1", "label_2"]);
    assert!(
        !d.join("plain.labels.json").exists() && !d.join("plain.ctbl").exists(),
        "only with --labels-json, --color-table"
    );

    let Some(py) = nibabel_python() else {
        return;
    };
    // As TotalSegmentator's load_multilabel_nifti reads it: extensions[0].get_content() parsed
    // as XML (CaretExtension/VolumeInformation/LabelTable/Label, Key and text).
    let code = "import sys, json, nibabel as nib, xml.etree.ElementTree as ET\n\
                h = nib.load(sys.argv[1]).header\n\
                assert int(h['intent_code']) == 1002, int(h['intent_code'])\n\
                x = h.extensions[0].get_content()\n\
                t = ET.fromstring(x)\n\
                assert t.tag == 'CaretExtension', t.tag\n\
                ls = t.find('VolumeInformation').find('LabelTable').findall('Label')\n\
                c = lambda e, k: round(float(e.get(k)) * 255)\n\
                print(json.dumps({e.get('Key'): [e.text, c(e, 'Red'), c(e, 'Green'), c(e, 'Blue')] for e in ls}))";
    let o = Command::new(py)
        .args(["-c", code, s(&out)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "nibabel: {err}");
    let table: Value = serde_json::from_slice(&o.stdout).unwrap();
    let entry = |l: u16, n: &str| {
        let [r, g, b] = voxtile::volume::label_colour(l);
        serde_json::json!([n, r, g, b])
    };
    assert_eq!(
        table,
        serde_json::json!({
            "0": entry(0, "background"),
            "2": entry(2, "spleen & <kidney>"),
            "7": entry(7, "liver"),
        })
    );
}

/// A one-channel model (labels 0 and 1) takes its classes as one name (the foreground) or two
/// (background first); three are refused.
#[test]
fn a_one_channel_model_takes_background_and_foreground_names() {
    let dir = tempdir();
    let d = dir.path();
    let input = volume(&d.join("case.nii"));
    let model = conv_model(&d.join("brain.onnx"), 1);
    let man = d.join("m.toml");
    for (classes, want) in [
        ("[\"background\", \"brain\"]", ["background", "brain"]),
        ("[\"air\", \"brain\"]", ["air", "brain"]),
        ("[\"brain\"]", ["background", "brain"]),
    ] {
        std::fs::write(&man, format!("classes = {classes}\n")).unwrap();
        let out = d.join("seg.nii.gz");
        let o = segment_cpu(&input, &model, &out, &["--manifest", s(&man), "--force"]);
        ok(&o);
        let names = voxtile::volume::read_label_names(&out).unwrap().unwrap();
        assert_eq!(names.names, want, "{classes}");
    }
    std::fs::write(&man, "classes = [\"a\", \"b\", \"c\"]\n").unwrap();
    let out = d.join("three.nii.gz");
    let o = segment_cpu(&input, &model, &out, &["--manifest", s(&man)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !out.exists());
    assert!(err.contains("lists 3 class(es)"), "{err}");
}

#[test]
fn output_folder_for_one_input() {
    let dir = tempdir();
    let d = dir.path();
    let input = volume(&d.join("case.nii"));
    let model = conv_model(&d.join("m.onnx"), 2);
    // A folder that does not exist yet, named with a trailing slash: made, <case>.nii.gz in it.
    let new = format!("{}/new/deeper/", d.display());
    ok(&voxtile(&[
        "segment",
        s(&input),
        "-m",
        s(&model),
        "-o",
        &new,
        "--device",
        "cpu",
    ]));
    assert!(d.join("new/deeper/case.nii.gz").exists());
    // An existing folder without the slash; the sidecar beside the label map.
    std::fs::create_dir(d.join("out")).unwrap();
    let out = d.join("out");
    ok(&segment_cpu(&input, &model, &out, &["--labels-json"]));
    let mut made: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    made.sort();
    assert_eq!(made, ["case.labels.json", "case.nii.gz"]);
    // The file there is kept without --force.
    let o = segment_cpu(&input, &model, &out, &[]);
    assert_one_error(&o, "case.nii.gz");
    // Refused (another output is wrong): the folder it would have made is removed again.
    let gone = format!("{}/gone/", d.display());
    let bad = d.join("p.txt");
    let o = voxtile(&[
        "segment",
        s(&input),
        "-m",
        s(&model),
        "-o",
        &gone,
        "--device",
        "cpu",
        "--preview",
        s(&bad),
    ]);
    assert_one_error(&o, "p.txt");
    assert!(!d.join("gone").exists(), "no folder left by a refused run");
}
