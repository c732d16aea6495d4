//! Every output file is first *staged*: written in full to a temp file beside its destination,
//! then *committed* by a rename. A run stages all its outputs and commits them together at the end
//! ([`Outputs`]), so it leaves all of them or none.
//!
//! The temp file cannot be hijacked: its name carries the pid and 64 random bits, and it is
//! opened create-new and no-follow, so a file or symbolic link planted at that name makes the
//! open fail instead of being written through. Without `replace`, the commit never replaces a
//! file that appeared meanwhile (`renameat2(RENAME_NOREPLACE)`, or link + unlink where the
//! filesystem lacks it); with it, the file replaced is kept (a hard link) until the run is done.
//! Temp files and committed outputs of an unfinished run are registered with the crate's signal
//! handler (`signals`), which takes them back on a termination signal. A run only ever takes
//! back what it wrote itself: a committed output is removed (or the file it replaced put back)
//! only while its path still holds the file this run wrote, never by path alone.
//!
//! Stale temp files are removed when a new one is staged in the same folder, but only those
//! known abandoned: a writer holds an exclusive `flock` on its temp file from creation to commit,
//! so a temp file whose lock can be taken belongs to a process that has ended — whatever host
//! (NFS) or PID namespace (containers) it ran in, where a pid says nothing. A temp file younger
//! than [`STALE_AGE`] is spared too (its writer may be between the create and the lock).

use crate::sys::signals::{registry, Ident, TempGuard, Undo};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What sits between a temp file's name and its pid: `.<name>.voxtile-tmp-<pid>-<16 hex>`.
const TMP_TAG: &str = ".voxtile-tmp-";
/// What names the file a commit replaced while the run is not done:
/// `.<name>.voxtile-old-<pid>-<16 hex>`. Not a temp name, so no stale-temp cleanup removes it.
const OLD_TAG: &str = ".voxtile-old-";
/// A temp file this young is never taken for abandoned.
pub const STALE_AGE: Duration = Duration::from_secs(60);

/// A complete output in its temp file, not yet under its final name. Dropped uncommitted, the
/// temp file is removed.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    guard: Option<TempGuard>,
    /// The temp file, open and locked until the commit is done.
    file: Option<File>,
}

/// A committed output of a run that is not finished yet: taken back on a signal (it is
/// registered) and by [`Outputs`] when a later commit fails.
#[derive(Debug)]
struct Committed {
    path: PathBuf,
    undo: Undo,
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

/// A name of ours beside `dest`: `.<name><tag><pid>-<16 hex>`.
fn own_name(dest: &Path, tag: &str) -> Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| {
        Error::Invalid(format!("{}: output path has no file name", dest.display()))
    })?;
    Ok(parent_dir(dest).join(format!(
        ".{}{tag}{}-{:016x}",
        name.to_string_lossy(),
        std::process::id(),
        random_u64()
    )))
}

fn temp_name(dest: &Path) -> Result<PathBuf> {
    own_name(dest, TMP_TAG)
}

/// The pid in a temp file name of ours, if `name` is one.
fn temp_pid(name: &str) -> Option<u32> {
    let rest = &name[name.rfind(TMP_TAG)? + TMP_TAG.len()..];
    let (pid, rand) = rest.split_once('-')?;
    (name.starts_with('.') && rand.len() == 16 && rand.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Take `file`'s exclusive lock; `wait` = false gives up at once when another holds it.
fn lock(file: &File, wait: bool) -> bool {
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on a descriptor owned by `file`, which outlives the call.
    unsafe { libc::flock(file.as_raw_fd(), op) == 0 }
}

/// Remove the temp file at `path` if it is abandoned: a regular file, older than
/// [`STALE_AGE`], whose writer's lock is gone (taken here, so no writer can be mid-way).
fn remove_if_abandoned(path: &Path) {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    else {
        return;
    };
    let old = f.metadata().is_ok_and(|m| {
        m.is_file()
            && m.modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_AGE)
    });
    if old && lock(&f, false) {
        let _ = std::fs::remove_file(path);
    }
}

/// Remove temp files in `dir` left by voxtile processes that have ended (best effort).
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if temp_pid(&e.file_name().to_string_lossy()).is_some() {
            remove_if_abandoned(&e.path());
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
    let mut staged = Staged {
        tmp,
        dest: dest.to_path_buf(),
        guard: Some(guard),
        file: None,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&staged.tmp)
        .map_err(|e| Error::io(dest, e))?;
    // Held until the commit: the mark of a live writer that other runs' cleanup respects. A
    // filesystem without locks refuses it for everyone, so nobody takes this file for stale.
    lock(&file, true);
    let file = staged.file.insert(file);
    body(file)
        .and_then(|_| file.sync_all())
        .map_err(|e| Error::io(dest, e))?;
    crate::sys::signals::test_pause_before_rename();
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
        let file = self.file.take().expect("a staged file is open");
        let ident = file
            .metadata()
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
            .map_err(|e| Error::io(&dest, e))?;
        let (kept, undo) = guard
            .commit_to(&dest, |tmp| place(tmp, &dest, replace, ident))
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
        drop(file);
        // Make the rename itself durable (best effort: not every filesystem allows it).
        if let Ok(d) = File::open(parent_dir(&dest)) {
            let _ = d.sync_all();
        }
        Ok(Committed {
            path: dest,
            undo,
            _guard: kept,
        })
    }

    /// Rename to the final name now (replacing an existing file only if `replace`).
    pub fn commit(self, replace: bool) -> Result<()> {
        self.commit_registered(replace).map(|c| c.undo.finish())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.guard.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Put the temp file `tmp` (identity `ident`) at `dest`, and say how to take it back. Without
/// `replace` an existing `dest` fails (AlreadyExists); with it, the file replaced is first kept
/// as a hard link under an `OLD_TAG` name, for an undo to put back.
fn place(tmp: &Path, dest: &Path, replace: bool, ident: Ident) -> io::Result<Undo> {
    let placed = |backup| Undo::Output { ident, backup };
    if !replace {
        return rename_noreplace(tmp, dest).map(|_| placed(None));
    }
    let backup = own_name(dest, OLD_TAG).map_err(|e| io::Error::other(e.to_string()))?;
    match std::fs::hard_link(dest, &backup) {
        Ok(()) => match std::fs::rename(tmp, dest) {
            Ok(()) => Ok(placed(Some(backup))),
            Err(e) => {
                let _ = std::fs::remove_file(&backup);
                Err(e)
            }
        },
        // Nothing to replace (or it appeared just now, and --force says replace it).
        Err(e) if e.kind() == io::ErrorKind::NotFound => match rename_noreplace(tmp, dest) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                std::fs::rename(tmp, dest).map(|_| placed(None))
            }
            r => r.map(|_| placed(None)),
        },
        // No hard links on this filesystem: replaced without a way back.
        Err(_) => std::fs::rename(tmp, dest).map(|_| placed(None)),
    }
}

