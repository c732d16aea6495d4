//! The trust issue's output-side failures, one regression test each: inputs never overwritten
//! (whatever flag names them), outputs all or nothing, temp files that cannot be hijacked, late
//! failures made early, validators with their own rules, a closed stdout.

use crate::common::nifti::nifti2;
use crate::common::small::{ball_volume, conv_model};
use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Case {
    _dir: tempfile::TempDir,
    d: PathBuf,
    vol: PathBuf,
    model: PathBuf,
}

fn case() -> Case {
    let dir = tempdir();
    let d = dir.path().to_path_buf();
    let vol = ball_volume(&d.join("v.nii"), [16, 16, 16]);
    let model = conv_model(&d.join("m.onnx"), 2);
    Case {
        _dir: dir,
        d,
        vol,
        model,
    }
}

fn seg(c: &Case, extra: &[&str]) -> Output {
    seg_in(c, &c.vol, extra)
}

/// `voxtile segment INPUT -m <the case's model> --device cpu EXTRA...`
fn seg_in(c: &Case, input: &Path, extra: &[&str]) -> Output {
    let mut a = vec!["segment", s(input), "-m", s(&c.model), "--device", "cpu"];
    a.extend_from_slice(extra);
    voxtile(&a)
}

#[test]
fn report_never_replaces_an_input_a_model_or_an_existing_file() {
    let c = case();
    let (vol, model) = (bytes(&c.vol), bytes(&c.model));
    let o = |n: &str| s(&c.d.join(n)).to_string();
    let o1 = o("o1.nii.gz");
    // The plain path and the pipeline path (--tta).
    for extra in [vec![], vec!["--tta", "0"]] {
        let mut a = vec!["-o", &o1, "--report", s(&c.vol)];
        a.extend(&extra);
        assert_one_error(&seg(&c, &a), "v.nii");
        let mut a = vec!["-o", &o1, "--report", s(&c.model)];
        a.extend(&extra);
        assert_one_error(&seg(&c, &a), "m.onnx");
    }
    assert_eq!(bytes(&c.vol), vol, "input untouched");
    assert_eq!(bytes(&c.model), model, "model untouched");
    let notes = c.d.join("notes.json");
    std::fs::write(&notes, b"keep").unwrap();
    assert_one_error(
        &seg(&c, &["-o", &o("o2.nii.gz"), "--report", s(&notes)]),
        "--force",
    );
    assert_eq!(bytes(&notes), b"keep");
    // The report naming the labels output.
    assert_one_error(
        &seg(&c, &["-o", &o("o3.nii.gz"), "--report", &o("o3.nii.gz")]),
        "o3.nii.gz",
    );
    assert!(!c.d.join("o1.nii.gz").exists() && !c.d.join("o3.nii.gz").exists());
}

#[test]
fn batch_extra_outputs_never_go_into_an_input_folder() {
    let c = case();
    let inp = c.d.join("in");
    std::fs::create_dir(&inp).unwrap();
    let a = ball_volume(&inp.join("a.nii"), [12, 12, 12]);
    let before = bytes(&a);
    let out = c.d.join("out");
    for flag in [
        "--logits",
        "--probabilities",
        "--preview",
        "--split-classes",
        "-o",
    ] {
        let mut args = vec!["segment", s(&inp), "-m", s(&c.model), "--device", "cpu"];
        if flag != "-o" {
            args.extend(["-o", s(&out)]);
        }
        args.extend([flag, s(&inp)]);
        assert_one_error(&voxtile(&args), "input folder");
        assert_eq!(bytes(&a), before, "{flag}");
        assert_eq!(listing(&inp), ["a.nii"], "{flag}");
    }
}

