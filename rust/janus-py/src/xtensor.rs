//! Python binding of janus_core::xtensor: `XtPool`, `XtSegment`, `XtKv`, `XtRange`.
//! Type and error conversion only; the Python face is `janusd.memory`. Calls that may map
//! or unmap pages release the GIL.

use std::sync::Arc;

use janus_core::xtensor::{bench, region::VirtualRange, DevicePool, Stats, XtError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{xt_err, XTensorError};

fn to_usize(v: i64, what: &str) -> Result<usize, XtError> {
    usize::try_from(v).map_err(|_| XtError::invalid(format!("{what} must be non-negative, got {v}")))
}

/// A reserved virtual range kept alive while this object (or a view holding it) exists.
#[pyclass(module = "janusd._native", frozen)]
pub struct XtRange {
    range: Arc<VirtualRange>,
}

#[pymethods]
impl XtRange {
    #[getter]
    fn base(&self) -> usize {
        self.range.base
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.range.len
    }
}

/// One device's page pool (see rust/janus-core/src/xtensor/device.rs).
#[pyclass(module = "janusd._native", frozen)]
pub struct XtPool {
    pool: Arc<DevicePool>,
}

#[pymethods]
impl XtPool {
    #[new]
    #[pyo3(signature = (kind, num_pages, page_size, device_index=0, background=true))]
    fn new(py: Python<'_>, kind: &str, num_pages: i64, page_size: i64, device_index: i64, background: bool) -> PyResult<Self> {
        let num_pages = to_usize(num_pages, "num_pages").map_err(xt_err)?;
        let page_size = to_usize(page_size, "page_size").map_err(xt_err)?;
        let device_index = u32::try_from(device_index)
            .map_err(|_| xt_err(XtError::invalid(format!("device_index must be in 0..2^32, got {device_index}"))))?;
        let kind = kind.to_string();
        let pool = py
            .detach(move || DevicePool::new(&kind, num_pages, page_size, device_index, background))
            .map_err(xt_err)?;
        Ok(Self { pool: Arc::new(pool) })
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.pool.kind().as_str()
    }
    #[getter]
    fn page_size(&self) -> usize {
        self.pool.page_size()
    }
    #[getter]
    fn num_pages(&self) -> usize {
        self.pool.num_pages()
    }
    #[getter]
    fn global_base(&self) -> usize {
        self.pool.global_base()
    }
    #[getter]
    fn global_nbytes(&self) -> usize {
        self.pool.global_range().len
    }
    #[getter]
    fn closed(&self) -> bool {
        self.pool.is_closed()
    }

    fn global_range(&self) -> XtRange {
        XtRange { range: self.pool.global_range() }
    }

    fn alloc_weights(&self, py: Python<'_>, owner: &str, nbytes: i64) -> PyResult<XtSegment> {
        let pool = self.pool.clone();
        let owner_s = owner.to_string();
        let s = py.detach(move || pool.alloc_weights(&owner_s, nbytes)).map_err(xt_err)?;
        Ok(XtSegment {
            id: s.id,
            addr: s.addr,
            nbytes: s.nbytes,
            page_ids: s.pages,
            contiguous: s.contiguous,
            global_offset: s.global_offset,
            range: s.range,
        })
    }

    #[pyo3(signature = (owner, max_bytes, cache_low, cache_high))]
    fn kv_region(&self, owner: &str, max_bytes: i64, cache_low: i64, cache_high: i64) -> PyResult<XtKv> {
        let low = to_usize(cache_low, "cache_low").map_err(xt_err)?;
        let high = to_usize(cache_high, "cache_high").map_err(xt_err)?;
        let k = self.pool.kv_region(owner, max_bytes, low, high).map_err(xt_err)?;
        Ok(XtKv { pool: self.pool.clone(), id: k.id, base: k.base, max_pages: k.max_pages, range: k.range })
    }

    fn free(&self, py: Python<'_>, owner: &str) -> PyResult<()> {
        let pool = self.pool.clone();
        let owner = owner.to_string();
        py.detach(move || pool.free(&owner)).map_err(xt_err)
    }

    fn maintain(&self, py: Python<'_>) -> PyResult<()> {
        let pool = self.pool.clone();
        py.detach(move || pool.maintain()).map_err(xt_err)
    }

    fn maintenance_backlog(&self) -> PyResult<usize> {
        self.pool.maintenance_backlog().map_err(xt_err)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats().map_err(xt_err)?;
        stats_dict(py, &s)
    }

    fn check_integrity(&self) -> PyResult<()> {
        self.pool.check_integrity().map_err(xt_err)
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let pool = self.pool.clone();
        py.detach(move || pool.close()).map_err(xt_err)
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("num_pages", s.num_pages)?;
    d.set_item("page_size", s.page_size)?;
    d.set_item("free_pages", s.free_pages)?;
    d.set_item("largest_free_run", s.largest_free_run)?;
    d.set_item("free_runs", s.free_runs)?;
    let by_owner = PyDict::new(py);
    for (name, n) in &s.pages_by_owner {
        by_owner.set_item(name, n)?;
    }
    d.set_item("pages_by_owner", by_owner)?;
    d.set_item("weight_pages", s.weight_pages)?;
    d.set_item("kv_pages", s.kv_pages)?;
    d.set_item("cached_pages", s.cached_pages)?;
    d.set_item("idle_cache_pages", s.idle_cache_pages)?;
    d.set_item("stranded_free_pages", s.stranded_free_pages)?;
    d.set_item("stranded_threshold_pages", s.stranded_threshold_pages)?;
    d.set_item("stranded_weight_zone_pages", s.stranded_weight_zone_pages)?;
    d.set_item("fragmentation_pct", s.fragmentation_pct)?;
    d.set_item("fragmentation_all_zones_pct", s.fragmentation_all_zones_pct)?;
    d.set_item("rounding_waste_pct", s.rounding_waste_pct)?;
    d.set_item("cache_misses", s.cache_misses)?;
    d.set_item("cache_hits", s.cache_hits)?;
    d.set_item("weight_segments", s.weight_segments)?;
    d.set_item("noncontiguous_segments", s.noncontiguous_segments)?;
    d.set_item("kv_regions", s.kv_regions)?;
    Ok(d)
}

/// A weight segment (immutable facts; freed through its pool by owner).
#[pyclass(module = "janusd._native", frozen)]
pub struct XtSegment {
    #[pyo3(get)]
    id: u64,
    #[pyo3(get)]
    addr: usize,
    #[pyo3(get)]
    nbytes: usize,
    #[pyo3(get)]
    page_ids: Vec<u32>,
    #[pyo3(get)]
    contiguous: bool,
    #[pyo3(get)]
    global_offset: usize,
    range: Arc<VirtualRange>,
}

#[pymethods]
impl XtSegment {
    fn range(&self) -> XtRange {
        XtRange { range: self.range.clone() }
    }
}

/// A model's KV region.
#[pyclass(module = "janusd._native", frozen)]
pub struct XtKv {
    pool: Arc<DevicePool>,
    #[pyo3(get)]
    id: u64,
    #[pyo3(get)]
    base: usize,
    #[pyo3(get)]
    max_pages: usize,
    range: Arc<VirtualRange>,
}

#[pymethods]
impl XtKv {
    fn range(&self) -> XtRange {
        XtRange { range: self.range.clone() }
    }

    fn resize(&self, py: Python<'_>, n_pages: i64) -> PyResult<()> {
        let n = to_usize(n_pages, "n_pages").map_err(xt_err)?;
        let (pool, id) = (self.pool.clone(), self.id);
        py.detach(move || pool.kv_resize(id, n)).map_err(xt_err)
    }

    /// (used pages, cached pages, max pages, cache misses, cache hits)
    fn state(&self) -> PyResult<(usize, usize, usize, u64, u64)> {
        self.pool.kv_state(self.id).map_err(xt_err)
    }

    fn page_ids(&self) -> PyResult<Vec<u32>> {
        self.pool.kv_page_ids(self.id).map_err(xt_err)
    }

    fn global_offsets(&self, byte_offset: i64, nbytes: i64) -> PyResult<Vec<(usize, usize)>> {
        self.pool.kv_global_offsets(self.id, byte_offset, nbytes).map_err(xt_err)
    }
}

/// `janus bench xtensor`: per-page map/unmap against the raw mmap floor (host backend), untouched and touched.
#[pyfunction]
#[pyo3(signature = (pages=256, page_size=2 << 20, rounds=15))]
fn xtensor_bench_map<'py>(py: Python<'py>, pages: usize, page_size: usize, rounds: usize) -> PyResult<Bound<'py, PyDict>> {
    if pages == 0 || rounds == 0 {
        return Err(XTensorError::new_err("pages and rounds must be positive"));
    }
    let r = py.detach(move || bench::map_unmap(pages, page_size, rounds)).map_err(xt_err)?;
    let d = PyDict::new(py);
    d.set_item("pages", r.pages)?;
    d.set_item("rounds", r.rounds)?;
    d.set_item("map_us_per_page", r.map_us_per_page)?;
    d.set_item("unmap_us_per_page", r.unmap_us_per_page)?;
    d.set_item("raw_map_us_per_page", r.raw_map_us_per_page)?;
    d.set_item("raw_unmap_us_per_page", r.raw_unmap_us_per_page)?;
    d.set_item("touched_map_us_per_page", r.touched_map_us_per_page)?;
    d.set_item("touched_unmap_us_per_page", r.touched_unmap_us_per_page)?;
    d.set_item("raw_touched_map_us_per_page", r.raw_touched_map_us_per_page)?;
    d.set_item("raw_touched_unmap_us_per_page", r.raw_touched_unmap_us_per_page)?;
    Ok(d)
}

