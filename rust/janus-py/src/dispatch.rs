//! Python binding of janus_core::dispatch: `moore_hodgson`, `lst_imh`, `Dispatcher`.
//! Type and error conversion only. Whole-backlog calls (the two algorithms, `tick`,
//! `next_wakeup`) release the GIL; errors become ValueError via `errors::dispatch_err`.

use janus_core::dispatch as core;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::dispatch_err;

// Argument and answer conversion (Int, Float, list[float], index lists) lives in its own file.
#[path = "dispatch_convert.rs"]
mod convert;
use convert::{floats, index_list, Float, Int};

/// Indices of a maximum set of jobs that all meet their deadlines on one machine free at
/// `start`, in execution (earliest-deadline-first) order.
#[pyfunction]
fn moore_hodgson<'py>(
    py: Python<'py>,
    proc: &Bound<'py, PyAny>,
    deadline: &Bound<'py, PyAny>,
    start: Float,
) -> PyResult<Bound<'py, PyList>> {
    let (proc, deadline, start) = (
        floats(proc, "proc")?,
        floats(deadline, "deadline")?,
        start.0,
    );
    let seq = py
        .detach(|| core::moore_hodgson(proc, deadline, start))
        .map_err(dispatch_err)?;
    index_list(py, &seq)
}

/// LST-IMH: per machine (input order), its job indices in execution order.
#[pyfunction]
fn lst_imh<'py>(
    py: Python<'py>,
    proc: &Bound<'py, PyAny>,
    deadline: &Bound<'py, PyAny>,
    avail: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let (proc, deadline, avail) = (
        floats(proc, "proc")?,
        floats(deadline, "deadline")?,
        floats(avail, "avail")?,
    );
    let plan = py
        .detach(|| core::lst_imh(proc, deadline, avail))
        .map_err(dispatch_err)?;
    let lists = plan
        .iter()
        .map(|seq| index_list(py, seq))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, lists)
}

/// The online, clock-injected dispatcher (per-model queues, one EPDT per device group,
/// pre-pull, the global or window plan, requeue).
#[pyclass(module = "janusd._native")]
pub struct Dispatcher {
    inner: core::Dispatcher,
}

