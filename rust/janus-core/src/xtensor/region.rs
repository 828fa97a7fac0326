//! Virtual ranges and what lives in them: weight segments and per-model KV regions.
//!
//! A [`VirtualRange`] is a reservation; it is released when the last `Arc` to it goes,
//! so a Python view that outlives `pool.free(owner)` points into an inaccessible
//! reservation (a clean fault on touch) rather than into memory reused by someone else.

use std::sync::Arc;

use super::backend::Backend;
use super::pool::{OwnerId, PageId};

pub struct VirtualRange {
    backend: Arc<dyn Backend>,
    pub base: usize,
    pub len: usize,
}

impl VirtualRange {
    pub fn reserve(backend: &Arc<dyn Backend>, len: usize) -> super::error::XtResult<Arc<Self>> {
        let base = backend.reserve(len)?;
        Ok(Arc::new(Self { backend: backend.clone(), base, len }))
    }
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        let _ = self.backend.release(self.base, self.len);
    }
}

/// A weight segment: pages from the high end. Contiguous segments are views into the
/// global region (`range` is None); the non-contiguous fallback has its own range onto
/// which its pages are mapped in order.
pub struct Segment {
    pub owner: OwnerId,
    pub nbytes: usize,
    pub pages: Vec<PageId>,
    pub contiguous: bool,
    pub range: Option<Arc<VirtualRange>>,
    pub addr: usize,
}

/// One model's KV region: a reserved range, mapped page by page from the bottom.
/// `pages[..used]` are in use; `pages[used..]` are the model's cache of mapped-but-unused
/// pages (already mapped at their final position, so growing into them costs no map call).
pub struct KvRegion {
    pub owner: OwnerId,
    pub range: Arc<VirtualRange>,
    pub max_pages: usize,
    pub pages: Vec<PageId>,
    pub used: usize,
    /// Refill the cache when it falls below `low`, up to `high`; trim it back to `high`.
    pub low: usize,
    pub high: usize,
    /// Pages mapped on the request path (growth beyond the cache).
    pub misses: u64,
    /// Pages taken from the cache on growth.
    pub hits: u64,
}

impl KvRegion {
    pub fn cached(&self) -> usize {
        self.pages.len() - self.used
    }
    /// Cached pages beyond the high watermark (idle memory; counted as fragmentation).
    pub fn excess(&self) -> usize {
        self.cached().saturating_sub(self.high)
    }
    /// The cache size the refill aims for: `high`, but never past the reserved range.
    pub fn refill_target(&self) -> usize {
        self.high.min(self.max_pages - self.used)
    }
    /// True when the cache is outside its watermarks (something for maintenance to do).
    pub fn needs_maintenance(&self) -> bool {
        self.excess() > 0 || self.cached() < self.low.min(self.max_pages - self.used)
    }
    pub fn va_of(&self, index: usize, page_size: usize) -> usize {
        self.range.base + index * page_size
    }
}

/// Group `pages` (in region order) into (index_in_list, first_page, count) stretches of
/// physically consecutive pages, so a backend can map each stretch with one call.
pub fn consecutive_stretches(pages: &[PageId]) -> Vec<(usize, PageId, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 {
            j += 1;
        }
        out.push((i, pages[i], j - i));
        i = j;
    }
    out
}
