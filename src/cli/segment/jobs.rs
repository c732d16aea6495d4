//! The files a run segments and where each one's outputs go, claimed before any work.

use super::config::Files;
use super::dataset::{self, stem};
use super::{cases, claims, shard};
use crate::gate::{Gate, Kind};
use crate::volume::Source;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The outputs of one input file.
#[derive(Clone, Debug)]
pub struct Job {
    /// The volume read (the first channel file of a case of several), as messages name it.
    pub input: PathBuf,
    /// What is read: the file or DICOM folder (and series), or the channel files.
    pub source: Source,
    /// Its label map.
    pub output: PathBuf,
    /// `--probabilities`.
    pub probabilities: Option<PathBuf>,
    /// `--logits`.
    pub logits: Option<PathBuf>,
    /// `--split-classes` folder.
    pub split: Option<PathBuf>,
    /// `--preview` picture.
    pub preview: Option<PathBuf>,
    /// `--labels-json` sidecar.
    pub labels_json: Option<PathBuf>,
    /// `--color-table` sidecar (3D Slicer).
    pub color_table: Option<PathBuf>,
    /// `--statistics` JSON.
    pub statistics: Option<PathBuf>,
}

/// A sidecar of a label map: `<name>.<ext>` beside it (`labels.json`, `ctbl`).
fn sidecar(output: &Path, ext: &str) -> PathBuf {
    output.with_file_name(format!("{}.{ext}", stem(output)))
}

/// The case name of an input, for outputs named after it: its file or folder name without the
/// volume extension(s).
fn case_name(input: &Path) -> Result<String> {
    let direct = stem(input);
    let name = if direct.is_empty() || direct == "." || direct == ".." {
        std::fs::canonicalize(input)
            .map(|c| stem(&c))
            .unwrap_or_default()
    } else {
        direct
    };
    if name.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no name to give its output; give -o a file name",
            input.display()
        )));
    }
    Ok(name)
}

/// `-o` of one input: a file, or a folder (ending in `/`, or existing) that gets
/// `<case>.nii.gz`. A missing folder ending in `/` is created; the folders made are returned,
/// top-most first, to be removed if the run is refused.
fn single_output(input: &Path, output: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let slash = output.as_os_str().to_string_lossy().ends_with('/');
    if !slash && !output.is_dir() {
        return Ok((output.to_path_buf(), Vec::new()));
    }
    let file = output.join(format!("{}.nii.gz", case_name(input)?));
    let mut made: Vec<PathBuf> = output
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    made.reverse();
    std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
    Ok((file, made))
}

/// The cases of a run: those to segment and, in a batch, those skipped (label map there,
/// no `--force`).
pub struct Plan {
    /// Several inputs or a folder of cases.
    pub batch: bool,
    /// The jobs to run, every output claimed.
    pub todo: Vec<Job>,
    /// Batch cases whose label map exists (nothing of theirs is written).
    pub skipped: Vec<Job>,
}

