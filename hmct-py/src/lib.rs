//! `hmct_rs._native`: the Rust half of the Python package `hmct_rs`. It holds models
//! ([`model::PyModel`]) and analysis engines ([`analyses::Analyzer`]) and returns
//! every analysis result as the CLI's `--json` text, so Python and the CLI cannot
//! disagree; the Python half (`python/hmct_rs`) gives it the seeds' API.
//!
//! Long computations run on a worker thread with the GIL released while the calling
//! thread watches for Ctrl-C and reports progress ([`interrupt::run`]); a Rust panic
//! becomes a `RuntimeError`, never a Python-level crash.

use pyo3::prelude::*;

/// Large buffers on cache lines, as in `hmct-debugger` (see `hmct_quant::alloc`).
#[global_allocator]
static ALLOC: hmct_quant::CacheLineAlloc = hmct_quant::CacheLineAlloc;

mod analyses;
mod data;
mod errors;
mod interrupt;
mod model;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::PyModel>()?;
    m.add_class::<analyses::Analyzer>()?;
    m.add_function(wrap_pyfunction!(analyses::calibrate, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
