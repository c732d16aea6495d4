//! The output-safety gate: every path a run will write is claimed here before the first window
//! runs, and refused when writing it could destroy something or would fail late.
//!
//! A claimed path is never an input of the run (compared by device + inode and by canonical
//! path, so `./x`, `../d/x`, hard links and symbolic links are caught), never another output of
//! the same run, never an existing file without `--force`, never a directory; its folder exists;
//! its extension matches what is written (`-o seg.png` would otherwise get a NIfTI). Output
//! folders (batch mode, `--split-classes`) are never an input folder.

use crate::{Error, Result};
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
    /// A folder of outputs (created when missing).
    Folder,
}

impl Kind {
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Kind::Volume => &[".nii", ".nii.gz"],
            Kind::Png => &[".png"],
            Kind::Report => &[".json", ".jsonl"],
            Kind::Folder => &[],
        }
    }
}

/// A file's identity: device and inode.
type Ident = (u64, u64);

/// The paths a run reads and the paths it has claimed so far.
#[derive(Debug, Default)]
pub struct Gate {
    inputs: Vec<(PathBuf, Option<Ident>, Option<PathBuf>)>,
    input_dirs: Vec<(PathBuf, PathBuf)>,
    claimed: Vec<(PathBuf, PathBuf)>,
    force: bool,
}

/// `path` made absolute and canonical even when its last component does not exist yet: the
/// canonical parent joined with the file name. None when the parent does not exist.
pub fn canonical_target(path: &Path) -> Option<PathBuf> {
    if let Ok(c) = std::fs::canonicalize(path) {
        return Some(c);
    }
    let name = path.file_name()?;
    let parent = crate::staged::parent_dir(path);
    Some(std::fs::canonicalize(parent).ok()?.join(name))
}

