//! Python binding of janus_core::dispatch: `moore_hodgson`, `lst_imh`, `Dispatcher`.
//! Type and error conversion only. Whole-backlog calls (the two algorithms, `tick`,
//! `next_wakeup`) release the GIL; errors become ValueError via `errors::dispatch_err`.

use janus_core::dispatch as core;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};

use crate::errors::dispatch_err;

/// `list[float]` to `Vec<f64>`. A list is read directly (borrowed items, no iterator
/// object): pyo3's generic sequence path costs about as much as LST-IMH itself on a
/// 1,000-job backlog. Anything else goes through pyo3's extraction.
fn floats(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let Ok(list) = obj.cast::<PyList>() else {
        return obj.extract::<Vec<f64>>();
    };
    let py = obj.py();
    let n = list.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `list` is a live list and i < its length (nothing here runs Python code
        // that could shrink it); PyList_GetItem returns a borrowed reference.
        let v = unsafe {
            let item = pyo3::ffi::PyList_GetItem(list.as_ptr(), i as pyo3::ffi::Py_ssize_t);
            if item.is_null() {
                return Err(PyErr::fetch(py));
            }
            pyo3::ffi::PyFloat_AsDouble(item)
        };
        if v == -1.0 {
            if let Some(err) = PyErr::take(py) {
                return Err(err);
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// Indices of a maximum set of jobs that all meet their deadlines on one machine free at
/// `start`, in execution (earliest-deadline-first) order.
#[pyfunction]
fn moore_hodgson<'py>(
    py: Python<'py>,
    proc: &Bound<'py, PyAny>,
    deadline: &Bound<'py, PyAny>,
    start: f64,
) -> PyResult<Bound<'py, PyList>> {
    let (proc, deadline) = (floats(proc)?, floats(deadline)?);
    let seq = py
        .detach(|| core::moore_hodgson(proc, deadline, start))
        .map_err(dispatch_err)?;
    index_list(py, &seq)
}

/// Python ints 0, 1, ... created once and shared by every answer: an answer is lists of
/// job indices, and a fresh int per index (no small-int cache past 256) cost about as
/// much as LST-IMH itself on a 1,000-job backlog. A Python list, so only the GIL guards
/// it (no lock that a garbage-collection callback could deadlock on).
static INDEX_INTS: PyOnceLock<Py<PyList>> = PyOnceLock::new();
/// Indices past this get fresh ints (the cache stays under ~3 MB).
const INDEX_CACHE_MAX: usize = 1 << 16;

fn index_list<'py>(py: Python<'py>, seq: &[usize]) -> PyResult<Bound<'py, PyList>> {
    let cache = INDEX_INTS
        .get_or_init(py, || PyList::empty(py).unbind())
        .bind(py);
    let need = seq
        .iter()
        .copied()
        .max()
        .map_or(0, |m| m + 1)
        .min(INDEX_CACHE_MAX);
    for i in cache.len()..need {
        cache.append(i)?;
    }
    let item = |i: usize| -> Bound<'py, PyAny> {
        if i < need {
            if let Ok(x) = cache.get_item(i) {
                return x;
            }
        }
        let Ok(x) = i.into_pyobject(py);
        x.into_any()
    };
    PyList::new(py, seq.iter().map(|&i| item(i)))
}

/// LST-IMH: per machine (input order), its job indices in execution order.
#[pyfunction]
fn lst_imh<'py>(
    py: Python<'py>,
    proc: &Bound<'py, PyAny>,
    deadline: &Bound<'py, PyAny>,
    avail: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let (proc, deadline, avail) = (floats(proc)?, floats(deadline)?, floats(avail)?);
    let plan = py
        .detach(|| core::lst_imh(proc, deadline, avail))
        .map_err(dispatch_err)?;
    let lists = plan
        .iter()
        .map(|seq| index_list(py, seq))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, lists)
}

/// The online, clock-injected dispatcher (per-model queues, EPDT, pre-pull, requeue).
#[pyclass(module = "janusd._native")]
pub struct Dispatcher {
    inner: core::Dispatcher,
}