/// `tmp` → `dest`, atomically refusing an existing `dest` (AlreadyExists).
fn rename_noreplace(tmp: &Path, dest: &Path) -> io::Result<()> {
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

    /// Commit everything; on the first failure take back the commits made so far (each only
    /// while its path still holds what this run wrote, the file it replaced put back).
    pub fn commit(mut self) -> Result<Vec<PathBuf>> {
        let mut done: Vec<Committed> = Vec::new();
        for (s, replace) in std::mem::take(&mut self.staged) {
            match s.commit_registered(replace) {
                Ok(c) => done.push(c),
                Err(e) => {
                    for c in done.iter().rev() {
                        c.undo.run(&c.path);
                    }
                    return Err(e);
                }
            }
        }
        self.made_dirs.clear();
        done.iter().for_each(|c| c.undo.finish());
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

    /// A temp file named like ours, last modified `age` ago.
    fn planted_temp(dir: &Path, pid: u32, age: Duration) -> PathBuf {
        let p = dir.join(format!(".x.nii.voxtile-tmp-{pid}-0123456789abcdef"));
        let f = File::create(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() - age).unwrap();
        p
    }

    #[test]
    fn failed_commit_undoes_the_others_and_stale_temps_go() {
        let dir = tempfile::tempdir().unwrap();
        // An abandoned temp file: nobody holds its lock, and it is old enough.
        let stale = planted_temp(dir.path(), 99999999, STALE_AGE * 2);
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

    #[test]
    fn a_temp_whose_writer_holds_its_lock_is_never_removed() {
        // Defect 5 of the second trust round: the pid in the name says nothing about a writer on
        // another host or in another PID namespace (here a pid no process has on this host), so
        // only the writer's lock counts.
        let dir = tempfile::tempdir().unwrap();
        let live = planted_temp(dir.path(), 99999999, STALE_AGE * 2);
        let writer = File::open(&live).unwrap();
        assert!(lock(&writer, false));
        remove_stale_temps(dir.path());
        assert!(live.exists(), "a locked temp file is a live writer's");
        drop(writer);
        let young = planted_temp(dir.path(), 99999998, Duration::ZERO);
        remove_stale_temps(dir.path());
        assert!(!live.exists(), "its writer is gone: removed");
        assert!(young.exists(), "too young to tell: spared");
        // A staged file holds its lock until it is committed.
        let out = dir.path().join("o.nii");
        let s = stage_bytes(&out, b"o").unwrap();
        let probe = File::open(&s.tmp).unwrap();
        assert!(
            !lock(&probe, false),
            "the writer's lock is held while staged"
        );
        s.commit(false).unwrap();
        assert!(lock(&probe, false), "released once committed");
    }

    #[test]
    fn an_undo_takes_back_only_what_this_run_wrote() {
        // Defect 2 of the second trust round: a failed commit undid the outputs by path, which
        // by then could be another run's files.
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.nii"), dir.path().join("b.nii"));
        // Ours at a, then another run puts its own a in place.
        let c = stage_bytes(&a, b"ours")
            .unwrap()
            .commit_registered(false)
            .unwrap();
        stage_bytes(&a, b"theirs").unwrap().commit(true).unwrap();
        assert!(!c.undo.run(&a));
        assert_eq!(std::fs::read(&a).unwrap(), b"theirs");
        // Replacing (--force) keeps the old file until the run is done; an undo puts it back.
        std::fs::write(&b, b"before").unwrap();
        let c = stage_bytes(&b, b"new")
            .unwrap()
            .commit_registered(true)
            .unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"new");
        assert!(c.undo.run(&b));
        assert_eq!(std::fs::read(&b).unwrap(), b"before");
        // Done: no file of ours is left beside the outputs.
        let c = stage_bytes(&b, b"new")
            .unwrap()
            .commit_registered(true)
            .unwrap();
        c.undo.finish();
        drop(c);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(std::fs::read(&b).unwrap(), b"new");
    }
}
