//! Label maps that carry their class names: `intent_code` = NIFTI_INTENT_LABEL and a Caret XML
//! label table (`<CaretExtension>` … `<LabelTable>`) in a NIfTI extension, written as
//! TotalSegmentator writes it: extension code 0, because nibabel decodes code 30 (Caret) with a
//! handler whose `get_content()` raises, and TotalSegmentator's `load_multilabel_nifti` reads
//! `extensions[0].get_content()` as XML. Optional sidecars: `labels.json` and a 3D Slicer colour
//! table (`.ctbl`; Slicer ignores NIfTI extensions). NIfTI-1 or NIfTI-2 headers. Colours come
//! from [`crate::volume::label_colour`], the preview's too.

use super::geometry::output_geometry;
use super::header::{self, encode_nifti1, Header};
use crate::{Error, Result};
use std::io::{Read, Write};
use std::path::Path;

/// NIFTI_INTENT_LABEL: the values are indices into a label table.
pub const NIFTI_INTENT_LABEL: i32 = 1002;
/// NIFTI_ECODE_CARET: Caret/Workbench XML; read back (voxtile wrote it before), not written.
pub const NIFTI_ECODE_CARET: i32 = 30;
/// NIFTI_ECODE_IGNORE: the code the label table is written with (TotalSegmentator's, which
/// nibabel hands back as bytes).
pub const NIFTI_ECODE_IGNORE: i32 = 0;

/// Class names of a label map: `names[i]` names label value `i` (label 0 is usually
/// "background"). An empty name leaves that value out of the table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelNames {
    /// Name of each label value, by value.
    pub names: Vec<String>,
}

/// How a label map is written: with class names (intent LABEL + Caret extension) or not, as
/// NIfTI-1 (the default) or NIfTI-2.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabelOptions<'a> {
    /// Class names to store in the file; None writes a plain label map, as before.
    pub names: Option<&'a LabelNames>,
    /// Write a NIfTI-2 header (540 bytes, 64-bit dims) instead of NIfTI-1.
    pub nifti2: bool,
}

/// `s` inside CDATA, a `]]>` in it split across two sections.
fn cdata(s: &str) -> String {
    format!("<![CDATA[{}]]>", s.replace("]]>", "]]]]><![CDATA[>"))
}

impl LabelNames {
    /// Names by label value.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        LabelNames {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// The Caret XML label table TotalSegmentator writes (`VolumeType` Label).
    pub fn caret_xml(&self) -> String {
        let mut x = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CaretExtension Version=\"1.0\">\n<VolumeInformation Index=\"0\">\n<LabelTable>\n",
        );
        for (i, n) in self.names.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            let [r, g, b] = super::label_colour(i as u16).map(|c| c as f64 / 255.0);
            let alpha = if i == 0 { 0 } else { 1 };
            x += &format!(
                "<Label Key=\"{i}\" Red=\"{r:.6}\" Green=\"{g:.6}\" Blue=\"{b:.6}\" Alpha=\"{alpha}\">{}</Label>\n",
                cdata(n)
            );
        }
        x += "</LabelTable>\n<VolumeType><![CDATA[Label]]></VolumeType>\n</VolumeInformation>\n</CaretExtension>\n";
        x
    }

    /// The names of a Caret XML label table (keys up to 65535; values absent from the table get
    /// empty names).
    pub fn from_caret_xml(xml: &str) -> std::result::Result<Self, String> {
        if !xml.contains("<CaretExtension") || !xml.contains("<LabelTable") {
            return Err("not a Caret XML label table".into());
        }
        let mut names: Vec<String> = Vec::new();
        for part in xml.split("<Label ").skip(1) {
            let key = part
                .split_once("Key=\"")
                .and_then(|(_, r)| r.split_once('"'))
                .and_then(|(k, _)| k.trim().parse::<u16>().ok())
                .ok_or("a <Label> without a valid Key")?;
            let body = part
                .split_once('>')
                .and_then(|(_, r)| r.split_once("</Label>"))
                .map(|(b, _)| b)
                .ok_or("an unterminated <Label>")?;
            let mut name = String::new();
            let mut rest = body;
            while let Some((before, after)) = rest.split_once("<![CDATA[") {
                name += before;
                let (inner, tail) = after.split_once("]]>").ok_or("an unterminated CDATA")?;
                name += inner;
                rest = tail;
            }
            name += rest;
            let k = key as usize;
            if names.len() <= k {
                names.resize(k + 1, String::new());
            }
            names[k] = name.trim().to_string();
        }
        Ok(LabelNames { names })
    }

    /// The 3D Slicer colour table (`.ctbl`, "index name R G B A" a line, 0-255; spaces in a
    /// name become `_`, as the format asks): load it with Add Data, then pick it when importing
    /// the label map as a segmentation to get the names and colours.
    pub fn slicer_ctbl(&self) -> String {
        let named: Vec<(usize, &String)> = self
            .names
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.is_empty())
            .collect();
        let mut t = format!("# Color table file\n# {} values\n", named.len());
        for (i, n) in named {
            let [r, g, b] = super::label_colour(i as u16);
            let alpha = if i == 0 { 0 } else { 255 };
            let name: String = n
                .chars()
                .map(|c| if c.is_whitespace() { '_' } else { c })
                .collect();
            t += &format!("{i} {name} {r} {g} {b} {alpha}\n");
        }
        t
    }

    /// `{"1": "spleen", ...}` as TotalSegmentator's label maps (values with a name only).
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .names
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.is_empty())
            .map(|(i, n)| (i.to_string(), serde_json::Value::String(n.clone())))
            .collect();
        serde_json::to_string_pretty(&map).unwrap_or_default() + "\n"
    }
}

