//! NIfTI I/O against the shared real files, hand-built files of every dtype/byte order, and
//! corrupted copies. Reference values come from a small independent decoder written here.
#![allow(clippy::type_complexity)]

use crate::common::nifti::{nifti2, nifti_stored, Geo, Storage};
use ndarray::{Array3, Array4};
use std::io::Read;
use std::path::{Path, PathBuf};
use voxtile::volume::{self, Header};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/volumes"
    ))
    .join(name)
}

fn raw_bytes(path: &Path) -> Vec<u8> {
    let b = std::fs::read(path).unwrap();
    if b.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&b[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        b
    }
}

/// Gzip at the default level (this file's fixtures; the other tests use the fast level).
fn gz(bytes: &[u8]) -> Vec<u8> {
    crate::common::gz_level(bytes, flate2::Compression::default())
}

/// The test's own minimal decoder: (dims, datatype, big_endian, vox_offset, slope, inter).
struct RawInfo {
    dims: Vec<usize>,
    datatype: i16,
    be: bool,
    vox_offset: usize,
    slope: f64,
    inter: f64,
}

fn raw_info(b: &[u8]) -> RawInfo {
    let le = i32::from_le_bytes(b[0..4].try_into().unwrap());
    let be = !(le == 348 || le == 540);
    let v1 = le == 348 || i32::from_be_bytes(b[0..4].try_into().unwrap()) == 348;
    let rd = |off: usize, n: usize| -> Vec<u8> {
        let mut v = b[off..off + n].to_vec();
        if be {
            v.reverse();
        }
        v
    };
    let i16_ = |off| i16::from_le_bytes(rd(off, 2).try_into().unwrap());
    let i64_ = |off| i64::from_le_bytes(rd(off, 8).try_into().unwrap());
    let f32_ = |off| f32::from_le_bytes(rd(off, 4).try_into().unwrap()) as f64;
    let f64_ = |off| f64::from_le_bytes(rd(off, 8).try_into().unwrap());
    if v1 {
        let nd = i16_(40) as usize;
        RawInfo {
            dims: (1..=nd).map(|i| i16_(40 + 2 * i) as usize).collect(),
            datatype: i16_(70),
            be,
            vox_offset: f32_(108) as usize,
            slope: f32_(112),
            inter: f32_(116),
        }
    } else {
        let nd = i64_(16) as usize;
        RawInfo {
            dims: (1..=nd).map(|i| i64_(16 + 8 * i) as usize).collect(),
            datatype: i16_(12),
            be,
            vox_offset: i64_(168) as usize,
            slope: f64_(176),
            inter: f64_(184),
        }
    }
}

/// Value number `idx` (file order) of the raw data, scaled, decoded by hand.
fn raw_value(b: &[u8], r: &RawInfo, idx: usize) -> f64 {
    let bpv = match r.datatype {
        2 | 256 => 1,
        4 | 512 => 2,
        8 | 16 | 768 => 4,
        _ => 8,
    };
    let off = r.vox_offset + idx * bpv;
    let mut v = b[off..off + bpv].to_vec();
    if r.be {
        v.reverse(); // swap by hand, then decode as little-endian
    }
    let x = match r.datatype {
        2 => v[0] as f64,
        256 => v[0] as i8 as f64,
        4 => i16::from_le_bytes(v[..].try_into().unwrap()) as f64,
        512 => u16::from_le_bytes(v[..].try_into().unwrap()) as f64,
        8 => i32::from_le_bytes(v[..].try_into().unwrap()) as f64,
        768 => u32::from_le_bytes(v[..].try_into().unwrap()) as f64,
        16 => f32::from_le_bytes(v[..].try_into().unwrap()) as f64,
        1024 => i64::from_le_bytes(v[..].try_into().unwrap()) as f64,
        1280 => u64::from_le_bytes(v[..].try_into().unwrap()) as f64,
        64 => f64::from_le_bytes(v[..].try_into().unwrap()),
        d => panic!("test decoder: dtype {d}"),
    };
    if r.slope != 0.0 && r.slope.is_finite() {
        x * r.slope + r.inter
    } else {
        x
    }
}

/// shape, channels, dtype, version, big-endian, orientation per /work/shared/README.md and the headers.
const EXPECTED: &[(&str, [usize; 3], usize, &str, u8, bool, &str)] = &[
    (
        "ts_example_ct.nii.gz",
        [122, 101, 112],
        1,
        "int32",
        1,
        false,
        "RAS",
    ),
    (
        "ts_example_ct_sm.nii.gz",
        [122, 101, 30],
        1,
        "int16",
        1,
        false,
        "RAS",
    ),
    (
        "ts_example_ct_sm_seg.nii.gz",
        [122, 101, 30],
        1,
        "uint8",
        1,
        false,
        "RAS",
    ),
    (
        "ts_ct_512x512x20.nii.gz",
        [512, 512, 20],
        1,
        "int16",
        1,
        false,
        "LAS",
    ),
    (
        "nibabel_anatomical_bigendian.nii",
        [33, 41, 25],
        1,
        "int16",
        1,
        true,
        "LAS",
    ),
    (
        "nibabel_example_nifti2.nii.gz",
        [32, 20, 12],
        2,
        "int16",
        2,
        false,
        "LAS",
    ),
];

