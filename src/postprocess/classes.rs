//! Which classes a post-processing step applies to: every foreground class, or a list of class
//! names (the manifest's `classes`) and label values.

use crate::volume::LabelNames;
use crate::{Error, Result};

/// The classes a step applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Classes {
    /// None: the step is off.
    #[default]
    Off,
    /// Every foreground class (label values other than 0).
    All,
    /// These classes: names or label values as typed.
    Listed(Vec<String>),
}

/// The foreground names of a manifest's `classes`: all but the first (the background), or the
/// one name of a one-channel model (its label 1).
fn foreground(classes: &[String]) -> &[String] {
    if classes.len() == 1 {
        classes
    } else {
        &classes[1..]
    }
}

impl Classes {
    /// Parse a flag's value: `all`, or a comma-separated list of class names and label values.
    pub fn parse(s: &str, flag: &str) -> Result<Classes> {
        if s == "all" {
            return Ok(Classes::All);
        }
        let list: Vec<String> = s.split(',').map(|t| t.trim().to_string()).collect();
        if list.iter().any(String::is_empty) {
            return Err(Error::Invalid(format!(
                "{flag}: an empty class name in {s:?}; give names or label values separated by commas"
            )));
        }
        Ok(Classes::Listed(list))
    }

    /// Refuse names that are not among `classes` (the manifest's, if any) and label value 0,
    /// before any work; `what` names the flag or manifest field.
    pub fn check(&self, classes: Option<&[String]>, what: &str) -> Result<()> {
        let Classes::Listed(list) = self else {
            return Ok(());
        };
        for t in list {
            match t.parse::<u16>() {
                Ok(0) => {
                    return Err(Error::Invalid(format!(
                        "{what}: label 0 is the background, not a class to post-process"
                    )))
                }
                Ok(_) => {}
                Err(_) if classes.is_some_and(|c| foreground(c).iter().any(|n| n == t)) => {}
                Err(_) => {
                    let known = match classes {
                        Some(c) => format!("the manifest's classes are {}", c.join(", ")),
                        None => "the model has no manifest classes".into(),
                    };
                    return Err(Error::Invalid(format!(
                        "{what}: no class named {t:?} ({known}); give class names or label values"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Per label value: whether the step applies to it (label 0 never), names looked up in
    /// `names` (the label map's table).
    pub fn mask(&self, names: &LabelNames, what: &str) -> Result<Vec<bool>> {
        let mut m = vec![false; 1 << 16];
        match self {
            Classes::Off => {}
            Classes::All => m[1..].iter_mut().for_each(|b| *b = true),
            Classes::Listed(list) => {
                for t in list {
                    let value = match t.parse::<u16>() {
                        Ok(v) => Some(v as usize),
                        Err(_) => names.names.iter().position(|n| n == t),
                    };
                    match value {
                        Some(v) if v != 0 => m[v] = true,
                        _ => {
                            return Err(Error::Invalid(format!(
                                "{what}: no foreground class named {t:?} in the label map"
                            )))
                        }
                    }
                }
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_resolve_and_unknown_names_are_refused() {
        let names = LabelNames {
            names: vec![
                "background".into(),
                "liver".into(),
                String::new(),
                "spleen".into(),
            ],
        };
        let c = Classes::parse("liver, 2", "--keep-largest").unwrap();
        let m = c.mask(&names, "--keep-largest").unwrap();
        assert_eq!(&m[..4], &[false, true, true, false]);
        let all = Classes::parse("all", "x")
            .unwrap()
            .mask(&names, "x")
            .unwrap();
        assert!(!all[0] && all[1] && all[65535]);
        let manifest = ["background".to_string(), "liver".into()];
        assert!(c.check(Some(&manifest), "x").is_ok());
        let e = Classes::parse("kidney", "--fill-holes").unwrap();
        let msg = e
            .check(Some(&manifest), "--fill-holes")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("kidney") && msg.contains("liver"), "{msg}");
        assert!(Classes::parse("0", "x").unwrap().check(None, "x").is_err());
        assert!(Classes::parse("background", "x")
            .unwrap()
            .check(Some(&manifest), "x")
            .is_err());
        assert!(Classes::parse("liver,,", "x").is_err());
        let one = ["brain".to_string()];
        assert!(Classes::parse("brain", "x")
            .unwrap()
            .check(Some(&one), "x")
            .is_ok());
    }
}
