//! What the CLI says on stderr: `-q`/`-v` mapped onto a `tracing` filter, every event written
//! as one `voxtile: …` line (through [`super::progress::suspend`], so a bar is never torn).

use std::io::Write;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::sys::notice::{ALERT_TARGET, SUMMARY_TARGET};

/// `-q` and `-v`, accepted before or after the subcommand.
#[derive(clap::Args, Debug, Default, Clone, Copy)]
pub struct Verbosity {
    /// Nothing on stderr on success (errors are still printed)
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// More on stderr: -v notices (device fallback, planning), -vv debug
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl Verbosity {
    /// The filter the flags ask for; None without flags (the environment or the default decide).
    fn directives(self) -> Option<&'static str> {
        match (self.quiet, self.verbose) {
            (true, _) => Some("error"),
            (false, 0) => None,
            (false, 1) => Some("warn,voxtile=info"),
            (false, 2) => Some("warn,voxtile=debug"),
            (false, _) => Some("warn,voxtile=trace"),
        }
    }
}

/// The filter: `-q`/`-v` when given, else `VOXTILE_LOG` or `RUST_LOG` (full `EnvFilter` syntax,
/// for one module's debug output), else warnings; then [`always`] on top.
fn filter(v: Verbosity) -> EnvFilter {
    let base = match v.directives() {
        Some(d) => d.to_string(),
        None => ["VOXTILE_LOG", "RUST_LOG"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|s| !s.trim().is_empty()))
            .filter(|s| EnvFilter::try_new(s).is_ok())
            .unwrap_or_else(|| "warn".into()),
    };
    EnvFilter::new(format!("{base},{}", always(v.quiet)))
}

/// The directives no environment variable overrides (they come last, and the most specific
/// target wins): the alerts always, the summaries unless `-q`.
fn always(quiet: bool) -> String {
    let summary = if quiet { "off" } else { "info" };
    format!("{SUMMARY_TARGET}={summary},{ALERT_TARGET}=warn")
}

/// Install the stderr subscriber (a second call does nothing).
pub fn install(v: Verbosity) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(v))
        .with_writer(|| Stderr)
        .event_format(Prefixed)
        .try_init();
}

/// Write one line to stderr without tearing a progress bar; a closed or broken stderr only loses
/// the line (`voxtile … 2>&1 | head -1` must not panic).
pub fn line(text: &str) {
    super::progress::suspend(|| {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    });
}

/// `voxtile: ` then `error: `/`warning: `/`debug: ` by level (nothing for notices), then the
/// message and its fields.
struct Prefixed;

impl<S, N> FormatEvent<S, N> for Prefixed
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let tag = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        };
        write!(w, "voxtile: {tag}")?;
        ctx.format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// The subscriber's writer: stderr, around the progress bar. The formatter hands it a whole
/// event in one write.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        super::progress::suspend(|| {
            let _ = std::io::stderr().lock().write_all(buf);
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_the_default() {
        let v = |quiet, verbose| Verbosity { quiet, verbose }.directives();
        assert_eq!(v(true, 0), Some("error"));
        assert_eq!(v(false, 0), None);
        assert_eq!(v(false, 1), Some("warn,voxtile=info"));
        assert_eq!(v(false, 2), Some("warn,voxtile=debug"));
        assert_eq!(
            always(false),
            "voxtile::summary=info,voxtile::alert=warn",
            "summaries on without -q"
        );
        assert!(always(true).starts_with("voxtile::summary=off,"));
    }
}
