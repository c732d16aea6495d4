//! Stopping a run from another thread (a GUI's Cancel button, a server's timeout).

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A flag shared by every clone: [`CancelToken::cancel`] on any clone stops the runs that hold
/// another. The engine checks it before each batch of windows (the CPU backend; the CUDA backend
/// streams a volume's windows as one pass and checks before and after it) and between the
/// passes of a pipeline; a cancelled run returns [`Error::Cancelled`] and none of its outputs.
///
/// # Examples
///
/// ```no_run
/// use voxtile::{CancelToken, Error, Pipeline};
///
/// let mut pipeline = Pipeline::from_model("net.onnx")?;
/// let token: CancelToken = pipeline.cancel_token();
/// std::thread::spawn(move || {
///     std::thread::sleep(std::time::Duration::from_secs(5));
///     token.cancel();
/// });
/// let volume = voxtile::volume::read("ct.nii.gz")?;
/// match pipeline.run(&volume, &mut |_, _| {}) {
///     Err(Error::Cancelled) => println!("stopped after 5 s"),
///     other => println!("finished: {}", other.is_ok()),
/// }
/// # Ok::<(), voxtile::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not cancelled yet.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }
    /// Ask every run holding this token (or a clone) to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    /// Clear the flag: a caller that reuses its engines after a cancelled run (the Python
    /// package's `Model`) starts the next one afresh.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    /// [`Error::Cancelled`] once cancelled: `token.check()?` between units of work.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }
}
