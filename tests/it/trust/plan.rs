//! The trust issue, planner and memory side: a small budget never shrinks the model's window
//! (it refuses, naming the budget needed), the out-of-memory retry only halves the batch,
//! `plan --volume` with absurd sizes errs at once, a window below the receptive field warns, the
//! default CPU budget honours RLIMIT_AS and cgroup limits, and NaN network outputs are counted.

use crate::common::nifti::{nifti, Geo};
use crate::common::onnx::*;
use crate::common::*;
use ndarray::Array4;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use voxtile::engine::{Device, Engine, Options};
use voxtile::plan::{self, Request, Target};
use voxtile::tiling::Placement;
use voxtile::Error;

fn deepbrain() -> voxtile::model::Graph {
    voxtile::model::onnx::load(data("deepbrain.onnx")).unwrap()
}

/// Runs the binary with a deadline: None when it had to be killed.
fn run_within(cmd: &mut Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Dice of the nonzero voxels of two label files.
fn dice(a: &Path, b: &Path) -> f64 {
    let la = voxtile::volume::read(a).unwrap().data;
    let lb = voxtile::volume::read(b).unwrap().data;
    let (mut both, mut na, mut nb) = (0usize, 0usize, 0usize);
    for (x, y) in la.iter().zip(lb.iter()) {
        let (x, y) = (*x > 0.0, *y > 0.0);
        both += (x && y) as usize;
        na += x as usize;
        nb += y as usize;
    }
    2.0 * both as f64 / (na + nb).max(1) as f64
}

/// `--memory-budget 32MiB` on the shipped sample: the run keeps the default mask or refuses with
/// one error line naming the budget and what the model's window needs (it used to run silently
/// with a [24,128,128]-like window below deepbrain's 64³ receptive field: an empty mask).
#[test]
fn small_budget_keeps_the_mask_or_refuses() {
    let dir = tempdir();
    let small = dir.path().join("small.nii.gz");
    let input = data("mni_t1_128.nii.gz");
    let model = data("deepbrain.onnx");
    let o = segment_cpu(&input, &model, &small, &["--memory-budget", "32MiB"]);
    if o.status.success() {
        let reference = dir.path().join("ref.nii.gz");
        let r = segment_cpu(&input, &model, &reference, &[]);
        assert!(r.status.success());
        let d = dice(&small, &reference);
        assert!(d >= 0.99, "Dice {d} against the default run");
    } else {
        let err = assert_one_error(&o, "32.00 MiB");
        assert!(
            err.contains("[128, 128, 128]") && err.contains("needs"),
            "{err}"
        );
        assert!(!small.exists(), "no output after a refusal");
    }
}

/// The planner never changes the window: for every budget it keeps the model's window with
/// some batch, or errs naming that window; the batch-1 need it names is exactly what fits.
#[test]
fn planner_keeps_the_window_at_every_budget() {
    let g = deepbrain();
    let roi = [128, 128, 128];
    for target in [Target::Cpu, Target::Cuda] {
        let w = workload([128, 128, 128]);
        let need = estimate_on_target(&g, target, roi, 1, &w)
            .unwrap()
            .budgeted
            .total();
        for mib in [8u64, 16, 32, 64, 128, 512, 4096] {
            for explicit in [true, false] {
                let req = Request {
                    budget: mib << 20,
                    budget_explicit: explicit,
                    user_roi: None,
                    user_batch: None,
                    workload: w,
                };
                match choose_on(&g, target, &req) {
                    Ok(p) => {
                        assert_eq!(p.roi, roi, "{target:?} {mib} MiB");
                        assert!(need <= mib << 20);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        assert!(need > mib << 20, "{target:?} {mib} MiB: {e}");
                        assert!(
                            e.contains(&format!("{roi:?}"))
                                && e.contains(&plan::format_bytes(need))
                                && e.contains(&format!("{mib}.00 MiB")),
                            "{e}"
                        );
                    }
                }
            }
        }
    }
    // A fixed input size is the window too, whatever the volume.
    let mut fixed = deepbrain();
    fixed.fixed_input_spatial = [Some(64), Some(64), Some(64)];
    let req = Request {
        budget: 1 << 40,
        budget_explicit: true,
        user_roi: None,
        user_batch: None,
        workload: workload([30, 200, 90]),
    };
    assert_eq!(
        choose_on(&fixed, Target::Cpu, &req).unwrap().roi,
        [64, 64, 64]
    );
}

/// `voxtile plan --volume` with sizes whose voxel or window counts overflow: one error line,
/// exit 1, well within a deadline (it used to hang or abort).
#[test]
fn plan_with_absurd_volumes_errs_at_once() {
    let model = data("deepbrain.onnx");
    let cases: [&[&str]; 5] = [
        &["--volume", "18446744073709551615x2x2"],
        &["--volume", "99999999999x99999999999x99999999999"],
        &["--volume", "99999999999x1x1"],
        &[
            "--volume",
            "1000x1000x1000",
            "--overlap",
            "0.99999999",
            "--roi",
            "64",
        ],
        &[
            "--volume",
            "1000x1000x1000",
            "--overlap",
            "0.99999999",
            "--roi",
            "64",
            "--placement",
            "nnunet",
        ],
    ];
    for args in cases {
        let out = run_within(
            Command::new(voxtile_bin())
                .args(["plan", "--device", "cpu", "--memory-budget", "1TiB", "-m"])
                .arg(&model)
                .args(args),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|| panic!("{args:?}: still running after 10 s"));
        // The error names the volume.
        assert_one_error(&out, args[1]);
    }
    // The library refuses the same without listing windows.
    let mut w = workload([usize::MAX, 2, 2]);
    assert!(w.windows([128, 8, 8]).is_err());
    w.shape = [1000; 3];
    w.overlap = [0.999_999_99; 3];
    w.placement = Placement::NnUnet;
    assert!(w.windows([64; 3]).is_err());
    assert!(estimate_on_target(&deepbrain(), Target::Cuda, [64; 3], 1, &w).is_err());
}

/// A synthetic volume of deepbrain's kind.
fn volume(shape: [usize; 3]) -> Array4<f32> {
    Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        (((i as f32) * 0.2).sin() * ((j as f32) * 0.15).cos() + (k as f32) * 0.01).abs()
    })
}

