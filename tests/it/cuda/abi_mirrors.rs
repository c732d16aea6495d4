//! The kernels' parameter blocks (`src/backend/cuda/abi.rs`) against the CUDA structs they
//! mirror (`kernels/*.cu*`), no GPU: the same fields in the same order with the same types, so
//! the same layout. A field added on one side only would shift every later field the kernel
//! reads, which nothing short of a GPU run would show.

use std::path::Path;

/// (name without a trailing `_`, type as Rust spells it, array length or 1) of each field.
type Fields = Vec<(String, String, usize)>;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The body of `head` ... up to the first line starting with `end` after it.
fn body<'a>(src: &'a str, head: &str, end: &str) -> Vec<&'a str> {
    let mut lines = src.lines().skip_while(|l| !l.starts_with(head));
    assert!(lines.next().is_some(), "no `{head}`");
    lines.take_while(|l| !l.starts_with(end)).collect()
}

/// A field name and its array length (`xd[8]` -> ("xd", 8)), the trailing `_` dropped (`do_`
/// and `abs_` are spelt so on one side to avoid a keyword or a macro).
fn name_len(s: &str) -> (String, usize) {
    let (name, len) = match s.split_once('[') {
        Some((n, l)) => (
            n,
            l.trim_end_matches(']')
                .trim()
                .parse()
                .expect("an array length"),
        ),
        None => (s, 1),
    };
    (name.trim().trim_end_matches('_').to_string(), len)
}

fn c_fields(src: &str, name: &str) -> Fields {
    let mut out = Vec::new();
    for line in body(src, &format!("struct {name} {{"), "};") {
        let code = line.split("//").next().unwrap_or("");
        for decl in code.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            let (ty, names) = [
                ("unsigned long long", "u64"),
                ("i64", "i64"),
                ("int", "i32"),
                ("float", "f32"),
            ]
            .iter()
            .find_map(|(c, r)| decl.strip_prefix(c).map(|rest| (*r, rest)))
            .unwrap_or_else(|| panic!("struct {name}: a type this test does not know in `{decl}`"));
            for n in names.split(',') {
                let (n, len) = name_len(n);
                out.push((n, ty.to_string(), len));
            }
        }
    }
    out
}

fn rust_fields(src: &str, name: &str) -> Fields {
    body(src, &format!("pub struct {name} {{"), "}")
        .iter()
        .map(|l| l.trim())
        .filter(|l| l.starts_with("pub "))
        .map(|l| {
            let (n, ty) = l["pub ".len()..]
                .trim_end_matches(',')
                .split_once(':')
                .expect("`name: type`");
            let ty = ty.trim();
            let (ty, len) = match ty.strip_prefix('[') {
                Some(arr) => {
                    let (t, l) = arr.trim_end_matches(']').split_once(';').expect("[T; N]");
                    (
                        t.trim().to_string(),
                        l.trim().parse().expect("an array length"),
                    )
                }
                None => (ty.to_string(), 1),
            };
            (n.trim().trim_end_matches('_').to_string(), ty, len)
        })
        .collect()
}

#[test]
fn parameter_blocks_mirror_their_cuda_structs() {
    let abi = read("src/backend/cuda/abi.rs");
    for (name, file) in [
        ("ConvParams", "kernels/common.cuh"),
        ("PoolParams", "kernels/pool_resize.cu"),
        ("NdParams", "kernels/tensor.cu"),
        ("GemmParams", "kernels/tensor.cu"),
    ] {
        let (c, r) = (c_fields(&read(file), name), rust_fields(&abi, name));
        assert!(!c.is_empty(), "{name}: no fields read");
        assert_eq!(c, r, "{name}: abi.rs against {file}");
    }
}
