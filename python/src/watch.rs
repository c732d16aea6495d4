//! A run with the GIL released: the work goes on its own thread while the caller's thread wakes
//! every 100 ms to hand progress to the Python callback and to look for signals. Ctrl-C (or an
//! exception raised by the callback) cancels the run through the library's token; the run then
//! stops at its next check and that exception is raised instead of its result.

use pyo3::prelude::*;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;
use voxtile::{CancelToken, Error};

/// How often the waiting thread looks at progress and signals.
const TICK: Duration = Duration::from_millis(100);

/// Run `work` (given a progress sink) under `cancel`, without the GIL; `progress(done, total)`
/// is called with the GIL on the calling thread.
pub fn watched<T: Send>(
    py: Python<'_>,
    cancel: &CancelToken,
    progress: Option<&Py<PyAny>>,
    work: impl FnOnce(&mut dyn FnMut(usize, usize)) -> Result<T, Error> + Send,
) -> PyResult<T> {
    let progress = progress.map(|p| p.clone_ref(py));
    let (result, raised) = py.detach(move || {
        let (tx, rx) = channel::<(usize, usize)>();
        std::thread::scope(|s| {
            let worker = s.spawn(move || {
                work(&mut |done, total| {
                    // The waiting thread gone only means nobody reads progress any more.
                    let _ = tx.send((done, total));
                })
            });
            let mut raised: Option<PyErr> = None;
            loop {
                let mut latest = None;
                let finished = match rx.recv_timeout(TICK) {
                    Ok(p) => {
                        latest = Some(p);
                        // Only the newest count matters.
                        latest = rx.try_iter().last().or(latest);
                        false
                    }
                    Err(RecvTimeoutError::Timeout) => false,
                    Err(RecvTimeoutError::Disconnected) => true,
                };
                if raised.is_none() {
                    raised = Python::attach(|py| {
                        let called = match (&progress, latest) {
                            (Some(cb), Some((d, t))) => cb.call1(py, (d, t)).map(drop),
                            _ => Ok(()),
                        };
                        called.and_then(|_| py.check_signals()).err()
                    });
                    if raised.is_some() {
                        cancel.cancel();
                    }
                }
                if finished {
                    break;
                }
            }
            let result = worker.join().unwrap_or_else(|_| {
                Err(Error::Backend(
                    "the run stopped on an internal error".into(),
                ))
            });
            (result, raised)
        })
    });
    match (raised, result) {
        // What stopped the run is what the caller sees; a run that finished first still wins
        // only when nothing was raised.
        (Some(e), _) => Err(e),
        (None, r) => r.map_err(crate::errors::to_py),
    }
}
