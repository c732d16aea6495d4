//! Value statistics and the `voxtile info` text: over a volume in memory, or streamed from the
//! file chunk by chunk ([`summarize`]) so describing a volume never holds it whole as f32.

use super::geometry::AffineSource;
use super::header::Header;
use super::payload::{self, Layout};
use super::{dicom, dispatch, metaimage, nrrd, pair, read, space_unit, Format, Volume};
use crate::Result;
use ndarray::Array4;
use std::fmt::Write as _;
use std::fs::File;
use std::path::Path;

/// Finite min/max/sum/count and NaN/Inf counts.
pub(crate) struct Stats {
    pub(crate) min: f32,
    pub(crate) max: f32,
    pub(crate) sum: f64,
    pub(crate) finite: u64,
    pub(crate) nan: u64,
    pub(crate) inf: u64,
}

impl Stats {
    pub(crate) const EMPTY: Stats = Stats {
        min: f32::INFINITY,
        max: f32::NEG_INFINITY,
        sum: 0.0,
        finite: 0,
        nan: 0,
        inf: 0,
    };
    fn add(mut self, v: f32) -> Stats {
        if v.is_nan() {
            self.nan += 1;
        } else if v.is_infinite() {
            self.inf += 1;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
            self.sum += v as f64;
            self.finite += 1;
        }
        self
    }
    pub(crate) fn merge(self, o: Stats) -> Stats {
        Stats {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
            sum: self.sum + o.sum,
            finite: self.finite + o.finite,
            nan: self.nan + o.nan,
            inf: self.inf + o.inf,
        }
    }
}

/// One pass in memory order, in parallel over contiguous memory (any other layout: serial `fold`).
pub(crate) fn stats(a: &Array4<f32>) -> Stats {
    use rayon::prelude::*;
    match a.as_slice_memory_order() {
        Some(s) => s
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(Stats::EMPTY, |st, &v| st.add(v)))
            .reduce(|| Stats::EMPTY, Stats::merge),
        None => a.fold(Stats::EMPTY, |st, &v| st.add(v)),
    }
}

/// Human summary for `voxtile info`: format, shape, dtype, scaling, spacing, orientation, affine,
/// and the value range of the loaded data (finite values only, plus NaN/Inf counts).
pub fn describe(path: &Path, v: &Volume) -> String {
    describe_with(path, &v.header, &stats(&v.data))
}

/// [`describe`] of a header and the statistics of its values (computed in memory or streamed).
pub(crate) fn describe_with(path: &Path, h: &Header, st: &Stats) -> String {
    let mut s = String::new();
    let [x, y, z] = h.shape();
    let _ = writeln!(s, "file:        {}", path.display());
    let _ = match h.format {
        Format::Nifti | Format::NiftiPair => writeln!(
            s,
            "format:      NIfTI-{}{}{}, {}-endian",
            h.version,
            if h.format == Format::NiftiPair {
                " pair (.hdr/.img)"
            } else {
                ""
            },
            if h.gzipped { " (gzip)" } else { "" },
            if h.big_endian { "big" } else { "little" }
        ),
        f => writeln!(
            s,
            "format:      {}, read as NIfTI with a RAS affine",
            f.name()
        ),
    };
    let _ = writeln!(
        s,
        "shape:       {x} x {y} x {z}, {} channel{}",
        h.channels(),
        if h.channels() == 1 { "" } else { "s" }
    );
    let scaling = match h.scaling() {
        Some((sl, it)) => format!(" (scaled: x {sl} + {it})"),
        None => String::new(),
    };
    let _ = writeln!(s, "dtype:       {}{scaling}", h.dtype_name());
    let sp = h.spacing();
    let _ = writeln!(
        s,
        "spacing:     {} x {} x {} {}",
        sp[0],
        sp[1],
        sp[2],
        space_unit(h.xyzt_units)
    );
    let _ = writeln!(s, "orientation: {}", h.orientation());
    let (a, src) = h.affine_with_source();
    let src = match src {
        AffineSource::Sform => format!("sform, code {} {}", h.sform_code, xform_name(h.sform_code)),
        AffineSource::Qform => format!("qform, code {} {}", h.qform_code, xform_name(h.qform_code)),
        AffineSource::Pixdim if h.sform_code > 0 || h.qform_code > 0 => {
            "sform/qform unusable: diag(pixdim)".to_string()
        }
        AffineSource::Pixdim => "no sform/qform code: diag(pixdim)".to_string(),
    };
    let _ = writeln!(s, "affine:      ({src})");
    for row in &a[..3] {
        let _ = writeln!(
            s,
            "  [{:>11.4} {:>11.4} {:>11.4} {:>11.4} ]",
            row[0], row[1], row[2], row[3]
        );
    }
    let (mn, mx, sum, n, nan, inf) = (st.min, st.max, st.sum, st.finite, st.nan, st.inf);
    if n > 0 {
        let _ = writeln!(
            s,
            "values:      min {mn}, max {mx}, mean {:.6}",
            sum / n as f64
        );
    } else {
        let _ = writeln!(s, "values:      no finite values");
    }
    let _ = write!(s, "non-finite:  {nan} NaN, {inf} Inf");
    s
}