#[test]
fn reads_every_shared_fixture_with_expected_shape_dtype_and_all_values() {
    let dir = fixture("");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let v = volume::read(&path).unwrap_or_else(|e| panic!("{e}"));
        let h = &v.header;
        if let Some(exp) = EXPECTED.iter().find(|e| e.0 == name) {
            seen += 1;
            assert_eq!(h.shape(), exp.1, "{name}");
            assert_eq!(v.shape(), exp.1, "{name}");
            assert_eq!(h.channels(), exp.2, "{name}");
            assert_eq!(v.channels(), exp.2, "{name}");
            assert_eq!(h.dtype_name(), exp.3, "{name}");
            assert_eq!(h.version, exp.4, "{name}");
            assert_eq!(h.big_endian, exp.5, "{name}");
            assert_eq!(h.orientation(), exp.6, "{name}");
        }
        // Every voxel against the hand decoder, which also pins the axis convention:
        // data[[c, i, j, k]] is the value at file index i + nx*(j + ny*(k + nz*c)).
        let b = raw_bytes(&path);
        let r = raw_info(&b);
        let [nx, ny, nz] = h.shape();
        assert_eq!(&r.dims[..3], &[nx, ny, nz][..], "{name}");
        for ((c, i, j, k), &got) in v.data.indexed_iter() {
            let idx = i + nx * (j + ny * (k + nz * c));
            let want = raw_value(&b, &r, idx);
            assert_eq!(got, want as f32, "{name} at {c},{i},{j},{k}");
        }
        // The header-only path agrees with the full read.
        assert_eq!(&volume::read_header(&path).unwrap(), h, "{name}");
    }
    assert_eq!(seen, EXPECTED.len());
}

#[test]
fn axis_convention_spot_checks() {
    // Big-endian file: bytes swapped by hand, offsets computed by hand.
    let path = fixture("nibabel_anatomical_bigendian.nii");
    let v = volume::read(&path).unwrap();
    let b = std::fs::read(&path).unwrap();
    assert_eq!(&b[0..4], &348i32.to_be_bytes());
    let (nx, ny) = (33usize, 41usize);
    for &(i, j, k) in &[
        (0, 0, 0),
        (16, 20, 12),
        (32, 40, 24),
        (5, 33, 2),
        (30, 1, 20),
    ] {
        let off = 352 + 2 * (i + nx * (j + ny * k));
        let want = i16::from_be_bytes([b[off], b[off + 1]]) as f32;
        assert_eq!(v.data[[0, i, j, k]], want, "{i},{j},{k}");
    }
    let nonzero = v.data.iter().filter(|&&x| x != 0.0).count();
    assert!(
        nonzero > 1000,
        "an all-zero decode would pass the spot checks"
    );

    // scl_inter -1024 applied (the 512 CT stores HU + 1024 as int16).
    let path = fixture("ts_ct_512x512x20.nii.gz");
    let v = volume::read(&path).unwrap();
    let b = raw_bytes(&path);
    for &(i, j, k) in &[(0, 0, 0), (256, 256, 10), (511, 3, 19), (100, 400, 7)] {
        let off = 352 + 2 * (i + 512 * (j + 512 * k));
        let want = i16::from_le_bytes([b[off], b[off + 1]]) as f32 - 1024.0;
        assert_eq!(v.data[[0, i, j, k]], want);
    }

    // NIfTI-2, 4-D: channel 1 starts after the whole first 3-D block.
    let path = fixture("nibabel_example_nifti2.nii.gz");
    let v = volume::read(&path).unwrap();
    let b = raw_bytes(&path);
    let (nx, ny, nz) = (32usize, 20usize, 12usize);
    let mut differ = 0;
    for &(i, j, k) in &[(0, 0, 0), (31, 19, 11), (10, 5, 6), (20, 10, 3)] {
        for c in 0..2 {
            let off = 608 + 2 * (i + nx * (j + ny * (k + nz * c)));
            let want = i16::from_le_bytes([b[off], b[off + 1]]) as f32;
            assert_eq!(v.data[[c, i, j, k]], want);
        }
        differ += (v.data[[0, i, j, k]] != v.data[[1, i, j, k]]) as usize;
    }
    assert!(differ > 0, "channels must not alias each other");
}

#[test]
fn label_map_max_and_geometry_of_fixtures() {
    let path = fixture("ts_example_ct_sm_seg.nii.gz");
    let v = volume::read(&path).unwrap();
    let b = raw_bytes(&path);
    let raw_max = *b[13168..].iter().max().unwrap() as f32;
    let max = v.data.iter().cloned().fold(f32::MIN, f32::max);
    assert_eq!(max, raw_max);
    assert!(
        (1.0..=117.0).contains(&max),
        "TotalSegmentator has 117 classes, max {max}"
    );

    // sform_code 2 with srow = diag(3) + offset; qform_code 0.
    let h = &v.header;
    assert_eq!((h.qform_code, h.sform_code), (0, 2));
    let a = h.affine();
    assert_eq!(a[0], [3.0, 0.0, 0.0, -177.95632934570312]);
    assert_eq!(a[1], [0.0, 3.0, 0.0, 11.319000244140625]);
    assert_eq!(a[2], [0.0, 0.0, 3.0, 94.3017578125]);
    assert_eq!(h.spacing(), [3.0, 3.0, 3.0]);

    // Big-endian file: the qform (quaternion (0,1,0), qfac -1) must give the same matrix as its
    // sform diag(-2,2,2): two independent encodings of one geometry.
    let h = volume::read_header(fixture("nibabel_anatomical_bigendian.nii")).unwrap();
    let (q, s) = (h.qform_affine(), h.sform_affine());
    for i in 0..4 {
        for j in 0..4 {
            assert!((q[i][j] - s[i][j]).abs() < 1e-6, "{q:?} vs {s:?}");
        }
    }
    assert_eq!(s[0], [-2.0, 0.0, 0.0, 32.0]);
    // NIfTI-2 oblique file: qform and sform agree to float precision too.
    let h = volume::read_header(fixture("nibabel_example_nifti2.nii.gz")).unwrap();
    let (q, s) = (h.qform_affine(), h.sform_affine());
    for i in 0..4 {
        for j in 0..4 {
            assert!((q[i][j] - s[i][j]).abs() < 1e-4, "{q:?} vs {s:?}");
        }
    }
    assert_eq!(h.pixdim[4], 2000.0);
}

