//! Helpers shared by the integration tests: fixture paths and error norms.
#![allow(dead_code)]

pub mod attention;
pub mod graph;
pub mod nifti;
pub mod onnx;
pub mod rng;
pub mod small;
pub mod sw;
pub mod transformer;
pub mod unet;

use std::path::{Path, PathBuf};

/// `../shared` next to the repo. CI sets VOXTILE_REQUIRE_FIXTURES=1 so a missing folder fails
/// there instead of skipping.
pub fn shared(rel: &str) -> Option<PathBuf> {
    // VOXTILE_SHARED_DIR: where the GPU machine finds the copy carried in .dev/ (no ../shared there).
    let root = std::env::var_os("VOXTILE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")));
    let p = root.join(rel);
    if p.exists() {
        Some(p)
    } else if std::env::var_os("VOXTILE_REQUIRE_FIXTURES").is_some() {
        panic!(
            "fixture {} is missing and VOXTILE_REQUIRE_FIXTURES is set",
            p.display()
        );
    } else {
        eprintln!("skipping: fixture {} not found", p.display());
        None
    }
}

pub fn data(rel: &str) -> PathBuf {
    let root = std::env::var_os("VOXTILE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/data")));
    root.join(rel)
}

/// Optional fixtures (e.g. the MeshNet whose licence keeps it out of the repo): skip when absent.
pub fn optional_shared(rel: &str) -> Option<PathBuf> {
    let root = std::env::var_os("VOXTILE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")));
    let p = root.join(rel);
    p.exists().then_some(p)
}

/// Fraction of equal elements.
pub fn agreement<'a>(
    a: impl IntoIterator<Item = &'a u16>,
    b: impl IntoIterator<Item = &'a u16>,
) -> f64 {
    let (mut same, mut n) = (0usize, 0usize);
    for (x, y) in a.into_iter().zip(b) {
        same += (x == y) as usize;
        n += 1;
    }
    same as f64 / n.max(1) as f64
}

/// ‖a − b‖ / ‖b‖ in float64.
pub fn rel_l2<'a>(
    a: impl IntoIterator<Item = &'a f32>,
    b: impl IntoIterator<Item = &'a f32>,
) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    let mut n = 0usize;
    for (x, y) in a.into_iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        num += (x - y) * (x - y);
        den += y * y;
        n += 1;
    }
    assert!(n > 0, "rel_l2 of empty arrays");
    assert!(num.is_finite(), "non-finite values in the compared arrays");
    (num / den.max(1e-300)).sqrt()
}

/// A fresh temporary folder removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn voxtile_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_voxtile"))
}

/// Runs the `voxtile` binary to completion.
pub fn voxtile(args: &[&str]) -> std::process::Output {
    std::process::Command::new(voxtile_bin())
        .args(args)
        .output()
        .expect("voxtile runs")
}

/// A path as a CLI argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Gzip at `level` (the tests' own encoder, independent of voxtile's writer).
pub fn gz_level(bytes: &[u8], level: flate2::Compression) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Gzip at the fast level.
pub fn gz(bytes: &[u8]) -> Vec<u8> {
    gz_level(bytes, flate2::Compression::fast())
}

/// Whether CUDA device 0 opens; VOXTILE_REQUIRE_GPU=1 turns a missing GPU into a failure.
pub fn gpu_present() -> bool {
    cuda_backend().is_some()
}

/// A CUDA backend on device 0, or None (after saying why) where there is none;
/// VOXTILE_REQUIRE_GPU=1 turns a missing GPU into a failure.
pub fn cuda_backend() -> Option<voxtile::internals::cuda::CudaBackend> {
    match voxtile::internals::cuda::CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                std::env::var("VOXTILE_REQUIRE_GPU").as_deref() != Ok("1"),
                "VOXTILE_REQUIRE_GPU=1 but: {e}"
            );
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// Asserts a failed run: exit 1, exactly one `voxtile: error:` line containing `names`, no panic.
pub fn assert_one_error(o: &std::process::Output, names: &str) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "exit code, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let errs: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("voxtile: error:"))
        .collect();
    assert_eq!(errs.len(), 1, "one error line expected: {stderr}");
    assert!(
        errs[0].contains(names),
        "error should name {names}: {stderr}"
    );
    stderr
}

