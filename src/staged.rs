//! Every output file is first *staged*: written in full to a temp file beside its destination,
//! then *committed* by a rename. A run stages all its outputs and commits them together at the end
//! ([`Outputs`]), so it leaves all of them or none.
//!
//! The temp file cannot be hijacked: its name carries the pid and 64 random bits, and it is
//! opened create-new and no-follow, so a file or symbolic link planted at that name makes the
//! open fail instead of being written through. Without `replace`, the commit never replaces a
//! file that appeared meanwhile (`renameat2(RENAME_NOREPLACE)`, or link + unlink where the
//! filesystem lacks it). Temp files and committed outputs of an unfinished run are registered
//! with the crate's signal handler (`signals`), which removes them on a termination signal. Stale temp files of
//! processes that no longer exist are removed when a new one is staged in the same folder.

use crate::signals::{registry, TempGuard};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What sits between a temp file's name and its pid: `.<name>.voxtile-tmp-<pid>-<16 hex>`.
const TMP_TAG: &str = ".voxtile-tmp-";

/// A complete output in its temp file, not yet under its final name. Dropped uncommitted, the
/// temp file is removed.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    guard: Option<TempGuard>,
}

/// A committed output of a run that is not finished yet: removed on a signal (it is registered)
/// and by [`Outputs`] when a later commit fails.
#[derive(Debug)]
struct Committed {
    path: PathBuf,
    _guard: TempGuard,
}

/// The folder a path's file lives in (`.` for a bare name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// 64 bits nobody can predict: std's per-process random SipHash keys over a counter and the time.
fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn temp_name(dest: &Path) -> Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| {
        Error::Invalid(format!("{}: output path has no file name", dest.display()))
    })?;
    Ok(parent_dir(dest).join(format!(
        ".{}{TMP_TAG}{}-{:016x}",
        name.to_string_lossy(),
        std::process::id(),
        random_u64()
    )))
}

