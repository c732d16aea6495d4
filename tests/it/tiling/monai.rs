//! Tiling conformance: grids, weight maps, padding and blending against MONAI 1.6.1 /
//! nnU-Net v2 semantics. The references here are written straight from the Python sources in float64
//! (monai/inferers/utils.py `sliding_window_inference` + `_get_scan_interval`, monai/data/utils.py
//! `dense_patch_slices` + `compute_importance_map`, nnunetv2 `compute_steps_for_sliding_window`), and
//! share no code with `voxtile::tiling`.

use crate::common::rng::Rng;
use ndarray::{s, Array3, Array4, ArrayView4, Axis, Ix5};
use voxtile::tiling::*;
use voxtile::Error;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/sliding_window"
);

// ---------------------------------------------------------------------------------------------
// Small helpers

fn random_vol(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let mut r = Rng::new(seed);
    Array4::from_shape_simple_fn(shape, || r.uni())
}

/// rel L2 = ||a - b|| / ||b|| and max |a - b|.
fn compare(a: ArrayView4<f32>, b: &Array4<f64>) -> (f64, f64) {
    assert_eq!(a.dim(), b.dim());
    let (mut num, mut den, mut max) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b.iter()) {
        let d = x as f64 - y;
        num += d * d;
        den += y * y;
        max = max.max(d.abs());
    }
    ((num / den).sqrt(), max)
}

// ---------------------------------------------------------------------------------------------
// An independent float64 MONAI sliding_window_inference (non-buffered path, NCDHW with N = 1)

#[derive(Clone, Copy)]
enum RefPad {
    Constant(f64),
    Replicate,
}

/// monai `_get_scan_interval` then `dense_patch_slices`, literally: a list of window origins.
fn ref_monai_starts(image_size: [usize; 3], roi: [usize; 3], overlap: [f64; 3]) -> Vec<[usize; 3]> {
    let mut scan_interval = [0usize; 3];
    for i in 0..3 {
        if roi[i] == image_size[i] {
            scan_interval[i] = roi[i];
        } else {
            let interval = (roi[i] as f64 * (1.0 - overlap[i])).trunc() as i64;
            scan_interval[i] = if interval > 0 { interval as usize } else { 1 };
        }
    }
    let mut per_dim: Vec<Vec<usize>> = vec![];
    for i in 0..3 {
        let num = (image_size[i] as f64 / scan_interval[i] as f64).ceil() as usize;
        let mut scan_dim = None;
        for d in 0..num {
            if d * scan_interval[i] + roi[i] >= image_size[i] {
                scan_dim = Some(d);
                break;
            }
        }
        let scan_num = scan_dim.map(|d| d + 1).unwrap_or(1);
        let mut dim_starts = vec![];
        for idx in 0..scan_num {
            let mut start_idx = (idx * scan_interval[i]) as i64;
            start_idx -= (start_idx + roi[i] as i64 - image_size[i] as i64).max(0);
            dim_starts.push(start_idx as usize);
        }
        per_dim.push(dim_starts);
    }
    // np.meshgrid(*starts, indexing="ij") flattened: the last axis varies fastest.
    let mut out = vec![];
    for &a in &per_dim[0] {
        for &b in &per_dim[1] {
            for &c in &per_dim[2] {
                out.push([a, b, c]);
            }
        }
    }
    out
}

/// monai `compute_importance_map` in float64 (constant: ones; gaussian: product of
/// exp(x² / (-2 sigma²)), x from -(n-1)/2; then clamp(min = max(min, 1e-3))).
fn ref_importance(roi: [usize; 3], gaussian: bool, sigma_scale: f64) -> Array3<f64> {
    let mut m = Array3::<f64>::ones((roi[0], roi[1], roi[2]));
    if gaussian {
        let g = |a: usize, i: usize| {
            let sigma = roi[a] as f64 * sigma_scale;
            let x = -((roi[a] - 1) as f64) / 2.0 + i as f64;
            (x * x / (-2.0 * sigma * sigma)).exp()
        };
        for ((i, j, k), v) in m.indexed_iter_mut() {
            *v = g(0, i) * g(1, j) * g(2, k);
        }
    }
    let min_non_zero = m.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3);
    m.mapv_inplace(|v| v.max(min_non_zero));
    m
}

/// torch F.pad with MONAI's split (diff // 2 before, the rest after), "constant" or "replicate".
fn ref_pad(vol: &Array4<f64>, roi: [usize; 3], pad: RefPad) -> (Array4<f64>, [usize; 3]) {
    let (c, d, h, w) = vol.dim();
    let shape = [d, h, w];
    let before: [usize; 3] = [0, 1, 2].map(|a| roi[a].saturating_sub(shape[a]) / 2);
    let size: [usize; 3] = [0, 1, 2].map(|a| shape[a].max(roi[a]));
    let out = Array4::from_shape_fn((c, size[0], size[1], size[2]), |(ci, i, j, k)| {
        let p = [i, j, k];
        let mut src = [0usize; 3];
        for a in 0..3 {
            let o = p[a] as i64 - before[a] as i64;
            if o < 0 || o >= shape[a] as i64 {
                match pad {
                    RefPad::Constant(v) => return v,
                    RefPad::Replicate => src[a] = o.clamp(0, shape[a] as i64 - 1) as usize,
                }
            } else {
                src[a] = o as usize;
            }
        }
        vol[[ci, src[0], src[1], src[2]]]
    });
    (out, before)
}

