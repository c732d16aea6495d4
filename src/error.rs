//! One error type for the library; every variant prints as one sentence that names the file or node.
//!
//! The cases a caller may want to handle (wrong channel count, a memory budget too small, a model
//! with operators voxtile lacks, a cancelled run) are typed variants with their numbers; the rest
//! carry their sentence.

use std::fmt;
use std::path::{Path, PathBuf};

/// Errors of the whole library. Panics are bugs; everything a user can cause lands here.
///
/// # Examples
///
/// Tell a wrong input apart from the rest:
///
/// ```no_run
/// use voxtile::{Error, Pipeline};
///
/// let mut pipeline = Pipeline::from_model("net.onnx")?;
/// let volume = voxtile::volume::read("t1_and_flair.nii.gz")?;
/// match pipeline.run(&volume, &mut |_, _| {}) {
///     Ok(out) => println!("{} labelled voxels", out.labels.iter().filter(|&&l| l > 0).count()),
///     Err(Error::ChannelMismatch { expected, got, .. }) => {
///         eprintln!("the model takes {expected} channel(s), this file has {got}")
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), voxtile::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// An ONNX file (or its manifest) is malformed, or a node uses an attribute voxtile does not
    /// support.
    #[error("{}: {msg}", path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A model's nodes use operators voxtile does not implement: every such node, not only the
    /// first, so that one look tells whether a model can run.
    #[error("{}: {}", path.display(), describe_ops(ops))]
    UnsupportedOps {
        /// The model file.
        path: PathBuf,
        /// The nodes, in graph order.
        ops: Vec<UnsupportedOp>,
    },
    /// The volume's channels are not the ones the model takes.
    #[error(
        "{}the volume has {got} channel(s) but {} expects {expected}",
        file_prefix(input),
        model_name(model)
    )]
    ChannelMismatch {
        /// Input channels of the model.
        expected: usize,
        /// Channels of the volume.
        got: usize,
        /// The volume's file, when it came from one.
        input: Option<PathBuf>,
        /// The model's file, when it came from one.
        model: Option<PathBuf>,
    },
    /// The memory budget is below what one batch at the kept window needs (the window is never
    /// shrunk: that would change the result).
    #[error("{}the memory budget {}{} is too small for the window {roi:?}: batch {batch} needs {} ({}); raise --memory-budget, or lower --batch or --roi",
        file_prefix(model), crate::plan::format_bytes(*budget), source_suffix(budget_source),
        crate::plan::format_bytes(*needed), if *device { "device memory" } else { "host working set" })]
    BudgetTooSmall {
        /// Bytes the run needs at `roi` and `batch`.
        needed: u64,
        /// Bytes it may use.
        budget: u64,
        /// The window (network axes).
        roi: [usize; 3],
        /// Windows per backend call.
        batch: usize,
        /// Device memory (CUDA) rather than the host working set.
        device: bool,
        /// Where a default budget came from (RAM, cgroup, Slurm...); None when the caller set it.
        budget_source: Option<String>,
        /// The model's file, when it came from one.
        model: Option<PathBuf>,
    },
    /// The run was cancelled through its [`crate::CancelToken`]; nothing was returned or written.
    #[error("cancelled")]
    Cancelled,
    /// A graph-level problem found after loading (shape mismatch, bad window size...).
    #[error("{0}")]
    Graph(String),
    /// Inputs that do not fit together (roi, overlap, settings...).
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

/// One node whose operator voxtile does not implement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The operator (`Einsum`), prefixed with its domain when not the default one
    /// (`com.microsoft.FusedConv`).
    pub op: String,
    /// The node's name (or `Op#index` when it has none).
    pub node: String,
    /// Why it cannot be imported (the operator is unknown, or this use of it is not supported).
    pub why: String,
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `path: ` or nothing.
fn file_prefix(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| format!("{}: ", p.display()))
        .unwrap_or_default()
}

/// The model's file name, or "the model".
fn model_name(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the model".into())
}

/// ` (default budget: SOURCE)` or nothing.
fn source_suffix(s: &Option<String>) -> String {
    s.as_ref()
        .map(|s| format!(" (default budget: {s})"))
        .unwrap_or_default()
}

/// One node: the sentence voxtile always printed; several: a count per operator, then every node
/// (one line, like every error; `voxtile inspect` prints them one per line).
fn describe_ops(ops: &[UnsupportedOp]) -> String {
    let one = |o: &UnsupportedOp| format!("node \"{}\" ({}): {}", o.node, o.op, o.why);
    if let [o] = ops {
        return one(o);
    }
    let mut kinds: Vec<(&str, usize)> = vec![];
    for o in ops {
        match kinds.iter_mut().find(|(k, _)| *k == o.op) {
            Some((_, n)) => *n += 1,
            None => kinds.push((&o.op, 1)),
        }
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
    let lines: Vec<String> = ops.iter().map(one).collect();
    format!(
        "{} constructs voxtile does not support ({}): {}",
        ops.len(),
        kinds.join(", "),
        lines.join("; ")
    )
}

impl fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node \"{}\" ({})", self.node, self.op)
    }
}

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
    /// Name the model file in the typed errors that leave it open (a graph loaded from a file
    /// knows it; the planner and the channel check do not).
    pub fn with_model(mut self, path: &Path) -> Self {
        match &mut self {
            Error::ChannelMismatch { model, .. } | Error::BudgetTooSmall { model, .. } => {
                model.get_or_insert_with(|| path.to_path_buf());
            }
            _ => {}
        }
        self
    }
    /// Whether the run was cancelled (a caller that cancelled may treat it as no error).
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled)
    }
}
