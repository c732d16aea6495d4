//! One error type for the library; every variant prints as one sentence that names the file or node.

use std::path::PathBuf;

/// Errors of the whole library. Panics are bugs; everything a user can cause lands here.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed at the OS level.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A NIfTI (or npy) file is malformed, truncated or unsupported.
    #[error("{}: {msg}", path.display())]
    Volume {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// An ONNX file is malformed, or a node uses an op/attribute voxtile does not support.
    #[error("{}: {msg}", path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A graph-level problem found after loading (shape mismatch, bad window size...).
    #[error("{0}")]
    Graph(String),
    /// Inputs that do not fit together (channels, roi, overlap...).
    #[error("{0}")]
    Invalid(String),
    /// A backend failed (CUDA driver, NVRTC, allocation).
    #[error("{0}")]
    Backend(String),
    /// Device (or host, for the CPU backend) memory ran out: the engine may retry with a smaller
    /// batch.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An OS-level failure on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    /// A malformed or unsupported volume file.
    pub fn volume(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Volume {
            path: path.into(),
            msg: msg.into(),
        }
    }
    /// A malformed or unsupported model file.
    pub fn model(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Model {
            path: path.into(),
            msg: msg.into(),
        }
    }
}
