//! [`State`]: everything of one device that sits behind its lock (page pool, owners,
//! weight segments, KV regions, the refill thread's work list), and its integrity check.
//! Its own module because both the device (`device.rs`) and the statistics (`stats.rs`)
//! read it: each imports this, so neither imports the other.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::error::{XtError, XtErrorKind, XtResult};
use super::pool::{OwnerId, PagePool, PageId};
use super::region::{KvRegion, Segment};

pub(super) struct State {
    pub(super) pool: PagePool,
    pub(super) owners: HashMap<String, OwnerId>,
    pub(super) names: HashMap<OwnerId, String>,
    pub(super) next_owner: OwnerId,
    pub(super) freed: HashSet<String>,
    pub(super) segments: BTreeMap<u64, Segment>,
    pub(super) regions: BTreeMap<u64, KvRegion>,
    /// First page of every weight segment (a multiset: page -> count); its minimum is
    /// the boundary between the KV zone (below) and the weight zone.
    pub(super) weight_starts: BTreeMap<PageId, usize>,
    pub(super) next_id: u64,
    pub(super) dirty: BTreeSet<u64>,
    pub(super) closed: bool,
    pub(super) stop: bool,
}

impl State {
    pub(super) fn new(pool: PagePool) -> Self {
        State {
            pool,
            owners: HashMap::new(),
            names: HashMap::new(),
            next_owner: 0,
            freed: HashSet::new(),
            segments: BTreeMap::new(),
            regions: BTreeMap::new(),
            weight_starts: BTreeMap::new(),
            next_id: 1,
            dirty: BTreeSet::new(),
            closed: false,
            stop: false,
        }
    }

    /// The lowest page of any weight segment (u32::MAX when there are none).
    pub fn weight_zone_start(&self) -> PageId {
        self.weight_starts.keys().next().copied().unwrap_or(PageId::MAX)
    }

    pub(super) fn owner_id(&mut self, name: &str) -> OwnerId {
        if let Some(&o) = self.owners.get(name) {
            return o;
        }
        let o = self.next_owner;
        self.next_owner += 1;
        self.owners.insert(name.to_string(), o);
        self.names.insert(o, name.to_string());
        self.freed.remove(name);
        o
    }

    /// Forget an owner that a failed first allocation registered.
    pub(super) fn drop_owner_if_empty(&mut self, name: &str) {
        if let Some(&o) = self.owners.get(name) {
            let has = self.segments.values().any(|s| s.owner == o) || self.regions.values().any(|r| r.owner == o);
            if !has {
                self.owners.remove(name);
                self.names.remove(&o);
            }
        }
    }

    pub(super) fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The pool's own invariants, plus: every allocated page belongs to exactly one segment
    /// or region of its owner, and every segment/region page is owned by its owner.
    pub(super) fn check_integrity(&self) -> XtResult<()> {
        let st = self;
        st.pool.check_integrity()?;
        let fail = |m: String| Err(XtError::new(XtErrorKind::Backend, format!("device integrity: {m}")));
        let mut holder: HashMap<u32, String> = HashMap::new();
        let mut per_owner: HashMap<u32, usize> = HashMap::new();
        let mut claim = |page: u32, owner: u32, what: String| -> Result<(), String> {
            if st.pool.owner_of(page) != Some(owner) {
                return Err(format!("{what}: page {page} is owned by {:?}, not {owner}", st.pool.owner_of(page)));
            }
            if let Some(prev) = holder.insert(page, what.clone()) {
                return Err(format!("page {page} is in both {prev} and {what}"));
            }
            *per_owner.entry(owner).or_insert(0) += 1;
            Ok(())
        };
        for (id, s) in &st.segments {
            if s.contiguous && s.pages.windows(2).any(|w| w[1] != w[0] + 1) {
                return fail(format!("segment {id} is marked contiguous but is not"));
            }
            for &p in &s.pages {
                if let Err(m) = claim(p, s.owner, format!("segment {id}")) {
                    return fail(m);
                }
            }
        }
        for (id, r) in &st.regions {
            if r.used > r.pages.len() || r.pages.len() > r.max_pages {
                return fail(format!("region {id}: used {} mapped {} max {}", r.used, r.pages.len(), r.max_pages));
            }
            for &p in &r.pages {
                if let Err(m) = claim(p, r.owner, format!("region {id}")) {
                    return fail(m);
                }
            }
        }
        for (o, n) in st.pool.owners() {
            if per_owner.get(&o).copied().unwrap_or(0) != n {
                return fail(format!("owner {o} holds {n} pages but its segments/regions list {:?}", per_owner.get(&o)));
            }
            if !st.names.contains_key(&o) {
                return fail(format!("owner {o} has pages but no name"));
            }
        }
        for (name, o) in &st.owners {
            if st.names.get(o) != Some(name) {
                return fail(format!("owner table mismatch for {name:?}"));
            }
        }
        Ok(())
    }
}