/// sliding_window_inference with a float64 predictor `(C_in, roi) -> (C_out, roi)`.
fn ref_sliding_window(
    vol: &Array4<f64>,
    roi: [usize; 3],
    overlap: [f64; 3],
    gaussian: bool,
    sigma_scale: f64,
    pad: RefPad,
    predictor: &dyn Fn(&Array4<f64>) -> Array4<f64>,
) -> Array4<f64> {
    let (_, d, h, w) = vol.dim();
    let (padded, before) = ref_pad(vol, roi, pad);
    let image_size = [padded.dim().1, padded.dim().2, padded.dim().3];
    let imp = ref_importance(roi, gaussian, sigma_scale);
    let mut out: Option<Array4<f64>> = None;
    let mut count = Array3::<f64>::zeros((image_size[0], image_size[1], image_size[2]));
    for st in ref_monai_starts(image_size, roi, overlap) {
        let sl = s![
            ..,
            st[0]..st[0] + roi[0],
            st[1]..st[1] + roi[1],
            st[2]..st[2] + roi[2]
        ];
        let win = padded.slice(sl).to_owned();
        let p = predictor(&win);
        let o = out.get_or_insert_with(|| {
            Array4::zeros((p.dim().0, image_size[0], image_size[1], image_size[2]))
        });
        let mut region = o.slice_mut(sl);
        for ((ci, i, j, k), v) in region.indexed_iter_mut() {
            *v += p[[ci, i, j, k]] * imp[[i, j, k]];
        }
        let mut cr = count.slice_mut(s![
            st[0]..st[0] + roi[0],
            st[1]..st[1] + roi[1],
            st[2]..st[2] + roi[2]
        ]);
        cr += &imp;
    }
    let mut o = out.expect("at least one window");
    for mut oc in o.axis_iter_mut(Axis(0)) {
        oc /= &count;
    }
    o.slice(s![
        ..,
        before[0]..before[0] + d,
        before[1]..before[1] + h,
        before[2]..before[2] + w
    ])
    .to_owned()
}

/// A predictor that depends on the position inside the window, so wrong origins, orders or weights
/// show: channel c = x * (c + 1) - 0.5 c + 0.01 (d + 2 h + 3 w), window-relative (d, h, w).
fn positional_f64(x: &Array4<f64>) -> Array4<f64> {
    let (_, d, h, w) = x.dim();
    Array4::from_shape_fn((2, d, h, w), |(c, i, j, k)| {
        x[[0, i, j, k]] * (c + 1) as f64 - 0.5 * c as f64 + 0.01 * (i + 2 * j + 3 * k) as f64
    })
}
fn positional_f32(x: ArrayView4<f32>) -> Array4<f32> {
    let (_, d, h, w) = x.dim();
    Array4::from_shape_fn((2, d, h, w), |(c, i, j, k)| {
        x[[0, i, j, k]] * (c + 1) as f32 - 0.5 * c as f32 + 0.01 * (i + 2 * j + 3 * k) as f32
    })
}