/// A NIfTI-1 file in byte order `be` with scaling (slope, inter) and a fixed sform.
fn build_nifti1(
    be: bool,
    dims: &[i64],
    datatype: i16,
    bitpix: i16,
    scl: [f32; 2],
    data: &[u8],
) -> Vec<u8> {
    let geo = Geo {
        srow: [
            [1.5, 0.0, 0.0, 0.0],
            [0.0, 2.5, 0.0, 0.0],
            [0.0, 0.0, -1.0, 7.0],
        ],
        xyzt_units: 0,
        ..Geo::default()
    };
    let st = Storage {
        big_endian: be,
        slope: scl[0],
        inter: scl[1],
    };
    nifti_stored(dims, datatype, bitpix, &geo, st, data)
}

/// Encode values of one dtype in the requested byte order.
fn encode(dt: i16, vals: &[f64], be: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in vals {
        let mut b: Vec<u8> = match dt {
            2 => vec![v as u8],
            256 => vec![v as i8 as u8],
            4 => (v as i16).to_le_bytes().to_vec(),
            512 => (v as u16).to_le_bytes().to_vec(),
            8 => (v as i32).to_le_bytes().to_vec(),
            768 => (v as u32).to_le_bytes().to_vec(),
            16 => (v as f32).to_le_bytes().to_vec(),
            1024 => (v as i64).to_le_bytes().to_vec(),
            1280 => (v as u64).to_le_bytes().to_vec(),
            64 => v.to_le_bytes().to_vec(),
            _ => unreachable!(),
        };
        if be {
            b.reverse();
        }
        out.extend(b);
    }
    out
}

#[test]
fn every_dtype_in_both_byte_orders_plain_and_gz() {
    let dir = tempfile::tempdir().unwrap();
    let types: &[(i16, i16, &str, &[f64])] = &[
        (2, 8, "uint8", &[0.0, 1.0, 200.0, 255.0]),
        (256, 8, "int8", &[-128.0, -1.0, 0.0, 127.0]),
        (4, 16, "int16", &[-32768.0, -5.0, 300.0, 32767.0]),
        (512, 16, "uint16", &[0.0, 1.0, 40000.0, 65535.0]),
        (8, 32, "int32", &[-2e9, -7.0, 123456.0, 2e6]),
        (768, 32, "uint32", &[0.0, 4e9, 17.0, 65536.0]),
        (16, 32, "float32", &[-1.5, 0.25, 3.5e10, -7e-3]),
        (1024, 64, "int64", &[-9e15, -3.0, 1e12, 42.0]),
        (1280, 64, "uint64", &[0.0, 1.8e19, 5.0, 1e10]),
        (64, 64, "float64", &[-1e-3, 1e300, 2.5, -4.0]),
    ];
    for &(dt, bitpix, name, vals) in types {
        // 2x2x1 plus 1x... : 4 values per channel, two channels of distinct values.
        let mut all = vals.to_vec();
        all.extend(vals.iter().rev());
        for be in [false, true] {
            for zip in [false, true] {
                let bytes = build_nifti1(
                    be,
                    &[2, 2, 1, 2],
                    dt,
                    bitpix,
                    [0.0, 0.0],
                    &encode(dt, &all, be),
                );
                let p = dir.path().join(format!("{name}_{be}_{zip}.nii"));
                std::fs::write(&p, if zip { gz(&bytes) } else { bytes }).unwrap();
                let v = volume::read(&p).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(v.header.dtype_name(), name);
                assert_eq!(v.header.big_endian, be);
                assert_eq!(v.header.gzipped, zip);
                assert_eq!(v.data.dim(), (2, 2, 2, 1));
                for c in 0..2 {
                    for j in 0..2 {
                        for i in 0..2 {
                            let want = all[i + 2 * j + 4 * c] as f32;
                            assert_eq!(v.data[[c, i, j, 0]], want, "{name} be={be} {c}{i}{j}");
                        }
                    }
                }
            }
        }
        // NIfTI-2 in both byte orders (the 540-swapped detection).
        for be in [false, true] {
            let bytes = nifti2(be, &[4, 1, 1], dt, bitpix, &encode(dt, vals, be));
            let p = dir.path().join(format!("{name}_{be}_n2.nii"));
            std::fs::write(&p, bytes).unwrap();
            let v = volume::read(&p).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(v.header.version, 2);
            let got: Vec<f32> = (0..4).map(|i| v.data[[0, i, 0, 0]]).collect();
            let want: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
            assert_eq!(got, want, "{name} nifti2 be={be}");
        }
    }
}

