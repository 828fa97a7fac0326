//! cargo tests of xTensor: the page pool against a brute-force reference (proptest),
//! real remapping on the host backend, and the missing-library errors.

use proptest::prelude::*;

use super::bench;
use super::device::DevicePool;
use super::pool::PagePool;

/// Reference: the owner of every page, and exact predictions of what each call takes.
#[derive(Clone, Debug)]
struct Model {
    owner: Vec<Option<u32>>,
}

impl Model {
    fn runs(&self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.owner.len() {
            if self.owner[i].is_none() {
                let s = i;
                while i < self.owner.len() && self.owner[i].is_none() {
                    i += 1;
                }
                out.push((s as u32, (i - s) as u32));
            } else {
                i += 1;
            }
        }
        out
    }
    fn free(&self) -> usize {
        self.owner.iter().filter(|o| o.is_none()).count()
    }
    fn weights(&self, n: usize) -> (Vec<u32>, bool) {
        let fits: Vec<(u32, u32)> = self.runs().into_iter().filter(|&(_, l)| l as usize >= n).collect();
        if let Some(best) = fits.iter().map(|&(_, l)| l).min() {
            let start = fits.iter().filter(|&&(_, l)| l == best).map(|&(s, _)| s).max().unwrap();
            return (((start + best - n as u32)..(start + best)).collect(), true);
        }
        let free: Vec<u32> = (0..self.owner.len() as u32).filter(|&p| self.owner[p as usize].is_none()).collect();
        (free[free.len() - n..].to_vec(), false)
    }
    fn low(&self, n: usize) -> Vec<u32> {
        (0..self.owner.len() as u32).filter(|&p| self.owner[p as usize].is_none()).take(n).collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Weights(u32, usize),
    Low(u32, usize),
    /// Free the k-th live allocation (modulo), optionally only part of a KV one.
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..4, 1usize..24).prop_map(|(o, n)| Op::Weights(o, n)),
        (0u32..4, 1usize..8).prop_map(|(o, n)| Op::Low(o, n)),
        (0usize..64).prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn pool_matches_reference(ops in proptest::collection::vec(op(), 1..80)) {
        const N: usize = 64;
        let mut pool = PagePool::new(N).unwrap();
        let mut model = Model { owner: vec![None; N] };
        let mut live: Vec<(u32, Vec<u32>)> = Vec::new();
        for op in ops {
            match op {
                Op::Weights(o, n) | Op::Low(o, n) if n > model.free() => {
                    let before = pool.clone();
                    let r = if matches!(op, Op::Weights(..)) { pool.alloc_weights(o, n).map(|x| x.0) } else { pool.alloc_low(o, n) };
                    prop_assert!(r.unwrap_err().message.contains("exhausted"));
                    prop_assert_eq!(before.free_runs().collect::<Vec<_>>(), pool.free_runs().collect::<Vec<_>>());
                    prop_assert_eq!(before.free_pages(), pool.free_pages());
                }
                Op::Weights(o, n) => {
                    let (expect, contiguous) = model.weights(n);
                    let (got, c) = pool.alloc_weights(o, n).unwrap();
                    prop_assert_eq!(&got, &expect);
                    prop_assert_eq!(c, contiguous);
                    for &p in &got { model.owner[p as usize] = Some(o); }
                    live.push((o, got));
                }
                Op::Low(o, n) => {
                    let expect = model.low(n);
                    let got = pool.alloc_low(o, n).unwrap();
                    prop_assert_eq!(&got, &expect);
                    for &p in &got { model.owner[p as usize] = Some(o); }
                    live.push((o, got));
                }
                Op::Free(k) => {
                    if live.is_empty() { continue; }
                    let (o, pages) = live.swap_remove(k % live.len());
                    // A wrong owner is refused and changes nothing.
                    prop_assert!(pool.free(o + 1, &pages).is_err());
                    pool.free(o, &pages).unwrap();
                    for &p in &pages { model.owner[p as usize] = None; }
                }
            }
            pool.check_integrity().unwrap();
            prop_assert_eq!(pool.free_runs().collect::<Vec<_>>(), model.runs());
            prop_assert_eq!(pool.largest_free_run(), model.runs().iter().map(|&(_, l)| l as usize).max().unwrap_or(0));
        }
    }
}

