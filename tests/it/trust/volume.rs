//! Trust issue, volume side: output geometry with negative pixdim and unusable qforms, resampling
//! grids that cannot fit, and running out of memory as one error line instead of an abort.

use crate::common::nifti::{nifti, Geo};
use crate::common::onnx::*;
use crate::common::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use voxtile::volume::{read_header, Mat4};

/// One 1x1x1 Conv from 1 to 2 channels (background / foreground by intensity), with symbolic
/// spatial dims: any window works.
fn write_model(dir: &Path, manifest: Option<&str>) -> PathBuf {
    let attrs = vec![ints_attr("kernel_shape", vec![1, 1, 1])];
    let m = model_with(
        "conv",
        17,
        vec![node_with("Conv", "conv0", &["x", "w", "b"], &["y"], attrs)],
        vec![
            ftensor("w", &[2, 1, 1, 1, 1], [-4.0, 4.0]),
            ftensor("b", &[2], [2.0, -2.0]),
        ],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", None)],
    );
    let path = dir.join("m.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    if let Some(t) = manifest {
        std::fs::write(dir.join("m.toml"), t).unwrap();
    }
    path
}

/// An n³ float32 ball with the given geometry.
fn write_ball(path: &Path, n: usize, geo: &Geo) {
    let c = (n as f32 - 1.0) / 2.0;
    let mut data = Vec::with_capacity(n * n * n * 4);
    for k in 0..n {
        for j in 0..n {
            for i in 0..n {
                let r2 = [i, j, k].map(|v| (v as f32 - c) / n as f32);
                let v = (1.0 - 6.0 * r2.iter().map(|x| x * x).sum::<f32>()).max(0.0);
                data.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let n = n as i64;
    std::fs::write(path, nifti(&[n, n, n], 16, 32, geo, &data)).unwrap();
}

/// An isotropic-pixdim ball with the sform diag(pixdim) (what mkvol.py of the checks makes).
fn write_scaled_ball(path: &Path, n: usize, p: f32) {
    let geo = Geo {
        pixdim: [p; 3],
        srow: [[p, 0.0, 0.0, 0.0], [0.0, p, 0.0, 0.0], [0.0, 0.0, p, 0.0]],
        ..Geo::default()
    };
    write_ball(path, n, &geo);
}

/// The qform matrix as nibabel's `get_qform` builds it (|pixdim|, qfac on the 3rd column),
/// written out here from the quaternion formula rather than taken from voxtile.
fn nibabel_qform(geo: &Geo) -> Mat4 {
    let [b, c, d] = geo.quatern.map(|v| v as f64);
    let a = (1.0 - (b * b + c * c + d * d)).max(0.0).sqrt();
    let r = [
        [
            a * a + b * b - c * c - d * d,
            2.0 * (b * c - a * d),
            2.0 * (b * d + a * c),
        ],
        [
            2.0 * (b * c + a * d),
            a * a + c * c - b * b - d * d,
            2.0 * (c * d - a * b),
        ],
        [
            2.0 * (b * d - a * c),
            2.0 * (c * d + a * b),
            a * a + d * d - b * b - c * c,
        ],
    ];
    let mut z = geo.pixdim.map(|v| (v as f64).abs());
    z[2] *= if geo.qfac < 0.0 { -1.0 } else { 1.0 };
    let mut m = [[0.0; 4]; 4];
    for i in 0..3 {
        for j in 0..3 {
            m[i][j] = r[i][j] * z[j];
        }
        m[i][3] = geo.qoffset[i] as f64;
    }
    m[3][3] = 1.0;
    m
}

fn assert_close(what: &str, got: &Mat4, want: &Mat4) {
    for i in 0..3 {
        for j in 0..4 {
            let tol = 1e-5 * (1.0 + want[i][j].abs());
            assert!(
                (got[i][j] - want[i][j]).abs() <= tol,
                "{what}: [{i}][{j}] is {} but should be {}\n got {got:?}\nwant {want:?}",
                got[i][j],
                want[i][j]
            );
        }
    }
}

/// `voxtile segment INPUT -m MODEL -o OUT --device cpu`, optionally under RLIMIT_AS (bytes).
fn segment(input: &Path, model: &Path, out: &Path, limit_as: Option<u64>) -> Output {
    let mut cmd = Command::new(voxtile_bin());
    cmd.args(["segment", s(input), "-m", s(model), "-o", s(out)])
        .args(["--device", "cpu"]);
    if let Some(limit) = limit_as {
        limit_address_space(&mut cmd, limit);
    }
    cmd.output().expect("voxtile runs")
}

fn no_abort(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !err.contains("memory allocation of") && !err.contains("panicked"),
        "abort or panic: {err}"
    );
    err
}

#[test]
fn negative_pixdim_with_a_qform_gives_one_matrix_for_both_forms() {
    let dir = tempdir();
    let model = write_model(dir.path(), None);
    let qform_only = Geo {
        pixdim: [-2.0, 3.0, -0.5],
        qfac: -1.0,
        qform_code: 1,
        sform_code: 0,
        quatern: [0.1, -0.2, 0.3],
        qoffset: [10.0, -20.0, 5.0],
        ..Geo::default()
    };
    // The same qform with an sform that says the same thing (nibabel writes both).
    let want = nibabel_qform(&qform_only);
    let mut both = qform_only.clone();
    both.sform_code = 1;
    for (row, w) in both.srow.iter_mut().zip(&want) {
        *row = [0, 1, 2, 3].map(|j| w[j] as f32);
    }
    for (name, geo) in [("qform_only", &qform_only), ("both", &both)] {
        let input = dir.path().join(format!("{name}.nii"));
        write_ball(&input, 8, geo);
        let inh = read_header(&input).unwrap();
        assert_close(&format!("{name}: input affine"), &inh.affine(), &want);
        let out = dir.path().join(format!("{name}_seg.nii.gz"));
        let o = segment(&input, &model, &out, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let h = read_header(&out).unwrap();
        assert_close(&format!("{name}: output sform"), &h.sform_affine(), &want);
        assert_close(&format!("{name}: output qform"), &h.qform_affine(), &want);
        assert!(h.qform_code > 0 && h.sform_code > 0, "{name}: codes {h:?}");
        assert!(
            h.pixdim[1..4].iter().all(|&p| p > 0.0),
            "{name}: output pixdim {:?}",
            h.pixdim
        );
    }
}

#[test]
fn unusable_qform_warns_and_the_sform_or_pixdim_is_used() {
    let dir = tempdir();
    let model = write_model(dir.path(), None);
    let sform = [
        [-1.5, 0.0, 0.0, 30.0],
        [0.0, 1.5, 0.0, -40.0],
        [0.0, 0.0, 1.5, 12.0],
    ];
    let cases = [("nan", [f32::NAN, 0.0, 0.0]), ("too_long", [0.8, 0.7, 0.0])];
    for (name, quatern) in cases {
        let geo = Geo {
            pixdim: [1.5; 3],
            qform_code: 1,
            sform_code: 1,
            quatern,
            srow: sform,
            ..Geo::default()
        };
        let input = dir.path().join(format!("{name}.nii"));
        write_ball(&input, 8, &geo);
        let o = voxtile(&["info", s(&input)]);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "{name}: {err}");
        assert!(
            err.contains("qform ignored") && err.contains("using the sform"),
            "{name}: no warning: {err}"
        );
        assert!(out.contains("(sform, code 1"), "{name}: {out}");
        // The output's qform is rebuilt from the sform: both are the input's sform.
        let seg = dir.path().join(format!("{name}_seg.nii.gz"));
        let o = segment(&input, &model, &seg, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let h = read_header(&seg).unwrap();
        let mut want = [[0.0; 4]; 4];
        for i in 0..3 {
            want[i] = sform[i].map(|v| v as f64);
        }
        want[3][3] = 1.0;
        assert_close(&format!("{name}: output qform"), &h.qform_affine(), &want);
        assert_close(&format!("{name}: output sform"), &h.sform_affine(), &want);
    }
    // No sform to fall back on: diag(pixdim), still a warning, no NaN anywhere.
    let geo = Geo {
        pixdim: [2.0; 3],
        qform_code: 1,
        sform_code: 0,
        quatern: [f32::NAN, 0.0, 0.0],
        ..Geo::default()
    };
    let input = dir.path().join("nan_no_sform.nii");
    write_ball(&input, 8, &geo);
    let o = voxtile(&["info", s(&input)]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(err.contains("using diag(pixdim)"), "{err}");
    let affine: Vec<&str> = out.lines().filter(|l| l.starts_with("  [")).collect();
    assert_eq!(affine.len(), 3, "{out}");
    assert!(
        affine.iter().all(|l| !l.contains("NaN")) && affine[0].contains("2.0000"),
        "{out}"
    );
}

#[test]
fn resampling_grid_too_large_is_refused_before_allocating() {
    let dir = tempdir();
    let model = write_model(dir.path(), Some("spacing = [1.0, 1.0, 1.0]\n"));
    // 16³ voxels of 100 mm at 1 mm: a 1600³ grid (16 GB per channel).
    let input = dir.path().join("p100.nii");
    write_scaled_ball(&input, 16, 100.0);
    let out = dir.path().join("p100_seg.nii.gz");
    let o = segment(&input, &model, &out, Some(2 << 30));
    no_abort(&o);
    let err = assert_one_error(&o, "p100.nii");
    assert!(err.contains("1600x1600x1600"), "{err}");
    assert!(!out.exists());
    // 16³ voxels of 40 mm: 640³ x 3 channels = 3.1 GB, under the hard cap but over 2 GiB of
    // address space: refused by the same check, not by an allocation failure.
    let input = dir.path().join("p40.nii");
    write_scaled_ball(&input, 16, 40.0);
    let o = segment(&input, &model, &out, Some(2 << 30));
    no_abort(&o);
    let err = assert_one_error(&o, "p40.nii");
    assert!(
        err.contains("640x640x640") && err.contains("available"),
        "{err}"
    );
}

#[test]
fn pixdim_1e30_is_an_error_for_that_file_only() {
    let dir = tempdir();
    let model = write_model(dir.path(), Some("spacing = [1.0, 1.0, 1.0]\n"));
    let input = dir.path().join("huge.nii");
    write_scaled_ball(&input, 16, 1e30);
    let out = dir.path().join("huge_seg.nii.gz");
    let o = segment(&input, &model, &out, None);
    no_abort(&o);
    let err = assert_one_error(&o, "huge.nii");
    assert!(err.contains("1e30"), "{err}");
    // In a folder: the other files are still segmented.
    let inp = dir.path().join("in");
    std::fs::create_dir(&inp).unwrap();
    write_scaled_ball(&inp.join("a.nii"), 16, 1.0);
    write_scaled_ball(&inp.join("b.nii"), 16, 1e30);
    write_scaled_ball(&inp.join("c.nii"), 16, 1.0);
    let outd = dir.path().join("out");
    let o = segment(&inp, &model, &outd, None);
    let err = no_abort(&o);
    assert!(err.contains("b.nii"), "{err}");
    assert!(outd.join("a.nii.gz").exists() && outd.join("c.nii.gz").exists());
    assert!(!outd.join("b.nii.gz").exists());
}

#[test]
fn sample_under_300_mb_of_address_space_exits_cleanly() {
    let dir = tempdir();
    let out = dir.path().join("u.nii.gz");
    let o = segment(
        &data("mni_t1_128.nii.gz"),
        &data("deepbrain.onnx"),
        &out,
        Some(300_000 * 1024),
    );
    let err = no_abort(&o);
    let code = o.status.code();
    assert!(matches!(code, Some(0) | Some(1)), "exit {code:?}: {err}");
    if code == Some(1) {
        assert_one_error(&o, "");
    }
}

#[test]
fn nifti_inputs_must_be_regular_files() {
    let dir = tempdir();
    let fifo = dir.path().join("pipe.nii");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo on a fresh path in a temp dir.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (input, name) in [
        (fifo.as_path(), "pipe.nii"),
        (Path::new("/dev/zero"), "/dev/zero"),
    ] {
        // Nobody writes the FIFO: a reader that opens it blocks, so give it 20 s at most.
        let mut child = Command::new(voxtile_bin())
            .args(["info", s(input)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() && t.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("{name}: still reading after 20 s");
        }
        let o = child.wait_with_output().unwrap();
        let err = assert_one_error(&o, name);
        assert!(err.contains("not a regular file"), "{err}");
    }
}