#[test]
fn scaling_slope_inter_and_none() {
    let dir = tempfile::tempdir().unwrap();
    let vals = [0.0, 1.0, -4.0, 100.0];
    let cases: &[(f32, f32, &dyn Fn(f64) -> f64)] = &[
        (2.0, 10.0, &|x| 2.0 * x + 10.0),
        (0.5, -1024.0, &|x| 0.5 * x - 1024.0),
        (0.0, 55.0, &|x| x),     // slope 0: no scaling, inter ignored
        (f32::NAN, 3.0, &|x| x), // NaN slope: no scaling
        (1.0, 0.0, &|x| x),
    ];
    for (n, &(slope, inter, f)) in cases.iter().enumerate() {
        let bytes = build_nifti1(
            n % 2 == 1,
            &[4],
            4,
            16,
            [slope, inter],
            &encode(4, &vals, n % 2 == 1),
        );
        let p = dir.path().join(format!("s{n}.nii"));
        std::fs::write(&p, bytes).unwrap();
        let v = volume::read(&p).unwrap();
        assert_eq!(v.header.shape(), [4, 1, 1]);
        for (i, &x) in vals.iter().enumerate() {
            assert_eq!(v.data[[0, i, 0, 0]], f(x) as f32, "case {n}");
        }
    }
    // Valid slope with a non-finite intercept is refused.
    let bytes = build_nifti1(
        false,
        &[4],
        4,
        16,
        [2.0, f32::INFINITY],
        &encode(4, &vals, false),
    );
    let p = dir.path().join("badinter.nii");
    std::fs::write(&p, bytes).unwrap();
    expect_err(&p, "scl_inter");
}

