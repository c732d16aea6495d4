//! Opening the files a run reads: regular files only, never through a FIFO or a device, and
//! never more bytes than a cap, so a hostile path (`--manifest /dev/zero`, a FIFO planted as a
//! model's external data) is one error line instead of a hang or an exhausted machine.

use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Largest model file (`.onnx`) read into memory.
pub const MODEL_CAP: u64 = 4 << 30;
/// Largest manifest (`.toml`/`.json`) read.
pub const MANIFEST_CAP: u64 = 1 << 20;

/// Open `path` for reading if it is a regular file of at most `cap` bytes. `follow` = false also
/// refuses a symbolic link as the last component (O_NOFOLLOW). Opened without blocking, so a
/// FIFO is refused rather than waited on.
pub fn open_regular(path: &Path, cap: u64, follow: bool) -> Result<(File, u64)> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if !follow && e.raw_os_error() == Some(libc::ELOOP) {
                Error::Invalid(format!(
                    "{}: is a symbolic link; refusing to follow it",
                    path.display()
                ))
            } else {
                Error::io(path, e)
            }
        })?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{}: is a directory, not a file",
            path.display()
        )));
    }
    if !meta.is_file() {
        return Err(Error::Invalid(format!(
            "{}: is not a regular file (a FIFO, socket or device)",
            path.display()
        )));
    }
    if meta.len() > cap {
        return Err(Error::Invalid(format!(
            "{}: {} bytes is more than the {} this file may have",
            path.display(),
            meta.len(),
            crate::sys::memory::format_bytes(cap)
        )));
    }
    clear_nonblock(&file);
    Ok((file, meta.len()))
}

/// Back to blocking reads once the file is known to be regular (O_NONBLOCK only served the open).
fn clear_nonblock(file: &File) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns; failure leaves it as it was,
    // which is harmless for a regular file.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// The whole content of a regular file of at most `cap` bytes (symbolic links followed).
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path, cap, true)?;
    read_opened(file, len, cap, path)
}

/// The rest of `file` (`len` bytes by its metadata, at most `cap`), read fallibly.
fn read_opened(file: File, len: u64, cap: u64, path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len as usize).map_err(|_| {
        Error::Invalid(format!(
            "{}: not enough memory to read its {len} bytes",
            path.display()
        ))
    })?;
    // `take` guards against a file that grows while it is read.
    file.take(cap)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    Ok(buf)
}

/// The whole content of `dir/rel` as UTF-8 text, opened by [`open_contained`] (a manifest
/// beside a model).
pub fn read_contained_text(dir: &Path, rel: &Path, whose: &str, cap: u64) -> Result<String> {
    let path = dir.join(rel);
    let (file, len) = open_contained(dir, rel, whose, cap)?;
    String::from_utf8(read_opened(file, len, cap, &path)?)
        .map_err(|_| Error::Invalid(format!("{}: is not UTF-8 text", path.display())))
}

/// `dir/rel` with every symbolic link resolved, if it stays inside `dir` (itself resolved);
/// otherwise why not (`whose` names the folder in the message: "model's", "header's"). A link
/// beside a model or a header must not make weights or voxels out of `/etc/passwd`.
pub fn contained(dir: &Path, rel: &Path, whose: &str) -> std::result::Result<PathBuf, String> {
    let root = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve the {whose} folder {}: {e}", dir.display()))?;
    let joined = dir.join(rel);
    let real = joined
        .canonicalize()
        .map_err(|e| format!("cannot open {}: {e}", joined.display()))?;
    if !real.starts_with(&root) {
        return Err(format!(
            "{} resolves to {}, outside the {whose} folder {}",
            joined.display(),
            real.display(),
            root.display()
        ));
    }
    Ok(real)
}

/// [`open_regular`] of `dir/rel` once [`contained`] says it stays inside `dir`: the resolved
/// path is opened no-follow, so a link swapped in after the check is refused too.
pub fn open_contained(dir: &Path, rel: &Path, whose: &str, cap: u64) -> Result<(File, u64)> {
    let real = contained(dir, rel, whose).map_err(Error::Invalid)?;
    open_regular(&real, cap, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_fifos_dirs_and_oversize() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_regular(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let fifo = dir.path().join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a fresh path in a temp dir.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&fifo, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = read_regular(dir.path(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let f = dir.path().join("big");
        std::fs::write(&f, [0u8; 100]).unwrap();
        assert_eq!(read_regular(&f, 100).unwrap().len(), 100);
        assert!(read_regular(&f, 99).is_err());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(open_regular(&link, 100, true).is_ok());
        let e = open_regular(&link, 100, false).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    #[test]
    fn contained_refuses_links_out_of_the_folder() {
        let top = tempfile::tempdir().unwrap();
        let (inner, outside) = (top.path().join("in"), top.path().join("secret"));
        std::fs::create_dir(&inner).unwrap();
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::write(inner.join("data.raw"), b"voxels").unwrap();
        std::os::unix::fs::symlink("../secret", inner.join("out.raw")).unwrap();
        std::os::unix::fs::symlink("data.raw", inner.join("alias.raw")).unwrap();
        let e = open_contained(&inner, Path::new("out.raw"), "header's", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("outside the header's folder"), "{e}");
        assert!(
            !e.to_string().contains("secret\n"),
            "no content echoed: {e}"
        );
        for ok in ["data.raw", "alias.raw"] {
            let (_, len) = open_contained(&inner, Path::new(ok), "header's", 1 << 20).unwrap();
            assert_eq!(len, 6);
        }
    }
}
