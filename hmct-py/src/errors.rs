//! Rust errors as Python exceptions: mistakes in the arguments (the CLI's exit status
//! 2) are `ValueError` with the CLI's message and suggestions, file problems
//! `OSError` (its errno subclass, e.g. `FileNotFoundError`), anything else
//! `RuntimeError`; a cancelled engine is `KeyboardInterrupt`.

use std::error::Error;

use hmct_debug::engine::EngineError;
use hmct_ir::IrError;
use pyo3::PyErr;
use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError};

/// The exception for `e`; `usage` says whether it is a mistake in the arguments.
pub(crate) fn to_py(e: &(dyn Error + 'static), usage: bool) -> PyErr {
    // The same line the CLI prints.
    let message = hmct_ir::error_chain(e);
    if usage {
        return PyValueError::new_err(message);
    }
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if matches!(
            c.downcast_ref::<EngineError>(),
            Some(EngineError::Cancelled)
        ) {
            return PyKeyboardInterrupt::new_err("cancelled");
        }
        let io = c
            .downcast_ref::<std::io::Error>()
            .or_else(|| match c.downcast_ref::<IrError>() {
                Some(IrError::Io { error, .. }) => Some(error),
                _ => None,
            });
        if let Some(io) = io {
            // OSError(errno, text) becomes the errno's subclass (FileNotFoundError, ...).
            return match io.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, message)),
                None => PyOSError::new_err(message),
            };
        }
        cause = c.source();
    }
    PyRuntimeError::new_err(message)
}

/// A `ValueError` with this message.
pub(crate) fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Shorthand: an analysis error with an `is_usage` method.
macro_rules! py_err {
    ($e:expr) => {{
        let e = $e;
        let usage = e.is_usage();
        $crate::errors::to_py(&e, usage)
    }};
}
pub(crate) use py_err;
