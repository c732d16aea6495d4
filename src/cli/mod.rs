//! The `voxtile` command line: segment, info, inspect, plan, completions. `main.rs` only calls
//! [`run`].

mod completions;
mod describe;
pub mod embed;
mod flags;
mod log;
mod plan;
mod progress;
pub mod segment;
mod summary;
mod window;

use crate::Error;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "voxtile",
    version,
    about = "Segment 3D medical volumes with an ONNX 3D CNN, window by window"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    verbosity: log::Verbosity,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Segment a NIfTI volume with an ONNX model and write the labels as NIfTI.
    Segment(segment::SegmentArgs),
    /// Show a NIfTI file's shape, dtype, spacing, orientation, affine and value range.
    Info {
        /// Volume file (NIfTI, NRRD, MetaImage, .hdr/.img) or DICOM series folder
        input: PathBuf,
        /// The SeriesInstanceUID to read from a DICOM folder that holds several series
        #[arg(long, value_name = "UID")]
        series: Option<String>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Plan roi and batch for a model and volume size under a memory budget, and print the
    /// predicted memory (weights, activations, workspace, staging, accumulators).
    Plan(plan::PlanArgs),
    /// Show an ONNX model's inputs, outputs, ops, parameters and receptive field.
    Inspect {
        /// .onnx file
        model: PathBuf,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script, e.g. `voxtile completions bash > ~/.local/share/bash-completion/completions/voxtile`.
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
}

/// Parse arguments, run, print one error line on failure; returns the process exit code.
pub fn run() -> i32 {
    // Parsed through ArgMatches so that `segment` knows which flags were typed (they beat the
    // model manifest; defaults do not).
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (mut cli, matches) = match parsed {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    if let (Command::Segment(args), Some(m)) =
        (&mut cli.command, matches.subcommand_matches("segment"))
    {
        args.pipe.explicit = typed(m);
    }
    install_panic_hook();
    log::install(cli.verbosity);
    let result = match cli.command {
        Command::Segment(args) => segment::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Info {
            input,
            series,
            json,
        } => describe::info(&input, series.as_deref(), json),
        Command::Inspect { model, json } => describe::inspect(&model, json),
        Command::Completions { shell } => completions::print(shell),
    };
    match result {
        Ok(()) => 0,
        Err(Error::Io { source, .. }) if is_closed_stdout(&source) => 0,
        Err(e) => {
            crate::cli::say!("voxtile: error: {e}");
            1
        }
    }
}

/// The ids of the arguments typed on the command line (they beat a model's manifest; defaults
/// do not).
fn typed(m: &clap::ArgMatches) -> Vec<String> {
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.to_string())
        .collect()
}

/// `eprintln!` that never panics (a closed or broken stderr only loses the message) and never
/// tears a progress bar: for what is printed whatever `-q` says (errors).
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::cli::log::line(&format!($($arg)*));
    }};
}
pub(crate) use say;

/// Whether an error is standard output closed by its reader (`voxtile inspect m.onnx | head -1`).
fn is_closed_stdout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Write `text` to standard output; a reader that went away ends the command quietly (exit 0).
pub(crate) fn print_stdout(text: &str) -> crate::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Error::io("<stdout>", e))
}

/// Panics are bugs: one line naming them, not a backtrace. Inside [`catch_bug`] the message is
/// kept for the caller, which reports it for the file being processed and goes on.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = panic_message(info.payload());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let line = format!("internal error (a bug, please report it): {msg}{at}");
        if CAUGHT.with(|c| c.borrow().is_some()) {
            CAUGHT.with(|c| *c.borrow_mut() = Some(line));
        } else {
            crate::cli::say!("voxtile: {line}");
        }
    }));
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into())
}

thread_local! {
    /// Some(..) while [`catch_bug`] runs on this thread: where the hook leaves its message.
    static CAUGHT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Run `f`; a panic inside becomes an `Error` (one line) instead of ending the process.
pub(crate) fn catch_bug<T>(f: impl FnOnce() -> crate::Result<T>) -> crate::Result<T> {
    CAUGHT.with(|c| *c.borrow_mut() = Some(String::new()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let msg = CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or_default();
    r.unwrap_or_else(|_| Err(Error::Invalid(msg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_bug_is_one_error_line() {
        install_panic_hook();
        let e = catch_bug(|| -> crate::Result<()> { panic!("index out of range") }).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("internal error") && msg.contains("index out of range"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        assert_eq!(catch_bug(|| Ok(3)).unwrap(), 3);
        let _ = std::panic::take_hook();
    }
}