/// One NIfTI extension: esize (a multiple of 16), ecode, the data zero-padded.
fn extension(code: i32, data: &[u8]) -> Vec<u8> {
    let size = (8 + data.len()).div_ceil(16) * 16;
    let mut e = Vec::with_capacity(size);
    e.extend_from_slice(&(size as i32).to_le_bytes());
    e.extend_from_slice(&code.to_le_bytes());
    e.extend_from_slice(data);
    e.resize(size, 0);
    e
}

/// The header bytes (header, extension flag, extensions) of a label map of datatype `dt`.
pub(crate) fn label_header(
    like: &Header,
    shape: [usize; 3],
    dt: i16,
    opts: &LabelOptions,
) -> std::result::Result<Vec<u8>, String> {
    let ext = opts
        .names
        .map(|n| extension(NIFTI_ECODE_IGNORE, n.caret_xml().as_bytes()))
        .unwrap_or_default();
    let intent = if opts.names.is_some() {
        NIFTI_INTENT_LABEL
    } else {
        0
    };
    let descrip = "voxtile labels";
    let mut b = if opts.nifti2 {
        encode_nifti2(like, shape, dt, descrip)?
    } else {
        encode_nifti1(like, shape, 1, dt, descrip)?.to_vec()
    };
    let base = b.len();
    if !ext.is_empty() {
        b[base - 4] = 1; // extension flag
        b.extend_from_slice(&ext);
    }
    let vox = b.len();
    if opts.nifti2 {
        b[168..176].copy_from_slice(&(vox as i64).to_le_bytes());
        b[504..508].copy_from_slice(&intent.to_le_bytes());
        if intent != 0 {
            b[508..514].copy_from_slice(b"labels");
        }
    } else {
        b[108..112].copy_from_slice(&(vox as f32).to_le_bytes());
        b[68..70].copy_from_slice(&(intent as i16).to_le_bytes());
        if intent != 0 {
            b[328..334].copy_from_slice(b"labels");
        }
    }
    Ok(b)
}