/// Claim the outputs of the one input and the report; the folders made for them are removed
/// again if one is refused.
fn claim_single(
    gate: &mut Gate,
    job: &Job,
    (masks, report): (&[String], Option<&Path>),
    made: &[PathBuf],
) -> Result<()> {
    let mut claim = || -> Result<()> {
        claims::claim(gate, job, masks)?;
        match report {
            Some(r) => gate.claim(r, Kind::Report, "--report"),
            None => Ok(()),
        }
    };
    let r = claim();
    if r.is_err() {
        for d in made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
    r
}

/// The files to segment and where each one's outputs go, every path written claimed through
/// one gate before any work (`masks`: the `--split-classes` file names). Batch mode: `-o` and
/// the extra outputs name folders (created here, after every check), each file's outputs are
/// `<folder>/<input name>.<ext>`; the report and every case's outputs are claimed together, so
/// that two of them naming one file are refused up front.
pub fn jobs(f: &Files, gate: &mut Gate, masks: &[String]) -> Result<Plan> {
    let mut inputs = vec![f.input.clone()];
    inputs.extend(f.more_inputs.iter().cloned());
    let batch_mode =
        inputs.len() > 1 || (f.input.is_dir() && !crate::volume::is_dicom_series_dir(&f.input));
    let folders = [
        (&f.probabilities, "--probabilities"),
        (&f.logits, "--logits"),
        (&f.split_classes, "--split-classes"),
        (&f.preview, "--preview"),
        (&f.statistics, "--statistics"),
    ];
    if !batch_mode {
        if let Some(s) = &f.shard {
            shard::resolve(s, &shard::process_env)?;
            return Err(Error::Invalid(format!(
                "--shard splits a batch: give a folder of cases or several inputs, not the one volume {}",
                f.input.display()
            )));
        }
        gate.add_volume(&f.input);
        let (output, made) = single_output(&f.input, &f.output)?;
        let job = Job {
            input: f.input.clone(),
            source: Source::One {
                path: f.input.clone(),
                series: f.series.clone(),
            },
            labels_json: f.labels_json.then(|| sidecar(&output, "labels.json")),
            color_table: f.color_table.then(|| sidecar(&output, "ctbl")),
            output,
            probabilities: f.probabilities.clone(),
            logits: f.logits.clone(),
            split: f.split_classes.clone(),
            preview: f.preview.clone(),
            statistics: f.statistics.clone(),
        };
        claim_single(gate, &job, (masks, f.report.as_deref()), &made)?;
        return Ok(Plan {
            batch: false,
            todo: vec![job],
            skipped: Vec::new(),
        });
    }
    if dataset::is_nifti(&f.output) {
        return Err(Error::Invalid(format!(
            "{}: with several inputs -o names a folder, not a NIfTI file",
            f.output.display()
        )));
    }
    if let Some(uid) = &f.series {
        return Err(Error::Invalid(format!(
            "--series {uid} picks a series in one DICOM folder; in a batch each DICOM folder must hold one series"
        )));
    }
    let mut cases = cases::list(&inputs)?;
    for i in &inputs {
        if i.is_dir() && !crate::volume::is_dicom_series_dir(i) {
            gate.add_input(i);
        }
    }
    for c in &cases {
        c.source.paths().iter().for_each(|v| gate.add_volume(v));
    }
    gate.claim(&f.output, Kind::Folder, "-o")?;
    for (path, what) in folders {
        if let Some(path) = path {
            gate.claim(path, Kind::Folder, what)?;
        }
    }
    if let Some(r) = &f.report {
        // A log of the batch, appended to: an existing one needs no --force.
        gate.claim_appended(r, Kind::Report, "--report")?;
    }
    if let Some(s) = &f.shard {
        cases = shard::take(&cases, s)?;
    }
    let (mut todo, mut skipped) = (Vec::new(), Vec::new());
    for c in cases {
        let s = c.name;
        let file = |d: &PathBuf, ext: &str| d.join(format!("{s}.{ext}"));
        let job = Job {
            output: file(&f.output, "nii.gz"),
            labels_json: f.labels_json.then(|| file(&f.output, "labels.json")),
            color_table: f.color_table.then(|| file(&f.output, "ctbl")),
            probabilities: f.probabilities.as_ref().map(|d| file(d, "nii.gz")),
            logits: f.logits.as_ref().map(|d| file(d, "nii.gz")),
            split: f.split_classes.as_ref().map(|d| d.join(&s)),
            preview: f.preview.as_ref().map(|d| file(d, "png")),
            statistics: f.statistics.as_ref().map(|d| file(d, "json")),
            input: c.source.paths()[0].clone(),
            source: c.source,
        };
        if job.output.exists() && !f.force {
            skipped.push(job);
        } else {
            claims::claim(gate, &job, masks)?;
            todo.push(job);
        }
    }
    for d in std::iter::once(&f.output).chain(folders.iter().filter_map(|(d, _)| d.as_ref())) {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    Ok(Plan {
        batch: true,
        todo,
        skipped,
    })
}
