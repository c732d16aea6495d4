//! The gate's unit tests: inputs under any name, detached data files, DICOM folders, outputs
//! naming each other, folders the run makes.

use super::*;

#[test]
fn inputs_under_any_name_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.nii");
    std::fs::write(&input, b"x").unwrap();
    std::os::unix::fs::symlink(&input, d.join("link.nii")).unwrap();
    std::fs::hard_link(&input, d.join("hard.nii")).unwrap();
    for force in [false, true] {
        let mut g = Gate::new(&[&input], force);
        for p in [
            input.clone(),
            d.join(".").join("in.nii"),
            d.join("link.nii"),
            d.join("hard.nii"),
        ] {
            let e = g.claim(&p, Kind::Volume, "-o").unwrap_err().to_string();
            assert!(e.contains("same file as the input"), "{e}");
        }
        // The report of B1: refused by its extension first, and as the input anyway.
        assert!(g.claim(&input, Kind::Report, "--report").is_err());
        g.claim(&d.join("new.nii.gz"), Kind::Volume, "-o").unwrap();
    }
}

#[test]
fn outputs_alias_extensions_folders_and_existing_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut g = Gate::new(&[], false);
    g.claim(&d.join("o.nii"), Kind::Volume, "-o").unwrap();
    let e = g
        .claim(&d.join(".").join("o.nii"), Kind::Volume, "--logits")
        .unwrap_err()
        .to_string();
    assert!(e.contains("another output"), "{e}");
    for (p, k) in [
        (d.join("seg.png"), Kind::Volume),
        (d.join("p.nii"), Kind::Png),
        (d.join("r.nii"), Kind::Report),
        (d.join(".nii"), Kind::Volume),
        (d.to_path_buf(), Kind::Volume),
        (PathBuf::from("."), Kind::Volume),
        (d.join("nodir").join("r.json"), Kind::Report),
    ] {
        assert!(g.claim(&p, k, "x").is_err(), "{p:?} as {k:?}");
    }
    let notes = d.join("notes.json");
    std::fs::write(&notes, b"keep").unwrap();
    assert!(g.claim(&notes, Kind::Report, "--report").is_err());
    Gate::new(&[], true)
        .claim(&notes, Kind::Report, "--report")
        .unwrap();
    g.claim(Path::new("-"), Kind::Report, "--report").unwrap();
}

#[test]
fn input_folders_are_not_output_folders() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in");
    std::fs::create_dir(&inp).unwrap();
    let mut g = Gate::new(&[&inp], false);
    let e = g
        .claim(&inp.join("."), Kind::Folder, "--logits")
        .unwrap_err()
        .to_string();
    assert!(e.contains("input folder"), "{e}");
    g.claim(&dir.path().join("out"), Kind::Folder, "-o")
        .unwrap();
}

#[test]
fn detached_data_files_are_inputs() {
    // Defect 10 of the second trust round: `-o scan.nii --force` beside a `scan.nhdr` that
    // reads its voxels from scan.nii.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("scan.nii"), b"voxels").unwrap();
    let nhdr = d.join("scan.nhdr");
    let text =
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 2 2 2\nencoding: raw\ndata file: scan.nii\n";
    std::fs::write(&nhdr, text).unwrap();
    let mut g = Gate::new(&[], true);
    g.add_volume(&nhdr);
    let e = g
        .claim(&d.join("scan.nii"), Kind::Volume, "-o")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("read for the input") && e.contains("scan.nhdr"),
        "{e}"
    );
    g.claim(&d.join("seg.nii"), Kind::Volume, "-o").unwrap();
}

#[test]
fn files_of_folders_the_run_makes_are_claimed_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("liver.nii.gz");
    std::fs::write(&input, b"x").unwrap();
    let mut g = Gate::new(&[&input], false);
    let e = g
        .claim(&d.join("no").join("a.nii"), Kind::Volume, "-o")
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    let masks = d.join("masks");
    g.claim(&masks, Kind::Folder, "--split-classes").unwrap();
    g.claim(&masks.join("case"), Kind::Folder, "--split-classes")
        .unwrap();
    let mask = masks.join("case").join("liver.nii.gz");
    g.claim(&mask, Kind::Volume, "--split-classes").unwrap();
    let e = g
        .claim(
            &masks.join(".").join("case/liver.nii.gz"),
            Kind::Volume,
            "-o",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("this run (--split-classes"), "{e}");
    assert!(!masks.exists(), "claims make nothing");
}

#[test]
fn nothing_is_written_into_an_input_dicom_folder() {
    // Defect 11: batch `--split-classes .` wrote the masks of series folder ct into ct/.
    let dir = tempfile::tempdir().unwrap();
    let ct = dir.path().join("ct");
    std::fs::create_dir(&ct).unwrap();
    std::fs::write(ct.join("IM0001"), b"slice").unwrap();
    let mut g = Gate::new(&[], true);
    g.add_volume(&ct);
    for (p, k) in [
        (ct.clone(), Kind::Folder),
        (ct.join("sub"), Kind::Folder),
        (ct.join("seg.nii.gz"), Kind::Volume),
        (ct.join("IM0001"), Kind::Volume),
    ] {
        let e = g.claim(&p, k, "x").unwrap_err().to_string();
        assert!(e.contains("input folder") || e.contains("same file"), "{e}");
    }
    g.claim(&dir.path().join("seg.nii.gz"), Kind::Volume, "-o")
        .unwrap();
}

#[test]
fn an_appended_log_needs_no_force_but_is_one_output() {
    // Defect 12: a batch report named like a case's sidecar.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("b.labels.json");
    std::fs::write(&log, b"{}\n").unwrap();
    let mut g = Gate::new(&[], false);
    g.claim_appended(&log, Kind::Report, "--report").unwrap();
    let e = g
        .claim(&log, Kind::Report, "--labels-json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("this run (--report"), "{e}");
}
