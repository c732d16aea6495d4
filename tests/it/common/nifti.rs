//! Hand-written NIfTI-1 files for the tests (independent of voxtile's writer).
#![allow(dead_code)]

/// Geometry fields of a hand-written NIfTI-1 header.
#[derive(Clone)]
pub struct Geo {
    pub pixdim: [f32; 3],
    pub qfac: f32,
    pub qform_code: i16,
    pub sform_code: i16,
    pub quatern: [f32; 3],
    pub qoffset: [f32; 3],
    pub srow: [[f32; 4]; 3],
    /// Byte 123 (xyzt_units): 2 = mm, 0 = unknown.
    pub xyzt_units: u8,
}

impl Default for Geo {
    fn default() -> Self {
        Geo {
            pixdim: [1.0; 3],
            qfac: 1.0,
            qform_code: 0,
            sform_code: 1,
            quatern: [0.0; 3],
            qoffset: [0.0; 3],
            srow: [
                [1.0, 0.0, 0.0, 0.0],
                [0.0, 1.0, 0.0, 0.0],
                [0.0, 0.0, 1.0, 0.0],
            ],
            xyzt_units: 2,
        }
    }
}

/// `n` float32 values `f(0..n)` as little-endian bytes.
pub fn f32_data(n: usize, f: impl Fn(usize) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| f(i).to_le_bytes()).collect()
}

/// A float32 NIfTI-1 file of `dims` (default geometry) whose voxel `i` in file order is `f(i)`.
pub fn nifti_f32(dims: &[i64], f: impl Fn(usize) -> f32) -> Vec<u8> {
    let n = dims.iter().product::<i64>() as usize;
    nifti(dims, 16, 32, &Geo::default(), &f32_data(n, f))
}

/// Byte order and intensity scaling of a hand-written file.
#[derive(Clone, Copy)]
pub struct Storage {
    pub big_endian: bool,
    pub slope: f32,
    pub inter: f32,
}

impl Default for Storage {
    fn default() -> Self {
        Storage {
            big_endian: false,
            slope: 1.0,
            inter: 0.0,
        }
    }
}

/// A little-endian NIfTI-1 file written field by field (independent of voxtile's writer).
pub fn nifti(dims: &[i64], datatype: i16, bitpix: i16, geo: &Geo, data: &[u8]) -> Vec<u8> {
    nifti_stored(dims, datatype, bitpix, geo, Storage::default(), data)
}

/// A NIfTI-1 file in the byte order and scaling of `st`; `data` is already in that order.
pub fn nifti_stored(
    dims: &[i64],
    datatype: i16,
    bitpix: i16,
    geo: &Geo,
    st: Storage,
    data: &[u8],
) -> Vec<u8> {
    let mut h = vec![0u8; 352];
    let put = |h: &mut Vec<u8>, off: usize, b: &[u8]| {
        let mut b = b.to_vec();
        if st.big_endian {
            b.reverse();
        }
        h[off..off + b.len()].copy_from_slice(&b)
    };
    put(&mut h, 0, &348i32.to_le_bytes());
    let mut dim = [1i16; 8];
    dim[0] = dims.len() as i16;
    for (i, &d) in dims.iter().enumerate() {
        dim[i + 1] = d as i16;
    }
    for (i, d) in dim.iter().enumerate() {
        put(&mut h, 40 + 2 * i, &d.to_le_bytes());
    }
    put(&mut h, 70, &datatype.to_le_bytes());
    put(&mut h, 72, &bitpix.to_le_bytes());
    let pix = [
        geo.qfac,
        geo.pixdim[0],
        geo.pixdim[1],
        geo.pixdim[2],
        1.0,
        1.0,
        1.0,
        1.0,
    ];
    for (i, p) in pix.iter().enumerate() {
        put(&mut h, 76 + 4 * i, &p.to_le_bytes());
    }
    put(&mut h, 108, &352f32.to_le_bytes());
    put(&mut h, 112, &st.slope.to_le_bytes());
    put(&mut h, 116, &st.inter.to_le_bytes());
    h[123] = geo.xyzt_units;
    put(&mut h, 252, &geo.qform_code.to_le_bytes());
    put(&mut h, 254, &geo.sform_code.to_le_bytes());
    for i in 0..3 {
        put(&mut h, 256 + 4 * i, &geo.quatern[i].to_le_bytes());
        put(&mut h, 268 + 4 * i, &geo.qoffset[i].to_le_bytes());
        for j in 0..4 {
            put(&mut h, 280 + 16 * i + 4 * j, &geo.srow[i][j].to_le_bytes());
        }
    }
    h[344..348].copy_from_slice(b"n+1\0");
    h.extend_from_slice(data);
    h
}

/// A NIfTI-2 file (unit spacing, no transform, slope 1) in either byte order; `data` is
/// already in that order.
pub fn nifti2(big_endian: bool, dims: &[i64], datatype: i16, bitpix: i16, data: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 544];
    let mut put = |off: usize, b: &[u8]| {
        let mut b = b.to_vec();
        if big_endian {
            b.reverse();
        }
        h[off..off + b.len()].copy_from_slice(&b);
    };
    put(0, &540i32.to_le_bytes());
    put(12, &datatype.to_le_bytes());
    put(14, &bitpix.to_le_bytes());
    let mut dim = [1i64; 8];
    dim[0] = dims.len() as i64;
    dim[1..=dims.len()].copy_from_slice(dims);
    for (i, d) in dim.iter().enumerate() {
        put(16 + 8 * i, &d.to_le_bytes());
    }
    for i in 0..8 {
        put(104 + 8 * i, &1f64.to_le_bytes());
    }
    put(168, &544i64.to_le_bytes()); // vox_offset
    put(176, &1f64.to_le_bytes()); // scl_slope
    h[4..12].copy_from_slice(b"n+2\0\r\n\x1a\n");
    h.extend_from_slice(data);
    h
}
