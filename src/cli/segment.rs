//! `voxtile segment`: one front door for every run — one model or an ensemble, one file or a
//! batch, with or without TTA, resampling or extra outputs. The flags become one [`Config`],
//! every file goes through the same [`process`] (read and preprocess while the engines get
//! ready, segment, stage the outputs, commit them together) and gets the same report.

mod args;
mod batch;
mod cases;
mod config;
mod jobs;
mod process;
mod record;
mod shard;

use crate::gate::{Gate, Kind};
use crate::staged::Outputs;
use crate::Result;
pub use args::SegmentArgs;
use config::Config;
use process::{prepare, process, read_ahead, Processed, Replace};
use std::path::Path;
use std::time::Instant;

/// Stage the report (`-`: kept to print on standard output once the outputs are committed).
fn stage_report(path: &Path, json: String, outs: &mut Outputs) -> Result<Option<String>> {
    if path == Path::new("-") {
        return Ok(Some(json));
    }
    outs.push(crate::staged::stage_bytes(path, json.as_bytes())?, true);
    Ok(None)
}

/// Run `voxtile segment`.
pub fn run(args: SegmentArgs) -> Result<()> {
    let config = Config::new(&args)?;
    let mut reads: Vec<&Path> = vec![args.input.as_path()];
    reads.extend(args.pipe.more_inputs.iter().map(|m| m.as_path()));
    reads.extend(args.model.iter().map(|m| m.as_path()));
    reads.extend(config.manifest_path.as_deref());
    let mut gate = Gate::new(&reads, args.force);
    let (batch_mode, jobs) = jobs::jobs(&args, &mut gate)?;
    if batch_mode {
        return batch::run(&args, &config, &reads, jobs);
    }
    if let Some(r) = &args.report {
        gate.claim(r, Kind::Report, "--report")?;
    }
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
    let replace = Replace {
        force: args.force,
        extras: args.force,
    };
    let bar = super::progress::wanted();
    let Processed {
        outs,
        stdout,
        summary,
        ..
    } = process(
        &mut pipe,
        &config,
        job,
        (input, ahead),
        (bar, args.report.as_deref()),
        replace,
    )?;
    outs.commit()?;
    super::summary::emit(&summary.line());
    if let Some(json) = stdout {
        super::print_stdout(&json)?;
    }
    // The process ends right after this: the driver frees the device context with the process,
    // faster than tearing down every buffer and module one by one.
    std::mem::forget(pipe);
    Ok(())
}
