//! The pipeline around the sliding window: manifests, intensity, resampling, TTA, ensembles,
//! outputs, preview, batches (library and through the `voxtile` binary).

use crate::common::onnx::*;
use crate::common::rng::Rng;
use crate::common::*;
use ndarray::{Array3, Array4, ArrayView4, Axis};
use prost::Message;
use std::path::{Path, PathBuf};
use voxtile::engine::{AxisOrder, Device, Engine, Options};
use voxtile::internals::cli::dataset as batch;
use voxtile::pipeline::{
    self, manifest::OneOrThree, outputs, resample, Activation, Intensity, Manifest, Pipeline,
    Settings,
};
use voxtile::tiling::BlendMode;
use voxtile::volume::intensity;
use voxtile::volume::{Header, Volume};

// ---------------------------------------------------------------- helpers

/// One Conv (kernel k, "same" padding) from cin to cout channels: the ONNX bytes.
fn conv_onnx(cin: usize, cout: usize, k: usize, w: &[f32], b: &[f32]) -> Vec<u8> {
    assert_eq!(w.len(), cout * cin * k * k * k);
    let p = (k / 2) as i64;
    let k = k as i64;
    let attrs = vec![
        ints_attr("kernel_shape", vec![k, k, k]),
        ints_attr("pads", vec![p, p, p, p, p, p]),
    ];
    let m = model_with(
        "conv",
        17,
        vec![node_with("Conv", "conv0", &["x", "w", "b"], &["y"], attrs)],
        vec![
            ftensor("w", &[cout as i64, cin as i64, k, k, k], w),
            ftensor("b", &[cout as i64], b),
        ],
        vec![vi_ncdhw("x", Some(cin as i64))],
        vec![vi_ncdhw("y", None)],
    );
    m.encode_to_vec()
}

fn graph(bytes: &[u8]) -> voxtile::model::Graph {
    voxtile::model::onnx::load_bytes(bytes, None, Path::new("t.onnx")).expect("model loads")
}

/// Three classes by intensity: 0 below 0.25, 1 up to 0.75, 2 above (1x1x1 conv).
fn three_class_onnx() -> Vec<u8> {
    conv_onnx(1, 3, 1, &[0.0, 4.0, 8.0], &[0.0, -1.0, -4.0])
}

/// A 3x3x3 conv with random weights; `symmetric`: invariant under every flip of the kernel.
fn conv3_onnx(cout: usize, symmetric: bool, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let base: Vec<f32> = (0..cout * 27).map(|_| r.uni()).collect();
    let w: Vec<f32> = (0..cout * 27)
        .map(|n| {
            let (o, a, b, c) = (n / 27, n / 9 % 3, n / 3 % 3, n % 3);
            if symmetric {
                // Depends only on the distance from the centre along each axis.
                let (a, b, c) = (a.abs_diff(1), b.abs_diff(1), c.abs_diff(1));
                base[o * 27 + a * 9 + b * 3 + c]
            } else {
                base[o * 27 + a * 9 + b * 3 + c]
            }
        })
        .collect();
    let b: Vec<f32> = (0..cout).map(|_| r.uni() * 0.1).collect();
    conv_onnx(1, cout, 3, &w, &b)
}

fn cpu_options(roi: usize) -> Options {
    Options {
        roi: Some([roi; 3]),
        device: Device::Cpu,
        blend: BlendMode::Constant,
        // The references below read the engine's blended outputs directly.
        keep_logits: true,
        ..Options::default()
    }
}

fn engine(bytes: &[u8], roi: usize) -> Engine {
    Engine::new(graph(bytes), cpu_options(roi)).unwrap()
}

fn random_volume(shape: [usize; 3], spacing: [f64; 3], seed: u64) -> Volume {
    let mut r = Rng::new(seed);
    let data = Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |_| r.uni());
    Volume {
        data,
        header: Header::new(shape, 1, spacing),
    }
}

/// Smooth values in [0, 1] so the three-class model gives all three labels.
fn ramp_volume(shape: [usize; 3], spacing: [f64; 3]) -> Volume {
    let s = (shape[0] + shape[1] + shape[2] - 3) as f32;
    let data = Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        (i + j + k) as f32 / s
    });
    Volume {
        data,
        header: Header::new(shape, 1, spacing),
    }
}

/// Softmax over axis 0 in f64 (independent of the library's).
fn softmax_ref(x: ArrayView4<f32>) -> Array4<f64> {
    let mut out = x.mapv(|v| v as f64);
    for mut lane in out.lanes_mut(Axis(0)) {
        let m = lane.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        lane.mapv_inplace(|v| (v - m).exp());
        let s = lane.sum();
        lane.mapv_inplace(|v| v / s);
    }
    out
}

