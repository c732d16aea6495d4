//! The CUDA backend's `host/` files import one another without circles (src/backend/cuda/mod.rs,
//! "Layers"): each file's `host::name` / `super::name` uses, outside its test module, form a
//! graph with an order. A circle is two concerns that cannot be read, tested or moved apart.

use std::collections::BTreeMap;
use std::path::Path;

#[test]
fn host_files_import_without_circles() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda/host");
    let mut uses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name != "mod" {
            names.push(name);
        }
    }
    for name in &names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.rs"))).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let lines = code.lines().filter(|l| !l.trim_start().starts_with("//"));
        let code: String = lines.collect::<Vec<_>>().join("\n");
        let used = names
            .iter()
            .filter(|&o| o != name)
            .filter(|o| {
                code.contains(&format!("host::{o}::"))
                    || code.contains(&format!("host::{o};"))
                    || code.contains(&format!("host::{o}::{{"))
                    || code.contains(&format!("super::{o}::"))
            })
            .cloned()
            .collect();
        uses.insert(name.clone(), used);
    }
    // Kahn's order: repeatedly take the files whose imports are all placed.
    let mut placed: Vec<String> = Vec::new();
    while placed.len() < names.len() {
        let next: Vec<String> = uses
            .iter()
            .filter(|(n, u)| !placed.contains(n) && u.iter().all(|d| placed.contains(d)))
            .map(|(n, _)| n.clone())
            .collect();
        let left: BTreeMap<_, _> = uses.iter().filter(|(n, _)| !placed.contains(n)).collect();
        assert!(
            !next.is_empty(),
            "host/ files in a circle of imports: {left:?}"
        );
        placed.extend(next);
    }
    println!("RESULT host/ layers: {placed:?}");
    assert!(
        uses["buffers"].contains(&"fusion".to_string()),
        "the scan sees imports"
    );
}
