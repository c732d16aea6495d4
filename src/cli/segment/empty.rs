//! The warning for a label map without a foreground voxel: a run that finds nothing (a wrong
//! window, spacing or normalisation, or truly nothing there) must not pass unnoticed, so it is
//! said even under `-q`.

use crate::sys::notice::ALERT_TARGET;
use std::path::Path;

/// Warn (whatever `-q` or `RUST_LOG` say) when every voxel of the map whose
/// [`label_counts`](crate::engine::label_counts) are `counts` is `background`.
pub fn warn_if_empty(input: &Path, counts: &[u64], background: u16) {
    if let Some(line) = message(input, counts, background) {
        tracing::warn!(target: ALERT_TARGET, "{line}");
    }
}

fn message(input: &Path, counts: &[u64], background: u16) -> Option<String> {
    let foreground = |(v, &n): (usize, &u64)| v != background as usize && n > 0;
    (!counts.iter().enumerate().any(foreground)).then(|| {
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
        let counts = |a: &Array3<u16>| crate::engine::label_counts(a.view());
        let mut a = Array3::<u16>::zeros((3, 2, 2));
        let p = Path::new("in.nii");
        assert!(message(p, &counts(&a), 0).is_some_and(|m| m.contains("in.nii")));
        a[[2, 1, 0]] = 3;
        assert!(message(p, &counts(&a), 0).is_none());
        assert!(message(p, &counts(&Array3::from_elem((2, 2, 2), 5)), 5).is_some());
    }
}
