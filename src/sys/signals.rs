//! Clean exit on SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2: temp files being written are
//! removed and the outputs the unfinished run already committed are taken back (see [`Undo`]),
//! then the process exits 128 + signal (130 for SIGINT, 143 for SIGTERM), so an interrupted run
//! leaves neither a partial output nor a temp file behind.
//!
//! Signals are received by `signal-hook`'s iterator (its self-pipe and a thread of its own), so
//! the cleanup runs as ordinary code, not inside a signal handler, and may lock the registry.
//! The writer renames a finished temp file only while holding the same lock and after checking
//! that no signal arrived: either the rename happens entirely before the cleanup (a complete
//! output stays) or not at all.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Temp files being written and whether a termination signal arrived. One global instance
/// ([`registry`]); tests make their own so they cannot disturb writers running in parallel.
#[derive(Debug, Default)]
pub struct Registry {
    temps: Mutex<Vec<(PathBuf, Undo)>>,
    interrupted: AtomicBool,
}

static GLOBAL: Registry = Registry::new();
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// The process-wide registry the volume writer and the signal thread share.
pub fn registry() -> &'static Registry {
    &GLOBAL
}

/// Install the handler once (later calls do nothing). Returns false if the OS refused it; the
/// program then still works, only without cleanup on signals.
pub fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([
            SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
        ]) else {
            return false;
        };
        std::thread::Builder::new()
            .name("voxtile-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let removed = GLOBAL.cleanup();
                    let name = match sig {
                        SIGINT => "SIGINT",
                        SIGTERM => "SIGTERM",
                        SIGQUIT => "SIGQUIT",
                        SIGUSR1 => "SIGUSR1",
                        SIGUSR2 => "SIGUSR2",
                        _ => "SIGHUP",
                    };
                    announce(format!(
                        "interrupted by {name}{}",
                        if removed > 0 {
                            "; the unfinished output was removed"
                        } else {
                            ""
                        }
                    ));
                    // Keep the registry locked so no rename can slip in while the process exits.
                    let _hold = GLOBAL.temps();
                    std::process::exit(128 + sig);
                }
            })
            .is_ok()
    })
}

/// Emit `msg` as an error event, waiting at most a second for it: the subscriber writes to
/// stderr, which a stopped reader (a full pipe) or another thread's write may block, and the
/// process must exit on a signal regardless. Runs on the signal thread, never in a handler.
fn announce(msg: String) {
    let (done, wait) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("voxtile-signal-msg".into())
        .spawn(move || {
            tracing::error!("{msg}");
            let _ = done.send(());
        });
    if spawned.is_ok() {
        let _ = wait.recv_timeout(std::time::Duration::from_secs(1));
    }
}

impl Registry {
    /// An empty registry (a `static` needs a const constructor).
    pub const fn new() -> Registry {
        Registry {
            temps: Mutex::new(Vec::new()),
            interrupted: AtomicBool::new(false),
        }
    }

    fn temps(&self) -> MutexGuard<'_, Vec<(PathBuf, Undo)>> {
        // A writer that panicked while holding the lock leaves a usable list behind.
        self.temps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mark the run interrupted and take back every registered path (temp files removed,
    /// committed outputs undone); returns how many were taken back. The signal thread calls it
    /// on the global registry.
    pub fn cleanup(&self) -> usize {
        self.interrupted.store(true, Ordering::SeqCst);
        let mut list = self.temps();
        list.drain(..).filter(|(p, undo)| undo.run(p)).count()
    }

    /// Whether a termination signal was received (or [`Registry::cleanup`] called).
    pub fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// Register `path` as a temp file to delete on a signal. Register before creating the file,
    /// so there is no moment where it exists unregistered.
    pub fn register(&'static self, path: &Path) -> TempGuard {
        self.temps().push((path.to_path_buf(), Undo::Remove));
        TempGuard {
            reg: self,
            path: path.to_path_buf(),
        }
    }

    /// Whether `path` is registered right now.
    #[cfg(test)]
    pub fn is_registered(&self, path: &Path) -> bool {
        self.temps().iter().any(|(p, _)| p == path)
    }
}

/// A registered temp file; dropping it unregisters the path (the file itself is the writer's).
#[derive(Debug)]
pub struct TempGuard {
    reg: &'static Registry,
    path: PathBuf,
}

impl TempGuard {
    /// Run `rename` (the temp → final step) under the registry lock, unless a signal arrived
    /// first, in which case nothing is renamed and an `Interrupted` error is returned. The final
    /// path `dest` takes the temp file's place in the registry in the same locked step, with
    /// the [`Undo`] that `rename` returns: the returned guard keeps it there, so a signal before
    /// the whole run is finished takes the committed output back too.
    pub fn commit_to(
        &self,
        dest: &Path,
        rename: impl FnOnce(&Path) -> std::io::Result<Undo>,
    ) -> std::io::Result<(TempGuard, Undo)> {
        let mut list = self.reg.temps();
        if self.reg.interrupted() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted by a signal before the output was complete",
            ));
        }
        let undo = rename(&self.path)?;
        list.retain(|(p, _)| p != &self.path);
        list.push((dest.to_path_buf(), undo.clone()));
        let guard = TempGuard {
            reg: self.reg,
            path: dest.to_path_buf(),
        };
        Ok((guard, undo))
    }
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        self.reg.temps().retain(|(p, _)| p != &self.path);
    }
}

