//! Hostile inputs end to end: fuzzing crashers, limits before allocation, hostile ONNX through the
//! CLI, awkward volumes through the CLI (geometry kept), and nothing left behind on SIGINT/SIGTERM.

use crate::common::nifti::*;
use crate::common::onnx::*;
use crate::common::small::ball;
use crate::common::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use voxtile::internals::proto;

// ------------------------------------------------------------------ hand-made NIfTI-1 files

/// float32 voxels from a function of the flat file index.
fn le_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn le_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}

// ------------------------------------------------------------------ 1. fuzz crashers

fn crashers(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/crashers")
        .join(kind);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|r| r.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Every input the fuzzers (or we, by hand) found to crash, hang or over-allocate: now an error
/// (or a volume), returned quickly.
#[test]
fn nifti_crashers_are_errors() {
    let files = crashers("nifti");
    assert!(!files.is_empty(), "tests/fixtures/crashers/nifti is empty");
    for p in files {
        let bytes = std::fs::read(&p).unwrap();
        let t = Instant::now();
        match voxtile::volume::read_bytes(&bytes, &p) {
            Ok(v) => assert_eq!(
                v.data.len(),
                v.channels() * v.shape().iter().product::<usize>()
            ),
            Err(e) => assert!(
                e.to_string().starts_with(s(&p)),
                "error names the file: {e}"
            ),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{}", p.display());
        // The same bytes from disk through the CLI: no panic, exit 0 or 1.
        let o = voxtile(&["info", s(&p)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{}: {err}", p.display());
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", p.display());
    }
}

#[test]
fn onnx_crashers_are_errors() {
    let files = crashers("onnx");
    assert!(!files.is_empty(), "tests/fixtures/crashers/onnx is empty");
    for p in files {
        let bytes = std::fs::read(&p).unwrap();
        let t = Instant::now();
        match voxtile::model::onnx::load_bytes(&bytes, None, &p) {
            Ok(g) => {
                if g.validate().is_ok() {
                    let d = g.spatial_divisor();
                    let w = d.map(|d| {
                        if d == 0 || d > 64 {
                            8
                        } else {
                            d * 8usize.div_ceil(d)
                        }
                    });
                    let _ = g.infer_shapes(1, w);
                    let _ = (g.summary(), g.flops(1, w), g.receptive_field());
                }
            }
            Err(e) => assert!(e.to_string().starts_with(s(&p)), "{e}"),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{}", p.display());
        let o = voxtile(&["inspect", s(&p)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{}: {err}", p.display());
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", p.display());
    }
}

// ------------------------------------------------------------------ 2. limits before allocation

/// Run voxtile under an address-space limit (`ulimit -v`, KiB): a large allocation then fails
/// for real instead of being overcommitted, so a refusal "before allocation" is observable.
fn voxtile_limited(kib: u64, args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(voxtile_bin())
        .args(args)
        .output()
        .expect("sh runs");
    (o, t.elapsed())
}

const LIMIT_KIB: u64 = 1 << 20; // 1 GiB of address space

#[test]
fn huge_volume_headers_are_refused_before_allocating() {
    let dir = tempdir();
    let d = dir.path();
    // Sanity: the limit leaves room for a normal run.
    let ok = d.join("ok.nii");
    std::fs::write(&ok, nifti_f32(&[8, 8, 8], |i| i as f32)).unwrap();
    let (o, _) = voxtile_limited(LIMIT_KIB, &["info", s(&ok)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // 30000³ float32 (108 TB): refused by the size rules.
    let p = d.join("dims30000.nii");
    std::fs::write(
        &p,
        nifti(&[30000, 30000, 30000], 16, 32, &Geo::default(), &[0; 64]),
    )
    .unwrap();
    let (o, t) = voxtile_limited(LIMIT_KIB, &["info", s(&p)]);
    let e = assert_one_error(&o, "dims30000.nii");
    assert!(e.contains("truncated") || e.contains("limit"), "{e}");
    assert!(t < Duration::from_secs(5));
    let pz = d.join("dims30000.nii.gz");
    std::fs::write(&pz, gz(&std::fs::read(&p).unwrap())).unwrap();
    let (o, t) = voxtile_limited(LIMIT_KIB, &["info", s(&pz)]);
    let e = assert_one_error(&o, "dims30000.nii.gz");
    assert!(e.contains("limit") || e.contains("memory"), "{e}");
    assert!(t < Duration::from_secs(5));

    // 1024x1024x512 float32 = 2 GiB: under every size rule on a normal machine, but the gzip
    // stream holds 64 bytes of voxels. The length of a gzip stream is unknown up front; the reader
    // must notice the truncation before it has allocated the 2 GiB (which the 1 GiB limit forbids:
    // "cannot allocate" would mean it tried).
    let p = d.join("claims2g.nii.gz");
    std::fs::write(
        &p,
        gz(&nifti(
            &[1024, 1024, 512],
            16,
            32,
            &Geo::default(),
            &[0; 64],
        )),
    )
    .unwrap();
    let (o, t) = voxtile_limited(LIMIT_KIB, &["info", s(&p)]);
    let e = assert_one_error(&o, "claims2g.nii.gz");
    assert!(e.contains("truncated"), "{e}");
    assert!(t < Duration::from_secs(5));
    // In-process the same: an error naming the file.
    let e = voxtile::volume::read_bytes(&std::fs::read(&p).unwrap(), &p).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

// ---------------------------------------------------------------------- ONNX builders

fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    ints: &[(&str, Vec<i64>)],
) -> proto::NodeProto {
    let attrs = ints.iter().map(|(k, v)| ints_attr(k, v.clone())).collect();
    node_with(op, name, ins, outs, attrs)
}

fn model(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    out: &str,
) -> proto::ModelProto {
    let (ins, outs) = (vec![vi_c("x", Some(1))], vec![vi_c(out, None)]);
    model_with("hostile", 17, nodes, inits, ins, outs)
}

/// A 1→2 channel 3x3x3 conv weight.
fn w3() -> proto::TensorProto {
    ftensor(
        "w",
        &[2, 1, 3, 3, 3],
        (0..54).map(|i| (i as f32 * 0.1).sin()).collect::<Vec<_>>(),
    )
}

fn conv(name: &str, x: &str, out: &str, ints: &[(&str, Vec<i64>)]) -> proto::NodeProto {
    node("Conv", name, &[x, "w"], &[out], ints)
}

#[test]
fn huge_tensors_and_short_external_data_are_refused_before_allocating() {
    let dir = tempdir();
    let d = dir.path();
    // 10^12 elements declared, 8 bytes held.
    let mut t = ftensor("w", &[1_000_000, 1_000_000, 1, 1, 1], vec![0.0, 0.0]);
    let m = model(vec![conv("c", "x", "y", &[])], vec![t.clone()], "y");
    let p = d.join("tera.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    let (o, el) = voxtile_limited(LIMIT_KIB, &["inspect", s(&p)]);
    let e = assert_one_error(&o, "tera.onnx");
    assert!(e.contains("\"w\"") && e.contains("2^31"), "{e}");
    assert!(el < Duration::from_secs(5));

    // 2^30 floats (4 GiB) declared in raw_data that holds 8 bytes: under the element cap, so the
    // byte-count check must come before the decode allocates.
    t.dims = vec![1 << 10, 1 << 10, 1 << 10, 1, 1];
    let m = model(vec![conv("c", "x", "y", &[])], vec![t.clone()], "y");
    let p = d.join("giga_raw.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    let (o, _) = voxtile_limited(LIMIT_KIB, &["inspect", s(&p)]);
    let e = assert_one_error(&o, "giga_raw.onnx");
    assert!(e.contains("need 4294967296 bytes"), "{e}");

    // External data declaring 4 GiB with a 100-byte file: refused before reading.
    std::fs::write(d.join("w.bin"), [0u8; 100]).unwrap();
    t.raw_data = None;
    t.data_location = Some(proto::tensor_proto::DataLocation::External as i32);
    t.external_data = [
        ("location", "w.bin"),
        ("offset", "0"),
        ("length", "4294967296"),
    ]
    .iter()
    .map(|(k, v)| proto::StringStringEntryProto {
        key: Some(k.to_string()),
        value: Some(v.to_string()),
    })
    .collect();
    let m = model(vec![conv("c", "x", "y", &[])], vec![t.clone()], "y");
    let p = d.join("short_ext.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    let (o, el) = voxtile_limited(LIMIT_KIB, &["inspect", s(&p)]);
    let e = assert_one_error(&o, "short_ext.onnx");
    assert!(e.contains("holds only 100 bytes"), "{e}");
    assert!(el < Duration::from_secs(5));
    // Without a length entry the file's size is taken and disagrees with the dims.
    t.external_data.truncate(2);
    let m = model(vec![conv("c", "x", "y", &[])], vec![t], "y");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    let (o, _) = voxtile_limited(LIMIT_KIB, &["inspect", s(&p)]);
    let e = assert_one_error(&o, "short_ext.onnx");
    assert!(e.contains("disagrees"), "{e}");
}

// ------------------------------------------------------------------ 3. hostile ONNX via the CLI

/// Hostile models: (file stem, model, what the error must say).
fn hostile_models() -> Vec<(&'static str, proto::ModelProto, &'static str)> {
    let mut short_w = w3();
    short_w.dims = vec![2, 1, 3, 3, 4]; // 72 values declared, 54 held
    let one_ch = ftensor("w1", &[1, 1, 1, 1, 1], vec![1.0]);
    let three_ch = ftensor("w3c", &[3, 1, 3, 3, 3], vec![0.05; 81]);
    let tera = ftensor("w", &[1_000_000, 1_000_000, 1, 1, 1], vec![0.0; 2]);
    vec![
        (
            "tera_tensor",
            model(vec![conv("c", "x", "y", &[])], vec![tera], "y"),
            "2^31",
        ),
        (
            "cycle",
            model(
                vec![
                    node("Add", "a", &["x", "r_out"], &["a_out"], &[]),
                    node("Relu", "r", &["a_out"], &["r_out"], &[]),
                    node("Relu", "o", &["a_out"], &["y"], &[]),
                ],
                vec![],
                "y",
            ),
            "cycle",
        ),
        (
            "dangling",
            model(
                vec![node("Add", "a", &["x", "ghost"], &["y"], &[])],
                vec![],
                "y",
            ),
            "\"ghost\"",
        ),
        (
            "short_init",
            model(vec![conv("c", "x", "y", &[])], vec![short_w], "y"),
            "tensor \"w\"",
        ),
        (
            "channel_mismatch",
            // 2-channel conv output added to a 3-channel one (1 and 2 would broadcast).
            model(
                vec![
                    conv("c", "x", "y0", &[("pads", vec![1; 6])]),
                    node(
                        "Conv",
                        "c3",
                        &["x", "w3c"],
                        &["y1"],
                        &[("pads", vec![1; 6])],
                    ),
                    node("Add", "a", &["y1", "y0"], &["y"], &[]),
                ],
                vec![w3(), three_ch],
                "y",
            ),
            "channels",
        ),
        (
            "conv_on_wrong_channels",
            // The second conv's weight expects 1 input channel but gets 2.
            model(
                vec![
                    conv("c", "x", "y0", &[("pads", vec![1; 6])]),
                    node("Conv", "c2", &["y0", "w1"], &["y"], &[]),
                ],
                vec![w3(), one_ch],
                "y",
            ),
            "c2",
        ),
        (
            "negative_pads",
            model(
                vec![conv("c", "x", "y", &[("pads", vec![1, 1, -1, 1, 1, 1])])],
                vec![w3()],
                "y",
            ),
            "pads",
        ),
        (
            "zero_strides",
            model(
                vec![conv("c", "x", "y", &[("strides", vec![1, 0, 1])])],
                vec![w3()],
                "strides",
            ),
            "strides",
        ),
        (
            "zero_kernel_pool",
            model(
                vec![node(
                    "MaxPool",
                    "p",
                    &["x"],
                    &["y"],
                    &[("kernel_shape", vec![2, 0, 2])],
                )],
                vec![],
                "y",
            ),
            "kernel",
        ),
    ]
}

/// Each hostile model through `inspect` and `segment`: exit 1, one error line that names the model
/// file and says what is wrong, no panic, no output.
#[test]
fn hostile_models_fail_cleanly_in_the_cli() {
    let dir = tempdir();
    let d = dir.path();
    let vol = d.join("v.nii");
    std::fs::write(&vol, nifti_f32(&[16, 16, 16], ball([16; 3]))).unwrap();
    let cases = hostile_models();
    for (name, m, what) in cases {
        let mp = d.join(format!("{name}.onnx"));
        std::fs::write(&mp, m.encode_to_vec()).unwrap();
        let o = voxtile(&["inspect", s(&mp)]);
        let e = assert_one_error(&o, &format!("{name}.onnx"));
        assert!(e.contains(what), "{name}: {e}");
        let out = d.join("out.nii");
        let o = segment_cpu(&vol, &mp, &out, &[]);
        let e = assert_one_error(&o, &format!("{name}.onnx"));
        assert!(e.contains(what), "{name}: {e}");
        assert!(!out.exists() && temp_files(d).is_empty(), "{name}");
    }
}

// ------------------------------------------------------------------ 4. awkward volumes via the CLI

/// Segment `input` with the shipped deepbrain model; returns the output path and stderr.
fn segment_ok(input: &Path, extra: &[&str]) -> (PathBuf, String) {
    let out = input.with_file_name(format!(
        "{}_seg.nii",
        input
            .file_name()
            .unwrap()
            .to_string_lossy()
            .split('.')
            .next()
            .unwrap()
    ));
    let model = data("deepbrain.onnx");
    let mut args = vec![
        "segment",
        s(input),
        "--model",
        s(&model),
        "-o",
        s(&out),
        "--device",
        "cpu",
        "--force",
    ];
    args.extend_from_slice(extra);
    let o = voxtile(&args);
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{}: {stderr}", input.display());
    assert!(!stderr.contains("panicked"));
    (out, stderr)
}

/// Output geometry fields read from the raw bytes of a NIfTI-1 output.
fn raw_geometry(p: &Path) -> (Vec<i16>, [f32; 4], i16, i16, [f32; 6], [f32; 12]) {
    let b = std::fs::read(p).unwrap();
    let dim: Vec<i16> = (0..8).map(|i| le_i16(&b, 40 + 2 * i)).collect();
    let pix = [
        le_f32(&b, 76),
        le_f32(&b, 80),
        le_f32(&b, 84),
        le_f32(&b, 88),
    ];
    let q: Vec<f32> = (0..6).map(|i| le_f32(&b, 256 + 4 * i)).collect();
    let sr: Vec<f32> = (0..12).map(|i| le_f32(&b, 280 + 4 * i)).collect();
    (
        dim,
        pix,
        le_i16(&b, 252),
        le_i16(&b, 254),
        q.try_into().unwrap(),
        sr.try_into().unwrap(),
    )
}

/// The label map must have the input's grid: same dims, pixdim, and the same best affine.
fn assert_same_grid(out: &Path, dims: [i16; 3], geo: &Geo, want_affine: [[f64; 4]; 3]) {
    let (dim, pix, _, _, _, _) = raw_geometry(out);
    assert_eq!(dim[0], 3);
    assert_eq!(&dim[1..4], &dims);
    assert_eq!(&pix[1..4], &geo.pixdim, "pixdim");
    let h = voxtile::volume::read_header(out).unwrap();
    let a = h.affine();
    for r in 0..3 {
        for c in 0..4 {
            assert!(
                (a[r][c] - want_affine[r][c]).abs() < 1e-4,
                "affine[{r}][{c}] {} vs {}",
                a[r][c],
                want_affine[r][c]
            );
        }
    }
}

#[test]
fn sform_only_qform_only_neither_and_anisotropic_keep_geometry() {
    let dir = tempdir();
    let d = dir.path();
    let dims = [24usize, 20, 16];
    let n = dims.iter().product();
    let data = f32_data(n, ball(dims));
    let dims16 = dims.map(|v| v as i16);
    let di = dims.map(|v| v as i64);

    // sform only, anisotropic 0.7 x 1.3 x 3.0 with an oblique (shear-free rotated) srow.
    let sf = Geo {
        pixdim: [0.7, 1.3, 3.0],
        qform_code: 0,
        sform_code: 2,
        srow: [
            [0.0, -1.3, 0.0, 40.0],
            [0.7, 0.0, 0.0, -12.5],
            [0.0, 0.0, 3.0, 7.25],
        ],
        ..Geo::default()
    };
    let p = d.join("sform.nii");
    std::fs::write(&p, nifti(&di, 16, 32, &sf, &data)).unwrap();
    let (out, _) = segment_ok(&p, &[]);
    let want = sf.srow.map(|r| r.map(|v| v as f64));
    assert_same_grid(&out, dims16, &sf, want);
    let (_, _, _, sc, _, srow) = raw_geometry(&out);
    assert_eq!(sc, 2, "sform code kept");
    assert_eq!(srow.to_vec(), sf.srow.concat(), "srow copied bit for bit");

    // qform only: 90° about z (a = d = √½), qfac -1, anisotropic.
    let h = std::f32::consts::FRAC_1_SQRT_2;
    let qf = Geo {
        pixdim: [0.9, 1.1, 2.5],
        qfac: -1.0,
        qform_code: 1,
        sform_code: 0,
        quatern: [0.0, 0.0, h],
        qoffset: [-30.0, 12.0, 5.5],
        srow: [[0.0; 4]; 3],
        ..Geo::default()
    };
    let p = d.join("qform.nii");
    std::fs::write(&p, nifti(&di, 16, 32, &qf, &data)).unwrap();
    let (out, _) = segment_ok(&p, &[]);
    // R = [[0,-1,0],[1,0,0],[0,0,1]], columns scaled by (0.9, 1.1, -2.5).
    let want = [
        [0.0, -1.1, 0.0, -30.0],
        [0.9, 0.0, 0.0, 12.0],
        [0.0, 0.0, -2.5, 5.5],
    ];
    assert_same_grid(&out, dims16, &qf, want);
    let (_, pix, qc, _, q, _) = raw_geometry(&out);
    assert_eq!(qc, 1, "qform code kept");
    assert_eq!(pix[0], -1.0, "qfac kept");
    assert_eq!(
        q,
        [0.0, 0.0, h, -30.0, 12.0, 5.5],
        "quaternion copied bit for bit"
    );

    // Neither: codes stay 0 (every reader falls back the same way for input and output).
    let nn = Geo {
        pixdim: [2.0, 0.5, 1.5],
        qform_code: 0,
        sform_code: 0,
        srow: [[0.0; 4]; 3],
        ..Geo::default()
    };
    let p = d.join("neither.nii");
    std::fs::write(&p, nifti(&di, 16, 32, &nn, &data)).unwrap();
    let (out, _) = segment_ok(&p, &[]);
    let want = [
        [2.0, 0.0, 0.0, 0.0],
        [0.0, 0.5, 0.0, 0.0],
        [0.0, 0.0, 1.5, 0.0],
    ];
    assert_same_grid(&out, dims16, &nn, want);
    let (_, _, qc, sc, _, _) = raw_geometry(&out);
    assert_eq!((qc, sc), (0, 0));
}

#[test]
fn nonfinite_constant_and_thin_volumes() {
    let dir = tempdir();
    let d = dir.path();
    let model = data("deepbrain.onnx");

    // NaN and ±Inf voxels: warning naming the file and the count; the result equals segmenting the
    // volume with NaN→0 and ±Inf→the finite max/min written out by hand.
    let dims = [24usize, 24, 16];
    let n: usize = dims.iter().product();
    let f = ball(dims);
    let clean: Vec<f32> = (0..n).map(&f).collect();
    let (mn, mx) = clean
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let mut dirty = clean.clone();
    let mut fixed = clean.clone();
    let mut bad = 0;
    for i in (0..n).step_by(53) {
        let (v, r) = match (i / 53) % 3 {
            0 => (f32::NAN, 0.0),
            1 => (f32::INFINITY, mx),
            _ => (f32::NEG_INFINITY, mn),
        };
        dirty[i] = v;
        fixed[i] = r;
        bad += 1;
    }
    let di = dims.map(|v| v as i64);
    let pd = d.join("dirty.nii");
    std::fs::write(&pd, nifti_f32(&di, |i| dirty[i])).unwrap();
    let pf = d.join("fixed.nii");
    std::fs::write(&pf, nifti_f32(&di, |i| fixed[i])).unwrap();
    let (od, err) = segment_ok(&pd, &[]);
    assert!(
        err.contains("dirty.nii") && err.contains(&format!("{bad} NaN/Inf")),
        "{err}"
    );
    let (of, err) = segment_ok(&pf, &[]);
    assert!(!err.contains("NaN"), "{err}");
    assert_eq!(std::fs::read(&od).unwrap(), std::fs::read(&of).unwrap());

    // Constant volumes (zero and non-zero): a valid label map on the input grid.
    for (name, v) in [("const0.nii", 0.0f32), ("const7.nii", 7.0)] {
        let p = d.join(name);
        std::fs::write(&p, nifti_f32(&[20, 20, 12], |_| v)).unwrap();
        let (out, _) = segment_ok(&p, &[]);
        let seg = voxtile::volume::read(&out).unwrap();
        assert_eq!(seg.shape(), [20, 20, 12]);
        assert!(seg.data.iter().all(|&l| l == 0.0 || l == 1.0));
    }

    // One voxel thick (64x64x1) with a model that downsamples: padded to its divisor, cropped back.
    let g = voxtile::model::onnx::load(&model).unwrap();
    let div = g.spatial_divisor();
    assert!(div[2] > 1, "deepbrain downsamples, divisor {div:?}");
    let p = d.join("thin.nii");
    std::fs::write(&p, nifti_f32(&[64, 64, 1], ball([64, 64, 1]))).unwrap();
    let (out, _) = segment_ok(&p, &[]);
    let (dim, ..) = raw_geometry(&out);
    assert_eq!(&dim[..4], &[3, 64, 64, 1]);
    let vox_offset = le_f32(&std::fs::read(&out).unwrap(), 108) as u64;
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        vox_offset + 64 * 64,
        "uint8 labels, no padding left"
    );
    // 1x1x1.
    let p = d.join("one.nii");
    std::fs::write(&p, nifti_f32(&[1, 1, 1], |_| 0.5)).unwrap();
    let (out, _) = segment_ok(&p, &[]);
    assert_eq!(&raw_geometry(&out).0[..4], &[3, 1, 1, 1]);

    // 4-D with 3 channels for a one-channel model: one clear error naming both files.
    let p = d.join("three_ch.nii");
    std::fs::write(&p, nifti_f32(&[16, 16, 8, 3], |i| i as f32)).unwrap();
    let out = d.join("three_ch_seg.nii");
    let o = segment_cpu(&p, &model, &out, &[]);
    let e = assert_one_error(&o, "three_ch.nii");
    assert!(
        e.contains("3 channel") && e.contains("deepbrain.onnx") && e.contains("expects 1"),
        "{e}"
    );
    assert!(!out.exists());
}

// ------------------------------------------------------------------ 5. output safety

/// A volume big enough that deepbrain on the CPU runs for several seconds.
fn big_input(d: &Path) -> PathBuf {
    let dims = [160usize, 160, 128];
    let p = d.join("big.nii");
    std::fs::write(&p, nifti_f32(&dims.map(|v| v as i64), ball(dims))).unwrap();
    p
}

/// 9 windows instead of 4: inference outlasts the 1.5 s before the signal even on a fast machine.
const MANY_WINDOWS: &[&str] = &["--overlap", "0.75"];

fn kill(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

fn spawn_segment(
    input: &Path,
    out: &Path,
    env: &[(&str, &str)],
    extra: &[&str],
) -> std::process::Child {
    let model = data("deepbrain.onnx");
    let mut c = Command::new(voxtile_bin());
    c.args([
        "segment",
        s(input),
        "--model",
        s(&model),
        "-o",
        s(out),
        "--device",
        "cpu",
    ])
    .stdout(Stdio::null())
    .args(extra)
    .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn wait_output(child: std::process::Child) -> (Option<i32>, String) {
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn interrupted_runs_leave_nothing_behind() {
    let dir = tempdir();
    let d = dir.path();
    let input = big_input(d);

    // SIGINT and SIGTERM during inference.
    for (sig, code) in [("-INT", 130), ("-TERM", 143)] {
        let out = d.join("mid.nii.gz");
        let child = spawn_segment(&input, &out, &[], MANY_WINDOWS);
        std::thread::sleep(Duration::from_millis(1500));
        kill(child.id(), sig);
        let (c, err) = wait_output(child);
        assert_eq!(c, Some(code), "{sig}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.exists(), "{sig}: no output");
        assert!(temp_files(d).is_empty(), "{sig}: {:?}", temp_files(d));
    }

    // SIGKILL between windows cannot be caught; the output only ever exists as a temp file during
    // the write phase, so nothing is left either.
    let out = d.join("killed.nii.gz");
    let child = spawn_segment(&input, &out, &[], MANY_WINDOWS);
    std::thread::sleep(Duration::from_millis(1500));
    kill(child.id(), "-KILL");
    let (c, _) = wait_output(child);
    assert_eq!(c, None, "killed by the signal");
    assert!(!out.exists() && temp_files(d).is_empty());

    // During the write: the temp file is complete and about to be renamed (held there by the test
    // hook); the signal must remove it and keep the final name absent.
    for (sig, code) in [("-TERM", 143), ("-INT", 130)] {
        let out = d.join("write.nii.gz");
        let child = spawn_segment(
            &input,
            &out,
            &[("VOXTILE_TEST_PAUSE_BEFORE_RENAME", "20000")],
            &[],
        );
        let t = Instant::now();
        while temp_files(d).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "no temp file appeared"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The temp file is registered before it is created, so the signal may come at once; wait
        // a little anyway so that it is being written or finished.
        std::thread::sleep(Duration::from_millis(300));
        kill(child.id(), sig);
        let (c, err) = wait_output(child);
        assert_eq!(c, Some(code), "{sig}: {err}");
        assert!(err.contains("unfinished output was removed"), "{err}");
        assert!(!out.exists(), "{sig}: no output");
        assert!(temp_files(d).is_empty(), "{sig}: {:?}", temp_files(d));
    }

    // An existing output survives an interrupted --force run untouched.
    let out = d.join("keep.nii.gz");
    std::fs::write(&out, b"previous result").unwrap();
    let model = data("deepbrain.onnx");
    let child = Command::new(voxtile_bin())
        .args([
            "segment",
            s(&input),
            "--model",
            s(&model),
            "-o",
            s(&out),
            "--device",
            "cpu",
            "--force",
        ])
        .env("VOXTILE_TEST_PAUSE_BEFORE_RENAME", "20000")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while temp_files(d).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(child.id(), "-INT");
    let (c, _) = wait_output(child);
    assert_eq!(c, Some(130));
    assert_eq!(std::fs::read(&out).unwrap(), b"previous result");
    assert!(temp_files(d).is_empty());
}

#[test]
fn existing_outputs_and_inputs_are_protected() {
    let dir = tempdir();
    let d = dir.path();
    let model = data("deepbrain.onnx");
    let vol = d.join("v.nii");
    std::fs::write(&vol, nifti_f32(&[16, 16, 8], ball([16, 16, 8]))).unwrap();
    let vol_bytes = std::fs::read(&vol).unwrap();
    let out = d.join("o.nii");
    std::fs::write(&out, b"old").unwrap();
    // Existing output without --force: refused, untouched.
    let o = segment_cpu(&vol, &model, &out, &[]);
    let e = assert_one_error(&o, "o.nii");
    assert!(e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
    // A symlink to the input as output, even with --force: refused, input untouched.
    let link = d.join("link.nii");
    std::os::unix::fs::symlink(&vol, &link).unwrap();
    let o = segment_cpu(&vol, &model, &link, &["--force"]);
    assert_one_error(&o, "refusing to overwrite an input");
    assert_eq!(std::fs::read(&vol).unwrap(), vol_bytes);
    // The model as output: refused.
    let o = segment_cpu(&vol, &model, &model, &["--force"]);
    assert_one_error(&o, "refusing to overwrite an input");
    // --logits onto the input: refused before any work.
    let o = voxtile(&[
        "segment",
        s(&vol),
        "--model",
        s(&model),
        "-o",
        s(&d.join("new.nii")),
        "--logits",
        s(&vol),
        "--device",
        "cpu",
    ]);
    assert_one_error(&o, "refusing to overwrite an input");
    assert!(!d.join("new.nii").exists());
    // With --force the old output is replaced by a valid label map, no temp left.
    let o = segment_cpu(&vol, &model, &out, &["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(voxtile::volume::read(&out).unwrap().shape(), [16, 16, 8]);
    assert!(temp_files(d).is_empty());
    // An output folder that does not exist: one error naming the path, nothing created.
    let nowhere = d.join("no/such/dir/o.nii");
    let o = segment_cpu(&vol, &model, &nowhere, &[]);
    assert_one_error(&o, "no/such/dir");
    assert!(!d.join("no").exists());
}

/// Writes the small hand-built ONNX seeds of the `onnx_load` fuzz target into fuzz/seeds/onnx,
/// and the hostile models into tests/fixtures/crashers/onnx (run by hand: `cargo test --test it write_onnx_fuzz_seeds -- --ignored`).
#[test]
#[ignore]
fn write_onnx_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/onnx");
    std::fs::create_dir_all(&dir).unwrap();
    let up = ftensor(
        "wt",
        &[2, 1, 2, 2, 2],
        (0..16).map(|i| i as f32 * 0.05).collect::<Vec<_>>(),
    );
    let w_out = ftensor("w_out", &[1, 2, 1, 1, 1], vec![0.5, -0.25]);
    let b = ftensor("b", &[2], vec![0.1, -0.2]);
    let seeds = [
        (
            "conv_relu",
            model(
                vec![
                    node(
                        "Conv",
                        "c",
                        &["x", "w", "b"],
                        &["h"],
                        &[("pads", vec![1; 6])],
                    ),
                    node("Relu", "r", &["h"], &["y"], &[]),
                ],
                vec![w3(), b.clone()],
                "y",
            ),
        ),
        (
            "down_up_concat",
            model(
                vec![
                    node(
                        "Conv",
                        "down",
                        &["x", "w"],
                        &["d"],
                        &[("pads", vec![1; 6]), ("strides", vec![2, 2, 2])],
                    ),
                    node(
                        "ConvTranspose",
                        "up",
                        &["d", "wt"],
                        &["u"],
                        &[("strides", vec![2, 2, 2])],
                    ),
                    node("Concat", "cat", &["x", "u"], &["c"], &[("axis", vec![])]),
                    node("Conv", "head", &["c", "w_out"], &["l"], &[]),
                    node("Sigmoid", "s", &["l"], &["y"], &[]),
                ],
                vec![w3(), up, w_out],
                "y",
            ),
        ),
        (
            "pool_softmax",
            model(
                vec![
                    node("Conv", "c", &["x", "w"], &["h"], &[("pads", vec![1; 6])]),
                    node(
                        "MaxPool",
                        "p",
                        &["h"],
                        &["q"],
                        &[("kernel_shape", vec![2, 2, 2]), ("strides", vec![2, 2, 2])],
                    ),
                    node("Softmax", "sm", &["q"], &["y"], &[]),
                ],
                vec![w3()],
                "y",
            ),
        ),
    ];
    for (name, mut m) in seeds {
        // Concat's axis is an int attribute, not ints.
        for n in &mut m.graph.as_mut().unwrap().node {
            for a in &mut n.attribute {
                if a.name() == "axis" {
                    a.ints.clear();
                    a.i = Some(1);
                    a.r#type = Some(2);
                }
            }
        }
        let bytes = m.encode_to_vec();
        let g = voxtile::model::onnx::load_bytes(&bytes, None, Path::new(name)).unwrap();
        g.validate().unwrap();
        g.infer_shapes(1, [8, 8, 8]).unwrap();
        std::fs::write(dir.join(format!("{name}.onnx")), bytes).unwrap();
    }
    let crash = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crashers/onnx");
    std::fs::create_dir_all(&crash).unwrap();
    for (name, m, _) in hostile_models() {
        std::fs::write(crash.join(format!("{name}.onnx")), m.encode_to_vec()).unwrap();
    }
}

/// `read_bytes` (what the fuzzers call) is the same reader as `read`: same header, same values,
/// plain and gzip.
#[test]
fn read_bytes_matches_read() {
    for rel in [
        "fixtures/volumes/nibabel_anatomical_bigendian.nii",
        "fixtures/volumes/nibabel_example_nifti2.nii.gz",
    ] {
        let Some(p) = shared(rel) else { continue };
        let a = voxtile::volume::read(&p).unwrap();
        let b = voxtile::volume::read_bytes(&std::fs::read(&p).unwrap(), &p).unwrap();
        assert_eq!(a.header, b.header, "{rel}");
        assert_eq!(a.data, b.data, "{rel}");
    }
    // A gzip stream that is longer than 4 Mi values grows past the first reservation correctly.
    let dims = [256usize, 128, 160];
    let raw = nifti_f32(&dims.map(|v| v as i64), |i| i as f32);
    let v = voxtile::volume::read_bytes(&gz(&raw), Path::new("big.nii.gz")).unwrap();
    assert_eq!(v.shape(), dims);
    let flat: Vec<f32> = v
        .data
        .index_axis(ndarray::Axis(0), 0)
        .t()
        .iter()
        .copied()
        .collect();
    assert!(flat.iter().enumerate().all(|(i, &x)| x == i as f32));
}
