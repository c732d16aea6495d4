//! `voxtile._voxtile.Session`: a model made ready as `voxtile segment` makes it (the library's
//! [`embed::Session`]), run on arrays. Runs on one session take turns (a lock); `cancel` stops
//! the one in progress.

use crate::arrays::Input;
use crate::errors::to_py;
use crate::watch::watched;
use ndarray::Zip;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Mutex;
use voxtile::internals::cli::embed;
use voxtile::{CancelToken, Error};

/// A model, its manifest and `voxtile segment`'s flags, ready on its device.
#[pyclass(module = "voxtile._voxtile", frozen)]
pub struct Session {
    inner: Mutex<embed::Session>,
    cancel: CancelToken,
    /// Whether every label value fits uint8 (the labels' dtype: fixed by the model, not the data).
    labels_u8: bool,
}

/// What a run returns: labels, probabilities and raw outputs when asked for, the report (JSON).
type Ran = (Py<PyAny>, Option<Py<PyAny>>, Option<Py<PyAny>>, String);

#[pymethods]
impl Session {
    /// `model`: the .onnx file; `flags`: `voxtile segment`'s, e.g. `["--device", "cpu"]`.
    #[new]
    fn new(py: Python<'_>, model: PathBuf, flags: Vec<String>) -> PyResult<Self> {
        let flags: Vec<OsString> = flags.into_iter().map(OsString::from).collect();
        let inner = py
            .detach(|| embed::session(&model, &flags))
            .map_err(to_py)?;
        let pipe = inner.pipeline();
        let top = match &pipe.settings().remap {
            Some(table) => table.iter().copied().max().unwrap_or(0) as usize,
            None => pipe.output_channels().max(2) - 1,
        };
        Ok(Session {
            cancel: inner.cancel_token(),
            inner: Mutex::new(inner),
            labels_u8: top <= u8::MAX as usize,
        })
    }

    /// Segment a (channels, i, j, k) array; see `voxtile.Model.segment`.
    #[pyo3(signature = (array, affine, spacing, probabilities, logits, clean_nonfinite, progress))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        affine: Option<[[f64; 4]; 4]>,
        spacing: Option<[f64; 3]>,
        probabilities: bool,
        logits: bool,
        clean_nonfinite: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Ran> {
        let input = Input::extract(array)?;
        let shape = input.shape();
        let view = input.view();
        // A cancel meant for an earlier run does not stop this one.
        self.cancel.reset();
        let out = watched(py, &self.cancel, progress.as_ref(), |cb| {
            let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let header = s.header(shape, affine, spacing)?;
            let data = view.to_f32();
            if !clean_nonfinite {
                let n = data.nonfinite();
                if n > 0 {
                    return Err(Error::Invalid(format!(
                        "the array has {n} NaN or infinite value(s): pass nonfinite=\"clean\" \
                         to read NaN as 0 and clamp ±Inf (as voxtile segment reads a file)"
                    )));
                }
            }
            s.run(data.view(), &header, (probabilities, logits), cb)
        })?;
        let report = serde_json::to_string(&out.report)
            .map_err(|e| to_py(Error::Invalid(format!("report: {e}"))))?;
        let labels = if self.labels_u8 {
            let labels = &out.labels;
            let narrow = py.detach(|| Zip::from(labels).par_map_collect(|&v| v as u8));
            narrow.into_pyarray(py).into_any().unbind()
        } else {
            out.labels.into_pyarray(py).into_any().unbind()
        };
        let array =
            |a: Option<ndarray::Array4<f32>>| a.map(|a| a.into_pyarray(py).into_any().unbind());
        Ok((labels, array(out.probabilities), array(out.logits), report))
    }

    /// `model.info` as JSON.
    fn info(&self) -> PyResult<String> {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.info().map(|v| v.to_string()).map_err(to_py)
    }

    /// The plan for a volume of network-axis `shape` on this model's device and budget (JSON).
    fn plan(&self, shape: [usize; 3]) -> PyResult<String> {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.plan(shape).map(|v| v.to_string()).map_err(to_py)
    }

    /// Stop the run in progress (it raises `voxtile.Cancelled`).
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Channels the model takes.
    #[getter]
    fn input_channels(&self) -> usize {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.pipeline().input_channels()
    }
}
