//! The cases of a batch: what the inputs given (files, folders of cases) hold, each case with its
//! output name. A folder lists its volume files (NIfTI, NRRD, MetaImage, NIfTI-1 pairs) and its
//! sub-folders that hold a DICOM series; files named the nnU-Net way (`CASE_0000.nii.gz`,
//! `CASE_0001.nii.gz`, ...) are the channels of one case `CASE`.
//!
//! nnU-Net naming is all or nothing per folder, judged by names alone (as nnU-Net does): it holds
//! when every volume file of the folder ends in `_XXXX` (four digits) and every case's channels
//! run `_0000`, `_0001`, ... without a gap. Otherwise (mixed naming, numbering from `_0001`,
//! a gap) each file is a case of its own under its full name, and a folder that looked
//! half-nnU-Net gets one warning saying why it was not grouped.

use crate::volume::{foreign_hint, is_dicom_series_dir, volume_stem, Source};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One case: what is read, and the name its outputs take (`<name>.nii.gz`).
#[derive(Clone, Debug)]
pub struct Case {
    /// Output name, without extension.
    pub name: String,
    /// Its input.
    pub source: Source,
}

/// What the listing found beside the cases.
#[derive(Default)]
struct Found {
    /// Volume files by folder (nnU-Net naming is judged per folder).
    files: BTreeMap<PathBuf, Vec<PathBuf>>,
    /// DICOM series folders and explicit files of no known format (their read says why).
    cases: Vec<Case>,
    /// Files of formats voxtile does not read, with the hint for the first.
    skipped: Vec<PathBuf>,
}

/// The cases `inputs` hold, sorted by their first path (every shard of a batch computes the
/// same list), checked for two cases with one output name.
pub fn list(inputs: &[PathBuf]) -> Result<Vec<Case>> {
    let mut found = Found::default();
    for p in inputs {
        if p.is_dir() && !is_dicom_series_dir(p) {
            scan_folder(p, &mut found)?;
        } else {
            add_path(p, &mut found, true);
        }
    }
    let mut cases = found.cases;
    for (dir, mut files) in found.files {
        files.sort();
        files.dedup();
        cases.extend(group(&dir, files));
    }
    cases.sort_by(|a, b| a.source.paths()[0].cmp(&b.source.paths()[0]));
    cases.dedup_by(|a, b| a.source == b.source);
    if let Some(first) = found.skipped.first() {
        let hint = foreign_hint(first).unwrap_or_default();
        let (n, what) = (found.skipped.len(), format!("{}: {hint}", first.display()));
        if cases.is_empty() {
            return Err(Error::Invalid(format!(
                "no volumes to segment; {n} file(s) of formats voxtile does not read, e.g. {what}"
            )));
        }
        crate::cli::say!(
            "voxtile: warning: skipped {n} file(s) voxtile does not read, e.g. {what}"
        );
    }
    if cases.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no volumes to segment (.nii, .nii.gz, .nrrd, .nhdr, .mha, .mhd, .hdr files or DICOM series folders)",
            inputs[0].display()
        )));
    }
    check_names(&cases)?;
    Ok(cases)
}

/// The non-hidden entries of a folder of cases.
fn scan_folder(dir: &Path, found: &mut Found) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = e.map_err(|e| Error::io(dir, e))?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if !hidden {
            add_path(&path, found, false);
        }
    }
    Ok(())
}

/// One path: a DICOM folder is a case; a volume file joins its folder's files; a file of a
/// format voxtile does not read is skipped in a folder, a case (refused with its hint when read)
/// when named on the command line; other sub-folders and files are passed over.
fn add_path(p: &Path, found: &mut Found, explicit: bool) {
    if p.is_dir() {
        if is_dicom_series_dir(p) {
            found.cases.push(Case {
                name: folder_name(p),
                source: Source::file(p),
            });
        }
    } else if volume_stem(p).is_some() {
        let dir = crate::staged::parent_dir(p);
        found.files.entry(dir).or_default().push(p.to_path_buf());
    } else if explicit {
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        found.cases.push(Case {
            name,
            source: Source::file(p),
        });
    } else if p.is_file() && foreign_hint(p).is_some() {
        found.skipped.push(p.to_path_buf());
    }
}

/// A folder's name (`.` and `dir/` resolved).
fn folder_name(p: &Path) -> String {
    let named = p.file_name().map(|n| n.to_string_lossy().to_string());
    named
        .or_else(|| {
            std::fs::canonicalize(p)
                .ok()
                .and_then(|c| c.file_name().map(|n| n.to_string_lossy().to_string()))
        })
        .unwrap_or_else(|| "series".into())
}

