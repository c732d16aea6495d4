//! The `--report` of one run: stage times, sizes, the planner's prediction next to what was
//! measured; what each class of the label map measures; the digest that names a model file.

pub use crate::backend::StageTimes;
use crate::plan;
use crate::volume::LabelNames;
use crate::{Error, Result};
use ndarray::ArrayView3;
use serde::Serialize;
use std::io::Read;
use std::path::Path;

/// Stage timings and sizes of one run, serialised into `--report`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Volume size (i, j, k).
    pub input_shape: [usize; 3],
    /// Input channels.
    pub channels: usize,
    /// Voxel size (mm) from the header.
    pub spacing: [f64; 3],
    /// Window size that ran (network axes).
    pub roi: [usize; 3],
    /// Window overlap that ran.
    pub overlap: [f64; 3],
    /// Windows on the volume.
    pub windows: usize,
    /// Windows per backend call.
    pub batch: usize,
    /// The backend's name ("cpu (N threads)", "cuda:0 NVIDIA H200").
    pub device: String,
    /// What the graph applies to its output: "none", "softmax" or "sigmoid".
    pub output_activation: String,
    /// How labels were made, in words.
    pub labels: String,
    /// Seconds per stage.
    pub seconds: StageTimes,
    /// Extra per-stage GPU times (event-timed) when the CUDA path ran.
    pub gpu: Option<serde_json::Value>,
    /// Input voxels that were NaN (set to 0) or infinite (clamped) before the network.
    pub nonfinite_voxels: usize,
    /// Voxels whose blended network output holds NaN (their labels are meaningless; warned on
    /// stderr). None where it is not counted: the CUDA path that makes labels on the device.
    pub nan_output_voxels: Option<usize>,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_host_bytes: u64,
    /// High-water mark of the device allocations (CUDA).
    pub peak_device_bytes: Option<u64>,
    /// The planner's prediction for the roi and batch that ran: host (working set + volume and
    /// outputs) and device (CUDA).
    pub predicted_peak_bytes: PredictedPeak,
    /// Activation bytes the backend measured: CPU executor's liveness peak (max over batches),
    /// CUDA launch list's buffer pool.
    pub measured_activation_bytes: Option<u64>,
    /// The budget the planner used, bytes.
    pub memory_budget: u64,
    /// Where the budget came from, in words.
    pub memory_budget_source: String,
    /// "default", "planned" or "user".
    pub plan: String,
    /// The planner's breakdown (weights, activations, workspace, staging, accumulators).
    pub predicted: Option<plan::Estimate>,
    /// Out-of-memory retries, one line each.
    pub oom_retries: Vec<String>,
    /// Windows run, counting twice those two devices (or two bands) share when a volume is
    /// split (= `windows` on one device in one band).
    pub windows_run: usize,
    /// Each device's share when the volume was split across several (empty on one device; the
    /// key is always there, so every report has the same keys).
    pub parts: Vec<PartReport>,
    /// Network-axis H rows `[lo, hi)` of each band, in run order: one band `[0, H)` unless the
    /// whole cross-section's accumulators did not fit the budget (see `Plan::bands`).
    pub bands: Vec<[usize; 2]>,
}

/// One device's share of a split volume.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartReport {
    /// Its backend's name.
    pub device: String,
    /// Network-axis D planes `[lo, hi)` of the output it wrote.
    pub planes: [usize; 2],
    /// The D planes `[lo, hi)` of the volume its windows read.
    pub crop: [usize; 2],
    /// The network-axis H rows `[lo, hi)` of the band it was a share of.
    pub rows: [usize; 2],
    /// Windows it ran.
    pub windows: usize,
    /// Its windows per backend call.
    pub batch: usize,
    /// Its network (and, on the CPU, blending) time.
    pub compute_seconds: f64,
    /// Its device allocations' high-water mark (CUDA).
    pub peak_device_bytes: Option<u64>,
    /// Activation bytes its backend measured.
    pub measured_activation_bytes: u64,
}

/// Predicted peak bytes, next to the measured ones in the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PredictedPeak {
    /// Host bytes: working set plus the volume and outputs.
    pub host: u64,
    /// Device bytes (CUDA only).
    pub device: Option<u64>,
}