/// A NIfTI-2 header (540 bytes + 4-byte extension flag) for a 3-D output of `like`'s geometry:
/// the fields of [`encode_nifti1`] at NIfTI-2 offsets and widths.
fn encode_nifti2(
    like: &Header,
    shape: [usize; 3],
    dt: i16,
    descrip: &str,
) -> std::result::Result<Vec<u8>, String> {
    let (_, bpv) = header::datatype_info(dt)?;
    let g = output_geometry(like);
    let mut b = vec![0u8; header::NIFTI2_SIZE + 4];
    let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
    put(0, &540i32.to_le_bytes());
    put(4, b"n+2\0\r\n\x1a\n");
    put(12, &dt.to_le_bytes());
    put(14, &((8 * bpv) as i16).to_le_bytes());
    let dims = [3, shape[0], shape[1], shape[2], 1, 1, 1, 1];
    for (i, &d) in dims.iter().enumerate() {
        put(16 + 8 * i, &(d as i64).to_le_bytes());
    }
    let mut pixdim = like.pixdim;
    pixdim[0] = g.qfac;
    pixdim[1..4].copy_from_slice(&g.zooms);
    for (i, &p) in pixdim.iter().enumerate() {
        put(
            104 + 8 * i,
            &(if p.is_finite() { p } else { 0.0 }).to_le_bytes(),
        );
    }
    put(176, &1f64.to_le_bytes());
    put(224, &like.slice_start.to_le_bytes());
    put(232, &like.slice_end.to_le_bytes());
    let d = descrip.as_bytes();
    put(240, &d[..d.len().min(79)]);
    put(344, &g.qform_code.to_le_bytes());
    put(348, &g.sform_code.to_le_bytes());
    for (i, v) in g.quatern.iter().chain(g.qoffset.iter()).enumerate() {
        put(352 + 8 * i, &v.to_le_bytes());
    }
    for r in 0..3 {
        for c in 0..4 {
            put(400 + 32 * r + 8 * c, &g.sform[r][c].to_le_bytes());
        }
    }
    put(496, &like.slice_code.to_le_bytes());
    put(500, &like.xyzt_units.to_le_bytes());
    put(524, &[like.dim_info]);
    Ok(b)
}

/// Write the `labels.json` sidecar (`{"1": "liver", ...}`), replacing an existing file.
pub fn write_labels_json(path: &Path, names: &LabelNames) -> Result<()> {
    stage_labels_json(path, names)?.commit(true)
}

/// [`write_labels_json`], staged for the caller to commit with the run's other outputs.
pub fn stage_labels_json(path: &Path, names: &LabelNames) -> Result<crate::staged::Staged> {
    let text = names.to_json();
    crate::staged::stage(path, |f| f.write_all(text.as_bytes()))
}

/// Stage the 3D Slicer colour table ([`LabelNames::slicer_ctbl`]) for the caller to commit with
/// the run's other outputs.
pub fn stage_color_table(path: &Path, names: &LabelNames) -> Result<crate::staged::Staged> {
    let text = names.slicer_ctbl();
    crate::staged::stage(path, |f| f.write_all(text.as_bytes()))
}

/// Largest header + extensions read back (vox_offset of a label map with thousands of names).
const EXT_CAP: u64 = 16 << 20;

/// The class names stored in a NIfTI file's Caret extension (plain or gzip, NIfTI-1 or -2); None
/// when it has none.
pub fn read_label_names(path: &Path) -> Result<Option<LabelNames>> {
    let h = super::read::read_header(path)?;
    let (file, _) = crate::sys::fsio::open_regular(path, u64::MAX, true)?;
    let mut r: Box<dyn Read> = if h.gzipped {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
            file,
        )))
    } else {
        Box::new(file)
    };
    let want = h.vox_offset.min(EXT_CAP);
    let mut b = Vec::new();
    (&mut r)
        .take(want)
        .read_to_end(&mut b)
        .map_err(|e| Error::io(path, e))?;
    let size = if h.version == 1 { 348 } else { 540 };
    if b.len() < size + 4 || b[size] == 0 {
        return Ok(None);
    }
    let rd = |p: usize| {
        let a = [b[p], b[p + 1], b[p + 2], b[p + 3]];
        if h.big_endian {
            i32::from_be_bytes(a)
        } else {
            i32::from_le_bytes(a)
        }
    };
    let mut at = size + 4;
    while at + 8 <= b.len() {
        let (esize, code) = (rd(at), rd(at + 4));
        if esize < 16 || esize % 16 != 0 || at + esize as usize > b.len() {
            return Err(Error::volume(
                path,
                format!("invalid NIfTI extension size {esize}"),
            ));
        }
        let data = &b[at + 8..at + esize as usize];
        let text = String::from_utf8_lossy(data);
        if (code == NIFTI_ECODE_CARET || code == NIFTI_ECODE_IGNORE)
            && text.contains("<CaretExtension")
        {
            let text = text.trim_end_matches('\0');
            return LabelNames::from_caret_xml(text)
                .map(Some)
                .map_err(|m| Error::volume(path, m));
        }
        at += esize as usize;
    }
    Ok(None)
}
