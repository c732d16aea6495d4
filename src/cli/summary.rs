//! The one line per file that says what `segment` did, e.g.
//! `voxtile: t1.nii.gz -> out/t1.nii.gz  labels 0,1 (background, brain)  128x128x128  3.2 s  cpu`.
//! Shown by default, hidden by `-q` (events of [`SUMMARY_TARGET`] at info level).

use crate::sys::notice::SUMMARY_TARGET;
use crate::volume::LabelNames;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What one segmented file's line says; the time is read when the line is made (after the
/// outputs are committed).
#[derive(Debug)]
pub struct Summary {
    input: PathBuf,
    output: PathBuf,
    labels: String,
    shape: [usize; 3],
    device: String,
    start: Instant,
}

impl Summary {
    /// The summary of `input` segmented into `labels` (written to `output`) on `device` (the
    /// engine's name, e.g. "cpu (2 threads)"), the run having started at `start`.
    pub fn new(
        (input, output): (&Path, &Path),
        (shape, counts): ([usize; 3], &[u64]),
        names: Option<&LabelNames>,
        device: &str,
        start: Instant,
    ) -> Summary {
        Summary {
            input: input.to_path_buf(),
            output: output.to_path_buf(),
            labels: label_list(&present(counts), names),
            shape,
            device: short_device(device),
            start,
        }
    }

    /// The line (without the `voxtile: ` prefix the logger adds).
    pub fn line(&self) -> String {
        let [i, j, k] = self.shape;
        format!(
            "{}  labels {}  {i}x{j}x{k}  {:.1} s  {}",
            arrow(&self.input, &self.output),
            self.labels,
            self.start.elapsed().as_secs_f64(),
            self.device
        )
    }
}

fn arrow(input: &Path, output: &Path) -> String {
    format!("{} -> {}", input.display(), output.display())
}

/// The line of a batch file not run again because its labels exist.
pub fn skipped(input: &Path, output: &Path) -> String {
    format!(
        "{}  skipped: the output exists (--force redoes it)",
        arrow(input, output)
    )
}

/// Whether summaries are shown (not `-q`, not filtered out by `RUST_LOG`).
pub fn enabled() -> bool {
    tracing::enabled!(target: SUMMARY_TARGET, tracing::Level::INFO)
}

/// Say `line` on stderr unless summaries are hidden.
pub fn emit(line: &str) {
    tracing::info!(target: SUMMARY_TARGET, "{line}");
}

/// The label values present, ascending.
fn present(counts: &[u64]) -> Vec<u16> {
    (0..=u16::MAX)
        .filter(|&v| counts.get(v as usize).is_some_and(|&n| n > 0))
        .collect()
}

/// `0,1,2` or, with class names, `0,1,2 (background, liver, spleen)` (the names the label map's
/// table carries).
fn label_list(present: &[u16], names: Option<&LabelNames>) -> String {
    let ids: Vec<String> = present.iter().map(u16::to_string).collect();
    let Some(names) = names else {
        return ids.join(",");
    };
    let named: Vec<&str> = present
        .iter()
        .map(|&v| names.names.get(v as usize).map_or("?", String::as_str))
        .collect();
    format!("{} ({})", ids.join(","), named.join(", "))
}

/// "cpu (2 threads)" -> "cpu"; "cuda:0 NVIDIA H200 + cuda:1 NVIDIA H200" -> "cuda:0+cuda:1".
fn short_device(name: &str) -> String {
    name.split(" + ")
        .map(|d| d.split_whitespace().next().unwrap_or(d))
        .collect::<Vec<_>>()
        .join("+")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    #[test]
    fn labels_with_and_without_names() {
        let mut a = Array3::<u16>::zeros((4, 3, 2));
        a[[1, 1, 1]] = 7;
        a[[2, 0, 0]] = 2;
        let counts = crate::engine::label_counts(a.view());
        assert_eq!(present(&counts), vec![0, 2, 7]);
        assert_eq!(label_list(&[0, 2, 7], None), "0,2,7");
        let mut names = vec![String::new(); 8];
        names[0] = "bg".into();
        names[2] = "spleen".into();
        names[7] = "liver".into();
        let c = Some(LabelNames { names });
        let c = c.as_ref();
        assert_eq!(label_list(&[0, 2, 7], c), "0,2,7 (bg, spleen, liver)");
        let s = Summary::new(
            (Path::new("in.nii"), Path::new("o/out.nii.gz")),
            ([4, 3, 2], &counts),
            c,
            "cuda:0 NVIDIA H200 + cuda:1 NVIDIA H200",
            Instant::now(),
        );
        let line = s.line();
        assert!(
            line.starts_with("in.nii -> o/out.nii.gz  labels 0,2,7 (bg, spleen, liver)  4x3x2  "),
            "{line}"
        );
        assert!(line.ends_with(" s  cuda:0+cuda:1"), "{line}");
    }
}
