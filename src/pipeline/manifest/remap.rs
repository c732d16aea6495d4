//! The manifest's `remap` table: output channel → label value. A key given twice is an error,
//! never "the last one wins" (JSON parsers keep the last silently; TOML refuses it itself).

use super::text::show;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;

/// `remap` as read: `None` when absent (or JSON `null`), a key written twice refused.
pub(super) fn unique_keys<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, u16>>, D::Error> {
    Ok(Option::<Unique>::deserialize(d)?.map(|u| u.0))
}

struct Unique(BTreeMap<String, u16>);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a table of output channel = label value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Unique, A::Error> {
        let mut m = BTreeMap::new();
        while let Some((k, v)) = a.next_entry::<String, u16>()? {
            if m.contains_key(&k) {
                // Named only when it is a channel number: no other text of the file is shown.
                let digits = k.len() <= 10 && k.bytes().all(|b| b.is_ascii_digit());
                return Err(A::Error::custom(if digits {
                    format!("remap: the key {k} is given twice")
                } else {
                    "remap: a key is given twice".to_string()
                }));
            }
            m.insert(k, v);
        }
        Ok(Unique(m))
    }
}

/// The label value of each of `channels` output channels (identity where `map` is silent);
/// `channels == usize::MAX` only checks the keys. Keys naming one channel twice ("1", "01") are
/// refused like a repeated key.
pub(super) fn table(
    map: &BTreeMap<String, u16>,
    channels: usize,
) -> Result<Option<Vec<u16>>, String> {
    let mut pairs: BTreeMap<usize, u16> = BTreeMap::new();
    for (k, v) in map {
        let c: usize = k
            .trim()
            .parse()
            .map_err(|_| format!("remap keys are output channel numbers, not {}", show(k)))?;
        if channels != usize::MAX && c >= channels {
            return Err(format!(
                "remap names channel {c} but the model has {channels} output channel(s)"
            ));
        }
        if pairs.insert(c, *v).is_some() {
            return Err(format!("remap names channel {c} twice"));
        }
    }
    if channels == usize::MAX {
        return Ok(None);
    }
    let mut table: Vec<u16> = (0..channels as u16).collect();
    for (c, v) in pairs {
        table[c] = v;
    }
    Ok(Some(table))
}
