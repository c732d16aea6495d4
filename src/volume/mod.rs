//! Volumes: reading NIfTI-1/2 (any scalar dtype, either byte order, gz), NIfTI-1 pairs, DICOM
//! series folders, NRRD and MetaImage; geometry; writing (NIfTI-1, temp + rename), label maps
//! with their class names.
//!
//! Data is held as f32 `(channel, i, j, k)` in the file's own axis order: no reorientation, so
//! outputs written with the input's header overlay the input voxel for voxel. Other formats are
//! handed out as the NIfTI file a converter would write (dcm2niix for DICOM), with a RAS affine.
//!
//! # Examples
//!
//! Write a label map on a 2 mm grid and read it back:
//!
//! ```
//! use ndarray::Array3;
//! use voxtile::volume::{self, Header};
//!
//! let labels = Array3::from_shape_fn((8, 6, 4), |(i, _, _)| (i >= 4) as u16);
//! let header = Header::new([8, 6, 4], 1, [2.0, 2.0, 2.0]);
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("seg.nii.gz");
//! volume::write_labels(&path, labels.view(), &header)?;
//!
//! let back = volume::read(&path)?;
//! assert_eq!(back.shape(), [8, 6, 4]);
//! assert_eq!(back.header.spacing(), [2.0, 2.0, 2.0]);
//! assert_eq!(back.data[[0, 7, 0, 0]], 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dicom;
mod dicom_meta;
mod dispatch;
mod geometry;
mod header;
mod hints;
mod inputs;
pub mod intensity;
mod labels;
mod metaimage;
mod nrrd;
mod orient;
mod pair;
mod palette;
mod payload;
mod raw;
mod read;
mod source;
mod summary;
mod write;

pub use dicom::{is_dicom_series_dir, read_dicom_header, read_dicom_series};
pub use dispatch::{foreign_hint, read, read_header, read_series, read_series_header, volume_stem};
pub use inputs::files_read;
pub use labels::{
    read_label_names, stage_color_table, stage_labels_json, write_labels_json, LabelNames,
    LabelOptions, NIFTI_ECODE_CARET, NIFTI_ECODE_IGNORE, NIFTI_INTENT_LABEL,
};
pub use palette::label_colour;
pub use raw::Format;
pub use source::Source;
pub use summary::describe;
pub(crate) use summary::{describe_with, stats, summarize, Stats};

pub use geometry::{
    axcodes, io_orientation, mat44_to_quatern, quatern_to_mat44, AffineSource, Mat4,
};
pub use header::{check_nifti1_shape, Header, NIFTI1_MAX_AXIS};
pub use orient::{all_axis_codes, Orientation, Reorientation};
pub(crate) use read::check_f32_values;
pub use read::{read_bytes, HARD_CAP_BYTES};
pub use write::{
    check_output_shape, stage_f32, stage_labels, stage_labels_with, stage_unit_u8, unit_to_u8,
    write_f32, write_labels, write_labels_with, write_unit_u8,
};

use ndarray::Array4;

/// A volume in memory: `data` axes are (channel, i, j, k) of the file (i fastest on disk), with
/// scl_slope/scl_inter applied. Memory layout is whatever came cheapest (Fortran order from disk).
#[derive(Debug, Clone)]
pub struct Volume {
    /// Voxel values, (channel, i, j, k), scaling applied.
    pub data: Array4<f32>,
    /// The header read with it (geometry for the outputs).
    pub header: Header,
}

impl Volume {
    /// Spatial size (i, j, k).
    pub fn shape(&self) -> [usize; 3] {
        let (_, x, y, z) = self.data.dim();
        [x, y, z]
    }
    /// Number of channels (the 4th NIfTI dimension, 1 for a 3D file).
    pub fn channels(&self) -> usize {
        self.data.dim().0
    }
}