fn expect_err(p: &Path, needle: &str) -> String {
    let msg = match volume::read(p) {
        Ok(_) => panic!("{} read without error, expected {needle}", p.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains(&p.display().to_string()),
        "message lacks path: {msg}"
    );
    assert!(
        msg.to_lowercase().contains(&needle.to_lowercase()),
        "expected '{needle}' in: {msg}"
    );
    assert!(!msg.contains('\n'), "one sentence: {msg}");
    msg
}

/// Patch a little-endian NIfTI-1 header copy.
fn patch(b: &mut [u8], off: usize, bytes: &[u8]) {
    b[off..off + bytes.len()].copy_from_slice(bytes);
}

#[test]
fn bad_inputs_give_one_clear_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let seg_gz = std::fs::read(fixture("ts_example_ct_sm_seg.nii.gz")).unwrap();
    let seg = raw_bytes(&fixture("ts_example_ct_sm_seg.nii.gz")); // LE NIfTI-1, uint8, vox_offset 13168

    // Corrupt gzip: garbage in the middle of the deflate stream.
    let mut c = seg_gz.clone();
    for x in &mut c[1000..1200] {
        *x ^= 0x5a;
    }
    expect_err(&w("corrupt.nii.gz", &c), "gzip");
    // Corrupt gzip in its header-carrying first block.
    let mut c = seg_gz.clone();
    for x in &mut c[12..40] {
        *x = 0xff;
    }
    assert!(volume::read(w("corrupt2.nii.gz", &c)).is_err());
    // Truncated gzip.
    expect_err(&w("trunc.nii.gz", &seg_gz[..seg_gz.len() / 2]), "truncated");
    // CRC damage in the trailer only: caught because the reader reads to the end of the stream.
    let mut c = seg_gz.clone();
    let n = c.len();
    c[n - 8] ^= 0xff;
    expect_err(&w("crc.nii.gz", &c), "gzip");
    // Gzip of something that is not NIfTI.
    expect_err(
        &w("text.nii.gz", &gz(b"hello world, definitely not a header")),
        "not a NIfTI",
    );

    // Not NIfTI at all; empty; too short.
    expect_err(&w("text.nii", &[b'x'; 2000]), "not a NIfTI");
    expect_err(&w("empty.nii", &[]), "not a NIfTI");
    expect_err(&w("short.nii", &seg[..200]), "truncated NIfTI header");
    let mut c = seg.clone();
    patch(&mut c, 344, b"ni1\0");
    expect_err(&w("pair.nii", &c), ".hdr/.img");
    let mut c = seg.clone();
    patch(&mut c, 344, b"\0\0\0\0");
    expect_err(&w("analyze.nii", &c), "magic");

    // Plain data truncated: dims x bytes larger than the file (both by cutting and by dims).
    expect_err(&w("cut.nii", &seg[..seg.len() - 100]), "truncated");
    let mut c = seg.clone();
    patch(&mut c, 46, &31i16.to_le_bytes()); // nz 30 -> 31
    expect_err(&w("dims.nii", &c), "truncated");
    // ... and in a gz stream (found while decoding).
    expect_err(&w("dims.nii.gz", &gz(&c)), "truncated");

    // Zero and negative dims; bad dim[0].
    for (name, off, val, needle) in [
        ("zero.nii", 44, 0i16, "dim[2] = 0"),
        ("neg.nii", 42, -5, "dim[1] = -5"),
        ("nd0.nii", 40, 0, "dim[0] = 0"),
        ("nd8.nii", 40, 8, "dim[0] = 8"),
        ("nd-1.nii", 40, -1, "dim[0] = -1"),
    ] {
        let mut c = seg.clone();
        patch(&mut c, off, &val.to_le_bytes());
        expect_err(&w(name, &c), needle);
    }
    // 5-D with a real 5th dim is refused; 5-D with 1s is fine.
    let mut c = seg.clone();
    patch(&mut c, 40, &5i16.to_le_bytes());
    patch(&mut c, 48, &1i16.to_le_bytes());
    patch(&mut c, 50, &2i16.to_le_bytes());
    expect_err(&w("5d.nii", &c), "dim[5] = 2");
    patch(&mut c, 50, &1i16.to_le_bytes());
    let v = volume::read(w("5d1.nii", &c)).unwrap();
    assert_eq!(v.data.dim(), (1, 122, 101, 30));

    // Unknown and unsupported datatypes; bitpix inconsistent.
    let mut c = seg.clone();
    patch(&mut c, 70, &999i16.to_le_bytes());
    expect_err(&w("dt999.nii", &c), "unknown NIfTI datatype code 999");
    for (code, name) in [
        (32i16, "complex64"),
        (128, "RGB24"),
        (1792, "complex128"),
        (2304, "RGBA32"),
    ] {
        let mut c = seg.clone();
        patch(&mut c, 70, &code.to_le_bytes());
        expect_err(&w(&format!("dt{code}.nii"), &c), name);
    }
    let mut c = seg.clone();
    patch(&mut c, 72, &16i16.to_le_bytes()); // uint8 with bitpix 16
    expect_err(&w("bitpix.nii", &c), "bitpix 16");

    // vox_offset past the end (plain and gz), inside the header, non-integral.
    let mut c = seg.clone();
    patch(&mut c, 108, &1.0e7f32.to_le_bytes());
    expect_err(&w("voxoff.nii", &c), "past the end");
    expect_err(&w("voxoff.nii.gz", &gz(&c)), "past the end");
    patch(&mut c, 108, &100f32.to_le_bytes());
    expect_err(&w("voxin.nii", &c), "inside the header");
    patch(&mut c, 108, &13168.5f32.to_le_bytes());
    expect_err(&w("voxfrac.nii", &c), "vox_offset");
    patch(&mut c, 108, &f32::NAN.to_le_bytes());
    expect_err(&w("voxnan.nii", &c), "vox_offset");

    // Too large for RAM: refused from the header alone, before any allocation (plain and gz).
    let mut c = seg[..13168].to_vec();
    patch(&mut c, 42, &30000i16.to_le_bytes());
    patch(&mut c, 44, &30000i16.to_le_bytes());
    patch(&mut c, 46, &30000i16.to_le_bytes());
    // Plain: the size check says truncated first (cheap, exact); gz: only the memory check can.
    assert!(volume::read(w("huge.nii", &c)).is_err());
    expect_err(&w("huge.nii.gz", &gz(&c)), "GiB");
    // Bigger than available memory but under the hard cap would need a big machine to test
    // without allocating; the NIfTI-2 variant checks 64-bit dims overflow instead.
    let bytes = nifti2(false, &[1 << 40, 1 << 40, 1 << 20], 2, 8, &[0; 16]);
    expect_err(&w("overflow.nii.gz", &gz(&bytes)), "overflow");
    let bytes = nifti2(false, &[4, -3, 1], 2, 8, &[0; 16]);
    expect_err(&w("neg2.nii", &bytes), "dim[2] = -3");
    let mut bytes = nifti2(false, &[4, 1, 1], 2, 8, &[0; 4]);
    bytes[9] = b'x'; // altered magic tail
    expect_err(&w("magic2.nii", &bytes), "magic");

    // A directory is not a file.
    let msg = volume::read(dir.path()).err().unwrap().to_string();
    assert!(msg.contains(&dir.path().display().to_string()));
    // Missing file: OS error naming the path.
    let missing = dir.path().join("missing.nii");
    let msg = volume::read_header(&missing).err().unwrap().to_string();
    assert!(msg.contains("missing.nii"), "{msg}");
}