#[test]
fn outputs_naming_each_other_or_the_wrong_kind_are_refused_before_any_work() {
    let c = case();
    let p = |n: &str| s(&c.d.join(n)).to_string();
    let aliased = format!("{}/./al.nii", s(&c.d));
    let d = s(&c.d).to_string();
    let cases: Vec<([String; 2], [String; 2], &str)> = [
        (
            ["-o", &p("al.nii")],
            ["--logits", &aliased],
            "another output",
        ),
        (["-o", &p("seg.png")], ["--tta", "0"], ".nii"),
        // `-o FOLDER` means FOLDER/v.nii.gz (tests/it/cli/outputs.rs), checked like a file name.
        (["-o", &d], ["--logits", &p("v.nii.gz")], "another output"),
        (
            ["-o", &p("x.nii.gz")],
            ["--report", &p("nodir/r.json")],
            "does not exist",
        ),
        (
            ["-o", &p("y.nii.gz")],
            ["--preview", &p("y.nii.gz.jpg")],
            ".png",
        ),
        (
            ["-o", &p("z.nii.gz")],
            ["--probabilities", &p("z.nii.gz")],
            "another output",
        ),
    ]
    .map(|(a, b, n)| (a.map(String::from), b.map(String::from), n))
    .into();
    for (o, extra, names) in cases {
        let args = [o, extra].concat();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_one_error(&seg(&c, &a), names);
        assert_eq!(listing(&c.d), ["m.onnx", "v.nii"], "{args:?}");
    }
}

#[test]
fn planted_temp_symlink_is_not_followed() {
    let c = case();
    let victim = c.d.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    // The old temp name was predictable: `.<name>.voxtile-tmp-<pid>`; plant it for the child's pid
    // by exec'ing voxtile from the shell that planted it.
    let out = c.d.join("o5.nii.gz");
    let st = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ln -s {victim} {dir}/.o5.nii.gz.voxtile-tmp-$$; exec {bin} segment {vol} -m {model} -o {out} --device cpu",
            victim = s(&victim),
            dir = s(&c.d),
            bin = s(&voxtile_bin()),
            vol = s(&c.vol),
            model = s(&c.model),
            out = s(&out),
        ))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(bytes(&victim), b"precious");
    assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
    assert!(volume_reads(&out));
}

fn volume_reads(p: &Path) -> bool {
    voxtile::volume::read(p).is_ok()
}

#[test]
fn batch_inputs_with_one_output_name_are_refused() {
    let c = case();
    let inp = c.d.join("in");
    std::fs::create_dir(&inp).unwrap();
    ball_volume(&inp.join("a.nii"), [12, 12, 12]);
    let other = ball_volume(&c.d.join("x.nii"), [10, 10, 10]);
    std::fs::write(inp.join("a.nii.gz"), gz(&bytes(&other))).unwrap();
    let out = c.d.join("out");
    assert_one_error(&seg_in(&c, &inp, &["-o", s(&out)]), "a.nii.gz");
    assert!(!out.exists() || listing(&out).is_empty());
}

