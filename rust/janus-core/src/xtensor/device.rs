//! [`DevicePool`]: one device's page pool, global region, weight segments and KV regions.
//! All state sits behind one mutex; mapping calls happen under it. The KV caches and
//! their refill thread are in `cache.rs`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::backend::{self, Backend, DeviceKind};
use super::error::{XtError, XtErrorKind, XtResult};
use super::pool::{PagePool, PageId};
use super::region::{consecutive_stretches, KvRegion, Segment, VirtualRange};
use super::state::State;
use super::stats::Stats;

/// A weight segment as handed out: where it is and which pages back it.
pub struct SegmentInfo {
    pub id: u64,
    pub addr: usize,
    pub nbytes: usize,
    pub pages: Vec<PageId>,
    pub contiguous: bool,
    pub global_offset: usize,
    /// Keeps the segment's reservation alive while a handle exists.
    pub range: Arc<VirtualRange>,
}

pub struct KvInfo {
    pub id: u64,
    pub base: usize,
    pub max_pages: usize,
    pub range: Arc<VirtualRange>,
}

/// Cache watermarks used when the caller gives none.
pub const DEFAULT_CACHE_LOW: usize = 2;
pub const DEFAULT_CACHE_HIGH: usize = 4;
/// Most pages the background thread maps or unmaps per lock hold.
pub(super) const MAINTENANCE_CHUNK: usize = 16;

pub(super) struct Shared {
    pub backend: Arc<dyn Backend>,
    pub global: Arc<VirtualRange>,
    pub page_size: usize,
    pub state: Mutex<State>,
    pub wake: Condvar,
    pub background: bool,
}

pub struct DevicePool {
    pub(super) shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl DevicePool {
    /// Create the backend (failing with one clear error if its library is missing),
    /// reserve the global region and map the whole pool into it 1:1.
    pub fn new(kind: &str, num_pages: usize, page_size: usize, device_index: u32, background: bool) -> XtResult<Self> {
        let kind = DeviceKind::parse(kind)?;
        if num_pages == 0 {
            return Err(XtError::invalid("num_pages must be positive"));
        }
        if page_size == 0 || !page_size.is_power_of_two() {
            return Err(XtError::invalid(format!("page_size must be a positive power of two, got {page_size}")));
        }
        let total = num_pages
            .checked_mul(page_size)
            .ok_or_else(|| XtError::invalid("num_pages * page_size overflows"))?;
        let pool = PagePool::new(num_pages)?;
        let be = backend::create(kind, num_pages, page_size, device_index)?;
        let global = VirtualRange::reserve(&be, total)?;
        be.map(global.base, 0, num_pages)?;
        let state = State::new(pool);
        let shared = Arc::new(Shared {
            backend: be,
            global,
            page_size,
            state: Mutex::new(state),
            wake: Condvar::new(),
            background,
        });
        let worker = if background {
            let s = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("xtensor-refill".into())
                    .spawn(move || s.background_loop())
                    .map_err(|e| XtError::backend(format!("cannot start the refill thread: {e}")))?,
            )
        } else {
            None
        };
        Ok(Self { shared, worker: Mutex::new(worker) })
    }

    pub fn kind(&self) -> DeviceKind {
        self.shared.backend.kind()
    }
    pub fn page_size(&self) -> usize {
        self.shared.page_size
    }
    pub fn num_pages(&self) -> usize {
        self.shared.backend.num_pages()
    }
    pub fn global_base(&self) -> usize {
        self.shared.global.base
    }
    pub fn global_range(&self) -> Arc<VirtualRange> {
        self.shared.global.clone()
    }

