//! `--orientation`: one scan stored several ways (a DICOM folder, its NRRD in SimpleITK's LPS
//! space, NIfTI files with permuted and flipped axes and matching affines) gives identical labels,
//! probabilities and raw outputs back on each input's grid, with the input's geometry; the model
//! is a conv with an asymmetric kernel, so a run in stored order does not.

use crate::common::small::conv_model;
use crate::common::{s, segment_cpu, tempdir};
use ndarray::{Array4, Axis};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use voxtile::volume::{self, Header, Mat4, Volume};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/volumes")
        .join(name)
}

/// One storage order: stored axis `k` is the scan's axis `perm[k]`, reversed for the scan axes
/// in `flips` (as contract.py builds them).
struct Variant {
    name: &'static str,
    perm: [usize; 3],
    flips: &'static [usize],
}

const VARIANTS: [Variant; 3] = [
    Variant {
        name: "flip_ij",
        perm: [0, 1, 2],
        flips: &[0, 1],
    },
    Variant {
        name: "jki",
        perm: [1, 2, 0],
        flips: &[1, 2],
    },
    Variant {
        name: "kji",
        perm: [2, 1, 0],
        flips: &[0],
    },
];

impl Variant {
    /// (C, i, j, k) data of the scan in this storage order.
    fn store(&self, d: &Array4<f32>) -> Array4<f32> {
        let mut v = d.view();
        for &a in self.flips {
            v.invert_axis(Axis(a + 1));
        }
        let [p0, p1, p2] = self.perm;
        v.permuted_axes([0, p0 + 1, p1 + 1, p2 + 1]).to_owned()
    }
    /// Stored data of this order back in the scan's order.
    fn back(&self, d: &Array4<f32>) -> Array4<f32> {
        let mut inv = [0; 3];
        for (k, &a) in self.perm.iter().enumerate() {
            inv[a] = k;
        }
        let mut v = d
            .view()
            .permuted_axes([0, inv[0] + 1, inv[1] + 1, inv[2] + 1]);
        for &a in self.flips {
            v.invert_axis(Axis(a + 1));
        }
        v.to_owned()
    }
    /// The affine of this order: scan affine @ T, T taking new indices to the scan's.
    fn affine(&self, a: &Mat4, n: [usize; 3]) -> Mat4 {
        let mut t = [[0.0; 4]; 4];
        t[3][3] = 1.0;
        for (k, &ax) in self.perm.iter().enumerate() {
            t[ax][k] = 1.0;
        }
        for &ax in self.flips {
            let k = self.perm.iter().position(|&p| p == ax).unwrap();
            t[ax][k] = -1.0;
            t[ax][3] = (n[ax] - 1) as f64;
        }
        let mut m = [[0.0; 4]; 4];
        for i in 0..4 {
            for j in 0..4 {
                m[i][j] = (0..4).map(|k| a[i][k] * t[k][j]).sum();
            }
        }
        m
    }
}

