//! Per-window importance maps: how much each voxel of a window counts when windows overlap.

use ndarray::Array3;

/// Blending weights of one window. All maps are separable and strictly positive, so every covered voxel
/// has a positive weight sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlendMode {
    /// All ones (MONAI `mode="constant"`): a plain average of overlapping windows.
    Constant,
    /// MONAI `compute_importance_map(mode="gaussian")`, reproduced in its float32 arithmetic.
    Gaussian,
    /// Separable Hann taper `sin²(π (i + 1) / (n + 1))`: the symmetric Hann window of length n + 2 without
    /// its two zero end points, then MONAI's clamp. Not in MONAI; a smooth alternative to the gaussian.
    Hann,
}

/// The `value_scaling_factor` nnU-Net v2's predictor passes to `compute_gaussian`.
pub const NNUNET_VALUE_SCALING: f32 = 10.0;

/// MONAI's clamp of non-positive weights: `clamp(min = max(min(map), 1e-3))`; `1e-3` becomes an f32 scalar.
fn clamp_like_monai(map: &mut Array3<f32>) {
    let min = map.iter().copied().fold(f32::INFINITY, f32::min);
    let floor = if (min as f64) > 1e-3 {
        min
    } else {
        1e-3_f64 as f32
    };
    map.mapv_inplace(|v| v.max(floor));
}

/// Outer product `(a[i] * b[j]) * c[k]` in f32, in the order MONAI's `unsqueeze(-1) *` loop multiplies.
fn outer(p: &[Vec<f32>; 3]) -> Array3<f32> {
    Array3::from_shape_fn((p[0].len(), p[1].len(), p[2].len()), |(i, j, k)| {
        (p[0][i] * p[1][j]) * p[2][k]
    })
}

/// Importance map of shape `roi`. `sigma_scale` (per axis, gaussian only; sigma = scale * roi) must be
/// positive and finite: an axis where it is not gets no taper (see [`crate::tiling::parse_sigma_scale`]
/// for user input).
///
/// The gaussian is MONAI's: centred at `(n - 1) / 2`, so for even n the peak is
/// `exp(-0.25 / (2 sigma²))` per axis rather than 1 (MONAI does not normalise), and values under
/// `max(min, 1e-3)` are raised to it.
pub fn weight_map(roi: [usize; 3], mode: BlendMode, sigma_scale: [f64; 3]) -> Array3<f32> {
    let mut map = match mode {
        BlendMode::Constant => Array3::ones((roi[0], roi[1], roi[2])),
        BlendMode::Gaussian => {
            let profiles = [0, 1, 2].map(|a| {
                let n = roi[a];
                let sigma = n as f64 * sigma_scale[a];
                if !(sigma.is_finite() && sigma > 0.0) {
                    return vec![1.0f32; n];
                }
                // torch: x = arange(-(n-1)/2, ...) in f32; exp(x**2 / (-2 * sigma**2)) with the Python
                // float scalar cast to f32.
                let denom = (-2.0 * (sigma * sigma)) as f32;
                (0..n)
                    .map(|i| {
                        let x = (i as f32) - (n as f32 - 1.0) / 2.0;
                        let arg = (x * x) / denom;
                        (arg as f64).exp() as f32
                    })
                    .collect()
            });
            outer(&profiles)
        }
        BlendMode::Hann => {
            let profiles = [0, 1, 2].map(|a| {
                let n = roi[a];
                (0..n)
                    .map(|i| {
                        let s = (std::f64::consts::PI * (i + 1) as f64 / (n + 1) as f64).sin();
                        (s * s) as f32
                    })
                    .collect()
            });
            outer(&profiles)
        }
    };
    clamp_like_monai(&mut map);
    map
}

/// The window weights of a pass: with nnU-Net's placement and gaussian blending, nnU-Net's own
/// gaussian (centred at `n // 2`, truncated), so that `--placement nnunet` computes what
/// `nnUNetPredictor` does; MONAI's everywhere else.
pub fn pass_weights(
    roi: [usize; 3],
    mode: BlendMode,
    sigma_scale: [f64; 3],
    placement: super::Placement,
) -> Array3<f32> {
    match (placement, mode) {
        (super::Placement::NnUnet, BlendMode::Gaussian) => weight_map_nnunet(roi, sigma_scale),
        _ => weight_map(roi, mode, sigma_scale),
    }
}

/// nnU-Net v2's `compute_gaussian`: a unit impulse at `n // 2` filtered by scipy's `gaussian_filter`
/// (sigma = scale * n, truncated at `int(4 sigma + 0.5)`), divided by its maximum, times
/// [`NNUNET_VALUE_SCALING`]; zeros are replaced by the smallest non-zero value. Computed in f64, stored
/// as f32 (nnU-Net's fp16 storage is deliberately not copied: its underflow is what the zero
/// replacement patches). nnU-Net's default `sigma_scale` is 1/8. Non-positive scales give no taper.
pub fn weight_map_nnunet(roi: [usize; 3], sigma_scale: [f64; 3]) -> Array3<f32> {
    // The filtered impulse divided by its maximum is the kernel divided by its centre tap:
    // exp(-0.5 (i - c)² / sigma²) inside the truncation radius, 0 outside.
    let profiles: [Vec<f64>; 3] = [0, 1, 2].map(|a| {
        let n = roi[a];
        let sigma = n as f64 * sigma_scale[a];
        if !(sigma.is_finite() && sigma > 0.0) {
            return vec![1.0; n];
        }
        let radius = (4.0 * sigma + 0.5) as i64;
        let c = (n / 2) as i64;
        (0..n as i64)
            .map(|i| {
                let x = i - c;
                if x.abs() > radius {
                    0.0
                } else {
                    (-0.5 / (sigma * sigma) * (x * x) as f64).exp()
                }
            })
            .collect()
    });
    let scale = NNUNET_VALUE_SCALING as f64;
    let mut map = Array3::from_shape_fn((roi[0], roi[1], roi[2]), |(i, j, k)| {
        (profiles[0][i] * profiles[1][j] * profiles[2][k] * scale) as f32
    });
    let min_nonzero = map
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(f32::INFINITY, f32::min);
    if min_nonzero.is_finite() {
        map.mapv_inplace(|v| if v == 0.0 { min_nonzero } else { v });
    }
    map
}