    pub(super) fn lock(&self) -> XtResult<MutexGuard<'_, State>> {
        let g = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.closed {
            return Err(XtError::new(XtErrorKind::Closed, "the device pool is closed"));
        }
        Ok(g)
    }

    pub(super) fn pages_for(&self, nbytes: i64, what: &str) -> XtResult<usize> {
        if nbytes <= 0 {
            return Err(XtError::invalid(format!("{what}: nbytes must be positive, got {nbytes}")));
        }
        Ok((nbytes as usize).div_ceil(self.shared.page_size))
    }

    /// Weights for `owner`: a contiguous best-fit run from the high end (a view into the
    /// global region) or, if none is long enough, scattered high pages mapped into a
    /// separate range. Idle KV cache pages are reclaimed first if the pool is short.
    pub fn alloc_weights(&self, owner: &str, nbytes: i64) -> XtResult<SegmentInfo> {
        let n = self.pages_for(nbytes, "alloc_weights")?;
        let mut st = self.lock()?;
        check_owner_name(owner)?;
        self.shared.reclaim(&mut st, n, None)?;
        let oid = st.owner_id(owner);
        let (pages, contiguous) = match st.pool.alloc_weights(oid, n) {
            Ok(r) => r,
            Err(e) => {
                st.drop_owner_if_empty(owner);
                return Err(e);
            }
        };
        let ps = self.shared.page_size;
        let (addr, range) = if contiguous {
            (self.shared.global.base + pages[0] as usize * ps, None)
        } else {
            match self.shared.map_scattered(&pages) {
                Ok(r) => (r.base, Some(r)),
                Err(e) => {
                    st.pool.free(oid, &pages).expect("pages just allocated");
                    st.drop_owner_if_empty(owner);
                    return Err(e);
                }
            }
        };
        let id = st.take_id();
        let info = SegmentInfo {
            id,
            addr,
            nbytes: nbytes as usize,
            global_offset: pages[0] as usize * ps,
            pages: pages.clone(),
            contiguous,
            range: range.clone().unwrap_or_else(|| self.shared.global.clone()),
        };
        *st.weight_starts.entry(info.pages[0]).or_insert(0) += 1;
        st.segments.insert(id, Segment { owner: oid, nbytes: nbytes as usize, pages, contiguous, range, addr });
        Ok(info)
    }

    /// Free every weight segment and KV region of `owner`.
    pub fn free(&self, owner: &str) -> XtResult<()> {
        let mut st = self.lock()?;
        self.shared.free_owner(&mut st, owner)
    }

    /// Bring every KV cache to its watermarks now (what the refill thread does).
    pub fn maintain(&self) -> XtResult<()> {
        let mut st = self.lock()?;
        let ids: Vec<u64> = st.regions.keys().copied().collect();
        for id in ids {
            while self.shared.maintain_region(&mut st, id, usize::MAX)? {}
        }
        st.dirty.clear();
        Ok(())
    }

    /// Regions the refill thread still has to bring to their watermarks (0: quiescent).
    /// Maintenance runs a chunk at a time under the state lock, so 0 seen here means no
    /// trim or refill is half done.
    pub fn maintenance_backlog(&self) -> XtResult<usize> {
        Ok(self.lock()?.dirty.len())
    }

    pub fn stats(&self) -> XtResult<Stats> {
        let st = self.lock()?;
        Ok(Stats::collect(&st, self.shared.page_size))
    }

    /// (fragmentation %, all-zones fragmentation %, free %) without building a full
    /// [`Stats`]: O(regions + log N), cheap enough to sample after every churn operation.
    pub fn fragmentation_sample(&self) -> XtResult<(f64, f64, f64)> {
        let st = self.lock()?;
        let idle: usize = st.regions.values().map(|r| r.excess()).sum();
        let n = st.pool.num_pages() as f64;
        let stranded = st.pool.stranded_from(st.weight_zone_start());
        Ok((
            100.0 * (stranded + idle) as f64 / n,
            100.0 * (st.pool.stranded_free() + idle) as f64 / n,
            100.0 * st.pool.free_pages() as f64 / n,
        ))
    }

    pub fn check_integrity(&self) -> XtResult<()> {
        let st = self.lock()?;
        st.check_integrity()
    }

    /// Stop the refill thread and free every owner. Reservations still referenced by
    /// handles (and the global region) are released when the last handle goes.
    pub fn close(&self) -> XtResult<()> {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.closed {
                return Ok(());
            }
            st.stop = true;
            self.shared.wake.notify_all();
        }
        if let Some(h) = self.worker.lock().unwrap().take() {
            let _ = h.join();
        }
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let names: Vec<String> = st.owners.keys().cloned().collect();
        let mut first_err = None;
        for n in names {
            if let Err(e) = self.shared.free_owner(&mut st, &n) {
                first_err.get_or_insert(e);
            }
        }
        st.closed = true;
        first_err.map_or(Ok(()), Err)
    }

    pub fn is_closed(&self) -> bool {
        self.shared.state.lock().map(|s| s.closed).unwrap_or(true)
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

pub(super) fn check_owner_name(owner: &str) -> XtResult<()> {
    if owner.is_empty() {
        return Err(XtError::invalid("owner must be a non-empty string"));
    }
    Ok(())
}

impl Shared {
    fn map_scattered(&self, pages: &[PageId]) -> XtResult<Arc<VirtualRange>> {
        let range = VirtualRange::reserve(&self.backend, pages.len() * self.page_size)?;
        for (i, first, count) in consecutive_stretches(pages) {
            self.backend.map(range.base + i * self.page_size, first, count)?; // range drop unmaps on error
        }
        Ok(range)
    }

    /// Map `pages` into region `r` starting at page index `at`; all or nothing.
    pub(super) fn map_into(&self, r: &KvRegion, at: usize, pages: &[PageId]) -> XtResult<()> {
        for (i, first, count) in consecutive_stretches(pages) {
            if let Err(e) = self.backend.map(r.va_of(at + i, self.page_size), first, count) {
                let _ = self.backend.unmap(r.va_of(at, self.page_size), i * self.page_size);
                return Err(e);
            }
        }
        Ok(())
    }

    fn free_owner(&self, st: &mut State, owner: &str) -> XtResult<()> {
        let Some(&oid) = st.owners.get(owner) else {
            let why = if st.freed.contains(owner) { "already freed (double free)" } else { "unknown owner" };
            return Err(XtError::unknown(format!("free({owner:?}): {why}")));
        };
        let seg_ids: Vec<u64> = st.segments.iter().filter(|(_, s)| s.owner == oid).map(|(&i, _)| i).collect();
        for id in seg_ids {
            let s = st.segments.remove(&id).expect("listed");
            let first = s.pages[0];
            if let Some(c) = st.weight_starts.get_mut(&first) {
                *c -= 1;
                if *c == 0 {
                    st.weight_starts.remove(&first);
                }
            }
            if let Some(range) = &s.range {
                self.backend.unmap(range.base, range.len)?;
            }
            st.pool.free(oid, &s.pages)?;
        }
        let reg_ids: Vec<u64> = st.regions.iter().filter(|(_, r)| r.owner == oid).map(|(&i, _)| i).collect();
        for id in reg_ids {
            let r = st.regions.remove(&id).expect("listed");
            if !r.pages.is_empty() {
                self.backend.unmap(r.range.base, r.pages.len() * self.page_size)?;
            }
            st.pool.free(oid, &r.pages)?;
            st.dirty.remove(&id);
        }
        st.owners.remove(owner);
        st.names.remove(&oid);
        st.freed.insert(owner.to_string());
        Ok(())
    }
}
