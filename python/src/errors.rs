//! The library's errors as the Python classes of `voxtile._errors`, one per kind, with the
//! numbers a caller may act on as attributes.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use voxtile::Error;

/// The class of `voxtile._errors` for an error kind.
pub fn class_name(e: &Error) -> &'static str {
    match e {
        Error::Io { .. } => "IoError",
        Error::Volume { .. } => "VolumeError",
        Error::Model { .. } => "ModelError",
        Error::UnsupportedOps { .. } => "UnsupportedOps",
        Error::ChannelMismatch { .. } => "ChannelMismatch",
        Error::BudgetTooSmall { .. } => "BudgetTooSmall",
        Error::Cancelled => "Cancelled",
        Error::Graph(_) => "GraphError",
        Error::Invalid(_) => "InvalidInput",
        Error::Backend(_) => "BackendError",
        Error::OutOfMemory(_) => "OutOfMemory",
        _ => "VoxtileError",
    }
}

/// The attributes beside the message.
fn fields<'py>(py: Python<'py>, e: &Error) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match e {
        Error::ChannelMismatch { expected, got, .. } => {
            d.set_item("expected", expected)?;
            d.set_item("got", got)?;
        }
        Error::BudgetTooSmall {
            needed,
            budget,
            roi,
            batch,
            ..
        } => {
            d.set_item("needed", needed)?;
            d.set_item("budget", budget)?;
            d.set_item("roi", roi.to_vec())?;
            d.set_item("batch", batch)?;
        }
        Error::UnsupportedOps { ops, .. } => {
            let listed: Vec<(String, String, String)> = ops
                .iter()
                .map(|o| (o.op.clone(), o.node.clone(), o.why.clone()))
                .collect();
            d.set_item("ops", listed)?;
        }
        _ => {}
    }
    Ok(d)
}

/// `e` as an instance of its class, attributes set.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| build(py, &e).unwrap_or_else(|err| err))
}

fn build(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let class = py.import("voxtile._errors")?.getattr(class_name(e))?;
    let err = class.call1((e.to_string(),))?;
    for (k, v) in fields(py, e)?.iter() {
        err.setattr(k.extract::<String>()?.as_str(), v)?;
    }
    Ok(PyErr::from_value(err))
}

/// An `InvalidInput` with this message (bad arrays and arguments found here).
pub fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(Error::Invalid(msg.into()))
}
