//! The KV-region half of [`DevicePool`]: one reserved virtual range per model, mapped
//! page by page from the bottom (PAPER.md §7), and the byte-range -> global-offset
//! translation that lets a remote peer address KV pages as base + offset.

use super::device::{check_owner_name, DevicePool, KvInfo};
use super::error::{XtError, XtResult};
use super::pool::PageId;
use super::region::{KvRegion, VirtualRange};

impl DevicePool {
    /// Reserve a KV region of `max_bytes` (rounded up to pages) for `owner`; nothing is
    /// mapped until `kv_resize` (or the cache refill) maps pages.
    pub fn kv_region(&self, owner: &str, max_bytes: i64, low: usize, high: usize) -> XtResult<KvInfo> {
        let max_pages = self.pages_for(max_bytes, "kv_region")?;
        if low > high {
            return Err(XtError::invalid(format!("cache watermarks: low {low} > high {high}")));
        }
        check_owner_name(owner)?;
        let mut st = self.lock()?;
        let range = VirtualRange::reserve(&self.shared.backend, max_pages * self.shared.page_size)?;
        let oid = st.owner_id(owner);
        let id = st.take_id();
        let base = range.base;
        st.regions.insert(
            id,
            KvRegion { owner: oid, range: range.clone(), max_pages, pages: Vec::new(), used: 0, low, high, misses: 0, hits: 0 },
        );
        self.shared.after_change(&mut st, id)?;
        Ok(KvInfo { id, base, max_pages, range })
    }

    /// Make exactly `n` pages usable at the bottom of region `id`: growth takes the
    /// region's cache first, then the pool's low end (mapping on the spot: a cache miss);
    /// shrinking moves the top pages into the cache (the refill thread trims it to the
    /// high watermark). On error nothing changes.
    pub fn kv_resize(&self, id: u64, n: usize) -> XtResult<()> {
        let mut st = self.lock()?;
        let r = st.regions.get(&id).ok_or_else(|| XtError::unknown(format!("no KV region {id} (freed?)")))?;
        if n > r.max_pages {
            return Err(XtError::invalid(format!("resize to {n} pages exceeds the region's {} reserved pages", r.max_pages)));
        }
        let (used, mapped, owner) = (r.used, r.pages.len(), r.owner);
        if n > mapped {
            let need = n - mapped;
            self.shared.reclaim(&mut st, need, Some(id))?;
            let pages = st.pool.alloc_low(owner, need)?;
            let r = st.regions.get(&id).expect("checked");
            if let Err(e) = self.shared.map_into(r, mapped, &pages) {
                st.pool.free(owner, &pages).expect("pages just allocated");
                return Err(e);
            }
            let r = st.regions.get_mut(&id).expect("checked");
            r.pages.extend_from_slice(&pages);
            r.misses += need as u64;
        }
        let r = st.regions.get_mut(&id).expect("checked");
        if n > used {
            r.hits += (n.min(mapped) - used) as u64;
        }
        r.used = n;
        self.shared.after_change(&mut st, id)
    }

    /// (used pages, cached pages, max pages, misses, hits) of region `id`.
    pub fn kv_state(&self, id: u64) -> XtResult<(usize, usize, usize, u64, u64)> {
        let st = self.lock()?;
        let r = st.regions.get(&id).ok_or_else(|| XtError::unknown(format!("no KV region {id} (freed?)")))?;
        Ok((r.used, r.cached(), r.max_pages, r.misses, r.hits))
    }

    /// Physical ids of the used pages of region `id`, in region order.
    pub fn kv_page_ids(&self, id: u64) -> XtResult<Vec<PageId>> {
        let st = self.lock()?;
        let r = st.regions.get(&id).ok_or_else(|| XtError::unknown(format!("no KV region {id} (freed?)")))?;
        Ok(r.pages[..r.used].to_vec())
    }

    /// `[offset, offset+nbytes)` of region `id` as (global offset, length) pieces, merged
    /// where physically consecutive: what a remote peer addresses as base + offset.
    pub fn kv_global_offsets(&self, id: u64, offset: i64, nbytes: i64) -> XtResult<Vec<(usize, usize)>> {
        let st = self.lock()?;
        let r = st.regions.get(&id).ok_or_else(|| XtError::unknown(format!("no KV region {id} (freed?)")))?;
        let ps = self.shared.page_size;
        let mapped = r.used * ps;
        if offset < 0 || nbytes <= 0 || offset as usize + nbytes as usize > mapped {
            return Err(XtError::invalid(format!(
                "byte range {offset}+{nbytes} is not inside the region's {mapped} mapped bytes"
            )));
        }
        let (mut pos, end) = (offset as usize, offset as usize + nbytes as usize);
        let mut out: Vec<(usize, usize)> = Vec::new();
        while pos < end {
            let within = pos % ps;
            let len = (ps - within).min(end - pos);
            let g = r.pages[pos / ps] as usize * ps + within;
            match out.last_mut() {
                Some(last) if last.0 + last.1 == g => last.1 += len,
                _ => out.push((g, len)),
            }
            pos += len;
        }
        Ok(out)
    }
}
