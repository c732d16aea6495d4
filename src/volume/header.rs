//! Own NIfTI-1 (348 bytes) and NIfTI-2 (540 bytes) header parser and NIfTI-1 encoder.
//!
//! Own code rather than the `nifti` crate: every field is bounds-checked and validated here so that a
//! hostile header turns into one error sentence, never a panic or a huge allocation.

use super::geometry;

/// NIfTI datatype codes voxtile reads (everything that converts to f32 losslessly enough).
pub(crate) const DT_UINT8: i16 = 2;
pub(crate) const DT_INT16: i16 = 4;
pub(crate) const DT_INT32: i16 = 8;
pub(crate) const DT_FLOAT32: i16 = 16;
pub(crate) const DT_FLOAT64: i16 = 64;
pub(crate) const DT_INT8: i16 = 256;
pub(crate) const DT_UINT16: i16 = 512;
pub(crate) const DT_UINT32: i16 = 768;
pub(crate) const DT_INT64: i16 = 1024;
pub(crate) const DT_UINT64: i16 = 1280;

/// Header size of NIfTI-1 and NIfTI-2.
pub(crate) const NIFTI1_SIZE: usize = 348;
pub(crate) const NIFTI2_SIZE: usize = 540;

/// Everything a NIfTI header says, widened to the NIfTI-2 types (i64 dims, f64 floats) so one struct
/// serves both versions; enough to write outputs with the same geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The file format it was read from (non-NIfTI inputs get a NIfTI header standing for them).
    pub format: super::raw::Format,
    /// 1 or 2 (NIfTI-1 or NIfTI-2).
    pub version: u8,
    /// Byte order of the file that was read (outputs are always little-endian).
    pub big_endian: bool,
    /// Whether the file was gzip-compressed.
    pub gzipped: bool,
    /// `dim[0]` = number of dimensions, `dim[1..=dim[0]]` = sizes.
    pub dim: [i64; 8],
    /// `pixdim[0]` = qfac (±1), `pixdim[1..4]` voxel size, `pixdim[4]` time step...
    pub pixdim: [f64; 8],
    /// NIfTI datatype code (2 = uint8, 4 = int16, 16 = float32, ...).
    pub datatype: i16,
    /// Bits per voxel, as the datatype implies.
    pub bitpix: i16,
    /// Byte offset of the voxel data in the (uncompressed) file.
    pub vox_offset: u64,
    /// Intensity scaling: value = scl_slope * stored + scl_inter (0 = none).
    pub scl_slope: f64,
    /// Intensity offset of the scaling.
    pub scl_inter: f64,
    /// Display range maximum.
    pub cal_max: f64,
    /// Display range minimum.
    pub cal_min: f64,
    /// Time to acquire one slice.
    pub slice_duration: f64,
    /// Time axis shift.
    pub toffset: f64,
    /// First slice index of the acquisition pattern.
    pub slice_start: i64,
    /// Last slice index of the acquisition pattern.
    pub slice_end: i64,
    /// Slice timing order code.
    pub slice_code: i32,
    /// Frequency, phase and slice encoding axes (2 bits each).
    pub dim_info: u8,
    /// Units of pixdim (spatial and temporal codes).
    pub xyzt_units: i32,
    /// Meaning of the voxel values (NIFTI_INTENT_*).
    pub intent_code: i32,
    /// First intent parameter.
    pub intent_p1: f64,
    /// Second intent parameter.
    pub intent_p2: f64,
    /// Third intent parameter.
    pub intent_p3: f64,
    /// Name of the intent.
    pub intent_name: String,
    /// Free-text description.
    pub descrip: String,
    /// Auxiliary file name.
    pub aux_file: String,
    /// What the qform maps to (0 = unknown, 1 = scanner, ...).
    pub qform_code: i32,
    /// What the sform maps to (0 = unknown, 2 = aligned, 4 = MNI, ...).
    pub sform_code: i32,
    /// qform rotation quaternion, b.
    pub quatern_b: f64,
    /// qform rotation quaternion, c.
    pub quatern_c: f64,
    /// qform rotation quaternion, d.
    pub quatern_d: f64,
    /// qform translation, x (mm).
    pub qoffset_x: f64,
    /// qform translation, y (mm).
    pub qoffset_y: f64,
    /// qform translation, z (mm).
    pub qoffset_z: f64,
    /// sform first row (x = srow_x · [i, j, k, 1]).
    pub srow_x: [f64; 4],
    /// sform second row.
    pub srow_y: [f64; 4],
    /// sform third row.
    pub srow_z: [f64; 4],
}

