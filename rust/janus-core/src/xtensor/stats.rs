//! Pool statistics, read from the device's [`State`].
//!
//! Fragmentation (the paper's "~0.3% under continuous alloc/free", PAPER.md §7) is
//! defined here as the share of the pool that is free or held but cannot serve the
//! requests that allocate where it lies:
//! - stranded weight-zone pages: free pages in free runs that start at or above the
//!   lowest weight-segment page (the weight zone) and are shorter than the smallest
//!   weight segment requested so far on this pool: no weight segment of any model seen
//!   fits there contiguously, and KV allocations (lowest ids first) reach them last; plus
//! - idle cache pages: mapped-but-unused KV pages a model holds beyond its cache's high
//!   watermark (memory nobody uses that the refill thread has not trimmed yet);
//!
//! divided by the number of pages in the pool, in percent (`fragmentation_pct`).
//! Short free runs below the weight zone (the KV zone) serve KV growth, whose requests
//! are single pages, so they are not counted there; `fragmentation_all_zones_pct` counts
//! them too (every free run shorter than the smallest weight request, anywhere), the
//! stricter figure. Page rounding of weight segments is `rounding_waste_pct`.
//! docs/xtensor.md states the same definitions for readers of the benchmark, with their
//! caveats; keep the two in step.

use super::state::State;

#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub num_pages: usize,
    pub page_size: usize,
    pub free_pages: usize,
    pub largest_free_run: usize,
    pub free_runs: usize,
    pub pages_by_owner: Vec<(String, usize)>,
    pub weight_pages: usize,
    pub kv_pages: usize,
    pub cached_pages: usize,
    pub idle_cache_pages: usize,
    pub stranded_free_pages: usize,
    pub stranded_threshold_pages: usize,
    pub stranded_weight_zone_pages: usize,
    pub fragmentation_pct: f64,
    pub fragmentation_all_zones_pct: f64,
    pub rounding_waste_pct: f64,
    pub cache_misses: u64,
    pub cache_hits: u64,
    pub weight_segments: usize,
    pub noncontiguous_segments: usize,
    pub kv_regions: usize,
}

impl Stats {
    pub(super) fn collect(st: &State, page_size: usize) -> Self {
        let c = st.pool.counters();
        let mut by_owner: Vec<(String, usize)> =
            st.pool.owners().map(|(o, n)| (st.names.get(&o).cloned().unwrap_or_else(|| format!("#{o}")), n)).collect();
        by_owner.sort();
        let weight_pages: usize = st.segments.values().map(|s| s.pages.len()).sum();
        let rounding: usize = st.segments.values().map(|s| s.pages.len() * page_size - s.nbytes).sum();
        let kv_pages: usize = st.regions.values().map(|r| r.used).sum();
        let cached: usize = st.regions.values().map(|r| r.cached()).sum();
        let idle: usize = st.regions.values().map(|r| r.excess()).sum();
        let total = c.num_pages as f64;
        let weight_zone = st.pool.stranded_from(st.weight_zone_start());
        Self {
            num_pages: c.num_pages,
            page_size,
            free_pages: c.free_pages,
            largest_free_run: c.largest_free_run,
            free_runs: c.free_runs,
            pages_by_owner: by_owner,
            weight_pages,
            kv_pages,
            cached_pages: cached,
            idle_cache_pages: idle,
            stranded_free_pages: c.stranded_free,
            stranded_threshold_pages: c.stranded_threshold,
            stranded_weight_zone_pages: weight_zone,
            fragmentation_pct: 100.0 * (weight_zone + idle) as f64 / total,
            fragmentation_all_zones_pct: 100.0 * (c.stranded_free + idle) as f64 / total,
            rounding_waste_pct: 100.0 * rounding as f64 / (total * page_size as f64),
            cache_misses: st.regions.values().map(|r| r.misses).sum(),
            cache_hits: st.regions.values().map(|r| r.hits).sum(),
            weight_segments: st.segments.len(),
            noncontiguous_segments: st.segments.values().filter(|s| !s.contiguous).count(),
            kv_regions: st.regions.len(),
        }
    }
}