/// `janus bench xtensor`: (thread CPU ns, wall ns) per bookkeeping alloc/free of the pure page pool.
#[pyfunction]
#[pyo3(signature = (num_pages=65536, ops=1_000_000, seed=1))]
fn xtensor_bench_bookkeeping(py: Python<'_>, num_pages: usize, ops: usize, seed: u64) -> PyResult<(f64, f64)> {
    if ops == 0 {
        return Err(XTensorError::new_err("ops must be positive"));
    }
    py.detach(move || bench::bookkeeping(num_pages, ops, seed)).map_err(xt_err)
}

/// `janus bench xtensor`: fragmentation over a load/unload + KV grow/shrink churn.
#[pyfunction]
#[pyo3(signature = (num_pages=32768, page_size=4096, ops=1_000_000, seed=7))]
fn xtensor_bench_churn<'py>(py: Python<'py>, num_pages: usize, page_size: usize, ops: usize, seed: u64) -> PyResult<Bound<'py, PyDict>> {
    if ops == 0 {
        return Err(XTensorError::new_err("ops must be positive"));
    }
    let r = py.detach(move || bench::churn(num_pages, page_size, ops, seed)).map_err(xt_err)?;
    let d = PyDict::new(py);
    d.set_item("ops", r.ops)?;
    d.set_item("loads", r.loads)?;
    d.set_item("unloads", r.unloads)?;
    d.set_item("kv_resizes", r.kv_resizes)?;
    d.set_item("kv_refused", r.kv_refused)?;
    d.set_item("load_refused", r.load_refused)?;
    d.set_item("noncontiguous_loads", r.noncontiguous_loads)?;
    d.set_item("fragmentation_mean_pct", r.fragmentation_mean_pct)?;
    d.set_item("fragmentation_max_pct", r.fragmentation_max_pct)?;
    d.set_item("fragmentation_all_zones_mean_pct", r.fragmentation_all_zones_mean_pct)?;
    d.set_item("fragmentation_all_zones_max_pct", r.fragmentation_all_zones_max_pct)?;
    d.set_item("mean_free_pct", r.mean_free_pct)?;
    d.set_item("seconds", r.seconds)?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(xtensor_bench_map, m)?)?;
    m.add_function(wrap_pyfunction!(xtensor_bench_bookkeeping, m)?)?;
    m.add_function(wrap_pyfunction!(xtensor_bench_churn, m)?)?;
    m.add("XTensorError", m.py().get_type::<XTensorError>())?;
    m.add_class::<XtPool>()?;
    m.add_class::<XtSegment>()?;
    m.add_class::<XtKv>()?;
    m.add_class::<XtRange>()?;
    Ok(())
}
