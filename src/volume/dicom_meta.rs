//! One DICOM slice: what its header says (read with dicom-rs up to the pixel data), its decoding
//! into the volume, and the length check every file passes before dicom-rs parses it.

use super::header;
use crate::{Error, Result};
use dicom_object::{FileDicomObject, InMemDicomObject, OpenFileOptions, Tag};
use dicom_pixeldata::PixelDecoder;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

const PIXEL_DATA: Tag = Tag(0x7FE0, 0x0010);
const DICOMDIR_CLASS: &str = "1.2.840.10008.1.3.10";

/// Transfer syntaxes decoded here: native, RLE, and the JPEG family of jpeg-decoder.
const SUPPORTED: [&str; 7] = [
    "1.2.840.10008.1.2",
    "1.2.840.10008.1.2.1",
    "1.2.840.10008.1.2.2",
    "1.2.840.10008.1.2.5",
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.70",
];

/// Name of a transfer syntax for the refusal message.
fn ts_name(uid: &str) -> &'static str {
    match uid {
        "1.2.840.10008.1.2.1.99" => "Deflated Explicit VR Little Endian",
        "1.2.840.10008.1.2.4.57" => "JPEG Lossless (process 14)",
        "1.2.840.10008.1.2.4.80" | "1.2.840.10008.1.2.4.81" => "JPEG-LS",
        "1.2.840.10008.1.2.4.90" | "1.2.840.10008.1.2.4.91" => "JPEG 2000",
        "1.2.840.10008.1.2.4.201" | "1.2.840.10008.1.2.4.202" | "1.2.840.10008.1.2.4.203" => {
            "HTJ2K"
        }
        "1.2.840.10008.1.2.4.100" | "1.2.840.10008.1.2.4.101" | "1.2.840.10008.1.2.4.102" => {
            "MPEG video"
        }
        _ => "an unknown transfer syntax",
    }
}

type Obj = FileDicomObject<InMemDicomObject>;

/// What the stacking needs from one image file's header.
#[derive(Debug, Clone)]
pub(crate) struct Slice {
    pub path: PathBuf,
    pub series: String,
    pub rows: usize,
    pub cols: usize,
    /// ImageOrientationPatient: row cosine then column cosine (LPS).
    pub iop: [f64; 6],
    /// ImagePositionPatient (LPS, mm).
    pub ipp: [f64; 3],
    /// PixelSpacing: [between rows, between columns].
    pub spacing: [f64; 2],
    /// No PixelSpacing in the file: `spacing` is the assumed 1 mm (the reader warns once).
    pub spacing_missing: bool,
    pub thickness: f64,
    pub slope: f64,
    pub intercept: f64,
    pub bits: u16,
    pub signed: bool,
    modality: String,
    description: String,
}

/// The file's bytes, length-checked, parsed by dicom-rs (up to the pixel data when `header_only`).
fn open(path: &Path, header_only: bool) -> Result<Obj> {
    let bytes = crate::sys::fsio::read_regular(path, super::dicom::FILE_CAP)?;
    check_lengths(&bytes).map_err(|m| Error::volume(path, m))?;
    let mut opts = OpenFileOptions::new().read_preamble(dicom_object::file::ReadPreamble::Always);
    if header_only {
        opts = opts.read_until(PIXEL_DATA);
    }
    match catch_unwind(AssertUnwindSafe(|| opts.from_reader(&bytes[..]))) {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(Error::volume(
            path,
            format!("not a readable DICOM file ({e})"),
        )),
        Err(_) => Err(Error::volume(path, "the DICOM parser failed on this file")),
    }
}

fn text(o: &Obj, tag: Tag) -> Option<String> {
    let e = o.element_opt(tag).ok()??;
    Some(e.to_str().ok()?.trim().to_string())
}

fn floats(o: &Obj, tag: Tag) -> Option<Vec<f64>> {
    o.element_opt(tag).ok()??.to_multi_float64().ok()
}