/// Name and bytes per voxel of a datatype voxtile reads; `Err` names the refused type.
pub(crate) fn datatype_info(code: i16) -> Result<(&'static str, usize), String> {
    Ok(match code {
        DT_UINT8 => ("uint8", 1),
        DT_INT8 => ("int8", 1),
        DT_INT16 => ("int16", 2),
        DT_UINT16 => ("uint16", 2),
        DT_INT32 => ("int32", 4),
        DT_UINT32 => ("uint32", 4),
        DT_FLOAT32 => ("float32", 4),
        DT_INT64 => ("int64", 8),
        DT_UINT64 => ("uint64", 8),
        DT_FLOAT64 => ("float64", 8),
        other => {
            let name = match other {
                0 => "unknown (0)",
                1 => "binary (1 bit)",
                32 => "complex64",
                128 => "RGB24",
                1536 => "float128",
                1792 => "complex128",
                2048 => "complex256",
                2304 => "RGBA32",
                _ => return Err(format!("unknown NIfTI datatype code {other}")),
            };
            return Err(format!(
                "unsupported NIfTI datatype {name} (code {other}); voxtile reads integer and float scalar volumes only"
            ));
        }
    })
}

/// Which header the first 4 bytes announce: (version, big_endian, header size).
pub(crate) fn detect(first4: [u8; 4]) -> Result<(u8, bool, usize), String> {
    let le = i32::from_le_bytes(first4);
    let be = i32::from_be_bytes(first4);
    match (le, be) {
        (348, _) => Ok((1, false, NIFTI1_SIZE)),
        (_, 348) => Ok((1, true, NIFTI1_SIZE)),
        (540, _) => Ok((2, false, NIFTI2_SIZE)),
        (_, 540) => Ok((2, true, NIFTI2_SIZE)),
        _ => Err(format!(
            "not a NIfTI file (sizeof_hdr is {le}, expected 348 for NIfTI-1 or 540 for NIfTI-2)"
        )),
    }
}

/// Bounds-checked field reader in the file's byte order.
struct Fields<'a> {
    b: &'a [u8],
    be: bool,
}

impl Fields<'_> {
    fn arr<const N: usize>(&self, off: usize) -> [u8; N] {
        // Offsets are constants inside the header size, checked once by the caller.
        let mut a = [0u8; N];
        a.copy_from_slice(&self.b[off..off + N]);
        if self.be {
            a.reverse();
        }
        a
    }
    fn i16(&self, off: usize) -> i16 {
        i16::from_le_bytes(self.arr(off))
    }
    fn i32(&self, off: usize) -> i32 {
        i32::from_le_bytes(self.arr(off))
    }
    fn i64(&self, off: usize) -> i64 {
        i64::from_le_bytes(self.arr(off))
    }
    fn f64(&self, off: usize) -> f64 {
        f64::from_le_bytes(self.arr(off))
    }
    fn str(&self, off: usize, len: usize) -> String {
        let s = &self.b[off..off + len];
        let end = s.iter().position(|&c| c == 0).unwrap_or(len);
        String::from_utf8_lossy(&s[..end]).into_owned()
    }
}

/// Parse and validate a header from its raw bytes (at least the size `detect` returned).
pub(crate) fn parse(bytes: &[u8], gzipped: bool) -> Result<Header, String> {
    parse_as(bytes, gzipped, false)
}