/// Mirror (C, i, j, k) along file axes by index arithmetic (not ndarray's invert_axis).
fn flip_ref(x: ArrayView4<f32>, axes: &[usize]) -> Array4<f32> {
    let (c, n0, n1, n2) = x.dim();
    let n = [n0, n1, n2];
    Array4::from_shape_fn((c, n0, n1, n2), |(ci, i, j, k)| {
        let mut p = [i, j, k];
        for &a in axes {
            p[a] = n[a] - 1 - p[a];
        }
        x[[ci, p[0], p[1], p[2]]]
    })
}

fn max_abs_diff(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> f64 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "voxtile failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn write_volume(path: &Path, v: &Volume) {
    voxtile::volume::write_f32(path, v.data.view(), &v.header).unwrap();
}

fn labels_of(path: &Path) -> Array3<u16> {
    let v = voxtile::volume::read(path).unwrap();
    v.data.index_axis(Axis(0), 0).mapv(|x| x as u16)
}

// ---------------------------------------------------------------- 1. manifest

const MANIFEST_TOML: &str = r#"
name = "liver-ct"
classes = ["background", "liver", "tumour"]
axis_order = "zyx"
spacing = [2.5, 0.8, 0.8]
roi = [64, 128, 128]
overlap = 0.25
blend = "gaussian"
activation = "softmax"
mirror_axes = [1, 2]

[normalize]
kind = "ct"
clip = [-100.0, 240.0]
mean = 99.4
std = 39.4

[remap]
1 = 6
2 = 7
"#;

#[test]
fn manifest_toml_and_json_agree_and_are_checked() {
    let dir = tempdir();
    let t = dir.path().join("net.toml");
    std::fs::write(&t, MANIFEST_TOML).unwrap();
    let m = Manifest::load(&t).unwrap();
    assert_eq!(m.classes.as_ref().unwrap()[2], "tumour");
    assert_eq!(m.axis_order.as_deref(), Some("zyx"));
    assert_eq!(m.spacing, Some([2.5, 0.8, 0.8]));
    assert_eq!(m.roi.unwrap().triple(), [64, 128, 128]);
    assert_eq!(m.overlap, Some(OneOrThree::One(0.25)));
    assert_eq!(m.activation, Some(Activation::Softmax));
    assert_eq!(
        m.normalize,
        Some(Intensity::Ct {
            clip: [-100.0, 240.0],
            mean: 99.4,
            std: 39.4
        })
    );
    assert_eq!(m.remap_table(3).unwrap(), Some(vec![0, 6, 7]));
    assert!(m.remap_table(2).is_err(), "remap names channel 2 of 2");

    // The same manifest as JSON.
    let j = dir.path().join("net.json");
    std::fs::write(
        &j,
        r#"{"name": "liver-ct", "classes": ["background", "liver", "tumour"], "axis_order": "zyx",
            "spacing": [2.5, 0.8, 0.8], "roi": [64, 128, 128], "overlap": 0.25, "blend": "gaussian",
            "activation": "softmax", "mirror_axes": [1, 2],
            "normalize": {"kind": "ct", "clip": [-100.0, 240.0], "mean": 99.4, "std": 39.4},
            "remap": {"1": 6, "2": 7}}"#,
    )
    .unwrap();
    assert_eq!(Manifest::load(&j).unwrap(), m);

    // Found beside the model by stem, TOML first.
    let model = dir.path().join("net.onnx");
    assert_eq!(Manifest::beside(&model), Some(t.clone()));
    std::fs::remove_file(&t).unwrap();
    assert_eq!(Manifest::beside(&model), Some(j.clone()));
    assert_eq!(Manifest::beside(dir.path().join("other.onnx")), None);

    // Mistakes are errors that name the file.
    for (bad, what) in [
        ("rois = 3", "unknown field"),
        ("spacing = [1.0, 0.0, 1.0]", "spacing"),
        ("overlap = 1.5", "overlap"),
        ("axis_order = \"yxz\"", "axis order"),
        ("blend = \"box\"", "blend"),
        ("mirror_axes = [3]", "mirror_axes"),
        (
            "[normalize]\nkind = \"ct\"\nclip = [10.0, 0.0]\nmean = 0.0\nstd = 1.0",
            "ct",
        ),
        (
            "[normalize]\nkind = \"percentile\"\np_lo = 99.0\np_hi = 1.0",
            "percentile",
        ),
        ("[normalize]\nkind = \"zscore\"\nmean = 3.0", "mean"),
        ("[remap]\nliver = 3", "remap"),
        ("classes = 3", "classes"),
    ] {
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, bad).unwrap();
        let e = Manifest::load(&p).unwrap_err().to_string();
        assert!(e.contains("bad.toml"), "{bad}: {e}");
        assert!(e.contains(what), "{bad}: expected '{what}' in {e}");
    }
}

// ---------------------------------------------------------------- intensity

