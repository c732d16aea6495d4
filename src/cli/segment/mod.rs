//! `voxtile segment`: one front door for every run — one model or an ensemble, one file or a
//! batch, with or without TTA, resampling or extra outputs. The flags become one [`Config`],
//! every file goes through the same [`process`] (read and preprocess while the engines get
//! ready, segment, stage the outputs, commit them together) and gets the same report.

mod args;
mod batch;
mod cases;
mod claims;
mod config;
pub mod dataset;
pub mod embed;
mod empty;
mod jobs;
mod post;
mod process;
mod record;
mod shard;

use crate::gate::Gate;
use crate::staged::Outputs;
use crate::Result;
pub use args::SegmentArgs;
use config::Config;
use process::{prepare, process, read_ahead, Processed};
use std::path::Path;
use std::time::Instant;

/// Stage the report (`-`: kept to print on standard output once the outputs are committed);
/// `force`: it may replace an existing file (the gate refused one without it).
fn stage_report(
    path: &Path,
    json: String,
    outs: &mut Outputs,
    force: bool,
) -> Result<Option<String>> {
    if path == Path::new("-") {
        return Ok(Some(json));
    }
    outs.push(crate::staged::stage_bytes(path, json.as_bytes())?, force);
    Ok(None)
}

/// Run `voxtile segment`.
pub fn run(args: SegmentArgs) -> Result<()> {
    run_with(args, crate::CancelToken::new())
}

/// Run `voxtile segment` under `cancel` (a caller in the same process stops it: the run returns
/// `Error::Cancelled` and commits nothing).
pub fn run_with(args: SegmentArgs, cancel: crate::CancelToken) -> Result<()> {
    let mut config = Config::new(&args)?;
    config.setup.options.cancel = cancel;
    let files = &config.files;
    let mut reads: Vec<&Path> = config.models.iter().map(|m| m.as_path()).collect();
    reads.extend(config.manifest_path.as_deref());
    let mut gate = Gate::new(&reads, files.force);
    let masks = claims::mask_names(&config, files.split_classes.is_some())?;
    let plan = jobs::jobs(files, &mut gate, &masks)?;
    drop(gate);
    if plan.batch {
        return batch::run(&config, plan);
    }
    let jobs = plan.todo;
    let Some(job) = jobs.first() else {
        return Ok(());
    };
    let (mut pipe, input, ahead) = read_ahead(job, &config, |header| {
        let t = Instant::now();
        let mut pipe = config.build(&config.devices)?;
        let engine_init = t.elapsed().as_secs_f64();
        prepare(&mut pipe, header, job, &config.models)?;
        Ok((pipe, engine_init))
    })?;
    let bar = super::progress::wanted();
    let Processed {
        outs,
        stdout,
        summary,
        released,
        ..
    } = process(
        &mut pipe,
        &config,
        job,
        (input, ahead),
        (bar, config.files.report.as_deref()),
        (config.files.force, true),
    )?;
    outs.commit()?;
    super::summary::emit(&summary.line());
    if let Some(json) = stdout {
        super::print_stdout(&json)?;
    }
    // The devices closed while the outputs were written; what is left ends with the process.
    for t in released {
        let _ = t.join();
    }
    std::mem::forget(pipe);
    Ok(())
}
