//! A few persistent threads that run the parts of one product: a product of a decode step
//! takes 20-200 us, so spawning threads per call (tens of us each) would eat the gain.
//!
//! One job at a time: the caller publishes it by bumping a generation, runs part 0 itself
//! and waits for the others. Idle workers spin briefly (the next product of a step follows
//! within microseconds) and then sleep on a condition variable, so an idle engine costs no
//! cpu. A caller that finds the pool busy (another thread's product), or that runs in a
//! forked child of the process that started the workers, runs all parts itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const MAX_THREADS: usize = 16;
const SPIN: Duration = Duration::from_micros(200);

type Job<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    generation: AtomicU64,
    pending: AtomicUsize,
    // the current job as a raw fat pointer and its number of parts; valid while pending > 0
    job: Mutex<(usize, usize, usize)>,
    wake: Condvar,
    busy: Mutex<()>,
    spawned: AtomicUsize, // workers started (lazily: as many as the largest job asked for)
    pid: u32,             // the process that started them: a fork's child has none of them
}

static POOL: OnceLock<&'static Shared> = OnceLock::new();

fn pool() -> &'static Shared {
    POOL.get_or_init(|| {
        let s: &'static Shared = Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            job: Mutex::new((0, 0, 0)),
            wake: Condvar::new(),
            busy: Mutex::new(()),
            spawned: AtomicUsize::new(0),
            pid: std::process::id(),
        }));
        s
    })
}

/// Workers 1 .. parts - 1 exist (called holding `busy`); false when one could not start.
fn ensure_workers(s: &'static Shared, parts: usize) -> bool {
    while s.spawned.load(Ordering::Acquire) + 1 < parts {
        let idx = s.spawned.load(Ordering::Acquire) + 1;
        let ok = std::thread::Builder::new().name(format!("janus-quant-{idx}")).spawn(move || worker(s, idx));
        if ok.is_err() {
            return false;
        }
        s.spawned.fetch_add(1, Ordering::AcqRel);
    }
    true
}

fn worker(s: &'static Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        while s.generation.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let mut g = s.job.lock().unwrap_or_else(|e| e.into_inner());
        while s.generation.load(Ordering::Acquire) == seen {
            g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        seen = s.generation.load(Ordering::Acquire);
        let (lo, hi, parts) = *g;
        drop(g);
        if idx < parts {
            // SAFETY: the caller of run() keeps the job alive until pending reaches 0
            let job: &Job<'_> = unsafe { std::mem::transmute::<(usize, usize), &Job<'_>>((lo, hi)) };
            job(idx);
            s.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs job(0) .. job(parts - 1), part 0 on the calling thread; returns when all are done.
pub(super) fn run(parts: usize, job: &Job<'_>) {
    let parts = parts.min(MAX_THREADS);
    let s = pool();
    let Ok(_guard) = s.busy.try_lock() else {
        (0..parts).for_each(job);
        return;
    };
    if s.pid != std::process::id() {
        // a forked child: the workers counted in `spawned` exist only in the parent
        (0..parts).for_each(job);
        return;
    }
    if !ensure_workers(s, parts) {
        (0..parts).for_each(job);
        return;
    }
    // SAFETY: a fat reference is two words; it is read back only while this call waits below
    let (lo, hi) = unsafe { std::mem::transmute::<&Job<'_>, (usize, usize)>(job) };
    {
        let mut g = s.job.lock().unwrap_or_else(|e| e.into_inner());
        *g = (lo, hi, parts);
        s.pending.store(parts - 1, Ordering::Release);
        s.generation.fetch_add(1, Ordering::AcqRel);
    }
    s.wake.notify_all();
    job(0);
    let start = Instant::now();
    while s.pending.load(Ordering::Acquire) != 0 {
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