/// The pid in a temp file name of ours, if `name` is one.
fn temp_pid(name: &str) -> Option<u32> {
    let rest = &name[name.rfind(TMP_TAG)? + TMP_TAG.len()..];
    let (pid, rand) = rest.split_once('-')?;
    (name.starts_with('.') && rand.len() == 16 && rand.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Remove temp files in `dir` left by voxtile processes that no longer run (best effort).
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(pid) = temp_pid(&name) {
            if pid != std::process::id() && !process_alive(pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Write `dest`'s content through `body` into a fresh temp file beside it and fsync it.
pub fn stage<F>(dest: &Path, body: F) -> Result<Staged>
where
    F: FnOnce(&mut File) -> io::Result<()>,
{
    remove_stale_temps(&parent_dir(dest));
    let tmp = temp_name(dest)?;
    // Registered before it exists: a termination signal from here on removes it.
    let guard = registry().register(&tmp);
    let staged = Staged {
        tmp,
        dest: dest.to_path_buf(),
        guard: Some(guard),
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&staged.tmp)
        .map_err(|e| Error::io(dest, e))?;
    body(&mut file)
        .and_then(|_| file.sync_all())
        .map_err(|e| Error::io(dest, e))?;
    crate::signals::test_pause_before_rename();
    Ok(staged)
}

/// [`stage`] of bytes already in memory.
pub fn stage_bytes(dest: &Path, bytes: &[u8]) -> Result<Staged> {
    stage(dest, |f| f.write_all(bytes))
}

impl Staged {
    /// The final path.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Rename to the final name (replacing an existing file only if `replace`); the final file
    /// stays registered for signal cleanup while the returned guard lives.
    fn commit_registered(mut self, replace: bool) -> Result<Committed> {
        let guard = self.guard.take().expect("a staged file has its guard");
        let dest = self.dest.clone();
        let kept = guard
            .commit_to(&dest, |tmp| rename(tmp, &dest, replace))
            .map_err(|e| {
                let _ = std::fs::remove_file(&self.tmp);
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Error::Invalid(format!(
                        "{}: appeared while this run was writing it; not replaced (use --force to overwrite)",
                        dest.display()
                    ))
                } else {
                    Error::io(&dest, e)
                }
            })?;
        // Make the rename itself durable (best effort: not every filesystem allows it).
        if let Ok(d) = File::open(parent_dir(&dest)) {
            let _ = d.sync_all();
        }
        Ok(Committed {
            path: dest,
            _guard: kept,
        })
    }

    /// Rename to the final name now (replacing an existing file only if `replace`).
    pub fn commit(self, replace: bool) -> Result<()> {
        self.commit_registered(replace).map(drop)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.guard.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `tmp` → `dest`; without `replace`, atomically refuses an existing `dest` (AlreadyExists).
fn rename(tmp: &Path, dest: &Path, replace: bool) -> io::Result<()> {
    if replace {
        return std::fs::rename(tmp, dest);
    }
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
    };
    let (from, to) = (c(tmp)?, c(dest)?);
    const RENAME_NOREPLACE: libc::c_uint = 1;
    // SAFETY: two valid NUL-terminated paths; renameat2 reads them and nothing else.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The filesystem (or kernel) has no RENAME_NOREPLACE: a hard link fails on an
        // existing name just as atomically.
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {
            std::fs::hard_link(tmp, dest)?;
            std::fs::remove_file(tmp)
        }
        _ => Err(e),
    }
}

/// The outputs of one run: staged one by one, committed together in the order they were added
/// (the label map last, since its presence marks a batch file as done). If a commit fails, the
/// outputs already committed are removed again, so the run leaves all its outputs or none.
#[derive(Debug, Default)]
pub struct Outputs {
    /// Each staged output and whether it may replace an existing file.
    staged: Vec<(Staged, bool)>,
    /// Folders this run created for its outputs (removed again when empty on failure).
    made_dirs: Vec<PathBuf>,
}

impl Outputs {
    /// An empty set.
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Add a staged output (committed after those added before it); `replace`: it may replace
    /// an existing file (`--force`), else a file that appeared meanwhile fails the commit.
    pub fn push(&mut self, s: Staged, replace: bool) {
        self.staged.push((s, replace));
    }

    /// Create `dir` (and record it) when it does not exist yet, so files can be staged in it.
    pub fn make_dir(&mut self, dir: &Path) -> Result<()> {
        if !dir.is_dir() {
            std::fs::create_dir(dir).map_err(|e| Error::io(dir, e))?;
            self.made_dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    /// Commit everything; on the first failure undo the commits made so far.
    pub fn commit(mut self) -> Result<Vec<PathBuf>> {
        let mut done: Vec<Committed> = Vec::new();
        for (s, replace) in std::mem::take(&mut self.staged) {
            match s.commit_registered(replace) {
                Ok(c) => done.push(c),
                Err(e) => {
                    for c in &done {
                        let _ = std::fs::remove_file(&c.path);
                    }
                    return Err(e);
                }
            }
        }
        self.made_dirs.clear();
        Ok(done.into_iter().map(|c| c.path).collect())
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        // Uncommitted: the staged temp files remove themselves; then the folders we made.
        self.staged.clear();
        for d in self.made_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_ours_and_unpredictable() {
        let a = temp_name(Path::new("d/o.nii.gz")).unwrap();
        let b = temp_name(Path::new("d/o.nii.gz")).unwrap();
        assert_ne!(a, b);
        let n = a.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_pid(n), Some(std::process::id()));
        assert_eq!(
            temp_pid(".o.nii.gz.voxtile-tmp-123"),
            None,
            "the old form is not ours"
        );
        assert_eq!(temp_pid("o.nii.gz"), None);
    }

    #[test]
    fn commit_without_replace_keeps_a_file_that_appeared() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.nii");
        let s = stage_bytes(&out, b"new").unwrap();
        std::fs::write(&out, b"theirs").unwrap();
        let e = s.commit(false).unwrap_err();
        assert!(e.to_string().contains("appeared"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"theirs");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp removed"
        );
        stage_bytes(&out, b"new").unwrap().commit(true).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
    }

    #[test]
    fn planted_temp_symlink_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        // Every name of the old scheme, and a guess of the new one, planted as links.
        let out = dir.path().join("o.nii");
        std::os::unix::fs::symlink(
            &victim,
            dir.path()
                .join(format!(".o.nii.voxtile-tmp-{}", std::process::id())),
        )
        .unwrap();
        stage_bytes(&out, b"labels").unwrap().commit(false).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
    }

    #[test]
    fn failed_commit_undoes_the_others_and_stale_temps_go() {
        let dir = tempfile::tempdir().unwrap();
        // A temp file of a process that cannot exist (pid above the kernel's maximum).
        let stale = dir
            .path()
            .join(".x.nii.voxtile-tmp-99999999-0123456789abcdef");
        std::fs::write(&stale, b"").unwrap();
        let (a, b) = (dir.path().join("a.nii"), dir.path().join("b.nii"));
        let mut outs = Outputs::new();
        outs.push(stage_bytes(&a, b"a").unwrap(), false);
        assert!(!stale.exists(), "stale temp removed when staging");
        outs.push(stage_bytes(&b, b"b").unwrap(), false);
        std::fs::write(&b, b"theirs").unwrap();
        assert!(outs.commit().is_err());
        assert!(!a.exists(), "a was committed, then undone");
        assert_eq!(std::fs::read(&b).unwrap(), b"theirs");
        let mut outs = Outputs::new();
        let sub = dir.path().join("masks");
        outs.make_dir(&sub).unwrap();
        outs.push(stage_bytes(&sub.join("m.nii"), b"m").unwrap(), false);
        drop(outs);
        assert!(!sub.exists(), "uncommitted: the folder made for it is gone");
    }
}
