//! The warning for a label map without a foreground voxel: a run that finds nothing (a wrong
//! window, spacing or normalisation, or truly nothing there) must not pass unnoticed, so it is
//! said even under `-q`.

use crate::cli::log::ALERT_TARGET;
use ndarray::ArrayView3;
use std::path::Path;

/// Warn (whatever `-q` or `RUST_LOG` say) when every voxel of `labels` is `background`.
pub fn warn_if_empty(input: &Path, labels: ArrayView3<u16>, background: u16) {
    if let Some(line) = message(input, labels, background) {
        tracing::warn!(target: ALERT_TARGET, "{line}");
    }
}

fn message(input: &Path, labels: ArrayView3<u16>, background: u16) -> Option<String> {
    labels.iter().all(|&v| v == background).then(|| {
        format!(
            "{}: the label map has no foreground voxel (every voxel is {background}, the background)",
            input.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    #[test]
    fn only_a_map_of_background_is_empty() {
        let mut a = Array3::<u16>::zeros((3, 2, 2));
        let p = Path::new("in.nii");
        assert!(message(p, a.view(), 0).is_some_and(|m| m.contains("in.nii")));
        a[[2, 1, 0]] = 3;
        assert!(message(p, a.view(), 0).is_none());
        assert!(message(p, Array3::from_elem((2, 2, 2), 5).view(), 5).is_some());
    }
}