/// The library path, as the engine will run it.
fn run_tiled(
    vol: ArrayView4<f32>,
    grid: &Grid,
    weights: Array3<f32>,
    pad: PadMode,
    predictor: &dyn Fn(ArrayView4<f32>) -> Array4<f32>,
    out_channels: usize,
) -> Array4<f32> {
    let c = vol.dim().0;
    let r = grid.roi;
    let mut win = Array4::<f32>::zeros((c, r[0], r[1], r[2]));
    let mut blender = Blender::new(out_channels, grid, weights);
    for &start in &grid.starts {
        gather_window(vol, grid, start, pad, win.view_mut());
        let y = predictor(win.view());
        blender.add(start, y.view());
    }
    assert_eq!(blender.added(), grid.len());
    blender.finish().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Grids

#[test]
fn monai_grid_fixture_cases_by_hand() {
    // [64,60,52], roi 48, overlap 0.5: interval int(48 * 0.5) = 24 on every axis.
    //   D=64: num = ceil(64/24) = 3; first d with d*24 + 48 >= 64 is d = 1 -> 2 windows;
    //         starts 0 and 24 - max(24 + 48 - 64, 0) = 16.
    //   H=60: d = 1 (72 >= 60) -> 0, 24 - 12 = 12.   W=52: 0, 24 - 20 = 4.
    // overlap 0.25: interval int(48 * 0.75) = 36; d = 1 on every axis (84 >= 64):
    //   D: 0, 36 - 20 = 16;  H: 0, 36 - 24 = 12;  W: 0, 36 - 32 = 4 (the same origins).
    let expect01: Vec<[usize; 3]> = vec![
        [0, 0, 0],
        [0, 0, 4],
        [0, 12, 0],
        [0, 12, 4],
        [16, 0, 0],
        [16, 0, 4],
        [16, 12, 0],
        [16, 12, 4],
    ];
    for ov in [0.5, 0.25] {
        let g = Grid::new([64, 60, 52], [48; 3], [ov; 3], Placement::Monai).unwrap();
        assert_eq!(g.starts, expect01, "overlap {ov}");
        assert_eq!(g.padded, [64, 60, 52]);
        assert_eq!(g.pad_before, [0, 0, 0]);
        assert_eq!(g.len(), 8);
    }
    // [70,33,64], roi 32, overlap (0.5, 0.25, 0):
    //   D=70: interval 16, num = ceil(70/16) = 5, d*16 + 32 >= 70 first at d = 3 -> 4 windows:
    //         0, 16, 32, 48 - (48 + 32 - 70) = 38.
    //   H=33: interval int(32 * 0.75) = 24, num = 2, d = 1 (56 >= 33): 0, 24 - 23 = 1.
    //   W=64: interval 32, num = 2, d = 1 (64 >= 64): 0, 32.
    let g = Grid::new([70, 33, 64], [32; 3], [0.5, 0.25, 0.0], Placement::Monai).unwrap();
    let mut expect2 = vec![];
    for d in [0, 16, 32, 38] {
        for h in [0, 1] {
            for w in [0, 32] {
                expect2.push([d, h, w]);
            }
        }
    }
    assert_eq!(g.starts, expect2);
    assert_eq!(g.len(), 16);
}

#[test]
fn monai_grid_matches_fixture_index_and_reference() {
    let text = std::fs::read_to_string(format!("{FIXTURES}/index.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let (shape, roi, overlap) = case_params(case);
        let g = Grid::new(shape, roi, overlap, Placement::Monai).unwrap();
        assert_eq!(g.starts, ref_monai_starts(g.padded, roi, overlap));
    }
}

#[test]
fn monai_grid_random_shapes_match_reference() {
    let mut r = Rng::new(7);
    for _ in 0..500 {
        let shape = [0; 3].map(|_| 1 + r.below(90));
        let roi = [0; 3].map(|_| 1 + r.below(50));
        let overlap = [0; 3].map(|_| [0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.99][r.below(8)]);
        let g = Grid::new(shape, roi, overlap, Placement::Monai).unwrap();
        let padded: [usize; 3] = [0, 1, 2].map(|a| shape[a].max(roi[a]));
        assert_eq!(g.padded, padded);
        assert_eq!(
            g.starts,
            ref_monai_starts(padded, roi, overlap),
            "{shape:?} {roi:?} {overlap:?}"
        );
        // Every padded voxel is covered, every window fits.
        for a in 0..3 {
            let mut covered = vec![false; padded[a]];
            for st in &g.starts {
                assert!(st[a] + roi[a] <= padded[a]);
                covered[st[a]..st[a] + roi[a]]
                    .iter_mut()
                    .for_each(|c| *c = true);
            }
            assert!(covered.iter().all(|&c| c));
        }
    }
}

#[test]
fn padding_split_like_monai() {
    // diff = roi - size; diff // 2 before: D 48-20 = 28 -> 14; H 60 >= 48 -> 0; W 48-33 = 15 -> 7 (8 after).
    let g = Grid::new([20, 60, 33], [48; 3], [0.5; 3], Placement::Monai).unwrap();
    assert_eq!(g.padded, [48, 60, 48]);
    assert_eq!(g.pad_before, [14, 0, 7]);
    // Padded axes equal the roi: one window there (interval = roi). H: 0, 12.
    assert_eq!(g.starts, vec![[0, 0, 0], [0, 12, 0]]);
}

/// nnU-Net v2 compute_steps_for_sliding_window, literally.
fn ref_nnunet_steps(image: usize, tile: usize, step: f64) -> Vec<usize> {
    let target = tile as f64 * step;
    let num = ((image - tile) as f64 / target).ceil() as usize + 1;
    let actual = if num > 1 {
        (image - tile) as f64 / (num - 1) as f64
    } else {
        99999999999.0
    };
    (0..num)
        .map(|i| {
            let x = actual * i as f64;
            // np.round: half to even
            let f = x.floor();
            let r = if x - f == 0.5 {
                if f % 2.0 == 0.0 {
                    f
                } else {
                    f + 1.0
                }
            } else {
                x.round()
            };
            r as usize
        })
        .collect()
}

#[test]
fn nnunet_steps() {
    // nnU-Net's own comment: image 110, patch 64, step 0.5 -> 0, 23, 46.
    // 101: target 32, n = ceil(37 / 32) + 1 = 3, actual 18.5 -> np.round(18.5) = 18 (half to even), 37.
    // 64 == tile -> one step at 0.
    let g = Grid::new([110, 101, 64], [64; 3], [0.5; 3], Placement::NnUnet).unwrap();
    let mut expect = vec![];
    for d in [0, 23, 46] {
        for h in [0, 18, 37] {
            expect.push([d, h, 0]);
        }
    }
    assert_eq!(g.starts, expect);
    // overlap 0 -> step 1: 100 vs 64: n = ceil(36/64) + 1 = 2 -> 0, 36. Padding like MONAI: 40 -> 48.
    let g = Grid::new([100, 40, 64], [64, 48, 64], [0.0; 3], Placement::NnUnet).unwrap();
    assert_eq!(g.pad_before, [0, 4, 0]);
    assert_eq!(g.padded, [100, 48, 64]);
    assert_eq!(g.starts, vec![[0, 0, 0], [36, 0, 0]]);
    let mut r = Rng::new(11);
    for _ in 0..500 {
        let shape = [0; 3].map(|_| 1 + r.below(300));
        let roi = [0; 3].map(|_| 1 + r.below(128));
        let overlap = [0; 3].map(|_| [0.0, 0.25, 0.5, 0.75, 0.8][r.below(5)]);
        let g = Grid::new(shape, roi, overlap, Placement::NnUnet).unwrap();
        let steps: Vec<Vec<usize>> = (0..3)
            .map(|a| ref_nnunet_steps(g.padded[a], roi[a], 1.0 - overlap[a]))
            .collect();
        let mut expect = vec![];
        for &d in &steps[0] {
            for &h in &steps[1] {
                for &w in &steps[2] {
                    expect.push([d, h, w]);
                }
            }
        }
        assert_eq!(g.starts, expect, "{shape:?} {roi:?} {overlap:?}");
    }
}

#[test]
fn grid_rejects_bad_input() {
    let cases: Vec<([usize; 3], [usize; 3], [f64; 3])> = vec![
        ([0, 10, 10], [8; 3], [0.5; 3]),
        ([10; 3], [8, 0, 8], [0.5; 3]),
        ([10; 3], [8; 3], [1.0, 0.5, 0.5]),
        ([10; 3], [8; 3], [0.5, -0.1, 0.5]),
        ([10; 3], [8; 3], [0.5, 0.5, f64::NAN]),
    ];
    for (shape, roi, ov) in cases {
        for p in [Placement::Monai, Placement::NnUnet] {
            match Grid::new(shape, roi, ov, p) {
                Err(Error::Invalid(msg)) => assert!(!msg.is_empty() && !msg.contains('\n')),
                other => panic!("{shape:?} {roi:?} {ov:?}: expected Invalid, got {other:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Weight maps

#[test]
fn gaussian_map_matches_monai_formula() {
    for (roi, sig) in [
        ([48, 48, 48], 0.125),
        ([33, 17, 9], 0.125),
        ([32, 20, 11], 0.3),
    ] {
        let m = weight_map(roi, BlendMode::Gaussian, [sig; 3]);
        let r = ref_importance(roi, true, sig);
        assert_eq!(m.dim(), (roi[0], roi[1], roi[2]));
        for (a, b) in m.iter().zip(r.iter()) {
            // f32 arithmetic vs f64: a few ulp; the clamp floor is f32(1e-3).
            assert!(((*a as f64) - b).abs() <= 4e-7 * b, "{roi:?}: {a} vs {b}");
        }
        // Symmetric under every axis flip, exactly (x² is symmetric).
        for ax in 0..3 {
            let mut f = m.clone();
            f.invert_axis(Axis(ax));
            assert_eq!(f, m);
        }
    }
    // Odd sizes: peak exactly 1 at the centre, the maximum.
    let m = weight_map([33, 17, 9], BlendMode::Gaussian, [0.125; 3]);
    assert_eq!(m[[16, 8, 4]], 1.0);
    assert!(m.iter().all(|&v| v <= 1.0));
    // Even sizes: MONAI centres at (n-1)/2 and does not renormalise: the 2x2x2 centre holds the max,
    // exp(-0.25 / (2 * 6²))³ < 1.
    let m = weight_map([48; 3], BlendMode::Gaussian, [0.125; 3]);
    let peak = (-0.25f64 / 72.0).exp().powi(3);
    assert!((m[[23, 24, 23]] as f64 - peak).abs() < 1e-6);
    assert!(m.iter().all(|&v| v <= m[[24, 24, 24]]));
    // Clamp: the corner product (~1e-10) is raised to max(min, 1e-3) = 1e-3.
    let floor = m.iter().copied().fold(f32::INFINITY, f32::min);
    assert_eq!(floor, 1e-3f32);
    assert!(m.iter().filter(|&&v| v == 1e-3f32).count() > 1000);
    // A wide gaussian never reaches 1e-3: the clamp is a no-op, the corner keeps its own value.
    let m = weight_map([48; 3], BlendMode::Gaussian, [1.0; 3]);
    let corner = (-(23.5f64 * 23.5) / (2.0 * 48.0 * 48.0)).exp().powi(3);
    assert!((m[[0, 0, 0]] as f64 - corner).abs() < 1e-6 * corner);
    assert_eq!(
        m.iter().copied().fold(f32::INFINITY, f32::min),
        m[[0, 0, 0]]
    );
}

#[test]
fn constant_and_hann_maps() {
    let m = weight_map([7, 8, 9], BlendMode::Constant, [0.125; 3]);
    assert!(m.iter().all(|&v| v == 1.0));
    assert_eq!(m.dim(), (7, 8, 9));
    // Hann: sin²(π (i + 1) / (n + 1)) per axis, product, floor max(min, 1e-3).
    for roi in [[9, 16, 5], [128, 96, 64]] {
        let m = weight_map(roi, BlendMode::Hann, [0.125; 3]);
        let h = |a: usize, i: usize| {
            (std::f64::consts::PI * (i as f64 + 1.0) / (roi[a] as f64 + 1.0))
                .sin()
                .powi(2)
        };
        let raw = Array3::from_shape_fn((roi[0], roi[1], roi[2]), |(i, j, k)| {
            h(0, i) * h(1, j) * h(2, k)
        });
        let floor = raw.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3);
        for (a, b) in m.iter().zip(raw.iter()) {
            let b = b.max(floor);
            assert!(((*a as f64) - b).abs() <= 1e-6 * b, "{roi:?}: {a} vs {b}");
        }
        assert!(m.iter().all(|&v| v > 0.0));
        for ax in 0..3 {
            let mut f = m.clone();
            f.invert_axis(Axis(ax));
            for (a, b) in f.iter().zip(m.iter()) {
                assert!((a - b).abs() <= 1e-6);
            }
        }
    }
    // Odd sizes peak at 1 in the centre; 128³ corners fall under 1e-3 and are clamped.
    let m = weight_map([9, 15, 5], BlendMode::Hann, [0.0; 3]);
    assert!((m[[4, 7, 2]] - 1.0).abs() < 1e-6);
    let m = weight_map([128; 3], BlendMode::Hann, [0.0; 3]);
    assert_eq!(m[[0, 0, 0]], 1e-3f32);
}

#[test]
fn nnunet_gaussian_map() {
    // scipy gaussian_filter of an impulse at n // 2 (truncate 4), / max, * 10; zeros -> smallest non-zero.
    for (roi, sig) in [([48, 33, 20], 0.125), ([64, 64, 16], 0.05)] {
        let m = weight_map_nnunet(roi, [sig; 3]);
        let prof = |a: usize, i: usize| {
            let sigma = roi[a] as f64 * sig;
            let radius = (4.0 * sigma + 0.5).floor() as i64;
            let x = i as i64 - (roi[a] / 2) as i64;
            if x.abs() > radius {
                0.0
            } else {
                (-0.5 * (x * x) as f64 / (sigma * sigma)).exp()
            }
        };
        let raw = Array3::from_shape_fn((roi[0], roi[1], roi[2]), |(i, j, k)| {
            10.0 * prof(0, i) * prof(1, j) * prof(2, k)
        });
        let min_nz = raw
            .iter()
            .copied()
            .filter(|&v| (v as f32) > 0.0)
            .fold(f64::INFINITY, f64::min);
        for (a, b) in m.iter().zip(raw.iter()) {
            let b = if (*b as f32) == 0.0 { min_nz } else { *b };
            assert!(((*a as f64) - b).abs() <= 1e-6 * b, "{roi:?}: {a} vs {b}");
        }
        assert_eq!(
            m[[roi[0] / 2, roi[1] / 2, roi[2] / 2]],
            NNUNET_VALUE_SCALING
        );
        assert!(m.iter().all(|&v| v > 0.0 && v <= NNUNET_VALUE_SCALING));
    }
    // 0.05 * 64 = 3.2: radius 13, so index 0 (32 from the centre) was zero and now holds the minimum.
    let m = weight_map_nnunet([64, 64, 16], [0.05; 3]);
    let min = m.iter().copied().fold(f32::INFINITY, f32::min);
    assert_eq!(m[[0, 32, 8]], min);
}

// ---------------------------------------------------------------------------------------------
// Gathering with virtual padding

#[test]
fn gather_window_pads_constant_and_edge() {
    let shape = (2, 5, 3, 4);
    let vol = random_vol(shape, 3);
    let vol64 = vol.mapv(|v| v as f64);
    let roi = [8, 3, 6];
    let g = Grid::new([5, 3, 4], roi, [0.25; 3], Placement::Monai).unwrap();
    assert_eq!(g.pad_before, [1, 0, 1]);
    assert_eq!(g.starts, vec![[0, 0, 0]]);
    for (pad, rpad) in [
        (PadMode::Constant(7.5), RefPad::Constant(7.5)),
        (PadMode::Edge, RefPad::Replicate),
    ] {
        let (padded, before) = ref_pad(&vol64, roi, rpad);
        assert_eq!(before, g.pad_before);
        let mut win = Array4::<f32>::from_elem((2, 8, 3, 6), f32::NAN);
        gather_window(vol.view(), &g, [0, 0, 0], pad, win.view_mut());
        assert_eq!(win.mapv(|v| v as f64), padded);
    }
}

#[test]
fn gather_window_any_strides() {
    // The volume stored (D, H, W, C), viewed as (C, D, H, W); the output a strided slice of a batch.
    let dhwc = random_vol((23, 17, 30, 3), 5);
    let vol = dhwc.view().permuted_axes([3, 0, 1, 2]);
    let std_vol = vol.as_standard_layout().into_owned();
    let roi = [16, 24, 12];
    let g = Grid::new([23, 17, 30], roi, [0.5; 3], Placement::Monai).unwrap();
    assert_eq!(g.pad_before, [0, 3, 0]);
    let (padded, _) = ref_pad(&std_vol.mapv(|v| v as f64), roi, RefPad::Constant(-2.0));
    let mut batch = ndarray::Array5::<f32>::zeros((3, 2, 3, 16, 24 * 12)); // roomy, then strided
    for &st in &g.starts {
        let mut out = batch
            .slice_mut(s![1, 1, .., .., ..])
            .into_shape_with_order((3, 16, 24, 12))
            .unwrap();
        out.fill(f32::NAN);
        let mut inv = out.view_mut();
        inv.invert_axis(Axis(3)); // negative stride
        gather_window(vol, &g, st, PadMode::Constant(-2.0), inv.view_mut());
        let expect = padded.slice(s![
            ..,
            st[0]..st[0] + 16,
            st[1]..st[1] + 24,
            st[2]..st[2] + 12
        ]);
        assert_eq!(inv.mapv(|v| v as f64), expect);
    }
}

// ---------------------------------------------------------------------------------------------
// Blending

#[test]
fn blending_a_per_voxel_function_returns_it() {
    // A translation-equivariant predictor (per voxel) blended over overlapping windows must give the
    // function itself whatever the weights, padded or not.
    let f = |x: ArrayView4<f32>| {
        let (_, d, h, w) = x.dim();
        Array4::from_shape_fn((3, d, h, w), |(c, i, j, k)| {
            let v = x[[0, i, j, k]];
            [2.0 * v + 1.0, v * v, -v][c]
        })
    };
    let vol = random_vol((1, 37, 20, 45), 9);
    let expect = f(vol.view()).mapv(|v| v as f64);
    for (roi, ov) in [([16, 16, 16], [0.5; 3]), ([24, 32, 20], [0.25, 0.6, 0.0])] {
        let g = Grid::new([37, 20, 45], roi, ov, Placement::Monai).unwrap();
        for mode in [BlendMode::Constant, BlendMode::Gaussian, BlendMode::Hann] {
            for pad in [PadMode::Constant(0.0), PadMode::Edge] {
                let w = weight_map(roi, mode, [0.125; 3]);
                let out = run_tiled(vol.view(), &g, w, pad, &f, 3);
                let (rel, max) = compare(out.view(), &expect);
                assert!(
                    rel < 1e-6 && max < 1e-5,
                    "{roi:?} {mode:?}: rel {rel:e} max {max:e}"
                );
            }
        }
        let gn = Grid::new([37, 20, 45], roi, ov, Placement::NnUnet).unwrap();
        let out = run_tiled(
            vol.view(),
            &gn,
            weight_map_nnunet(roi, [0.125; 3]),
            PadMode::Edge,
            &f,
            3,
        );
        let (rel, max) = compare(out.view(), &expect);
        assert!(
            rel < 1e-6 && max < 1e-5,
            "nnunet {roi:?}: rel {rel:e} max {max:e}"
        );
    }
}

fn case_params(case: &serde_json::Value) -> ([usize; 3], [usize; 3], [f64; 3]) {
    let tri_u = |v: &serde_json::Value| -> [usize; 3] {
        let a = v.as_array().unwrap();
        [0, 1, 2].map(|i| a[i].as_u64().unwrap() as usize)
    };
    let overlap = match &case["overlap"] {
        serde_json::Value::Array(a) => [0, 1, 2].map(|i| a[i].as_f64().unwrap()),
        v => [v.as_f64().unwrap(); 3],
    };
    (tri_u(&case["volume"]), tri_u(&case["roi"]), overlap)
}

/// The fixture cases (shapes, roi, overlap, mode, sigma, padding and the real input volumes MONAI saw),
/// with the position-dependent predictor in place of the network: library vs the float64 reference.
#[test]
fn conformance_on_fixture_cases() {
    let text = std::fs::read_to_string(format!("{FIXTURES}/index.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    for case in cases.as_array().unwrap() {
        let (shape, roi, overlap) = case_params(case);
        let gaussian = case["mode"].as_str().unwrap() == "gaussian";
        let sigma = case["sigma_scale"].as_f64().unwrap();
        assert_eq!(case["padding_mode"].as_str().unwrap(), "constant");
        let cval = case["cval"].as_f64().unwrap();
        let input = format!("{FIXTURES}/{}", case["input"].as_str().unwrap());
        let input = voxtile::internals::npy::read_f32(std::path::Path::new(&input)).unwrap();
        let input = input.into_dimensionality::<Ix5>().unwrap();
        let vol = input.index_axis(Axis(0), 0).to_owned();
        assert_eq!([vol.dim().1, vol.dim().2, vol.dim().3], shape);
        let output = format!("{FIXTURES}/{}", case["output"].as_str().unwrap());
        let output = voxtile::internals::npy::read_f32(std::path::Path::new(&output)).unwrap();
        assert_eq!(
            &output.shape()[2..],
            &shape[..],
            "MONAI's output keeps the volume's size"
        );

        let g = Grid::new(shape, roi, overlap, Placement::Monai).unwrap();
        let mode = if gaussian {
            BlendMode::Gaussian
        } else {
            BlendMode::Constant
        };
        let w = weight_map(roi, mode, [sigma; 3]);
        let out = run_tiled(
            vol.view(),
            &g,
            w,
            PadMode::Constant(cval as f32),
            &positional_f32,
            2,
        );
        let expect = ref_sliding_window(
            &vol.mapv(|v| v as f64),
            roi,
            overlap,
            gaussian,
            sigma,
            RefPad::Constant(cval),
            &positional_f64,
        );
        let (rel, max) = compare(out.view(), &expect);
        eprintln!("{}: rel L2 {rel:.2e}, max abs {max:.2e}", case["id"]);
        assert!(
            rel < 1e-6 && max < 1e-5,
            "{}: rel {rel:e} max {max:e}",
            case["id"]
        );
    }
}

/// Volumes smaller than the roi (padding, crop back) with constant and replicate padding.
#[test]
fn conformance_with_padding() {
    // Odd differences (13 and 3) so that a wrong before/after split shows.
    let vol = random_vol((1, 19, 40, 29), 21);
    let vol64 = vol.mapv(|v| v as f64);
    let roi = [32, 32, 32];
    for (ov, gaussian) in [([0.25; 3], true), ([0.5, 0.3, 0.0], false)] {
        let g = Grid::new([19, 40, 29], roi, ov, Placement::Monai).unwrap();
        assert_eq!(g.pad_before, [6, 0, 1]);
        for (pad, rpad) in [
            (PadMode::Constant(0.7), RefPad::Constant(0.7)),
            (PadMode::Edge, RefPad::Replicate),
        ] {
            let mode = if gaussian {
                BlendMode::Gaussian
            } else {
                BlendMode::Constant
            };
            let out = run_tiled(
                vol.view(),
                &g,
                weight_map(roi, mode, [0.125; 3]),
                pad,
                &positional_f32,
                2,
            );
            let expect =
                ref_sliding_window(&vol64, roi, ov, gaussian, 0.125, rpad, &positional_f64);
            let (rel, max) = compare(out.view(), &expect);
            assert!(rel < 1e-6 && max < 1e-5, "rel {rel:e} max {max:e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Labels

#[test]
fn argmax_first_max_wins() {
    let logits = Array4::from_shape_vec(
        (3, 1, 1, 5),
        vec![
            1.0,
            2.0,
            0.0,
            1.0,
            f32::NAN, //
            1.0,
            3.0,
            5.0,
            f32::NAN,
            1.0, //
            1.0,
            3.0,
            5.0,
            9.0,
            f32::NAN,
        ],
    )
    .unwrap();
    // ties -> first; NaN counts as the max (numpy/torch).
    assert_eq!(
        argmax(logits.view()).unwrap().into_raw_vec_and_offset().0,
        vec![0, 1, 1, 1, 0]
    );
    // Random data against "first index equal to the max".
    let l = random_vol((5, 9, 8, 7), 13).mapv(|v| (v * 3.0).round()); // many ties
    let a = argmax(l.view()).unwrap();
    for ((i, j, k), &lab) in a.indexed_iter() {
        let lane = l.slice(s![.., i, j, k]);
        let m = lane.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = lane.iter().position(|&v| v == m).unwrap();
        assert_eq!(lab as usize, first);
    }
    // Permuted (channels-last) input gives the same labels.
    let cl = l
        .view()
        .permuted_axes([1, 2, 3, 0])
        .as_standard_layout()
        .into_owned();
    assert_eq!(argmax(cl.view().permuted_axes([3, 0, 1, 2])).unwrap(), a);
}

#[test]
fn threshold_strictly_above() {
    let p =
        Array4::from_shape_vec((1, 1, 2, 3), vec![0.2, 0.5, 0.50001, 0.9, -1.0, f32::NAN]).unwrap();
    assert_eq!(
        threshold(p.view(), 0.5)
            .unwrap()
            .into_raw_vec_and_offset()
            .0,
        vec![0, 0, 1, 1, 0, 0]
    );
}

// ---------------------------------------------------------------------------------------------
// CLI parsing

#[test]
fn parse_triples() {
    assert_eq!(parse_triple_usize("96,96,64").unwrap(), [96, 96, 64]);
    assert_eq!(parse_triple_usize(" 128 ").unwrap(), [128; 3]);
    assert_eq!(parse_triple_usize("1, 2 ,3").unwrap(), [1, 2, 3]);
    assert_eq!(parse_triple_f64("0.5").unwrap(), [0.5; 3]);
    assert_eq!(parse_triple_f64("0.5, 0.25,0").unwrap(), [0.5, 0.25, 0.0]);
    assert_eq!(parse_sigma_scale("0.125").unwrap(), [0.125; 3]);
    for bad in ["", "1,2", "0", "a,b,c", "1,2,3,4", "-1", "96,,64", "1.5"] {
        match parse_triple_usize(bad) {
            Err(Error::Invalid(m)) => {
                assert!(m.contains(&format!("\"{bad}\"")) && !m.contains('\n'))
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    for bad in ["1", "1.0", "-0.1", "nan", "0.5,0.5", "x", "inf"] {
        assert!(
            matches!(parse_triple_f64(bad), Err(Error::Invalid(_))),
            "{bad:?}"
        );
    }
    for bad in ["0", "-1", "inf", "nan", ""] {
        assert!(
            matches!(parse_sigma_scale(bad), Err(Error::Invalid(_))),
            "{bad:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Slab-streaming blender

#[test]
fn slab_blender_is_bit_identical_to_blender() {
    let vol = random_vol((1, 45, 21, 26), 31);
    type Case = ([usize; 3], [usize; 3], [f64; 3], Placement);
    let cases: Vec<Case> = vec![
        ([45, 21, 26], [16, 16, 16], [0.5; 3], Placement::Monai),
        (
            [45, 21, 26],
            [12, 24, 16],
            [0.25, 0.5, 0.0],
            Placement::NnUnet,
        ),
        ([45, 21, 26], [7, 30, 8], [0.0; 3], Placement::Monai), // no D overlap, H padded
        ([45, 21, 26], [50, 8, 8], [0.5; 3], Placement::Monai), // D padded: one slab
    ];
    for (shape, roi, ov, placement) in cases {
        let g = Grid::new(shape, roi, ov, placement).unwrap();
        let w = weight_map(roi, BlendMode::Gaussian, [0.125; 3]);
        let full = run_tiled(vol.view(), &g, w.clone(), PadMode::Edge, &positional_f32, 2);
        let mut sb = SlabBlender::new(2, &g, w);
        let mut win = Array4::<f32>::zeros((1, roi[0], roi[1], roi[2]));
        let mut slabs = vec![];
        for &st in &g.starts {
            gather_window(vol.view(), &g, st, PadMode::Edge, win.view_mut());
            slabs.extend(sb.add(st, positional_f32(win.view()).view()).unwrap());
        }
        slabs.extend(sb.finish().unwrap());
        let mut next = 0;
        for sl in &slabs {
            assert_eq!(
                sl.d0, next,
                "{roi:?}: slabs must be contiguous and in order"
            );
            let n = sl.data.dim().1;
            assert!(n > 0);
            assert_eq!(
                sl.data,
                full.slice(s![.., next..next + n, .., ..]),
                "{roi:?} at {next}"
            );
            next += n;
        }
        assert_eq!(next, shape[0], "{roi:?}: slabs must cover the volume");
    }
}

#[test]
#[should_panic(expected = "non-decreasing D order")]
fn slab_blender_rejects_out_of_order_windows() {
    let g = Grid::new([40, 8, 8], [16, 8, 8], [0.5; 3], Placement::Monai).unwrap();
    let mut sb = SlabBlender::new(1, &g, weight_map(g.roi, BlendMode::Constant, [0.125; 3]));
    let y = Array4::<f32>::zeros((1, 16, 8, 8));
    let _ = sb.add([16, 0, 0], y.view());
    let _ = sb.add([8, 0, 0], y.view());
}

#[test]
fn nnunet_placement_blends_with_nnunets_gaussian() {
    let (roi, s) = ([16, 20, 12], [0.125; 3]);
    let nn = pass_weights(roi, BlendMode::Gaussian, s, Placement::NnUnet);
    assert_eq!(nn, weight_map_nnunet(roi, s));
    // The two gaussians differ (centre n//2 vs (n-1)/2, truncation): the choice matters.
    let monai = pass_weights(roi, BlendMode::Gaussian, s, Placement::Monai);
    assert_eq!(monai, weight_map(roi, BlendMode::Gaussian, s));
    let (a, b) = (
        nn.mapv(|v| v / nn[[8, 10, 6]]),
        monai.mapv(|v| v / monai[[8, 10, 6]]),
    );
    assert!(a.iter().zip(b.iter()).any(|(x, y)| (x - y).abs() > 1e-3));
    // Constant blending stays constant whatever the placement.
    let c = pass_weights(roi, BlendMode::Constant, s, Placement::NnUnet);
    assert!(c.iter().all(|&v| v == c[[0, 0, 0]]));
}