/// An out-of-memory error halves the batch only: at batch 1 it is an error naming the kept
/// window (it used to halve the window and restart the volume).
#[test]
fn oom_retry_never_changes_the_window() {
    let vol = volume([72, 40, 44]);
    let run = |batch: usize, inject: usize| {
        Engine::from_file(
            data("deepbrain.onnx"),
            Options {
                device: Device::Cpu,
                roi: Some([64; 3]),
                batch: Some(batch),
                inject_oom: Some(inject),
                ..Options::default()
            },
        )
        .unwrap()
        .segment_array(vol.view(), &mut |_, _| {})
        .map(parts)
    };
    let (_, _, r) = run(2, 1).unwrap();
    assert_eq!((r.roi, r.batch), ([64; 3], 1), "{:?}", r.oom_retries);
    assert_eq!(r.oom_retries.len(), 1);
    let e = run(1, 1).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    assert!(e.to_string().contains("[64, 64, 64]"), "{e}");
    // Through the CLI (VOXTILE_INJECT_OOM): one error line, exit 1, no labels.
    let dir = tempdir();
    let input = write_volume(dir.path(), "v.nii", [72, 40, 44], |i, j, k| {
        ((i * 3 + j * 5 + k) % 17) as f32
    });
    let out = dir.path().join("o.nii.gz");
    let o = Command::new(voxtile_bin())
        .args(["segment", s(&input), "-m", s(&data("deepbrain.onnx"))])
        .args([
            "-o",
            s(&out),
            "--device",
            "cpu",
            "--roi",
            "64",
            "--batch",
            "1",
        ])
        .env("VOXTILE_INJECT_OOM", "1")
        .output()
        .unwrap();
    let err = assert_one_error(&o, "[64, 64, 64]");
    assert!(err.contains("batch 1"), "{err}");
    assert!(!out.exists());
}