#[pymethods]
impl Dispatcher {
    #[new]
    #[pyo3(signature = (policy="lst_imh", prepull_window_s=0.02, requeue="reject", relax_factor=1.5, max_relax=2))]
    fn new(
        policy: &str,
        prepull_window_s: f64,
        requeue: &str,
        relax_factor: f64,
        max_relax: i64,
    ) -> PyResult<Self> {
        let max_relax = u32::try_from(max_relax).map_err(|_| {
            PyValueError::new_err(format!("max_relax must be in 0..2^32, got {max_relax}"))
        })?;
        let cfg = core::DispatcherConfig {
            policy: core::Policy::parse(policy).map_err(dispatch_err)?,
            prepull_window_s,
            requeue: core::Requeue::parse(requeue).map_err(dispatch_err)?,
            relax_factor,
            max_relax,
        };
        Ok(Dispatcher {
            inner: core::Dispatcher::new(cfg).map_err(dispatch_err)?,
        })
    }

    #[getter]
    fn policy(&self) -> &'static str {
        match self.inner.config().policy {
            core::Policy::LstImh => "lst_imh",
            core::Policy::RoundRobin => "round_robin",
            core::Policy::LeastLoad => "least_load",
        }
    }

    #[getter]
    fn prepull_window_s(&self) -> f64 {
        self.inner.config().prepull_window_s
    }

    fn add_instance(&mut self, instance_id: i64, model: &str) -> PyResult<()> {
        self.inner
            .add_instance(instance_id, model)
            .map_err(dispatch_err)
    }

    fn remove_instance(&mut self, instance_id: i64) -> PyResult<Vec<i64>> {
        self.inner
            .remove_instance(instance_id)
            .map_err(dispatch_err)
    }

    fn set_instance_ready(&mut self, instance_id: i64, ready: bool) -> PyResult<()> {
        self.inner
            .set_instance_ready(instance_id, ready)
            .map_err(dispatch_err)
    }

    fn submit(
        &mut self,
        request_id: i64,
        model: &str,
        arrival_s: f64,
        deadline_s: f64,
        est_proc_s: f64,
    ) -> PyResult<()> {
        self.inner
            .submit(request_id, model, arrival_s, deadline_s, est_proc_s)
            .map_err(dispatch_err)
    }

    fn tick(&mut self, py: Python<'_>, now: f64) -> PyResult<Vec<(i64, i64)>> {
        let inner = &mut self.inner;
        py.detach(|| inner.tick(now)).map_err(dispatch_err)
    }

    fn complete(&mut self, request_id: i64, now: f64) -> PyResult<()> {
        self.inner.complete(request_id, now).map_err(dispatch_err)
    }

    fn cancel(&mut self, request_id: i64) -> bool {
        self.inner.cancel(request_id)
    }

    fn take_rejected(&mut self) -> Vec<i64> {
        self.inner.take_rejected()
    }

    fn next_wakeup(&self, py: Python<'_>, now: f64) -> PyResult<Option<f64>> {
        let inner = &self.inner;
        py.detach(|| inner.next_wakeup(now)).map_err(dispatch_err)
    }

    fn epdt(&self, instance_id: i64, now: f64) -> PyResult<f64> {
        self.inner.epdt(instance_id, now).map_err(dispatch_err)
    }

    fn pending(&self, model: &str) -> usize {
        self.inner.pending(model)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("submitted", s.submitted),
            ("assigned", s.assigned),
            ("completed", s.completed),
            ("rejected", s.rejected),
            ("relaxed", s.relaxed),
            ("cancelled", s.cancelled),
            ("orphaned", s.orphaned),
            ("pending", s.pending),
            ("in_flight", s.in_flight),
            ("ticks", s.ticks),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "Dispatcher(policy='{}', pending={}, in_flight={})",
            self.policy(),
            s.pending,
            s.in_flight
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(moore_hodgson, m)?)?;
    m.add_function(wrap_pyfunction!(lst_imh, m)?)?;
    m.add_class::<Dispatcher>()?;
    Ok(())
}
