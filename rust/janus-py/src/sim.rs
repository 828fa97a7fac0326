//! Python binding of janus_core::sim: `SegmentLog` (python/janusd/sim/worker.py). Type and
//! error conversion only.

use janus_core::sim::segments;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A simulated device's step segments and the per-request on-time count
/// (rust/janus-core/src/sim/segments.rs).
#[pyclass(module = "janusd._native")]
pub struct SegmentLog {
    log: segments::SegmentLog,
}

#[pymethods]
impl SegmentLog {
    #[new]
    fn new() -> Self {
        Self { log: segments::SegmentLog::new() }
    }

    fn __len__(&self) -> usize {
        self.log.len()
    }

    fn push(&mut self, start: i64, t0: f64, dt: f64) -> PyResult<()> {
        self.log.push(start, t0, dt).map_err(PyValueError::new_err)
    }

    fn trim(&mut self, oldest: i64) {
        self.log.trim(oldest)
    }

    /// (on-time tokens, first token s after arrival, last token s after arrival, every
    /// token's time after arrival or None).
    #[pyo3(signature = (first, n_out, arrival, ttft, tpot, keep_times=false))]
    fn tally(&self, first: i64, n_out: i64, arrival: f64, ttft: f64, tpot: f64, keep_times: bool)
             -> PyResult<(i64, f64, f64, Option<Vec<f64>>)> {
        let mut times = keep_times.then(Vec::new);
        let t = self.log.tally(first, n_out, arrival, ttft, tpot, times.as_mut()).map_err(PyValueError::new_err)?;
        Ok((t.on_time, t.first_s, t.last_s, times))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SegmentLog>()
}
