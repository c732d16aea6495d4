//! The `voxtile` command line: segment, info, inspect. `main.rs` only calls [`run`].

mod plan;
mod segment;

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
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Segment a NIfTI volume with an ONNX model and write the labels as NIfTI.
    Segment(segment::SegmentArgs),
    /// Show a NIfTI file's shape, dtype, spacing, orientation, affine and value range.
    Info {
        /// .nii or .nii.gz file
        input: PathBuf,
    },
    /// Plan roi and batch for a model and volume size under a memory budget, and print the
    /// predicted memory (weights, activations, workspace, staging, accumulators).
    Plan(plan::PlanArgs),
    /// Show an ONNX model's inputs, outputs, ops, parameters and receptive field.
    Inspect {
        /// .onnx file
        model: PathBuf,
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
        args.pipe.explicit = m
            .ids()
            .filter(|id| {
                m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.to_string())
            .collect();
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VOXTILE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .try_init();
    let result = match cli.command {
        Command::Segment(args) => segment::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Info { input } => crate::volume::read(&input).map(|v| {
            println!("{}", crate::volume::describe(&input, &v));
        }),
        Command::Inspect { model } => crate::model::onnx::load(&model).and_then(|g| {
            println!("{}: {}", model.display(), g.summary());
            // The manifest beside the model, when there is one.
            if let Some(p) = crate::pipeline::Manifest::beside(&model) {
                let m = crate::pipeline::Manifest::load(&p)?;
                println!("{}", m.describe(&p));
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("voxtile: error: {e}");
            1
        }
    }
}