impl Header {
    /// A float32 NIfTI-1 header for data that has no file of its own (synthetic volumes, npy
    /// inputs): diag(spacing) affine, RAS, sform and qform code 1 (scanner), units mm.
    pub fn new(shape: [usize; 3], channels: usize, spacing: [f64; 3]) -> Header {
        let c = channels.max(1);
        let d = |v: usize| v.max(1) as i64;
        Header {
            format: raw::Format::Nifti,
            version: 1,
            big_endian: false,
            gzipped: false,
            dim: [
                if c > 1 { 4 } else { 3 },
                d(shape[0]),
                d(shape[1]),
                d(shape[2]),
                c as i64,
                1,
                1,
                1,
            ],
            pixdim: [1.0, spacing[0], spacing[1], spacing[2], 1.0, 1.0, 1.0, 1.0],
            datatype: header::DT_FLOAT32,
            bitpix: 32,
            vox_offset: 352,
            scl_slope: 1.0,
            scl_inter: 0.0,
            cal_max: 0.0,
            cal_min: 0.0,
            slice_duration: 0.0,
            toffset: 0.0,
            slice_start: 0,
            slice_end: 0,
            slice_code: 0,
            dim_info: 0,
            xyzt_units: 2, // mm
            intent_code: 0,
            intent_p1: 0.0,
            intent_p2: 0.0,
            intent_p3: 0.0,
            intent_name: String::new(),
            descrip: String::new(),
            aux_file: String::new(),
            qform_code: 1,
            sform_code: 1,
            quatern_b: 0.0,
            quatern_c: 0.0,
            quatern_d: 0.0,
            qoffset_x: 0.0,
            qoffset_y: 0.0,
            qoffset_z: 0.0,
            srow_x: [spacing[0], 0.0, 0.0, 0.0],
            srow_y: [0.0, spacing[1], 0.0, 0.0],
            srow_z: [0.0, 0.0, spacing[2], 0.0],
        }
    }

    /// Spatial size (nx, ny, nz); missing axes of 1-D/2-D files are 1.
    pub fn shape(&self) -> [usize; 3] {
        self.shape_i64().map(|d| d as usize)
    }

    /// `dim[4]` for 4-D files (the channel axis), else 1.
    /// Number of channels (the 4th NIfTI dimension, 1 for a 3D file).
    pub fn channels(&self) -> usize {
        self.channels_i64() as usize
    }

    /// Voxel size from pixdim[1..4], made positive; 0 or non-finite (unset) reads as 1.
    pub fn spacing(&self) -> [f64; 3] {
        [1, 2, 3].map(|i| {
            let p = self.pixdim[i].abs();
            if p > 0.0 && p.is_finite() {
                p
            } else {
                1.0
            }
        })
    }

    /// nibabel's `get_best_affine`: sform if sform_code > 0, else qform if qform_code > 0, else
    /// diag(spacing) (NIfTI "method 1").
    pub fn affine(&self) -> [[f64; 4]; 4] {
        self.affine_with_source().0
    }

    /// Axis codes of the best affine, e.g. "RAS" (nibabel `aff2axcodes`).
    pub fn orientation(&self) -> String {
        axcodes(&self.affine())
    }

    /// numpy-style name of the stored datatype ("int16", "float32"...).
    pub fn dtype_name(&self) -> &'static str {
        header::datatype_info(self.datatype)
            .map(|(n, _)| n)
            .unwrap_or("unknown")
    }
}

pub(crate) fn space_unit(xyzt: i32) -> &'static str {
    match xyzt & 0x07 {
        1 => "m",
        2 => "mm",
        3 => "um",
        _ => "(unit unknown)",
    }
}

/// Replace NaN with 0 and ±Inf with the largest/smallest finite value of the volume (0 if it has
/// none), so one bad voxel cannot poison a whole window's normalisation. Returns (nan, inf) counts
/// for the caller to warn about.
pub fn sanitize_nonfinite(data: &mut Array4<f32>) -> (usize, usize) {
    let st = stats(data);
    let (mut mn, mut mx, nan, inf) = (st.min, st.max, st.nan as usize, st.inf as usize);
    if nan == 0 && inf == 0 {
        return (0, 0);
    }
    if mn > mx {
        (mn, mx) = (0.0, 0.0);
    }
    data.par_mapv_inplace(|v| {
        if v.is_nan() {
            0.0
        } else if v == f32::INFINITY {
            mx
        } else if v == f32::NEG_INFINITY {
            mn
        } else {
            v
        }
    });
    (nan, inf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array4;

    #[test]
    fn sanitize_replaces_with_finite_extremes() {
        let mut a = Array4::from_shape_vec(
            (1, 2, 2, 2),
            vec![
                1.0,
                f32::NAN,
                -3.0,
                f32::INFINITY,
                7.5,
                f32::NEG_INFINITY,
                f32::NAN,
                2.0,
            ],
        )
        .unwrap();
        let (nan, inf) = sanitize_nonfinite(&mut a);
        assert_eq!((nan, inf), (2, 2));
        let v: Vec<f32> = a.iter().copied().collect();
        assert_eq!(v, vec![1.0, 0.0, -3.0, 7.5, 7.5, -3.0, 0.0, 2.0]);
        let mut all_bad = Array4::from_elem((1, 1, 1, 2), f32::NAN);
        all_bad[[0, 0, 0, 1]] = f32::INFINITY;
        assert_eq!(sanitize_nonfinite(&mut all_bad), (1, 1));
        assert!(all_bad.iter().all(|&v| v == 0.0));
    }
}