#[test]
fn gzip_stream_is_read_with_a_cap() {
    // Header says 2x2x2 uint8; the stream carries 64 MiB more. Reading must stop at the cap, quickly,
    // with the 8 values right.
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = build_nifti1(
        false,
        &[2, 2, 2],
        2,
        8,
        [1.0, 0.0],
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    bytes.resize(bytes.len() + (64 << 20), 0);
    let p = dir.path().join("bomb.nii.gz");
    std::fs::write(&p, gz(&bytes)).unwrap();
    let t = std::time::Instant::now();
    let v = volume::read(&p).unwrap();
    assert!(t.elapsed().as_secs_f64() < 0.5, "{:?}", t.elapsed());
    let got: Vec<f32> = v.data.iter().copied().collect::<Vec<_>>();
    let mut sorted = got.clone();
    sorted.sort_by(f32::total_cmp);
    assert_eq!(sorted, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    assert_eq!(v.data[[0, 1, 0, 1]], 6.0); // 1 + 2*(0 + 2*1) = index 5
}

fn assert_same_geometry(a: &Header, b: &Header) {
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.affine(), b.affine(), "affine must round-trip exactly");
    assert_eq!(
        a.pixdim[1..4],
        b.pixdim[1..4],
        "pixdim must round-trip exactly"
    );
    assert_eq!(a.xyzt_units, b.xyzt_units);
    assert_eq!(a.orientation(), b.orientation());
}

fn assert_qform_matches_sform(h: &Header, tol: f64) {
    let (q, s) = (h.qform_affine(), h.sform_affine());
    for i in 0..3 {
        for j in 0..4 {
            assert!((q[i][j] - s[i][j]).abs() <= tol, "qform {q:?}\nsform {s:?}");
        }
    }
}

#[test]
fn labels_roundtrip_u8_and_u16_with_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("ts_example_ct_sm_seg.nii.gz");
    let v = volume::read(&src).unwrap();
    let labels: Array3<u16> = v.data.index_axis(ndarray::Axis(0), 0).mapv(|x| x as u16);

    let out = dir.path().join("seg.nii.gz");
    volume::write_labels(&out, labels.view(), &v.header).unwrap();
    let r = volume::read(&out).unwrap();
    assert_eq!(r.header.dtype_name(), "uint8");
    assert!(r.header.gzipped && !r.header.big_endian && r.header.version == 1);
    assert_eq!(r.header.dim[0], 3);
    assert_eq!(r.data, v.data);
    assert_same_geometry(&r.header, &v.header);
    // Input has qform_code 0, sform_code 2: both written as 2, qform = the same matrix.
    assert_eq!((r.header.qform_code, r.header.sform_code), (2, 2));
    assert_qform_matches_sform(&r.header, 1e-5);
    assert_eq!(r.header.vox_offset, 352);
    assert_eq!((r.header.scl_slope, r.header.scl_inter), (1.0, 0.0));
    // Raw bytes: the 4-byte extension flag is zero and the data starts at 352.
    let raw = raw_bytes(&out);
    assert_eq!(&raw[348..352], &[0, 0, 0, 0]);
    assert_eq!(raw.len(), 352 + 122 * 101 * 30);

    // A label >= 256 switches to uint16; plain .nii when the name has no .gz.
    let mut big = labels.clone();
    big[[3, 4, 5]] = 300;
    big[[121, 100, 29]] = 65535;
    let out = dir.path().join("seg16.nii");
    volume::write_labels(&out, big.view(), &v.header).unwrap();
    let raw = std::fs::read(&out).unwrap();
    assert_eq!(raw.len(), 352 + 2 * 122 * 101 * 30);
    let r = volume::read(&out).unwrap();
    assert_eq!(r.header.dtype_name(), "uint16");
    assert!(!r.header.gzipped);
    assert_eq!(r.data[[0, 3, 4, 5]], 300.0);
    assert_eq!(r.data[[0, 121, 100, 29]], 65535.0);
    assert_eq!(
        r.data.index_axis(ndarray::Axis(0), 0).mapv(|x| x as u16),
        big
    );
    assert_same_geometry(&r.header, &v.header);
    // File offset of (3,4,5) by hand.
    let off = 352 + 2 * (3 + 122 * (4 + 101 * 5));
    assert_eq!(u16::from_le_bytes([raw[off], raw[off + 1]]), 300);

    // Shape mismatch is refused.
    let small = Array3::<u16>::zeros((2, 2, 2));
    let out = dir.path().join("bad.nii");
    let e = volume::write_labels(&out, small.view(), &v.header).unwrap_err();
    assert!(e.to_string().contains("bad.nii"), "{e}");
    assert!(!out.exists());
}

#[test]
fn floats_roundtrip_3d_and_4d() {
    let dir = tempfile::tempdir().unwrap();
    // Big-endian NIfTI-1 input (sform+qform code 2, qfac -1): exact geometry through the writer.
    let v = volume::read(fixture("nibabel_anatomical_bigendian.nii")).unwrap();
    let mut data = v.data.clone();
    data.mapv_inplace(|x| x * 0.37 - 5.25);
    data[[0, 1, 2, 3]] = f32::NAN; // NaN passes through the float writer as is
    let out = dir.path().join("f.nii.gz");
    volume::write_f32(&out, data.view(), &v.header).unwrap();
    let r = volume::read(&out).unwrap();
    assert_eq!(r.header.dtype_name(), "float32");
    assert_eq!(r.header.dim[0], 3);
    assert_same_geometry(&r.header, &v.header);
    assert_eq!((r.header.qform_code, r.header.sform_code), (2, 2));
    assert_eq!(r.header.pixdim[0], -1.0);
    assert_qform_matches_sform(&r.header, 1e-5);
    assert!(r.data[[0, 1, 2, 3]].is_nan());
    let same = r
        .data
        .iter()
        .zip(data.iter())
        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
    assert!(same);

    // NIfTI-2 4-D input (2 channels, f64 srow) -> NIfTI-1 4-D float output.
    let v = volume::read(fixture("nibabel_example_nifti2.nii.gz")).unwrap();
    let out = dir.path().join("f4.nii");
    volume::write_f32(&out, v.data.view(), &v.header).unwrap();
    let r = volume::read(&out).unwrap();
    assert_eq!(r.header.version, 1);
    assert_eq!(&r.header.dim[..5], &[4, 32, 20, 12, 2]);
    assert_eq!(r.data, v.data);
    assert_eq!(r.header.shape(), v.header.shape());
    let want: Vec<f64> = v.header.pixdim[1..5]
        .iter()
        .map(|&p| p as f32 as f64)
        .collect();
    assert_eq!(r.header.pixdim[1..5].to_vec(), want);
    // srow were f64 in the NIfTI-2 header: equal to f32 precision.
    let (a, b) = (r.header.affine(), v.header.affine());
    for i in 0..3 {
        for j in 0..4 {
            assert_eq!(a[i][j], b[i][j] as f32 as f64);
        }
    }
    assert_qform_matches_sform(&r.header, 1e-4);
    // File order by hand: channel 1, voxel (2,3,4).
    let raw = std::fs::read(&out).unwrap();
    let off = 352 + 4 * (2 + 32 * (3 + 20 * (4 + 12)));
    assert_eq!(
        f32::from_le_bytes(raw[off..off + 4].try_into().unwrap()),
        v.data[[1, 2, 3, 4]]
    );

    // A C-ordered (standard layout) array writes the same bytes as the Fortran-ordered one.
    let std_layout: Array4<f32> = v.data.as_standard_layout().to_owned();
    let out2 = dir.path().join("f4c.nii");
    volume::write_f32(&out2, std_layout.view(), &v.header).unwrap();
    assert_eq!(std::fs::read(&out2).unwrap(), raw);
}

