//! DICOM series, NRRD, MetaImage and NIfTI-1 pair inputs against references computed in Python
//! (`tests/fixtures/volumes/make.py`: SimpleITK/GDCM, pynrrd, nibabel), voxel by voxel and affine
//! by affine; and the refusals (mixed series, uneven spacing, unsupported transfer syntax, hostile
//! headers, formats that get a converter hint).

use std::path::{Path, PathBuf};
use voxtile::volume::{self, Format};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/volumes")
        .join(name)
}

/// The reference voxels (i, j, k) and RAS affine of fixture `name`.
fn reference(name: &str) -> (ndarray::ArrayD<f32>, Vec<Vec<f64>>) {
    let a = voxtile::internals::npy::read_f32(&fixture(&format!("{name}.npy"))).unwrap();
    let text = std::fs::read_to_string(fixture(&format!("{name}.affine.json"))).unwrap();
    (a, serde_json::from_str(&text).unwrap())
}

/// `path` read by voxtile equals the reference `name`: shape, every voxel, the affine to 1e-4 mm.
fn check(path: &Path, name: &str, format: Format) {
    let v = volume::read(path).unwrap_or_else(|e| panic!("{e}"));
    let (want, aff) = reference(name);
    assert_eq!(v.header.format, format);
    assert_eq!(v.channels(), 1);
    assert_eq!(&v.shape()[..], want.shape(), "{name}: shape");
    let [x, y, z] = v.shape();
    for i in 0..x {
        for j in 0..y {
            for k in 0..z {
                let (got, w) = (v.data[[0, i, j, k]], want[[i, j, k]]);
                assert!(
                    (got - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{name}: voxel ({i},{j},{k}) {got} != {w}"
                );
            }
        }
    }
    let a = v.header.affine();
    for r in 0..4 {
        for c in 0..4 {
            assert!(
                (a[r][c] - aff[r][c]).abs() < 1e-4,
                "{name}: affine {a:?} != {aff:?}"
            );
        }
    }
    // The header-only path agrees with the full read.
    let h = volume::read_header(path).unwrap();
    assert_eq!(h.shape(), v.shape());
    assert_eq!(h.affine(), a);
}

#[test]
fn dicom_series_match_gdcm_in_dcm2niix_layout() {
    check(&fixture("dicom_ct"), "dicom_ct", Format::Dicom);
    // RLE-compressed MR with slope 2.5 and intercept 10.
    check(&fixture("dicom_mr_rle"), "dicom_mr_rle", Format::Dicom);
    assert!(volume::is_dicom_series_dir(&fixture("dicom_ct")));
    assert!(!volume::is_dicom_series_dir(&fixture("dicom_ct/IM0000")));
    assert!(!volume::is_dicom_series_dir(Path::new(env!(
        "CARGO_MANIFEST_DIR"
    ))));
    // dcm2niix's axial layout is LAS; this oblique series is still read as stored.
    let h = volume::read_header(fixture("dicom_ct")).unwrap();
    assert_eq!(h.shape(), [24, 20, 12]);
}

#[test]
fn nrrd_and_metaimage_match_pynrrd_and_simpleitk() {
    check(&fixture("lps_gzip.nrrd"), "lps_gzip", Format::Nrrd);
    check(&fixture("ras_detached.nhdr"), "ras_detached", Format::Nrrd);
    check(
        &fixture("oblique_zlib.mha"),
        "oblique_zlib",
        Format::MetaImage,
    );
    check(&fixture("permuted.mhd"), "permuted", Format::MetaImage);
}

#[test]
fn nifti1_pair_matches_nibabel_by_either_name() {
    check(&fixture("pair.hdr"), "pair", Format::NiftiPair);
    check(&fixture("pair.img"), "pair", Format::NiftiPair);
}

/// Copy the files of fixture folders into one temp folder.
fn merged(dirs: &[&str], skip: &[&str]) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for d in dirs {
        for e in std::fs::read_dir(fixture(d)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().to_string();
            if !skip.contains(&name.as_str()) {
                std::fs::copy(e.path(), t.path().join(format!("{d}_{name}"))).unwrap();
            }
        }
    }
    t
}

/// SeriesInstanceUID of a fixture series, from the error listing the series of a mixed folder.
#[test]
fn mixed_series_are_refused_or_chosen_by_uid() {
    let t = merged(&["dicom_ct", "dicom_mr_rle"], &[]);
    let e = volume::read(t.path()).unwrap_err().to_string();
    assert!(
        e.contains("several series") && e.contains("--series"),
        "{e}"
    );
    assert!(e.contains("12 files") && e.contains("9 files"), "{e}");
    // Pick the MR by its UID (the one listed with 9 files).
    let mr_part = e.split("; ").find(|p| p.contains("9 files")).unwrap();
    let uid = mr_part.split_whitespace().last_uid();
    let v = volume::read_dicom_series(t.path(), Some(&uid)).unwrap();
    let (want, _) = reference("dicom_mr_rle");
    assert_eq!(&v.shape()[..], want.shape());
    let e = volume::read_dicom_series(t.path(), Some("1.2.3")).unwrap_err();
    assert!(e.to_string().contains("no series 1.2.3"), "{e}");
}