/// A numeric field as the file holds it: None when absent or empty, `Err` when it is not numbers.
fn present_floats(o: &Obj, tag: Tag) -> Option<std::result::Result<Vec<f64>, ()>> {
    let e = o.element_opt(tag).ok()??;
    let blank = || {
        e.to_str()
            .is_ok_and(|s| s.trim_matches(['\0', ' ']).is_empty())
    };
    match e.to_multi_float64() {
        Ok(v) if v.is_empty() => None,
        Ok(v) => Some(Ok(v)),
        Err(_) if blank() => None,
        Err(_) => Some(Err(())),
    }
}

/// Largest departure from unit length, or from a right angle (cosine), of the two direction
/// cosines of ImageOrientationPatient: written values round to ~1e-6, a sheared or scaled one is
/// off by far more.
const ORIENTATION_TOLERANCE: f64 = 1e-3;

/// PixelSpacing (rows, columns): two finite positive numbers; Ok(None) when the file has none
/// (1 mm is then assumed, with a warning); zero, negative, NaN or unreadable is an error.
pub(crate) fn check_spacing(
    v: Option<std::result::Result<Vec<f64>, ()>>,
) -> std::result::Result<Option<[f64; 2]>, String> {
    match v {
        None => Ok(None),
        Some(Ok(v)) if v.len() == 2 && v.iter().all(|&s| s > 0.0 && s.is_finite()) => {
            Ok(Some([v[0], v[1]]))
        }
        Some(Ok(v)) if v.len() == 2 => Err(format!(
            "PixelSpacing {} x {} is not a positive voxel size",
            v[0], v[1]
        )),
        Some(_) => Err("PixelSpacing is not two numbers".into()),
    }
}