/// [`parse`] of a single file (`pair` false, magic `n+1`/`n+2`) or of a pair's `.hdr` (`ni1`).
pub(crate) fn parse_as(bytes: &[u8], gzipped: bool, pair: bool) -> Result<Header, String> {
    if bytes.len() < 4 {
        return Err(format!(
            "not a NIfTI file (only {} bytes, a header needs 348)",
            bytes.len()
        ));
    }
    let (version, be, size) = detect([bytes[0], bytes[1], bytes[2], bytes[3]])?;
    if bytes.len() < size {
        return Err(format!(
            "truncated NIfTI-{version} header ({} of {size} bytes)",
            bytes.len()
        ));
    }
    let f = Fields {
        b: &bytes[..size],
        be,
    };
    let h = if version == 1 {
        let magic = &bytes[344..348];
        if magic == b"ni1\0" && !pair {
            return Err(
                "is the header of a .hdr/.img pair (magic \"ni1\"): give voxtile the .hdr or .img path"
                    .into(),
            );
        }
        let want: &[u8] = if pair { b"ni1\0" } else { b"n+1\0" };
        if magic != want {
            return Err(format!(
                "not a NIfTI-1 file (magic \"{}\", expected \"{}\"); ANALYZE 7.5 files are not supported: convert them with `fslchfiletype NIFTI_GZ` or nibabel",
                magic.escape_ascii(),
                want.escape_ascii()
            ));
        }
        nifti1_from_crate(&bytes[..size], be, gzipped)?
    } else {
        let magic = &bytes[4..12];
        if &magic[..4] == b"ni2\0" && !pair {
            return Err(
                "is the header of a .hdr/.img pair (magic \"ni2\"); voxtile reads single-file .nii/.nii.gz only"
                    .into(),
            );
        }
        if pair && &magic[..4] != b"ni2\0" || !pair && magic != b"n+2\0\r\n\x1a\n" {
            return Err(format!(
                "not a valid NIfTI-2 file (magic \"{}\", expected \"n+2\\0\\r\\n\\x1a\\n\"; a wrong tail means the file was altered by a text-mode transfer)",
                magic.escape_ascii()
            ));
        }
        let mut dim = [0i64; 8];
        let mut pixdim = [0f64; 8];
        for i in 0..8 {
            dim[i] = f.i64(16 + 8 * i);
            pixdim[i] = f.f64(104 + 8 * i);
        }
        let vox = f.i64(168);
        if vox < 0 {
            return Err(format!("negative vox_offset {vox}"));
        }
        Header {
            format: super::raw::Format::Nifti,
            version,
            big_endian: be,
            gzipped,
            dim,
            pixdim,
            datatype: f.i16(12),
            bitpix: f.i16(14),
            vox_offset: vox as u64,
            scl_slope: f.f64(176),
            scl_inter: f.f64(184),
            cal_max: f.f64(192),
            cal_min: f.f64(200),
            slice_duration: f.f64(208),
            toffset: f.f64(216),
            slice_start: f.i64(224),
            slice_end: f.i64(232),
            slice_code: f.i32(496),
            dim_info: bytes[524],
            xyzt_units: f.i32(500),
            intent_code: f.i32(504),
            intent_p1: f.f64(80),
            intent_p2: f.f64(88),
            intent_p3: f.f64(96),
            intent_name: f.str(508, 16),
            descrip: f.str(240, 80),
            aux_file: f.str(320, 24),
            qform_code: f.i32(344),
            sform_code: f.i32(348),
            quatern_b: f.f64(352),
            quatern_c: f.f64(360),
            quatern_d: f.f64(368),
            qoffset_x: f.f64(376),
            qoffset_y: f.f64(384),
            qoffset_z: f.f64(392),
            srow_x: [f.f64(400), f.f64(408), f.f64(416), f.f64(424)],
            srow_y: [f.f64(432), f.f64(440), f.f64(448), f.f64(456)],
            srow_z: [f.f64(464), f.f64(472), f.f64(480), f.f64(488)],
        }
    };
    validate(h, size, pair)
}

