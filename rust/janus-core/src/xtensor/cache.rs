//! The per-model KV cache of mapped-but-unused pages (PAPER.md §7): trimming to and
//! refilling up to the watermarks, reclaiming idle caches when the pool runs short, and
//! the background refill thread that keeps map calls off the request path.

use std::sync::Arc;
use std::time::Duration;

use super::device::{Shared, MAINTENANCE_CHUNK};
use super::state::State;
use super::error::{XtError, XtResult};
use super::pool::PageId;

impl Shared {
    /// Unmap the top `k` cached pages of region `id` and return them to the pool.
    pub(super) fn trim(&self, st: &mut State, id: u64, k: usize) -> XtResult<()> {
        let r = st.regions.get_mut(&id).expect("region exists");
        let k = k.min(r.cached());
        if k == 0 {
            return Ok(());
        }
        let from = r.pages.len() - k;
        self.backend.unmap(r.va_of(from, self.page_size), k * self.page_size)?;
        let pages: Vec<PageId> = r.pages.drain(from..).collect();
        let owner = r.owner;
        st.pool.free(owner, &pages)
    }

    /// Make `need` pages free by trimming idle KV caches (other than `except`'s) if the
    /// pool alone is short. Fails without touching anything if even that is not enough.
    pub(super) fn reclaim(&self, st: &mut State, need: usize, except: Option<u64>) -> XtResult<()> {
        let free = st.pool.free_pages();
        if free >= need {
            return Ok(());
        }
        let cached: usize = st.regions.iter().filter(|(&i, _)| Some(i) != except).map(|(_, r)| r.cached()).sum();
        if free + cached < need {
            return Err(XtError::exhausted(format!(
                "pool exhausted: {need} pages requested, {free} free and {cached} reclaimable from KV caches, of {}",
                st.pool.num_pages()
            )));
        }
        let mut victims: Vec<(usize, u64)> =
            st.regions.iter().filter(|(&i, r)| Some(i) != except && r.cached() > 0).map(|(&i, r)| (r.cached(), i)).collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for (c, id) in victims {
            let short = need.saturating_sub(st.pool.free_pages());
            if short == 0 {
                break;
            }
            self.trim(st, id, c.min(short))?;
        }
        Ok(())
    }

    /// One step of bringing region `id`'s cache to its watermarks, at most `budget` pages.
    /// Returns true if more remains to do. Refill never reclaims from others.
    pub(super) fn maintain_region(&self, st: &mut State, id: u64, budget: usize) -> XtResult<bool> {
        let Some(r) = st.regions.get(&id) else { return Ok(false) };
        let excess = r.excess();
        if excess > 0 {
            let k = excess.min(budget);
            self.trim(st, id, k)?;
            return Ok(k < excess);
        }
        if r.cached() >= r.low.min(r.max_pages - r.used) {
            return Ok(false);
        }
        let want = (r.refill_target() - r.cached()).min(st.pool.free_pages());
        let k = want.min(budget);
        if k == 0 {
            return Ok(false);
        }
        let (owner, at) = (r.owner, r.pages.len());
        let pages = st.pool.alloc_low(owner, k)?;
        let r = st.regions.get(&id).expect("exists");
        if let Err(e) = self.map_into(r, at, &pages) {
            st.pool.free(owner, &pages).expect("pages just allocated");
            return Err(e);
        }
        st.regions.get_mut(&id).expect("exists").pages.extend_from_slice(&pages);
        Ok(k < want)
    }

    /// After a region changed: hand it to the refill thread, or (without one) bring its
    /// cache to the watermarks right here.
    pub(super) fn after_change(&self, st: &mut State, id: u64) -> XtResult<()> {
        let needs = st.regions.get(&id).is_some_and(|r| r.needs_maintenance());
        if !needs {
            return Ok(());
        }
        if self.background {
            st.dirty.insert(id);
            self.wake.notify_one();
            Ok(())
        } else {
            while self.maintain_region(st, id, usize::MAX)? {}
            Ok(())
        }
    }

    /// The refill thread: wait for dirty regions, maintain them a chunk at a time,
    /// releasing the lock between chunks so request-path calls are not held up long.
    pub(super) fn background_loop(self: Arc<Self>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if st.stop {
                return;
            }
            let Some(&id) = st.dirty.iter().next() else {
                st = self.wake.wait_timeout(st, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
                continue;
            };
            match self.maintain_region(&mut st, id, MAINTENANCE_CHUNK) {
                Ok(true) => {}
                _ => {
                    st.dirty.remove(&id);
                }
            }
            drop(st);
            std::thread::yield_now();
            st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        }
    }}
