//! The measurements behind `janus bench xtensor` (PAPER.md §7), in Rust so that a
//! million-operation churn runs in seconds. No result is made up: every figure is timed
//! or counted here.
//!
//! - [`map_unmap`]: per-page map/unmap cost of a KV region growing/shrinking one page at
//!   a time through [`DevicePool`] (host backend), against the raw floor in the same run:
//!   a bare mmap(MAP_FIXED|MAP_SHARED) of a memfd page into a reserved range and a bare
//!   mmap(MAP_FIXED, PROT_NONE) over it. Untouched rounds: neither side touches the page
//!   after mapping (first-touch faults are excluded from both). Touched rounds: both sides
//!   write one byte to every OS page (4 KiB) of each page right after mapping it, inside
//!   the timed map loop, so the map figure includes faulting the page in and the unmap
//!   figure includes tearing down its page-table entries (what a real KV page costs).
//! - [`bookkeeping`]: nanoseconds per alloc/free of the pure [`PagePool`].
//! - [`churn`]: fragmentation ([`super::stats`]) sampled after every operation of a
//!   load/unload + KV grow/shrink workload on a real host-backed pool.

use std::time::Instant;

use super::backend::host::HostBackend;
use super::backend::Backend;
use super::device::DevicePool;
use super::error::XtResult;
use super::pool::PagePool;

/// A small deterministic PRNG (xorshift64*), so runs are reproducible without a crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MapResult {
    pub pages: usize,
    pub rounds: usize,
    pub map_us_per_page: f64,
    pub unmap_us_per_page: f64,
    pub raw_map_us_per_page: f64,
    pub raw_unmap_us_per_page: f64,
    /// Touched rounds: map + a write to every OS page, and unmap of the populated page.
    pub touched_map_us_per_page: f64,
    pub touched_unmap_us_per_page: f64,
    pub raw_touched_map_us_per_page: f64,
    pub raw_touched_unmap_us_per_page: f64,
}

