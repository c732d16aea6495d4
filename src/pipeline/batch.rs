//! Batch planning: the input list, shards, output names, device lists. Pure functions, so that a
//! Slurm array or an Indexed Job can split a dataset with no coordinator: every shard computes the
//! same sorted list and keeps files `i` with `i mod n == k`.

use crate::engine::Device;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

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

/// The name without `.nii.gz` / `.nii` (case-insensitive).
pub fn stem(p: &Path) -> String {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    for ext in [".nii.gz", ".nii"] {
        if lower.ends_with(ext) {
            return name[..name.len() - ext.len()].to_string();
        }
    }
    name
}

/// `--device` with a comma list: `cuda:0,1` = cuda:0 and cuda:1; `cpu,cpu` = two CPU workers.
pub fn parse_devices(s: &str) -> Result<Vec<Device>> {
    if let Some(list) = s.strip_prefix("cuda:").filter(|l| l.contains(',')) {
        return list
            .split(',')
            .map(|i| format!("cuda:{}", i.trim()).parse::<Device>())
            .collect();
    }
    s.split(',').map(|d| d.trim().parse::<Device>()).collect()
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