#[test]
fn percentile_matches_numpy_linear_on_a_sort() {
    let mut r = Rng::new(7);
    for n in [1usize, 2, 5, 100, 1001] {
        let v: Vec<f32> = (0..n).map(|_| r.uni() * 100.0).collect();
        let mut sorted = v.clone();
        sorted.sort_by(f32::total_cmp);
        for p in [0.0, 0.5, 1.0, 25.0, 50.0, 99.0, 99.5, 100.0] {
            let idx = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (idx.floor() as usize, idx.ceil() as usize);
            let want =
                sorted[lo] as f64 + (sorted[hi] as f64 - sorted[lo] as f64) * (idx - lo as f64);
            let got = intensity::percentile(&mut v.clone(), p);
            assert!(
                (got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                "n {n} p {p}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn intensity_normalisations() {
    let vol = random_volume([9, 8, 7], [1.0; 3], 3)
        .data
        .mapv(|v| v * 500.0);
    // CT: clip then standardise, voxel by voxel.
    let mut ct = vol.clone();
    intensity::apply(
        &mut ct,
        &Intensity::Ct {
            clip: [-100.0, 240.0],
            mean: 99.4,
            std: 39.4,
        },
    )
    .unwrap();
    for (o, x) in ct.iter().zip(vol.iter()) {
        let want = ((*x as f64).clamp(-100.0, 240.0) - 99.4) / 39.4;
        assert!((*o as f64 - want).abs() < 1e-4, "{o} vs {want}");
    }
    // z-score: mean 0, std 1.
    let mut z = vol.clone();
    intensity::apply(&mut z, &Intensity::Zscore).unwrap();
    let n = z.len() as f64;
    let mean = z.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(
        mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
        "{mean} {var}"
    );
    // Percentiles: p5 -> 0, p95 -> 1, clipped outside, linear between.
    let mut p = vol.clone();
    intensity::apply(
        &mut p,
        &Intensity::Percentile {
            p_lo: 5.0,
            p_hi: 95.0,
        },
    )
    .unwrap();
    let mut sorted: Vec<f32> = vol.iter().copied().collect();
    sorted.sort_by(f32::total_cmp);
    let q = |pp: f64| {
        let idx = pp / 100.0 * (sorted.len() - 1) as f64;
        let lo = idx.floor() as usize;
        sorted[lo] as f64 + (sorted[lo + 1] as f64 - sorted[lo] as f64) * (idx - lo as f64)
    };
    let (lo, hi) = (q(5.0), q(95.0));
    for (o, x) in p.iter().zip(vol.iter()) {
        let want = ((*x as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
        assert!((*o as f64 - want).abs() < 1e-5, "{o} vs {want}");
    }
    let below = p.iter().filter(|&&v| v == 0.0).count();
    assert!(
        below > 0 && below < p.len() / 10,
        "about 5% clipped to 0: {below}"
    );
}

// ---------------------------------------------------------------- 2. resampling

/// Direct trilinear in f64: for each output voxel, the 8 corners with product weights.
fn trilinear_ref(x: ArrayView4<f32>, to: [usize; 3]) -> Array4<f64> {
    let (c, n0, n1, n2) = x.dim();
    let n = [n0, n1, n2];
    Array4::from_shape_fn((c, to[0], to[1], to[2]), |(ci, a, b, d)| {
        let o = [a, b, d];
        let mut idx = [[0usize; 2]; 3];
        let mut w = [[0f64; 2]; 3];
        for ax in 0..3 {
            let pos = ((o[ax] as f64 + 0.5) * n[ax] as f64 / to[ax] as f64 - 0.5)
                .max(0.0)
                .min((n[ax] - 1) as f64);
            let f = pos.floor();
            idx[ax] = [f as usize, (f as usize + 1).min(n[ax] - 1)];
            w[ax] = [1.0 - (pos - f), pos - f];
        }
        let mut sum = 0.0;
        for u in 0..2 {
            for v in 0..2 {
                for t in 0..2 {
                    sum += w[0][u]
                        * w[1][v]
                        * w[2][t]
                        * x[[ci, idx[0][u], idx[1][v], idx[2][t]]] as f64;
                }
            }
        }
        sum
    })
}

#[test]
fn resample_matches_independent_f64_trilinear() {
    let mut r = Rng::new(11);
    let x = Array4::from_shape_fn((2, 7, 5, 6), |_| r.uni());
    for to in [[11, 3, 9], [14, 10, 12], [3, 2, 1], [7, 5, 13], [1, 1, 1]] {
        let got = resample::resample(x.view(), to).unwrap();
        assert_eq!(got.dim(), (2, to[0], to[1], to[2]));
        let want = trilinear_ref(x.view(), to);
        let e = max_abs_diff(got.iter().map(|&v| v as f64), want.iter().copied());
        assert!(e < 1e-5, "{to:?}: max error {e}");
    }
    // A permuted (non-standard) view gives the same as its standard copy.
    let t = x.view().permuted_axes([0, 3, 2, 1]);
    let a = resample::resample(t, [4, 4, 4]).unwrap();
    let b = resample::resample(t.as_standard_layout().view(), [4, 4, 4]).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        resample::shape_for_spacing([100, 80, 30], [0.8, 0.8, 3.0], [1.6, 1.0, 1.5]).unwrap(),
        [50, 64, 60]
    );
}

#[test]
fn resample_round_trips() {
    let mut r = Rng::new(5);
    let x = Array4::from_shape_fn((1, 8, 9, 10), |_| r.uni());
    // Same grid: bit for bit.
    assert_eq!(resample::resample(x.view(), [8, 9, 10]).unwrap(), x);
    // Constant: exact through any grid.
    let c = Array4::from_elem((1, 5, 6, 7), 3.25f32);
    let up = resample::resample(c.view(), [13, 4, 9]).unwrap();
    assert!(up.iter().all(|&v| v == 3.25));
    assert_eq!(resample::resample(up.view(), [5, 6, 7]).unwrap(), c);
    // An affine function survives up-by-2 then down-by-2 away from the clamped border voxel.
    let f = |i: usize, j: usize, k: usize| 0.5 * i as f32 - 0.25 * j as f32 + 0.125 * k as f32;
    let a = Array4::from_shape_fn((1, 8, 8, 8), |(_, i, j, k)| f(i, j, k));
    let back = resample::resample(
        resample::resample(a.view(), [16, 16, 16]).unwrap().view(),
        [8, 8, 8],
    )
    .unwrap();
    for i in 1..7 {
        for j in 1..7 {
            for k in 1..7 {
                let e = (back[[0, i, j, k]] - a[[0, i, j, k]]).abs();
                assert!(e < 1e-5, "({i},{j},{k}): {e}");
            }
        }
    }
}

#[test]
fn pipeline_resamples_to_the_model_spacing_and_back() {
    // Input at 1 x 1 x 2 mm; the model wants 2 mm: its grid is 10 x 8 x 6.
    let vol = random_volume([20, 16, 6], [1.0, 1.0, 2.0], 9);
    let bytes = three_class_onnx();
    let settings = Settings {
        spacing: Some([2.0, 2.0, 2.0]),
        keep_probabilities: true,
        ..Settings::default()
    };
    let mut p = Pipeline::new(vec![engine(&bytes, 8)], settings).unwrap();
    let out = p.run(&vol, &mut |_, _| {}).unwrap();
    assert_eq!(out.report.model_grid, [10, 8, 6]);
    assert_eq!(out.labels.dim(), (20, 16, 6));
    assert_eq!(out.header.affine(), vol.header.affine());
    // Reference: f64 trilinear down, the 1x1x1 model by hand, softmax, f64 trilinear up.
    let down = trilinear_ref(vol.data.view(), [10, 8, 6]);
    let logits = Array4::from_shape_fn((3, 10, 8, 6), |(c, i, j, k)| {
        let x = down[[0, i, j, k]] as f32;
        [0.0, 4.0 * x - 1.0, 8.0 * x - 4.0][c]
    });
    let probs = softmax_ref(logits.view()).mapv(|v| v as f32);
    let want = trilinear_ref(probs.view(), [20, 16, 6]);
    let got = out.probabilities.unwrap();
    let e = max_abs_diff(got.iter().map(|&v| v as f64), want.iter().copied());
    assert!(e < 1e-5, "probabilities max error {e}");
    // Labels: argmax of the reference wherever it is not a near tie.
    let mut checked = 0;
    for ((i, j, k), &l) in out.labels.indexed_iter() {
        let mut v: Vec<(f64, usize)> = (0..3).map(|c| (want[[c, i, j, k]], c)).collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        if v[0].0 - v[1].0 > 1e-4 {
            assert_eq!(l as usize, v[0].1, "({i},{j},{k})");
            checked += 1;
        }
    }
    assert!(checked > out.labels.len() * 9 / 10);
    let distinct: std::collections::BTreeSet<u16> = out.labels.iter().copied().collect();
    assert!(distinct.len() >= 2, "{distinct:?}");
}

// ---------------------------------------------------------------- 3. TTA and ensembles

#[test]
fn tta_on_a_flip_symmetric_model_changes_nothing() {
    // Symmetric kernel, constant blending and a symmetric window grid (24 = 0..16, 8..24):
    // the model commutes with every flip, so all 8 passes agree.
    let bytes = conv3_onnx(3, true, 21);
    let vol = random_volume([24, 24, 24], [1.0; 3], 4);
    let run = |axes: Vec<usize>| {
        let settings = Settings {
            mirror_axes: axes,
            keep_probabilities: true,
            ..Settings::default()
        };
        let mut p = Pipeline::new(vec![engine(&bytes, 16)], settings).unwrap();
        assert_eq!(p.effective_activation(), Activation::Softmax);
        p.run(&vol, &mut |_, _| {}).unwrap()
    };
    let plain = run(vec![]);
    let tta = run(vec![0, 1, 2]);
    assert_eq!(tta.report.passes, 8);
    let (a, b) = (plain.probabilities.unwrap(), tta.probabilities.unwrap());
    let e = max_abs_diff(a.iter().map(|&v| v as f64), b.iter().map(|&v| v as f64));
    assert!(e < 1e-5, "TTA changed a symmetric model's output by {e}");
    let agree = agreement(plain.labels.iter(), tta.labels.iter());
    assert!(agree > 0.9999, "{agree}");
}

#[test]
fn tta_is_the_average_of_the_flipped_passes() {
    let bytes = conv3_onnx(3, false, 33);
    let vol = random_volume([20, 18, 16], [1.0; 3], 8);
    let settings = Settings {
        mirror_axes: vec![0, 2],
        keep_probabilities: true,
        ..Settings::default()
    };
    let mut p = Pipeline::new(vec![engine(&bytes, 12)], settings).unwrap();
    assert_eq!(p.flip_sets().len(), 4);
    let out = p.run(&vol, &mut |_, _| {}).unwrap();
    // Reference: flip by index, run, flip back by index, f64 softmax, average.
    let mut e = engine(&bytes, 12);
    let mut acc = Array4::<f64>::zeros((3, 20, 18, 16));
    for axes in [vec![], vec![0], vec![2], vec![0, 2]] {
        let x = flip_ref(vol.data.view(), &axes);
        let (_, logits, _) = parts(e.segment_array(x.view(), &mut |_, _| {}).unwrap());
        acc += &softmax_ref(flip_ref(logits.view(), &axes).view());
    }
    acc.mapv_inplace(|v| v / 4.0);
    let got = out.probabilities.unwrap();
    let err = max_abs_diff(got.iter().map(|&v| v as f64), acc.iter().copied());
    assert!(err < 1e-5, "max error {err}");
    // And it differs from the plain pass (the model is not symmetric).
    let (_, plain, _) = parts(e.segment_array(vol.data.view(), &mut |_, _| {}).unwrap());
    let plain = softmax_ref(plain.view());
    let d = max_abs_diff(got.iter().map(|&v| v as f64), plain.iter().copied());
    assert!(
        d > 1e-3,
        "TTA made no difference ({d}): the test proves nothing"
    );
}

#[test]
fn mirror_axes_are_network_axes() {
    let bytes = conv3_onnx(2, false, 1);
    let mut o = cpu_options(8);
    o.axis_order = AxisOrder::Zyx;
    let e = Engine::new(graph(&bytes), o).unwrap();
    let p = Pipeline::new(
        vec![e],
        Settings {
            mirror_axes: vec![0],
            ..Settings::default()
        },
    )
    .unwrap();
    // Network D is file k under zyx.
    assert_eq!(p.flip_sets(), vec![vec![], vec![2]]);
    let bad = Pipeline::new(
        vec![engine(&bytes, 8)],
        Settings {
            mirror_axes: vec![3],
            ..Settings::default()
        },
    );
    assert!(bad.is_err());
}

#[test]
fn ensembles_average_the_models() {
    let (a, b) = (conv3_onnx(3, false, 41), conv3_onnx(3, false, 42));
    let vol = random_volume([14, 12, 10], [1.0; 3], 2);
    let keep = Settings {
        keep_probabilities: true,
        ..Settings::default()
    };
    let run = |models: Vec<&[u8]>| {
        let engines = models.into_iter().map(|m| engine(m, 8)).collect();
        let mut p = Pipeline::new(engines, keep.clone()).unwrap();
        p.run(&vol, &mut |_, _| {}).unwrap()
    };
    // A model with itself is the model.
    let one = run(vec![&a]);
    let twice = run(vec![&a, &a]);
    assert_eq!(twice.report.models, 2);
    let (p1, p2) = (
        one.probabilities.clone().unwrap(),
        twice.probabilities.unwrap(),
    );
    let e = max_abs_diff(p1.iter().map(|&v| v as f64), p2.iter().map(|&v| v as f64));
    assert!(e < 1e-6, "{e}");
    assert_eq!(one.labels, twice.labels);
    // Two different models: the mean of their softmax outputs.
    let both = run(vec![&a, &b]).probabilities.unwrap();
    let mut want = Array4::<f64>::zeros(both.raw_dim());
    for m in [&a, &b] {
        let (_, l, _) = engine(m, 8)
            .segment_array(vol.data.view(), &mut |_, _| {})
            .map(parts)
            .unwrap();
        want += &softmax_ref(l.view());
    }
    want.mapv_inplace(|v| v / 2.0);
    let e = max_abs_diff(both.iter().map(|&v| v as f64), want.iter().copied());
    assert!(e < 1e-5, "{e}");
    // Models that do not fit together are refused.
    let two_class = conv3_onnx(2, false, 43);
    assert!(Pipeline::new(vec![engine(&a, 8), engine(&two_class, 8)], keep.clone()).is_err());
}

#[test]
fn activations() {
    use voxtile::model::graph::OutputActivation as G;
    assert_eq!(
        pipeline::effective_activation(Activation::Auto, G::None, 3),
        Activation::Softmax
    );
    assert_eq!(
        pipeline::effective_activation(Activation::Auto, G::None, 1),
        Activation::Sigmoid
    );
    assert_eq!(
        pipeline::effective_activation(Activation::Auto, G::Softmax, 3),
        Activation::None
    );
    assert_eq!(
        pipeline::effective_activation(Activation::Sigmoid, G::None, 3),
        Activation::Sigmoid
    );
    let mut r = Rng::new(3);
    let x = Array4::from_shape_fn((4, 3, 2, 5), |_| r.uni() * 30.0);
    let mut y = x.clone();
    pipeline::apply_activation(&mut y, Activation::Softmax);
    let e = max_abs_diff(y.iter().map(|&v| v as f64), softmax_ref(x.view()));
    assert!(e < 1e-6, "{e}");
    let mut y = x.clone();
    pipeline::apply_activation(&mut y, Activation::Sigmoid);
    for (a, b) in y.iter().zip(x.iter()) {
        assert!((*a as f64 - 1.0 / (1.0 + (-(*b as f64)).exp())).abs() < 1e-6);
    }
}

// ---------------------------------------------------------------- 4, 6. outputs and preview

#[test]
fn remap_split_classes_and_u8_probabilities() {
    let dir = tempdir();
    let vol = ramp_volume([12, 10, 8], [1.0; 3]);
    let settings = Settings {
        remap: Some(vec![0, 10, 20]),
        keep_probabilities: true,
        ..Settings::default()
    };
    let mut p = Pipeline::new(vec![engine(&three_class_onnx(), 8)], settings).unwrap();
    let out = p.run(&vol, &mut |_, _| {}).unwrap();
    let probs = out.probabilities.unwrap();
    let raw = voxtile::tiling::argmax(probs.view()).unwrap();
    for (l, r) in out.labels.iter().zip(raw.iter()) {
        assert_eq!(*l, [0, 10, 20][*r as usize]);
    }
    let set: std::collections::BTreeSet<u16> = out.labels.iter().copied().collect();
    assert_eq!(set, [0, 10, 20].into_iter().collect());

    let names = vec!["bg".to_string(), "liver".into(), "spleen/x".into()];
    let files = outputs::write_split_classes(
        &dir.path().join("split"),
        out.labels.view(),
        &[0, 10, 20],
        Some(&names),
        &out.header,
    )
    .unwrap();
    assert_eq!(
        files,
        vec![
            dir.path().join("split/liver.nii.gz"),
            dir.path().join("split/spleen_x.nii.gz")
        ]
    );
    for (f, value) in files.iter().zip([10u16, 20]) {
        let m = labels_of(f);
        assert_eq!(m, out.labels.mapv(|l| (l == value) as u16));
    }

    let u8p = dir.path().join("p.nii.gz");
    outputs::write_probabilities_u8(&u8p, probs.view(), &out.header).unwrap();
    let back = voxtile::volume::read(&u8p).unwrap();
    assert_eq!(back.header.dtype_name(), "uint8");
    assert_eq!(back.header.affine(), vol.header.affine());
    assert_eq!(back.data.dim(), probs.dim());
    for (a, b) in back.data.iter().zip(probs.iter()) {
        assert!((a - b).abs() <= 0.5 / 255.0 + 1e-6, "{a} vs {b}");
    }
    assert_eq!(outputs::to_u8(1.0), 255);
    assert_eq!(outputs::to_u8(-1.0), 0);
    assert_eq!(outputs::to_u8(0.5), 128);
}

// ---------------------------------------------------------------- 5. batch planning

#[test]
fn shards_split_the_sorted_list() {
    assert_eq!(batch::parse_shard("1/3").unwrap(), (1, 3));
    for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
        assert!(batch::parse_shard(bad).is_err(), "{bad}");
    }
    let files: Vec<usize> = (0..10).collect();
    let mut all = Vec::new();
    for k in 0..3 {
        let part = batch::shard(&files, k, 3);
        assert!(part.iter().all(|i| i % 3 == k));
        all.extend(part);
    }
    all.sort();
    assert_eq!(all, files);
    assert_eq!(batch::stem(Path::new("/a/case_01.nii.gz")), "case_01");
    assert_eq!(batch::stem(Path::new("b.NII")), "b");
    assert_eq!(
        batch::parse_devices("cuda:0,1").unwrap(),
        vec![Device::Cuda(0), Device::Cuda(1)]
    );
    assert_eq!(
        batch::parse_devices("cpu,cpu").unwrap(),
        vec![Device::Cpu, Device::Cpu]
    );
    assert!(batch::parse_devices("cuda:0,x").is_err());
}

// ---------------------------------------------------------------- through the binary

/// net.onnx (three classes) and, when given, its manifest beside it.
fn model_dir(dir: &Path, manifest: Option<&str>) -> PathBuf {
    let m = dir.join("net.onnx");
    std::fs::write(&m, three_class_onnx()).unwrap();
    if let Some(t) = manifest {
        std::fs::write(dir.join("net.toml"), t).unwrap();
    }
    m
}

#[test]
fn cli_manifest_beside_the_model() {
    let dir = tempdir();
    let d = dir.path();
    let model = model_dir(
        d,
        Some(
            "classes = [\"background\", \"liver\", \"spleen\"]\nspacing = [1.5, 1.5, 1.5]\nroi = 8\n\
             [remap]\n1 = 10\n2 = 20\n",
        ),
    );
    let input = d.join("ct.nii.gz");
    let vol = ramp_volume([16, 12, 10], [1.0, 1.0, 1.0]);
    write_volume(&input, &vol);
    let out = d.join("seg.nii.gz");
    let report = d.join("r.json");
    let probs = d.join("probs.nii.gz");
    let split = d.join("classes");
    let png_path = d.join("overlay.png");
    ok(&segment_cpu(
        &input,
        &model,
        &out,
        &[
            "--report",
            s(&report),
            "--probabilities",
            s(&probs),
            "--split-classes",
            s(&split),
            "--preview",
            s(&png_path),
        ],
    ));
    let seg = voxtile::volume::read(&out).unwrap();
    assert_eq!(seg.header.shape(), [16, 12, 10], "the input's grid");
    assert_eq!(seg.header.affine(), vol.header.affine());
    let labels = labels_of(&out);
    let set: std::collections::BTreeSet<u16> = labels.iter().copied().collect();
    assert_eq!(set, [0, 10, 20].into_iter().collect(), "remapped labels");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(
        r["roi"],
        serde_json::json!([8, 8, 8]),
        "roi from the manifest"
    );
    assert_eq!(r["model_grid"], serde_json::json!([11, 8, 7]));
    // Probabilities (float32): sum to 1, argmax = labels before remapping.
    let p = voxtile::volume::read(&probs).unwrap();
    assert_eq!(p.header.dtype_name(), "float32");
    assert_eq!(p.data.dim(), (3, 16, 12, 10));
    let am = voxtile::tiling::argmax(p.data.view()).unwrap();
    for (a, l) in am.iter().zip(labels.iter()) {
        assert_eq!([0u16, 10, 20][*a as usize], *l);
    }
    for lane in p.data.lanes(Axis(0)) {
        assert!((lane.sum() - 1.0).abs() < 1e-5);
    }
    assert_eq!(
        labels_of(&split.join("spleen.nii.gz")),
        labels.mapv(|l| (l == 20) as u16)
    );
    assert!(split.join("liver.nii.gz").exists() && !split.join("background.nii.gz").exists());
    assert!(png_path.exists());

    // A flag beats the manifest.
    ok(&segment_cpu(
        &input,
        &model,
        &d.join("seg2.nii.gz"),
        &[
            "--roi",
            "4",
            "--spacing",
            "none",
            "--report",
            s(&report),
            "--force", // the report of the first run exists
            "--tta",
            "0,1",
        ],
    ));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["roi"], serde_json::json!([4, 4, 4]));
    assert_eq!(r["model_grid"], serde_json::json!([16, 12, 10]));
    assert_eq!(r["passes"], 4);

    // --probabilities-u8 and an ensemble of the model with itself: same labels.
    let pu8 = d.join("p8.nii.gz");
    ok(&voxtile(&[
        "segment",
        s(&input),
        "-m",
        s(&model),
        "-m",
        s(&model),
        "-o",
        s(&d.join("seg3.nii.gz")),
        "--device",
        "cpu",
        "--probabilities",
        s(&pu8),
        "--probabilities-u8",
    ]));
    let q = voxtile::volume::read(&pu8).unwrap();
    assert_eq!(q.header.dtype_name(), "uint8");
    for (a, b) in q.data.iter().zip(p.data.iter()) {
        assert!((a - b).abs() <= 0.5 / 255.0 + 1e-5, "{a} {b}");
    }
    assert_eq!(labels_of(&d.join("seg3.nii.gz")), labels);

    // inspect shows the manifest.
    let o = voxtile(&["inspect", s(&model)]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("manifest") && text.contains("2=spleen") && text.contains("1->10"),
        "{text}"
    );
}

#[test]
fn cli_bad_manifest_is_one_error_line() {
    let dir = tempdir();
    let d = dir.path();
    let model = model_dir(d, Some("roi = 8\nspacin = [1.0, 1.0, 1.0]\n"));
    let input = d.join("v.nii");
    write_volume(&input, &ramp_volume([8, 8, 8], [1.0; 3]));
    let out = d.join("o.nii.gz");
    let o = segment_cpu(&input, &model, &out, &[]);
    let err = assert_one_error(&o, "net.toml");
    let line = err.lines().find(|l| l.starts_with("voxtile: error:"));
    assert!(line.unwrap().contains("spacin"), "{err}");
    assert!(!out.exists());
    // A manifest whose classes do not match the model.
    std::fs::write(d.join("net.toml"), "classes = [\"a\", \"b\"]\n").unwrap();
    let o = segment_cpu(&input, &model, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("net.toml") && err.contains("2 class"), "{err}");
}

fn read_lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn cli_batch_folder_shards_resume_and_workers() {
    let dir = tempdir();
    let d = dir.path();
    let model = model_dir(d, None);
    let inputs = d.join("in");
    std::fs::create_dir(&inputs).unwrap();
    let names = ["c0.nii.gz", "c1.nii", "c2.nii.gz", "c3.nii.gz", "c4.nii.gz"];
    for (n, name) in names.iter().enumerate() {
        let v = ramp_volume([10 + n, 8, 6 + n], [1.0; 3]);
        write_volume(&inputs.join(name), &v);
    }
    std::fs::write(inputs.join("notes.txt"), "not a volume").unwrap();
    let out = d.join("out");
    let seg = |shard: &str, report: &Path, extra: &[&str]| {
        let mut a = vec![
            "segment",
            s(&inputs),
            "-m",
            s(&model),
            "-o",
            s(&out),
            "--device",
            "cpu",
            "--shard",
            shard,
            "--report",
            s(report),
        ];
        a.extend_from_slice(extra);
        voxtile(&a)
    };
    let (r0, r1) = (d.join("r0.jsonl"), d.join("r1.jsonl"));
    ok(&seg("0/2", &r0, &[]));
    ok(&seg("1/2", &r1, &["--preview", s(&d.join("png"))]));
    let (l0, l1) = (read_lines(&r0), read_lines(&r1));
    let stems = |ls: &[serde_json::Value]| -> Vec<String> {
        ls.iter()
            .map(|l| batch::stem(Path::new(l["input"].as_str().unwrap())))
            .collect()
    };
    assert_eq!(stems(&l0), ["c0", "c2", "c4"], "files i mod 2 == 0");
    assert_eq!(stems(&l1), ["c1", "c3"]);
    for l in l0.iter().chain(&l1) {
        assert_eq!(l["status"], "done", "{l}");
        assert!(l["seconds"]["total"].as_f64().unwrap() > 0.0);
    }
    let mut made: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    made.sort();
    assert_eq!(
        made,
        [
            "c0.nii.gz",
            "c1.nii.gz",
            "c2.nii.gz",
            "c3.nii.gz",
            "c4.nii.gz"
        ]
    );
    assert!(d.join("png/c3.png").exists() && !d.join("png/c0.png").exists());
    for (n, name) in names.iter().enumerate() {
        let o = voxtile::volume::read(out.join(format!("{}.nii.gz", batch::stem(Path::new(name)))))
            .unwrap();
        assert_eq!(o.header.shape(), [10 + n, 8, 6 + n]);
    }

    // Resumable: a second run skips what is there.
    let before = std::fs::metadata(out.join("c2.nii.gz"))
        .unwrap()
        .modified()
        .unwrap();
    ok(&seg("0/2", &r0, &[]));
    let again = read_lines(&r0);
    assert_eq!(again.len(), 6, "a resumed batch appends to its report");
    assert!(again[..3].iter().all(|l| l["status"] == "done"));
    assert!(again[3..]
        .iter()
        .all(|l| l["status"].as_str().unwrap().starts_with("skipped")));
    assert_eq!(
        std::fs::metadata(out.join("c2.nii.gz"))
            .unwrap()
            .modified()
            .unwrap(),
        before
    );

    // Two workers (one engine each), files round robin: the same outputs.
    let out2 = d.join("out2");
    let r2 = d.join("r2.jsonl");
    ok(&voxtile(&[
        "segment",
        s(&inputs),
        "-m",
        s(&model),
        "-o",
        s(&out2),
        "--device",
        "cpu,cpu",
        "--report",
        s(&r2),
    ]));
    assert_eq!(read_lines(&r2).len(), 5);
    for name in ["c0", "c1", "c2", "c3", "c4"] {
        let f = format!("{name}.nii.gz");
        assert_eq!(
            labels_of(&out.join(&f)),
            labels_of(&out2.join(&f)),
            "{name}"
        );
    }

    // A bad file is reported and the others still run; exit code 1.
    let mixed = d.join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    std::fs::copy(inputs.join("c0.nii.gz"), mixed.join("a.nii.gz")).unwrap();
    std::fs::write(mixed.join("b.nii.gz"), b"not gzip").unwrap();
    let r3 = d.join("r3.jsonl");
    let out3 = d.join("out3");
    let o = segment_cpu(&mixed, &model, &out3, &["--report", s(&r3)]);
    assert_eq!(o.status.code(), Some(1));
    let l = read_lines(&r3);
    assert_eq!(l.len(), 2);
    assert_eq!(l[0]["status"], "done");
    assert_eq!(l[1]["status"], "error");
    assert!(l[1]["error"].as_str().unwrap().contains("b.nii.gz"));
    assert!(out3.join("a.nii.gz").exists() && !out3.join("b.nii.gz").exists());
    // -o must be a folder with several inputs.
    let o = segment_cpu(&inputs, &model, &d.join("x.nii.gz"), &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("folder"));
}
