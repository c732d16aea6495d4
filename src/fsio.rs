//! Opening the files a run reads: regular files only, never through a FIFO or a device, and
//! never more bytes than a cap, so a hostile path (`--manifest /dev/zero`, a FIFO planted as a
//! model's external data) is one error line instead of a hang or an exhausted machine.

use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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
            crate::plan::format_bytes(cap)
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

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, cap: u64) -> Result<String> {
    String::from_utf8(read_regular(path, cap)?)
        .map_err(|_| Error::Invalid(format!("{}: is not UTF-8 text", path.display())))
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
}