/// The UID in "…: 1.2.826… (9 files, MR …)".
trait LastUid {
    fn last_uid(self) -> String;
}
impl<'a, I: Iterator<Item = &'a str>> LastUid for I {
    fn last_uid(self) -> String {
        self.filter(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
            .last()
            .unwrap()
            .to_string()
    }
}

#[test]
fn uneven_or_duplicated_slices_are_refused() {
    // A missing slice in the middle (the files are shuffled: drop several to be sure one is inner).
    let t = merged(&["dicom_ct"], &["IM0003", "IM0007"]);
    let e = volume::read(t.path()).unwrap_err().to_string();
    assert!(e.contains("uneven slice spacing"), "{e}");
    // The same slice twice (two acquisitions at one position).
    let t = merged(&["dicom_ct"], &[]);
    std::fs::copy(fixture("dicom_ct/IM0000"), t.path().join("again")).unwrap();
    let e = volume::read(t.path()).unwrap_err().to_string();
    assert!(e.contains("lie at one position"), "{e}");
}

#[test]
fn unsupported_transfer_syntax_is_named() {
    let e = volume::read(fixture("dicom_j2k")).unwrap_err().to_string();
    assert!(
        e.contains("1.2.840.10008.1.2.4.90") && e.contains("JPEG 2000") && e.contains("dcm2niix"),
        "{e}"
    );
}

#[test]
fn hostile_dicom_files_are_one_error() {
    let src = std::fs::read(fixture("dicom_ct/IM0000")).unwrap();
    let t = tempfile::tempdir().unwrap();
    // Truncated in the middle of the pixel data.
    std::fs::write(t.path().join("a"), &src[..src.len() - 100]).unwrap();
    let e = volume::read(t.path()).unwrap_err().to_string();
    assert!(e.contains("truncated") || e.contains("declares"), "{e}");
    // A value length of 4 GiB in a 1 kB file: refused before dicom-rs allocates it.
    let mut b = src[..1000].to_vec();
    let at = b
        .windows(4)
        .rposition(|w| w == [0x28, 0x00, 0x30, 0x00])
        .unwrap(); // PixelSpacing
    b[at + 6] = 0xFF;
    b[at + 7] = 0xFF;
    b.splice(at + 4..at + 6, *b"UT");
    b.splice(at + 8..at + 8, [0xFF, 0xFF, 0xFF, 0x7F]);
    std::fs::write(t.path().join("a"), &b).unwrap();
    let e = volume::read(t.path()).unwrap_err().to_string();
    assert!(e.contains("declares"), "{e}");
    // An empty folder and a folder of non-DICOM files.
    let empty = tempfile::tempdir().unwrap();
    let e = volume::read(empty.path()).unwrap_err().to_string();
    assert!(e.contains("no DICOM image files"), "{e}");
}

#[test]
fn hostile_nrrd_and_metaimage_headers_are_one_error() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("x.nrrd");
    // Huge declared size, tiny file: refused by the memory rule or as truncated, nothing allocated.
    std::fs::write(
        &p,
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 100000 100000 100000\nencoding: raw\n\n1234",
    )
    .unwrap();
    let e = volume::read(&p).unwrap_err().to_string();
    assert!(e.contains("limit") || e.contains("memory"), "{e}");
    let mut gz =
        b"NRRD0004\ntype: float\ndimension: 3\nsizes: 100 100 10\nencoding: gzip\n\n".to_vec();
    gz.extend_from_slice(b"\x1f\x8b\x08\0\0\0\0\0\0\xff");
    std::fs::write(&p, gz).unwrap();
    let e = volume::read(&p).unwrap_err().to_string();
    assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
    for (enc, msg) in [
        ("bzip2", "encoding \"bzip2\""),
        ("ascii", "encoding \"ascii\""),
    ] {
        let text =
            format!("NRRD0004\ntype: short\ndimension: 3\nsizes: 2 2 2\nencoding: {enc}\n\n");
        std::fs::write(&p, text).unwrap();
        let e = volume::read(&p).unwrap_err().to_string();
        assert!(e.contains(msg), "{e}");
    }
    std::fs::write(
        &p,
        "NRRD0004\ntype: short\ndimension: 3\nsizes: 2 2 2\nencoding: raw\ndata file: ../../etc/passwd\n",
    )
    .unwrap();
    let e = volume::read(&p).unwrap_err().to_string();
    assert!(e.contains("header's own folder"), "{e}");
    // Truncated raw MetaImage; a zlib stream that claims 10^9 voxels.
    let m = t.path().join("x.mha");
    let head = "ObjectType = Image\nNDims = 3\nDimSize = 4 4 4\nElementType = MET_SHORT\nElementDataFile = LOCAL\n";
    std::fs::write(&m, format!("{head}abc")).unwrap();
    let e = volume::read(&m).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let mut bomb = b"ObjectType = Image\nNDims = 3\nDimSize = 1000 1000 1000\nElementType = MET_UCHAR\nCompressedData = True\nElementDataFile = LOCAL\n".to_vec();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(9));
    std::io::Write::write_all(&mut z, &vec![0u8; 1 << 20]).unwrap();
    bomb.extend(z.finish().unwrap());
    std::fs::write(&m, bomb).unwrap();
    let e = volume::read(&m).unwrap_err().to_string();
    assert!(e.contains("truncated") || e.contains("memory"), "{e}");
    // A FIFO named .mha is refused, not waited on.
    let f = t.path().join("f.mha");
    let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a fresh path in a temp dir.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = volume::read(&f).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn other_formats_get_a_converter_hint() {
    let t = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 4] = [
        ("brain.mgz", b"\x1f\x8b\x08\0\0\0\0\0", "mri_convert"),
        (
            "slice.png",
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
            "stack the slices",
        ),
        (
            "noext",
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
            "stack the slices",
        ),
        ("one.dcm", b"\0", "folder that holds the whole series"),
    ];
    for (name, bytes, want) in cases {
        let p = t.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = volume::read(&p).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains("sizeof_hdr"), "{name}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