/// A file's identity: device and inode.
pub type Ident = (u64, u64);

/// The identity of the file at `path` itself (a symbolic link is not followed).
pub fn ident_of(path: &Path) -> Option<Ident> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// How a registered path is taken back when the run does not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undo {
    /// A temp file of this run (its name is unique to it): removed.
    Remove,
    /// A committed output: taken back only while the path still holds the file this run wrote
    /// (`ident`), since another run may have replaced it meanwhile; the file it replaced, kept
    /// under `backup`, is put back.
    Output {
        /// The identity of the file this run wrote.
        ident: Ident,
        /// Where the file it replaced was kept (a hard link), if it replaced one.
        backup: Option<PathBuf>,
    },
}

impl Undo {
    /// Take `path` back; true when something was removed or put back.
    pub fn run(&self, path: &Path) -> bool {
        match self {
            Undo::Remove => std::fs::remove_file(path).is_ok(),
            Undo::Output { ident, backup } => {
                let ours = ident_of(path) == Some(*ident);
                match backup {
                    Some(b) if ours => std::fs::rename(b, path).is_ok(),
                    Some(b) => {
                        // Another run replaced our output: theirs stays, the old file goes.
                        let _ = std::fs::remove_file(b);
                        false
                    }
                    None => ours && std::fs::remove_file(path).is_ok(),
                }
            }
        }
    }

    /// The run finished: the replaced file kept for an undo is not needed any more.
    pub fn finish(&self) {
        if let Undo::Output {
            backup: Some(b), ..
        } = self
        {
            let _ = std::fs::remove_file(b);
        }
    }
}

/// Test hook: `VOXTILE_TEST_PAUSE_BEFORE_RENAME=<ms>` sleeps that long after the temp file is
/// complete and before it is renamed, so tests can deliver a signal during the write phase
/// deterministically. Unset (always, outside tests): no pause.
pub(crate) fn test_pause_before_rename() {
    if let Some(ms) = std::env::var_os("VOXTILE_TEST_PAUSE_BEFORE_RENAME")
        .and_then(|v| v.to_str().and_then(|s| s.parse::<u64>().ok()))
    {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(60_000)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_commit_cleanup() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join(".a.tmp");
        let b = dir.path().join(".b.tmp");
        std::fs::write(&a, b"a").unwrap();
        {
            let g = reg.register(&a);
            assert!(reg.is_registered(&a));
            let fin = dir.path().join("a.nii");
            let (kept, _) = g
                .commit_to(&fin, |p| std::fs::rename(p, &fin).map(|_| Undo::Remove))
                .unwrap();
            assert!(!reg.is_registered(&a));
            assert!(
                reg.is_registered(&fin),
                "the committed output stays registered"
            );
            drop(kept);
            assert!(!reg.is_registered(&fin));
        }
        assert!(dir.path().join("a.nii").exists());
        let g = reg.register(&b);
        {
            let _c = reg.register(&dir.path().join(".c.tmp")); // dropped: unregistered, never created
        }
        assert!(!reg.is_registered(&dir.path().join(".c.tmp")));
        std::fs::write(&b, b"b").unwrap();
        assert_eq!(reg.cleanup(), 1);
        assert!(!b.exists() && reg.interrupted());
        assert!(
            !registry().interrupted(),
            "the global registry is untouched"
        );
        let e = g
            .commit_to(&dir.path().join("b.nii"), |p| {
                std::fs::rename(p, dir.path().join("b.nii")).map(|_| Undo::Remove)
            })
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted);
        assert!(!dir.path().join("b.nii").exists());
    }
}
