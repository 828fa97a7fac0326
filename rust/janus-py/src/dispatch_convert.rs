//! Argument and answer conversion for the dispatch binding (dispatch.rs): `Int` and
//! `Float` arguments (an out-of-range int is ValueError, like any bad value), `list[float]`
//! read straight off a list, and index lists built from shared cached ints. Split off so
//! that dispatch.rs holds only what Python sees (the two algorithms and `Dispatcher`)
//! and stays under the 400-line rule.

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;

/// pyo3 reports an int too large for `i64`/`f64` as OverflowError; to the caller it is a
/// bad value like NaN or a negative time, so it becomes ValueError (the argument's name is
/// added as a note by pyo3).
fn overflow_is_value_error(e: PyErr, py: Python<'_>) -> PyErr {
    if e.is_instance_of::<PyOverflowError>(py) {
        PyValueError::new_err(format!("out of range: {}", e.value(py)))
    } else {
        e
    }
}

/// An `int` argument (request or instance id); see [`overflow_is_value_error`].
pub(super) struct Int(pub(super) i64);

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        obj.extract::<i64>()
            .map(Int)
            .map_err(|e| overflow_is_value_error(e, obj.py()))
    }
}

/// A `float` argument (a time); see [`overflow_is_value_error`].
pub(super) struct Float(pub(super) f64);

impl<'a, 'py> FromPyObject<'a, 'py> for Float {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        obj.extract::<f64>()
            .map(Float)
            .map_err(|e| overflow_is_value_error(e, obj.py()))
    }
}

/// `list[float]` to `Vec<f64>`; an int too large for a float is a ValueError naming the
/// list (`name`).
pub(super) fn floats(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f64>> {
    floats_raw(obj).map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyValueError::new_err(format!("{name} out of range: {}", e.value(obj.py())))
        } else {
            e
        }
    })
}

/// `list[float]` to `Vec<f64>`. A list is read directly (borrowed items, no iterator
/// object): pyo3's generic sequence path costs about as much as LST-IMH itself on a
/// 1,000-job backlog. Anything else goes through pyo3's extraction.
fn floats_raw(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let Ok(list) = obj.cast::<PyList>() else {
        return obj.extract::<Vec<f64>>();
    };
    let py = obj.py();
    let n = list.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `list` is a live list; PyList_GetItem bounds-checks `i` (NULL and
        // IndexError if the list shrank) and returns a borrowed reference. An exact float
        // is read without running Python code. Anything else may run `__float__` or
        // `__index__`, which can drop the list's reference to the item, so the item is
        // held by a strong reference for the call.
        let v = unsafe {
            let item = pyo3::ffi::PyList_GetItem(list.as_ptr(), i as pyo3::ffi::Py_ssize_t);
            if item.is_null() {
                return Err(PyErr::fetch(py));
            }
            if pyo3::ffi::PyFloat_CheckExact(item) != 0 {
                // The macro reads the struct field; the stable ABI (abi3 builds, such as
                // the one carried to a device machine with another Python) has only the call.
                #[cfg(not(feature = "abi3"))]
                let v = pyo3::ffi::PyFloat_AS_DOUBLE(item);
                #[cfg(feature = "abi3")]
                let v = pyo3::ffi::PyFloat_AsDouble(item);
                v
            } else {
                pyo3::ffi::Py_INCREF(item);
                let v = pyo3::ffi::PyFloat_AsDouble(item);
                pyo3::ffi::Py_DECREF(item);
                v
            }
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

/// Python ints 0, 1, ... created once and shared by every answer: an answer is lists of
/// job indices, and a fresh int per index (no small-int cache past 256) cost about as
/// much as LST-IMH itself on a 1,000-job backlog. A Python list, so only the GIL guards
/// it (no lock that a garbage-collection callback could deadlock on).
static INDEX_INTS: PyOnceLock<Py<PyList>> = PyOnceLock::new();
/// Indices past this get fresh ints (the cache stays under ~3 MB).
const INDEX_CACHE_MAX: usize = 1 << 16;

pub(super) fn index_list<'py>(py: Python<'py>, seq: &[usize]) -> PyResult<Bound<'py, PyList>> {
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
