//! The post-processing of a run: the manifest's steps, each replaced by its flag when one is
//! typed; class names checked against the manifest's classes before any work.

use super::args::PostArgs;
use crate::pipeline::manifest::Manifest;
use crate::postprocess::{Classes, Postprocess};
use crate::{Error, Result};

/// `--min-component-ml ML[:CLASSES]`.
fn min_component(s: &str) -> Result<(f64, Classes)> {
    let (ml, classes) = match s.split_once(':') {
        Some((ml, c)) => (ml, Classes::parse(c, "--min-component-ml")?),
        None => (s, Classes::All),
    };
    match ml.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok((v, classes)),
        _ => Err(Error::Invalid(format!(
            "--min-component-ml takes a volume in mL (0 or more), optionally :CLASSES, not '{s}'"
        ))),
    }
}

/// The steps to run: the flags given beat the manifest's fields, step by step.
pub fn merge(
    flags: &PostArgs,
    manifest: &Manifest,
    classes: Option<&[String]>,
) -> Result<Postprocess> {
    let mut p = manifest.postprocess();
    for (what, c) in [
        ("keep_largest", &p.keep_largest),
        ("fill_holes", &p.fill_holes),
    ] {
        c.check(classes, &format!("manifest {what}"))?;
    }
    if let Some((_, c)) = &p.min_component {
        c.check(classes, "manifest min_component_ml")?;
    }
    if let Some(s) = &flags.keep_largest {
        p.keep_largest = Classes::parse(s, "--keep-largest")?;
        p.keep_largest.check(classes, "--keep-largest")?;
    }
    if let Some(s) = &flags.min_component_ml {
        let m = min_component(s)?;
        m.1.check(classes, "--min-component-ml")?;
        p.min_component = Some(m);
    }
    if let Some(s) = &flags.fill_holes {
        p.fill_holes = Classes::parse(s, "--fill-holes")?;
        p.fill_holes.check(classes, "--fill-holes")?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_component_parses_a_volume_and_classes() {
        assert_eq!(min_component("1.5").unwrap(), (1.5, Classes::All));
        let (ml, c) = min_component("2:liver,3").unwrap();
        assert_eq!(
            (ml, c),
            (2.0, Classes::Listed(vec!["liver".into(), "3".into()]))
        );
        for bad in ["-1", "x", "inf", "1:", ""] {
            assert!(min_component(bad).is_err(), "{bad}");
        }
    }
}
