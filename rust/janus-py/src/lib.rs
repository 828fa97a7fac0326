//! `janusd._native`: the Python face of janus-core. Only conversions live here.

use pyo3::prelude::*;

mod decode;
mod dispatch;
mod errors;
mod quant;
mod sim;
mod xtensor;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    dispatch::register(m)?;
    xtensor::register(m)?;
    sim::register(m)?;
    quant::register(m)?;
    decode::register(m)?;
    Ok(())
}