/// ImageOrientationPatient: two unit, orthogonal direction cosines (within
/// [`ORIENTATION_TOLERANCE`]); a sheared or scaled orientation has no voxel grid voxtile can write.
pub(crate) fn check_orientation(iop: &[f64]) -> std::result::Result<(), String> {
    let (r, c) = (&iop[0..3], &iop[3..6]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let worst = [
        (dot(r, r).sqrt() - 1.0).abs(),
        (dot(c, c).sqrt() - 1.0).abs(),
        dot(r, c).abs(),
    ];
    if iop.iter().any(|v| !v.is_finite()) || worst.iter().any(|&w| w > ORIENTATION_TOLERANCE) {
        return Err(format!(
            "ImageOrientationPatient {:?} is not two unit, orthogonal direction cosines (a sheared or scaled orientation)",
            iop
        ));
    }
    Ok(())
}

/// RescaleSlope / RescaleIntercept: absent is 1 / 0; a slope of 0 or a non-finite or unreadable
/// value is an error (a slope of 0 would flatten the volume to one value).
pub(crate) fn check_rescale(
    slope: Option<std::result::Result<Vec<f64>, ()>>,
    intercept: Option<std::result::Result<Vec<f64>, ()>>,
) -> std::result::Result<(f64, f64), String> {
    let one = |v: Option<std::result::Result<Vec<f64>, ()>>, name: &str, default: f64| match v {
        None => Ok(default),
        Some(Ok(v)) if v.len() == 1 && v[0].is_finite() => Ok(v[0]),
        Some(_) => Err(format!("{name} is not one finite number")),
    };
    let slope = one(slope, "RescaleSlope", 1.0)?;
    if slope == 0.0 {
        return Err("RescaleSlope is 0 (every voxel would read as the intercept)".into());
    }
    Ok((slope, one(intercept, "RescaleIntercept", 0.0)?))
}

fn int(o: &Obj, tag: Tag) -> Option<i64> {
    o.element_opt(tag).ok()??.to_int::<i64>().ok()
}

impl Slice {
    /// The slice described by an image file's header; None for files that are not images
    /// (DICOMDIR, reports, presentation states).
    pub fn scan(path: &Path) -> Result<Option<Slice>> {
        let o = open(path, true)?;
        if o.meta()
            .media_storage_sop_class_uid()
            .trim_end_matches('\0')
            == DICOMDIR_CLASS
        {
            return Ok(None);
        }
        let (Some(rows), Some(cols)) = (int(&o, Tag(0x0028, 0x0010)), int(&o, Tag(0x0028, 0x0011)))
        else {
            return Ok(None);
        };
        let bad = |m: String| Err(Error::volume(path, m));
        let err = |m: String| Error::volume(path, m);
        let ts = o
            .meta()
            .transfer_syntax()
            .trim_end_matches('\0')
            .to_string();
        if !SUPPORTED.contains(&ts.as_str()) {
            return bad(format!(
                "transfer syntax {ts} ({}) is not supported; convert the series with dcm2niix, or decompress it (`gdcmconv --raw`)",
                ts_name(&ts)
            ));
        }
        if int(&o, Tag(0x0028, 0x0008)).is_some_and(|f| f > 1) {
            return bad("a multi-frame (enhanced) DICOM file; convert it with dcm2niix".into());
        }
        if int(&o, Tag(0x0028, 0x0002)).is_some_and(|s| s != 1) {
            return bad(
                "a colour image (SamplesPerPixel > 1): voxtile reads grey-level series".into(),
            );
        }
        let (Some(iop), Some(ipp)) = (
            floats(&o, Tag(0x0020, 0x0037)).filter(|v| v.len() == 6),
            floats(&o, Tag(0x0020, 0x0032)).filter(|v| v.len() == 3),
        ) else {
            return bad(
                "no ImageOrientationPatient/ImagePositionPatient: not a slice of a volume".into(),
            );
        };
        let spacing = check_spacing(present_floats(&o, Tag(0x0028, 0x0030))).map_err(err)?;
        check_orientation(&iop).map_err(err)?;
        let (slope, intercept) = check_rescale(
            present_floats(&o, Tag(0x0028, 0x1053)),
            present_floats(&o, Tag(0x0028, 0x1052)),
        )
        .map_err(err)?;
        let bits = int(&o, Tag(0x0028, 0x0100)).unwrap_or(16);
        if !matches!(bits, 8 | 16 | 32)
            || !(1..=65535).contains(&rows)
            || !(1..=65535).contains(&cols)
        {
            return bad(format!(
                "unsupported image: {rows}x{cols}, {bits} bits allocated"
            ));
        }
        let s = Slice {
            path: path.to_path_buf(),
            series: text(&o, Tag(0x0020, 0x000E)).unwrap_or_default(),
            rows: rows as usize,
            cols: cols as usize,
            iop: [iop[0], iop[1], iop[2], iop[3], iop[4], iop[5]],
            ipp: [ipp[0], ipp[1], ipp[2]],
            spacing: spacing.unwrap_or([1.0, 1.0]),
            spacing_missing: spacing.is_none(),
            thickness: floats(&o, Tag(0x0018, 0x0050))
                .and_then(|v| v.first().copied())
                .filter(|t| *t > 0.0 && t.is_finite())
                .unwrap_or(1.0),
            slope,
            intercept,
            bits: bits as u16,
            signed: int(&o, Tag(0x0028, 0x0103)) == Some(1),
            modality: text(&o, Tag(0x0008, 0x0060)).unwrap_or_default(),
            description: text(&o, Tag(0x0008, 0x103E)).unwrap_or_default(),
        };
        let finite = s.iop.iter().chain(&s.ipp).all(|v| v.is_finite())
            && s.slope.is_finite()
            && s.intercept.is_finite();
        if !finite || s.normal().iter().all(|v| v.abs() < 1e-6) {
            return bad("invalid ImageOrientationPatient, position or rescale values".into());
        }
        Ok(Some(s))
    }

    /// "CT, 'description'" for listings of the series in a folder.
    pub fn describe(&self) -> String {
        format!("{} \"{}\"", self.modality, self.description)
    }

    /// Unit slice normal: row cosine × column cosine.
    pub fn normal(&self) -> [f64; 3] {
        let (r, c) = (&self.iop[0..3], &self.iop[3..6]);
        let n = [
            r[1] * c[2] - r[2] * c[1],
            r[2] * c[0] - r[0] * c[2],
            r[0] * c[1] - r[1] * c[0],
        ];
        let l = (n[0] * n[0] + n[1] * n[1] + n[2] * n[2]).sqrt();
        n.map(|v| v / l)
    }

    /// Position of the slice along `n`.
    pub fn along(&self, n: &[f64; 3]) -> f64 {
        self.ipp[0] * n[0] + self.ipp[1] * n[1] + self.ipp[2] * n[2]
    }

    /// The NIfTI datatype of the stored pixels.
    pub fn nifti_datatype(&self) -> i16 {
        match (self.bits, self.signed) {
            (8, false) => header::DT_UINT8,
            (8, true) => header::DT_INT8,
            (16, false) => header::DT_UINT16,
            (16, true) => header::DT_INT16,
            (_, false) => header::DT_UINT32,
            (_, true) => header::DT_INT32,
        }
    }

    /// Decode the pixels, rescale them, and append them to `out` with rows reversed (dcm2niix's
    /// layout: i = column fastest, j = row from the last).
    pub fn decode_into(&self, out: &mut Vec<f32>) -> Result<()> {
        let p = &self.path;
        let o = open(p, false)?;
        let decoded = match catch_unwind(AssertUnwindSafe(|| o.decode_pixel_data())) {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => {
                return Err(Error::volume(
                    p,
                    format!("pixel data cannot be decoded ({e})"),
                ))
            }
            Err(_) => return Err(Error::volume(p, "the pixel decoder failed on this file")),
        };
        let bpp = self.bits as usize / 8;
        let row_bytes = self.cols * bpp;
        let data = decoded.data();
        if (decoded.rows() as usize, decoded.columns() as usize) != (self.rows, self.cols)
            || decoded.bits_allocated() != self.bits
            || data.len() < row_bytes * self.rows
        {
            return Err(Error::volume(
                p,
                format!(
                    "pixel data holds {} bytes, the header's {}x{} image of {} bits needs {}",
                    data.len(),
                    self.rows,
                    self.cols,
                    self.bits,
                    row_bytes * self.rows
                ),
            ));
        }
        let stored = int_bits_stored(&o)
            .unwrap_or(self.bits as i64)
            .clamp(1, self.bits as i64);
        let value = |b: &[u8]| -> f64 {
            let raw: u32 = match bpp {
                1 => b[0] as u32,
                2 => u16::from_le_bytes([b[0], b[1]]) as u32,
                _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            };
            let shift = 32 - stored as u32;
            if self.signed {
                ((raw << shift) as i32 >> shift) as f64
            } else {
                ((raw << shift) >> shift) as f64
            }
        };
        for row in (0..self.rows).rev() {
            let line = &data[row * row_bytes..(row + 1) * row_bytes];
            out.extend(
                line.chunks_exact(bpp)
                    .map(|b| (value(b) * self.slope + self.intercept) as f32),
            );
        }
        Ok(())
    }
}

fn int_bits_stored(o: &Obj) -> Option<i64> {
    int(o, Tag(0x0028, 0x0101))
}

/// Walk every element header of a DICOM file and refuse a value length that runs past the end of
/// the file, before dicom-rs (which allocates a value's declared length up front) reads it: a
/// 300-byte file cannot make it allocate gigabytes. Deflated data sets are refused elsewhere.
pub(crate) fn check_lengths(b: &[u8]) -> std::result::Result<(), String> {
    if b.len() < 132 || &b[128..132] != b"DICM" {
        return Err("not a DICOM file (no DICM signature)".into());
    }
    let mut ts = String::new();
    let mut pos = 132usize;
    let (mut explicit, mut be, mut in_meta, mut fragments) = (true, false, true, false);
    let u16_at = |p: usize, be: bool| {
        let a = [b[p], b[p + 1]];
        if be {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        }
    };
    let u32_at = |p: usize, be: bool| {
        let a = [b[p], b[p + 1], b[p + 2], b[p + 3]];
        if be {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    };
    let short =
        |p: usize| format!("truncated DICOM file (an element header at byte {p} is cut off)");
    while pos < b.len() {
        if pos + 8 > b.len() {
            return Err(short(pos));
        }
        let group = u16_at(pos, be);
        if in_meta && group != 0x0002 {
            in_meta = false;
            explicit = ts != "1.2.840.10008.1.2";
            be = ts == "1.2.840.10008.1.2.2";
            if ts == "1.2.840.10008.1.2.1.99" {
                return Ok(()); // deflated: refused by transfer syntax before any pixel data
            }
            continue;
        }
        let elem = u16_at(pos + 2, be);
        let mut sq = false;
        let (len, head) = if group == 0xFFFE {
            (u32_at(pos + 4, be), 8)
        } else if explicit {
            let vr = &b[pos + 4..pos + 6];
            sq = vr == b"SQ";
            let long = matches!(
                vr,
                b"OB"
                    | b"OD"
                    | b"OF"
                    | b"OL"
                    | b"OV"
                    | b"OW"
                    | b"SQ"
                    | b"SV"
                    | b"UC"
                    | b"UN"
                    | b"UR"
                    | b"UT"
                    | b"UV"
            );
            if long {
                if pos + 12 > b.len() {
                    return Err(short(pos));
                }
                (u32_at(pos + 8, be), 12)
            } else {
                (u16_at(pos + 6, be) as u32, 8)
            }
        } else {
            (u32_at(pos + 4, be), 8)
        };
        pos += head;
        if group == 0xFFFE && elem != 0xE000 {
            // Item or sequence delimiter (length 0).
            fragments &= elem != 0xE0DD;
            continue;
        }
        if len == u32::MAX {
            // Undefined length: its items follow as element headers.
            fragments = (group, elem) == (0x7FE0, 0x0010);
            continue;
        }
        let end = pos.saturating_add(len as usize);
        if end > b.len() {
            return Err(format!(
                "element ({group:04X},{elem:04X}) declares {len} bytes but the file has {} left: truncated or corrupt",
                b.len() - pos
            ));
        }
        if in_meta && elem == 0x0010 {
            ts = String::from_utf8_lossy(&b[pos..end])
                .trim_end_matches(['\0', ' '])
                .to_string();
        }
        // Sequences and their items hold elements: walk into them; pixel fragments are data.
        let holds_elements = sq || (group == 0xFFFE && !fragments);
        if !holds_elements {
            pos = end;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fields_are_validated_not_defaulted() {
        assert_eq!(check_spacing(None), Ok(None));
        assert_eq!(
            check_spacing(Some(Ok(vec![0.8, 0.7]))),
            Ok(Some([0.8, 0.7]))
        );
        for bad in [
            vec![0.0, 0.7],
            vec![f64::NAN, 1.0],
            vec![-1.0, 1.0],
            vec![1.0],
        ] {
            assert!(check_spacing(Some(Ok(bad.clone()))).is_err(), "{bad:?}");
        }
        assert!(check_spacing(Some(Err(()))).is_err());
        assert!(check_orientation(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]).is_ok());
        let s = std::f64::consts::FRAC_1_SQRT_2;
        assert!(check_orientation(&[s, s, 0.0, -s, s, 0.0]).is_ok());
        for bad in [
            [1.0, 0.0, 0.0, 0.5, 0.866_025_4, 0.0],
            [2.0, 0.0, 0.0, 0.0, 1.0, 0.0],
            [1.0, 0.0, 0.0, 0.0, 0.99, 0.0],
            [f64::NAN, 0.0, 0.0, 0.0, 1.0, 0.0],
        ] {
            assert!(check_orientation(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_rescale(None, None), Ok((1.0, 0.0)));
        assert_eq!(
            check_rescale(Some(Ok(vec![2.0])), Some(Ok(vec![-1024.0]))),
            Ok((2.0, -1024.0))
        );
        assert!(check_rescale(Some(Ok(vec![0.0])), None).is_err());
        assert!(check_rescale(Some(Ok(vec![f64::INFINITY])), None).is_err());
        assert!(check_rescale(None, Some(Ok(vec![f64::NAN]))).is_err());
        assert!(check_rescale(Some(Err(())), None).is_err());
    }
}