/// An oblique, left-handed sform written out: the qform computed from it gives the same matrix.
#[test]
fn qform_quaternion_roundtrip_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = volume::read_header(fixture("ts_example_ct_sm_seg.nii.gz")).unwrap();
    let (a, b, c) = (0.4f64, -0.7f64, 1.9f64);
    // Rotation from Rodrigues' formula about a normalised axis, independent of quaternions.
    let n = (a * a + b * b + c * c).sqrt();
    let (ux, uy, uz, th) = (a / n, b / n, c / n, 0.8f64);
    let (s, co) = th.sin_cos();
    let r = [
        [
            co + ux * ux * (1.0 - co),
            ux * uy * (1.0 - co) - uz * s,
            ux * uz * (1.0 - co) + uy * s,
        ],
        [
            uy * ux * (1.0 - co) + uz * s,
            co + uy * uy * (1.0 - co),
            uy * uz * (1.0 - co) - ux * s,
        ],
        [
            uz * ux * (1.0 - co) - uy * s,
            uz * uy * (1.0 - co) + ux * s,
            co + uz * uz * (1.0 - co),
        ],
    ];
    for left in [false, true] {
        let zooms = [0.8, 1.1, if left { -2.5 } else { 2.5 }];
        let mut h = base.clone();
        let rows: Vec<[f64; 4]> = (0..3)
            .map(|i| {
                let mut row = [0.0; 4];
                for j in 0..3 {
                    row[j] = (r[i][j] * zooms[j]) as f32 as f64;
                }
                row[3] = [12.5, -3.0, 40.25][i];
                row
            })
            .collect();
        h.srow_x = rows[0];
        h.srow_y = rows[1];
        h.srow_z = rows[2];
        h.pixdim[1..4].copy_from_slice(&[0.8, 1.1, 2.5].map(|p: f64| p as f32 as f64));
        h.sform_code = 4;
        h.qform_code = 0;
        let labels = Array3::<u16>::zeros((122, 101, 30));
        let out = dir.path().join(format!("q{left}.nii"));
        volume::write_labels(&out, labels.view(), &h).unwrap();
        let back = volume::read_header(&out).unwrap();
        assert_eq!((back.qform_code, back.sform_code), (4, 4));
        assert_eq!(back.pixdim[0], if left { -1.0 } else { 1.0 });
        assert_eq!(back.sform_affine(), h.sform_affine());
        assert_qform_matches_sform(&back, 1e-5);
        assert_eq!(back.orientation(), h.orientation());

        // And the public matrix -> quaternion -> matrix functions directly (f64, no f32 storage).
        let m = h.sform_affine();
        let (q, off, z, qfac) = volume::mat44_to_quatern(&m);
        assert_eq!(qfac, if left { -1.0 } else { 1.0 });
        let m2 = volume::quatern_to_mat44(q, off, z, qfac);
        for i in 0..4 {
            for j in 0..4 {
                assert!((m[i][j] - m2[i][j]).abs() < 1e-5);
            }
        }
    }

    // Input with only a qform (code 1): the quaternion is copied, sform = that qform matrix.
    let mut h = volume::read_header(fixture("nibabel_anatomical_bigendian.nii")).unwrap();
    h.sform_code = 0;
    h.qform_code = 1;
    let out = dir.path().join("qonly.nii");
    volume::write_labels(&out, Array3::<u16>::zeros((33, 41, 25)).view(), &h).unwrap();
    let back = volume::read_header(&out).unwrap();
    assert_eq!((back.qform_code, back.sform_code), (1, 1));
    assert_eq!(back.qform_affine(), h.qform_affine());
    assert_eq!(
        [back.quatern_b, back.quatern_c, back.quatern_d],
        [h.quatern_b, h.quatern_c, h.quatern_d]
    );
    assert_qform_matches_sform(&back, 1e-6);

    // Neither code: both stay 0, affine() falls back to diag(pixdim) on input and output alike.
    h.qform_code = 0;
    let out = dir.path().join("nocode.nii");
    volume::write_labels(&out, Array3::<u16>::zeros((33, 41, 25)).view(), &h).unwrap();
    let back = volume::read_header(&out).unwrap();
    assert_eq!((back.qform_code, back.sform_code), (0, 0));
    assert_eq!(back.affine(), h.affine());
    assert_eq!(h.affine()[0], [2.0, 0.0, 0.0, 0.0]);
}