/// Write one byte to every OS page of `[va, va + len)`: each write faults one page in.
fn touch(va: usize, len: usize) {
    // SAFETY: sysconf has no preconditions.
    let step = unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize };
    for off in (0..len).step_by(step) {
        // SAFETY: callers pass a range they just mapped read/write.
        unsafe { std::ptr::write_volatile((va + off) as *mut u8, 1) };
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `rounds` alternating rounds of: ours (grow a KV region 0 -> `pages` one page per
/// resize, then shrink back one page per resize, cache watermarks 0 so each step maps or
/// unmaps exactly one page synchronously) and raw (the same number of bare mmap calls on
/// a memfd, pages placed in the same scattered order). Then `rounds` touched rounds, the
/// same but each page written at every OS page right after mapping (timed with the map),
/// after one untimed touched round per side so that both measure faults on memfd pages
/// that already exist (not the first allocation of shared memory); which side goes first
/// alternates between touched rounds. Medians over rounds.
pub fn map_unmap(pages: usize, page_size: usize, rounds: usize) -> XtResult<MapResult> {
    // Twice the pages, and a filler region holding every other page, so the measured
    // region's pages are never physically consecutive (one map call per page, like raw).
    let pool = DevicePool::new("cpu", 2 * pages, page_size, 0, false)?;
    let filler = pool.kv_region("filler", (2 * pages * page_size) as i64, 0, 0)?;
    let kv = pool.kv_region("bench", (pages * page_size) as i64, 0, 0)?;
    for i in 0..pages {
        pool.kv_resize(filler.id, i + 1)?;
        pool.kv_resize(kv.id, i + 1)?;
    }
    pool.kv_resize(kv.id, 0)?;
    let raw = HostBackend::new(2 * pages, page_size)?;
    let raw_base = raw.reserve(pages * page_size)?;
    let (mut m, mut u, mut rm, mut ru) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for i in 1..=pages {
            pool.kv_resize(kv.id, i)?;
        }
        m.push(t.elapsed().as_secs_f64() * 1e6 / pages as f64);
        let t = Instant::now();
        for i in (0..pages).rev() {
            pool.kv_resize(kv.id, i)?;
        }
        u.push(t.elapsed().as_secs_f64() * 1e6 / pages as f64);

        let t = Instant::now();
        for i in 0..pages {
            raw.map(raw_base + i * page_size, (2 * i + 1) as u32, 1)?;
        }
        rm.push(t.elapsed().as_secs_f64() * 1e6 / pages as f64);
        let t = Instant::now();
        for i in (0..pages).rev() {
            raw.unmap(raw_base + i * page_size, page_size)?;
        }
        ru.push(t.elapsed().as_secs_f64() * 1e6 / pages as f64);
    }
    let (mut tm, mut tu, mut trm, mut tru) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ours_touched = || -> XtResult<(f64, f64)> {
        let t = Instant::now();
        for i in 1..=pages {
            pool.kv_resize(kv.id, i)?;
            touch(kv.base + (i - 1) * page_size, page_size);
        }
        let map_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
        let t = Instant::now();
        for i in (0..pages).rev() {
            pool.kv_resize(kv.id, i)?;
        }
        Ok((map_us, t.elapsed().as_secs_f64() * 1e6 / pages as f64))
    };
    let raw_touched = || -> XtResult<(f64, f64)> {
        let t = Instant::now();
        for i in 0..pages {
            raw.map(raw_base + i * page_size, (2 * i + 1) as u32, 1)?;
            touch(raw_base + i * page_size, page_size);
        }
        let map_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
        let t = Instant::now();
        for i in (0..pages).rev() {
            raw.unmap(raw_base + i * page_size, page_size)?;
        }
        Ok((map_us, t.elapsed().as_secs_f64() * 1e6 / pages as f64))
    };
    for round in 0..=rounds {
        // Which side goes first alternates, so neither always runs on the other's leftovers.
        let (ours, theirs) = if round % 2 == 0 {
            let o = ours_touched()?;
            (o, raw_touched()?)
        } else {
            let r = raw_touched()?;
            (ours_touched()?, r)
        };
        if round > 0 {
            // Round 0 allocated the memfd pages on both sides: a warm-up, not measured.
            tm.push(ours.0);
            tu.push(ours.1);
            trm.push(theirs.0);
            tru.push(theirs.1);
        }
    }
    raw.release(raw_base, pages * page_size)?;
    pool.close()?;
    Ok(MapResult {
        pages,
        rounds,
        map_us_per_page: median(m),
        unmap_us_per_page: median(u),
        raw_map_us_per_page: median(rm),
        raw_unmap_us_per_page: median(ru),
        touched_map_us_per_page: median(tm),
        touched_unmap_us_per_page: median(tu),
        raw_touched_map_us_per_page: median(trm),
        raw_touched_unmap_us_per_page: median(tru),
    })
}

/// Nanoseconds per bookkeeping operation (an alloc or a free) on a pure pool of
/// `num_pages`: random KV allocs (1..=8 pages, low end) and weight allocs (16..=512
/// pages, best fit, high end), each freed later in random order, pool kept ~70% full.
/// Returns (CPU ns per op, wall ns per op), each the median of three trials of `ops`
/// operations. CPU time is the calling thread's (CLOCK_THREAD_CPUTIME_ID): on a shared,
/// oversubscribed machine wall time mostly measures the neighbours.
pub fn bookkeeping(num_pages: usize, ops: usize, seed: u64) -> XtResult<(f64, f64)> {
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    for t in 0..3 {
        let (c0, w0) = (thread_cpu_seconds(), Instant::now());
        bookkeeping_trial(num_pages, ops, seed.wrapping_add(t))?;
        cpu.push((thread_cpu_seconds() - c0) * 1e9 / ops as f64);
        wall.push(w0.elapsed().as_secs_f64() * 1e9 / ops as f64);
    }
    Ok((median(cpu), median(wall)))
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn bookkeeping_trial(num_pages: usize, ops: usize, seed: u64) -> XtResult<()> {
    let mut pool = PagePool::new(num_pages)?;
    let mut rng = Rng::new(seed);
    let mut live: Vec<(u32, Vec<u32>)> = Vec::new();
    let mut next_owner = 0u32;
    let target = num_pages * 7 / 10;
    let mut done = 0usize;
    while done < ops {
        let used = num_pages - pool.free_pages();
        if used < target || live.is_empty() || rng.chance(0.5) && used < num_pages * 9 / 10 {
            let (weights, n) = if rng.chance(0.1) { (true, rng.range(16, 512)) } else { (false, rng.range(1, 8)) };
            if n <= pool.free_pages() {
                let pages = if weights { pool.alloc_weights(next_owner, n)?.0 } else { pool.alloc_low(next_owner, n)? };
                live.push((next_owner, pages));
                next_owner = (next_owner + 1) % (u32::MAX - 2);
            }
        } else {
            let i = rng.range(0, live.len() - 1);
            let (o, pages) = live.swap_remove(i);
            pool.free(o, &pages)?;
        }
        done += 1;
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChurnResult {
    pub ops: usize,
    pub loads: usize,
    pub unloads: usize,
    pub kv_resizes: usize,
    pub kv_refused: usize,
    pub load_refused: usize,
    pub noncontiguous_loads: usize,
    pub fragmentation_mean_pct: f64,
    pub fragmentation_max_pct: f64,
    /// The stricter figure: every stranded free run counts, KV zone included.
    pub fragmentation_all_zones_mean_pct: f64,
    pub fragmentation_all_zones_max_pct: f64,
    pub mean_free_pct: f64,
    pub seconds: f64,
}

/// Weight sizes of the model catalogue in pages, as 2 MiB pages of 0.5B .. 14B-parameter
/// models at 2 bytes per parameter (a 32768-page pool is a 64 GiB device); each load
/// varies its size by up to +-10%. The page count, not the page size, decides
/// fragmentation, so the churn may use small real pages to keep mapping cheap.
const MODEL_PAGES: [usize; 7] = [480, 960, 1700, 3000, 4000, 7600, 14000];

/// A multi-model churn on a host-backed pool of `num_pages` pages of `page_size` bytes:
/// models load (weights + a KV region) and unload; loaded models' KV grows and shrinks
/// like requests arriving and finishing. Fragmentation is sampled after every operation.
pub fn churn(num_pages: usize, page_size: usize, ops: usize, seed: u64) -> XtResult<ChurnResult> {
    let pool = DevicePool::new("cpu", num_pages, page_size, 0, false)?;
    let mut rng = Rng::new(seed);
    // (name, kv id, kv max pages, kv used)
    let mut loaded: Vec<(String, u64, usize, usize)> = Vec::new();
    let mut r = ChurnResult {
        ops,
        loads: 0,
        unloads: 0,
        kv_resizes: 0,
        kv_refused: 0,
        load_refused: 0,
        noncontiguous_loads: 0,
        fragmentation_mean_pct: 0.0,
        fragmentation_max_pct: 0.0,
        fragmentation_all_zones_mean_pct: 0.0,
        fragmentation_all_zones_max_pct: 0.0,
        mean_free_pct: 0.0,
        seconds: 0.0,
    };
    let mut serial = 0u64;
    let (mut frag_sum, mut free_sum) = (0.0f64, 0.0f64);
    let mut all_sum = 0.0f64;
    let start = Instant::now();
    for _ in 0..ops {
        let load = loaded.len() < 2 || (rng.chance(0.001) && loaded.len() < 12);
        let unload = !load && rng.chance(0.001);
        if load {
            let base = MODEL_PAGES[rng.range(0, MODEL_PAGES.len() - 1)] as f64;
            let w = (base * (0.9 + 0.2 * rng.range(0, 1000) as f64 / 1000.0)) as usize;
            let kv_max = (w / 2).max(8);
            let name = format!("m{serial}");
            serial += 1;
            // Make room like a placement decision would: unload until weights + a little KV fit.
            while pool.stats()?.free_pages < w + kv_max / 4 && !loaded.is_empty() {
                let (n, ..) = loaded.swap_remove(rng.range(0, loaded.len() - 1));
                pool.free(&n)?;
                r.unloads += 1;
            }
            match pool.alloc_weights(&name, (w * page_size) as i64) {
                Ok(seg) => {
                    r.loads += 1;
                    r.noncontiguous_loads += usize::from(!seg.contiguous);
                    let kv = pool.kv_region(&name, (kv_max * page_size) as i64, 2, 8)?;
                    loaded.push((name, kv.id, kv_max, 0));
                }
                Err(_) => r.load_refused += 1,
            }
        } else if unload && !loaded.is_empty() {
            let (n, ..) = loaded.swap_remove(rng.range(0, loaded.len() - 1));
            pool.free(&n)?;
            r.unloads += 1;
        } else if !loaded.is_empty() {
            let i = rng.range(0, loaded.len() - 1);
            let (_, id, max, used) = loaded[i];
            // Requests arrive (grow by a few pages) or finish (shrink), biased to a mid level.
            let grow = rng.chance(if used < max / 2 { 0.6 } else { 0.4 });
            let step = rng.range(1, 4);
            let n = if grow { (used + step).min(max) } else { used.saturating_sub(step) };
            r.kv_resizes += 1;
            match pool.kv_resize(id, n) {
                Ok(()) => loaded[i].3 = n,
                Err(_) => r.kv_refused += 1,
            }
        }
        let (frag, all, free) = pool.fragmentation_sample()?;
        frag_sum += frag;
        all_sum += all;
        free_sum += free;
        r.fragmentation_all_zones_max_pct = r.fragmentation_all_zones_max_pct.max(all);
        if frag > r.fragmentation_max_pct {
            r.fragmentation_max_pct = frag;
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r.fragmentation_mean_pct = frag_sum / ops as f64;
    r.mean_free_pct = free_sum / ops as f64;
    r.fragmentation_all_zones_mean_pct = all_sum / ops as f64;
    pool.check_integrity()?;
    pool.close()?;
    Ok(r)
}