/// A NIfTI-1 header decoded by the `nifti` crate's `NiftiHeader` (its byte-order guess checked
/// against the one `sizeof_hdr` gave), widened into [`Header`]; `validate` then applies voxtile's
/// own rules. NIfTI-2, which the crate does not read, goes through [`Fields`].
fn nifti1_from_crate(bytes: &[u8], be: bool, gzipped: bool) -> Result<Header, String> {
    // The crate guesses the byte order from dim[0] (> 7: swapped); voxtile takes it from
    // sizeof_hdr. Hand the crate dim[0] = 1 in the file's order so both agree, and keep the
    // file's own dim[0] for `validate` to judge.
    let dim0 = Fields { b: bytes, be }.i16(40);
    let mut fixed = [0u8; NIFTI1_SIZE];
    fixed.copy_from_slice(&bytes[..NIFTI1_SIZE]);
    fixed[40..42].copy_from_slice(&if be {
        1i16.to_be_bytes()
    } else {
        1i16.to_le_bytes()
    });
    let mut n = nifti::NiftiHeader::from_reader(&fixed[..])
        .map_err(|e| format!("not a valid NIfTI-1 header ({e})"))?;
    if (n.endianness == nifti::Endianness::Big) != be {
        return Err("NIfTI-1 header of an unknown byte order".into());
    }
    n.dim[0] = dim0 as u16;
    let s = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    let f = |v: f32| v as f64;
    Ok(Header {
        format: super::raw::Format::Nifti,
        version: 1,
        big_endian: be,
        gzipped,
        dim: n.dim.map(|d| d as i16 as i64),
        pixdim: n.pixdim.map(f),
        datatype: n.datatype,
        bitpix: n.bitpix,
        vox_offset: vox_offset_from_f64(f(n.vox_offset))?,
        scl_slope: f(n.scl_slope),
        scl_inter: f(n.scl_inter),
        cal_max: f(n.cal_max),
        cal_min: f(n.cal_min),
        slice_duration: f(n.slice_duration),
        toffset: f(n.toffset),
        slice_start: n.slice_start as i64,
        slice_end: n.slice_end as i64,
        slice_code: n.slice_code as i32,
        dim_info: n.dim_info,
        xyzt_units: n.xyzt_units as i32,
        intent_code: n.intent_code as i32,
        intent_p1: f(n.intent_p1),
        intent_p2: f(n.intent_p2),
        intent_p3: f(n.intent_p3),
        intent_name: s(&n.intent_name),
        descrip: s(&n.descrip),
        aux_file: s(&n.aux_file),
        qform_code: n.qform_code as i32,
        sform_code: n.sform_code as i32,
        quatern_b: f(n.quatern_b),
        quatern_c: f(n.quatern_c),
        quatern_d: f(n.quatern_d),
        qoffset_x: f(n.quatern_x),
        qoffset_y: f(n.quatern_y),
        qoffset_z: f(n.quatern_z),
        srow_x: n.srow_x.map(f),
        srow_y: n.srow_y.map(f),
        srow_z: n.srow_z.map(f),
    })
}

/// NIfTI-1 stores vox_offset as a float: it must be a non-negative whole number.
fn vox_offset_from_f64(v: f64) -> Result<u64, String> {
    if !v.is_finite() || v < 0.0 || v.fract() != 0.0 || v > 9.0e15 {
        return Err(format!("invalid vox_offset {v}"));
    }
    Ok(v as u64)
}

