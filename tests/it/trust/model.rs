//! Trust issue, section 3 (and the channel limit of section 5): hostile models must be refused or
//! accepted quickly, within bounded memory, without reading outside the model's folder.
//! Each case runs the CLI as a child with a wall-clock deadline (and, for memory, an address-space
//! limit), so a hang, a stack overflow or an OOM abort is a test failure, not a stuck test run.

use crate::common::onnx::{ftensor, ints_attr, itensor, model_with, node_with, vi_c};
use prost::Message;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use voxtile::internals::proto;

/// Outcome of one CLI run: exit code (None: killed by a signal), stderr, wall time.
struct Run {
    code: Option<i32>,
    stderr: String,
    elapsed: Duration,
}

/// `voxtile args...`, killed after `deadline`; `as_limit` caps its address space (bytes).
fn voxtile(args: &[&Path], deadline: Duration, as_limit: Option<u64>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxtile"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    if let Some(lim) = as_limit {
        crate::common::limit_address_space(&mut cmd, lim);
    }
    let t = Instant::now();
    let mut child = cmd.spawn().expect("voxtile starts");
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if t.elapsed() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("voxtile {args:?} still running after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        code,
        stderr,
        elapsed: t.elapsed(),
    }
}

/// Exit 0 (accepted) or 1 (one clean error line): never a signal, a panic or a stack overflow.
fn assert_clean(r: &Run, what: &str) {
    assert!(
        matches!(r.code, Some(0) | Some(1)),
        "{what}: exit {:?}, stderr: {}",
        r.code,
        r.stderr
    );
    for bad in ["panicked", "overflowed its stack", "memory allocation of"] {
        assert!(!r.stderr.contains(bad), "{what}: {}", r.stderr);
    }
}

/// x [N,1,D,H,W] → 3x3x3 Conv (2 channels, pads 1) → `h`, then `extra` nodes that end in `y`.
fn conv_model(extra: Vec<proto::NodeProto>, mut inits: Vec<proto::TensorProto>) -> Vec<u8> {
    let mut nodes = vec![node_with(
        "Conv",
        "conv",
        &["x", "w", "b"],
        &["h"],
        vec![ints_attr("pads", vec![1; 6])],
    )];
    nodes.extend(extra);
    inits.push(ftensor("w", &[2, 1, 3, 3, 3], vec![0.1; 54]));
    inits.push(ftensor("b", &[2], [0.0, 0.0]));
    model_with(
        "g",
        13,
        nodes,
        inits,
        vec![vi_c("x", Some(1))],
        vec![vi_c("y", Some(2))],
    )
    .encode_to_vec()
}

/// s_{k+1} = (s_k + r) - r with r = s_k (`double`, a DAG whose tree doubles at each step) or the
/// constant 1, n times, from Shape(h); then Resize(h, sizes = s_n) → y. (onnx_dos.py's exp/deep.)
fn shape_chain(n: usize, double: bool) -> Vec<u8> {
    let mut nodes = vec![node_with("Shape", "shape", &["h"], &["s0"], vec![])];
    for k in 0..n {
        let (s, t, s1) = (format!("s{k}"), format!("t{k}"), format!("s{}", k + 1));
        let r = if double { s.clone() } else { "one".into() };
        nodes.push(node_with("Add", &t, &[&s, &r], &[&t], vec![]));
        nodes.push(node_with("Sub", &s1, &[&t, &r], &[&s1], vec![]));
    }
    let sn = format!("s{n}");
    nodes.push(node_with(
        "Resize",
        "resize",
        &["h", "", "", &sn],
        &["y"],
        vec![],
    ));
    conv_model(nodes, vec![itensor("one", &[], vec![1])])
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn doubling_shape_expression_is_inspected_quickly() {
    let dir = tempfile::tempdir().unwrap();
    // 40 doublings: 2^40 leaves if the DAG is walked as a tree.
    let p = write(dir.path(), "exp.onnx", &shape_chain(40, true));
    let r = voxtile(&[Path::new("inspect"), &p], Duration::from_secs(4), None);
    assert_clean(&r, "exp.onnx");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.elapsed < Duration::from_secs(2), "{:?}", r.elapsed);
}

