//! `voxtile._voxtile.Window`: MONAI's `sliding_window_inference` on the library's [`Engine`]
//! (MONAI's window placement, importance map and padding), returning the blended raw outputs.

use crate::arrays::Input;
use crate::errors::to_py;
use crate::watch::watched;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;
use voxtile::engine::{Device, Engine, Options};
use voxtile::tiling::{BlendMode, PadMode, Placement};
use voxtile::{CancelToken, Error, Segmentation};

/// An engine with one set of window settings.
#[pyclass(module = "voxtile._voxtile", frozen)]
pub struct Window {
    engine: Mutex<Engine>,
    cancel: CancelToken,
}

/// MONAI's `mode` and `padding_mode` names.
fn modes(mode: &str, padding: &str, cval: f32) -> Result<(BlendMode, PadMode), Error> {
    let blend = match mode {
        "gaussian" => BlendMode::Gaussian,
        "constant" => BlendMode::Constant,
        m => {
            return Err(Error::Invalid(format!(
                "mode \"{m}\": use \"gaussian\" or \"constant\" (MONAI's blend modes)"
            )))
        }
    };
    let pad = match padding {
        "constant" => PadMode::Constant(cval),
        "replicate" => PadMode::Edge,
        p => {
            return Err(Error::Invalid(format!(
                "padding_mode \"{p}\": use \"constant\" or \"replicate\""
            )))
        }
    };
    Ok((blend, pad))
}

#[pymethods]
impl Window {
    /// See `voxtile.sliding_window_inference`.
    #[new]
    #[pyo3(signature = (model, roi, overlap, mode, sigma_scale, padding_mode, cval, device, memory_budget, batch))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        roi: [usize; 3],
        overlap: [f64; 3],
        mode: &str,
        sigma_scale: [f64; 3],
        padding_mode: &str,
        cval: f32,
        device: &str,
        memory_budget: Option<&str>,
        batch: Option<usize>,
    ) -> PyResult<Self> {
        let (blend, pad) = modes(mode, padding_mode, cval).map_err(to_py)?;
        if overlap.iter().any(|o| !(0.0..1.0).contains(o)) {
            return Err(crate::errors::invalid(format!(
                "overlap must lie in [0, 1), got {overlap:?}"
            )));
        }
        let options = Options {
            roi: Some(roi),
            overlap,
            blend,
            sigma_scale,
            placement: Placement::Monai,
            batch,
            pad,
            device: device.parse::<Device>().map_err(to_py)?,
            keep_logits: true,
            memory_budget: memory_budget
                .map(voxtile::plan::parse_bytes)
                .transpose()
                .map_err(to_py)?,
            ..Options::default()
        };
        let cancel = options.cancel.clone();
        let engine = py
            .detach(|| Engine::from_file(&model, options))
            .map_err(to_py)?;
        Ok(Window {
            engine: Mutex::new(engine),
            cancel,
        })
    }

    /// The blended raw outputs (C_out, D, H, W) of one (C, D, H, W) item.
    #[pyo3(signature = (array, progress))]
    fn run(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let input = Input::extract(array)?;
        let view = input.view();
        self.blended(py, progress, |engine, cb| {
            engine.segment_array(view.to_f32().view(), cb)
        })
    }

    /// The blended raw outputs (C_out, D, H, W) of one (C, D, H, W) float32 CUDA tensor, given
    /// as its `__dlpack__()` capsule: windows are gathered from it on the device, no host copy.
    /// The capsule (and the tensor behind it) stays referenced by the caller's frame until this
    /// returns.
    #[pyo3(signature = (capsule, progress))]
    fn run_device(
        &self,
        py: Python<'_>,
        capsule: &Bound<'_, PyAny>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let volume = crate::dlpack::device_volume(capsule)?;
        self.blended(py, progress, |engine, cb| engine.segment_device(volume, cb))
    }

    /// Stop the run in progress.
    fn cancel(&self) {
        self.cancel.cancel();
    }
}

impl Window {
    /// `segment` on the engine without the GIL (progress and Ctrl-C watched), its blended
    /// outputs as a NumPy array.
    fn blended(
        &self,
        py: Python<'_>,
        progress: Option<Py<PyAny>>,
        segment: impl FnOnce(&mut Engine, &mut dyn FnMut(usize, usize)) -> Result<Segmentation, Error>
            + Send,
    ) -> PyResult<Py<PyAny>> {
        self.cancel.reset();
        let logits = watched(py, &self.cancel, progress.as_ref(), |cb| {
            let mut engine = self.engine.lock().unwrap_or_else(|p| p.into_inner());
            segment(&mut engine, cb)?.logits.ok_or_else(|| {
                Error::Backend("the engine kept no blended outputs although asked to".into())
            })
        })?;
        Ok(logits.into_pyarray(py).into_any().unbind())
    }
}
