//! The command line's `segment` and `plan`, given their arguments as the shell would.

use crate::errors::to_py;
use crate::watch::watched;
use pyo3::prelude::*;
use std::ffi::OsString;
use voxtile::internals::cli::embed;
use voxtile::CancelToken;

/// `voxtile segment ARGV`: the whole path of the command (readers, manifest, resampling, outputs
/// committed together, report); Ctrl-C cancels it and nothing is written.
#[pyfunction]
pub fn segment(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    let argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
    let cancel = CancelToken::new();
    let token = cancel.clone();
    watched(py, &cancel, None, move |_| embed::segment(&argv, token))
}

/// `voxtile plan ARGV --json`'s object, as JSON text.
#[pyfunction]
pub fn plan(py: Python<'_>, argv: Vec<String>) -> PyResult<String> {
    let argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
    py.detach(|| embed::plan(&argv))
        .map(|v| v.to_string())
        .map_err(to_py)
}