#[test]
fn spacing_and_sigma_scale_have_their_own_rules() {
    let c = case();
    let o = seg(&c, &["-o", s(&c.d.join("s.nii.gz")), "--spacing", "1.5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = seg(
        &c,
        &["-o", s(&c.d.join("t.nii.gz")), "--sigma-scale", "1.5"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_one_error(
        &seg(&c, &["-o", s(&c.d.join("u.nii.gz")), "--spacing", "0"]),
        "spacing",
    );
    assert_one_error(
        &seg(&c, &["-o", s(&c.d.join("u.nii.gz")), "--sigma-scale=-1"]),
        "sigma",
    );
}

#[test]
fn non_finite_parameters_are_refused() {
    let c = case();
    let out = c.d.join("pn.nii.gz");
    for pad in ["--pad=NaN", "--pad=inf", "--pad=-1e39"] {
        assert_one_error(&seg(&c, &["-o", s(&out), "--roi", "32", pad]), "--pad");
    }
    assert_one_error(
        &seg(&c, &["-o", s(&out), "--normalize=ct:-100,200,inf,40"]),
        "normalize",
    );
    std::fs::write(
        c.d.join("m.toml"),
        "[normalize]\nkind = \"ct\"\nclip = [-100.0, 240.0]\nmean = inf\nstd = 39.4\n",
    )
    .unwrap();
    assert_one_error(&seg(&c, &["-o", s(&out)]), "m.toml");
    assert!(!out.exists());
}

#[test]
fn split_class_names_that_collide_are_made_unique() {
    let c = case();
    let model = conv_model(&c.d.join("m4.onnx"), 4);
    std::fs::write(
        c.d.join("m4.toml"),
        "classes = [\"bg\", \"liver\", \"liver\", \"a/b\"]\n",
    )
    .unwrap();
    let masks = c.d.join("masks");
    let o = voxtile(&[
        "segment",
        s(&c.vol),
        "-m",
        s(&model),
        "-o",
        s(&c.d.join("sc.nii.gz")),
        "--split-classes",
        s(&masks),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        listing(&masks),
        ["a_b.nii.gz", "liver_1.nii.gz", "liver_2.nii.gz"]
    );
    let names = voxtile::pipeline::outputs::class_file_names(
        &[1, 2, 3],
        Some(&["bg", "a/b", "a_b", ""].map(String::from)),
    )
    .unwrap();
    assert_eq!(names, ["a_b_1.nii.gz", "a_b_2.nii.gz", "class_3.nii.gz"]);
    let e = voxtile::pipeline::outputs::class_file_names(
        &[1, 2, 3],
        Some(&["bg", "x", "x", "x_2"].map(String::from)),
    );
    assert!(e.is_err(), "x_2 twice cannot be made unique by suffixes");
}

#[test]
fn report_to_stdout_and_batch_report_appends() {
    let c = case();
    let o = seg(&c, &["-o", s(&c.d.join("r.nii.gz")), "--report", "-"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert!(
        v.get("windows").is_some() || v.get("engine").is_some(),
        "{v}"
    );
    let inp = c.d.join("in");
    std::fs::create_dir(&inp).unwrap();
    ball_volume(&inp.join("a.nii"), [12, 12, 12]);
    let (out, rep) = (c.d.join("out"), c.d.join("rep.jsonl"));
    let run = || {
        voxtile(&[
            "segment",
            s(&inp),
            "-m",
            s(&c.model),
            "-o",
            s(&out),
            "--report",
            s(&rep),
            "--device",
            "cpu",
        ])
    };
    assert!(run().status.success());
    assert!(run().status.success(), "resumed: the file is skipped");
    let text = String::from_utf8(bytes(&rep)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("\"done\"") && lines[1].contains("skipped"),
        "{text}"
    );
}

#[test]
fn closed_stdout_ends_quietly() {
    let model = data("deepbrain.onnx");
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} inspect {} | (exec 0<&-; sleep .3); exit ${{PIPESTATUS[0]}}",
            s(&voxtile_bin()),
            s(&model)
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked") && err.is_empty(), "{err}");
}

#[test]
fn interrupted_pipeline_run_leaves_no_extra_output() {
    let c = case();
    for sig in ["-QUIT", "-USR1", "-INT"] {
        let d = c.d.join(format!("run{sig}"));
        std::fs::create_dir(&d).unwrap();
        let child = Command::new(voxtile_bin())
            .args([
                "segment",
                s(&c.vol),
                "-m",
                s(&c.model),
                "-o",
                s(&d.join("o.nii.gz")),
                "--probabilities",
                s(&d.join("p.nii.gz")),
                "--preview",
                s(&d.join("p.png")),
                "--split-classes",
                s(&d.join("masks")),
                "--device",
                "cpu",
            ])
            .env("VOXTILE_TEST_PAUSE_BEFORE_RENAME", "400")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Staging pauses 0.4 s per file: signal while the later ones are staged.
        let t = std::time::Instant::now();
        while temp_files(&d).is_empty() {
            assert!(t.elapsed().as_secs() < 60, "no temp file appeared");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(600));
        let st = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.code().is_some_and(|c| c > 128), "{sig}: {err}");
        let left: Vec<String> = walk(&d);
        assert!(left.is_empty(), "{sig}: left behind {left:?} ({err})");
    }
}

fn walk(d: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(d).unwrap().flatten() {
        if e.path().is_dir() {
            v.extend(walk(&e.path()));
            if std::fs::read_dir(e.path()).unwrap().next().is_none() {
                continue; // an empty folder is no output
            }
        } else {
            v.push(e.path().display().to_string());
        }
    }
    v
}

#[test]
fn an_output_that_cannot_be_nifti1_is_refused_up_front() {
    let c = case();
    // NIfTI-2 input 40000 x 1 x 1: readable, but no NIfTI-1 label map can hold it.
    let h = nifti2(false, &[40000, 1, 1], 16, 32, &vec![0u8; 40000 * 4]);
    let wide = c.d.join("wide.nii");
    std::fs::write(&wide, h).unwrap();
    assert!(
        voxtile::volume::read_header(&wide).is_ok(),
        "the input itself is readable"
    );
    let o = seg_in(&c, &wide, &["-o", s(&c.d.join("w.nii.gz"))]);
    assert_one_error(&o, "32767");
}

#[test]
fn of_two_concurrent_runs_on_one_output_one_fails() {
    let c = case();
    let out = c.d.join("same.nii.gz");
    // Both pass the up-front check (the output does not exist yet) and hold their staged file
    // 1.5 s before committing: the second commit finds the first's output and must not replace it.
    let spawn = || {
        Command::new(voxtile_bin())
            .args([
                "segment",
                s(&c.vol),
                "-m",
                s(&c.model),
                "-o",
                s(&out),
                "--device",
                "cpu",
            ])
            .env("VOXTILE_TEST_PAUSE_BEFORE_RENAME", "1500")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "exactly one run wins");
    let loser = if a.status.success() { &b } else { &a };
    assert_one_error(loser, "appeared");
    assert!(volume_reads(&out));
    assert!(temp_files(&c.d).is_empty(), "{:?}", temp_files(&c.d));
}

#[test]
fn stale_temp_files_of_dead_runs_are_removed() {
    let c = case();
    // Two temp files a minute and more old: one abandoned, one whose writer (this test, standing
    // in for a run on another host or in another PID namespace, whose pid means nothing here)
    // still holds its lock. Only the abandoned one goes; so does no young one.
    let plant = |pid: u32, age: u64| {
        let p =
            c.d.join(format!(".o.nii.gz.voxtile-tmp-{pid}-0123456789abcdef"));
        let f = std::fs::File::create(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age))
            .unwrap();
        (p, f)
    };
    let (dead, _) = plant(99999999, 120);
    let (live, writer) = plant(99999998, 120);
    let (young, _) = plant(99999997, 0);
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor `writer` owns for the whole test.
    assert_eq!(unsafe { libc::flock(writer.as_raw_fd(), libc::LOCK_EX) }, 0);
    let o = seg(&c, &["-o", s(&c.d.join("o.nii.gz"))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!dead.exists(), "abandoned: removed");
    assert!(live.exists(), "its writer holds the lock: kept");
    assert!(young.exists(), "too young to tell: kept");
}

#[test]
fn preview_replaces_a_symlink_not_its_target() {
    let c = case();
    let victim = c.d.join("victim.png");
    std::fs::write(&victim, b"precious").unwrap();
    let link = c.d.join("p.png");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let o = seg(
        &c,
        &[
            "-o",
            s(&c.d.join("o.nii.gz")),
            "--preview",
            s(&link),
            "--force",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(bytes(&victim), b"precious");
    assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(&bytes(&link)[1..4], b"PNG");
}

#[test]
fn a_manifest_that_is_a_device_is_refused() {
    let c = case();
    for m in ["/dev/zero", "/dev/urandom"] {
        let o = seg(&c, &["-o", s(&c.d.join("o.nii.gz")), "--manifest", m]);
        assert_one_error(&o, "not a regular file");
    }
}