#[test]
fn failed_writes_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let v = volume::read(fixture("nibabel_anatomical_bigendian.nii")).unwrap();
    let labels = v
        .data
        .index_axis(ndarray::Axis(0), 0)
        .mapv(|x| x.max(0.0) as u16);
    let listing = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };

    // Nonexistent folder.
    let out = dir.path().join("nope").join("x.nii.gz");
    let e = volume::write_labels(&out, labels.view(), &v.header).unwrap_err();
    assert!(e.to_string().contains("x.nii.gz"), "{e}");
    assert_eq!(listing(dir.path()), Vec::<String>::new());

    // Failure at the very end (rename onto an existing non-empty directory): the whole temp file was
    // written and fsynced, then must be removed.
    let blocker = dir.path().join("out.nii.gz");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("keep"), b"x").unwrap();
    let e = volume::write_f32(&blocker, v.data.view(), &v.header).unwrap_err();
    assert!(e.to_string().contains("out.nii.gz"), "{e}");
    assert_eq!(listing(dir.path()), vec!["out.nii.gz".to_string()]);
    assert_eq!(listing(&blocker), vec!["keep".to_string()]);

    // Read-only folder (skipped when running as root, which ignores permissions).
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let probe = ro.join("probe");
    if std::fs::write(&probe, b"").is_err() {
        let out = ro.join("x.nii");
        assert!(volume::write_labels(&out, labels.view(), &v.header).is_err());
        assert_eq!(listing(&ro), Vec::<String>::new());
    } else {
        std::fs::remove_file(&probe).unwrap();
    }
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Overwriting an existing output works and leaves no temp file.
    let out = dir.path().join("ok.nii");
    std::fs::write(&out, b"old").unwrap();
    volume::write_labels(&out, labels.view(), &v.header).unwrap();
    assert_eq!(listing(dir.path()), vec!["ok.nii", "out.nii.gz", "ro"]);
    assert_eq!(volume::read(&out).unwrap().header.shape(), [33, 41, 25]);
}

#[test]
fn describe_reports_geometry_and_value_range() {
    let path = fixture("ts_example_ct.nii.gz");
    let v = volume::read(&path).unwrap();
    let d = volume::describe(&path, &v);
    // Independent stats from the raw int32 bytes.
    let b = raw_bytes(&path);
    let vals: Vec<i32> = b[352..]
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals.len(), 122 * 101 * 112);
    let (mn, mx) = (vals.iter().min().unwrap(), vals.iter().max().unwrap());
    let mean = vals.iter().map(|&x| x as f64).sum::<f64>() / vals.len() as f64;
    for needle in [
        "ts_example_ct.nii.gz".to_string(),
        "122 x 101 x 112".into(),
        "int32".into(),
        "RAS".into(),
        "3 x 3 x 3".into(),
        "sform, code 2".into(),
        format!("min {mn}, max {mx}, mean {mean:.6}"),
        "0 NaN, 0 Inf".into(),
    ] {
        assert!(d.contains(&needle), "'{needle}' missing in:\n{d}");
    }

    let mut v2 = v.clone();
    v2.data[[0, 0, 0, 0]] = f32::NAN;
    v2.data[[0, 1, 0, 0]] = f32::INFINITY;
    assert!(volume::describe(&path, &v2).contains("1 NaN, 1 Inf"));
    let (nan, inf) = volume::sanitize_nonfinite(&mut v2.data);
    assert_eq!((nan, inf), (1, 1));
    assert_eq!(v2.data[[0, 0, 0, 0]], 0.0);
    // +Inf becomes the finite max, which is the raw max unless that voxel held it.
    let finite_max = v2.data.iter().cloned().fold(f32::MIN, f32::max);
    assert_eq!(v2.data[[0, 1, 0, 0]], finite_max);
}

#[test]
fn synthetic_header_writes_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let h = Header::new([5, 4, 3], 2, [0.5, 0.75, 2.0]);
    assert_eq!(h.shape(), [5, 4, 3]);
    assert_eq!(h.channels(), 2);
    assert_eq!(h.orientation(), "RAS");
    assert_qform_matches_sform(&h, 0.0);
    let data = Array4::from_shape_fn((2, 5, 4, 3), |(c, i, j, k)| {
        (c * 1000 + i * 100 + j * 10 + k) as f32
    });
    let out = dir.path().join("syn.nii.gz");
    volume::write_f32(&out, data.view(), &h).unwrap();
    let r = volume::read(&out).unwrap();
    assert_eq!(r.data, data);
    assert_eq!(r.header.affine(), h.affine());
    assert_eq!(r.header.spacing(), [0.5, 0.75, 2.0]);
    assert_eq!((r.header.qform_code, r.header.sform_code), (1, 1));
    assert_eq!(r.header.xyzt_units, 2);
}

#[test]
fn outputs_too_wide_for_nifti1_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let h = Header::new([40000, 1, 1], 1, [1.0; 3]);
    let out = dir.path().join("wide.nii");
    let e = volume::write_labels(&out, Array3::<u16>::zeros((40000, 1, 1)).view(), &h)
        .unwrap_err()
        .to_string();
    assert!(e.contains("wide.nii") && e.contains("32767"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
