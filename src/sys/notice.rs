//! The `tracing` targets the CLI shows whatever the filter says, so that any layer may speak to
//! the user without importing the CLI: the CLI's filter (`cli/log.rs`) keeps them on.

/// One-line summaries (a file written, the first compile of the kernels): shown whatever
/// `RUST_LOG` says, hidden by `-q` alone (a pipeline's inherited `RUST_LOG=warn` must not turn a
/// run silent).
pub(crate) const SUMMARY_TARGET: &str = "voxtile::summary";

/// Warnings no filter hides, `-q` included (an empty label map).
pub(crate) const ALERT_TARGET: &str = "voxtile::alert";
