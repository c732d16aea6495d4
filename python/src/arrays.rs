//! NumPy arrays in: float32 read in place (any strides), float16 and int16 converted to
//! float32 without the GIL; checks that name what is wrong with an array.

use ndarray::{Array4, ArrayView4};
use numpy::{PyReadonlyArray4, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A 4-D array of one of the dtypes the engine takes (float32 in place, the others converted).
pub enum Input<'py> {
    /// Read in place.
    F32(PyReadonlyArray4<'py, f32>),
    /// Converted to float32.
    F16(PyReadonlyArray4<'py, half::f16>),
    /// Converted to float32.
    I16(PyReadonlyArray4<'py, i16>),
}

impl<'py> Input<'py> {
    /// `array` (4-D: the Python side adds the channel axis of a 3-D one) of a dtype taken here.
    pub fn extract(array: &Bound<'py, PyAny>) -> PyResult<Input<'py>> {
        if let Ok(a) = array.extract::<PyReadonlyArray4<f32>>() {
            return Ok(Input::F32(a));
        }
        if let Ok(a) = array.extract::<PyReadonlyArray4<half::f16>>() {
            return Ok(Input::F16(a));
        }
        if let Ok(a) = array.extract::<PyReadonlyArray4<i16>>() {
            return Ok(Input::I16(a));
        }
        let what = match array.cast::<numpy::PyUntypedArray>() {
            Ok(a) => format!("a {}-D {} array", a.ndim(), a.dtype()),
            Err(_) => format!("a {}", array.get_type().name()?),
        };
        Err(crate::errors::invalid(format!(
            "expected a 4-D float32, float16 or int16 array, got {what}"
        )))
    }

    /// (channels, i, j, k).
    pub fn shape(&self) -> [usize; 4] {
        let s = match self {
            Input::F32(a) => a.shape(),
            Input::F16(a) => a.shape(),
            Input::I16(a) => a.shape(),
        };
        [s[0], s[1], s[2], s[3]]
    }

    /// The views the work needs (Send, unlike the borrows).
    pub fn view(&self) -> View<'_> {
        match self {
            Input::F32(a) => View::F32(a.as_array()),
            Input::F16(a) => View::F16(a.as_array()),
            Input::I16(a) => View::I16(a.as_array()),
        }
    }
}

/// The data of an [`Input`], to be read without the GIL.
pub enum View<'a> {
    F32(ArrayView4<'a, f32>),
    F16(ArrayView4<'a, half::f16>),
    I16(ArrayView4<'a, i16>),
}

impl<'a> View<'a> {
    /// float32 data: the array itself, or a converted copy.
    pub fn to_f32(&self) -> F32<'a> {
        match self {
            View::F32(v) => F32::Borrowed(*v),
            View::F16(v) => F32::Owned(v.mapv(f32::from)),
            View::I16(v) => F32::Owned(v.mapv(f32::from)),
        }
    }
}

/// float32 data: the caller's array, or its converted copy.
pub enum F32<'a> {
    Borrowed(ArrayView4<'a, f32>),
    Owned(Array4<f32>),
}

impl F32<'_> {
    /// The data, (channels, i, j, k).
    pub fn view(&self) -> ArrayView4<'_, f32> {
        match self {
            F32::Borrowed(v) => v.view(),
            F32::Owned(a) => a.view(),
        }
    }

    /// How many values are NaN or infinite (counted only when there is one: the library's
    /// parallel scan first).
    pub fn nonfinite(&self) -> usize {
        if voxtile::pipeline::all_finite(self.view()) {
            return 0;
        }
        ndarray::Zip::from(&self.view()).par_fold(
            || 0,
            |n, v| n + !v.is_finite() as usize,
            |a, b| a + b,
        )
    }
}
