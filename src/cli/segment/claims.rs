//! Every path a case writes, with what it holds and the flag that names it: the one list the
//! output gate claims, for one file and for every case of a batch alike, before any work.

use super::config::Config;
use super::jobs::Job;
use crate::gate::{Gate, Kind};
use crate::pipeline::outputs;
use crate::Result;
use std::path::PathBuf;

/// One path a case writes.
pub struct Claim {
    /// Where.
    pub path: PathBuf,
    /// What it holds.
    pub kind: Kind,
    /// The flag naming it, for messages.
    pub what: &'static str,
}

/// The `--split-classes` mask file names (none without the flag), by the writer's rule
/// ([`outputs::class_files`]) for the model's output channels: the manifest's class count when
/// it lists classes (the build checks it against the model), else read from the first model.
pub fn mask_names(config: &Config, split: bool) -> Result<Vec<String>> {
    if !split {
        return Ok(Vec::new());
    }
    let channels = match &config.classes {
        Some(c) => c.len(),
        None => crate::model::onnx::load(&config.models[0])?.output_channels(),
    };
    let files = outputs::class_files(channels, config.classes.as_deref())?;
    Ok(files.into_iter().map(|(_, name)| name).collect())
}

/// Everything `job` writes, in the order its claims are checked: the label map, its sidecars,
/// the extra outputs, the mask folder and its masks, the preview and the statistics (`masks`: from [`mask_names`]).
pub fn of_job(job: &Job, masks: &[String]) -> Vec<Claim> {
    let c = |path: &PathBuf, kind, what| Claim {
        path: path.clone(),
        kind,
        what,
    };
    let mut v = vec![c(&job.output, Kind::Volume, "-o")];
    v.extend(
        job.labels_json
            .iter()
            .map(|p| c(p, Kind::Report, "--labels-json")),
    );
    v.extend(
        job.color_table
            .iter()
            .map(|p| c(p, Kind::ColorTable, "--color-table")),
    );
    v.extend(
        job.probabilities
            .iter()
            .map(|p| c(p, Kind::Volume, "--probabilities")),
    );
    v.extend(job.logits.iter().map(|p| c(p, Kind::Volume, "--logits")));
    if let Some(dir) = &job.split {
        v.push(c(dir, Kind::Folder, "--split-classes"));
        v.extend(
            masks
                .iter()
                .map(|m| c(&dir.join(m), Kind::Volume, "--split-classes")),
        );
    }
    v.extend(job.preview.iter().map(|p| c(p, Kind::Png, "--preview")));
    v.extend(
        job.statistics
            .iter()
            .map(|p| c(p, Kind::Report, "--statistics")),
    );
    v
}

/// Claim everything `job` writes.
pub fn claim(gate: &mut Gate, job: &Job, masks: &[String]) -> Result<()> {
    of_job(job, masks)
        .iter()
        .try_for_each(|c| gate.claim(&c.path, c.kind, c.what))
}