#[test]
fn deep_shape_chain_does_not_overflow_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    // 98 000 nodes: just under the node cap, a chain far deeper than any recursion could take.
    let p = write(dir.path(), "deep.onnx", &shape_chain(49_000, false));
    let r = voxtile(&[Path::new("inspect"), &p], Duration::from_secs(5), None);
    assert_clean(&r, "deep.onnx");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // onnx_dos.py's 80 000-step chain (160 000 nodes) is over the cap: refused at once.
    let p = write(dir.path(), "deep80k.onnx", &shape_chain(80_000, false));
    let r = voxtile(&[Path::new("inspect"), &p], Duration::from_secs(2), None);
    assert_clean(&r, "deep80k.onnx");
    assert!(
        r.code == Some(1) && r.stderr.contains("nodes"),
        "{}",
        r.stderr
    );
}

#[test]
fn unused_constant_of_shape_nodes_cost_no_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 400 unused ConstantOfShape of 256x128x128 (4 M elements each): 6 GB if folded.
    let mut nodes: Vec<proto::NodeProto> = (0..400)
        .map(|k| {
            let o = format!("c{k}");
            node_with("ConstantOfShape", &o, &["shp"], &[&o], vec![])
        })
        .collect();
    nodes.push(node_with("Relu", "relu", &["h"], &["y"], vec![]));
    let bytes = conv_model(nodes, vec![itensor("shp", &[3], vec![256, 128, 128])]);
    let p = write(dir.path(), "cos.onnx", &bytes);
    let r = voxtile(
        &[Path::new("inspect"), &p],
        Duration::from_secs(5),
        Some(1 << 30),
    );
    assert_clean(&r, "cos.onnx");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

#[test]
fn live_constant_folds_share_one_budget() {
    // Two 24 M-element ConstantOfShape (96 MB each), added and fed to a Resize's sizes through
    // Shape/Gather: each fits the per-value limit, together with their sum they pass the model's
    // constant-fold budget (256 MB plus four times the tiny weights) and are refused.
    let mut nodes = vec![
        node_with("ConstantOfShape", "c1", &["shp"], &["c1"], vec![]),
        node_with("ConstantOfShape", "c2", &["shp"], &["c2"], vec![]),
        node_with("Add", "sum", &["c1", "c2"], &["sum"], vec![]),
        node_with("Shape", "hs", &["h"], &["hs"], vec![]),
        node_with("Shape", "ss", &["sum"], &["ss"], vec![]),
        node_with("Gather", "g", &["ss", "zero"], &["g"], vec![]),
        node_with("Mul", "m", &["hs", "g"], &["sizes"], vec![]),
    ];
    nodes.push(node_with(
        "Resize",
        "r",
        &["h", "", "", "sizes"],
        &["y"],
        vec![],
    ));
    let bytes = conv_model(
        nodes,
        vec![
            itensor("shp", &[3], vec![1024, 1024, 24]),
            itensor("zero", &[1], vec![0]),
        ],
    );
    let e = voxtile::model::onnx::load_bytes(&bytes, None, Path::new("fold.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fold.onnx") && e.contains("bytes voxtile allows for this model"),
        "{e}"
    );
}

/// Conv 1 → `c` channels with a zero 1x1x1 weight (mkwide.py).
fn wide(c: usize) -> Vec<u8> {
    model_with(
        "g",
        17,
        vec![node_with("Conv", "conv", &["x", "w", "b"], &["y"], vec![])],
        vec![
            ftensor("w", &[c as i64, 1, 1, 1, 1], vec![0.0; c]),
            ftensor("b", &[c as i64], vec![0.0; c]),
        ],
        vec![vi_c("x", Some(1))],
        vec![vi_c("y", Some(c as i64))],
    )
    .encode_to_vec()
}

#[test]
fn more_than_65535_output_channels_are_refused_at_load() {
    let p = Path::new("w.onnx");
    let e = voxtile::model::onnx::load_bytes(&wide(65_536), None, p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("w.onnx") && e.contains("65536 channels") && e.contains("65535"),
        "{e}"
    );
    let g = voxtile::model::onnx::load_bytes(&wide(65_535), None, p).unwrap();
    assert_eq!(g.output_channels(), 65_535);
}

