//! Per-class statistics of a label map, as TotalSegmentator's `--statistics` gives: voxel count,
//! volume and the input's intensity (mean and population standard deviation) in each class.

use crate::engine::class_volumes;
use crate::volume::LabelNames;
use crate::{Error, Result};
use ndarray::ArrayView3;
use serde::Serialize;

/// One class's statistics.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassStatistics {
    /// Its label value.
    pub label: u16,
    /// Its name ("" when the label map has none for it).
    pub name: String,
    /// Voxels of the label map holding it.
    pub voxels: u64,
    /// Their volume, mL.
    pub volume_ml: f64,
    /// Mean input intensity over its voxels (finite values; None when there are none).
    pub intensity_mean: Option<f64>,
    /// Their standard deviation (ddof 0, as numpy's `std`).
    pub intensity_std: Option<f64>,
}

/// The statistics of every foreground class (named, or present) of `labels`, with the input's
/// intensities `image` on the same grid; `voxel_ml`: the volume of one voxel.
pub fn statistics(
    labels: ArrayView3<u16>,
    image: ArrayView3<f32>,
    names: &LabelNames,
    voxel_ml: f64,
) -> Result<Vec<ClassStatistics>> {
    if labels.shape() != image.shape() {
        return Err(Error::Invalid(format!(
            "statistics: the label map ({:?}) and the input ({:?}) differ in shape",
            labels.shape(),
            image.shape()
        )));
    }
    let mut n = vec![0u64; 1 << 16];
    let mut sum = vec![0f64; 1 << 16];
    for (&l, &v) in labels.iter().zip(image.iter()) {
        if v.is_finite() {
            n[l as usize] += 1;
            sum[l as usize] += v as f64;
        }
    }
    let mean: Vec<f64> = sum
        .iter()
        .zip(&n)
        .map(|(s, &k)| s / k.max(1) as f64)
        .collect();
    let mut sq = vec![0f64; 1 << 16];
    for (&l, &v) in labels.iter().zip(image.iter()) {
        if v.is_finite() {
            sq[l as usize] += (v as f64 - mean[l as usize]).powi(2);
        }
    }
    Ok(class_volumes(labels, names, voxel_ml)
        .into_iter()
        .filter(|c| c.label != 0)
        .map(|c| {
            let l = c.label as usize;
            let some = n[l] > 0;
            ClassStatistics {
                label: c.label,
                name: c.name,
                voxels: c.voxels,
                volume_ml: c.volume_ml,
                intensity_mean: some.then_some(mean[l]),
                intensity_std: some.then(|| (sq[l] / n[l] as f64).sqrt()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::components::tests::Rng;
    use super::*;
    use ndarray::Array3;

    #[test]
    fn statistics_match_a_direct_computation() {
        let mut rng = Rng(777);
        let labels = Array3::from_shape_fn((5, 6, 7), |_| rng.below(3) as u16);
        let image = Array3::from_shape_fn((5, 6, 7), |_| rng.below(1000) as f32 / 10.0 - 20.0);
        let names = LabelNames {
            names: vec!["background".into(), "a".into(), "b".into(), "never".into()],
        };
        let s = statistics(labels.view(), image.view(), &names, 0.5).unwrap();
        assert_eq!(
            s.len(),
            3,
            "classes 1, 2 and the named absent 3; no background"
        );
        for c in &s[..2] {
            let vals: Vec<f64> = labels
                .iter()
                .zip(image.iter())
                .filter(|(&l, _)| l == c.label)
                .map(|(_, &v)| v as f64)
                .collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|v| v * v).sum::<f64>() / vals.len() as f64 - m * m;
            assert_eq!(c.voxels, vals.len() as u64);
            assert!((c.volume_ml - 0.5 * vals.len() as f64).abs() < 1e-12);
            assert!((c.intensity_mean.unwrap() - m).abs() < 1e-9);
            assert!((c.intensity_std.unwrap() - var.sqrt()).abs() < 1e-6);
        }
        assert_eq!((s[2].name.as_str(), s[2].voxels), ("never", 0));
        assert_eq!(s[2].intensity_mean, None);
        let other = Array3::<f32>::zeros((5, 6, 8));
        assert!(statistics(labels.view(), other.view(), &names, 0.5).is_err());
    }
}