/// A float NRRD of `v` as SimpleITK writes one: LPS space, the same index order.
fn write_nrrd(path: &Path, v: &Volume) {
    let a = v.header.affine();
    let [x, y, z] = v.shape();
    let lps = |r: usize, c: usize| if r < 2 { -a[r][c] } else { a[r][c] };
    let vec3 = |c: usize| format!("({},{},{})", lps(0, c), lps(1, c), lps(2, c));
    let mut h =
        String::from("NRRD0004\ntype: float\ndimension: 3\nspace: left-posterior-superior\n");
    writeln!(h, "sizes: {x} {y} {z}").unwrap();
    writeln!(h, "space directions: {} {} {}", vec3(0), vec3(1), vec3(2)).unwrap();
    writeln!(
        h,
        "kinds: domain domain domain\nendian: little\nencoding: raw"
    )
    .unwrap();
    writeln!(h, "space origin: {}\n", vec3(3)).unwrap();
    let mut bytes = h.into_bytes();
    // i fastest on disk.
    let d = v.data.index_axis(Axis(0), 0);
    for t in d.t().iter() {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// A float32 NIfTI of `data` with affine `m`.
fn write_nifti(path: &Path, data: &Array4<f32>, m: &Mat4) {
    let (_, x, y, z) = data.dim();
    let mut h = Header::new([x, y, z], 1, [1.0; 3]);
    h.set_affine(m);
    volume::write_f32(path, data.view(), &h).unwrap();
}

/// One stored form of the scan: its name, its path, and its storage order (None: the scan's).
type Form = (String, PathBuf, Option<&'static Variant>);

/// The scan (the DICOM fixture) and every stored form of it.
fn stored_forms(dir: &Path) -> (Volume, Vec<Form>) {
    let dicom = fixture("dicom_ct");
    let scan = volume::read(&dicom).unwrap();
    let nrrd = dir.join("ct.nrrd");
    write_nrrd(&nrrd, &scan);
    let mut forms = vec![
        ("dicom".to_string(), dicom, None),
        ("nrrd".to_string(), nrrd, None),
    ];
    let (a, n) = (scan.header.affine(), scan.shape());
    for v in &VARIANTS {
        let p = dir.join(format!("{}.nii.gz", v.name));
        write_nifti(&p, &v.store(&scan.data), &v.affine(&a, n));
        forms.push((v.name.to_string(), p, Some(v)));
    }
    (scan, forms)
}

/// The outputs of one run (labels, probabilities, raw outputs) in the scan's order, and the
/// label map's header.
fn run(form: &Form, model: &Path, dir: &Path, extra: &[&str]) -> (Vec<Array4<f32>>, Header) {
    let (name, input, variant) = form;
    let names = ["lab", "prob", "logit"].map(|k| dir.join(format!("{name}_{k}.nii.gz")));
    let mut args = vec![
        "--force",
        "--probabilities",
        s(&names[1]),
        "--logits",
        s(&names[2]),
    ];
    args.extend_from_slice(extra);
    let o = segment_cpu(input, model, &names[0], &args);
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let read = |p: &PathBuf| {
        let d = volume::read(p).unwrap().data;
        match variant {
            Some(v) => v.back(&d),
            None => d,
        }
    };
    let header = volume::read_header(&names[0]).unwrap();
    (names.iter().map(read).collect(), header)
}

fn assert_affine_eq(a: &Mat4, b: &Mat4, what: &str) {
    for i in 0..4 {
        for j in 0..4 {
            assert!((a[i][j] - b[i][j]).abs() < 1e-4, "{what}: {a:?} vs {b:?}");
        }
    }
}

#[test]
fn one_scan_stored_five_ways_gives_the_same_outputs_on_each_grid() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("conv.onnx"), 3);
    let (scan, forms) = stored_forms(dir.path());
    let mut reference: Option<Vec<Array4<f32>>> = None;
    for form in &forms {
        let (out, header) = run(form, &model, dir.path(), &["--orientation", "RAS"]);
        // Written with the input's own geometry.
        let input = volume::read_header(&form.1).unwrap();
        assert_affine_eq(&header.affine(), &input.affine(), &form.0);
        assert_eq!(header.shape(), input.shape(), "{}", form.0);
        match &reference {
            None => {
                let labels = &out[0];
                assert!(
                    labels.iter().any(|&l| l != labels[[0, 0, 0, 0]]),
                    "the labels must not be constant"
                );
                assert_eq!(&labels.shape()[1..], &scan.shape()[..]);
                reference = Some(out);
            }
            Some(r) => {
                for (k, (a, b)) in ["labels", "probabilities", "raw outputs"]
                    .iter()
                    .zip(r.iter().zip(&out))
                {
                    assert!(a_eq(a, b), "{}: {k} differ from the DICOM folder's", form.0);
                }
            }
        }
    }
    // The model sees orientation: in stored order the same scan gives other labels.
    let (stored_dicom, _) = run(&forms[0], &model, dir.path(), &[]);
    let (stored_kji, _) = run(&forms[4], &model, dir.path(), &[]);
    assert!(
        stored_dicom[0] != stored_kji[0],
        "the test model must not be orientation-invariant"
    );
}

/// Bit-equal arrays.
fn a_eq(a: &Array4<f32>, b: &Array4<f32>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// With the manifest's spacing the volume is turned first, resampled in the model's frame and
/// put back: the storage order still does not change the answer; the report says what ran.
#[test]
fn manifest_orientation_with_spacing_and_report() {
    let dir = tempdir();
    let model = conv_model(&dir.path().join("conv.onnx"), 3);
    std::fs::write(
        dir.path().join("conv.toml"),
        "orientation = \"LPS\"\nspacing = [1.1, 0.9, 1.3]\n",
    )
    .unwrap();
    let (_, forms) = stored_forms(dir.path());
    let mut reference = None;
    for form in forms.iter().skip(2) {
        let rep = dir.path().join(format!("{}.json", form.0));
        let (out, header) = run(form, &model, dir.path(), &["--report", s(&rep)]);
        let input = volume::read_header(&form.1).unwrap();
        assert_eq!(header.shape(), input.shape());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
        let o = &r["orientation"];
        assert_eq!(o["setting"], "LPS", "{r}");
        assert_eq!(o["model"], "LPS");
        assert_eq!(o["input"], input.orientation().as_str());
        match &reference {
            None => reference = Some(out),
            Some(r) => assert!(a_eq(&r[0], &out[0]), "{}: labels differ", form.0),
        }
    }
    // --orientation beats the manifest; a bad value is one error line naming it.
    let rep = dir.path().join("stored.json");
    let (_, _) = run(
        &forms[2],
        &model,
        dir.path(),
        &["--orientation", "stored", "--report", s(&rep)],
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
    assert_eq!(r["orientation"]["setting"], "stored");
    assert_eq!(
        r["orientation"]["permutation"],
        serde_json::json!([0, 1, 2])
    );
    let o = segment_cpu(
        &forms[2].1,
        &model,
        &dir.path().join("bad.nii.gz"),
        &["--orientation", "RAR"],
    );
    let msg = crate::common::assert_one_error(&o, "RAR");
    assert!(msg.contains("orientation"), "{msg}");
    assert!(!dir.path().join("bad.nii.gz").exists());
}
