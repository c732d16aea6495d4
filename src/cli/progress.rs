//! Progress bars on a terminal: the windows of one file, the files of a batch. A steady tick
//! keeps the spinner and the clock moving while a slow first batch runs; lines written to stderr
//! go through [`suspend`] so they appear above the bar instead of through it.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

/// The bar on screen, if any (one at a time: a batch shows no window bars).
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn active() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether to draw bars: stderr is a terminal (not a Slurm log or a pipe) and the summaries are
/// shown (not `-q`).
pub fn wanted() -> bool {
    std::io::stderr().is_terminal() && super::summary::enabled()
}

/// A bar on screen until dropped (then cleared).
pub struct Bar(ProgressBar);

impl Bar {
    fn start(template: &str, len: Option<u64>) -> Bar {
        // No length yet: an empty bar, not a full one (indicatif draws 0/0 as complete).
        let b = len.map_or_else(ProgressBar::no_length, ProgressBar::new);
        b.set_style(
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b.enable_steady_tick(Duration::from_millis(120));
        *active() = Some(b.clone());
        Bar(b)
    }

    /// The windows of one file (their count is known once the plan is made).
    pub fn windows() -> Bar {
        Bar::start(
            "{spinner} windows {pos}/{len} [{bar:30}] {elapsed} (ETA {eta})",
            None,
        )
    }

    /// The files of a batch.
    pub fn files(total: usize) -> Bar {
        Bar::start(
            "{spinner} files {pos}/{len} [{bar:30}] {elapsed} (ETA {eta})",
            Some(total as u64),
        )
    }

    /// `done` of `total` finished.
    pub fn set(&self, done: usize, total: usize) {
        self.0.set_length(total as u64);
        self.0.set_position(done as u64);
    }

    /// One more finished.
    pub fn inc(&self) {
        self.0.inc(1);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        active().take();
        self.0.finish_and_clear();
    }
}

/// Run `f` (a write to stderr) with the bar on screen hidden meanwhile. [`ACTIVE`] is locked
/// only to clone the bar, never while `f` runs.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    let bar = active().clone();
    match bar {
        Some(b) => b.suspend(f),
        None => f(),
    }
}
