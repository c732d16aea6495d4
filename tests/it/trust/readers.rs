//! Trust issue, second round, reader side: detached voxel data never read through a link out of
//! the header's folder (NRRD, MetaImage, `.hdr`/`.img`), sizes of 2^63 and more refused instead
//! of read as 1, NRRD `kinds` honoured, DICOM geometry validated (spacing, orientation, slope),
//! and `voxtile info` streaming its statistics instead of holding the volume as f32.

use crate::common::{gz, s, tempdir, voxtile, voxtile_bin};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use voxtile::volume;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/volumes")
        .join(name)
}

/// What the outside file holds: recognisable bytes that must never appear in a message.
const SECRET: &[u8] = b"MARKER-alice:x:1000:hunter2-password-line-of-the-outside-file!!\n";

/// A folder `in/` beside `outside/secret` (the bytes `content`), returned as (top, in).
fn layout(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let top = tempdir();
    let inner = top.path().join("in");
    std::fs::create_dir(&inner).unwrap();
    std::fs::create_dir(top.path().join("outside")).unwrap();
    std::fs::write(top.path().join("outside/secret"), content).unwrap();
    (top, inner)
}

/// The read of `header` is refused as a link out of its folder, the outside bytes not echoed.
fn assert_refused_without_leak(header: &Path) {
    let e = volume::read(header)
        .expect_err("a data file linked out of the header's folder is refused")
        .to_string();
    assert!(e.contains("outside the header's folder"), "{e}");
    assert!(!e.contains("MARKER") && !e.contains("hunter2"), "{e}");
    // `voxtile info` goes through the streaming readers: refused the same way.
    let out = voxtile(&["info", s(header)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "info read it: {err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !err.contains("MARKER") && !stdout.contains("MARKER"),
        "{err}"
    );
}

#[test]
fn nrrd_data_file_linked_out_of_the_folder_is_refused() {
    assert_eq!(SECRET.len(), 64);
    let (_top, d) = layout(SECRET);
    let h = d.join("x.nhdr");
    std::fs::write(
        &h,
        "NRRD0004\ntype: uchar\ndimension: 3\nsizes: 64 1 1\nencoding: raw\ndata file: x.raw\n",
    )
    .unwrap();
    symlink("../outside/secret", d.join("x.raw")).unwrap();
    assert_refused_without_leak(&h);
    // Decision: a link that stays inside the folder is read (a renamed or versioned data file).
    std::fs::write(d.join("real.raw"), [7u8; 64]).unwrap();
    std::fs::remove_file(d.join("x.raw")).unwrap();
    symlink("real.raw", d.join("x.raw")).unwrap();
    let v = volume::read(&h).unwrap();
    assert!(v.data.iter().all(|&x| x == 7.0));
}

#[test]
fn metaimage_data_file_linked_out_of_the_folder_is_refused() {
    let (top, d) = layout(SECRET);
    let h = d.join("x.mhd");
    std::fs::write(
        &h,
        "ObjectType = Image\nNDims = 3\nBinaryData = True\nDimSize = 64 1 1\nElementType = MET_UCHAR\nElementDataFile = x.raw\n",
    )
    .unwrap();
    // An absolute link, as a planted one would be.
    symlink(top.path().join("outside/secret"), d.join("x.raw")).unwrap();
    assert_refused_without_leak(&h);
}

#[test]
fn pair_img_linked_out_of_the_folder_is_refused() {
    // The outside file is exactly as long as the real `.img`, so only the link rule can refuse it.
    let mut img = std::fs::read(fixture("pair.img")).unwrap();
    img[..SECRET.len()].copy_from_slice(SECRET);
    let (_top, d) = layout(&img);
    std::fs::copy(fixture("pair.hdr"), d.join("x.hdr")).unwrap();
    symlink("../outside/secret", d.join("x.img")).unwrap();
    assert_refused_without_leak(&d.join("x.hdr"));
}

/// An attached NRRD and MetaImage of 16x16 float voxels whose first size is `big`.
fn huge_size_files(d: &Path, big: &str) -> [PathBuf; 2] {
    let data = vec![0u8; 16 * 16 * 4];
    let nrrd = d.join(format!("s{}.nrrd", &big[..4]));
    let mut b = format!(
        "NRRD0004\ntype: float\ndimension: 3\nsizes: {big} 16 16\nendian: little\nencoding: raw\n\n"
    )
    .into_bytes();
    b.extend_from_slice(&data);
    std::fs::write(&nrrd, b).unwrap();
    let mha = d.join(format!("s{}.mha", &big[..4]));
    let mut b = format!(
        "ObjectType = Image\nNDims = 3\nBinaryData = True\nDimSize = {big} 16 16\nElementType = MET_FLOAT\nElementDataFile = LOCAL\n"
    )
    .into_bytes();
    b.extend_from_slice(&data);
    std::fs::write(&mha, b).unwrap();
    [nrrd, mha]
}

#[test]
fn sizes_of_2_pow_63_and_more_are_refused_not_read_as_1() {
    let t = tempdir();
    for big in [
        "9223372036854775808",
        "18446744073709551615",
        "99999999999999999999999",
    ] {
        for p in huge_size_files(t.path(), big) {
            let field = if p.extension().unwrap() == "nrrd" {
                "NRRD sizes"
            } else {
                "MetaImage DimSize"
            };
            let e = volume::read_header(&p).expect_err(big).to_string();
            assert!(e.contains(field) && e.contains("more than an axis"), "{e}");
            assert!(e.contains(s(&p)), "names the file: {e}");
            assert!(volume::read(&p).is_err(), "{big} read");
        }
    }
    // Each size fits, their product times 4 bytes does not: an overflow, not a wrap.
    let p = t.path().join("o.nrrd");
    std::fs::write(
        &p,
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 4294967296 4294967296 2\nencoding: raw\n\n",
    )
    .unwrap();
    let e = volume::read_header(&p).unwrap_err().to_string();
    assert!(e.contains("overflow"), "{e}");
    // A size that is not a whole number is named as such.
    std::fs::write(
        &p,
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 16 -1 16\nencoding: raw\n\n",
    )
    .unwrap();
    let e = volume::read_header(&p).unwrap_err().to_string();
    assert!(e.contains("\"-1\" is not a whole number"), "{e}");
}

#[test]
fn nrrd_kinds_other_than_spatial_are_refused() {
    let t = tempdir();
    let p = t.path().join("k.nrrd");
    let write = |kinds: &str| {
        let mut b = format!(
            "NRRD0004\ntype: uchar\ndimension: 3\nsizes: 3 4 4\nkinds: {kinds}\nencoding: raw\n\n"
        )
        .into_bytes();
        b.extend_from_slice(&[1u8; 48]);
        std::fs::write(&p, b).unwrap();
    };
    for kinds in [
        "RGB-color domain domain",
        "domain 3-vector domain",
        "domain domain complex",
        "list domain domain",
        "time domain domain",
    ] {
        write(kinds);
        let e = volume::read(&p).expect_err(kinds).to_string();
        assert!(e.contains("not a spatial axis"), "{kinds}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    for kinds in [
        "domain domain domain",
        "space space space",
        "none ??? domain",
    ] {
        write(kinds);
        let v = volume::read(&p).unwrap_or_else(|e| panic!("{kinds}: {e}"));
        assert_eq!(v.shape(), [3, 4, 4]);
    }
}

/// A copy of the `dicom_ct` series with the DS element `tag` (group, element as little-endian
/// bytes) of every file changed by `f` (bytes, element offset, value length): the fixture is
/// explicit VR little endian.
fn patched_ct(f: impl Fn(&mut Vec<u8>, usize, usize), tag: [u8; 4]) -> tempfile::TempDir {
    let t = tempdir();
    for e in std::fs::read_dir(fixture("dicom_ct")).unwrap() {
        let e = e.unwrap();
        let mut b = std::fs::read(e.path()).unwrap();
        let tag = [tag[0], tag[1], tag[2], tag[3], b'D', b'S'];
        let at = b.windows(6).position(|w| w == tag).expect("element");
        let len = u16::from_le_bytes([b[at + 6], b[at + 7]]) as usize;
        f(&mut b, at, len);
        std::fs::write(t.path().join(e.file_name()), b).unwrap();
    }
    t
}

/// `patched_ct` setting the element's value to `value` (space-padded to its length).
fn ct_with(tag: [u8; 4], value: &str) -> tempfile::TempDir {
    patched_ct(
        |b, at, len| {
            assert!(value.len() <= len, "{value} fits in {len} bytes");
            let v = format!("{value:<len$}");
            b[at + 8..at + 8 + len].copy_from_slice(v.as_bytes());
        },
        tag,
    )
}

const PIXEL_SPACING: [u8; 4] = [0x28, 0x00, 0x30, 0x00];
const ORIENTATION: [u8; 4] = [0x20, 0x00, 0x37, 0x00];
const RESCALE_SLOPE: [u8; 4] = [0x28, 0x00, 0x53, 0x10];

#[test]
fn dicom_bad_pixel_spacing_is_an_error_not_1mm() {
    assert!(volume::read(fixture("dicom_ct")).is_ok());
    for bad in ["0\\0.7", "NaN\\0.7", "-0.8\\0.7", "abc\\0.7"] {
        let t = ct_with(PIXEL_SPACING, bad);
        let e = volume::read(t.path()).expect_err(bad).to_string();
        assert!(e.contains("PixelSpacing"), "{bad}: {e}");
    }
}

#[test]
fn dicom_missing_pixel_spacing_warns_that_1mm_is_assumed() {
    // The tag renamed (0028,0031): the files have no PixelSpacing.
    let t = patched_ct(|b, at, _| b[at + 2] = 0x31, PIXEL_SPACING);
    let v = volume::read(t.path()).unwrap();
    let sp = v.header.spacing();
    assert!(
        (sp[0] - 1.0).abs() < 1e-6 && (sp[1] - 1.0).abs() < 1e-6,
        "{sp:?}"
    );
    let out = voxtile(&["info", s(t.path())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("no PixelSpacing") && err.contains("1 mm"),
        "{err}"
    );
}

#[test]
fn dicom_sheared_or_scaled_orientation_is_an_error() {
    for bad in [
        "1\\0\\0\\0.5\\0.8660254\\0",
        "2\\0\\0\\0\\1\\0",
        "0.9\\0\\0\\0\\1\\0",
    ] {
        let t = ct_with(ORIENTATION, bad);
        let e = volume::read(t.path()).expect_err(bad).to_string();
        assert!(e.contains("ImageOrientationPatient"), "{bad}: {e}");
    }
    // An exact axial orientation is fine.
    assert!(volume::read(ct_with(ORIENTATION, "1\\0\\0\\0\\1\\0").path()).is_ok());
}

#[test]
fn dicom_rescale_slope_zero_or_not_finite_is_an_error() {
    for bad in ["0", "NaN", "inf"] {
        let t = ct_with(RESCALE_SLOPE, bad);
        let e = volume::read(t.path()).expect_err(bad).to_string();
        assert!(e.contains("RescaleSlope"), "{bad}: {e}");
    }
}

/// `voxtile info`'s text for `path`, stdout.
fn info(path: &Path) -> String {
    let out = voxtile(&["info", s(path)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn info_prints_what_describe_says_for_every_reader() {
    for name in [
        "lps_gzip.nrrd",
        "ras_detached.nhdr",
        "oblique_zlib.mha",
        "permuted.mhd",
        "pair.hdr",
        "dicom_ct",
    ] {
        let p = fixture(name);
        let want = volume::describe(&p, &volume::read(&p).unwrap());
        assert_eq!(info(&p), format!("{want}\n"), "{name}");
    }
}

#[test]
fn info_streams_a_large_gzip_nrrd_under_a_small_address_space() {
    // 1024 x 1024 x 256 uint8: 256 MiB of voxels, 1 GiB as f32, a few hundred kB gzipped.
    let t = tempdir();
    let p = t.path().join("big.nrrd");
    let mut voxels = vec![0u8; 1024 * 1024 * 256];
    voxels[5] = 200;
    let mut b =
        b"NRRD0004\ntype: uchar\ndimension: 3\nsizes: 1024 1024 256\nencoding: gzip\n\n".to_vec();
    b.extend(gz(&voxels));
    drop(voxels);
    std::fs::write(&p, b).unwrap();
    // 700 MB of address space: the volume as bytes plus f32 (1.25 GiB) cannot fit; chunks can.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 700000 && exec '{}' info '{}'",
            voxtile_bin().display(),
            p.display()
        ))
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{e}");
    assert!(o.contains("min 0, max 200"), "{o}");
    assert!(o.contains("1024 x 1024 x 256"), "{o}");
}
