//! Physical page bookkeeping of one device (PAPER.md §7). Pure: no mapping, no I/O.
//!
//! Pages are ids `0..N`. Short-lived allocations (KV cache, activations) take the
//! LOWEST free ids; long-lived weight segments take one contiguous run from the HIGH end,
//! chosen by best fit among the free runs (ties: the highest run), using the highest
//! pages of that run. Keeping the two lifetimes at opposite ends is what keeps
//! fragmentation low; neither side is forbidden from using the other's pages.
//!
//! A free-run index (`by_start`: start -> len, `by_len`: (len, start)) makes every
//! operation O(log N) per run touched; [`PagePool::check_integrity`] verifies that the
//! index, the per-page owner table and the counters agree.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::error::{XtError, XtResult};

pub type PageId = u32;
pub type OwnerId = u32;

const FREE: u32 = u32::MAX;
/// The largest pool: 2^24 pages (32 TiB of 2 MiB pages). Bounds the per-page tables
/// (~200 MB at the limit), so a wrong argument is an error, not an out-of-memory abort.
pub const MAX_PAGES: usize = 1 << 24;

/// Owner ids are small integers handed out by the device: a multiplicative hash is
/// enough and much cheaper than SipHash on this hot path.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub type IdMap<V> = HashMap<OwnerId, V, BuildHasherDefault<IdHasher>>;
/// Transient mark used while validating a free (never visible between calls).
const PENDING: u32 = u32::MAX - 1;

/// Counters of the pool; `stranded_free` is the fragmentation numerator (see
/// [`PagePool::stranded_free`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCounters {
    pub num_pages: usize,
    pub free_pages: usize,
    pub largest_free_run: usize,
    pub free_runs: usize,
    pub stranded_free: usize,
    pub stranded_threshold: usize,
}

#[derive(Debug, Clone)]
pub struct PagePool {
    owner: Vec<u32>,
    by_start: BTreeMap<u32, u32>,
    by_len: BTreeSet<(u32, u32)>,
    free: usize,
    owner_pages: IdMap<usize>,
    /// Free runs shorter than this many pages are "stranded": they cannot hold the
    /// smallest weight segment requested so far on this pool (0: none requested yet).
    threshold: u32,
    stranded: usize,
    /// Fenwick tree over run starts holding the lengths of stranded runs, so the stranded
    /// pages at or above any page id are one O(log N) query.
    stranded_at: Vec<i64>,
}

impl PagePool {
    pub fn new(num_pages: usize) -> XtResult<Self> {
        if num_pages == 0 || num_pages > MAX_PAGES {
            return Err(XtError::invalid(format!("num_pages must be in 1..={MAX_PAGES}, got {num_pages}")));
        }
        let mut p = Self {
            owner: vec![FREE; num_pages],
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free: num_pages,
            owner_pages: IdMap::default(),
            threshold: 0,
            stranded: 0,
            stranded_at: vec![0; num_pages + 1],
        };
        p.insert_run(0, num_pages as u32);
        Ok(p)
    }

