//! End to end through the `voxtile` binary: the shipped sample, info/inspect, and bad input.

use crate::common::nifti::*;
use crate::common::onnx::*;
use crate::common::*;
use prost::Message;
use std::path::Path;
use std::process::Command;

/// A little-endian NIfTI-1 file written by hand: sform identity, units unknown.
fn nifti_bytes(dims: &[i16], datatype: i16, bitpix: i16, data: &[u8]) -> Vec<u8> {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let geo = Geo {
        xyzt_units: 0,
        ..Geo::default()
    };
    nifti(&dims, datatype, bitpix, &geo, data)
}

fn f32_volume(dims: &[i16]) -> Vec<u8> {
    let n: usize = dims.iter().map(|&d| d as usize).product();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.1).to_le_bytes())
        .collect();
    nifti_bytes(dims, 16, 32, &data)
}

/// Runs `segment` on a bad input; asserts exit ≠ 0, one error line naming `names`, no output left.
fn assert_refused(dir: &Path, input: &Path, model: &Path, names: &str, extra: &[&str]) -> String {
    let out = dir.join("seg_out.nii.gz");
    let o = segment_cpu(input, model, &out, extra);
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "expected failure for {}, stderr: {stderr}",
        input.display()
    );
    assert_one_error(&o, names);
    assert!(!out.exists(), "no output file may be left behind");
    let leftovers = temp_files(dir);
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    stderr
}

