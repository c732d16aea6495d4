//! What one case reads: a file or DICOM folder (with its series choice), or several files stacked
//! as the channels of one volume (nnU-Net's `CASE_0000`, `CASE_0001`, ...: one file per channel,
//! every channel on one voxel grid).

use super::header::Header;
use super::{dispatch, Volume};
use crate::{Error, Result};
use ndarray::{Array4, Axis};
use std::path::{Path, PathBuf};

/// Largest difference (mm, or direction × spacing) between two channels' affines still read as
/// one grid: affines stored as float32 round-trip to about 1e-5 of their size.
const GRID_TOLERANCE: f64 = 1e-3;

/// The input of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One volume file, or a DICOM folder (`series`: the SeriesInstanceUID to take where the
    /// folder holds several).
    One {
        /// File or folder.
        path: PathBuf,
        /// `--series`.
        series: Option<String>,
    },
    /// Files whose channels are stacked in this order into one volume (the first file's
    /// geometry); all on one grid. Never empty.
    Channels(Vec<PathBuf>),
}

impl Source {
    /// One file (or a folder holding one DICOM series).
    pub fn file(path: impl Into<PathBuf>) -> Source {
        Source::One {
            path: path.into(),
            series: None,
        }
    }

    /// The paths it reads, in channel order.
    pub fn paths(&self) -> &[PathBuf] {
        match self {
            Source::One { path, .. } => std::slice::from_ref(path),
            Source::Channels(p) => p,
        }
    }

    /// The header of the volume [`Source::read`] gives; for channels, every file's header is read
    /// and its grid checked against the first.
    pub fn read_header(&self) -> Result<Header> {
        match self {
            Source::One { path, series } => dispatch::read_series_header(path, series.as_deref()),
            Source::Channels(paths) if paths.len() == 1 => dispatch::read_header(&paths[0]),
            Source::Channels(paths) => {
                let first = dispatch::read_header(&paths[0])?;
                let mut channels = first.channels();
                for p in &paths[1..] {
                    let h = dispatch::read_header(p)?;
                    same_grid(&paths[0], &first, p, &h)?;
                    channels += h.channels();
                }
                Ok(with_channels(first, channels))
            }
        }
    }

    /// The whole volume, channels stacked in file order.
    pub fn read(&self) -> Result<Volume> {
        match self {
            Source::One { path, series } => dispatch::read_series(path, series.as_deref()),
            Source::Channels(paths) if paths.len() == 1 => dispatch::read(&paths[0]),
            Source::Channels(paths) => {
                let first = dispatch::read(&paths[0])?;
                let mut parts = vec![first.data];
                for p in &paths[1..] {
                    let v = dispatch::read(p)?;
                    same_grid(&paths[0], &first.header, p, &v.header)?;
                    parts.push(v.data);
                }
                let total: usize = parts.iter().map(|a| a.dim().0).sum();
                let data = stack(&paths[0], &parts, total)?;
                Ok(Volume {
                    data,
                    header: with_channels(first.header, total),
                })
            }
        }
    }
}

/// Refuse a channel file whose grid (shape or affine) is not the first file's.
fn same_grid(first: &Path, a: &Header, path: &Path, b: &Header) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::volume(
            path,
            format!(
                "{what} than {}: every channel of a case must share one voxel grid (resample it onto the first channel first)",
                first.display()
            ),
        ))
    };
    let (sa, sb) = (a.shape(), b.shape());
    if sa != sb {
        let f = |s: [usize; 3]| format!("{}x{}x{}", s[0], s[1], s[2]);
        return refuse(format!("a grid of {} voxels, not {} as", f(sb), f(sa)));
    }
    let (fa, fb) = (a.affine(), b.affine());
    let worst = (0..3)
        .flat_map(|r| (0..4).map(move |c| (r, c)))
        .map(|(r, c)| (fa[r][c] - fb[r][c]).abs())
        .fold(0.0f64, f64::max);
    if worst.is_nan() || worst > GRID_TOLERANCE {
        return refuse(format!(
            "another affine (up to {worst:.4} mm apart, spacing {:?} vs {:?})",
            b.spacing(),
            a.spacing()
        ));
    }
    Ok(())
}

/// `h` standing for a volume of `channels` channels (the NIfTI 4th dimension).
fn with_channels(mut h: Header, channels: usize) -> Header {
    if channels > 1 {
        h.dim[0] = h.dim[0].max(4);
        h.dim[4] = channels as i64;
    }
    h
}

/// The channel arrays as one (channel, i, j, k) array, allocated once (no abort when memory runs
/// short: an error naming the case).
fn stack(first: &Path, parts: &[Array4<f32>], total: usize) -> Result<Array4<f32>> {
    let (_, x, y, z) = parts[0].dim();
    let n = total * x * y * z;
    let mut buf: Vec<f32> = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| {
        Error::volume(
            first,
            format!("not enough memory to stack {total} channels of {x}x{y}x{z} voxels"),
        )
    })?;
    buf.resize(n, 0.0);
    let mut out = Array4::from_shape_vec((total, x, y, z), buf)
        .map_err(|e| Error::volume(first, format!("stacking channels: {e}")))?;
    let mut c = 0;
    for p in parts {
        let k = p.dim().0;
        out.slice_axis_mut(Axis(0), (c..c + k).into()).assign(p);
        c += k;
    }
    Ok(out)
}