/// Statistics of f32 values (one chunk).
pub(crate) fn stats_of(v: &[f32]) -> Stats {
    use rayon::prelude::*;
    v.par_chunks(1 << 16)
        .map(|c| c.iter().fold(Stats::EMPTY, |st, &v| st.add(v)))
        .reduce(|| Stats::EMPTY, Stats::merge)
}

/// Accumulates the statistics of raw voxel chunks: decoded into one reused f32 buffer.
pub(crate) struct Accumulator {
    pub(crate) stats: Stats,
    values: Vec<f32>,
    datatype: i16,
    big_endian: bool,
    scale: Option<(f64, f64)>,
}

impl Accumulator {
    pub(crate) fn new(datatype: i16, big_endian: bool, scale: Option<(f64, f64)>) -> Self {
        Accumulator {
            stats: Stats::EMPTY,
            values: Vec::new(),
            datatype,
            big_endian,
            scale,
        }
    }
    /// Add the voxels of `bytes` (whole voxels of the stored type).
    pub(crate) fn add_bytes(&mut self, bytes: &[u8]) {
        self.values.clear();
        read::convert(
            bytes,
            self.datatype,
            self.big_endian,
            self.scale,
            &mut self.values,
        );
        let chunk = stats_of(&self.values);
        self.merge(chunk);
    }
    /// Add decoded values.
    pub(crate) fn add_values(&mut self, v: &[f32]) {
        self.merge(stats_of(v));
    }
    fn merge(&mut self, chunk: Stats) {
        let st = std::mem::replace(&mut self.stats, Stats::EMPTY);
        self.stats = st.merge(chunk);
    }
}

/// The statistics of a detached or attached payload (NRRD, MetaImage, pair), streamed.
pub(crate) fn stream(
    file: &Path,
    opened: (File, u64),
    l: Layout,
    h: &Header,
    big_endian: bool,
    scale: Option<(f64, f64)>,
) -> Result<Stats> {
    let (_, bpv) =
        super::header::datatype_info(h.datatype).map_err(|m| crate::Error::volume(file, m))?;
    let mut acc = Accumulator::new(h.datatype, big_endian, scale);
    payload::for_each_chunk(file, opened, l, bpv, |b| acc.add_bytes(b))?;
    Ok(acc.stats)
}

/// The header and value statistics of any input [`dispatch::read_series`] reads, without holding
/// the volume as f32: what `voxtile info` shows, in the memory of one chunk (one slice for DICOM).
pub(crate) fn summarize(path: &Path, series: Option<&str>) -> Result<(Header, Stats)> {
    match dispatch::series_kind(path, series)? {
        dispatch::Kind::Dicom => dicom::summarize(path, series),
        dispatch::Kind::Nrrd => nrrd::summarize(path),
        dispatch::Kind::MetaImage => metaimage::summarize(path),
        dispatch::Kind::Pair => pair::summarize(path),
        dispatch::Kind::Nifti => dispatch::nifti(path, read::summarize),
    }
}

fn xform_name(code: i32) -> &'static str {
    match code {
        0 => "unknown",
        1 => "scanner",
        2 => "aligned",
        3 => "talairach",
        4 => "mni",
        5 => "template",
        _ => "invalid",
    }
}