/// Checks shared by both versions: dims, datatype/bitpix, vox_offset, scaling, voxel count overflow.
fn validate(mut h: Header, size: usize, pair: bool) -> Result<Header, String> {
    let nd = h.dim[0];
    if !(1..=7).contains(&nd) {
        return Err(format!(
            "invalid dim[0] = {nd} (number of dimensions must be 1 to 7)"
        ));
    }
    for i in 1..=nd as usize {
        if h.dim[i] <= 0 {
            return Err(format!(
                "invalid dim[{i}] = {} (every dimension must be at least 1)",
                h.dim[i]
            ));
        }
    }
    if nd >= 5 {
        if let Some(i) = (5..=nd as usize).find(|&i| h.dim[i] != 1) {
            return Err(format!(
                "{nd}-D volume with dim[{i}] = {}: voxtile reads 3-D volumes and 4-D volumes whose 4th axis holds channels",
                h.dim[i]
            ));
        }
    }
    let (name, bpv) = datatype_info(h.datatype)?;
    if h.bitpix as i64 != 8 * bpv as i64 {
        return Err(format!(
            "bitpix {} is inconsistent with datatype {name} (expected {})",
            h.bitpix,
            8 * bpv
        ));
    }
    // vox_offset 0 is what some writers put in single files: the data then starts right after the
    // header and its 4-byte extension flag. Anything else inside the header is corrupt.
    let min_off = size as u64 + 4;
    if pair {
        // A pair's data lies in the .img, from vox_offset (0 as a rule).
    } else if h.vox_offset == 0 {
        h.vox_offset = min_off;
    } else if h.vox_offset < min_off {
        return Err(format!(
            "vox_offset {} lies inside the header (a single-file NIfTI-{} needs at least {min_off})",
            h.vox_offset, h.version
        ));
    }
    if h.scl_slope.is_finite() && h.scl_slope != 0.0 && !h.scl_inter.is_finite() {
        return Err(format!(
            "valid scl_slope {} but invalid scl_inter {}",
            h.scl_slope, h.scl_inter
        ));
    }
    h.data_bytes()?;
    Ok(h)
}

impl Header {
    /// Number of voxels of all channels, checked for overflow.
    pub(crate) fn n_values(&self) -> Result<u64, String> {
        let [x, y, z] = self.shape_i64();
        let c = self.channels_i64();
        [x, y, z, c]
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| format!("dimensions {x}x{y}x{z}x{c} overflow the voxel count"))
    }

    /// Bytes of voxel data the file must hold after vox_offset.
    pub(crate) fn data_bytes(&self) -> Result<u64, String> {
        let (_, bpv) = datatype_info(self.datatype)?;
        self.n_values()?
            .checked_mul(bpv as u64)
            .ok_or_else(|| "voxel data size overflows".to_string())
    }

    pub(crate) fn shape_i64(&self) -> [i64; 3] {
        let nd = self.dim[0].clamp(0, 7) as usize;
        let d = |i: usize| if i <= nd { self.dim[i].max(1) } else { 1 };
        [d(1), d(2), d(3)]
    }

    pub(crate) fn channels_i64(&self) -> i64 {
        if self.dim[0] >= 4 {
            self.dim[4].max(1)
        } else {
            1
        }
    }

    /// (slope, inter) to apply, or None when scl_slope is 0 / non-finite (NIfTI: "no scaling") or
    /// the identity.
    pub(crate) fn scaling(&self) -> Option<(f64, f64)> {
        if self.scl_slope == 0.0 || !self.scl_slope.is_finite() {
            return None;
        }
        if self.scl_slope == 1.0 && self.scl_inter == 0.0 {
            return None;
        }
        Some((self.scl_slope, self.scl_inter))
    }
}

/// Largest size of one axis a NIfTI-1 header can hold (dim[] is int16).
pub const NIFTI1_MAX_AXIS: usize = i16::MAX as usize;

/// Whether an output of these sizes (spatial axes, then channels if any) fits a NIfTI-1 header,
/// so a run can refuse before its first window rather than after the last one.
pub fn check_nifti1_shape(shape: &[usize]) -> crate::Result<()> {
    if let Some(d) = shape.iter().find(|&&d| d > NIFTI1_MAX_AXIS) {
        return Err(crate::Error::Invalid(format!(
            "an output of {} cannot be written: NIfTI-1 holds at most {NIFTI1_MAX_AXIS} per axis, and {d} is more",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        )));
    }
    Ok(())
}