fn ident(path: &Path) -> Option<Ident> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Gate {
    /// A gate for a run reading `inputs` (volumes, models, manifests; folders of inputs too).
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

    /// One more path the run reads.
    pub fn add_input(&mut self, p: &Path) {
        let canon = std::fs::canonicalize(p).ok();
        if p.is_dir() {
            if let Some(c) = &canon {
                self.input_dirs.push((p.to_path_buf(), c.clone()));
            }
        } else {
            self.inputs.push((p.to_path_buf(), ident(p), canon));
        }
    }

    /// The input that `path` is (the same file under any name), if any.
    pub fn input_of(&self, path: &Path) -> Option<&Path> {
        self.input_named_by(path, &canonical_target(path)?)
    }

    fn input_named_by(&self, path: &Path, canon: &Path) -> Option<&Path> {
        let id = ident(path);
        self.inputs
            .iter()
            .find(|(_, iid, ic)| (id.is_some() && id == *iid) || ic.as_deref() == Some(canon))
            .map(|(p, _, _)| p.as_path())
    }

    /// Refuse `path` unless writing it as `kind` is safe; remember it as claimed.
    /// `what` names the flag in messages (`-o`, `--logits`, ...).
    pub fn claim(&mut self, path: &Path, kind: Kind, what: &str) -> Result<()> {
        let bad = |msg: String| Error::Invalid(format!("{what} {}: {msg}", path.display()));
        if kind == Kind::Report && path == Path::new("-") {
            return Ok(());
        }
        let parent = crate::staged::parent_dir(path);
        if !parent.is_dir() {
            return Err(bad(format!(
                "the folder {} does not exist",
                parent.display()
            )));
        }
        let canon =
            canonical_target(path).ok_or_else(|| bad("cannot resolve its folder".into()))?;
        if let Some(inp) = self.input_named_by(path, &canon) {
            return Err(bad(format!(
                "is the same file as the input {}; refusing to overwrite an input",
                inp.display()
            )));
        }
        let name = path.file_name().map(|n| n.to_string_lossy().to_string());
        let trailing_slash = path.as_os_str().to_string_lossy().ends_with('/');
        if kind != Kind::Folder {
            if name.is_none() || trailing_slash || path.is_dir() {
                return Err(bad("is a folder; a file name is needed".into()));
            }
            let lower = name.unwrap_or_default().to_ascii_lowercase();
            let exts = kind.extensions();
            if !exts
                .iter()
                .any(|e| lower.ends_with(e) && lower.len() > e.len())
            {
                return Err(bad(format!(
                    "the file name must end with {}",
                    exts.join(" or ")
                )));
            }
        } else if path.exists() && !path.is_dir() {
            return Err(bad("exists and is not a folder".into()));
        }
        if let Some((d, _)) = self.input_dirs.iter().find(|(_, c)| *c == canon) {
            if kind == Kind::Folder {
                return Err(bad(format!(
                    "is the input folder {}; outputs go to a folder of their own",
                    d.display()
                )));
            }
        }
        if let Some((other, _)) = self.claimed.iter().find(|(_, c)| *c == canon) {
            return Err(bad(format!(
                "is also named as another output of this run ({})",
                other.display()
            )));
        }
        if kind != Kind::Folder && path.exists() && !self.force {
            return Err(bad("exists (use --force to overwrite)".into()));
        }
        self.claimed.push((path.to_path_buf(), canon));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_under_any_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let input = d.join("in.nii");
        std::fs::write(&input, b"x").unwrap();
        std::os::unix::fs::symlink(&input, d.join("link.nii")).unwrap();
        std::fs::hard_link(&input, d.join("hard.nii")).unwrap();
        for force in [false, true] {
            let mut g = Gate::new(&[&input], force);
            for p in [
                input.clone(),
                d.join(".").join("in.nii"),
                d.join("link.nii"),
                d.join("hard.nii"),
            ] {
                let e = g.claim(&p, Kind::Volume, "-o").unwrap_err().to_string();
                assert!(e.contains("same file as the input"), "{e}");
            }
            // The report of B1: refused by its extension first, and as the input anyway.
            assert!(g.claim(&input, Kind::Report, "--report").is_err());
            g.claim(&d.join("new.nii.gz"), Kind::Volume, "-o").unwrap();
        }
    }

    #[test]
    fn outputs_alias_extensions_folders_and_existing_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut g = Gate::new(&[], false);
        g.claim(&d.join("o.nii"), Kind::Volume, "-o").unwrap();
        let e = g
            .claim(&d.join(".").join("o.nii"), Kind::Volume, "--logits")
            .unwrap_err()
            .to_string();
        assert!(e.contains("another output"), "{e}");
        for (p, k) in [
            (d.join("seg.png"), Kind::Volume),
            (d.join("p.nii"), Kind::Png),
            (d.join("r.nii"), Kind::Report),
            (d.join(".nii"), Kind::Volume),
            (d.to_path_buf(), Kind::Volume),
            (PathBuf::from("."), Kind::Volume),
            (d.join("nodir").join("r.json"), Kind::Report),
        ] {
            assert!(g.claim(&p, k, "x").is_err(), "{p:?} as {k:?}");
        }
        let notes = d.join("notes.json");
        std::fs::write(&notes, b"keep").unwrap();
        assert!(g.claim(&notes, Kind::Report, "--report").is_err());
        Gate::new(&[], true)
            .claim(&notes, Kind::Report, "--report")
            .unwrap();
        g.claim(Path::new("-"), Kind::Report, "--report").unwrap();
    }

    #[test]
    fn input_folders_are_not_output_folders() {
        let dir = tempfile::tempdir().unwrap();
        let inp = dir.path().join("in");
        std::fs::create_dir(&inp).unwrap();
        let mut g = Gate::new(&[&inp], false);
        let e = g
            .claim(&inp.join("."), Kind::Folder, "--logits")
            .unwrap_err()
            .to_string();
        assert!(e.contains("input folder"), "{e}");
        g.claim(&dir.path().join("out"), Kind::Folder, "-o")
            .unwrap();
    }
}