/// `CASE_XXXX` → (`CASE`, XXXX).
fn channel_of(stem: &str) -> Option<(&str, usize)> {
    let (case, num) = stem.rsplit_once('_')?;
    let ok = !case.is_empty() && num.len() == 4 && num.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| (case, num.parse().unwrap_or(0)))
}

/// The cases of one folder's volume files (sorted): nnU-Net channel groups when the whole folder
/// is named that way, else one case per file.
fn group(dir: &Path, files: Vec<PathBuf>) -> Vec<Case> {
    match nnunet_groups(&files) {
        Ok(groups) => groups
            .into_iter()
            .map(|(name, paths)| Case {
                name,
                source: Source::Channels(paths),
            })
            .collect(),
        Err(why) => {
            if let Some(why) = why {
                crate::cli::say!(
                    "voxtile: warning: {}: files not grouped as nnU-Net channels ({why}); each file is one case",
                    dir.display()
                );
            }
            files
                .into_iter()
                .map(|f| Case {
                    name: volume_stem(&f).unwrap_or_default(),
                    source: Source::file(f),
                })
                .collect()
        }
    }
}

/// The nnU-Net cases of `files` (name → channel files in order), or why the folder is not named
/// that way: None when nothing in it looks nnU-Net (no `_0000` file), else the reason to warn.
fn nnunet_groups(
    files: &[PathBuf],
) -> std::result::Result<Vec<(String, Vec<PathBuf>)>, Option<String>> {
    let name = |f: &PathBuf| {
        f.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let looks = files.iter().any(|f| {
        volume_stem(f)
            .as_deref()
            .and_then(channel_of)
            .is_some_and(|(_, c)| c == 0)
    });
    let mut groups: BTreeMap<String, Vec<(usize, PathBuf)>> = BTreeMap::new();
    for f in files {
        let stem = volume_stem(f).unwrap_or_default();
        match channel_of(&stem) {
            Some((case, c)) => groups
                .entry(case.to_string())
                .or_default()
                .push((c, f.clone())),
            None => {
                return Err(looks.then(|| format!("{} does not end in _XXXX", name(f))));
            }
        }
    }
    let mut out = Vec::new();
    for (case, mut chans) in groups {
        chans.sort();
        if let Some((i, (c, f))) = chans.iter().enumerate().find(|(i, (c, _))| i != c) {
            let why = match i.cmp(c) {
                std::cmp::Ordering::Greater => format!("{} repeats channel _{c:04}", name(f)),
                _ => format!("case {case} has no _{i:04}"),
            };
            return Err(looks.then_some(why));
        }
        out.push((case, chans.into_iter().map(|(_, f)| f).collect()));
    }
    Ok(out)
}

/// Two cases with one output name (a.nii + a.nii.gz, x.nii.gz in two folders, a series folder
/// `a` beside `a.nrrd`) would write the same files: refused before anything runs.
fn check_names(cases: &[Case]) -> Result<()> {
    let mut by_name: Vec<(&str, &Path)> = cases
        .iter()
        .map(|c| (c.name.as_str(), c.source.paths()[0].as_path()))
        .collect();
    by_name.sort();
    if let Some(w) = by_name.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Invalid(format!(
            "{} and {} would both be written as {}.nii.gz; rename one or segment them apart",
            w[0].1.display(),
            w[1].1.display(),
            w[0].0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path, files: &[&str]) -> Vec<(String, usize)> {
        let files = files.iter().map(|f| dir.join(f)).collect();
        group(dir, files)
            .into_iter()
            .map(|c| (c.name, c.source.paths().len()))
            .collect()
    }

    #[test]
    fn nnunet_naming_is_all_or_nothing() {
        let d = Path::new("in");
        let s = |v: &[(&str, usize)]| {
            v.iter()
                .map(|(n, c)| (n.to_string(), *c))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(
                d,
                &[
                    "a_0000.nii.gz",
                    "a_0001.nii.gz",
                    "b_0000.nii.gz",
                    "b_0001.nii.gz"
                ]
            ),
            s(&[("a", 2), ("b", 2)])
        );
        assert_eq!(names(d, &["case_0000.nii.gz"]), s(&[("case", 1)]));
        // Mixed naming, numbering from 1, a gap: one case per file, full names.
        assert_eq!(
            names(d, &["a_0000.nii.gz", "b.nii.gz"]),
            s(&[("a_0000", 1), ("b", 1)])
        );
        assert_eq!(
            names(d, &["amos_0001.nii.gz", "amos_0002.nii.gz"]),
            s(&[("amos_0001", 1), ("amos_0002", 1)])
        );
        assert_eq!(
            names(d, &["a_0000.nii.gz", "a_0002.nii.gz"]),
            s(&[("a_0000", 1), ("a_0002", 1)])
        );
        assert_eq!(channel_of("x_12345"), None);
        assert_eq!(channel_of("_0000"), None);
    }
}
