//! Label maps that carry their class names: intent LABEL and the Caret XML extension, read back in
//! Rust and by nibabel (when python3 has it; CI sets VOXTILE_REQUIRE_NIBABEL), NIfTI-1 and -2,
//! and the labels.json sidecar.

use ndarray::Array3;
use std::process::Command;
use voxtile::volume::{self, Header, LabelNames, LabelOptions};

fn names() -> LabelNames {
    LabelNames::new([
        "background",
        "liver",
        "spleen & <kidney>",
        "odd ]]> name",
        "",
        "aorta",
    ])
}

fn labels() -> Array3<u16> {
    Array3::from_shape_fn((6, 5, 4), |(i, j, k)| ((i + 2 * j + 3 * k) % 6) as u16)
}

fn like() -> Header {
    let mut h = Header::new([6, 5, 4], 1, [0.8, 0.9, 2.5]);
    h.srow_x[3] = -10.0;
    h
}

#[test]
fn caret_xml_round_trips() {
    let n = names();
    let xml = n.caret_xml();
    assert!(
        xml.contains("<CaretExtension") && xml.contains("<LabelTable>"),
        "{xml}"
    );
    assert!(
        xml.contains("<VolumeType><![CDATA[Label]]></VolumeType>"),
        "{xml}"
    );
    assert_eq!(LabelNames::from_caret_xml(&xml).unwrap(), n);
    assert!(LabelNames::from_caret_xml("<x/>").is_err());
}

#[test]
fn names_are_written_and_read_back_nifti1_and_nifti2() {
    let dir = tempfile::tempdir().unwrap();
    let n = names();
    for (file, nifti2) in [("a.nii.gz", false), ("b.nii", true), ("c.nii", false)] {
        let p = dir.path().join(file);
        let opts = LabelOptions {
            names: Some(&n),
            nifti2,
        };
        volume::write_labels_with(&p, labels().view(), &like(), &opts).unwrap();
        let v = volume::read(&p).unwrap();
        assert_eq!(v.header.version, if nifti2 { 2 } else { 1 });
        assert_eq!(v.header.intent_code, volume::NIFTI_INTENT_LABEL);
        let (a, b) = (v.header.affine(), like().affine());
        assert!(
            (0..16).all(|i| (a[i / 4][i % 4] - b[i / 4][i % 4]).abs() < 1e-6),
            "{a:?} != {b:?}"
        );
        let want = labels().mapv(|x| x as f32);
        assert_eq!(v.data.index_axis(ndarray::Axis(0), 0), want.view());
        assert_eq!(volume::read_label_names(&p).unwrap(), Some(n.clone()));
    }
    // Without names: no extension, no intent, as before.
    let p = dir.path().join("plain.nii");
    volume::write_labels(&p, labels().view(), &like()).unwrap();
    assert_eq!(volume::read_label_names(&p).unwrap(), None);
    assert_eq!(volume::read_header(&p).unwrap().intent_code, 0);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 352 + 6 * 5 * 4);
}

#[test]
fn labels_json_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("labels.json");
    volume::write_labels_json(&p, &names()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    assert_eq!(v["1"], "liver");
    assert_eq!(v["5"], "aorta");
    assert!(v.get("4").is_none(), "{v}");
}

#[test]
fn nibabel_reads_the_names() {
    let probe = Command::new("python3")
        .args(["-c", "import nibabel"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        assert!(
            std::env::var_os("VOXTILE_REQUIRE_NIBABEL").is_none(),
            "nibabel is required"
        );
        eprintln!("skipping: python3 nibabel not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let n = names();
    let mut paths = Vec::new();
    for (file, nifti2) in [("a.nii.gz", false), ("b.nii.gz", true)] {
        let p = dir.path().join(file);
        let opts = LabelOptions {
            names: Some(&n),
            nifti2,
        };
        volume::write_labels_with(&p, labels().view(), &like(), &opts).unwrap();
        paths.push(p.to_str().unwrap().to_string());
    }
    // TotalSegmentator's reader: extensions[0].get_content() as XML, Label Key -> name.
    let script = r#"
import sys, re, nibabel as nib, numpy as np
for path in sys.argv[1:]:
    img = nib.load(path)
    assert img.header.get_intent()[0] == 'label', img.header.get_intent()
    assert len(img.header.extensions) == 1, img.header.extensions
    xml = img.header.extensions[0].get_content()
    import xml.etree.ElementTree as ET
    root = ET.fromstring(xml)
    names = {int(l.get('Key')): l.text for l in root.iter('Label')}
    assert names == {0: 'background', 1: 'liver', 2: 'spleen & <kidney>', 3: 'odd ]]> name', 5: 'aorta'}, names
    d = np.asarray(img.dataobj)
    i, j, k = np.indices(d.shape)
    assert (d == (i + 2 * j + 3 * k) % 6).all()
print("nibabel ok")
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(&paths)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The label table's colours (Caret XML floats, the 3D Slicer table's bytes) are the preview's.
#[test]
fn the_tables_and_the_preview_share_one_colour_per_label() {
    let n = LabelNames::new((0..=14).map(|i| format!("class {i}")));
    let xml = n.caret_xml();
    let attr = |label: &str, key: &str| -> u8 {
        let v = label.split(&format!("{key}=\"")).nth(1).unwrap();
        let v: f64 = v.split('"').next().unwrap().parse().unwrap();
        (v * 255.0).round() as u8
    };
    let ctbl = n.slicer_ctbl();
    let rows: Vec<&str> = ctbl.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 15, "{ctbl}");
    for (l, label) in xml.split("<Label ").skip(1).enumerate() {
        let want = if l == 0 {
            [0; 3]
        } else {
            voxtile::pipeline::preview::label_colour(l as u16)
        };
        let got = ["Red", "Green", "Blue"].map(|k| attr(label, k));
        assert_eq!(got, want, "label {l} in the Caret table");
        let alpha = if l == 0 { 0 } else { 255 };
        let [r, g, b] = want;
        assert_eq!(rows[l], format!("{l} class_{l} {r} {g} {b} {alpha}"));
    }
}
