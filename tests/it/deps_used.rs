//! Every crate in Cargo.toml's `[dependencies]` is used by the code (CI runs this): a dependency
//! nothing names is compile time and supply chain for nothing (byteorder once was one).

use std::path::Path;

/// All `.rs` text under `dir`.
fn sources(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
}

#[test]
fn every_dependency_is_used() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let deps = toml
        .split("[dependencies]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    let mut code = String::new();
    sources(&root.join("src"), &mut code);
    let mut unused = Vec::new();
    let mut n = 0;
    for line in deps.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', ' ']).next().unwrap().replace('-', "_");
        n += 1;
        if !code.contains(&format!("{name}::")) && !code.contains(&format!("use {name}")) {
            unused.push(name);
        }
    }
    assert!(n >= 10, "parsed only {n} dependencies");
    assert!(
        unused.is_empty(),
        "dependencies nothing in src/ uses: {unused:?}"
    );
}
