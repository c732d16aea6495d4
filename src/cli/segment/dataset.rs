//! Batch planning: the input list, shards, output names, device lists. Pure functions, so that a
//! Slurm array or an Indexed Job can split a dataset with no coordinator: every shard computes the
//! same sorted list and keeps files `i` with `i mod n == k`.

use crate::engine::Device;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Whether the file name ends in `.nii` or `.nii.gz` (case-insensitive).
pub fn is_nifti(p: &Path) -> bool {
    let n = p.to_string_lossy().to_ascii_lowercase();
    n.ends_with(".nii") || n.ends_with(".nii.gz")
}

/// Files given on the command line, folders expanded to their `.nii`/`.nii.gz` files (not
/// recursive, hidden files skipped), sorted by path and deduplicated.
pub fn list_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in inputs {
        if p.is_dir() {
            for e in std::fs::read_dir(p).map_err(|e| Error::io(p, e))? {
                let path = e.map_err(|e| Error::io(p, e))?.path();
                let hidden = path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
                if path.is_file() && is_nifti(&path) && !hidden {
                    files.push(path);
                }
            }
        } else {
            files.push(p.clone());
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// `k/n` with 0 <= k < n.
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let bad = || Error::Invalid(format!("--shard takes k/n with 0 <= k < n, not '{s}'"));
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (
        k.trim().parse::<usize>().map_err(|_| bad())?,
        n.trim().parse::<usize>().map_err(|_| bad())?,
    );
    if n == 0 || k >= n {
        return Err(bad());
    }
    Ok((k, n))
}

/// The files of shard k of n: positions i (in the sorted list) with i mod n == k.
pub fn shard<T: Clone>(sorted: &[T], k: usize, n: usize) -> Vec<T> {
    sorted
        .iter()
        .enumerate()
        .filter(|(i, _)| i % n == k)
        .map(|(_, f)| f.clone())
        .collect()
}

/// The name without its volume extension ([`crate::volume::volume_stem`]), or the whole name (a
/// DICOM folder): the case name outputs are named after.
pub fn stem(p: &Path) -> String {
    crate::volume::volume_stem(p).unwrap_or_else(|| {
        p.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    })
}

/// `--device` with a comma list: `cuda:0,1` = `cuda:0,cuda:1` = cuda:0 and cuda:1 (a bare number
/// is a CUDA index); `cpu,cpu` = two CPU workers.
pub fn parse_devices(s: &str) -> Result<Vec<Device>> {
    s.split(',')
        .map(|d| {
            let d = d.trim();
            match d.parse::<usize>() {
                Ok(i) => Ok(Device::Cuda(i)),
                Err(_) => d.parse::<Device>(),
            }
        })
        .collect()
}

/// The devices of each file worker: one worker per device while there are at least as many
/// files; with fewer files than devices, one worker per file and the devices dealt round robin
/// among them (a worker with several devices splits each volume's windows across them).
pub fn device_groups(devices: &[Device], files: usize) -> Vec<Vec<Device>> {
    let workers = devices.len().min(files).max(1);
    (0..workers)
        .map(|w| {
            devices
                .iter()
                .enumerate()
                .filter(|(i, _)| i % workers == w)
                .map(|(_, &d)| d)
                .collect()
        })
        .collect()
}

/// Files assigned to worker `w` of `workers`: round robin over the (already sharded) list.
pub fn worker_files<T: Clone>(files: &[T], w: usize, workers: usize) -> Vec<(usize, T)> {
    files
        .iter()
        .cloned()
        .enumerate()
        .filter(|(i, _)| i % workers == w)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists() {
        let c = Device::Cuda;
        assert_eq!(parse_devices("cuda:0,1").unwrap(), [c(0), c(1)]);
        assert_eq!(parse_devices("cuda:2, cuda:0").unwrap(), [c(2), c(0)]);
        assert_eq!(parse_devices("cpu").unwrap(), [Device::Cpu]);
        for bad in ["cuda:0,", "cuda:0,x", "cpu,,cpu", "cuda:-1"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn groups_cover_every_device_once() {
        let d: Vec<Device> = (0..4).map(Device::Cuda).collect();
        // Enough files: one device each.
        assert_eq!(device_groups(&d, 9).len(), 4);
        assert!(device_groups(&d, 4).iter().all(|g| g.len() == 1));
        // One file: all four on it; two files: two each; three: 2, 1, 1.
        assert_eq!(device_groups(&d, 1), vec![d.clone()]);
        assert_eq!(
            device_groups(&d, 2),
            vec![vec![d[0], d[2]], vec![d[1], d[3]]]
        );
        let g = device_groups(&d, 3);
        assert_eq!(g.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 1]);
        for n in 0..6 {
            let mut all: Vec<Device> = device_groups(&d, n).concat();
            all.sort_by_key(|x| format!("{x:?}"));
            assert_eq!(all, d, "{n} files");
        }
    }
}
