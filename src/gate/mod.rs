//! The output-safety gate: every path a run will write is claimed here before the first window
//! runs, and refused when writing it could destroy something or would fail late.
//!
//! A claimed path is never a file the run reads (compared by device + inode and by canonical
//! path, so `./x`, `../d/x`, hard links and symbolic links are caught): an input volume, the
//! detached data file its header names, any file of an input DICOM folder, a model, a manifest.
//! It is never another output of the same run, never an existing file without `--force`, never
//! a directory; its folder exists or is one the run creates (claimed before it); its extension
//! matches what is written (`-o seg.png` would otherwise get a NIfTI). Output folders are never
//! an input folder, and nothing is written into an input DICOM folder or below it. Lookups are
//! hashed: a batch of thousands of cases claims in linear time.

use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a claimed path will hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A NIfTI volume: `.nii` or `.nii.gz`.
    Volume,
    /// A PNG image.
    Png,
    /// A JSON report: `.json` or `.jsonl`; `-` is standard output.
    Report,
    /// A 3D Slicer colour table: `.ctbl`.
    ColorTable,
    /// A folder of outputs (created when missing).
    Folder,
}

impl Kind {
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Kind::Volume => &[".nii", ".nii.gz"],
            Kind::Png => &[".png"],
            Kind::Report => &[".json", ".jsonl"],
            Kind::ColorTable => &[".ctbl"],
            Kind::Folder => &[],
        }
    }
}

/// A file's identity: device and inode.
type Ident = (u64, u64);

/// A file the run reads, and the input it is read for (itself, or the header or DICOM folder
/// that reads it).
#[derive(Debug)]
struct Read {
    file: PathBuf,
    input: PathBuf,
}

/// The paths a run reads and the paths it has claimed so far.
#[derive(Debug, Default)]
pub struct Gate {
    reads: Vec<Read>,
    by_ident: HashMap<Ident, usize>,
    by_canon: HashMap<PathBuf, usize>,
    /// Input folders by canonical path: the path as given, and whether every file in it is read
    /// (a DICOM series) rather than only its listing (a folder of cases).
    dirs: HashMap<PathBuf, (PathBuf, bool)>,
    /// Claimed paths by canonical target: the path as given and the flag naming it.
    claimed: HashMap<PathBuf, (PathBuf, String)>,
    /// Claimed folders (canonical); those missing are made by the run.
    folders: HashSet<PathBuf>,
    force: bool,
}