#[pymethods]
impl Dispatcher {
    #[new]
    #[pyo3(
        signature = (policy="lst_imh", prepull_window_s=Float(0.02), requeue="reject", relax_factor=Float(1.5), max_relax=Int(2), plan="global", objective="requests"),
        text_signature = "(policy='lst_imh', prepull_window_s=0.02, requeue='reject', relax_factor=1.5, max_relax=2, plan='global', objective='requests')"
    )]
    fn new(
        policy: &str,
        prepull_window_s: Float,
        requeue: &str,
        relax_factor: Float,
        max_relax: Int,
        plan: &str,
        objective: &str,
    ) -> PyResult<Self> {
        let (prepull_window_s, relax_factor, max_relax) =
            (prepull_window_s.0, relax_factor.0, max_relax.0);
        let max_relax = u32::try_from(max_relax).map_err(|_| {
            PyValueError::new_err(format!("max_relax must be in 0..2^32, got {max_relax}"))
        })?;
        let cfg = core::DispatcherConfig {
            policy: core::Policy::parse(policy).map_err(dispatch_err)?,
            prepull_window_s,
            requeue: core::Requeue::parse(requeue).map_err(dispatch_err)?,
            relax_factor,
            max_relax,
            plan: core::Plan::parse(plan).map_err(dispatch_err)?,
            objective: core::Objective::parse(objective).map_err(dispatch_err)?,
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

    #[getter]
    fn plan(&self) -> &'static str {
        self.inner.config().plan.name()
    }

    #[getter]
    fn objective(&self) -> &'static str {
        self.inner.config().objective.name()
    }

    /// Registers a ready instance of `model` in device group `group` (None: the
    /// instance's own id, a group of its own); the instances of a group share one EPDT.
    #[pyo3(signature = (instance_id, model, group=None))]
    fn add_instance(&mut self, instance_id: Int, model: &str, group: Option<Int>) -> PyResult<()> {
        let id = instance_id.0;
        let group = group.map_or(id, |g| g.0);
        self.inner
            .add_instance(id, model, group)
            .map_err(dispatch_err)
    }

    fn remove_instance(&mut self, instance_id: Int) -> PyResult<Vec<i64>> {
        self.inner
            .remove_instance(instance_id.0)
            .map_err(dispatch_err)
    }

    fn set_instance_ready(&mut self, instance_id: Int, ready: bool) -> PyResult<()> {
        self.inner
            .set_instance_ready(instance_id.0, ready)
            .map_err(dispatch_err)
    }

    fn set_group_decode_load(&mut self, group: Int, load: Float) -> PyResult<()> {
        self.inner
            .set_group_decode_load(group.0, load.0)
            .map_err(dispatch_err)
    }

    #[pyo3(
        signature = (request_id, model, arrival_s, deadline_s, est_proc_s, weight=Float(1.0), tokens=Float(0.0)),
        text_signature = "($self, request_id, model, arrival_s, deadline_s, est_proc_s, weight=1.0, tokens=0.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        request_id: Int,
        model: &str,
        arrival_s: Float,
        deadline_s: Float,
        est_proc_s: Float,
        weight: Float,
        tokens: Float,
    ) -> PyResult<()> {
        self.inner
            .submit_job(request_id.0, model, arrival_s.0, deadline_s.0, est_proc_s.0, weight.0, tokens.0)
            .map_err(dispatch_err)
    }

    /// The instance's own prefill fit (a, b): a job of `tokens` takes a + b * tokens
    /// there; None: each job's submitted estimate.
    #[pyo3(signature = (instance_id, fit=None))]
    fn set_prefill_fit(&mut self, instance_id: Int, fit: Option<(Float, Float)>) -> PyResult<()> {
        self.inner
            .set_prefill_fit(instance_id.0, fit.map(|(a, b)| (a.0, b.0)))
            .map_err(dispatch_err)
    }

    fn earliest_finish(&self, instance_ids: Vec<i64>, tokens: Float, est: Float, now: Float) -> PyResult<Option<f64>> {
        self.inner
            .earliest_finish(&instance_ids, tokens.0, est.0, now.0)
            .map_err(dispatch_err)
    }

    fn tick(&mut self, py: Python<'_>, now: Float) -> PyResult<Vec<(i64, i64)>> {
        let (inner, now) = (&mut self.inner, now.0);
        py.detach(|| inner.tick(now)).map_err(dispatch_err)
    }

    fn complete(&mut self, request_id: Int, now: Float) -> PyResult<()> {
        self.inner
            .complete(request_id.0, now.0)
            .map_err(dispatch_err)
    }

    #[pyo3(signature = (request_id, now=None))]
    fn cancel(&mut self, request_id: Int, now: Option<Float>) -> PyResult<bool> {
        match now {
            None => Ok(self.inner.cancel(request_id.0)),
            Some(now) => self
                .inner
                .cancel_at(request_id.0, now.0)
                .map_err(dispatch_err),
        }
    }

    fn wants_tick(&self) -> bool {
        self.inner.wants_tick()
    }

    fn take_rejected(&mut self) -> Vec<i64> {
        self.inner.take_rejected()
    }

    fn next_wakeup(&self, py: Python<'_>, now: Float) -> PyResult<Option<f64>> {
        let (inner, now) = (&self.inner, now.0);
        py.detach(|| inner.next_wakeup(now)).map_err(dispatch_err)
    }

    fn epdt(&self, instance_id: Int, now: Float) -> PyResult<f64> {
        self.inner.epdt(instance_id.0, now.0).map_err(dispatch_err)
    }

    /// (EPDT(now), ready, requests given and not prefilled) of an instance.
    fn instance_figures(&self, instance_id: Int, now: Float) -> PyResult<(f64, bool, usize)> {
        self.inner
            .instance_figures(instance_id.0, now.0)
            .map_err(dispatch_err)
    }

    fn min_epdt(&self, instance_ids: Vec<i64>, now: Float) -> PyResult<Option<f64>> {
        self.inner.min_epdt(&instance_ids, now.0).map_err(dispatch_err)
    }

    fn pending(&self, model: &str) -> usize {
        self.inner.pending(model)
    }

    fn relaxed(&self, model: &str) -> u64 {
        self.inner.relaxed(model)
    }

    /// None, or RuntimeError naming the first broken bookkeeping rule.
    fn check_integrity(&self) -> PyResult<()> {
        self.inner
            .check_integrity()
            .map_err(PyRuntimeError::new_err)
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
            "Dispatcher(policy='{}', plan='{}', pending={}, in_flight={})",
            self.policy(),
            self.plan(),
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