/// A 1x1x1 conv model whose bias (2 floats) is external data in `data.bin` next to it.
fn external_bias_model(dir: &Path) -> std::path::PathBuf {
    let b = proto::TensorProto {
        name: Some("b".into()),
        dims: vec![2],
        data_type: Some(1),
        data_location: Some(proto::tensor_proto::DataLocation::External as i32),
        external_data: [("location", "data.bin"), ("offset", "0"), ("length", "8")]
            .iter()
            .map(|(k, v)| proto::StringStringEntryProto {
                key: Some(k.to_string()),
                value: Some(v.to_string()),
            })
            .collect(),
        ..Default::default()
    };
    let m = model_with(
        "g",
        17,
        vec![node_with("Conv", "conv", &["x", "w", "b"], &["y"], vec![])],
        vec![ftensor("w", &[2, 1, 1, 1, 1], [0.0, 0.0]), b],
        vec![vi_c("x", Some(1))],
        vec![vi_c("y", Some(2))],
    );
    write(dir, "m.onnx", &m.encode_to_vec())
}

#[test]
fn external_data_through_a_symlink_out_of_the_folder_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    let secret = write(outside.path(), "secret", b"password");
    let dir = tempfile::tempdir().unwrap();
    let m = external_bias_model(dir.path());
    std::os::unix::fs::symlink(&secret, dir.path().join("data.bin")).unwrap();
    let e = voxtile::model::onnx::load(&m).unwrap_err().to_string();
    assert!(
        e.contains("m.onnx") && e.contains("outside the model's folder"),
        "{e}"
    );
    // A link that stays inside the folder is fine.
    std::fs::remove_file(dir.path().join("data.bin")).unwrap();
    write(dir.path(), "real.bin", &[0u8; 8]);
    std::os::unix::fs::symlink("real.bin", dir.path().join("data.bin")).unwrap();
    voxtile::model::onnx::load(&m).unwrap();
}

#[test]
fn external_data_fifo_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = external_bias_model(dir.path());
    let fifo = std::ffi::CString::new(dir.path().join("data.bin").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a fresh path in a temp dir.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let r = voxtile(&[Path::new("inspect"), &m], Duration::from_secs(4), None);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
}

#[test]
fn model_file_must_be_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo_path = dir.path().join("m.onnx");
    let fifo = std::ffi::CString::new(fifo_path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a fresh path in a temp dir.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let r = voxtile(
        &[Path::new("inspect"), &fifo_path],
        Duration::from_secs(4),
        None,
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("m.onnx"), "{}", r.stderr);
}

/// `len` Identity nodes copying `from` along i1..i{len}; the last one is named `to`.
fn identity_chain(from: &str, to: &str, len: usize) -> Vec<proto::NodeProto> {
    (1..=len)
        .map(|k| {
            let src = if k == 1 {
                from.to_string()
            } else {
                format!("i{}", k - 1)
            };
            let dst = if k == len {
                to.to_string()
            } else {
                format!("i{k}")
            };
            node_with("Identity", &dst, &[&src], &[&dst], vec![])
        })
        .collect()
}

#[test]
fn identity_chain_at_the_node_cap_is_inspected_quickly() {
    // Conv + 99 999 Identity = the 100 000-node cap. Resolving each read by walking the chain was
    // quadratic: minutes in a debug build (~100 s for 99 000 nodes in release).
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "idchain.onnx",
        &conv_model(identity_chain("h", "y", 99_999), vec![]),
    );
    let r = voxtile(&[Path::new("inspect"), &p], Duration::from_secs(20), None);
    assert_clean(&r, "idchain.onnx");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.elapsed < Duration::from_secs(5), "{:?}", r.elapsed);
}

#[test]
fn identity_chain_of_a_large_constant_shares_it() {
    // A 4 MB initializer copied by 99 000 Identity nodes: 400 GB if each copy held its own data.
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = identity_chain("k", "kk", 99_000);
    nodes.push(node_with("Add", "add", &["h", "kk"], &["y"], vec![]));
    let bytes = conv_model(nodes, vec![ftensor("k", &[1 << 20], vec![0.5; 1 << 20])]);
    let p = write(dir.path(), "kchain.onnx", &bytes);
    let r = voxtile(
        &[Path::new("inspect"), &p],
        Duration::from_secs(20),
        Some(1 << 30),
    );
    assert_clean(&r, "kchain.onnx");
    assert!(r.elapsed < Duration::from_secs(5), "{:?}", r.elapsed);
}
