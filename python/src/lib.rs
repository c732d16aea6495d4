//! `voxtile._voxtile`: the native half of the Python package. The public API (keyword arguments,
//! PyTorch tensors, tqdm, docstrings) is `voxtile/__init__.py`; this module runs the library's
//! own paths: [`session`] (a model as `voxtile segment` makes it, on arrays), [`window`] (MONAI's
//! sliding-window inference), the command line's `segment` and `plan` ([`commands`]).

mod arrays;
mod commands;
mod dlpack;
mod errors;
mod session;
mod watch;
mod window;

use pyo3::prelude::*;

#[pymodule]
fn _voxtile(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // As `voxtile` starts: a thread count that fits an address-space limit, warnings on stderr.
    voxtile::internals::init_thread_pool();
    voxtile::internals::cli::embed::log_to_stderr();
    m.add_class::<session::Session>()?;
    m.add_class::<window::Window>()?;
    m.add_function(wrap_pyfunction!(commands::segment, m)?)?;
    m.add_function(wrap_pyfunction!(commands::plan, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
