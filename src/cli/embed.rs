//! The command line's paths for a caller inside another program (the Python package): the same
//! flag parsing, `segment` and `plan`, without the process setup of `main.rs` (no signal handler
//! that exits, no panic hook, no exit code). Errors come back as [`crate::Error`].

use super::plan::PlanArgs;
use super::segment::SegmentArgs;
use crate::{CancelToken, Error, Result};
use clap::{Args, Command, FromArgMatches};
use std::ffi::OsString;
use std::path::Path;

pub use super::segment::embed::Session;

/// Parse `argv` (after the subcommand's name) as `name`'s flags; `typed`: where the ids of
/// the flags given go (a clap error becomes one `Error::Invalid` line).
fn parse<T: Args + FromArgMatches>(
    name: &'static str,
    argv: &[OsString],
) -> Result<(T, Vec<String>)> {
    let cmd = T::augment_args(Command::new(name).no_binary_name(true));
    let m = cmd.try_get_matches_from(argv).map_err(clap_error)?;
    let args = T::from_arg_matches(&m).map_err(clap_error)?;
    Ok((args, super::typed(&m)))
}

/// A clap error as one line: its first, without the "error: " prefix.
fn clap_error(e: clap::Error) -> Error {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or("invalid arguments").trim();
    Error::Invalid(line.strip_prefix("error: ").unwrap_or(line).to_string())
}

/// `voxtile segment`'s flags, the typed ones marked (they beat the manifest).
fn segment_args(argv: &[OsString]) -> Result<SegmentArgs> {
    let (mut args, typed): (SegmentArgs, _) = parse("segment", argv)?;
    args.pipe.explicit = typed;
    Ok(args)
}

/// `voxtile segment ARGV` (input, `-m MODEL`, `-o OUTPUT`, flags) under `cancel`: the whole path
/// of the command, outputs committed together, report written, summary line logged.
pub fn segment(argv: &[OsString], cancel: CancelToken) -> Result<()> {
    super::segment::run_with(segment_args(argv)?, cancel)
}

/// A [`Session`]: `model` made ready with `voxtile segment`'s `flags` (those that name files
/// refused).
pub fn session(model: &Path, flags: &[OsString]) -> Result<Session> {
    let mut argv: Vec<OsString> = ["<array>", "-m"].map(OsString::from).to_vec();
    argv.push(model.as_os_str().to_owned());
    argv.extend(["-o", "<array>"].map(OsString::from));
    argv.extend(flags.iter().cloned());
    Session::new(&segment_args(&argv)?)
}

/// `voxtile plan ARGV --json`'s object.
pub fn plan(argv: &[OsString]) -> Result<serde_json::Value> {
    let (args, _): (PlanArgs, _) = parse("plan", argv)?;
    super::plan::planned(&args)?.json()
}

/// Log the library's warnings to stderr as the command line does (`voxtile: warning: …`;
/// `VOXTILE_LOG` or `RUST_LOG` choose more); a second call does nothing.
pub fn log_to_stderr() {
    super::log::install(super::log::Verbosity::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/deepbrain.onnx");

    fn argv(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_session_takes_segment_flags_and_refuses_those_naming_files() {
        let s = session(Path::new(MODEL), &argv(&["--device", "cpu", "--roi=64"])).unwrap();
        assert_eq!(s.pipeline().engines()[0].options().roi, Some([64; 3]));
        let e = session(
            Path::new(MODEL),
            &argv(&["--device=cpu", "--preview=p.png"]),
        );
        let e = e.err().unwrap().to_string();
        assert!(e.contains("--preview") && e.contains("segment_file"), "{e}");
        let e = session(Path::new(MODEL), &argv(&["--no-such-flag"]));
        let e = e.err().unwrap().to_string();
        assert!(e.contains("--no-such-flag") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn an_array_header_carries_its_affine_and_spacing() {
        let s = session(Path::new(MODEL), &argv(&["--device=cpu"])).unwrap();
        let m = [
            [0.0, 0.0, 2.0, 10.0],
            [3.0, 0.0, 0.0, -4.0],
            [0.0, 1.5, 0.0, 7.0],
            [0.0, 0.0, 0.0, 1.0],
        ];
        let h = s.header([1, 4, 5, 6], Some(m), None).unwrap();
        assert_eq!(h.shape(), [4, 5, 6]);
        assert_eq!(h.affine(), m);
        assert_eq!(h.spacing(), [3.0, 1.5, 2.0]);
        let h = s
            .header([1, 4, 5, 6], Some(m), Some([1.0, 1.0, 1.25]))
            .unwrap();
        assert_eq!(h.spacing(), [1.0, 1.0, 1.25]);
        let mut skew = m;
        skew[3] = [0.0, 0.0, 1.0, 1.0];
        assert!(s.header([1, 4, 5, 6], Some(skew), None).is_err());
        assert!(s.header([1, 4, 5, 6], None, Some([0.0, 1.0, 1.0])).is_err());
        let h = s.header([1, 4, 5, 6], None, Some([0.5, 2.0, 3.0])).unwrap();
        assert_eq!(h.spacing(), [0.5, 2.0, 3.0]);
        assert_eq!(
            [h.affine()[0][0], h.affine()[1][1], h.affine()[2][2]],
            [0.5, 2.0, 3.0]
        );
    }

    #[test]
    fn plan_reads_plan_flags() {
        let v = plan(&argv(&[
            "-m",
            MODEL,
            "--volume",
            "96x96x96",
            "--device=cpu",
            "--memory-budget=1GiB",
        ]))
        .unwrap();
        assert_eq!(v["budget"], 1u64 << 30);
        assert_eq!(v["volume"], serde_json::json!([96, 96, 96]));
        assert!(v["batch"].as_u64().unwrap() >= 1);
    }

    /// `plan` plans what `segment` runs with the same flags: the manifest's window settings when
    /// none is typed, the typed ones over it.
    #[test]
    fn plan_plans_what_segment_runs() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.toml");
        std::fs::write(
            &manifest,
            "roi = 48\noverlap = 0.25\nplacement = \"nnunet\"\n",
        )
        .unwrap();
        let manifest = manifest.to_str().unwrap();
        let shared = [
            "--device=cpu",
            "--memory-budget=1GiB",
            "--manifest",
            manifest,
        ];
        let typed = [
            "--roi=64",
            "--overlap=0.5",
            "--placement=monai",
            "--batch=2",
        ];
        let mut seen = Vec::new();
        for flags in [&shared[..], &[&shared[..], &typed[..]].concat()] {
            let mut p = vec!["-m", MODEL, "--volume", "96x80x64"];
            p.extend(flags);
            let planned = plan(&argv(&p)).unwrap();
            let s = session(Path::new(MODEL), &argv(flags)).unwrap();
            let run = s.plan([96, 80, 64]).unwrap();
            for key in ["roi", "batch", "windows", "budget"] {
                assert_eq!(planned[key], run[key], "{key} with {flags:?}");
            }
            seen.push((planned["roi"].clone(), planned["windows"].clone()));
        }
        assert_eq!(seen[0].0, serde_json::json!([48, 48, 48]));
        assert_eq!(seen[1].0, serde_json::json!([64, 64, 64]));
        assert_ne!(seen[0].1, seen[1].1);
    }
}
