//! Batch mode: several files (or a folder), one worker per device, files round robin; a failed
//! file is reported and skipped; the report is a log of JSON lines.

use super::config::Config;
use super::dataset;
use super::jobs::{Job, Plan};
use super::process::{prepare, process, read_ahead};
use super::record::not_run;
use crate::cli::progress;
use crate::cli::summary::{self, Summary};
use crate::volume::{Header, Source};
use crate::{Error, Result};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

/// The batch report: JSON lines appended as files finish (a resumed batch adds to it); opened
/// without following a symbolic link, and only as a regular file.
fn open_batch_report(path: &Path, force: bool) -> Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if force {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    let f = o.open(path).map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::Invalid(format!(
            "--report {}: is not a regular file",
            path.display()
        )));
    }
    Ok(f)
}

/// A case of nnU-Net channel files (`CASE_0000`, `CASE_0001`, ...) whose channel count is not the
/// model's: said in the naming's terms, not as a volume's channel count.
fn check_channel_files(job: &Job, header: &Header, wanted: usize, config: &Config) -> Result<()> {
    let Source::Channels(files) = &job.source else {
        return Ok(());
    };
    if header.channels() == wanted {
        return Ok(());
    }
    let name = |f: &Path| {
        f.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let files = match files.len() {
        1 => name(&files[0]),
        n => format!("{} … {}", name(&files[0]), name(&files[n - 1])),
    };
    Err(Error::Invalid(format!(
        "nnU-Net channel file(s) {files} give {} channel(s) but {} takes {wanted} (files named CASE_XXXX are read as the channels of one case CASE)",
        header.channels(),
        config.models[0].display()
    )))
}

/// Segment the plan's cases (every output, the report included, already claimed); those
/// skipped (label map there, no `--force`) get a report line.
pub fn run(config: &Config, plan: Plan) -> Result<()> {
    let files = &config.files;
    let lines: Vec<serde_json::Value> = plan
        .skipped
        .iter()
        .map(|job| {
            summary::emit(&summary::skipped(&job.input, &job.output));
            let status = "skipped (output exists)";
            not_run(config, &job.input, &job.output, status, None)
        })
        .collect();
    let todo = plan.todo;
    let mut report = match &files.report {
        Some(p) if p != Path::new("-") => Some((open_batch_report(p, files.force)?, p.clone())),
        _ => None,
    };
    let to_stdout = files.report.as_deref() == Some(Path::new("-"));
    let mut emit = |v: &serde_json::Value| -> Result<()> {
        let s = serde_json::to_string(v).map_err(|e| Error::Invalid(format!("report: {e}")))?;
        if let Some((f, path)) = &mut report {
            // One write per line: appended whole even beside another writer.
            f.write_all(format!("{s}\n").as_bytes())
                .map_err(|e| Error::io(&*path, e))?;
        } else if to_stdout {
            crate::cli::print_stdout(&format!("{s}\n"))?;
        }
        Ok(())
    };
    for l in &lines {
        emit(l)?;
    }

    // Batch: one worker per device (fewer files than devices: per file, the devices shared out),
    // files round robin; a failed file is reported and skipped.
    let total = todo.len();
    let groups = dataset::device_groups(&config.devices, total);
    let workers = groups.len();
    let (tx, rx) = std::sync::mpsc::channel::<(serde_json::Value, Option<Summary>)>();
    let mut failed = 0usize;
    std::thread::scope(|s| -> Result<()> {
        for (w, group) in groups.iter().enumerate() {
            let tx = tx.clone();
            let mine = dataset::worker_files(&todo, w, workers);
            s.spawn(move || {
                let fail = |job: &Job, e: &Error| {
                    let msg = format!("{}: {e}", job.input.display());
                    not_run(config, &job.input, &job.output, "error", Some(msg))
                };
                let mut pipe = None;
                for (_, job) in &mine {
                    // A bug (panic) while processing one file is that file's error; the
                    // pipeline it may have left half-way is built anew for the next file.
                    let r = crate::cli::catch_bug(|| {
                        let (p, input, ahead) = read_ahead(job, config, |header| {
                            let t = Instant::now();
                            let mut p = match pipe.take() {
                                Some(p) => p,
                                None => config.build(group)?,
                            };
                            let engine_init = t.elapsed().as_secs_f64();
                            check_channel_files(job, header, p.input_channels(), config)?;
                            prepare(&mut p, header, job, &config.models)?;
                            Ok((p, engine_init))
                        })?;
                        let p = pipe.insert(p);
                        let done = process(
                            p,
                            config,
                            job,
                            (input, ahead),
                            (false, None),
                            (files.force, false),
                        )?;
                        done.outs.commit()?;
                        Ok((done.report, Some(done.summary)))
                    });
                    let _ = tx.send(r.unwrap_or_else(|e| (fail(job, &e), None)));
                }
            });
        }
        drop(tx);
        let bar = progress::wanted().then(|| progress::Bar::files(total));
        for (i, (v, done)) in rx.iter().enumerate() {
            bar.iter().for_each(progress::Bar::inc);
            match done {
                Some(s) => summary::emit(&format!("[{}/{total}] {}", i + 1, s.line())),
                None => {
                    failed += 1;
                    crate::cli::say!(
                        "voxtile: failed: {}",
                        v["error"].as_str().unwrap_or("unknown error")
                    );
                }
            }
            emit(&v)?;
        }
        Ok(())
    })?;
    if failed > 0 {
        return Err(Error::Invalid(format!(
            "{failed} of {total} file(s) failed (see the lines above)"
        )));
    }
    Ok(())
}
