//! Conversion of janus-core errors into Python exceptions (the only place that does it).

use janus_core::xtensor::XtError;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::PyErr;

create_exception!(
    janusd._native,
    XTensorError,
    PyValueError,
    "xTensor: bad arguments, unknown owner or double free, an exhausted pool, or a missing/failing device backend."
);

/// Every xTensor error becomes XTensorError (a ValueError) carrying the core's message.
pub fn xt_err(e: XtError) -> PyErr {
    XTensorError::new_err(e.message)
}

/// Every dispatch error (bad times or lengths, unknown or duplicate instance/request ids)
/// is a caller mistake: ValueError carrying the core's message.
pub fn dispatch_err(e: janus_core::dispatch::DispatchError) -> PyErr {
    PyValueError::new_err(e.to_string())
}