    pub fn num_pages(&self) -> usize {
        self.owner.len()
    }
    pub fn free_pages(&self) -> usize {
        self.free
    }
    pub fn largest_free_run(&self) -> usize {
        self.by_len.last().map_or(0, |&(l, _)| l as usize)
    }
    pub fn owner_of(&self, page: PageId) -> Option<OwnerId> {
        match self.owner.get(page as usize) {
            Some(&o) if o != FREE => Some(o),
            _ => None,
        }
    }
    pub fn pages_of(&self, owner: OwnerId) -> usize {
        self.owner_pages.get(&owner).copied().unwrap_or(0)
    }
    pub fn owners(&self) -> impl Iterator<Item = (OwnerId, usize)> + '_ {
        self.owner_pages.iter().map(|(&o, &n)| (o, n))
    }
    /// Free runs as (start, len), ascending by start.
    pub fn free_runs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }
    /// Free pages lying in runs shorter than the smallest weight request seen so far.
    pub fn stranded_free(&self) -> usize {
        self.stranded
    }

    pub fn counters(&self) -> PoolCounters {
        PoolCounters {
            num_pages: self.num_pages(),
            free_pages: self.free,
            largest_free_run: self.largest_free_run(),
            free_runs: self.by_start.len(),
            stranded_free: self.stranded,
            stranded_threshold: self.threshold as usize,
        }
    }

    // ---- run index ----

    fn insert_run(&mut self, start: u32, len: u32) {
        debug_assert!(len > 0);
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        if len < self.threshold {
            self.stranded += len as usize;
            self.fw_add(start, len as i64);
        }
    }

    fn remove_run(&mut self, start: u32, len: u32) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        if len < self.threshold {
            self.stranded -= len as usize;
            self.fw_add(start, -(len as i64));
        }
    }

    fn fw_add(&mut self, pos: u32, delta: i64) {
        let mut i = pos as usize + 1;
        while i < self.stranded_at.len() {
            self.stranded_at[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Stranded pages in runs starting below `pos`.
    fn fw_prefix(&self, pos: u32) -> usize {
        let mut i = (pos as usize).min(self.stranded_at.len() - 1);
        let mut sum = 0i64;
        while i > 0 {
            sum += self.stranded_at[i];
            i -= i & i.wrapping_neg();
        }
        sum as usize
    }

    /// Stranded free pages in runs starting at or above page `pos` (the weight zone when
    /// `pos` is the lowest weight page).
    pub fn stranded_from(&self, pos: u32) -> usize {
        self.stranded - self.fw_prefix(pos)
    }

    fn set_threshold(&mut self, pages: u32) {
        if self.threshold != 0 && pages >= self.threshold {
            return;
        }
        self.threshold = pages;
        self.stranded = 0;
        self.stranded_at.iter_mut().for_each(|x| *x = 0);
        let short: Vec<(u32, u32)> = self.by_len.range(..(pages, 0)).copied().collect();
        for (l, s) in short {
            self.stranded += l as usize;
            self.fw_add(s, l as i64);
        }
    }

    fn take(&mut self, owner: OwnerId, start: u32, len: u32) {
        self.owner[start as usize..(start + len) as usize].fill(owner);
        self.free -= len as usize;
        *self.owner_pages.entry(owner).or_insert(0) += len as usize;
    }

    fn check_request(&self, owner: OwnerId, n: usize, what: &str) -> XtResult<()> {
        if owner >= PENDING {
            return Err(XtError::invalid(format!("owner id {owner} is reserved")));
        }
        if n == 0 {
            return Err(XtError::invalid(format!("{what}: page count must be positive")));
        }
        if n > self.free {
            return Err(XtError::exhausted(format!(
                "{what}: pool exhausted: {n} pages requested, {} of {} free",
                self.free,
                self.num_pages()
            )));
        }
        Ok(())
    }

    // ---- allocation ----

    /// KV/activation pages: the `n` lowest free ids, ascending. All or nothing.
    pub fn alloc_low(&mut self, owner: OwnerId, n: usize) -> XtResult<Vec<PageId>> {
        self.check_request(owner, n, "kv allocation")?;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (&start, &len) = self.by_start.first_key_value().expect("free count says a run exists");
            let take = len.min((n - out.len()) as u32);
            self.remove_run(start, len);
            if take < len {
                self.insert_run(start + take, len - take);
            }
            self.take(owner, start, take);
            out.extend(start..start + take);
        }
        Ok(out)
    }

    /// The free run a contiguous weight request of `n` pages would use: best fit
    /// (shortest run with len >= n), ties broken towards the highest start.
    pub fn best_fit_run(&self, n: usize) -> Option<(u32, u32)> {
        let n = u32::try_from(n).ok()?;
        let &(len, _) = self.by_len.range((n, 0)..).next()?;
        let &(len, start) = self.by_len.range((len, 0)..=(len, u32::MAX)).next_back()?;
        Some((start, len))
    }

    /// Weight pages: one contiguous run (best fit, highest pages of that run) when one
    /// exists, else the `n` highest free pages. Returns ascending ids and whether they are
    /// contiguous. All or nothing.
    pub fn alloc_weights(&mut self, owner: OwnerId, n: usize) -> XtResult<(Vec<PageId>, bool)> {
        self.check_request(owner, n, "weight allocation")?;
        self.set_threshold(n as u32);
        if let Some((start, len)) = self.best_fit_run(n) {
            let n = n as u32;
            self.remove_run(start, len);
            if len > n {
                self.insert_run(start, len - n);
            }
            let first = start + len - n;
            self.take(owner, first, n);
            return Ok(((first..first + n).collect(), true));
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (&start, &len) = self.by_start.last_key_value().expect("free count says a run exists");
            let take = len.min((n - out.len()) as u32);
            self.remove_run(start, len);
            if take < len {
                self.insert_run(start, len - take);
            }
            let first = start + len - take;
            self.take(owner, first, take);
            out.extend(first..first + take);
        }
        out.sort_unstable();
        Ok((out, false))
    }

    /// Return pages of `owner` to the pool. Every id must be owned by `owner` and listed
    /// once; otherwise nothing changes.
    pub fn free(&mut self, owner: OwnerId, pages: &[PageId]) -> XtResult<()> {
        if pages.is_empty() {
            return Ok(());
        }
        // Validate in one pass: mark each page PENDING; a page seen PENDING again is listed
        // twice. On any error, roll the marks back so nothing changes.
        for (i, &p) in pages.iter().enumerate() {
            let err = match self.owner.get(p as usize) {
                None => Some(XtError::invalid(format!("page {p} out of range"))),
                Some(&PENDING) => Some(XtError::invalid(format!("page {p} listed twice in one free"))),
                Some(&o) if o != owner => {
                    Some(XtError::unknown(format!("page {p} is not owned by owner {owner} (double free?)")))
                }
                _ => None,
            };
            if let Some(e) = err {
                for &q in &pages[..i] {
                    self.owner[q as usize] = owner;
                }
                return Err(e);
            }
            self.owner[p as usize] = PENDING;
        }
        for &p in pages {
            self.owner[p as usize] = FREE;
        }
        // Merge maximal consecutive stretches of the (ordered) list into runs.
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            self.free_run(pages[i], (j - i) as u32);
            i = j;
        }
        let left = self.owner_pages.get_mut(&owner).expect("owner has pages");
        *left -= pages.len();
        if *left == 0 {
            self.owner_pages.remove(&owner);
        }
        self.free += pages.len();
        Ok(())
    }

    fn free_run(&mut self, mut start: u32, mut len: u32) {
        if let Some((&ls, &ll)) = self.by_start.range(..start).next_back() {
            if ls + ll == start {
                self.remove_run(ls, ll);
                start = ls;
                len += ll;
            }
        }
        if let Some(&rl) = self.by_start.get(&(start + len)) {
            self.remove_run(start + len, rl);
            len += rl;
        }
        self.insert_run(start, len);
    }

    /// Every page is free xor owned by exactly one owner, the counters add up, and the
    /// run index is exactly the maximal free runs of the owner table.
    pub fn check_integrity(&self) -> XtResult<()> {
        let fail = |m: String| Err(XtError::new(super::error::XtErrorKind::Backend, format!("pool integrity: {m}")));
        let mut runs = Vec::new();
        let mut counts: IdMap<usize> = IdMap::default();
        let mut free = 0usize;
        let mut i = 0usize;
        let n = self.owner.len();
        while i < n {
            if self.owner[i] == FREE {
                let s = i;
                while i < n && self.owner[i] == FREE {
                    i += 1;
                }
                runs.push((s as u32, (i - s) as u32));
                free += i - s;
            } else {
                *counts.entry(self.owner[i]).or_insert(0) += 1;
                i += 1;
            }
        }
        if free != self.free {
            return fail(format!("free counter {} != {} free pages in the table", self.free, free));
        }
        let indexed: Vec<(u32, u32)> = self.free_runs().collect();
        if indexed != runs {
            return fail(format!("run index {indexed:?} != table runs {runs:?}"));
        }
        if self.by_len.len() != self.by_start.len()
            || !self.by_start.iter().all(|(&s, &l)| self.by_len.contains(&(l, s)))
        {
            return fail("by_len and by_start disagree".into());
        }
        if counts != self.owner_pages {
            return fail(format!("owner counts {:?} != table {counts:?}", self.owner_pages));
        }
        if counts.values().sum::<usize>() + free != n {
            return fail("owned + free != num_pages".into());
        }
        let stranded: usize =
            runs.iter().filter(|&&(_, l)| l < self.threshold).map(|&(_, l)| l as usize).sum();
        if stranded != self.stranded {
            return fail(format!("stranded counter {} != {stranded}", self.stranded));
        }
        for &(s, _) in runs.iter().step_by(runs.len() / 8 + 1) {
            let above: usize =
                runs.iter().filter(|&&(rs, l)| rs >= s && l < self.threshold).map(|&(_, l)| l as usize).sum();
            if above != self.stranded_from(s) {
                return fail(format!("stranded index at {s}: {} != {above}", self.stranded_from(s)));
            }
        }
        Ok(())
    }
}
