//! What voxtile needs from the operating system, below everything else: host memory probing and
//! budgets (`memory`), fallible allocation and the thread pool (`alloc`), file reads that stay
//! inside a folder and write-then-rename (`fsio`), temp-file cleanup on signals (`signals`),
//! cooperative cancellation (`cancel`) and the log targets the CLI always shows (`notice`).
//! Nothing here imports from the engine, the planner, the backends or the readers.

#[allow(missing_docs)] // reached only through `internals`
pub(crate) mod alloc;
pub mod cancel;
pub(crate) mod fsio;
pub mod memory;
pub(crate) mod notice;
#[allow(missing_docs)] // reached only through `internals`
pub(crate) mod signals;
