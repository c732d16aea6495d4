//! The manifest's post-processing fields: `keep_largest` and `fill_holes` (`true` for every
//! foreground class, or a list of class names and label values) and `min_component_ml` (a
//! number of mL, or `{ ml = N, classes = [...] }`), checked as they are read.

use super::text::check_string;
use crate::postprocess::{Classes, Postprocess};
use serde::{Deserialize, Serialize};

/// `keep_largest` / `fill_holes`: on for every foreground class, or for the listed ones.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged, try_from = "RawSet")]
pub enum ClassSet {
    /// `true`: every foreground class; `false`: off.
    Every(bool),
    /// These class names or label values (as strings or numbers).
    Listed(Vec<String>),
}

/// `min_component_ml`: a volume for every foreground class, or for the listed ones.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged, try_from = "RawMin")]
pub enum MinComponent {
    /// Components under this many mL go, in every foreground class.
    Every(f64),
    /// Components under `ml` go, in `classes`.
    Listed {
        /// The volume, mL.
        ml: f64,
        /// Class names or label values.
        classes: Vec<String>,
    },
}

/// A class as written: a name or a label value.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawClass {
    Value(u16),
    Name(String),
}

impl RawClass {
    fn text(self) -> String {
        match self {
            RawClass::Value(v) => v.to_string(),
            RawClass::Name(n) => n,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSet {
    Every(bool),
    Listed(Vec<RawClass>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawMin {
    Every(f64),
    Listed { ml: f64, classes: Vec<RawClass> },
}

/// The listed classes as text, each a checked manifest string, the list not empty.
fn listed(raw: Vec<RawClass>) -> Result<Vec<String>, String> {
    if raw.is_empty() {
        return Err("an empty list of classes: give names or label values, or true".into());
    }
    let list: Vec<String> = raw.into_iter().map(RawClass::text).collect();
    list.iter()
        .try_for_each(|s| check_string("a class to post-process", s))?;
    Ok(list)
}

impl TryFrom<RawSet> for ClassSet {
    type Error = String;
    fn try_from(r: RawSet) -> Result<Self, String> {
        Ok(match r {
            RawSet::Every(b) => ClassSet::Every(b),
            RawSet::Listed(l) => ClassSet::Listed(listed(l)?),
        })
    }
}

/// A volume in mL: finite, not negative.
fn volume(ml: f64) -> Result<f64, String> {
    if ml.is_finite() && ml >= 0.0 {
        Ok(ml)
    } else {
        Err(format!(
            "min_component_ml must be a volume in mL, 0 or more; got {ml}"
        ))
    }
}

impl TryFrom<RawMin> for MinComponent {
    type Error = String;
    fn try_from(r: RawMin) -> Result<Self, String> {
        Ok(match r {
            RawMin::Every(ml) => MinComponent::Every(volume(ml)?),
            RawMin::Listed { ml, classes } => MinComponent::Listed {
                ml: volume(ml)?,
                classes: listed(classes)?,
            },
        })
    }
}

impl From<&ClassSet> for Classes {
    fn from(s: &ClassSet) -> Classes {
        match s {
            ClassSet::Every(true) => Classes::All,
            ClassSet::Every(false) => Classes::Off,
            ClassSet::Listed(l) => Classes::Listed(l.clone()),
        }
    }
}

impl super::Manifest {
    /// The post-processing the manifest asks for (every step off where it says nothing).
    pub fn postprocess(&self) -> Postprocess {
        let set = |s: &Option<ClassSet>| s.as_ref().map(Classes::from).unwrap_or_default();
        Postprocess {
            keep_largest: set(&self.keep_largest),
            min_component: self.min_component_ml.as_ref().map(|m| match m {
                MinComponent::Every(ml) => (*ml, Classes::All),
                MinComponent::Listed { ml, classes } => (*ml, Classes::Listed(classes.clone())),
            }),
            fill_holes: set(&self.fill_holes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Manifest;
    use super::*;

    fn toml(s: &str) -> Result<Manifest, String> {
        toml::from_str::<Manifest>(s).map_err(|e| e.to_string())
    }

    #[test]
    fn fields_read_into_the_steps() {
        let m = toml("keep_largest = true\nfill_holes = [\"liver\", 3]\nmin_component_ml = { ml = 2.5, classes = [\"spleen\"] }\n").unwrap();
        let p = m.postprocess();
        assert_eq!(p.keep_largest, Classes::All);
        assert_eq!(
            p.fill_holes,
            Classes::Listed(vec!["liver".into(), "3".into()])
        );
        assert_eq!(
            p.min_component,
            Some((2.5, Classes::Listed(vec!["spleen".into()])))
        );
        let m: Manifest =
            serde_json::from_str(r#"{"min_component_ml": 1, "keep_largest": false}"#).unwrap();
        let p = m.postprocess();
        assert_eq!(
            (p.min_component, p.keep_largest),
            (Some((1.0, Classes::All)), Classes::Off)
        );
        assert!(Manifest::default().postprocess() == Postprocess::default());
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(toml("min_component_ml = -1.0\n").is_err());
        assert!(toml("keep_largest = []\n").is_err());
        assert!(toml("fill_holes = \"liver\"\n").is_err());
        assert!(toml("fill_holes = [\"a\\nb\"]\n").is_err());
        assert!(toml("min_component_ml = { ml = 1.0 }\n").is_err());
    }
}