/// Names of the files in `dir` that look like voxtile temp files.
pub fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("voxtile-tmp"))
        .collect()
}

/// `voxtile segment INPUT -m MODEL -o OUT --device cpu EXTRA...`, run to completion.
pub fn segment_cpu(input: &Path, model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "segment",
        s(input),
        "-m",
        s(model),
        "-o",
        s(out),
        "--device",
        "cpu",
    ];
    a.extend_from_slice(extra);
    voxtile(&a)
}

/// Cap the address space (RLIMIT_AS, bytes) of the child `cmd` will start.
pub fn limit_address_space(cmd: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A 0.5-overlap MONAI-placed workload on a volume of `shape`, without logits.
pub fn workload(shape: [usize; 3]) -> voxtile::plan::Workload {
    voxtile::plan::Workload {
        shape,
        overlap: [0.5; 3],
        placement: voxtile::tiling::Placement::Monai,
        keep_logits: false,
        copy_input: false,
    }
}

/// The memory model of `target` without a device (CUDA: an H200, budgeted from cuda:0).
#[allow(dead_code)]
pub fn model_of(target: voxtile::plan::Target) -> Box<dyn voxtile::plan::MemoryModel> {
    use voxtile::backend::{memory_model, Device};
    memory_model(match target {
        voxtile::plan::Target::Cpu => Device::Cpu,
        voxtile::plan::Target::Cuda => Device::Cuda(0),
    })
}

/// The planner's prediction of (roi, batch) on `target` without a device.
#[allow(dead_code)]
pub fn estimate_on_target(
    g: &voxtile::model::Graph,
    target: voxtile::plan::Target,
    roi: [usize; 3],
    batch: usize,
    w: &voxtile::plan::Workload,
) -> voxtile::Result<voxtile::plan::Estimate> {
    model_of(target).estimate(g, roi, batch, w)
}

/// The planner's choice on `target` without a device.
#[allow(dead_code)]
pub fn choose_on(
    g: &voxtile::model::Graph,
    target: voxtile::plan::Target,
    req: &voxtile::plan::Request,
) -> voxtile::Result<voxtile::plan::Plan> {
    voxtile::plan::choose(g, model_of(target).as_ref(), req)
}

/// A segmentation as the (labels, blended outputs, report) tuple older tests compare; outputs not
/// kept are a zero-channel array.
pub fn parts(
    seg: voxtile::Segmentation,
) -> (
    ndarray::Array3<u16>,
    ndarray::Array4<f32>,
    voxtile::engine::Report,
) {
    let [x, y, z] = [0, 1, 2].map(|a| seg.labels.shape()[a]);
    let logits = seg
        .logits
        .unwrap_or_else(|| ndarray::Array4::zeros((0, x, y, z)));
    (seg.labels, logits, seg.report)
}

/// The bytes of `p` (the test fails when it cannot be read).
pub fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// The names in `d`, sorted.
pub fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

/// Every committed architecture fixture (tests/fixtures/archs, both exporters) as (name
/// "arch exporter", graph, window from index.json).
pub fn arch_fixtures() -> Vec<(String, voxtile::model::Graph, [usize; 3])> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/archs");
    let text = std::fs::read_to_string(dir.join("index.json")).expect("index.json");
    let index: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for (arch, entry) in index.as_object().unwrap() {
        let w: Vec<usize> = entry["window"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        for exporter in ["legacy", "dynamo"] {
            let p = dir.join(format!("{arch}_{exporter}.onnx"));
            if let Ok(g) = voxtile::model::onnx::load(&p) {
                out.push((format!("{arch} {exporter}"), g, [w[0], w[1], w[2]]));
            }
        }
    }
    out
}