#[test]
fn free_rejects_duplicates_and_foreign_pages_without_change() {
    let mut pool = PagePool::new(8).unwrap();
    let a = pool.alloc_low(1, 3).unwrap();
    let b = pool.alloc_low(2, 2).unwrap();
    assert!(pool.free(1, &[a[0], a[0]]).unwrap_err().message.contains("twice"));
    assert!(pool.free(1, &[a[0], b[0]]).unwrap_err().message.contains("not owned"));
    assert!(pool.free(1, &[99]).unwrap_err().message.contains("out of range"));
    assert_eq!(pool.free_pages(), 3);
    pool.check_integrity().unwrap();
}

fn read(addr: usize) -> u8 {
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}
fn write(addr: usize, v: u8) {
    unsafe { std::ptr::write_volatile(addr as *mut u8, v) }
}

#[test]
fn host_kv_page_is_the_global_page() {
    let ps = 4096;
    let pool = DevicePool::new("cpu", 8, ps, 0, false).unwrap();
    let kv = pool.kv_region("m", (4 * ps) as i64, 0, 0).unwrap();
    let w = pool.alloc_weights("w", (2 * ps) as i64).unwrap();
    assert_eq!(w.pages, vec![6, 7]);
    pool.kv_resize(kv.id, 2).unwrap();
    let ids = pool.kv_page_ids(kv.id).unwrap();
    assert_eq!(ids, vec![0, 1]);
    write(kv.base + ps + 17, 0xAB);
    assert_eq!(read(pool.global_base() + ids[1] as usize * ps + 17), 0xAB);
    write(w.addr + 5, 0x5C);
    assert_eq!(read(pool.global_base() + 6 * ps + 5), 0x5C);
    assert_eq!(pool.kv_global_offsets(kv.id, (ps + 17) as i64, 1).unwrap(), vec![(ps + 17, 1)]);
    pool.check_integrity().unwrap();
    pool.free("m").unwrap();
    assert!(pool.free("m").unwrap_err().message.contains("double free"));
    pool.check_integrity().unwrap();
}

#[test]
fn missing_vendor_libraries_are_named() {
    let have = |name: &str| {
        let c = std::ffi::CString::new(name).unwrap();
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        !h.is_null()
    };
    if !have("libcuda.so.1") {
        let e = DevicePool::new("cuda", 4, 2 << 20, 0, false).err().unwrap();
        assert!(e.message.starts_with("cuda backend: cannot load libcuda.so.1 ("), "{}", e.message);
    }
    if !have("libascendcl.so") {
        let e = DevicePool::new("npu", 4, 2 << 20, 0, false).err().unwrap();
        assert!(e.message.starts_with("npu backend: cannot load libascendcl.so ("), "{}", e.message);
    }
    assert!(DevicePool::new("tpu", 4, 4096, 0, false).err().unwrap().message.contains("unknown device kind"));
}

#[test]
fn benches_measure_something_real() {
    let m = bench::map_unmap(8, 4096, 3).unwrap();
    assert!(m.map_us_per_page > 0.0 && m.raw_map_us_per_page > 0.0);
    assert!(m.touched_map_us_per_page > 0.0 && m.raw_touched_map_us_per_page > 0.0);
    assert!(m.touched_unmap_us_per_page > 0.0 && m.raw_touched_unmap_us_per_page > 0.0);
    let (cpu, wall) = bench::bookkeeping(1024, 10_000, 3).unwrap();
    assert!(cpu > 0.0 && wall > 0.0);
    let c = bench::churn(4096, 4096, 20_000, 5).unwrap();
    assert_eq!(c.ops, 20_000);
    assert!(c.loads >= 2 && c.kv_resizes > 10_000);
    assert!(c.fragmentation_mean_pct <= c.fragmentation_all_zones_mean_pct);
    assert!(c.fragmentation_max_pct <= 100.0 && c.mean_free_pct > 0.0);
}