#[test]
fn sample_brain_mask_matches_onnxruntime() {
    let dir = tempdir();
    let out = dir.path().join("mask.nii.gz");
    let logits = dir.path().join("prob.nii.gz");
    let report = dir.path().join("report.json");
    let o = voxtile(&[
        "segment",
        data("mni_t1_128.nii.gz").to_str().unwrap(),
        "--model",
        data("deepbrain.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--logits",
        logits.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let input = voxtile::volume::read(data("mni_t1_128.nii.gz")).unwrap();
    let ort = voxtile::volume::read(data("mni_t1_128_prob_ort.nii.gz")).unwrap();
    let mask = voxtile::volume::read(&out).unwrap();
    let prob = voxtile::volume::read(&logits).unwrap();
    // Same geometry as the input.
    assert_eq!(mask.header.shape(), input.header.shape());
    assert_eq!(mask.header.affine(), input.header.affine());
    assert_eq!(mask.header.dtype_name(), "uint8");
    // Probabilities vs onnxruntime, and the mask vs ORT's thresholded probabilities.
    let e = rel_l2(prob.data.iter(), ort.data.iter());
    eprintln!("deepbrain sample: rel L2 of probabilities vs onnxruntime = {e:.3e}");
    assert!(e < 1e-4, "prob rel L2 {e}");
    let total = ort.data.len();
    let agree = mask
        .data
        .iter()
        .zip(ort.data.iter())
        .filter(|(m, p)| (**m > 0.5) == (**p > 0.5))
        .count();
    let brain = mask.data.iter().filter(|m| **m > 0.5).count();
    eprintln!(
        "deepbrain sample: mask agreement {}/{total}, brain voxels {brain}",
        agree
    );
    assert!(agree as f64 / total as f64 >= 0.9999);
    assert!(
        brain > total / 20 && brain < total / 2,
        "a brain mask, not empty/full: {brain}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["input_shape"], serde_json::json!([128, 128, 128]));
    assert!(r["windows"].as_u64().unwrap() >= 1);
    assert!(r["seconds"]["compute"].as_f64().unwrap() > 0.0);
    assert!(r["peak_host_bytes"].as_u64().unwrap() > 0);
    // Existing output is kept without --force, replaced with it.
    let again = segment_cpu(
        &data("mni_t1_128.nii.gz"),
        &data("deepbrain.onnx"),
        &out,
        &[],
    );
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
}

#[test]
fn output_readable_by_nibabel() {
    // CI installs nibabel; elsewhere skip unless asked for.
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
    let Some(ct) = shared("fixtures/volumes/ts_example_ct_sm.nii.gz") else {
        return;
    };
    let dir = tempdir();
    let out = dir.path().join("lab.nii.gz");
    // Any model works for geometry: deepbrain on a small CT (windows padded to 64).
    let o = voxtile(&[
        "segment",
        ct.to_str().unwrap(),
        "--model",
        data("deepbrain.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--roi",
        "64,64,32",
        "--allow-small-roi",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let script = r#"
import sys, nibabel as nib, numpy as np
a = nib.load(sys.argv[1]); b = nib.load(sys.argv[2])
assert a.shape[:3] == b.shape, (a.shape, b.shape)
assert np.allclose(a.affine, b.affine, atol=1e-4), (a.affine, b.affine)
assert np.allclose(b.header.get_sform(), b.header.get_qform(), atol=1e-4)
assert b.get_data_dtype() == np.uint8, b.get_data_dtype()
print("nibabel ok", b.shape, b.get_data_dtype())
"#;
    let o = Command::new("python3")
        .args(["-c", script, ct.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn info_and_inspect() {
    let o = voxtile(&["info", data("mni_t1_128.nii.gz").to_str().unwrap()]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("128"), "{s}");
    let o = voxtile(&["inspect", data("deepbrain.onnx").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(s.contains("conv") && s.contains("param"), "{s}");
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dir = tempdir();
    let d = dir.path();
    let model = data("deepbrain.onnx");
    let good = f32_volume(&[16, 16, 8]);

    let p = d.join("truncated.nii");
    std::fs::write(&p, &good[..good.len() - 100]).unwrap();
    assert_refused(d, &p, &model, "truncated.nii", &[]);

    let p = d.join("corrupt.nii.gz");
    let mut z = gz(&good);
    let n = z.len();
    for b in &mut z[20..n - 8] {
        *b ^= 0x5a;
    }
    std::fs::write(&p, &z).unwrap();
    assert_refused(d, &p, &model, "corrupt.nii.gz", &[]);

    let p = d.join("cut.nii.gz");
    let z = gz(&good);
    std::fs::write(&p, &z[..z.len() / 2]).unwrap();
    assert_refused(d, &p, &model, "cut.nii.gz", &[]);

    let p = d.join("zero.nii");
    std::fs::write(&p, f32_volume(&[16, 0, 8])).unwrap();
    assert_refused(d, &p, &model, "zero.nii", &[]);

    let p = d.join("negative.nii");
    std::fs::write(&p, nifti_bytes(&[16, -4, 8], 16, 32, &[0; 64])).unwrap();
    assert_refused(d, &p, &model, "negative.nii", &[]);

    let p = d.join("huge.nii");
    std::fs::write(&p, nifti_bytes(&[30000, 30000, 30000], 16, 32, &[0; 64])).unwrap();
    assert_refused(d, &p, &model, "huge.nii", &[]);

    let p = d.join("notnifti.nii");
    std::fs::write(&p, b"hello, this is not a NIfTI file at all; hello hello").unwrap();
    assert_refused(d, &p, &model, "notnifti.nii", &[]);

    let p = d.join("missing.nii.gz");
    assert_refused(d, &p, &model, "missing.nii.gz", &[]);

    // Two channels for a one-channel model.
    let p = d.join("twochan.nii");
    std::fs::write(&p, f32_volume(&[16, 16, 8, 2])).unwrap();
    assert_refused(d, &p, &model, "twochan.nii", &[]);

    // A model with an op outside the list.
    let bad_model = d.join("bad_op.onnx");
    let m = model_with(
        "g",
        17,
        vec![node_with("FancyOp", "weird_node", &["x"], &["y"], vec![])],
        vec![],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", Some(1))],
    );
    std::fs::write(&bad_model, m.encode_to_vec()).unwrap();
    let p = d.join("ok.nii");
    std::fs::write(&p, &good).unwrap();
    let e = assert_refused(d, &p, &bad_model, "FancyOp", &[]);
    assert!(e.contains("weird_node"), "{e}");

    // A model file that is not ONNX.
    let junk = d.join("junk.onnx");
    std::fs::write(&junk, b"\x08\x07garbage\xff\xff\xff").unwrap();
    assert_refused(d, &p, &junk, "junk.onnx", &[]);

    // Bad options.
    assert_refused(d, &p, &model, "overlap", &["--overlap", "1.5"]);
    assert_refused(d, &p, &model, "roi", &["--roi", "12,12,12"]);

    // Writing over the input is refused even with --force.
    let o = voxtile(&[
        "segment",
        p.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "-o",
        p.to_str().unwrap(),
        "--force",
        "--device",
        "cpu",
    ]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&p).unwrap(), good, "the input is untouched");
}

#[test]
fn nan_voxels_are_reported_and_replaced() {
    let dir = tempdir();
    let d = dir.path();
    let n = 16 * 16 * 8;
    let data_bytes: Vec<u8> = (0..n)
        .flat_map(|i| {
            (if i % 97 == 0 {
                f32::NAN
            } else {
                (i % 5) as f32 * 0.2
            })
            .to_le_bytes()
        })
        .collect();
    let p = d.join("nan.nii");
    std::fs::write(&p, nifti_bytes(&[16, 16, 8], 16, 32, &data_bytes)).unwrap();
    let out = d.join("nan_seg.nii");
    let o = segment_cpu(&p, &data("deepbrain.onnx"), &out, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("NaN"),
        "a warning names the NaN voxels: {stderr}"
    );
    let seg = voxtile::volume::read(&out).unwrap();
    assert_eq!(seg.header.shape(), [16, 16, 8]);
}

/// A 1x1x1 Conv, 1 -> 2 channels, weights (1, -1), no bias: argmax is 1 exactly where the
/// normalised input is below 0, so with z-score the labels are `x < mean`.
fn sign_model(path: &Path) {
    let m = model_with(
        "sign",
        17,
        vec![node_with("Conv", "conv", &["x", "w", "b"], &["y"], vec![])],
        vec![
            ftensor("w", &[2, 1, 1, 1, 1], [1.0, -1.0]),
            ftensor("b", &[2], [0.0, 0.0]),
        ],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", Some(2))],
    );
    std::fs::write(path, m.encode_to_vec()).unwrap();
}

/// W3's path on the CPU: int16 .nii.gz in, z-score, uint8 labels .nii.gz out (parallel gzip of
/// several pieces), checked voxel by voxel against `x < mean` computed here, decoded by a
/// single-member gzip decoder (and by nibabel when present); the report names every stage.
#[test]
fn int16_gz_zscore_labels_end_to_end() {
    use std::io::Read;
    let dir = tempdir();
    let d = dir.path();
    let (nx, ny, nz) = (150usize, 140usize, 72usize);
    let vals: Vec<i16> = (0..nx * ny * nz)
        .map(|i| ((i * 7919 + (i / nx) * 13) % 3001) as i16 - 1024)
        .collect();
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = d.join("ct.nii.gz");
    std::fs::write(
        &input,
        gz(&nifti_bytes(
            &[nx as i16, ny as i16, nz as i16],
            4,
            16,
            &bytes,
        )),
    )
    .unwrap();
    let model = d.join("sign.onnx");
    sign_model(&model);
    let out = d.join("seg.nii.gz");
    let report = d.join("r.json");
    let o = voxtile(&[
        "segment",
        input.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--roi",
        "64",
        "--overlap",
        "0.5",
        "--batch",
        "2",
        "--normalize",
        "zscore",
        "--device",
        "cpu",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / vals.len() as f64;
    let want: Vec<u8> = vals
        .iter()
        .map(|&v| ((v as f32) < mean as f32) as u8)
        .collect();
    assert!(want.contains(&0) && want.contains(&1));
    let z = std::fs::read(&out).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&z[..])
        .read_to_end(&mut raw)
        .unwrap();
    // The data start at vox_offset (after the class-name extension).
    let off = f32::from_le_bytes(raw[108..112].try_into().unwrap()) as usize;
    assert_eq!(raw.len(), off + want.len(), "one gzip member holds it all");
    assert_eq!(i16::from_le_bytes([raw[70], raw[71]]), 2, "uint8");
    assert!(raw[off..] == want[..], "labels differ from x < mean");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for k in [
        "read",
        "normalize",
        "engine_init",
        "wait_for_read",
        "prepare",
        "compute",
        "write",
        "total",
    ] {
        assert!(r["seconds"][k].as_f64().is_some(), "report lacks {k}: {r}");
    }
    assert!(r["seconds"]["read"].as_f64().unwrap() > 0.0);

    let probe = Command::new("python3")
        .args(["-c", "import nibabel"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        assert!(
            std::env::var_os("VOXTILE_REQUIRE_NIBABEL").is_none(),
            "nibabel is required"
        );
        return;
    }
    let script = r#"
import sys, nibabel as nib, numpy as np
x = np.asarray(nib.load(sys.argv[1]).dataobj); y = np.asarray(nib.load(sys.argv[2]).dataobj)
assert y.dtype == np.uint8, y.dtype
ref = (x.astype(np.float32) < np.float32(x.astype(np.float64).mean())).astype(np.uint8)
assert np.array_equal(y, ref), int((y != ref).sum())
print("nibabel ok")
"#;
    let o = Command::new("python3")
        .args(["-c", script, input.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