fn ident(path: &Path) -> Option<Ident> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Gate {
    /// A gate for a run reading `inputs` (models, manifests, volume files, folders of cases).
    pub fn new(inputs: &[&Path], force: bool) -> Gate {
        let mut g = Gate {
            force,
            ..Gate::default()
        };
        for p in inputs {
            g.add_input(p);
        }
        g
    }

    /// One more path the run reads as it is: a file, or a folder of cases (only listed).
    pub fn add_input(&mut self, p: &Path) {
        if p.is_dir() {
            self.add_dir(p, false);
        } else {
            self.add_read(p, p);
        }
    }

    /// An input volume: the file and the detached data file its header names; a DICOM folder and
    /// every file in it. A header that cannot be parsed counts as itself (its read says why).
    pub fn add_volume(&mut self, p: &Path) {
        if p.is_dir() {
            self.add_dir(p, true);
        }
        let files = crate::volume::files_read(p).unwrap_or_else(|_| vec![p.to_path_buf()]);
        for f in files {
            self.add_read(&f, p);
        }
    }

    fn add_dir(&mut self, p: &Path, data: bool) {
        if let Ok(c) = std::fs::canonicalize(p) {
            let e = self.dirs.entry(c).or_insert((p.to_path_buf(), data));
            e.1 |= data;
        }
    }

    fn add_read(&mut self, file: &Path, input: &Path) {
        if file.is_dir() {
            return;
        }
        let n = self.reads.len();
        self.reads.push(Read {
            file: file.to_path_buf(),
            input: input.to_path_buf(),
        });
        if let Some(id) = ident(file) {
            self.by_ident.entry(id).or_insert(n);
        }
        if let Ok(c) = std::fs::canonicalize(file) {
            self.by_canon.entry(c).or_insert(n);
        }
    }

    /// `path` made absolute and canonical even when it does not exist yet: the canonical parent
    /// (or the target of a claimed folder the run will make) joined with the file name. None
    /// when its folder neither exists nor is claimed.
    fn target(&self, path: &Path) -> Option<PathBuf> {
        if let Ok(c) = std::fs::canonicalize(path) {
            return Some(c);
        }
        let name = path.file_name()?;
        let parent = crate::staged::parent_dir(path);
        let dir = match std::fs::canonicalize(&parent) {
            Ok(c) => c,
            Err(_) => self.target(&parent).filter(|t| self.folders.contains(t))?,
        };
        Some(dir.join(name))
    }

    /// The file read that `path` (canonically `canon`) is, under any name.
    fn read_named_by(&self, path: &Path, canon: &Path) -> Option<&Read> {
        let by_id = ident(path).and_then(|id| self.by_ident.get(&id));
        by_id
            .or_else(|| self.by_canon.get(canon))
            .map(|&i| &self.reads[i])
    }

    /// Refuse `path` unless writing it as `kind` is safe; remember it as claimed.
    /// `what` names the flag in messages (`-o`, `--logits`, ...).
    pub fn claim(&mut self, path: &Path, kind: Kind, what: &str) -> Result<()> {
        self.claim_as(path, kind, what, false)
    }

    /// [`Gate::claim`] for a log appended to (a batch `--report`): an existing file is kept and
    /// added to, so it needs no `--force`.
    pub fn claim_appended(&mut self, path: &Path, kind: Kind, what: &str) -> Result<()> {
        self.claim_as(path, kind, what, true)
    }

    fn claim_as(&mut self, path: &Path, kind: Kind, what: &str, appended: bool) -> Result<()> {
        let bad = |msg: String| Error::Invalid(format!("{what} {}: {msg}", path.display()));
        if kind == Kind::Report && path == Path::new("-") {
            return Ok(());
        }
        let parent = crate::staged::parent_dir(path);
        let made = || {
            self.target(&parent)
                .is_some_and(|t| self.folders.contains(&t))
        };
        if !parent.is_dir() && !made() {
            return Err(bad(format!(
                "the folder {} does not exist",
                parent.display()
            )));
        }
        let canon = self
            .target(path)
            .ok_or_else(|| bad("cannot resolve its folder".into()))?;
        if let Some(r) = self.read_named_by(path, &canon) {
            let same = if r.file == r.input {
                format!("is the same file as the input {}", r.file.display())
            } else {
                let (f, i) = (r.file.display(), r.input.display());
                format!("is the same file as {f}, read for the input {i}")
            };
            return Err(bad(format!("{same}; refusing to overwrite an input")));
        }
        check_kind(path, kind).map_err(bad)?;
        if let Some((d, _)) = self.dirs.get(&canon).filter(|_| kind == Kind::Folder) {
            return Err(bad(format!(
                "is the input folder {}; outputs go to a folder of their own",
                d.display()
            )));
        }
        let series = canon
            .ancestors()
            .skip(1)
            .find_map(|a| match self.dirs.get(a) {
                Some((d, true)) => Some(d),
                _ => None,
            });
        if let Some(d) = series {
            return Err(bad(format!(
                "is inside the input folder {} (a DICOM series, every file of which is read); outputs go elsewhere",
                d.display()
            )));
        }
        if let Some((other, flag)) = self.claimed.get(&canon) {
            return Err(bad(format!(
                "is also named as another output of this run ({flag} {})",
                other.display()
            )));
        }
        if kind != Kind::Folder && path.exists() && !self.force && !appended {
            return Err(bad("exists (use --force to overwrite)".into()));
        }
        if kind == Kind::Folder {
            self.folders.insert(canon.clone());
        }
        self.claimed
            .insert(canon, (path.to_path_buf(), what.to_string()));
        Ok(())
    }
}

/// Refuse a file name that does not say what `kind` is, or a folder where a file is written.
fn check_kind(path: &Path, kind: Kind) -> std::result::Result<(), String> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string());
    let trailing_slash = path.as_os_str().to_string_lossy().ends_with('/');
    if kind == Kind::Folder {
        if path.exists() && !path.is_dir() {
            return Err("exists and is not a folder".into());
        }
        return Ok(());
    }
    if name.is_none() || trailing_slash || path.is_dir() {
        return Err("is a folder; a file name is needed".into());
    }
    let lower = name.unwrap_or_default().to_ascii_lowercase();
    let exts = kind.extensions();
    if !exts
        .iter()
        .any(|e| lower.ends_with(e) && lower.len() > e.len())
    {
        return Err(format!("the file name must end with {}", exts.join(" or ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