/// The process's resident high-water mark (VmHWM) in bytes; 0 where /proc is missing.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Voxel count and volume of one label value of a label map.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassVolume {
    /// The label value in the file.
    pub label: u16,
    /// Its class name (empty when the label table has none).
    pub name: String,
    /// Voxels holding it.
    pub voxels: u64,
    /// Their volume in millilitres (voxels × voxel volume).
    pub volume_ml: f64,
}

/// The volume of one voxel in mL (= cm³) for a voxel size in the file's space unit
/// (`xyzt_units & 7`: 1 metres, 3 micrometres, anything else read as millimetres, as nibabel
/// users and TotalSegmentator assume).
pub fn voxel_ml(spacing: [f64; 3], xyzt_units: i32) -> f64 {
    let to_mm = match xyzt_units & 0x07 {
        1 => 1000.0,
        3 => 0.001,
        _ => 1.0,
    };
    spacing.iter().map(|s| s * to_mm).product::<f64>() / 1000.0
}

/// Voxels per label value (65536 counts): one pass, over chunks on the thread pool, that the
/// class volumes, the summary line and the empty-map warning share (three serial passes over
/// a 512x512x128 map were ~0.1 s of W3's end).
pub fn label_counts(labels: ArrayView3<u16>) -> Vec<u64> {
    use rayon::prelude::*;
    // Runs of one value (a label map is mostly runs) counted at once: no increment waits on
    // the one before it for the same counter.
    let count = |mut c: Vec<u64>, s: &[u16]| {
        let mut it = s.iter();
        if let Some(&first) = it.next() {
            let (mut cur, mut run) = (first, 1u64);
            for &v in it {
                if v == cur {
                    run += 1;
                } else {
                    c[cur as usize] += run;
                    (cur, run) = (v, 1);
                }
            }
            c[cur as usize] += run;
        }
        c
    };
    let zero = || vec![0u64; 1 << 16];
    let add = |mut a: Vec<u64>, b: Vec<u64>| {
        a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
        a
    };
    match labels.as_slice_memory_order() {
        Some(s) => s.par_chunks(1 << 22).fold(zero, count).reduce(zero, add),
        None => labels.iter().fold(zero(), |mut c, &l| {
            c[l as usize] += 1;
            c
        }),
    }
}

/// Voxel count and volume of every named label value, then of any value present without a
/// name, in label order.
pub fn class_volumes(
    labels: ArrayView3<u16>,
    names: &LabelNames,
    voxel_ml: f64,
) -> Vec<ClassVolume> {
    class_volumes_of(&label_counts(labels), names, voxel_ml)
}

/// [`class_volumes`] from the map's [`label_counts`].
pub fn class_volumes_of(counts: &[u64], names: &LabelNames, voxel_ml: f64) -> Vec<ClassVolume> {
    let name = |l: usize| names.names.get(l).cloned().unwrap_or_default();
    counts
        .iter()
        .enumerate()
        .filter(|&(l, &n)| n > 0 || !name(l).is_empty())
        .map(|(l, &n)| ClassVolume {
            label: l as u16,
            name: name(l),
            voxels: n,
            volume_ml: n as f64 * voxel_ml,
        })
        .collect()
}

/// A file named by its content: path, size and SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileDigest {
    /// The path as given.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Lower-case hex SHA-256 of its bytes.
    pub sha256: String,
}

impl FileDigest {
    /// Read `path` (a regular file) through SHA-256.
    pub fn of(path: &Path) -> Result<FileDigest> {
        use sha2::{Digest, Sha256};
        let (mut file, bytes) = crate::sys::fsio::open_regular(path, u64::MAX, true)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let sha256 = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(FileDigest {
            path: path.display().to_string(),
            bytes,
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{s, Array3};

    /// Runs, single voxels and chunk edges (chunks of 2^22 voxels) against a plain count, on
    /// a contiguous map and on a strided view of it.
    #[test]
    fn label_counts_match_a_plain_count() {
        let mut a = Array3::<u16>::zeros((64, 256, 300));
        let mut x = 12345u64;
        for (i, v) in a.iter_mut().enumerate() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *v = match i % 1000 {
                0..=599 => 0,
                600..=899 => 3,
                _ => (x >> 60) as u16 + 65520,
            };
        }
        for view in [a.view(), a.slice(s![.., ..;3, 1..])] {
            let mut want = vec![0u64; 1 << 16];
            view.iter().for_each(|&l| want[l as usize] += 1);
            assert_eq!(label_counts(view), want);
        }
    }
}