/// Build the header of an output file: NIfTI-1, little-endian, vox_offset 352, no extensions, the
/// geometry of `like` (see `geometry::output_geometry` for how sform/qform are chosen).
pub(crate) fn encode_nifti1(
    like: &Header,
    shape: [usize; 3],
    channels: usize,
    datatype: i16,
    descrip: &str,
) -> Result<[u8; 352], String> {
    let (_, bpv) = datatype_info(datatype)?;
    let mut dims = [0i64; 8];
    dims[0] = if channels > 1 { 4 } else { 3 };
    dims[1] = shape[0] as i64;
    dims[2] = shape[1] as i64;
    dims[3] = shape[2] as i64;
    dims[4] = channels as i64;
    for d in dims.iter_mut().skip(5) {
        *d = 1;
    }
    check_nifti1_shape(&[shape[0], shape[1], shape[2], channels]).map_err(|e| e.to_string())?;
    let g = geometry::output_geometry(like);
    let mut b = [0u8; 352];
    let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
    let f32b = |v: f64| (v as f32).to_le_bytes();
    let i16b = |v: i64| (v.clamp(i16::MIN as i64, i16::MAX as i64) as i16).to_le_bytes();
    put(0, &348i32.to_le_bytes());
    put(39, &[like.dim_info]);
    for (i, &d) in dims.iter().enumerate() {
        put(40 + 2 * i, &(d as i16).to_le_bytes());
    }
    put(70, &datatype.to_le_bytes());
    put(72, &((8 * bpv) as i16).to_le_bytes());
    put(74, &i16b(like.slice_start));
    let mut pixdim = like.pixdim;
    pixdim[0] = g.qfac;
    pixdim[1..4].copy_from_slice(&g.zooms);
    for (i, &p) in pixdim.iter().enumerate() {
        put(76 + 4 * i, &f32b(if p.is_finite() { p } else { 0.0 }));
    }
    put(108, &352f32.to_le_bytes());
    put(112, &1f32.to_le_bytes());
    put(116, &0f32.to_le_bytes());
    put(120, &i16b(like.slice_end));
    put(122, &[like.slice_code.clamp(0, 255) as u8]);
    put(123, &[like.xyzt_units.clamp(0, 255) as u8]);
    put(132, &f32b(finite_or_zero(like.slice_duration)));
    put(136, &f32b(finite_or_zero(like.toffset)));
    let d = descrip.as_bytes();
    put(148, &d[..d.len().min(79)]);
    put(252, &(g.qform_code as i16).to_le_bytes());
    put(254, &(g.sform_code as i16).to_le_bytes());
    for (i, v) in g.quatern.iter().chain(g.qoffset.iter()).enumerate() {
        put(256 + 4 * i, &f32b(*v));
    }
    for r in 0..3 {
        for c in 0..4 {
            put(280 + 16 * r + 4 * c, &f32b(g.sform[r][c]));
        }
    }
    put(344, b"n+1\0");
    // 348..352: extension flag, all zero = no extensions.
    Ok(b)
}

fn finite_or_zero(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nifti1_shape_limit_is_per_axis() {
        assert!(check_nifti1_shape(&[32767, 32767, 1]).is_ok());
        assert!(check_nifti1_shape(&[512, 512, 400, 117]).is_ok());
        let e = check_nifti1_shape(&[40000, 16, 16])
            .unwrap_err()
            .to_string();
        assert!(e.contains("40000x16x16") && e.contains("32767"), "{e}");
        let e = check_nifti1_shape(&[16, 16, 16, 70000])
            .unwrap_err()
            .to_string();
        assert!(e.contains("70000"), "{e}");
        // The encoder applies the same rule.
        let like = Header::new([4, 4, 4], 1, [1.0; 3]);
        assert!(encode_nifti1(&like, [32768, 1, 1], 1, DT_UINT8, "").is_err());
        assert!(encode_nifti1(&like, [32767, 1, 1], 1, DT_UINT8, "").is_ok());
    }
}