/// A float32 NIfTI of `shape` with values `f(i, j, k)`.
fn write_volume(
    dir: &Path,
    name: &str,
    shape: [usize; 3],
    f: impl Fn(usize, usize, usize) -> f32,
) -> PathBuf {
    let mut bytes = Vec::with_capacity(4 * shape.iter().product::<usize>());
    // NIfTI order: i fastest.
    for k in 0..shape[2] {
        for j in 0..shape[1] {
            for i in 0..shape[0] {
                bytes.extend_from_slice(&f(i, j, k).to_le_bytes());
            }
        }
    }
    let dims = shape.map(|d| d as i64);
    let p = dir.join(name);
    std::fs::write(&p, nifti(&dims, 16, 32, &Geo::default(), &bytes)).unwrap();
    p
}

/// An explicit roi below the model's receptive field is refused, naming the receptive field
/// (the planner's warning is what `--allow-small-roi` runs with); the model's own window (or one
/// at the receptive field) gives neither.
#[test]
fn roi_below_the_receptive_field_is_refused_unless_allowed() {
    let g = deepbrain();
    assert_eq!(g.receptive_field(), [64, 64, 64]);
    let req = |roi: Option<[usize; 3]>| Request {
        budget: 4 << 30,
        budget_explicit: true,
        user_roi: roi,
        user_batch: None,
        workload: workload([40, 36, 44]),
    };
    let p = choose_on(&g, Target::Cpu, &req(Some([32, 64, 64]))).unwrap();
    let w = p.warning.expect("a warning");
    assert!(
        w.contains("receptive field") && w.contains("[32, 64, 64]"),
        "{w}"
    );
    assert!(!w.contains('\n'));
    assert_eq!(p.roi, [32, 64, 64]);
    assert!(choose_on(&g, Target::Cpu, &req(Some([64; 3])))
        .unwrap()
        .warning
        .is_none());
    // The default window of a small volume is the volume itself, not a user's choice.
    assert!(choose_on(&g, Target::Cpu, &req(None))
        .unwrap()
        .warning
        .is_none());
    let vol = [40, 36, 44];
    assert!(plan::refuse_small_roi(&g, Some([32, 64, 64]), vol)
        .unwrap_err()
        .to_string()
        .contains("receptive field [64, 64, 64]"));
    assert!(plan::refuse_small_roi(&g, Some([64; 3]), vol).is_ok());
    assert!(plan::refuse_small_roi(&g, None, vol).is_ok());
    // A window that holds the whole volume loses no context: neither refused nor warned,
    // though it is below the receptive field; one voxel short of an axis is refused.
    assert!(plan::refuse_small_roi(&g, Some(vol), vol).is_ok());
    let whole = Request {
        workload: workload([32; 3]),
        ..req(Some([32; 3]))
    };
    let p = choose_on(&g, Target::Cpu, &whole);
    assert!(p.as_ref().is_ok_and(|p| p.warning.is_none()), "{p:?}");
    assert!(plan::refuse_small_roi(&g, Some([40, 36, 43]), vol).is_err());
    // Through the CLI: refused with one error line naming the receptive field, no output.
    let dir = tempdir();
    let input = write_volume(dir.path(), "v.nii", [40, 36, 44], |i, j, k| {
        ((i + 2 * j + 3 * k) % 13) as f32
    });
    let out = dir.path().join("o.nii.gz");
    let o = segment_cpu(&input, &data("deepbrain.onnx"), &out, &["--roi", "32"]);
    let err = assert_one_error(&o, "receptive field [64, 64, 64]");
    assert!(err.contains("--allow-small-roi"), "{err}");
    assert!(!out.exists());
    // With --allow-small-roi the run succeeds and says so once on stderr.
    let o = segment_cpu(
        &input,
        &data("deepbrain.onnx"),
        &out,
        &["--roi", "32", "--allow-small-roi"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("receptive field"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(out.exists());
    // `voxtile plan` refuses it too, and with --allow-small-roi reports the warning.
    let model = data("deepbrain.onnx");
    let plan_args = [
        "plan",
        "-m",
        s(&model),
        "--volume",
        "40x36x44",
        "--device",
        "cpu",
        "--roi",
        "32",
        "--json",
    ];
    assert_one_error(&voxtile(&plan_args), "receptive field [64, 64, 64]");
    let o = voxtile(&[&plan_args[..], &["--allow-small-roi"]].concat());
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["warning"]
        .as_str()
        .is_some_and(|w| w.contains("receptive field")));
}

/// The parsers behind the default CPU budget, on fake file contents.
#[test]
fn cgroup_rlimit_and_meminfo_parsing() {
    // /proc/self/cgroup: v2 only, v1 with a memory controller, a hybrid.
    let (v2, v1) = plan::parse_proc_cgroup("0::/system.slice/slurmstepd.scope/job_42/step_0\n");
    assert_eq!(
        (v2.as_deref(), v1),
        (Some("/system.slice/slurmstepd.scope/job_42/step_0"), None)
    );
    let (v2, v1) = plan::parse_proc_cgroup(
        "5:cpuacct,cpu:/\n4:memory:/kubepods/pod1/c1\n0::/\n1:name=systemd:/x\n",
    );
    assert_eq!(
        (v2.as_deref(), v1.as_deref()),
        (Some("/"), Some("/kubepods/pod1/c1"))
    );
    assert_eq!(plan::parse_cgroup_limit("max\n"), None);
    assert_eq!(plan::parse_cgroup_limit("9223372036854771712\n"), None);
    assert_eq!(plan::parse_cgroup_limit("1073741824\n"), Some(1 << 30));
    assert_eq!(plan::parse_cgroup_limit("garbage"), None);
    assert_eq!(
        plan::parse_mem_available("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"),
        Some(2 << 20)
    );
    assert_eq!(plan::parse_mem_available("MemTotal: 100 kB\n"), None);

    // A v2 tree: the job limits 8 GiB with 3 GiB used, its step is unlimited, the task folder
    // is missing (no cgroup namespace): the headroom is the job's 5 GiB.
    let root = tempdir();
    let job = root.path().join("slurm/job_42");
    let step = job.join("step_0");
    std::fs::create_dir_all(&step).unwrap();
    std::fs::write(job.join("memory.max"), format!("{}\n", 8u64 << 30)).unwrap();
    std::fs::write(job.join("memory.current"), format!("{}\n", 3u64 << 30)).unwrap();
    std::fs::write(step.join("memory.max"), "max\n").unwrap();
    std::fs::write(step.join("memory.current"), "12345\n").unwrap();
    let (left, at) = plan::cgroup_headroom(
        root.path(),
        "/slurm/job_42/step_0/task_0",
        "memory.max",
        "memory.current",
    )
    .unwrap();
    assert_eq!(left, 5 << 30);
    assert_eq!(at, job);
    // A tighter step wins; usage above the limit leaves 0.
    std::fs::write(step.join("memory.max"), format!("{}\n", 1u64 << 30)).unwrap();
    let (left, at) = plan::cgroup_headroom(
        root.path(),
        "/slurm/job_42/step_0",
        "memory.max",
        "memory.current",
    )
    .unwrap();
    assert_eq!((left, at), ((1 << 30) - 12345, step.clone()));
    std::fs::write(step.join("memory.current"), format!("{}\n", 2u64 << 30)).unwrap();
    let (left, _) = plan::cgroup_headroom(
        root.path(),
        "/slurm/job_42/step_0",
        "memory.max",
        "memory.current",
    )
    .unwrap();
    assert_eq!(left, 0);
    // v1 "unlimited" everywhere: no cgroup limit.
    let v1 = tempdir();
    std::fs::write(
        v1.path().join("memory.limit_in_bytes"),
        "9223372036854771712\n",
    )
    .unwrap();
    std::fs::write(v1.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
    assert!(plan::cgroup_headroom(
        v1.path(),
        "/docker/abc",
        "memory.limit_in_bytes",
        "memory.usage_in_bytes"
    )
    .is_none());
    // The tightest limit is named.
    let t = plan::tightest([
        Some((16 << 30, "available RAM".to_string())),
        None,
        Some((2 << 30, "cgroup memory left (x)".to_string())),
    ])
    .unwrap();
    assert_eq!(t, (2 << 30, "cgroup memory left (x)".to_string()));
}

/// Under RLIMIT_AS the default CPU budget is three quarters of the address space left (not
/// half: that space is the process's own and already net of what is mapped), and its source
/// says so (the host's MemAvailable is not ours).
#[test]
fn default_budget_honours_rlimit_as() {
    use std::os::unix::process::CommandExt;
    let limit: u64 = 3 << 30;
    let mut cmd = Command::new(voxtile_bin());
    cmd.args(["plan", "-m", s(&data("deepbrain.onnx"))])
        .args(["--volume", "64x64x64", "--device", "cpu", "--json"]);
    // SAFETY: setrlimit only, in the child before exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let budget = v["budget"].as_u64().unwrap();
    let source = v["budget_source"].as_str().unwrap();
    let ram = plan::mem_available().unwrap_or(u64::MAX);
    if ram / 2 > limit {
        assert!(
            source.starts_with("75% of") && source.contains("RLIMIT_AS"),
            "{source}"
        );
        // The binary and the model are mapped already: a little less than 3/4 of the limit.
        assert!(
            budget > limit / 2 + limit / 8 && budget <= limit / 4 * 3,
            "{budget} under {limit}"
        );
    } else {
        assert!(budget <= ram / 2);
    }
}

/// Each limit's share: half of RAM or a cgroup's headroom, three quarters of the address space
/// left; the least wins and names its source.
#[test]
fn default_budget_shares() {
    let as_left = |m: u64| Some((m, plan::RLIMIT_AS_LEFT.to_string()));
    let ram = |m: u64| Some((m, "available RAM".to_string()));
    let (b, src) = plan::budget_of([ram(8 << 30), as_left(1 << 30), None]).unwrap();
    assert_eq!(b, 3 << 28);
    assert!(
        src.starts_with("75% of the 1.00 GiB address space left"),
        "{src}"
    );
    let (b, src) = plan::budget_of([ram(1 << 30), as_left(1 << 30)]).unwrap();
    assert_eq!((b, src.starts_with("50% of")), (1 << 29, true), "{src}");
    assert_eq!(plan::budget_of([None, None]), None);
}

/// The shipped sample under `ulimit -v 600M` (RLIMIT_AS 600 MiB) with the default budget: it
/// runs (about 310 MB of working set; halving the address space left refused it), and the
/// plan it runs under says RLIMIT_AS and predicts a working set within that budget.
#[test]
fn shipped_sample_runs_under_ulimit_v_600m() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mask.nii.gz");
    let report = dir.path().join("r.json");
    let mut cmd = Command::new(voxtile_bin());
    cmd.args(["segment", s(&data("head_t1_128.nii.gz")), "-m"])
        .args([s(&data("deepbrain.onnx")), "-o", s(&out), "--device", "cpu"])
        .args(["--report", s(&report)]);
    limit_address_space(&mut cmd, 600 << 20);
    let o = run_within(&mut cmd, Duration::from_secs(120)).expect("finishes");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&report)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let src = r["memory_budget_source"].as_str().unwrap_or_default();
    assert!(src.contains("RLIMIT_AS"), "{r}");
    let budget = r["memory_budget"].as_u64().unwrap();
    let p = &r["predicted"]["budgeted"];
    let need: u64 = [
        "weights",
        "activations",
        "workspace",
        "staging",
        "accumulators",
    ]
    .iter()
    .map(|k| p[k].as_u64().unwrap())
    .sum();
    assert!(need <= budget && budget < 600 << 20, "{need} {budget}");
}

/// A model whose output is NaN where the input is 0 (x / x).
fn nan_model(dir: &Path) -> PathBuf {
    nan_model_with(dir, 1)
}

/// `x / x` (NaN where x is 0), then `channels - 1` copies of x concatenated after it: with
/// several channels the CUDA path makes the labels with its device argmax.
fn nan_model_with(dir: &Path, channels: usize) -> PathBuf {
    use prost::Message;
    let mut nodes = vec![node_with("Div", "div", &["x", "x"], &["q"], vec![])];
    let mut cat = vec!["q"];
    cat.extend(std::iter::repeat_n("x", channels - 1));
    nodes.push(node_with(
        "Concat",
        "cat",
        &cat,
        &["y"],
        vec![int_attr("axis", 1)],
    ));
    let m = model_with(
        "nan_where_zero",
        13,
        nodes,
        vec![],
        vec![vi_ncdhw("x", Some(1))],
        vec![vi_ncdhw("y", Some(channels as i64))],
    );
    let p = dir.join(format!("nan{channels}.onnx"));
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

/// NaN in the blended output is counted (voxels) in the report and warned about with the
/// count; a clean output reports 0 (it used to give all-zero labels silently).
#[test]
fn nan_outputs_are_counted_and_warned() {
    let dir = tempdir();
    let model = nan_model(dir.path());
    let shape = [20, 12, 10];
    let zero = |i: usize, j: usize, k: usize| (i * 7 + j * 3 + k).is_multiple_of(5);
    let zeros = (0..shape[0])
        .flat_map(|i| (0..shape[1]).flat_map(move |j| (0..shape[2]).map(move |k| (i, j, k))))
        .filter(|&(i, j, k)| zero(i, j, k))
        .count();
    assert!(zeros > 0);
    let vol = Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        if zero(i, j, k) {
            0.0
        } else {
            1.0 + i as f32
        }
    });
    for devices in [vec![Device::Cpu], vec![Device::Cpu, Device::Cpu]] {
        let mut o = Options {
            roi: Some([8, 8, 8]),
            ..Options::default()
        };
        o.set_devices(&devices);
        let mut e = Engine::from_file(&model, o).unwrap();
        let r = e.segment_array(vol.view(), &mut |_, _| {}).unwrap().report;
        assert!(r.windows > 1);
        assert_eq!(
            r.nan_output_voxels,
            Some(zeros),
            "{} device(s)",
            devices.len()
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["nan_output_voxels"].as_u64(), Some(zeros as u64));
    }
    let clean = vol.mapv(|v| v + 1.0);
    let mut e = Engine::from_file(
        &model,
        Options {
            device: Device::Cpu,
            roi: Some([8, 8, 8]),
            ..Options::default()
        },
    )
    .unwrap();
    let r = e
        .segment_array(clean.view(), &mut |_, _| {})
        .unwrap()
        .report;
    assert_eq!(r.nan_output_voxels, Some(0));
    // Through the CLI: one warning line with the count.
    let input = write_volume(dir.path(), "v.nii", shape, |i, j, k| {
        if zero(i, j, k) {
            0.0
        } else {
            1.0 + i as f32
        }
    });
    let out = dir.path().join("o.nii.gz");
    let o = segment_cpu(&input, &model, &out, &["--roi", "8"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("NaN")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(&format!("{zeros} voxels")), "{err}");
}

/// On CUDA NaN voxels are counted whether the blended outputs come back (one channel, or
/// `keep_logits`) or the labels are made by the device argmax (which marks them). Run on the GPU
/// machine.
#[test]
fn nan_outputs_are_counted_on_gpu() {
    if !gpu_present() {
        return;
    }
    let dir = tempdir();
    let model = nan_model(dir.path());
    let shape = [24, 16, 12];
    let zero = |i: usize, j: usize, k: usize| (i + 2 * j + k).is_multiple_of(7);
    let vol = Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        if zero(i, j, k) {
            0.0
        } else {
            1.0
        }
    });
    let zeros = vol.iter().filter(|&&v| v == 0.0).count();
    for (model, keep_logits) in [
        (model.clone(), true),
        (model, false),
        (nan_model_with(dir.path(), 3), false),
        (nan_model_with(dir.path(), 3), true),
    ] {
        let mut e = Engine::from_file(
            &model,
            Options {
                device: Device::Cuda(0),
                roi: Some([8, 8, 8]),
                keep_logits,
                ..Options::default()
            },
        )
        .unwrap();
        let (labels, _, r) = parts(e.segment_array(vol.view(), &mut |_, _| {}).unwrap());
        let what = format!("{} keep_logits {keep_logits}", model.display());
        assert_eq!(r.nan_output_voxels, Some(zeros), "{what}");
        assert!(
            labels.iter().all(|&l| l < 3),
            "{what}: no marker left in the labels"
        );
    }
}
